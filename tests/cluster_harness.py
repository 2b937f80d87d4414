"""A real Redis Cluster for the tests: 3 masters and 3 replicas on free loopback ports.

Every node is a ``redis-server`` started here, in its own temporary directory,
and stopped by ``cleanup`` (also when a test failed). The harness moves slots
and kills masters the way an operator or a crash would, and waits until the
cluster is healthy again, so a test sees a settled topology before and after.
With an ACL file every node lets in the ACL's users plus ``ADMIN`` (the
harness, ``redis-cli``, replication and ``MIGRATE`` log in as ``ADMIN``); with
``tls=True`` clients, replication and the cluster bus speak TLS only.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import redis
from redis.cluster import RedisCluster

from examples.demo.local import free_port
from tests.redis_harness import RedisServer
from tests.security.certificates import Authority, Issued

HOST = "127.0.0.1"
SLOTS = 16384
BUS_OFFSET = 10000
"""The cluster bus of a node listens on its port + this."""
MAX_PORT = 65535 - BUS_OFFSET
"""A node on a higher port refuses to start ("Redis port number too high")."""
NODE_TIMEOUT_MS = 1000
MIGRATE_BATCH = 100
"""Keys per ``MIGRATE`` call when a slot moves."""
ADMIN = "cluster-admin"
"""The ACL user of the harness, ``redis-cli``, replication and ``MIGRATE``."""


@dataclass(frozen=True)
class LocalNode:
    """One node as the cluster sees it (``CLUSTER NODES``)."""

    port: int
    node_id: str
    role: Literal["master", "replica"]
    master_id: str | None
    failed: bool


@dataclass(frozen=True)
class _Tls:
    ca: Authority
    server: Issued
    client: Issued


def cluster_port(taken: set[int]) -> int:
    """A free port at most ``MAX_PORT`` whose bus port is free too, clear of ``taken``."""
    for _ in range(1000):
        port = free_port()
        clash = {port, port + BUS_OFFSET, port - BUS_OFFSET} & taken
        if port <= MAX_PORT and not clash and _is_free(port + BUS_OFFSET):
            taken.update((port, port + BUS_OFFSET))
            return port
    raise RuntimeError("found no free port pair (port, port + 10000) on loopback")


def _is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
        return True


class LocalCluster:
    """A Redis Cluster of ``masters`` masters with ``replicas`` replicas each.

    Args:
        masters: Number of masters (3 is the smallest cluster ``redis-cli`` creates).
        replicas: Replicas per master.
        args: Extra ``redis-server`` arguments of every node.
        aclfile: An ACL file; each node gets a copy with ``ADMIN`` added.
        tls: TLS only (clients, replication, cluster bus), with a throwaway CA.

    Example:
        >>> with LocalCluster() as cluster:
        ...     cluster.client().set("{job}:state", 1)
    """

    def __init__(
        self,
        *,
        masters: int = 3,
        replicas: int = 1,
        args: Sequence[str] = (),
        aclfile: Path | str | None = None,
        tls: bool = False,
    ) -> None:
        self.size = masters * (1 + replicas)
        self.replicas = replicas
        self.args = list(args)
        self.aclfile = None if aclfile is None else Path(aclfile)
        self.admin_password = f"admin-{uuid.uuid4().hex}" if aclfile is not None else None
        self.dir = Path(tempfile.mkdtemp(prefix="stepbarrier-cluster-"))
        self.tls: _Tls | None = None
        if tls:
            ca = Authority(self.dir, "cluster")
            server = ca.issue("cluster-server", server=True)
            self.tls = _Tls(ca, server, ca.issue("cluster-client", server=False))
        self.servers: dict[int, RedisServer] = {}
        self._admins: dict[int, redis.Redis] = {}
        self._clients: list[redis.Redis | RedisCluster] = []
        self._replicas_of_killed: dict[int, list[int]] = {}

    # -- lifecycle -----------------------------------------------------------

    def start(self, timeout: float = 60.0) -> LocalCluster:
        """Start the nodes, create the cluster and wait until it is healthy."""
        taken: set[int] = set()
        for _ in range(self.size):
            server = self._start_node(taken)
            self.servers[server.port] = server
        addresses = [f"{HOST}:{port}" for port in self.servers]
        create = [*addresses, "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        self._redis_cli(["--cluster", "create", *create], timeout)
        self.wait_healthy(timeout)
        return self

    def _start_node(self, taken: set[int], attempts: int = 3) -> RedisServer:
        # a port that was free a moment ago can be taken before redis-server binds it
        for attempt in range(attempts):
            server = RedisServer(port=cluster_port(taken), tls=self._server_tls())
            server.args = [*self._node_args(server.dir), *self.args]
            try:
                return server.start()
            except RuntimeError:
                server.cleanup()
                if attempt == attempts - 1:
                    raise
        raise AssertionError("unreachable")

    def _node_args(self, directory: Path) -> list[str]:
        args = ["--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
                "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
                "--repl-diskless-sync-delay", "0"]  # fmt: skip
        if self.aclfile is not None and self.admin_password is not None:
            acl = directory / "users.acl"  # a copy per node: ACL SAVE writes to it
            rules = self.aclfile.read_text().rstrip("\n")
            acl.write_text(f"{rules}\nuser {ADMIN} on >{self.admin_password} ~* &* +@all\n")
            args += ["--aclfile", str(acl), "--masteruser", ADMIN,
                     "--masterauth", self.admin_password]  # fmt: skip
        if self.tls is not None:
            args += ["--tls-cluster", "yes", "--tls-replication", "yes",
                     "--tls-client-cert-file", str(self.tls.client.cert),
                     "--tls-client-key-file", str(self.tls.client.key)]  # fmt: skip
        return args

    def _server_tls(self) -> tuple[str, str, str] | None:
        if self.tls is None:
            return None
        return (str(self.tls.server.cert), str(self.tls.server.key), str(self.tls.ca.path))

    def _redis_cli(self, arguments: list[str], timeout: float) -> str:
        command = [shutil.which("redis-cli") or "redis-cli"]
        if self.admin_password is not None:
            command += ["--user", ADMIN, "--pass", self.admin_password, "--no-auth-warning"]
        if self.tls is not None:
            command += ["--tls", "--cacert", str(self.tls.ca.path), "--cert",
                        str(self.tls.client.cert), "--key", str(self.tls.client.key)]  # fmt: skip
        done = subprocess.run(
            command + arguments, capture_output=True, text=True, timeout=timeout, check=False
        )
        if done.returncode != 0:
            output = done.stdout + done.stderr
            raise RuntimeError(f"redis-cli {' '.join(arguments)} failed:\n{output}")
        return done.stdout

    def cleanup(self) -> None:
        """Stop every node and remove every directory; safe to call twice."""
        for client in [*self._clients, *self._admins.values()]:
            with contextlib.suppress(Exception):  # a broken client must not keep nodes alive
                client.close()
        self._clients.clear()
        self._admins.clear()
        for server in self.servers.values():
            if server.process is not None and server.process.poll() is None:
                server.process.terminate()  # all at once; each stop() below then waits
        for server in self.servers.values():
            server.cleanup()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        try:
            return self.start()
        except BaseException:
            self.cleanup()
            raise

    def __exit__(self, *exc: object) -> None:
        self.cleanup()

    # -- clients -------------------------------------------------------------

    def admin_options(self) -> dict[str, Any]:
        """redis-py options of an admin connection (credentials, TLS files)."""
        options: dict[str, Any] = {}
        if self.admin_password is not None:
            options.update(username=ADMIN, password=self.admin_password)
        if self.tls is not None:
            options.update(ssl=True, ssl_ca_certs=str(self.tls.ca.path),
                           ssl_certfile=str(self.tls.client.cert),
                           ssl_keyfile=str(self.tls.client.key))  # fmt: skip
        return options

    def alive(self, port: int) -> bool:
        process = self.servers[port].process
        return process is not None and process.poll() is None

    @property
    def seed_port(self) -> int:
        """The first node still running."""
        return next(port for port in self.servers if self.alive(port))

    @property
    def seed_url(self) -> str:
        """``redis://`` (or ``rediss://`` with TLS) URL of a running node, db 0."""
        scheme = "rediss" if self.tls is not None else "redis"
        return f"{scheme}://{HOST}:{self.seed_port}/0"

    def client(self, **options: Any) -> RedisCluster:
        """A ``RedisCluster`` on the seed node, as the admin unless ``options`` say otherwise."""
        client = RedisCluster(host=HOST, port=self.seed_port, **{**self.admin_options(), **options})
        self._clients.append(client)
        return client

    def node_client(self, port: int, **options: Any) -> redis.Redis:
        """A plain client of one node, as the admin unless ``options`` say otherwise."""
        client = redis.Redis(host=HOST, port=port, **{**self.admin_options(), **options})
        self._clients.append(client)
        return client

    def _admin(self, port: int) -> redis.Redis:
        if port not in self._admins:
            self._admins[port] = redis.Redis(
                host=HOST, port=port, decode_responses=True, socket_timeout=5.0,
                **self.admin_options(),
            )  # fmt: skip
        return self._admins[port]

    def _call(self, port: int, *command: str | int) -> Any:
        return self._admin(port).execute_command(*command)  # type: ignore[no-untyped-call]

    # -- topology ------------------------------------------------------------

    @property
    def nodes(self) -> list[LocalNode]:
        """Every node, as the seed node sees it now (killed ones are ``failed``)."""
        nodes = []
        for line in str(self._call(self.seed_port, "CLUSTER", "NODES")).splitlines():
            node_id, address, flags, master, *_ = line.split()
            port = int(address.split("@")[0].rsplit(":", 1)[1])
            flag_set = set(flags.split(","))
            role: Literal["master", "replica"] = "master" if "master" in flag_set else "replica"
            nodes.append(LocalNode(port, node_id, role, None if master == "-" else master,
                                   "fail" in flag_set))  # fmt: skip
        return sorted(nodes, key=lambda node: node.port)

    @property
    def masters(self) -> list[int]:
        """Ports of the running masters that serve slots, by the seed's slot map (its
        CLUSTER NODES view may still call a new replica a master until gossip says
        otherwise, on a loaded machine)."""
        serving = {master for _, _, master, _ in self._slot_map(self.seed_port)}
        return sorted(port for port in serving if self.alive(port))

    def node_id(self, port: int) -> str:
        return str(self._call(port, "CLUSTER", "MYID"))

    def slot_of(self, key: str) -> int:
        """The hash slot of a key or shard channel (``CLUSTER KEYSLOT``)."""
        return int(self._call(self.seed_port, "CLUSTER", "KEYSLOT", key))

    def owner_of(self, key: str) -> int:
        """Port of the master owning the slot of a key or shard channel."""
        return self.owner_of_slot(self.slot_of(key))

    def owner_of_slot(self, slot: int) -> int:
        for start, end, master, _ in self._slot_map(self.seed_port):
            if start <= slot <= end:
                return master
        raise LookupError(f"slot {slot} is not served by any node")

    def _slot_map(self, port: int) -> list[tuple[int, int, int, tuple[int, ...]]]:
        """``CLUSTER SLOTS`` of one node: (first slot, last slot, master, replicas)."""
        ranges = []
        for start, end, master, *replicas in self._call(port, "CLUSTER", "SLOTS"):
            ranges.append((int(start), int(end), int(master[1]),
                           tuple(sorted(int(r[1]) for r in replicas))))  # fmt: skip
        return sorted(ranges)

    # -- health --------------------------------------------------------------

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every running node says ``cluster_state:ok``, all agree on who owns
        every slot, and every running replica's link to its master is up."""
        _wait_until(self._healthy, timeout, "cluster healthy", self._diagnosis)

    def _healthy(self) -> bool:
        running = [port for port in self.servers if self.alive(port)]
        views = set()
        for port in running:
            info = self._call(port, "CLUSTER", "INFO")
            if "cluster_state:ok" not in str(info):
                return False
            # only the masters: CLUSTER SLOTS leaves out a replica until its
            # replication offset (0 before the first write) has been gossiped
            views.add(tuple((start, end, master) for start, end, master, _ in self._slot_map(port)))
            replication = self._admin(port).info("replication")
            if replication["role"] == "slave" and replication["master_link_status"] != "up":
                return False
        if len(views) != 1:
            return False
        (view,) = views
        return sum(end - start + 1 for start, end, _ in view) == SLOTS

    def _diagnosis(self) -> str:
        lines = []
        for port, server in self.servers.items():
            if not self.alive(port):
                lines.append(f"{port}: not running")
                continue
            try:
                state = str(self._call(port, "CLUSTER", "INFO")).split()[0]
                role = self._admin(port).info("replication")
                lines.append(f"{port}: {state} role={role['role']} "
                             f"link={role.get('master_link_status', '-')}")  # fmt: skip
            except redis.RedisError as error:
                lines.append(f"{port}: {error!r}")
            if server.log.exists():
                lines += [f"  {line}" for line in server.log.read_text().splitlines()[-5:]]
        return "\n".join(lines)

    # -- operations ----------------------------------------------------------

    def migrate_slot(self, slot: int, to_port: int) -> int:
        """Move ``slot`` and its keys to the master on ``to_port``, as documented
        (IMPORTING, MIGRATING, MIGRATE in batches, NODE on every master).

        Returns:
            The number of keys moved.
        """
        source = self.owner_of_slot(slot)
        if source == to_port:
            raise ValueError(f"slot {slot} is already on {to_port}")
        source_id, target_id = self.node_id(source), self.node_id(to_port)
        self._call(to_port, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
        self._call(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
        login: list[str] = []
        if self.admin_password is not None:
            login = ["AUTH2", ADMIN, self.admin_password]
        moved = 0
        while keys := self._call(source, "CLUSTER", "GETKEYSINSLOT", slot, MIGRATE_BATCH):
            self._call(source, "MIGRATE", HOST, to_port, "", 0, 5000, *login, "KEYS", *keys)
            moved += len(keys)
        others = [port for port in self.masters if port not in (to_port, source)]
        for port in [to_port, source, *others]:
            self._call(port, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
        _wait_until(
            lambda: all(self._owner_seen_by(port, slot) == to_port for port in self._running()),
            30.0, f"every node sees slot {slot} on {to_port}", self._diagnosis,
        )  # fmt: skip
        return moved

    def _owner_seen_by(self, port: int, slot: int) -> int | None:
        for start, end, master, _ in self._slot_map(port):
            if start <= slot <= end:
                return master
        return None

    def _running(self) -> list[int]:
        return [port for port in self.servers if self.alive(port)]

    def kill_master(self, port: int) -> None:
        """SIGKILL the master on ``port``, as a crash would; its replicas stay."""
        by_port = {node.port: node for node in self.nodes}
        if by_port[port].role != "master" or not self.alive(port):
            raise ValueError(f"{port} is not a running master")
        master_id = by_port[port].node_id
        replicas = [n.port for n in by_port.values() if n.master_id == master_id]
        self._replicas_of_killed[port] = replicas
        self.servers[port].kill()
        admin = self._admins.pop(port, None)
        if admin is not None:
            admin.close()

    def wait_promoted(self, old_port: int, timeout: float = 30.0) -> int:
        """Until a replica of the killed master on ``old_port`` is a master and the
        running nodes are healthy again.

        Returns:
            The port of the promoted replica.
        """

        def promoted() -> int | None:
            for port in self._replicas_of_killed[old_port]:
                if self._admin(port).info("replication")["role"] == "master":
                    return port
            return None

        port = _wait_until(promoted, timeout, f"a replica of {old_port} promoted", self._diagnosis)
        self.wait_healthy(timeout)
        return int(port)

    def load_functions(self, source: str) -> str:
        """``FUNCTION LOAD REPLACE`` on every running master, as the admin, and wait
        until its replicas have it too.

        Returns:
            The library's name.
        """
        deadline = time.monotonic() + 60.0
        while True:
            name = ""
            try:
                for port in self.masters:
                    name = str(self._call(port, "FUNCTION", "LOAD", "REPLACE", source))
                    replicas = int(self._admin(port).info("replication")["connected_slaves"])
                    if replicas:  # a promoted master has none left
                        self._call(port, "WAIT", replicas, 5000)
                return name
            except redis.ReadOnlyError:
                # a master that was slow for NODE_TIMEOUT_MS on a loaded machine
                # was failed over while we looked: load it on the masters of now
                if time.monotonic() > deadline:
                    raise
                self.wait_healthy()


def _wait_until(
    check: Callable[[], Any], timeout: float, what: str, diagnosis: Callable[[], str]
) -> Any:
    """Poll ``check`` until it returns something truthy; a Redis error counts as no."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            result = check()
        except redis.RedisError:
            result = None
        if result:
            return result
        if time.monotonic() >= deadline:
            raise TimeoutError(f"not within {timeout:g} s: {what}\n{diagnosis()}")
        time.sleep(0.05)
