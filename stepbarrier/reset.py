"""Ending a job by hand: delete its keys and abort whoever still waits.

The waiters' registry entries are found through the job's index (the targets
sorted set), never by scanning the keyspace.
"""

from __future__ import annotations

import time

import redis

from stepbarrier.config import BarrierConfig
from stepbarrier.connection import call_with_retries, make_client
from stepbarrier.redis_code import RedisCode
from stepbarrier.waiter_registry import indexed_keys

RESET_MARKER_TTL = 24 * 3600
"""Seconds the reset marker stays, so waiters that reconnect later still abort."""
RESET_BATCH = 1000
"""Registry keys deleted per command (the last batch goes with the reset script)."""
MAX_RESET_WAITERS = 100_000
"""Most registry entries one reset deletes; any others expire by their TTL."""


def reset_job(config: BarrierConfig, client: redis.Redis | None = None) -> int:
    """Delete the job's keys; waiting workers get ``BarrierAborted`` at once.

    A marker with the reset's time stays for ``RESET_MARKER_TTL``: a waiter that
    began before it and missed the announcement aborts on its next read, and a
    chief that began before it stops publishing instead of bringing the job back.

    Returns:
        The number of waiter entries removed.
    """
    own = client is None
    active = client if client is not None else make_client(config)
    keys = config.keys
    code = RedisCode(active, config)

    def run() -> int:
        entries = _indexed(active, config)
        batches = [entries[i : i + RESET_BATCH] for i in range(0, len(entries), RESET_BATCH)]
        last = batches.pop() if batches else []
        removed = sum(int(active.delete(*batch)) for batch in batches)
        removed += int(active.exists(*last)) if last else 0
        code.call(
            "reset_job",
            [keys.state, keys.targets, keys.registrations, keys.reset, *last],
            [keys.channel, RESET_MARKER_TTL],
        )
        return removed

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


def _indexed(client: redis.Redis, config: BarrierConfig) -> list[bytes]:
    try:
        return list(indexed_keys(client, config.keys, page=RESET_BATCH, limit=MAX_RESET_WAITERS))
    except redis.exceptions.NoPermissionError:
        raise
    except redis.ResponseError:
        return []  # not a sorted set: no index to follow, and the script deletes it
