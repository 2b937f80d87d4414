"""The stateful fault test's reply-dropping proxy loses exactly the reply it is told to."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from stepbarrier import BarrierConfig, StepPublisher
from tests.redis_harness import RedisServer
from tests.reliability.reply_dropping_proxy import PUBLISH_STEP, ReplyDroppingProxy

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(60)]


@pytest.fixture
def proxy(server: RedisServer) -> Iterator[ReplyDroppingProxy]:
    proxy = ReplyDroppingProxy(server.port).start()
    try:
        yield proxy
    finally:
        proxy.stop()


def through(proxy: ReplyDroppingProxy) -> redis.Redis:
    """A client of the proxy that never retries by itself: each error is seen."""
    return redis.Redis(port=proxy.port, retry=Retry(NoBackoff(), 0), socket_timeout=10)


def test_commands_and_replies_pass_through(proxy: ReplyDroppingProxy) -> None:
    client = through(proxy)
    assert client.set("key", "value") is True
    assert client.get("key") == b"value"
    assert proxy.drops == 0


def test_the_armed_command_is_applied_and_its_reply_lost(
    proxy: ReplyDroppingProxy, server: RedisServer
) -> None:
    client = through(proxy)
    client.set("before", "1")
    proxy.drop_reply(b"INCRBY")
    with pytest.raises(redis.ConnectionError):
        client.incrby("counter", 5)  # applied by Redis, its reply never comes
    assert proxy.dropped.is_set() and proxy.drops == 1
    assert proxy.dropped_replies == [b":5\r\n"]  # what Redis answered
    direct = server.client()
    assert direct.get("counter") == b"5"
    # the client's retry goes through a new connection, and its reply comes back
    assert client.incrby("counter", 5) == 10
    assert direct.get("counter") == b"10"


def test_exactly_one_reply_is_lost_per_arming(proxy: ReplyDroppingProxy) -> None:
    client = through(proxy)
    proxy.drop_reply(b"INCRBY")
    with pytest.raises(redis.ConnectionError):
        client.incrby("counter", 1)
    for expected in (2, 3, 4):
        assert client.incrby("counter", 1) == expected
    assert proxy.drops == 1 and not proxy.armed


def test_an_error_reply_passes_and_the_next_command_loses_its_reply(
    proxy: ReplyDroppingProxy, server: RedisServer
) -> None:
    client = through(proxy)
    client.set("text", "not a number")
    proxy.drop_reply(b"INCRBY")
    with pytest.raises(redis.ResponseError):
        client.incrby("text", 1)  # did not run: its error comes back
    assert proxy.drops == 0 and proxy.armed
    with pytest.raises(redis.ConnectionError):
        client.incrby("counter", 1)
    assert proxy.drops == 1 and server.client().get("counter") == b"1"


def test_other_commands_keep_their_replies_while_armed(proxy: ReplyDroppingProxy) -> None:
    client = through(proxy)
    proxy.drop_reply(b"publish_step")
    for number in range(5):
        assert client.set(f"key{number}", number) is True
    assert proxy.armed and proxy.drops == 0
    assert proxy.disarm() and not proxy.armed


def test_a_client_reaches_redis_again_after_it_restarted_behind_the_proxy(
    proxy: ReplyDroppingProxy, server: RedisServer
) -> None:
    client = through(proxy)
    client.set("key", "1")
    server.restart_empty()
    # the old connection is cut with Redis's; the next one reaches the new server
    with contextlib.suppress(redis.ConnectionError):
        client.ping()
    assert client.get("key") is None


def test_a_chiefs_write_is_applied_and_its_reply_lost_then_it_writes_again(
    proxy: ReplyDroppingProxy, server: RedisServer, job: str
) -> None:
    # what the stateful fault test arms: the library's own write, found by its name
    # (not the library's source, which the first write loads)
    config = BarrierConfig(job=job, redis_url=proxy.url, heartbeat=0.1, stall_timeout=30.0)
    publisher = StepPublisher(config)
    try:
        publisher.publish(1)
        assert publisher.flush(30.0)
        proxy.drop_reply(PUBLISH_STEP)
        publisher.publish(2)
        assert proxy.dropped.wait(30.0)
        reply = proxy.dropped_replies[0]
        assert reply.startswith(b"*") and b":1\r\n" in reply  # accepted: Redis ran it
        assert b"\r\n2\r\n" in reply  # (the stored step it answered)
        assert publisher.flush(30.0)  # the chief wrote again, and heard back
        assert publisher.active and proxy.drops == 1
        assert server.client().hget(config.keys.state, "step") == b"2"
    finally:
        publisher.close(timeout=5.0)
