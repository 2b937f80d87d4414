"""The launchers' examples, run for real against the session's redis-server: the task
id and the run id come from torchrun (``RANK``, ``TORCHELASTIC_RUN_ID``) and Slurm
(``SLURM_PROCID``, ``SLURM_JOB_ID``), with no ``STEPBARRIER_*`` variable but the job
and the Redis URL, and each rank above 0 starts training only once rank 0's
published step has reached its own (docs/coming-from.md); a torchrun evaluator
follows every checkpoint (docs/following.md), and a Slurm job's status names its
slow task (docs/who-is-slow.md).

Slurm runs without a daemon: ``examples/slurm_job.sh`` is run by ``bash`` as
``sbatch`` would (``SLURM_JOB_ID``, ``SLURM_NTASKS``), with an ``srun`` on the PATH
that starts its command once per task with ``SLURM_PROCID`` set."""

from __future__ import annotations

import json
import math
import os
import signal
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


def test_a_torchrun_evaluator_follows_every_checkpoint_while_the_chief_jumps(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    """examples/torchrun_evaluator.py: rank 0 checkpoints every 5 steps but publishes
    only every 15, so each announcement crosses three multiples; rank 1 follows and
    evaluates each checkpoint, in order, none skipped (issue 38)."""
    every, publish_every, steps = 5, 15, 60
    env = subprocess_env(STEPBARRIER_JOB=job, STEPBARRIER_REDIS_URL=redis_server.url)
    done = subprocess.run(
        [str(BIN / "torchrun"), "--nproc-per-node", "2", "--standalone",
         str(EXAMPLES / "torchrun_evaluator.py"), "--steps", str(steps), "--every", str(every),
         "--publish-every", str(publish_every), "--step-sleep", "0.01",
         "--follow-timeout", "120", "--checkpoint-dir", str(tmp_path / "ckpt"),
         "--record-dir", str(tmp_path)],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    chief, evaluator = records(tmp_path, "rank", 2)
    assert chief["published"] == [15, 30, 45, 60]
    assert chief["run_id"] == evaluator["run_id"]  # torchrun's, for both ranks
    followed = evaluator["followed"]
    assert [f["multiple"] for f in followed] == list(range(every, steps + 1, every))
    for seen in followed:  # the chief's step that released it: one it published
        assert seen["step"] in chief["published"] and seen["step"] >= seen["multiple"], seen
        assert math.isfinite(seen["loss"])  # the checkpoint was there, whole
    assert "evaluator: checkpoint of step 60" in done.stdout
    status = read_status(BarrierConfig(job=job, redis_url=redis_server.url, run_id=chief["run_id"]))
    assert (status.step, status.done) == (steps, True)


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


def slurm_env(tmp_path: Path, **variables: str) -> dict[str, str]:
    """The environment of ``examples/slurm_job.sh`` as sbatch would start it, with the fake
    ``srun`` first on PATH; each task's record goes to ``tmp_path``."""
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    srun = fake_bin / "srun"
    srun.write_text(FAKE_SRUN.format(python=sys.executable))
    srun.chmod(0o755)
    return subprocess_env(
        PATH=f"{fake_bin}:{subprocess_env()['PATH']}",
        PYTHON=sys.executable,
        SLURM_SUBMIT_DIR=ROOT,
        RECORD_DIR=str(tmp_path),
        **variables,
    )


def test_the_slurm_scripts_tasks_start_gradually_from_the_chiefs_step(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    ntasks, schedule_k = 4, 10
    env = slurm_env(
        tmp_path,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_JOB=job,
        STEPBARRIER_SCHEDULE=f"log:{schedule_k}",
        STEPBARRIER_TIMEOUT="120",
        TRAIN_STEPS="30",
        STEP_SLEEP="0.02",
        SLURM_JOB_ID="4242",  # what sbatch sets for the batch script and its steps
        SLURM_NTASKS=str(ntasks),
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


def test_the_slurm_jobs_status_names_its_slow_task(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    """examples/slurm_job.sh with ``SLOW_TASK=3``: every task reports its own step, and
    ``stepbarrier status --json`` names task 3 a straggler while the others keep up,
    then ``status --check`` exits 10 naming it stuck (issue 38). No Slurm here: the
    script runs under ``bash`` with the variables sbatch sets, and the fake ``srun``
    starts each task with its ``SLURM_PROCID``. Task 3 would train for minutes: the
    test ends the job it started once status has said it."""
    ntasks, slow = 4, 3
    env = slurm_env(
        tmp_path,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_JOB=job,
        STEPBARRIER_SCHEDULE="log:10",
        STEPBARRIER_TIMEOUT="120",
        TRAIN_STEPS="100000",  # the chief trains until the test ends the job
        STEP_SLEEP="0.02",
        SLOW_TASK=str(slow),
        SLOW_STEP_SLEEP="5",  # one step each 5 s: behind, then no progress for 2 s
        SLURM_JOB_ID="4343",
        SLURM_NTASKS=str(ntasks),
    )
    status_env = subprocess_env(
        STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=job, STEPBARRIER_RUN_ID="slurm-4343"
    )
    job_run = subprocess.Popen(
        ["bash", str(EXAMPLES / "slurm_job.sh")], env=env, cwd=tmp_path, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        # a healthy task is at most about a second of steps (50) plus its ramp behind
        while True:
            assert job_run.poll() is None, "the job ended before status named its slow task"
            shown = run(status_env, "status", "--json", "--straggler-steps", "150")
            tasks = {t["task_id"]: t for t in json.loads(shown.stdout).get("tasks", [])}
            if slow in tasks and tasks[slow]["straggler"] and len(tasks) == ntasks:
                break
        assert max(tasks.values(), key=lambda t: t["behind"])["task_id"] == slow, tasks
        assert not any(t["stuck"] for task_id, t in tasks.items() if task_id != slow), tasks
        while True:  # no step of task 3 for the reader's stall timeout, the chief going on
            assert job_run.poll() is None, "the job ended before task 3 was stuck"
            checked = run(status_env, "status", "--check", "--stall-timeout", "2")
            if checked.returncode == 10:
                break
            assert checked.returncode == 0, checked.stdout + checked.stderr
        assert f"stuck: task {slow} at step" in checked.stdout, checked.stdout
    finally:
        os.killpg(job_run.pid, signal.SIGTERM)
        job_run.wait(60)


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
