"""Telling a job that is not there: no key of it holds anything, and which jobs are.

What the commands say: docs/cli.md#a-job-that-is-not-there (a job of named barriers
only, ``stepbarrier arrive``'s, is there too: ``has_barrier_keys``).
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

import redis

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.listing import SCAN_COUNT, scan_jobs
from stepbarrier._inspect.status import JobStatus, operator_read
from stepbarrier._protocol.wire import as_text
from stepbarrier._redis.client import RedisClient

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
    """Jobs found on the Redis, for a message about a job that is not there: up to
    ``SUGGEST`` ``names``, ``more`` if there are others (or the short scan did not
    see the whole keyspace), and the ``close`` ones (a typo's likely meaning), best
    first, whether or not among ``names``."""

    names: tuple[str, ...] = ()
    more: bool = False
    may_scan: bool = True
    close: tuple[str, ...] = ()


def is_missing(status: JobStatus, waiting: int = 0) -> bool:
    """True if no key of the job holds anything: no state, no reset marker, no
    waiter (nor ``waiting``, counted apart from ``status`` by a summary), no
    barrier, nothing malformed."""
    return status.holds_nothing and status.reset_at is None and not (waiting or status.barriers)


def has_barrier_keys(config: BarrierConfig, client: RedisClient | None = None) -> bool:
    """True if the job's barrier index or barrier epoch is there.

    Every arrival refreshes both with its barrier's TTL, so a job with a barrier
    (open, complete or stale) has them; a reset leaves a new epoch (and its
    marker). ``TYPE`` of the two keys: O(1), and every role may run it. Raises
    as ``operator_read``.
    """
    keys = config.keys

    def run(active: RedisClient) -> bool:
        pipe = active.pipeline(transaction=False)
        pipe.type(keys.barrier_index)
        pipe.type(keys.barrier_epoch)
        kinds = pipe.execute()
        return any(as_text(kind) != "none" for kind in kinds)

    return operator_read(config, client, run, action="read the job's barrier keys")


def other_jobs(config: BarrierConfig, client: RedisClient | None = None) -> OtherJobs:
    """A few of the jobs on this Redis (not ``config.job``), by a short bounded ``SCAN``;
    raises as ``operator_read``."""

    def scan(active: RedisClient) -> OtherJobs:
        try:  # every job name the short scan sees is kept
            found = scan_jobs(active, ("*",), SUGGEST_SCAN_CALLS * SCAN_COUNT, SUGGEST_SCAN_CALLS)
        except redis.exceptions.NoPermissionError:
            return OtherJobs(may_scan=False)
        names = [name for name in found.lowest(0) if name != config.job]
        close = difflib.get_close_matches(config.job, names, n=CLOSE, cutoff=CLOSE_CUTOFF)
        more = not found.complete or len(names) > SUGGEST
        return OtherJobs(tuple(names[:SUGGEST]), more, close=tuple(close))

    return operator_read(config, client, scan, "list the jobs")
