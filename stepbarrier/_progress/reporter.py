"""Each training task reports its own step: hand it over, and let a thread write it.

``report(step)`` is on the hot path, like ``StepPublisher.publish``
(docs/performance.md#reporting-progress). A thread writes the latest step into the
job's progress hash (docs/protocol.md#progress) at most once per ``interval``;
outages are retried quietly, and a refusal (no retry cures it) is said once and
ends the reporting.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable

from stepbarrier._config.checks import TASK_ID, Kind
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import report_progress_call
from stepbarrier._protocol.wire import MAX_STEP, checked_step
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.failures import REDIS_ERRORS
from stepbarrier._redis.functions import RedisCode, is_out_of_memory
from stepbarrier._redis.outage import BackgroundWriter, Outage
from stepbarrier.errors import ConfigurationError

log = logging.getLogger("stepbarrier")

DEFAULT_INTERVAL = 1.0
"""Seconds between two writes of a task's step, at most one per interval."""
MIN_INTERVAL = 0.05
"""Shortest interval a reporter takes (tests); a job keeps the default."""
MAX_INTERVAL = 3600.0
"""Longest interval a reporter takes."""
CLOSE_WAIT = 2.0
"""Seconds ``close`` waits, at most, for the last step to be written (``LOST_REDIS_WAIT``
once Redis was found unreachable)."""
_INTERVAL = Kind(
    f"a number of seconds from {MIN_INTERVAL:g} to {MAX_INTERVAL:g}",
    float,
    lambda value: (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and MIN_INTERVAL <= value <= MAX_INTERVAL
    ),
)


class ProgressReporter(BackgroundWriter):
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
        interval: Seconds between two writes, at most one per interval.
        clock: Monotonic clock (injectable for tests).
        optional: Nobody asked for this reporting (the hooks' and callbacks'
            default): a refusal is said at INFO, not as a WARNING.

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
        outage = Outage(
            config, action="report the task's progress", doing="reporting progress", log=log
        )
        super().__init__(config, client, name="progress", outage=outage)
        if task_id is None:
            task_id = 0 if config.task_id is None and config.role == "chief" else config.task_id
        if task_id is None:
            raise ConfigurationError(
                "a progress reporter needs the task id: set STEPBARRIER_TASK_ID (or a "
                "launcher's rank, TF_CONFIG), or pass task_id",
                variable="STEPBARRIER_TASK_ID",
            )
        self.task_id: int = TASK_ID.check(task_id, "task_id")
        self.interval = float(_INTERVAL.check(interval, "interval"))
        # the key lives key_ttl after the last write: write again well before
        self.keepalive = max(self.interval, config.key_ttl / 3)
        self.optional = optional
        self._clock = clock
        self._code: RedisCode | None = None
        self._latest: int | None = None  # report()'s, replaced whole: no lock
        self._written: int | None = None
        self._written_at = -math.inf
        self._ended = False  # refused for good: nothing more is written
        self._urgent = False  # flush(): write the latest step now
        self._thread.start()

    @classmethod
    def from_env(cls) -> ProgressReporter:
        """A reporter configured from ``STEPBARRIER_*`` variables."""
        return cls(BarrierConfig.from_env())

    def report(self, step: int) -> None:
        """Hand over this task's current step (completed); returns at once.

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

    @property
    def failing(self) -> bool:
        """True while the latest write failed because Redis could not be reached."""
        return self._outage.failing

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
        """Write the last step (within ``timeout``; see ``CLOSE_WAIT``) and stop.

        Returns:
            True if the last handed-over step reached Redis (or none was handed over).
        """
        if self._closed:
            return self._latest is None or self._written == self._latest
        self._closed = True
        timeout = self._end_wait(timeout)
        ok = self.flush(timeout)
        self._signal_stop()
        self._thread.join(min(timeout, 1.0))
        if not self._thread.is_alive():
            self._close_client()
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

    def __exit__(self, *_: object) -> None:
        self.close()

    def _run(self) -> None:
        while not self._ended:
            # until the end of the interval since the last write, or a whole interval
            # (report() wakes no thread: the step is looked at once per interval)
            left = self._written_at + self.interval - self._clock()
            self._wake.wait(left if left > 0 else self.interval)
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
                except Exception as exc:  # training must never die of a Redis problem
                    if not self._outage.failed(exc, passing=_passing(exc)):
                        self._end()
                        break
                    self._outage.say(logging.INFO, "training continues, will retry")
                    if self._stopping.wait(self._outage.delay()) and not urgent:
                        continue  # close() came meanwhile: one more try, then stop
                else:
                    if self._outage.succeeded():
                        log.info("job %s: Redis is back; progress reported", self.config.job)
            if self._written == self._latest:
                self._urgent = False
            if stopping:
                break

    def _write(self, step: int) -> None:
        if self._code is None:
            self._code = RedisCode(self._connected(), self.config)
        at = self._clock()
        self._code.call(
            *report_progress_call(
                self.config.keys, task_id=self.task_id, step=step, key_ttl=self.config.key_ttl
            )
        )
        self._written, self._written_at = step, at
        self.writes += 1

    def _end(self) -> None:
        """A failure no retry cures ends the reporting (said once; a bug is said already)."""
        self._ended = True
        if self.last_failure is not None:
            log.log(
                logging.INFO if self.optional else logging.WARNING,
                "job %s: task %d's progress is not reported: %s",
                self.config.job,
                self.task_id,
                self.last_error,
            )


def _passing(exc: BaseException) -> bool:
    """A refusal that clears by itself, so the reporter retries (with its backoff) rather
    than stop: Redis full (``maxmemory``: memory is freed, keys expire), or the job's
    progress hash full of other tasks (its fields expire with the key). A stopped
    reporter would show a healthy task as stuck."""
    return is_out_of_memory(exc) or (
        isinstance(exc, REDIS_ERRORS) and "tasks already" in str(exc) and "progress" in str(exc)
    )
