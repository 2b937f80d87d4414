"""Instruction counts: stepbarrier's waits and writes beside their floors, with Callgrind.

User-space instructions, counted by Callgrind (``bench.callgrind``) in the
measured process only, between marks that process sets itself; start-up,
imports and set-up are never in a region. Each figure is measured beside its
floor in the same process and run (alternating blocks), both sides with
hiredis, and the run is repeated (``REPEATS``) to show the spread. Every
region is bounded by two dumps; what a dump costs the region (the median of
empty regions, measured in the same process) is subtracted per region.

Parts (``--only`` picks some):

- ``sync``: a ``StepWaiter`` waits in this process's child (under Valgrind);
  this process is the chief (``StepPublisher``) and sends each step once the
  waiter registered for it. Floor: a raw waiter that reads the stored step
  (``GET``) and then waits on a subscription it keeps between waits
  (``get_message``, the payload parsed as JSON, its step compared); this
  process sends its steps with ``SET`` + ``PUBLISH``. Two figures per wait:

  * ``wake``: from the subscription's socket turning readable (the ``poll``
    in redis-py's hiredis parser returns) to the return of ``wait()``;
  * ``whole``: the whole ``wait()`` call (register and read, wait, wake,
    release and leave), blocked time aside (it executes nothing). A wait
    that took in a chief heartbeat before its step (one more wake) is left
    out of ``whole`` (counted as ``heartbeat_waits``).

- ``async``: ``AsyncStepWaiter`` with 1, 64 and 1,024 concurrent waits,
  released by one announcement; per released wait, from the first readiness
  of a socket after the step was sent to the return of the last wait. Floor:
  one shared raw ``redis.asyncio`` subscription whose reader task parses
  each message once and resolves the futures of the waits it reached.
- ``chief``: per step, ``StepPublisher.publish(step)`` and its writer
  thread's write, until ``flush()`` returns (the write stored; every thread
  of the chief's process is counted), a waiter registered for the step (a
  crossed threshold: the chief writes). Floor: a ``SET`` + ``PUBLISH``
  pipeline from the caller's thread. A region a heartbeat write fell into is
  left out (counted).

- ``follow`` (issue 38): as ``sync``, the sides ``StepWaiter.wait`` and
  ``StepWaiter.follow(every=1)`` (each yielded step a wait): ``wake`` per
  yielded step beside ``wait``'s, and ``whole`` (for follow, one ``next()``).
- ``progress`` (issue 38): per call, ``ProgressReporter.report(step)`` beside
  ``StepPublisher.publish(step)`` (no waiter: neither writes) and an empty
  function, in regions of 1,000 calls (every thread counted: a region a
  background heartbeat or report fell into is an outlier the median ignores).

Redis's CPU per waiter per step (the other row of the issue's table) is
measured by ``bench.fleet`` (part ``independent-4x16`` and ``independent``):
``INFO cpu`` over each release and the next wait's registration.

Usage: ``python -m bench.instructions [--quick] [--only PART ...]``; results in
``bench/results/instructions.json`` (``--only`` keeps the other parts' saved
results).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.callgrind import Dump, read_dumps, start_under_callgrind, valgrind_version
from bench.floors import FLOOR_KEY, raw_write
from bench.harness import (
    RESULTS_DIR,
    RedisServer,
    git,
    load_average,
    machine,
    save,
    stop_process,
)

if TYPE_CHECKING:
    from stepbarrier import StepPublisher

PARTS = ("sync", "async", "chief", "follow", "progress")
REPEATS = 3
"""Runs of each part (each its own process under Valgrind): the spread across them
is what the figure repeats within."""
DELAY = 0.15
"""Seconds between a waiter's readiness and the step sent: the waiter (slowed some
50 times by Valgrind) is then blocked on its subscription."""
ASYNC_SIZES = (1, 64, 1024)
SIDES = ("floor", "stepbarrier")
FOLLOW_SIDES = ("stepbarrier", "follow")
"""The ``follow`` part's sides: ``wait`` (named as in ``sync``), then ``follow``."""
PROGRESS_SIDES = ("empty", "publish", "report")


def _wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(0.002)


def _lines(process: Any) -> Iterator[str]:
    assert process.stdout is not None
    for line in process.stdout:
        line = line.strip()
        if line == "done":
            return
        yield line
    raise RuntimeError(f"the driver ended early (exit {process.wait()})")


def _stats(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median": statistics.median(values),
        "mean": statistics.fmean(values),
        "min": min(values),
        "max": max(values),
    }


def _calibration(dumps: list[Dump]) -> float:
    """What one region's bounding dumps cost it (median of the empty regions)."""
    return statistics.median(d.instructions for d in dumps if d.label == "calibration")


