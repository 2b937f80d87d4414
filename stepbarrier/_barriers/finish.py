"""Finishing a job once its end barrier completed: every party has finished training.

Nothing can still need the job then, so the chief marks it done, as ``last_step``
or ``stepbarrier publish STEP --done`` do (a step wait that is not a party ends,
and the keys expire after ``STEPBARRIER_DONE_TTL``), and ends the job's barrier
epoch, so that a rerun under the same job name (without a run id) begins every
barrier anew; this run's barriers the index names also get the shorter TTL.
"""

from __future__ import annotations

import logging
import os
import socket

import redis

from stepbarrier._barriers.wait import MAX_INDEXED_BARRIERS
from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.barrier_record import split_member
from stepbarrier._protocol.wire import parse_int
from stepbarrier._redis.client import RedisClient, with_client

log = logging.getLogger("stepbarrier._barriers.finish")

FINISH_TIMEOUT = 10.0
"""Seconds the chief keeps trying to mark the job done if Redis is unreachable."""


def finish_job(config: BarrierConfig, final_step: int, client: RedisClient | None = None) -> bool:
    """Mark the job done at ``final_step`` and end the job's barrier epoch.

    The chief writes as a new chief incarnation (the training session's
    publisher has ended), so ``final_step`` must be the true final global step.

    Returns:
        True if the job is marked done; if not, a warning says why.
    """
    # written as a final fact (like an operator's): the chief's session has
    # ended, and a probation would only keep the finished job from releasing
    publisher = StepPublisher(
        config,
        client,
        description=f"end barrier {socket.gethostname()}:{os.getpid()}",
        operator=True,
    )
    publisher.publish(final_step)
    if not publisher.close(done=True, timeout=FINISH_TIMEOUT):
        return False
    try:
        end_barrier_epoch(config, client)
    except Exception as exc:  # the job is done; the barriers still expire by their TTL
        log.warning(
            "job %s: the barrier epoch could not be ended (%s): until its barriers expire, "
            "a rerun under this job name without a run id may pass a barrier this run "
            "completed; give reruns their own STEPBARRIER_RUN_ID",
            config.job,
            exc,
        )
    try:
        expire_run_barriers(config, config.done_ttl, client)
    except Exception as exc:  # stale already; they expire by their TTL
        log.warning("job %s: the barriers keep their TTL (%s)", config.job, exc)
    log.info("job %s: every party finished; job marked done at step %d", config.job, final_step)
    return True


def end_barrier_epoch(config: BarrierConfig, client: RedisClient | None = None) -> None:
    """Make every barrier of the job stale at once, whatever the barrier index holds: a
    new epoch token, ``by=finish`` (docs/protocol.md#barriers)."""
    key = config.keys.barrier_epoch

    def write(active: RedisClient) -> None:
        seconds, micros = active.time()
        token = int(seconds) * 1_000_000 + int(micros)
        old = parse_int(active.hget(key, "token"))
        if old is not None and old >= token:
            token = old + 1  # tokens only grow (docs/protocol.md#barriers)
        active.hset(key, mapping={"token": str(token), "by": "finish"})
        active.expire(key, max(config.key_ttl, 24 * 3600))

    with_client(config, client, write, action="end the job's barrier epoch", retry_seconds=5.0)


def expire_run_barriers(config: BarrierConfig, ttl: int, client: RedisClient | None = None) -> None:
    """Let this run's barriers the index names expire within ``ttl`` seconds (never
    later than they would); only to tidy up, as ``end_barrier_epoch`` made them stale
    (a barrier the index no longer names is stale all the same)."""
    index, prefix = config.keys.barrier_index, config.keys.barrier_prefix.encode()

    def run(active: RedisClient) -> None:
        try:  # a longer index was inflated by hand: it gets no more read
            found = active.zrangebyscore(index, "-inf", "+inf", start=0, num=MAX_INDEXED_BARRIERS)
        except redis.exceptions.NoPermissionError:
            raise
        except redis.ResponseError:
            return  # not a sorted set: reset deletes it, and there is nothing to follow
        members = [m if isinstance(m, bytes) else str(m).encode() for m in found]
        mine = [
            m for m in members if split_member(m.decode("utf-8", "replace"))[1] == config.run_id
        ]
        pipe = active.pipeline(transaction=False)
        for member in mine:
            pipe.expire(prefix + member, ttl, lt=True)
        if mine:
            pipe.execute()

    with_client(config, client, run, action="expire the run's barriers", retry_seconds=5.0)
