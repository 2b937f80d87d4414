"""StepPublisher against a real redis-server."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import pytest
import redis

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter
from stepbarrier._protocol.wire import parse_announcement
from tests.redis_harness import RedisServer, free_port


def stored(client: redis.Redis, cfg: BarrierConfig) -> dict[str, str]:
    raw = client.hgetall(cfg.keys.state)
    return {k.decode(): v.decode() for k, v in raw.items()}


def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


def test_publish_stores_the_step_and_announces_it(
    config: BarrierConfig, client: redis.Redis
) -> None:
    pubsub = client.pubsub(ignore_subscribe_messages=True)
    pubsub.subscribe(config.keys.channel)
    time.sleep(0.05)
    with StepPublisher(config) as publisher:
        publisher.publish(5)
        assert publisher.flush(5.0)
        state = stored(client, config)
        assert state["step"] == "5" and state["done"] == "0"
        message = None
        deadline = time.monotonic() + 5
        while message is None and time.monotonic() < deadline:
            message = pubsub.get_message(timeout=0.5)
        assert message is not None
        ann = parse_announcement(message["data"])
        assert ann is not None and ann.step == 5 and ann.generation == int(state["generation"])
    assert stored(client, config)["done"] == "1"
    assert client.ttl(config.keys.state) > 0
    pubsub.close()


def test_steps_are_monotonic_within_a_generation(
    config: BarrierConfig, client: redis.Redis
) -> None:
    publisher = StepPublisher(config)
    publisher.publish(10)
    assert publisher.flush(5.0)
    publisher.publish(4)  # a lower value from the same chief must not win
    assert publisher.flush(5.0)
    assert stored(client, config)["step"] == "10"
    publisher.close(done=False)


def test_a_new_generation_replaces_a_higher_stale_step(
    config: BarrierConfig, client: redis.Redis
) -> None:
    publisher = StepPublisher(config)
    publisher.publish(100)
    assert publisher.flush(5.0)
    first = int(stored(client, config)["generation"])
    publisher.new_generation()  # restored from a checkpoint at step 30
    publisher.publish(30)
    assert publisher.flush(5.0)
    state = stored(client, config)
    assert state["step"] == "30"
    assert int(state["generation"]) > first
    publisher.close(done=False)


def test_a_restarted_chief_takes_over_and_the_old_one_is_ignored(
    config: BarrierConfig, client: redis.Redis
) -> None:
    old = StepPublisher(config)
    old.publish(50)
    assert old.flush(5.0)
    new = StepPublisher(config)
    new.publish(7)
    assert new.flush(5.0)
    old.publish(60)  # a zombie chief keeps going: it must not overwrite the new one
    old.flush(2.0)
    assert eventually(lambda: not old.active)
    old.publish(61)
    assert not old.flush(None)  # returns at once: the step will never be stored
    assert stored(client, config)["step"] == "7"
    new.close(done=False)
    old.close(done=False)


def test_close_with_done_marks_the_job_finished(config: BarrierConfig, client: redis.Redis) -> None:
    publisher = StepPublisher(config)
    publisher.publish(3)
    assert publisher.close(done=True)
    assert stored(client, config) | {} and stored(client, config)["done"] == "1"
    assert stored(client, config)["step"] == "3"


def test_publish_rejects_bad_steps(config: BarrierConfig) -> None:
    with StepPublisher(config) as publisher:
        with pytest.raises(TypeError):
            publisher.publish(1.5)  # type: ignore[arg-type]
        with pytest.raises(ValueError):
            publisher.publish(-1)
        with pytest.raises(ValueError):
            publisher.publish(2**60)


def test_numpy_like_integers_are_accepted(config: BarrierConfig, client: redis.Redis) -> None:
    class Int64Like:
        def __index__(self) -> int:
            return 9

    with StepPublisher(config) as publisher:
        publisher.publish(Int64Like())  # type: ignore[arg-type]
        assert publisher.flush(5.0)
        assert stored(client, config)["step"] == "9"


def test_writes_stay_bounded_under_a_fast_step_loop(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    cfg = make_config(heartbeat=0.25, stall_timeout=30.0)
    client.zadd(cfg.keys.targets, {"w1": 20_000, "w2": 40_000})  # two registered waiters
    publisher = StepPublisher(cfg)
    started = time.monotonic()
    for step in range(1, 50_001):
        publisher.publish(step)
    assert publisher.flush(5.0)
    elapsed = time.monotonic() - started
    publisher.close(done=False)
    heartbeats = elapsed / cfg.heartbeat + 2
    # one write per heartbeat, one per crossed threshold (2), the first and the last
    assert publisher.writes <= heartbeats + 2 + 3, (publisher.writes, elapsed)
    assert stored(client, cfg)["step"] == "50000"


@pytest.mark.usefixtures("long_heartbeats")
def test_a_crossed_threshold_is_published_without_waiting_for_the_heartbeat(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    cfg = make_config(heartbeat=60.0, stall_timeout=120.0)
    with StepPublisher(cfg) as publisher:
        publisher.publish(1)
        assert eventually(lambda: stored(client, cfg).get("step") == "1")
        client.zadd(cfg.keys.targets, {"w": 5})
        client.rpush(cfg.keys.registrations, 5)  # what a registering waiter does
        assert eventually(lambda: publisher.next_threshold == 5)
        publisher.publish(4)
        time.sleep(0.2)
        assert stored(client, cfg)["step"] == "1"  # below every threshold: no write
        publisher.publish(5)
        assert eventually(lambda: stored(client, cfg).get("step") == "5", timeout=5.0)


def test_publish_never_raises_while_redis_is_down_and_catches_up(job: str) -> None:
    port = free_port()
    cfg = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{port}/0", heartbeat=0.2)
    publisher = StepPublisher(cfg)
    for step in range(1, 200):
        publisher.publish(step)  # Redis is not there: must not raise nor block
    assert not publisher.flush(0.5)
    with RedisServer(port=port) as server:
        client = server.client()
        publisher.publish(250)
        assert publisher.flush(15.0)
        assert client.hget(cfg.keys.state, "step") == b"250"
        assert publisher.close(done=True)
        client.close()


def test_malformed_state_does_not_crash_the_chief(
    config: BarrierConfig, client: redis.Redis
) -> None:
    client.set(config.keys.state, b"\xff garbage")
    client.set(config.keys.targets, "not a zset")
    with StepPublisher(config) as publisher:
        publisher.publish(2)
        assert publisher.flush(5.0)
        assert stored(client, config)["step"] == "2"


def test_a_waiter_sees_the_step_of_a_publisher_context(config: BarrierConfig) -> None:
    with StepPublisher(config) as publisher:
        publisher.publish(12)
        assert publisher.flush(5.0)
        with StepWaiter(config) as waiter:
            assert waiter.wait(10, timeout=10) == 12


def test_the_writer_holds_one_connection_of_a_callers_client_and_gives_it_back(
    config: BarrierConfig, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    # the writer thread sends on one connection of its own (no pool on the
    # releasing write's path): a client the caller passed in gets it back at close
    own = redis.Redis.from_url(config.redis_url)
    pool = own.connection_pool
    with StepPublisher(config, own) as publisher:
        publisher.publish(3)
        assert publisher.flush(5.0)
        (held,) = pool._in_use_connections  # type: ignore[attr-defined]
        host, port = held._sock.getsockname()[:2]
        # Redis drops that connection (a restart, its idle timeout, a proxy):
        # the next write makes it again before sending, and does not fail
        assert client.client_kill_filter(_id=None, addr=f"{host}:{port}") == 1
        caplog.set_level(logging.INFO, logger="stepbarrier")
        writes = publisher.writes
        publisher.publish(4)
        assert publisher.flush(5.0)
        assert stored(client, config)["step"] == "4"
        assert publisher.writes == writes + 1 and publisher.last_error is None
        assert not [r for r in caplog.records if "retry" in r.getMessage()], caplog.text
    assert not pool._in_use_connections  # type: ignore[attr-defined]
    assert own.ping()  # the caller's client is still the caller's to use
    own.close()


def test_a_writer_that_ends_after_close_gave_up_on_it_still_gives_its_connection_back(
    config: BarrierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepbarrier._chief.publish_call import StepWriter

    own = redis.Redis.from_url(config.redis_url)
    publisher = StepPublisher(config, own)
    publisher.publish(1)
    assert publisher.flush(5.0)
    write = StepWriter.write

    def slow(self: StepWriter, values: object) -> object:
        time.sleep(1.5)  # a write that outlasts close()'s timeout
        return write(self, values)  # type: ignore[arg-type]

    monkeypatch.setattr(StepWriter, "write", slow)
    publisher.publish(2)
    publisher.close(timeout=0.2)
    thread = publisher._thread
    thread.join(10)
    assert not thread.is_alive()
    assert not own.connection_pool._in_use_connections  # type: ignore[attr-defined]
    own.close()
