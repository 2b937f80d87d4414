"""A real between-graph parameter-server job on loopback, one OS process per task.

One ps, the chief and two workers run ``examples/tf1_parameter_server.py`` with
the hooks from ``hooks_from_env()`` (role and task id from ``TF_CONFIG``, the
workers' steps from the ``log:20`` schedule). The assertions use only what the
processes recorded themselves.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer, free_port
from tests.tf.example_processes import ExampleProcesses

pytestmark = pytest.mark.tensorflow

TRAIN_STEPS = 50
SCHEDULE_K = 20
SOON = 10
"""Chief steps a worker may be released after its step (the job runs ~20 steps/s)."""


def tf_config(cluster: dict[str, list[str]], kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@pytest.fixture(scope="module")
def job_records(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """Run the job once; every test below reads its records."""
    workdir: Path = tmp_path_factory.mktemp("ps-job")
    cluster = {
        "ps": [f"localhost:{free_port()}"],
        "chief": [f"localhost:{free_port()}"],
        "worker": [f"localhost:{free_port()}", f"localhost:{free_port()}"],
    }
    base = subprocess_env(
        STEPBARRIER_JOB=f"ps-job-{workdir.name}",
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_SCHEDULE=f"log:{SCHEDULE_K}",
        STEPBARRIER_TIMEOUT="180",
        TRAIN_STEPS=str(TRAIN_STEPS),
        STEP_SLEEP="0.05",
    )
    with ExampleProcesses(workdir) as job:
        example = "tf1_parameter_server.py"
        job.start("ps", example, {**base, "TF_CONFIG": tf_config(cluster, "ps", 0)})
        job.start(
            "chief",
            example,
            # Training starts once both workers wait, so neither can miss its step.
            {**base, "TF_CONFIG": tf_config(cluster, "chief", 0), "WAIT_FOR_WAITERS": "2"},
        )
        for index in (0, 1):
            env = {**base, "TF_CONFIG": tf_config(cluster, "worker", index)}
            job.start(f"worker{index}", example, env)
        return job.finish("chief", "worker0", "worker1")


def workers(records: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    return [records["worker0"], records["worker1"]]


def test_the_workers_wait_for_different_steps_of_the_log_schedule(
    job_records: dict[str, dict[str, Any]],
) -> None:
    steps = [w["wait_until_step"] for w in workers(job_records)]
    # TF_CONFIG worker i is task i + 1 when the cluster has a chief
    assert [w["task_id"] for w in workers(job_records)] == [1, 2]
    assert steps == [int(SCHEDULE_K * math.log(2)), int(SCHEDULE_K * math.log(3))]
    assert steps[0] != steps[1]


def test_no_worker_is_released_before_the_global_step_reaches_its_step(
    job_records: dict[str, dict[str, Any]],
) -> None:
    for worker in workers(job_records):
        assert worker["released_at_step"] >= worker["wait_until_step"], worker


def test_no_worker_trains_before_the_global_step_reaches_its_step(
    job_records: dict[str, dict[str, Any]],
) -> None:
    for worker in workers(job_records):
        # first_global_step is the ps's global step right after the worker's
        # first run, its own increment included: before that run it was one less.
        assert worker["steps_trained"] > 0, worker
        assert worker["first_global_step"] - 1 >= worker["wait_until_step"], worker


def test_each_worker_is_released_soon_after_its_step(
    job_records: dict[str, dict[str, Any]],
) -> None:
    for worker in workers(job_records):
        assert worker["released_at_step"] <= worker["wait_until_step"] + SOON, worker
        assert worker["released_at"] <= worker["first_step_at"]


def test_the_chief_trains_from_the_start_to_the_last_step(
    job_records: dict[str, dict[str, Any]],
) -> None:
    chief = job_records["chief"]
    steps = [step for step, _ in chief["step_times"]]
    assert chief["released_at_step"] is None and chief["wait_until_step"] == 0
    assert chief["first_global_step"] == 1
    assert steps == sorted(steps) and len(set(steps)) == len(steps)
    assert steps[-1] >= TRAIN_STEPS
    assert chief["steps_trained"] == len(steps)
