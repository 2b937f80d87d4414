"""Turn ``bench/results/*.json`` into ``results.md`` and ``wake_latency.png``.

Usage: ``python -m bench.report [--quick]`` (``python -m bench`` calls it at the end;
``--quick`` reports the quick run in ``bench/results/quick/``).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.harness import RESULTS_DIR
from bench.report_fleet import fleet_section, fleet_targets, plot_fleet
from bench.report_instructions import instructions_section, instructions_targets

TARGETS = {
    "wake_median_ms": 2.0,
    "wake_p99_ms": 10.0,
    "floor_ratio": 2.0,
    "fanout_256_median_ms": 50.0,
    "chief_slowdown": 0.03,
    "publish_us": 5.0,
    "idle_waiter_per_s": 0.2,
}
SHARE_OF_CORE = 0.5
"""Share of one Redis core the scale arithmetic allows itself (headroom for bursts)."""
DEFAULT_MAXCLIENTS = 10_000


def _plain(value: object) -> str:
    """A mapping or a list as a reader reads it (``fcall 24, blpop 6``; ``0.48 / 2.7``),
    not as Python's repr."""
    if isinstance(value, dict):
        return ", ".join(f"{key} {_plain(item)}" for key, item in value.items()) or "none"
    if isinstance(value, (list, tuple)):
        return " / ".join(_plain(item) for item in value)
    return str(value)


def load(name: str) -> dict[str, Any] | None:
    path = RESULTS_DIR / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def verdict(ok: bool) -> str:
    return "pass" if ok else "**MISS**"


def fmt(value: float | None, digits: int = 2) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:,.{digits}f}"


def stats_row(label: str, stats: dict[str, float], digits: int = 2) -> str:
    cells = [fmt(stats.get(k), digits) for k in ("median", "p90", "p99", "max", "mean")]
    return f"| {label} | {stats.get('n', 0)} | " + " | ".join(cells) + " |"


STATS_HEADER = "| | n | median | p90 | p99 | max | mean |\n|---|---|---|---|---|---|---|"


def wake_section(
    tf: dict[str, Any] | None, floor: dict[str, Any] | None, run: dict[str, Any] | None = None
) -> list[str]:
    lines = ["## 1-2. Wake latency (ms)", ""]
    lines.append(
        "From the end of the chief's run that reached step K (or the `publish`/`PUBLISH` "
        "call) to the return of the worker's waiter. Same run, same machine, loopback."
    )
    lines += ["", STATS_HEADER]
    if tf:
        for name, stats in tf["latency_ms"].items():
            kind, period = name.split("@")
            label = (
                "TensorFlow `GlobalStepWaiterHook`"
                if kind == "tensorflow"
                else "stepbarrier `GlobalStepWaiterHook`"
            )
            lines.append(stats_row(f"{label}, chief step {period}", stats))
        untouched = tf.get("untouched") or {}
        for kind, stats in sorted(
            untouched.get("latency_ms", {}).items(),
            key=lambda item: list(UNTOUCHED_NAMES).index(item[0]),
        ):
            label = (
                f"{UNTOUCHED_NAMES[kind]}, chief untouched, chief step {untouched['period_ms']}ms"
            )
            lines.append(stats_row(label, stats))
    if floor:
        core = "stepbarrier core: `publish()` -> `wait()` (no TF)"
        lines.append(stats_row(core, floor["core_ms"]))
        lines.append(stats_row("floor: raw redis-py `PUBLISH` -> `get_message`", floor["floor_ms"]))
    lines.append("")
    if tf:
        dropped = {k: v for k, v in tf["dropped"].items() if v}
        untouched = tf.get("untouched") or {}
        dropped.update(
            {f"{k}, chief untouched": v for k, v in untouched.get("dropped", {}).items() if v}
        )
        if dropped:
            lines.append(
                f"Trials dropped (the wait began after step K was reached): {_plain(dropped)}."
            )
        for period in ("10ms", "200ms"):
            t = tf["latency_ms"].get(f"tensorflow@{period}", {})
            s = tf["latency_ms"].get(f"stepbarrier@{period}", {})
            if t.get("n") and s.get("n"):
                lines.append(
                    f"- chief step {period}: TensorFlow's hook / stepbarrier's hook = "
                    f"{t['median'] / s['median']:,.0f}x at the median, "
                    f"{t['p99'] / s['p99']:,.0f}x at p99."
                )
        lines += untouched_lines(tf)
        lines.append(
            f"- publisher-hook verifications (extra global-step reads at a crossed target): "
            f"{tf.get('publisher_verifications')}."
        )
    if floor:
        lines.append(
            f"- stepbarrier core / floor = {floor['core_over_floor_median']:.2f}x at the median."
        )
        if tf:
            for period in ("10ms", "200ms"):
                s = tf["latency_ms"].get(f"stepbarrier@{period}", {})
                if s.get("n"):
                    lines.append(
                        f"- stepbarrier TF hook ({period}) / floor = "
                        f"{s['median'] / floor['floor_ms']['median']:.2f}x at the median."
                    )
    lines.append("")
    lines.append("![wake latency](wake_latency.png)")
    lines.append("")
    if tf:
        lines += ps_reads_lines(tf)
        lines += tf_run_lines(tf, run)
    return lines


UNTOUCHED_NAMES = {
    "tensorflow": "TensorFlow `GlobalStepWaiterHook`",
    "stepbarrier": "stepbarrier `GlobalStepWaiterHook` (configured, no publisher)",
    "unconfigured": "stepbarrier `GlobalStepWaiterHook` without `STEPBARRIER_JOB`",
}
READ_CASES = {
    "tensorflow@publisher": "TensorFlow `GlobalStepWaiterHook`",
    "stepbarrier@publisher": "stepbarrier's, chief with `GlobalStepPublisherHook`",
    "tensorflow@untouched": "TensorFlow `GlobalStepWaiterHook` (chief-untouched trials)",
    "stepbarrier@untouched": "stepbarrier's, chief untouched (configured, no publisher)",
    "unconfigured@untouched": "stepbarrier's without `STEPBARRIER_JOB` (chief untouched)",
}


