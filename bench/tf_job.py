"""Wake latency and chief cost in a real TensorFlow parameter-server job on loopback.

One cluster: a ps, a chief and a worker process (plus a private redis-server).

Wake latency (both hooks, same cluster, same run). The chief trains at a fixed
step period (about 10 ms, then about 200 ms) with ``GlobalStepPublisherHook``
and notes ``time.time()`` after each run, from the first hook's ``after_run``
(before any other hook, the publisher's included), together with the global
step the run reached. The worker runs trials one after the other, alternating
``tf.compat.v1.train.GlobalStepWaiterHook`` and stepbarrier's
``GlobalStepWaiterHook``: each trial builds a fresh graph, reads the global
step S, waits a random delay of up to 0.5 s (TensorFlow's poll cycle), then
opens a ``MonitoredTrainingSession`` whose waiter hook waits for K = S + 1.2 s
of chief steps, and notes ``time.time()`` when the hook's ``before_run``
returns. Latency = that moment minus the chief's note for step K. A trial
whose wait began after step K was reached is dropped (and counted).

Chief cost. Afterwards the chief trains as fast as it can in one new session,
in short blocks that rotate between no hook, a hook that only fetches the
global step with each run (TensorFlow's share of the cost) and
``GlobalStepPublisherHook`` (no worker waiting), and reports steps/s per block.
A switched-off hook is still called but returns nothing at once; the
publisher's thread keeps its heartbeat (one write per second) throughout.

Usage: ``python bench/tf_job.py [--quick]``; the task roles are internal.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from harness import (
    RedisServer,
    child_process,
    load_average,
    ms,
    save,
    stop_process,
    summarize,
)

from stepbarrier.local_cluster import free_port

PERIODS = (0.01, 0.2)
"""The chief's step periods (seconds) of the wake-latency phases."""
MARGIN = 1.2
"""Seconds of chief steps between a trial's read of the step and its target."""
POLL_CYCLE = 0.5
"""TensorFlow's hook polls every 0.5 s: each trial starts its wait after a
random delay of up to one cycle, so that the step falls at a uniformly random
point of the poll cycle, whatever the chief's step period."""
COST_KINDS = ("without", "fetch_only", "with")
"""Chief-cost sessions: no hook; a hook that only fetches the global step each
run (TensorFlow's share of the publisher hook's cost); the publisher hook."""


# -- TensorFlow tasks -------------------------------------------------------------


def tf_setup(cluster_json: str, job_name: str) -> tuple[Any, Any, Any, Any]:
    import tensorflow as tf

    tf.compat.v1.disable_eager_execution()
    cluster = tf.train.ClusterSpec(json.loads(cluster_json))
    server = tf.distribute.Server(cluster, job_name=job_name, task_index=0)
    device = f"/job:{job_name}/task:0"
    session_config = tf.compat.v1.ConfigProto(device_filters=["/job:ps", device])
    return tf, cluster, server, session_config


def build_model(tf: Any, cluster: Any, device: str) -> tuple[Any, Any]:
    """Global step and a tiny linear model on the ps; train_op yields the new step."""
    setter = tf.compat.v1.train.replica_device_setter(worker_device=device, cluster=cluster)
    with tf.compat.v1.device(setter):
        global_step = tf.compat.v1.train.get_or_create_global_step()
        weights = tf.compat.v1.get_variable("weights", [4, 1])
        bias = tf.compat.v1.get_variable("bias", [1], initializer=tf.zeros_initializer())
        x = tf.random.normal([32, 4])
        y = tf.matmul(x, [[1.0], [-2.0], [3.0], [0.5]]) + 0.7
        loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) + bias - y))
        optimizer = tf.compat.v1.train.GradientDescentOptimizer(0.05)
        apply = optimizer.apply_gradients(optimizer.compute_gradients(loss))
        with tf.control_dependencies([apply]):
            train_op = tf.compat.v1.assign_add(global_step, 1)
    return global_step, train_op


