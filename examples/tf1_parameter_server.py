"""A between-graph parameter-server job (TF1-style graph mode) with stepbarrier hooks.

What ``make demo`` (``examples/demo``) runs in each of its processes; the
compose file, the Kubernetes manifests and tests/tf/ run it too.

Each task is its own process: one or more ps tasks serve the variables, the
chief trains and publishes its global step (``GlobalStepPublisherHook``), and
every worker starts training once the global step reaches its
``wait_until_step`` (``GlobalStepWaiterHook``, a drop-in for TensorFlow's hook).
The only stepbarrier line is ``hooks = hooks_from_env(last_step=...)``. The model
is a tiny linear regression on synthetic data.

Environment variables (this script reads no command-line arguments):
    TF_CONFIG                   required: the cluster ("ps", "chief", "worker"
                                addresses) and this task, e.g.
                                {"cluster": {"ps": ["localhost:2222"],
                                             "chief": ["localhost:2223"],
                                             "worker": ["localhost:2224"]},
                                 "task": {"type": "worker", "index": 0}}
                                The chief (or a TF1 "master") is task id 0,
                                worker i is task id i + 1; without a chief job
                                worker 0 is the chief, as in TensorFlow.
    STEPBARRIER_JOB             required (chief and workers): the job's name.
    STEPBARRIER_REDIS_URL       Redis, e.g. redis://redis:6379/0 (default localhost).
    STEPBARRIER_WAIT_UNTIL_STEP a worker's step to wait for, or
    STEPBARRIER_SCHEDULE        a ramp such as "log:20": int(20 * log(task_id + 1)).
    STEPBARRIER_ROLE, STEPBARRIER_TASK_ID
                                override the barrier role and task id that
                                TF_CONFIG gives; the barrier's chief is also
                                the session's chief (every other STEPBARRIER_*
                                variable works too: docs/configuration.md).
    TRAIN_STEPS                 every task stops once the global step reaches it
                                (default 200); the chief's session ending there
                                finishes the job (workers still waiting abort).
    STEP_SLEEP                  extra seconds of sleep after each training step of
                                every training task (default 0): slows the job down
                                so that the ramp is visible.
    WAIT_FOR_WAITERS            chief only: once its session is up, wait (up to
                                120 s) until this many workers wait before
                                training (default 0): makes demos and tests
                                deterministic.
    RECORD_FILE                 if set, the task writes one JSON object there when
                                it ends (and, for the demo's live view, a worker
                                right after its release and the chief every
                                RECORD_EVERY seconds while it trains): task_type,
                                task_index, task_id,
                                wait_until_step, released_at_step (the chief's step
                                the worker saw when released, null if it did not
                                wait), released_at (time.time(), null),
                                steps_trained, first_step_at (time.time() after its
                                first training run), first_global_step (the global
                                step right after that run, read from the ps),
                                step_times (chief only: [global_step, time.time()]
                                after each run).

A ps task serves until it is killed. The chief prints "chief ready at global
step N" once its session exists; starting the workers after that spares them
TensorFlow's 30 s re-check (they also tolerate an earlier start: they poll the
ps every 0.1 s until the chief has initialised the variables).

Exit status: 0 when the task trained to the end; 1 when a worker's wait ended
without its step (BarrierAborted: the chief finished below it; BarrierTimeout),
so that Kubernetes does not count that worker as done; 2 without TF_CONFIG.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from stepbarrier import BarrierAborted, BarrierConfig, BarrierTimeout, read_status
from stepbarrier.tf_hooks import GlobalStepWaiterHook, hooks_from_env

BATCH = 32
FEATURES = 4
RECORD_EVERY = 0.5
"""Seconds between the chief's interim records (its step times so far)."""


def build_model(cluster: tf.train.ClusterSpec, device: str) -> tuple[Any, Any]:
    """Variables on the ps, ops on this task: returns (global_step, train_op)."""
    setter = tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)
    with tf.compat.v1.device(setter):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.get_variable("weights", [FEATURES, 1])
        bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.zeros_initializer())
        x = tf.random.normal([BATCH, FEATURES])
        y = tf.matmul(x, [[1.0], [-2.0], [3.0], [0.5]]) + 0.7
        loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) + bias - y))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.05)
        apply = optimizer.apply_gradients(optimizer.compute_gradients(loss))
        with tf.control_dependencies([apply]):
            # The value of the increment is the global step right after this run.
            train_op = tf.compat.v1.assign_add(global_step, 1)
    return global_step, train_op


