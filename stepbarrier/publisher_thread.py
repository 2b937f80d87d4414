"""The background threads' half of ``StepPublisher``: its writes to Redis.

The publisher's thread writes once per heartbeat and once per crossed
threshold, takes in what each write's reply says (the targets of waiting
workers, a newer chief, a reset), retries outages with backoff and tells what
failed; the registration listener's thread adds the targets of newly
registered workers. ``StepPublisher`` (``stepbarrier.publisher``) sets up the
state declared here and is what the training thread calls.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

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
from stepbarrier.registrations import RegistrationListener
from stepbarrier.step_write import StepWrite, StepWriter, WriteResult

# the name these messages always had: log filters and tests select by it
log = logging.getLogger("stepbarrier.publisher")

LOG_EVERY = 30.0
"""Seconds between repeated log lines about the same outage."""


class PublisherThread:
    """What ``StepPublisher``'s background threads do; ``StepPublisher`` is the class to use.

    The attributes below are set up by ``StepPublisher.__init__``. The training
    thread only writes the handed-over step (``_latest``, ``_handed``,
    ``_handed_at``, ``_step_time``) and reads ``_next_threshold``, with plain
    attribute reads and writes; the rest belongs to the background threads,
    under ``_lock`` where two of them share it.
    """

    config: BarrierConfig
    contributor: bool
    writes: int
    last_error: str | None
    last_failure: StepBarrierError | None
    _client: RedisClient | None
    _clock: Callable[[], float]
    _chief_name: str
    _writer_of: StepWriter | None
    _latest: int | None
    _handed: int
    _handed_at: float
    _step_time: float | None
    _next_threshold: float
    _lock: threading.Lock
    _stored: threading.Condition
    _stored_seq: int
    _refusals: int
    _pending: tuple[int, ...]
    _stored_step: int
    _heard_targets: set[int]
    _generation: int | None
    _epoch: int
    _generation_wanted: int
    _generation_begun: int
    _ignore_until_handed: int
    _ended: str | None
    _final_done: bool | None
    _close_deadline: float
    _wake: threading.Event
    _stopping: threading.Event
    _listener: RegistrationListener | None

    if TYPE_CHECKING:  # defined by StepPublisher

        @property
        def active(self) -> bool: ...

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
                        "(reporting needs a user with the chief role's rights; see "
                        "docs/tensorflow-keras.md#workers-keep-the-step-moving)",
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
