"""Ending a job by hand: delete its keys and abort whoever still waits.

The waiters' entries are found through the job's index, never a keyspace scan, and
go by ``UNLINK`` (a large one's memory is freed off Redis's main thread) in batches
before the reset function, which refuses more than ``RESET_BATCH`` of them. The named
barriers need no finding: the new barrier epoch makes every one begun before it stale
at once (the first ``MAX_RESET_BARRIERS`` indexed are deleted too; the others expire).
"""

from __future__ import annotations

import redis

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.registry import entry_key, to_bytes
from stepbarrier._inspect.status import BARRIER_MEMBER, operator_read
from stepbarrier._protocol.calls import reset_job_call
from stepbarrier._protocol.library import MAX_RESET_KEYS
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode, publish_command

RESET_MARKER_TTL = 24 * 3600
"""Seconds the reset marker stays, so waiters that reconnect later still abort."""
RESET_BATCH = 1000
"""Registry keys deleted per command."""
MAX_RESET_WAITERS = 100_000
"""Most registry entries one reset deletes; any others expire by their TTL."""
MAX_RESET_BARRIERS = MAX_RESET_KEYS - RESET_BATCH - 1
"""Most barrier hashes one reset deletes (the one key less: the progress hash)."""


def reset_job(config: BarrierConfig, client: RedisClient | None = None) -> int:
    """Delete the job's keys and make every barrier stale; waiting tasks get
    ``BarrierAborted`` at once.

    A marker with the reset's time stays for ``RESET_MARKER_TTL``: a waiter that
    began before it and missed the announcement aborts on its next read, and a
    chief that began before it stops publishing instead of bringing the job back.

    Returns:
        The number of waiter entries removed.
    """
    keys = config.keys

    def run(active: RedisClient) -> int:
        # whatever is indexed belongs to the job: the scores are not checked
        waiters = _indexed(active, keys.targets, most=MAX_RESET_WAITERS, page=RESET_BATCH)
        entries = [entry_key(keys, waiter) for waiter in waiters]
        batches = [entries[i : i + RESET_BATCH] for i in range(0, len(entries), RESET_BATCH)]
        last = batches.pop() if batches else []
        removed = sum(int(active.unlink(*batch)) for batch in batches)
        removed += int(active.exists(*last)) if last else 0
        # only a barrier's name can name a barrier the library made
        named = _indexed(
            active, keys.barrier_index, most=MAX_RESET_BARRIERS, page=MAX_RESET_BARRIERS
        )
        prefix = keys.barrier_prefix.encode()
        barriers = [prefix + name for name in named if BARRIER_MEMBER.fullmatch(name)]
        call = reset_job_call(
            keys,
            marker_ttl=RESET_MARKER_TTL,
            publish_command=publish_command(config),
            extra=[keys.progress, *last, *barriers],  # each task's progress goes too
        )
        RedisCode(active, config).call(*call)
        return removed

    return operator_read(config, client, run, action="reset the job")


def _indexed(client: RedisClient, key: str, *, most: int, page: int) -> list[bytes]:
    """The members of the index ``key``, at most ``most``, ``page`` per ``LIMIT`` read
    (``NoPermissionError`` if the user may not read it)."""
    members: list[bytes] = []
    try:
        while len(members) < most:
            num = min(page, most - len(members))
            got = client.zrangebyscore(key, "-inf", "+inf", start=len(members), num=num)
            members += map(to_bytes, got)
            if len(got) < num:
                break
    except redis.exceptions.NoPermissionError:
        raise
    except redis.ResponseError:
        return []  # not a sorted set: nothing to follow, and the reset script deletes it
    return members