def session_kwargs(session_config: Any) -> dict[str, Any]:
    return {
        "config": session_config,
        "checkpoint_dir": None,
        "save_checkpoint_secs": None,
        "save_checkpoint_steps": None,
        "save_summaries_steps": None,
        "save_summaries_secs": None,
        "log_step_count_steps": None,
    }


def run_ps(cluster_json: str) -> None:
    _, _, server, _ = tf_setup(cluster_json, "ps")
    server.join()


def run_chief(cluster_json: str, redis_url: str, job: str, workdir: str, cost: str) -> None:
    tf, cluster, server, session_config = tf_setup(cluster_json, "chief")
    from stepbarrier import BarrierConfig
    from stepbarrier.tf_hooks import GlobalStepPublisherHook

    control = Path(workdir) / "control"
    state = {"period": PERIODS[0], "command": "period"}

    def follow_control() -> None:
        while state["command"] != "cost":
            try:
                command, _, value = control.read_text().partition(" ")
                state["command"] = command
                if command == "period":
                    state["period"] = float(value)
            except (OSError, ValueError):
                pass
            time.sleep(0.05)

    records: list[tuple[int, float, float]] = []

    class StampHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
        """First hook of the chief: notes when each run returned, and its step."""

        def __init__(self, step_tensor: Any) -> None:
            self.step_tensor = step_tensor

        def before_run(self, run_context: Any) -> Any:
            return tf.compat.v1.train.SessionRunArgs(self.step_tensor)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            records.append((int(run_values.results), time.time(), state["period"]))

    config = BarrierConfig(job=job, redis_url=redis_url, role="chief", task_id=0)
    with tf.Graph().as_default():
        _, train_op = build_model(tf, cluster, "/job:chief/task:0")
        publisher_hook = GlobalStepPublisherHook(config)
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target,
            is_chief=True,
            hooks=[StampHook(train_op)],
            chief_only_hooks=[publisher_hook],
            **session_kwargs(session_config),
        ) as session:
            (Path(workdir) / "chief-ready").write_text("1")
            threading.Thread(target=follow_control, daemon=True).start()
            while state["command"] != "cost":
                started = time.perf_counter()
                session.run(train_op)
                rest = state["period"] - (time.perf_counter() - started)
                if rest > 0:
                    time.sleep(rest)
        verifications = publisher_hook.verifications
    rounds, block = (int(x) for x in cost.split(","))
    rates: dict[str, list[float]] = {kind: [] for kind in COST_KINDS}

    class FetchOnlyHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
        """Fetches the global step with each run, as the publisher hook does, no more."""

        def begin(self) -> None:
            self.global_step = tf.compat.v1.train.get_global_step()

        def before_run(self, run_context: Any) -> Any:
            return tf.compat.v1.train.SessionRunArgs(self.global_step)

    class Switchable(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
        """Passes runs to ``inner`` only while switched on (its session hooks always)."""

        def __init__(self, inner: Any) -> None:
            self.inner, self.on = inner, False

        def begin(self) -> None:
            self.inner.begin()

        def after_create_session(self, session: Any, coord: Any) -> None:
            self.inner.after_create_session(session, coord)

        def before_run(self, run_context: Any) -> Any:
            return self.inner.before_run(run_context) if self.on else None

        def after_run(self, run_context: Any, run_values: Any) -> None:
            if self.on:
                self.inner.after_run(run_context, run_values)

        def end(self, session: Any) -> None:
            self.inner.end(session)

    # One session, the three cases in short alternating blocks, so that the
    # machine's noise (2 cores, shared) falls on all of them alike.
    cost_config = BarrierConfig(job=f"{job}-cost", redis_url=redis_url, role="chief", task_id=0)
    switches = {
        "fetch_only": Switchable(FetchOnlyHook()),
        "with": Switchable(GlobalStepPublisherHook(cost_config)),
    }
    with tf.Graph().as_default():
        _, train_op = build_model(tf, cluster, "/job:chief/task:0")
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target,
            is_chief=True,
            chief_only_hooks=list(switches.values()),
            **session_kwargs(session_config),
        ) as session:
            for _ in range(50):
                session.run(train_op)
            for number in range(rounds):
                order = COST_KINDS if number % 2 == 0 else COST_KINDS[::-1]
                for kind in order:
                    for name, switch in switches.items():
                        switch.on = name == kind
                    started = time.perf_counter()
                    for _ in range(block):
                        session.run(train_op)
                    rates[kind].append(block / (time.perf_counter() - started))
    result = {"records": records, "verifications": verifications, "rates": rates}
    (Path(workdir) / "chief.json").write_text(json.dumps(result))


