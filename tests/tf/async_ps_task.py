"""One task of an asynchronous parameter-server job whose chief stops first.

    python tests/tf/async_ps_task.py

Each task is its own process, configured by its environment: ``TF_CONFIG``
(the cluster and this task), ``STEPBARRIER_JOB``, ``STEPBARRIER_REDIS_URL``,
``STEPBARRIER_WAIT_UNTIL_STEP`` (workers), ``RECORD_FILE``, and:

- ps: serves the variables until it is killed.
- chief: ``hooks_from_env()`` (a ``GlobalStepPublisherHook`` without
  ``last_step``); once ``WAITERS`` workers wait, trains until the global step
  reaches ``STOP_AT``, then its session ends and it records ``final_step``.
- worker: ``hooks_from_env()`` (a ``GlobalStepWaiterHook`` that reports the
  step it trains at); trains until the global step reaches ``STOP_AT`` (at
  least one run). ``PAUSE_AT`` and ``PAUSE_UNTIL_FILE``: once the step reached
  ``PAUSE_AT``, it stops training until that file exists. ``UNTIL_NOBODY_WAITS``:
  it also trains on while any worker still waits (at most ``MAX_RUNS`` runs).

Every training task records ``released_at_step``, ``error`` (the name of the
exception that ended its wait), ``first_global_step`` (right after its first
run), ``resumed_at_step`` (the step when a pause ended) and ``final_step``.
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

from stepbarrier import BarrierConfig, StepBarrierError, read_status
from stepbarrier.tf_hooks import GlobalStepWaiterHook, hooks_from_env

MAX_RUNS = 5000


def build_model(cluster: tf.train.ClusterSpec, device: str) -> tuple[Any, Any]:
    setter = tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)
    with tf.compat.v1.device(setter):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weight = tf.compat.v1.get_variable("weight", [1])
        loss = tf.reduce_mean(tf.square(weight * tf.random.normal([8]) - 1.0))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.01)
        with tf.control_dependencies([optimizer.minimize(loss)]):
            train_op = tf.compat.v1.assign_add(global_step, 1)  # the step after this run
    return global_step, train_op


def wait_until(condition: Any, what: str, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError(what)
        time.sleep(0.05)


def wait_for_chief(target: str, session_config: Any) -> None:
    """Poll until the chief has initialised the variables (TensorFlow re-checks every 30 s)."""
    ready = tf.compat.v1.report_uninitialized_variables()
    with tf.compat.v1.Session(target, config=session_config) as session:
        wait_until(lambda: len(session.run(ready)) == 0, "the chief's variables")


def train(task_type: str, server: Any, cluster: tf.train.ClusterSpec, index: int) -> dict[str, Any]:
    config = BarrierConfig.from_env()
    env = os.environ
    stop_at = int(env.get("STOP_AT", "0"))
    pause_at, pause_file = int(env.get("PAUSE_AT", "-1")), env.get("PAUSE_UNTIL_FILE")
    until_nobody_waits = env.get("UNTIL_NOBODY_WAITS") == "1"
    device = f"/job:{task_type}/task:{index}"
    session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
    record: dict[str, Any] = {"released_at_step": None, "error": None, "runs": 0}
    record.update(first_global_step=None, resumed_at_step=None, final_step=None)
    is_chief = task_type == "chief"
    with tf.Graph().as_default():
        global_step, train_op = build_model(cluster, device)
        hooks = hooks_from_env()
        waiter = next((h for h in hooks if isinstance(h, GlobalStepWaiterHook)), None)
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
                    waiters = int(env.get("WAITERS", "0"))
                    wait_until(lambda: len(read_status(config).waiters) >= waiters, "the workers")
                while not session.should_stop() and record["runs"] < MAX_RUNS:
                    step = int(session.run(train_op))
                    record["runs"] += 1
                    if record["first_global_step"] is None:
                        record["first_global_step"] = step
                    if pause_file and record["resumed_at_step"] is None and step >= pause_at:
                        wait_until(lambda: os.path.exists(pause_file), pause_file)
                        record["resumed_at_step"] = int(session.run(global_step))
                    if step >= stop_at and not (until_nobody_waits and read_status(config).waiters):
                        break
                record["final_step"] = int(session.run(global_step))
        except StepBarrierError as exc:
            record["error"] = type(exc).__name__
            print(f"{task_type} {index}: {exc}", flush=True)
    if waiter is not None:
        record["released_at_step"] = waiter.released_at_step
    return record


def main() -> int:
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("stepbarrier").setLevel(logging.INFO)
    tf_config = json.loads(os.environ["TF_CONFIG"])
    cluster = tf.train.ClusterSpec(tf_config["cluster"])
    task_type, index = tf_config["task"]["type"], int(tf_config["task"]["index"])
    tf.compat.v1.disable_eager_execution()
    server = tf.distribute.Server(cluster, job_name=task_type, task_index=index)
    if task_type == "ps":
        server.join()  # never returns: the test kills the ps
    record = train(task_type, server, cluster, index)
    print(f"{task_type} {index}: {record}", flush=True)
    path = os.environ["RECORD_FILE"]
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
