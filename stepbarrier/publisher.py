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

import math
import operator
import os
import socket
import threading
import time
from collections.abc import Callable
from types import TracebackType

from stepbarrier.config import BarrierConfig
from stepbarrier.connection import RedisClient
from stepbarrier.errors import StepBarrierError
from stepbarrier.protocol import MAX_STEP
from stepbarrier.publisher_thread import LOG_EVERY, PublisherThread, log
from stepbarrier.registrations import RegistrationListener
from stepbarrier.step_write import StepWriter

__all__ = ["LOG_EVERY", "STEP_TIME_SMOOTHING", "StepPublisher"]

STEP_TIME_SMOOTHING = 0.2
"""Weight of the newest gap in the running mean of the time between two publishes."""


class StepPublisher(PublisherThread):
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
