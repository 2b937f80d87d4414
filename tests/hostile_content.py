"""Content a worker user can write into a job's keys, meant to break operator views."""

from __future__ import annotations

import math

import redis

from stepbarrier import BarrierConfig

CHIEF = "[bold red]chief[/x]:1"
HOSTILE_SINCE = ["nan", "1e20", "-1e20", "inf", "-inf", "1e11", "-5", " 5", "5_0", "0x10"]
"""``since`` values that float() would take (or nearly): none is a plausible time."""
HOSTILE_SCORES = {"at-inf": math.inf, "at-minus-inf": -math.inf, "at-1e20": 1e20, "half": 1.5}


def host(index: int) -> str:
    """The host name forged waiter ``index`` claims: markup that would not even parse."""
    return f"[/x]host{index}[bold red]"


def write_hostile(client: redis.Redis, config: BarrierConfig, *, done: bool) -> None:
    """A done (or live) state whose chief name is markup, and waiters a worker forged."""
    keys = config.keys
    seconds, micros = client.time()
    client.hset(
        keys.state,
        mapping={
            "step": "5",
            "generation": "7",
            "done": "1" if done else "0",
            "heartbeat_ms": str(seconds * 1000 + micros // 1000),
            "chief": CHIEF,
        },
    )
    client.set(keys.reset, "1e20")
    for index, since in enumerate(HOSTILE_SINCE):
        waiter_id = f"forged-{index}"
        client.hset(
            keys.waiter(waiter_id),
            mapping={"wait_until_step": "9", "since": since, "host": host(index), "pid": "12"},
        )
        client.zadd(keys.targets, {waiter_id: 9})
    client.hset(keys.waiter("escape"), mapping={"wait_until_step": "9", "host": "\x1b[31mred"})
    client.zadd(keys.targets, {"escape": 9})
    for waiter_id, score in HOSTILE_SCORES.items():
        client.hset(keys.waiter(waiter_id), mapping={"wait_until_step": "9", "host": waiter_id})
        client.zadd(keys.targets, {waiter_id: score})


def assert_shown_literally(output: str) -> None:
    """``output`` shows every forged name as written, and no raw escape sequence."""
    assert CHIEF in output
    for index in range(len(HOSTILE_SINCE)):
        assert f"{host(index)}:12" in output
    assert "\x1b" not in output
    assert "\\x1b[31mred" in output  # the escape sequence, escaped
