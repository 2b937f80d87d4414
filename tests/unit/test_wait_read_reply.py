"""A wait's read of the state comes back as the values of ``WAIT_FIELDS`` alone (kind
``values``, from a listpack state) or as named pairs (kind ``hash``, any other read):
both parse to the same state, and a reply of another shape is no state, said why."""

from __future__ import annotations

import pytest

from stepbarrier._protocol.wire import WAIT_FIELDS
from stepbarrier._worker.snapshot import parse_snapshot

STATE = {"generation": b"7", "step": b"41", "beat": b"9", "run_id": b"r-1", "vouch": b"1"}


def as_values(state: dict[str, bytes]) -> list[object]:
    return [b"0", None, b"values", *(state.get(name) for name in WAIT_FIELDS)]


def as_pairs(state: dict[str, bytes]) -> list[object]:
    flat: list[object] = []
    for name in WAIT_FIELDS:
        if name in state:
            flat += [name.encode(), state[name]]
    return [b"0", None, b"hash", *flat]


@pytest.mark.parametrize(
    "state",
    [
        STATE,
        {**STATE, "idle_ms": b"12"},  # the last field present
        {name: STATE[name] for name in ("step", "generation")},  # gaps in the middle
        {"fence": b"5"},  # a begun generation only: no state
        {},
    ],
)
def test_the_values_and_the_named_pairs_are_the_same_state(state: dict[str, bytes]) -> None:
    assert parse_snapshot(as_values(state)) == parse_snapshot(as_pairs(state))


def test_values_that_do_not_match_the_fields_are_no_state_and_say_why() -> None:
    short = as_values(STATE)[:-1]
    state = parse_snapshot(short).state
    assert state.step is None and state.generation is None
    assert state.problem is not None
    assert f"{len(WAIT_FIELDS) - 1} values for {len(WAIT_FIELDS)} fields" in state.problem
