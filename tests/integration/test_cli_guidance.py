"""The CLI never leaves a user guessing (issue 25, item 5): missing jobs, stale chiefs,
`status --check`, wait's progress and --json, watch when piped, help texts, durations."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis
from click.testing import CliRunner

from stepbarrier import BarrierConfig, StepPublisher, read_status
from stepbarrier._config.checks import parse_duration
from stepbarrier._protocol.keys import JobKeys
from stepbarrier.cli import cli
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer

CLI = [sys.executable, "-m", "stepbarrier"]


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


@pytest.fixture
def env(redis_server: RedisServer, job: str) -> dict[str, str]:
    # a run id: a step pinned by `publish` then releases waits that begin later
    return subprocess_env(
        STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=job, STEPBARRIER_RUN_ID="run-1"
    )


@pytest.fixture(scope="module")
def own_server() -> Iterator[RedisServer]:
    """A Redis of this module's own: the jobs on it are the ones the tests put there."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


def publish(config: BarrierConfig, step: int, *, done: bool = False) -> None:
    """Write ``step`` as a chief does, and stop (the job marked done only if ``done``)."""
    publisher = StepPublisher(config)
    publisher.publish(step)
    assert publisher.flush(10)
    assert publisher.close(done=done)


def pin(env: dict[str, str], step: int) -> None:
    """``stepbarrier publish``: a pinned step, which releases later waits too."""
    assert run(env, "publish", str(step), "--force").returncode == 0


def age_heartbeat(config: BarrierConfig, seconds: float) -> None:
    """Make the chief's last heartbeat ``seconds`` old, by Redis's clock."""
    client = redis.Redis.from_url(config.redis_url)
    try:
        now, micros = client.time()
        then = now * 1000 + micros // 1000 - int(seconds * 1000)
        client.hset(JobKeys.for_job(config.job).state, "heartbeat_ms", then)
    finally:
        client.close()


# -- a job that is not there ---------------------------------------------------------


def test_a_job_that_only_many_waiters_wait_on_is_not_called_missing(
    redis_server: RedisServer,
) -> None:
    # more waiters than status lists: it summarises them (and reads no entry);
    # they are there, so the job is too, and no SCAN looks for other jobs
    from stepbarrier._inspect.summary import LIST_UP_TO
    from stepbarrier._protocol.calls import register_call
    from stepbarrier._redis.functions import RedisCode
    from stepbarrier._worker.links import REGISTRY_TTL, registry_entry

    config = BarrierConfig(job=f"many-{uuid.uuid4().hex[:6]}", redis_url=redis_server.url)
    admin = redis.Redis.from_url(redis_server.url)
    calls = [
        register_call(
            config.keys,
            f"{i}-w",
            10 + i,
            registry_entry(config, 10 + i, time.time()),
            registry_ttl=REGISTRY_TTL,
            key_ttl=config.key_ttl,
        )
        for i in range(LIST_UP_TO + 5)
    ]
    RedisCode(admin, config).pipeline(calls)
    admin.config_resetstat()
    env = subprocess_env(STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=config.job)
    result = run(env, "status")
    assert result.returncode == 0, result.stderr
    assert "no job" not in result.stderr, result.stderr
    assert re.search(rf"waiting\s+{LIST_UP_TO + 5} worker\(s\)", result.stdout), result.stdout
    assert "cmdstat_scan" not in admin.info("commandstats")
    admin.close()


