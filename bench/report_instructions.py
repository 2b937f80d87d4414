"""The instruction-count part of ``results.md`` (``bench.instructions``), with Redis's CPU
per waiter per step (``bench.fleet``'s independent layouts).

``report.py`` calls ``instructions_section`` and ``instructions_targets``.
"""

from __future__ import annotations

import statistics
from typing import Any

INSTRUCTION_TARGETS = {
    "wake": 1.5,
    "whole": 2.5,
    "async": 1.5,
    "redis_cpu": 2.0,
    "follow": 1.1,
    "progress": 1.0,
}
"""stepbarrier / floor at most (issue 35); ``follow`` / ``wait()`` (a yielded step wakes as a
wait does, issue 38) and ``report()`` / ``publish()`` (issue 38) at most."""
REDIS_CPU_LAYOUTS = ("independent-4x16", "independent")
"""The fleet parts whose Redis CPU per release gives the per-waiter figure (64, 1,024)."""


def _waits(count: int, kind: str = "") -> str:
    return f"{count:,} {kind}wait{'s' if count != 1 else ''}"


def _range(low: float, high: float, digits: int = 1) -> str:
    """``low-high``, or one value if they are the same as shown."""
    a, b = f"{low:.{digits}f}", f"{high:.{digits}f}"
    return a if a == b else f"{a}-{b}"


def _verdict(ok: bool) -> str:
    return "pass" if ok else "**MISS**"


def _k(value: float | None) -> str:
    """Instructions in thousands (``139.2k``)."""
    return "-" if value is None else f"{value / 1000:,.1f}k"


