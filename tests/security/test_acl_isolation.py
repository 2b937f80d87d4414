"""Users confined to one team's jobs by ``stepbarrier acl``: a team-a worker and chief
run a team-a job end to end, and are refused on every key and channel of team b.

The users are the CLI's own output (a subprocess), loaded from an aclfile next to
the shipped users, or with ``ACL SETUSER``; the library is loaded by the installer,
as ops does.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from stepbarrier import BarrierConfig, RedisRefused, StepPublisher, StepWaiter, read_status
from stepbarrier._redis.functions import function_name
from tests.conftest import subprocess_env
from tests.ops_redis import HARNESS_LINE, HARNESS_PASSWORD, HARNESS_USER, OpsRedis, acl_with

CLI = [sys.executable, "-m", "stepbarrier"]
TEAM_A = {
    "a-chief": ("chief", "team-a-chief-secret-9f3e"),
    "a-worker": ("worker", "team-a-worker-secret-41c7"),
    "a-monitor": ("monitor", "team-a-monitor-secret-d02b"),
}
"""Team a's users: role and password, for the jobs ``team-a-*``."""


def generate(role: str, user: str, jobs: str, password: str) -> subprocess.CompletedProcess[str]:
    """``stepbarrier acl`` in a subprocess, the password on stdin (not a terminal)."""
    return subprocess.run(
        [*CLI, "acl", role, "--user", user, "--jobs", jobs],
        input=password + "\n",
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def generated_line(role: str, user: str, jobs: str, password: str) -> str:
    result = generate(role, user, jobs, password)
    assert result.returncode == 0, result.stderr
    assert password not in result.stdout + result.stderr
    [line] = result.stdout.splitlines()
    return line


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRedis]:
    """The shipped users, team a's users from the CLI, and the harness (ACL SETUSER)."""
    lines = [generated_line(role, user, "team-a-*", pw) for user, (role, pw) in TEAM_A.items()]
    acl = acl_with(tmp_path_factory.mktemp("acl"), *lines, HARNESS_LINE)
    server = OpsRedis(acl_file=acl)
    server.start()
    yield server
    server.cleanup()


def config(server: OpsRedis, job: str, user: str, **extra: float) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=server.url,
        redis_username=user,
        redis_password=TEAM_A[user][1],
        heartbeat=0.2,
        stall_timeout=30.0,
        **extra,  # type: ignore[arg-type]
    )


def team_job(team: str, job: str) -> str:
    """A job of ``team`` unique to this test."""
    return f"team-{team}-{job}"[:64]


def run_a_job(chief: BarrierConfig, worker: BarrierConfig, monitor: BarrierConfig) -> int:
    """A worker waits for step 4 and the chief trains to 5; returns the step it saw."""
    result: dict[str, int] = {}

    def wait() -> None:
        with StepWaiter(worker) as waiter:
            result["step"] = waiter.wait(4, timeout=30)

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 15
    while not read_status(monitor).waiters and time.monotonic() < deadline:
        time.sleep(0.02)
    assert [w.wait_until_step for w in read_status(monitor).waiters] == [4]
    with StepPublisher(chief) as publisher:
        for step in range(1, 6):
            publisher.publish(step)
        thread.join(30)
    return result["step"]


def test_a_team_a_worker_is_released_by_a_team_a_chief(team_server: OpsRedis, job: str) -> None:
    name = team_job("a", job)
    released = run_a_job(
        config(team_server, name, "a-chief"),
        config(team_server, name, "a-worker", task_id=1),
        config(team_server, name, "a-monitor"),
    )
    assert released >= 4


def test_a_team_a_worker_cannot_touch_a_team_b_jobs_keys(team_server: OpsRedis, job: str) -> None:
    keys = BarrierConfig(job=team_job("b", job)).keys
    registry = [keys.waiter("x"), keys.targets, keys.registrations]
    entry = [30, 60, "x", 5, "host", "[/x]"]
    worker = team_server.as_user("a-worker", TEAM_A["a-worker"][1])
    attempts: dict[str, Callable[[], object]] = {
        "ZADD targets": lambda: worker.zadd(keys.targets, {"evil": 5}),
        "HSET a waiter entry": lambda: worker.hset(keys.waiter("x"), "host", "[/x]"),
        "read the state": lambda: worker.hgetall(keys.state),
        "register through the library": lambda: worker.fcall(
            function_name("waiter_register"), 3, *registry, *entry
        ),
        "read through the library": lambda: worker.fcall_ro(
            function_name("waiter_read"), 2, keys.state, keys.reset
        ),
        "SUBSCRIBE": lambda: worker.execute_command("SUBSCRIBE", keys.channel),  # type: ignore[no-untyped-call]
    }
    try:
        for name, attempt in attempts.items():
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
                pytest.fail(f"the team-a worker could {name} on team b's job")
    finally:
        worker.close()


def test_a_team_a_worker_cannot_write_the_state_of_its_own_job(
    team_server: OpsRedis, job: str
) -> None:
    keys = BarrierConfig(job=team_job("a", job)).keys
    worker = team_server.as_user("a-worker", TEAM_A["a-worker"][1])
    attempts: list[Callable[[], object]] = [
        lambda: worker.hset(keys.state, "step", "999"),
        lambda: worker.delete(keys.state),
        lambda: worker.set(keys.reset, "1"),
        lambda: worker.publish(keys.channel, '{"step":999,"generation":1,"done":false}'),
        lambda: worker.fcall(function_name("may_write"), 1, keys.state),
    ]
    try:
        for attempt in attempts:
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        worker.close()


