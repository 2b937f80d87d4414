"""Named barriers on a real local Redis Cluster with ops/redis/users.acl: the chief and
worker users meet at a barrier in the job's slot (announced with SPUBLISH), a waiting
arrival follows its slot to another master, and a reset aborts it."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from stepbarrier import Barrier, BarrierAborted, BarrierConfig, read_status
from stepbarrier._inspect.reset import reset_job
from stepbarrier._redis.functions import library_source
from tests.cluster.conftest import Timings
from tests.cluster_harness import LocalCluster
from tests.ops_redis import ACL_FILE, PASSWORDS

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A cluster whose nodes load the shipped users (and the harness's admin)."""
    started = time.monotonic()
    with LocalCluster(aclfile=ACL_FILE) as local:
        local.load_functions(library_source())  # an administrator, on every primary
        Timings(request.module.__name__).record("ACL cluster start", time.monotonic() - started)
        yield local


def as_user(cluster: LocalCluster, job: str, user: str, **extra: object) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=cluster.seed_url,
        redis_cluster=True,
        redis_username=user,
        redis_password=PASSWORDS[user],
        heartbeat=0.2,
        stall_timeout=60.0,
        **extra,  # type: ignore[arg-type]
    )


class Arriving:
    """An arrival in a thread; keeps its result or error."""

    def __init__(self, config: BarrierConfig, name: str, parties: int) -> None:
        self.result: bool | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(config, name, parties))
        self.thread.start()

    def _run(self, config: BarrierConfig, name: str, parties: int) -> None:
        try:
            with Barrier(config, name, parties) as barrier:
                self.result = barrier.arrive(timeout=60)
        except BaseException as exc:
            self.error = exc

    def join(self) -> Arriving:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the arrival did not end"
        return self


def eventually(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def subscribers(cluster: LocalCluster, channel: str) -> int:
    owner = cluster.node_client(cluster.owner_of(channel))
    return int(owner.execute_command("PUBSUB", "SHARDNUMSUB", channel)[1])  # type: ignore[no-untyped-call]


def test_the_chief_and_worker_users_meet_at_a_barrier_in_the_jobs_slot(
    cluster: LocalCluster, timings: Timings
) -> None:
    job = f"meet-{uuid.uuid4().hex[:8]}"
    keys = as_user(cluster, job, "monitor").keys
    names = [keys.state, keys.reset, keys.barrier("start"), keys.barrier_index]
    assert len({cluster.slot_of(name) for name in [*names, keys.barrier_channel]}) == 1
    workers = [Arriving(as_user(cluster, job, "worker", task_id=t), "start", 3) for t in (1, 2)]
    monitor = as_user(cluster, job, "monitor")
    eventually(lambda: any(b.arrived == 2 for b in read_status(monitor).barriers))
    eventually(lambda: subscribers(cluster, keys.barrier_channel) == 2)
    started = time.monotonic()
    with Barrier(as_user(cluster, job, "chief", task_id=0), "start", 3) as barrier:
        assert barrier.arrive(timeout=30)
    for worker in workers:
        assert worker.join().error is None and worker.result is True
    timings.record("barrier: chief's arrival to both workers released", time.monotonic() - started)
    assert read_status(monitor).barriers == ()


def test_a_waiting_arrival_follows_its_slot_to_another_master(
    cluster: LocalCluster, timings: Timings
) -> None:
    job = f"moving-{uuid.uuid4().hex[:8]}"
    keys = as_user(cluster, job, "chief").keys
    waiting = Arriving(as_user(cluster, job, "worker", task_id=1), "end", 2)
    eventually(lambda: subscribers(cluster, keys.barrier_channel) == 1)
    source = cluster.owner_of(keys.barrier_channel)
    target = next(port for port in cluster.masters if port != source)
    started = time.monotonic()
    cluster.migrate_slot(cluster.slot_of(keys.barrier_channel), target)
    timings.record("slot migration", time.monotonic() - started)
    # the arrival hears the server's sunsubscribe and subscribes on the new owner
    eventually(lambda: subscribers(cluster, keys.barrier_channel) == 1)
    assert cluster.owner_of(keys.barrier_channel) == target
    assert waiting.thread.is_alive()
    with Barrier(as_user(cluster, job, "chief", task_id=0), "end", 2) as barrier:
        assert barrier.arrive(timeout=30)
    assert waiting.join().error is None and waiting.result is True


def test_a_reset_on_a_cluster_aborts_a_waiting_arrival(cluster: LocalCluster) -> None:
    job = f"reset-{uuid.uuid4().hex[:8]}"
    keys = as_user(cluster, job, "chief").keys
    waiting = Arriving(as_user(cluster, job, "worker", task_id=1), "start", 2)
    eventually(lambda: subscribers(cluster, keys.barrier_channel) == 1)
    reset_job(as_user(cluster, job, "chief"))
    error = waiting.join().error
    assert isinstance(error, BarrierAborted) and error.reason == "reset"
    admin = cluster.client()
    assert admin.exists(keys.barrier("start")) == 0
