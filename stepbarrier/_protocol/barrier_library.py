"""A named barrier's arrival in Redis (``lua/barrier_arrive.lua``): its replies and limits.

Registered in ``library.BODIES`` with the rest of the library, so it runs as a
function of the Redis Functions library and uses its helpers (``whole``,
``now_ms``, ``publish_command``, ``read_hash``) and limits (``MAX_PARTIES``,
``MAX_FIELDS``, ...: ``stepbarrier._protocol.library``). A barrier is one hash under the job's
hash tag: ``parties``, ``arrived`` (a hint: completion is counted from the
fields, with ``HLEN``), ``created_ms``, ``run_id``, ``epoch`` (the job's barrier epoch token
when it was begun), ``last_ms``, ``completed_ms`` once complete, and
``t<task id>`` -> arrival time (ms) per task.

The job's barrier epoch (a hash, ``JobKeys.barrier_epoch``) holds a unique
token; a reset and the job's finish replace it (``by`` says which), so every
barrier begun before is stale at once, whatever the barrier index holds: the next
arrival begins it anew. Forgetting (an expired or evicted epoch, a Redis that
restarted empty) can only make a task wait, never release one early. The
barrier index (a sorted set) is only for ``status`` to show the open barriers.

Bounded work: an arrival refuses more than ``MAX_RESTORED`` arrivals to record
again (before anything is read or written: ``split_arrival`` sends more as
several calls), reads only the barrier's own fields and the task fields it
records, refuses a hash of more than ``MAX_FIELDS`` fields beyond its parties
(it begins it anew, as a malformed one), and keeps the index to
``MAX_BARRIER_INDEX`` members with at most about that many removed per call.

Completion follows from the arrivals, against the caller's own number of
parties: ``HLEN`` (the fields that are not the barrier's own) bounds them from
above in O(1), and only once that bound reaches the caller's parties are the
task fields ``t0 .. t<parties - 1>`` counted, reading each (at most
``MAX_PARTIES``, before anything is written: ``FUNCTION KILL`` can end it). A
stored ``parties``, ``arrived`` or ``completed_ms``, or a field that is no
task's arrival, completes nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from stepbarrier._protocol.calls import Call
from stepbarrier._protocol.wire import parse_int

BARRIER_RECORDED = 1
"""BARRIER_ARRIVE reply status: the arrival is recorded (now or before)."""
BARRIER_OTHER_PARTIES = 0
"""BARRIER_ARRIVE reply status: the barrier was begun with another number of parties."""

BARRIER_EPOCH_ENDED = 2
"""BARRIER_ARRIVE reply status: a reset or the job's finish ended the epoch the caller
arrived in; nothing is recorded (the reply's last field says which: 'reset' or 'finish')."""

BARRIER_RESTORABLE = 1
"""BARRIER_ARRIVE reply field: the caller's arrivals of an earlier epoch may be recorded."""

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