def run_worker(cluster_json: str, redis_url: str, job: str, workdir: str, trials: int) -> None:
    tf, cluster, server, session_config = tf_setup(cluster_json, "worker")
    from stepbarrier import BarrierConfig
    from stepbarrier.tf_hooks import GlobalStepWaiterHook

    config = BarrierConfig(job=job, redis_url=redis_url, role="worker", task_id=1, timeout=120)

    def timed(base: type) -> type:
        class Timed(base):  # type: ignore[misc, valid-type]
            entered: float | None = None
            returned: float | None = None

            def before_run(self, run_context: Any) -> Any:
                first = self.entered is None
                if first:
                    self.entered = time.time()
                result = super().before_run(run_context)
                if first:
                    self.returned = time.time()
                return result

        return Timed

    hook_types = {
        "tensorflow": timed(tf.compat.v1.train.GlobalStepWaiterHook),
        "stepbarrier": timed(GlobalStepWaiterHook),
    }
    setter = tf.compat.v1.train.replica_device_setter(
        worker_device="/job:worker/task:0", cluster=cluster
    )
    results = []
    kinds = ["tensorflow", "stepbarrier"]
    for period in PERIODS:
        (Path(workdir) / "control").write_text(f"period {period}")
        time.sleep(0.5)
        for trial in range(2 * trials):
            kind = kinds[trial % 2]
            with tf.Graph().as_default():
                with tf.compat.v1.device(setter):
                    global_step = tf.compat.v1.train.get_or_create_global_step()
                with tf.compat.v1.Session(server.target, config=session_config) as plain:
                    start_step = int(plain.run(global_step))
                target = start_step + max(2, round(MARGIN / period))
                time.sleep(random.uniform(0, POLL_CYCLE))
                hook = (
                    hook_types[kind](target, config)
                    if kind == "stepbarrier"
                    else hook_types[kind](target)
                )
                with tf.compat.v1.train.MonitoredTrainingSession(
                    master=server.target,
                    is_chief=False,
                    hooks=[hook],
                    **session_kwargs(session_config),
                ) as session:
                    session.run(global_step)
                results.append(
                    {
                        "kind": kind,
                        "period": period,
                        "target": target,
                        "start_step": start_step,
                        "entered": hook.entered,
                        "returned": hook.returned,
                    }
                )
        kinds.reverse()
    (Path(workdir) / "worker.json").write_text(json.dumps(results))


# -- the orchestration ------------------------------------------------------------


def wait_for(path: Path, processes: list[Any], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"a TF task exited early ({process.args[2:4]})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {path.name}")
        time.sleep(0.1)


