"""Redis calls bounded by their caller, so that a wait ends within its limits.

A paused or hung Redis (SIGSTOP, a frozen VM, a proxy without its backend) accepts
connections and never answers; a call bounded only by the client's 10 s socket
timeout would hold a wait that long past its limits. So a wait gives each blocking
call the time left to its nearest limit (``call_timeout``), on a ``HeldConnection``:
one made apart from the client's pool, from its settings, whose connect, handshake
and every reply are bounded by that time. The asyncio side bounds its awaits
instead (``stepbarrier._redis.aio_client.within``).
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
    """Seconds a blocking call may take: the time left to ``until``, ``CALL_FLOOR`` at least."""
    return max(CALL_FLOOR, until - now)


class HeldConnection:
    """One connection made apart from a client's ``pool`` (a Cluster's: its node's), with
    its settings; one thread at a time uses it."""

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
        """Send ``commands`` in one round trip within ``timeout`` (``None``: the client's own
        timeouts); their replies, each error reply in its place. A failure closes it."""
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
        """Send one command (a subscription's) without reading its reply, within ``timeout``."""
        self._ready(timeout)
        try:
            self._connection.send_command(*command, check_health=False)
        except BaseException:
            self.disconnect()
            raise

    def receive(self, timeout: float) -> Any:
        """The next reply or message, ``None`` if none began within ``timeout`` (a whole one
        is then read within ``CALL_FLOOR``); an error reply is raised, a failure closes it."""
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
        if self._pid == os.getpid():
            with contextlib.suppress(Exception):
                self._connection.disconnect()

    def _ready(self, timeout: float | None) -> float | None:
        """Set this call's bound and connect (again: ``ensure_fresh``) if need be, within
        it; returns the ``time.monotonic()`` the call must end by (``None``: no bound)."""
        if self._pid != os.getpid():  # a forked child: the parent's socket is not ours
            self._pid = os.getpid()
            self._connection = self.pool.connection_class(**self.pool.connection_kwargs)
        seconds = _least(self._reply_limit, timeout)
        connection = self._connection
        # what a connect reads: its TCP connect, and each reply of its handshake
        # (AUTH, HELLO, CLIENT SETINFO, SELECT)
        connection.socket_timeout = seconds
        if seconds is not None:
            connection.socket_connect_timeout = _least(self._connect_limit, seconds)
        until = None if seconds is None else time.monotonic() + seconds
        try:
            ensure_fresh(connection)
        except BaseException:
            self.disconnect()
            raise
        return until


def ensure_fresh(connection: Any) -> None:
    """Connect ``connection`` (a redis-py one) if need be, and again if Redis closed it
    meanwhile (a restart, its ``timeout``, a proxy's idle cut) or it has unread data:
    the write after a long pause must not fail on it. (``connect()`` is also where a
    Sentinel's connection asks for the master.)"""
    if connection.is_connected:
        try:
            stale = connection.can_read(timeout=0)  # a closed socket reads as ready
        except (rex.ConnectionError, rex.TimeoutError, OSError):
            stale = True
        if not stale:
            return
        connection.disconnect()
    connection.connect()


def _least(*limits: float | None) -> float | None:
    """The shortest of the ``limits`` given (``None``: no limit)."""
    return min((limit for limit in limits if limit is not None), default=None)


def _left(until: float | None) -> float | None:
    """Seconds left to ``until`` for one read (a little at least: a reply there is taken)."""
    return None if until is None else max(0.001, until - time.monotonic())


class HeldConnections:
    """Idle ``HeldConnection`` s for the next bounded call (thread-safe): a waiter's
    waits reuse one, threads calling at once each get their own."""

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
