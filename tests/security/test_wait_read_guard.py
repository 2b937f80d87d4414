"""Issue 35: a wait's read of a hash, guarded by its encoding instead of a length per field.

A hash Redis keeps as a listpack holds no value longer than
``hash-max-listpack-value`` (64 bytes by default, at most ``MAX_ARGUMENT`` by the
operator's bound), so the library reads it with one ``HMGET`` and measures the
values in Lua; any other hash has each value's length asked first (``HSTRLEN``),
so that a planted megabyte is never copied. Under a users.acl of an older
version, without ``+object|encoding`` (nor ``+zcount``), every read and
registration still works, the old way. Measured by what Redis counted (``INFO
commandstats`` calls, ``INFO stats`` output bytes), never by wall-clock time.
"""

from __future__ import annotations

import dataclasses
import re
import threading
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter
from stepbarrier._protocol.calls import read_call, register_call
from stepbarrier._protocol.library import MAX_TASK_VALUE
from stepbarrier._protocol.roles import role_rules
from stepbarrier._protocol.wire import WAIT_FIELDS
from stepbarrier._redis.functions import RedisCode, install_functions
from stepbarrier._worker.snapshot import parse_snapshot
from tests.redis_harness import RedisServer

PLANTED = 1_000_000
"""Bytes of the value planted in a hash: far over anything the library reads."""
NEW_RULES = ("+object|encoding", "+zcount")
"""What this version's worker holds and an older users.acl's did not."""


