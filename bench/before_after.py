"""Two checkouts' waiters side by side in one run: wake latency, fan-out, async waits.

The same cases, on one private redis-server, in alternating blocks (so that a
burst of machine noise hits every side alike); but for ``chief``, the chief is
this checkout's, only the waiting side differs:

* ``floor``: raw ``PUBLISH`` -> ``PubSub.get_message`` (as ``wake_floor.py``).
* ``waiter``: a raw ``PUBLISH`` of a well-formed announcement of a live chief
  -> ``StepWaiter.wait`` returns: the waiter's own wake path, without the
  chief's (its thread, its ``FCALL``).
* ``core``: ``StepPublisher.publish`` -> ``StepWaiter.wait`` (as ``wake_floor.py``).
* ``chief``: the same, with the chief from the tree too (in a helper process):
  both sides of the wake differ. The CPU of one write of the chief's writer
  thread (the write that releases the worker) and of one ``wait`` call of the
  worker's thread (its register, read, wake and return) are measured here.
* ``fanout``: ``THREADS`` independent ``StepWaiter`` threads in one process, one
  ``publish``: until the last wakes.
* ``async``: ``ASYNC_WAITS`` concurrent ``AsyncStepWaiter.wait`` on one loop, one
  ``publish``: until the last returns.

Usage: ``python -m bench.before_after BEFORE_TREE [--quick]``: BEFORE_TREE is a
copy of another checkout's ``stepbarrier`` package's parent directory (e.g. made
with ``git archive HEAD stepbarrier | tar -x -C /tmp/before``); "after" is
this checkout. ``--label`` names BEFORE_TREE (e.g. its commit) in the results.
Prints the medians and the ratios, and writes ``bench/results/before_after.json``
(``quick/`` with ``--quick``), which ``bench.report`` adds to ``results.md``.
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
from typing import Any

import redis

from bench.harness import ROOT, RedisServer, git, load_average, ms, save, stop_process, summarize
from bench.wake_floor import publish_when_registered, run_floor_block

GAP_MIN, GAP_MAX = 0.02, 0.06
THREADS = 32
ASYNC_WAITS = 1000


def helper(tree: str, *args: str) -> subprocess.Popen[str]:
    """``python -m bench.before_after --helper args`` with ``tree``'s ``stepbarrier``.

    ``tree`` comes first on the path and is the working directory (which ``-m``
    puts first on ``sys.path``), so this checkout's ``stepbarrier`` never shadows
    it; ``bench`` is found in this checkout (ROOT) when ``tree`` has none.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPBARRIER_")}
    env["PYTHONPATH"] = os.pathsep.join([tree, str(ROOT)])
    return subprocess.Popen(
        [sys.executable, "-m", "bench.before_after", "--helper", *args],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=tree,
    )


# -- the waiting side (in the helper, from the tree on its PYTHONPATH) -----------------


def wait_role(url: str, job: str, count: int, threads: int) -> None:
    import stepbarrier
    from stepbarrier import BarrierConfig, StepWaiter

    woke: dict[str, float] = {}
    cpu: list[float] = []

    def run(task: int) -> None:
        config = BarrierConfig(job=job, redis_url=url, task_id=task + 1)
        with StepWaiter(config) as waiter:
            for target in range(1, count + 1):
                started = time.thread_time()
                waiter.wait(target, timeout=30)
                now = time.time()
                cpu.append(time.thread_time() - started)
                key = str(target)
                if woke.get(key, 0.0) < now:
                    woke[key] = now

    pool = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for thread in pool:
        thread.start()
    for thread in pool:
        thread.join()
    print(json.dumps({"received": woke, "package": stepbarrier.__file__, "cpu": cpu}))


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


def thread_cpu(native_id: int) -> float:
    """Seconds of CPU a thread of this process has used (Linux schedstat)."""
    path = Path(f"/proc/self/task/{native_id}/schedstat")
    return int(path.read_text().split()[0]) / 1e9


def chief_role(url: str, job: str, count: int) -> None:
    """A chief from the tree on PYTHONPATH: publishes steps 1..count, each once a
    waiter is registered for it; prints when it handed each over, and its writer
    thread's CPU per write."""
    import stepbarrier
    from stepbarrier import BarrierConfig, StepPublisher

    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0)
    with StepPublisher(config) as publisher:
        publisher.publish(0)
        publisher.flush(5)
        print("ready", flush=True)
        writer = next(t for t in threading.enumerate() if t.name.startswith("stepbarrier-pub"))
        assert writer.native_id is not None
        cpu_before, writes_before = thread_cpu(writer.native_id), publisher.writes
        sent = publish_when_registered(publisher, count)
        publisher.flush(5)
        per_write = (thread_cpu(writer.native_id) - cpu_before) / max(
            1, publisher.writes - writes_before
        )
    print(json.dumps({"sent": sent, "package": stepbarrier.__file__, "cpu": [per_write]}))


