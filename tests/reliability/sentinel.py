"""A Redis Sentinel deployment for one test: a master, a replica and three sentinels.

Every process is started here on free loopback ports and stopped by ``cleanup``.
Sentinels detect a dead master after ``DOWN_AFTER_MS``; ``failover`` forces one
with ``SENTINEL FAILOVER`` and waits until every sentinel and both servers agree
on the new roles. With a ``Lockdown`` every process speaks TLS only and lets in
only known ACL users.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from pathlib import Path

import redis

from stepbarrier._protocol.roles import role_rules
from stepbarrier._redis.functions import install_functions
from tests.redis_harness import RedisServer, redis_binary
from tests.reliability.processes import wait_until
from tests.security.certificates import Authority, Issued

DOWN_AFTER_MS = 1000
"""Milliseconds without a reply after which a sentinel considers a server down."""
FAILOVER_TIMEOUT_MS = 5000


ADMIN = "admin"
"""The ACL user of a ``Lockdown``'s Sentinels, replica and harness (all commands)."""


@dataclass(frozen=True)
class Lockdown:
    """What makes a ``SentinelGroup`` TLS-only and closed to unknown users.

    Servers and Sentinels listen on TLS only and require a client certificate
    (``tls-auth-clients yes``, Redis's default); they present ``client`` when
    they connect to one another. Their ``default`` user is off. The Sentinels,
    the replica and this harness log in as ``ADMIN``, which also loads the
    Functions library, as an installer would. An application logs in as
    ``user`` with ``password`` everywhere: on the servers it has the rights of
    the shipped chief and worker roles together (``app_rules``), and no code of
    its own; on the Sentinels it may only ask for the master.
    """

    ca: Authority
    server: Issued
    client: Issued
    user: str
    password: str
    admin_password: str

    @classmethod
    def create(cls, directory: Path, *, user: str, password: str) -> Lockdown:
        """A new CA in ``directory`` with one server and one client certificate."""
        ca = Authority(directory, "sentinel-group")
        return cls(
            ca=ca,
            server=ca.issue("sentinel-group-server", server=True),
            client=ca.issue("sentinel-group-client", server=False),
            user=user,
            password=password,
            admin_password=f"admin-{uuid.uuid4().hex}",
        )

    @property
    def server_tls(self) -> tuple[str, str, str]:
        """``RedisServer``'s ``tls`` argument."""
        return (str(self.server.cert), str(self.server.key), str(self.ca.path))

    def outgoing_tls(self) -> dict[str, str]:
        """Settings for the connections a server or Sentinel opens itself."""
        return {
            "tls-replication": "yes",
            "tls-client-cert-file": str(self.client.cert),
            "tls-client-key-file": str(self.client.key),
        }

    def server_users(self) -> list[str]:
        return [
            "user default off",
            f"user {ADMIN} on >{self.admin_password} ~* &* +@all",
            f"user {self.user} on >{self.password} {app_rules()}",
        ]

    def sentinel_users(self) -> list[str]:
        return [
            "user default off",
            f"user {ADMIN} on >{self.admin_password} +@all",
            f"user {self.user} on >{self.password} -@all +ping "
            "+sentinel|masters +sentinel|get-master-addr-by-name +sentinel|replicas",
        ]

    def admin_options(self) -> dict[str, object]:
        """redis-py options of the harness's own clients."""
        return {
            "ssl": True,
            "ssl_ca_certs": str(self.ca.path),
            "ssl_certfile": str(self.client.cert),
            "ssl_keyfile": str(self.client.key),
            "username": ADMIN,
            "password": self.admin_password,
        }


def app_rules() -> str:
    """The chief's rules for every job, plus the worker's commands: one user that
    both publishes and waits (the tests run both sides with one URL), and PING,
    with which the tests check a connection."""
    chief = role_rules("chief", "*").split()
    worker = role_rules("worker", "*").split()
    extra = [w for w in worker if w.startswith("+") and w not in chief]
    return " ".join([*chief, *extra, "+ping"])


class SentinelProcess(RedisServer):
    """``redis-server sentinel.conf --sentinel`` monitoring one master."""

    def __init__(self, service: str, master_port: int, lockdown: Lockdown | None = None) -> None:
        super().__init__()
        listen = [f"port {self.port}"]
        secured: list[str] = []
        master_login: list[str] = []  # after "sentinel monitor", which it refers to
        if lockdown is not None:
            cert, key, ca = lockdown.server_tls
            listen = ["port 0", f"tls-port {self.port}"]
            secured = [
                f"tls-cert-file {cert}",
                f"tls-key-file {key}",
                f"tls-ca-cert-file {ca}",
                *(f"{name} {value}" for name, value in lockdown.outgoing_tls().items()),
                *lockdown.sentinel_users(),
                f"sentinel sentinel-user {ADMIN}",
                f"sentinel sentinel-pass {lockdown.admin_password}",
            ]
            master_login = [
                f"sentinel auth-user {service} {ADMIN}",
                f"sentinel auth-pass {service} {lockdown.admin_password}",
            ]
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            "\n".join(
                [
                    *listen,
                    "bind 127.0.0.1",
                    f"dir {self.dir}",
                    f"logfile {self.log}",
                    *secured,
                    f"sentinel monitor {service} 127.0.0.1 {master_port} 2",
                    *master_login,
                    f"sentinel down-after-milliseconds {service} {DOWN_AFTER_MS}",
                    f"sentinel failover-timeout {service} {FAILOVER_TIMEOUT_MS}",
                    f"sentinel parallel-syncs {service} 1",
                    "",
                ]
            )
        )

    def command(self) -> list[str]:
        return [redis_binary(), str(self.conf), "--sentinel"]


