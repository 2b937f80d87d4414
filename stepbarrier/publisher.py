"""The chief's side: hand over the global step, and let a thread publish it.

``publish(step)`` is on the training thread's hot path, so it only stores the
number and, when the step crosses a step some worker waits for, sets an event:
a few microseconds, no I/O, no exception because Redis is down.

A background thread does the Redis work. It writes once per heartbeat (step,
Redis-time heartbeat, TTLs) and once per crossed threshold, whatever the step
rate: the thresholds are the targets registered by waiting workers, returned by
every write, and pushed to a second thread the moment a new worker registers.
Outages are retried with backoff; the latest step is written once Redis is back.

Each write also says how long ago the training loop last handed the step over.
A step that no loop has confirmed for longer than its confirmation window (a
chief recovering its session, say) releases no newly arriving worker.
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

from stepbarrier import scripts
from stepbarrier.config import BarrierConfig
from stepbarrier.connection import (
    REDIS_ERRORS,
    RedisClient,
    backoff_attempt,
    call_with_retries,
    is_transient,
    make_client,
    translate,
)
from stepbarrier.connection import backoff as retry_backoff
from stepbarrier.errors import RedisUnavailable, StepBarrierError
from stepbarrier.freshness import confirm_window
from stepbarrier.protocol import MAX_STEP
from stepbarrier.registrations import RegistrationListener
from stepbarrier.step_write import StepWrite, StepWriter, WriteResult

log = logging.getLogger("stepbarrier.publisher")

LOG_EVERY = 30.0
"""Seconds between repeated log lines about the same outage."""
STEP_TIME_SMOOTHING = 0.2
"""Weight of the newest gap in the running mean of the time between two publishes."""


class StepPublisher:
    """Publishes the chief's global step for a job's waiting workers.

    Args:
        config: The job's settings.
        client: A redis-py client to use; one is made from ``config`` if omitted
            (and then closed by ``close``).
        clock: Monotonic clock (injectable for tests).
        contributor: Publish as a training worker rather than as the chief: only
            raise the step of the chief's current generation (in asynchronous
            parameter-server training every worker moves the global step, and
            the job goes on after the chief's session ends), never start a
            generation, never mark the job finished.
        description: Who publishes, stored as the state's ``chief`` field for
            operators; ``host:pid`` by default.

    Example:
        >>> with StepPublisher(BarrierConfig(job="demo")) as publisher:  # doctest: +SKIP
        ...     for step in range(1, 1001):
        ...         train_one_step()
        ...         publisher.publish(step)
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        contributor: bool = False,
        description: str | None = None,
    ) -> None:
        self.config = config
        self.contributor = contributor
        self._owns_client = client is None
        # made in the thread, at the first write (a cluster client reads the slot
        # map at once: a Redis that is down must not fail the chief's start)
        self._client: RedisClient | None = client
        self._clock = clock
        chief = (description or f"{socket.gethostname()}:{os.getpid()}")[:200]
        self._chief_name = chief
        self._writer_of: StepWriter | None = None
        # Shared with the training thread: plain attribute reads and writes only.
        self._latest: int | None = None
        self._handed = 0
        self._handed_at = clock()
        self._step_time: float | None = None
        self._next_threshold: float = -1.0
        # Owned by the background threads.
        self._lock = threading.Lock()
        self._stored = threading.Condition(self._lock)
        self._stored_seq = 0
        self._refusals = 0
        self._pending: tuple[int, ...] = ()
        self._stored_step = -1
        self._heard_targets: set[int] = set()
        self._generation: int | None = None
        self._epoch = 0
        self._generation_wanted = 1
        self._generation_begun = 0
        self._ignore_until_handed = 0
        # "superseded", "reset" or "refused" (a contributor): this writer is done for good
        self._ended: str | None = None
        self._final_done: bool | None = None
        self._close_deadline = math.inf
        self._closed = False
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self.writes = 0
        """Number of successful writes to Redis (for tests and benchmarks)."""
        self.last_error: str | None = None
        """The most recent error as one clear line, ``None`` after a successful write."""
        self.last_failure: StepBarrierError | None = None
        """The most recent Redis error (``RedisRefused``, ``RedisUnavailable``), or ``None``
        after a successful write; after ``close``, why its final write failed."""
        self._thread = threading.Thread(
            target=self._run, name=f"stepbarrier-publisher-{config.job}", daemon=True
        )
        self._listener = None if contributor else RegistrationListener(config, self._heard)
        self._thread.start()
        if self._listener is not None:
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
        now = self._clock()
        gap = now - self._handed_at
        mean = self._step_time
        self._step_time = gap if mean is None else mean + STEP_TIME_SMOOTHING * (gap - mean)
        self._handed_at = now
        self._latest = value
        self._handed += 1
        if value >= self._next_threshold:
            self._wake.set()

    @property
    def next_threshold(self) -> float:
        """The lowest step a registered worker still waits for (``inf`` if none).

        Integrations whose step value may lag (TensorFlow fetches the global
        step from before the run in flight) check this to confirm the true
        step only when it matters. ``-1`` until the first write of a generation
        got through: that write goes out with the next ``publish``.
        """
        return self._next_threshold

    @property
    def active(self) -> bool:
        """False once a newer chief took the job over or the job was reset."""
        return self._ended is None

    @property
    def step_time(self) -> float | None:
        """Running mean of the seconds between two ``publish`` calls (``None`` before two)."""
        return self._step_time

    def new_generation(self) -> None:
        """Start a new chief generation (after a restart or a checkpoint restore).

        The next ``publish`` replaces the stored step, even with a lower value, so
        waiters follow the real step rather than a stale maximum. A write already
        on its way under the old generation no longer counts for ``flush``.
        """
        if self._ended is not None:
            return  # superseded or reset: this publisher never writes again
        with self._lock:
            self._latest = None
            self._stored_step = -1
            self._next_threshold = -1.0
            self._heard_targets = set()
            if not self.contributor:
                self._generation_wanted += 1

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the last handed-over step is stored in Redis.

        Returns:
            True if it was stored within ``timeout`` seconds; False at once if a
            newer chief generation has taken the job over, the job was reset, or
            Redis refused a write (a wrong password, an ACL) while waiting.
        """
        wanted = self._handed
        if self._latest is None:
            return True
        deadline = None if timeout is None else self._clock() + timeout
        self._wake.set()
        with self._stored:
            refusals = self._refusals
            while self._stored_seq < wanted:
                remaining = None if deadline is None else deadline - self._clock()
                expired = remaining is not None and remaining <= 0
                if (
                    expired
                    or self._ended is not None
                    or self._refusals != refusals
                    or not self._thread.is_alive()
                ):
                    return False
                self._wake.set()
                self._stored.wait(0.05 if remaining is None else min(remaining, 0.05))
        return True

    def close(self, done: bool = True, *, timeout: float = 10.0) -> bool:
        """Publish the last step, optionally mark the job finished, and stop.

        Args:
            done: Mark the job finished: workers still waiting for a step that has
                not come are aborted at once (``BarrierAborted``). Ignored by a
                contributor.
            timeout: Seconds to keep trying if Redis is unreachable.

        Returns:
            True if the final state reached Redis; if not, a warning says why
            (nothing is said by a writer that a newer chief or a reset ended).
        """
        if self._closed:
            return True
        self._closed = True
        deadline = self._clock() + timeout
        self._close_deadline = deadline
        self._final_done = done and not self.contributor
        self._stopping.set()
        self._wake.set()
        self._stop_listener(0.0)
        self._thread.join(max(0.0, deadline - self._clock()) + 1.0)
        self._stop_listener(1.0)
        ok = self._ended is None and self._stored_seq >= self._handed and self.last_error is None
        if not ok and self._ended is None and self._latest is not None:
            log.warning(
                "job %s: the final step %s may not have reached Redis (%s)",
                self.config.job,
                self._latest,
                self.last_error or "timed out",
            )
        if self._owns_client and self._client is not None:
            self._client.close()
        return ok or (self._latest is None and self._ended is None)

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
        while not self._stopping.is_set() and self._ended is None:
            self._wake.wait(max(0.0, next_beat - self._clock()))
            self._wake.clear()
            if self._stopping.is_set():
                break
            if self._latest is None:
                next_beat = self._clock() + self.config.heartbeat
                continue
            try:
                wrote = self._write(done=False)
                if failures:
                    log.info("Redis is back; published step %s", self._latest)
                failures = 0
                next_beat = self._clock() + self.config.heartbeat
                if wrote:
                    self._forget_stale_wake()
            except Exception as exc:  # the chief must never die of a Redis problem
                failures += 1
                transient = self._note_failure(exc)
                if not self.active:
                    break  # told once, by _end
                now = self._clock()
                if now - last_log >= LOG_EVERY:
                    last_log = now
                    log.warning("%s; training continues, will retry", self.last_error)
                delay = backoff(backoff_attempt(failures)) if transient else self.config.heartbeat
                self._stopping.wait(delay)
                next_beat = self._clock()
        if self._ended is not None:
            self._stop_listener(1.0)
        self._finish()

    def _note_failure(self, exc: BaseException) -> bool:
        """Record why a write failed; True if a retry may cure it."""
        if not isinstance(exc, (*REDIS_ERRORS, OSError, StepBarrierError)):
            # our own bug, not Redis: say so, with the traceback, and keep training
            log.error("job %s: internal error while publishing", self.config.job, exc_info=exc)
            self.last_failure = None
            self.last_error = f"internal error: {type(exc).__name__}: {exc}"
            transient = False
        else:
            error = translate(exc, self.config, action="publish the step")
            self.last_failure, self.last_error = error, str(error)
            transient = is_transient(exc) or isinstance(exc, RedisUnavailable)
        if not transient:
            with self._stored:
                self._refusals += 1
                self._stored.notify_all()
                refused = getattr(self.last_failure, "kind", None) in ("permission", "functions")
                if self.contributor and refused:
                    # a worker whose user may not write the step (the shipped
                    # worker role): reporting is optional, so say it once and stop
                    self._end(
                        "refused",
                        f"this worker does not report the global step: {self.last_error} "
                        "(reporting needs a user with the chief role's rights; see the README, "
                        "'Workers keep the step moving')",
                    )
        return transient

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
        if self._latest is None or self._ended is not None or self._final_done is None:
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
            self._note_failure(exc)  # close() reports it

    def _write(self, *, done: bool) -> bool:
        """One write; False if there was nothing (new) to write."""
        with self._lock:
            wanted = self._generation_wanted
            needs_generation = not self.contributor and self._generation_begun != wanted
        if needs_generation:
            generation = self._writer().begin_generation()
            with self._lock:
                if self._generation_wanted != wanted:
                    return False  # yet another generation was asked for meanwhile
                self._generation, self._generation_begun = generation, wanted
                self._epoch = self._epoch or generation
            log.info("job %s: chief generation %d begins", self.config.job, generation)
        with self._lock:
            step, seq = self._latest, self._handed
            if step is None or seq <= self._ignore_until_handed:
                return False
            values = StepWrite(
                generation=self._generation or 0,
                step=step,
                done=done,
                publish_age=max(0.0, self._clock() - self._handed_at),
                confirm_window=confirm_window(self.config.heartbeat, self._step_time),
                epoch=self._epoch,
            )
        result = self._writer().write(values)
        self.writes += 1
        self.last_error = None
        self.last_failure = None
        if result.repaired:
            log.warning("job %s: replaced malformed content in its state keys", self.config.job)
        with self._stored:
            if self._generation_wanted != wanted:
                # new_generation() came while this write was on its way: its
                # results describe the old generation and must not count
                self._wake.set()
                return False
            return self._apply(result, seq)

    def _writer(self) -> StepWriter:
        # only the background threads write: the publisher thread, then _finish
        if self._writer_of is None:
            if self._client is None:
                self._client = make_client(self.config)
            self._writer_of = StepWriter(
                self._client, self.config, self._chief_name, contributor=self.contributor
            )
        return self._writer_of

    def _apply(self, result: WriteResult, seq: int) -> bool:
        """Take in a write's reply (holding the lock)."""
        if result.status == scripts.SUPERSEDED:
            self._end(
                "superseded",
                f"a newer chief (generation {result.stored_generation}) has taken over; this "
                f"chief (generation {self._generation}) stops publishing",
            )
            return False
        if result.status == scripts.WAS_RESET:
            self._end(
                "reset",
                "the job was reset (stepbarrier reset) after this chief began; it stops "
                "publishing and waiting workers abort. Start a new chief to run the job again",
            )
            return False
        if result.status == scripts.NOTHING_TO_JOIN:
            return False  # no live chief state of this run yet: try again next heartbeat
        if result.status == scripts.REJOIN:
            # steps handed over before we learnt of the new generation may have
            # been read before the chief restored an older checkpoint: drop them
            self._generation = result.stored_generation or 0
            self._epoch = self._epoch or (result.stored_generation or 0)
            self._ignore_until_handed = self._handed
            self._stored_step = -1
            self._wake.set()
            return False
        stored = -1 if result.stored_step is None else result.stored_step
        self._stored_step = stored
        self._heard_targets = {t for t in self._heard_targets if t > stored}
        self._pending = result.targets
        self._refresh_threshold()
        self._stored_seq = max(self._stored_seq, seq)
        self._stored.notify_all()
        return True

    def _end(self, why: str, message: str) -> None:
        if self._ended is None:
            self._ended = why
            self.last_error = message
            level = logging.ERROR if why == "reset" else logging.WARNING
            log.log(level, "job %s: %s", self.config.job, message)
        self._next_threshold = math.inf
        self._stored.notify_all()
        self._wake.set()

    def _stop_listener(self, timeout: float) -> None:
        if self._listener is not None:
            self._listener.stop(timeout=timeout)

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
        if target <= self._stored_step or self._ended is not None:
            return  # that waiter reads a step it already has
        with self._lock:
            self._heard_targets.add(target)
            self._refresh_threshold()
