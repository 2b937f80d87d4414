"""The floor: raw redis-py pub/sub delivery, next to stepbarrier's own wake-up.

Both run in the same run, on the same private redis-server, between the same
two processes (this one sends, a helper process receives), in alternating
blocks so that a burst of machine noise hits both sides alike:

* ``floor``: ``PUBLISH`` here, ``PubSub.get_message`` there; from just before
  the ``PUBLISH`` call to the receiver's return from ``get_message``.
* ``core``: ``StepPublisher.publish(K)`` here (its thread writes and
  announces), ``StepWaiter.wait(K)`` there; from just before ``publish`` to the
  return of ``wait`` (which includes its unregistration).

``bench.cluster`` runs both against a Redis Cluster too (``sharded``:
``SPUBLISH``/``SSUBSCRIBE`` on the channel's owner; ``cluster``: the job's
clients in cluster mode).

Usage: ``python -m bench.wake_floor [--quick]``; the helper role is internal.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from typing import TYPE_CHECKING

import redis
from redis.client import PubSub

from bench.harness import (
    RedisServer,
    child_process,
    load_average,
    ms,
    save,
    stop_process,
    summarize,
)

if TYPE_CHECKING:
    from stepbarrier import StepPublisher

CHANNEL = "bench:floor"
GAP_MIN, GAP_MAX = 0.02, 0.06
"""Random idle seconds before each trial, the same for both sides: a real worker
waits long, and a wake-up from idle is slower than one in a busy loop."""


def receive_raw(url: str, count: int, sharded: bool) -> None:
    client = redis.Redis.from_url(url)
    pubsub: PubSub = client.pubsub(ignore_subscribe_messages=True)
    if sharded:
        pubsub.ssubscribe(CHANNEL)
    else:
        pubsub.subscribe(CHANNEL)
    while pubsub.get_message(timeout=1.0) is None and not pubsub.subscribed:
        pass
    received: dict[int, float] = {}
    idle_until = time.monotonic() + 30
    while len(received) < count and time.monotonic() < idle_until:
        message = pubsub.get_message(timeout=1.0)
        if message is not None and message["type"] in ("message", "smessage"):
            received[int(message["data"])] = time.time()
            idle_until = time.monotonic() + 10
    print(json.dumps({"received": received}))


def receive_core(url: str, job: str, count: int, cluster: bool) -> None:
    from stepbarrier import BarrierConfig, StepWaiter

    config = BarrierConfig(job=job, redis_url=url, task_id=1, redis_cluster=cluster)
    woke: dict[int, float] = {}
    with StepWaiter(config) as waiter:
        for target in range(1, count + 1):
            waiter.wait(target, timeout=30)
            woke[target] = time.time()
    print(json.dumps({"received": woke}))


def run_floor_block(url: str, count: int, sharded: bool = False) -> list[float]:
    """Raw delivery on the Redis at ``url`` (``sharded``: the owner of ``CHANNEL``'s slot)."""
    client = redis.Redis.from_url(url)
    role = ["raw", url, str(count), *(["sharded"] if sharded else [])]
    helper = child_process("bench.wake_floor", "--helper", *role)
    numsub = ("PUBSUB", "SHARDNUMSUB" if sharded else "NUMSUB", CHANNEL)
    try:
        deadline = time.monotonic() + 30
        while not client.execute_command(*numsub)[1]:  # type: ignore[no-untyped-call]  # the receiver is subscribed
            if time.monotonic() > deadline:
                raise RuntimeError("the raw receiver did not subscribe")
            time.sleep(0.01)
        sent = {}
        for i in range(count):
            time.sleep(random.uniform(GAP_MIN, GAP_MAX))
            sent[i] = time.time()
            client.execute_command("SPUBLISH" if sharded else "PUBLISH", CHANNEL, str(i))  # type: ignore[no-untyped-call]
        out, _ = helper.communicate(timeout=60)
    finally:
        stop_process(helper)
        client.close()
    received = {int(k): v for k, v in json.loads(out)["received"].items()}
    return [received[i] - sent[i] for i in sorted(received)]


def publish_when_registered(publisher: StepPublisher, count: int) -> dict[int, float]:
    """Publish steps 1..count, each once a waiter is registered for it and after a
    random idle gap; returns when each was handed over (``time.time()``)."""
    sent = {}
    for target in range(1, count + 1):
        deadline = time.monotonic() + 30
        while publisher.next_threshold != target:  # the waiter is registered
            if time.monotonic() > deadline:
                raise RuntimeError(f"the waiter never registered for step {target}")
            time.sleep(0.001)
        time.sleep(random.uniform(GAP_MIN, GAP_MAX))
        sent[target] = time.time()
        publisher.publish(target)
    return sent


def run_core_block(url: str, count: int, cluster: bool = False) -> list[float]:
    """stepbarrier's wake-up on the Redis at ``url`` (``cluster``: a cluster's seed node)."""
    from stepbarrier import BarrierConfig, StepPublisher

    job = f"floor-{uuid.uuid4().hex[:8]}"
    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0, redis_cluster=cluster)
    helper = None
    with StepPublisher(config) as publisher:
        publisher.publish(0)
        publisher.flush(5)
        role = ["core", url, job, str(count), *(["cluster"] if cluster else [])]
        helper = child_process("bench.wake_floor", "--helper", *role)
        try:
            sent = publish_when_registered(publisher, count)
            out, _ = helper.communicate(timeout=60)
        finally:
            stop_process(helper)
    received = {int(k): v for k, v in json.loads(out)["received"].items()}
    return [received[t] - sent[t] for t in sorted(received)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--helper", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.helper:
        role, url, *rest = args.helper
        if role == "raw":
            receive_raw(url, int(rest[0]), sharded=rest[1:] == ["sharded"])
        else:
            receive_core(url, rest[0], int(rest[1]), cluster=rest[2:] == ["cluster"])
        return
    blocks, per_block = (2, 60) if args.quick else (4, 150)
    floor: list[float] = []
    core: list[float] = []
    load_before = load_average()
    with RedisServer() as server:
        for _ in range(blocks):
            floor += run_floor_block(server.url, per_block)
            core += run_core_block(server.url, per_block)
    result = {
        "benchmark": "wake_floor",
        "quick": args.quick,
        "load_before": load_before,
        "load_after": load_average(),
        "floor_ms": summarize(ms(floor)),
        "core_ms": summarize(ms(core)),
        "floor_samples_ms": ms(floor),
        "core_samples_ms": ms(core),
    }
    result["core_over_floor_median"] = result["core_ms"]["median"] / result["floor_ms"]["median"]
    path = save("wake_floor", result)
    f, c = result["floor_ms"], result["core_ms"]
    print(
        f"floor: median {f['median']:.3f} ms p99 {f['p99']:.3f} ms (n={f['n']}); "
        f"stepbarrier core: median {c['median']:.3f} ms p99 {c['p99']:.3f} ms (n={c['n']}); "
        f"ratio {result['core_over_floor_median']:.2f} -> {path}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
