"""One process of a ``model.fit`` under a ``tf.distribute`` strategy, for the
record of what Keras 3 does there (tests/tf/test_keras_strategies_keras3.py).

    STRATEGY=multi-worker-mirrored python tests/tf/keras_strategy_task.py

Configured by its environment: ``STRATEGY`` (below), ``TF_CONFIG`` (the cluster and this task, for a
cluster strategy), ``STEPBARRIER_JOB`` and ``STEPBARRIER_REDIS_URL`` (the
stepbarrier callbacks given to ``fit``), ``RECORD_FILE`` (where the record goes,
as JSON). ``STRATEGY`` is one of:

- ``multi-worker-mirrored``: a worker of a ``MultiWorkerMirroredStrategy``
  cluster (its ``worker`` tasks). It first takes an all-reduce across the
  workers (the cluster works), then ``fit``: a model built in
  ``strategy.scope()`` (worker 0 with ``StepPublisherCallback``, the others
  with ``StepWaiterCallback``), then a model built outside the scope and fit
  inside it (the others with ``StepWaiterCallback``).
- ``parameter-server``: the coordinator (the ``chief`` task) of a
  ``ParameterServerStrategy`` cluster: ``fit`` of a model built in the scope
  (with ``StepPublisherCallback``), of one built outside and fit inside, and of
  a dataset from ``ClusterCoordinator.create_per_worker_dataset``; then
  functions scheduled on the worker (the cluster works). Its ``worker`` and
  ``ps`` tasks run only a ``tf.distribute.Server``, until they are killed, as
  the strategy has them do.
- ``one-process-multi-worker-mirrored``: a ``MultiWorkerMirroredStrategy``
  without a cluster (no ``TF_CONFIG``): ``fit``, then ``fit`` with
  ``StepWaiterCallback``.

Each ``fit`` is recorded by name: ``outcome`` (``trained`` or ``raised``),
``error`` (the exception's class name), ``message``, ``train_begun`` (whether
any callback's ``on_train_begin`` ran), ``batches_begun`` and ``iterations``
(the optimizer's step after it). The process exits 0 whatever ``fit`` did.
"""

from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np
import tensorflow as tf

from stepbarrier import BarrierConfig
from stepbarrier.keras_callbacks import StepPublisherCallback, StepWaiterCallback

BATCHES = 3
WAIT_FOR = 2
"""The chief's step a worker's ``StepWaiterCallback`` waits for."""


class Recorder(keras.callbacks.Callback):  # type: ignore[misc]
    """Records whether ``fit`` began training and how many batches began."""

    def __init__(self) -> None:
        super().__init__()
        self.train_begun = False
        self.batches_begun = 0

    def on_train_begin(self, logs: Any = None) -> None:
        self.train_begun = True

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.batches_begun += 1


def new_model() -> keras.Model:
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    return model


