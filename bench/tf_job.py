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
in short blocks that rotate between the cases of ``COST_KINDS`` (no hook; a
hook that only fetches the global-step variable with each run, TensorFlow's
share of the cost; ``GlobalStepPublisherHook`` as shipped and fetching with
every run; the hooks ``MonitoredTrainingSession`` adds by default, alone and
with the publisher hook), no worker waiting, and reports steps/s per block.
A switched-off hook is still called but returns nothing at once; each
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

from stepbarrier.cli.local_cluster import free_port

PERIODS = (0.01, 0.2)
"""The chief's step periods (seconds) of the wake-latency phases."""
MARGIN = 1.2
"""Seconds of chief steps between a trial's read of the step and its target."""
POLL_CYCLE = 0.5
"""TensorFlow's hook polls every 0.5 s: each trial starts its wait after a
random delay of up to one cycle, so that the step falls at a uniformly random
point of the poll cycle, whatever the chief's step period."""
COST_KINDS = (
    "without", "fetch_only", "with_every", "with", "defaults", "defaults_with_every",
    "defaults_with",
)  # fmt: skip
"""Chief-cost cases: no hook; a hook that only fetches the global-step variable
each run (TensorFlow's share of the publisher hook's cost before it fetched the
shared read tensor); the publisher hook fetching with every run, and as shipped
(``FETCH_EVERY``); ``MonitoredTrainingSession``'s default hooks
(``StepCounterHook`` and ``SummarySaverHook``, every 100 steps, as with a
``summary_dir``), alone, with the every-run publisher hook and with the
publisher hook as shipped."""
PUBLISHERS = ("with_every", "with", "defaults_with_every", "defaults_with")
"""The cases with a publisher hook (each its own, on its own job)."""
COST_GROUPS = (COST_KINDS[:4], COST_KINDS[4:])
"""The cases of each chief-cost session: without the default hooks, then with them."""


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

    class CountedPublisherHook(GlobalStepPublisherHook):  # type: ignore[misc]
        """The publisher hook as shipped, counting the runs it fetched the step with."""

        fetches = 0

        def before_run(self, run_context: Any) -> Any:
            request = super().before_run(run_context)
            self.fetches += request is not None
            return request

    class EveryRunPublisherHook(CountedPublisherHook):
        """The publisher hook, fetching the global step with every run."""

        def _fetch_due(self, publisher: Any) -> bool:
            return True

    def publisher_hook(kind: str) -> Any:
        cost_config = BarrierConfig(
            job=f"{job}-cost-{kind}", redis_url=redis_url, role="chief", task_id=0
        )
        every = kind.endswith("_every")
        return (EveryRunPublisherHook if every else CountedPublisherHook)(cost_config)

    # Two sessions: the bare chief's cases, then those with the default hooks
    # (their cached global-step read exists only with them). In each, the cases
    # run in short alternating blocks, so that the machine's noise (2 cores,
    # shared) falls on all of them alike.
    summary_dir = tempfile.mkdtemp(prefix="sb-tfbench-summaries-")
    fetches: dict[str, int] = {}
    for group in COST_GROUPS:
        with tf.Graph().as_default():
            _, train_op = build_model(tf, cluster, "/job:chief/task:0")
            scaffold = tf.compat.v1.train.Scaffold()
            switches: dict[str, list[Switchable]] = {
                kind: [Switchable(publisher_hook(kind))] for kind in group if kind in PUBLISHERS
            }
            if "fetch_only" in group:
                switches["fetch_only"] = [Switchable(FetchOnlyHook())]
            if "defaults" in group:
                defaults = [  # what MonitoredTrainingSession adds with a summary_dir
                    tf.compat.v1.train.StepCounterHook(output_dir=summary_dir, every_n_steps=100),
                    tf.compat.v1.train.SummarySaverHook(
                        save_steps=100, output_dir=summary_dir, scaffold=scaffold
                    ),
                ]
                default_switches = [Switchable(hook) for hook in defaults]
                for kind in group:
                    switches[kind] = [*default_switches, *switches.get(kind, [])]
            hooks = list(
                {id(s): s for group_hooks in switches.values() for s in group_hooks}.values()
            )
            with tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target,
                is_chief=True,
                chief_only_hooks=hooks,
                scaffold=scaffold,
                **session_kwargs(session_config),
            ) as session:
                for _ in range(50):
                    session.run(train_op)
                for number in range(rounds):
                    order = group if number % 2 == 0 else group[::-1]
                    for kind in order:
                        active = {id(s) for s in switches.get(kind, [])}
                        for hook in hooks:
                            hook.on = id(hook) in active
                        started = time.perf_counter()
                        for _ in range(block):
                            session.run(train_op)
                        rates[kind].append(block / (time.perf_counter() - started))
            for kind in group:
                for switch in switches.get(kind, []):
                    if isinstance(switch.inner, CountedPublisherHook):
                        fetches[kind] = switch.inner.fetches
    result = {
        "records": records,
        "verifications": verifications,
        "rates": rates,
        "fetches": fetches,
        "runs_per_case": rounds * block,
    }
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
    for kind in COST_KINDS[1:]:
        base = "defaults" if kind.startswith("defaults_") else "without"
        ratios = [1.0 - a / b for a, b in zip(rates[kind], rates[base], strict=True)]
        if ratios:
            out[f"chief_slowdown_{kind}"] = summarize(ratios)
    out["publisher_fetches"] = chief.get("fetches", {})
    out["runs_per_case"] = chief.get("runs_per_case")
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
    for kind in COST_KINDS[1:]:
        slowdown = result.get(f"chief_slowdown_{kind}", {})
        if slowdown.get("n"):
            base = "defaults" if kind.startswith("defaults_") else "no hook"
            print(
                f"chief slowdown ({kind} vs {base}): median {100 * slowdown['median']:.1f}% "
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
