"""Fan-out: N waiters, spread over several processes, released by one step.

For each trial this process (the chief) waits until all N waiters are
registered for the trial's step and the publisher knows that threshold, then
calls ``publish(step)``; each waiter thread notes when its ``wait`` returns.
The latency of a trial is from just before ``publish`` to the last wake-up
(the median wake-up is reported too).

``bench.cluster`` runs the same trials on a Redis Cluster (the job's
clients in cluster mode; Redis's CPU is then the job's slot owner's).

Usage: ``python -m bench.fanout [--quick]``; the waiter role is internal.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from bench.harness import (
    RedisServer,
    child_process,
    load_average,
    ms,
    run_threads,
    save,
    stop_process,
    summarize,
)

STEP_GAP = 10
"""Steps between two trials' targets."""
MAX_PROCESSES = 8
"""Waiter processes at most (2 cores: more only adds scheduling noise)."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
QUIET = 0.5
"""Seconds a woken waiter stays idle before it registers for the next trial."""


def waiter_process(url: str, job: str, threads: int, trials: int, cluster: bool) -> None:
    from stepbarrier import BarrierConfig, StepWaiter

    config = BarrierConfig(
        job=job, redis_url=url, task_id=1, stall_timeout=120, redis_cluster=cluster
    )
    woke: list[list[float]] = [[0.0] * trials for _ in range(threads)]
    errors: list[str] = []

    def run(index: int) -> None:
        try:
            with StepWaiter(config) as waiter:
                for trial in range(trials):
                    waiter.wait((trial + 1) * STEP_GAP, timeout=120)
                    woke[index][trial] = time.time()
                    # A released worker trains; it does not wait again at once.
                    # Registering for the next trial now would steal the CPU
                    # (2 cores) from the waiters of this trial still waking.
                    time.sleep(QUIET)
        except Exception as exc:
            errors.append(repr(exc))

    run_threads(threads, run)
    print(json.dumps({"woke": woke, "errors": errors}))


def cpu_seconds(client: redis.Redis, helpers: list[subprocess.Popen[str]]) -> dict[str, float]:
    """CPU time used so far by redis-server and by the waiter processes."""
    info = client.info("cpu")
    waiters = 0.0
    for helper in helpers:
        try:
            fields = Path(f"/proc/{helper.pid}/stat").read_text().rsplit(")", 1)[1].split()
            waiters += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            pass
    return {"redis": info["used_cpu_sys"] + info["used_cpu_user"], "waiters": waiters}


def fanout_job(waiters: int) -> str:
    """A new job name for one fan-out size."""
    return f"fanout-{waiters}-{uuid.uuid4().hex[:6]}"


def run_fanout(
    url: str,
    waiters: int,
    trials: int,
    *,
    cluster: bool = False,
    job: str | None = None,
    cpu_of: redis.Redis | None = None,
) -> dict[str, object]:
    """One fan-out size on the Redis at ``url`` (``cluster``: a cluster's seed node).

    ``cpu_of`` is the server whose CPU a release is charged (default: ``url``'s;
    on a cluster, pass the owner of ``job``'s slot).
    """
    from stepbarrier import BarrierConfig, StepPublisher

    job = job or fanout_job(waiters)
    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0, redis_cluster=cluster)
    processes = min(waiters, MAX_PROCESSES)
    shares = [waiters // processes + (i < waiters % processes) for i in range(processes)]
    client = RedisCluster.from_url(url) if cluster else redis.Redis.from_url(url)
    cpu_client = cpu_of or redis.Redis.from_url(url)
    helpers = []
    sent: list[float] = []
    cpu: list[dict[str, float]] = []
    try:
        with StepPublisher(config) as publisher:
            publisher.publish(0)
            publisher.flush(5)
            for share in shares:
                role = [url, job, str(share), str(trials), *(["cluster"] if cluster else [])]
                helpers.append(child_process("bench.fanout", "--waiter", *role))
            for trial in range(trials):
                step = (trial + 1) * STEP_GAP
                deadline = time.monotonic() + 120
                while (
                    client.zcount(config.keys.targets, step, step) < waiters
                    or publisher.next_threshold != step
                ):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{waiters} waiters never registered for step {step}")
                    time.sleep(0.005)
                time.sleep(0.05)  # let the registration traffic settle
                cpu_before = cpu_seconds(cpu_client, helpers)
                sent.append(time.time())
                publisher.publish(step)
                # before the woken waiters register again (QUIET), note the CPU
                # the release cost: Redis's, and the waiter processes'
                time.sleep(QUIET * 0.8)
                cpu_after = cpu_seconds(cpu_client, helpers)
                cpu.append({k: cpu_after[k] - cpu_before[k] for k in cpu_before})
            outputs = [helper.communicate(timeout=120)[0] for helper in helpers]
    finally:
        for helper in helpers:
            stop_process(helper)
        client.close()
        if cpu_of is None:
            cpu_client.close()
    woke_by_trial: list[list[float]] = [[] for _ in range(trials)]
    errors: list[str] = []
    for output in outputs:
        data = json.loads(output)
        errors += data["errors"]
        for per_thread in data["woke"]:
            for trial, when in enumerate(per_thread):
                woke_by_trial[trial].append(when)
    last = [max(w) - sent[t] for t, w in enumerate(woke_by_trial)]
    if max(last) > QUIET:
        print(f"warning: a trial took longer than {QUIET} s: trials overlapped", file=sys.stderr)
    middle = [sorted(w)[len(w) // 2] - sent[t] for t, w in enumerate(woke_by_trial)]
    return {
        "waiters": waiters,
        "processes": processes,
        "trials": trials,
        "release_cpu_ms": {
            k: 1000 * sum(c[k] for c in cpu) / len(cpu) for k in ("redis", "waiters")
        },
        "errors": errors,
        "last_wake_ms": summarize(ms(last)),
        "median_wake_ms": summarize(ms(middle)),
        "last_wake_samples_ms": ms(last),
        "median_wake_samples_ms": ms(middle),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--waiter", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.waiter:
        url, job, threads, trials, *mode = args.waiter
        waiter_process(url, job, int(threads), int(trials), cluster=mode == ["cluster"])
        return
    trials = 8 if args.quick else 30
    load_before = load_average()
    runs = []
    with RedisServer() as server:
        for waiters in (1, 16, 64, 256):
            result = run_fanout(server.url, waiters, trials)
            runs.append(result)
            last = result["last_wake_ms"]
            assert isinstance(last, dict)
            cpu = result["release_cpu_ms"]
            assert isinstance(cpu, dict)
            print(
                f"fan-out {waiters:>3}: last wake median {last['median']:.2f} ms, "
                f"p99 {last['p99']:.2f} ms, max {last['max']:.2f} ms; CPU per release: "
                f"redis {cpu['redis']:.1f} ms, waiters {cpu['waiters']:.1f} ms",
                file=sys.stderr,
            )
    save(
        "fanout",
        {
            "benchmark": "fanout",
            "quick": args.quick,
            "load_before": load_before,
            "load_after": load_average(),
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
