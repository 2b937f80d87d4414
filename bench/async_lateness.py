"""How late a waiting worker is released in asynchronous parameter-server training.

In asynchronous training the other workers push the global step while each
chief run is in flight, and the step the chief's hook fetches with a run is the
value from before the run. A target crossed in the middle of a run is only
seen in the fetched value of the *next* run, a whole chief run later, unless
the hook confirms the true step when the run returns.

Two publisher hooks, side by side on the same chief, the same runs and the
same targets:

* ``current``: ``GlobalStepPublisherHook`` as shipped. It confirms the true
  step (one extra read) when ``step + lead >= next_threshold``, the lead being
  the largest recent move of the step per chief run (``StepLead``).
* ``previous``: ``PreviousRulePublisherHook`` below, whose lead is always 1.
  It emulates the rule of the previous release, ``step + 1 >= next_threshold``
  (which confirmed the step only when the chief's own increment could reach
  the target).

Each hook publishes to its own job on one private redis-server, and for every
target one worker waits on each job.

The setup is in-process, and TensorFlow is real: one graph-mode
``MonitoredTrainingSession`` (no ps process), with both hooks among its hooks.
A chief run sleeps ``CHIEF_RUN`` seconds, after it has read the global step
(the value the hooks fetch), then adds 1. A second thread plays the other
workers: it adds 1 to the global step in the same session every
``PUSH_PAUSE`` seconds (about 190 steps/s), so a chief run moves the step by
about 20. The waiting workers are ``StepWaiter`` threads in this process (the
core of stepbarrier's ``GlobalStepWaiterHook``). Each registers
``AHEAD`` steps before its target. Targets are ``GAP`` steps apart, more than
3 chief runs, so the previous rule's late confirmation of one target never
releases the next one by luck. This is the scenario of
``tests/tf/test_async_ps.py``, with the other workers pushing on their own
clock instead of in lock-step with the chief.

Measured for each target and hook, from the *crossing run* (the first chief
run that returned with the true step at or above the target; its step and
return time are noted by the chief's first hook, before either publisher):

* lateness in time: the worker's release (the moment ``wait()`` returned)
  minus the moment the crossing run returned;
* lateness in steps: the true global step read by the worker right after its
  release, minus the step the crossing run returned with: how many steps the
  other workers did in the meantime;
* steps past the target: the worker's step minus the target (includes the
  steps done between the crossing and the end of the crossing run, which
  no rule can avoid).

The current hook runs after the previous one, so any time the previous one
spends in a run falls on the current one. A target whose waiters registered
after the crossing run had begun is dropped (and counted). Releases more
than half a chief run late are listed with the crossing run's fetched and
reached steps and the moves of the runs before it.

Usage: ``python -m bench.async_lateness [--quick] [--targets N]``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import threading
import time
import uuid
from typing import Any

from bench.harness import RedisServer, git, load_average, ms, save, summarize

CHIEF_RUN = 0.1
"""Seconds of one chief run (after it has read the global step)."""
PUSH_PAUSE = 0.005
"""Seconds the other workers pause between two pushes of the global step."""
GAP = (70, 110)
"""Steps between two targets (inclusive range, drawn at random)."""
AHEAD = 150
"""Steps before its target at which a worker starts to wait (about 0.8 s)."""
RULES = ("previous", "current")
"""The two publisher hooks, in the order the chief calls them."""
TIMEOUT = 60.0
"""Seconds after which a wait is given up (never reached in a healthy run)."""


def measure(url: str, targets: int, seed: int) -> dict[str, Any]:
    """Run the chief, the other workers and the waiting workers; return the raw records."""
    import numpy as np
    import tensorflow as tf

    from stepbarrier import BarrierConfig, StepWaiter
    from stepbarrier.tf_hooks import GlobalStepPublisherHook, StepLead

    tf.compat.v1.disable_eager_execution()

    class UnitLead(StepLead):
        """A lead of exactly 1: the chief's own increment, nothing else."""

        def observe(self, step: int, runs: int = 1) -> int:
            super().observe(step, runs)
            return 1

        @property
        def lead(self) -> int:
            return 1

    class PreviousRulePublisherHook(GlobalStepPublisherHook):
        """Emulates the previous release: confirm only when ``step + 1 >= next_threshold``."""

        def __init__(self, config: BarrierConfig) -> None:
            super().__init__(config)
            # fail loudly, rather than measure the current rule twice, if the hook changed
            if not isinstance(getattr(self, "_lead", None), StepLead):
                raise RuntimeError("GlobalStepPublisherHook no longer keeps its StepLead in _lead")
            self._lead = UnitLead()

    # per chief run: the step fetched with it (pre-run), the true step it returned with, when
    runs: list[tuple[int, int, float]] = []
    stop = threading.Event()
    raw: dict[str, Any] = {}

    class ChiefStamp(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
        """The chief's first hook: keeps the raw session, notes each run's step and return."""

        def __init__(self, train_op: Any, global_step: Any) -> None:
            self.train_op, self.global_step = train_op, global_step

        def after_create_session(self, session: Any, coord: Any) -> None:
            raw["session"] = session

        def before_run(self, run_context: Any) -> Any:
            return tf.compat.v1.train.SessionRunArgs((self.global_step, self.train_op))

        def after_run(self, run_context: Any, run_values: Any) -> None:
            fetched, reached = run_values.results
            runs.append((int(fetched), int(reached), time.time()))

    def chief_compute(fetched: np.int64) -> np.int64:
        time.sleep(CHIEF_RUN)
        return fetched

    def other_workers(increment: Any) -> None:
        while not stop.is_set():
            raw["session"].run(increment)
            time.sleep(PUSH_PAUSE)

    job = f"lateness-{uuid.uuid4().hex[:6]}"
    configs = {rule: BarrierConfig(job=f"{job}-{rule}", redis_url=url) for rule in RULES}
    trials: list[dict[str, Any]] = []
    errors: list[str] = []

    def wait_for(rule: str, target: int, task_id: int, global_step: Any) -> None:
        config = BarrierConfig(job=configs[rule].job, redis_url=url, role="worker", task_id=task_id)
        trial: dict[str, Any] = {"rule": rule, "target": target}
        try:
            with StepWaiter(config) as waiter:
                trial["entered"] = time.time()
                trial["released_at_step"] = waiter.wait(target, timeout=TIMEOUT)
                trial["released"] = time.time()
                trial["step_at_release"] = int(raw["session"].run(global_step))
        except Exception as exc:  # reported, and the trial left out
            errors.append(f"{rule} {target}: {exc!r}")
            return
        trials.append(trial)

    def schedule(global_step: Any) -> None:
        rng = random.Random(seed)
        target = int(raw["session"].run(global_step)) + AHEAD + 50
        waits: list[threading.Thread] = []
        try:
            for number in range(targets):
                while int(raw["session"].run(global_step)) < target - AHEAD:
                    time.sleep(0.01)
                for index, rule in enumerate(RULES):
                    thread = threading.Thread(
                        target=wait_for,
                        args=(rule, target, 2 * number + index + 1, global_step),
                        daemon=True,
                    )
                    thread.start()
                    waits.append(thread)
                target += rng.randint(*GAP)
            for thread in waits:
                thread.join(TIMEOUT + 10)
        finally:
            stop.set()

    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(global_step, 1)
        # the value the hooks fetch: the compute waits for it, so it is the pre-run step
        read = tf.compat.v1.get_default_graph().as_graph_element(global_step)
        compute = tf.numpy_function(chief_compute, [read], tf.int64, stateful=True)
        with tf.control_dependencies([compute]):
            train_op = tf.compat.v1.assign_add(global_step, 1)
        hooks = {
            "previous": PreviousRulePublisherHook(configs["previous"]),
            "current": GlobalStepPublisherHook(configs["current"]),
        }
        with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[ChiefStamp(train_op, global_step), *(hooks[rule] for rule in RULES)],
            # a chief run blocks one inter-op thread; the other workers need more
            config=tf.compat.v1.ConfigProto(inter_op_parallelism_threads=4),
            save_checkpoint_secs=None,
            save_checkpoint_steps=None,
            save_summaries_steps=None,
            save_summaries_secs=None,
            log_step_count_steps=None,
        ) as session:
            pusher = threading.Thread(target=other_workers, args=(increment,), daemon=True)
            scheduler = threading.Thread(target=schedule, args=(global_step,), daemon=True)
            pusher.start()
            scheduler.start()
            try:
                while not stop.is_set():
                    session.run(train_op)
            finally:
                stop.set()
                scheduler.join(TIMEOUT + 30)
                pusher.join(10)
        verifications = {rule: hooks[rule].verifications for rule in RULES}
    return {"runs": runs, "trials": trials, "errors": errors, "verifications": verifications}


