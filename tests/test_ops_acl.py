"""ops/redis/users.acl and redis.conf, loaded by a real redis-server: each user can
do its job and nothing more."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter, read_status
from tests.conftest import ROOT, subprocess_env
from tests.redis_harness import RedisServer

OPS = Path(ROOT) / "ops" / "redis"
ACL_FILE = OPS / "users.acl"
CLI = [sys.executable, "-m", "stepbarrier"]


def example_passwords() -> dict[str, str]:
    """The example passwords of ops/redis/users.acl, by user."""
    found = re.findall(r"^user (\w+) on .*?>(\S+)", ACL_FILE.read_text(), re.MULTILINE)
    return dict(found)


PASSWORDS = example_passwords()


class ConfiguredRedis(RedisServer):
    """redis-server started with ops/redis/redis.conf; the harness's arguments
    (loopback, free port, temporary dir) and the ACL file's real path win."""

    def command(self) -> list[str]:
        binary, *args = super().command()
        return [binary, str(OPS / "redis.conf"), *args]


@pytest.fixture(scope="module")
def acl_server() -> Iterator[RedisServer]:
    server = ConfiguredRedis(args=["--aclfile", str(ACL_FILE)])
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def user_env(
    server: RedisServer, job: str, user: str, password: str | None = None
) -> dict[str, str]:
    return subprocess_env(
        STEPBARRIER_REDIS_URL=server.url,
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_USERNAME=user,
        STEPBARRIER_REDIS_PASSWORD=PASSWORDS[user] if password is None else password,
    )


