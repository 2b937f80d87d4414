"""Two checkouts' waiters side by side in one run: wake latency, fan-out, async waits.

The same cases, on one private redis-server, in alternating blocks (so that a
burst of machine noise hits every side alike); the chief is this checkout's,
only the waiting side differs:

* ``floor``: raw ``PUBLISH`` -> ``PubSub.get_message`` (as ``wake_floor.py``).
* ``waiter``: a raw ``PUBLISH`` of a well-formed announcement of a live chief
  -> ``StepWaiter.wait`` returns: the waiter's own wake path, without the
  chief's (its thread, its ``FCALL``).
* ``core``: ``StepPublisher.publish`` -> ``StepWaiter.wait`` (as ``wake_floor.py``).
* ``fanout``: ``THREADS`` independent ``StepWaiter`` threads in one process, one
  ``publish``: until the last wakes.
* ``async``: ``ASYNC_WAITS`` concurrent ``AsyncStepWaiter.wait`` on one loop, one
  ``publish``: until the last returns.

Usage: ``python bench/before_after.py BEFORE_TREE [--quick]``: BEFORE_TREE is a
copy of another checkout's ``stepbarrier`` package's parent directory (e.g. made
with ``git archive HEAD stepbarrier | tar -x -C /tmp/before``); "after" is
this checkout. Prints the medians and the ratios; writes nothing.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import redis
from harness import ROOT, RedisServer, ms, stop_process, summarize
from wake_floor import run_floor_block

GAP_MIN, GAP_MAX = 0.02, 0.06
THREADS = 32
ASYNC_WAITS = 1000


def helper(tree: str, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPBARRIER_")}
    env["PYTHONPATH"] = os.pathsep.join([tree, str(Path(__file__).parent)])
    return subprocess.Popen(
        [sys.executable, __file__, "--helper", *args], stdout=subprocess.PIPE, text=True, env=env
    )


# -- the waiting side (in the helper, from the tree on its PYTHONPATH) -----------------


def wait_role(url: str, job: str, count: int, threads: int) -> None:
    import stepbarrier
    from stepbarrier import BarrierConfig, StepWaiter

    woke: dict[str, float] = {}

    def run(task: int) -> None:
        config = BarrierConfig(job=job, redis_url=url, task_id=task + 1)
        with StepWaiter(config) as waiter:
            for target in range(1, count + 1):
                waiter.wait(target, timeout=30)
                now = time.time()
                key = str(target)
                if woke.get(key, 0.0) < now:
                    woke[key] = now

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    print(json.dumps({"received": woke, "package": stepbarrier.__file__}))


def async_role(url: str, job: str, count: int, waits: int) -> None:
    import stepbarrier
    from stepbarrier import BarrierConfig
    from stepbarrier.aio import AsyncStepWaiter

    woke: dict[str, float] = {}

    async def main() -> None:
        config = BarrierConfig(job=job, redis_url=url, task_id=1)
        async with AsyncStepWaiter(config) as waiter:
            for target in range(1, count + 1):
                await asyncio.gather(*(waiter.wait(target, timeout=30) for _ in range(waits)))
                woke[str(target)] = time.time()

    asyncio.run(main())
    print(json.dumps({"received": woke, "package": stepbarrier.__file__}))


# -- the chief's side (this checkout) ------------------------------------------------


def run_block(
    tree: str, url: str, count: int, *, kind: str, width: int = 1
) -> tuple[list[float], str]:
    """One block of ``count`` trials of ``kind`` (``waiter``, ``core``, ``fanout``, ``async``)."""
    from stepbarrier import BarrierConfig, StepPublisher

    job = f"ba-{uuid.uuid4().hex[:8]}"
    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0)
    client = redis.Redis.from_url(url)
    role = "async" if kind == "async" else "wait"
    process = None
    with StepPublisher(config) as publisher:
        publisher.publish(0)
        publisher.flush(5)
        process = helper(tree, role, url, job, str(count), str(width))
        try:
            sent: dict[int, float] = {}
            generation = beat = 0
            for target in range(1, count + 1):
                deadline = time.monotonic() + 60
                while (  # every wait is registered (and the chief knows the threshold)
                    int(client.zcount(config.keys.targets, target, target)) < width
                    or (kind != "waiter" and publisher.next_threshold != target)
                ):
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the waiters never registered for step {target}")
                    time.sleep(0.001)
                if kind == "waiter" and not generation:
                    state = client.hgetall(config.keys.state)
                    generation = int(state[b"generation"])
                    beat = int(state.get(b"beat", b"0"))
                time.sleep(random.uniform(GAP_MIN, GAP_MAX))
                if kind == "waiter":
                    beat += 1000  # after any of the chief's own heartbeats
                    announcement = {
                        "step": target,
                        "generation": generation,
                        "beat": beat,
                        "vouch": True,
                        "run_id": "",
                    }
                    message = json.dumps(announcement)
                    sent[target] = time.time()
                    client.publish(config.keys.channel, message)
                else:
                    sent[target] = time.time()
                    publisher.publish(target)
            out, _ = process.communicate(timeout=120)
        finally:
            stop_process(process)
            client.close()
    data = json.loads(out)
    received = {int(k): v for k, v in data["received"].items()}
    return [received[t] - sent[t] for t in sorted(received)], data["package"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("before", nargs="?")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--helper", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.helper:
        role, url, job, count, width = args.helper
        if role == "async":
            async_role(url, job, int(count), int(width))
        else:
            wait_role(url, job, int(count), int(width))
        return
    trees = {"before": str(Path(args.before).resolve()), "after": str(ROOT)}
    blocks, per_block = (2, 40) if args.quick else (4, 100)
    cases = {
        "waiter": dict(kind="waiter"),
        "core": dict(kind="core"),
        "fanout": dict(kind="fanout", width=THREADS),
        "async": dict(kind="async", width=ASYNC_WAITS),
    }
    series: dict[str, list[float]] = {"floor": []}
    packages: dict[str, str] = {}
    with RedisServer() as server:
        for block in range(blocks):
            series["floor"] += run_floor_block(server.url, per_block)
            for case, options in cases.items():
                count = per_block if case in ("waiter", "core") else max(10, per_block // 4)
                sides = list(trees.items())
                if block % 2:
                    sides.reverse()
                for side, tree in sides:
                    samples, package = run_block(tree, server.url, count, **options)  # type: ignore[arg-type]
                    series.setdefault(f"{case} {side}", []).extend(samples)
                    packages[side] = package
    floor = summarize(ms(series["floor"]))["median"]
    print(f"packages: {packages}")
    print(f"floor (raw PUBLISH -> get_message): median {floor:.3f} ms")
    for case in cases:
        b = summarize(ms(series[f"{case} before"]))
        a = summarize(ms(series[f"{case} after"]))
        sides = " | ".join(
            f"{name} median {x['median']:.3f} ms p90 {x['p90']:.3f} "
            f"({x['median'] / floor:.2f}x floor)"
            for name, x in (("before", b), ("after", a))
        )
        print(f"{case:7s} {sides} | after/before {a['median'] / b['median']:.2f} (n={a['n']})")


if __name__ == "__main__":
    main()
