"""One task of a real between-graph parameter-server job, as a TF user migrating has it.

Run as its own process (``tests/tf/test_drop_in.py``). Environment:

    TF_CONFIG         the cluster and this task (ps, chief or worker).
    CHIEF_HOOKS       chief: ``none`` (the chief left as a TensorFlow user had it)
                      or ``publisher`` (``GlobalStepPublisherHook``).
    CHIEF_LOOP        chief: ``normal``; ``dies`` (the loop raises at DIE_AT, the
                      error is caught and the process stays alive for STAY_ALIVE
                      seconds, as in a notebook); ``sessions`` (two sessions, the
                      first ends at GAP_AT, then GAP seconds without a session).
    WORKER_HOOK       worker: ``stepbarrier`` or ``tensorflow`` (TensorFlow's own hook).
    WAIT_UNTIL_STEP   worker: the step to wait for.
    TRAIN_STEPS       every task stops at this global step.
    STEP_SLEEP        seconds of sleep after each run of the chief.
    WORKER_SLEEP      seconds of sleep after each run of a worker.
    WAIT_READY        chief: comma-separated files the workers create just before
                      their hook's wait begins; the first session trains once
                      they exist.
    RECORD_FILE       where the task writes its record (JSON) when it ends:
                      released_at_step, released_by, wait_until_step,
                      first_global_step, steps_trained, error, and for the chief
                      step_times ([global_step, time.time()] per run).
    STEPBARRIER_*     as on any host (none at all: an unconfigured worker).

A worker whose wait ends with an error records it and exits with 1.
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

from stepbarrier.tf_hooks import GlobalStepPublisherHook, GlobalStepWaiterHook


class Ready(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Creates a file in the first ``before_run``, just before the waiter hook's wait
    begins: the chief trains once every worker waits, so none can come late."""

    def __init__(self, path: str) -> None:
        self.path = path

    def before_run(self, run_context: Any) -> None:
        if not os.path.exists(self.path):
            with open(self.path, "w", encoding="utf-8"):
                pass


class LoopDied(Exception):
    """The chief's training code fails (not a preemption: TensorFlow skips end())."""


def build(cluster: tf.train.ClusterSpec, device: str) -> tuple[Any, Any]:
    setter = tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)
    with tf.compat.v1.device(setter):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.assign_add(global_step, 1)
    return global_step, train_op


def wait_for_chief(target: str, config: Any) -> None:
    ready = tf.compat.v1.report_uninitialized_variables()
    with tf.compat.v1.Session(target, config=config) as session:
        while len(session.run(ready)) > 0:
            time.sleep(0.1)


def main() -> int:
    logging.basicConfig(format="%(asctime)s %(name)s %(levelname)s %(message)s")
    logging.getLogger("stepbarrier").setLevel(logging.INFO)
    tf.compat.v1.disable_eager_execution()
    spec = json.loads(os.environ["TF_CONFIG"])
    cluster = tf.train.ClusterSpec(spec["cluster"])
    kind, index = spec["task"]["type"], int(spec["task"]["index"])
    server = tf.distribute.Server(cluster, job_name=kind, task_index=index)
    if kind == "ps":
        server.join()
        return 0
    device = f"/job:{kind}/task:{index}"
    session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
    train_steps = int(os.environ.get("TRAIN_STEPS", "100"))
    record: dict[str, Any] = {
        "wait_until_step": None,
        "released_at_step": None,
        "released_by": None,
        "first_global_step": None,
        "steps_trained": 0,
        "step_times": [],
        "error": None,
    }
    is_chief = kind == "chief"
    hooks: list[Any] = []
    waiter: Any = None
    with tf.Graph().as_default():
        global_step, train_op = build(cluster, device)
        if is_chief and os.environ.get("CHIEF_HOOKS") == "publisher":
            hooks.append(GlobalStepPublisherHook())
        if not is_chief:
            step = int(os.environ["WAIT_UNTIL_STEP"])
            record["wait_until_step"] = step
            if os.environ.get("WORKER_HOOK") == "tensorflow":
                waiter = tf.compat.v1.train.GlobalStepWaiterHook(step)
            else:
                waiter = GlobalStepWaiterHook(step)
            hooks[:0] = [Ready(os.environ["RECORD_FILE"] + ".ready")]  # before the wait
            hooks.append(waiter)
            wait_for_chief(server.target, session_config)
        try:
            if is_chief:
                run_chief(server.target, session_config, hooks, global_step, train_op, record)
            else:
                sleep = float(os.environ.get("WORKER_SLEEP", "0.05"))
                train(server.target, session_config, hooks, train_op, train_steps, sleep, record)
        except Exception as exc:  # recorded: the test reads it
            record["error"] = f"{type(exc).__name__}: {exc}"
        if waiter is not None:
            record["released_at_step"] = getattr(waiter, "released_at_step", None)
            record["released_by"] = getattr(waiter, "released_by", None)
    write(record)
    return 1 if record["error"] and not is_chief else 0