def user_config(server: RedisServer, job: str, user: str, **extra: object) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=server.url,
        redis_username=user,
        redis_password=PASSWORDS[user],
        **extra,  # type: ignore[arg-type]
    )


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def wait_for_waiters(config: BarrierConfig, count: int, process: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + 30
    while len(read_status(config).waiters) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the waiter never registered"
        time.sleep(0.05)


def test_the_file_defines_chief_worker_and_monitor_with_marked_example_passwords() -> None:
    assert set(PASSWORDS) == {"chief", "worker", "monitor"}
    assert all("example" in password for password in PASSWORDS.values())
    assert re.search(r"^user default off\b", ACL_FILE.read_text(), re.MULTILINE)


def test_the_default_user_is_off(acl_server: RedisServer) -> None:
    client = acl_server.client()
    with pytest.raises(redis.AuthenticationError):
        client.ping()
    client.close()


def test_chief_publishes(acl_server: RedisServer, job: str) -> None:
    result = run(user_env(acl_server, job, "chief"), "publish", "7")
    assert result.returncode == 0, result.stderr
    assert read_status(user_config(acl_server, job, "monitor")).step == 7


def test_chief_reads_its_password_from_a_file(
    acl_server: RedisServer, job: str, tmp_path: Path
) -> None:
    secret = tmp_path / "chief.password"
    secret.write_text(PASSWORDS["chief"] + "\n")
    env = user_env(acl_server, job, "chief")
    del env["STEPBARRIER_REDIS_PASSWORD"]
    result = run(env, "publish", "3", "--password-file", str(secret))
    assert result.returncode == 0, result.stderr


def test_worker_waits_registers_and_is_released(acl_server: RedisServer, job: str) -> None:
    monitor = user_config(acl_server, job, "monitor")
    waiting = subprocess.Popen(
        [*CLI, "wait", "--until", "5", "--task-id", "2", "--timeout", "60"],
        env=user_env(acl_server, job, "worker"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_for_waiters(monitor, 1, waiting)
    [waiter] = read_status(monitor).waiters
    assert (waiter.task_id, waiter.wait_until_step) == (2, 5)
    client = acl_server.client(username="monitor", password=PASSWORDS["monitor"])
    assert client.zrange(monitor.keys.targets, 0, -1, withscores=True)[0][1] == 5.0
    client.close()
    assert run(user_env(acl_server, job, "chief"), "publish", "5").returncode == 0
    out, err = waiting.communicate(timeout=60)
    assert (waiting.returncode, out) == (0, "5\n"), err


def test_the_chief_hears_a_worker_registration(acl_server: RedisServer, job: str) -> None:
    chief = user_config(acl_server, job, "chief", heartbeat=0.2)
    worker = user_config(acl_server, job, "worker", task_id=1)
    with StepPublisher(chief) as publisher, StepWaiter(worker) as waiter:
        publisher.publish(1)
        assert publisher.flush(10)
        waiting = subprocess.Popen(  # the waiter in another process, with the worker user
            [*CLI, "wait", "--until", "4", "--timeout", "60"],
            env=user_env(acl_server, job, "worker"),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 30
        while publisher.next_threshold != 4:
            assert time.monotonic() < deadline, "the chief never heard of the target"
            time.sleep(0.05)
        publisher.publish(4)
        out, err = waiting.communicate(timeout=60)
        assert (waiting.returncode, out) == (0, "4\n"), err
        assert waiter.wait(4, timeout=10) == 4


def test_worker_cannot_publish(acl_server: RedisServer, job: str) -> None:
    assert run(user_env(acl_server, job, "chief"), "publish", "2").returncode == 0
    result = run(user_env(acl_server, job, "worker"), "publish", "999")
    assert result.returncode == 2
    assert "user 'worker' may not" in result.stderr
    assert result.stderr.count("\n") == 1
    assert read_status(user_config(acl_server, job, "monitor")).step == 2


def test_worker_cannot_reset(acl_server: RedisServer, job: str) -> None:
    assert run(user_env(acl_server, job, "chief"), "publish", "2").returncode == 0
    result = run(user_env(acl_server, job, "worker"), "reset", "--yes")
    assert result.returncode == 2
    assert "user 'worker' may not reset the job" in result.stderr
    assert read_status(user_config(acl_server, job, "monitor")).step == 2


def test_worker_cannot_write_the_state_directly_or_through_a_script(
    acl_server: RedisServer, job: str
) -> None:
    keys = user_config(acl_server, job, "worker").keys
    client = acl_server.client(username="worker", password=PASSWORDS["worker"])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.hset(keys.state, "step", "999")
        with pytest.raises(redis.ResponseError):  # undeclared key: checked inside the script
            client.eval("return redis.call('HSET', ARGV[1], 'step', 999)", 0, keys.state)
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.publish(keys.channel, '{"step":999,"generation":1,"done":false}')
    finally:
        client.close()


def test_monitor_runs_status_but_cannot_publish_or_reset(acl_server: RedisServer, job: str) -> None:
    assert run(user_env(acl_server, job, "chief"), "publish", "6").returncode == 0
    monitor = user_env(acl_server, job, "monitor")
    status = run(monitor, "status", "--json")
    assert status.returncode == 0, status.stderr
    assert '"step": 6' in status.stdout
    published = run(monitor, "publish", "7")
    assert published.returncode == 2
    assert "user 'monitor' may not" in published.stderr
    assert run(monitor, "reset", "--yes").returncode == 2
    assert read_status(user_config(acl_server, job, "monitor")).step == 6


def test_wrong_password_is_a_clean_exit_2(acl_server: RedisServer, job: str) -> None:
    result = run(user_env(acl_server, job, "chief", password="not-the-password"), "status")
    assert result.returncode == 2
    assert "refused authentication" in result.stderr
    assert "not-the-password" not in result.stderr
    assert result.stderr.count("\n") == 1
    assert "Traceback" not in result.stderr


def test_no_user_at_all_is_a_clean_exit_2(acl_server: RedisServer, job: str) -> None:
    env = subprocess_env(STEPBARRIER_REDIS_URL=acl_server.url, STEPBARRIER_JOB=job)
    result = run(env, "wait", "--until", "3", "--timeout", "30")
    assert result.returncode == 2
    assert "authentication" in result.stderr
