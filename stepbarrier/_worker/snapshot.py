"""What a waiter's read of its job found (``waiter_read``), parsed without any I/O: the
drivers make a ``Snapshot`` from a reply, ``WaitRules`` judges it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from stepbarrier._protocol.library import MAX_FIELDS, MAX_VALUE
from stepbarrier._protocol.wire import WAIT_FIELDS, ChiefState, as_text, parse_int, parse_state


@dataclass(frozen=True)
class Snapshot:
    """What one ``register_and_read`` read."""

    now_ms: int  # Redis's clock (for operators' views only)
    reset_marker: str | None  # an opaque token
    state: ChiefState  # empty, possibly with a problem, if absent or malformed
    full: bool = False  # Redis refused the registration: out of memory (the chief's too)


def parse_snapshot(reply: Any) -> Snapshot:
    """What the ``waiter_read`` call returned, parsed without trusting it."""
    reply = list(reply)
    kind = as_text(reply[2])
    if kind == "values" and len(reply) == 3 + len(WAIT_FIELDS):
        # a wait's read: WAIT_FIELDS' values in order (None: absent)
        values = zip(WAIT_FIELDS, reply[3:], strict=True)
        state = parse_state({name: value for name, value in values if value is not None})
    elif kind == "values":  # not one value per field: another version of the library
        state = ChiefState.empty(
            f"the read returned {len(reply) - 3} values for {len(WAIT_FIELDS)} fields: not "
            "read, treated as no state (is the loaded library another version?)"
        )
    elif kind == "hash":
        flat = reply[3:]
        state = parse_state(dict(zip(flat[0::2], flat[1::2], strict=False)))
    elif kind == "none":
        state = ChiefState.empty()
    elif kind == "oversized":  # waiter_read refused to read it
        state = ChiefState.empty(
            f"state key is oversized (more than {MAX_FIELDS} fields, or a field longer than "
            f"{MAX_VALUE} bytes): not read, treated as no state"
        )
    else:
        state = ChiefState.empty(f"state key holds a {kind}, not a hash")
    return Snapshot(
        now_ms=parse_int(reply[0]) or 0,
        reset_marker=None if reply[1] is None or reply[1] is False else as_text(reply[1]),
        state=state,
    )