def _registered(publisher: StepPublisher, step: int) -> None:
    """Until the chief knows of a waiter for ``step`` (its next threshold)."""
    _wait_until(lambda: publisher.next_threshold == step, 300, f"a waiter for step {step}")


def _chief(url: str, job: str) -> StepPublisher:
    from stepbarrier import BarrierConfig, StepPublisher

    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0)
    publisher = StepPublisher(config)
    publisher.publish(0)
    if not publisher.flush(30):
        raise RuntimeError("the chief's first write did not get through")
    return publisher


# -- sync -----------------------------------------------------------------------------


def sync_figures(dumps: list[Dump], sides: tuple[str, ...] = SIDES) -> dict[str, Any]:
    """Per side: ``wake`` and ``whole`` per wait, less the dumps' cost."""
    overhead = _calibration(dumps)
    out: dict[str, dict[str, list[float]]] = {side: {"wake": [], "whole": []} for side in sides}
    skipped = {side: {"heartbeat_waits": 0, "no_wake": 0} for side in sides}
    segments: list[int] = []
    for dump in dumps:
        if dump.label == "gap":
            segments = []
        elif dump.label == "wake":
            segments.append(dump.instructions)
        elif dump.label in sides:
            wakes = len(segments)
            if wakes == 0:
                skipped[dump.label]["no_wake"] += 1
                continue
            out[dump.label]["wake"].append(dump.instructions - overhead)
            if wakes == 1:
                whole = sum(segments) + dump.instructions - 2 * overhead
                out[dump.label]["whole"].append(whole)
            else:
                skipped[dump.label]["heartbeat_waits"] += 1
    return {
        "calibration": overhead,
        **{
            side: {
                "wake": _stats(out[side]["wake"]),
                "whole": _stats(out[side]["whole"]),
                **skipped[side],
            }
            for side in sides
        },
    }


def sync_run(
    server: RedisServer, count: int, blocks: int, warmup: int, role: str = "sync"
) -> dict[str, Any]:
    job = f"instr-{role}-{uuid.uuid4().hex[:6]}"
    raw = server.client()
    raw.set(FLOOR_KEY, 0)
    publisher = _chief(server.url, job)
    driver = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
            args = (role, server.url, job, str(count), str(blocks), str(warmup))
            driver = start_under_callgrind(Path(tmp), "bench.instruction_drivers", *args)
            for line in _lines(driver):
                side, target = line.split()
                step = int(target)
                if side == "floor":
                    time.sleep(DELAY)
                    raw_write(raw, step)
                else:
                    _registered(publisher, step)
                    time.sleep(DELAY)
                    publisher.publish(step)
            driver.wait(120)
            sides = FOLLOW_SIDES if role == "follow" else SIDES
            return sync_figures(read_dumps(Path(tmp), driver.pid), sides)
    finally:
        stop_process(driver)
        publisher.close()
        raw.close()


# -- progress -------------------------------------------------------------------------


def progress_run(server: RedisServer, blocks: int) -> dict[str, Any]:
    """Per side: instructions per call (the median region, less the dumps' cost)."""
    from bench.instruction_drivers import PROGRESS_CALLS

    job = f"instr-progress-{uuid.uuid4().hex[:6]}"
    driver = None
    try:
        with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
            args = ("progress", server.url, job, str(blocks))
            driver = start_under_callgrind(Path(tmp), "bench.instruction_drivers", *args)
            for _ in _lines(driver):
                pass
            driver.wait(120)
            dumps = read_dumps(Path(tmp), driver.pid)
    finally:
        stop_process(driver)
    overhead = _calibration(dumps)
    return {
        "calibration": overhead,
        "calls_per_region": PROGRESS_CALLS,
        **{
            side: {
                "per_call": _stats(
                    [(d.instructions - overhead) / PROGRESS_CALLS for d in dumps if d.label == side]
                )
            }
            for side in PROGRESS_SIDES
        },
    }


# -- async ----------------------------------------------------------------------------


