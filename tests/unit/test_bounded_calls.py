"""Bounded Redis calls (``stepbarrier._redis.bounded``): the bound each call gets.

No connection is made: the connection's ``connect`` is replaced by one that
records the timeouts it would connect (and read its handshake) with.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis

from stepbarrier._redis.bounded import (
    CALL_FLOOR,
    MAX_IDLE,
    HeldConnection,
    HeldConnections,
    call_timeout,
)


def test_a_call_gets_the_time_left_to_its_limit_and_the_floor_at_least() -> None:
    assert call_timeout(until=110.0, now=100.0) == 10.0
    assert call_timeout(until=100.0 + CALL_FLOOR / 2, now=100.0) == CALL_FLOOR
    assert call_timeout(until=90.0, now=100.0) == CALL_FLOOR  # a passed limit: its last read


class Unreachable(redis.TimeoutError):
    pass


def held_on(pool: redis.ConnectionPool) -> tuple[HeldConnection, list[tuple[Any, Any]]]:
    """A held connection whose connects record their timeouts, then time out."""
    held = HeldConnection(pool)
    seen: list[tuple[Any, Any]] = []
    connection = held._connection

    def connect() -> None:
        seen.append((connection.socket_timeout, connection.socket_connect_timeout))
        raise Unreachable("paused")

    connection.connect = connect
    return held, seen


@pytest.mark.parametrize(
    ("bound", "expected"),
    [
        (0.4, (0.4, 0.4)),  # the caller's bound: its connect and handshake too
        (5.0, (5.0, 3.0)),  # never a longer connect than the client's
        (60.0, (10.0, 3.0)),  # never longer than the client's own timeouts
        (None, (10.0, 3.0)),  # no bound of the caller's: the client's
    ],
)
def test_a_held_connection_connects_within_the_callers_bound(
    bound: float | None, expected: tuple[float, float]
) -> None:
    pool = redis.ConnectionPool(host="127.0.0.1", socket_timeout=10.0, socket_connect_timeout=3.0)
    held, seen = held_on(pool)
    with pytest.raises(Unreachable):
        held.run([("PING",)], bound)
    assert seen == [expected]
    with pytest.raises(Unreachable):
        held.send(("SUBSCRIBE", "channel"), bound)
    assert seen[-1] == expected


def test_held_connections_are_reused_per_pool_and_closed_when_too_many() -> None:
    first = redis.ConnectionPool(host="127.0.0.1")
    second = redis.ConnectionPool(host="127.0.0.1")
    stash = HeldConnections()
    one = stash.take(first)
    stash.give(one)
    assert stash.take(second) is not one  # another pool's settings
    assert stash.take(first) is one
    closed: list[HeldConnection] = []
    many = [stash.take(first) for _ in range(MAX_IDLE + 2)]
    for held in many:
        held.disconnect = lambda held=held: closed.append(held)  # type: ignore[method-assign]
        stash.give(held)
    assert closed == many[MAX_IDLE:]  # kept: MAX_IDLE, the others closed
    stash.close()
    assert closed == many[MAX_IDLE:] + many[:MAX_IDLE]
    assert stash.take(first) not in many  # none kept after close
