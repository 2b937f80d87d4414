"""Issue 37, item 10: a waiting command stopped by SIGTERM or SIGHUP (a launcher's or a
container's stop) leaves the job's registry on its way out, as Ctrl-C does, instead
of staying listed in ``status`` until its entry expires."""

from __future__ import annotations

import signal
import subprocess

import pytest

from stepbarrier import BarrierConfig, read_status
from tests.conftest import subprocess_env
from tests.integration.test_cli import CLI, wait_for_waiters


def stoppable() -> None:
    """``preexec_fn``: the stop signals at their defaults in the command, as a launcher
    starts it, whatever this suite was started with (``nohup`` ignores SIGHUP, a
    shell's ``&`` SIGINT, and a child inherits what is ignored)."""
    for stop in STOPS:
        signal.signal(stop, signal.SIG_DFL)


STOPS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)


@pytest.mark.parametrize("stop", STOPS)
@pytest.mark.parametrize(
    "command", [["wait", "--until", "100"], ["follow", "--every", "10", "--from", "100"]]
)
def test_a_stopped_wait_leaves_the_registry_at_once(
    config: BarrierConfig, stop: signal.Signals, command: list[str]
) -> None:
    env = {"STEPBARRIER_REDIS_URL": config.redis_url, "STEPBARRIER_JOB": config.job}
    process = subprocess.Popen(
        [*CLI, *command],
        env=subprocess_env(**env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=stoppable,
    )
    wait_for_waiters(config, 1, process)
    process.send_signal(stop)
    _, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert read_status(config).waiters == ()  # left, not left to expire


def test_a_stop_signal_ignored_at_start_stays_ignored(config: BarrierConfig) -> None:
    """A wait started under ``nohup`` (SIGHUP ignored) lives through a SIGHUP."""
    env = subprocess_env(STEPBARRIER_REDIS_URL=config.redis_url, STEPBARRIER_JOB=config.job)
    process = subprocess.Popen(
        ["nohup", *CLI, "wait", "--until", "100", "--timeout", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=stoppable,  # (nohup then ignores SIGHUP itself)
    )
    try:
        wait_for_waiters(config, 1, process)
        process.send_signal(signal.SIGHUP)
        with pytest.raises(subprocess.TimeoutExpired):
            process.wait(timeout=1.0)  # (no wall-clock bound: it must not have ended)
        assert len(read_status(config).waiters) == 1
    finally:
        process.kill()
        process.communicate(timeout=30)
