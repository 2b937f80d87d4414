"""Redis calls bounded by their caller, so that a wait ends within its limits.

A paused or hung Redis (stopped by SIGSTOP, a frozen VM, a proxy that lost its
backend) accepts connections, since the kernel completes the TCP handshake, and
never answers. A call bounded only by the client's socket timeout (10 s) would
hold a wait that long past its limits, and a wait looks at its limits only
between calls. So a wait gives each blocking call the time left to its nearest
limit (``call_timeout``: at least ``CALL_FLOOR``, the last read at a passed
limit included), and leaving is best effort within ``LEAVE_WITHIN``.

On the blocking side a bounded call runs on a ``HeldConnection``: a connection
made apart from the client's pool, from the pool's own settings, whose connect,
handshake and every reply are bounded by the time its caller gives (never more
than the client's own socket and connect timeouts). ``HeldConnections`` keeps
the idle ones for the next call, so a waiter's waits reuse one connection. The
asyncio side bounds its awaits instead (``stepbarrier._redis.aio_client.within``).
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

from redis import exceptions as rex

CALL_FLOOR = 1.0
"""The least time a wait's blocking call is given, even at or past the wait's
limit: the last read at a passed limit can still be answered by a Redis that is
merely slow."""
LEAVE_WITHIN = 1.0
"""Seconds a wait's unregistration may take; after that the wait ends without
it (its registry entry expires by itself)."""
MAX_IDLE = 8
"""Most idle connections ``HeldConnections`` keeps (one per thread that waits)."""


def call_timeout(until: float, now: float) -> float:
    """Seconds a blocking call may take: the time left to ``until`` (a caller's
    limit, on its clock), and at least ``CALL_FLOOR``."""
    return max(CALL_FLOOR, until - now)


class HeldConnection:
    """One connection of a client, apart from its pool, every call of it bounded.

    Made from ``pool``'s connection class and settings (TLS, credentials, the
    database, a Sentinel's master), so it connects as the client does. One
    thread at a time uses it.

    Args:
        pool: The client's connection pool (a Redis Cluster's: its node's).
    """

    def __init__(self, pool: Any) -> None:
        self.pool = pool
        self._pid = os.getpid()
        self._connection: Any = pool.connection_class(**pool.connection_kwargs)
        # the client's own limits: a caller's bound never makes them longer
        self._reply_limit: float | None = self._connection.socket_timeout
        self._connect_limit: float | None = self._connection.socket_connect_timeout

    @property
    def connected(self) -> bool:
        """True while its socket is open (in this process)."""
        return self._pid == os.getpid() and bool(self._connection.is_connected)

    def run(self, commands: Sequence[Sequence[Any]], timeout: float | None) -> list[Any]:
        """Send ``commands`` in one round trip; their replies, each error reply in its place.

        Args:
            commands: The commands, each as its arguments (``("FCALL", name, 1, key)``).
            timeout: Seconds the whole call may take, connecting included (``None``:
                the client's own timeouts).

        Raises:
            redis.TimeoutError: No (whole) reply in time; the connection is closed.
            redis.ConnectionError: The connection failed; it is closed.
        """
        until = self._ready(timeout)
        connection = self._connection
        try:
            connection.send_packed_command(connection.pack_commands(commands), check_health=False)
            replies: list[Any] = []
            for _ in commands:
                try:
                    replies.append(connection.read_response(timeout=_left(until)))
                except rex.ResponseError as exc:  # read whole: the connection is fine
                    replies.append(exc)
            return replies
        except BaseException:
            # a reply half read (or never) must not be taken for the next call's
            self.disconnect()
            raise

    def send(self, command: Sequence[Any], timeout: float | None) -> None:
        """Send one command without reading its reply (a subscription's), connecting
        first within ``timeout`` seconds if need be."""
        self._ready(timeout)
        try:
            self._connection.send_command(*command, check_health=False)
        except BaseException:
            self.disconnect()
            raise

    def receive(self, timeout: float) -> Any:
        """The next reply or message, or ``None`` if none began within ``timeout``
        seconds (a whole one is then read within ``CALL_FLOOR`` more at most).

        Raises:
            redis.ResponseError: An error reply (read whole: the connection is fine).
            redis.ConnectionError: The connection is closed or failed (then closed).
        """
        connection = self._connection
        if not self.connected:
            raise rex.ConnectionError("the connection to Redis is closed")
        try:
            if not connection.can_read(timeout=max(0.0, timeout)):
                return None
            return connection.read_response(timeout=max(timeout, CALL_FLOOR), push_request=True)
        except rex.ResponseError:
            raise
        except BaseException:
            self.disconnect()
            raise

    def disconnect(self) -> None:
        """Close the connection (the next call connects again)."""
        if self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._connection.disconnect()

    def _ready(self, timeout: float | None) -> float | None:
        """Set this call's bound and connect (again) if need be, within it; returns
        the ``time.monotonic()`` the call must end by (``None``: no bound of its own).

        A connection that Redis closed meanwhile (a restart, its ``timeout``, a
        proxy's idle cut), or that has unread data, is made again.
        """
        if self._pid != os.getpid():  # a forked child: the parent's socket is not ours
            self._pid = os.getpid()
            self._connection = self.pool.connection_class(**self.pool.connection_kwargs)
        seconds = self._reply_limit
        if timeout is not None:
            seconds = timeout if seconds is None else min(seconds, timeout)
        connection = self._connection
        # what a connect reads: its TCP connect, and each reply of its handshake
        # (AUTH, HELLO, CLIENT SETINFO, SELECT)
        connection.socket_timeout = seconds
        if seconds is not None:
            connect = self._connect_limit
            connection.socket_connect_timeout = (
                seconds if connect is None else min(connect, seconds)
            )
        until = None if seconds is None else time.monotonic() + seconds
        try:
            if connection.is_connected:
                try:
                    stale = connection.can_read(timeout=0)  # a closed socket reads as ready
                except (rex.ConnectionError, rex.TimeoutError, OSError):
                    stale = True
                if not stale:
                    return until
                connection.disconnect()
            connection.connect()
        except BaseException:
            self.disconnect()
            raise
        return until


def _left(until: float | None) -> float | None:
    """Seconds left to ``until`` for one read (a little at least: a reply that is
    already there is still taken)."""
    return None if until is None else max(0.001, until - time.monotonic())


class HeldConnections:
    """Idle ``HeldConnection`` s of a client, for the next bounded call (thread-safe).

    A caller takes one for a call and gives it back, so calls of one thread after
    another share one connection, and calls of several threads at once each get
    their own.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[HeldConnection] = []

    def take(self, pool: Any) -> HeldConnection:
        """An idle connection of ``pool`` (made now if there is none)."""
        with self._lock:
            for index in range(len(self._idle) - 1, -1, -1):
                if self._idle[index].pool is pool:
                    return self._idle.pop(index)
        return HeldConnection(pool)

    def give(self, held: HeldConnection) -> None:
        """Keep ``held`` for the next call (closed if too many are idle)."""
        with self._lock:
            if len(self._idle) < MAX_IDLE:
                self._idle.append(held)
                return
        held.disconnect()

    def close(self) -> None:
        """Close the idle connections (a connection taken is closed by its taker)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for held in idle:
            held.disconnect()
