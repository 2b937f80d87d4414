"""The chief's side: hand over the global step, and let a thread publish it.

``publish(step)`` is on the training thread's hot path: no I/O, and no exception
because Redis is down. A writer thread writes once per heartbeat and once per
crossed threshold (the targets come with every write, and at once from the
``RegistrationListener``), whatever the step rate; ``PublisherState`` decides.
"""

from __future__ import annotations

import heapq
import logging
import math
import os
import socket
import threading
import time
from collections.abc import Callable

import redis

from stepbarrier._chief.publish_call import Beginning, StepWriter, finished_ttl
from stepbarrier._chief.state import Handover, PublisherState, log
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import WriterMode
from stepbarrier._protocol.freshness import FENCE
from stepbarrier._protocol.library import MAX_LIFETIME
from stepbarrier._protocol.wire import checked_step, parse_int
from stepbarrier._redis.client import RedisClient, disconnect_all, refresh_topology
from stepbarrier._redis.failures import translate
from stepbarrier._redis.outage import LOST_REDIS_WAIT, BackgroundWriter, Outage

_listener_log = logging.getLogger("stepbarrier._chief.registrations")  # its lines' own name

STEP_TIME_SMOOTHING = 0.2
"""Weight of the newest gap in the running mean of the time between two publishes."""
REGISTRATION_BLOCK = 30
"""Seconds one BLPOP blocks; a new waiter ends it at once."""
REGISTRATION_BATCH = 1000
"""Most registrations one wake takes off the list."""
REPORT_PER_WAKE = 32
"""Most targets one wake hands to the publisher (the lowest, without duplicates)."""
INDEX_REFRESH = 60
"""Seconds between a chief's entries of its job in its team's job index
(``STEPBARRIER_JOBS_PATTERN``), each kept ``key_ttl`` seconds and this more (the keys
live ``key_ttl`` after the last write)."""
INDEX_RETRY = 10
"""Seconds until a failed entry in the job index is tried again."""
INDEX_CALL_TIMEOUT = 1.0
"""Seconds one entry in the job index may take (on a Cluster the index lies on another
master than the job's keys): the writer thread is the one that releases workers."""

# The paused chief publisher of each job in this process (at most one): a new
# chief publisher of the job (a hook or callback made anew for the next session)
# closes it, instead of letting the two write until Redis tells the older one it
# was superseded.
_paused: dict[tuple[str, str], StepPublisher] = {}
_paused_lock = threading.Lock()


