"""Every operation of each role, with ops/redis/users.acl loaded: what the role may do
works with its own user, and everything else is refused with a clear message."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from stepbarrier import BarrierConfig, RedisRefused, StepPublisher, StepWaiter, read_status
from stepbarrier.reset import reset_job
from tests.conftest import ROOT
from tests.redis_harness import RedisServer

PASSWORDS = {
    "chief": "chief-example-password",
    "worker": "worker-example-password",
    "monitor": "monitor-example-password",
}
OPERATIONS = ["publish", "wait", "status", "reset"]
ALLOWED = {
    "chief": {"publish", "status", "reset"},
    "worker": {"wait", "status"},
    "monitor": {"status"},
}


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    acl = tmp_path_factory.mktemp("acl") / "users.acl"
    shutil.copy(Path(ROOT, "ops", "redis", "users.acl"), acl)
    server = RedisServer(args=["--aclfile", str(acl)])
    server.start()
    yield server
    server.cleanup()


def as_user(server: RedisServer, job: str, user: str, **extra: float) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=server.url,
        redis_username=user,
        redis_password=PASSWORDS[user],
        heartbeat=0.2,
        **extra,  # type: ignore[arg-type]
    )


def run_publish(config: BarrierConfig) -> None:
    publisher = StepPublisher(config)
    publisher.publish(5)
    stored = publisher.flush(3.0)
    failure = publisher.last_failure
    publisher.close(done=False, timeout=1.0)
    if not stored:  # publish() itself never raises: the thread keeps the reason
        assert failure is not None
        raise failure


def run_wait(config: BarrierConfig) -> None:
    StepWaiter(config).wait(1, timeout=5)


def run_status(config: BarrierConfig) -> None:
    read_status(config)


def run_reset(config: BarrierConfig) -> None:
    reset_job(config)


RUN: dict[str, Callable[[BarrierConfig], None]] = {
    "publish": run_publish,
    "wait": run_wait,
    "status": run_status,
    "reset": run_reset,
}


def seed(server: RedisServer, job: str) -> None:
    """A live chief at step 3, so that a permitted wait for step 1 returns at once."""
    publisher = StepPublisher(as_user(server, job, "chief"))
    publisher.publish(3)
    assert publisher.flush(5.0)
    publisher.close(done=False)


@pytest.mark.parametrize("operation", OPERATIONS)
@pytest.mark.parametrize("role", list(ALLOWED))
def test_each_role_may_do_exactly_its_operations(
    acl_server: RedisServer, job: str, role: str, operation: str
) -> None:
    seed(acl_server, job)
    config = as_user(acl_server, job, role)
    if operation in ALLOWED[role]:
        RUN[operation](config)
        return
    with pytest.raises(RedisRefused) as info:
        RUN[operation](config)
    message = str(info.value)
    assert info.value.kind == "permission", message
    assert "permission" in message.lower() or "NOPERM" in message or "may not" in message


def test_the_refusal_names_the_user_and_the_acl_file(acl_server: RedisServer, job: str) -> None:
    with pytest.raises(RedisRefused) as info:
        reset_job(as_user(acl_server, job, "worker"))
    assert "'worker'" in str(info.value)
    assert "users.acl" in str(info.value)


def test_the_monitor_cannot_write_anything(acl_server: RedisServer, job: str) -> None:
    seed(acl_server, job)
    keys = BarrierConfig(job=job).keys
    monitor = acl_server.client(username="monitor", password=PASSWORDS["monitor"])
    writes: list[Callable[[], object]] = [
        lambda: monitor.hset(keys.state, "step", "999"),
        lambda: monitor.set(keys.reset, "1"),
        lambda: monitor.delete(keys.state),
        lambda: monitor.zadd(keys.targets, {"x": 1}),
        lambda: monitor.rpush(keys.registrations, "1"),
        lambda: monitor.publish(keys.channel, '{"step":999,"generation":1,"done":false}'),
        lambda: monitor.expire(keys.state, 1),
        lambda: monitor.eval("return 1", 0),
    ]
    for write in writes:
        with pytest.raises(redis.exceptions.NoPermissionError):
            write()
    assert read_status(as_user(acl_server, job, "monitor")).step == 3
    monitor.close()


def test_a_worker_cannot_forge_a_release(acl_server: RedisServer, job: str) -> None:
    """Announcements and the stored step are the chief's alone."""
    seed(acl_server, job)
    keys = BarrierConfig(job=job).keys
    worker = acl_server.client(username="worker", password=PASSWORDS["worker"])
    for forge in [
        lambda: worker.publish(
            keys.channel, '{"step":999,"generation":99999999999999,"done":false}'
        ),
        lambda: worker.hset(keys.state, "step", "999"),
        lambda: worker.delete(keys.state),
        lambda: worker.set(keys.reset, "1"),
    ]:
        with pytest.raises(redis.exceptions.NoPermissionError):
            forge()
    worker.close()


def test_a_worker_and_a_chief_with_their_own_users_meet(acl_server: RedisServer, job: str) -> None:
    result: dict[str, int] = {}
    worker_config = as_user(acl_server, job, "worker")

    def wait() -> None:
        with StepWaiter(worker_config) as waiter:
            result["step"] = waiter.wait(4, timeout=30)

    thread = threading.Thread(target=wait)
    thread.start()
    monitor = as_user(acl_server, job, "monitor")
    deadline = time.monotonic() + 10
    while not read_status(monitor).waiters and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [w.wait_until_step for w in read_status(monitor).waiters] == [4]
    with StepPublisher(as_user(acl_server, job, "chief")) as publisher:
        for step in range(1, 6):
            publisher.publish(step)
        thread.join(30)
    assert result["step"] >= 4
