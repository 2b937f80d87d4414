"""Load on Redis: what a chief sends at 10, 1,000 and 10,000 steps/s, and an idle waiter.

Each chief rate runs against its own redis-server, which only that chief (and
this script's ``INFO``/``CONFIG`` calls, left out) talks to; commands are
counted from ``INFO commandstats`` deltas. Five waiter targets are registered
across the run (written directly, as a waiter's script would), so the count
also shows the one write per crossed threshold.

Redis counts the commands a function calls in ``commandstats`` too. What
crosses the network is one ``FCALL`` per write (``EVALSHA`` under
``STEPBARRIER_USE_EVAL=1``), so "sent" counts top-level commands (``FCALL``,
``FCALL_RO``, ``BLPOP``, connection set-up) and the in-script commands are
reported separately.

The idle waiter waits for a step that never comes while a chief publishes 10
steps/s on the same server; its commands are the total minus the chief's
writes (the publisher counts them). Its target is in round trips: a waiter's
periodic check is two calls in one pipeline (``FCALL`` to register,
``FCALL_RO`` to read; see ``stepbarrier/_worker/links.py``), so each read that
travelled with a register counts once.

Usage: ``python -m bench.redis_load [--quick]``.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import time
import uuid
from typing import Any

import redis
from redis.client import PubSub

from bench.harness import RedisServer, child_process, load_average, save, stop_process

CROSSED_THRESHOLDS = 5
OURS = {"info", "config|resetstat", "config", "ping"}
"""Commands this script itself sends to read the statistics."""


def in_script_commands() -> frozenset[str]:
    """Every command the library's Lua calls inside Redis (commandstats counts them, the
    network never carries them), read from the library's own source; ``PUBLISH`` and
    ``SPUBLISH`` are named by a variable there."""
    from stepbarrier._redis.functions import library_source

    # a container command is counted under its subcommand ('OBJECT', 'ENCODING' is
    # object|encoding); another quoted word after a name only adds a name never seen
    named = re.findall(r"redis\.call(?:\(|, )\s*'([A-Z]+)'(?:,\s*'([A-Z]+)')?", library_source())
    names = {name.lower() for name, _ in named} | {f"{n}|{s}".lower() for n, s in named if s}
    return frozenset(names | {"publish", "spublish"})


IN_SCRIPT = in_script_commands()


def command_stats(client: redis.Redis) -> Stats:
    raw = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): dict(stats) for name, stats in raw.items()}


Stats = dict[str, dict[str, float]]


def delta(before: Stats, after: Stats) -> dict[str, int]:
    calls = {}
    for name, stats in after.items():
        count = int(stats["calls"]) - int(before.get(name, {}).get("calls", 0))
        if count and name not in OURS:
            calls[name] = count
    return calls


SCRIPT_CALLS = ("fcall", "fcall_ro", "evalsha", "eval")
"""How a stepbarrier function or script is called (FCALL, or EVALSHA/EVAL under
STEPBARRIER_USE_EVAL=1)."""


def script_calls(sent: dict[str, int]) -> int:
    return sum(sent.get(name, 0) for name in SCRIPT_CALLS)


def split(calls: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    sent = {k: v for k, v in calls.items() if k not in IN_SCRIPT}
    inside = {k: v for k, v in calls.items() if k in IN_SCRIPT}
    return sent, inside


def chief_at(rate: float, seconds: float) -> dict[str, Any]:
    from stepbarrier import BarrierConfig, StepPublisher

    with RedisServer() as server:
        client = server.client()
        job = f"load-{uuid.uuid4().hex[:6]}"
        config = BarrierConfig(job=job, redis_url=server.url, role="chief", task_id=0)
        total_steps = int(rate * seconds)
        targets = [
            int(total_steps * (i + 0.5) / CROSSED_THRESHOLDS) or 1
            for i in range(CROSSED_THRESHOLDS)
        ]
        client.zadd(config.keys.targets, {f"bench-{t}": t for t in targets})
        client.rpush(config.keys.registrations, *targets)
        client.config_resetstat()
        before = command_stats(client)
        start = time.perf_counter()
        nap = min(0.5 / rate, 0.01)
        step = 0
        with StepPublisher(config) as publisher:
            while step < total_steps:
                due = min(total_steps, int((time.perf_counter() - start) * rate))
                while step < due:
                    step += 1
                    publisher.publish(step)
                time.sleep(nap)
            elapsed = time.perf_counter() - start
            writes = publisher.writes
        # close() made the final write; count everything up to here
        after = command_stats(client)
        client.close()
    sent, inside = split(delta(before, after))
    calls = script_calls(sent)
    # one generation start, one write per heartbeat (the first at once), one
    # per crossed threshold, and the final write of close()
    allowed = 1 + (int(elapsed / config.heartbeat) + 1) + CROSSED_THRESHOLDS + 1
    return {
        "target_rate": rate,
        "achieved_rate": step / elapsed,
        "seconds": elapsed,
        "steps": step,
        "heartbeat_s": config.heartbeat,
        "crossed_thresholds": CROSSED_THRESHOLDS,
        "publisher_writes": writes,
        "sent": sent,
        "sent_per_s": sum(sent.values()) / elapsed,
        "script_calls": calls,
        "script_calls_per_s": calls / elapsed,
        "in_script": inside,
        "in_script_per_s": sum(inside.values()) / elapsed,
        "fcall_usec_per_call": float(after.get("fcall", {}).get("usec_per_call", 0.0)),
        "script_calls_allowed": allowed,
        # a run that made no script call at all measured nothing
        "pass": 0 < calls <= allowed,
    }


def idle_waiter(seconds: float) -> dict[str, Any]:
    from stepbarrier import BarrierConfig, StepPublisher

    with RedisServer() as server:
        client = server.client()
        job = f"idle-{uuid.uuid4().hex[:6]}"
        config = BarrierConfig(job=job, redis_url=server.url, role="chief", task_id=0)
        helper = None
        with StepPublisher(config) as publisher:
            try:
                publisher.publish(1)
                publisher.flush(5)
                helper = child_process(
                    "bench.redis_load", "--idle-waiter", server.url, job, stdout=None
                )
                deadline = time.monotonic() + 60
                while not client.zcard(config.keys.targets):
                    if time.monotonic() > deadline:
                        raise RuntimeError("the idle waiter never registered")
                    time.sleep(0.05)
                time.sleep(1.0)
                before, writes_before = command_stats(client), publisher.writes
                start = time.perf_counter()
                step = 1
                while time.perf_counter() - start < seconds:
                    step += 1
                    publisher.publish(step)
                    time.sleep(0.1)
                after, writes = command_stats(client), publisher.writes - writes_before
                elapsed = time.perf_counter() - start
            finally:
                stop_process(helper)
        client.close()
    sent, _ = split(delta(before, after))
    chief = {"fcall": writes}
    waiter = dict(sent)
    waiter["fcall"] = waiter.get("fcall", 0) - writes
    waiter.pop("blpop", None)  # the chief's registration listener
    if waiter["fcall"] < 0 or not waiter.get("fcall_ro"):
        raise RuntimeError(f"unexpected command counts: sent {sent}, chief writes {writes}")
    waiter = {k: v for k, v in waiter.items() if v}
    commands = sum(waiter.values())
    # each read (FCALL_RO) travels with its register (FCALL) in one pipeline
    round_trips = commands - min(waiter.get("fcall", 0), waiter.get("fcall_ro", 0))
    per_s = round_trips / elapsed
    return {
        "seconds": elapsed,
        "chief_writes": chief,
        "waiter_sent": waiter,
        "waiter_commands_per_s": commands / elapsed,
        "waiter_round_trips": round_trips,
        "waiter_round_trips_per_s": per_s,
        "fallback_interval_s": config.fallback_interval,
        "pass": per_s <= 0.2 + 1e-9,
    }


def capacity(requests: int) -> dict[str, Any]:
    """What one Redis core can serve: our functions, next to PING.

    ``redis-benchmark`` (C, 16 connections, no pipelining) drives the server to
    one full core; commandstats give the server time inside each script.
    """
    from stepbarrier import BarrierConfig
    from stepbarrier._protocol.calls import publish_step_call, read_call, register_call
    from stepbarrier._redis.functions import function_command, install_functions
    from stepbarrier._worker.links import REGISTRY_TTL

    config = BarrierConfig(job="capacity", redis_url="redis://127.0.0.1:1/0")
    keys = config.keys
    # each call as the library builds it (stepbarrier._protocol.calls), never by hand
    chief_write = function_command(
        *publish_step_call(
            state=keys.state, targets=keys.targets, reset=keys.reset, generation=2**40,
            step=1000, done=False, key_ttl=config.key_ttl, channel=keys.channel,
            writer="bench:1", max_targets=256, run_id="", vouch=True, heartbeat_ms=1000,
            finished_ttl=300, reset_marker="", mode="chief", publish_command="PUBLISH",
            served=0, idle_ms=0,
        )
    )  # fmt: skip
    entry = {"task_id": "1", "wait_until_step": str(2**50), "since": "0", "host": "h", "pid": "1"}
    waiter_sync = function_command(
        *register_call(keys, "w1", 2**50, entry, registry_ttl=REGISTRY_TTL, key_ttl=config.key_ttl)
    )
    waiter_read = function_command(*read_call(keys.state, keys.reset, wait=True))
    out: dict[str, Any] = {"requests": requests, "clients": 16}
    with RedisServer() as server:
        client = server.client()
        install_functions(client)
        for name, command in (
            ("chief_write", chief_write),
            ("waiter_sync", waiter_sync),
            ("waiter_read", waiter_read),
            ("ping", ["PING"]),
        ):
            client.execute_command(*command)  # type: ignore[no-untyped-call]  # the first call registers the waiter
            client.config_resetstat()
            run = subprocess.run(
                [
                    "redis-benchmark",
                    "-h",
                    "127.0.0.1",
                    "-p",
                    str(server.port),
                    "-n",
                    str(requests),
                    "-c",
                    "16",
                    "--csv",
                    *map(str, command),
                ],
                capture_output=True,
                text=True,
                check=True,
            )
            rows = [line for line in run.stdout.splitlines() if line and line[1:5] != "test"]
            per_s = float(rows[-1].split(",")[1].strip('"'))
            stats = command_stats(client)
            top = command[0].lower()
            out[name] = {
                "requests_per_s": per_s,
                "server_usec_per_call": float(stats.get(top, {}).get("usec_per_call", 0.0)),
            }
        out["memory_per_subscriber_bytes"] = memory_per_subscriber(client, server.url)
        client.close()
    return out


def memory_per_subscriber(client: redis.Redis, url: str, count: int = 500) -> float:
    """Redis memory per idle subscribed connection (a waiting worker's subscription)."""
    before = int(client.info("memory")["used_memory"])
    subscriptions = []
    try:
        for number in range(count):
            pubsub: PubSub = redis.Redis.from_url(url).pubsub()
            pubsub.subscribe(f"stepbarrier:{{job-{number % 50}}}:steps")
            pubsub.get_message(timeout=1.0)
            subscriptions.append(pubsub)
        after = int(client.info("memory")["used_memory"])
    finally:
        for pubsub in subscriptions:
            pubsub.close()
    return (after - before) / count


def run_idle_waiter(url: str, job: str) -> None:
    from stepbarrier import BarrierConfig, StepWaiter

    config = BarrierConfig(job=job, redis_url=url, task_id=1)
    with StepWaiter(config) as waiter:
        waiter.wait(10**12, timeout=3600)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--idle-waiter", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.idle_waiter:
        run_idle_waiter(*args.idle_waiter)
        return
    seconds = 5.0 if args.quick else 20.0
    idle_seconds = 15.0 if args.quick else 60.0
    load_before = load_average()
    chiefs = []
    for rate in (10, 1_000, 10_000):
        result = chief_at(rate, seconds)
        chiefs.append(result)
        print(
            f"chief at {result['achieved_rate']:.0f} steps/s: {result['script_calls_per_s']:.2f} "
            f"FCALL/s sent ({result['sent']}); in-script {result['in_script_per_s']:.1f}/s; "
            f"allowed {result['script_calls_allowed']} in {result['seconds']:.1f} s -> "
            f"{'pass' if result['pass'] else 'MISS'}",
            file=sys.stderr,
        )
    idle = idle_waiter(idle_seconds)
    print(
        f"idle waiter: {idle['waiter_round_trips_per_s']:.3f} round trips/s "
        f"({idle['waiter_sent']}) -> "
        f"{'pass' if idle['pass'] else 'MISS'}",
        file=sys.stderr,
    )
    limits = capacity(20_000 if args.quick else 100_000)
    print(
        "one Redis core: "
        + ", ".join(
            f"{k} {v['requests_per_s']:.0f}/s" for k, v in limits.items() if isinstance(v, dict)
        ),
        file=sys.stderr,
    )
    save(
        "redis_load",
        {
            "benchmark": "redis_load",
            "quick": args.quick,
            "load_before": load_before,
            "load_after": load_average(),
            "chief": chiefs,
            "idle_waiter": idle,
            "capacity": limits,
        },
    )


if __name__ == "__main__":
    main()