def calls(admin: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT."""
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def sent_bytes(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_net_output_bytes"])


def worker_url(server: RedisServer, admin: redis.Redis, *, older: bool) -> Iterator[str]:
    """A worker's URL under this version's rules, or (``older``) an older users.acl's."""
    rules = role_rules("worker", "*")
    if older:
        for rule in NEW_RULES:
            rules = rules.replace(f" {rule} ", " ")
        assert not any(rule in rules.split() for rule in NEW_RULES)
    user, password = f"guard-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
    arguments = re.findall(r"\([^)]*\)|\S+", rules)  # a selector ``(...)`` is one
    admin.execute_command("ACL", "SETUSER", user, "on", f">{password}", *arguments)
    try:
        yield server.url.replace("redis://", f"redis://{user}:{password}@")
    finally:
        admin.acl_deluser(user)


@pytest.fixture
def older_worker(redis_server: RedisServer, client: redis.Redis) -> Iterator[str]:
    yield from worker_url(redis_server, client, older=True)


@pytest.fixture
def worker(redis_server: RedisServer, client: redis.Redis) -> Iterator[str]:
    yield from worker_url(redis_server, client, older=False)


@pytest.fixture
def published(config: BarrierConfig, client: redis.Redis) -> BarrierConfig:
    """``config``'s job with its state at step 5 (a listpack hash), the chief gone."""
    install_functions(client, replace=True)  # the worker users may not load it
    chief = StepPublisher(config)
    chief.publish(5)
    assert chief.flush(10.0)
    chief.close(done=False, timeout=1.0)
    assert client.object("encoding", config.keys.state) == b"listpack"
    return config


def wait_read(config: BarrierConfig, url: str | None = None) -> list[object]:
    config = config if url is None else dataclasses.replace(config, redis_url=url)
    with redis.Redis.from_url(config.redis_url) as reader:
        reply = RedisCode(reader, config).call(
            *read_call(config.keys.state, config.keys.reset, wait=True)
        )
    return list(reply)


def test_a_listpack_state_is_read_with_one_hmget_and_no_length_per_field(
    published: BarrierConfig, client: redis.Redis, worker: str
) -> None:
    client.config_resetstat()
    reply = wait_read(published, worker)
    counted = calls(client)
    # the values alone, in WAIT_FIELDS' order: the same state as the named pairs
    assert reply[2] == b"values" and len(reply) == 3 + len(WAIT_FIELDS)
    assert reply[3 + WAIT_FIELDS.index("step")] == b"5"
    state = parse_snapshot(reply).state
    assert (state.step, state.problem) == (5, None)
    assert counted.get("hmget") == 1 and counted.get("object|encoding") == 1
    assert counted.get("hstrlen", 0) == 0
    # the commands inside the call: the marker's TYPE, then HLEN, OBJECT ENCODING, HMGET
    inside = sum(n for name, n in counted.items() if name not in ("fcall_ro", "auth", "hello"))
    assert inside - counted.get("config|resetstat", 0) <= 4


def test_a_planted_huge_value_keeps_the_length_check_of_each_field(
    published: BarrierConfig, client: redis.Redis, worker: str
) -> None:
    key = published.keys.state
    client.hset(key, "step", "x" * PLANTED)  # what only the chief's password could write
    assert client.object("encoding", key) == b"hashtable"
    client.config_resetstat()
    before = sent_bytes(client)
    reply = wait_read(published, worker)
    sent = sent_bytes(client) - before
    assert reply[2] == b"oversized"
    assert calls(client).get("hstrlen", 0) >= 1 and calls(client).get("hmget", 0) == 0
    assert sent < 10_000  # never the megabyte


def test_a_huge_value_in_another_field_is_checked_field_by_field_and_not_read(
    published: BarrierConfig, client: redis.Redis, worker: str
) -> None:
    key = published.keys.state
    client.hset(key, "planted", "x" * PLANTED)
    client.config_resetstat()
    before = sent_bytes(client)
    reply = wait_read(published, worker)
    sent = sent_bytes(client) - before
    assert reply[2] == b"hash" and b"step" in reply[3:]
    assert calls(client).get("hstrlen") == len(WAIT_FIELDS)
    assert sent < 10_000


def test_a_listpack_value_over_the_limit_is_refused_as_before(
    make_config: Callable[..., BarrierConfig], client: redis.Redis, worker: str
) -> None:
    """A task field under 64 bytes stays in a listpack, and is still over its limit."""
    config = make_config(task_id=0)
    install_functions(client, replace=True)
    key = config.keys.barrier("b")
    client.hset(key, mapping={"parties": "2", "t0": "9" * (MAX_TASK_VALUE + 20)})
    assert client.object("encoding", key) == b"listpack"
    with redis.Redis.from_url(dataclasses.replace(config, redis_url=worker).redis_url) as reader:
        reply = RedisCode(reader, config).call(*read_call(key, config.keys.reset))
    assert reply[2] == b"oversized"


def test_an_older_users_acl_reads_and_registers_the_old_way(
    published: BarrierConfig, client: redis.Redis, older_worker: str, worker: str
) -> None:
    expected = parse_snapshot(wait_read(published, worker))
    client.config_resetstat()
    older = wait_read(published, older_worker)
    assert older[2] == b"hash"  # the named pairs: no OBJECT ENCODING, no 'values'
    assert parse_snapshot(older) == expected
    counted = calls(client)
    # OBJECT ENCODING refused by the ACL: every field's length asked, as before
    assert counted.get("hstrlen") == len(WAIT_FIELDS) and counted.get("object|encoding", 0) == 0
    config = dataclasses.replace(published, redis_url=older_worker)
    with redis.Redis.from_url(older_worker) as writer:
        code = RedisCode(writer, config)
        for waiter in ("a", "b"):
            entry = {"host": "h"}
            code.call(*register_call(config.keys, waiter, 9, entry, registry_ttl=60, key_ttl=60))
    # without ZCOUNT each new waiter wakes the chief, as before
    assert client.lrange(config.keys.registrations, 0, -1) == [b"9", b"9"]


def test_an_older_users_acl_waits_and_is_released(
    config: BarrierConfig, client: redis.Redis, older_worker: str
) -> None:
    install_functions(client, replace=True)
    seen: list[int] = []
    with StepPublisher(config) as chief:
        chief.publish(2)
        assert chief.flush(10.0)
        with StepWaiter(dataclasses.replace(config, redis_url=older_worker)) as waiter:
            thread = threading.Thread(target=lambda: seen.append(waiter.wait(4, timeout=60)))
            thread.start()
            # its registration, heard by the chief, before the step it waits for
            while not client.zcount(config.keys.targets, 4, 4) and thread.is_alive():
                thread.join(0.01)
            chief.publish(4)
            thread.join(60)
    assert seen and seen[0] >= 4


def test_one_push_per_target_however_many_wait_for_it(
    published: BarrierConfig, client: redis.Redis, worker: str
) -> None:
    config = dataclasses.replace(published, redis_url=worker)
    with redis.Redis.from_url(worker) as writer:
        code = RedisCode(writer, config)
        for waiter in ("a", "b", "c"):
            entry = {"host": "h"}
            code.call(*register_call(config.keys, waiter, 9, entry, registry_ttl=60, key_ttl=60))
        code.call(*register_call(config.keys, "d", 19, {}, registry_ttl=60, key_ttl=60))
        # "a" moves to 19, which "d" waits for: no push; "b" waits again: no push
        code.call(*register_call(config.keys, "a", 19, {}, registry_ttl=60, key_ttl=60))
        code.call(*register_call(config.keys, "b", 9, {}, registry_ttl=60, key_ttl=60))
    assert client.lrange(config.keys.registrations, 0, -1) == [b"9", b"19"]
    assert client.zcount(config.keys.targets, 9, 9) == 2
