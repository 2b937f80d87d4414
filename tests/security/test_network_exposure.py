"""Issue 34, item 4: a network-only attacker locks every team out.

Redis counts a connection against ``maxclients`` from the moment it accepts it,
before any password, and any command (a ``PING`` that Redis refuses with
``NOAUTH`` too) resets the idle ``timeout``. Nothing in Redis prevents the
lock-out, so the shipped files keep strangers away from the port, and the docs
say so:

- ``ops/redis/redis.conf`` binds loopback: redis-server started with it listens
  on no other address of this machine (one started with the old ``bind *``
  does, on the same address: the check can see an exposure);
- ``maxclients`` is set, sized, and documented for what it does not do;
- the docs' statement, on a real server with the shipped configuration and
  ``maxclients`` lowered to 10: ten connections that never log in fill it, a
  ``PING`` each keeps them open past the idle timeout that closes a silent one,
  and a chief with its password is refused until a slot is free.

Nothing here measures wall-clock time: the waits are bounded, the outcomes are
what Redis answers. The compose files and the NetworkPolicy:
tests/repository/test_ops_network.py and tests/repository/test_ops_k8s.py.
"""

from __future__ import annotations

import ipaddress
import re
import secrets
import select
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stepbarrier._protocol.roles import password_hash
from tests.conftest import ROOT
from tests.ops_redis import (
    ACL_FILE,
    HARNESS_LINE,
    PASSWORDS,
    REDIS_CONF,
)
from tests.redis_harness import RedisServer, redis_binary

DOCS = Path(ROOT) / "docs"
NOAUTH = b"-NOAUTH"


def directives(text: str) -> dict[str, str]:
    pairs = (line.split(None, 1) for line in text.splitlines() if line.strip() and line[0] != "#")
    return {name: value.strip() for name, value in pairs}


def comment_before(text: str, directive: str) -> str:
    """The comment lines just above ``directive`` in a configuration file."""
    lines = text.splitlines()
    [index] = [i for i, line in enumerate(lines) if line.split(None, 1)[:1] == [directive]]
    comment: list[str] = []
    while index > 0 and lines[index - 1].startswith("#"):
        index -= 1
        comment.insert(0, lines[index].lstrip("# "))
    return " ".join(comment)


def section(page: str, heading: str) -> str:
    text = (DOCS / page).read_text()
    start = text.index(f"\n{heading}\n")
    level = heading.split()[0]
    end = text.find(f"\n{level} ", start + 1)
    return text[start : end if end != -1 else len(text)]


class Shipped(RedisServer):
    """redis-server with ops/redis/redis.conf as it is, but for a free port, a
    temporary directory, the given ACL file and ``options`` (no ``--bind`` unless
    given: the file's own is what is tested)."""

    def __init__(self, acl: Path, options: list[str]) -> None:
        super().__init__(args=["--aclfile", str(acl), *options])

    def command(self) -> list[str]:
        return [
            redis_binary(),
            str(REDIS_CONF),  # the configuration file first; the options win over it
            "--port",
            str(self.port),
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.log),
            *self.args,
        ]


@pytest.fixture
def servers() -> Iterator[list[RedisServer]]:
    started: list[RedisServer] = []
    try:
        yield started
    finally:
        for server in started:
            server.cleanup()


def start(servers: list[RedisServer], acl: Path, *options: str) -> Shipped:
    server = Shipped(acl, list(options))
    servers.append(server)
    server.start()
    return server


def locked_acl(directory: Path) -> tuple[Path, str]:
    """An ACL file that no one outside the test can log in with: the default user
    off, and an administrator with a random password (for a server that may
    listen beyond loopback for a moment)."""
    password = secrets.token_hex(16)
    path = directory / "locked.acl"
    path.write_text(
        "user default off resetpass resetkeys resetchannels -@all\n"
        f"user admin on #{password_hash(password)} ~* &* +@all\n"
    )
    return path, password


def shipped_acl(directory: Path) -> Path:
    """ops/redis/users.acl (the example users) and the tests' harness user."""
    path = directory / "shipped.acl"
    path.write_text(ACL_FILE.read_text() + HARNESS_LINE + "\n")
    return path


def machine_addresses() -> list[str]:
    """This machine's addresses other than loopback and link-local ones."""
    found: set[str] = set()
    ip = shutil.which("ip")
    if ip is not None:
        listing = subprocess.run(
            [ip, "-o", "addr", "show"], capture_output=True, text=True, check=False
        ).stdout
        found.update(re.findall(r"\binet6? ([0-9a-fA-F.:]+)/\d+", listing))
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:  # the source address of a route (no packet is sent)
            with socket.socket(family, socket.SOCK_DGRAM) as sock:
                sock.connect((probe, 9))
                found.add(sock.getsockname()[0])
        except OSError:
            pass
    usable = []
    for address in sorted(found):
        parsed = ipaddress.ip_address(address.split("%")[0])
        if not (parsed.is_loopback or parsed.is_link_local or parsed.is_unspecified):
            usable.append(str(parsed))
    return usable


def accepts(address: str, port: int) -> bool:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        try:
            sock.connect((address, port))
        except OSError:
            return False
        return True


# -- the shipped configuration ------------------------------------------------------


