"""Fuzzed payloads: whatever sits in a job's keys or travels on its channel, waiters
log it and wait for a valid step, status reports it, and the chief carries on."""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter, read_status
from tests.redis_harness import RedisServer

FUZZ = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

numbers_as_text = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["", " ", "1e3", "0x10", "٣", "12abc", "-0"]),
)
values = st.one_of(st.binary(max_size=40), numbers_as_text.map(str.encode))
state_fields = st.dictionaries(
    st.sampled_from([b"step", b"generation", b"done", b"heartbeat_ms", b"chief", b"\xff"]),
    values,
    min_size=1,
)


def fresh_config(server: RedisServer, **extra: Any) -> BarrierConfig:
    return BarrierConfig(job=f"fuzz-{uuid.uuid4().hex[:10]}", redis_url=server.url, **extra)


def write_garbage(client: redis.Redis, key: str, kind: str, fields: dict[bytes, bytes]) -> None:
    client.delete(key)
    if kind == "hash":
        client.hset(key, mapping=fields)
    elif kind == "string":
        client.set(key, b"".join(fields.values()) or b"\xff")
    elif kind == "list":
        client.rpush(key, *fields.values())
    elif kind == "set":
        client.sadd(key, *fields.values())
    elif kind == "zset":
        client.zadd(key, {v or b"m": i for i, v in enumerate(fields.values())})


kinds = st.sampled_from(["hash", "string", "list", "set", "zset"])


@FUZZ
@given(state=state_fields, kind=kinds, reset=st.one_of(st.none(), values), waiter=state_fields)
def test_status_reports_garbage_instead_of_crashing(
    redis_server: RedisServer,
    client: redis.Redis,
    state: dict[bytes, bytes],
    kind: str,
    reset: bytes | None,
    waiter: dict[bytes, bytes],
) -> None:
    config = fresh_config(redis_server)
    keys = config.keys
    write_garbage(client, keys.state, kind, state)
    if reset is not None:
        client.set(keys.reset, reset)
    client.hset(keys.waiter("x-1"), mapping=waiter)
    status = read_status(config, client)
    assert status.job == config.job
    assert status.step is None or status.step >= 0
    if kind != "hash":
        assert status.problems, "a state key of the wrong type must be reported"
    client.delete(*keys.all_fixed(), keys.waiter("x-1"))


@FUZZ
@given(state=state_fields, kind=kinds, targets=kinds, registrations=kinds)
def test_the_chief_repairs_or_ignores_garbage_and_publishes(
    redis_server: RedisServer,
    client: redis.Redis,
    state: dict[bytes, bytes],
    kind: str,
    targets: str,
    registrations: str,
) -> None:
    config = fresh_config(redis_server, heartbeat=0.2)
    keys = config.keys
    write_garbage(client, keys.state, kind, state)
    write_garbage(client, keys.targets, targets, state)
    write_garbage(client, keys.registrations, registrations, state)
    publisher = StepPublisher(config, client)
    try:
        publisher.publish(7)
        assert publisher.flush(5.0), publisher.last_error
        assert client.hget(keys.state, "step") == b"7"
        assert publisher._thread.is_alive() and publisher._listener.is_alive()
    finally:
        publisher.close(done=False)
        client.delete(*keys.all_fixed())


class Waiting:
    def __init__(self, config: BarrierConfig, target: int) -> None:
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self.run, args=(config, target), daemon=True)
        self.thread.start()

    def run(self, config: BarrierConfig, target: int) -> None:
        try:
            with StepWaiter(config) as waiter:
                self.result = waiter.wait(target, timeout=10)
        except BaseException as exc:
            self.error = exc


def registered(config: BarrierConfig, client: redis.Redis) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if any(True for _ in client.scan_iter(match=config.keys.waiter_pattern)):
            return True
        time.sleep(0.01)
    return False


channel_garbage = st.lists(
    st.one_of(
        st.binary(max_size=60),
        st.builds(
            lambda s, g, d: f'{{"step": {s}, "generation": {g}, "done": {d}}}'.encode(),
            st.sampled_from(["-1", "1e400", '"9"', "null", "9.5", "[]", "99999999999999999999999"]),
            st.sampled_from(["1", "-1", '"x"', "null"]),
            st.sampled_from(["false", "0", '"no"', "null"]),
        ),
    ),
    min_size=1,
    max_size=8,
)


@FUZZ
@given(messages=channel_garbage, state=state_fields)
def test_waiters_ignore_garbage_and_are_released_by_a_valid_step(
    redis_server: RedisServer,
    client: redis.Redis,
    messages: list[bytes],
    state: dict[bytes, bytes],
) -> None:
    config = fresh_config(redis_server, heartbeat=0.2)
    write_garbage(client, config.keys.state, "hash", state)
    waiting = Waiting(config, 5)
    assert registered(config, client)
    for message in messages:
        client.publish(config.keys.channel, message)
    time.sleep(0.05)
    assert waiting.thread.is_alive(), f"released or crashed by garbage: {waiting.error!r}"
    with StepPublisher(config, client) as publisher:
        publisher.publish(5)
        waiting.thread.join(30)
    assert waiting.error is None, repr(waiting.error)
    assert waiting.result == 5


@pytest.mark.parametrize("kind", ["string", "list", "set", "zset"])
def test_a_waiter_survives_every_wrong_type_of_state_key(
    redis_server: RedisServer, client: redis.Redis, kind: str
) -> None:
    config = fresh_config(redis_server, heartbeat=0.2)
    write_garbage(client, config.keys.state, kind, {b"a": b"\xff\xfe", b"b": b"-3"})
    write_garbage(client, config.keys.reset, "list", {b"a": b"x"})
    waiting = Waiting(config, 2)
    assert registered(config, client)
    assert waiting.thread.is_alive()
    with StepPublisher(config, client) as publisher:
        publisher.publish(2)
        waiting.thread.join(30)
    assert waiting.error is None and waiting.result == 2