def ratio(a: float | None, b: float | None) -> str:
    if not a or not b:
        return "-"
    return f"{a / b:,.2f}x"


def untouched_lines(tf: dict[str, Any]) -> list[str]:
    """The chief-untouched trials as ratios to TensorFlow's hook, and what released them."""
    untouched = tf.get("untouched")
    if not untouched:
        return []
    stats = untouched["latency_ms"]
    base = stats.get("tensorflow", {})
    lines = []
    for kind in ("stepbarrier", "unconfigured"):
        s = stats.get(kind, {})
        if base.get("n") and s.get("n"):
            lines.append(
                f"- chief untouched (no `GlobalStepPublisherHook`), chief step "
                f"{untouched['period_ms']}ms: {UNTOUCHED_NAMES[kind]} / TensorFlow's hook = "
                f"{ratio(s['median'], base['median'])} at the median, "
                f"{ratio(s['p90'], base['p90'])} at p90, {ratio(s['mean'], base['mean'])} "
                f"in the mean ({s['n']} and {base['n']} trials; 1x: the same, both read the "
                f"session's step every 0.5 s)."
            )
    released = {
        **{f"{k}, chief with the publisher": v for k, v in tf.get("released_by", {}).items()},
        **{f"{k}, chief untouched": v for k, v in untouched["released_by"].items()},
    }
    parts = [
        f"{name}: " + ", ".join(f"{by} {n}" for by, n in sorted(counts.items()))
        for name, counts in released.items()
        if not name.startswith(("tensorflow", "unconfigured"))
    ]
    early = any(
        "the session's global step" in counts for counts in tf.get("released_by", {}).values()
    )
    if parts:
        lines.append(
            f"- what released stepbarrier's configured hook (`released_by`): {'; '.join(parts)}."
            + (
                " A release by the session's read can come before the chief's note of step K "
                "(the step on the ps moves before the chief's run returns): a latency below 0."
                if early
                else ""
            )
        )
    return lines


