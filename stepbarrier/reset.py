"""Ending a job by hand: delete its keys and abort whoever still waits."""

from __future__ import annotations

import time

import redis

from stepbarrier import scripts
from stepbarrier.config import BarrierConfig
from stepbarrier.connection import call_with_retries, make_client

RESET_MARKER_TTL = 24 * 3600
"""Seconds the reset marker stays, so waiters that reconnect later still abort."""


def reset_job(config: BarrierConfig, client: redis.Redis | None = None) -> int:
    """Delete the job's keys; waiting workers get ``BarrierAborted`` at once.

    A marker with the reset's time stays (and is removed by the next chief), so
    a waiter that missed the announcement aborts on its next read.

    Returns:
        The number of waiter entries removed.
    """
    own = client is None
    active = client if client is not None else make_client(config)
    keys = config.keys
    script = active.register_script(scripts.RESET_JOB)

    def run() -> int:
        waiters = list(active.scan_iter(match=keys.waiter_pattern, count=500))
        script(
            keys=[keys.state, keys.targets, keys.registrations, keys.reset, *waiters],
            args=[keys.channel, RESET_MARKER_TTL],
        )
        return len(waiters)

    try:
        return call_with_retries(
            run,
            config,
            action="reset the job",
            deadline=time.monotonic() + 5.0,
            clock=time.monotonic,
            sleep=time.sleep,
        )
    finally:
        if own:
            active.close()
