"""What reporting a task's progress costs the training thread, beside ``publish()``.

``ProgressReporter.report(step)`` and ``StepPublisher.publish(step)`` are both
on the training thread's hot path: each hands a step over to a background
thread and does no I/O. Measured side by side in one process against a real
``redis-server`` (their threads write to it meanwhile), in alternating blocks
of ``CALLS`` calls, ``REPEATS`` times: the median nanoseconds per call of each,
and their ratio, with an empty loop's cost (the floor of any call from Python)
beside them. Also the Redis calls the reporter made: at most one per interval.

Usage: ``python -m bench.progress_cost [--quick]``; results in
``bench/results/progress_cost.json``.
"""

from __future__ import annotations

import argparse
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from bench.harness import RedisServer, machine, save
from stepbarrier import BarrierConfig, ProgressReporter, StepPublisher

CALLS = 200_000
"""Calls per block."""
REPEATS = 15
"""Alternating blocks of each."""


def per_call_ns(call: Callable[[int], None], start: int, calls: int) -> float:
    """Nanoseconds per call of ``call(step)`` over ``calls`` rising steps."""
    began = time.perf_counter_ns()
    for step in range(start, start + calls):
        call(step)
    return (time.perf_counter_ns() - began) / calls


def measure(quick: bool = False) -> dict[str, Any]:
    calls = CALLS // 10 if quick else CALLS
    repeats = 5 if quick else REPEATS
    samples: dict[str, list[float]] = {"report": [], "publish": [], "empty": []}
    with RedisServer() as server:
        job = f"bench-progress-{uuid.uuid4().hex[:8]}"
        chief = BarrierConfig(job=job, redis_url=server.url, role="chief")
        began = time.monotonic()
        with StepPublisher(chief) as publisher, ProgressReporter(chief) as progress:

            def nothing(step: int) -> None:
                pass

            step = 1
            for _ in range(repeats):
                for name, call in (
                    ("report", progress.report),
                    ("publish", publisher.publish),
                    ("empty", nothing),
                ):
                    samples[name].append(per_call_ns(call, step, calls))
                step += calls
            elapsed = time.monotonic() - began
            writes = progress.writes
    medians = {name: statistics.median(values) for name, values in samples.items()}
    return {
        "machine": machine(),
        "calls_per_block": calls,
        "repeats": repeats,
        "ns_per_call": {name: round(value, 1) for name, value in medians.items()},
        "ns_per_call_all": samples,
        "report_over_publish": round(medians["report"] / medians["publish"], 3),
        "reporter_writes": writes,
        "seconds": round(elapsed, 2),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter blocks")
    args = parser.parse_args()
    data = measure(quick=args.quick)
    path = save("progress_cost", data)
    ns = data["ns_per_call"]
    print(
        f"report(): {ns['report']} ns/call, publish(): {ns['publish']} ns/call, "
        f"empty loop: {ns['empty']} ns/call; report/publish = {data['report_over_publish']}; "
        f"{data['reporter_writes']} reporter writes in {data['seconds']} s -> {path}"
    )


if __name__ == "__main__":
    main()
