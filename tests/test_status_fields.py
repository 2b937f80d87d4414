"""``status`` shows the chief's run id and how long ago its loop last published."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis

from stepbarrier import BarrierConfig, read_status
from tests.conftest import subprocess_env
from tests.test_cli import run
from tests.test_cli_publish import redis_ms, write_chief


@pytest.fixture
def job_config(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    return make_config()


@pytest.fixture
def env(job_config: BarrierConfig) -> dict[str, str]:
    return subprocess_env(
        STEPBARRIER_REDIS_URL=job_config.redis_url, STEPBARRIER_JOB=job_config.job, COLUMNS="200"
    )


def write_run(client: redis.Redis, config: BarrierConfig, run_id: str, **fields: str) -> None:
    published = str(redis_ms(client) - 3_000)
    write_chief(client, config, 0, run_id=run_id, published_ms=published, **fields)


def test_status_reads_the_run_id_and_the_publish_age(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "run-42.a_b")
    status = read_status(job_config, client)
    assert status.run_id == "run-42.a_b"
    assert status.published_age is not None and status.published_age >= 3.0
    assert status.problems == ()


def test_status_json_and_table_show_them(
    env: dict[str, str], client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "run-42.a_b")
    data = json.loads(run(env, "status", "--json").stdout)
    assert data["run_id"] == "run-42.a_b"
    assert data["published_age"] >= 3.0
    table = run(env, "status")
    assert table.returncode == 0, table.stderr
    assert "run-42.a_b" in table.stdout
    assert any(line.split()[:2] == ["last", "publish"] for line in table.stdout.splitlines())


def test_watch_shows_the_run_id(
    env: dict[str, str], client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "run-7", done="1")
    result = run(env, "watch", "--until-done", "--interval", "0.05")
    assert result.returncode == 0, result.stderr
    assert "run-7" in result.stdout


@pytest.mark.parametrize("run_id", ["[bold]x", "a b", "x" * 65, "é", "run/1"])
def test_a_malformed_run_id_is_a_problem_and_none(
    env: dict[str, str], client: redis.Redis, job_config: BarrierConfig, run_id: str
) -> None:
    write_run(client, job_config, run_id)
    result = run(env, "status", "--json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["run_id"] is None
    assert any("run_id" in problem for problem in data["problems"])


@pytest.mark.parametrize("marker", ["9999999999999999", "1e20", "-5", "nan"])
def test_an_implausible_reset_time_is_a_problem(
    client: redis.Redis, job_config: BarrierConfig, marker: str
) -> None:
    client.set(job_config.keys.reset, marker)
    status = read_status(job_config, client)
    assert status.reset_at is None
    assert status.problems == (f"malformed reset marker: {marker!r}",)
