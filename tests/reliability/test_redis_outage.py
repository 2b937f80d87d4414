"""Scenarios 1 and 2: Redis dies (or is not up yet) while the chief trains and workers wait.

Guarantee: once Redis is back, every worker whose step the chief passed during
the outage is released within 5 s, none before the chief reached its step, the
chief's ``publish`` never blocked or raised, and the chief wrote its latest step
into the empty Redis by itself. A worker that loses Redis for longer than its
stall timeout ends with ``BarrierTimeout`` naming Redis, that timeout, the last step
and the heartbeat's age.
"""

from __future__ import annotations

import time

import pytest

from stepbarrier import BarrierConfig, read_status
from tests.redis_harness import RedisServer
from tests.reliability.conftest import FALLBACK, Timings, wait_for_waiters
from tests.reliability.processes import (
    Chief,
    Fleet,
    Worker,
    assert_chief_never_blocked,
    assert_not_early,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

RELEASE_AFTER_REDIS_IS_BACK = 5.0
"""The bound issue 6 sets: seconds from Redis listening again to the release."""


def start_workers(fleet: Fleet, targets: list[int]) -> list[Worker]:
    return [
        fleet.worker(f"worker{i}", target, task_id=i, overrides={"fallback_interval": FALLBACK})
        for i, target in enumerate(targets, start=1)
    ]


def check_recovery(
    server: RedisServer,
    config: BarrierConfig,
    chief: Chief,
    workers: list[Worker],
    down_since: float,
    timings: Timings,
) -> None:
    """Redis comes back: the passed targets are released in time, the rest later."""
    *passed, ahead = workers
    latest = chief.current_step()
    assert all(latest >= w.target for w in passed) and latest < ahead.target
    time.sleep(max(0.0, down_since + 2.5 - time.time()))  # an outage of 2.5 s at least
    assert all(w.still_waiting() for w in workers), "a worker was released while Redis was down"

    server.start()
    back = time.time()
    timings.record("Redis down", back - down_since)
    client = server.client()

    def stored_state() -> list[bytes] | None:
        step, writer = client.hmget(config.keys.state, ["step", "chief"])
        return None if step is None else [step, writer]

    try:
        stored = wait_until(stored_state, 10.0, "the chief republished its step")
    finally:
        client.close()
    timings.record("chief republished", time.time() - back)
    assert int(stored[0]) == latest
    assert stored[1].decode().endswith(f":{chief.pid}")

    for worker in passed:
        record = worker.released(timeout=15.0)
        assert_not_early(record, chief)
        delay = timings.record(f"{worker.name} released after Redis was back", record["t"] - back)
        assert delay <= RELEASE_AFTER_REDIS_IS_BACK, f"{worker.name} released {delay:.2f} s late"

    assert ahead.still_waiting(), f"{ahead.name} was released before its step"
    wait_until(
        lambda: {w.wait_until_step for w in read_status(config).waiters} == {ahead.target},
        10.0,
        f"only {ahead.name} registered in the restarted Redis",
    )
    chief.train_to(ahead.target + 10)
    record = ahead.released(timeout=15.0)
    assert_not_early(record, chief)
    timings.record(
        f"{ahead.name} released after its step", record["t"] - chief.reached(ahead.target)
    )
    assert_chief_never_blocked(chief.close(done=True))


def test_redis_killed_and_restarted_empty_while_workers_wait(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url)
    chief = fleet.chief()
    chief.wait_ready()
    chief.train_to(10)
    workers = start_workers(fleet, [30, 60, 120])
    wait_for_waiters(config, 3, workers)
    assert all(w.still_waiting() for w in workers)

    server.kill()
    down_since = time.time()
    # the chief trains past two targets while Redis is gone
    assert_chief_never_blocked(chief.train_to(70, step_seconds=0.02))
    check_recovery(server, config, chief, workers, down_since, timings)


def test_redis_down_when_the_chief_starts_and_up_later(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url)
    server.kill()  # nothing listens on its port until it starts again
    down_since = time.time()
    chief = fleet.chief()
    chief.wait_ready()
    workers = start_workers(fleet, [20, 40, 100])
    assert_chief_never_blocked(chief.train_to(50, step_seconds=0.02))
    check_recovery(server, config, chief, workers, down_since, timings)


def test_redis_gone_for_longer_than_the_stall_timeout_ends_the_wait_clearly(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    stall = 3.0
    config = BarrierConfig(job=job, redis_url=server.url)
    chief = fleet.chief()
    chief.wait_ready()
    chief.train_to(20)
    worker = fleet.worker(
        "worker1",
        50,
        task_id=1,
        env={"STEPBARRIER_STALL_TIMEOUT": str(stall)},
        overrides={"fallback_interval": FALLBACK},
    )
    wait_for_waiters(config, 1, [worker])
    time.sleep(1.5)  # the worker sees a heartbeat (1 s) happen: the chief is live to it
    server.kill()
    killed = time.time()

    error = worker.wait_outcome(timeout=stall + 30.0)
    timings.record("wait ended after Redis died", error["t"] - killed)
    assert error["event"] == "error" and error["type"] == "BarrierTimeout", error
    assert error["t"] - killed >= stall - FALLBACK - 0.5, "gave up before the stall timeout"
    assert error["last_step"] == 20
    assert error["heartbeat_age"] >= stall - 0.25
    for part in (f"stall timeout ({stall:g} s)", "last step seen 20", server.url):
        assert part in error["message"], error["message"]
    assert_chief_never_blocked(chief.train_to(25))  # the chief trains on regardless
    server.start()
    assert_chief_never_blocked(chief.close(done=True))
