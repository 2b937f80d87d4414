"""One task of a real parameter-server job whose Redis or chief misbehaves (issue 33).

Run as its own process (``tests/tf/test_tensorflow_edges.py``); it reuses the
job of ``migration_task.py`` (the graph, the sessions, the ready files) and adds
what those cases need: a chief that hangs or loses Redis, or whose training
loop dies, and workers whose waits are recorded read by read. Environment:

    TF_CONFIG         the cluster and this task (ps, chief or worker).
    RECORD_FILE       where the task writes its record (JSON).
    STEPBARRIER_*     as on any host.

    chief:
    CHIEF_LOOP        ``hang``: at step PAUSE_AT the chief stops Redis itself
                      (SIGSTOP to REDIS_PID: it accepts connections and never
                      answers), trains on until the file REDIS_KILLED exists (the
                      test killed Redis), then until its publisher found Redis
                      lost; then a second session moves the step to LAST_STEP at
                      once. ``dies``: the loop raises at DIE_AT, the error is
                      caught, the record written, and the process stays alive
                      STAY_ALIVE seconds (a notebook, a caught exception).
    LAST_STEP         the publisher hook's ``last_step`` (``hang``).
    STEP_SLEEP        seconds of sleep after each run.
    WAIT_READY        as in ``migration_task.py``.

    worker (it only reads the global step: it never moves it):
    WORKER_HOOK       ``stepbarrier`` (default) or ``tensorflow``.
    WAIT_UNTIL_STEP   the step to wait for.
    SESSIONS          sessions to run one after the other (default 1).
    WORKER_RUNS       runs per session (default 3).

Records. A worker: ``sessions``, one per session, with ``reads`` (every read of
the session's global step its waiter hook made: ``[step, chief_seen,
redis_lost]`` for stepbarrier's, the state of its wait at that read; ``[step]``
for TensorFlow's), ``released_at_step``, ``released_by`` and ``first_step``;
``error``, ``error_type`` and ``limit`` when a wait failed (it then exits with
1). The chief: ``step_times`` (``[global step, time.time()]`` per run) and, for
``hang``, ``paused_redis_at``, ``lost_seen`` and the calls of its publisher's
session ends: ``pause_calls`` and ``close_calls`` (arguments, ``redis_lost``
when called, result) and ``waits``, how long each wait for Redis was allowed
(``allowed``: seconds from the call to the deadline it was given, on the
publisher's own clock, read at the call: a computed limit, not a measured
time).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

from stepbarrier import StepPublisher
from stepbarrier._worker.wait_state import WaitRules
from stepbarrier.tf_hooks import GlobalStepPublisherHook, GlobalStepWaiterHook
from tests.tf.migration_task import LoopDied, Ready, session_for, wait_for_chief, wait_ready

CAP = 240.0
"""Seconds a chief waits for the test's next move before it gives up (records it)."""

Record = dict[str, Any]


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
    config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
    record: Record = {"error": None, "error_type": None, "limit": None, "step_times": []}
    with tf.Graph().as_default():
        setter = tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)
        with tf.compat.v1.device(setter):
            global_step = tf.compat.v1.train.get_or_create_global_step()
            train_op = tf.compat.v1.assign_add(global_step, 1)
            jump_op = tf.compat.v1.assign(global_step, int(os.environ.get("LAST_STEP", "0")))
        try:
            if kind == "chief":
                run_chief(server.target, config, global_step, train_op, jump_op, record)
            else:
                run_worker(server.target, config, global_step, record)
        except Exception as exc:  # recorded: the test reads it
            record["error"] = f"{type(exc).__name__}: {exc}"
            record["error_type"] = type(exc).__name__
            record["limit"] = getattr(exc, "limit", None)
    write(record)
    return 1 if record["error"] and kind != "chief" else 0


# -- a worker -----------------------------------------------------------------------


def run_worker(target: str, config: Any, global_step: Any, record: Record) -> None:
    step = int(os.environ["WAIT_UNTIL_STEP"])
    sessions: list[Record] = []
    record["sessions"] = sessions
    if os.environ.get("WORKER_HOOK") == "tensorflow":
        waiter: Any = RecordedTensorFlowHook(step, sessions)
    else:
        record_reads_of_stepbarrier(sessions)
        waiter = GlobalStepWaiterHook(step)
    hooks = [Ready(os.environ["RECORD_FILE"] + ".ready"), waiter]  # ready: before the wait
    wait_for_chief(target, config)
    for number in range(int(os.environ.get("SESSIONS", "1"))):
        current: Record = {"reads": [], "first_step": None}
        sessions.append(current)
        with session_for(target, config, hooks, False) as session:
            for _ in range(int(os.environ.get("WORKER_RUNS", "3"))):
                seen = int(session.run(global_step))  # a read: the step stays the chief's
                if current["first_step"] is None:
                    current["first_step"] = seen
                time.sleep(0.05)
        current["released_at_step"] = getattr(waiter, "released_at_step", None)
        current["released_by"] = getattr(waiter, "released_by", None)
        print(f"worker: session {number + 1} ended", flush=True)


def record_reads_of_stepbarrier(sessions: list[Record]) -> None:
    """Record each read of the session's step by stepbarrier's hook, with its wait's state."""
    judge = WaitRules.on_outside_step

    def recorded(self: WaitRules, step: int, hint: str = "") -> int | None:
        sessions[-1]["reads"].append([int(step), self.chief_seen, self.redis_lost])
        return judge(self, step, hint)

    WaitRules.on_outside_step = recorded  # type: ignore[method-assign]


