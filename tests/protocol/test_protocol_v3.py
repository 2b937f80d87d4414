"""Issue 32 (protocol v3): the common paths live with no run id, and the review's
new early releases closed, against a real redis-server.

Each liveness test would have ended in ``BarrierTimeout`` before v3 (a wait
distrusted every final fact it did not see written); each safety test
reproduces a case of the issue. No test bounds a duration: each asserts what
released the wait, or that it was not released.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import redis

from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    BarrierTimeout,
    StepPublisher,
    StepWaiter,
)
from stepbarrier._chief.publish_call import StepWrite, StepWriter
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.freshness import GRACE
from tests.redis_harness import RedisServer

# long enough that a wait which does not trust a final fact times out instead
LIMIT = 4 * GRACE + 6.0


def finished_job(config: BarrierConfig, step: int) -> None:
    """A chief that ran to ``step`` and finished, before anyone waits."""
    with StepPublisher(config) as chief:
        chief.publish(step)
        assert chief.flush(10.0)
        chief.close(done=True)


def test_a_worker_that_starts_after_the_job_finished_is_released_without_a_run_id(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=LIMIT)
    finished_job(config, 50)
    with StepWaiter(config) as waiter:
        assert waiter.wait(10, timeout=LIMIT) == 50


def test_a_worker_above_the_finished_step_is_aborted_without_a_run_id(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=LIMIT)
    finished_job(config, 50)
    with StepWaiter(config) as waiter, pytest.raises(BarrierAborted) as info:
        waiter.wait(80, timeout=LIMIT)
    assert info.value.reason == "done" and info.value.last_step == 50


def test_a_reruns_worker_is_never_released_by_the_previous_runs_final_state(
    make_config: Callable[..., BarrierConfig],
) -> None:
    # the rerun's chief begins after its first worker's first read, within the
    # grace: its begin is on the old state, which the worker then distrusts
    config = make_config(heartbeat=0.2, stall_timeout=LIMIT)
    finished_job(config, 50)
    released: list[int] = []
    waiting = threading.Event()

    def worker() -> None:
        with StepWaiter(config) as waiter:
            waiting.set()
            released.append(waiter.wait(10, timeout=LIMIT))

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    assert waiting.wait(10.0)
    time.sleep(0.3)  # (the worker's first read; the chief begins well within GRACE)
    with StepPublisher(config) as chief:
        chief.publish(3)
        assert chief.flush(10.0)
        time.sleep(GRACE + 1.0)  # past the old state's grace: still not released
        assert not released, f"released at {released} by the previous run's state"
        chief.publish(10)
        thread.join(LIMIT + 10.0)
        chief.close(done=True)
    assert released == [10]


def test_an_operators_pin_releases_a_wait_that_arrives_afterwards_without_a_run_id(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=LIMIT)
    with StepPublisher(config, operator=True) as operator:
        operator.publish(40)
        assert operator.flush(10.0)
    with StepWaiter(config) as waiter:
        assert waiter.wait(30, timeout=LIMIT) == 40


def test_a_full_redis_is_named_not_a_missing_publisher(own_server: RedisServer) -> None:
    config = BarrierConfig(job="full", redis_url=own_server.url, heartbeat=0.2, stall_timeout=3.0)
    client = own_server.client()
    with StepPublisher(config) as chief:
        chief.publish(50)
        assert chief.flush(10.0)
        # Redis is full: it refuses every write (the chief's heartbeats too), and
        # answers reads
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", 1)
        try:
            with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as info:
                waiter.wait(10, timeout=20.0)
        finally:
            client.config_set("maxmemory", 0)
        chief.close(done=False)
    message = str(info.value)
    assert "refuses writes because it is full" in message
    assert "runs no publisher" not in message
    client.close()


def test_a_timeout_after_reading_its_runs_state_does_not_blame_a_missing_publisher(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=2.0)
    with StepPublisher(config) as chief:
        chief.publish(5)
        assert chief.flush(10.0)
        chief.close(done=False)  # gone without finishing
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as info:
        waiter.wait(10, timeout=20.0)
    message = str(info.value)
    assert "runs no publisher" not in message
    assert "state is stored (step 5" in message


# -- the review's early releases (cases 4 and 5), on a real Redis -------------------


def writer(config: BarrierConfig) -> StepWriter:
    return StepWriter(redis.Redis.from_url(config.redis_url), config, "t:1")


def test_two_zombies_after_redis_forgot_never_vouch(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=30.0)
    zombie_1, zombie_2, newest = writer(config), writer(config), writer(config)
    first = zombie_1.begin_generation().generation
    second = zombie_2.begin_generation().generation
    third = newest.begin_generation().generation
    assert newest.write(StepWrite(third, 30, False, True, "")).probation == 0
    client.delete(config.keys.state)  # Redis forgot
    one = zombie_1.write(StepWrite(first, 1007, False, True, ""))
    two = zombie_2.write(StepWrite(second, 2004, False, True, ""))
    assert (one.status, two.status) == (scripts.ACCEPTED, scripts.ACCEPTED)
    assert one.probation and two.probation and two.probation != one.probation
    assert client.hget(config.keys.state, "vouch") == b"0"
    # the newest chief, live, replaces it at its next write (on probation too)
    assert newest.write(StepWrite(third, 30, False, True, "")).probation
    assert zombie_2.write(StepWrite(second, 2005, False, True, "")).status == scripts.SUPERSEDED
    for w in (zombie_1, zombie_2, newest):
        w.close()


def test_a_lost_reply_does_not_skip_probation_on_a_real_redis(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=30.0)
    zombie = writer(config)
    generation = zombie.begin_generation().generation
    client.delete(config.keys.state)  # Redis forgot, the begin with it
    zombie.write(StepWrite(generation, 1007, False, True, ""))  # its reply "lost"
    retry = zombie.write(StepWrite(generation, 1007, False, True, ""))
    assert retry.status == scripts.ACCEPTED and retry.probation
    assert client.hget(config.keys.state, "vouch") == b"0"
    zombie.close()
