"""The launchers' examples, run for real against the session's redis-server: the task
id and the run id come from torchrun (``RANK``, ``TORCHELASTIC_RUN_ID``) and Slurm
(``SLURM_PROCID``, ``SLURM_JOB_ID``), with no ``STEPBARRIER_*`` variable but the job
and the Redis URL, and each rank above 0 starts training only once rank 0's
published step has reached its own (docs/coming-from.md).

Slurm runs without a daemon: ``examples/slurm_job.sh`` is run by ``bash`` as
``sbatch`` would (``SLURM_JOB_ID``, ``SLURM_NTASKS``), with an ``srun`` on the PATH
that starts its command once per task with ``SLURM_PROCID`` set."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from stepbarrier import BarrierConfig, read_status
from tests.conftest import ROOT, subprocess_env
from tests.integration.test_cli import run
from tests.redis_harness import RedisServer

EXAMPLES = Path(ROOT) / "examples"
BIN = Path(sys.executable).parent


def records(directory: Path, prefix: str, count: int) -> list[dict[str, Any]]:
    found = [json.loads((directory / f"{prefix}-{i}.json").read_text()) for i in range(count)]
    return found


def test_torchrun_ranks_start_gradually_from_rank_0s_step(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    ranks, ramp, steps = 3, 12.0, 30
    env = subprocess_env(STEPBARRIER_JOB=job, STEPBARRIER_REDIS_URL=redis_server.url)
    done = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", str(ranks), "--standalone",
         str(EXAMPLES / "torchrun_gradual_start.py"), "--steps", str(steps),
         "--ramp", str(ramp), "--step-sleep", "0.02", "--barrier-timeout", "120",
         "--record-dir", str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    chief, *workers = records(tmp_path, "rank", ranks)
    assert chief["role"] == "chief" and chief["rank"] == 0
    assert chief["task"] == "task 0, chief (from RANK, torchrun's global rank)"
    # --standalone makes one fresh rendezvous id per launch: every rank's run id
    [run_id] = {record["run_id"] for record in (chief, *workers)}
    assert run_id and {r["run_id_source"] for r in (chief, *workers)} == {"TORCHELASTIC_RUN_ID"}
    published_at = {int(step): at for step, at in chief["published_at"].items()}
    assert sorted(published_at) == list(range(1, steps + 1))
    for rank, worker in enumerate(workers, start=1):
        target = int(ramp * math.log(rank + 1))
        assert worker["role"] == "worker", worker
        assert worker["task"] == f"task {rank}, worker (from RANK, torchrun's global rank)"
        assert worker["wait_until_step"] == target > 0
        assert worker["released_at_step"] >= target, worker  # rank 0's step it saw
        # time.monotonic() is the machine's one clock: an order, no duration
        assert worker["first_step_at"] > published_at[target], (worker, published_at[target])
        assert worker["steps_trained"] == steps
        assert f"rank {rank} (worker): waited for step {target}" in done.stdout
    config = BarrierConfig(job=job, redis_url=redis_server.url, run_id=run_id)
    status = read_status(config)
    assert (status.run_id, status.step, status.done) == (run_id, steps, True)


FAKE_SRUN = """#!{python}
# srun without Slurm: its command once per task (SLURM_NTASKS), SLURM_PROCID set in
# each, as srun does; each task's RECORD_FILE is its own. Options are ignored.
import os, subprocess, sys
command = [word for word in sys.argv[1:] if not word.startswith("--")]
tasks = []
for rank in range(int(os.environ["SLURM_NTASKS"])):
    env = {{**os.environ, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
            "RECORD_FILE": os.path.join(os.environ["RECORD_DIR"], f"task-{{rank}}.json")}}
    tasks.append(subprocess.Popen(command, env=env))
sys.exit(max(task.wait() for task in tasks))
"""


def test_the_slurm_scripts_tasks_start_gradually_from_the_chiefs_step(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    ntasks, schedule_k = 4, 10
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    srun = fake_bin / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(0o755)
    env = subprocess_env(
        PATH=f"{fake_bin}:{subprocess_env()['PATH']}",
        PYTHON=sys.executable,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_JOB=job,
        STEPBARRIER_SCHEDULE=f"log:{schedule_k}",
        STEPBARRIER_TIMEOUT="120",
        TRAIN_STEPS="30",
        STEP_SLEEP="0.02",
        SLURM_JOB_ID="4242",  # what sbatch sets for the batch script and its steps
        SLURM_NTASKS=str(ntasks),
        SLURM_SUBMIT_DIR=ROOT,
        RECORD_DIR=str(tmp_path),
    )
    done = subprocess.run(
        ["bash", str(EXAMPLES / "slurm_job.sh")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "fewer than" not in done.stdout  # the chief trained once every worker waited
    chief, *workers = records(tmp_path, "task", ntasks)
    assert (chief["task_type"], chief["task_id"], chief["steps_trained"]) == ("chief", 0, 30)
    for task_id, worker in enumerate(workers, start=1):
        target = int(schedule_k * math.log(task_id + 1))
        assert (worker["task_type"], worker["task_id"]) == ("worker", task_id)
        assert worker["wait_until_step"] == target > 0
        # each worker waited before the chief's first step (WAIT_FOR_WAITERS) and
        # was released by a step of the chief at or past its own
        assert worker["released_at_step"] >= target, worker
        assert worker["steps_trained"] == 30
    config = BarrierConfig(job=job, redis_url=redis_server.url, run_id="slurm-4242")
    status = read_status(config)
    assert (status.run_id, status.step, status.done) == ("slurm-4242", 30, True)


def test_the_slurm_script_refuses_to_run_without_a_redis_url(tmp_path: Path) -> None:
    env = subprocess_env(SLURM_JOB_ID="1", SLURM_NTASKS="2", PATH="/usr/bin:/bin")
    done = subprocess.run(
        ["bash", str(EXAMPLES / "slurm_job.sh")],
        env=env, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "set STEPBARRIER_REDIS_URL" in done.stderr


def test_doctor_says_the_task_the_launcher_gave(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config()
    base = subprocess_env(STEPBARRIER_REDIS_URL=config.redis_url, STEPBARRIER_JOB=config.job)
    for extra, said in [
        ({"SLURM_JOB_ID": "81", "SLURM_PROCID": "2"}, "task 2, worker (from SLURM_PROCID"),
        ({"TORCHELASTIC_RUN_ID": "t-1", "RANK": "0"}, "task 0, chief (from RANK"),
        (
            {"STEPBARRIER_TASK_ID": "5", "SLURM_PROCID": "0"},
            "task 5, worker (from STEPBARRIER_TASK_ID)",
        ),
    ]:
        result = run({**base, **extra}, "doctor")
        [line] = [line for line in result.stdout.splitlines() if " task: " in line]
        assert line.startswith(f"note  task: {said}"), result.stdout + result.stderr
    bad = run({**base, "TORCHELASTIC_RUN_ID": "t-1", "RANK": "abc"}, "doctor")
    assert bad.returncode == 2
    assert "RANK (torchrun's global rank) must be an integer" in bad.stderr
    assert "Traceback" not in bad.stderr
