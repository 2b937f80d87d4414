"""The core wake-up, split where its time goes: the chief's thread, its script, the waiter.

One run, one private redis-server, three processes: this one is the chief (a
``StepPublisher`` whose writer thread is timestamped), a helper process waits
(``StepWaiter.wait``, as ``wake_floor.py``'s core), and another helper holds a
raw redis-py subscription to the job's channel. For each step, from just
before ``publish``:

* ``writer awake``: the writer thread's wait for work returns;
* ``FCALL sent``: the write's command reaches the socket (redis-py's
  ``Connection.send_packed_command``);
* ``heard raw``: the raw subscriber gets the announcement (what Redis's
  delivery costs from there);
* ``wait returns``: the waiter's ``wait`` returns.

Next to it, in alternating blocks, the floor of ``wake_floor.py`` (raw
``PUBLISH`` -> ``get_message``), and Redis's own time per ``FCALL`` of the
write (``INFO commandstats``).

Usage: ``python -m bench.wake_path [--quick]``; the helper roles are internal.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from typing import Any

import redis
import redis.connection
from redis.client import PubSub

from bench.harness import (
    RedisServer,
    child_process,
    git,
    load_average,
    ms,
    save,
    stop_process,
    summarize,
)
from bench.wake_floor import publish_when_registered, receive_core, run_floor_block

POINTS = ("writer awake", "FCALL sent", "heard raw", "wait returns")


def listen_raw(url: str, channel: str, count: int) -> None:
    """Print when each step's first announcement came (the step read from it)."""
    client = redis.Redis.from_url(url)
    pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(channel)
    while pubsub.get_message(timeout=1.0) is None and not pubsub.subscribed:
        pass
    print("ready", flush=True)
    heard: dict[int, float] = {}
    idle_until = time.monotonic() + 60
    while len(heard) < count and time.monotonic() < idle_until:
        message = pubsub.get_message(timeout=1.0)
        if message is not None and message["type"] == "message":
            now = time.time()
            step = int(json.loads(message["data"])["step"])
            heard.setdefault(step, now)
            idle_until = time.monotonic() + 10
    print(json.dumps({"received": heard}))


class _Stamps:
    """Times of the writer thread's wake-ups and of its commands on the socket."""

    def __init__(self, writer: threading.Thread | None = None) -> None:
        self.writer = writer
        self.awake: list[float] = []
        self.sent: list[float] = []


def _first_after(times: list[float], moment: float) -> float | None:
    """The earliest of ``times`` at or after ``moment`` (``None`` if none)."""
    later = [t for t in times if t >= moment]
    return min(later) if later else None


def run_block(url: str, count: int) -> tuple[dict[str, list[float]], float]:
    """One block: per point, the seconds from ``publish`` to it; and Redis's us per FCALL."""
    from stepbarrier import BarrierConfig, StepPublisher

    job = f"path-{uuid.uuid4().hex[:8]}"
    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0)
    admin = redis.Redis.from_url(url)
    stamps = _Stamps()
    original_send = redis.connection.Connection.send_packed_command

    def send(connection: Any, command: Any, check_health: bool = True) -> None:
        if threading.current_thread() is stamps.writer:
            stamps.sent.append(time.time())
        original_send(connection, command, check_health)  # type: ignore[no-untyped-call]

    listener = waiter = None
    redis.connection.Connection.send_packed_command = send  # type: ignore[method-assign]
    try:
        with StepPublisher(config) as publisher:
            publisher.publish(0)
            publisher.flush(5)
            # the writer thread's wake-up, timestamped
            stamps.writer = publisher._thread
            wait = publisher._wake.wait

            def timed_wait(timeout: float | None = None) -> bool:
                woke = wait(timeout)
                stamps.awake.append(time.time())
                return woke

            publisher._wake.wait = timed_wait  # type: ignore[method-assign]
            listener = child_process(
                "bench.wake_path", "--helper", "raw", url, config.keys.channel, str(count)
            )
            assert listener.stdout is not None
            if listener.stdout.readline().strip() != "ready":
                raise RuntimeError("the raw subscriber did not start")
            waiter = child_process("bench.wake_path", "--helper", "core", url, job, str(count))
            admin.config_resetstat()
            sent = publish_when_registered(publisher, count)
            waited, _ = waiter.communicate(timeout=60)
            heard, _ = listener.communicate(timeout=60)
            stats = admin.info("commandstats").get("cmdstat_fcall", {})
    finally:
        redis.connection.Connection.send_packed_command = original_send  # type: ignore[method-assign]
        for process in (listener, waiter):
            if process is not None:
                stop_process(process)
        admin.close()
    returned = {int(k): v for k, v in json.loads(waited)["received"].items()}
    raw = {int(k): v for k, v in json.loads(heard)["received"].items()}
    points: dict[str, list[float]] = {name: [] for name in POINTS}
    for target, moment in sent.items():
        found = {
            "writer awake": _first_after(stamps.awake, moment),
            "FCALL sent": _first_after(stamps.sent, moment),
            "heard raw": raw.get(target),
            "wait returns": returned.get(target),
        }
        for name, when in found.items():
            if when is not None:
                points[name].append(when - moment)
    return points, float(stats.get("usec_per_call", 0.0))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--helper", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.helper:
        role, url, name, count = args.helper
        if role == "raw":
            listen_raw(url, name, int(count))
        else:
            receive_core(url, name, int(count), cluster=False)
        return
    blocks, per_block = (2, 60) if args.quick else (4, 150)
    floor: list[float] = []
    points: dict[str, list[float]] = {name: [] for name in POINTS}
    fcall_us: list[float] = []
    load_before = load_average()
    with RedisServer() as server:
        for _ in range(blocks):
            floor += run_floor_block(server.url, per_block)
            block, usec = run_block(server.url, per_block)
            for name, values in block.items():
                points[name] += values
            fcall_us.append(usec)
    result: dict[str, Any] = {
        "benchmark": "wake_path",
        "quick": args.quick,
        "load_before": load_before,
        "load_after": load_average(),
        "floor_ms": summarize(ms(floor)),
        "points_ms": {name: summarize(ms(values)) for name, values in points.items()},
        "fcall_us_per_call": fcall_us,
        "commit": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
    }
    path = save("wake_path", result)
    line = ", ".join(f"{n} {result['points_ms'][n]['median']:.3f}" for n in POINTS)
    print(
        f"floor {result['floor_ms']['median']:.3f} ms; from publish (medians, ms): {line}; "
        f"Redis us per FCALL: {fcall_us} -> {path}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
