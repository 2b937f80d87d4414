"""``AsyncStepWaiter`` through Sentinel: released through the master the Sentinels
name, across a forced failover, never before its step (scenario 7, on asyncio)."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from stepbarrier import BarrierConfig, StepPublisher, read_status
from tests.cluster.test_cluster_aio import AsyncWaits
from tests.reliability.sentinel import SentinelGroup

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(150)]


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    sentinels = SentinelGroup()
    try:
        yield sentinels.start()
    finally:
        sentinels.cleanup()


def eventually(predicate: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_async_waits_through_sentinel_are_released_after_a_failover_never_before(
    group: SentinelGroup, job: str
) -> None:
    config = BarrierConfig(
        job=job,
        sentinels=group.addresses,
        sentinel_service=group.service,
        heartbeat=0.2,
        stall_timeout=60.0,
        fallback_interval=1.0,
    )
    chief = StepPublisher(config)
    try:
        chief.publish(10)
        assert chief.flush(10)
        waits = AsyncWaits(config, [5, 20, 30])
        eventually(lambda: 5 in waits.results)
        assert waits.results[5] == 10
        eventually(lambda: len(read_status(config).waiters) >= 2)
        new_master, old_master = group.failover()
        assert old_master.port != new_master.port
        for step in range(11, 20):  # the chief trains on after the failover
            chief.publish(step)
            time.sleep(0.05)
        assert chief.flush(10)
        time.sleep(0.3)
        assert 20 not in waits.results and 30 not in waits.results, "released before its step"
        chief.publish(25)
        eventually(lambda: 20 in waits.results)
        assert 30 not in waits.results, "released before its step"
        chief.publish(30)
        waits.join()
        assert waits.results == {5: 10, 20: 25, 30: 30}
    finally:
        chief.close(done=False, timeout=2.0)
