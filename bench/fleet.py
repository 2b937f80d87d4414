"""Fleet scale: thousands of waiters on one Redis.

Parts (``--only`` picks some):

- ``independent``: 1,024 ``StepWaiter`` threads (32 processes of 32), each
  with its own connections, released by one ``publish``; next to the raw
  pub/sub floor with the same number of subscriber connections (32 processes
  of 32 threads, each a redis-py subscription), in alternating phases of the
  same run. Time from just before ``publish``/``PUBLISH`` to the last (and
  the median) waiter's return. ``--profile`` splits each waiter's wake path
  at the arrival of the announcement.
- ``independent-16x64``: the same 1,024 waiters as 16 processes of 64 threads
  (more threads share one interpreter lock), against the floor in that layout.
- ``async``: 10,000 concurrent ``AsyncStepWaiter.wait`` calls (4 processes of
  2,500, one waiter each) released by one ``publish``.
- ``floor10k``: the raw floor at 10,000 subscriber connections (asyncio
  subscribers, 4 processes of 2,500): what one announcement to 10,000
  independent waiters costs Redis.
- ``distinct``: 10,000 async waits for 10,000 distinct steps; the chief runs
  through them at ``RATE`` steps/s; its writes are counted (one per
  heartbeat plus one per crossed threshold at most) and every release is
  checked against the moment the chief handed over its step. Before, the
  reads of ``status``, ``status --json`` and ``watch`` are timed, and their
  commands counted, over a job of 10,000 registered waiters (registered with
  the waiters' own call; none live, so that no waiter's traffic is counted).

Each part reports Redis's CPU per release (``INFO cpu``), the waiter
processes' CPU, and Redis's memory and connections per waiting worker.

Usage: ``python -m bench.fleet [--quick] [--only PART ...] [--no-profile]``;
``--only`` replaces those parts in the saved results and keeps the others.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.client import PubSub

from bench.harness import (
    RESULTS_DIR,
    ROOT,
    RedisServer,
    child_env,
    child_process,
    git,
    load_average,
    ms,
    run_threads,
    save,
    stop_process,
    summarize,
)

STEP_GAP = 10
"""Steps between two trials' targets."""
QUIET = 1.0
"""Seconds a process rests after its waiters woke before it waits again (the
others may still be waking: registering now would take their CPU)."""
FLOOR_CHANNEL = "bench:fleet:floor"
SETTLE = 3.0
"""Seconds between the last subscription and the first trial of a floor phase."""
RATE = 2000
"""Steps per second of the chief in the ``distinct`` part."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PARTS = ("independent", "independent-16x64", "async", "floor10k", "distinct")
LAYOUTS = {"independent": (32, 32), "independent-16x64": (16, 64)}
"""Processes x threads of each ``independent`` part (``--quick``: a quarter of the
processes, half the threads)."""


# -- helper processes ---------------------------------------------------------------


def sync_role(url: str, job: str, threads: int, trials: int, profile: bool) -> None:
    from stepbarrier import BarrierConfig, StepWaiter
    from stepbarrier._redis.subscription import Subscription

    arrived = threading.local()
    if profile:  # when the announcement reached the waiter's thread
        original = Subscription.get_message

        def timed(self: Subscription, timeout: float) -> Any:
            message = original(self, timeout)
            if message is not None:
                arrived.t = time.time()
            return message

        Subscription.get_message = timed  # type: ignore[method-assign]
    config = BarrierConfig(job=job, redis_url=url, task_id=1, stall_timeout=300)
    woke = [[0.0] * trials for _ in range(threads)]
    came = [[0.0] * trials for _ in range(threads)]
    errors: list[str] = []

    def run(index: int) -> None:
        try:
            with StepWaiter(config) as waiter:
                for trial in range(trials):
                    waiter.wait((trial + 1) * STEP_GAP, timeout=300)
                    woke[index][trial] = time.time()
                    came[index][trial] = getattr(arrived, "t", 0.0)
                    time.sleep(QUIET)
        except Exception as exc:
            errors.append(repr(exc))

    run_threads(threads, run)
    print(json.dumps({"woke": woke, "arrived": came if profile else None, "errors": errors}))


def floor_role(url: str, threads: int, trials: int) -> None:
    received = [[0.0] * trials for _ in range(threads)]
    errors: list[str] = []

    def run(index: int) -> None:
        try:
            client = redis.Redis.from_url(url)
            pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
            pubsub.subscribe(FLOOR_CHANNEL)
            seen = 0
            idle_until = time.monotonic() + 600
            while seen < trials and time.monotonic() < idle_until:
                # idle like a waiter: it wakes for a fallback read every 5 s
                message = pubsub.get_message(timeout=5.0)
                if message is not None and message["type"] == "message":
                    received[index][int(message["data"])] = time.time()
                    seen += 1
            pubsub.close()
        except Exception as exc:
            errors.append(repr(exc))

    run_threads(threads, run)
    print(json.dumps({"woke": received, "errors": errors}))


def floor_async_role(url: str, connections: int, trials: int) -> None:
    import redis.asyncio

    async def one(index: int, out: list[list[float]], connecting: asyncio.Semaphore) -> None:
        client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=60)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        async with connecting:  # thousands of connects at once overflow the listen backlog
            await pubsub.subscribe(FLOOR_CHANNEL)
        seen = 0
        while seen < trials:
            message = await pubsub.get_message(timeout=600)
            if message is not None and message["type"] == "message":
                out[index][int(message["data"])] = time.time()
                seen += 1
        await pubsub.aclose()  # type: ignore[no-untyped-call]
        await client.aclose()

    async def main() -> list[list[float]]:
        out = [[0.0] * trials for _ in range(connections)]
        connecting = asyncio.Semaphore(100)
        await asyncio.gather(*(one(i, out, connecting) for i in range(connections)))
        return out

    print(json.dumps({"woke": asyncio.run(main()), "errors": []}))


def aio_role(url: str, job: str, waits: int, trials: int, first: int, stride: int) -> None:
    """``trials`` rounds of ``waits`` concurrent waits for one step each; or, with
    ``trials`` 0, one round of ``waits`` waits for the steps first, first+stride, ..."""
    from stepbarrier import BarrierConfig
    from stepbarrier.aio import AsyncStepWaiter

    config = BarrierConfig(job=job, redis_url=url, task_id=1, stall_timeout=300)

    async def main() -> dict[str, Any]:
        errors: list[str] = []

        async def one(target: int) -> tuple[int, int, float]:
            try:
                step = await waiter.wait(target, timeout=300)
            except Exception as exc:
                errors.append(repr(exc))
                return target, -1, time.time()
            return target, step, time.time()

        async with AsyncStepWaiter(config) as waiter:
            if trials == 0:
                targets = [first + i * stride for i in range(waits)]
                return {"released": await asyncio.gather(*map(one, targets)), "errors": errors}
            by_trial: list[list[float]] = []
            for trial in range(trials):
                results = await asyncio.gather(*(one((trial + 1) * STEP_GAP) for _ in range(waits)))
                by_trial.append([when for _, _, when in results])
                await asyncio.sleep(QUIET)
            woke = [list(per_wait) for per_wait in zip(*by_trial, strict=True)]
            return {"woke": woke, "errors": errors, "round_trips": waiter.round_trips}

    print(json.dumps(asyncio.run(main())))


# -- measurements -------------------------------------------------------------------


def process_cpu(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
        except (OSError, IndexError, ValueError):
            pass
    return total


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"] + info["used_cpu_user"])


def redis_footprint(client: redis.Redis) -> dict[str, int]:
    memory, clients = client.info("memory"), client.info("clients")
    return {"used_memory": memory["used_memory"], "clients": clients["connected_clients"]}


def wait_until(check: Callable[..., object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out: {what}")
        time.sleep(0.01)


def collect(helpers: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    outputs = []
    for helper in helpers:
        out, _ = helper.communicate(timeout=timeout)
        outputs.append(json.loads(out))
    return outputs


def per_trial(outputs: list[dict[str, Any]], key: str, trials: int) -> list[list[float]]:
    by_trial: list[list[float]] = [[] for _ in range(trials)]
    for output in outputs:
        for per_waiter in output[key]:
            for trial, when in enumerate(per_waiter):
                by_trial[trial].append(when)
    return by_trial


def wake_stats(by_trial: list[list[float]], sent: list[float]) -> dict[str, Any]:
    last = [max(w) - sent[t] for t, w in enumerate(by_trial)]
    middle = [sorted(w)[len(w) // 2] - sent[t] for t, w in enumerate(by_trial)]
    return {
        "last_wake_ms": summarize(ms(last)),
        "median_wake_ms": summarize(ms(middle)),
        "last_wake_samples_ms": ms(last),
    }


def floor_phase(
    server: RedisServer, processes: int, threads: int, trials: int, *, asyncio_role: bool = False
) -> dict[str, Any]:
    client = server.client()
    total = processes * threads
    role = "floor-async" if asyncio_role else "floor"
    helpers = [
        child_process("bench.fleet", "--role", role, server.url, str(threads), str(trials))
        for _ in range(processes)
    ]
    sent, cpu = [], []
    try:
        wait_until(lambda: client.pubsub_numsub(FLOOR_CHANNEL)[0][1] >= total, 300, "subscribers")
        time.sleep(SETTLE)  # the helpers' start-up is over, as the waiters' is
        before_footprint = redis_footprint(client)
        for trial in range(trials):
            time.sleep(QUIET)
            cpu_before = (redis_cpu(client), process_cpu([h.pid for h in helpers]))
            sent.append(time.time())
            client.publish(FLOOR_CHANNEL, str(trial))
            time.sleep(QUIET * 0.8)
            cpu_after = (redis_cpu(client), process_cpu([h.pid for h in helpers]))
            cpu.append([a - b for a, b in zip(cpu_after, cpu_before, strict=True)])
        outputs = collect(helpers, 120)
    finally:
        for helper in helpers:
            stop_process(helper)
        client.close()
    result = wake_stats(per_trial(outputs, "woke", trials), sent)
    result.update(
        subscribers=total,
        processes=processes,
        trials=trials,
        errors=[e for o in outputs for e in o["errors"]],
        release_cpu_ms={
            "redis": 1000 * sum(c[0] for c in cpu) / trials,
            "waiters": 1000 * sum(c[1] for c in cpu) / trials,
        },
        redis_with_subscribers=before_footprint,
    )
    return result


def waiters_phase(
    server: RedisServer, processes: int, per_process: int, trials: int, *, kind: str, profile: bool
) -> dict[str, Any]:
    """``kind``: ``"sync"`` (threads, each its own StepWaiter) or ``"aio"``."""
    from stepbarrier import BarrierConfig, StepPublisher

    job = f"fleet-{kind}-{uuid.uuid4().hex[:6]}"
    config = BarrierConfig(job=job, redis_url=server.url, role="chief", task_id=0)
    client = server.client()
    total = processes * per_process
    baseline = redis_footprint(client)
    helpers: list[subprocess.Popen[str]] = []
    sent, cpu, footprints = [], [], []
    try:
        with StepPublisher(config) as publisher:
            publisher.publish(0)
            publisher.flush(10)
            for _ in range(processes):
                if kind == "sync":
                    role = ["sync", server.url, job, str(per_process), str(trials)]
                    role += ["profile"] if profile else []
                else:
                    role = ["aio", server.url, job, str(per_process), str(trials), "0", "0"]
                helpers.append(child_process("bench.fleet", "--role", *role))
            pids = [h.pid for h in helpers]
            for trial in range(trials):
                step = (trial + 1) * STEP_GAP
                wait_until(
                    lambda s=step: (
                        client.zcount(config.keys.targets, s, s) >= total
                        and publisher.next_threshold == s
                    ),
                    300,
                    f"{total} waiters registered for step {step}",
                )
                time.sleep(0.2)  # let the registration traffic settle
                footprints.append(redis_footprint(client))
                cpu_before = (redis_cpu(client), process_cpu(pids))
                sent.append(time.time())
                publisher.publish(step)
                time.sleep(QUIET * 0.8)
                cpu_after = (redis_cpu(client), process_cpu(pids))
                cpu.append([a - b for a, b in zip(cpu_after, cpu_before, strict=True)])
            outputs = collect(helpers, 300)
    finally:
        for helper in helpers:
            stop_process(helper)
        client.close()
    result = wake_stats(per_trial(outputs, "woke", trials), sent)
    waiting = footprints[-1]
    result.update(
        waiters=total,
        processes=processes,
        trials=trials,
        errors=[e for o in outputs for e in o["errors"]][:5],
        release_cpu_ms={
            "redis": 1000 * sum(c[0] for c in cpu) / trials,
            "waiters": 1000 * sum(c[1] for c in cpu) / trials,
        },
        redis_per_waiter={
            "bytes": (waiting["used_memory"] - baseline["used_memory"]) / total,
            "connections": (waiting["clients"] - baseline["clients"] - 2)
            / total,  # less the chief's
        },
        redis_while_waiting=waiting,
        redis_baseline=baseline,
    )
    if kind == "aio":
        result["round_trips_per_process"] = [o.get("round_trips") for o in outputs]
    if profile and kind == "sync":
        arrived = per_trial(outputs, "arrived", trials)
        woke = per_trial(outputs, "woke", trials)
        result["profile"] = {
            "arrival_last_ms": summarize(ms(max(a) - sent[t] for t, a in enumerate(arrived))),
            "arrival_median_ms": summarize(
                ms(sorted(a)[len(a) // 2] - sent[t] for t, a in enumerate(arrived))
            ),
            "after_arrival_ms": summarize(
                ms(
                    w - a
                    for wt, at in zip(woke, arrived, strict=True)
                    for w, a in zip(wt, at, strict=True)
                )
            ),
        }
    return result


def independent(server: RedisServer, part: str, quick: bool, profile: bool) -> dict[str, Any]:
    processes, threads = LAYOUTS[part]
    if quick:
        processes, threads = processes // 4, threads // 2
    trials, blocks = (3, 1) if quick else (8, 2)
    floor: list[dict[str, Any]] = []
    core: list[dict[str, Any]] = []
    for _ in range(blocks):
        floor.append(floor_phase(server, processes, threads, trials))
        core.append(waiters_phase(server, processes, threads, trials, kind="sync", profile=profile))
    return {"floor": floor, "stepbarrier": core}


def async_fleet(server: RedisServer, quick: bool) -> dict[str, Any]:
    processes, waits = (2, 1000) if quick else (4, 2500)
    return waiters_phase(server, processes, waits, 3 if quick else 10, kind="aio", profile=False)


def floor10k(server: RedisServer, quick: bool) -> dict[str, Any]:
    processes, connections = (2, 1000) if quick else (4, 2500)
    return floor_phase(server, processes, connections, 3 if quick else 8, asyncio_role=True)


def status_costs(url: str, job: str, client: redis.Redis) -> dict[str, Any]:
    from stepbarrier import BarrierConfig, read_status
    from stepbarrier._inspect.summary import read_overview

    config = BarrierConfig(job=job, redis_url=url)
    out: dict[str, Any] = {}

    def counted(label: str, action: Callable[..., object], repeat: int = 5) -> None:
        seconds = []
        before = client.info("commandstats")
        for _ in range(repeat):
            started = time.perf_counter()
            action()
            seconds.append(time.perf_counter() - started)
        after = client.info("commandstats")
        sent = {
            name.removeprefix("cmdstat_"): (stats["calls"] - before.get(name, {}).get("calls", 0))
            / repeat
            for name, stats in after.items()
            if stats["calls"] != before.get(name, {}).get("calls", 0)
        }
        out[label] = {"seconds": summarize(seconds), "commands_per_call": sent}

    counted("read_status", lambda: read_status(config))
    counted("read_overview", lambda: read_overview(config))
    env = child_env(STEPBARRIER_REDIS_URL=url, STEPBARRIER_JOB=job)
    command = [sys.executable, "-m", "stepbarrier"]
    for label, args in (("cli_status", ["status"]), ("cli_status_json", ["status", "--json"])):
        counted(
            label,
            lambda a=args: subprocess.run(
                [*command, *a], env=env, cwd=ROOT, capture_output=True, check=True
            ),
            repeat=3,
        )
    counted(
        "cli_startup",
        lambda: subprocess.run([*command, "--version"], env=env, cwd=ROOT, capture_output=True),
        repeat=3,
    )
    return out


def static_fleet(url: str, total: int) -> str:
    """A job with ``total`` registered waiters (their own registration calls, pipelined)
    and none of them live: ``status`` measured without the waiters' own traffic."""
    from stepbarrier import BarrierConfig
    from stepbarrier._redis.functions import RedisCode
    from stepbarrier._worker.links import register_call, registry_entry

    job = f"fleet-status-{uuid.uuid4().hex[:6]}"
    config = BarrierConfig(job=job, redis_url=url, task_id=1)
    code = RedisCode(redis.Redis.from_url(url), config)
    since = time.time()
    calls = [
        register_call(config, f"{i}-{i:08x}", 1 + i, registry_entry(config, 1 + i, since))
        for i in range(total)
    ]
    for start in range(0, total, 1000):
        code.pipeline(calls[start : start + 1000])
    return job


