"""Telling a job that is not there: no key of it holds anything, and which jobs are.

``stepbarrier status``, ``wait`` and ``reset`` say so when a job has no keys
(a typo in ``--job`` is the usual cause) and name a few jobs found on the
Redis, the closest to the job's name first ("did you mean"). A short ``SCAN``
finds the names (``SUGGEST_SCAN_CALLS`` calls of ``SCAN_COUNT`` keys per
master), never a walk of a large keyspace; a user
that may not ``SCAN`` (a worker's or a chief's password) learns how to list
them instead.

A job of named barriers only (``stepbarrier arrive``, no chief state) is there
too: ``reset`` looks for its barrier index and epoch (``has_barrier_keys``),
whether or not one of its barriers is open.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.listing import SCAN_COUNT, job_of_state_key
from stepbarrier._inspect.status import STATUS_RETRY_SECONDS, JobStatus
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.client import RedisClient, with_client

SUGGEST = 5
"""Most job names a message names."""
CLOSE = 3
"""Most close matches ("did you mean") a message names."""
CLOSE_CUTOFF = 0.6
"""How alike (``difflib``'s ratio, 0 to 1) a job's name must be to be a close match."""
SUGGEST_SCAN_CALLS = 10
"""Most ``SCAN`` calls per master when looking for other jobs' names."""


@dataclass(frozen=True)
class OtherJobs:
    """Jobs found on the Redis, for a message about a job that is not there.

    Attributes:
        names: Up to ``SUGGEST`` job names, sorted.
        more: More jobs exist, or the short scan did not see the whole keyspace.
        may_scan: False if the user may not run ``SCAN`` (``names`` is then empty).
        close: The names found that are closest to the job's (a typo's likely
            meaning), best first: at most ``CLOSE``, whether or not among ``names``.
    """

    names: tuple[str, ...] = ()
    more: bool = False
    may_scan: bool = True
    close: tuple[str, ...] = ()


def is_missing(status: JobStatus, waiting: int = 0) -> bool:
    """True if no key of the job holds anything: no state, no reset marker, no
    waiter, no barrier, nothing malformed.

    Args:
        status: What was read.
        waiting: Waiters counted apart from ``status`` (a summary's, when the
            status lists none of them).
    """
    return (
        status.step is None
        and status.generation is None
        and status.heartbeat_age is None
        and status.reset_at is None
        and not (status.done or status.waiters or waiting or status.problems or status.barriers)
    )


def has_barrier_keys(config: BarrierConfig, client: RedisClient | None = None) -> bool:
    """True if the job's barrier index or barrier epoch is there.

    Every arrival refreshes both with its barrier's TTL, so a job with a barrier
    (open, complete or stale) has them; a reset leaves a new epoch (and its
    marker). ``TYPE`` of the two keys: O(1), and every role may run it.

    Raises:
        RedisUnavailable: Redis was unreachable for ``STATUS_RETRY_SECONDS``.
        RedisRefused: Redis refused the read (authentication, ACL).
    """
    keys = config.keys

    def run(active: RedisClient) -> bool:
        pipe = active.pipeline(transaction=False)
        pipe.type(keys.barrier_index)
        pipe.type(keys.barrier_epoch)
        kinds = pipe.execute()
        return any(_text(kind) != "none" for kind in kinds)

    return with_client(
        config,
        client,
        run,
        action="read the job's barrier keys",
        retry_seconds=STATUS_RETRY_SECONDS,
    )


def _text(raw: object) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def other_jobs(config: BarrierConfig, client: RedisClient | None = None) -> OtherJobs:
    """A few of the jobs on this Redis (not ``config.job``), by a short bounded ``SCAN``.

    Raises:
        RedisUnavailable: Redis was unreachable for ``STATUS_RETRY_SECONDS``.
        RedisRefused: Redis refused the connection (authentication, TLS).
    """
    return with_client(
        config,
        client,
        lambda active: _scan(config, active),
        action="list the jobs",
        retry_seconds=STATUS_RETRY_SECONDS,
    )


def _scan(config: BarrierConfig, client: RedisClient) -> OtherJobs:
    match = JobKeys.for_job("*").state
    nodes: list[Any] = [None]
    if isinstance(client, RedisCluster):
        nodes = list(client.get_primaries())  # type: ignore[no-untyped-call]
    found: set[str] = set()
    more = False
    try:
        for node in nodes:
            cursor: Any = "0"
            for _ in range(SUGGEST_SCAN_CALLS):
                extra = {} if node is None else {"target_nodes": node}
                cursor, keys = client.scan(cursor=cursor, match=match, count=SCAN_COUNT, **extra)
                if isinstance(cursor, dict):
                    cursor = next(iter(cursor.values()), 0)
                for key in keys:
                    job = job_of_state_key(key)
                    if job is not None and job != config.job:
                        found.add(job)
                if int(cursor) == 0:
                    break
            else:
                more = True
    except redis.exceptions.NoPermissionError:
        return OtherJobs(may_scan=False)
    names = sorted(found)
    close = difflib.get_close_matches(config.job, names, n=CLOSE, cutoff=CLOSE_CUTOFF)
    return OtherJobs(tuple(names[:SUGGEST]), more or len(names) > SUGGEST, close=tuple(close))
