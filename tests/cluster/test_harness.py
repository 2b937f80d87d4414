"""The local cluster harness itself: topology, key spread, slot migration and failover.

These tests use ``redis.cluster.RedisCluster`` directly, not stepbarrier. They
share one cluster and run in file order: the failover comes last.
"""

from __future__ import annotations

import time

import pytest
import redis

from tests.cluster.conftest import Timings
from tests.cluster_harness import SLOTS, LocalCluster

pytestmark = pytest.mark.cluster

LIBRARY = """#!lua name=harness_probe
redis.register_function('harness_probe', function(keys, args)
  return redis.call('INCR', keys[1])
end)
"""


def test_the_cluster_has_three_masters_each_with_a_synced_replica(cluster: LocalCluster) -> None:
    nodes = cluster.nodes
    masters = {node.node_id for node in nodes if node.role == "master"}
    replicas = [node for node in nodes if node.role == "replica"]
    assert len(masters) == 3
    assert sorted(node.master_id or "" for node in replicas) == sorted(masters)
    for replica in replicas:
        info = cluster.node_client(replica.port).info("replication")
        assert info["master_link_status"] == "up"


def test_the_three_masters_own_all_16384_slots(cluster: LocalCluster) -> None:
    owners = [cluster.owner_of_slot(slot) for slot in range(0, SLOTS, 97)] + [
        cluster.owner_of_slot(SLOTS - 1)
    ]
    assert set(owners) == set(cluster.masters)
    for port in cluster.masters:
        info = cluster.node_client(port, decode_responses=True).cluster("INFO")
        assert info["cluster_state"] == "ok"
        assert int(info["cluster_slots_ok"]) == SLOTS


def test_keys_of_100_hash_tags_spread_over_all_three_masters(cluster: LocalCluster) -> None:
    client = cluster.client()
    owners = set()
    for i in range(100):
        key = f"{{job-{i}}}:state"
        client.set(key, i)
        owner = cluster.owner_of(key)
        owners.add(owner)
        assert cluster.owner_of(f"{{job-{i}}}:steps") == owner  # same tag, same slot
        assert cluster.node_client(owner).get(key) == str(i).encode()  # no MOVED: really there
    assert owners == set(cluster.masters)


def test_a_plain_client_of_another_master_is_redirected(cluster: LocalCluster) -> None:
    key = "{redirect}:state"
    other = next(port for port in cluster.masters if port != cluster.owner_of(key))
    with pytest.raises(redis.exceptions.MovedError):
        cluster.node_client(other).get(key)


def test_load_functions_reaches_every_master(cluster: LocalCluster) -> None:
    assert cluster.load_functions(LIBRARY) == "harness_probe"
    client = cluster.client()
    keys = {cluster.owner_of(f"{{fn-{i}}}"): f"{{fn-{i}}}" for i in range(30)}
    assert set(keys) == set(cluster.masters)
    for key in keys.values():
        assert client.fcall("harness_probe", 1, key) == 1


def test_a_migrated_slot_keeps_its_key_readable_through_a_cluster_client(
    cluster: LocalCluster, timings: Timings
) -> None:
    client = cluster.client()
    key = "{migrating-job}:state"
    client.set(key, "before")
    source = cluster.owner_of(key)
    target = next(port for port in cluster.masters if port != source)

    started = time.monotonic()
    moved = cluster.migrate_slot(cluster.slot_of(key), target)
    timings.record("slot migration (1 key)", time.monotonic() - started)

    assert moved == 1
    assert cluster.owner_of(key) == target
    assert cluster.node_client(target).get(key) == b"before"
    assert client.get(key) == b"before"  # its slot cache still says source: follows MOVED
    client.set(key, "after")
    assert cluster.node_client(target).get(key) == b"after"


def test_a_migrated_slot_moves_every_key_in_batches(
    cluster: LocalCluster, timings: Timings
) -> None:
    client = cluster.client()
    keys = [f"{{bulk-job}}:waiter:{i}" for i in range(250)]
    for key in keys:
        client.set(key, key)
    slot = cluster.slot_of(keys[0])
    source = cluster.owner_of(keys[0])
    target = next(port for port in cluster.masters if port != source)

    started = time.monotonic()
    moved = cluster.migrate_slot(slot, target)
    timings.record(f"slot migration ({moved} keys)", time.monotonic() - started)

    assert moved == len(keys)

    assert cluster.node_client(source).cluster("COUNTKEYSINSLOT", slot) == 0
    assert cluster.node_client(target).cluster("COUNTKEYSINSLOT", slot) == len(keys)
    assert [client.get(key) for key in keys] == [key.encode() for key in keys]


def test_a_killed_master_is_replaced_by_its_replica_with_its_data(
    cluster: LocalCluster, timings: Timings
) -> None:
    client = cluster.client()
    key = "{failover-job}:state"
    owner = cluster.owner_of(key)
    writer = cluster.node_client(owner)
    writer.set(key, "kept")
    assert writer.execute_command("WAIT", 1, 1000) == 1  # type: ignore[no-untyped-call]
    replica = next(n.port for n in cluster.nodes if n.master_id == cluster.node_id(owner))

    started = time.monotonic()
    cluster.kill_master(owner)
    promoted = cluster.wait_promoted(owner)
    timings.record("failover (SIGKILL to healthy)", time.monotonic() - started)

    assert promoted == replica
    assert len(cluster.masters) == 3
    assert cluster.owner_of(key) == promoted
    assert [node.failed for node in cluster.nodes if node.port == owner] == [True]
    assert client.get(key) == b"kept"  # a client made before the kill finds the new master
    assert cluster.client().get(key) == b"kept"
