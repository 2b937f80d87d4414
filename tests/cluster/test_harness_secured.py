"""The harness with TLS everywhere and ops/redis/users.acl loaded, and its cleanup.

This module starts clusters of its own after ``test_harness.py``'s: clusters
come and go within one session and leave nothing behind.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from tests.cluster.conftest import Timings
from tests.cluster_harness import BUS_OFFSET, HOST, LocalCluster
from tests.conftest import ROOT
from tests.redis_harness import pid_alive

pytestmark = pytest.mark.cluster

USERS_ACL = Path(ROOT, "ops", "redis", "users.acl")
MONITOR = {"username": "monitor", "password": "monitor-example-password"}
LIBRARY = """#!lua name=secured_probe
redis.register_function('secured_probe', function(keys, args)
  return redis.call('INCR', keys[1])
end)
"""
NO_RETRY = Retry(NoBackoff(), 0)
"""For clients that must fail: redis-py would retry a refused login for about 3 s."""


@pytest.fixture(scope="module")
def secured(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A TLS-only cluster whose nodes let in only the ACL's users and the harness."""
    started = time.monotonic()
    with LocalCluster(aclfile=USERS_ACL, tls=True) as local:
        elapsed = time.monotonic() - started
        Timings(request.module.__name__).record("TLS + ACL cluster start", elapsed)
        yield local


def test_a_tls_cluster_is_reached_over_rediss(secured: LocalCluster) -> None:
    assert secured.seed_url.startswith("rediss://")
    client = secured.client()
    client.set("{tls-job}:state", 1)
    assert client.get("{tls-job}:state") == b"1"


def test_a_tls_cluster_refuses_plain_text(secured: LocalCluster) -> None:
    plain = redis.Redis(host=HOST, port=secured.seed_port, socket_timeout=2.0, retry=NO_RETRY)
    with pytest.raises(redis.ConnectionError):
        plain.ping()
    plain.close()


def test_the_acl_file_holds_its_users_to_their_rules(secured: LocalCluster) -> None:
    key = "stepbarrier:{acl-job}:state"
    secured.client().set(key, 5)
    monitor = secured.node_client(secured.owner_of(key), **MONITOR)
    assert monitor.get(key) == b"5"
    with pytest.raises(redis.exceptions.NoPermissionError):
        monitor.set(key, 6)
    with pytest.raises(redis.AuthenticationError):
        secured.node_client(
            secured.seed_port, username="default", password="", retry=NO_RETRY
        ).ping()


def test_a_slot_migrates_with_auth2_over_tls(secured: LocalCluster, timings: Timings) -> None:
    client = secured.client()
    key = "stepbarrier:{acl-migrating}:state"
    client.set(key, "moved")
    target = next(port for port in secured.masters if port != secured.owner_of(key))

    started = time.monotonic()
    assert secured.migrate_slot(secured.slot_of(key), target) == 1
    timings.record("slot migration over TLS with AUTH2", time.monotonic() - started)

    assert secured.owner_of(key) == target
    assert client.get(key) == b"moved"


def test_a_replica_synced_over_tls_takes_over(secured: LocalCluster, timings: Timings) -> None:
    key = "stepbarrier:{acl-failover}:state"
    owner = secured.owner_of(key)
    writer = secured.node_client(owner)
    writer.set(key, "kept")
    assert writer.execute_command("WAIT", 1, 1000) == 1  # type: ignore[no-untyped-call]

    started = time.monotonic()
    secured.kill_master(owner)
    promoted = secured.wait_promoted(owner)
    timings.record("failover over TLS", time.monotonic() - started)

    assert secured.owner_of(key) == promoted
    assert secured.client().get(key) == b"kept"


def test_functions_load_as_the_admin_even_on_a_master_without_replica(
    secured: LocalCluster,
) -> None:
    assert secured.load_functions(LIBRARY) == "secured_probe"
    client = secured.client()
    keys = {
        secured.owner_of(f"stepbarrier:{{fn-{i}}}"): f"stepbarrier:{{fn-{i}}}" for i in range(30)
    }
    assert set(keys) == set(secured.masters)
    assert [client.fcall("secured_probe", 1, key) for key in keys.values()] == [1, 1, 1]


def test_a_cluster_leaves_no_process_directory_or_listener_behind() -> None:
    with LocalCluster() as cluster:
        pids = [server.process.pid for server in cluster.servers.values() if server.process]
        directories = [cluster.dir, *(server.dir for server in cluster.servers.values())]
        ports = [*cluster.servers, *(port + BUS_OFFSET for port in cluster.servers)]
        cluster.client().set("{short-lived}", 1)
        assert len(pids) == 6
        assert all(directory.is_dir() for directory in directories)

    assert not [pid for pid in pids if pid_alive(pid)]
    assert not [directory for directory in directories if directory.exists()]
    assert not [port for port in ports if listening(port)]


def listening(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1.0):
            return True
    except OSError:
        return False