def session_for(target: str, config: Any, hooks: list[Any], is_chief: bool) -> Any:
    return tf.compat.v1.train.MonitoredTrainingSession(
        master=target,
        is_chief=is_chief,
        hooks=hooks,
        config=config,
        checkpoint_dir=None,
        save_checkpoint_secs=None,
        save_checkpoint_steps=None,
        save_summaries_steps=None,
        save_summaries_secs=None,
        log_step_count_steps=None,
    )


def train(
    target: str,
    config: Any,
    hooks: list[Any],
    train_op: Any,
    until: int,
    sleep: float,
    record: dict[str, Any],
    *,
    is_chief: bool = False,
    die_at: int | None = None,
) -> None:
    with session_for(target, config, hooks, is_chief) as session:
        if is_chief and not record["step_times"]:
            wait_ready()
        step = 0
        while not session.should_stop() and step < until:
            step = int(session.run(train_op))
            if record["first_global_step"] is None:
                record["first_global_step"] = step
            record["steps_trained"] += 1
            if is_chief:
                record["step_times"].append([step, time.time()])
            if die_at is not None and step >= die_at:
                raise LoopDied(f"the chief's training code failed at step {step}")
            time.sleep(sleep)


def wait_ready() -> None:
    """Return once every file of WAIT_READY exists (and a second more), or after 120 s."""
    paths = [p for p in os.environ.get("WAIT_READY", "").split(",") if p]
    deadline = time.monotonic() + 120
    while not all(os.path.exists(p) for p in paths) and time.monotonic() < deadline:
        time.sleep(0.05)
    time.sleep(0.5)  # the workers' waiter hooks begin to wait


def run_chief(
    target: str, config: Any, hooks: list[Any], global_step: Any, train_op: Any, record: Any
) -> None:
    train_steps = int(os.environ.get("TRAIN_STEPS", "100"))
    sleep = float(os.environ.get("STEP_SLEEP", "0.05"))
    loop = os.environ.get("CHIEF_LOOP", "normal")
    if loop == "dies":
        try:
            die_at = int(os.environ["DIE_AT"])
            train(target, config, hooks, train_op, train_steps, sleep, record, is_chief=True,
                  die_at=die_at)  # fmt: skip
        except LoopDied as exc:
            record["error"] = str(exc)
            print(f"chief: {exc}; the process stays alive", flush=True)
            time.sleep(float(os.environ.get("STAY_ALIVE", "30")))
        return
    if loop == "sessions":
        gap_at = int(os.environ["GAP_AT"])
        train(target, config, hooks, train_op, gap_at, sleep, record, is_chief=True)
        print(f"chief: first session ended; {os.environ['GAP']} s without one", flush=True)
        time.sleep(float(os.environ["GAP"]))
    train(target, config, hooks, train_op, train_steps, sleep, record, is_chief=True)
    print("chief: done", flush=True)
    time.sleep(float(os.environ.get("STAY_ALIVE", "0")))


def write(record: dict[str, Any]) -> None:
    path = os.environ["RECORD_FILE"]
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
