"""Whether a chief still heartbeats a job: a hand-run ``publish`` must not supersede it.

Each ``publish`` starts a new chief generation, and a newer generation wins for
good: the running chief would stop publishing and its workers would follow the
hand-set step. So ``stepbarrier publish`` first asks ``find_live_chief``.
"""

from __future__ import annotations

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import STATUS_RETRY_SECONDS, JobStatus, read_status
from stepbarrier._protocol.freshness import stale_after
from stepbarrier._redis.client import RedisClient, with_client
from stepbarrier._redis.functions import RedisCode

HAND_PUBLISHED = "cli:"
"""Prefix of the ``chief`` field written by ``stepbarrier publish``: it wrote once
and left, so it is no running chief that a later ``publish`` would supersede."""


def live_chief_limit(status: JobStatus, default_heartbeat: float) -> float | None:
    """The heartbeat age under which ``status``'s chief counts as live, if it does.

    The chief is live while its heartbeat is younger than three of its own
    heartbeat periods (at least five seconds); the period is the one the chief
    stored, or ``default_heartbeat`` if it stored none. A chief that marked
    the job done is finished, however recent its last write, and an earlier
    ``stepbarrier publish`` is no running chief.

    Returns:
        That age limit in seconds while the chief is live, else ``None``.
    """
    if status.done or status.heartbeat_age is None:
        return None
    if status.chief is not None and status.chief.startswith(HAND_PUBLISHED):
        return None
    period = status.heartbeat_period if status.heartbeat_period is not None else default_heartbeat
    limit = stale_after(period)
    return limit if status.heartbeat_age < limit else None


def find_live_chief(
    config: BarrierConfig, client: RedisClient | None = None
) -> tuple[JobStatus, float] | None:
    """The job's status and its live-chief limit while a chief heartbeats, else ``None``.

    A user that may not publish at all learns that first (a chief's liveness is
    beside the point for it): the job's state must be writable for this user.

    Raises:
        RedisRefused: The user may not write the job's state (or read it).
        RedisUnavailable: Redis was unreachable for ``STATUS_RETRY_SECONDS``.
    """

    def check(active: RedisClient) -> JobStatus:
        RedisCode(active, config).call("may_write", [config.keys.state], [])
        return read_status(config, active)

    status = with_client(
        config, client, check, action="publish the step", retry_seconds=STATUS_RETRY_SECONDS
    )
    limit = live_chief_limit(status, config.heartbeat)
    return None if limit is None else (status, limit)
