"""The job's barriers as an operator sees them: which are open, who is missing.

Barriers are found through the job's barrier index (a sorted set the arrivals
keep), never by scanning the keyspace; ``read_open_barriers`` only reads, so
the read-only ``monitor`` user may run it. The index is for this display only:
a barrier of another epoch than the job's current one (begun before a reset or
the job's finish) is stale, and not shown. Malformed content becomes a problem
line, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.client import RedisClient

STATUS_BARRIERS = 50
"""Most barriers ``status`` reads: those with the latest arrivals."""


@dataclass(frozen=True)
class BarrierInfo:
    """An open barrier: not every party has arrived yet.

    Attributes:
        name: The barrier's name.
        run_id: The run it belongs to (``None``: no run id).
        parties: How many tasks it waits for.
        arrived: How many have arrived.
        missing: The ids of the tasks that have not, sorted.
        open_for: Seconds since the first arrival, by Redis's clock.
        last_arrival_age: Seconds since the latest arrival, by Redis's clock.
    """

    name: str
    run_id: str | None
    parties: int
    arrived: int
    missing: tuple[int, ...]
    open_for: float | None
    last_arrival_age: float | None


INDEX_READ = 1000
"""The most barrier index entries any reader reads (the library keeps the index
below this; a longer one was inflated by hand)."""


def barrier_keys(client: RedisClient, keys: JobKeys) -> list[bytes]:
    """The hash of every barrier the job's index names (for tidying up only: a
    barrier the index no longer names is made stale by a new epoch all the same).

    Raises:
        redis.exceptions.NoPermissionError: The user may not read the index.
    """
    try:
        # the index holds at most INDEX_READ barriers the library wrote: a worker
        # that inflated it gets no more read
        members = client.zrangebyscore(keys.barrier_index, "-inf", "+inf", start=0, num=INDEX_READ)
    except redis.exceptions.NoPermissionError:
        raise
    except redis.ResponseError:
        return []  # not a sorted set: reset deletes it, and there is nothing to follow
    prefix = keys.barrier_prefix.encode()
    return [prefix + _to_bytes(member) for member in members]


def _to_bytes(member: Any) -> bytes:
    return member if isinstance(member, bytes) else str(member).encode()
