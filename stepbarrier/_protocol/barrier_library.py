"""A named barrier's arrival in Redis (``lua/barrier_arrive.lua``): its replies and
limits, and a long arrival sent as several calls (docs/protocol.md#barriers).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepbarrier._protocol.calls import Call
from stepbarrier._protocol.wire import parse_int

BARRIER_RECORDED = 1
"""Reply status: the arrival is recorded (now or before)."""
BARRIER_OTHER_PARTIES = 0
"""Reply status: the barrier was begun with another number of parties."""
BARRIER_EPOCH_ENDED = 2
"""Reply status: a reset or the job's finish ended the epoch the caller arrived in;
nothing is recorded (the reply's last field says which: 'reset' or 'finish')."""

BARRIER_RESTORABLE = 1
"""Reply field: the caller's arrivals of an earlier epoch may be recorded."""

MAX_BARRIER_INDEX = 1000
"""Most barriers the job's barrier index keeps, whatever a caller asks; an index of
twice that or more (written by hand) is dropped whole at the next arrival."""

MAX_RESTORED = 1000
"""Most arrivals one BARRIER_ARRIVE call records again on other tasks' behalf (its
pairs after the nine fixed arguments); a call with more is refused before
anything is read or written. ``split_arrival`` sends more as several calls."""
ARRIVAL_ARGUMENTS = 9
"""BARRIER_ARRIVE's fixed arguments; the pairs of a task and its time follow."""


def split_arrival(call: Call) -> list[Call]:
    """A BARRIER_ARRIVE call as calls of at most ``MAX_RESTORED`` restored arrivals each.

    Each part is the same arrival of the caller (recorded once: a re-arrival keeps
    its first time) with the next ``MAX_RESTORED`` of the restored arrivals, in
    order; a call within the limit is itself. Sent in order, the parts record
    what the one call would have (only not atomically: each part is an arrival
    of its own, which the protocol allows at any moment).
    """
    name, keys, args = call
    fixed, pairs = list(args[:ARRIVAL_ARGUMENTS]), list(args[ARRIVAL_ARGUMENTS:])
    size = 2 * MAX_RESTORED
    if len(pairs) <= size:
        return [call]
    return [(name, keys, fixed + pairs[at : at + size]) for at in range(0, len(pairs), size)]


def arrival_reply(replies: Sequence[Any]) -> Any:
    """The reply of an arrival sent as the parts of ``split_arrival``: the first part's
    error, or reply that recorded nothing (another number of parties, an ended
    epoch: the parts after it were refused alike), else the last part's (the
    barrier as all of them left it)."""
    for reply in replies:
        if isinstance(reply, Exception) or not isinstance(reply, (list, tuple)) or not reply:
            return reply
        if parse_int(reply[0]) != BARRIER_RECORDED:
            return reply
    return replies[-1]
