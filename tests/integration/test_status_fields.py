"""``status`` shows the chief's run id and whether it vouches (``--json``: its beat too)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import pytest
import redis

from stepbarrier import BarrierConfig, read_status
from stepbarrier._inspect.reset import reset_job
from tests.conftest import subprocess_env
from tests.integration.test_cli import run
from tests.integration.test_cli_publish import write_chief


@pytest.fixture
def job_config(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    return make_config()


@pytest.fixture
def env(job_config: BarrierConfig) -> dict[str, str]:
    return subprocess_env(
        STEPBARRIER_REDIS_URL=job_config.redis_url, STEPBARRIER_JOB=job_config.job, COLUMNS="200"
    )


def write_run(client: redis.Redis, config: BarrierConfig, run_id: str, **fields: str) -> None:
    state = {"beat": "17", "vouch": "1", "pinned": "0"}
    state.update(fields)
    write_chief(client, config, 0, run_id=run_id, **state)


def summary_rows(table: str) -> dict[str, str]:
    """The summary's rows of ``stepbarrier status``: first word -> the rest."""
    rows = {}
    for line in table.splitlines():
        name, _, rest = line.strip().partition(" ")
        if name and name not in rows:
            rows[name] = rest.strip()
    return rows


def test_status_reads_the_run_id_the_beat_and_the_vouch(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "run-42.a_b")
    status = read_status(job_config, client)
    assert status.run_id == "run-42.a_b"
    assert (status.beat, status.vouch, status.pinned) == (17, True, False)
    assert status.problems == ()


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"vouch": "0"}, (17, False, False)),
        ({"pinned": "1", "vouch": "0"}, (17, False, True)),
        ({"beat": "lots", "vouch": "yes", "pinned": "true"}, (0, False, False)),
    ],
    ids=["on probation", "pinned", "malformed"],
)
def test_status_reads_each_field_strictly(
    client: redis.Redis,
    job_config: BarrierConfig,
    fields: dict[str, str],
    expected: tuple[int, bool, bool],
) -> None:
    write_run(client, job_config, "run-1", **fields)
    status = read_status(job_config, client)
    assert (status.beat, status.vouch, status.pinned) == expected
    assert status.step == 3  # the step itself is still shown


def test_status_json_and_table_show_them(
    env: dict[str, str], client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "run-42.a_b")
    data = json.loads(run(env, "status", "--json").stdout)
    assert data["run_id"] == "run-42.a_b"
    assert (data["beat"], data["vouch"], data["pinned"]) == (17, True, False)
    assert "published_age" not in data
    table = run(env, "status")
    assert table.returncode == 0, table.stderr
    assert "run-42.a_b" in table.stdout
    rows = summary_rows(table.stdout)
    # the row says what it means (issue 37)
    assert rows["vouched"] == "yes: the step may release the workers waiting for it"
    # the beat is no count of writes (it starts from the Redis clock): not shown
    assert "writes" not in rows and "beat" not in rows


@pytest.mark.parametrize(
    ("fields", "shown"),
    [
        ({"vouch": "0"}, "no: the chief's training loop"),
        ({"vouch": "0", "probation": "1796017268056931"}, "no: on probation"),
        ({"pinned": "1", "vouch": "0"}, "yes: pinned by an operator"),
    ],
    ids=["not vouched", "on probation", "pinned"],
)
def test_the_table_says_why_a_step_releases_nobody_or_everybody(
    env: dict[str, str],
    client: redis.Redis,
    job_config: BarrierConfig,
    fields: dict[str, str],
    shown: str,
) -> None:
    write_run(client, job_config, "run-1", **fields)
    table = run(env, "status")
    assert table.returncode == 0, table.stderr
    assert summary_rows(table.stdout)["vouched"].startswith(shown)


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


def test_a_reset_token_is_shown_as_the_time_of_the_reset(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    before = time.time()
    reset_job(job_config, client)
    status = read_status(job_config, client)
    assert status.problems == ()
    assert status.reset_at is not None and before - 5 <= status.reset_at <= time.time() + 5


@pytest.mark.parametrize("marker", ["9999999999999999", "1e20", "-5", "nan"])
def test_an_implausible_reset_time_is_a_problem(
    client: redis.Redis, job_config: BarrierConfig, marker: str
) -> None:
    client.set(job_config.keys.reset, marker)
    status = read_status(job_config, client)
    assert status.reset_at is None
    assert status.problems == (f"malformed reset marker: {marker!r}",)
