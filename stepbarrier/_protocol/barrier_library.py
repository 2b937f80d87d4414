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

Bounded work: an arrival reads only the barrier's own fields and the task fields
it records, refuses a hash of more than ``MAX_FIELDS`` fields beyond its parties
(it begins it anew, as a malformed one), counts the arrivals in O(1), and keeps
the index to ``MAX_BARRIER_INDEX`` members with at most about that many removed
per call.
"""

from __future__ import annotations

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
