"""``stepbarrier publish`` never supersedes a live chief by accident: it is refused
(exit 2, naming the chief and its heartbeat) while a chief heartbeats, unless --force."""

from __future__ import annotations

import os
import socket
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import redis
from redis.typing import EncodableT, FieldT

from stepbarrier import BarrierConfig, StepPublisher, read_status
from tests.conftest import subprocess_env
from tests.integration.test_cli import run

HAND_WRITTEN_CHIEF = "trainer-7:4242"


@pytest.fixture
def job_config(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    return make_config()  # the default heartbeat (1 s), as the CLI's below


@pytest.fixture
def env(job_config: BarrierConfig) -> dict[str, str]:
    return subprocess_env(
        STEPBARRIER_REDIS_URL=job_config.redis_url, STEPBARRIER_JOB=job_config.job
    )


def redis_ms(client: redis.Redis) -> int:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def write_chief(
    client: redis.Redis, config: BarrierConfig, heartbeat_age_ms: int, **fields: str
) -> None:
    """The state a chief at step 3 leaves, its last heartbeat ``heartbeat_age_ms`` ago."""
    state: dict[FieldT, EncodableT] = {
        "step": "3",
        "generation": "1",
        "done": "0",
        "heartbeat_ms": str(redis_ms(client) - heartbeat_age_ms),
        "chief": HAND_WRITTEN_CHIEF,
    }
    state.update(fields)
    client.hset(config.keys.state, mapping=state)


@contextmanager
def heartbeating(
    client: redis.Redis, config: BarrierConfig, heartbeat_age_ms: int, **fields: str
) -> Iterator[None]:
    """A live chief's state: its heartbeat kept ``heartbeat_age_ms`` old while the block
    runs, as a chief that beats keeps it (a command that starts slowly on a loaded
    machine would otherwise find a once-written heartbeat stale)."""
    write_chief(client, config, heartbeat_age_ms, **fields)
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(0.05):
            at = redis_ms(client) - heartbeat_age_ms
            client.hset(config.keys.state, "heartbeat_ms", str(at))

    beater = threading.Thread(target=beat, daemon=True)
    beater.start()
    try:
        yield
    finally:
        stop.set()
        beater.join()


def test_publish_is_refused_while_a_chief_heartbeats(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    chief = StepPublisher(job_config)
    try:
        chief.publish(3)
        assert chief.flush(10)
        result = run(env, "publish", "10")
        assert result.returncode == 2, result.stderr
        assert f"{socket.gethostname()}:{os.getpid()}" in result.stderr
        assert "heartbeat" in result.stderr and "s ago" in result.stderr
        assert "--force" in result.stderr
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert read_status(job_config).step == 3
    finally:
        chief.close(done=False)


def test_publish_force_supersedes_a_live_chief(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    chief = StepPublisher(job_config)
    try:
        chief.publish(3)
        assert chief.flush(10)
        result = run(env, "publish", "10", "--force")
        assert result.returncode == 0, result.stderr
        assert read_status(job_config).step == 10
    finally:
        chief.close(done=False)


def test_publish_goes_ahead_when_no_chief_ever_wrote(env: dict[str, str]) -> None:
    result = run(env, "publish", "4")
    assert result.returncode == 0, result.stderr


def test_publish_says_whom_the_pin_releases(env: dict[str, str]) -> None:
    """Later arrivals trust a pin they did not see happen with a run id, or after the grace."""
    without = run(env, "publish", "4")
    assert without.returncode == 0, without.stderr
    assert "arrives later is released by it after 3 s, unless a new chief" in without.stdout
    with_run = run({**env, "STEPBARRIER_RUN_ID": "run-9"}, "publish", "5")
    assert with_run.returncode == 0, with_run.stderr
    assert "releases later arrivals of run run-9 too" in with_run.stdout


@pytest.mark.parametrize(
    ("heartbeat_age_ms", "fields"),
    [
        pytest.param(1_000, {}, id="a recent heartbeat"),
        pytest.param(20_000, {"heartbeat_period_ms": "10000"}, id="within 3 of its own periods"),
        pytest.param(1_000, {"heartbeat_period_ms": "100"}, id="within 5 s, however fast it beats"),
    ],
)
def test_publish_is_refused_while_the_heartbeat_is_fresh(
    env: dict[str, str],
    client: redis.Redis,
    job_config: BarrierConfig,
    heartbeat_age_ms: int,
    fields: dict[str, str],
) -> None:
    with heartbeating(client, job_config, heartbeat_age_ms, **fields):
        result = run(env, "publish", "10")
    assert result.returncode == 2, result.stderr
    assert f"chief {HAND_WRITTEN_CHIEF} is live" in result.stderr
    assert read_status(job_config, client).step == 3


@pytest.mark.parametrize(
    ("heartbeat_age_ms", "fields"),
    [
        pytest.param(20_000, {}, id="stale by the config's 1 s heartbeat"),
        pytest.param(20_000, {"heartbeat_period_ms": "99999999999"}, id="implausible period"),
        pytest.param(20_000, {"heartbeat_period_ms": "1e4"}, id="malformed period"),
        pytest.param(1_000, {"done": "1"}, id="the chief finished the job"),
    ],
)
def test_publish_goes_ahead_once_the_chief_is_gone(
    env: dict[str, str],
    client: redis.Redis,
    job_config: BarrierConfig,
    heartbeat_age_ms: int,
    fields: dict[str, str],
) -> None:
    write_chief(client, job_config, heartbeat_age_ms, **fields)
    result = run(env, "publish", "10")
    assert result.returncode == 0, result.stderr
    assert read_status(job_config, client).step == 10


def test_publish_after_an_earlier_publish_needs_no_force(
    env: dict[str, str], job_config: BarrierConfig
) -> None:
    # an earlier `stepbarrier publish` wrote once and left: it is no running chief
    assert run(env, "publish", "3").returncode == 0
    assert (read_status(job_config).chief or "").startswith("cli:")
    second = run(env, "publish", "5")
    assert second.returncode == 0, second.stderr
    assert read_status(job_config).step == 5
