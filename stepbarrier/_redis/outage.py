"""A background writer: its daemon thread, and its failures (``Outage``).

The chief's writer and registration listener, and each task's progress reporter,
call Redis from a thread of their own and never fail the training thread; an
``Outage`` judges each failure once (retry or not; a bug of ours is no Redis
problem) and paces the retries and the log lines.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from types import SimpleNamespace
from typing import TypeVar, cast

from tenacity import RetryCallState

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.failures import REDIS_ERRORS, is_transient, translate
from stepbarrier._redis.retries import backoff
from stepbarrier.errors import RedisUnavailable, StepBarrierError

W = TypeVar("W", bound="BackgroundWriter")

LOG_EVERY = 30.0
"""Seconds between repeated log lines about the same outage."""
LOST_REDIS_WAIT = 0.5
"""Seconds a session's end (``close``, ``pause``) waits for the last write once a
write failed because Redis could not be reached: the end of a training session
waits for a Redis that answers, never for one that is gone."""


class Outage:
    """The failures of one background writer since its last success (``action``: what it
    does, in a failure's message; ``doing``: in a bug's log line)."""

    def __init__(
        self,
        config: BarrierConfig,
        *,
        action: str,
        doing: str,
        log: logging.Logger,
        log_every: float = LOG_EVERY,
    ) -> None:
        self._config, self._action, self._doing, self._log = config, action, doing, log
        self._log_every = log_every
        self._said_at = -math.inf
        self._backoff = backoff()
        self.failures = 0
        self.failing = False  # the last try failed for want of Redis: a retry may cure it
        self.last_error: str | None = None  # the last failure as one line
        self.last_failure: StepBarrierError | None = None  # None for a bug of our own

    def succeeded(self) -> bool:
        """Note a try that went through; True if it ended a run of failures."""
        ended = self.failures > 0
        self.failures, self.failing = 0, False
        self.last_error = self.last_failure = None
        return ended

    def failed(self, exc: BaseException, *, passing: bool = False) -> bool:
        """Note why a try failed; True if a retry may cure it (``failing``; ``passing``: a
        refusal that clears by itself, retried like an outage)."""
        self.failures += 1
        if isinstance(exc, (*REDIS_ERRORS, OSError, StepBarrierError)):
            error = translate(exc, self._config, action=self._action, probe=False)
            self.last_failure, self.last_error = error, str(error)
            self.failing = is_transient(exc) or isinstance(exc, RedisUnavailable) or passing
        else:
            # our own bug, not Redis: say so, with the traceback, and keep training
            self._log.error(
                "job %s: internal error while %s", self._config.job, self._doing, exc_info=exc
            )
            self.last_failure, self.failing = None, False
            self.last_error = f"internal error: {type(exc).__name__}: {exc}"
        return self.failing

    def say(self, level: int, consequence: str) -> None:
        """Log the last failure and its ``consequence``, once per ``log_every`` at most."""
        now = time.monotonic()
        if now - self._said_at >= self._log_every:
            self._said_at = now
            self._log.log(level, "%s; %s", (self.last_error or "").rstrip("."), consequence)

    def delay(self, attempt: int | None = None) -> float:
        """Seconds to wait after the ``attempt``-th failure in a row (default: this outage's)."""
        # backoff() reads only the attempt number of tenacity's state
        state = SimpleNamespace(attempt_number=attempt or self.failures)
        return float(self._backoff(cast(RetryCallState, state)))


class BackgroundWriter:
    """A daemon thread (running ``_run``) that calls Redis so that the training thread
    never does, woken by ``_wake``. Its client is the one given, or one ``_connected``
    makes in the thread at first use (a cluster client reads the slot map at once: a
    Redis that is down must not fail the training's start).
    """

    def __init__(
        self, config: BarrierConfig, client: RedisClient | None, *, name: str, outage: Outage
    ) -> None:
        self.config = config
        self._client = client
        self._owns_client = client is None
        self._client_lock = threading.Lock()  # no close while another thread cuts its calls
        self._outage = outage
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"stepbarrier-{name}-{config.job}", daemon=True
        )
        self.writes = 0  # answered writes to Redis (for tests and benchmarks)
        self._closed = False  # close() ran: a second one only reports

    @property
    def last_error(self) -> str | None:
        """The most recent error as one clear line, ``None`` after a successful write."""
        return self._outage.last_error

    @property
    def last_failure(self) -> StepBarrierError | None:
        """The most recent Redis error (``RedisRefused``, ``RedisUnavailable``), ``None``
        after a successful write or for a bug; after ``close``, why its last write failed."""
        return self._outage.last_failure

    def __enter__(self: W) -> W:
        return self

    def _run(self) -> None:
        raise NotImplementedError

    def _connected(self, **options: float) -> RedisClient:
        client = self._client
        if client is None:
            client = make_client(self.config, **options)  # may do I/O: not under the lock
            with self._client_lock:
                self._client = client
        return client

    def _end_wait(self, timeout: float) -> float:
        """How long a session's end waits (``LOST_REDIS_WAIT`` at most once Redis is lost)."""
        return min(timeout, LOST_REDIS_WAIT) if self._outage.failing else timeout

    def _signal_stop(self) -> None:
        self._stopping.set()
        self._wake.set()

    def _close_client(self) -> None:
        """Close the client if it was made here (a given one is its owner's)."""
        with self._client_lock:
            if self._owns_client and self._client is not None:
                self._client.close()
