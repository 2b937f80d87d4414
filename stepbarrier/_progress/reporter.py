"""Each training task reports its own step: hand it over, and let a thread write it.

``report(step)`` is on the training thread's hot path, like
``StepPublisher.publish``: it checks the number and stores it in an attribute,
no lock, no I/O, no exception because Redis is down (well under a microsecond:
docs/performance.md#reporting-progress).

A daemon thread writes the latest step into the job's progress hash
(``report_progress``, docs/protocol.md#progress) at most once per ``interval``
(1 s by default), and only when it changed, or when the hash's TTL needs
refreshing (every third of ``key_ttl``): a task costs Redis at most one short
call per second, whatever its step rate. Redis outages are retried quietly with
backoff (training never waits for, nor fails because of, Redis); a refusal (a
user that may not write the progress hash, a library without the function) is
said once and ends the reporting, because a retry cannot cure it.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable
from types import TracebackType

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.progress import MAX_TASK_ID
from stepbarrier._protocol.wire import MAX_STEP, checked_step
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.failures import REDIS_ERRORS, is_transient, translate
from stepbarrier._redis.functions import RedisCode, is_out_of_memory
from stepbarrier._redis.retries import backoff, backoff_attempt
from stepbarrier.errors import ConfigurationError, RedisUnavailable, StepBarrierError

log = logging.getLogger("stepbarrier")

DEFAULT_INTERVAL = 1.0
"""Seconds between two writes of a task's step, at most one per interval."""
MIN_INTERVAL = 0.05
"""Shortest interval a reporter takes (tests); a job keeps the default."""
MAX_INTERVAL = 3600.0
"""Longest interval a reporter takes."""
LOG_EVERY = 30.0
"""Seconds between repeated log lines about the same outage."""
CLOSE_WAIT = 2.0
"""Seconds ``close`` waits, at most, for the last step to be written (0.5 s once
Redis was found unreachable: a session's end never waits for a gone Redis)."""


