"""stepbarrier in a framework-free training loop (the pattern for PyTorch, JAX, ...).

The chief publishes its step after every training step; each worker waits for
its step, then trains. Every task with a task id reports its own step through a
``ProgressReporter`` (no I/O on the training thread), so ``stepbarrier status``
shows how far each is behind the chief and names the stragglers and the stuck
(docs/who-is-slow.md). Start the chief first or last, in any order: a worker
that starts late is released within a heartbeat if the chief is already past
its step, and within 3 s (the protocol's grace) if the job has finished.

Environment variables (this script reads no command-line arguments):
    STEPBARRIER_JOB             required: the job's name, the same on every host.
    STEPBARRIER_REDIS_URL       Redis, e.g. redis://redis:6379/0 (default localhost).
    STEPBARRIER_ROLE            "chief" or "worker" (else taken from TF_CONFIG, or
                                under torchrun or srun from the rank: 0 is the chief).
    STEPBARRIER_TASK_ID         this host's task id, the chief being 0 (else
                                TF_CONFIG's, torchrun's RANK or SLURM_PROCID).
    STEPBARRIER_WAIT_UNTIL_STEP a worker's step to wait for, or
    STEPBARRIER_SCHEDULE        a ramp such as "log:20": int(20 * log(task_id + 1)).
    (every other STEPBARRIER_* variable works too: docs/configuration.md)
    TRAIN_STEPS                 training steps of each task (default 200).
    STEP_SLEEP                  extra seconds of sleep after each step (default 0).
    WAIT_FOR_WAITERS            chief only: before training, wait up to 120 s until
                                this many workers are waiting (default 0).
    SLOW_TASK, SLOW_STEP_SLEEP  the task whose id is SLOW_TASK sleeps SLOW_STEP_SLEEP
                                more seconds after each step (default: none): the
                                slow rank that `stepbarrier status` names.
    RECORD_FILE                 if set, write one JSON object about this task there.

Run a chief and two workers on one machine (Redis on localhost):
    STEPBARRIER_JOB=demo STEPBARRIER_ROLE=chief STEP_SLEEP=0.05 python plain_loop.py &
    STEPBARRIER_JOB=demo STEPBARRIER_ROLE=worker STEPBARRIER_TASK_ID=1 \\
        STEPBARRIER_SCHEDULE=log:40 python plain_loop.py &
    STEPBARRIER_JOB=demo STEPBARRIER_ROLE=worker STEPBARRIER_TASK_ID=2 \\
        STEPBARRIER_SCHEDULE=log:40 python plain_loop.py
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import sys
import time
from typing import Any

from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    ProgressReporter,
    StepPublisher,
    StepWaiter,
    read_status,
)


def train_step(weight: float) -> float:
    """One step of SGD on y = 3x: the stand-in for your framework's step."""
    x = random.uniform(-1.0, 1.0)
    gradient = 2 * (weight * x - 3.0 * x) * x
    return weight - 0.1 * gradient


def wait_for_waiters(config: BarrierConfig, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while len(read_status(config).waiters) < count:
        if time.monotonic() > deadline:
            print(f"chief: fewer than {count} workers are waiting; training anyway")
            return
        time.sleep(0.05)


def step_sleep_of(config: BarrierConfig) -> float:
    """STEP_SLEEP, plus SLOW_STEP_SLEEP on the task SLOW_TASK names."""
    sleep = float(os.environ.get("STEP_SLEEP", "0"))
    slow = os.environ.get("SLOW_TASK")
    if slow and config.task_id == int(slow):
        sleep += float(os.environ.get("SLOW_STEP_SLEEP", "0"))
    return sleep


def main() -> int:
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("stepbarrier").setLevel(logging.INFO)
    config = BarrierConfig.from_env()
    train_steps = int(os.environ.get("TRAIN_STEPS", "200"))
    step_sleep = step_sleep_of(config)
    progress: ProgressReporter | None = None
    record: dict[str, Any] = {
        "task_type": config.role,
        "task_index": config.task_id,
        "task_id": config.task_id,
        "wait_until_step": 0,
        "released_at_step": None,
        "released_at": None,
        "steps_trained": 0,
        "first_step_at": None,
        "step_times": [],
    }
    weight = 0.0
    reporting = contextlib.ExitStack()
    if config.role == "chief" or config.task_id is not None:  # the chief is task 0
        progress = reporting.enter_context(ProgressReporter(config))
    if config.role == "chief":
        with reporting, StepPublisher(config) as publisher:
            publisher.publish(0)
            wait_for_waiters(config, int(os.environ.get("WAIT_FOR_WAITERS", "0")))
            for step in range(1, train_steps + 1):
                weight = train_step(weight)
                publisher.publish(step)  # a few microseconds: no I/O here
                if progress is not None:
                    progress.report(step)  # well under a microsecond
                now = time.time()
                record["first_step_at"] = record["first_step_at"] or now
                record["step_times"].append([step, now])
                record["steps_trained"] = step
                time.sleep(step_sleep)
        # leaving the block marks the job finished; late workers are not left waiting
    elif config.role == "worker":
        target = config.resolved_wait_until_step()
        record["wait_until_step"] = target
        try:
            with StepWaiter(config) as waiter:
                record["released_at_step"] = waiter.wait(target)
                record["released_at"] = time.time()
        except BarrierAborted as exc:
            print(f"worker: {exc}; nothing to train")
            train_steps = 0
        with reporting:
            for _ in range(train_steps):
                weight = train_step(weight)
                record["first_step_at"] = record["first_step_at"] or time.time()
                record["steps_trained"] += 1
                if progress is not None:
                    progress.report(record["steps_trained"])  # its own step
                time.sleep(step_sleep)
    else:
        print("neither chief nor worker: set STEPBARRIER_ROLE or TF_CONFIG", file=sys.stderr)
        return 2
    trained = record["steps_trained"]
    print(f"{config.role} {config.task_id}: trained {trained} steps, w={weight:.3f}")
    write_record(record)
    return 0


def write_record(record: dict[str, Any]) -> None:
    path = os.environ.get("RECORD_FILE")
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
