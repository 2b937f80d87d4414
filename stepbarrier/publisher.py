"""The chief's side: hand over the global step, and let a thread publish it.

``publish(step)`` is on the training thread's hot path, so it only stores the
number and, when the step crosses a step some worker waits for, sets an event:
a few microseconds, no I/O, no exception because Redis is down.

A background thread does the Redis work. It writes once per heartbeat (step,
Redis-time heartbeat, TTLs) and once per crossed threshold, whatever the step
rate: the thresholds are the targets registered by waiting workers, returned by
every write, and pushed to a second thread the moment a new worker registers.
Outages are retried with backoff; the latest step is written once Redis is back.
"""

from __future__ import annotations

import logging
import math
import operator
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

import redis

from stepbarrier import scripts
from stepbarrier.config import BarrierConfig
from stepbarrier.connection import backoff as retry_backoff
from stepbarrier.connection import (
    backoff_attempt,
    call_with_retries,
    is_transient,
    make_client,
    translate,
)
from stepbarrier.errors import StepBarrierError
from stepbarrier.protocol import MAX_STEP
from stepbarrier.registrations import RegistrationListener

log = logging.getLogger("stepbarrier.publisher")

MAX_TARGETS = 256
"""How many pending targets (lowest first) each write brings back to the chief."""
LOG_EVERY = 30.0
"""Seconds between repeated log lines about the same outage."""