def run_chief_block(tree: str, url: str, count: int) -> tuple[list[float], dict[str, Any]]:
    """One block of the ``chief`` case: the chief and the waiter both from ``tree``."""
    job = f"ba-{uuid.uuid4().hex[:8]}"
    chief = helper(tree, "chief", url, job, str(count), "1")
    waiter = None
    try:
        assert chief.stdout is not None
        if chief.stdout.readline().strip() != "ready":
            raise RuntimeError("the chief helper did not start")
        waiter = helper(tree, "wait", url, job, str(count), "1")
        waited, _ = waiter.communicate(timeout=120)
        published, _ = chief.communicate(timeout=60)
    finally:
        stop_process(chief)
        if waiter is not None:
            stop_process(waiter)
    chief_data, waiter_data = json.loads(published), json.loads(waited)
    sent = {int(k): v for k, v in chief_data["sent"].items()}
    received = {int(k): v for k, v in waiter_data["received"].items()}
    cpu = {"chief write": chief_data["cpu"], "wait call": waiter_data["cpu"]}
    return [received[t] - sent[t] for t in sorted(received)], {
        "package": waiter_data["package"],
        "cpu": cpu,
    }


# -- the chief's side (this checkout) ------------------------------------------------


def run_block(
    tree: str, url: str, count: int, *, kind: str, width: int = 1
) -> tuple[list[float], dict[str, Any]]:
    """One block of ``count`` trials of ``kind`` (``waiter``, ``core``, ``fanout``, ``async``,
    ``chief``): the wake latencies, and the helper's package and CPU figures."""
    if kind == "chief":
        return run_chief_block(tree, url, count)
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
    cpu = {"wait call": data["cpu"]} if "cpu" in data and width == 1 else {}
    return [received[t] - sent[t] for t in sorted(received)], {
        "package": data["package"],
        "cpu": cpu,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("before", nargs="?")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--label", help="what BEFORE_TREE is (e.g. its commit)")
    parser.add_argument("--helper", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.helper:
        role, url, job, count, width = args.helper
        if role == "async":
            async_role(url, job, int(count), int(width))
        elif role == "chief":
            chief_role(url, job, int(count))
        else:
            wait_role(url, job, int(count), int(width))
        return
    trees = {"before": str(Path(args.before).resolve()), "after": str(ROOT)}
    blocks, per_block = (2, 40) if args.quick else (4, 100)
    cases: dict[str, tuple[str, int]] = {  # case: (kind, width)
        "waiter": ("waiter", 1),
        "core": ("core", 1),
        "chief": ("chief", 1),
        "fanout": ("fanout", THREADS),
        "async": ("async", ASYNC_WAITS),
    }
    load_before = load_average()
    series: dict[str, list[float]] = {"floor": []}
    cpu: dict[str, list[float]] = {}
    packages: dict[str, str] = {}
    with RedisServer() as server:
        for block in range(blocks):
            series["floor"] += run_floor_block(server.url, per_block)
            for case, (kind, width) in cases.items():
                single = case in ("waiter", "core", "chief")
                count = per_block if single else max(10, per_block // 4)
                sides = list(trees.items())
                if block % 2:
                    sides.reverse()
                for side, tree in sides:
                    samples, info = run_block(tree, server.url, count, kind=kind, width=width)
                    series.setdefault(f"{case} {side}", []).extend(samples)
                    packages[side] = info["package"]
                    for what, values in info["cpu"].items():
                        cpu.setdefault(f"{case}: {what} {side}", []).extend(values)
    floor = summarize(ms(series["floor"]))["median"]
    summaries = {name: summarize(ms(values)) for name, values in series.items()}
    cpu_us = {name: summarize([1e6 * v for v in values]) for name, values in cpu.items()}
    save(
        "before_after",
        {
            "benchmark": "before_after",
            "quick": args.quick,
            "before": args.label or trees["before"],
            "after": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
            "load_before": load_before,
            "load_after": load_average(),
            "wake_ms": summaries,
            "cpu_us": cpu_us,
            "widths": {case: width for case, (_, width) in cases.items()},
        },
    )
    print(f"packages: {packages}")
    print(f"floor (raw PUBLISH -> get_message): median {floor:.3f} ms")
    for case in cases:
        b = summarize(ms(series[f"{case} before"]))
        a = summarize(ms(series[f"{case} after"]))
        columns = " | ".join(
            f"{name} median {x['median']:.3f} ms p90 {x['p90']:.3f} "
            f"({x['median'] / floor:.2f}x floor)"
            for name, x in (("before", b), ("after", a))
        )
        print(f"{case:7s} {columns} | after/before {a['median'] / b['median']:.2f} (n={a['n']})")
    print("CPU (us; a write: its mean over the block's writes, heartbeats included):")
    for key in sorted({k.rsplit(" ", 1)[0] for k in cpu}):
        b, a = (summarize([1e6 * v for v in cpu[f"{key} {side}"]]) for side in trees)
        print(
            f"  {key}: before median {b['median']:.0f} us, after {a['median']:.0f} us, "
            f"after/before {a['median'] / b['median']:.2f} (n={a['n']})"
        )


if __name__ == "__main__":
    main()