def test_a_job_whose_tasks_report_before_its_chief_writes_is_not_called_missing(
    redis_server: RedisServer,
) -> None:
    # tasks may start before the chief's first write (seen in a fresh-clone CI run on
    # a loaded machine): their progress is the job's, and status shows it, exit 0
    from stepbarrier import ProgressReporter

    config = BarrierConfig(
        job=f"early-{uuid.uuid4().hex[:6]}", redis_url=redis_server.url, task_id=2
    )
    with ProgressReporter(config) as progress:
        progress.report(7)
    env = subprocess_env(STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=config.job)
    result = run(env, "status", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no job" not in result.stderr, result.stderr
    assert [(t["task_id"], t["step"]) for t in json.loads(result.stdout)["tasks"]] == [(2, 7)]
    checked = run(env, "status", "--check")
    assert checked.returncode == 7, checked.stdout + checked.stderr
    assert "no chief has written a heartbeat (only waiters, tasks' progress" in checked.stdout


def test_status_of_a_missing_job_names_the_jobs_that_exist(own_server: RedisServer) -> None:
    present = f"present-{uuid.uuid4().hex[:6]}"
    publish(BarrierConfig(job=present, redis_url=own_server.url), 3)
    env = subprocess_env(STEPBARRIER_REDIS_URL=own_server.url, STEPBARRIER_JOB="nosuchjob")
    result = run(env, "status")
    assert result.returncode == 0, result.stderr
    assert "no job 'nosuchjob' on this Redis; jobs here" in result.stderr
    assert present in result.stderr
    as_json = run(env, "status", "--json")
    assert json.loads(as_json.stdout)["step"] is None  # stdout stays JSON
    assert "no job 'nosuchjob'" in as_json.stderr


def test_a_user_that_may_not_scan_is_told_how_to_list_the_jobs(own_server: RedisServer) -> None:
    admin = own_server.client()
    try:
        admin.acl_setuser(
            "noscan", enabled=True, passwords=["+noscan-pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-scan"],
        )  # fmt: skip
    finally:
        admin.close()
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=own_server.url,
        STEPBARRIER_JOB="nosuchjob",
        STEPBARRIER_REDIS_USERNAME="noscan",
        STEPBARRIER_REDIS_PASSWORD="noscan-pw",
    )
    result = run(env, "status")
    assert result.returncode == 0, result.stderr
    assert "may not list the jobs here" in result.stderr
    assert "stepbarrier jobs" in result.stderr


def test_reset_of_a_missing_job_says_so_and_exits_6(env: dict[str, str], job: str) -> None:
    result = run(env, "reset", "--yes")
    assert result.returncode == 6, result.stderr
    assert f"no job {job!r} on this Redis" in result.stderr
    assert "nothing reset" in result.stderr


def test_wait_on_a_job_no_chief_wrote_says_so(env: dict[str, str], job: str) -> None:
    result = run(env, "wait", "--until", "5", "--timeout", "2")
    assert result.returncode == 3
    assert f"no job {job!r} on this Redis yet" in result.stderr
    assert result.stdout == ""


# -- stale chiefs and status --check ----------------------------------------------------


def test_status_marks_a_stale_chief(env: dict[str, str], config: BarrierConfig) -> None:
    publish(config, 7)
    fresh = run(env, "status")
    assert "STALE" not in fresh.stdout
    age_heartbeat(config, 120)
    stale = run(env, "status")
    assert stale.returncode == 0, stale.stderr
    assert "STALE" in stale.stdout


def test_status_check_exit_codes(env: dict[str, str], config: BarrierConfig) -> None:
    missing = run(env, "status", "--check")
    assert missing.returncode == 6
    assert "missing" in missing.stdout and "no job" in missing.stdout

    publish(config, 4)
    state = JobKeys.for_job(config.job).state
    with redis.Redis.from_url(config.redis_url) as client:
        # a chief of a 10 min heartbeat: live for 30 min, however slow this machine
        client.hset(state, "heartbeat_period_ms", 600_000)
    live = run(env, "status", "--check")
    assert live.returncode == 0, live.stdout + live.stderr
    assert ": live:" in live.stdout

    with redis.Redis.from_url(config.redis_url) as client:
        client.hset(state, "heartbeat_period_ms", 200)
    age_heartbeat(config, 120)
    # within the default stall timeout of 600 s, but stale: not "live" (exit 9)
    stale = run(env, "status", "--check")
    assert stale.returncode == 9, stale.stdout + stale.stderr
    assert ": stale: no chief heartbeat for 2 min" in stale.stdout
    assert "the chief may be gone" in stale.stdout
    verdict = json.loads(run(env, "status", "--check", "--json").stdout)
    assert verdict["verdict"] == "stale" and verdict["exit_code"] == 9
    dead = run(env, "status", "--check", "--stall-timeout", "1m")
    assert dead.returncode == 7
    assert ": dead:" in dead.stdout
    verdict = json.loads(run(env, "status", "--check", "--stall-timeout", "60", "--json").stdout)
    assert verdict["verdict"] == "dead" and verdict["exit_code"] == 7

    publish(config, 5, done=True)
    done = run(env, "status", "--check", "--stall-timeout", "2")
    assert done.returncode == 0
    assert ": done:" in done.stdout


