"""A private Redis Cluster for the benchmarks: 3 masters and 3 replicas on loopback.

Six ``redis-server`` processes without persistence, each in its own temporary
directory, joined by ``redis-cli --cluster create``. The tests have a fuller
harness (``tests/cluster_harness.py``: migrations, failovers, ACLs, TLS); the
benchmarks only need a healthy cluster, its nodes' pids (for ``/proc/PID/io``)
and its slot map, and import nothing from the tests.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import redis
from redis.cluster import RedisCluster

from examples.demo.local import LOOPBACK, free_port, stop_process_group

BUS_OFFSET = 10000
"""A node's cluster bus listens on its port + this (so its port is at most 55535)."""
NODE_TIMEOUT_MS = 5000
"""``cluster-node-timeout``: also sets how often the nodes ping each other."""
SLOTS = 16384


class LocalRedisCluster:
    """``masters`` masters with ``replicas`` replicas each, healthy once started.

    Example:
        >>> with LocalRedisCluster() as cluster:
        ...     cluster.client().set("{job}:state", 1)
    """

    def __init__(self, masters: int = 3, replicas: int = 1) -> None:
        self.size = masters * (1 + replicas)
        self.replicas = replicas
        self.dir = Path(tempfile.mkdtemp(prefix="stepbarrier-bench-cluster-"))
        self.processes: dict[int, subprocess.Popen[bytes]] = {}
        self._nodes: dict[int, redis.Redis] = {}

    def start(self, timeout: float = 60.0) -> LocalRedisCluster:
        taken: set[int] = set()
        for _ in range(self.size):
            port = _cluster_port(taken)
            directory = self.dir / str(port)
            directory.mkdir()
            self.processes[port] = subprocess.Popen(
                ["redis-server", "--port", str(port), "--bind", LOOPBACK, "--save", "",
                 "--appendonly", "no", "--dir", str(directory),
                 "--logfile", str(directory / "redis.log"),
                 "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                 "--cluster-node-timeout", str(NODE_TIMEOUT_MS)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
            )  # fmt: skip
        for port in self.processes:
            node = self.node(port)
            _until(node.ping, timeout, f"node {port} answers")
        addresses = [f"{LOOPBACK}:{port}" for port in self.processes]
        subprocess.run(
            ["redis-cli", "--cluster", "create", *addresses,
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            capture_output=True, text=True, timeout=timeout, check=True,
        )  # fmt: skip
        _until(self._healthy, timeout, "cluster healthy")
        return self

    def stop(self) -> None:
        for client in self._nodes.values():
            client.close()
        self._nodes.clear()
        for process in self.processes.values():
            stop_process_group(process)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalRedisCluster:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def ports(self) -> list[int]:
        return sorted(self.processes)

    @property
    def url(self) -> str:
        """The seed node's URL (one node is enough: the client reads the slot map)."""
        return f"redis://{LOOPBACK}:{self.ports[0]}/0"

    def client(self) -> RedisCluster:
        return RedisCluster(host=LOOPBACK, port=self.ports[0])

    def node(self, port: int) -> redis.Redis:
        """A plain client of one node (kept; closed by ``stop``)."""
        if port not in self._nodes:
            self._nodes[port] = redis.Redis(
                host=LOOPBACK, port=port, decode_responses=True, socket_timeout=5.0
            )
        return self._nodes[port]

    def pid(self, port: int) -> int:
        return self.processes[port].pid

    def owner_of(self, key: str) -> int:
        """Port of the master that owns ``key``'s (or a shard channel's) slot."""
        slot = int(self.node(self.ports[0]).execute_command("CLUSTER", "KEYSLOT", key))  # type: ignore[no-untyped-call]
        for start, end, master in self._slot_ranges():
            if start <= slot <= end:
                return master
        raise LookupError(f"slot {slot} has no owner")

    @property
    def masters(self) -> list[int]:
        """Ports of the masters."""
        return sorted({master for _start, _end, master in self._slot_ranges()})

    def replicas_of(self, port: int) -> list[int]:
        """Ports of the replicas of the master on ``port`` (from ``CLUSTER NODES``:
        ``CLUSTER SLOTS`` leaves a replica out until its offset has been gossiped)."""
        master_id = str(self.node(port).execute_command("CLUSTER", "MYID"))  # type: ignore[no-untyped-call]
        replicas = []
        for line in str(self.node(port).execute_command("CLUSTER", "NODES")).splitlines():  # type: ignore[no-untyped-call]
            _id, address, _flags, master, *_ = line.split()
            if master == master_id:
                replicas.append(int(address.split("@")[0].rsplit(":", 1)[1]))
        return sorted(replicas)

    def _slot_ranges(self) -> list[tuple[int, int, int]]:
        """``CLUSTER SLOTS`` of the first node: (first slot, last slot, master's port)."""
        slots = self.node(self.ports[0]).execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
        return sorted((int(start), int(end), int(master[1])) for start, end, master, *_ in slots)

    def _healthy(self) -> bool:
        views = set()
        for port in self.ports:
            node = self.node(port)
            if "cluster_state:ok" not in str(node.execute_command("CLUSTER", "INFO")):  # type: ignore[no-untyped-call]
                return False
            replication = node.info("replication")
            if replication["role"] == "slave" and replication["master_link_status"] != "up":
                return False
            slots = node.execute_command("CLUSTER", "SLOTS")  # type: ignore[no-untyped-call]
            views.add(tuple(sorted((int(s), int(e), int(m[1])) for s, e, m, *_ in slots)))
        if len(views) != 1:
            return False
        (view,) = views
        return sum(end - start + 1 for start, end, _ in view) == SLOTS


def _cluster_port(taken: set[int]) -> int:
    for _ in range(1000):
        port = free_port()
        clash = {port, port + BUS_OFFSET, port - BUS_OFFSET} & taken
        if port <= 65535 - BUS_OFFSET and not clash and _is_free(port + BUS_OFFSET):
            taken.update((port, port + BUS_OFFSET))
            return port
    raise RuntimeError("no free port pair (port, port + 10000) on loopback")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((LOOPBACK, port))
        except OSError:
            return False
        return True


def _until(check: Callable[[], object], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except redis.RedisError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"not within {timeout:g} s: {what}")
        time.sleep(0.05)
