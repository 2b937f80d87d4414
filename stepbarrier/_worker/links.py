"""A waiter's links to its job in Redis: its subscription and its registry entry.

``StepWaiter`` decides; this module only talks to Redis, one try per call (the
waiter retries within its deadlines). ``register_and_read`` is a waiter's one command per
fallback interval: it registers the waiter (again, if its entry expired or
Redis restarted empty) and returns the stored state with Redis's clock.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import Call
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode, is_out_of_memory
from stepbarrier._redis.subscription import Subscription
from stepbarrier._worker.snapshot import Snapshot, oversized_state_problem, parse_snapshot

log = logging.getLogger("stepbarrier._worker.waiter")

__all__ = [
    "REGISTRY_TTL",
    "Snapshot",
    "WaiterLink",
    "leave_call",
    "new_waiter_id",
    "oversized_state_problem",
    "parse_snapshot",
    "read_call",
    "register_call",
    "registry_entry",
    "warn_unregistered",
]

REGISTRY_TTL = 30
"""Seconds a waiter's registry entry outlives its last refresh (so dead ones go)."""


class WaiterLink:
    """One wait's subscription and registry entry.

    Args:
        connect: Returns the waiter's redis-py client (made on first use: a
            cluster client reads the slot map at once, and Redis may be down).
        config: The job's settings.
        target: The step waited for.
        since: Unix time the wait began (shown by ``stepbarrier status``).
        code: Returns the code runner to call on (the waiter's, shared by its
            waits, made on first use); one of this link's own if omitted.
        call_timeout: Returns the seconds the next call may take (the time
            left to the wait's nearest limit); ``None``: the client's timeouts.
        waiter_id: The id to register under: one a waiter's earlier wait left
            (its entry, if still there, is written over: no new entry, and
            no wake of the chief unless the target is new to the index); a
            new one if omitted.
    """

    def __init__(
        self,
        connect: Callable[[], RedisClient],
        config: BarrierConfig,
        target: int,
        since: float,
        *,
        code: Callable[[], RedisCode] | None = None,
        call_timeout: Callable[[], float] | None = None,
        waiter_id: str | None = None,
    ):
        self._connect = connect
        self._config = config
        self._keys = config.keys
        self.id = new_waiter_id(config) if waiter_id is None else waiter_id
        self.target = target
        self.registered = False
        self.answered = True
        """False once a call failed (Redis unreachable, or no reply in time), until
        one succeeds."""
        self._code_source = code
        self._code_of: RedisCode | None = None
        self._call_timeout = call_timeout
        self._entry = registry_entry(config, target, since)
        # the round trip of every read of the wait, made once
        self._calls = [
            register_call(config, self.id, target, self._entry, self._keys),
            read_call(self._keys, wait=True),
        ]

    @property
    def _code(self) -> RedisCode:
        if self._code_source is not None:
            return self._code_source()
        if self._code_of is None:
            self._code_of = RedisCode(self._connect(), self._config)
        return self._code_of

    def _timeout(self) -> float | None:
        return None if self._call_timeout is None else self._call_timeout()

    def subscribe(self, *, refresh_topology: bool = False) -> Subscription:
        """A subscription to the job's channel, confirmed by Redis before it returns."""
        try:
            subscription = Subscription.open(
                self._connect(),
                self._keys.channel,
                refresh_topology=refresh_topology,
                timeout=self._timeout(),
            )
        except Exception:
            self.answered = False
            raise
        self.answered = True
        return subscription

    def register_and_read(self) -> Snapshot:
        """Register (or refresh the entry), then read the state: one round trip.

        Two calls in one pipeline, in this order: the registering one declares
        only what a waiter writes, the reading one (``FCALL_RO``) what it only
        reads, so the worker role needs no write permission on the state.
        """
        try:
            registered, reply = self._code.replies(self._calls, timeout=self._timeout())
        except Exception:
            self.answered = False
            raise
        self.answered = True
        if isinstance(reply, Exception):
            raise reply
        if isinstance(registered, Exception):
            if not is_out_of_memory(registered):
                raise registered
            warn_unregistered(self._config.job, registered)
            return replace(parse_snapshot(reply), full=True)
        self.registered = True
        return parse_snapshot(reply)

    def leave(self, timeout: float | None = None) -> None:
        """Remove the registry entry and its target (one try within ``timeout``
        seconds, else the link's call timeout; raises on failure)."""
        if self.registered:
            self._code.call(
                *leave_call(self._keys, self.id),
                timeout=self._timeout() if timeout is None else timeout,
            )

    def close(self) -> None:
        """Close this link's own code runner's connections (not a shared one's)."""
        code, self._code_of = self._code_of, None
        if code is not None:
            code.close()


_unregistered_warned: set[str] = set()


def warn_unregistered(job: str, error: Exception) -> None:
    """Say (once per job and process) that Redis is too full to register a waiter."""
    if job not in _unregistered_warned:
        _unregistered_warned.add(job)
        log.warning(
            "job %s: Redis is full and refused this waiter's registration (%s); the wait "
            "goes on by reading the state, but the chief does not hear of it and "
            "`stepbarrier status` does not show it. Raise maxmemory "
            "(docs/operations.md#memory)",
            job,
            " ".join(str(error).split())[:120],
        )


def new_waiter_id(config: BarrierConfig) -> str:
    """A new wait's id in the job's registry: its task id and a random part (32 bits)."""
    task = "x" if config.task_id is None else str(config.task_id)
    return f"{task}-{secrets.token_hex(4)}"


_process: tuple[int, str] = (0, "")
"""``(pid, host name)`` of this process (read again after a fork)."""


def _host_and_pid() -> tuple[str, str]:
    global _process
    pid = os.getpid()
    if _process[0] != pid:
        _process = (pid, socket.gethostname()[:200])
    return _process[1], str(pid)


def registry_entry(config: BarrierConfig, target: int, since: float) -> dict[str, str]:
    """The registry entry of a wait (what ``stepbarrier status`` shows)."""
    host, pid = _host_and_pid()
    return {
        "task_id": "" if config.task_id is None else str(config.task_id),
        "wait_until_step": str(target),
        "since": f"{since:.3f}",
        "host": host,
        "pid": pid,
    }


def register_call(
    config: BarrierConfig,
    waiter_id: str,
    target: int,
    entry: dict[str, str],
    keys: JobKeys | None = None,
) -> Call:
    """The call that registers a waiter (again, if its entry expired) or refreshes it
    (``keys``: ``config.keys``, if the caller has them at hand)."""
    keys = config.keys if keys is None else keys
    args: list[Any] = [REGISTRY_TTL, config.key_ttl, waiter_id, target]
    for name, value in entry.items():
        args += [name, value]
    return ("waiter_register", [keys.waiter(waiter_id), keys.targets, keys.registrations], args)


def read_call(keys: JobKeys, *, wait: bool = False) -> Call:
    """The read-only call that returns Redis's clock, the reset marker and the state
    (``wait``: a wait's read, of the fields a wait decides by only, without the clock)."""
    return ("waiter_read", [keys.state, keys.reset], ["wait"] if wait else [])


def leave_call(keys: JobKeys, waiter_id: str) -> Call:
    """The call that removes a waiter's registry entry and its target."""
    return ("waiter_leave", [keys.waiter(waiter_id), keys.targets], [waiter_id])
