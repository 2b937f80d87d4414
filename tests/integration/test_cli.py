"""The ``stepbarrier`` command, run as real processes against a real redis-server."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from click.testing import CliRunner

from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    BarrierTimeout,
    ConfigurationError,
    RedisRefused,
    RedisUnavailable,
    StepBarrierError,
    read_status,
)
from stepbarrier.cli import cli
from stepbarrier.cli._context import exit_code_for, mask_secrets
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer, free_port

CLI = [sys.executable, "-m", "stepbarrier"]
SECRET = "hunter2-not-for-logs"


@pytest.fixture
def env(redis_server: RedisServer, job: str) -> dict[str, str]:
    """Environment of a CLI process for this test's job."""
    return subprocess_env(STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=job)


def run(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def start(env: dict[str, str], *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [*CLI, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def finish(process: subprocess.Popen[str], timeout: float = 60) -> tuple[int, str, str]:
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def wait_for_waiters(config: BarrierConfig, count: int, process: subprocess.Popen[str]) -> None:
    """Block until ``count`` waiters are registered (the wait process must live)."""
    deadline = time.monotonic() + 30
    while len(read_status(config).waiters) < count:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the waiter never registered"
        time.sleep(0.05)


@pytest.fixture
def job_config(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    return make_config()


# -- exit codes and messages -------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (ConfigurationError("bad", variable="STEPBARRIER_JOB"), 2),
        (RedisRefused("no", kind="authentication"), 2),
        (RedisRefused("no", kind="permission"), 2),
        (BarrierTimeout("late"), 3),
        (BarrierAborted("gone", reason="done"), 4),
        (BarrierAborted("gone", reason="reset"), 4),
        (RedisUnavailable("down"), 5),
        (StepBarrierError("other"), 1),
        (RuntimeError("bug"), 1),
    ],
)
def test_each_error_class_has_its_exit_code(error: BaseException, code: int) -> None:
    assert exit_code_for(error) == code


def test_help_documents_the_exit_codes() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0
    for line in ("0  success", "2  usage", "3  timeout", "4  aborted", "5  Redis unreachable"):
        assert line in result.output


def test_mask_secrets_hides_url_passwords_and_known_secrets() -> None:
    text = f"redis://user:{SECRET}@host:6379/0 and rediss://:{SECRET}@h/1, also {SECRET}"
    masked = mask_secrets(text, [SECRET])
    assert SECRET not in masked
    assert "redis://user:***@host:6379/0" in masked
    assert "rediss://:***@h/1" in masked


def test_missing_job_is_one_line_naming_the_option_and_exit_2(env: dict[str, str]) -> None:
    del env["STEPBARRIER_JOB"]
    result = run(env, "status")
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1
    assert "STEPBARRIER_JOB" in result.stderr and "--job" in result.stderr
    assert "Traceback" not in result.stderr


def test_invalid_variable_is_exit_2(env: dict[str, str]) -> None:
    env["STEPBARRIER_HEARTBEAT"] = "often"
    result = run(env, "status")
    assert result.returncode == 2
    assert "STEPBARRIER_HEARTBEAT" in result.stderr


def test_option_overrides_the_environment(env: dict[str, str]) -> None:
    result = run(env, "status", "--json", "--job", "from-option")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["job"] == "from-option"


def test_unreachable_redis_is_exit_5_with_the_password_masked() -> None:
    url = f"redis://operator:{SECRET}@127.0.0.1:{free_port()}/0"
    env = subprocess_env(STEPBARRIER_REDIS_URL=url, STEPBARRIER_JOB="unreachable")
    result = run(env, "wait", "--until", "5", "--timeout", "1", "--verbose")
    assert result.returncode == 5
    assert "unreachable" in result.stderr
    assert "operator:***@127.0.0.1" in result.stderr
    assert SECRET not in result.stderr + result.stdout


def test_debug_adds_a_traceback_still_masked() -> None:
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=f"redis://:{SECRET}@127.0.0.1:{free_port()}/0",
        STEPBARRIER_JOB="unreachable",
    )
    result = run(env, "wait", "--until", "5", "--timeout", "1", "--debug")
    assert result.returncode == 5
    assert "Traceback" in result.stderr
    assert SECRET not in result.stderr


def test_password_from_the_environment_is_masked_in_messages(env: dict[str, str]) -> None:
    env["STEPBARRIER_REDIS_PASSWORD"] = SECRET
    env["STEPBARRIER_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    result = run(env, "wait", "--until", "5", "--timeout", "1", "--debug")
    assert result.returncode == 5
    assert SECRET not in result.stderr + result.stdout


# -- status --------------------------------------------------------------------------


def test_status_json_has_the_documented_schema(
    env: dict[str, str], job: str, job_config: BarrierConfig
) -> None:
    assert run(env, "publish", "5").returncode == 0
    waiting = start(env, "wait", "--until", "9", "--task-id", "3", "--timeout", "60")
    wait_for_waiters(job_config, 1, waiting)

    result = run(env, "status", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["job"] == job
    assert data["step"] == 5
    assert isinstance(data["generation"], int)
    assert isinstance(data["heartbeat_age"], float)
    assert data["done"] is False
    [waiter] = data["waiters"]
    assert waiter["task_id"] == 3
    assert waiter["wait_until_step"] == 9
    assert isinstance(waiter["since"], float)
    assert isinstance(waiter["host"], str) and waiter["host"]

    assert run(env, "publish", "9", "--force").returncode == 0
    assert finish(waiting)[:2] == (0, "9\n")


def test_status_table_shows_the_step_and_each_waiter(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    assert run(env, "publish", "42").returncode == 0
    waiting = start(env, "wait", "--until", "77", "--task-id", "4", "--timeout", "60")
    wait_for_waiters(job_config, 1, waiting)
    result = run(env, "status")
    assert result.returncode == 0, result.stderr
    assert "42" in result.stdout
    assert any(line.split()[:2] == ["4", "77"] for line in result.stdout.splitlines())
    assert run(env, "publish", "77", "--force").returncode == 0
    assert finish(waiting)[0] == 0


def test_status_of_an_unknown_job_says_no_step_yet(env: dict[str, str]) -> None:
    result = run(env, "status")
    assert result.returncode == 0
    assert "none yet" in result.stdout


# -- wait, publish, reset --------------------------------------------------------------


def test_wait_is_released_by_publish_from_another_process(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    waiting = start(env, "wait", "--until", "12", "--timeout", "60")
    wait_for_waiters(job_config, 1, waiting)
    assert run(env, "publish", "11").returncode == 0
    assert waiting.poll() is None
    # --force: the publish just before still counts as a live chief (test_cli_publish.py)
    published = run(env, "publish", "12", "--force")
    assert published.returncode == 0, published.stderr
    assert finish(waiting)[:2] == (0, "12\n")


def test_wait_follows_the_schedule_and_task_id(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    env["STEPBARRIER_SCHEDULE"] = "log:10"  # task 3: int(10 * log(4)) = 13
    waiting = start(env, "wait", "--task-id", "3", "--timeout", "60")
    wait_for_waiters(job_config, 1, waiting)
    assert read_status(job_config).waiters[0].wait_until_step == 13
    assert run(env, "publish", "13").returncode == 0
    assert finish(waiting)[:2] == (0, "13\n")


def test_wait_for_a_step_already_reached_returns_the_stored_step(env: dict[str, str]) -> None:
    # the operator's step is pinned: a later wait of the same run trusts it unseen
    env = {**env, "STEPBARRIER_RUN_ID": "run-cli"}
    assert run(env, "publish", "5").returncode == 0  # the chief is gone: no more messages
    result = run(env, "wait", "--until", "3", "--timeout", "60")
    assert (result.returncode, result.stdout) == (0, "5\n"), result.stderr


def test_wait_for_step_0_returns_at_once(env: dict[str, str]) -> None:
    result = run(env, "wait", "--until", "0")
    assert (result.returncode, result.stdout) == (0, "0\n")


def test_publish_done_aborts_a_waiting_wait_with_exit_4(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    waiting = start(env, "wait", "--until", "50", "--timeout", "60")
    wait_for_waiters(job_config, 1, waiting)
    assert run(env, "publish", "20", "--done").returncode == 0
    code, _, err = finish(waiting)
    assert code == 4
    assert "finished before step 50" in err
    # the progress lines, then the one error line
    others = [line for line in err.splitlines() if not line.startswith("waiting for job")]
    assert others == [err.splitlines()[-1]] and others[0].startswith("Error: ")


def test_reset_aborts_a_waiting_wait_with_exit_4(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    assert run(env, "publish", "3").returncode == 0
    waiting = start(env, "wait", "--until", "50", "--timeout", "60")
    wait_for_waiters(job_config, 1, waiting)
    result = run(env, "reset", "--yes")
    assert result.returncode == 0, result.stderr
    assert "1 waiter entry removed" in result.stdout
    code, _, err = finish(waiting)
    assert code == 4
    assert "was reset" in err
    assert read_status(job_config).step is None


def test_reset_without_yes_off_a_terminal_is_refused(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    assert run(env, "publish", "3").returncode == 0
    result = run(env, "reset")
    assert result.returncode == 2
    assert "--yes" in result.stderr
    assert read_status(job_config).step == 3


def test_reset_of_a_job_with_only_barriers_aborts_a_party_waiting_in_one(
    env: dict[str, str], job_config: BarrierConfig, redis_server: RedisServer
) -> None:
    """Issue 32, case 10: a barrier-only job (`stepbarrier arrive`, no chief state)
    was refused as "no job ...; nothing reset", and its barriers survived."""
    keys = job_config.keys
    waiting = start(env, "arrive", "start", "--parties", "2", "--task-id", "1", "--timeout", "60")
    client = redis_server.client()
    try:
        deadline = time.monotonic() + 30
        while len(read_status(job_config).barriers) < 1:
            assert waiting.poll() is None, waiting.communicate()
            assert time.monotonic() < deadline, "the arrival was never recorded"
            time.sleep(0.05)
        assert not client.exists(keys.state)  # no chief: only the barrier's keys
        result = run(env, "reset", "--yes")
        assert result.returncode == 0, result.stderr
        assert f"job {job_config.job}: reset" in result.stdout
        code, _, err = finish(waiting)
        assert code == 4, err
        assert "was reset" in err and "barrier 'start'" in err
        assert not client.exists(keys.barrier("start"), keys.barrier_index)
        assert client.hget(keys.barrier_epoch, "by") == b"reset"
    finally:
        client.close()


def test_reset_of_a_job_whose_barriers_all_completed_removes_them(
    env: dict[str, str], job_config: BarrierConfig, redis_server: RedisServer
) -> None:
    """No barrier is open, so `status` shows none; the job is there all the same."""
    keys = job_config.keys
    arrived = run(env, "arrive", "start", "--parties", "1", "--task-id", "0", "--timeout", "60")
    assert arrived.returncode == 0, arrived.stderr
    client = redis_server.client()
    try:
        epoch = client.hget(keys.barrier_epoch, "token")
        assert client.exists(keys.barrier("start"), keys.barrier_index) == 2
        result = run(env, "reset", "--yes")
        assert result.returncode == 0, result.stderr
        assert not client.exists(keys.barrier("start"), keys.barrier_index)
        assert client.hget(keys.barrier_epoch, "by") == b"reset"
        assert client.hget(keys.barrier_epoch, "token") != epoch
    finally:
        client.close()


def test_wait_timeout_is_exit_3(env: dict[str, str]) -> None:
    assert run(env, "publish", "1").returncode == 0
    result = run(env, "wait", "--until", "100", "--timeout", "0.5")
    assert result.returncode == 3
    assert "gave up waiting for step 100" in result.stderr
    assert "last step seen 1" in result.stderr


def test_wait_timeout_under_proceed_exits_0_with_the_last_step(env: dict[str, str]) -> None:
    env["STEPBARRIER_ON_TIMEOUT"] = "proceed"
    assert run(env, "publish", "4").returncode == 0
    result = run(env, "wait", "--until", "100", "--timeout", "0.5")
    assert (result.returncode, result.stdout) == (0, "4\n")
    assert "proceeding" in result.stderr


def test_publish_replaces_the_step_as_a_new_chief(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    assert run(env, "publish", "30").returncode == 0
    first = read_status(job_config)
    # --force: the publish just before still counts as a live chief (test_cli_publish.py)
    assert run(env, "publish", "10", "--force").returncode == 0
    second = read_status(job_config)
    assert (first.step, second.step) == (30, 10)
    assert second.generation is not None and first.generation is not None
    assert second.generation > first.generation


def test_watch_until_done_ends_once_the_job_is_done(env: dict[str, str]) -> None:
    assert run(env, "publish", "8", "--done").returncode == 0
    result = run(env, "watch", "--until-done", "--interval", "0.05", timeout=30)
    assert result.returncode == 0, result.stderr
    assert "8" in result.stdout and "yes" in result.stdout


def test_watch_with_unreachable_redis_is_exit_5() -> None:
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0", STEPBARRIER_JOB="w"
    )
    result = run(env, "watch")
    assert result.returncode == 5


def test_in_process_status_matches_the_library(
    redis_server: RedisServer, job: str, job_config: BarrierConfig
) -> None:
    # STEPBARRIER_RUN_ID set empty: no launcher's id of the test's own environment
    env = {
        "STEPBARRIER_REDIS_URL": redis_server.url,
        "STEPBARRIER_JOB": job,
        "STEPBARRIER_RUN_ID": "",
    }
    result = CliRunner().invoke(cli, ["status", "--json"], env=env)
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    # the command's own run id, beside the library's status of the job
    assert data.pop("config") == {"run_id": None, "run_id_source": "STEPBARRIER_RUN_ID"}
    assert data == read_status(job_config).to_dict()
