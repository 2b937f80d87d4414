"""Redis Cluster beside a standalone Redis, in the same run.

One private standalone ``redis-server`` and one private 6-node Redis Cluster (3
masters, 3 replicas, ``cluster_servers.py``), both on loopback, measured in
turns so that machine noise hits both alike:

1. Wake latency, in alternating blocks (``wake_floor.py``'s trials): the raw
   floor (``PUBLISH`` -> ``get_message``; on the cluster ``SPUBLISH`` ->
   ``SSUBSCRIBE`` on the channel's owner) and stepbarrier's ``publish()`` ->
   ``wait()`` (the cluster's job clients in cluster mode).
2. Fan-out (``fanout.py``'s trials): one step releases N waiters, standalone
   then cluster for each N.
3. What one announcement costs the cluster, node by node: the announcing
   commands each node ran (``INFO commandstats``), the cluster-bus messages it
   sent and received (``CLUSTER INFO`` ``cluster_stats_messages_publish*`` and
   ``..._publishshard_*``), the bytes it wrote (``/proc/PID/io`` ``wchar``) and
   its CPU (``INFO cpu``), the last two less an idle baseline. For stepbarrier's
   own announcement (the chief's ``FCALL``, whose function calls ``SPUBLISH``),
   a raw ``SPUBLISH`` and a raw ``PUBLISH`` of the same size on the same channel
   (a cluster forwards every ``PUBLISH`` to every node).

Usage: ``python -m bench.cluster [--quick]`` (or ``python -m bench --only cluster``).
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from redis.client import PubSub

from bench.cluster_servers import NODE_TIMEOUT_MS, LocalRedisCluster
from bench.fanout import fanout_job, run_fanout
from bench.harness import RedisServer, git, load_average, machine, ms, save, summarize
from bench.wake_floor import CHANNEL, run_core_block, run_floor_block

FANOUT_SIZES = (1, 16, 64, 256)
IDLE_SECONDS = 1.0
"""How long the idle baseline of the cost measurement is taken."""
COUNTERS = ("publish_sent", "publish_received", "publishshard_sent", "publishshard_received")
"""The cluster-bus counters of ``CLUSTER INFO`` (``cluster_stats_messages_<name>``)."""
COMMANDS = ("fcall", "spublish", "publish", "command|getkeys")
"""Commands counted per node (``INFO commandstats``). redis-py's cluster client asks
a node for the keys of every ``FCALL`` (``COMMAND GETKEYS``) before it sends it."""


def wake(
    server: RedisServer, cluster: LocalRedisCluster, blocks: int, per_block: int
) -> dict[str, Any]:
    """Both floors and both wake-ups, block after block, in turns."""
    owner_url = f"redis://127.0.0.1:{cluster.owner_of(CHANNEL)}/0"
    series: dict[str, list[float]] = {
        "standalone_floor": [], "standalone_core": [], "cluster_floor": [], "cluster_core": [],
    }  # fmt: skip
    for block in range(blocks):
        print(f"wake: block {block + 1} of {blocks}", file=sys.stderr, flush=True)
        series["standalone_floor"] += run_floor_block(server.url, per_block)
        series["cluster_floor"] += run_floor_block(owner_url, per_block, sharded=True)
        series["standalone_core"] += run_core_block(server.url, per_block)
        series["cluster_core"] += run_core_block(cluster.url, per_block, cluster=True)
    result: dict[str, Any] = {name: summarize(ms(values)) for name, values in series.items()}
    result["samples_ms"] = {name: ms(values) for name, values in series.items()}
    for kind in ("core", "floor"):
        on_cluster, standalone = result[f"cluster_{kind}"], result[f"standalone_{kind}"]
        for stat in ("median", "p90", "p99"):
            ratio = on_cluster[stat] / standalone[stat]
            result[f"{kind}_cluster_over_standalone_{stat}"] = ratio
    return result


def chief_writes(server: RedisServer, cluster: LocalRedisCluster, count: int) -> dict[str, Any]:
    """The chief's write, ``publish(step)`` then ``flush()``, one after another,
    standalone and on the cluster in two turns each (ms per write)."""
    from stepbarrier import BarrierConfig, StepPublisher

    times: dict[str, list[float]] = {"standalone": [], "cluster": []}
    for _turn in range(2):
        for name, url in (("standalone", server.url), ("cluster", cluster.url)):
            job = f"write-{uuid.uuid4().hex[:6]}"
            config = BarrierConfig(
                job=job, redis_url=url, role="chief", task_id=0, redis_cluster=name == "cluster"
            )
            with StepPublisher(config) as publisher:
                publisher.publish(0)
                publisher.flush(5)
                time.sleep(0.5)  # its registration listener has connected by now
                for step in range(1, count // 2 + 1):
                    started = time.perf_counter()
                    publisher.publish(step)
                    publisher.flush(5)
                    times[name].append(time.perf_counter() - started)
    result: dict[str, Any] = {name: summarize(ms(values)) for name, values in times.items()}
    result["cluster_over_standalone_median"] = (
        result["cluster"]["median"] / result["standalone"]["median"]
    )
    return result


def fanout(
    server: RedisServer, cluster: LocalRedisCluster, trials: int, rounds: int
) -> list[dict[str, Any]]:
    """Each fan-out size in ``rounds`` turns of standalone then cluster trials, so
    that a burst of load on the (shared) machine hits both alike."""
    runs = []
    for waiters in FANOUT_SIZES:
        parts: dict[str, list[dict[str, Any]]] = {"standalone": [], "cluster": []}
        for _round in range(rounds):
            parts["standalone"].append(run_fanout(server.url, waiters, trials // rounds))
            # a release works on the job's slot owner: charge that node's CPU
            job = fanout_job(waiters)
            owner = cluster.node(cluster.owner_of(channel_of(job)))
            chunk = run_fanout(
                cluster.url, waiters, trials // rounds, cluster=True, job=job, cpu_of=owner
            )
            parts["cluster"].append(chunk)
        standalone, on_cluster = _merged(parts["standalone"]), _merged(parts["cluster"])
        runs.append({"waiters": waiters, "standalone": standalone, "cluster": on_cluster})
        for name, run in (("standalone", standalone), ("cluster", on_cluster)):
            last = run["last_wake_ms"]
            assert isinstance(last, dict)
            print(
                f"fan-out {waiters:>3} {name:>10}: last wake median {last['median']:.2f} ms, "
                f"p90 {last['p90']:.2f} ms",
                file=sys.stderr,
            )
    return runs


def _merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """One fan-out result from several turns of the same size."""
    last = [x for part in parts for x in part["last_wake_samples_ms"]]
    middle = [x for part in parts for x in part["median_wake_samples_ms"]]
    trials = sum(part["trials"] for part in parts)
    return {
        "waiters": parts[0]["waiters"],
        "processes": parts[0]["processes"],
        "trials": trials,
        "turns": len(parts),
        "release_cpu_ms": {
            kind: sum(p["release_cpu_ms"][kind] * p["trials"] for p in parts) / trials
            for kind in ("redis", "waiters")
        },
        "errors": [error for part in parts for error in part["errors"]],
        "last_wake_ms": summarize(last),
        "median_wake_ms": summarize(middle),
        "last_wake_samples_ms": last,
    }


def channel_of(job: str) -> str:
    """The job's announcement channel (its slot is the job's slot)."""
    from stepbarrier import BarrierConfig

    return BarrierConfig(job=job, redis_url="redis://127.0.0.1:1/0").keys.channel


def node_counters(cluster: LocalRedisCluster) -> dict[int, dict[str, float]]:
    """Per node: cluster-bus publish counters, announcing commands, bytes written, CPU."""
    counters: dict[int, dict[str, float]] = {}
    for port in cluster.ports:
        node = cluster.node(port)
        info = str(node.execute_command("CLUSTER", "INFO"))  # type: ignore[no-untyped-call]
        fields = dict(line.split(":", 1) for line in info.split() if ":" in line)
        row = {name: float(fields.get(f"cluster_stats_messages_{name}", 0)) for name in COUNTERS}
        stats = node.info("commandstats")
        for command in COMMANDS:
            row[command] = float(stats.get(f"cmdstat_{command}", {}).get("calls", 0))
        cpu = node.info("cpu")
        row["cpu_s"] = float(cpu["used_cpu_sys"]) + float(cpu["used_cpu_user"])
        row["wchar"] = float(_proc_io(cluster.pid(port))["wchar"])
        counters[port] = row
    return counters


def _proc_io(pid: int) -> dict[str, int]:
    lines = Path(f"/proc/{pid}/io").read_text().splitlines()
    return {key: int(value) for key, value in (line.split(": ") for line in lines)}


def _delta(
    before: dict[int, dict[str, float]], after: dict[int, dict[str, float]]
) -> dict[int, dict[str, float]]:
    return {port: {k: after[port][k] - before[port][k] for k in after[port]} for port in after}


def measured(
    cluster: LocalRedisCluster, action: Callable[[], object]
) -> tuple[dict[int, dict[str, float]], float]:
    """Per-node counter deltas while ``action()`` runs, and how long it ran."""
    before = node_counters(cluster)
    started = time.perf_counter()
    action()
    seconds = time.perf_counter() - started
    time.sleep(0.2)  # let the bus messages of the last announcements arrive
    return _delta(before, node_counters(cluster)), seconds + 0.2


def announcement_cost(cluster: LocalRedisCluster, count: int) -> dict[str, Any]:
    """Per node and per announcement: stepbarrier's, a raw SPUBLISH's and a raw PUBLISH's."""
    from stepbarrier import BarrierConfig, StepPublisher

    job = f"cost-{uuid.uuid4().hex[:6]}"
    channel = channel_of(job)
    owner = cluster.owner_of(channel)
    replicas = cluster.replicas_of(owner)
    masters = cluster.masters
    roles = {
        port: "owner" if port == owner else "owner's replica" if port in replicas
        else "other master" if port in masters else "other replica"
        for port in cluster.ports
    }  # fmt: skip
    idle, idle_seconds = measured(cluster, lambda: time.sleep(IDLE_SECONDS))
    rows: dict[str, Any] = {}

    config = BarrierConfig(job=job, redis_url=cluster.url, role="chief", task_id=0,
                           redis_cluster=True)  # fmt: skip
    payload = ""
    subscriber: PubSub = cluster.node(owner).pubsub()
    subscriber.ssubscribe(channel)
    try:
        with StepPublisher(config) as publisher:
            publisher.publish(0)
            publisher.flush(5)
            time.sleep(1.0)  # its registration listener has connected by now

            def announce() -> None:
                for step in range(1, count + 1):
                    publisher.publish(step)
                    publisher.flush(5)

            deltas, seconds = measured(cluster, announce)
        rows["stepbarrier"] = _row(deltas, seconds, idle, idle_seconds, "spublish")
        for message in iter(lambda: subscriber.get_message(timeout=0.5), None):
            if message["type"] == "smessage":
                payload = str(message["data"])  # the last announcement, as sent
    finally:
        subscriber.close()

    for command, subscribe in (("SPUBLISH", "ssubscribe"), ("PUBLISH", "subscribe")):
        subscriber = cluster.node(owner).pubsub(ignore_subscribe_messages=True)
        getattr(subscriber, subscribe)(channel)
        node = cluster.node(owner)

        def send(command: str = command, node: redis.Redis = node) -> None:
            for _ in range(count):  # one round trip each, as an announcement is
                node.execute_command(command, channel, payload)  # type: ignore[no-untyped-call]

        try:
            deltas, seconds = measured(cluster, send)
        finally:
            subscriber.close()
        rows[command.lower()] = _row(deltas, seconds, idle, idle_seconds, command.lower())
    return {
        "announcements": count,
        "payload_bytes": len(payload),
        "roles": {str(port): role for port, role in roles.items()},
        "idle_seconds": idle_seconds,
        "rows": rows,
    }


