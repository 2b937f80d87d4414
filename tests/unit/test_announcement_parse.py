"""The announcement's fast path (``publish_step``'s exact format read by one regular
expression, issue 35) decides as the general JSON parse does, for every message it
takes: hostile or malformed content included. A message it does not take goes to the
general parse, so only the messages it takes need the check."""

from __future__ import annotations

import json

from hypothesis import given
from hypothesis import strategies as st

from stepbarrier._protocol import wire

numbers = st.one_of(
    st.integers(0, 20),
    st.integers(0, wire.MAX_STEP + 2),
    st.just(wire.MAX_STEP),
    st.just(wire.MAX_STEP + 1),
    st.integers(10**15, 10**17),
)
run_ids = st.one_of(
    st.just(""),
    st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True),
    st.text(max_size=70),
)


@given(
    step=numbers,
    generation=numbers,
    beat=numbers,
    vouch=st.booleans(),
    done=st.booleans(),
    pinned=st.booleans(),
    run_id=run_ids,
    idle=numbers,
)
def test_the_fast_path_decides_as_the_general_parse(
    step: int,
    generation: int,
    beat: int,
    vouch: bool,
    done: bool,
    pinned: bool,
    run_id: str,
    idle: int,
) -> None:
    message = {
        "step": step,
        "generation": generation,
        "beat": beat,
        "vouch": vouch,
        "done": done,
        "pinned": pinned,
        "run_id": run_id,
        "idle": idle,
    }
    raw = json.dumps(message, separators=(",", ":")).encode()
    fast = wire._announced(raw)
    general = wire.parse_announcement(raw.decode())  # text: the general parse only
    if fast is not None:
        assert fast == general
    assert wire.parse_announcement(raw) == general


def test_the_chief_s_own_format_takes_the_fast_path() -> None:
    raw = (
        b'{"step":12,"generation":1796307737399076,"beat":1796307737399080,"vouch":true,'
        b'"done":false,"pinned":false,"run_id":"run-1","idle":0}'
    )
    fast = wire._announced(raw)
    assert fast is not None
    assert fast == wire.parse_announcement(raw.decode())
    assert (fast.step, fast.run_id, fast.vouch) == (12, "run-1", True)
