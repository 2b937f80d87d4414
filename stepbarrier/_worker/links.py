"""A threaded wait's links to its job in Redis: its channel (``ChannelWait``, the I/O
loop a step wait and a named barrier's share, deciding nothing), and a step wait's
registry entry (``WaiterLink``)."""

from __future__ import annotations

import functools
import logging
import os
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import replace
from typing import Any, Generic, TypeVar

import redis

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol import calls
from stepbarrier._protocol.calls import Call
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.bounded import call_timeout
from stepbarrier._redis.client import SOCKET_TIMEOUT, RedisClient, make_client
from stepbarrier._redis.functions import RedisCode, is_out_of_memory
from stepbarrier._redis.retries import call_with_retries
from stepbarrier._redis.subscription import Subscription
from stepbarrier._worker.snapshot import Snapshot, parse_snapshot
from stepbarrier._worker.timing import READ, READ_SOURCE, LastChance, Receive, WaitTiming
from stepbarrier.errors import RedisRefused, RedisUnavailable

log = logging.getLogger("stepbarrier._worker.waiter")

L = TypeVar("L", bound="LazyClient")
R = TypeVar("R")
T = TypeVar("T")

REGISTRY_TTL = 30
"""Seconds a waiter's registry entry outlives its last refresh (so dead ones go)."""