def _row(
    deltas: dict[int, dict[str, float]],
    seconds: float,
    idle: dict[int, dict[str, float]],
    idle_seconds: float,
    command: str,
) -> dict[str, Any]:
    announcements = sum(row[command] for row in deltas.values())
    per_node = {}
    for port, row in deltas.items():
        scale = seconds / idle_seconds
        node = {k: row[k] / announcements for k in (*COUNTERS, *COMMANDS)}
        node["bus_messages"] = sum(node[k] for k in COUNTERS)
        node["cpu_us"] = 1e6 * (row["cpu_s"] - scale * idle[port]["cpu_s"]) / announcements
        node["bytes_written"] = (row["wchar"] - scale * idle[port]["wchar"]) / announcements
        node["involved"] = bool(
            any(row[name] for name in COMMANDS)
            or row["publish_received"]
            or row["publishshard_received"]
        )
        per_node[str(port)] = node
    return {
        "announcements": announcements,
        "seconds": seconds,
        "per_node": per_node,
        "nodes_involved": sum(node["involved"] for node in per_node.values()),
        "bus_messages_sent": sum(
            n["publish_sent"] + n["publishshard_sent"] for n in per_node.values()
        ),
        "bus_messages_received": sum(
            n["publish_received"] + n["publishshard_received"] for n in per_node.values()
        ),
        "getkeys": sum(n["command|getkeys"] for n in per_node.values()),
        "cpu_us": sum(n["cpu_us"] for n in per_node.values()),
        "bytes_written": sum(n["bytes_written"] for n in per_node.values()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    blocks, per_block = (2, 60) if args.quick else (4, 150)
    trials = 8 if args.quick else 30
    announcements = 300 if args.quick else 2000
    started = time.monotonic()
    load_before = load_average()
    with RedisServer() as server, LocalRedisCluster() as cluster:
        from stepbarrier._redis.functions import install_functions

        client = cluster.client()
        install_functions(client)  # on every master, as an administrator would
        client.close()
        loads = {"wake": load_average()}
        wake_result = wake(server, cluster, blocks, per_block)
        w = wake_result
        print(
            f"wake median: standalone {w['standalone_core']['median']:.3f} ms, cluster "
            f"{w['cluster_core']['median']:.3f} ms "
            f"({w['core_cluster_over_standalone_median']:.2f}x); floors "
            f"{w['standalone_floor']['median']:.3f} / {w['cluster_floor']['median']:.3f} ms",
            file=sys.stderr,
        )
        loads["chief_write"] = load_average()
        writes = chief_writes(server, cluster, announcements)
        print(
            f"chief write median: standalone {writes['standalone']['median']:.3f} ms, "
            f"cluster {writes['cluster']['median']:.3f} ms",
            file=sys.stderr,
        )
        loads["fanout"] = load_average()
        fanout_runs = fanout(server, cluster, trials, rounds=2 if args.quick else 3)
        loads["announcement"] = load_average()
        cost = announcement_cost(cluster, announcements)
    for name, row in cost["rows"].items():
        print(
            f"one {name} announcement: {row['nodes_involved']} nodes, "
            f"{row['bus_messages_sent']:.2f} bus messages sent, {row['cpu_us']:.1f} us CPU, "
            f"{row['bytes_written']:.0f} bytes written (all nodes)",
            file=sys.stderr,
        )
    path = save(
        "cluster",
        {
            "benchmark": "cluster",
            "quick": args.quick,
            "seconds": time.monotonic() - started,
            "load_before": load_before,
            "load_after": load_average(),
            "load": loads,
            "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
            "machine": machine(),
            "cluster": {"masters": 3, "replicas": 1, "node_timeout_ms": NODE_TIMEOUT_MS},
            "wake": wake_result,
            "chief_write_ms": writes,
            "fanout": fanout_runs,
            "announcement": cost,
        },
    )
    print(f"-> {path}", file=sys.stderr)


if __name__ == "__main__":
    main()
