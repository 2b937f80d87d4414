"""Untrusted content from Redis is parsed defensively, never executed."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepbarrier._protocol.wire import parse_announcement, parse_int, parse_state


def test_a_valid_announcement() -> None:
    ann = parse_announcement(b'{"step":12,"generation":7,"done":false}')
    assert ann is not None
    assert (ann.step, ann.generation, ann.done, ann.reset) == (12, 7, False, False)


def test_a_reset_announcement() -> None:
    ann = parse_announcement(b'{"reset":true,"time_ms":5}')
    assert ann is not None and ann.reset


def test_malformed_announcements_are_none() -> None:
    for raw in [
        b"",
        b"12",
        b"\xff\xfe",
        b"[1,2]",
        b'{"step":-1,"generation":1}',
        b'{"step":"12","generation":1}',
        b'{"step":1.5,"generation":1}',
        b'{"step":1e300,"generation":1}',
        b'{"step":12}',
        b'{"step":12,"generation":1,"done":"yes"}',
        b"cos\nsystem\n(S'echo pwned'\ntR.",  # a pickle: never unpickled
        b"[" * 10_000,
        b'{"reset":"true"}',
    ]:
        assert parse_announcement(raw) is None, raw


def test_state_parsing() -> None:
    state = parse_state(
        {b"step": b"10", b"generation": b"3", b"done": b"1", b"heartbeat_ms": b"99"}
    )
    assert (state.step, state.generation, state.done, state.heartbeat_ms) == (10, 3, True, 99)
    assert state.problem is None


def test_malformed_state_is_reported_not_trusted() -> None:
    state = parse_state({b"step": b"\xff", b"generation": b"3"})
    assert state.step is None and state.problem is not None
    assert "non-UTF-8" in state.problem
    state = parse_state({b"step": b"-4", b"generation": b"3"})
    assert state.step is None
    state = parse_state({b"step": b"99999999999999999999999", b"generation": b"3"})
    assert state.step is None
    error_state = parse_state(Exception("WRONGTYPE Operation against a key"))
    assert error_state.step is None and error_state.problem and "WRONGTYPE" in error_state.problem


def test_parse_int_bounds() -> None:
    assert parse_int(b"5") == 5
    assert parse_int("5", low=6) is None
    assert parse_int(True) is None
    assert parse_int(None) is None
    assert parse_int(b"2" * 25) is None


@pytest.mark.parametrize("number", [2**53 - 1, 2**53])
def test_a_stored_number_above_max_step_is_malformed(number: int) -> None:
    """Issue 32, case 7: above 2**53 - 2, ``n + 1`` is not exact in Lua's doubles."""
    assert parse_int(str(2**53 - 2)) == 2**53 - 2
    assert parse_int(str(number)) is None
    state = parse_state({b"step": b"5", b"generation": str(number).encode()})
    assert state.generation is None and state.problem is not None
    message = json.dumps({"step": 5, "generation": number})
    assert parse_announcement(message) is None


@given(st.binary(max_size=300))
def test_any_bytes_on_the_channel_parse_or_are_ignored(raw: bytes) -> None:
    ann = parse_announcement(raw)
    assert ann is None or ann.reset or (ann.step is not None and ann.step >= 0)


@given(st.dictionaries(st.binary(max_size=20), st.binary(max_size=30), max_size=8))
def test_any_hash_contents_parse_to_a_state(raw: dict[bytes, bytes]) -> None:
    state = parse_state(raw)
    assert state.step is None or state.step >= 0


@given(
    st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
        lambda inner: (
            st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
        ),
        max_leaves=20,
    )
)
def test_any_json_on_the_channel_parses_or_is_ignored(value: object) -> None:
    ann = parse_announcement(json.dumps(value).encode())
    if ann is not None and not ann.reset:
        assert isinstance(ann.step, int) and isinstance(ann.generation, int)