class LazyClient:
    """A waiter's client and code runner, made on first use (a cluster client reads
    the slot map at once, and Redis may be down)."""

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None,
        socket_timeout: float = SOCKET_TIMEOUT,
    ) -> None:
        self.config = config
        self._owns_client = client is None
        self._client = client
        self._socket_timeout = socket_timeout
        self._code_of: RedisCode | None = None
        self._client_lock = threading.Lock()

    def _connected(self) -> RedisClient:
        with self._client_lock:
            if self._client is None:
                self._client = make_client(self.config, socket_timeout=self._socket_timeout)
            return self._client

    def _code(self) -> RedisCode:
        """The code runner (its bounded calls keep their idle connection for the next)."""
        client = self._connected()
        with self._client_lock:
            if self._code_of is None:
                self._code_of = RedisCode(client, self.config)
            return self._code_of

    def close(self) -> None:
        with self._client_lock:
            code, self._code_of = self._code_of, None
            client = self._client if self._owns_client else None  # a caller's stays usable
            if client is not None:
                self._client = None
        if code is not None:
            code.close()
        if client is not None:
            client.close()

    def __enter__(self: L) -> L:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ChannelWait(Generic[R]):
    """The I/O of one threaded wait on ``channel``, as its rules (``timing``) say: a
    subclass reads (``_read``) and judges a message (``_on_message``), each returning
    what releases the wait (``R``) or ``None``. A call is retried until the wait's
    nearest limit, each try bounded by the time left to it: a Redis that hangs cannot
    hold the wait past its limits."""

    survivable: tuple[type[Exception], ...] = (RedisUnavailable,)
    """What the last chance's read may fail with, the wait going on to its end."""
    quiet = False
    """Log retries at DEBUG: the wait says once what an outage means to it."""

    def __init__(
        self,
        config: BarrierConfig,
        timing: WaitTiming,
        channel: str,
        connect: Callable[[], RedisClient],
        sleep: Callable[[float], None],
    ) -> None:
        self.config = config
        self.timing = timing
        self.clock = timing.clock
        self.channel = channel
        self.connect = connect
        self.sleep = sleep
        self.pubsub: Subscription | None = None
        self.subscriptions = 0
        self.answered = True  # False from a failed call (or no reply in time) to a success
        self.calls_until = timing.started  # when the current call's retries end

    def _read(self) -> R | None:
        raise NotImplementedError

    def _on_message(self, message: Any) -> R | None:
        raise NotImplementedError

    def _read_source(self) -> R | None:
        return None  # (only a step wait has an outside witness)

    def _listen(self, first: Callable[[], R | None]) -> R:
        """``first()``, then act as the rules say until something releases the wait. A
        Redis the retries could not reach, or that refused, ends the wait as the rules
        say (``on_redis_lost``), or the wait goes on without it, unsubscribed."""
        timing, act = self.timing, first
        while True:
            try:
                released = act()
                while released is None:
                    action = timing.next_action(self.clock())
                    if isinstance(action, Receive):
                        released = self._receive(action.timeout)
                    elif action is READ:
                        released = self._read()
                    elif action is READ_SOURCE:
                        released = self._read_source()
                    elif isinstance(action, LastChance):
                        released = timing.after_last_chance(action.limit, self._last_chance())
                    else:  # RESUBSCRIBE
                        released = self._reconnect()
                return released
            except (RedisUnavailable, RedisRefused) as exc:
                timing.on_redis_lost(exc)
                self._close_pubsub()
                act = _nothing

    def _receive(self, timeout: float) -> R | None:
        pubsub = self.pubsub
        if pubsub is None:  # Redis is lost until the rules retry it
            self.sleep(timeout)
            return None
        try:
            message = pubsub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            # SubscriptionLost too: in a cluster, the job's slot moved
            log.info("job %s: subscription lost (%s); reconnecting", self.config.job, exc)
            return self._reconnect()
        return None if message is None else self._on_message(message)

    def _subscribe(self) -> Subscription:
        # after a lost subscription, a cluster's slot map is read again: the
        # job's slot may have moved, or its master failed over
        refresh = self.subscriptions > 0
        return self._retry(
            lambda: Subscription.open(
                self.connect(), self.channel, refresh_topology=refresh, timeout=self._call_timeout()
            ),
            f"subscribe to {self.channel}",
        )

    def _reconnect(self) -> R | None:
        """Subscribe, read the confirmation, then read (in that order)."""
        self._close_pubsub()
        self.pubsub = self._subscribe()
        self.subscriptions += 1
        self.timing.subscribed()
        return self._read()

    def _last_chance(self) -> R | None:
        try:
            return self._read()  # (past the limit: bounded by CALL_FLOOR)
        except self.survivable:
            return None

    def _retry_deadline(self) -> float:
        return self.timing.retry_deadline()

    def _retry_sleep(self, seconds: float) -> None:
        self.sleep(seconds)

    def _retry(self, operation: Callable[[], T], action: str) -> T:
        """``operation()``, retried until the wait's nearest limit."""
        self.calls_until = deadline = self._retry_deadline()
        try:
            result = call_with_retries(
                operation,
                self.config,
                action=action,
                deadline=deadline,
                clock=self.clock,
                sleep=self._retry_sleep,
                quiet=self.quiet,
            )
        except Exception:
            self.answered = False
            raise
        self.answered = True
        return result

    def _call_timeout(self) -> float:
        """Seconds the call about to be made may take (``CALL_FLOOR`` at least)."""
        return call_timeout(self.calls_until, self.clock())

    def _close_pubsub(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            pubsub.close()


def _nothing() -> None:
    return None


class WaiterLink:
    """One step wait's entry in the job's registry, registered by each read.

    ``waiter_id``: an id a waiter's earlier wait left, so that its entry, if still
    there, is written over (no wake of the chief unless the target is new to the
    index); a new one if omitted.
    """

    def __init__(
        self,
        code: Callable[[], RedisCode],
        config: BarrierConfig,
        target: int,
        since: float,
        call_timeout: Callable[[], float],
        waiter_id: str | None = None,
    ):
        self._code = code
        self._config = config
        self._keys = keys = config.keys
        self.id = new_waiter_id(config) if waiter_id is None else waiter_id
        self.registered = False
        self._call_timeout = call_timeout
        self._calls = [register_call(config, keys, self.id, target, since), wait_read_call(keys)]

    def register_and_read(self) -> Snapshot:
        """Register (or refresh the entry), then read the state: one round trip."""
        registered, reply = self._code().replies(self._calls, timeout=self._call_timeout())
        snapshot = registered_read(self._config.job, registered, reply)
        if not snapshot.full:
            self.registered = True
        return snapshot

    def leave(self, timeout: float) -> None:
        """Remove the registry entry and its target (one try; raises on failure)."""
        if self.registered:
            self._code().call(*calls.leave_call(self._keys, self.id), timeout=timeout)


def registered_read(job: str, registered: Any, read: Any) -> Snapshot:
    """The read made after a registration whose reply was ``registered`` (``None``: none
    was sent); raises an error of either, but a full Redis's refusal of the registration
    (the wait goes on by reading; said once)."""
    if isinstance(registered, Exception) and not is_out_of_memory(registered):
        raise registered
    snapshot = read if isinstance(read, Snapshot | BaseException) else parse_snapshot(read)
    if isinstance(snapshot, BaseException):
        raise snapshot
    if isinstance(registered, Exception):
        if job not in _unregistered_warned:  # once per job and process
            _unregistered_warned.add(job)
            log.warning(
                "job %s: Redis is full and refused this waiter's registration (%s); the wait "
                "goes on by reading the state, but the chief does not hear of it and "
                "`stepbarrier status` does not show it. Raise maxmemory "
                "(docs/operations.md#memory)",
                job,
                " ".join(str(registered).split())[:120],
            )
        return replace(snapshot, full=True)
    return snapshot


_unregistered_warned: set[str] = set()


def new_waiter_id(config: BarrierConfig) -> str:
    """A new wait's id in the job's registry: its task id and a random part (32 bits)."""
    task = "x" if config.task_id is None else str(config.task_id)
    return f"{task}-{secrets.token_hex(4)}"


@functools.lru_cache(maxsize=1)
def _host_name(pid: int) -> str:  # (read again in a forked process)
    return socket.gethostname()[:200]


def registry_entry(config: BarrierConfig, target: int, since: float) -> dict[str, str]:
    """The registry entry of a wait (what ``stepbarrier status`` shows)."""
    pid = os.getpid()
    return {
        "task_id": "" if config.task_id is None else str(config.task_id),
        "wait_until_step": str(target),
        "since": f"{since:.3f}",
        "host": _host_name(pid),
        "pid": str(pid),
    }


def register_call(
    config: BarrierConfig, keys: JobKeys, waiter_id: str, target: int, since: float
) -> Call:
    """A wait's registration (or its refresh): its registry entry and its target."""
    entry = registry_entry(config, target, since)
    return calls.register_call(
        keys, waiter_id, target, entry, registry_ttl=REGISTRY_TTL, key_ttl=config.key_ttl
    )


def wait_read_call(keys: JobKeys) -> Call:
    """A wait's read of the state: an ``FCALL_RO``, so that the worker role needs no write
    permission on it."""
    return calls.read_call(keys.state, keys.reset, wait=True)