def async_figures(dumps: list[Dump], wakes: list[list[float]], waits: int) -> dict[str, Any]:
    """Per side: instructions per released wait (the release: from the first wake at
    or after the step was sent to the return of the last wait)."""
    overhead = _calibration(dumps)
    per_wait: dict[str, list[float]] = {side: [] for side in SIDES}
    before_send = {side: 0 for side in SIDES}
    unmarked = {side: 0 for side in SIDES}
    rounds = iter(wakes)
    segments: list[int] = []
    for dump in dumps:
        if dump.label == "gap":
            segments = []
        elif dump.label == "wake":
            segments.append(dump.instructions)
        elif dump.label in (*SIDES, "warmup"):
            offsets = next(rounds)
            segments.append(dump.instructions)
            if dump.label == "warmup":
                continue
            first = next((i for i, offset in enumerate(offsets) if offset >= 0), None)
            if first is None:  # (cannot be: the announcement comes through a select)
                unmarked[dump.label] += 1
                continue
            before_send[dump.label] += first
            released = segments[first + 1 :]
            per_wait[dump.label].append((sum(released) - len(released) * overhead) / waits)
    return {
        "calibration": overhead,
        **{
            side: {
                "per_wait": _stats(per_wait[side]),
                "wakes_before_the_step": before_send[side],
                "releases_without_a_marked_wake": unmarked[side],
            }
            for side in SIDES
        },
    }


