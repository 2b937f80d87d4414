"""What ``model.fit`` of Keras 3 (``tf.keras`` in TensorFlow 2.16 and later) does
under each ``tf.distribute`` strategy, with and without stepbarrier's callbacks:
each test is a claim of docs/tensorflow-keras.md#distribution-strategies.

The strategies of one process run in this process; those that need a cluster
run as real processes on loopback (tests/tf/keras_strategy_task.py, one per
task, on free 127.0.0.1 ports), each bounded by ``FINISH_TIMEOUT``: a hang fails
the test with the processes' logs instead of blocking the suite. The runs of
processes are started together, once per module, and the tests read the
records their processes wrote.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from examples.demo.local import LOOPBACK, free_port
from stepbarrier import BarrierConfig, read_status
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer
from tests.tf.example_processes import ExampleProcesses

pytestmark = pytest.mark.tensorflow

TASK = str(Path(__file__).with_name("keras_strategy_task.py"))
"""The program of every process (an absolute path: ExampleProcesses runs it)."""
BATCHES = 3
"""The batches of every ``fit`` (the task's too)."""
PER_REPLICA = "Attempt to convert a value (PerReplica:"
"""How Keras 3's ``fit`` fails under ``MultiWorkerMirroredStrategy`` with a cluster."""
PER_WORKER_DATASET = (
    "To use this dataset, you need to pass this dataset to "
    "ClusterCoordinator.create_per_worker_dataset."
)
"""How it fails on a ``ParameterServerStrategy`` coordinator."""


@dataclass
class Run:
    """The records of one run's processes, and the stepbarrier job they were given."""

    records: dict[str, dict[str, Any]]
    config: BarrierConfig

    def nothing_reached_redis(self) -> bool:
        """No callback published a step or registered a wait for this job."""
        status = read_status(self.config)
        return status.step is None and status.generation is None and not status.waiters


class Started:
    """One run's processes, started: ``finish`` waits for them and reads their records."""

    def __init__(
        self, workdir: Path, server: RedisServer, strategy: str, tasks: dict[str, int]
    ) -> None:
        """A process per task of ``tasks`` (a ``TF_CONFIG`` cluster: how many tasks
        of each type), or a single ``main`` process without ``TF_CONFIG`` when it
        is empty."""
        self.config = BarrierConfig(
            job=f"keras3-{strategy}-{uuid.uuid4().hex[:8]}", redis_url=server.url
        )
        common = {
            "STRATEGY": strategy,
            "STEPBARRIER_JOB": self.config.job,
            "STEPBARRIER_REDIS_URL": server.url,
        }
        cluster = {
            kind: [f"{LOOPBACK}:{free_port()}" for _ in range(n)] for kind, n in tasks.items()
        }
        self.processes = ExampleProcesses(workdir)
        if not tasks:
            self.processes.start("main", TASK, subprocess_env(**common))
        for kind, count in tasks.items():
            for index in range(count):
                task = {"cluster": cluster, "task": {"type": kind, "index": index}}
                env = subprocess_env(**common, TF_CONFIG=json.dumps(task))
                self.processes.start(f"{kind}{index}", TASK, env)

    def finish(self, *recorded: str) -> Run:
        """The records of ``recorded`` once they ended; the other processes (servers)
        are killed then."""
        with self.processes:
            return Run(self.processes.finish(*recorded), self.config)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, redis_server: RedisServer) -> dict[str, Run]:
    """Every run of processes, started together (their TensorFlow imports overlap)."""
    started = {
        # two workers of a MultiWorkerMirroredStrategy cluster
        "multi-worker-mirrored": ({"worker": 2}, ["worker0", "worker1"]),
        # a ParameterServerStrategy cluster: the coordinator (chief), a worker, a ps
        "parameter-server": ({"ps": 1, "worker": 1, "chief": 1}, ["chief0"]),
        # a MultiWorkerMirroredStrategy without TF_CONFIG, in a process of its own:
        # its setup stays out of this process's TensorFlow
        "one-process-multi-worker-mirrored": ({}, ["main"]),
    }
    groups: dict[str, tuple[Started, list[str]]] = {}
    try:
        for strategy, (tasks, recorded) in started.items():
            workdir = tmp_path_factory.mktemp(strategy)
            groups[strategy] = (Started(workdir, redis_server, strategy, tasks), recorded)
        return {strategy: group.finish(*recorded) for strategy, (group, recorded) in groups.items()}
    finally:
        for group, _ in groups.values():
            group.processes.close()


@pytest.fixture
def multi_worker_mirrored(runs: dict[str, Run]) -> Run:
    return runs["multi-worker-mirrored"]


@pytest.fixture
def parameter_server(runs: dict[str, Run]) -> Run:
    return runs["parameter-server"]


@pytest.fixture
def one_process_multi_worker_mirrored(runs: dict[str, Run]) -> Run:
    return runs["one-process-multi-worker-mirrored"]


class Batches(keras.callbacks.Callback):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.count += 1


ONE_PROCESS: dict[str, Callable[[], tf.distribute.Strategy | None]] = {
    "default": lambda: None,
    "one-device": lambda: tf.distribute.OneDeviceStrategy("/cpu:0"),
    "mirrored": tf.distribute.MirroredStrategy,
    "central-storage": tf.distribute.experimental.CentralStorageStrategy,
}


