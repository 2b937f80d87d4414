"""Every operation of each role, with ops/redis/users.acl loaded and the library loaded
by the installer: what the role may do works with its own user, everything else is
refused with a clear message, and no user can run code of its own or block Redis."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from stepbarrier import Barrier, BarrierConfig, RedisRefused, StepPublisher, StepWaiter, read_status
from stepbarrier._inspect.missing import is_missing
from stepbarrier._inspect.reset import reset_job
from stepbarrier._redis.functions import function_name
from stepbarrier.cli import cli
from stepbarrier.cli._context import EXIT_NO_JOB
from tests.ops_redis import (
    HARNESS_LINE,
    HARNESS_PASSWORD,
    HARNESS_USER,
    PASSWORDS,
    OpsRedis,
    acl_with,
)
from tests.redis_harness import RedisServer

OPERATIONS = ["publish", "wait", "status", "reset", "arrive"]
ALLOWED = {
    # the chief subscribes for its own barrier arrivals, so it may wait for a step too
    "chief": {"publish", "wait", "status", "reset", "arrive"},
    # the worker's status shows the step, not the waiters (a range read: below)
    "worker": {"wait", "status", "arrive"},
    "monitor": {"status"},
}
LOOP = "local i = 0 while true do i = i + 1 end"
"""The issue's blocking loop: Redis answers BUSY to everyone while it runs."""


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRedis]:
    """ops/redis, plus an all-powerful harness user that stands for whatever else
    could have put runaway code into Redis."""
    acl = acl_with(tmp_path_factory.mktemp("acl"), HARNESS_LINE)
    server = OpsRedis(acl_file=acl)
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
        run_id="acl-roles",  # the seeded pin is this run's: a wait may trust it unseen
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


def run_arrive(config: BarrierConfig) -> None:
    with Barrier(dataclasses.replace(config, task_id=0), "probe", 1) as barrier:
        assert barrier.arrive(timeout=5)


RUN: dict[str, Callable[[BarrierConfig], None]] = {
    "publish": run_publish,
    "wait": run_wait,
    "status": run_status,
    "reset": run_reset,
    "arrive": run_arrive,
}


def seed(server: RedisServer, job: str) -> None:
    """A step 3 pinned by an operator (the chief's user), so that a permitted wait for
    step 1 returns at once (a stored step alone, with no live chief, releases no one)."""
    publisher = StepPublisher(as_user(server, job, "chief"), operator=True)
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


def test_a_workers_status_shows_the_step_and_says_why_not_the_waiters(
    acl_server: RedisServer, job: str
) -> None:
    seed(acl_server, job)
    chief, worker = as_user(acl_server, job, "chief"), as_user(acl_server, job, "worker")
    keys = chief.keys
    admin = acl_server.client(username="chief", password=PASSWORDS["chief"])
    admin.zadd(keys.targets, {"w1": 9})  # a waiter, so that the listing must read
    admin.zadd(keys.barrier_index, {"start": 1})
    status = read_status(worker)
    assert status.step == 3 and status.waiters == ()
    shown = " ".join(status.problems)
    assert "waiters not shown" in shown and "barriers not shown" in shown
    assert "monitor user" in shown
    assert "not shown" not in " ".join(read_status(chief).problems)
    admin.close()


@pytest.mark.parametrize("role", ["worker", "chief", "monitor"])
def test_a_job_that_is_not_there_is_missing_for_every_role(
    acl_server: RedisServer, job: str, role: str
) -> None:
    """A worker may not list the waiters, but ZCARD shows there are none: the job is
    missing (exit 6), not dead (7), whichever password reads it."""
    assert is_missing(read_status(as_user(acl_server, job, role)))
    env = {
        "STEPBARRIER_REDIS_URL": acl_server.url,
        "STEPBARRIER_REDIS_USERNAME": role,
        "STEPBARRIER_REDIS_PASSWORD": PASSWORDS[role],
    }
    result = CliRunner().invoke(cli, ["status", "--job", job, "--check"], env=env)
    assert result.exit_code == EXIT_NO_JOB, result.output


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
    forgeries: list[Callable[[], object]] = [
        lambda: worker.publish(
            keys.channel, '{"step":999,"generation":99999999999999,"done":false}'
        ),
        lambda: worker.hset(keys.state, "step", "999"),
        lambda: worker.delete(keys.state),
        lambda: worker.set(keys.reset, "1"),
    ]
    for forge in forgeries:
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