class RecordedTensorFlowHook(tf.compat.v1.train.GlobalStepWaiterHook):  # type: ignore[misc]
    """TensorFlow's own hook, unchanged; each of its reads of the global step recorded."""

    def __init__(self, wait_until_step: int, sessions: list[Record]) -> None:
        super().__init__(wait_until_step)
        self._sessions = sessions

    def before_run(self, run_context: Any) -> Any:
        reads = self._sessions[-1]["reads"]
        return super().before_run(_RecordedContext(run_context, reads))


class _RecordedContext:
    def __init__(self, context: Any, reads: list[list[int]]) -> None:
        self.session = _RecordedSession(context.session, reads)


class _RecordedSession:
    def __init__(self, session: Any, reads: list[list[int]]) -> None:
        self._session = session
        self._reads = reads

    def run(self, fetches: Any, *args: Any, **kwargs: Any) -> Any:
        value = self._session.run(fetches, *args, **kwargs)
        self._reads.append([int(value)])
        return value


# -- the chief ------------------------------------------------------------------------


def run_chief(
    target: str, config: Any, global_step: Any, train_op: Any, jump_op: Any, record: Record
) -> None:
    last_step = os.environ.get("LAST_STEP")
    hook = GlobalStepPublisherHook(last_step=None if last_step is None else int(last_step))
    sleep = float(os.environ.get("STEP_SLEEP", "0.05"))
    if os.environ["CHIEF_LOOP"] == "dies":
        die_at = int(os.environ["DIE_AT"])
        try:
            with session_for(target, config, [hook], True) as session:
                wait_ready()
                while True:
                    step = run(session, train_op, record)
                    if step >= die_at:
                        raise LoopDied(f"the chief's training code failed at step {step}")
                    time.sleep(sleep)
        except LoopDied as exc:
            record["error"] = str(exc)
            write(record)  # now: the test reads it while this process lives on
            print(f"chief: {exc}; the process stays alive", flush=True)
            time.sleep(float(os.environ["STAY_ALIVE"]))
        return
    spy_on_session_ends(record)
    pause_at = int(os.environ["PAUSE_AT"])
    killed = os.environ["REDIS_KILLED"]
    record["paused_redis_at"] = None
    with session_for(target, config, [hook], True) as session:
        wait_ready()
        give_up = time.monotonic() + CAP
        while not os.path.exists(killed) and time.monotonic() < give_up:
            step = run(session, train_op, record)
            if record["paused_redis_at"] is None and step >= pause_at:
                os.kill(int(os.environ["REDIS_PID"]), signal.SIGSTOP)
                record["paused_redis_at"] = step
                print(f"chief: paused Redis at step {step}", flush=True)
            time.sleep(sleep)
        # Redis is gone: train on until the publisher found it so (a write failed)
        publisher = hook.publisher
        assert publisher is not None
        give_up = time.monotonic() + CAP
        while not lost(publisher) and time.monotonic() < give_up:
            run(session, train_op, record)
            time.sleep(sleep)
        record["lost_seen"] = lost(publisher)
        print("chief: the first session ends (the hook's end() pauses)", flush=True)
    # a second session reaches last_step at once: its end() closes with done=True
    with session_for(target, config, [hook], True) as session:
        session.run(jump_op)
        print("chief: the second session ends at last_step (end() closes)", flush=True)


def run(session: Any, train_op: Any, record: Record) -> int:
    step = int(session.run(train_op))
    record["step_times"].append([step, time.time()])
    return step


def lost(publisher: StepPublisher) -> bool:
    """The publisher found Redis lost (``redis_lost``; before it existed: a write failed)."""
    flag = getattr(publisher, "redis_lost", None)
    return publisher.last_error is not None if flag is None else bool(flag)


def spy_on_session_ends(record: Record) -> None:
    """Record the publisher's ``pause``/``close`` calls and what each wait for Redis
    was allowed (the session's end waits in ``wait_stored`` and ``stop``)."""
    record["pause_calls"] = []
    record["close_calls"] = []
    record["waits"] = []
    pause, close = StepPublisher.pause, StepPublisher.close
    wait_stored, stop = StepPublisher._wait_stored, StepPublisher._stop

    def paused(self: StepPublisher, *, flush_timeout: float | None = None) -> bool:
        call: Record = {"flush_timeout": flush_timeout, "redis_lost": lost(self)}
        record["pause_calls"].append(call)
        started = time.monotonic()
        result = pause(self, flush_timeout=flush_timeout)
        call.update(result=result, seconds=time.monotonic() - started)  # seconds: never asserted
        return result

    def closed(self: StepPublisher, done: bool = True, *, timeout: float = 10.0) -> bool:
        call: Record = {"done": done, "timeout": timeout, "redis_lost": lost(self)}
        record["close_calls"].append(call)
        started = time.monotonic()
        result = close(self, done, timeout=timeout)
        call.update(result=result, seconds=time.monotonic() - started)  # seconds: never asserted
        return result

    def stored(self: StepPublisher, wanted: int, deadline: float | None, **kwargs: Any) -> bool:
        allowed = None if deadline is None else deadline - self._clock()
        record["waits"].append({"in": "wait_stored", "allowed": allowed, **kwargs})
        return wait_stored(self, wanted, deadline, **kwargs)

    def stopped(self: StepPublisher, *, done: bool, deadline: float) -> bool:
        record["waits"].append({"in": "stop", "allowed": deadline - self._clock(), "done": done})
        return stop(self, done=done, deadline=deadline)

    StepPublisher.pause = paused  # type: ignore[method-assign]
    StepPublisher.close = closed  # type: ignore[method-assign]
    StepPublisher._wait_stored = stored  # type: ignore[method-assign]
    StepPublisher._stop = stopped  # type: ignore[method-assign]


def write(record: Record) -> None:
    path = os.environ["RECORD_FILE"]
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        json.dump(record, handle)
    os.replace(path + ".tmp", path)


if __name__ == "__main__":
    sys.exit(main())
