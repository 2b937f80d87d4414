"""Whether a chief still heartbeats a job: the one chief-liveness rule of the operator's views.

``stale_limit`` and ``is_stale`` are the rule every view shows (``status``,
``watch``, ``jobs``, ``wait``'s progress, ``status --check``), and a hand-run
``publish`` must not supersede a chief that is live by it.

Each ``publish`` starts a new chief generation, and a newer generation wins for
good: the running chief would stop publishing and its workers would follow the
hand-set step. So ``stepbarrier publish`` first asks ``find_live_chief``.
"""

from __future__ import annotations

from stepbarrier._config.defaults import DEFAULT_HEARTBEAT
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import STATUS_RETRY_SECONDS, JobStatus, read_status
from stepbarrier._protocol.freshness import stale_after
from stepbarrier._redis.client import RedisClient, with_client
from stepbarrier._redis.functions import RedisCode

HAND_PUBLISHED = "cli:"
"""Prefix of the ``chief`` field written by ``stepbarrier publish``: it wrote once
and left, so it is no running chief that a later ``publish`` would supersede."""


def stale_limit(status: JobStatus, default_heartbeat: float = DEFAULT_HEARTBEAT) -> float | None:
    """The heartbeat age from which ``status``'s chief counts as stale, if the question arises.

    The one chief-liveness rule of every operator's view (``status``, ``watch``,
    ``jobs``, ``wait``'s progress, ``status --check``) and of ``publish``'s
    refusal: a chief is live while its heartbeat is younger than three of its
    own heartbeat periods (at least five seconds), stale from then on. The
    period is the one the chief stored, or ``default_heartbeat`` if it stored
    none. Display only: no waiter decides by it (they judge observed writes).

    Returns:
        That age in seconds; ``None`` when no running chief is in question: the
        job is done (finished, however recent its last write), no chief wrote a
        heartbeat, or the step was published by hand (``stepbarrier publish``
        wrote once and left).
    """
    if status.done or status.heartbeat_age is None:
        return None
    if status.chief is not None and status.chief.startswith(HAND_PUBLISHED):
        return None
    period = status.heartbeat_period if status.heartbeat_period is not None else default_heartbeat
    return stale_after(period)


def is_stale(status: JobStatus, default_heartbeat: float = DEFAULT_HEARTBEAT) -> bool:
    """True if ``status``'s chief is stale by ``stale_limit``: the chief may be gone."""
    limit = stale_limit(status, default_heartbeat)
    return limit is not None and status.heartbeat_age is not None and status.heartbeat_age >= limit


def live_chief_limit(status: JobStatus, default_heartbeat: float) -> float | None:
    """The heartbeat age under which ``status``'s chief counts as live, if it does.

    Returns:
        ``stale_limit`` while the chief is live (not stale), else ``None``.
    """
    limit = stale_limit(status, default_heartbeat)
    return None if limit is None or is_stale(status, default_heartbeat) else limit


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
