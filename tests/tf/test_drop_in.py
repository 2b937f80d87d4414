""" "Change one import", tried as a TensorFlow user would, in real parameter-server jobs.

Each job runs on loopback with one OS process per task (``migration_task.py``):
a ps, a chief and workers in ``MonitoredTrainingSession``. The records the
processes wrote, their exit codes and their logs are all the assertions use.

- The chief left as the TensorFlow user had it (no publisher): workers with
  stepbarrier's hook (configured for Redis; with no ``STEPBARRIER_*`` at all;
  with Redis down from the start) start as TensorFlow's own hook does, on the
  session's global step.
- A chief with the publisher whose training loop dies in a process that lives
  on: a worker waiting for a later step reaches its stall timeout instead of
  waiting as long as the process lives.
- A chief that trains in two sessions with a gap longer than the stall
  timeout: its waiting worker waits on through the gap; a worker started after
  the chief's last session ended is released by the session's step.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer, free_port
from tests.tf.example_processes import ExampleProcesses

pytestmark = pytest.mark.tensorflow

TASK = str(Path(__file__).parent / "migration_task.py")
SOON = 25
"""Chief steps a worker woken through Redis may start after its step (about 20 steps
a second; the wake takes milliseconds, the worker's first run does not)."""
SOON_BY_SESSION = 60
"""Chief steps a worker released by the session's step may start after it. The
chief runs at most 20 steps a second and a worker reads the session's step every
0.5 s (10 steps), but each read is a gRPC call to the ps, and with six TensorFlow
processes per job and another test worker beside them a read was seen 1.4 s late
(28 steps). 60 steps (3 s) still proves the point: a worker that missed its step
waits for the end of the chief's 150 steps, or 600 s."""
SESSION = "the session's global step"


def cluster_of(workers: int) -> dict[str, list[str]]:
    return {
        "ps": [f"localhost:{free_port()}"],
        "chief": [f"localhost:{free_port()}"],
        "worker": [f"localhost:{free_port()}" for _ in range(workers)],
    }


def tf_config(cluster: dict[str, list[str]], kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def start_job(
    job: ExampleProcesses,
    cluster: dict[str, list[str]],
    chief_env: dict[str, str],
    workers: dict[str, dict[str, str]],
) -> None:
    """Start the ps, the chief (training once every worker is about to wait) and workers."""
    job.start("ps", TASK, subprocess_env(TF_CONFIG=tf_config(cluster, "ps", 0)))
    ready = ",".join(str(job.record_path(name)) + ".ready" for name in workers)
    env = {**chief_env, "TF_CONFIG": tf_config(cluster, "chief", 0), "WAIT_READY": ready}
    job.start("chief", TASK, env)
    for index, (name, worker_env) in enumerate(workers.items()):
        job.start(name, TASK, {**worker_env, "TF_CONFIG": tf_config(cluster, "worker", index)})


def full_log(job: ExampleProcesses, name: str) -> str:
    return (job.workdir / f"{name}.log").read_text(errors="replace")


# -- the chief left as the TensorFlow user had it -------------------------------------

UNCHANGED_TARGET = 60


@pytest.fixture(scope="module")
def unchanged_chief(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    workdir = tmp_path_factory.mktemp("unchanged-chief")
    cluster = cluster_of(4)
    common = {"TRAIN_STEPS": "150", "WAIT_UNTIL_STEP": str(UNCHANGED_TARGET)}
    redis = {"STEPBARRIER_JOB": f"unchanged-{workdir.name}"}
    workers = {
        "tensorflow": subprocess_env(**common, WORKER_HOOK="tensorflow"),
        "configured": subprocess_env(
            **common,
            **redis,
            STEPBARRIER_REDIS_URL=redis_server.url,
            STEPBARRIER_NO_CHIEF_WARNING="1",
        ),
        "unconfigured": subprocess_env(**common),
        "redis_down": subprocess_env(
            **common, **redis, STEPBARRIER_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0"
        ),
    }
    with ExampleProcesses(workdir) as job:
        chief = subprocess_env(CHIEF_HOOKS="none", TRAIN_STEPS="150", STEP_SLEEP="0.05")
        start_job(job, cluster, chief, workers)
        records = job.finish("chief", *workers)
        logs = {name: full_log(job, name) for name in workers}
    return records, logs


@pytest.mark.parametrize("worker", ["tensorflow", "configured", "unconfigured", "redis_down"])
def test_with_the_chief_unchanged_every_worker_starts_at_its_step_as_tensorflow_s_does(
    unchanged_chief: tuple[dict[str, dict[str, Any]], dict[str, str]], worker: str
) -> None:
    records, _ = unchanged_chief
    record = records[worker]
    assert record["error"] is None, record
    assert record["steps_trained"] > 0, record
    # never early: the step before the worker's first run reached its target
    assert record["first_global_step"] - 1 >= UNCHANGED_TARGET, record
    assert record["first_global_step"] - 1 <= UNCHANGED_TARGET + SOON_BY_SESSION, record
    if worker != "tensorflow":
        assert record["released_by"] == SESSION, record
        late = UNCHANGED_TARGET + SOON_BY_SESSION
        assert UNCHANGED_TARGET <= record["released_at_step"] <= late, record


def test_a_configured_worker_says_early_that_no_chief_publishes_and_how_to_add_one(
    unchanged_chief: tuple[dict[str, dict[str, Any]], dict[str, str]],
) -> None:
    log = unchanged_chief[1]["configured"]
    assert "WARNING job unchanged-" in log and "no write of this job's chief seen on" in log
    assert "Likely causes: the chief runs no publisher" in log
    assert "before any write of this job's chief was seen" in log
    assert "add GlobalStepPublisherHook() to the chief's chief_only_hooks" in log
    assert "Waiting for global step 60 before starting training." in log
    assert f"by {SESSION}" in log


def test_an_unconfigured_worker_warns_once_naming_the_variables(
    unchanged_chief: tuple[dict[str, dict[str, Any]], dict[str, str]],
) -> None:
    log = unchanged_chief[1]["unconfigured"]
    assert log.count("STEPBARRIER_JOB is not set") == 1
    assert "STEPBARRIER_REDIS_URL" in log
    assert "Redis at" not in log and "unreachable" not in log, "it touched Redis"


def test_with_redis_down_a_worker_says_so_once_and_waits_on_the_session(
    unchanged_chief: tuple[dict[str, dict[str, Any]], dict[str, str]],
) -> None:
    log = unchanged_chief[1]["redis_down"]
    assert log.count(f"waiting on {SESSION} alone") == 1, log


# -- a chief with the publisher whose training loop dies -------------------------------

DIE_AT = 60
STALL = 4.0


@pytest.fixture(scope="module")
def dead_loop(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, dict[str, Any]], dict[str, int | None]]:
    workdir = tmp_path_factory.mktemp("dead-loop")
    cluster = cluster_of(2)
    redis = {
        "STEPBARRIER_JOB": f"dead-loop-{workdir.name}",
        "STEPBARRIER_REDIS_URL": redis_server.url,
        "STEPBARRIER_STALL_TIMEOUT": str(STALL),
        "STEPBARRIER_HEARTBEAT": "0.5",
        "TRAIN_STEPS": "400",
    }
    workers = {
        # it stops training before the chief's loop dies: nobody moves the step after
        "early": subprocess_env(**{**redis, "TRAIN_STEPS": "45"}, WAIT_UNTIL_STEP="30"),
        "after_death": subprocess_env(**redis, WAIT_UNTIL_STEP="300"),
    }
    with ExampleProcesses(workdir) as job:
        chief = subprocess_env(
            **redis,
            CHIEF_HOOKS="publisher",
            CHIEF_LOOP="dies",
            DIE_AT=str(DIE_AT),
            STAY_ALIVE="60",
            STEP_SLEEP="0.05",
        )
        start_job(job, cluster, chief, workers)
        codes: dict[str, int | None] = {name: job.exit_code(name) for name in workers}
        codes["chief_while_workers_ended"] = job.processes["chief"].poll()
        records = {name: job.record(name) for name in workers}
    return records, codes


def test_a_worker_whose_step_came_is_woken_through_redis(
    dead_loop: tuple[dict[str, dict[str, Any]], dict[str, int | None]],
) -> None:
    records, codes = dead_loop
    early = records["early"]
    assert codes["early"] == 0 and early["error"] is None, early
    assert early["released_by"] != SESSION, early
    assert 30 <= early["released_at_step"] <= 30 + SOON, early


def test_a_chief_whose_loop_died_stops_vouching_and_its_worker_reaches_the_stall_timeout(
    dead_loop: tuple[dict[str, dict[str, Any]], dict[str, int | None]],
) -> None:
    records, codes = dead_loop
    worker = records["after_death"]
    assert codes["after_death"] == 1, worker
    assert "BarrierTimeout" in worker["error"] and "stall timeout" in worker["error"], worker
    assert worker["steps_trained"] == 0, worker
    # it ended while the chief's process still lived (it stays 60 s after the loop died)
    assert codes["chief_while_workers_ended"] is None


# -- a chief that trains in two sessions, and a worker that comes late -----------------

GAP_AT = 40
GAP_TARGET = 70
LAST = 100


@pytest.fixture(scope="module")
def two_sessions(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    workdir = tmp_path_factory.mktemp("two-sessions")
    cluster = cluster_of(2)
    redis = {
        "STEPBARRIER_JOB": f"two-sessions-{workdir.name}",
        "STEPBARRIER_REDIS_URL": redis_server.url,
        "STEPBARRIER_STALL_TIMEOUT": str(STALL),
        "STEPBARRIER_HEARTBEAT": "0.5",
        "TRAIN_STEPS": str(LAST),
    }
    with ExampleProcesses(workdir) as job:
        chief = subprocess_env(
            **redis,
            CHIEF_HOOKS="publisher",
            CHIEF_LOOP="sessions",
            GAP_AT=str(GAP_AT),
            GAP=str(3 * STALL),  # the heartbeat would stop after one, the wait one later
            STEP_SLEEP="0.05",
        )
        start_job(job, cluster, chief, {"gap": subprocess_env(**redis, WAIT_UNTIL_STEP="70")})
        records = job.finish("chief", "gap")
        # the chief's last session ended (without last_step) and its process is gone
        late = subprocess_env(**{**redis, "TRAIN_STEPS": str(LAST + 5)}, WAIT_UNTIL_STEP="50")
        job.start("late", TASK, {**late, "TF_CONFIG": tf_config(cluster, "worker", 1)})
        records.update(job.finish("late"))
        records["late"]["log"] = full_log(job, "late")
    return records


def test_a_worker_waits_on_through_a_gap_between_the_chief_s_sessions(
    two_sessions: dict[str, dict[str, Any]],
) -> None:
    worker = two_sessions["gap"]
    assert worker["error"] is None, worker
    assert worker["released_by"] != SESSION, worker
    assert GAP_TARGET <= worker["released_at_step"] <= GAP_TARGET + SOON, worker
    steps = [step for step, _ in two_sessions["chief"]["step_times"]]
    assert GAP_AT in steps and max(steps) >= GAP_TARGET  # the gap came before the target


def test_a_worker_started_after_the_chief_s_last_session_is_released_by_the_session(
    two_sessions: dict[str, dict[str, Any]],
) -> None:
    late = two_sessions["late"]
    assert late["error"] is None, late
    assert late["released_by"] == SESSION, late
    assert late["released_at_step"] >= LAST, late
    assert late["steps_trained"] > 0