def test_piped_status_has_no_trailing_spaces(env: dict[str, str], config: BarrierConfig) -> None:
    publish(config, 3)
    result = run(env, "status")
    assert result.returncode == 0
    assert result.stdout.strip()
    assert [line for line in result.stdout.splitlines() if line != line.rstrip()] == []


# -- wait's progress, --json, --quiet ------------------------------------------------------


def test_piped_wait_prints_progress_on_stderr_and_only_the_step_on_stdout(
    env: dict[str, str], config: BarrierConfig
) -> None:
    pin(env, 2)
    waiting = subprocess.Popen(
        [*CLI, "wait", "--until", "6", "--timeout", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert waiting.stderr is not None
        first = waiting.stderr.readline()  # the first line comes at once, not at exit
        assert f"waiting for job {config.job} to reach step 6: chief at step 2" in first
        assert "heartbeat" in first and "no timeout" not in first and "left" in first
        pin(env, 6)
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert waiting.returncode == 0, err
    assert out == "6\n"


def test_wait_json_and_quiet(env: dict[str, str], config: BarrierConfig) -> None:
    pin(env, 9)
    result = run(env, "wait", "--until", "4", "--json", "--quiet")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["job"] == config.job
    assert (data["wait_until_step"], data["step"]) == (4, 9)
    assert isinstance(data["waited_seconds"], float)
    assert data["released_by"]
    assert result.stderr == ""


# -- watch when piped --------------------------------------------------------------------


def watch_one_frame(env: dict[str, str]) -> tuple[int, str, str, str]:
    """Run ``watch`` piped, read its first frame while it runs, then SIGTERM it.

    Returns:
        Its exit code, the first frame, the rest of stdout, and stderr.
    """
    watching = subprocess.Popen(
        [*CLI, "watch", "--interval", "0.1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert watching.stdout is not None
        deadline = time.monotonic() + 30
        seen = ""
        while "updated" not in seen:  # the first frame arrives while watch runs
            assert time.monotonic() < deadline
            seen += watching.stdout.readline()
        watching.send_signal(signal.SIGTERM)
        rest, err = watching.communicate(timeout=30)
    finally:
        if watching.poll() is None:
            watching.kill()
    return watching.returncode, seen, rest, err


def test_piped_watch_is_line_buffered_and_prints_a_last_frame_on_sigterm(
    env: dict[str, str], config: BarrierConfig
) -> None:
    publish(config, 11)
    code, seen, rest, err = watch_one_frame(env)
    assert "11" in seen
    assert code == 0, err
    assert "updated" in rest  # the last frame
    assert [line for line in (seen + rest).splitlines() if line != line.rstrip()] == []
    assert "\x1b[" not in seen + rest  # no cursor moves nor colours in a log


# -- help, version, durations ----------------------------------------------------------------


def help_of(*args: str) -> str:
    result = CliRunner().invoke(cli, [*args, "-h"], terminal_width=100)
    assert result.exit_code == 0, result.output
    return result.output


def test_h_is_help_everywhere() -> None:
    assert "Usage: cli [OPTIONS] COMMAND" in help_of() or "COMMAND [ARGS]" in help_of()
    assert "--until" in help_of("wait")
    assert "install" in help_of("functions")


def test_each_command_lists_only_its_own_exit_codes() -> None:
    wait = help_of("wait")
    assert "3   timeout" in wait and "130 interrupted" in wait
    assert "no such job" not in wait and "dead" not in wait
    status = help_of("status")
    assert "7   with --check: the job is dead" in status
    assert "3   timeout" not in status and "aborted" not in status
    jobs = help_of("jobs")
    assert "3   timeout" not in jobs and "130 interrupted" in jobs
    acl = help_of("acl")
    assert "5   Redis unreachable" not in acl
    assert "1   a check failed" in help_of("doctor")


def test_the_command_list_shows_whole_descriptions() -> None:
    text = " ".join(help_of().split())
    # (the demo, whose line this was, left the command for examples/demo)
    arrive = "Arrive at barrier NAME and wait until tasks 0..N-1 have all arrived."
    assert arrive in text
    reset = "Delete the job's keys; workers still waiting are aborted (exit 4), not left hanging."
    assert reset in text
    assert "_STEPBARRIER_COMPLETE=bash_source" in text


def test_version_names_redis_py() -> None:
    result = CliRunner().invoke(cli, ["--version"])
    assert result.exit_code == 0
    assert "redis-py" in result.output


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("600", 600.0), ("0.5", 0.5), ("90s", 90.0), ("10m", 600.0), ("1h", 3600.0),
     ("250ms", 0.25), ("2 min", 120.0), ("1.5h", 5400.0)],
)  # fmt: skip
def test_durations_as_people_type_them(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "ten", "10x", "-5", "inf", "nan", "1e", "1e999", "5" * 50])
def test_what_is_no_duration(text: str) -> None:
    assert parse_duration(text) is None


def test_a_bad_duration_says_how_to_write_one(env: dict[str, str]) -> None:
    result = run(env, "wait", "--until", "3", "--timeout", "10x")
    assert result.returncode == 2
    assert "seconds, e.g. 600" in result.stderr


def test_a_duration_with_a_unit_is_taken(
    env: dict[str, str], make_config: Callable[..., BarrierConfig]
) -> None:
    pin(env, 5)
    result = run(env, "wait", "--until", "5", "--timeout", "1m", "--stall-timeout", "90s")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "5\n"
    assert read_status(make_config()).step == 5


def test_status_check_of_a_job_only_workers_wait_on_is_dead(
    env: dict[str, str], config: BarrierConfig
) -> None:
    waiting = subprocess.Popen(
        [*CLI, "wait", "--until", "5", "--timeout", "60", "--quiet"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 30
        while not read_status(config).waiters:
            assert time.monotonic() < deadline and waiting.poll() is None
            time.sleep(0.05)
        result = run(env, "status", "--check")
        assert result.returncode == 7, result.stdout + result.stderr
        assert "no chief has written a heartbeat" in result.stdout
    finally:
        waiting.kill()
        waiting.wait()


UNRESOLVABLE = "redis://no-such-host.invalid:6379/0"
"""``.invalid`` never resolves (RFC 2606): getaddrinfo answers EAI_NONAME at once."""


def test_the_command_does_not_retry_a_host_name_that_does_not_resolve(job: str) -> None:
    # --verbose shows the library's retries ("...; retrying to ...")
    result = run({"STEPBARRIER_JOB": job}, "status", "--verbose", "--redis-url", UNRESOLVABLE)
    assert result.returncode == 2, result.stderr
    assert "'no-such-host.invalid' is unknown" in result.stderr
    assert "Traceback" not in result.stderr
    assert "retrying" not in result.stderr  # refused at once, not retried with backoff


def test_the_library_retries_it_within_the_deadline(job: str) -> None:
    """A worker may start before its Redis's DNS name exists: it keeps trying, and
    its deadline ends the wait with the unknown host named."""
    from stepbarrier import RedisUnavailable, StepWaiter
    from stepbarrier._redis import failures

    assert failures.UNKNOWN_HOST_IS_FINAL.get() is False  # also after the commands above ran
    waiter = StepWaiter(BarrierConfig(job=job, redis_url=UNRESOLVABLE, stall_timeout=3.0))
    started = time.monotonic()
    with pytest.raises(RedisUnavailable) as info:
        waiter.wait(5, timeout=3.0)
    assert time.monotonic() - started >= 2.0  # retried, not refused at once
    assert "no-such-host.invalid" in str(info.value)
    waiter.close()


def test_wait_retries_a_host_name_that_does_not_resolve_until_its_timeout(job: str) -> None:
    """`stepbarrier wait --until N && ./train.sh` in a launcher that starts before its
    Redis's DNS name exists: it waits on, as the library does."""
    started = time.monotonic()
    result = run(
        {"STEPBARRIER_JOB": job},
        "wait",
        "--until",
        "5",
        "--timeout",
        "3",
        "--redis-url",
        UNRESOLVABLE,
    )
    assert time.monotonic() - started >= 2.5  # retried until its timeout
    assert result.returncode == 5, result.stderr  # unavailable, not refused
    assert "no-such-host.invalid" in result.stderr
