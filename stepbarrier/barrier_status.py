"""The job's barriers as an operator sees them: which are open, who is missing.

Barriers are found through the job's barrier index (a sorted set the arrivals
keep), never by scanning the keyspace; ``read_open_barriers`` only reads, so
the read-only ``monitor`` user may run it. The index is for this display only:
a barrier of another epoch than the job's current one (begun before a reset or
the job's finish) is stale, and not shown. Malformed content becomes a problem
line, never an exception.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import redis

from stepbarrier.barrier_state import epoch_token, parse_barrier
from stepbarrier.connection import RedisClient
from stepbarrier.keys import JobKeys
from stepbarrier.waiter_registry import printable

STATUS_BARRIERS = 50
"""Most barriers ``status`` reads: those with the latest arrivals."""
_MEMBER = re.compile(rb"[A-Za-z0-9._-]{1,64}(:[A-Za-z0-9._-]{1,64})?")


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


def read_open_barriers(
    client: RedisClient, keys: JobKeys, now_ms: int, problems: list[str]
) -> tuple[BarrierInfo, ...]:
    """The job's open barriers, latest arrival first (at most ``STATUS_BARRIERS`` read).

    Args:
        client: The job's client.
        keys: The job's keys.
        now_ms: Redis's clock, for the ages.
        problems: Malformed content found is described here.
    """
    pipe = client.pipeline(transaction=False)
    pipe.zrangebyscore(keys.barrier_index, "-inf", "+inf", withscores=True, start=0, num=INDEX_READ)
    pipe.hgetall(keys.barrier_epoch)
    index, epoch_fields = pipe.execute(raise_on_error=False)
    epoch = None
    if isinstance(epoch_fields, Exception):
        problems.append("the barrier epoch is malformed (not a hash): every barrier is stale")
    elif epoch_fields:
        epoch = epoch_token(epoch_fields.get(b"token"))
    if isinstance(index, Exception):
        problems.append(f"barriers not shown: {' '.join(str(index).split())[:160]}")
        return ()
    newest = sorted(index, key=lambda pair: -float(pair[1]))[:STATUS_BARRIERS]
    members = []
    for member, _score in newest:
        raw = _to_bytes(member)
        if _MEMBER.fullmatch(raw) is None:
            problems.append(f"malformed barrier name in the index: {printable(raw, 40)!r}")
        else:
            members.append(raw.decode())
    if not members:
        return ()
    pipe = client.pipeline(transaction=False)
    for member in members:
        pipe.hgetall(keys.barrier(member))
    found = []
    for member, fields in zip(members, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(fields, Exception) or not fields:
            continue  # expired since the index was read, or not a hash: nothing to show
        state = parse_barrier(member, fields)
        if state is None:
            problems.append(f"barrier {member!r} is malformed (no valid number of parties)")
        elif epoch is not None and state.epoch == epoch and not state.complete:
            found.append(
                BarrierInfo(
                    name=state.name,
                    run_id=state.run_id,
                    parties=state.parties,
                    arrived=len(state.arrivals),
                    missing=state.missing,
                    open_for=_age(now_ms, state.created_ms),
                    last_arrival_age=_age(now_ms, state.last_ms),
                )
            )
    return tuple(found)


def _age(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)


def _to_bytes(member: Any) -> bytes:
    return member if isinstance(member, bytes) else str(member).encode()