def ps_reads_lines(tf: dict[str, Any]) -> list[str]:
    reads = tf.get("ps_reads")
    if not reads:
        return []
    long_waits, trials = reads["long_wait"], reads["trials"]
    lines = [
        "### Parameter-server reads of a waiting worker",
        "",
        "The `session.run` calls the waiter hook makes during its wait, each a read of the "
        "global step on the ps: its `before_run` is handed a `SessionRunContext` whose session "
        "is the `MonitoredTrainingSession`'s own behind a proxy that counts and times `run` "
        "(nothing else is counted: not the session's other runs, not Redis). One long wait, "
        "the cases at once in one worker process (each in its own thread, graph and session), "
        "for the same step, chief step 200ms, the chief publishing (the untouched case waits "
        "on a job no publisher writes):",
        "",
        "| waiter hook | wait (s) | PS reads | reads/s | / TensorFlow's | median gap (s) "
        "| reads at (s) | released by |",
        "|---|---|---|---|---|---|---|---|",
    ]
    base = long_waits.get("tensorflow@publisher", {}).get("reads_per_s")
    for name, label in READ_CASES.items():
        wait = long_waits.get(name)
        if not wait:
            continue
        shown = wait["read_at_s"] if len(wait["read_at_s"]) <= 8 else wait["read_at_s"][:4]
        first = ", ".join(f"{t:.2f}" for t in shown)
        more = ", ..." if len(shown) < len(wait["read_at_s"]) else ""
        lines.append(
            f"| {label} | {wait['seconds']:.1f} | {wait['reads']} | {wait['reads_per_s']:.2f} | "
            f"{ratio(wait['reads_per_s'], base)} | {fmt(wait['gap_s'].get('median'))} | "
            f"{first}{more} | {wait['released_by'] or '-'} |"
        )
    lines += [
        "",
        "In the wake-latency trials above (waits of about a second: the read before Redis is "
        "touched, and the one 0.5 s later, scheduled before the chief was seen, dominate):",
        "",
        "| waiter hook | waits | wait (s), median | PS reads per wait, median | max "
        "| reads per second of waiting | / TensorFlow's |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in READ_CASES.items():
        case = trials.get(name)
        if not case or not case["waits"]:
            continue
        tf_rate = trials.get(f"tensorflow@{name.split('@')[1]}", {}).get("reads_per_s")
        per_wait, rate = case["reads_per_wait"], case["reads_per_s"]
        lines.append(
            f"| {label} | {case['waits']} | {fmt(case['wait_s']['median'])} | "
            f"{fmt(per_wait['median'], 0)} | {fmt(per_wait['max'], 0)} | "
            f"{fmt(rate)} | {ratio(rate, tf_rate)} |"
        )
    lines.append("")
    with_publisher = long_waits.get("stepbarrier@publisher")
    untouched = long_waits.get("stepbarrier@untouched")
    if base and with_publisher and untouched:
        at = with_publisher["read_at_s"]
        gaps = [b - a for a, b in itertools.pairwise(at)]
        early = next((i for i, gap in enumerate(gaps) if gap > 1.0), len(gaps)) + 1
        later = sorted(gaps[early - 1 :])
        pace = (
            f", then one every {later[len(later) // 2]:.1f} s (the median gap after those)"
            if later
            else ""
        )
        lines += [
            f"- A waiting worker reads the ps {base:.2f} times a second with TensorFlow's hook; "
            f"with stepbarrier's and a publisher on the chief {with_publisher['reads_per_s']:.2f} "
            f"times ({ratio(with_publisher['reads_per_s'], base)} TensorFlow's): {early} reads "
            f"about 0.5 s apart from the start of the wait (the first before Redis is touched; "
            f"the pace slows once a write of the chief was seen){pace}; with the chief untouched "
            f"{untouched['reads_per_s']:.2f} times ({ratio(untouched['reads_per_s'], base)}), "
            f"as TensorFlow's hook.",
            "",
        ]
    return lines


def tf_run_lines(tf: dict[str, Any], run: dict[str, Any] | None) -> list[str]:
    if "commit" not in tf:
        return []
    alone = run is not None and run.get("commit") != tf["commit"]
    return [
        f"The TF job (sections 1-2 and 4): `python -m bench.tf_job"
        f"{' --quick' if tf['quick'] else ''}`, commit {tf['commit']}"
        + (" with uncommitted changes in stepbarrier/" if tf.get("dirty") else "")
        + f", {tf['seconds']:.0f} s, load average before {_plain(tf['load_before'])}, after "
        f"{_plain(tf['load_after'])}; {tf['trials_per_hook_and_period']} trials per hook and "
        "period, "
        f"{tf.get('untouched_trials_per_hook')} per hook with the chief untouched."
        + (
            f" It ran on its own, not in the `{run['command']}` run of the other sections "
            f"(commit {run['commit']}): the lines and targets that divide its numbers by "
            f"theirs (the TF hook / floor) mix two runs."
            if alone and run is not None
            else ""
        ),
        "",
    ]


def fanout_section(fanout: dict[str, Any] | None) -> list[str]:
    if not fanout:
        return []
    lines = [
        "## 3. Fan-out: one step releases N waiters (ms until the last one wakes)",
        "",
        "| waiters | processes | trials | median | p90 | p99 | max | median of the median wake |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in fanout["runs"]:
        s, m = run["last_wake_ms"], run["median_wake_ms"]
        lines.append(
            f"| {run['waiters']} | {run['processes']} | {run['trials']} | {fmt(s['median'])} | "
            f"{fmt(s['p90'])} | {fmt(s['p99'])} | {fmt(s['max'])} | {fmt(m['median'])} |"
        )
        if run["errors"]:
            lines.append(f"| errors: {run['errors'][:3]} |")
    lines.append("")
    return lines


def chief_section(tf: dict[str, Any] | None, publish: dict[str, Any] | None) -> list[str]:
    lines = ["## 4. The chief's cost", ""]
    if tf and "chief_steps_per_s" in tf:
        lines += [
            "TF chief training as fast as it can (tiny model, ps on loopback), one session, "
            "blocks of 25 steps rotating between the cases; steps/s per block:",
            "",
            STATS_HEADER,
        ]
        names = {
            "without": "no hook",
            "fetch_only": "a hook that only fetches the global-step variable",
            "with_every": "`GlobalStepPublisherHook` fetching with every run",
            "with": "`GlobalStepPublisherHook` (as shipped: fetches skipped far from targets)",
            "defaults": "`MonitoredTrainingSession`'s default hooks (step counter, summaries)",
            "defaults_with_every": "default hooks + publisher hook fetching with every run",
            "defaults_with": "default hooks + `GlobalStepPublisherHook` (as shipped)",
        }
        kinds = [k for k in names if k in tf["chief_steps_per_s"]]
        for kind in kinds:
            lines.append(stats_row(names[kind], tf["chief_steps_per_s"][kind], 0))
        lines.append("")
        for kind in kinds:
            slow = tf.get(f"chief_slowdown_{kind}")
            base_kind = "defaults" if kind.startswith("defaults_") else "without"
            if slow and slow.get("n"):
                base = tf["chief_steps_per_s"][base_kind]["median"]
                extra = 1000 / tf["chief_steps_per_s"][kind]["median"] - 1000 / base
                paired = "across the two sessions" if kind == "defaults" else "paired by round"
                lines.append(
                    f"- slowdown, {names[kind]} vs {names[base_kind]} ({paired}): median "
                    f"{100 * slow['median']:.1f}%, p90 {100 * slow['p90']:.1f}% "
                    f"({extra:+.2f} ms per step at the medians)"
                )
        fetched, runs = tf.get("publisher_fetches") or {}, tf.get("runs_per_case")
        if fetched and runs:
            shares = ", ".join(f"{names.get(k, k)}: {v / runs:.1%}" for k, v in fetched.items())
            lines.append(f"- runs that fetched the global step ({runs:,} runs a case): {shares}")
        lines.append(
            "- the bare cases and the default-hook cases ran in two sessions (the cached "
            "global-step read that the default hooks fetch, and the publisher hook then shares, "
            "exists only in the second); each case is compared within its session."
        )
        lines.append("")
    if publish:
        lines += [
            "`StepPublisher.publish()` in a tight loop (microseconds per call):",
            "",
            "| case | calls | per call, batches of 1,000 (median) | single call median | "
            "single call p99 | writes |",
            "|---|---|---|---|---|---|",
        ]
        for run in publish["runs"]:
            b, s = run["batch_us_per_call"], run["single_call_us"]
            case = "waiters every 10,000 steps" if run["waiters"] else "no waiter"
            lines.append(
                f"| {case} | {run['calls']:,} | {fmt(b['median'], 3)} | {fmt(s['median'], 3)} | "
                f"{fmt(s['p99'], 3)} | {run['writes']} |"
            )
        lines.append("")
    return lines


def load_section(load_result: dict[str, Any] | None) -> list[str]:
    if not load_result:
        return []
    lines = [
        "## 5. Load on Redis",
        "",
        '"Sent" counts the commands that cross the network. Redis\'s `INFO commandstats` '
        "also counts every command a function calls; those are listed as in-script. "
        "A chief's write is one `FCALL`; a waiter's periodic check is an `FCALL` (register) "
        "and an `FCALL_RO` (read) in one pipeline: one round trip.",
        "",
        "| chief steps/s (achieved) | seconds | FCALL sent/s | all sent/s | sent "
        "| in-script commands/s | FCALL allowed (1 + beats + thresholds + close) | verdict |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for run in load_result["chief"]:
        sent = _plain(run["sent"]).replace("|", "\\|")  # a table cell: FUNCTION|LOAD
        lines.append(
            f"| {run['target_rate']:,} ({run['achieved_rate']:,.0f}) | {run['seconds']:.1f} | "
            f"{run['script_calls_per_s']:.2f} | {run['sent_per_s']:.2f} | {sent} | "
            f"{run['in_script_per_s']:.1f} | {run['script_calls_allowed']} | "
            f"{verdict(run['pass'])} |"
        )
    idle = load_result["idle_waiter"]
    lines += [
        "",
        f"Idle waiter over {idle['seconds']:.0f} s: {idle['waiter_round_trips_per_s']:.3f} "
        f"round trips/s ({idle['waiter_commands_per_s']:.3f} commands/s: "
        f"{_plain(idle['waiter_sent'])}), target <= 0.2 round trips/s: {verdict(idle['pass'])}.",
        "",
    ]
    return lines


def scale_section(load_result: dict[str, Any] | None, fanout: dict[str, Any] | None) -> list[str]:
    if not load_result or "capacity" not in load_result:
        return []
    cap = load_result["capacity"]
    # steady state: the writes that are neither the generation's start, nor a
    # crossed threshold, nor close()'s final one
    slowest = load_result["chief"][0]
    beats = slowest["script_calls"] - 2 - slowest["crossed_thresholds"]
    chief_rate = max(beats, 1) / slowest["seconds"]
    idle = max(load_result["idle_waiter"]["waiter_round_trips_per_s"], 1e-9)
    write_cost = 1.0 / cap["chief_write"]["requests_per_s"]
    sync_cost = sum(
        1.0 / cap[part]["requests_per_s"] for part in ("waiter_sync", "waiter_read") if part in cap
    )
    budget = SHARE_OF_CORE
    chief_core = chief_rate * write_cost
    waiter_core = idle * sync_cost
    jobs_cpu = budget / chief_core
    waiters_cpu = budget / waiter_core
    lines = [
        "## 6. Scale on paper",
        "",
        f"Measured here: one Redis core serves {cap['chief_write']['requests_per_s']:,.0f} "
        f"chief writes/s ({cap['chief_write']['server_usec_per_call']:.1f} us inside the "
        f"script), {cap['waiter_sync']['requests_per_s']:,.0f} waiter reads/s "
        f"({cap['waiter_sync']['server_usec_per_call']:.1f} us) and "
        f"{cap['ping']['requests_per_s']:,.0f} PINGs/s (`redis-benchmark`, "
        f"{cap['clients']} connections, no pipelining, on this 2-core machine).",
        "",
        f"- A running job's chief sends {chief_rate:.2f} FCALL/s in steady state (heartbeat "
        f"1 s; plus one per crossed threshold and a BLPOP per registration or 30 s): "
        f"{1e6 * chief_core:.0f} us of Redis CPU per second, {100 * chief_core:.3f}% of a core.",
        f"- A waiting worker makes {idle:.2f} round trips/s (a register and a read in one "
        f"pipeline each): {1e6 * waiter_core:.1f} us/s, "
        f"{100 * waiter_core:.4f}% of a core; a release costs one announcement per job "
        f"(fan-out to N subscribers inside Redis; the announcing script also deletes the "
        f"released workers' registry entries).",
        f"- A job with W workers waiting makes about {chief_rate:.1f} + {idle:.1f} W "
        f"round trips/s (a 100-worker ramp: {chief_rate + 100 * idle:.0f}/s).",
        f"- With {int(100 * budget)}% of one core: about {jobs_cpu:,.0f} concurrent jobs' chiefs, "
        f"or {waiters_cpu:,.0f} waiting workers. CPU is not the limit.",
        f"- Connections are: a chief holds 2 (writes, registration listener), a waiting "
        f"worker 2 (subscription, commands). Redis's default `maxclients` is "
        f"{DEFAULT_MAXCLIENTS:,}: about {DEFAULT_MAXCLIENTS // 2:,} chiefs and waiting workers "
        f"at once; raise `maxclients` and the file-descriptor limit to go further "
        f"(an idle subscribed connection costs Redis "
        f"{cap.get('memory_per_subscriber_bytes', 0) / 1024:.0f} KB, measured).",
        "- Redis Cluster takes over when one server's connections (tens of thousands) or "
        "memory run out, not its CPU. All of a job's keys share the hash tag `{job}`, so "
        "jobs spread over slots, and in cluster mode the announcements are sharded "
        "(`SPUBLISH`/`SSUBSCRIBE`): one costs the job's shard (its master and replicas), "
        "not every node (section 8).",
    ]
    if fanout:
        big = max(fanout["runs"], key=lambda r: r["waiters"])
        lines.append(
            f"- A release of {big['waiters']} waiters took {big['last_wake_ms']['median']:.0f} ms "
            f"(median, until the last one) with all of them on these 2 cores; on separate "
            f"hosts each worker only pays its own wake-up."
        )
    lines.append("")
    return lines


def lateness_section(late: dict[str, Any] | None) -> list[str]:
    if not late:
        return []
    scenario, moves = late["scenario"], late["step_move_per_chief_run"]
    lines = [
        "## 7. Release lateness in asynchronous parameter-server training",
        "",
        f"The other workers move the global step while each chief run is in flight "
        f"(chief runs of {late['chief_run_ms']['median']:.0f} ms, other workers pushing every "
        f"{1000 * scenario['push_pause_s']:.0f} ms: the step moves by {moves['median']:.0f} "
        f"per chief run at the median). Two publisher hooks on the same chief, the same runs "
        f"and the same {late['targets']} targets, one waiting worker per hook and target: "
        f"`GlobalStepPublisherHook` (confirms the step when `step + lead >= threshold`) and "
        f"the previous release's rule (`step + 1 >= threshold`, emulated). In-process "
        f"graph-mode TF session, other workers in a thread, `StepWaiter` threads as workers "
        f"(`python -m bench.async_lateness`). Lateness from the return of the chief's run that "
        f"crossed the target to the worker's release:",
        "",
        STATS_HEADER,
    ]
    names = {
        "previous": "previous rule (`step + 1`)",
        "current": "current `GlobalStepPublisherHook` (`step + lead`)",
    }
    for kind, unit, digits in (
        ("lateness_ms", "ms", 2),
        ("lateness_steps", "steps", 1),
        ("past_target_steps", "steps past the target", 1),
    ):
        for rule in ("previous", "current"):
            lines.append(stats_row(f"{names[rule]}, {unit}", late[kind][rule], digits))
    ratios = late["ratio_previous_over_current"]

    def times(name: str) -> str:
        value = ratios.get(name)
        return "- (current: 0)" if value is None else f"{value:,.1f}x"

    steps = late["lateness_steps"]
    verifications = late["verifications"]
    lines += [
        "",
        f"- previous / current, time: {times('lateness_ms_median')} at the median, "
        f"{times('lateness_ms_p90')} at p90.",
        f"- steps done by the other workers before the release: median "
        f"{steps['previous']['median']:g} vs {steps['current']['median']:g}, p90 "
        f"{steps['previous']['p90']:g} vs {steps['current']['p90']:g} "
        f"(previous / current: {times('lateness_steps_p90')} at p90, "
        f"{times('lateness_steps_mean')} in the mean).",
        f"- released a whole chief run late (more than half a run after the crossing run): "
        f"previous {len(late['released_a_run_late']['previous'])}, current "
        f"{len(late['released_a_run_late']['current'])} of {steps['current']['n']}.",
        f"- extra global-step reads: previous {verifications['previous']}, current "
        f"{verifications['current']} (for {late['targets']} targets, {late['chief_runs']} "
        f"chief runs).",
        f"- dropped trials (registered too late): {_plain(late['dropped'])}; releases below the "
        f"target: {_plain(late['released_early'])}.",
        f"- run: commit {late['commit']}"
        + (" with uncommitted changes in stepbarrier/" if late.get("dirty") else "")
        + f", {late['seconds']:.0f} s, load average before {_plain(late['load_before'])}, after "
        f"{_plain(late['load_after'])}.",
        "",
    ]
    return lines


CLUSTER_ROWS = {
    "stepbarrier": "stepbarrier's announcement (the chief's `FCALL`, `SPUBLISH` inside)",
    "spublish": "raw `SPUBLISH` (sharded)",
    "publish": "raw `PUBLISH` (classic: the cluster forwards it to every node)",
}
ROLE_ORDER = ("owner", "owner's replica", "other master", "other replica")


def cluster_section(result: dict[str, Any] | None) -> list[str]:
    if not result:
        return []
    wake, cost, shape = result["wake"], result["announcement"], result["cluster"]
    nodes = shape["masters"] * (1 + shape["replicas"])
    lines = [
        "## 8. Redis Cluster beside standalone Redis",
        "",
        f"A local Redis Cluster of {shape['masters']} masters and {shape['masters']} "
        f"replicas (redis-server {result['machine']['redis_server']}, "
        f"`cluster-node-timeout` {shape['node_timeout_ms']} ms) and a standalone redis-server, "
        f"both on loopback, measured in turns in the same run (`python -m bench.cluster`). On the "
        f"cluster the job's clients run in cluster mode (`redis_cluster=True`) and the "
        f"announcements are sharded: `SPUBLISH` inside the library's function, the waiter "
        f"`SSUBSCRIBE`d on the owner of the job's slot.",
        "",
        "Wake latency (ms), from just before `publish`/`PUBLISH` to the return of the waiter's "
        "`wait`/`get_message`, in alternating blocks:",
        "",
        STATS_HEADER,
        stats_row("standalone: stepbarrier `publish()` -> `wait()`", wake["standalone_core"]),
        stats_row("cluster: stepbarrier `publish()` -> `wait()`", wake["cluster_core"]),
        stats_row("standalone floor: raw `PUBLISH` -> `get_message`", wake["standalone_floor"]),
        stats_row("cluster floor: raw `SPUBLISH` -> `get_message` (on the owner)",
                  wake["cluster_floor"]),
        "",
        f"- stepbarrier on the cluster / standalone: "
        f"{wake['core_cluster_over_standalone_median']:.2f}x at the median, "
        f"{wake['core_cluster_over_standalone_p90']:.2f}x at p90.",
        f"- raw delivery, `SPUBLISH` on the cluster / `PUBLISH` standalone: "
        f"{wake['floor_cluster_over_standalone_median']:.2f}x at the median, "
        f"{wake['floor_cluster_over_standalone_p90']:.2f}x at p90.",
        "",
    ]  # fmt: skip
    writes = result.get("chief_write_ms")
    if writes:
        lines += [
            "The chief's write, `publish(step)` then `flush()` (ms per write, one after another):",
            "",
            STATS_HEADER,
            stats_row("standalone", writes["standalone"]),
            stats_row("cluster", writes["cluster"]),
            "",
            f"- cluster / standalone: {writes['cluster_over_standalone_median']:.2f}x at the "
            f"median ({writes['cluster']['median'] - writes['standalone']['median']:+.2f} ms). "
            f"redis-py's cluster client asks a node for the keys of each `FCALL` "
            f"(`COMMAND GETKEYS`, counted below) before it sends it.",
            "",
        ]
    lines += [
        "Fan-out: one step releases N waiters (ms until the last one wakes; the trials in "
        "turns of standalone then cluster; Redis CPU per release: the standalone server's, "
        "the job's slot owner's on the cluster):",
        "",
        "| waiters | trials | standalone median | cluster median | cluster / standalone | "
        "standalone p90 | cluster p90 | Redis CPU ms, standalone | Redis CPU ms, cluster owner |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for run in result["fanout"]:
        alone, on_cluster = run["standalone"], run["cluster"]
        a, c = alone["last_wake_ms"], on_cluster["last_wake_ms"]
        cpu_alone = alone["release_cpu_ms"]["redis"]
        cpu_cluster = on_cluster["release_cpu_ms"]["redis"]
        lines.append(
            f"| {run['waiters']} | {alone['trials']} | {fmt(a['median'])} | {fmt(c['median'])} | "
            f"{c['median'] / a['median']:.2f}x | {fmt(a['p90'])} | {fmt(c['p90'])} | "
            f"{fmt(cpu_alone)} | {fmt(cpu_cluster)} |"
        )
        for name, data in (("standalone", alone), ("cluster", on_cluster)):
            if data["errors"]:
                lines.append(f"| errors ({name}): {data['errors'][:3]} |")
    rows = cost["rows"]
    lines += [
        "",
        f"What one announcement costs the cluster ({cost['announcements']:,} of each, one "
        f"round trip each, one subscriber on the owner; the {cost['payload_bytes']}-byte "
        f"message of stepbarrier's last announcement for the raw ones). A node counts as "
        f"involved when it ran the announcing command (or `COMMAND GETKEYS` for it) or "
        f"received it over the cluster bus "
        f"(`CLUSTER INFO` `cluster_stats_messages_publish*_received`). Bytes written "
        f"(`/proc/PID/io` `wchar`: replies, pub/sub messages, replication, cluster bus) and "
        f"CPU (`INFO cpu`) are summed over the {nodes} nodes, less an idle baseline:",
        "",
        f"| per announcement | nodes involved (of {nodes}) | cluster-bus messages sent | "
        "received | bytes written, all nodes | Redis CPU us, all nodes | `COMMAND GETKEYS` |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, label in CLUSTER_ROWS.items():
        row = rows[name]
        lines.append(
            f"| {label} | {row['nodes_involved']} | {row['bus_messages_sent']:.2f} | "
            f"{row['bus_messages_received']:.2f} | {row['bytes_written']:,.0f} | "
            f"{row['cpu_us']:.1f} | {row.get('getkeys', 0):.2f} |"
        )
    lines += [
        "",
        "Cluster-bus messages each node sent + received per announcement:",
        "",
        "| node | " + " | ".join(f"`{name}`" for name in CLUSTER_ROWS) + " |",
        "|---|" + "---|" * len(CLUSTER_ROWS),
    ]
    roles = cost["roles"]
    for port in sorted(roles, key=lambda p: (ROLE_ORDER.index(roles[p]), p)):
        cells = [f"{rows[name]['per_node'][port]['bus_messages']:.2f}" for name in CLUSTER_ROWS]
        lines.append(f"| {roles[port]} | " + " | ".join(cells) + " |")
    ours, spub, pub = rows["stepbarrier"], rows["spublish"], rows["publish"]
    third = (
        " (one more: the node redis-py asked for the keys of the `FCALL`)"
        if ours["nodes_involved"] > spub["nodes_involved"]
        else ""
    )
    lines += [
        "",
        f"- A sharded announcement involves {spub['nodes_involved']} of the {nodes} nodes, "
        f"the job's owner and its replica; stepbarrier's involves {ours['nodes_involved']}"
        f"{third}. A classic `PUBLISH` involves {pub['nodes_involved']} and sends "
        f"{pub['bus_messages_sent']:.0f} cluster-bus messages where `SPUBLISH` sends "
        f"{spub['bus_messages_sent']:.0f}: its cost grows with the number of nodes, a "
        f"sharded one's only with the replicas of one shard.",
        f"- raw `PUBLISH` / raw `SPUBLISH`: {pub['bytes_written'] / spub['bytes_written']:.1f}x "
        f"the bytes written, {pub['cpu_us'] / spub['cpu_us']:.1f}x the Redis CPU.",
        f"- run: commit {result['commit']}"
        + (" with uncommitted changes in stepbarrier/" if result.get("dirty") else "")
        + f", {'quick' if result['quick'] else 'full'} run, {result['seconds']:.0f} s, load "
        f"average before {_plain(result['load_before'])}, after {_plain(result['load_after'])}"
        + (f", at the start of each part: {_plain(result['load'])}" if result.get("load") else "")
        + ".",
        "",
    ]
    return lines


def targets_section(
    tf: dict[str, Any] | None,
    floor: dict[str, Any] | None,
    fanout: dict[str, Any] | None,
    publish: dict[str, Any] | None,
    load_result: dict[str, Any] | None,
    extra: Sequence[tuple[str, ...]] = (),
) -> list[str]:
    rows: list[tuple[str, ...]] = []
    if tf:
        for period in ("10ms", "200ms"):
            s = tf["latency_ms"].get(f"stepbarrier@{period}", {})
            if s.get("n"):
                rows.append(
                    (
                        f"1. stepbarrier hook median <= 2 ms (chief step {period})",
                        f"{s['median']:.2f} ms",
                        verdict(s["median"] <= TARGETS["wake_median_ms"]),
                    )
                )
                rows.append(
                    (
                        f"1. stepbarrier hook p99 <= 10 ms (chief step {period})",
                        f"{s['p99']:.2f} ms",
                        verdict(s["p99"] <= TARGETS["wake_p99_ms"]),
                    )
                )
    if floor:
        ratio = floor["core_over_floor_median"]
        rows.append(
            (
                "2. stepbarrier core median within 2x of the raw pub/sub floor",
                f"{ratio:.2f}x",
                verdict(ratio <= TARGETS["floor_ratio"]),
            )
        )
        if tf:
            s = tf["latency_ms"].get("stepbarrier@10ms", {})
            if s.get("n"):
                ratio = s["median"] / floor["floor_ms"]["median"]
                rows.append(
                    (
                        "2. stepbarrier TF hook median (10 ms steps) within 2x of the floor",
                        f"{ratio:.2f}x",
                        verdict(ratio <= TARGETS["floor_ratio"]),
                    )
                )
    if fanout:
        run = next((r for r in fanout["runs"] if r["waiters"] == 256), None)
        if run:
            median = run["last_wake_ms"]["median"]
            rows.append(
                (
                    "3. 256 waiters: last wake median <= 50 ms",
                    f"{median:.1f} ms",
                    verdict(median <= TARGETS["fanout_256_median_ms"]),
                )
            )
    if tf and tf.get("chief_slowdown_with", {}).get("n"):
        slow = tf["chief_slowdown_with"]["median"]
        rows.append(
            (
                "4. TF chief with `GlobalStepPublisherHook` at most 3% slower",
                f"{100 * slow:.1f}%",
                verdict(slow <= TARGETS["chief_slowdown"]),
            )
        )
    if publish:
        median = max(r["single_call_us"]["median"] for r in publish["runs"])
        rows.append(
            (
                "4. `publish()` median <= 5 us a call",
                f"{median:.3f} us",
                verdict(median <= TARGETS["publish_us"]),
            )
        )
    if load_result:
        for run in load_result["chief"]:
            rows.append(
                (
                    f"5. chief at {run['target_rate']:,} steps/s: FCALL <= heartbeats + "
                    "crossed thresholds",
                    f"{run['script_calls']} <= {run['script_calls_allowed']}",
                    verdict(run["pass"]),
                )
            )
        idle = load_result["idle_waiter"]
        rows.append(
            (
                "5. idle waiter <= 0.2 round trips/s",
                f"{idle['waiter_round_trips_per_s']:.3f}/s",
                verdict(idle["pass"]),
            )
        )
    rows += extra
    lines = ["## Targets", "", "| target | measured | verdict |", "|---|---|---|"]
    lines += [f"| {a} | {b} | {c} |" for a, b, c in rows]
    lines.append("")
    return lines


def plot(tf: dict[str, Any] | None, floor: dict[str, Any] | None, path: Path) -> bool:
    if not tf:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    styles = {
        "tensorflow@10ms": ("TensorFlow GlobalStepWaiterHook, 10 ms steps", "tab:red", "-"),
        "tensorflow@200ms": ("TensorFlow GlobalStepWaiterHook, 200 ms steps", "tab:red", "--"),
        "stepbarrier@10ms": ("stepbarrier GlobalStepWaiterHook, 10 ms steps", "tab:blue", "-"),
        "stepbarrier@200ms": ("stepbarrier GlobalStepWaiterHook, 200 ms steps", "tab:blue", "--"),
    }
    series = {name: tf["samples_ms"].get(name, []) for name in styles}
    untouched = tf.get("untouched") or {}
    for kind, label, color in (
        ("tensorflow", "TensorFlow GlobalStepWaiterHook", "tab:orange"),
        ("stepbarrier", "stepbarrier GlobalStepWaiterHook", "tab:cyan"),
        ("unconfigured", "stepbarrier GlobalStepWaiterHook without STEPBARRIER_JOB", "tab:green"),
    ):
        if kind in untouched.get("samples_ms", {}):
            name = f"untouched:{kind}"
            period = untouched["period_ms"]
            styles[name] = (f"{label}, chief untouched, {period} ms steps", color, "-.")
            series[name] = untouched["samples_ms"][kind]
    if floor:
        styles["floor"] = ("raw redis-py pub/sub delivery (floor)", "tab:gray", ":")
        series["floor"] = floor["floor_samples_ms"]
    for name, (label, color, line) in styles.items():
        values = sorted(max(v, 0.01) for v in series[name])
        if not values:
            continue
        fractions = [(i + 1) / len(values) for i in range(len(values))]
        ax.step(
            values,
            fractions,
            where="post",
            color=color,
            linestyle=line,
            label=f"{label} (n={len(values)})",
        )
    ax.set_xscale("log")
    ax.set_xlabel("wake latency: end of the chief's run reaching step K -> waiter returns (ms)")
    ax.set_ylabel("fraction of trials")
    ax.set_title("Worker wake latency in a TF parameter-server job (loopback, same run)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.2), fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120, bbox_inches="tight")  # the legend is below the axes
    plt.close(fig)
    return True


def machine_section(run: dict[str, Any] | None) -> list[str]:
    if not run:
        return []
    m = run["machine"]
    lines = [
        "## Machine and run",
        "",
        f"- {m['nproc']} CPUs ({m['cpu']}), {m['platform']}",
        f"- Python {m['python']}, redis-server {m['redis_server']}, redis-py {m['redis_py']}, "
        f"hiredis {m['hiredis']}, TensorFlow {run.get('tensorflow', '-')}",
        f"- command: `{run['command']}` ({'quick' if run['quick'] else 'full'} run, "
        f"{run['seconds']:.0f} s), commit {run['commit']}"
        + (" with uncommitted changes" if run.get("dirty") else ""),
        f"- load average (1, 5, 15 min) before: {_plain(run['load_before'])}, after: "
        f"{_plain(run['load_after'])}; per benchmark: {_plain(run['load'])}",
        "",
    ]
    if run.get("failed"):
        lines += [f"- **failed benchmarks**: {run['failed']}", ""]
    for note in run.get("notes", []):  # what happened to the run since, said by hand
        lines += [f"- {note}", ""]
    later = []
    for name in ("fleet", "before_after", "wake_path", "instructions"):
        result = load(name)
        commit = result and (result.get("commit") or result.get("after"))
        if result and commit and commit != run["commit"]:
            later.append(
                f"{name} at {commit}" + (" (uncommitted changes)" if result.get("dirty") else "")
            )
        for part, at in sorted(((result or {}).get("part_commits") or {}).items()):
            if at != commit:
                later.append(f"its part {part} at {at}")
    if later:
        lines += [f"- run on their own since (the sections say so): {', '.join(later)}", ""]
    return lines


BEFORE_AFTER_CASES = {
    "waiter": "a raw announcement -> `StepWaiter.wait` returns (the waiter's side alone)",
    "core": "`publish` (this checkout's chief) -> `StepWaiter.wait` returns",
    "chief": "`publish` -> `StepWaiter.wait` returns, the chief from the same tree",
    "fanout": "one `publish` -> the last of 32 `StepWaiter` threads returns",
    "async": "one `publish` -> the last of 1,000 `AsyncStepWaiter.wait` calls returns",
}


def before_after_section(result: dict[str, Any] | None) -> list[str]:
    """Section 10: ``bench.before_after``'s run, if one was saved."""
    if not result:
        return []
    wake, cpu = result["wake_ms"], result["cpu_us"]
    after = result["after"] + (" with uncommitted changes" if result.get("dirty") else "")
    lines = [
        "## 10. Before and after: the wake path, side by side",
        "",
        f"`python -m bench.before_after`: before = {result['before']}, after = {after}; the "
        "same cases in one run on one redis-server, in alternating blocks (the order of the "
        "two sides swapped every block); the waiting side comes from each tree, and in "
        f"`chief` the chief too. Load average before {_plain(result['load_before'])}, after "
        f"{_plain(result['load_after'])}. The raw floor (`PUBLISH` -> `get_message`): median "
        f"{fmt(wake['floor']['median'], 3)} ms.",
        "",
        "| case | n | before median (ms) | after median (ms) | after/before | after / floor |",
        "|---|---|---|---|---|---|",
    ]
    for case, what in BEFORE_AFTER_CASES.items():
        b, a = wake.get(f"{case} before"), wake.get(f"{case} after")
        if not b or not a:
            continue
        lines.append(
            f"| `{case}`: {what} | {a['n']} | {fmt(b['median'], 3)} | {fmt(a['median'], 3)} | "
            f"{a['median'] / b['median']:.2f} | {a['median'] / wake['floor']['median']:.2f}x |"
        )
    lines += [
        "",
        "CPU per wake, the same run: `wait call` is the CPU time of the waiting thread in one "
        "`wait()` (its registering read, the wake and the return); `chief write` is the "
        "chief's writer thread per write (its mean over a block, heartbeats included), from "
        "the thread's `schedstat`.",
        "",
        "| measure | n | before median (us) | after median (us) | after/before |",
        "|---|---|---|---|---|",
    ]
    for key in sorted({name.rsplit(" ", 1)[0] for name in cpu}):
        b, a = cpu.get(f"{key} before"), cpu.get(f"{key} after")
        if not b or not a:
            continue
        lines.append(
            f"| {key} | {a['n']} | {b['median']:.0f} | {a['median']:.0f} | "
            f"{a['median'] / b['median']:.2f} |"
        )
    lines.append("")
    return lines


def wake_path_section(result: dict[str, Any] | None) -> list[str]:
    """Section 11: where the core wake-up's time goes (``bench.wake_path``)."""
    if not result:
        return []
    points, floor = result["points_ms"], result["floor_ms"]
    lines = [
        "## 11. The core wake-up, split",
        "",
        "`python -m bench.wake_path`: `publish` -> `StepWaiter.wait` returns, timestamped on "
        "the way, beside the raw floor in alternating blocks of the same run. Milliseconds "
        "from just before `publish` (the chief's writer thread and the raw subscriber of the "
        "job's channel are timestamped; the waiter returns in another process):",
        "",
        "| point | n | median | p90 | p99 |",
        "|---|---|---|---|---|",
    ]
    for name, what in (
        ("writer awake", "the chief's writer thread wakes"),
        ("FCALL sent", "its write reaches the socket"),
        ("heard raw", "a raw subscriber of the job's channel has the announcement"),
        ("wait returns", "the waiter's `wait()` returns"),
    ):
        s = points[name]
        lines.append(
            f"| {what} | {s['n']} | {fmt(s['median'], 3)} | {fmt(s['p90'], 3)} | "
            f"{fmt(s['p99'], 3)} |"
        )
    fcall = result["fcall_us_per_call"]
    lines += [
        f"| floor: raw `PUBLISH` -> `get_message` | {floor['n']} | {fmt(floor['median'], 3)} | "
        f"{fmt(floor['p90'], 3)} | {fmt(floor['p99'], 3)} |",
        "",
        f"- Redis's time per `FCALL` of the chief's write (`INFO commandstats`, per block): "
        f"{', '.join(f'{u:.0f}' for u in fcall)} us.",
        "- Everything up to the `FCALL` on the socket is the chief's side: a raw `PUBLISH` "
        "goes out from the caller's thread, while `publish` hands the step to the writer "
        "thread and returns (the training loop never waits for Redis).",
        "",
    ]
    return lines


def progress_section(result: dict[str, Any] | None) -> list[str]:
    """Section 13: what ``ProgressReporter.report(step)`` costs the training thread."""
    if not result:
        return []
    ns = result["ns_per_call"]
    return [
        "## 13. Reporting a task's progress, beside `publish()`",
        "",
        "`python -m bench.progress_cost`: `ProgressReporter.report(step)`, "
        "`StepPublisher.publish(step)` and an empty function, called from one Python loop in "
        f"alternating blocks of {result['calls_per_block']:,} calls, {result['repeats']} "
        "blocks each, against a real redis-server their threads write to meanwhile; the "
        "median nanoseconds per call (wall clock: the instruction counts of section 12 are "
        "the figure load does not blur).",
        "",
        "| call | ns per call (median) |",
        "|---|---|",
        f"| `report(step)` | {ns['report']:.1f} |",
        f"| `publish(step)` | {ns['publish']:.1f} |",
        f"| an empty function | {ns['empty']:.1f} |",
        "",
        f"report / publish: {result['report_over_publish']:.2f}; the reporter wrote "
        f"{result['reporter_writes']} times to Redis in {result['seconds']:.1f} s (at most one "
        "write per interval, whatever the call rate).",
        "",
    ]


def progress_targets(result: dict[str, Any] | None) -> list[tuple[str, ...]]:
    """Issue 38's: ``report()`` under a microsecond and no dearer than ``publish()``."""
    if not result:
        return []
    ns = result["ns_per_call"]
    return [
        (
            "13. `ProgressReporter.report(step)` under 1 us a call",
            f"{ns['report'] / 1000:.3f} us",
            verdict(ns["report"] < 1000),
        ),
        (
            "13. `report(step)` no dearer than `publish(step)`",
            f"{ns['report']:.0f} vs {ns['publish']:.0f} ns = {result['report_over_publish']:.2f}x",
            verdict(result["report_over_publish"] <= 1.0),
        ),
    ]


def main() -> None:
    tf, floor = load("tf_job"), load("wake_floor")
    fanout, publish, load_result = load("fanout"), load("publish_call"), load("redis_load")
    late, run, cluster = load("async_lateness"), load("run"), load("cluster")
    fleet, instructions = load("fleet"), load("instructions")
    if run is not None and tf is not None:
        run["tensorflow"] = tf.get("tensorflow")
    lines = ["# stepbarrier benchmark results", ""]
    lines += machine_section(run)
    progress = load("progress_cost")
    extra = (
        fleet_targets(fleet, tf)
        + instructions_targets(instructions, fleet)
        + progress_targets(progress)
    )
    lines += targets_section(tf, floor, fanout, publish, load_result, extra)
    lines += wake_section(tf, floor, run)
    lines += fanout_section(fanout)
    lines += chief_section(tf, publish)
    lines += load_section(load_result)
    lines += scale_section(load_result, fanout)
    lines += lateness_section(late)
    lines += cluster_section(cluster)
    lines += fleet_section(fleet)
    lines += before_after_section(load("before_after"))
    lines += wake_path_section(load("wake_path"))
    lines += instructions_section(instructions, fleet)
    lines += progress_section(progress)
    plot_fleet(fleet, RESULTS_DIR / "fleet_wake.png")
    if not plot(tf, floor, RESULTS_DIR / "wake_latency.png"):
        lines.append("(no TF results: no plot)")
    (RESULTS_DIR / "results.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
