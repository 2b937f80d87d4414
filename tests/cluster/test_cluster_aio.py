"""``AsyncStepWaiter`` on a real Redis Cluster: released, never early, across a slot
migration and a failover (the threaded waiter's scenarios, on asyncio)."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Sequence

import pytest

from stepbarrier import BarrierConfig, StepPublisher
from stepbarrier._redis.functions import install_functions
from stepbarrier.aio import AsyncStepWaiter
from tests.cluster.test_cluster_jobs import cluster_config, eventually, registered, subscribers
from tests.cluster_harness import LocalCluster

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module", autouse=True)
def library(cluster: LocalCluster) -> None:
    """The Functions library on every master, loaded as an administrator would."""
    with cluster.client() as client:
        install_functions(client)


class AsyncWaits:
    """Concurrent waits of one ``AsyncStepWaiter`` on an event loop of their own thread;
    each wait's result (or error) and the time it ended."""

    def __init__(self, config: BarrierConfig, targets: Sequence[int]) -> None:
        self.targets = list(targets)
        self.results: dict[int, int | BaseException] = {}  # by target
        self.ended: dict[int, float] = {}  # by target: when its last wait ended
        self.thread = threading.Thread(target=asyncio.run, args=(self._main(config),))
        self.thread.daemon = True
        self.thread.start()

    async def _main(self, config: BarrierConfig) -> None:
        async with AsyncStepWaiter(config) as waiter:

            async def one(target: int) -> None:
                try:
                    self.results[target] = await waiter.wait(target, timeout=60)
                except BaseException as exc:
                    self.results[target] = exc
                self.ended[target] = time.monotonic()

            await asyncio.gather(*(one(t) for t in self.targets))

    def join(self, timeout: float = 60.0) -> AsyncWaits:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the waits did not end"
        return self


def test_concurrent_async_waits_are_released_by_their_steps_never_before(
    cluster: LocalCluster,
) -> None:
    config = cluster_config(cluster, f"aio-{uuid.uuid4().hex[:8]}")
    with StepPublisher(config) as chief:
        chief.publish(10)
        assert chief.flush(10)
        waits = AsyncWaits(config, [5, 20, 30, 30])
        eventually(lambda: 5 in waits.results)
        assert waits.results[5] == 10  # the step had come before the wait did
        eventually(registered(config, 2))  # the two targets (20, 30) left are registered
        eventually(lambda: subscribers(cluster, config.keys.channel) == 1)  # one, shared
        chief.publish(25)
        eventually(lambda: 20 in waits.results)
        time.sleep(0.2)
        assert 30 not in waits.results, "released before its step"
        published_30 = time.monotonic()
        chief.publish(30)
        waits.join()
    assert waits.results == {5: 10, 20: 25, 30: 30}
    assert waits.ended[30] >= published_30


def test_an_async_wait_across_a_slot_migration_is_woken_by_the_next_announcement(
    cluster: LocalCluster,
) -> None:
    config = cluster_config(cluster, f"aio-moving-{uuid.uuid4().hex[:8]}", fallback_interval=5.0)
    keys = config.keys
    with StepPublisher(config) as chief:
        chief.publish(10)
        assert chief.flush(10)
        waits = AsyncWaits(config, [50])
        eventually(registered(config))
        eventually(lambda: subscribers(cluster, keys.channel) == 1)
        source = cluster.owner_of(keys.state)
        target = next(port for port in cluster.masters if port != source)
        cluster.migrate_slot(cluster.slot_of(keys.state), target)
        # the waiter notices the server's sunsubscribe and subscribes on the new owner
        eventually(lambda: subscribers(cluster, keys.channel) == 1)
        assert cluster.owner_of(keys.channel) == target
        chief.publish(30)
        assert chief.flush(10)
        time.sleep(0.2)
        assert not waits.results, "released before its step"
        chief.publish(50)
        waits.join()
    assert waits.results == {50: 50}


def test_an_async_wait_across_a_failover_is_released_after_the_promotion_never_before(
    cluster: LocalCluster,
) -> None:
    job = f"aio-failover-{uuid.uuid4().hex[:8]}"
    owner = cluster.owner_of(cluster_config(cluster, job).keys.state)
    # the worst case: the seed node of every client is the master that dies
    config = cluster_config(
        cluster, job, fallback_interval=1.0, redis_url=f"redis://127.0.0.1:{owner}/0"
    )
    chief = StepPublisher(config)
    try:
        chief.publish(5)
        assert chief.flush(10)
        waits = AsyncWaits(config, [40, 40])
        eventually(registered(config))
        with cluster.node_client(owner) as node:
            node.execute_command("WAIT", 1, 2000)  # the replica has the state
        cluster.kill_master(owner)
        for step in range(6, 40):  # the chief trains on through the failover
            chief.publish(step)
            time.sleep(0.05)
        promoted = cluster.wait_promoted(owner)
        assert promoted != owner
        assert not waits.results, "released before its step"
        chief.publish(40)
        waits.join()
        assert all(isinstance(r, int) and r >= 40 for r in waits.results.values()), waits.results
    finally:
        chief.close(done=False, timeout=2.0)
