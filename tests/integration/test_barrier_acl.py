"""Named barriers with ops/redis/users.acl loaded and the library loaded by the
installer: the worker and the chief users arrive (the worker writing only barrier
keys, and announcing only on the barrier channel), the monitor sees open barriers
and cannot arrive, and the chief finishes the job after the end barrier."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
import redis

from stepbarrier import Barrier, BarrierConfig, RedisRefused, read_status
from stepbarrier._barriers.finish import finish_job
from tests.conftest import subprocess_env
from tests.ops_redis import (
    HARNESS_LINE,
    HARNESS_PASSWORD,
    HARNESS_USER,
    PASSWORDS,
    OpsRedis,
    acl_with,
)

CLI = [sys.executable, "-m", "stepbarrier"]


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRedis]:
    """ops/redis, plus the tests' all-powerful harness user to look at the keys."""
    server = OpsRedis(acl_file=acl_with(tmp_path_factory.mktemp("acl"), HARNESS_LINE))
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def as_user(server: OpsRedis, job: str, user: str, **extra: object) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=server.url,
        redis_username=user,
        redis_password=PASSWORDS[user],
        heartbeat=0.2,
        stall_timeout=30.0,
        **extra,  # type: ignore[arg-type]
    )


def test_the_worker_and_the_chief_users_meet_at_a_barrier(acl_server: OpsRedis, job: str) -> None:
    waiting = subprocess.Popen(
        [*CLI, "arrive", "start", "--parties", "2", "--task-id", "1", "--timeout", "60"],
        env=subprocess_env(
            STEPBARRIER_REDIS_URL=acl_server.url,
            STEPBARRIER_JOB=job,
            STEPBARRIER_REDIS_USERNAME="worker",
            STEPBARRIER_REDIS_PASSWORD=PASSWORDS["worker"],
        ),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    monitor = as_user(acl_server, job, "monitor")
    deadline = time.monotonic() + 30
    while not read_status(monitor).barriers:
        assert waiting.poll() is None, waiting.communicate()
        assert time.monotonic() < deadline, "the worker never arrived"
        time.sleep(0.05)
    [shown] = read_status(monitor).barriers
    assert (shown.arrived, shown.missing) == (1, (0,))
    with Barrier(as_user(acl_server, job, "chief", task_id=0), "start", 2) as barrier:
        assert barrier.arrive(timeout=30)
    out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 0, err
    assert "complete" in out


def test_the_worker_announces_on_the_barrier_channel_only(acl_server: OpsRedis, job: str) -> None:
    keys = BarrierConfig(job=job).keys
    worker = acl_server.as_user("worker")
    try:
        worker.publish(keys.barrier_channel, '{"barrier":"start","complete":true}')
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.publish(keys.channel, '{"step":999,"generation":99999999999999,"done":false}')
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.hset(keys.state, "step", "999")
    finally:
        worker.close()


def test_the_monitor_cannot_arrive(acl_server: OpsRedis, job: str) -> None:
    with pytest.raises(RedisRefused) as info:
        Barrier(as_user(acl_server, job, "monitor", task_id=0), "start", 1).arrive(timeout=5)
    assert info.value.kind == "permission"


def test_the_chief_finishes_the_job_and_shortens_its_barriers_ttl(
    acl_server: OpsRedis, job: str
) -> None:
    chief = as_user(acl_server, job, "chief", task_id=0, done_ttl=120)
    with Barrier(chief, "end", 1) as barrier:
        assert barrier.arrive(timeout=10)
    assert finish_job(chief, 42)
    status = read_status(as_user(acl_server, job, "monitor"))
    assert (status.step, status.done) == (42, True)
    admin = acl_server.as_user(HARNESS_USER, HARNESS_PASSWORD)
    try:
        assert 0 < admin.ttl(chief.keys.barrier("end")) <= 120
    finally:
        admin.close()
