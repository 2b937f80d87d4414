"""The ACL roles on a real Redis Cluster: with ops/redis/users.acl and users that
``stepbarrier acl`` confines to team a, the library loaded on every primary by the
harness's administrator, a team-a chief and worker run a team-a job and are refused
on team b's, and no shipped role runs code of its own on any node."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
import redis
from redis.cluster import RedisCluster

from stepbarrier import BarrierConfig, RedisRefused, StepPublisher, StepWaiter
from stepbarrier._protocol.roles import acl_line, password_hash
from stepbarrier._redis.functions import library_source
from tests.cluster.conftest import Timings
from tests.cluster_harness import HOST, LocalCluster
from tests.ops_redis import PASSWORDS, acl_with

pytestmark = pytest.mark.cluster

TEAM_A = {
    "a-chief": ("chief", "team-a-chief-cluster-secret"),
    "a-worker": ("worker", "team-a-worker-cluster-secret"),
}
LOOP = "local i = 0 while true do i = i + 1 end"


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[LocalCluster]:
    lines = [
        acl_line(user, role, "team-a-*", password_hash(pw)) for user, (role, pw) in TEAM_A.items()
    ]
    acl = acl_with(tmp_path_factory.mktemp("acl"), *lines)
    started = time.monotonic()
    with LocalCluster(aclfile=acl) as local:
        local.load_functions(library_source())  # an administrator, on every primary
        Timings(request.module.__name__).record("ACL cluster start", time.monotonic() - started)
        yield local


def as_team_a(cluster: LocalCluster, job: str, user: str, **extra: float) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=cluster.seed_url,
        redis_cluster=True,
        redis_username=user,
        redis_password=TEAM_A[user][1],
        heartbeat=0.2,
        stall_timeout=60.0,
        **extra,  # type: ignore[arg-type]
    )


def test_a_team_a_worker_is_released_by_a_team_a_chief(cluster: LocalCluster, job: str) -> None:
    name = f"team-a-{job}"[:64]
    result: dict[str, int] = {}

    def wait() -> None:
        with StepWaiter(as_team_a(cluster, name, "a-worker", task_id=1)) as waiter:
            result["step"] = waiter.wait(4, timeout=60)

    thread = threading.Thread(target=wait)
    thread.start()
    with StepPublisher(as_team_a(cluster, name, "a-chief")) as publisher:
        for step in range(1, 6):
            publisher.publish(step)
            time.sleep(0.2)
        thread.join(60)
    assert result["step"] >= 4


def test_a_team_a_worker_is_refused_on_a_team_b_job(cluster: LocalCluster, job: str) -> None:
    name = f"team-b-{job}"[:64]
    waiting = StepWaiter(as_team_a(cluster, name, "a-worker"))
    with waiting as waiter, pytest.raises(RedisRefused) as info:
        waiter.wait(3, timeout=20)
    assert info.value.kind == "permission" and "'a-worker'" in str(info.value)
    keys = BarrierConfig(job=name).keys
    worker = RedisCluster(host=HOST, port=cluster.seed_port, username="a-worker",
                          password=TEAM_A["a-worker"][1])  # fmt: skip
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.zadd(keys.targets, {"evil": 5})
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.hset(keys.waiter("x"), "host", "[/x]")
    finally:
        worker.close()


def test_a_team_a_chief_cannot_publish_to_a_team_b_job(cluster: LocalCluster, job: str) -> None:
    publisher = StepPublisher(as_team_a(cluster, f"team-b-{job}"[:64], "a-chief"))
    publisher.publish(5)
    assert not publisher.flush(10.0)
    failure = publisher.last_failure
    publisher.close(done=False, timeout=1.0)
    assert isinstance(failure, RedisRefused) and failure.kind == "permission", failure


@pytest.mark.parametrize("user", ["chief", "worker", "monitor", "emergency", "installer"])
def test_no_shipped_user_runs_a_script_on_any_primary(cluster: LocalCluster, user: str) -> None:
    for port in cluster.masters:
        client = cluster.node_client(port, username=user, password=PASSWORDS[user])
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.eval(LOOP, 0)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.script_load(LOOP)