def harness_client(server: OpsRedis) -> redis.Redis:
    return server.as_user(HARNESS_USER, HARNESS_PASSWORD)


def answers(server: OpsRedis) -> bool:
    """Redis answers the monitor at once: nothing blocks it."""
    monitor = server.as_user("monitor")
    try:
        return bool(monitor.ping())
    finally:
        monitor.close()


def loaded_script(server: OpsRedis) -> str:
    """The SHA1 of the blocking loop, loaded by the harness (as if someone had)."""
    harness = harness_client(server)
    try:
        return str(harness.script_load(f"{LOOP} return 1"))
    finally:
        harness.close()


CODE_OF_ITS_OWN: dict[str, Callable[[redis.Redis, str], object]] = {
    "EVAL": lambda client, sha: client.eval(LOOP, 0),
    "EVAL_RO": lambda client, sha: client.eval_ro(LOOP, 0),
    "EVALSHA of a loaded script": lambda client, sha: client.evalsha(sha, 0),
    "EVALSHA of an unknown script": lambda client, sha: client.evalsha("0" * 40, 0),
    "SCRIPT LOAD": lambda client, sha: client.script_load(LOOP),
    "FUNCTION LOAD": lambda client, sha: client.function_load(
        f"#!lua name=evil\nredis.register_function('evil', function() {LOOP} end)"
    ),
    "FUNCTION DELETE": lambda client, sha: client.function_delete("stepbarrier_v1"),
    "FUNCTION FLUSH": lambda client, sha: client.function_flush(),
}


@pytest.mark.parametrize("attack", list(CODE_OF_ITS_OWN))
@pytest.mark.parametrize("user", ["chief", "worker", "monitor", "emergency"])
def test_no_user_that_may_hold_a_hosts_password_runs_code_of_its_own(
    acl_server: OpsRedis, user: str, attack: str
) -> None:
    sha = loaded_script(acl_server)
    client = acl_server.as_user(user)
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            CODE_OF_ITS_OWN[attack](client, sha)
    finally:
        client.close()
    assert answers(acl_server)


@pytest.mark.parametrize("attack", ["EVAL", "EVAL_RO", "EVALSHA of a loaded script", "SCRIPT LOAD"])
def test_the_installer_runs_no_script_either(acl_server: OpsRedis, attack: str) -> None:
    sha = loaded_script(acl_server)
    installer = acl_server.as_user("installer")
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            CODE_OF_ITS_OWN[attack](installer, sha)
    finally:
        installer.close()


def test_the_installer_calls_no_function_and_touches_no_key(acl_server: OpsRedis, job: str) -> None:
    seed(acl_server, job)
    keys = BarrierConfig(job=job).keys
    installer = acl_server.as_user("installer")
    attempts: list[Callable[[], object]] = [
        lambda: installer.fcall(function_name("version"), 0),
        lambda: installer.fcall_ro(function_name("waiter_read"), 2, keys.state, keys.reset),
        lambda: installer.hgetall(keys.state),
        lambda: installer.hset(keys.state, "step", "999"),
        lambda: installer.publish(keys.channel, '{"step":999,"generation":1,"done":false}'),
    ]
    try:
        for attempt in attempts:
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        installer.close()


def test_a_library_that_loops_while_loading_does_not_block_redis(acl_server: OpsRedis) -> None:
    installer = acl_server.as_user("installer")
    try:
        with pytest.raises(redis.ResponseError, match="timeout"):  # Redis's own limit
            installer.function_load(f"#!lua name=loops_at_load\n{LOOP}\n")
    finally:
        installer.close()
    assert answers(acl_server)


def in_background(call: Callable[[], Any]) -> tuple[threading.Thread, dict[str, str]]:
    """Run ``call`` in a thread; its error message lands in the returned dict."""
    outcome: dict[str, str] = {}

    def run() -> None:
        try:
            call()
        except redis.ResponseError as exc:
            outcome["error"] = str(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, outcome


def when_busy(call: Callable[[], Any]) -> Any:
    """``call`` once Redis runs the code: a kill before it starts is NOTBUSY."""
    deadline = time.monotonic() + 30
    while True:
        try:
            return call()
        except redis.ResponseError as exc:
            if "NOTBUSY" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.02)