def _spread(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    middle = statistics.median(values)
    return f"{100 * (max(values) - min(values)) / middle:.1f}%"


def _ratios(values: list[float]) -> str:
    return ", ".join(f"{v:.2f}" for v in values) or "-"


def redis_cpu_per_waiter(fleet: dict[str, Any] | None, part: str) -> dict[str, Any] | None:
    """Redis's CPU per waiter per step (us) of one fleet layout, each side: its value
    per phase, their mean, and stepbarrier / floor."""
    phases = (fleet or {}).get(part)
    if not phases or "timers_ms_per_s" not in phases["floor"][0]:
        return None  # a run from before the windows took in the next registration
    out: dict[str, Any] = {}
    for side in ("floor", "stepbarrier"):
        values = [
            1000 * phase["release_cpu_ms"]["redis"] / (phase.get("waiters") or phase["subscribers"])
            for phase in phases[side]
        ]
        out[side] = {"runs": values, "mean": statistics.fmean(values)}
    out["waiters"] = phases["stepbarrier"][0]["waiters"]
    out["trials"] = sum(phase["trials"] for phase in phases["stepbarrier"])
    out["ratio"] = out["stepbarrier"]["mean"] / out["floor"]["mean"]
    return out


def _counted(
    label: str, figure: dict[str, Any], target: float | None, sides: tuple[str, str]
) -> dict[str, Any]:
    """A row of instruction counts: ``sides`` (ours, its floor) of one figure of a part."""
    return {
        "label": label,
        "unit": "instructions",
        "ours": figure[sides[0]],
        "floor": figure[sides[1]],
        "ratio": figure["ratio"]["median"],
        "ratios": figure["ratio"]["runs"],
        "target": target,
    }


def _rows(result: dict[str, Any] | None, fleet: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per figure: label, both sides, the ratio per run and overall, its target."""
    rows: list[dict[str, Any]] = []
    result = result or {}
    ours = ("stepbarrier", "floor")
    if "sync" in result:
        for figure, label in (
            ("wake", "threaded wake: the subscription turns readable -> `wait()` returns"),
            ("whole", "a whole `wait()` call"),
        ):
            rows.append(_counted(label, result["sync"][figure], INSTRUCTION_TARGETS[figure], ours))
    for size, entry in sorted(result.get("async", {}).items(), key=lambda item: int(item[0])):
        label = f"asyncio, per released wait, {_waits(int(size), 'concurrent ')}"
        rows.append(_counted(label, entry["per_wait"], INSTRUCTION_TARGETS["async"], ours))
    if "chief" in result:
        rows.append(
            _counted("the chief's write, per step", result["chief"]["per_step"], None, ours)
        )
    if "follow" in result:
        for figure, label in (
            ("wake", "follow, the wake per yielded step (floor: `wait()`'s wake)"),
            ("whole", "follow, one `next()` (floor: one whole `wait()`)"),
        ):
            figures = result["follow"][figure]
            target = INSTRUCTION_TARGETS["follow"]
            rows.append(_counted(label, figures, target, ("follow", "stepbarrier")))
    if "progress" in result:
        label = "`ProgressReporter.report(step)` per call (floor: `publish(step)`)"
        figure = result["progress"]["per_call"]
        rows.append(_counted(label, figure, INSTRUCTION_TARGETS["progress"], ("report", "publish")))
    for part in REDIS_CPU_LAYOUTS:
        cpu = redis_cpu_per_waiter(fleet, part)
        if cpu:
            rows.append(
                {
                    "label": f"Redis CPU per waiter per step, {cpu['waiters']:,} waiters",
                    "unit": "us",
                    "ours": {
                        "median": cpu["stepbarrier"]["mean"],
                        "runs": cpu["stepbarrier"]["runs"],
                    },
                    "floor": {"median": cpu["floor"]["mean"], "runs": cpu["floor"]["runs"]},
                    "ratio": cpu["ratio"],
                    "ratios": [
                        a / b
                        for a, b in zip(
                            cpu["stepbarrier"]["runs"], cpu["floor"]["runs"], strict=False
                        )
                    ],
                    "target": INSTRUCTION_TARGETS["redis_cpu"],
                }
            )
    return rows


def instructions_targets(
    result: dict[str, Any] | None, fleet: dict[str, Any] | None
) -> list[tuple[str, ...]]:
    """Rows for the targets table (issue 35's: stepbarrier / floor at most)."""
    out: list[tuple[str, ...]] = []
    for row in _rows(result, fleet):
        if row["target"] is None or row["ratio"] is None:
            continue
        value = (
            f"{_k(row['ours']['median'])} vs {_k(row['floor']['median'])} = {row['ratio']:.2f}x"
            if row["unit"] == "instructions"
            else f"{row['ours']['median']:.1f} us vs {row['floor']['median']:.1f} us = "
            f"{row['ratio']:.2f}x"
        )
        out.append(
            (
                f"12. {row['label']}: within {row['target']:g}x of the floor",
                value,
                _verdict(row["ratio"] <= row["target"]),
            )
        )
    return out


def _plain(values: list[float]) -> str:
    return " / ".join(f"{v:g}" for v in values)


def _each(figure: dict[str, Any], side: str) -> str:
    """One side's median per run, in whole instructions."""
    return _plain([round(v) for v in figure[side]["runs"]])


def instructions_section(result: dict[str, Any] | None, fleet: dict[str, Any] | None) -> list[str]:
    rows = _rows(result, fleet)
    if not rows:
        return []
    lines = [
        "## 12. Instruction counts and Redis CPU, beside their floors",
        "",
        "User-space instructions counted by Callgrind in the measured process (every thread "
        "of it), between marks the process sets itself: `python -m bench.instructions`, each "
        "figure beside its floor in the same process and run (alternating blocks), both sides "
        "with hiredis; the median over the waits (or releases, or steps) of one run, and the "
        "run repeated"
        + (f" {result['repeats']} times" if result else "")
        + ": the spread is (max - min) / median of the runs' medians, the ratio the median of "
        "the runs' ratios. Redis's CPU per waiter per step: `python -m bench.fleet` (`INFO "
        "cpu`), each release's window until every waiter registered its next wait, Redis's "
        "timers subtracted; the mean over the phases. How each is measured and why "
        "its floor is the floor: [the performance page](../performance.md#how-each-figure-is"
        "-measured).",
        "",
        "| figure | stepbarrier | floor | stepbarrier / floor | ratio per run | spread, "
        "stepbarrier | spread, floor | target | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ours, floor = row["ours"], row["floor"]
        show = _k if row["unit"] == "instructions" else (lambda v: f"{v:.1f} us")
        target = "-" if row["target"] is None else f"<= {row['target']:g}x"
        verdict = (
            "-"
            if row["target"] is None or row["ratio"] is None
            else _verdict(row["ratio"] <= row["target"])
        )
        lines.append(
            f"| {row['label']} | {show(ours['median'])} | {show(floor['median'])} | "
            f"{row['ratio']:.2f}x | {_ratios(row['ratios'])} | {_spread(ours['runs'])} | "
            f"{_spread(floor['runs'])} | {target} | {verdict} |"
        )
    lines.append("")
    if result:
        lines += _details(result)
    lines += _redis_cpu_details(fleet)
    return lines


def _details(result: dict[str, Any]) -> list[str]:
    lines = ["Each run's median, and what was left out:", ""]
    sync = result.get("sync")
    if sync:
        runs = sync["runs"]
        left = sum(run["stepbarrier"]["heartbeat_waits"] for run in runs)
        no_wake = sum(run[side]["no_wake"] for run in runs for side in ("floor", "stepbarrier"))
        lines += [
            f"- threaded wake, stepbarrier: {_each(sync['wake'], 'stepbarrier')}; "
            f"floor: {_each(sync['wake'], 'floor')} "
            f"({sync['waits_per_side']} waits a side per run).",
            f"- whole `wait()`, stepbarrier: {_each(sync['whole'], 'stepbarrier')}; "
            f"floor: {_each(sync['whole'], 'floor')}. Left out of "
            f"the whole call: {left} stepbarrier waits that took in a chief heartbeat before "
            f"their step (a second wake: the heartbeat's cost is a waiting second's, not the "
            f"call's); waits without a wake: {no_wake}.",
            "- the mean of a whole `wait()` (the garbage collector's runs included), "
            "stepbarrier / floor per run: "
            + _ratios(
                [
                    run["stepbarrier"]["whole"]["mean"] / run["floor"]["whole"]["mean"]
                    for run in runs
                ]
            )
            + ".",
        ]
    for size, entry in sorted((result.get("async") or {}).items(), key=lambda i: int(i[0])):
        per = entry["per_wait"]
        lines.append(
            f"- asyncio, {_waits(int(size))}: stepbarrier {_each(per, 'stepbarrier')}; "
            f"floor {_each(per, 'floor')} "
            f"({entry['releases_per_side']} releases a side per run)."
        )
    chief = result.get("chief")
    if chief:
        per = chief["per_step"]
        left = sum(
            run[side]["heartbeat_regions"]
            for run in chief["runs"]
            for side in ("floor", "stepbarrier")
        )
        lines.append(
            f"- the chief, per step: stepbarrier {_each(per, 'stepbarrier')}; "
            f"floor {_each(per, 'floor')} ({chief['steps_per_side']} "
            f"steps a side per run; {left} regions a heartbeat write fell into left out)."
        )
    follow = result.get("follow")
    if follow:
        lines.append(
            f"- follow, per yielded step: {_each(follow['wake'], 'follow')}; `wait()`'s wake: "
            f"{_each(follow['wake'], 'stepbarrier')}; one `next()`: "
            f"{_each(follow['whole'], 'follow')}; one `wait()`: "
            f"{_each(follow['whole'], 'stepbarrier')} ({follow['waits_per_side']} a side per run)."
        )
    progress = result.get("progress")
    if progress:
        per = progress["per_call"]
        lines.append(
            f"- `report(step)` per call: {_each(per, 'report')}; `publish(step)`: "
            f"{_each(per, 'publish')}; an empty function: {_each(per, 'empty')} "
            f"(report / empty per run: {_ratios(progress['report_over_empty']['runs'])})."
        )
    calibrations = sorted(
        {
            round(run["calibration"])
            for key in ("sync", "chief")
            for run in (result.get(key) or {}).get("runs", [])
        }
    )
    machine = result.get("machine", {})
    lines += [
        f"- a region's bounding dumps cost it {_plain(calibrations)} instructions (the median "
        "empty region of each run), subtracted from every region.",
        f"- run: `python -m bench.instructions{' --quick' if result['quick'] else ''}`, commit "
        f"{result['commit']}"
        + (" with uncommitted changes in stepbarrier/" if result.get("dirty") else "")
        + f", {result['seconds']:.0f} s, {result['valgrind']}, Python {machine.get('python')}, "
        f"redis-py {machine.get('redis_py')}, hiredis {machine.get('hiredis')}; load average "
        f"before {_plain(result['load_before'])}, after {_plain(result['load_after'])}.",
        "",
    ]
    return lines


def _redis_cpu_details(fleet: dict[str, Any] | None) -> list[str]:
    lines = []
    for part in REDIS_CPU_LAYOUTS:
        cpu = redis_cpu_per_waiter(fleet, part)
        if not cpu or fleet is None:
            continue
        phases = fleet[part]
        timers = [p["timers_ms_per_s"] for p in phases["floor"]]
        waiting = [p["idle_cpu_ms_per_s"]["redis"] for p in phases["stepbarrier"]]
        beats = sum(p.get("heartbeats_in_windows", 0) for p in phases["stepbarrier"])
        beat = statistics.fmean(p.get("heartbeat_redis_ms", 0) for p in phases["stepbarrier"])
        per_waiter = [1000 * ms / cpu["waiters"] for ms in (min(waiting), max(waiting))]
        lines.append(
            f"- Redis CPU per waiter per step, {cpu['waiters']:,} waiters ({part}), per phase: "
            f"stepbarrier {_plain([round(v, 1) for v in cpu['stepbarrier']['runs']])} us, "
            f"floor {_plain([round(v, 1) for v in cpu['floor']['runs']])} us "
            f"({cpu['trials']} releases a side; Redis's timers, "
            f"{_range(min(timers), max(timers))} ms/s, subtracted; {beats} chief heartbeats "
            f"in stepbarrier's windows, each {beat:.1f} ms of Redis CPU, subtracted). While "
            f"its waiters wait, stepbarrier costs Redis "
            f"{_range(min(waiting), max(waiting))} ms/s in all "
            f"({_range(per_waiter[0], per_waiter[1], 0)} us per waiter per second; the "
            f"floor's waiting waiters cost it nothing but its "
            f"timers)."
        )
    if lines:
        lines.append("")
    return lines
