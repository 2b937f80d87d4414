"""A confirmed subscription to a job's channel, plain or sharded (Redis Cluster).

On a standalone Redis (or through Sentinel) the job's announcements travel on
an ordinary channel (``SUBSCRIBE``/``PUBLISH``). On a Redis Cluster they are
sharded (``SSUBSCRIBE``/``SPUBLISH``): the channel lives in the job's slot, so
an announcement costs one shard, not a broadcast to every node. When the slot
moves to another node, the old owner ends the subscription with an unrequested
``sunsubscribe``; redis-py does not subscribe again by itself, so this module
reports it as ``SubscriptionLost`` and the waiter subscribes again on the new
owner, then reads the state (nothing sent in between is lost: the stored state
is the truth).
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from redis.cluster import RedisCluster

from stepbarrier._redis.bounded import HeldConnection
from stepbarrier._redis.client import CONNECT_TIMEOUT, RedisClient


class SubscriptionLost(redis.ConnectionError):
    """The server ended our subscription (in a cluster: the job's slot moved)."""


class Subscription:
    """One confirmed subscription; ``get_message`` yields the payloads.

    It has a connection of its own (a ``HeldConnection``, made from the client's
    settings), so that opening it is bounded by its caller's time, the connect
    and its handshake included, against a Redis that hangs as well.

    Args:
        connection: Its connection, subscribed and confirmed.
        channel: The channel's name.
        sharded: ``SSUBSCRIBE`` rather than ``SUBSCRIBE``.
    """

    def __init__(self, connection: HeldConnection, channel: str, *, sharded: bool) -> None:
        self._connection = connection
        self._channel = channel
        self.sharded = sharded

    @classmethod
    def open(
        cls,
        client: RedisClient,
        channel: str,
        *,
        refresh_topology: bool = False,
        timeout: float | None = None,
    ) -> Subscription:
        """Subscribe and wait for Redis's confirmation (one try).

        Args:
            client: The job's client; a ``RedisCluster`` subscribes on the node
                that owns ``channel``'s slot.
            channel: The channel.
            refresh_topology: Re-read the cluster's slot map first (after a
                subscription was lost to a slot migration or a failover).
            timeout: Seconds it may take at most, connecting included (``None``:
                the client's own timeouts); the confirmation is awaited for
                ``CONNECT_TIMEOUT`` at most.

        Raises:
            redis.TimeoutError: No confirmation in time.
            redis.RedisError: The subscription failed.
        """
        sharded = isinstance(client, RedisCluster)
        if isinstance(client, RedisCluster):
            if refresh_topology:
                client.nodes_manager.initialize()
            node = client.get_node_from_key(channel)  # type: ignore[no-untyped-call]
            pool = client.get_redis_connection(node).connection_pool
        else:
            pool = client.connection_pool
        started = time.monotonic()
        connection = HeldConnection(pool)
        try:
            connection.send(("SSUBSCRIBE" if sharded else "SUBSCRIBE", channel), timeout)
            expected = "ssubscribe" if sharded else "subscribe"
            until = time.monotonic() + CONNECT_TIMEOUT
            if timeout is not None:
                until = min(until, started + timeout)
            while (left := until - time.monotonic()) > 0:
                message = connection.receive(left)
                if message is not None and _kind(message) == expected:
                    return cls(connection, channel, sharded=sharded)
            raise redis.TimeoutError("no subscription confirmation from Redis")
        except BaseException:
            connection.disconnect()
            raise

    def get_message(self, timeout: float) -> Any:
        """The next announcement's payload, or ``None`` if none came in ``timeout``.

        Raises:
            SubscriptionLost: The server ended the subscription.
            redis.ConnectionError: The connection broke (a ``MOVED`` reply counts).
        """
        try:
            message = self._connection.receive(timeout)
        except redis.ResponseError as exc:  # e.g. MOVED: the slot is elsewhere now
            raise SubscriptionLost(str(exc)) from exc
        if message is None:
            return None
        kind = _kind(message)
        if kind in ("message", "smessage"):
            return message[2] if len(message) > 2 else None
        if kind in ("unsubscribe", "sunsubscribe"):
            raise SubscriptionLost(f"the server ended the subscription to {self._channel}")
        return None

    def drain(self) -> bool:
        """Discard what arrived while no wait listened (one read of what is buffered).

        Returns:
            False if the subscription has ended or its connection broke.
        """
        try:
            while (message := self._connection.receive(0)) is not None:
                if _kind(message) in ("unsubscribe", "sunsubscribe"):
                    return False
        except Exception:  # a broken connection, a MOVED reply: subscribe anew
            return False
        return True

    def close(self) -> None:
        """Close it, even if its connection is already dead."""
        with contextlib.suppress(Exception):
            self._connection.disconnect()


class KeptSubscription:
    """The last wait's subscription, kept open for the waiter's next wait.

    A released wait does not close its subscription (that is off the release's
    path); the next wait takes it over if it is younger than ``max_age``, and
    closes it otherwise. Waits of one waiter may end in several threads.

    Args:
        clock: Monotonic clock.
        max_age: Seconds after which a kept subscription is not taken over.
    """

    def __init__(self, clock: Callable[[], float], max_age: float) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._max_age = max_age
        self._idle: Subscription | None = None
        self._idle_since = 0.0

    def take(self) -> Subscription | None:
        """The kept subscription if it is younger than ``max_age`` (then no longer kept)."""
        with self._lock:
            idle, self._idle = self._idle, None
            fresh = self._clock() - self._idle_since < self._max_age
        if idle is not None and not fresh:
            idle.close()
            return None
        return idle

    def keep(self, subscription: Subscription) -> None:
        """Keep ``subscription`` for the next wait."""
        with self._lock:
            old, self._idle = self._idle, subscription
            self._idle_since = self._clock()
        if old is not None:  # two waits ended: one subscription is enough
            old.close()

    def close(self) -> None:
        """Close the kept subscription, if any."""
        with self._lock:
            idle, self._idle = self._idle, None
        if idle is not None:
            idle.close()


def _kind(message: Any) -> str:
    """A pub/sub message's type (``"message"``, ``"subscribe"``...); ``""`` for any other reply."""
    if not isinstance(message, list) or not message:
        return ""
    raw = message[0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)
