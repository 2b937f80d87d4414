"""A worker's own stall timeout judges the chief's training loop, not its process
(issue 33, case 3), and a lost Redis never holds a chief's session end (case 2).

Against a real redis-server; no duration is asserted, only which limit ended
what, and what each said.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest

from stepbarrier import BarrierConfig, BarrierTimeout, StepPublisher, StepWaiter
from stepbarrier._redis.outage import LOST_REDIS_WAIT
from tests.redis_harness import RedisServer, free_port


def noticed_lost(chief: StepPublisher) -> None:
    """Until the chief's writer notices that Redis is gone (refused connections)."""
    for _ in range(200):
        if chief.redis_lost:
            return
        chief.flush(0.05)
    assert chief.redis_lost


def test_a_loop_that_died_in_a_live_process_ends_the_wait_at_the_workers_stall_timeout(
    make_config: Callable[..., BarrierConfig],
) -> None:
    chief_config = make_config(heartbeat=0.2, stall_timeout=600.0)  # heartbeats on and on
    worker_config = make_config(heartbeat=0.2, stall_timeout=3.0)
    with StepPublisher(chief_config) as chief:
        chief.publish(5)  # the loop's last step: it dies here, its process lives
        assert chief.flush(10.0)
        with StepWaiter(worker_config) as waiter, pytest.raises(BarrierTimeout) as info:
            waiter.wait(10, timeout=120.0)  # only the stall timeout can end it
        assert chief.active  # the chief's heartbeat went on all along
        chief.close(done=False)
    assert info.value.limit == "stall"
    assert "training loop has handed no step over for 3 s" in str(info.value)


def test_a_paused_chief_between_sessions_keeps_its_workers_waiting(
    make_config: Callable[..., BarrierConfig],
) -> None:
    chief_config = make_config(heartbeat=0.2, stall_timeout=600.0)
    worker_config = make_config(heartbeat=0.2, stall_timeout=2.0)
    with StepPublisher(chief_config) as chief:
        chief.publish(5)
        assert chief.pause(flush_timeout=10.0)  # a gap between two sessions
        with StepWaiter(worker_config) as waiter, pytest.raises(BarrierTimeout) as info:
            waiter.wait(10, timeout=6.0)  # outlives three stall timeouts
        chief.close(done=False)
    assert info.value.limit == "deadline"  # never "stall": the pause is no dead loop


def test_a_session_end_does_not_wait_for_a_redis_that_is_gone(
    job: str, caplog: pytest.LogCaptureFixture
) -> None:
    port = free_port()
    server = RedisServer(port=port).start()
    config = BarrierConfig(job=job, redis_url=server.url, heartbeat=0.2, stall_timeout=30.0)
    chief = StepPublisher(config)
    try:
        chief.publish(1)
        assert chief.flush(10.0)
        server.kill()
        chief.publish(2)
        noticed_lost(chief)
        # what each end of a session allows itself, on the chief's own clock
        allowed: list[float] = []
        loop = chief
        real_wait, real_stop = loop._wait_stored, loop._stop

        def wait_stored(wanted: int, deadline: float | None, **kwargs: bool) -> bool:
            allowed.append(float("inf") if deadline is None else deadline - time.monotonic())
            return real_wait(wanted, deadline, **kwargs)

        def stop(*, done: bool, deadline: float) -> bool:
            allowed.append(deadline - time.monotonic())
            return real_stop(done=done, deadline=deadline)

        loop._wait_stored = wait_stored  # type: ignore[method-assign]
        loop._stop = stop  # type: ignore[method-assign]
        with caplog.at_level(logging.WARNING, logger="stepbarrier"):
            assert not chief.pause(flush_timeout=10.0)
            assert not chief.close(done=True)
        assert "may not have reached Redis" in caplog.text
        # not the 10 s each asked for: Redis is gone, training does not wait for it
        assert len(allowed) == 2 and all(seconds <= LOST_REDIS_WAIT for seconds in allowed)
    finally:
        chief.close(done=False)
        server.cleanup()


def test_a_final_write_made_on_probation_is_waited_out_once_redis_answers_again(
    job: str,
) -> None:
    # found by the stateful fault test: Redis restarts (empty) while the chief's
    # writes fail; the close, cut short for a lost Redis, found it back, and its
    # final write made the state anew on probation: it waits that out within its
    # whole timeout, so the finished job vouches (and aborts waiters above it)
    server = RedisServer(port=free_port()).start()
    config = BarrierConfig(job=job, redis_url=server.url, heartbeat=0.2, stall_timeout=30.0)
    chief = StepPublisher(config)
    try:
        chief.publish(11)
        assert chief.flush(10.0)
        server.kill()
        chief.publish(12)
        noticed_lost(chief)
        server.start()
        assert chief.close(done=True)
        stored = server.client().hgetall(config.keys.state)
        assert (stored[b"done"], stored[b"vouch"], stored[b"step"]) == (b"1", b"1", b"12")
    finally:
        chief.close(done=False)
        server.cleanup()