def test_a_team_a_worker_waiting_on_a_team_b_job_is_refused_by_name(
    team_server: OpsRedis, job: str
) -> None:
    worker = config(team_server, team_job("b", job), "a-worker")
    with StepWaiter(worker) as waiter, pytest.raises(RedisRefused) as info:
        waiter.wait(3, timeout=10)
    assert info.value.kind == "permission"
    assert "'a-worker'" in str(info.value)


def test_a_team_a_chief_cannot_publish_to_a_team_b_job(team_server: OpsRedis, job: str) -> None:
    publisher = StepPublisher(config(team_server, team_job("b", job), "a-chief"))
    publisher.publish(5)
    assert not publisher.flush(5.0)
    failure = publisher.last_failure
    publisher.close(done=False, timeout=1.0)
    assert isinstance(failure, RedisRefused), failure
    assert failure.kind == "permission"
    assert "'a-chief'" in str(failure)


def test_a_team_a_chief_cannot_subscribe_or_publish_on_team_bs_channel(
    team_server: OpsRedis, job: str
) -> None:
    keys = BarrierConfig(job=team_job("b", job)).keys
    chief = team_server.as_user("a-chief", TEAM_A["a-chief"][1])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            chief.publish(keys.channel, '{"step":999,"generation":1,"done":false}')
        with pytest.raises(redis.exceptions.NoPermissionError):
            chief.execute_command("SUBSCRIBE", keys.channel)  # type: ignore[no-untyped-call]
        with pytest.raises(redis.exceptions.NoPermissionError):  # the library, team b's keys
            chief.fcall(function_name("may_write"), 1, keys.state)
    finally:
        chief.close()


def test_a_team_a_monitor_cannot_read_a_team_b_jobs_status(team_server: OpsRedis, job: str) -> None:
    with pytest.raises(RedisRefused) as info:
        read_status(config(team_server, team_job("b", job), "a-monitor"))
    assert info.value.kind == "permission"


def cli_env(server: OpsRedis, job: str, user: str) -> dict[str, str]:
    return subprocess_env(
        STEPBARRIER_REDIS_URL=server.url,
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_USERNAME=user,
        STEPBARRIER_REDIS_PASSWORD=TEAM_A[user][1],
    )


def test_the_cli_exits_2_when_a_team_a_user_acts_on_a_team_b_job(
    team_server: OpsRedis, job: str
) -> None:
    commands = {
        "a-chief": ["publish", "5"],
        "a-worker": ["wait", "--until", "3", "--timeout", "30"],
    }
    for user, command in commands.items():
        result = subprocess.run(
            [*CLI, *command],
            env=cli_env(team_server, team_job("b", job), user),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 2, result.stderr
        assert f"user '{user}' may not" in result.stderr
        assert TEAM_A[user][1] not in result.stderr


def test_the_cli_runs_a_team_a_job_with_its_users(team_server: OpsRedis, job: str) -> None:
    name = team_job("a", job)
    waiting = subprocess.Popen(
        [*CLI, "wait", "--until", "3", "--timeout", "60"],
        env=cli_env(team_server, name, "a-worker"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    monitor = config(team_server, name, "a-monitor")
    deadline = time.monotonic() + 30
    while not read_status(monitor).waiters:
        assert waiting.poll() is None, waiting.communicate()
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.05)
    published = subprocess.run(
        [*CLI, "publish", "3"],
        env=cli_env(team_server, name, "a-chief"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert published.returncode == 0, published.stderr
    out, err = waiting.communicate(timeout=60)
    assert (waiting.returncode, out) == (0, "3\n"), err


def test_the_cli_line_works_through_acl_setuser(team_server: OpsRedis, job: str) -> None:
    password = "setuser-worker-secret-77aa"
    line = generated_line("worker", "setuser-worker", "team-a-*", password)
    user, name, *rules = line.split()
    assert (user, name) == ("user", "setuser-worker")
    harness = team_server.as_user(HARNESS_USER, HARNESS_PASSWORD)
    try:
        harness.execute_command("ACL", "SETUSER", name, "resetpass", *rules)  # type: ignore[no-untyped-call]
    finally:
        harness.close()
    own, other = (
        BarrierConfig(job=team_job("a", job)).keys,
        BarrierConfig(job=team_job("b", job)).keys,
    )
    worker = team_server.as_user(name, password)
    try:
        assert worker.fcall_ro(function_name("waiter_read"), 2, own.state, own.reset)
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.zadd(other.targets, {"evil": 5})
    finally:
        worker.close()


def test_an_emergency_and_an_installer_line_from_the_cli_work(
    team_server: OpsRedis, tmp_path: Path
) -> None:
    for role, password in [("emergency", "e-secret-5c1d"), ("installer", "i-secret-0b9e")]:
        secret = tmp_path / f"{role}.password"
        secret.write_text(password + "\n")
        result = subprocess.run(
            [*CLI, "acl", role, "--user", f"gen-{role}", "--password-file", str(secret)],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert result.returncode == 0, result.stderr
        assert password not in result.stdout + result.stderr
        _user, name, *rules = result.stdout.split()
        harness = team_server.as_user(HARNESS_USER, HARNESS_PASSWORD)
        try:
            harness.execute_command("ACL", "SETUSER", name, *rules)  # type: ignore[no-untyped-call]
        finally:
            harness.close()
        client = team_server.as_user(name, password)
        try:
            assert client.ping()
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.get("stepbarrier:{team-a-x}:state")
        finally:
            client.close()
