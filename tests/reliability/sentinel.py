"""A Redis Sentinel deployment for one test: a master, a replica and three sentinels.

Every process is started here on free loopback ports and stopped by ``cleanup``.
Sentinels detect a dead master after ``DOWN_AFTER_MS``; ``failover`` forces one
with ``SENTINEL FAILOVER`` and waits until every sentinel and both servers agree
on the new roles.
"""

from __future__ import annotations

import uuid

import redis

from tests.redis_harness import RedisServer, redis_binary
from tests.reliability.processes import wait_until

DOWN_AFTER_MS = 1000
"""Milliseconds without a reply after which a sentinel considers a server down."""
FAILOVER_TIMEOUT_MS = 5000


class SentinelProcess(RedisServer):
    """``redis-server sentinel.conf --sentinel`` monitoring one master."""

    def __init__(self, service: str, master_port: int) -> None:
        super().__init__()
        self.conf = self.dir / "sentinel.conf"
        self.conf.write_text(
            "\n".join(
                [
                    f"port {self.port}",
                    "bind 127.0.0.1",
                    f"dir {self.dir}",
                    f"logfile {self.log}",
                    f"sentinel monitor {service} 127.0.0.1 {master_port} 2",
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
    """A master, one replica and three sentinels, all on loopback."""

    def __init__(self) -> None:
        self.service = f"sb-{uuid.uuid4().hex[:8]}"
        no_delay = ["--repl-diskless-sync-delay", "0"]  # the old master resyncs at once
        self.master = RedisServer(args=no_delay)
        self.replica = RedisServer(args=no_delay)
        self.sentinels: list[SentinelProcess] = []

    @property
    def addresses(self) -> tuple[tuple[str, int], ...]:
        return tuple(("127.0.0.1", s.port) for s in self.sentinels)

    @property
    def env_value(self) -> str:
        """``STEPBARRIER_SENTINELS`` for this group."""
        return ",".join(f"{host}:{port}" for host, port in self.addresses)

    def start(self) -> SentinelGroup:
        self.master.start()
        self.replica.args += ["--replicaof", "127.0.0.1", str(self.master.port)]
        self.replica.start()
        wait_until(lambda: self.role(self.replica) == ("slave", "up"), 15.0, "replica in sync")
        self.sentinels = [SentinelProcess(self.service, self.master.port) for _ in range(3)]
        for sentinel in self.sentinels:
            sentinel.start()
        # every sentinel knows the replica and the two other sentinels
        wait_until(self._settled, 30.0, "sentinels know the replica and each other", 0.1)
        return self

    def _ask(self, sentinel: SentinelProcess, *command: str) -> object:
        client = sentinel.client(decode_responses=True, socket_timeout=2)
        try:
            return client.execute_command("SENTINEL", *command)
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
        client = server.client(decode_responses=True, socket_timeout=2)
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
