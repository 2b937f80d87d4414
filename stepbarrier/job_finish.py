"""Finishing a job once its end barrier completed: every party has finished training.

The chief's end barrier (``EndBarrierHook``, ``EndBarrierCallback``) completes
only when every worker has arrived, that is, finished training. Nothing can
still need the job then, so the chief marks it done, as ``last_step`` or
``stepbarrier publish STEP --done`` do: a step wait that is not a party (an
evaluator's, say) ends with ``BarrierAborted`` rather than waiting for ever,
``stepbarrier watch --until-done`` ends, and the job's keys, this run's
barriers with them, expire after ``STEPBARRIER_DONE_TTL``, so that a rerun under
the same job name (without a run id) starts clean instead of passing its start
barrier at once.
"""

from __future__ import annotations

import logging
import os
import socket

from stepbarrier.barrier_state import split_member
from stepbarrier.barrier_status import barrier_keys
from stepbarrier.config import BarrierConfig
from stepbarrier.connection import RedisClient, with_client
from stepbarrier.publisher import StepPublisher

log = logging.getLogger("stepbarrier.job_finish")

FINISH_TIMEOUT = 10.0
"""Seconds the chief keeps trying to mark the job done if Redis is unreachable."""


def finish_job(config: BarrierConfig, final_step: int, client: RedisClient | None = None) -> bool:
    """Mark the job done at ``final_step`` and let this run's barriers expire with it.

    The chief writes as a new chief incarnation (the training session's
    publisher has ended), so ``final_step`` must be the true final global step.

    Returns:
        True if the job is marked done; if not, a warning says why.
    """
    publisher = StepPublisher(
        config, client, description=f"end barrier {socket.gethostname()}:{os.getpid()}"
    )
    publisher.publish(final_step)
    if not publisher.close(done=True, timeout=FINISH_TIMEOUT):
        return False
    try:
        expire_run_barriers(config, config.done_ttl, client)
    except Exception as exc:  # the job is done; the barriers still expire by their TTL
        log.warning("job %s: the barriers keep their TTL (%s)", config.job, exc)
    log.info("job %s: every party finished; job marked done at step %d", config.job, final_step)
    return True


def expire_run_barriers(config: BarrierConfig, ttl: int, client: RedisClient | None = None) -> int:
    """Let this run's barriers expire within ``ttl`` seconds (never later than they would).

    Returns:
        How many barriers were given the shorter TTL.
    """
    prefix = config.keys.barrier_prefix.encode()

    def run(active: RedisClient) -> int:
        mine = []
        for key in barrier_keys(active, config.keys):
            member = key[len(prefix) :].decode("utf-8", "replace")
            if split_member(member)[1] == config.run_id:
                mine.append(key)
        pipe = active.pipeline(transaction=False)
        for key in mine:
            pipe.expire(key, ttl, lt=True)
        return sum(bool(done) for done in pipe.execute()) if mine else 0

    return with_client(config, client, run, action="expire the run's barriers", retry_seconds=5.0)