class StepPublisher:
    """Publishes the chief's global step for a job's waiting workers.

    Args:
        config: The job's settings.
        client: A redis-py client to use; one is made from ``config`` if omitted
            (and then closed by ``close``).
        clock: Monotonic clock (injectable for tests).

    Example:
        >>> with StepPublisher(BarrierConfig(job="demo")) as publisher:  # doctest: +SKIP
        ...     for step in range(1, 1001):
        ...         train_one_step()
        ...         publisher.publish(step)
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: redis.Redis | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.config = config
        self._keys = config.keys
        self._owns_client = client is None
        self._client = client if client is not None else make_client(config)
        self._clock = clock
        self._chief = f"{socket.gethostname()}:{os.getpid()}"[:200]
        self._publish_script = self._client.register_script(scripts.PUBLISH_STEP)
        self._begin_script = self._client.register_script(scripts.BEGIN_GENERATION)
        # Shared with the training thread: plain attribute reads and writes only.
        self._latest: int | None = None
        self._handed = 0
        self._next_threshold: float = -1.0
        # Owned by the background threads.
        self._lock = threading.Lock()
        self._stored = threading.Condition(self._lock)
        self._stored_seq = 0
        self._pending: list[int] = []
        self._stored_step = -1
        self._heard_targets: set[int] = set()
        self._generation: int | None = None
        self._generation_wanted = 1
        self._generation_begun = 0
        self._superseded = False
        self._final_done: bool | None = None
        self._close_deadline = math.inf
        self._closed = False
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.writes = 0
        """Number of successful writes to Redis (for tests and benchmarks)."""
        self.last_error: str | None = None
        """The most recent Redis error as one clear line, ``None`` after a successful write."""
        self.last_failure: StepBarrierError | None = None
        """The most recent Redis error (``RedisRefused``, ``RedisUnavailable``), or ``None``
        after a successful write; after ``close``, why its final write failed."""
        self._thread = threading.Thread(
            target=self._run, name=f"stepbarrier-publisher-{config.job}", daemon=True
        )
        self._listener = RegistrationListener(config, self._heard)
        self._thread.start()
        self._listener.start()

    @classmethod
    def from_env(cls) -> StepPublisher:
        """A publisher configured from ``STEPBARRIER_*`` variables."""
        return cls(BarrierConfig.from_env())

    # -- the training thread's side ------------------------------------------------

    def publish(self, step: int) -> None:
        """Hand over the chief's current global step; returns at once.

        Args:
            step: The global step the chief has completed (an ``int`` or a
                NumPy integer), never more than the true step.

        Raises:
            TypeError: ``step`` is not an integer.
            ValueError: ``step`` is negative or above 2**53.
        """
        value = operator.index(step)
        if not 0 <= value <= MAX_STEP:
            raise ValueError(f"step must be from 0 to 2**53, got {value}")
        self._latest = value
        self._handed += 1
        if value >= self._next_threshold:
            self._wake.set()

    @property
    def next_threshold(self) -> float:
        """The lowest step a registered worker still waits for (``inf`` if none).

        Integrations whose step value may lag by one (TensorFlow fetches the
        global step from before the run in flight) check this to confirm the
        true step only when it matters: once per crossed threshold.
        """
        return self._next_threshold

    def new_generation(self) -> None:
        """Start a new chief generation (after a restart or a checkpoint restore).

        The next ``publish`` replaces the stored step, even with a lower value, so
        waiters follow the real step rather than a stale maximum.
        """
        with self._lock:
            self._latest = None
            self._stored_step = -1
            self._next_threshold = -1.0
            self._generation_wanted += 1
            self._superseded = False

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the last handed-over step is stored in Redis.

        Returns:
            True if it was stored within ``timeout`` seconds; False at once if a
            newer chief generation has taken the job over.
        """
        wanted = self._handed
        if self._latest is None:
            return True
        deadline = None if timeout is None else self._clock() + timeout
        self._wake.set()
        with self._stored:
            while self._stored_seq < wanted:
                remaining = None if deadline is None else deadline - self._clock()
                expired = remaining is not None and remaining <= 0
                if expired or self._superseded or not self._thread.is_alive():
                    return False  # a newer chief owns the job: this step will never be stored
                self._wake.set()
                self._stored.wait(0.05 if remaining is None else min(remaining, 0.05))
        return True

    def close(self, done: bool = True, *, timeout: float = 10.0) -> bool:
        """Publish the last step, optionally mark the job finished, and stop.

        Args:
            done: Mark the job finished: workers still waiting for a step that has
                not come are aborted at once (``BarrierAborted``).
            timeout: Seconds to keep trying if Redis is unreachable.

        Returns:
            True if the final state reached Redis; if not, a warning says why.
        """
        if self._closed:
            return True
        self._closed = True
        deadline = self._clock() + timeout
        self._close_deadline = deadline
        self._final_done = done
        self._stopping.set()
        self._wake.set()
        self._listener.stop(timeout=0.0)
        self._thread.join(max(0.0, deadline - self._clock()) + 1.0)
        self._listener.stop(timeout=1.0)
        ok = self._stored_seq >= self._handed and self.last_error is None
        if not ok:
            log.warning(
                "job %s: the final step %s may not have reached Redis (%s)",
                self.config.job,
                self._latest,
                self.last_error or "timed out",
            )
        if self._owns_client:
            self._client.close()
        return ok

    def __enter__(self) -> StepPublisher:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # A crash is not the end of the job: a restarted chief may carry on.
        self.close(done=exc_type is None)

    # -- the background thread's side ---------------------------------------------

    def _run(self) -> None:
        next_beat = self._clock()
        failures = 0
        last_log = -math.inf
        backoff = retry_backoff()
        while not self._stopping.is_set():
            self._wake.wait(max(0.0, next_beat - self._clock()))
            self._wake.clear()
            if self._stopping.is_set():
                break
            if self._latest is None or self._superseded:
                next_beat = self._clock() + self.config.heartbeat
                continue
            try:
                self._write(done=False)
                if failures:
                    log.info("Redis is back; published step %s", self._latest)
                failures = 0
                next_beat = self._clock() + self.config.heartbeat
                self._forget_stale_wake()
            except Exception as exc:  # the chief must never die of a Redis problem
                failures += 1
                error = translate(exc, self.config, action="publish the step")
                self.last_failure, self.last_error = error, str(error)
                now = self._clock()
                if now - last_log >= LOG_EVERY:
                    last_log = now
                    log.warning("%s; training continues, will retry", error)
                delay = (
                    backoff(backoff_attempt(failures))
                    if is_transient(exc)
                    else self.config.heartbeat
                )
                self._stopping.wait(delay)
                next_beat = self._clock()
        self._finish()

    def _forget_stale_wake(self) -> None:
        # Every publish() between crossing a threshold and this write's new
        # threshold set the event again; honoured, it would make a second
        # write per crossed threshold at high step rates. Clear it, then look
        # again, so no wake that still matters (a crossing, close()) is lost.
        self._wake.clear()
        latest = self._latest
        if self._stopping.is_set() or (latest is not None and latest >= self._next_threshold):
            self._wake.set()

    def _finish(self) -> None:
        if self._latest is None or self._superseded or self._final_done is None:
            return
        done = self._final_done
        try:
            call_with_retries(
                lambda: self._write(done=done),
                self.config,
                action="publish the final step",
                deadline=self._close_deadline,
                clock=self._clock,
                sleep=time.sleep,
            )
        except Exception as exc:
            self.last_failure = translate(exc, self.config, action="publish the final step")
            self.last_error = str(self.last_failure)  # close() reports it

    def _write(self, *, done: bool) -> None:
        if self._generation_begun != self._generation_wanted:
            wanted = self._generation_wanted
            self._generation = int(self._begin_script(keys=[self._keys.state]))
            self._generation_begun = wanted
            log.info("job %s: chief generation %d begins", self.config.job, self._generation)
        step, seq, generation = self._latest, self._handed, self._generation
        if step is None or generation is None:
            return
        keys = self._keys
        reply = self._publish_script(
            keys=[keys.state, keys.targets, keys.reset],
            args=[
                generation,
                step,
                1 if done else 0,
                self.config.key_ttl,
                keys.channel,
                self._chief,
                MAX_TARGETS,
                keys.waiter_prefix,
            ],
        )
        accepted, stored_step, stored_generation, repaired, *targets = reply
        self.writes += 1
        self.last_error = None
        self.last_failure = None
        if int(repaired):
            log.warning("job %s: replaced malformed content in its state keys", self.config.job)
        if not int(accepted):
            self._superseded = True
            log.warning(
                "job %s: a newer chief (generation %s) has taken over; this chief "
                "(generation %s) stops publishing",
                self.config.job,
                stored_generation.decode()
                if isinstance(stored_generation, bytes)
                else stored_generation,
                self._generation,
            )
            return
        stored = int(stored_step)
        self._stored_step = stored
        pending = sorted({int(float(t)) for t in targets})
        with self._stored:
            self._heard_targets = {t for t in self._heard_targets if t > stored}
            self._pending = pending
            self._refresh_threshold()
            self._stored_seq = max(self._stored_seq, seq)
            self._stored.notify_all()

    def _refresh_threshold(self) -> None:
        if self._stored_step < 0:
            # No write in this generation yet: the next publish must write at once,
            # even if a registration was heard first (it would wait a heartbeat).
            self._next_threshold = -1.0
            return
        candidates = [*self._pending[:1], *self._heard_targets]
        self._next_threshold = float(min(candidates)) if candidates else math.inf
        latest = self._latest
        if latest is not None and latest >= self._next_threshold:
            self._wake.set()

    # -- the registration listener -------------------------------------------------

    def _heard(self, target: int) -> None:
        """A new waiter registered ``target`` (called by the registration listener)."""
        if target <= self._stored_step:
            return  # that waiter reads a step it already has
        with self._lock:
            self._heard_targets.add(target)
            self._refresh_threshold()
