"""The framework-free example, and the examples' promise to need only the environment.

``tf1_parameter_server.py`` runs in test_parameter_server_job.py and
``keras_fit.py`` in test_keras_callbacks.py.
"""

from __future__ import annotations

import math
import subprocess
import sys
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig, read_status
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer
from tests.tf.example_processes import EXAMPLES, ExampleProcesses

pytestmark = pytest.mark.tensorflow


def test_the_plain_loop_starts_workers_on_the_schedule_and_aborts_a_hopeless_one(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    base = subprocess_env(
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_SCHEDULE="log:20",
        STEPBARRIER_TIMEOUT="120",
        TRAIN_STEPS="40",
        STEP_SLEEP="0.02",
    )
    with ExampleProcesses(tmp_path) as job_processes:
        job_processes.start(
            "chief", "plain_loop.py", {**base, "STEPBARRIER_ROLE": "chief", "WAIT_FOR_WAITERS": "3"}
        )
        for task in (1, 2):
            env = {**base, "STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": str(task)}
            job_processes.start(f"worker{task}", "plain_loop.py", env)
        late = {**base, "STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": "3"}
        job_processes.start(
            "hopeless", "plain_loop.py", {**late, "STEPBARRIER_WAIT_UNTIL_STEP": "1000"}
        )
        records = job_processes.finish("chief", "worker1", "worker2", "hopeless")
    assert records["chief"]["steps_trained"] == 40
    for task in (1, 2):
        worker = records[f"worker{task}"]
        assert worker["wait_until_step"] == int(20 * math.log(task + 1))
        assert (
            worker["wait_until_step"]
            <= worker["released_at_step"]
            <= worker["wait_until_step"] + 10
        )
        assert worker["steps_trained"] == 40
    hopeless = records["hopeless"]
    assert (hopeless["released_at_step"], hopeless["steps_trained"]) == (None, 0)
    status = read_status(BarrierConfig(job=job, redis_url=redis_server.url))
    assert (status.step, status.done) == (40, True)


@pytest.mark.parametrize("example", ["tf1_parameter_server.py", "keras_fit.py", "plain_loop.py"])
def test_each_example_documents_every_variable_it_reads(example: str) -> None:
    text = (EXAMPLES / example).read_text()
    docstring = text.split('"""')[1]
    read = {"TRAIN_STEPS", "STEP_SLEEP", "RECORD_FILE", "WAIT_FOR_WAITERS", "STEPBARRIER_JOB"}
    for name in read:
        assert name in docstring, f"{example} does not document {name}"
    assert "argv" not in text and "argparse" not in text


@pytest.mark.parametrize(
    ("module", "missing"),
    [("stepbarrier.tf_hooks", "tensorflow"), ("stepbarrier.keras_callbacks", "keras")],
)
def test_a_missing_framework_gives_a_clear_import_error(module: str, missing: str) -> None:
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "import stepbarrier\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as exc:\n"
        "    print(exc)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'stepbarrier[tensorflow]'" in result.stdout