def distinct(server: RedisServer, quick: bool) -> dict[str, Any]:
    from stepbarrier import BarrierConfig, StepPublisher

    processes, total = (2, 2000) if quick else (4, 10_000)
    per_process = total // processes
    job = f"fleet-distinct-{uuid.uuid4().hex[:6]}"
    config = BarrierConfig(job=job, redis_url=server.url, role="chief", task_id=0)
    client = server.client()
    # first, alone on the server: the commands counted are the reads' own
    costs = status_costs(server.url, static_fleet(server.url, total), client)
    helpers = [
        child_process(
            "bench.fleet", "--role", "aio", server.url, job, str(per_process), "0", str(1 + i),
            str(processes),
        )
        for i in range(processes)
    ]  # fmt: skip
    handed: dict[int, float] = {}
    try:
        wait_until(lambda: client.zcard(config.keys.targets) >= total, 300, "registered")
        before = client.info("commandstats")
        started = time.monotonic()
        with StepPublisher(config) as publisher:
            for step in range(total + 1):
                handed[step] = time.time()
                publisher.publish(step)
                pause = started + (step + 1) / RATE - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            publisher.flush(30)
            outputs = collect(helpers, 300)
            writes = publisher.writes
        elapsed = time.monotonic() - started
        after = client.info("commandstats")
    finally:
        for helper in helpers:
            stop_process(helper)
        client.close()
    released = [r for o in outputs for r in o["released"]]
    early = [r for r in released if r[1] < r[0] or r[2] < handed.get(r[0], 0)]
    lateness = [when - handed[target] for target, step, when in released if step >= target]
    fcall = after.get("cmdstat_fcall", {}).get("calls", 0) - before.get("cmdstat_fcall", {}).get(
        "calls", 0
    )
    heartbeats = int(elapsed / config.heartbeat) + 1
    return {
        "waiters": total,
        "distinct_targets": total,
        "rate_steps_per_s": RATE,
        "seconds": elapsed,
        "writes": writes,
        "fcall_sent": fcall,
        "heartbeats": heartbeats,
        "crossed_thresholds": total,
        "writes_allowed": 1 + heartbeats + total + 1,
        "released": len(released),
        "released_early": len(early),
        "errors": [e for o in outputs for e in o["errors"]][:5],
        "lateness_ms": summarize(ms(lateness)),
        "lateness_by_target_samples_ms": [
            round(1000 * (when - handed[target]), 3) for target, _, when in sorted(released)
        ],
        "status": costs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=PARTS)
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="do not split the wake path"
    )
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        role, url, *rest = args.role
        if role == "sync":
            sync_role(url, rest[0], int(rest[1]), int(rest[2]), rest[3:] == ["profile"])
        elif role == "floor":
            floor_role(url, int(rest[0]), int(rest[1]))
        elif role == "floor-async":
            floor_async_role(url, int(rest[0]), int(rest[1]))
        else:
            aio_role(url, rest[0], *map(int, rest[1:5]))
        return
    load_before = load_average()
    started = time.monotonic()
    result: dict[str, Any] = {"benchmark": "fleet", "quick": args.quick}
    saved = RESULTS_DIR / "fleet.json"
    if args.only and saved.exists():
        # --only replaces those parts of the saved run; the others keep theirs,
        # each part with the commit it ran at
        result = json.loads(saved.read_text())
        commits = result.setdefault("part_commits", {})
        for part in PARTS:
            if part in result:
                commits.setdefault(part, result.get("commit"))
    with RedisServer() as server:
        admin = server.client()
        admin.config_set("maxclients", 19_000)  # 10,000 subscribers and more
        maxclients = admin.config_get("maxclients")["maxclients"]
        if maxclients is None:
            raise RuntimeError("redis-server reported no maxclients")
        result["maxclients"] = int(maxclients)
        for part in args.only or PARTS:
            print(f"-- {part}", file=sys.stderr, flush=True)
            if part in LAYOUTS:
                result[part] = independent(server, part, args.quick, args.profile)
            elif part == "async":
                result[part] = async_fleet(server, args.quick)
            elif part == "floor10k":
                result[part] = floor10k(server, args.quick)
            else:
                result[part] = distinct(server, args.quick)
            result.setdefault("part_commits", {})[part] = git("rev-parse", "--short", "HEAD")
            print(json.dumps(brief(result[part]), indent=1), file=sys.stderr, flush=True)
    result.update(
        seconds=time.monotonic() - started,
        load_before=load_before,
        load_after=load_average(),
        commit=git("rev-parse", "--short", "HEAD"),
        dirty=bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
    )
    save("fleet", result)


def brief(data: Any) -> Any:
    """``data`` without its long sample lists (for the console)."""
    if isinstance(data, dict):
        return {k: brief(v) for k, v in data.items() if not k.endswith("samples_ms")}
    if isinstance(data, list):
        return [brief(v) for v in data]
    return data


if __name__ == "__main__":
    main()