class ProgressReporter:
    """Reports one training task's own step to the job's progress hash.

    ``stepbarrier status`` and ``watch`` then show each task's step, how far it
    is behind the chief, the stragglers and the stuck tasks; the exporter
    publishes them (docs/who-is-slow.md). The TensorFlow hooks and the Keras
    callbacks report on their own; the core API reports through this.

    Args:
        config: The job's settings; ``config.task_id`` is the task reported
            (the chief, ``role="chief"``, is task 0 when it has none).
        client: A redis-py client to use; one is made from ``config`` if
            omitted (and then closed by ``close``).
        task_id: The task to report as, instead of ``config.task_id``.
        interval: Seconds between two writes, at most one per interval (1 s).
        clock: Monotonic clock (injectable for tests).
        optional: Nobody asked for this reporting (the hooks' and callbacks'
            default): a refusal (a Redis user that may not write the progress
            hash) is said at INFO, not as a WARNING.

    Raises:
        ConfigurationError: No task id (``config.task_id`` unset and not the
            chief), or an invalid ``task_id`` or ``interval``.

    Example:
        ```python
        with ProgressReporter(BarrierConfig(job="demo", task_id=3)) as progress:
            for step in range(1, 1001):
                train_one_step()
                progress.report(step)
        ```
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None = None,
        *,
        task_id: int | None = None,
        interval: float = DEFAULT_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        optional: bool = False,
    ) -> None:
        self.config = config
        self.task_id = _task_id(config, task_id)
        if (
            isinstance(interval, bool)
            or not isinstance(interval, (int, float))
            or not MIN_INTERVAL <= interval <= MAX_INTERVAL
        ):
            raise ConfigurationError(
                f"interval must be a number of seconds from {MIN_INTERVAL:g} to "
                f"{MAX_INTERVAL:g}, got {interval!r}",
                variable="interval",
            )
        self.interval = float(interval)
        # the key lives key_ttl after the last write: write again well before
        self.keepalive = max(self.interval, config.key_ttl / 3)
        self.optional = optional
        self._clock = clock
        self._client = client
        self._owns_client = client is None
        self._code: RedisCode | None = None
        # what report() writes: one attribute, read by the thread (no lock: an
        # int is replaced whole, and the thread reads whichever it finds)
        self._latest: int | None = None
        self._written: int | None = None
        self._written_at = -math.inf
        self.writes = 0
        self.failing = False
        self.last_error: str | None = None
        self.last_failure: StepBarrierError | None = None
        self._ended = False  # refused for good: nothing more is written
        self._urgent = False  # flush(): write the latest step now
        self._closed = False
        self._wake = threading.Event()
        self._stopping = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name=f"stepbarrier-progress-{config.job}", daemon=True
        )
        self._thread.start()

    @classmethod
    def from_env(cls) -> ProgressReporter:
        """A reporter configured from ``STEPBARRIER_*`` variables."""
        return cls(BarrierConfig.from_env())

    # -- the training thread's side ------------------------------------------------

    def report(self, step: int) -> None:
        """Hand over this task's current step; returns at once (no I/O).

        Args:
            step: The step this task has completed (an ``int`` or a NumPy integer).

        Raises:
            TypeError: ``step`` is not an integer (``True`` is not step 1).
            ValueError: ``step`` is negative or above 2**53 - 2 (``MAX_STEP``).
        """
        if type(step) is not int or not 0 <= step <= MAX_STEP:
            step = checked_step(step, what="step", low=0)
        self._latest = step

    @property
    def step(self) -> int | None:
        """The last step handed over (``None`` before any)."""
        return self._latest

    @property
    def written(self) -> int | None:
        """The last step written to Redis (``None`` before any)."""
        return self._written

    @property
    def active(self) -> bool:
        """False once a refusal ended the reporting (``last_error`` says why)."""
        return not self._ended

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the last handed-over step is written (or ``timeout`` seconds).

        Returns:
            True if it was written; False on a timeout, or once reporting ended.
        """
        deadline = None if timeout is None else self._clock() + timeout
        while True:
            latest = self._latest
            if latest is None or self._written == latest:
                return True
            if self._ended or not self._thread.is_alive():
                return False
            remaining = None if deadline is None else deadline - self._clock()
            if remaining is not None and remaining <= 0:
                return False
            self._urgent = True
            self._wake.set()
            time.sleep(0.01 if remaining is None else min(0.01, remaining))

    def close(self, *, timeout: float = CLOSE_WAIT) -> bool:
        """Write the last step (within ``timeout``, 0.5 s once Redis was lost) and stop.

        Returns:
            True if the last handed-over step reached Redis (or none was handed over).
        """
        if self._closed:
            return self._latest is None or self._written == self._latest
        self._closed = True
        if self.failing:
            timeout = min(timeout, 0.5)
        ok = self.flush(timeout)
        self._stopping.set()
        self._wake.set()
        self._thread.join(min(timeout, 1.0))
        if self._owns_client and self._client is not None and not self._thread.is_alive():
            self._client.close()
        if not ok and not self._ended:
            # (a hook's reporter: the chief's publisher already said that Redis is lost)
            log.log(
                logging.DEBUG if self.optional else logging.INFO,
                "job %s: task %d's progress at its end (step %s) was not written (%s)",
                self.config.job,
                self.task_id,
                self._latest,
                self.last_error or "timed out",
            )
        return ok

    def __enter__(self) -> ProgressReporter:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # -- the thread ------------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        last_log = -math.inf
        delays = backoff()
        while not self._ended:
            self._wake.wait(self._sleep_for())
            self._wake.clear()
            stopping = self._stopping.is_set()
            urgent = stopping or self._urgent
            latest = self._latest
            now = self._clock()
            due = latest is not None and (
                (latest != self._written and (urgent or now >= self._written_at + self.interval))
                or now >= self._written_at + self.keepalive
            )
            if due and latest is not None:
                try:
                    self._write(latest)
                    failures = 0
                    if self.failing:
                        log.info("job %s: Redis is back; progress reported", self.config.job)
                    self.failing = False
                except Exception as exc:  # training must never die of a Redis problem
                    failures += 1
                    if not self._note_failure(exc):
                        break
                    self.failing = True
                    if now - last_log >= LOG_EVERY:
                        last_log = now
                        log.info("%s; training continues, will retry", self.last_error)
                    if self._stopping.wait(delays(backoff_attempt(failures))) and not urgent:
                        continue  # close() came meanwhile: one more try, then stop
            if self._written == self._latest:
                self._urgent = False
            if stopping:
                break

    def _sleep_for(self) -> float:
        """Seconds until the next write may be due: the end of the interval since
        the last write, or a whole interval (``report`` wakes no thread: the step
        handed over is looked at once per interval)."""
        left = self._written_at + self.interval - self._clock()
        return left if left > 0 else self.interval

    def _write(self, step: int) -> None:
        if self._code is None:
            if self._client is None:
                self._client = make_client(self.config)
            self._code = RedisCode(self._client, self.config)
        at = self._clock()
        self._code.call(
            "report_progress",
            [self.config.keys.progress],
            [self.task_id, step, self.config.key_ttl],
        )
        self._written, self._written_at = step, at
        self.writes += 1
        self.last_error = None
        self.last_failure = None

    def _note_failure(self, exc: BaseException) -> bool:
        """Record why a write failed; True if a retry may cure it (else reporting ends)."""
        if not isinstance(exc, (*REDIS_ERRORS, OSError, StepBarrierError)):
            log.error(
                "job %s: internal error while reporting progress", self.config.job, exc_info=exc
            )
            self.last_error = f"internal error: {type(exc).__name__}: {exc}"
            self._ended = True
            return False
        error = translate(exc, self.config, action="report the task's progress", probe=False)
        self.last_failure, self.last_error = error, str(error)
        if is_transient(exc) or isinstance(exc, RedisUnavailable) or _passing(exc):
            return True
        self._ended = True
        log.log(
            logging.INFO if self.optional else logging.WARNING,
            "job %s: task %d's progress is not reported: %s",
            self.config.job,
            self.task_id,
            self.last_error,
        )
        return False


def _passing(exc: BaseException) -> bool:
    """A refusal that clears by itself, so the reporter retries (with its backoff) rather
    than stop: Redis full (``maxmemory``: memory is freed, keys expire), or the job's
    progress hash full of other tasks (its fields expire with the key). A stopped
    reporter would show a healthy task as stuck."""
    return is_out_of_memory(exc) or (
        isinstance(exc, REDIS_ERRORS) and "tasks already" in str(exc) and "progress" in str(exc)
    )


def _task_id(config: BarrierConfig, task_id: int | None) -> int:
    """The task a reporter reports as: ``task_id``, ``config.task_id``, or 0 for the chief."""
    if task_id is None:
        task_id = config.task_id
    if task_id is None and config.role == "chief":
        task_id = 0
    if task_id is None:
        raise ConfigurationError(
            "a progress reporter needs the task id: set STEPBARRIER_TASK_ID (or a "
            "launcher's rank, TF_CONFIG), or pass task_id",
            variable="STEPBARRIER_TASK_ID",
        )
    if isinstance(task_id, bool) or not isinstance(task_id, int) or not 0 <= task_id <= MAX_TASK_ID:
        raise ConfigurationError(
            f"task_id must be an integer from 0 to {MAX_TASK_ID}, got {task_id!r}",
            variable="task_id",
        )
    return task_id