def test_redis_runs_with_a_one_second_busy_reply_threshold(acl_server: OpsRedis) -> None:
    harness = harness_client(acl_server)
    try:
        assert harness.config_get("busy-reply-threshold") == {"busy-reply-threshold": "1000"}
    finally:
        harness.close()


def test_the_emergency_user_ends_a_runaway_function(acl_server: OpsRedis, job: str) -> None:
    seed(acl_server, job)
    harness = harness_client(acl_server)
    harness.function_load(
        "#!lua name=runaway\nredis.register_function{function_name='runaway', "
        f"callback=function() {LOOP} end, flags={{'no-writes'}}}}",
        replace=True,
    )
    thread, outcome = in_background(lambda: harness.fcall_ro("runaway", 0))
    emergency = acl_server.as_user("emergency")
    try:
        # FUNCTION STATS waits for Redis to turn BUSY (busy-reply-threshold), then names it
        stats = emergency.function_stats()
        while "runaway" not in repr(stats):
            time.sleep(0.02)
            stats = emergency.function_stats()
        assert when_busy(emergency.function_kill) in (True, b"OK", "OK")
        thread.join(30)
        assert "killed" in outcome.get("error", "").lower(), outcome
        assert emergency.ping()
    finally:
        emergency.close()
        harness.close()
    assert read_status(as_user(acl_server, job, "monitor")).step == 3


def test_the_emergency_user_ends_a_runaway_script(acl_server: OpsRedis) -> None:
    """An EVAL script, as on a server where the roles use the EVAL fallback."""
    harness = harness_client(acl_server)
    thread, outcome = in_background(lambda: harness.eval(LOOP, 0))
    emergency = acl_server.as_user("emergency")
    try:
        assert when_busy(emergency.script_kill) in (True, b"OK", "OK")
        thread.join(30)
        assert "killed" in outcome.get("error", "").lower(), outcome
    finally:
        emergency.close()
        harness.close()
    assert answers(acl_server)


def test_the_emergency_user_reads_and_writes_no_key_and_no_channel(
    acl_server: OpsRedis, job: str
) -> None:
    seed(acl_server, job)
    keys = BarrierConfig(job=job).keys
    emergency = acl_server.as_user("emergency")
    attempts: list[Callable[[], object]] = [
        lambda: emergency.hgetall(keys.state),
        lambda: emergency.get(keys.reset),
        lambda: emergency.hset(keys.state, "step", "999"),
        lambda: emergency.delete(keys.state),
        lambda: emergency.zadd(keys.targets, {"x": 1}),
        lambda: emergency.publish(keys.channel, '{"reset":true}'),
        lambda: emergency.fcall(function_name("version"), 0),
        lambda: emergency.execute_command("SUBSCRIBE", keys.channel),  # type: ignore[no-untyped-call]
    ]
    try:
        for attempt in attempts:
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
    finally:
        emergency.close()
    assert read_status(as_user(acl_server, job, "monitor")).step == 3


@pytest.fixture
def server_without_library(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """The shipped users on a Redis that nobody loaded the library into."""
    acl = acl_with(tmp_path_factory.mktemp("acl"))
    server = RedisServer(args=["--aclfile", str(acl)]).start()
    yield server
    server.cleanup()


@pytest.mark.parametrize(
    ("role", "operation"), [("chief", "publish"), ("worker", "wait"), ("monitor", "status")]
)
def test_a_role_finds_a_missing_library_named_with_the_command_that_loads_it(
    server_without_library: RedisServer, job: str, role: str, operation: str
) -> None:
    with pytest.raises(RedisRefused) as info:
        RUN[operation](as_user(server_without_library, job, role))
    message = str(info.value)
    assert info.value.kind == "functions", message
    assert "has no stepbarrier Functions library" in message  # FUNCTION LIST told it
    assert "stepbarrier functions install" in message


@pytest.mark.parametrize("role", ["chief", "worker", "monitor"])
def test_every_role_reading_the_status_sees_a_reset(
    acl_server: OpsRedis, job: str, role: str
) -> None:
    seed(acl_server, job)
    reset_job(as_user(acl_server, job, "chief"))
    assert read_status(as_user(acl_server, job, role)).reset_at is not None
