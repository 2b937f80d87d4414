"""Keras ``model.fit`` with stepbarrier callbacks: workers start on a ramp.

The chief's ``fit`` publishes ``model.optimizer.iterations`` after every batch
(``StepPublisherCallback``); each worker's ``fit`` waits, before its first
batch, until the chief's step reaches the worker's step (``StepWaiterCallback``).
The only stepbarrier line is ``callbacks_from_env(last_step=...)``. Each process
trains its own tiny regression model on synthetic data: the barrier is what
they share.

Environment variables (this script reads no command-line arguments):
    STEPBARRIER_JOB             required: the job's name, the same on every host.
    STEPBARRIER_REDIS_URL       Redis, e.g. redis://redis:6379/0 (default localhost).
    STEPBARRIER_ROLE            "chief" or "worker" (else taken from TF_CONFIG).
    STEPBARRIER_TASK_ID         this host's task id, the chief being 0 (or TF_CONFIG).
    STEPBARRIER_WAIT_UNTIL_STEP a worker's step to wait for, or
    STEPBARRIER_SCHEDULE        a ramp such as "log:20": int(20 * log(task_id + 1)).
    TF_CONFIG                   optional: the role and task id, as TensorFlow sets it.
    (every other STEPBARRIER_* variable works too: docs/configuration.md)
    TRAIN_STEPS                 training batches of each task (default 200).
    STEP_SLEEP                  extra seconds of sleep after each batch (default 0).
    WAIT_FOR_WAITERS            chief only: before training, wait up to 120 s until
                                this many workers are waiting (default 0).
    RECORD_FILE                 if set, write one JSON object about this task there
                                (the fields of tf1_parameter_server.py; step_times
                                hold [iterations, time.time()] after each batch).
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

from stepbarrier import BarrierAborted, BarrierConfig, read_status
from stepbarrier.keras_callbacks import StepWaiterCallback, callbacks_from_env

BATCH = 16


class TrainingRecord(keras.callbacks.Callback):  # type: ignore[misc]
    """Notes when this task trained, and slows each batch down by ``sleep`` seconds."""

    def __init__(self, record: dict[str, Any], sleep: float, is_chief: bool) -> None:
        super().__init__()
        self.record, self.sleep, self.is_chief = record, sleep, is_chief

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        now = time.time()
        step = int(self.model.optimizer.iterations.numpy())
        if self.record["first_step_at"] is None:
            self.record["first_step_at"], self.record["first_global_step"] = now, step
        self.record["steps_trained"] += 1
        if self.is_chief:
            self.record["step_times"].append([step, now])
        time.sleep(self.sleep)


def wait_for_waiters(config: BarrierConfig, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(read_status(config).waiters) < count:
        if time.monotonic() > deadline:
            print(f"chief: fewer than {count} workers are waiting; training anyway", flush=True)
            return
        time.sleep(0.05)


def main() -> int:
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("stepbarrier").setLevel(logging.INFO)
    config = BarrierConfig.from_env()
    train_steps = int(os.environ.get("TRAIN_STEPS", "200"))
    is_chief = config.role == "chief"
    record: dict[str, Any] = {
        "task_type": config.role,
        "task_index": config.task_id,
        "task_id": config.task_id,
        "wait_until_step": 0,
        "released_at_step": None,
        "released_at": None,
        "steps_trained": 0,
        "first_step_at": None,
        "first_global_step": None,
        "step_times": [],
    }
    # the publisher on the chief, the waiter on a worker; the chief's fit is the
    # whole job: reaching its last step finishes it, and a worker still waiting
    # for a later step is aborted instead of waiting on
    callbacks = callbacks_from_env(last_step=train_steps)
    waiter = next((c for c in callbacks if isinstance(c, StepWaiterCallback)), None)
    if waiter is not None:
        record["wait_until_step"] = waiter.wait_until_step

    rng = np.random.default_rng(config.task_id or 0)
    x = rng.normal(size=(train_steps * BATCH, 4)).astype("float32")
    y = x @ np.array([[1.0], [-2.0], [3.0], [0.5]], dtype="float32") + 0.7
    model = keras.Sequential([keras.Input(shape=(4,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    callbacks.append(TrainingRecord(record, float(os.environ.get("STEP_SLEEP", "0")), is_chief))
    if is_chief:
        wait_for_waiters(config, int(os.environ.get("WAIT_FOR_WAITERS", "0")))
    try:
        model.fit(x, y, batch_size=BATCH, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    except BarrierAborted as exc:
        print(f"{config.role} {config.task_id}: {exc}; nothing to train", flush=True)
    if waiter is not None:
        record["released_at_step"] = waiter.released_at_step
        record["released_at"] = waiter.released_at
    print(f"{config.role} {config.task_id}: trained {record['steps_trained']} batches", flush=True)
    path = os.environ.get("RECORD_FILE")
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
