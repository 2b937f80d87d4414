"""Whether a chief still heartbeats a job, before a hand-run ``publish`` supersedes it.

Each ``publish`` starts a new chief generation, and a newer generation wins for
good: the running chief would stop publishing and its workers would follow the
hand-set step. So ``stepbarrier publish`` first asks ``find_live_chief``, by
the one liveness rule of the operator's views (``freshness.stale_limit``).
"""

from __future__ import annotations

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import (
    JobStatus,
    is_stale,
    operator_read,
    read_status,
    stale_limit,
)
from stepbarrier._protocol.calls import may_write_call
from stepbarrier._protocol.freshness import HAND_PUBLISHED
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode

__all__ = ["HAND_PUBLISHED", "find_live_chief", "is_stale", "stale_limit"]


def find_live_chief(
    config: BarrierConfig, client: RedisClient | None = None
) -> tuple[JobStatus, float] | None:
    """The job's status and its stale limit while a chief heartbeats (not stale), else ``None``.

    A user that may not publish at all learns that first (a chief's liveness is
    beside the point for it): ``RedisRefused`` unless the job's state is writable.
    """

    def check(active: RedisClient) -> JobStatus:
        RedisCode(active, config).call(*may_write_call(config.keys.state))
        return read_status(config, active)

    status = operator_read(config, client, check, action="publish the step")
    limit = stale_limit(status, config.heartbeat)
    if limit is None or is_stale(status, config.heartbeat):
        return None
    return status, limit
