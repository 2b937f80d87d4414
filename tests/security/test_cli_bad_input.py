"""Bad settings through the CLI: exit 2 and one clear line on stderr, never a traceback."""

from __future__ import annotations

import os
import subprocess
import sys

from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings

from stepbarrier import BarrierConfig, ConfigurationError
from stepbarrier.cli import cli
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer
from tests.security.test_config_fuzz import environments


def settable(env: dict[str, str]) -> dict[str, str]:
    """What a process environment can hold (no NUL, valid UTF-8)."""
    return {
        k: v.encode("utf-8", "replace").decode("utf-8").replace("\x00", "") for k, v in env.items()
    }


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(environments())
def test_any_bad_environment_exits_2_with_one_line(env: dict[str, str]) -> None:
    env = settable(env)
    try:
        BarrierConfig.from_env(env)
    except ConfigurationError as error:
        expected = error
    else:
        return  # a valid configuration: the other suites cover what it does
    cleared = {
        name: None for name in os.environ if name.startswith("STEPBARRIER_") or name == "TF_CONFIG"
    }
    result = CliRunner().invoke(cli, ["status"], env={**cleared, **env})
    assert result.exit_code == 2, (result.output, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert expected.variable is not None and expected.variable in lines[0]
    assert "Traceback" not in result.output + result.stderr
    password = env.get("STEPBARRIER_REDIS_PASSWORD", "")
    if password.startswith("PW-"):
        assert password not in result.output + result.stderr


def test_a_real_process_with_a_bad_setting(job: str) -> None:
    env = subprocess_env(STEPBARRIER_JOB=job, STEPBARRIER_TIMEOUT="soon")
    done = subprocess.run(
        [sys.executable, "-m", "stepbarrier", "wait", "--until", "3"],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.decode().strip().count("\n") == 0
    assert "STEPBARRIER_TIMEOUT" in done.stderr.decode()
    assert b"Traceback" not in done.stderr


def test_wrong_password_through_the_cli_exits_2_without_the_password(job: str) -> None:
    server = RedisServer(args=["--requirepass", "the-real-one"])
    server.start()
    try:
        env = subprocess_env(
            STEPBARRIER_JOB=job,
            STEPBARRIER_REDIS_URL=f"redis://:guessed-wrong-pw@127.0.0.1:{server.port}/0",
        )
        for command in (["status"], ["wait", "--until", "3", "--timeout", "30"], ["publish", "4"]):
            done = subprocess.run(
                [sys.executable, "-m", "stepbarrier", *command],
                env=env,
                capture_output=True,
                timeout=60,
            )
            output = (done.stdout + done.stderr).decode()
            assert done.returncode == 2, (command, output)
            assert "guessed-wrong-pw" not in output and "the-real-one" not in output
            assert "Traceback" not in output
    finally:
        server.cleanup()
