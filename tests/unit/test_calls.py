"""The long calls' builders lay their named arguments out as each Lua body reads them."""

from __future__ import annotations

import re

import pytest

from stepbarrier._protocol.calls import barrier_arrive_call, publish_step_call
from stepbarrier._protocol.lua import lua_source


def documented_argv(name: str) -> dict[int, str]:
    """``ARGV[n]`` -> its description, from the header comment of ``lua/<name>.lua``."""
    header = " ".join(
        line.removeprefix("--").strip()
        for line in lua_source(name).splitlines()
        if line.startswith("--")
    )
    parts = re.split(r"ARGV\[(\d+)(?:\.\.)?\]", header)
    described: dict[int, str] = {}
    for i in range(1, len(parts) - 1, 2):  # the first mention: the header's
        described.setdefault(int(parts[i]), parts[i + 1])
    return described


# (argument, the value passed, a word of ARGV[n]'s description, n)
PUBLISH_STEP = [
    ("generation", 11, "generation", 1),
    ("step", 22, "step", 2),
    ("done", True, "done", 3),
    ("key_ttl", 44, "key TTL", 4),
    ("channel", "chan", "channel", 5),
    ("writer", "host:1", "writer description", 6),
    ("max_targets", 77, "max targets", 7),
    ("run_id", "run-8", "run id", 8),
    ("vouch", False, "vouch", 9),
    ("heartbeat_ms", 1010, "heartbeat period", 10),
    ("finished_ttl", 1111, "finished job", 11),
    ("reset_marker", "mark", "reset marker", 12),
    ("mode", "contributor", "'contributor'", 13),
    ("publish_command", "SPUBLISH", "'SPUBLISH'", 14),
    ("served", 1515, "probation this writer has served", 15),
    ("idle_ms", 1616, "training loop handed its last step over", 16),
]


def test_publish_step_call_lays_out_each_argument_where_the_lua_reads_it() -> None:
    values = {name: value for name, value, _word, _n in PUBLISH_STEP}
    name, keys, args = publish_step_call(state="s", targets="t", reset="r", **values)  # type: ignore[arg-type]
    assert name == "publish_step" and list(keys) == ["s", "t", "r"]
    documented = documented_argv("publish_step")
    assert len(args) == max(documented) == len(PUBLISH_STEP)
    for argument, value, word, n in PUBLISH_STEP:
        expected = int(value) if isinstance(value, bool) else value
        assert args[n - 1] == expected, argument
        assert word in documented[n], (argument, documented[n])


BARRIER_ARRIVE = [
    ("member", "start:run-1", "the barrier", 1),
    ("task_id", 3, "task's id", 2),
    ("parties", 4, "parties", 3),
    ("key_ttl", 55, "key TTL", 4),
    ("channel", "bchan", "channel", 5),
    ("publish_command", "PUBLISH", "'PUBLISH'", 6),
    ("run_id", "run-1", "run id", 7),
    ("max_indexed", 1000, "most barriers", 8),
    ("arrived_under", "tok", "epoch token", 9),
]


@pytest.mark.parametrize("restore", [(), ((1, 1700), (2, 1800))])
def test_barrier_arrive_call_lays_out_each_argument_where_the_lua_reads_it(
    restore: tuple[tuple[int, int], ...],
) -> None:
    values = {name: value for name, value, _word, _n in BARRIER_ARRIVE}
    name, keys, args = barrier_arrive_call(
        barrier="b",
        index="i",
        epoch="e",
        restore=restore,
        **values,  # type: ignore[arg-type]
    )
    assert name == "barrier_arrive" and list(keys) == ["b", "i", "e"]
    documented = documented_argv("barrier_arrive")
    for argument, value, word, n in BARRIER_ARRIVE:
        assert args[n - 1] == value, argument
        assert word in documented[n], (argument, documented[n])
    assert "pairs of a task" in documented[10]
    assert list(args[9:]) == [x for pair in restore for x in pair]