def async_run(
    server: RedisServer, waits: int, rounds: int, blocks: int, warmup: int
) -> dict[str, Any]:
    job = f"instr-async-{uuid.uuid4().hex[:6]}"
    raw = server.client()
    raw.set(FLOOR_KEY, 0)
    publisher = _chief(server.url, job)
    driver = None
    wakes: list[list[float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
            args = ("async", server.url, job, str(waits), str(rounds), str(blocks), str(warmup))
            driver = start_under_callgrind(Path(tmp), "bench.instruction_drivers", *args)
            assert driver.stdin is not None
            for line in _lines(driver):
                if line.startswith("wakes"):
                    wakes.append([float(v) for v in line.split()[1:]])
                    continue
                side, target = line.split()
                step = int(target)
                if side == "floor":
                    sent = time.monotonic()
                    raw_write(raw, step)
                else:
                    _registered(publisher, step)
                    sent = time.monotonic()
                    publisher.publish(step)
                driver.stdin.write(f"{sent}\n")
                driver.stdin.flush()
            driver.wait(300)
            return async_figures(read_dumps(Path(tmp), driver.pid), wakes, waits)
    finally:
        stop_process(driver)
        publisher.close()
        raw.close()


# -- chief ----------------------------------------------------------------------------


def chief_figures(dumps: list[Dump], writes: list[tuple[str, int]]) -> dict[str, Any]:
    """Per side: instructions per step, the regions with a heartbeat write left out."""
    overhead = _calibration(dumps)
    per_step: dict[str, list[float]] = {side: [] for side in SIDES}
    heartbeats = {side: 0 for side in SIDES}
    ends = [d for d in dumps if d.label in (*SIDES, "warmup")]
    if len(ends) != len(writes):
        raise RuntimeError(f"{len(ends)} regions, {len(writes)} write counts")
    for dump, (side, wrote) in zip(ends, writes, strict=True):
        if dump.label == "warmup":
            continue
        if wrote != (1 if side == "stepbarrier" else 0):
            heartbeats[side] += 1
            continue
        per_step[side].append(dump.instructions - overhead)
    return {
        "calibration": overhead,
        **{
            side: {"per_step": _stats(per_step[side]), "heartbeat_regions": heartbeats[side]}
            for side in SIDES
        },
    }


def chief_run(server: RedisServer, count: int, blocks: int, warmup: int) -> dict[str, Any]:
    from stepbarrier import BarrierConfig, StepWaiter

    job = f"instr-chief-{uuid.uuid4().hex[:6]}"
    waiter = StepWaiter(BarrierConfig(job=job, redis_url=server.url, task_id=1))
    driver = None
    writes: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    waiting: threading.Thread | None = None

    def wait(step: int) -> None:
        try:
            waiter.wait(step, timeout=300)
        except BaseException as exc:
            errors.append(exc)

    try:
        with tempfile.TemporaryDirectory(prefix="bench-callgrind-") as tmp:
            args = ("chief", server.url, job, str(count), str(blocks), str(warmup))
            driver = start_under_callgrind(Path(tmp), "bench.instruction_drivers", *args)
            for line in _lines(driver):
                kind, value, *_ = [*line.split(), ""]
                if kind == "want":
                    if waiting is not None:
                        waiting.join(300)
                    if errors:
                        raise RuntimeError(f"the chief's waiter failed: {errors[0]!r}")
                    waiting = threading.Thread(target=wait, args=(int(value),), daemon=True)
                    waiting.start()
                elif kind == "wrote":
                    writes.append((value, int(line.split()[2])))
            driver.wait(120)
            return chief_figures(read_dumps(Path(tmp), driver.pid), writes)
    finally:
        stop_process(driver)
        if waiting is not None:
            waiting.join(10)
        waiter.close()


# -- the run --------------------------------------------------------------------------


def repeated(
    runs: list[dict[str, Any]],
    figure: str,
    stat: str = "median",
    sides: tuple[str, ...] = SIDES,
    over: tuple[str, str] = ("stepbarrier", "floor"),
) -> dict[str, Any]:
    """One figure over the repeats: each side's value per run, the median of those,
    their spread ((max - min) / median), and ``over[0] / over[1]`` per run."""
    out: dict[str, Any] = {}
    for side in sides:
        values = [run[side][figure][stat] for run in runs if run[side][figure].get("n")]
        middle = statistics.median(values) if values else None
        out[side] = {
            "runs": values,
            "median": middle,
            "spread": (max(values) - min(values)) / middle if values and middle else None,
        }
    top, bottom = over
    ratios = [
        run[top][figure][stat] / run[bottom][figure][stat]
        for run in runs
        if run[top][figure].get("n") and run[bottom][figure].get("n")
    ]
    out["ratio"] = {
        "runs": ratios,
        "median": statistics.median(ratios) if ratios else None,
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=PARTS)
    args = parser.parse_args()
    quick = args.quick
    repeats = 2 if quick else REPEATS
    started = time.monotonic()
    saved = RESULTS_DIR / "instructions.json"
    result: dict[str, Any] = {}
    if args.only and saved.exists():
        result = json.loads(saved.read_text())
    result.update(benchmark="instructions", quick=quick)
    load_before = load_average()
    parts_load: dict[str, list[float]] = {}
    with RedisServer() as server:
        for part in args.only or PARTS:
            print(f"-- {part}", file=sys.stderr, flush=True)
            parts_load[part] = load_average()
            if part == "sync":
                count, blocks, warmup = (15, 1, 10) if quick else (40, 2, 10)
                runs = [sync_run(server, count, blocks, warmup) for _ in range(repeats)]
                result["sync"] = {
                    "waits_per_side": count * blocks,
                    "runs": runs,
                    "wake": repeated(runs, "wake"),
                    "whole": repeated(runs, "whole"),
                }
            elif part == "async":
                entry: dict[str, Any] = {}
                for waits in ASYNC_SIZES:
                    rounds = 4 if waits >= 1024 else 12
                    rounds, blocks = (max(2, rounds // 4), 1) if quick else (rounds, 2)
                    runs = [async_run(server, waits, rounds, blocks, 2) for _ in range(repeats)]
                    entry[str(waits)] = {
                        "waits": waits,
                        "releases_per_side": rounds * blocks,
                        "runs": runs,
                        "per_wait": repeated(runs, "per_wait"),
                    }
                    print(json.dumps(entry[str(waits)]["per_wait"]), file=sys.stderr, flush=True)
                result["async"] = entry
            elif part == "follow":
                count, blocks, warmup = (15, 1, 10) if quick else (40, 2, 10)
                runs = [sync_run(server, count, blocks, warmup, "follow") for _ in range(repeats)]
                over = ("follow", "stepbarrier")
                result["follow"] = {
                    "waits_per_side": count * blocks,
                    "runs": runs,
                    "wake": repeated(runs, "wake", sides=FOLLOW_SIDES, over=over),
                    "whole": repeated(runs, "whole", sides=FOLLOW_SIDES, over=over),
                }
            elif part == "progress":
                runs = [progress_run(server, 10 if quick else 30) for _ in range(repeats)]
                sides = PROGRESS_SIDES
                result["progress"] = {
                    "runs": runs,
                    "per_call": repeated(runs, "per_call", sides=sides, over=("report", "publish")),
                    "report_over_empty": repeated(
                        runs, "per_call", sides=sides, over=("report", "empty")
                    )["ratio"],
                }
            else:
                count, blocks, warmup = (15, 1, 10) if quick else (40, 2, 10)
                runs = [chief_run(server, count, blocks, warmup) for _ in range(repeats)]
                result["chief"] = {
                    "steps_per_side": count * blocks,
                    "runs": runs,
                    "per_step": repeated(runs, "per_step"),
                }
            if part != "async":
                figures = [
                    k for k in ("wake", "whole", "per_step", "per_call") if k in result[part]
                ]
                for figure in figures:
                    print(json.dumps({figure: result[part][figure]}), file=sys.stderr, flush=True)
            result.setdefault("part_commits", {})[part] = git("rev-parse", "--short", "HEAD")
            save("instructions", result)  # each part as soon as it is measured
    result.update(
        repeats=repeats,
        seconds=time.monotonic() - started,
        load_before=load_before,
        load_after=load_average(),
        load=parts_load,
        valgrind=valgrind_version(),
        machine=machine(),
        commit=git("rev-parse", "--short", "HEAD"),
        dirty=bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
    )
    save("instructions", result)


if __name__ == "__main__":
    main()