def wait_for_chief(target: str, session_config: Any) -> None:
    """Poll until the chief has initialised the variables (cheaper than TF's 30 s)."""
    ready_op = tf.compat.v1.report_uninitialized_variables()
    with tf.compat.v1.Session(target, config=session_config) as session:
        while len(session.run(ready_op)) > 0:
            time.sleep(0.1)


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
    tf_config = json.loads(os.environ.get("TF_CONFIG") or "{}")
    if "cluster" not in tf_config or "task" not in tf_config:
        print("set TF_CONFIG to the cluster and this task (see the docstring)", file=sys.stderr)
        return 2
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    task_type = tf_config["task"]["type"]
    task_index = int(tf_config["task"].get("index", 0))
    tf.compat.v1.disable_eager_execution()
    server = tf.distribute.Server(cluster, job_name=task_type, task_index=task_index)
    if task_type == "ps":
        print(f"ps {task_index} serving on {server.target}", flush=True)
        server.join()  # never returns: the ps is ended by a signal
        return 0

    train_steps = int(os.environ.get("TRAIN_STEPS", "200"))
    step_sleep = float(os.environ.get("STEP_SLEEP", "0"))
    config = BarrierConfig.from_env()
    # TensorFlow's rule: chief, master, or worker 0 of a cluster without a chief job
    is_chief = config.role == "chief"
    device = f"/job:{task_type}/task:{task_index}"
    session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
    record: dict[str, Any] = {
        "task_type": task_type,
        "task_index": task_index,
        "task_id": config.task_id,
        "wait_until_step": 0,
        "released_at_step": None,
        "released_at": None,
        "steps_trained": 0,
        "first_step_at": None,
        "first_global_step": None,
        "step_times": [],
    }
    gave_up: str | None = None  # why a worker's wait ended without its step
    with tf.Graph().as_default():
        global_step, train_op = build_model(cluster, device)
        # the publisher on the chief, the waiter on a worker; the chief's session
        # ends at train_steps, which finishes the job: a worker still waiting for
        # a later step is aborted instead of waiting on
        hooks = hooks_from_env(last_step=train_steps)
        waiter = next((h for h in hooks if isinstance(h, GlobalStepWaiterHook)), None)
        if waiter is not None:
            record["wait_until_step"] = waiter.wait_until_step
        if not is_chief:
            wait_for_chief(server.target, session_config)
        try:
            with tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target,
                is_chief=is_chief,
                hooks=hooks,
                config=session_config,
                checkpoint_dir=None,
                save_checkpoint_secs=None,
                save_checkpoint_steps=None,
                save_summaries_steps=None,
                save_summaries_secs=None,
                log_step_count_steps=None,
            ) as session:
                if is_chief:
                    print(f"chief ready at global step {session.run(global_step)}", flush=True)
                    wait_for_waiters(config, int(os.environ.get("WAIT_FOR_WAITERS", "0")))
                step = 0
                recorded = 0.0
                while not session.should_stop() and step < train_steps:
                    step = int(session.run(train_op))
                    now = time.time()
                    first = record["first_step_at"] is None
                    if first:
                        record["first_step_at"], record["first_global_step"] = now, step
                    record["steps_trained"] += 1
                    if is_chief:
                        record["step_times"].append([step, now])
                    if waiter is not None and first:  # released: tell the demo at once
                        record["released_at_step"] = waiter.released_at_step
                        record["released_at"] = waiter.released_at
                        write_record(record)
                    elif is_chief and now - recorded >= RECORD_EVERY:
                        write_record(record)
                        recorded = now
                    time.sleep(step_sleep)
        except (BarrierAborted, BarrierTimeout) as exc:
            gave_up = f"{type(exc).__name__}: {exc}"
        if waiter is not None:
            record["released_at_step"] = waiter.released_at_step
            record["released_at"] = waiter.released_at
    print(f"{task_type} {task_index}: trained {record['steps_trained']} steps", flush=True)
    write_record(record)
    if gave_up is not None:
        print(f"{task_type} {task_index}: gave up waiting: {gave_up}", file=sys.stderr, flush=True)
        return 1
    return 0


def write_record(record: dict[str, Any]) -> None:
    path = os.environ.get("RECORD_FILE")
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