def fit(
    strategy: tf.distribute.Strategy,
    *callbacks: keras.callbacks.Callback,
    build_in_scope: bool = True,
    data: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """``model.fit`` of a new model; what happened, as a record."""
    recorder = Recorder()  # first: it sees on_train_begin before any other callback
    outside: Callable[[], AbstractContextManager[Any]] = nullcontext
    build_scope, fit_scope = (
        (strategy.scope, outside) if build_in_scope else (outside, strategy.scope)
    )
    record: dict[str, Any] = {"error": None, "message": None, "iterations": None}
    with build_scope():
        model = new_model()
    x = np.zeros((BATCHES * 4, 2), dtype="float32")
    try:
        with fit_scope():
            every = {"epochs": 1, "verbose": 0, "callbacks": [recorder, *callbacks]}
            if data is None:
                model.fit(x, x[:, :1], batch_size=4, **every)
            else:
                model.fit(data(), steps_per_epoch=BATCHES, **every)
        record["outcome"] = "trained"
    except Exception as exc:  # the record is the point: any error is one
        record.update(outcome="raised", error=type(exc).__name__, message=str(exc)[:500])
    record.update(train_begun=recorder.train_begun, batches_begun=recorder.batches_begun)
    try:
        record["iterations"] = int(keras.ops.convert_to_numpy(model.optimizer.iterations))
    except Exception as exc:  # an optimizer never built under the strategy
        record["iterations"] = f"unreadable: {type(exc).__name__}"
    return record


def barrier_config(task_id: int) -> BarrierConfig:
    return BarrierConfig(
        job=os.environ["STEPBARRIER_JOB"],
        redis_url=os.environ["STEPBARRIER_REDIS_URL"],
        task_id=task_id,
        heartbeat=0.2,
        timeout=30.0,
        stall_timeout=30.0,
    )


def multi_worker_mirrored(index: int) -> dict[str, Any]:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    record: dict[str, Any] = {"strategy": type(strategy).__name__}
    ones = strategy.run(lambda: tf.constant(1.0))
    record["all_reduce_sum"] = float(strategy.reduce(tf.distribute.ReduceOp.SUM, ones, None))
    config = barrier_config(index)
    step_callback = (
        StepPublisherCallback(config) if index == 0 else StepWaiterCallback(WAIT_FOR, config)
    )
    record["built_in_scope"] = fit(strategy, step_callback)
    waiter = [] if index == 0 else [StepWaiterCallback(WAIT_FOR, config)]
    record["built_outside_scope"] = fit(strategy, *waiter, build_in_scope=False)
    return record


def wait_for_servers(cluster: dict[str, list[str]], timeout: float = 120.0) -> None:
    """Until every worker and ps task of ``cluster`` accepts connections."""
    deadline = time.monotonic() + timeout
    for address in [*cluster.get("worker", []), *cluster.get("ps", [])]:
        host, port = address.rsplit(":", 1)
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no server at {address}") from None
                time.sleep(0.1)


def parameter_server() -> dict[str, Any]:
    wait_for_servers(json.loads(os.environ["TF_CONFIG"])["cluster"])
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    record: dict[str, Any] = {"strategy": type(strategy).__name__}
    record["built_in_scope"] = fit(strategy, StepPublisherCallback(barrier_config(0)))
    record["built_outside_scope"] = fit(strategy, build_in_scope=False)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)

    def batches() -> tf.data.Dataset:
        x = np.zeros((BATCHES * 4, 2), dtype="float32")
        return tf.data.Dataset.from_tensor_slices((x, x[:, :1])).repeat().batch(4)

    record["per_worker_dataset"] = fit(
        strategy, data=lambda: coordinator.create_per_worker_dataset(batches)
    )
    with strategy.scope():
        counter = tf.Variable(0.0)

    @tf.function
    def count() -> None:
        counter.assign_add(1.0)

    for _ in range(BATCHES):
        coordinator.schedule(count)
    coordinator.join()
    record["scheduled_runs"] = float(counter.numpy())
    return record


def serve() -> None:
    """A worker or ps task of ``ParameterServerStrategy``: its server, nothing else."""
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol="grpc",
        start=True,
    )
    server.join()


def one_process_multi_worker_mirrored() -> dict[str, Any]:
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    record: dict[str, Any] = {"strategy": type(strategy).__name__}
    record["num_replicas_in_sync"] = strategy.num_replicas_in_sync
    record["plain"] = fit(strategy)
    record["with_waiter"] = fit(strategy, StepWaiterCallback(WAIT_FOR, barrier_config(1)))
    return record


def main() -> None:
    kind = os.environ["STRATEGY"]
    task = json.loads(os.environ.get("TF_CONFIG", "{}")).get("task", {})
    if kind == "parameter-server" and task.get("type") in ("worker", "ps"):
        serve()
        return
    if kind == "multi-worker-mirrored":
        record = multi_worker_mirrored(int(task["index"]))
    elif kind == "parameter-server":
        record = parameter_server()
    elif kind == "one-process-multi-worker-mirrored":
        record = one_process_multi_worker_mirrored()
    else:
        raise SystemExit(f"unknown strategy {kind!r}")
    with open(os.environ["RECORD_FILE"], "w") as file:
        json.dump(record, file)


if __name__ == "__main__":
    main()