class StepPublisher(BackgroundWriter):
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
        operator: Publish as an operator (``stepbarrier publish``): the step is
            *pinned*: it releases every waiter of the job at or below it, also
            those that arrive later, until a chief's newer generation or a reset
            replaces it (docs/protocol.md#operator-publish).
        join_generation: (A contributor) the chief generation to report into,
            e.g. the one this worker's own wait was released by
            (``StepWaiter.last_generation``); by default the first one found.
            A contributor never reports into another generation.
        optional: (A contributor) nobody asked for this reporting (a default):
            a refusal because the user may not write the step is said at INFO,
            not as a WARNING.

    Example:
        ```python
        with StepPublisher(BarrierConfig(job="demo")) as publisher:
            for step in range(1, 1001):
                train_one_step()
                publisher.publish(step)
        ```
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        contributor: bool = False,
        description: str | None = None,
        operator: bool = False,
        join_generation: int | None = None,
        optional: bool = False,
    ) -> None:
        if contributor and operator:
            raise ValueError("a publisher is a contributor or an operator, not both")
        mode: WriterMode = "contributor" if contributor else "operator" if operator else "chief"
        outage = Outage(config, action="publish the step", doing="publishing", log=log)
        super().__init__(config, client, name="publisher", outage=outage)
        self.contributor = contributor
        self._mode = mode
        self._clock = clock
        self._pause_key = (config.job, config.redis_url)
        self._chief_name = (description or f"{socket.gethostname()}:{os.getpid()}")[:200]
        self._writer: StepWriter | None = None
        # what publish() writes and reads: plain attributes, no lock (see Handover)
        self._handover = Handover(handed_at=clock())
        # _wake: write now (a crossed threshold, flush(), close())
        self._state = PublisherState(
            config,
            self._handover,
            self._wake,
            clock=clock,
            mode=mode,
            quiet=optional and contributor,
        )
        self._final_done: bool | None = None
        self._index_due = -math.inf  # the next entry in the job index (the writer thread's)
        self._index_failing = False
        self._close_deadline = math.inf  # may grow to the next one: see _finish
        self._answered_deadline = -math.inf  # the close's whole timeout's
        self._listener = (
            None if contributor else RegistrationListener(config, self._state.on_registration)
        )
        if contributor and join_generation is not None:
            self._state.join(checked_step(join_generation, what="join_generation", low=1))
        if mode == "chief":
            with _paused_lock:
                earlier = _paused.pop(self._pause_key, None)
            if earlier is not None and earlier._handover.paused:
                earlier.close(done=False, timeout=2.0)  # its next session is this one
        self._thread.start()
        if self._listener is not None:
            self._listener.start()

    @classmethod
    def from_env(cls) -> StepPublisher:
        """A publisher configured from ``STEPBARRIER_*`` variables."""
        return cls(BarrierConfig.from_env())

    def publish(self, step: int) -> None:
        """Hand over the chief's current global step; returns at once.

        Args:
            step: The global step the chief has completed (an ``int`` or a
                NumPy integer), never more than the true step.

        Raises:
            TypeError: ``step`` is not an integer (``True`` is not step 1).
            ValueError: ``step`` is negative or above 2**53 - 2 (``MAX_STEP``).
        """
        value = checked_step(step, what="step", low=0)
        handover = self._handover
        now = self._clock()
        if handover.skip_gap:
            handover.skip_gap = False  # the gap of a pause or a new session is no step
        else:
            gap = now - handover.handed_at
            mean = handover.step_time
            handover.step_time = gap if mean is None else mean + STEP_TIME_SMOOTHING * (gap - mean)
        handover.handed_at = now
        handover.latest = value
        handover.handed += 1
        if value >= handover.next_threshold:
            self._wake.set()

    @property
    def next_threshold(self) -> float:
        """The lowest step a registered worker still waits for (``inf`` if none).

        Integrations whose step value may lag (TensorFlow fetches the global
        step from before the run in flight) check this to confirm the true
        step only when it matters. ``-1`` until the first write of a generation
        got through: that write goes out with the next ``publish``.
        """
        return self._handover.next_threshold

    @property
    def active(self) -> bool:
        """False once a newer chief took the job over or the job was reset."""
        return self._state.ended is None

    @property
    def step_time(self) -> float | None:
        """Running mean of the seconds between two ``publish`` calls (``None`` before two)."""
        return self._handover.step_time

    @property
    def generation(self) -> int | None:
        """The chief generation written as (a contributor's: the one it joined), or ``None``."""
        return self._state.generation

    @property
    def redis_lost(self) -> bool:
        """True while the latest write failed because Redis could not be reached."""
        return self._outage.failing

    @property
    def last_error(self) -> str | None:
        """The most recent error as one clear line (why it ended, once it did)."""
        return self._state.end_message if self._state.ended is not None else self._outage.last_error

    def pause(self, *, flush_timeout: float | None = None) -> bool:
        """Keep the heartbeat going while the training loop hands nothing over.

        For a chief between two training sessions (``fit`` calls, a
        train/evaluate loop): waiting workers wait on instead of reaching their
        stall timeout in the gap. The step is not vouched for in the pause (the
        next session may restore an older checkpoint), so it releases nobody
        new; the next ``publish`` ends the pause. ``close`` ends it too.

        Args:
            flush_timeout: Seconds to wait for the last handed-over step to be
                stored (at the end of a session: the process may end right
                after it, and a worker waiting for exactly that step must see
                it); ``None``: do not wait (a pause within a session, such as
                an evaluation).

        Returns:
            True if the last step is stored (or nothing was waited for); if
            not, a warning says why (as ``close`` does).
        """
        self._handover.paused_at = self._handover.handed
        self._handover.skip_gap = True
        if not self.contributor:
            with _paused_lock:
                _paused[self._pause_key] = self
        if flush_timeout is None or self._handover.latest is None:
            return True
        deadline = self._clock() + self._end_wait(flush_timeout)
        stored = self._wait_stored(self._handover.handed, deadline, while_reachable=True)
        if not stored and self.active:
            self._say_not_stored(logging.WARNING)
        return stored or not self.active

    def new_generation(self) -> None:
        """Start a new chief generation (after a restart or a checkpoint restore).

        The next ``publish`` replaces the stored step, even with a lower value, so
        waiters follow the real step rather than a stale maximum. A write already
        on its way under the old generation no longer counts for ``flush``.
        """
        self._state.new_generation()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the last handed-over step is stored in Redis.

        Returns:
            True if it was stored within ``timeout`` seconds; False at once if a
            newer chief generation has taken the job over, the job was reset, or
            Redis refused a write (a wrong password, an ACL) while waiting.
        """
        if self._handover.latest is None:
            return True
        deadline = None if timeout is None else self._clock() + timeout
        return self._wait_stored(self._handover.handed, deadline)

    def close(self, done: bool = True, *, timeout: float = 10.0) -> bool:
        """Publish the last step, optionally mark the job finished, and stop.

        Args:
            done: Mark the job finished: workers still waiting for a step that has
                not come are aborted at once (``BarrierAborted``). Ignored by a
                contributor.
            timeout: Seconds to keep trying if Redis does not answer; at most
                ``LOST_REDIS_WAIT`` once a write failed because Redis could not be
                reached (``redis_lost``).

        Returns:
            True if the final state reached Redis; if not, a warning says why
            (nothing is said by a writer that a newer chief or a reset ended).
        """
        if self._closed:
            return True
        self._closed = True
        with _paused_lock:
            if _paused.get(self._pause_key) is self:
                del _paused[self._pause_key]
        self._answered_deadline = self._clock() + timeout
        ok = self._stop(
            done=done and not self.contributor, deadline=self._clock() + self._end_wait(timeout)
        )
        latest, ended = self._handover.latest, self._state.ended
        if ok or ended is not None or latest is None:
            return ok or (latest is None and ended is None)
        if self.contributor and self._state.joined is None and not self.last_error:
            # nothing timed out: no chief generation of this run was there to join
            log.info(
                "job %s: step %s was not reported: no chief generation of this run "
                "was found to report it into",
                self.config.job,
                latest,
            )
        elif not self.last_error and self._state.probation_until > self._clock():
            log.warning(
                "job %s: the final step %s is stored on probation (Redis had lost the "
                "job's state) and vouches for nothing yet: the close's timeout ended "
                "before the probation did",
                self.config.job,
                latest,
            )
        else:
            self._say_not_stored(self._state.level)
        return False

    def _say_not_stored(self, level: int) -> None:
        log.log(
            level,
            "job %s: the final step %s may not have reached Redis (%s)",
            self.config.job,
            self._handover.latest,
            self.last_error or "timed out",
        )

    def __exit__(self, exc_type: type[BaseException] | None, *_: object) -> None:
        self.close(done=exc_type is None)  # a crash is no end of the job: a restart carries on

    def _wait_stored(
        self, wanted: int, deadline: float | None, *, while_reachable: bool = False
    ) -> bool:
        """Wait until the ``wanted``-th hand-over is stored (see ``flush``);
        ``while_reachable``: give up once a write fails for want of Redis."""
        state = self._state
        self._wake.set()
        with state.stored:
            refusals = state.refusals
            while state.stored_seq < wanted:
                remaining = None if deadline is None else deadline - self._clock()
                if (
                    (remaining is not None and remaining <= 0)
                    or state.ended is not None
                    or state.refusals != refusals
                    or not self._thread.is_alive()
                    or (while_reachable and self._outage.failing)
                ):
                    return False
                self._wake.set()
                state.stored.wait(0.05 if remaining is None else min(remaining, 0.05))
        return True

    def _stop(self, *, done: bool, deadline: float) -> bool:
        """Write the final state (marking the job finished if ``done``), then stop both
        threads; True if every handed-over step reached Redis and no write failed since."""
        self._close_deadline = deadline
        self._final_done = done
        self._signal_stop()
        self._stop_listener(0.0)
        # with Redis lost, a thread still in a call to it is not waited for long:
        # training never waits for Redis (the thread is a daemon)
        slack = 0.1 if self._outage.failing else 1.0
        while self._thread.is_alive() and self._clock() < self._close_deadline + slack:
            self._thread.join(min(0.05, max(0.0, self._close_deadline + slack - self._clock())))
        self._stop_listener(slack)
        self._close_client()
        # a final write left on probation vouches for nothing: not a success
        unvouched = done and self._state.probation_until > self._clock()
        return (
            self.active
            and self._state.stored_seq >= self._handover.handed
            and self.last_error is None
            and not unvouched
        )

    def _stop_listener(self, timeout: float) -> None:
        if self._listener is not None:
            self._listener.stop(timeout=timeout)

    def _step_writer(self) -> StepWriter:
        """The step writer, made (with its client) at its first use, in the thread."""
        if self._writer is None:
            self._writer = StepWriter(self._connected(), self.config, self._chief_name, self._mode)
        return self._writer

    def _run(self) -> None:
        try:
            self._write_until_stopped()
            if not self.active:
                self._stop_listener(1.0)
            elif self._handover.latest is not None and self._final_done is not None:
                self._finish(self._final_done)
        finally:
            # the thread gives its connection back itself, however late it ends
            # (_stop() may have stopped waiting for it)
            if self._writer is not None:
                self._writer.close()

    def _write_until_stopped(self) -> None:
        next_beat = self._clock()
        while not self._stopping.is_set() and self.active:
            self._wake.wait(max(0.0, next_beat - self._clock()))
            self._wake.clear()
            if self._stopping.is_set():
                break
            if self._handover.latest is None or self._state.loop_idle():
                next_beat = self._clock() + self.config.heartbeat
                continue
            wrote = self._try_write(done=False)
            if wrote is None:
                if self._state.ended is not None:
                    break  # told once, by PublisherState
                self._outage.say(self._state.level, "training continues, will retry")
                failing = self._outage.failing
                self._stopping.wait(self._outage.delay() if failing else self.config.heartbeat)
                next_beat = self._clock()
                continue
            next_beat = self._clock() + self.config.heartbeat
            if self._state.probation_until > self._clock():
                # the probation's end is a write: it is what releases workers
                next_beat = min(next_beat, self._state.probation_until + 0.001)
            if wrote:
                # Every publish() between crossing a threshold and this write's new
                # threshold set the event again; honoured, it would make a second
                # write per crossed threshold at high step rates. Clear it, then look
                # again, so no wake that still matters (a crossing, close()) is lost.
                self._wake.clear()
                latest = self._handover.latest
                if self._stopping.is_set() or (
                    latest is not None and latest >= self._handover.next_threshold
                ):
                    self._wake.set()

    def _finish(self, done: bool) -> None:
        """The final write, retried until the close's deadline while Redis answers, and
        for ``LOST_REDIS_WAIT`` at most once it was found unreachable. One written on
        probation vouches for nothing: the probation is waited out and the step written
        once more, so that the finished job releases its waiters, within the close's
        whole timeout now that Redis answers (a lost Redis cut the deadline short)."""
        deadline, lost, tries, again = self._close_deadline, False, 0, True
        while True:
            wait = min(self._state.probation_until, deadline) - self._clock()
            if wait > 0:
                time.sleep(wait + 0.001)
            if self._try_write(done=done) is not None:
                if not (again and self.active and self._state.probation_until > self._clock()):
                    return
                self._close_deadline = max(self._close_deadline, self._answered_deadline)
                deadline, lost, tries, again = self._close_deadline, False, 0, False
                continue
            tries += 1
            if self._outage.failing and not lost:  # counted from this failure, not the next
                lost, deadline = True, min(deadline, self._clock() + LOST_REDIS_WAIT)
            left = deadline - self._clock()
            if not self._outage.failing or left <= 0:
                return  # _stop() reports it
            time.sleep(min(self._outage.delay(tries), left))

    def _try_write(self, *, done: bool) -> bool | None:
        """``_write``, its failure noted (and a refusal told to the state): ``None``."""
        try:
            wrote = self._write(done=done)
        except Exception as exc:  # the chief must never die of a Redis problem
            if not self._outage.failed(exc):
                kind = getattr(self._outage.last_failure, "kind", None)
                forbidden = kind in ("permission", "functions")
                self._state.refused(self._outage.last_error or "", forbidden=forbidden)
            return None
        if self._outage.succeeded() and not self._stopping.is_set():
            log.info("Redis is back; published step %s", self._handover.latest)
        return wrote

    def _write(self, *, done: bool) -> bool:
        """One write; False if there was nothing (new) to write."""
        wanted, needs_generation = self._state.generation_to_begin()
        if needs_generation:
            beginning = self._begin()
            if beginning is None or not self._state.begin_generation(wanted, beginning):
                return False  # another run's chief is live, or yet another generation was asked for
            log.info("job %s: chief generation %d begins", self.config.job, beginning.generation)
        upcoming = self._state.next_write(done=done)
        if upcoming is None:
            return False
        values, seq = upcoming
        result = self._step_writer().write(values)
        self.writes += 1
        if result.repaired:
            log.warning("job %s: replaced malformed content in its state keys", self.config.job)
        accepted = self._state.take_reply(result, seq, wanted)
        self._keep_indexed(done)
        return accepted

    def _keep_indexed(self, done: bool) -> None:
        """A chief with a jobs pattern puts its job in that pattern's job index now and
        then, and when it finishes (the entry then lives as its finished keys do). A
        failure is told once, at WARNING, and costs the job only its place in listings."""
        pattern = self.config.jobs_pattern
        if pattern is None or self._mode != "chief":
            return  # (on every write: the chief's cost per step, bench.instructions)
        now = self._clock()
        if not done and now < self._index_due:
            return
        self._index_due = now + INDEX_REFRESH
        lifetime = finished_ttl(self.config) if done else self.config.key_ttl + INDEX_REFRESH
        try:
            self._step_writer().index_job(pattern, min(lifetime, MAX_LIFETIME), INDEX_CALL_TIMEOUT)
        except Exception as exc:  # never the chief's end
            if not self._index_failing:
                told = translate(exc, self.config, action="keep the job in its job index")
                log.warning(
                    "job %s: not kept in the job index of STEPBARRIER_JOBS_PATTERN %r (a "
                    "listing of that pattern finds it only by a scan): %s; tried again in %d s",
                    self.config.job,
                    pattern,
                    " ".join(str(told).split()),
                    INDEX_RETRY,
                )
            self._index_failing = True
            self._index_due = self._clock() + INDEX_RETRY
        else:
            self._index_failing = False

    def _begin(self) -> Beginning | None:
        """Begin a generation, unless another run's chief is live (one found is watched
        for ``FENCE`` first: ``PublisherState.watches`` and ``takes_over``)."""
        beginning = self._step_writer().begin_generation()
        found = beginning.stored
        if found is None or not self._state.watches(found):
            return beginning
        if self._stopping.wait(FENCE):
            return None
        beginning = self._step_writer().begin_generation()
        return beginning if self._state.takes_over(found, beginning.stored) else None


class RegistrationListener(BackgroundWriter):
    """The chief's ear: calls ``on_target(step)`` for every valid target a new waiter
    pushes, so that a step is announced the moment it is crossed even if its waiter
    registered after the chief's last write (a lost one costs only speed: every write
    returns the pending targets too). Bounded work, for anyone who may register may
    flood the list: the publisher needs only the lowest targets above its step.
    """

    def __init__(self, config: BarrierConfig, on_target: Callable[[int], None]) -> None:
        outage = Outage(
            config,
            action="hear new waiters",
            doing="hearing new waiters",
            log=_listener_log,
            log_every=60.0,
        )
        super().__init__(config, None, name="registrations", outage=outage)
        self._on_target = on_target
        self._batches = True  # False once the server refused LPOP with a count
        self.start = self._thread.start
        self.is_alive = self._thread.is_alive

    def stop(self, timeout: float = 1.0) -> None:
        """Stop listening, cutting a BLPOP short by closing its socket, again until the
        thread has gone (one begun just after a close would outlive ``stop`` by 30 s)."""
        self._signal_stop()
        deadline = time.monotonic() + timeout
        while True:
            with self._client_lock:
                if self._client is not None:
                    disconnect_all(self._client)
            remaining = deadline - time.monotonic()
            if not self._thread.is_alive() or remaining <= 0:
                return
            self._thread.join(min(remaining, 0.05))

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                try:
                    items = self._take(self.config.keys.registrations)
                    self._outage.succeeded()
                except Exception as exc:
                    if self._stopping.is_set():
                        break
                    if self._client is not None:
                        refresh_topology(self._client)
                    # a refusal (ACL, password) will not pass by retrying soon
                    transient = self._outage.failed(exc)
                    self._outage.say(
                        logging.WARNING, "new waiters are heard at the chief's next write instead"
                    )
                    self._stopping.wait(self._outage.delay() if transient else REGISTRATION_BLOCK)
                    continue
                for target in lowest_targets(items):
                    self._on_target(target)
        finally:
            self._close_client()

    def _take(self, key: str) -> list[object]:
        """Block until a registration comes, then take up to a batch of them."""
        client = self._connected(socket_timeout=REGISTRATION_BLOCK + 10)
        item = client.blpop([key], timeout=REGISTRATION_BLOCK)
        if item is None:
            return []
        items: list[object] = [item[1]]
        if self._batches:
            try:
                more = client.lpop(key, REGISTRATION_BATCH - 1)
            except redis.ResponseError as exc:
                if not str(exc).startswith("WRONGTYPE"):
                    # LPOP with a count needs Redis 6.2 or later and the chief's
                    # +lpop (users.acl of this version): else one a wake, as before
                    _listener_log.debug("registrations taken one at a time: %s", exc)
                    self._batches = False
            except redis.RedisError:
                pass  # the next BLPOP meets the failure; keep what was taken
            else:
                if isinstance(more, list):
                    items += more
        return items


def lowest_targets(items: list[object]) -> list[int]:
    """The ``REPORT_PER_WAKE`` lowest valid targets among ``items``, once each, in order."""
    parsed = [parse_int(raw, low=1) for raw in items]
    if malformed := parsed.count(None):
        _listener_log.debug("ignored %d malformed registration(s)", malformed)
    return heapq.nsmallest(REPORT_PER_WAKE, {target for target in parsed if target is not None})
