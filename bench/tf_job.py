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

Chief untouched (same run, after those trials). The chief switches its
``GlobalStepPublisherHook`` off (its runs are a plain chief's: the switched-off
hook is passed no run, and no publisher ever writes the job the worker then
waits on), and the worker alternates three hooks in trials made the same way at
the 10 ms step period: TensorFlow's; stepbarrier's configured (``BarrierConfig``
with the bench's private Redis) for a job on which no publisher ever wrote,
which is what a worker sees when only the workers' import was changed; and
stepbarrier's with ``config=None`` and no ``STEPBARRIER_JOB`` in the worker's
environment (it then waits as TensorFlow's hook).

Parameter-server reads of a waiting worker. The waiter hook's ``before_run`` is
handed a ``SessionRunContext`` whose session is the MonitoredSession's own session
behind a proxy that counts (and times) its ``run`` calls: every global-step read
the hook makes during its wait is one ``session.run``, one round trip to the ps,
and nothing else is counted (not the other runs of the session, not Redis). They
are counted in every trial above (waits of about 1 s, where the read before Redis
is touched and the one 0.5 s later dominate) and in one long wait (``LONG_WAIT``
seconds) between the two: the four cases of ``LONG_WAIT_CASES`` wait at once,
each in its own thread, graph and ``MonitoredTrainingSession``, for the same step,
while the chief publishes at the 200 ms period (the untouched case waits on the
job no publisher writes).

Chief cost. Afterwards the chief trains as fast as it can in one new session,
in short blocks that rotate between the cases of ``COST_KINDS`` (no hook; a
hook that only fetches the global-step variable with each run, TensorFlow's
share of the cost; ``GlobalStepPublisherHook`` as shipped and fetching with
every run; the hooks ``MonitoredTrainingSession`` adds by default, alone and
with the publisher hook), no worker waiting, and reports steps/s per block.
A switched-off hook is still called but returns nothing at once; each
publisher's thread keeps its heartbeat (one write per second) throughout.

Usage: ``python -m bench.tf_job [--quick] [--trials N] [--untouched-trials N]
[--long-wait SECONDS] [--cost ROUNDS,STEPS]``; the task roles are internal.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.harness import (
    RedisServer,
    child_process,
    git,
    load_average,
    ms,
    save,
    stop_process,
    summarize,
)
from examples.demo.local import free_port

PERIODS = (0.01, 0.2)
"""The chief's step periods (seconds) of the wake-latency phases."""
UNTOUCHED_PERIOD = PERIODS[0]
"""The chief's step period (seconds) of the chief-untouched phase."""
UNTOUCHED_KINDS = ("tensorflow", "stepbarrier", "unconfigured")
"""The hooks of the chief-untouched phase: TensorFlow's; stepbarrier's,
configured (``BarrierConfig`` on the bench's Redis) for a job no publisher
writes; stepbarrier's with ``config=None`` and no ``STEPBARRIER_JOB``."""
LONG_WAIT_CASES = (
    ("tensorflow", "publisher"), ("stepbarrier", "publisher"), ("stepbarrier", "untouched"),
    ("unconfigured", "untouched"),
)  # fmt: skip
"""The (hook, phase) cases of the long wait that counts PS reads."""
LONG_WAIT = {"quick": 8.0, "full": 30.0}
"""Seconds of the long wait (stepbarrier with a publisher reads every 5 s)."""
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
    from stepbarrier import BarrierConfig, StepPublisher
    from stepbarrier.tf_hooks import GlobalStepPublisherHook

    control = Path(workdir) / "control"
    state: dict[str, Any] = {"period": PERIODS[0], "command": "period"}
    session_run_hook: Any = tf.compat.v1.train.SessionRunHook  # (tf: a module, untyped)

    class Switchable(session_run_hook):  # type: ignore[misc]
        """Passes runs to ``inner`` only while switched on (its session hooks always)."""

        def __init__(self, inner: Any, on: bool = False) -> None:
            self.inner, self.on, self.passed = inner, on, False

        def begin(self) -> None:
            self.inner.begin()

        def after_create_session(self, session: Any, coord: Any) -> None:
            self.inner.after_create_session(session, coord)

        def before_run(self, run_context: Any) -> Any:
            self.passed = self.on  # (switched by another thread in the untouched phase)
            return self.inner.before_run(run_context) if self.passed else None

        def after_run(self, run_context: Any, run_values: Any) -> None:
            if self.passed:
                self.inner.after_run(run_context, run_values)

        def end(self, session: Any) -> None:
            self.inner.end(session)

    config = BarrierConfig(job=job, redis_url=redis_url, role="chief", task_id=0)
    publishing = Switchable(GlobalStepPublisherHook(config), on=True)

    def follow_control() -> None:
        while state["command"] != "cost":
            try:
                command, _, value = control.read_text().partition(" ")
                state["command"] = command
                if command in ("period", "untouched"):
                    state["period"] = float(value)
                    # chief untouched: the runs of a chief without the publisher
                    publishing.on = command == "period"
            except (OSError, ValueError):
                pass
            time.sleep(0.05)

    records: list[tuple[int, float, float, bool]] = []

    class StampHook(session_run_hook):  # type: ignore[misc]
        """First hook of the chief: notes when each run returned, and its step."""

        def __init__(self, step_tensor: Any) -> None:
            self.step_tensor = step_tensor

        def before_run(self, run_context: Any) -> Any:
            return tf.compat.v1.train.SessionRunArgs(self.step_tensor)

        def after_run(self, run_context: Any, run_values: Any) -> None:
            records.append((int(run_values.results), time.time(), state["period"], publishing.on))

    with tf.Graph().as_default():
        _, train_op = build_model(tf, cluster, "/job:chief/task:0")
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target,
            is_chief=True,
            hooks=[StampHook(train_op)],
            chief_only_hooks=[publishing],
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
        verifications = publishing.inner.verifications
    rounds, block = (int(x) for x in cost.split(","))
    rates: dict[str, list[float]] = {kind: [] for kind in COST_KINDS}

    class FetchOnlyHook(session_run_hook):  # type: ignore[misc]
        """Fetches the global step with each run, as the publisher hook does, no more."""

        def begin(self) -> None:
            self.global_step = tf.compat.v1.train.get_global_step()

        def before_run(self, run_context: Any) -> Any:
            return tf.compat.v1.train.SessionRunArgs(self.global_step)

    class CountedPublisherHook(GlobalStepPublisherHook):
        """The publisher hook as shipped, counting the runs it fetched the step with."""

        fetches = 0

        def before_run(self, run_context: Any) -> Any:
            request = super().before_run(run_context)
            self.fetches += request is not None
            return request

    class EveryRunPublisherHook(CountedPublisherHook):
        """The publisher hook, fetching the global step with every run."""

        def _fetch_due(self, publisher: StepPublisher) -> bool:
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


class CountingSession:
    """The session a waiter hook is handed, counting its ``run`` calls (PS reads).

    Each call's ``time.time()`` is noted in ``reads``; anything else is the
    wrapped session's.
    """

    def __init__(self, session: Any, reads: list[float]) -> None:
        self._session = session
        self._reads = reads

    def run(self, *args: Any, **kwargs: Any) -> Any:
        self._reads.append(time.time())
        return self._session.run(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


def run_worker(
    cluster_json: str, redis_url: str, job: str, workdir: str, trials: int, extra: str
) -> None:
    tf, cluster, server, session_config = tf_setup(cluster_json, "worker")
    from stepbarrier import BarrierConfig
    from stepbarrier.tf_hooks import GlobalStepWaiterHook

    untouched_trials, long_wait = int(extra.split(",")[0]), float(extra.split(",")[1])
    # the unconfigured hook reads BarrierConfig.from_env() only with STEPBARRIER_JOB
    # set (child_env passes no STEPBARRIER_* variable)
    os.environ.pop("STEPBARRIER_JOB", None)
    configs = {
        phase: BarrierConfig(
            job=phase_job, redis_url=redis_url, role="worker", task_id=1, timeout=120
        )
        # a job no publisher ever writes: what a worker sees when its chief is untouched
        for phase, phase_job in (("publisher", job), ("untouched", f"{job}-untouched"))
    }

    def instrumented(base: type) -> type:
        class Instrumented(base):  # type: ignore[misc]
            """Times the first ``before_run`` (the wait) and counts its session reads."""

            entered: float | None = None
            returned: float | None = None

            def before_run(self, run_context: Any) -> Any:
                if self.entered is not None:
                    return super().before_run(run_context)
                self.reads: list[float] = []
                counted = tf.compat.v1.train.SessionRunContext(
                    run_context.original_args, CountingSession(run_context.session, self.reads)
                )
                self.entered = time.time()
                result = super().before_run(counted)
                self.returned = time.time()
                if counted.stop_requested:
                    run_context.request_stop()
                return result

        return Instrumented

    tensorflow_hook = instrumented(tf.compat.v1.train.GlobalStepWaiterHook)
    stepbarrier_hook = instrumented(GlobalStepWaiterHook)

    def make_hook(kind: str, phase: str, target: int) -> Any:
        if kind == "tensorflow":
            return tensorflow_hook(target)
        if kind == "unconfigured":
            return stepbarrier_hook(target, None)
        return stepbarrier_hook(target, configs[phase])

    setter = tf.compat.v1.train.replica_device_setter(
        worker_device="/job:worker/task:0", cluster=cluster
    )

    def read_step() -> int:
        with tf.Graph().as_default():
            with tf.compat.v1.device(setter):
                global_step = tf.compat.v1.train.get_or_create_global_step()
            with tf.compat.v1.Session(server.target, config=session_config) as plain:
                return int(plain.run(global_step))

    def wait_once(
        kind: str, phase: str, period: float, target: int, delay: float
    ) -> dict[str, Any]:
        with tf.Graph().as_default():
            with tf.compat.v1.device(setter):
                global_step = tf.compat.v1.train.get_or_create_global_step()
            time.sleep(delay)
            hook = make_hook(kind, phase, target)
            with tf.compat.v1.train.MonitoredTrainingSession(
                master=server.target,
                is_chief=False,
                hooks=[hook],
                **session_kwargs(session_config),
            ) as session:
                session.run(global_step)
        return {
            "kind": kind,
            "phase": phase,
            "period": period,
            "target": target,
            "entered": hook.entered,
            "returned": hook.returned,
            "reads": [t - hook.entered for t in hook.reads],
            "released_by": getattr(hook, "released_by", None),
        }

    def trial(kind: str, phase: str, period: float) -> dict[str, Any]:
        start_step = read_step()
        target = start_step + max(2, round(MARGIN / period))
        result = wait_once(kind, phase, period, target, random.uniform(0, POLL_CYCLE))
        result["start_step"] = start_step
        return result

    control = Path(workdir) / "control"
    results = []
    kinds = ["tensorflow", "stepbarrier"]
    for period in PERIODS:
        control.write_text(f"period {period}")
        time.sleep(0.5)
        for number in range(2 * trials):
            results.append(trial(kinds[number % 2], "publisher", period))
        kinds.reverse()

    # PS reads over one long wait: the kinds wait at once, each in its own
    # thread, graph and session, for the same step (publisher on, last period)
    long_waits: dict[str, Any] = {}
    period = PERIODS[-1]
    target = read_step() + round(long_wait / period)
    errors: list[BaseException] = []

    def long_wait_of(kind: str, phase: str) -> None:
        try:
            long_waits[f"{kind}@{phase}"] = wait_once(kind, phase, period, target, 0.0)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=long_wait_of, args=case) for case in LONG_WAIT_CASES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]

    # chief untouched: the chief's publisher switched off, stepbarrier's hook on
    # a job no publisher writes, and without STEPBARRIER_JOB
    control.write_text(f"untouched {UNTOUCHED_PERIOD}")
    time.sleep(0.5)
    for number in range(len(UNTOUCHED_KINDS) * untouched_trials):
        rounds, at = divmod(number, len(UNTOUCHED_KINDS))
        kind = UNTOUCHED_KINDS[(rounds + at) % len(UNTOUCHED_KINDS)]
        results.append(trial(kind, "untouched", UNTOUCHED_PERIOD))
    data = {"trials": results, "long_waits": long_waits, "long_wait_target": target}
    (Path(workdir) / "worker.json").write_text(json.dumps(data))


# -- the orchestration ------------------------------------------------------------


def wait_for(path: Path, processes: list[subprocess.Popen[str]], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        for process in processes:
            if process.poll() is not None:
                # [python, -m, bench.tf_job, --role, ROLE, ...]
                role = process.args[3:5] if isinstance(process.args, list) else process.args
                raise RuntimeError(f"a TF task exited early ({role!r})")
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {path.name}")
        time.sleep(0.1)


def analyse(chief: dict[str, Any], worker: dict[str, Any]) -> dict[str, Any]:
    trials = worker["trials"]
    reached: dict[int, tuple[float, float, bool]] = {}
    for step, when, period, publishing in chief["records"]:
        reached.setdefault(step, (when, period, publishing))

    def kept(kind: str, phase: str, period: float) -> tuple[list[float], list[dict[str, Any]], int]:
        """Latencies (s) and trials of one case, and how many were dropped."""
        samples, used, dropped = [], [], 0
        for trial in trials:
            if (trial["kind"], trial["phase"], trial["period"]) != (kind, phase, period):
                continue
            when, chief_period, publishing = reached.get(trial["target"], (None, None, None))
            if (
                when is None
                or trial["entered"] >= when
                or chief_period != period
                or publishing != (phase == "publisher")
            ):
                dropped += 1
                continue
            samples.append(trial["returned"] - when)
            used.append(trial)
        return samples, used, dropped

    def released_by(used: list[dict[str, Any]]) -> dict[str, int]:
        counts: dict[str, int] = {}
        for trial in used:
            by = trial["released_by"] or "-"
            counts[by] = counts.get(by, 0) + 1
        return counts

    out: dict[str, Any] = {"dropped": {}, "latency_ms": {}, "samples_ms": {}, "released_by": {}}
    waits: dict[str, list[dict[str, Any]]] = {}
    for period in PERIODS:
        for kind in ("tensorflow", "stepbarrier"):
            name = f"{kind}@{int(period * 1000)}ms"
            samples, used, dropped = kept(kind, "publisher", period)
            out["samples_ms"][name] = ms(samples)
            out["latency_ms"][name] = summarize(ms(samples))
            out["dropped"][name] = dropped
            out["released_by"][name] = released_by(used)
            waits.setdefault(f"{kind}@publisher", []).extend(used)
    untouched: dict[str, Any] = {
        "period_ms": int(UNTOUCHED_PERIOD * 1000),
        "latency_ms": {},
        "samples_ms": {},
        "dropped": {},
        "released_by": {},
    }
    for kind in UNTOUCHED_KINDS:
        samples, used, dropped = kept(kind, "untouched", UNTOUCHED_PERIOD)
        untouched["samples_ms"][kind] = ms(samples)
        untouched["latency_ms"][kind] = summarize(ms(samples))
        untouched["dropped"][kind] = dropped
        untouched["released_by"][kind] = released_by(used)
        waits[f"{kind}@untouched"] = used
    out["untouched"] = untouched
    # PS reads: the waiter hook's session.run calls during its wait
    in_trials: dict[str, Any] = {}
    for name, used in waits.items():
        seconds = [t["returned"] - t["entered"] for t in used]
        counts = [len(t["reads"]) for t in used]
        in_trials[name] = {
            "waits": len(used),
            "wait_s": summarize(seconds),
            "reads_per_wait": summarize(counts),
            "reads_per_s": sum(counts) / sum(seconds) if used else None,
        }
    long_waits: dict[str, Any] = {}
    for name, wait in worker["long_waits"].items():
        seconds, reads = wait["returned"] - wait["entered"], wait["reads"]
        gaps = [b - a for a, b in itertools.pairwise(reads)]
        long_waits[name] = {
            "seconds": seconds,
            "reads": len(reads),
            "reads_per_s": len(reads) / seconds,
            "read_at_s": [round(r, 3) for r in reads],
            "gap_s": summarize(gaps),
            "released_by": wait["released_by"],
        }
    out["ps_reads"] = {"trials": in_trials, "long_wait": long_waits}
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
    parser.add_argument(
        "--untouched-trials", type=int, help="chief-untouched trials per hook (4 quick, 24)"
    )
    parser.add_argument(
        "--long-wait", type=float, help="seconds of the PS-read count's long wait (8 quick, 30)"
    )
    parser.add_argument("--cost", help="chief-cost rounds and steps per block, e.g. 160,25")
    args = parser.parse_args()
    if args.role:
        role, *rest = args.role
        if role == "ps":
            run_ps(rest[0])
        elif role == "chief":
            run_chief(*rest)
        else:
            run_worker(rest[0], rest[1], rest[2], rest[3], int(rest[4]), rest[5])
        return
    trials = args.trials if args.trials is not None else 6 if args.quick else 32
    untouched_trials = (
        args.untouched_trials if args.untouched_trials is not None else 4 if args.quick else 24
    )
    long_wait = args.long_wait or LONG_WAIT["quick" if args.quick else "full"]
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
    processes: list[subprocess.Popen[str]] = []
    started = time.monotonic()
    with RedisServer() as server, tempfile.TemporaryDirectory(prefix="sb-tfbench-") as workdir:
        work = Path(workdir)
        try:
            processes.append(child_process("bench.tf_job", "--role", "ps", cluster, stdout=None))
            chief = child_process(
                "bench.tf_job",
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
                "bench.tf_job",
                "--role",
                "worker",
                cluster,
                server.url,
                job,
                workdir,
                str(trials),
                f"{untouched_trials},{long_wait}",
                stdout=None,
            )
            processes.append(worker)
            worker_trials = trials * 2 * len(PERIODS) + untouched_trials * len(UNTOUCHED_KINDS)
            worker.wait(timeout=60 + worker_trials * 10 + 2 * long_wait)
            if worker.returncode != 0:
                raise RuntimeError(f"the worker failed (exit {worker.returncode})")
            (work / "control").write_text("cost")
            chief.wait(timeout=600)
            if chief.returncode != 0:
                raise RuntimeError(f"the chief failed (exit {chief.returncode})")
            chief_data = json.loads((work / "chief.json").read_text())
            worker_data = json.loads((work / "worker.json").read_text())
        finally:
            for process in reversed(processes):
                stop_process(process)
    result = analyse(chief_data, worker_data)
    result.update(
        benchmark="tf_job",
        quick=args.quick,
        commit=git("rev-parse", "--short", "HEAD"),
        dirty=bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
        load_before=load_before,
        load_after=load_average(),
        seconds=time.monotonic() - started,
        trials_per_hook_and_period=trials,
        untouched_trials_per_hook=untouched_trials,
        long_wait_s=long_wait,
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
    for kind, stats in result["untouched"]["latency_ms"].items():
        if stats.get("n"):
            print(
                f"{kind + '@untouched':>22}: median {stats['median']:.2f} ms, p99 "
                f"{stats['p99']:.2f} ms (n={stats['n']}, dropped "
                f"{result['untouched']['dropped'][kind]})",
                file=sys.stderr,
            )
    for name, reads in result["ps_reads"]["trials"].items():
        if reads["waits"]:
            print(
                f"{name:>22}: {reads['reads_per_s']:.2f} PS reads/s over {reads['waits']} "
                f"waits (median {reads['wait_s']['median']:.2f} s)",
                file=sys.stderr,
            )
    for name, wait in result["ps_reads"]["long_wait"].items():
        print(
            f"{name:>22}: {wait['reads']} PS reads in one wait of {wait['seconds']:.1f} s "
            f"({wait['reads_per_s']:.2f}/s), the first at {wait['read_at_s'][:8]} s",
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
