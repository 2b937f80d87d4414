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

The heartbeat says that the training loop lives, not only the process: once the
loop has handed no step over for the stall timeout (or its confirmation window,
if that is longer: a slow chief's long steps), the heartbeat stops (a loop
that died in a process that lives on, a notebook, a caught exception), so that
waiting workers reach their stall timeout; the next ``publish`` resumes it. A
loop that ends one session in order and may start another says so with
``pause``: the heartbeat then goes on, vouching for nothing new, until the next
``publish`` (TensorFlow's workers wait on between a chief's sessions too).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

from stepbarrier._chief.state import log
from stepbarrier._chief.threads import LOST_REDIS_WAIT, PublisherLoop
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.wire import checked_step
from stepbarrier._redis.client import RedisClient
from stepbarrier.errors import StepBarrierError

STEP_TIME_SMOOTHING = 0.2
"""Weight of the newest gap in the running mean of the time between two publishes."""

# The paused chief publisher of each job in this process (at most one): a new
# chief publisher of the job (a hook or callback made anew for the next session)
# closes it, instead of letting the two write until Redis tells the older one it
# was superseded.
_paused: dict[tuple[str, str], StepPublisher] = {}
_paused_lock = threading.Lock()


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
        self.config = config
        self.contributor = contributor
        self._clock = clock
        self._closed = False
        chief = (description or f"{socket.gethostname()}:{os.getpid()}")[:200]
        # The background side: the writer thread and the registration listener.
        self._loop = PublisherLoop(
            config,
            client,
            clock=clock,
            contributor=contributor,
            chief_name=chief,
            operator=operator,
            optional=optional and contributor,
        )
        if contributor and join_generation is not None:
            self._loop.state.join(_checked_generation(join_generation))
        if not contributor and not operator:
            with _paused_lock:
                earlier = _paused.pop(self._pause_key, None)
            if earlier is not None and earlier._loop.paused:
                earlier.close(done=False, timeout=2.0)  # its next session is this one
        # What publish() writes and reads: plain attributes, no lock (see Handover).
        self._handover = self._loop.handover
        self._loop.start()

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
            self._loop.wake.set()

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
        return self._loop.active

    @property
    def step_time(self) -> float | None:
        """Running mean of the seconds between two ``publish`` calls (``None`` before two)."""
        return self._handover.step_time

    @property
    def generation(self) -> int | None:
        """The chief generation this publisher writes as: its own once begun; a
        contributor's, the one it joined. ``None`` before either."""
        return self._loop.state.generation

    @property
    def writes(self) -> int:
        """Number of successful writes to Redis (for tests and benchmarks)."""
        return self._loop.writes

    @property
    def redis_lost(self) -> bool:
        """True while the latest write failed because Redis could not be reached
        (the writer keeps trying; ``close`` and ``pause`` then wait at most
        ``LOST_REDIS_WAIT`` for it)."""
        return self._loop.failing

    @property
    def last_error(self) -> str | None:
        """The most recent error as one clear line, ``None`` after a successful write."""
        return self._loop.last_error

    @property
    def last_failure(self) -> StepBarrierError | None:
        """The most recent Redis error (``RedisRefused``, ``RedisUnavailable``), or ``None``.

        ``None`` after a successful write; after ``close``, why its final write failed.
        """
        return self._loop.last_failure

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
        self._loop.pause()
        if not self.contributor:
            with _paused_lock:
                _paused[self._pause_key] = self
        if flush_timeout is None or self._flush_while_reachable(flush_timeout) or not self.active:
            return True
        log.warning(
            "job %s: the final step %s may not have reached Redis (%s)",
            self.config.job,
            self._handover.latest,
            self.last_error or "timed out",
        )
        return False

    def new_generation(self) -> None:
        """Start a new chief generation (after a restart or a checkpoint restore).

        The next ``publish`` replaces the stored step, even with a lower value, so
        waiters follow the real step rather than a stale maximum. A write already
        on its way under the old generation no longer counts for ``flush``.
        """
        self._loop.new_generation()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the last handed-over step is stored in Redis.

        Returns:
            True if it was stored within ``timeout`` seconds; False at once if a
            newer chief generation has taken the job over, the job was reset, or
            Redis refused a write (a wrong password, an ACL) while waiting.
        """
        wanted = self._handover.handed
        if self._handover.latest is None:
            return True
        deadline = None if timeout is None else self._clock() + timeout
        return self._loop.wait_stored(wanted, deadline)

    def _flush_while_reachable(self, timeout: float) -> bool:
        """``flush``, but for at most ``LOST_REDIS_WAIT`` once Redis is lost (before
        or during the wait): the end of a session never waits for a gone Redis."""
        if self._handover.latest is None:
            return True
        if self.redis_lost:
            timeout = min(timeout, LOST_REDIS_WAIT)
        wanted = self._handover.handed
        return self._loop.wait_stored(wanted, self._clock() + timeout, while_reachable=True)

    def close(self, done: bool = True, *, timeout: float = 10.0) -> bool:
        """Publish the last step, optionally mark the job finished, and stop.

        Args:
            done: Mark the job finished: workers still waiting for a step that has
                not come are aborted at once (``BarrierAborted``). Ignored by a
                contributor.
            timeout: Seconds to keep trying if Redis does not answer; at most
                ``LOST_REDIS_WAIT`` once a write failed because Redis could not be
                reached (``redis_lost``): a session's end never waits for a Redis
                that is gone.

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
        self._loop.answered_deadline = self._clock() + timeout
        if self.redis_lost:
            timeout = min(timeout, LOST_REDIS_WAIT)  # training never waits for Redis
        deadline = self._clock() + timeout
        ok = self._loop.stop(done=done and not self.contributor, deadline=deadline)
        latest, ended = self._handover.latest, self._loop.ended
        if not ok and ended is None and latest is not None:
            if self.contributor and self._loop.state.joined is None and not self.last_error:
                # nothing timed out: no chief generation of this run was there to join
                log.info(
                    "job %s: step %s was not reported: no chief generation of this run "
                    "was found to report it into",
                    self.config.job,
                    latest,
                )
                return False
            if not self.last_error and self._loop.state.probation_until > self._clock():
                log.warning(
                    "job %s: the final step %s is stored on probation (Redis had lost the "
                    "job's state) and vouches for nothing yet: the close's timeout ended "
                    "before the probation did",
                    self.config.job,
                    latest,
                )
                return False
            log.log(
                logging.INFO if self._loop.state.optional else logging.WARNING,
                "job %s: the final step %s may not have reached Redis (%s)",
                self.config.job,
                latest,
                self.last_error or "timed out",
            )
        return ok or (latest is None and ended is None)

    @property
    def _pause_key(self) -> tuple[str, str]:
        return (self.config.job, self.config.redis_url)

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


def _checked_generation(generation: int) -> int:
    return checked_step(generation, what="join_generation", low=1)
