"""The parameter-server example with a TF1 ``master`` task, and workers that give up.

One ps, a ``master`` (TF1's name for the chief) and three workers run
``examples/tf1_parameter_server.py``: worker 0 waits for its ``log:20`` step;
worker 1 waits for a step the master never reaches, so it is aborted when the
master finishes; worker 2 waits in a barrier job nobody publishes to, for a step the job never
reaches, with a 1 s timeout. A worker whose wait ended without its step must exit non-zero, or
Kubernetes would count it as done.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer, free_port
from tests.tf.example_processes import ExampleProcesses

pytestmark = pytest.mark.tensorflow

TRAIN_STEPS = 40
SCHEDULE_K = 20


@dataclass
class Outcome:
    """How one task of the job ended."""

    exit_code: int
    record: dict[str, Any]
    log: str


def tf_config(cluster: dict[str, list[str]], kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@pytest.fixture(scope="module")
def outcomes(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Outcome]:
    """Run the job once; every test below reads how its tasks ended."""
    workdir: Path = tmp_path_factory.mktemp("master-job")
    cluster = {
        "ps": [f"localhost:{free_port()}"],
        "master": [f"localhost:{free_port()}"],
        "worker": [f"localhost:{free_port()}" for _ in range(3)],
    }
    job = f"master-job-{workdir.name}"
    base = subprocess_env(
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_SCHEDULE=f"log:{SCHEDULE_K}",
        STEPBARRIER_TIMEOUT="180",
        TRAIN_STEPS=str(TRAIN_STEPS),
        STEP_SLEEP="0.05",
    )
    example = "tf1_parameter_server.py"
    envs = {
        "ps": {**base, "TF_CONFIG": tf_config(cluster, "ps", 0)},
        # Training starts once workers 0 and 1 wait, so worker 1 is surely aborted.
        "master": {**base, "TF_CONFIG": tf_config(cluster, "master", 0), "WAIT_FOR_WAITERS": "2"},
        "worker0": {**base, "TF_CONFIG": tf_config(cluster, "worker", 0)},
        "worker1": {
            **base,
            "TF_CONFIG": tf_config(cluster, "worker", 1),
            "STEPBARRIER_WAIT_UNTIL_STEP": "1000",
            "STEPBARRIER_TIMEOUT": "90",  # the master ends long before: the wait is aborted
        },
        "worker2": {
            **base,
            "TF_CONFIG": tf_config(cluster, "worker", 2),
            "STEPBARRIER_JOB": f"{job}-nobody-publishes",
            # a step the job never reaches: the session's step (the safety net,
            # which would release a lower one as TensorFlow's hook does) never comes
            "STEPBARRIER_WAIT_UNTIL_STEP": "100000",
            "STEPBARRIER_TIMEOUT": "1",
        },
    }
    with ExampleProcesses(workdir) as processes:
        for name, env in envs.items():
            processes.start(name, example, env)
        return {
            name: Outcome(processes.exit_code(name), processes.record(name), processes.log(name))
            for name in ("master", "worker0", "worker1", "worker2")
        }


def test_a_master_task_is_the_chief_and_trains_from_the_first_step(
    outcomes: dict[str, Outcome],
) -> None:
    master = outcomes["master"]
    assert master.exit_code == 0, master.log
    assert master.record["task_id"] == 0 and master.record["wait_until_step"] == 0
    assert master.record["first_global_step"] == 1
    assert master.record["step_times"][-1][0] >= TRAIN_STEPS


def test_a_worker_of_a_master_job_is_released_at_its_step(outcomes: dict[str, Outcome]) -> None:
    worker = outcomes["worker0"]
    assert worker.exit_code == 0, worker.log
    assert worker.record["task_id"] == 1  # worker i is task i + 1 next to a master
    assert worker.record["wait_until_step"] == int(SCHEDULE_K * math.log(2))
    assert worker.record["released_at_step"] >= worker.record["wait_until_step"]
    assert worker.record["steps_trained"] > 0


def test_an_aborted_worker_exits_non_zero(outcomes: dict[str, Outcome]) -> None:
    worker = outcomes["worker1"]
    assert worker.exit_code == 1, worker.log
    assert "BarrierAborted" in worker.log
    assert (worker.record["released_at_step"], worker.record["steps_trained"]) == (None, 0)


def test_a_timed_out_worker_exits_non_zero(outcomes: dict[str, Outcome]) -> None:
    worker = outcomes["worker2"]
    assert worker.exit_code == 1, worker.log
    assert "BarrierTimeout" in worker.log
    assert (worker.record["released_at_step"], worker.record["steps_trained"]) == (None, 0)
