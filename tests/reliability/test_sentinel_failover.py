"""Scenario 7: a Sentinel failover while workers wait.

Guarantee: with ``STEPBARRIER_SENTINELS`` set, a forced failover (``SENTINEL
FAILOVER``) loses no release: workers are released after the chief's next
publish, which goes through the new master; none is released early and the
chief's ``publish`` never blocks while the master changes.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig, read_status
from tests.reliability.conftest import FALLBACK, HEARTBEAT, Timings, wait_for_waiters
from tests.reliability.processes import (
    Fleet,
    assert_chief_never_blocked,
    assert_not_early,
)
from tests.reliability.sentinel import SentinelGroup

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(150)]


@pytest.fixture
def group() -> Iterator[SentinelGroup]:
    sentinels = SentinelGroup()
    try:
        yield sentinels.start()
    finally:
        sentinels.cleanup()


def test_workers_are_released_through_the_new_master_after_a_failover(
    group: SentinelGroup, tmp_path: Path, job: str, timings: Timings
) -> None:
    config = BarrierConfig(job=job, sentinels=group.addresses, sentinel_service=group.service)
    fleet = Fleet(
        tmp_path,
        {
            "STEPBARRIER_JOB": job,
            "STEPBARRIER_SENTINELS": group.env_value,
            "STEPBARRIER_SENTINEL_SERVICE": group.service,
            "STEPBARRIER_HEARTBEAT": str(HEARTBEAT),
            "STEPBARRIER_STALL_TIMEOUT": "60",
        },
    )
    try:
        chief = fleet.chief()
        chief.wait_ready()
        chief.train_to(10)
        workers = [
            fleet.worker(f"worker{i}", t, task_id=i, overrides={"fallback_interval": FALLBACK})
            for i, t in ((1, 20), (2, 30))
        ]
        wait_for_waiters(config, 2, workers)

        started = time.time()
        chief.start_training(19, step_seconds=0.3)  # the chief trains on during the failover
        new_master, old_master = group.failover()
        timings.record("failover (forced until all agree)", time.time() - started)
        assert_chief_never_blocked(chief.wait_trained(19))
        assert all(w.still_waiting() for w in workers), "released before its step"

        assert_chief_never_blocked(chief.train_to(35, step_seconds=0.01))
        for worker in workers:
            record = worker.released(timeout=30.0)
            assert_not_early(record, chief)
            timings.record(
                f"{worker.name} released after the chief's step",
                record["t"] - chief.reached(worker.target),
            )

        client = new_master.client()
        try:
            step, writer = client.hmget(config.keys.state, ["step", "chief"])
        finally:
            client.close()
        assert step is not None and int(step) >= 30, "the new master does not hold the step"
        assert writer is not None and writer.decode().endswith(f":{chief.pid}")
        # through Sentinel, the same master: its step, or a later one (the chief's
        # writer may still be storing its last steps)
        assert int(step) <= read_status(config).step <= 35
        assert old_master.port != new_master.port
        assert_chief_never_blocked(chief.close(done=True))
    finally:
        fleet.stop_all()