def analyse(chief: dict[str, Any], trials: list[dict[str, Any]]) -> dict[str, Any]:
    reached: dict[int, tuple[float, float]] = {}
    for step, when, period in chief["records"]:
        reached.setdefault(step, (when, period))
    out: dict[str, Any] = {"dropped": {}, "latency_ms": {}, "samples_ms": {}}
    for period in PERIODS:
        for kind in ("tensorflow", "stepbarrier"):
            name = f"{kind}@{int(period * 1000)}ms"
            samples, dropped = [], 0
            for trial in trials:
                if trial["kind"] != kind or trial["period"] != period:
                    continue
                when, chief_period = reached.get(trial["target"], (None, None))
                if when is None or trial["entered"] >= when or chief_period != period:
                    dropped += 1
                    continue
                samples.append(trial["returned"] - when)
            out["samples_ms"][name] = ms(samples)
            out["latency_ms"][name] = summarize(ms(samples))
            out["dropped"][name] = dropped
    rates = chief["rates"]
    out["chief_steps_per_s"] = {kind: summarize(rates[kind]) for kind in COST_KINDS}
    out["chief_samples"] = rates
    # Blocks ran in alternating order: compare each round's blocks pairwise.
    for kind in ("with", "fetch_only"):
        ratios = [1.0 - a / b for a, b in zip(rates[kind], rates["without"], strict=True)]
        if ratios:
            out[f"chief_slowdown_{kind}"] = summarize(ratios)
    out["publisher_verifications"] = chief["verifications"]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    parser.add_argument("--trials", type=int, help="trials per hook and period")
    parser.add_argument("--cost", help="chief-cost rounds and steps per block, e.g. 160,25")
    args = parser.parse_args()
    if args.role:
        role, *rest = args.role
        if role == "ps":
            run_ps(rest[0])
        elif role == "chief":
            run_chief(*rest)
        else:
            run_worker(*rest[:4], int(rest[4]))
        return
    trials = args.trials if args.trials is not None else 6 if args.quick else 32
    cost = args.cost or ("30,20" if args.quick else "160,25")
    load_before = load_average()
    cluster = json.dumps(
        {
            "ps": [f"localhost:{free_port()}"],
            "chief": [f"localhost:{free_port()}"],
            "worker": [f"localhost:{free_port()}"],
        }
    )
    job = f"tfbench-{uuid.uuid4().hex[:6]}"
    processes: list[Any] = []
    started = time.monotonic()
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="sb-tfbench-") as workdir:
        work = Path(workdir)
        try:
            processes.append(child_process("tf_job.py", "--role", "ps", cluster, stdout=None))
            chief = child_process(
                "tf_job.py",
                "--role",
                "chief",
                cluster,
                server.url,
                job,
                workdir,
                cost,
                stdout=None,
            )
            processes.append(chief)
            wait_for(work / "chief-ready", processes, 180)
            worker = child_process(
                "tf_job.py",
                "--role",
                "worker",
                cluster,
                server.url,
                job,
                workdir,
                str(trials),
                stdout=None,
            )
            processes.append(worker)
            worker.wait(timeout=60 + trials * 2 * len(PERIODS) * 10)
            if worker.returncode != 0:
                raise RuntimeError(f"the worker failed (exit {worker.returncode})")
            (work / "control").write_text("cost")
            chief.wait(timeout=600)
            if chief.returncode != 0:
                raise RuntimeError(f"the chief failed (exit {chief.returncode})")
            chief_data = json.loads((work / "chief.json").read_text())
            trial_data = json.loads((work / "worker.json").read_text())
        finally:
            for process in reversed(processes):
                stop_process(process)
    result = analyse(chief_data, trial_data)
    result.update(
        benchmark="tf_job",
        quick=args.quick,
        load_before=load_before,
        load_after=load_average(),
        seconds=time.monotonic() - started,
        trials_per_hook_and_period=trials,
        tensorflow=tf_version(),
    )
    save("tf_job", result)
    for name, stats in result["latency_ms"].items():
        if stats.get("n"):
            print(
                f"{name:>22}: median {stats['median']:.2f} ms, p99 {stats['p99']:.2f} ms, "
                f"max {stats['max']:.2f} ms (n={stats['n']}, dropped {result['dropped'][name]})",
                file=sys.stderr,
            )
    for kind in ("with", "fetch_only"):
        slowdown = result.get(f"chief_slowdown_{kind}", {})
        if slowdown.get("n"):
            print(
                f"chief slowdown ({kind}): median {100 * slowdown['median']:.1f}% "
                f"over {slowdown['n']} blocks",
                file=sys.stderr,
            )


def tf_version() -> str:
    try:
        from importlib.metadata import version

        return version("tensorflow-cpu")
    except Exception:
        return "unknown"


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
