"""``status`` and ``doctor`` say which run id is in force and where it came from,
and ``status`` shows the beat as what it is: no count of writes.

Real CLI processes against the session's redis-server; the chief's state is
written by hand (``write_chief``), with the run id each case needs.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
import redis

from stepbarrier import BarrierConfig
from stepbarrier._config.defaults import LAUNCHER_VARIABLES
from stepbarrier._redis.functions import install_functions
from tests.conftest import subprocess_env
from tests.integration.test_cli import run
from tests.integration.test_cli_publish import write_chief
from tests.integration.test_status_fields import summary_rows

BEAT = 1_796_283_865_620_470
"""A beat as a (re)made state starts it: the Redis clock in microseconds."""
OTHER_RUN = "not the run of the chief's state"


@pytest.fixture
def job_config(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    return make_config()


def cli_env(config: BarrierConfig, **extra: str) -> dict[str, str]:
    """A CLI process's environment: this job, no launcher's id but ``extra``'s."""
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=config.redis_url, STEPBARRIER_JOB=config.job, COLUMNS="300"
    )
    for name in LAUNCHER_VARIABLES:
        env.pop(name, None)
    env.update(extra)
    return env


def run_here(table: str) -> str:
    """The ``run here`` row of ``stepbarrier status``, without its label."""
    [row] = [line for line in table.splitlines() if line.startswith("run here ")]
    return row.removeprefix("run here").strip()


def write_run(client: redis.Redis, config: BarrierConfig, run_id: str) -> None:
    write_chief(client, config, 0, run_id=run_id, beat=str(BEAT), vouch="1", pinned="0")


def test_status_says_the_slurm_jobs_run_id_and_that_it_is_the_chiefs(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "slurm-81-r1")
    env = cli_env(job_config, SLURM_JOB_ID="81", SLURM_RESTART_COUNT="1")
    table = run(env, "status")
    assert table.returncode == 0, table.stderr
    assert run_here(table.stdout) == "slurm-81-r1 (from SLURM_JOB_ID, the Slurm job)"
    data = json.loads(run(env, "status", "--json").stdout)
    assert data["config"] == {"run_id": "slurm-81-r1", "run_id_source": "SLURM_JOB_ID"}
    assert data["run_id"] == "slurm-81-r1"  # the chief's, as before


def test_status_says_when_the_chiefs_state_is_another_runs(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "run-a")
    env = cli_env(job_config, TORCHELASTIC_RUN_ID="run-b", SLURM_JOB_ID="81")
    table = run(env, "status")
    assert table.returncode == 0, table.stderr
    row = run_here(table.stdout)
    assert row.startswith("run-b (from TORCHELASTIC_RUN_ID")
    assert OTHER_RUN in row
    assert summary_rows(table.stdout)["run"] == "run-a"


def test_status_of_an_empty_job_says_the_run_id_and_no_mismatch(
    job_config: BarrierConfig,
) -> None:
    env = cli_env(job_config, STEPBARRIER_RUN_ID="", SLURM_JOB_ID="81")
    table = run(env, "status")
    assert table.returncode == 0, table.stderr
    row = run_here(table.stdout)
    assert row.startswith("none (STEPBARRIER_RUN_ID is set empty")
    assert OTHER_RUN not in row  # no chief state to differ from
    data = json.loads(run(env, "status", "--json").stdout)
    assert data["config"] == {"run_id": None, "run_id_source": "STEPBARRIER_RUN_ID"}


def test_status_shows_no_count_of_writes_and_json_keeps_the_raw_beat(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "run-a")
    env = cli_env(job_config, STEPBARRIER_RUN_ID="run-a")
    table = run(env, "status")
    assert table.returncode == 0, table.stderr
    assert "writes" not in summary_rows(table.stdout)
    assert f"{BEAT:,}" not in table.stdout and str(BEAT) not in table.stdout
    assert json.loads(run(env, "status", "--json").stdout)["beat"] == BEAT


def test_the_verbose_status_logs_the_run_id_line_once(job_config: BarrierConfig) -> None:
    env = cli_env(job_config, TORCHELASTIC_RUN_ID="t-9")
    result = run(env, "status", "--verbose")
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stderr.splitlines() if "stepbarrier.config" in line]
    assert len(lines) == 1, result.stderr
    assert f"job {job_config.job}: run id t-9 (from TORCHELASTIC_RUN_ID" in lines[0]
    assert " INFO " in lines[0]


# -- doctor ---------------------------------------------------------------------------


def doctor_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if "run id:" in line]


@pytest.fixture
def with_library(client: redis.Redis) -> None:
    install_functions(client)  # doctor never loads it; the state read needs it


@pytest.mark.usefixtures("with_library")
def test_doctor_says_the_run_id_and_that_the_state_is_this_runs(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "slurm-81")
    result = run(cli_env(job_config, SLURM_JOB_ID="81"), "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    first, last = doctor_lines(result.stdout)
    assert first == "note  run id: slurm-81 (from SLURM_JOB_ID, the Slurm job)"
    assert last == "ok    run id: the job's state is this run's (run id slurm-81)"


@pytest.mark.usefixtures("with_library")
def test_doctor_notes_a_state_of_another_run_and_says_what_to_do(
    client: redis.Redis, job_config: BarrierConfig
) -> None:
    write_run(client, job_config, "slurm-80")
    result = run(cli_env(job_config, SLURM_JOB_ID="81"), "doctor")
    assert result.returncode == 0, result.stdout + result.stderr  # a note, not a failure
    first, last = doctor_lines(result.stdout)
    assert "slurm-81 (from SLURM_JOB_ID" in first
    assert last.startswith("note  run id: the job's state belongs to run slurm-80")
    assert "not to this run (slurm-81)" in last
    fix = result.stdout.splitlines()[result.stdout.splitlines().index(last) + 1]
    assert fix.strip().startswith("fix:") and "STEPBARRIER_RUN_ID" in fix


@pytest.mark.usefixtures("with_library")
def test_doctor_without_any_run_id_says_which_variables_it_looked_at(
    job_config: BarrierConfig,
) -> None:
    result = run(cli_env(job_config), "doctor")
    assert result.returncode == 0, result.stdout + result.stderr
    first, last = doctor_lines(result.stdout)
    assert first == (
        "note  run id: none (no STEPBARRIER_RUN_ID, TORCHELASTIC_RUN_ID or SLURM_JOB_ID is set)"
    )
    assert last == "note  run id: no chief has written the job's state yet"
