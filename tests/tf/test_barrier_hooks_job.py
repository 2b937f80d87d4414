"""A real between-graph parameter-server job with start and end barriers, one OS
process per task: one ps, the chief and two workers run
``examples/tf1_start_end_barriers.py`` (``hooks_from_env(start_barrier=True,
end_barrier=True)``, the parties from ``TF_CONFIG``). Worker 2 has more to do
after training: the test holds it until the chief has arrived at the end barrier,
sees the chief still holding in ``end()``, and only then lets worker 2 finish."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from examples.demo.local import free_port
from stepbarrier import Barrier, BarrierConfig, read_status
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer
from tests.tf.example_processes import ExampleProcesses

pytestmark = pytest.mark.tensorflow

EXAMPLE = "tf1_start_end_barriers.py"
TRAIN_STEPS = 30


def tf_config(cluster: dict[str, list[str]], kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def arrived(config: BarrierConfig, name: str) -> tuple[int, ...]:
    state = Barrier(config, name, 3).read()
    return () if state is None else state.arrived


def test_the_chiefs_end_waits_for_every_worker(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    cluster = {
        "ps": [f"localhost:{free_port()}"],
        "chief": [f"localhost:{free_port()}"],
        "worker": [f"localhost:{free_port()}", f"localhost:{free_port()}"],
    }
    release = tmp_path / "worker-2-may-finish"
    base = subprocess_env(
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_RUN_ID="run-1",
        TRAIN_STEPS=str(TRAIN_STEPS),
        STEP_SLEEP="0.02",
    )
    observer = BarrierConfig(job=job, redis_url=redis_server.url, task_id=0, run_id="run-1")
    with ExampleProcesses(tmp_path) as tasks:
        tasks.start("ps", EXAMPLE, {**base, "TF_CONFIG": tf_config(cluster, "ps", 0)})
        tasks.start("chief", EXAMPLE, {**base, "TF_CONFIG": tf_config(cluster, "chief", 0)})
        tasks.start("worker1", EXAMPLE, {**base, "TF_CONFIG": tf_config(cluster, "worker", 0)})
        held = {**base, "TF_CONFIG": tf_config(cluster, "worker", 1)}
        tasks.start("worker2", EXAMPLE, {**held, "HOLD_END_UNTIL_FILE": str(release)})
        deadline = time.monotonic() + 180
        while arrived(observer, "end") != (0, 1):  # the chief and worker 1 are done
            assert tasks.processes["chief"].poll() is None, tasks.all_logs()
            assert time.monotonic() < deadline, tasks.all_logs()
            time.sleep(0.1)
        time.sleep(0.5)  # ample time to exit, if the chief were not held
        assert tasks.processes["chief"].poll() is None, "the chief left before worker 2"
        released_at = time.time()
        release.touch()
        records: dict[str, dict[str, Any]] = tasks.finish("chief", "worker1", "worker2")
    start = Barrier(observer, "start", 3).read()
    end = Barrier(observer, "end", 3).read()
    assert start is not None and start.completed_ms is not None
    assert end is not None and end.completed_ms is not None
    assert dict(end.arrivals)[2] == end.completed_ms  # worker 2 came last, after the release
    assert end.completed_ms >= int(released_at * 1000)
    chief = records["chief"]
    assert chief["ended_at"] * 1000 >= end.completed_ms
    assert chief["job_done"] is True
    for record in records.values():  # nobody trained before everyone was there
        assert record["steps_trained"] > 0
        assert record["first_step_at"] * 1000 >= start.completed_ms
    status = read_status(observer)
    assert status.done and status.step is not None and status.step >= TRAIN_STEPS
    print(
        f"\nstart barrier open {start.completed_ms - (start.created_ms or 0)} ms; chief held "
        f"{end.completed_ms - dict(end.arrivals)[0]} ms at the end; chief exited "
        f"{chief['ended_at'] * 1000 - end.completed_ms:.0f} ms after worker 2's arrival"
    )
