"""A small network of Linux network namespaces, built and removed by one test.

One namespace holds a bridge (the switch); every host (Redis, the chief, each
worker) is a namespace of its own whose ``eth0`` is a veth pair plugged into a
port of that bridge. Cutting a host's link takes its switch port down, as when
a cable is pulled: packets vanish, nothing is refused, connections hang.

Nothing is created in the caller's namespace; the addresses (``SUBNET``) exist
only inside these namespaces, and ``remove`` deletes every namespace (their
interfaces go with them).
"""

from __future__ import annotations

import contextlib
import subprocess
import time
import uuid
from dataclasses import dataclass

from tests.redis_harness import RedisServer

SUBNET = "10.213.0"
"""The hosts' /24, private to this set of namespaces."""


class NamespaceError(RuntimeError):
    """An ``ip`` command failed."""


def ip(*args: str) -> str:
    result = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        raise NamespaceError(f"ip {' '.join(args)}: {result.stderr.strip()}")
    return result.stdout


@dataclass(frozen=True)
class Host:
    """One namespace on the switch."""

    namespace: str
    address: str
    port: str
    """The host's port on the switch (an interface in the switch namespace)."""

    @property
    def prefix(self) -> list[str]:
        """Runs a command inside this host."""
        return ["ip", "netns", "exec", self.namespace]


class Network:
    """A switch and its hosts; use ``with`` or call ``remove``."""

    def __init__(self) -> None:
        self.tag = f"sb{uuid.uuid4().hex[:6]}"
        self.switch = f"{self.tag}-switch"
        self.hosts: dict[str, Host] = {}
        self._namespaces: list[str] = []

    def _add_namespace(self, name: str) -> None:
        ip("netns", "add", name)
        self._namespaces.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def create(self) -> Network:
        self._add_namespace(self.switch)
        ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        ip("-n", self.switch, "link", "set", "br0", "up")
        return self

    def add_host(self, name: str) -> Host:
        number = len(self.hosts) + 1
        host = Host(f"{self.tag}-{name}", f"{SUBNET}.{number}", f"port{number}")
        self._add_namespace(host.namespace)
        ip(
            "-n", self.switch, "link", "add", host.port, "type", "veth",
            "peer", "name", "eth0", "netns", host.namespace,
        )  # fmt: skip
        ip("-n", self.switch, "link", "set", host.port, "master", "br0", "up")
        ip("-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", "eth0")
        ip("-n", host.namespace, "link", "set", "eth0", "up")
        self.hosts[name] = host
        return host

    def cut(self, host: Host) -> None:
        """Unplug ``host``: its switch port goes down."""
        ip("-n", self.switch, "link", "set", host.port, "down")

    def restore(self, host: Host) -> None:
        ip("-n", self.switch, "link", "set", host.port, "up")

    def remove(self) -> None:
        for name in reversed(self._namespaces):
            with contextlib.suppress(NamespaceError):  # already gone
                ip("netns", "del", name)
        self._namespaces.clear()

    def __enter__(self) -> Network:
        return self.create()

    def __exit__(self, *exc: object) -> None:
        self.remove()


class NamespacedRedis(RedisServer):
    """A ``redis-server`` inside ``host``, listening on the host's address."""

    def __init__(self, host: Host) -> None:
        super().__init__()
        self.host = host

    @property
    def url(self) -> str:
        return f"redis://{self.host.address}:{self.port}/0"

    def command(self) -> list[str]:
        listen = ["--bind", self.host.address, "--protected-mode", "no"]
        return [*self.host.prefix, *super().command(), *listen]

    def cli(self, *args: str) -> str:
        """``redis-cli`` run inside the Redis host."""
        result = subprocess.run(
            [*self.host.prefix, "redis-cli", "-h", self.host.address, "-p", str(self.port), *args],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return result.stdout

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                raise RuntimeError(f"redis-server exited at start: {self.log.read_text()[-2000:]}")
            if self.cli("PING").strip() == "PONG":
                return
            time.sleep(0.05)
        raise RuntimeError(f"redis-server did not answer on {self.url} within {timeout} s")
