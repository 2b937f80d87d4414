"""The chief's hot path: ``StepPublisher.publish()`` in a tight Python loop.

The publisher is connected to a private redis-server, its background threads
running (a heartbeat write every second). Two cases: no waiter registered, and
waiters registered every 10,000 steps (each crossing wakes the writer thread).
Reported per call: batches of 1,000 calls (time / 1,000), and single calls
timed one by one with ``perf_counter_ns`` (the timer's own cost subtracted).

Usage: ``python -m bench.publish_call [--quick]``.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from bench.harness import RedisServer, load_average, save, summarize

BATCH = 1000
THRESHOLD_EVERY = 10_000


def timer_overhead_ns() -> float:
    clock = time.perf_counter_ns
    samples = []
    for _ in range(100_000):
        start = clock()
        samples.append(clock() - start)
    samples.sort()
    return float(samples[len(samples) // 2])


def measure(server: RedisServer, calls: int, with_waiters: bool) -> dict[str, object]:
    from stepbarrier import BarrierConfig, StepPublisher

    job = f"publish-{uuid.uuid4().hex[:6]}"
    config = BarrierConfig(job=job, redis_url=server.url, role="chief", task_id=0)
    client = server.client()
    if with_waiters:
        keys = config.keys
        targets = range(THRESHOLD_EVERY, calls + 1, THRESHOLD_EVERY)
        client.zadd(keys.targets, {f"bench-{t}": t for t in targets})
        client.rpush(keys.registrations, *targets)
    overhead = timer_overhead_ns()
    clock = time.perf_counter_ns
    batches: list[float] = []
    singles: list[float] = []
    with StepPublisher(config) as publisher:
        publisher.publish(0)
        publisher.flush(5)
        time.sleep(0.2)  # the listener has heard every registration
        publish = publisher.publish
        step = 0
        while step < calls:
            start = clock()
            for value in range(step + 1, step + BATCH + 1):
                publish(value)
            batches.append((clock() - start) / BATCH / 1000.0)
            step += BATCH
        for value in range(step + 1, step + min(calls, 200_000) + 1):
            start = clock()
            publish(value)
            singles.append(max(0.0, clock() - start - overhead) / 1000.0)
        writes = publisher.writes
    client.close()
    return {
        "waiters": with_waiters,
        "calls": calls,
        "writes": writes,
        "timer_overhead_ns": overhead,
        "batch_us_per_call": summarize(batches),
        "single_call_us": summarize(singles),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    calls = 300_000 if args.quick else 2_000_000
    load_before = load_average()
    with RedisServer() as server:
        runs = [measure(server, calls, with_waiters) for with_waiters in (False, True)]
    for run in runs:
        batch, single = run["batch_us_per_call"], run["single_call_us"]
        assert isinstance(batch, dict) and isinstance(single, dict)
        print(
            f"publish() {'with' if run['waiters'] else 'without'} waiters: "
            f"{batch['median']:.3f} us/call (batches), single calls median "
            f"{single['median']:.3f} us, p99 {single['p99']:.3f} us",
            file=sys.stderr,
        )
    save(
        "publish_call",
        {
            "benchmark": "publish_call",
            "quick": args.quick,
            "load_before": load_before,
            "load_after": load_average(),
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