@pytest.mark.parametrize("name", list(ONE_PROCESS))
def test_fit_trains_in_one_process_under(name: str) -> None:
    """The default strategy, ``OneDeviceStrategy``, ``MirroredStrategy`` and
    ``CentralStorageStrategy`` (this process's devices): ``fit`` trains."""
    strategy = ONE_PROCESS[name]()
    scope: Callable[[], AbstractContextManager[Any]] = (
        nullcontext if strategy is None else strategy.scope
    )
    with scope():
        model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((BATCHES * 4, 2), dtype="float32")
    batches = Batches()
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[batches])
    assert batches.count == BATCHES
    assert int(model.optimizer.iterations.numpy()) == BATCHES


def test_fit_trains_under_multi_worker_mirrored_without_a_cluster(
    one_process_multi_worker_mirrored: Run,
) -> None:
    record = one_process_multi_worker_mirrored.records["main"]
    assert record["num_replicas_in_sync"] == 1  # this process's one CPU
    plain = record["plain"]
    assert (plain["outcome"], plain["batches_begun"], plain["iterations"]) == (
        "trained",
        BATCHES,
        BATCHES,
    )


def test_the_waiter_refuses_multi_worker_mirrored_without_a_cluster(
    one_process_multi_worker_mirrored: Run,
) -> None:
    waited = one_process_multi_worker_mirrored.records["main"]["with_waiter"]
    assert (waited["error"], waited["train_begun"], waited["batches_begun"]) == (
        "ConfigurationError",
        True,
        0,
    )
    assert "tf.distribute.MultiWorkerMirroredStrategy" in waited["message"]
    assert one_process_multi_worker_mirrored.nothing_reached_redis()


def test_two_multi_worker_mirrored_workers_take_an_all_reduce_together(
    multi_worker_mirrored: Run,
) -> None:
    """The cluster works: one all-reduce sums a 1 from each worker."""
    for record in multi_worker_mirrored.records.values():
        assert record["strategy"] == "CollectiveAllReduceStrategy"
        assert record["all_reduce_sum"] == 2.0


def test_fit_under_multi_worker_mirrored_with_a_cluster_raises_before_any_callback(
    multi_worker_mirrored: Run,
) -> None:
    """A model built in ``strategy.scope()``: every worker's ``fit`` raises Keras's
    ``ValueError`` before ``on_train_begin``; the stepbarrier callbacks given
    (the publisher to worker 0, a step waiter to worker 1) never ran."""
    for record in multi_worker_mirrored.records.values():
        fit = record["built_in_scope"]
        assert (fit["error"], fit["train_begun"], fit["batches_begun"]) == ("ValueError", False, 0)
        assert fit["message"].startswith(PER_REPLICA)
        assert fit["iterations"] == 0
    assert multi_worker_mirrored.nothing_reached_redis()


def test_under_multi_worker_mirrored_a_model_built_outside_the_scope_fails_in_its_first_step(
    multi_worker_mirrored: Run,
) -> None:
    """Built outside the scope and fit inside it: ``on_train_begin`` runs and the
    first batch begins, then that step raises ``AssertionError``: no step is
    taken. A step waiter refuses first, at ``on_train_begin``."""
    without = multi_worker_mirrored.records["worker0"]["built_outside_scope"]
    assert (without["error"], without["train_begun"], without["batches_begun"]) == (
        "AssertionError",
        True,
        1,
    )
    assert without["iterations"] == 0
    waiter = multi_worker_mirrored.records["worker1"]["built_outside_scope"]
    assert (waiter["error"], waiter["train_begun"], waiter["batches_begun"]) == (
        "ConfigurationError",
        True,
        0,
    )
    assert "tf.distribute.MultiWorkerMirroredStrategy" in waiter["message"]
    assert multi_worker_mirrored.nothing_reached_redis()


def test_a_parameter_server_cluster_runs_what_its_coordinator_schedules(
    parameter_server: Run,
) -> None:
    """The cluster works, and its worker runs only a ``tf.distribute.Server``:
    the functions the coordinator schedules (``ClusterCoordinator.schedule``)
    are what it runs."""
    record = parameter_server.records["chief0"]
    assert record["strategy"] == "ParameterServerStrategyV2"
    assert record["scheduled_runs"] == BATCHES


def test_fit_on_a_parameter_server_coordinator_raises_before_any_batch(
    parameter_server: Run,
) -> None:
    """A model built in the scope: ``ValueError`` before ``on_train_begin`` (the
    publisher given never ran); built outside and fit inside: after it, before
    the first batch."""
    record = parameter_server.records["chief0"]
    inside, outside = record["built_in_scope"], record["built_outside_scope"]
    assert (inside["error"], inside["train_begun"], inside["batches_begun"]) == (
        "ValueError",
        False,
        0,
    )
    assert (outside["error"], outside["train_begun"], outside["batches_begun"]) == (
        "ValueError",
        True,
        0,
    )
    for fit in (inside, outside):
        assert fit["message"] == PER_WORKER_DATASET
        assert fit["iterations"] == 0
    assert parameter_server.nothing_reached_redis()


def test_fit_on_a_parameter_server_coordinator_takes_no_per_worker_dataset(
    parameter_server: Run,
) -> None:
    """The dataset the error asks for (``create_per_worker_dataset``) is no input of Keras 3."""
    fit = parameter_server.records["chief0"]["per_worker_dataset"]
    assert (fit["error"], fit["train_begun"], fit["batches_begun"]) == ("ValueError", False, 0)
    assert fit["message"].startswith("Unrecognized data type: x=<")
    assert "PerWorkerDataset" in fit["message"]
