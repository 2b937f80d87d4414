"""Announcements on the barrier channel are hints, against a real redis-server (issue 21
"announcements are hints everywhere", issue 23 high-1): anyone who may arrive may
publish there, and may write the barrier's counters. A barrier completes only when
each party's own arrival is stored (the ``t<task>`` fields, never the ``arrived``
counter or ``completed_ms``), and a wait aborts only when the stored reset marker
differs from the one it read first (a token: equality only, never a clock)."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest
import redis

from stepbarrier import Barrier, BarrierAborted, BarrierConfig
from tests.barrier_helpers import Waiting, as_task, eventually, subscribed

HOLD = 0.6
"""Seconds a wait must go on after a forgery to count as not fooled."""


@pytest.fixture
def slow_reads(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    """Fallback reads 5 s apart: within a test, only announcements make a wait read."""
    return make_config(stall_timeout=30.0, fallback_interval=5.0)


def waiting_task(config: BarrierConfig, client: redis.Redis, parties: int = 2) -> Waiting:
    """Task 1 waiting at "start", subscribed and past its first read."""
    waiting = Waiting(as_task(config, 1), "start", parties, timeout=30)
    eventually(subscribed(client, config.keys.barrier_channel))
    time.sleep(0.1)
    assert waiting.waiting
    return waiting


def test_a_forged_completion_announcement_releases_nobody(
    slow_reads: BarrierConfig, client: redis.Redis
) -> None:
    waiting = waiting_task(slow_reads, client)
    channel = slow_reads.keys.barrier_channel
    for _ in range(3):
        client.publish(channel, '{"barrier":"start","complete":true}')
    time.sleep(HOLD)
    assert waiting.waiting, "released by an announcement alone"
    assert Barrier(as_task(slow_reads, 0), "start", 2).arrive(timeout=10)
    assert waiting.join().result is True


def test_a_forged_arrived_counter_completes_nothing(
    slow_reads: BarrierConfig, client: redis.Redis
) -> None:
    waiting = waiting_task(slow_reads, client, parties=3)
    key = slow_reads.keys.barrier("start")
    client.hset(key, mapping={"arrived": "2", "completed_ms": "1"})  # only task 1 arrived
    client.publish(slow_reads.keys.barrier_channel, '{"barrier":"start","complete":true}')
    state = Barrier(as_task(slow_reads, 0), "start", 3).read()
    assert state is not None and not state.complete and state.missing == (0, 2)
    # the counter says the next arrival is the last: the stored arrivals say it is not
    assert not Barrier(as_task(slow_reads, 2), "start", 3).arrive(wait=False)
    time.sleep(HOLD)
    assert waiting.waiting, "released by a forged counter"
    assert client.hget(key, "arrived") == b"2"  # counted again from the task fields
    assert Barrier(as_task(slow_reads, 0), "start", 3).arrive(timeout=10)
    assert waiting.join().result is True


def test_a_forged_reset_notice_aborts_nobody(
    slow_reads: BarrierConfig, client: redis.Redis
) -> None:
    waiting = waiting_task(slow_reads, client)
    client.publish(slow_reads.keys.barrier_channel, '{"reset":true,"time_ms":1}')
    time.sleep(HOLD)
    assert waiting.waiting and waiting.error is None, "aborted by a notice alone"
    assert Barrier(as_task(slow_reads, 0), "start", 2).arrive(timeout=10)
    assert waiting.join().result is True


def test_a_reset_notice_with_a_new_marker_aborts(
    slow_reads: BarrierConfig, client: redis.Redis
) -> None:
    """The marker is a token: a new one aborts whatever its value (here less than any
    clock), and a marker that was there before the arrival does not."""
    keys = slow_reads.keys
    client.set(keys.reset, "token-a", ex=3600)  # an earlier reset
    waiting = waiting_task(slow_reads, client)
    client.publish(keys.barrier_channel, '{"reset":true}')
    time.sleep(HOLD)
    assert waiting.waiting  # the marker is the one it read first
    client.set(keys.reset, "1", ex=3600)
    client.publish(keys.barrier_channel, '{"reset":true}')
    error = waiting.join().error
    assert isinstance(error, BarrierAborted) and error.reason == "reset"


def test_a_gone_marker_is_no_reset(slow_reads: BarrierConfig, client: redis.Redis) -> None:
    keys = slow_reads.keys
    client.set(keys.reset, "token-a", ex=3600)
    waiting = waiting_task(slow_reads, client)
    client.delete(keys.reset)  # expired, or a Redis that restarted empty
    client.publish(keys.barrier_channel, '{"reset":true}')
    time.sleep(HOLD)
    assert waiting.waiting and waiting.error is None
    assert Barrier(as_task(slow_reads, 0), "start", 2).arrive(timeout=10)
    assert waiting.join().result is True
