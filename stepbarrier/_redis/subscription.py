"""A confirmed subscription to a job's channel, plain or sharded on a Redis Cluster,
where a slot's move ends it as ``SubscriptionLost`` (docs/operations.md#redis-cluster).
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
from stepbarrier._redis.client import CONNECT_TIMEOUT, RedisClient, slot_client


class SubscriptionLost(redis.ConnectionError):
    """The server ended our subscription (in a cluster: the job's slot moved)."""


class Subscription:
    """One confirmed subscription (``open``), on a ``HeldConnection`` of its own: opening
    it is bounded by its caller's time, against a Redis that hangs as well."""

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
        """Subscribe and wait for the confirmation (one try, ``CONNECT_TIMEOUT`` at most),
        on a Cluster on the slot's owner (``refresh_topology``: re-read the slot map)."""
        sharded = isinstance(client, RedisCluster)
        pool = slot_client(client, channel, refresh=refresh_topology).connection_pool
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
            SubscriptionLost: The server ended the subscription (or replied ``MOVED``).
            redis.ConnectionError: The connection broke.
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
        """Discard what arrived while no wait listened; False if it ended or broke."""
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
    """The last wait's subscription, kept open (off the release's path) for the next
    wait, which takes it over if younger than ``max_age`` seconds (thread-safe)."""

    def __init__(self, clock: Callable[[], float], max_age: float) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self._max_age = max_age
        self._idle: Subscription | None = None
        self._idle_since = 0.0

    def take(self) -> Subscription | None:
        """The kept subscription if it is young enough (then no longer kept)."""
        with self._lock:
            idle, self._idle = self._idle, None
            fresh = self._clock() - self._idle_since < self._max_age
        if idle is not None and not fresh:
            idle.close()
            return None
        return idle

    def keep(self, subscription: Subscription | None) -> None:
        """Keep ``subscription`` (``None``: none), closing the one kept before."""
        with self._lock:
            old, self._idle = self._idle, subscription
            self._idle_since = self._clock()
        if old is not None:  # two waits ended: one subscription is enough
            old.close()

    def close(self) -> None:
        self.keep(None)


def _kind(message: Any) -> str:
    # a pub/sub message's type ("message", "subscribe"...); "" for any other reply
    if not isinstance(message, list) or not message:
        return ""
    raw = message[0]
    return raw.decode() if isinstance(raw, bytes) else str(raw)
