"""The fleet-scale part of ``results.md`` (``bench.fleet``) and its plot ``fleet_wake.png``.

``report.py`` calls ``fleet_section``, ``fleet_targets`` and ``plot_fleet``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

FLEET_TARGETS = {
    "independent_over_floor": 1.5,
    "async_10000_last_ms": 100.0,
    "status_seconds": 1.0,
    "chief_over_defaults": 0.01,
}


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def _loads(values: list[float]) -> str:
    """A load average as ``0.48 / 2.7 / 7.99``."""
    return " / ".join(f"{v:g}" for v in values)


def _plain_list(values: list[Any] | None) -> str:
    return "-" if not values else ", ".join(str(v) for v in values)


def _verdict(ok: bool) -> str:
    return "pass" if ok else "**MISS**"


def _pooled(phases: list[dict[str, Any]]) -> list[float]:
    return sorted(v for phase in phases for v in phase["last_wake_samples_ms"])


def _median(values: list[float]) -> float:
    data = sorted(values)
    middle = len(data) // 2
    return data[middle] if len(data) % 2 else (data[middle - 1] + data[middle]) / 2


INDEPENDENT_PARTS = ("independent", "independent-16x64", "independent-4x16")
"""The layouts of independent waiters ``bench.fleet`` measures (its ``LAYOUTS``)."""
LATENCY_TARGET_PARTS = ("independent", "independent-16x64")
"""The layouts of 1,024 waiters the last-wake target is about."""


def _layout(phase: dict[str, Any]) -> str:
    return f"{phase['processes']} processes of {phase['waiters'] // phase['processes']}"


def independent_ratio(
    fleet: dict[str, Any], name: str = "independent"
) -> tuple[float, float, float] | None:
    """(stepbarrier, floor, ratio) of the median last wake, all trials pooled."""
    part = fleet.get(name)
    if not part:
        return None
    ours, floor = _median(_pooled(part["stepbarrier"])), _median(_pooled(part["floor"]))
    return ours, floor, ours / floor


def fleet_targets(fleet: dict[str, Any] | None, tf: dict[str, Any] | None) -> list[tuple[str, ...]]:
    """Rows for the targets table."""
    rows: list[tuple[str, ...]] = []
    if fleet:
        for name in LATENCY_TARGET_PARTS:
            ratio = independent_ratio(fleet, name)
            if ratio:
                first = fleet[name]["stepbarrier"][0]
                rows.append(
                    (
                        f"9. {first['waiters']:,} independent waiters ({_layout(first)}): last "
                        "wake within 1.5x of the raw floor",
                        f"{ratio[0]:.0f} ms vs {ratio[1]:.0f} ms = {ratio[2]:.2f}x",
                        _verdict(ratio[2] <= FLEET_TARGETS["independent_over_floor"]),
                    )
                )
        run = fleet.get("async")
        if run:
            last = run["last_wake_ms"]["median"]
            rows.append(
                (
                    f"9. {run['waiters']:,} concurrent async waits: the last wakes within 100 ms",
                    f"median {last:.0f} ms, max {run['last_wake_ms']['max']:.0f} ms",
                    _verdict(last <= FLEET_TARGETS["async_10000_last_ms"]),
                )
            )
        dist = fleet.get("distinct")
        if dist:
            status = dist["status"]
            worst = max(status[k]["seconds"]["max"] for k in ("read_status", "read_overview"))
            cli = max(status[k]["seconds"]["max"] for k in ("cli_status", "cli_status_json"))
            scans = sum(
                status[k]["commands_per_call"].get(c, 0) for k in status for c in ("scan", "keys")
            )
            rows.append(
                (
                    f"9. `status` over {dist['waiters']:,} waiters within 1 s, no SCAN",
                    f"library {worst:.2f} s, CLI {cli:.2f} s (with start-up); SCAN/KEYS {scans:g}",
                    _verdict(worst <= FLEET_TARGETS["status_seconds"] and scans == 0),
                )
            )
            rows.append(
                (
                    f"9. chief with {dist['distinct_targets']:,} distinct targets: writes <= "
                    "heartbeats + crossed thresholds",
                    f"{dist['writes']:,} <= {dist['writes_allowed']:,}",
                    _verdict(dist["writes"] <= dist["writes_allowed"]),
                )
            )
    if tf and tf.get("chief_slowdown_defaults_with", {}).get("n"):
        slow = tf["chief_slowdown_defaults_with"]["median"]
        rows.append(
            (
                "4. TF chief with default hooks: `GlobalStepPublisherHook` at most 1% slower",
                f"{100 * slow:.1f}%",
                _verdict(slow <= FLEET_TARGETS["chief_over_defaults"]),
            )
        )
    return rows


def _cpu_cells(phase: dict[str, Any]) -> str:
    """Redis's and the waiters' CPU per release (the next registration included)."""
    cpu = phase["release_cpu_ms"]
    return f"{cpu['redis']:.1f} ms | {cpu['waiters']:.0f} ms"


def _new_windows(phases: list[dict[str, Any]]) -> bool:
    """The phases' CPU windows took in the next wait's registration (this method)."""
    return all("timers_ms_per_s" in phase for phase in phases)


def _cpu_means(phases: list[dict[str, Any]]) -> tuple[float, float]:
    """Redis's and the waiters' CPU per release (ms), the mean over ``phases``."""
    return (
        sum(p["release_cpu_ms"]["redis"] for p in phases) / len(phases),
        sum(p["release_cpu_ms"]["waiters"] for p in phases) / len(phases),
    )


CPU_NOTE = (
    "CPU per release: from just before `publish`/`PUBLISH` until every waiter is ready for "
    "the next trial (stepbarrier's: its next wait registered in Redis's index; the floor's: "
    "its next `GET` answered), so the next wait's registration is in it; Redis's from `INFO "
    "cpu`, less what its own timers cost in as long (measured while the floor's waiters "
    "wait), and less what a chief heartbeat costs it where one fell into the window (a "
    "heartbeat is a cost per second of waiting, not per step: below); the waiters' from "
    "every thread's `schedstat` (nanoseconds), as measured."
)


def _waiting_line(ours: list[dict[str, Any]], floor: list[dict[str, Any]]) -> str:
    """What a second of waiting costs each side, and what the CPU means left out."""
    idle_ours = [p["idle_cpu_ms_per_s"] for p in ours]
    idle_floor = [p["idle_cpu_ms_per_s"] for p in floor]
    beats = sum(p.get("heartbeats_in_windows", 0) for p in ours)
    windows = sum(p["trials"] for p in ours)
    cost = ", ".join(f"{p.get('heartbeat_redis_ms', 0):.1f}" for p in ours)
    return (
        "- a second of waiting (every waiter waiting, each phase): Redis "
        + ", ".join(f"{i['redis']:.1f}" for i in idle_ours)
        + " ms (floor: "
        + ", ".join(f"{i['redis']:.1f}" for i in idle_floor)
        + ", its timers alone), the waiters "
        + ", ".join(f"{i['waiters']:.0f}" for i in idle_ours)
        + " ms (floor: "
        + ", ".join(f"{i['waiters']:.0f}" for i in idle_floor)
        + f"); chief heartbeats in stepbarrier's {windows} windows: {beats}, one costing "
        + f"Redis {cost} ms (each phase; subtracted from its window's Redis CPU); "
        + "released by a read rather than the announcement: stepbarrier "
        + f"{sum(p.get('released_by_read', 0) for p in ours)}, floor "
        + f"{sum(p.get('released_by_read', 0) for p in floor)}."
    )


def _independent_lines(fleet: dict[str, Any], name: str) -> list[str]:
    """The table and notes of one ``independent`` layout (none if it did not run)."""
    part = fleet.get(name)
    lines: list[str] = []
    if part:
        ours, floor = part["stepbarrier"], part["floor"]
        first = ours[0]
        new = _new_windows(ours + floor)
        floor_what = (
            "as many raw waiters in the same layout (each reads the stored step with `GET`, "
            "then waits on a subscription it keeps), released by one `SET` + `PUBLISH`"
            if new
            else "as many redis-py subscriptions in the same layout, one `PUBLISH`"
        )
        lines += [
            f"**Independent waiters, {_layout(first)}.** {first['waiters']:,} `StepWaiter` "
            "threads, each with its own subscription and command connection, against the raw "
            f"floor: {floor_what}. Phases alternate, floor first:",
            "",
            "| phase | trials | last wake median | p90 | max | median wake (median) | "
            "Redis CPU per release | waiters' CPU per release |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for floor_phase, our_phase in zip(floor, ours, strict=False):
            for label, phase in (("raw floor", floor_phase), ("stepbarrier", our_phase)):
                s, m = phase["last_wake_ms"], phase["median_wake_ms"]
                lines.append(
                    f"| {label} | {phase['trials']} | {_fmt(s['median'])} | {_fmt(s['p90'])} | "
                    f"{_fmt(s['max'])} | {_fmt(m['median'])} | {_cpu_cells(phase)} |"
                )
        lines.append("")
        ratio = independent_ratio(fleet, name)
        if ratio:
            target = " (target 1.5x)" if name in LATENCY_TARGET_PARTS else ""
            lines.append(
                f"- all trials pooled: last wake {ratio[0]:.0f} ms vs {ratio[1]:.0f} ms for the "
                f"floor, **{ratio[2]:.2f}x**{target}."
            )
        if new:
            (our_redis, our_waiters), (floor_redis, floor_waiters) = (
                _cpu_means(ours),
                _cpu_means(floor),
            )
            waiters = first["waiters"]
            lines.append(
                f"- CPU per release and the next registration, the mean over the phases: "
                f"Redis {our_redis:.1f} ms against {floor_redis:.1f} ms for the floor "
                f"(**{our_redis / floor_redis:.2f}x**; per waiter "
                f"{1000 * our_redis / waiters:.1f} us against {1000 * floor_redis / waiters:.1f} "
                f"us), the waiters {our_waiters:.0f} ms against {floor_waiters:.0f} ms "
                f"(**{our_waiters / floor_waiters:.2f}x**; per waiter "
                f"{1000 * our_waiters / waiters:.0f} us against "
                f"{1000 * floor_waiters / waiters:.0f} us)."
            )
            lines.append(_waiting_line(ours, floor))
        profiles = [p["profile"] for p in ours if p.get("profile")]
        if profiles:
            prof = profiles[-1]
            lines.append(
                f"- wake path, split where the announcement reaches the waiter's thread (last "
                f"phase): the last arrival {prof['arrival_last_ms']['median']:.0f} ms after "
                f"`publish` (median arrival {prof['arrival_median_ms']['median']:.0f} ms), then "
                f"{prof['after_arrival_ms']['median']:.2f} ms (median; p99 "
                f"{prof['after_arrival_ms']['p99']:.1f} ms) from arrival to `wait()`'s return."
            )
        per = first["redis_per_waiter"]
        lines.append(
            f"- Redis per waiting worker: {per['connections']:.2f} connections, "
            f"{per['bytes'] / 1024:.1f} KB (connections' buffers and the registry entry)."
        )
        lines.append("")
    return lines


def fleet_section(fleet: dict[str, Any] | None) -> list[str]:
    if not fleet:
        return []
    lines = [
        "## 9. Fleet scale",
        "",
        f"`python -m bench.fleet`, one redis-server (`maxclients` {fleet['maxclients']:,}), "
        "everything on this machine's 2 cores. Times from just before `publish`/`PUBLISH` to "
        "the last (and the median) waiter's return, per trial, in ms.",
        "",
    ]
    if any(
        _new_windows(phases)
        for phases in (
            *(fleet[n]["stepbarrier"] + fleet[n]["floor"] for n in INDEPENDENT_PARTS if n in fleet),
            [fleet[n] for n in ("async", "async-floor") if n in fleet],
        )
        if phases
    ):
        lines += [CPU_NOTE, ""]
    for name in INDEPENDENT_PARTS:
        lines += _independent_lines(fleet, name)
    run, floor = fleet.get("async"), fleet.get("async-floor")
    if run:
        s, per = run["last_wake_ms"], run["redis_per_waiter"]
        lines += [
            f"**Concurrent async waits.** {run['waiters']:,} `AsyncStepWaiter.wait` calls "
            f"({run['processes']} processes of {run['waiters'] // run['processes']:,}, one "
            f"`AsyncStepWaiter` each), one `publish` releases all; {run['trials']} trials"
            + (
                f"; their floor: as many waits on one shared raw subscription per process "
                f"(its reader task parses each message once and resolves the waits' futures; "
                f"the waits of a round share one `GET`), {floor['trials']} trials"
                if floor
                else ""
            )
            + ":",
            "",
            "| | n | median | p90 | p99 | max |",
            "|---|---|---|---|---|---|",
            f"| last wake (ms) | {s['n']} | {_fmt(s['median'])} | {_fmt(s['p90'])} | "
            f"{_fmt(s['p99'])} | {_fmt(s['max'])} |",
            f"| median wake (ms) | {run['median_wake_ms']['n']} | "
            f"{_fmt(run['median_wake_ms']['median'])} | {_fmt(run['median_wake_ms']['p90'])} | "
            f"{_fmt(run['median_wake_ms']['p99'])} | {_fmt(run['median_wake_ms']['max'])} |",
        ]
        if floor:
            f, m = floor["last_wake_ms"], floor["median_wake_ms"]
            lines += [
                f"| floor: last wake (ms) | {f['n']} | {_fmt(f['median'])} | {_fmt(f['p90'])} | "
                f"{_fmt(f['p99'])} | {_fmt(f['max'])} |",
                f"| floor: median wake (ms) | {m['n']} | {_fmt(m['median'])} | "
                f"{_fmt(m['p90'])} | {_fmt(m['p99'])} | {_fmt(m['max'])} |",
            ]
        lines += [
            "",
            f"- Redis per waiting worker: {per['connections']:.4f} connections "
            f"({run['redis_while_waiting']['clients'] - run['redis_baseline']['clients']} in all, "
            f"the chief's 2 included), {per['bytes']:.0f} bytes (its registry entry and target).",
        ]
        cpu = run["release_cpu_ms"]
        if floor and _new_windows([run, floor]):
            fcpu = floor["release_cpu_ms"]
            lines.append(
                f"- CPU per release and the next registration: Redis {cpu['redis']:.1f} ms "
                f"against {fcpu['redis']:.1f} ms for the floor, the waiter processes "
                f"{cpu['waiters']:.0f} ms against {fcpu['waiters']:.0f} ms "
                f"(**{cpu['waiters'] / fcpu['waiters']:.2f}x**); last wake "
                f"**{s['median'] / floor['last_wake_ms']['median']:.2f}x** the floor's."
            )
            lines.append(_waiting_line([run], [floor]))
        else:
            lines.append(
                f"- CPU per release: Redis {cpu['redis']:.1f} ms (the announcing script "
                f"removes {run['waiters']:,} targets from the index), the waiter processes "
                f"{cpu['waiters']:.0f} ms."
            )
        lines += [
            f"- registration round trips per process, all trials: "
            f"{_plain_list(run.get('round_trips_per_process'))}.",
            "",
        ]
    floor10k = fleet.get("floor10k")
    if floor10k:
        s = floor10k["last_wake_ms"]
        lines += [
            f"**{floor10k['subscribers']:,} raw waiters, each with its own connection** "
            f"(asyncio, {floor10k['processes']} processes; each reads the stored step, then "
            f"waits on its own subscription): last delivery median {_fmt(s['median'])} ms "
            f"(max {_fmt(s['max'])} ms); a release costs Redis "
            f"{floor10k['release_cpu_ms']['redis']:.1f} ms of CPU. What "
            f"{floor10k['subscribers']:,} independent waiters would cost at least; not the "
            f"floor of waits that share a process (that is the shared subscription above).",
            "",
        ]
    dist = fleet.get("distinct")
    if dist:
        late = dist["lateness_ms"]
        lines += [
            f"**The chief with {dist['distinct_targets']:,} distinct targets.** "
            f"{dist['waiters']:,} async waits, one per step from 1 to {dist['waiters']:,}; the "
            f"chief runs through them at {dist['rate_steps_per_s']:,} steps/s "
            f"({dist['seconds']:.1f} s):",
            "",
            f"- writes: {dist['writes']:,} (`FCALL` sent: {dist['fcall_sent']:,}); allowed: 1 + "
            f"{dist['heartbeats']} heartbeats + {dist['crossed_thresholds']:,} crossed "
            f"thresholds + 1 = {dist['writes_allowed']:,}.",
            f"- {dist['released']:,} released, {dist['released_early']} early; from the "
            f"`publish` of a waiter's step to its release: median {late['median']:.1f} ms, p99 "
            f"{late['p99']:.1f} ms, max {late['max']:.1f} ms.",
            f"- errors: {dist['errors'] or 'none'}.",
            "",
            f"`status` over the {dist['waiters']:,} registered waiters (seconds; commands per "
            f"call from `INFO commandstats`, in-script ones included):",
            "",
            "| read | median | max | commands per call |",
            "|---|---|---|---|",
        ]
        labels = {
            "read_status": "`read_status` (every waiter's entry, as `status --json`)",
            "read_overview": "`read_overview` (`status` and each `watch` refresh: summarised)",
            "cli_status": "`stepbarrier status`, a new process",
            "cli_status_json": "`stepbarrier status --json`, a new process",
            "cli_startup": "`stepbarrier --version` (the start-up alone)",
        }
        for key, label in labels.items():
            entry = dist["status"][key]
            sent = entry["commands_per_call"]
            shown = ", ".join(f"{k} {v:g}" for k, v in sorted(sent.items(), key=lambda i: -i[1]))
            lines.append(
                f"| {label} | {entry['seconds']['median']:.3f} | {entry['seconds']['max']:.3f} | "
                f"{shown or '-'} |"
            )
        lines.append("")
    if "commit" in fleet:
        lines.append(
            f"Run: commit {fleet['commit']}"
            + (" with uncommitted changes in stepbarrier/" if fleet.get("dirty") else "")
            + f", {'quick' if fleet['quick'] else 'full'}, {fleet['seconds']:.0f} s, load "
            f"average before {_loads(fleet['load_before'])}, after {_loads(fleet['load_after'])}"
            + "".join(
                f"; {part} at {at}"
                for part, at in sorted(fleet.get("part_commits", {}).items())
                if at != fleet["commit"]
            )
            + "."
        )
        lines.append("")
    lines += ["![fleet wake](fleet_wake.png)", ""]
    return lines


def plot_fleet(fleet: dict[str, Any] | None, path: Path) -> bool:
    if not fleet:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series: list[tuple[str, list[float], str, str]] = []
    for name, color in zip(INDEPENDENT_PARTS, ("tab:blue", "tab:purple", "tab:olive"), strict=True):
        part = fleet.get(name)
        if part:
            first = part["stepbarrier"][0]
            n, layout = first["waiters"], _layout(first)
            series.append(
                (f"{n:,} StepWaiter threads ({layout})", _pooled(part["stepbarrier"]), color, "-")
            )
            series.append(
                (f"raw floor, {n:,} subscriptions ({layout})", _pooled(part["floor"]), color, ":")
            )
    if fleet.get("async"):
        run = fleet["async"]
        series.append(
            (
                f"{run['waiters']:,} AsyncStepWaiter waits ({run['processes']} processes)",
                sorted(run["last_wake_samples_ms"]),
                "tab:green",
                "-",
            )
        )
    if fleet.get("floor10k"):
        run = fleet["floor10k"]
        series.append(
            (
                f"raw floor, {run['subscribers']:,} subscriptions",
                sorted(run["last_wake_samples_ms"]),
                "tab:gray",
                "--",
            )
        )
    fig, ax = plt.subplots(figsize=(9, 5))
    for label, values, color, line in series:
        if values:
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
    ax.set_xlabel("one release: publish -> the last waiter returns (ms)")
    ax.set_ylabel("fraction of trials")
    ax.set_title("Fleet scale on one 2-core machine (loopback, same run)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