def ratio(old: float | None, new: float | None) -> float | None:
    """``old / new``, or ``None`` where ``new`` is 0 (or either is missing)."""
    if old is None or new is None or new <= 0:
        return None
    return old / new


def analyse(raw: dict[str, Any]) -> dict[str, Any]:
    runs: list[tuple[int, int, float]] = raw["runs"]
    steps = [reached for _, reached, _ in runs]
    out: dict[str, Any] = {
        "lateness_ms": {},
        "lateness_steps": {},
        "past_target_steps": {},
        "samples_ms": {},
        "samples_steps": {},
        "dropped": {},
        "released_early": {},
        "released_a_run_late": {},
    }
    for rule in RULES:
        late_s, late_steps, past, dropped, early = [], [], [], 0, 0
        misses: list[dict[str, Any]] = []
        for trial in raw["trials"]:
            if trial["rule"] != rule:
                continue
            crossing = next((i for i, step in enumerate(steps) if step >= trial["target"]), None)
            # the waiter must have registered before the crossing run began
            if crossing is None or crossing == 0 or trial["entered"] >= runs[crossing - 1][2]:
                dropped += 1
                continue
            fetched, step, returned = runs[crossing]
            if trial["released_at_step"] < trial["target"]:
                early += 1
            late_s.append(trial["released"] - returned)
            if trial["released"] - returned > CHIEF_RUN / 2:
                moves = [b - a for a, b, _ in runs[max(crossing - 5, 0) : crossing + 1]]
                misses.append(
                    {
                        "target": trial["target"],
                        "fetched": fetched,
                        "reached": step,
                        "moves_up_to_the_crossing_run": moves,
                    }
                )
            late_steps.append(float(trial["step_at_release"] - step))
            past.append(float(trial["step_at_release"] - trial["target"]))
        out["lateness_ms"][rule] = summarize(ms(late_s))
        out["lateness_steps"][rule] = summarize(late_steps)
        out["past_target_steps"][rule] = summarize(past)
        out["samples_ms"][rule] = ms(late_s)
        out["samples_steps"][rule] = late_steps
        out["dropped"][rule] = dropped
        out["released_early"][rule] = early
        out["released_a_run_late"][rule] = misses
    out["ratio_previous_over_current"] = {
        f"{kind}_{q}": ratio(out[kind]["previous"].get(q), out[kind]["current"].get(q))
        for kind in ("lateness_ms", "lateness_steps", "past_target_steps")
        for q in ("median", "p90", "mean")
    }
    moves = [reached - fetched for fetched, reached, _ in runs[1:]]
    gaps = [b - a for (_, _, a), (_, _, b) in itertools.pairwise(runs)]
    out["chief_runs"] = len(runs)
    out["step_move_per_chief_run"] = summarize(float(m) for m in moves)
    out["chief_run_ms"] = summarize(ms(gaps))
    out["verifications"] = raw["verifications"]
    out["errors"] = raw["errors"][:10]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--targets", type=int, help="targets (one waiter per hook each)")
    parser.add_argument("--seed", type=int, default=11, help="seed of the target gaps")
    args = parser.parse_args()
    targets = args.targets if args.targets is not None else 20 if args.quick else 300
    load_before = load_average()
    started = time.monotonic()
    with RedisServer() as server:
        raw = measure(server.url, targets, args.seed)
    result = analyse(raw)
    result.update(
        benchmark="async_lateness",
        quick=args.quick,
        targets=targets,
        seconds=time.monotonic() - started,
        load_before=load_before,
        load_after=load_average(),
        commit=git("rev-parse", "--short", "HEAD"),
        hooks_dirty=bool(git("status", "--porcelain", "--", "stepbarrier/tf_hooks.py")),
        dirty=bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
        scenario={
            "chief_run_s": CHIEF_RUN,
            "push_pause_s": PUSH_PAUSE,
            "target_gap_steps": list(GAP),
            "ahead_steps": AHEAD,
            "setup": "in-process graph-mode MonitoredTrainingSession; other workers "
            "in a thread; waiters are StepWaiter threads",
        },
    )
    path = save("async_lateness", result)
    for rule in RULES:
        t, s = result["lateness_ms"][rule], result["lateness_steps"][rule]
        if t.get("n"):
            print(
                f"{rule:>8}: {t['median']:.2f} ms (p90 {t['p90']:.2f}) and "
                f"{s['median']:.0f} steps (p90 {s['p90']:.0f}) late, n={t['n']}, "
                f"dropped {result['dropped'][rule]}, "
                f"verifications {result['verifications'][rule]}",
                file=sys.stderr,
            )
    if result["errors"]:
        print(f"errors: {result['errors']}", file=sys.stderr)
    print(f"-> {path}", file=sys.stderr)
    if result["errors"] or not all(result["lateness_ms"][r].get("n") for r in RULES):
        sys.exit(1)


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
