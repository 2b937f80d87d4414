"""The background side of ``StepPublisher``: the threads that write its step to Redis.

``PublisherLoop``'s writer thread writes once per heartbeat and once per
crossed threshold, hands each write's reply to its ``PublisherState``
(``stepbarrier._chief.state``: what the reply means), retries outages with
backoff and tells what failed; its registration listener adds the targets of
newly registered workers. The training thread (``stepbarrier._chief.publisher``)
reaches it through a ``Handover`` and a few calls that are off the hot path.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable

from stepbarrier._chief.publish_call import Beginning, StepWriter
from stepbarrier._chief.registrations import RegistrationListener
from stepbarrier._chief.state import Handover, PublisherState, log
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.freshness import FENCE, confirm_window
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.failures import REDIS_ERRORS, is_transient, translate
from stepbarrier._redis.retries import backoff as retry_backoff
from stepbarrier._redis.retries import backoff_attempt, call_with_retries
from stepbarrier.errors import RedisUnavailable, StepBarrierError

LOG_EVERY = 30.0
"""Seconds between repeated log lines about the same outage."""

LOST_REDIS_WAIT = 0.5
"""Seconds ``close`` and ``pause`` wait for the last step to be stored once a write
failed because Redis could not be reached: the end of a training session waits
for a Redis that answers, never for one that is gone."""


class PublisherLoop:
    """The writer thread and the registration listener of one ``StepPublisher``.

    Takes ``StepPublisher``'s arguments (``chief_name`` is its ``description``).
    The training thread writes ``handover``, sets ``wake`` and calls the methods
    up to ``writer``; everything else is the threads' own. What they share
    lives in ``state``, under its lock.
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None,
        *,
        clock: Callable[[], float],
        contributor: bool,
        chief_name: str,
        operator: bool = False,
        optional: bool = False,
    ) -> None:
        self.config = config
        self.contributor = contributor
        self.operator = operator
        self._owns_client = client is None
        # made in the thread, at the first write (a cluster client reads the slot
        # map at once: a Redis that is down must not fail the chief's start)
        self._client: RedisClient | None = client
        self._clock = clock
        self._chief_name = chief_name
        self._writer_of: StepWriter | None = None
        self.handover = Handover(handed_at=clock())
        self.wake = threading.Event()  # write now: a crossed threshold, flush(), stop()
        self._stopping = threading.Event()
        self.state = PublisherState(
            config,
            self.handover,
            self.wake,
            clock=clock,
            contributor=contributor,
            optional=optional,
        )
        self._final_done: bool | None = None
        self._idle_said = False
        self._close_deadline = math.inf
        # the close's whole deadline: once Redis answers again, the final write
        # may wait out a probation until then (a lost Redis cut the close short)
        self.answered_deadline = -math.inf
        self.failing = False  # the last write failed for want of Redis (it retries)
        self.writes = 0  # these three: see StepPublisher's properties
        self._last_error: str | None = None
        self.last_failure: StepBarrierError | None = None
        self.thread = threading.Thread(
            target=self._run, name=f"stepbarrier-publisher-{config.job}", daemon=True
        )
        self.listener = (
            None if contributor else RegistrationListener(config, self.state.on_registration)
        )

    # -- called by the training thread -----------------------------------------------

    @property
    def active(self) -> bool:
        """False once this writer is done for good (``ended`` says why)."""
        return self.state.ended is None

    @property
    def ended(self) -> str | None:
        """``"superseded"``, ``"reset"`` or ``"refused"`` once done for good; else ``None``."""
        return self.state.ended

    @property
    def pending(self) -> tuple[int, ...]:
        """The lowest targets waited for, from the last write."""
        return self.state.pending

    @property
    def last_error(self) -> str | None:
        """Why this writer ended, or else the last write's error (``None`` after a success)."""
        return self.state.end_message if self.state.ended is not None else self._last_error

    def start(self) -> None:
        """Start the writer thread and the registration listener."""
        self.thread.start()
        if self.listener is not None:
            self.listener.start()

    def pause(self) -> None:
        """Heartbeat on while nothing is handed over; see ``StepPublisher.pause``
        (called by the training thread, like ``publish``)."""
        self.handover.paused_at = self.handover.handed
        self.handover.skip_gap = True

    @property
    def paused(self) -> bool:
        """True from ``pause()`` until the next step is handed over."""
        return self.handover.paused_at == self.handover.handed

    def loop_idle(self) -> bool:
        """True once the training loop handed nothing over for ``idle_limit()``,
        out of a pause, and what it handed over last is stored: the heartbeat
        then stops (said once; and again when it resumes)."""
        handover = self.handover
        idle = self._clock() - handover.handed_at
        paused = self.paused
        stored = self.state.stored_seq >= handover.handed
        stopped = idle >= self.idle_limit() and stored and not paused
        if stopped and not self._idle_said:
            self._idle_said = True
            log.warning(
                "job %s: the training loop handed no step over for %.0f s (the stall "
                "timeout, or its confirmation window); the heartbeat stops, so that "
                "waiting workers see that this chief no longer trains; the next step "
                "resumes it",
                self.config.job,
                idle,
            )
        elif not stopped and self._idle_said:
            self._idle_said = False
            log.info("job %s: the training loop hands steps over again", self.config.job)
        return stopped

    def idle_limit(self) -> float:
        """How long the loop may hand nothing over before the heartbeat stops: the
        stall timeout, or its confirmation window (four of its mean step times,
        at least 5 s: a slow chief's long steps), whichever is longer."""
        # at least the confirmation window too: a step that still vouches is
        # heartbeated (a late joiner's registration asks for a write of it)
        return max(self.config.stall_timeout, confirm_window(self.handover.step_time))

    def new_generation(self) -> None:
        """Drop the handed-over step and, for a chief, ask for a new generation."""
        self.state.new_generation()

    def wait_stored(
        self, wanted: int, deadline: float | None, *, while_reachable: bool = False
    ) -> bool:
        """Wait until the ``wanted``-th handed-over step is stored; see ``StepPublisher.flush``.

        ``while_reachable``: give up once a write fails for want of Redis.
        """
        state = self.state
        self.wake.set()
        with state.stored:
            refusals = state.refusals
            while state.stored_seq < wanted:
                remaining = None if deadline is None else deadline - self._clock()
                expired = remaining is not None and remaining <= 0
                if (
                    expired
                    or state.ended is not None
                    or state.refusals != refusals
                    or not self.thread.is_alive()
                    or (while_reachable and self.failing)
                ):
                    return False
                self.wake.set()
                state.stored.wait(0.05 if remaining is None else min(remaining, 0.05))
        return True

    def stop(self, *, done: bool, deadline: float) -> bool:
        """Write the final state (marking the job finished if ``done``), then stop both threads.

        Returns:
            True if every handed-over step reached Redis and no write failed since.
        """
        self._close_deadline = deadline
        self._final_done = done
        self._stopping.set()
        self.wake.set()
        self._stop_listener(0.0)
        # with Redis lost, a thread still in a call to it is not waited for long:
        # training never waits for Redis (the thread is a daemon)
        slack = 0.1 if self.failing else 1.0
        # (the deadline may grow: a final write that Redis answered waits out
        # its probation within the close's whole timeout)
        while self.thread.is_alive() and self._clock() < self._close_deadline + slack:
            self.thread.join(min(0.05, max(0.0, self._close_deadline + slack - self._clock())))
        self._stop_listener(slack)
        if self._owns_client and self._client is not None:
            self._client.close()
        # a final write left on probation vouches for nothing: not a success
        unvouched = bool(done) and self.state.probation_until > self._clock()
        return (
            self.ended is None
            and self.state.stored_seq >= self.handover.handed
            and self.last_error is None
            and not unvouched
        )

    def writer(self) -> StepWriter:
        """The step writer, made (with its client) at its first use by the writer thread."""
        if self._writer_of is None:
            if self._client is None:
                self._client = make_client(self.config)
            self._writer_of = StepWriter(
                self._client,
                self.config,
                self._chief_name,
                contributor=self.contributor,
                operator=self.operator,
            )
        return self._writer_of

    # -- the writer thread -----------------------------------------------------------

    def _run(self) -> None:
        try:
            self._write_until_stopped()
        finally:
            # the thread gives its connection back itself, however late it ends
            # (stop() may have stopped waiting for it)
            if self._writer_of is not None:
                self._writer_of.close()

    def _write_until_stopped(self) -> None:
        next_beat = self._clock()
        failures = 0
        last_log = -math.inf
        backoff = retry_backoff()
        while not self._stopping.is_set() and self.ended is None:
            self.wake.wait(max(0.0, next_beat - self._clock()))
            self.wake.clear()
            if self._stopping.is_set():
                break
            if self.handover.latest is None or self.loop_idle():
                next_beat = self._clock() + self.config.heartbeat
                continue
            try:
                wrote = self._write(done=False)
                if failures:
                    log.info("Redis is back; published step %s", self.handover.latest)
                failures = 0
                self.failing = False
                next_beat = self._clock() + self.config.heartbeat
                if self.state.probation_until > self._clock():
                    # the probation's end is a write: it is what releases workers
                    next_beat = min(next_beat, self.state.probation_until + 0.001)
                if wrote:
                    self._forget_stale_wake()
            except Exception as exc:  # the chief must never die of a Redis problem
                failures += 1
                transient = self._note_failure(exc)
                self.failing = transient
                if not self.active:
                    break  # told once, by PublisherState
                now = self._clock()
                if now - last_log >= LOG_EVERY:
                    last_log = now
                    # optional reporting (a worker's, by default) is no one's concern
                    level = logging.INFO if self.state.optional else logging.WARNING
                    log.log(level, "%s; training continues, will retry", self.last_error)
                delay = backoff(backoff_attempt(failures)) if transient else self.config.heartbeat
                self._stopping.wait(delay)
                next_beat = self._clock()
        if self.ended is not None:
            self._stop_listener(1.0)
        self._finish()

    def _note_failure(self, exc: BaseException) -> bool:
        """Record why a write failed; True if a retry may cure it."""
        if not isinstance(exc, (*REDIS_ERRORS, OSError, StepBarrierError)):
            # our own bug, not Redis: say so, with the traceback, and keep training
            log.error("job %s: internal error while publishing", self.config.job, exc_info=exc)
            self.last_failure = None
            self._last_error = f"internal error: {type(exc).__name__}: {exc}"
            transient = False
        else:
            error = translate(exc, self.config, action="publish the step", probe=False)
            self.last_failure, self._last_error = error, str(error)
            transient = is_transient(exc) or isinstance(exc, RedisUnavailable)
        if not transient:
            forbidden = getattr(self.last_failure, "kind", None) in ("permission", "functions")
            self.state.refused(self._last_error, forbidden=forbidden)
        return transient

    def _forget_stale_wake(self) -> None:
        # Every publish() between crossing a threshold and this write's new
        # threshold set the event again; honoured, it would make a second
        # write per crossed threshold at high step rates. Clear it, then look
        # again, so no wake that still matters (a crossing, stop()) is lost.
        self.wake.clear()
        latest = self.handover.latest
        if self._stopping.is_set() or (
            latest is not None and latest >= self.handover.next_threshold
        ):
            self.wake.set()

    def _finish(self) -> None:
        if self.handover.latest is None or self.ended is not None or self._final_done is None:
            return
        done = self._final_done
        for _ in range(2):
            # a final step written on probation vouches for nothing: wait it out
            # (within the close's deadline) and write it again, so that the
            # finished job releases its waiters
            wait = min(self.state.probation_until, self._close_deadline) - self._clock()
            if wait > 0:
                time.sleep(wait + 0.001)
            try:
                self._final_write(done)
                self.failing = False  # Redis answered
            except Exception as exc:
                self._note_failure(exc)  # stop() reports it
                return
            if self.ended is not None or self.state.probation_until <= self._clock():
                return
            # Redis answers: a probation may be waited out within the whole close
            self._close_deadline = max(self._close_deadline, self.answered_deadline)

    def _final_write(self, done: bool) -> None:
        """The final write, retried until the close's deadline while Redis answers
        something; once it is found unreachable, for at most ``LOST_REDIS_WAIT``
        more (a session's end never waits for a Redis that is gone)."""
        deadline = self._close_deadline
        if self.failing:
            deadline = min(deadline, self._clock() + LOST_REDIS_WAIT)
        else:
            try:
                self._write(done=done)
                return
            except (*REDIS_ERRORS, OSError, RedisUnavailable) as exc:
                if not (is_transient(exc) or isinstance(exc, RedisUnavailable)):
                    raise  # noted once, by the caller
                self.failing = True
                deadline = min(deadline, self._clock() + LOST_REDIS_WAIT)
        call_with_retries(
            lambda: self._write(done=done),
            self.config,
            action="publish the final step",
            deadline=deadline,
            clock=self._clock,
            sleep=time.sleep,
        )

    def _write(self, *, done: bool) -> bool:
        """One write; False if there was nothing (new) to write."""
        wanted, needs_generation = self.state.generation_to_begin()
        if needs_generation:
            beginning = self._begin()
            if beginning is None or not self.state.begin_generation(wanted, beginning):
                return False  # another run's chief is live, or yet another generation was asked for
            log.info("job %s: chief generation %d begins", self.config.job, beginning.generation)
        upcoming = self.state.next_write(done=done)
        if upcoming is None:
            return False
        values, seq = upcoming
        result = self.writer().write(values)
        self.writes += 1
        self._last_error = None
        self.last_failure = None
        if result.repaired:
            log.warning("job %s: replaced malformed content in its state keys", self.config.job)
        return self.state.take_reply(result, seq, wanted)

    def _begin(self) -> Beginning | None:
        """Begin a generation, unless another run's chief is live (docs/protocol.md#runs).

        A chief that finds the state of another run id, not finished, watches it
        for ``FENCE`` on its own clock: if that run's writes went on, both
        runs would share one job's keys, so this chief refuses (an ERROR naming
        both runs) instead of silently superseding it.
        """
        beginning = self.writer().begin_generation()
        found = beginning.stored
        if self.operator or found is None or found.done or found.run_id == self.config.run_id:
            return beginning
        fence = FENCE
        log.info(
            "job %s: the stored state belongs to run %s (chief %s); watching it for %.1f s "
            "before taking the job over",
            self.config.job,
            found.run_id or "(none)",
            found.chief or "unknown",
            fence,
        )
        if self._stopping.wait(fence):
            return None
        beginning = self.writer().begin_generation()
        again = beginning.stored
        if (
            again is not None
            and again.run_id == found.run_id
            and not again.done
            and (again.generation, again.beat) != (found.generation, found.beat)
        ):
            self.state.conflict(
                f"job {self.config.job} is in use by run {found.run_id or '(none)'} (chief "
                f"{again.chief or 'unknown'}, still writing); this chief of run "
                f"{self.config.run_id or '(none)'} does not take it over and publishes nothing. "
                "Give each concurrent run its own STEPBARRIER_JOB, or stop the other run "
                "(`stepbarrier reset` clears its state)"
            )
            return None
        if again is not None and again.run_id == found.run_id:
            log.warning(
                "job %s: taking the job over from run %s, whose chief wrote nothing for %.1f s",
                self.config.job,
                found.run_id or "(none)",
                fence,
            )
        return beginning

    def _stop_listener(self, timeout: float) -> None:
        if self.listener is not None:
            self.listener.stop(timeout=timeout)
