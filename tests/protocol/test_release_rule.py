"""The release rule is written three times; the three agree.

A write of the chief releases a waiting worker by ``WaitRules`` (docs/protocol.md#release,
``stepbarrier/_worker/wait_state.py``); the same write's Lua (``publish_step.lua``)
removes the workers it releases from the targets index, so that a released
worker need not unregister; and ``AsyncStepWaiter``'s shared subscription
(``stepbarrier/_worker/aio_subscription.py``) wakes only the waits an
announcement concerns. Each case here is one real write, run by the Lua on a
real Redis, whose real announcement is then judged by the rules and by the
asyncio pre-filter: the rules release exactly the waits the Lua removed, and
the pre-filter wakes every wait the rules release or abort.
"""

from __future__ import annotations

import itertools
import logging
from collections import deque
from typing import Any

import pytest
import redis

from stepbarrier import BarrierAborted, BarrierConfig
from stepbarrier._protocol.calls import publish_step_call, read_call, register_call
from stepbarrier._protocol.wire import parse_announcement
from stepbarrier._redis.functions import RedisCode, publish_command
from stepbarrier._worker.aio_subscription import Mailbox, SharedSubscription
from stepbarrier._worker.links import REGISTRY_TTL, registry_entry
from stepbarrier._worker.snapshot import Snapshot, parse_snapshot
from stepbarrier._worker.wait_state import WaitRules

STEP = 50
TARGETS = (STEP - 1, STEP, STEP + 1)  # reached before, at, and not by the write

CASES = [
    (mode, vouch, done)
    for mode, vouch, done in itertools.product(("chief", "operator"), (False, True), (False, True))
    if mode == "chief" or vouch  # an operator's pinned step always vouches
]


def write(code: RedisCode, config: BarrierConfig, generation: int, step: int, **how: Any) -> None:
    """One write of ``step`` (``how``: ``mode``, ``vouch``, ``done``), run by the Lua."""
    keys = config.keys
    values: dict[str, Any] = {"mode": "chief", "vouch": True, "done": False, **how}
    code.call(
        *publish_step_call(
            state=keys.state,
            targets=keys.targets,
            reset=keys.reset,
            generation=generation,
            step=step,
            key_ttl=config.key_ttl,
            channel=keys.channel,
            writer="test",
            max_targets=10,
            run_id="",
            heartbeat_ms=1000,
            finished_ttl=config.done_ttl,
            reset_marker="",
            publish_command=publish_command(config),
            served=0,
            idle_ms=0,
            **values,
        )
    )


def one_write(config: BarrierConfig, client: redis.Redis, **how: Any) -> tuple[Snapshot, Any]:
    """A begun chief writes step 1; one waiter per target registers and reads that
    state; then ``STEP`` is written as ``how`` says. Returns the waiters' read, and
    the second write's announcement as the channel carried it."""
    keys = config.keys
    code = RedisCode(client, config)
    generation = int(code.call("begin_generation", [keys.state, keys.reset], ["", "0"])[0])
    write(code, config, generation, 1)
    for target in TARGETS:
        entry = registry_entry(config, target, 0.0)
        code.call(
            *register_call(
                keys, f"w{target}", target, entry, registry_ttl=REGISTRY_TTL, key_ttl=config.key_ttl
            )
        )
    read = parse_snapshot(code.call(*read_call(keys.state, keys.reset, wait=True)))
    pubsub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
    pubsub.subscribe(keys.channel)
    assert pubsub.get_message(timeout=5) is None  # (the confirmation, ignored)
    write(code, config, generation, STEP, **how)
    message = pubsub.get_message(timeout=5)
    pubsub.close()
    code.close()
    assert message is not None and message["type"] == "message", message
    return read, message["data"]


def judged(config: BarrierConfig, target: int, read: Snapshot, raw: Any) -> str:
    """What ``WaitRules``, having read ``read``, make of ``raw``: ``"released"``,
    ``"aborted"`` (the job finished short of the target) or ``"held"``."""
    rules = WaitRules(config, target, None, lambda: 0.0, logging.getLogger("tests"))
    assert rules.on_snapshot(read) is None
    try:
        outcome = rules.on_announcement(parse_announcement(raw), raw)
    except BarrierAborted:
        return "aborted"
    return "released" if isinstance(outcome, int) else "held"


def prefilter_wakes(config: BarrierConfig, target: int, generation: int, raw: Any) -> bool:
    """Whether the asyncio subscription hands ``raw`` to a wait for ``target`` that
    has read ``generation`` (as every wait has, once an announcement of it came)."""

    async def no_io(*_: Any) -> Any:
        raise AssertionError("the pre-filter does no I/O")

    subscription = SharedSubscription(config, lambda: 0.0, no_io, no_io)
    mailbox = Mailbox(target, lambda snapshot, after: None)
    mailbox.generation = generation
    subscription.add(mailbox)
    subscription._generation = generation
    subscription._dispatch(raw)
    return mailbox.items != deque()


@pytest.mark.parametrize(("mode", "vouch", "done"), CASES)
def test_the_rules_the_lua_and_the_asyncio_prefilter_release_the_same_waits(
    config: BarrierConfig, client: redis.Redis, mode: str, vouch: bool, done: bool
) -> None:
    read, raw = one_write(config, client, mode=mode, vouch=vouch, done=done)
    assert read.state.generation is not None
    for target in TARGETS:
        outcome = judged(config, target, read, raw)
        removed = client.zscore(config.keys.targets, f"w{target}") is None
        assert (outcome == "released") == removed, (mode, vouch, done, target, outcome)
        if outcome != "held":  # woken, to be released or to abort
            assert prefilter_wakes(config, target, read.state.generation, raw), (mode, vouch, done)
        assert outcome != "released" or target <= STEP  # never early