class SentinelGroup:
    """A master, one replica and three sentinels, all on loopback.

    Args:
        lockdown: Serve TLS only and require ACL users everywhere.
    """

    def __init__(self, lockdown: Lockdown | None = None) -> None:
        self.service = f"sb-{uuid.uuid4().hex[:8]}"
        self.lockdown = lockdown
        self.master = self._server()
        self.replica = self._server()
        self.sentinels: list[SentinelProcess] = []

    def _server(self) -> RedisServer:
        no_delay = ["--repl-diskless-sync-delay", "0"]  # the old master resyncs at once
        if self.lockdown is None:
            return RedisServer(args=no_delay)
        server = RedisServer(tls=self.lockdown.server_tls)
        acl = server.dir / "users.acl"
        acl.write_text("\n".join([*self.lockdown.server_users(), ""]))
        server.args += [*no_delay, "--aclfile", str(acl)]
        # as a replica (the replica now, the master after a failover) it logs in as admin
        server.args += ["--masteruser", ADMIN, "--masterauth", self.lockdown.admin_password]
        for name, value in self.lockdown.outgoing_tls().items():
            server.args += [f"--{name}", value]
        return server

    def client(self, server: RedisServer, **options: object) -> redis.Redis:
        """An admin client of one of the group's servers or Sentinels."""
        if self.lockdown is not None:
            options = {**self.lockdown.admin_options(), **options}
        return server.client(**options)

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple(("127.0.0.1", s.port) for s in self.sentinels)

    @property
    def env_value(self) -> str:
        """``STEPBARRIER_SENTINELS`` for this group."""
        return ",".join(f"{host}:{port}" for host, port in self.addresses)

    def start(self) -> SentinelGroup:
        self.master.start()
        admin = self.client(self.master)
        try:  # as ops does: an administrator loads the library; the replica copies it
            install_functions(admin)
        finally:
            admin.close()
        self.replica.args += ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica.start()
        wait_until(lambda: self.role(self.replica) == ("slave", "up"), 15.0, "replica in sync")
        self.sentinels = [
            SentinelProcess(self.service, self.master.port, self.lockdown) for _ in range(3)
        ]
        for sentinel in self.sentinels:
            sentinel.start()
        # every sentinel knows the replica and the two other sentinels
        wait_until(self._settled, 30.0, "sentinels know the replica and each other", 0.1)
        return self

    def _ask(self, sentinel: SentinelProcess, *command: str) -> object:
        client = self.client(sentinel, decode_responses=True, socket_timeout=2)
        try:
            return client.execute_command("SENTINEL", *command)  # type: ignore[no-untyped-call]
        finally:
            client.close()

    def _settled(self) -> bool:
        for sentinel in self.sentinels:
            replicas = self._ask(sentinel, "REPLICAS", self.service)
            peers = self._ask(sentinel, "SENTINELS", self.service)
            assert isinstance(replicas, list) and isinstance(peers, list)
            healthy = [
                r
                for r in replicas
                if _fields(r).get("master-link-status") == "ok"
                and "disconnected" not in _fields(r).get("flags", "")
            ]
            if not healthy or len(peers) < 2:
                return False
        return True

    def role(self, server: RedisServer) -> tuple[str, str]:
        """``("master", "")`` or ``("slave", link status)``."""
        client = self.client(server, decode_responses=True, socket_timeout=2)
        try:
            info = client.info("replication")
        except redis.RedisError:
            return ("unreachable", "")
        finally:
            client.close()
        return (str(info["role"]), str(info.get("master_link_status", "")))

    def master_port(self, sentinel: SentinelProcess) -> int:
        reply = self._ask(sentinel, "GET-MASTER-ADDR-BY-NAME", self.service)
        assert isinstance(reply, list)
        return int(reply[1])

    def failover(self, timeout: float = 30.0) -> tuple[RedisServer, RedisServer]:
        """Force a failover; return ``(new master, old master)`` once all agree."""
        old, new = self.master, self.replica
        assert self._ask(self.sentinels[0], "FAILOVER", self.service) in ("OK", b"OK", True)

        def agreed() -> bool:
            return (
                all(self.master_port(s) == new.port for s in self.sentinels)
                and self.role(new)[0] == "master"
                and self.role(old) == ("slave", "up")
            )

        wait_until(agreed, timeout, "sentinels, new master and old master agree", 0.1)
        self.master, self.replica = new, old
        return new, old

    def cleanup(self) -> None:
        for server in [*self.sentinels, self.master, self.replica]:
            server.cleanup()


def _fields(flat: object) -> dict[str, str]:
    if isinstance(flat, dict):
        return {str(k): str(v) for k, v in flat.items()}
    assert isinstance(flat, list)
    return {str(k): str(v) for k, v in zip(flat[0::2], flat[1::2], strict=False)}
