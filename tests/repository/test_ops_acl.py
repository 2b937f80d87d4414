"""ops/redis (users.acl, redis.conf, start-redis.sh and the Functions library), run
by a real redis-server started the way ops starts it: each user can do its job and
nothing more, and the library is there at every start."""

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
from stepbarrier._protocol.roles import acl_line, password_hash
from stepbarrier._redis.functions import LIBRARY_VERSION, function_name, library_source
from tests.conftest import subprocess_env
from tests.ops_redis import (
    ACL_FILE,
    HARNESS_LINE,
    HARNESS_PASSWORD,
    HARNESS_USER,
    LIBRARY_FILE,
    PASSWORDS,
    REDIS_CONF,
    SHIPPED_USERS,
    OpsRedis,
    acl_with,
)
from tests.redis_harness import RedisServer

CLI = [sys.executable, "-m", "stepbarrier"]


@pytest.fixture(scope="module")
def acl_server() -> Iterator[OpsRedis]:
    server = OpsRedis()
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


def shipped_lines() -> dict[str, str]:
    """Each user's line of ops/redis/users.acl, by user."""
    lines = ACL_FILE.read_text().splitlines()
    return {line.split()[1]: line for line in lines if line.strip()}


def test_the_file_defines_the_shipped_users_with_marked_example_passwords() -> None:
    assert set(shipped_lines()) == {"default", *SHIPPED_USERS}
    assert all("example" in password for password in PASSWORDS.values())
    assert re.search(r"^user default off\b", ACL_FILE.read_text(), re.MULTILINE)


def test_no_password_is_in_the_file_in_clear() -> None:
    text = ACL_FILE.read_text()
    assert ">" not in text and "nopass" not in text
    for password in PASSWORDS.values():
        assert password not in text


@pytest.mark.parametrize("user", SHIPPED_USERS)
def test_each_shipped_user_is_the_generators_line_for_every_job(user: str) -> None:
    expected = acl_line(user, user, "*", password_hash(PASSWORDS[user]))
    assert shipped_lines()[user] == expected


def test_the_library_file_is_the_librarys_source() -> None:
    assert LIBRARY_FILE.read_text() == library_source(), (
        "ops/redis/stepbarrier-functions.lua is stale: regenerate it with "
        "`stepbarrier functions source > ops/redis/stepbarrier-functions.lua`"
    )


def test_redis_conf_ends_runaway_code_after_a_second() -> None:
    directives = [line.split() for line in REDIS_CONF.read_text().splitlines()]
    assert ["busy-reply-threshold", "1000"] in directives
    assert "FUNCTION KILL" in REDIS_CONF.read_text() and "SCRIPT KILL" in REDIS_CONF.read_text()


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


def test_worker_cannot_write_the_state_directly_or_through_code(
    acl_server: RedisServer, job: str
) -> None:
    keys = user_config(acl_server, job, "worker").keys
    client = acl_server.client(username="worker", password=PASSWORDS["worker"])
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.hset(keys.state, "step", "999")
        with pytest.raises(redis.exceptions.NoPermissionError):  # no code of its own
            client.eval("return redis.call('HSET', ARGV[1], 'step', 999)", 0, keys.state)
        with pytest.raises(redis.exceptions.NoPermissionError):  # FCALL: RW on its keys
            client.fcall(function_name("may_write"), 1, keys.state)
        with pytest.raises(redis.exceptions.NoPermissionError):  # the state as its "entry"
            client.fcall(
                function_name("waiter_register"), 3, keys.state, keys.targets,
                keys.registrations, 30, 60, "x", 5, "step", "999",
            )  # fmt: skip
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


def test_the_start_script_loads_the_library_for_the_chief(acl_server: OpsRedis) -> None:
    chief = acl_server.as_user("chief")
    try:
        assert chief.fcall(function_name("version"), 0) == LIBRARY_VERSION
    finally:
        chief.close()


def test_the_library_is_loaded_again_after_redis_restarts_empty(job: str) -> None:
    server = OpsRedis()
    try:
        server.start()
        server.restart_empty()  # SIGKILL to the script and its server, then a new start
        assert run(user_env(server, job, "chief"), "publish", "4").returncode == 0
        assert read_status(user_config(server, job, "monitor")).step == 4
    finally:
        server.cleanup()


def test_the_start_script_stops_the_server_when_it_cannot_load_the_library(
    tmp_path: Path,
) -> None:
    wrong = tmp_path / "installer.password"
    wrong.write_text("not-the-installer-password\n")
    server = OpsRedis(installer_password_file=wrong)
    try:
        server.start(wait=False)
        assert server.process is not None
        assert server.process.wait(30) == 1
        assert server.process.stderr is not None
        err = server.process.stderr.read().decode()
        assert "refused the installer user" in err
        assert "not-the-installer-password" not in err
        with pytest.raises(redis.ConnectionError):  # no server left behind
            server.client(socket_connect_timeout=2).ping()
    finally:
        server.cleanup()


def test_the_server_does_not_inherit_the_installer_password(acl_server: OpsRedis) -> None:
    assert acl_server.process is not None
    shell = acl_server.process.pid
    [child] = Path(f"/proc/{shell}/task/{shell}/children").read_text().split()
    assert "redis-server" in Path(f"/proc/{child}/cmdline").read_text()
    environment = Path(f"/proc/{child}/environ").read_bytes()
    assert b"REDISCLI_AUTH" not in environment
    assert PASSWORDS["installer"].encode() not in environment


def test_on_a_replica_the_start_script_takes_the_library_from_the_primary(
    tmp_path: Path, job: str
) -> None:
    """start-redis.sh runs on every node: a replica refuses FUNCTION LOAD (READONLY)
    and gets the library with the primary's data instead."""
    acl = acl_with(tmp_path, HARNESS_LINE)  # replication logs in as the harness
    primary, replica = OpsRedis(acl_file=acl), OpsRedis(acl_file=acl)
    replica.args += ["--replicaof", "127.0.0.1", str(primary.port)]
    replica.args += ["--masteruser", HARNESS_USER, "--masterauth", HARNESS_PASSWORD]
    try:
        primary.start()
        replica.start()  # waits until the installer sees the library on the replica
        assert run(user_env(primary, job, "chief"), "publish", "2").returncode == 0
        monitor = replica.as_user("monitor")
        try:
            deadline = time.monotonic() + 30
            while monitor.hmget(f"stepbarrier:{{{job}}}:state", ["step"])[0] != b"2":
                assert time.monotonic() < deadline, "the replica never got the step"
                time.sleep(0.05)
        finally:
            monitor.close()
    finally:
        replica.cleanup()
        primary.cleanup()
