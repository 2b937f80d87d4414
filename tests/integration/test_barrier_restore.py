"""Arrivals Redis lost, against real redis-servers (issue 21, defect 7): a waiting party
remembers every arrival it has read and records them again when Redis loses them (a
restart with no data, an eviction), so that the end barrier's chief is released once
the last worker arrives instead of timing out naming workers that did arrive; an
arrival lost before anyone read it is named as missing, and the timeout says Redis
lost arrivals."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import pytest
import redis

from stepbarrier import Barrier, BarrierConfig, BarrierTimeout
from stepbarrier._protocol.library import MAX_RESTORED
from tests.barrier_helpers import Waiting, as_task, eventually, subscribed
from tests.redis_harness import RedisServer


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A server of this test's own, to restart empty."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


def end_barrier_with_two_workers_gone(config: BarrierConfig, client: redis.Redis) -> Waiting:
    """Workers 1 and 2 arrive and go (``wait=False``); the chief waits for 4 parties
    and has read the barrier since."""
    for task in (1, 2):
        assert not Barrier(as_task(config, task), "end", 4).arrive(wait=False)
    chief = Waiting(as_task(config, 0), "end", 4, timeout=10)
    eventually(subscribed(client, config.keys.barrier_channel))
    eventually(lambda: client.hexists(config.keys.barrier("end"), "t0"))
    time.sleep(0.5)  # the read after the subscription, and a couple of fallback reads
    return chief


def test_a_redis_restarted_empty_does_not_lose_the_finished_workers(
    own_server: RedisServer,
) -> None:
    config = BarrierConfig(
        job="restart", redis_url=own_server.url, stall_timeout=30.0, fallback_interval=0.2
    )
    client = own_server.client()
    try:
        chief = end_barrier_with_two_workers_gone(config, client)
        own_server.restart_empty()
        key = config.keys.barrier("end")
        client.close()
        client = own_server.client()
        # the chief reconnects, arrives again and records workers 1 and 2 again
        eventually(lambda: client.exists(key) == 1 and client.hexists(key, "t2"), timeout=8)
        assert Barrier(as_task(config, 3), "end", 4).arrive(wait=False)  # the last: complete
        chief.join()
        assert chief.error is None and chief.result is True
        state = Barrier(as_task(config, 0), "end", 4).read()
        assert state is not None and state.arrived == (0, 1, 2, 3)
    finally:
        client.close()


def test_an_evicted_barrier_does_not_lose_the_finished_workers(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(stall_timeout=30.0, fallback_interval=0.2)
    chief = end_barrier_with_two_workers_gone(config, client)
    key = config.keys.barrier("end")
    client.delete(key)  # evicted (allkeys-lru), or expired
    eventually(lambda: client.hexists(key, "t1") and client.hexists(key, "t2"), timeout=8)
    assert Barrier(as_task(config, 3), "end", 4).arrive(wait=False)  # the last: complete
    chief.join()
    assert chief.error is None and chief.result is True


def test_arrivals_missing_from_a_read_are_recorded_again_with_their_times(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(stall_timeout=30.0, fallback_interval=0.2)
    chief = end_barrier_with_two_workers_gone(config, client)
    key = config.keys.barrier("end")
    first = client.hget(key, "t1")
    client.hdel(key, "t1")  # one arrival lost (a Redis restored from an older snapshot)
    eventually(lambda: client.hexists(key, "t1"), timeout=8)
    assert client.hget(key, "t1") == first  # recorded again as it was
    assert chief.waiting
    assert Barrier(as_task(config, 3), "end", 4).arrive(wait=False)  # the last: complete
    assert chief.join().result is True


def test_an_arrival_lost_while_another_arrives_is_recorded_again(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    """The count of stored arrivals stays what the chief saw (task 1 lost, task 3 new),
    so its reads of constant cost learn nothing from the count; the arrival changed
    the barrier's ``last_ms``, and that makes the chief read every arrival, find task
    1's lost and record it again (before, only its last-chance read at its deadline
    did: found by an adversarial review)."""
    config = make_config(stall_timeout=30.0, fallback_interval=0.2)
    chief = end_barrier_with_two_workers_gone(config, client)
    key = config.keys.barrier("end")
    client.hdel(key, "t1")  # a failover to a replica that had not seen task 1 arrive
    assert not Barrier(as_task(config, 3), "end", 4).arrive(wait=False)  # t1 is missing
    eventually(lambda: client.hexists(key, "t1"), timeout=8)  # the chief's deadline: 10 s
    assert chief.join().result is True


def test_more_lost_arrivals_than_one_call_takes_are_recorded_again_in_several(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    """Issue 34: one arrival records again at most ``MAX_RESTORED`` lost arrivals (more
    is refused before anything is written); a party that remembers more sends them
    as several calls, and is released all the same."""
    parties = 2 * MAX_RESTORED + 500
    config = make_config(stall_timeout=30.0, fallback_interval=0.2)
    key = config.keys.barrier("big")
    assert not Barrier(as_task(config, 1), "big", parties).arrive(wait=False)
    for first in range(2, parties - 1, 1000):  # tasks 2 .. parties - 2, as arrivals write them
        last = min(first + 1000, parties - 1)
        client.hset(key, mapping={f"t{task}": "1700000000000" for task in range(first, last)})
    chief = Waiting(as_task(config, 0), "big", parties, timeout=30)
    eventually(subscribed(client, config.keys.barrier_channel))
    eventually(lambda: client.hexists(key, "t0"))
    time.sleep(0.5)  # the read after the subscription, and a couple of fallback reads
    client.delete(key)  # evicted: the chief remembers parties - 1 arrivals
    eventually(lambda: client.hexists(key, f"t{parties - 2}"), timeout=8)
    assert chief.waiting
    assert Barrier(as_task(config, parties - 1), "big", parties).arrive(wait=False)
    assert chief.join().result is True
    state = Barrier(as_task(config, 0), "big", parties).read()
    assert state is not None and state.arrived == tuple(range(parties))


def test_an_arrival_lost_before_anyone_read_it_is_named_and_the_loss_is_said(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(stall_timeout=30.0, fallback_interval=5.0)
    chief = Waiting(as_task(config, 0), "end", 3, timeout=1.5)
    eventually(subscribed(client, config.keys.barrier_channel))
    time.sleep(0.2)  # its read after the subscription is done; the next is at the timeout
    assert not Barrier(as_task(config, 1), "end", 3).arrive(wait=False)  # unseen: no read
    client.delete(config.keys.barrier("end"))  # lost before the chief's next read
    error = chief.join().error
    assert isinstance(error, BarrierTimeout)
    assert error.missing == (1, 2)  # task 1 was never seen: it is named, truthfully
    assert "missing task(s) 1, 2" in str(error)
    assert "Redis lost arrivals at this barrier" in str(error)
    assert "may have arrived" in str(error)


def test_a_timeout_without_a_loss_says_nothing_of_one(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(stall_timeout=30.0, fallback_interval=0.2)
    assert not Barrier(as_task(config, 1), "end", 3).arrive(wait=False)
    with pytest.raises(BarrierTimeout) as info:
        Barrier(as_task(config, 0), "end", 3).arrive(timeout=0.6)
    assert info.value.missing == (2,)
    assert "lost" not in str(info.value)
