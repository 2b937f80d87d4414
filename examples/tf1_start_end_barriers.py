"""A parameter-server job that starts and ends together: start and end barriers, no sleeps.

Each task is its own process, as in ``tf1_parameter_server.py``. The one
stepbarrier line is::

    hooks = hooks_from_env(start_barrier=True, end_barrier=True, barrier_timeout=600)

It replaces the usual sleeps: no task takes a step before the chief and every
worker are up (``StartBarrierHook``, in the first ``before_run``), and the
chief's session does not end before every worker has finished
(``EndBarrierHook``, in ``end()``); then the chief marks the job done. The
parties are the chief and the workers of ``TF_CONFIG``. The model is a tiny
linear regression on synthetic data.

Environment variables (this script reads no command-line arguments):
    TF_CONFIG                 required: the cluster ("ps", "chief", "worker"
                              addresses) and this task; the chief is task id 0,
                              worker i is task id i + 1.
    STEPBARRIER_JOB           required (chief and workers): the job's name.
    STEPBARRIER_REDIS_URL     Redis, e.g. redis://redis:6379/0 (default localhost).
    STEPBARRIER_RUN_ID        recommended: one id per run, so that a rerun under
                              the same job name has barriers of its own.
    TRAIN_STEPS               every task stops once the global step reaches it
                              (default 200).
    STEP_SLEEP                extra seconds of sleep after each training step
                              (default 0).
    HOLD_END_UNTIL_FILE       if set, the task waits (after training, before its
                              session ends) until this file exists: a worker
                              with more to do after training, made visible.
    RECORD_FILE               if set, the task writes one JSON object there when
                              it ends: task_type, task_index, task_id,
                              steps_trained, started_at (time.time() when the
                              start barrier released it), first_step_at,
                              ended_at (after its session ended: for the chief,
                              after the end barrier), job_done (chief: whether
                              the end barrier let it mark the job done).

A ps task serves until it is killed. Exit status: 0 when the task trained to
the end; 1 when a barrier gave up (BarrierTimeout names the missing tasks, or
BarrierAborted after a reset); 2 without TF_CONFIG.
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

from stepbarrier import BarrierAborted, BarrierConfig, BarrierTimeout
from stepbarrier.tf_hooks import EndBarrierHook, StartBarrierHook, hooks_from_env

BATCH = 32
FEATURES = 4


def build_model(cluster: tf.train.ClusterSpec, device: str) -> Any:
    """Variables (the global step too: the hooks read it) on the ps; returns train_op."""
    setter = tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)
    with tf.compat.v1.device(setter):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.get_variable("weights", [FEATURES, 1])
        x = tf.random.normal([BATCH, FEATURES])
        y = tf.matmul(x, [[1.0], [-2.0], [3.0], [0.5]])
        loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) - y))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.05)
        apply = optimizer.apply_gradients(optimizer.compute_gradients(loss))
        with tf.control_dependencies([apply]):
            train_op = tf.compat.v1.assign_add(global_step, 1)
    return train_op


def wait_for_chief(target: str, session_config: Any) -> None:
    """Poll until the chief has initialised the variables (cheaper than TF's 30 s)."""
    ready_op = tf.compat.v1.report_uninitialized_variables()
    with tf.compat.v1.Session(target, config=session_config) as session:
        while len(session.run(ready_op)) > 0:
            time.sleep(0.1)


def hold_until(path: str | None) -> None:
    while path and not os.path.exists(path):
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
    is_chief = config.role == "chief"
    device = f"/job:{task_type}/task:{task_index}"
    session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
    record: dict[str, Any] = {
        "task_type": task_type,
        "task_index": task_index,
        "task_id": config.task_id,
        "steps_trained": 0,
        "first_step_at": None,
    }
    failed: str | None = None
    with tf.Graph().as_default():
        train_op = build_model(cluster, device)
        hooks = hooks_from_env(start_barrier=True, end_barrier=True, barrier_timeout=600)
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
                step = 0
                while not session.should_stop() and step < train_steps:
                    step = int(session.run(train_op))
                    if record["first_step_at"] is None:
                        record["first_step_at"] = time.time()
                    record["steps_trained"] += 1
                    time.sleep(step_sleep)
                hold_until(os.environ.get("HOLD_END_UNTIL_FILE"))
        except (BarrierAborted, BarrierTimeout) as exc:
            failed = f"{type(exc).__name__}: {exc}"
        record["ended_at"] = time.time()
        start = next(hook for hook in hooks if isinstance(hook, StartBarrierHook))
        end = next(hook for hook in hooks if isinstance(hook, EndBarrierHook))
        record["started_at"] = start.released_at
        record["job_done"] = is_chief and end.complete
    print(f"{task_type} {task_index}: trained {record['steps_trained']} steps", flush=True)
    path = os.environ.get("RECORD_FILE")
    if path:
        with open(path + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(record, handle)
        os.replace(path + ".tmp", path)
    if failed is not None:
        print(f"{task_type} {task_index}: {failed}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