def test_the_shipped_redis_conf_binds_loopback_only() -> None:
    text = REDIS_CONF.read_text()
    found = directives(text)
    assert found["bind"] == "127.0.0.1 -::1"
    assert found["protected-mode"] == "yes"
    # it says where to widen it, and to what
    comment = comment_before(text, "bind")
    assert "docs/operations.md#network-exposure" in comment
    assert "never a public one" in comment


def test_redis_started_with_the_shipped_conf_listens_on_no_other_address(
    tmp_path: Path, servers: list[RedisServer]
) -> None:
    addresses = machine_addresses()
    if not addresses:
        pytest.skip("this machine has no address but loopback: the bind is checked as text")
    acl, password = locked_acl(tmp_path)
    shipped = start(servers, acl)
    admin = shipped.client(username="admin", password=password)
    try:
        assert admin.config_get("bind") == {"bind": "127.0.0.1 -::1"}
    finally:
        admin.close()
    assert accepts("127.0.0.1", shipped.port)
    for address in addresses:
        assert not accepts(address, shipped.port), f"the shipped redis.conf listens on {address}"
    # the check can see an exposure: the former `bind * -::*` listens there
    exposed = start(servers, acl, "--bind", "*", "-::*")
    assert any(accepts(address, exposed.port) for address in addresses)
    exposed.cleanup()


def test_maxclients_is_set_sized_and_documented() -> None:
    text = REDIS_CONF.read_text()
    maxclients = int(directives(text)["maxclients"])
    assert maxclients >= 1000  # every task of many jobs, 2 connections each
    comment = comment_before(text, "maxclients")
    for said in ("a chief holds 2", "before any password", "no defence", "network-exposure"):
        assert said in comment, said
    timeout = comment_before(text, "timeout")
    assert "any command resets the timer" in timeout and "NOAUTH" in timeout
    buffer = comment_before(text, "client-query-buffer-limit")
    assert "does not bound a command's arguments" in buffer
    exposure = section("operations.md", "## Network exposure")
    for said in ("`maxclients`", "never logs in", "`PING`", "`NOAUTH`", "networkpolicy.yaml"):
        assert said in exposure, said
    connections = section("operations.md", "## Connections and file descriptors")
    assert "Every connection counts" in connections
    assert "any command resets the timer" in connections
    assert "does not bound how\n  many arguments" in connections


# -- the docs' statement, on a real server ------------------------------------------


def send(sock: socket.socket, command: bytes) -> bytes:
    """One inline command and the first line of its reply (b"" if closed)."""
    sock.sendall(command + b"\r\n")
    reply = b""
    while not reply.endswith(b"\r\n"):
        chunk = sock.recv(256)
        if not chunk:
            return reply
        reply += chunk
    return reply


def connect_stranger(port: int) -> socket.socket:
    """A connection that never logs in, once Redis has accepted and counted it (its
    PING refused with NOAUTH). A slot still held by a connection that was closed
    a moment ago (the harness's readiness probe) is waited for, within bounds."""
    deadline = time.monotonic() + 30
    while True:
        sock = socket.create_connection(("127.0.0.1", port), 10)
        reply = send(sock, b"PING")
        if reply.startswith(NOAUTH):
            return sock
        sock.close()
        assert reply.startswith(b"-ERR max number of clients reached"), reply
        assert time.monotonic() < deadline, "a slot was never freed"
        time.sleep(0.05)


def closed_by_server(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1) == b""


def test_connections_that_never_log_in_fill_maxclients_and_lock_out_a_password(
    tmp_path: Path, servers: list[RedisServer]
) -> None:
    """maxclients lowered to 10 and timeout to 5 s, the rest as shipped: ten
    strangers hold every slot without a password, nine of them past the idle
    timeout with a refused PING each, while the chief is refused."""
    server = start(servers, shipped_acl(tmp_path), "--maxclients", "10", "--timeout", "5")
    strangers = [connect_stranger(server.port) for _ in range(10)]
    # no retries: redis-py's default (10, with backoff) would wait for the timeout
    once = {"socket_timeout": 10, "retry": Retry(NoBackoff(), 0)}
    chief = server.client(username="chief", password=PASSWORDS["chief"], **once)
    worker = server.client(username="worker", password=PASSWORDS["worker"], **once)
    try:
        with pytest.raises(redis.ConnectionError, match="max number of clients reached"):
            chief.time()

        # the last one stays silent, the others send a PING every 0.2 s: the idle
        # timeout closes the silent one only (a bounded wait, nothing timed)
        *pinging, silent = strangers
        deadline = time.monotonic() + 60
        while not closed_by_server(silent):
            assert time.monotonic() < deadline, "the idle timeout never closed a silent connection"
            for stranger in pinging:
                assert send(stranger, b"PING").startswith(NOAUTH), "a pinging stranger was closed"
            time.sleep(0.2)
        # older than the silent one, and still open: a refused PING resets the timer
        for stranger in pinging:
            assert send(stranger, b"PING").startswith(NOAUTH)

        assert chief.time()  # the slot the timeout freed
        with pytest.raises(redis.ConnectionError, match="max number of clients reached"):
            worker.time()  # and full again
    finally:
        for each in strangers:
            each.close()
        chief.close()
        worker.close()
