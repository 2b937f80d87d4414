"""The chief's publisher across sessions, and each task's progress, for the TF hooks
and Keras callbacks (no TensorFlow here). Progress goes through a ``ProgressReporter``
(docs/who-is-slow.md): the chief's step as task 0, a worker's own step once it is
released. It is optional: a Redis user that may not write the progress hash is said
at INFO, and training goes on.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Callable

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.environment import job_in_env
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._progress.reporter import DEFAULT_INTERVAL, ProgressReporter
from stepbarrier.errors import ConfigurationError

log = logging.getLogger("stepbarrier")


class TaskProgress:
    """This task's progress reporter, from one start to the next ``close()``; the
    chief's (``chief``) is task 0 unless the config names another. A worker that
    waits for nothing read no config: it reports with the environment's, if any."""

    def __init__(self, *, chief: bool) -> None:
        self._chief = chief
        self._next = -float("inf")
        self._reporter: ProgressReporter | None = None
        self._tried = False

    @property
    def reporting(self) -> bool:
        return self._reporter is not None

    def start(self, config: BarrierConfig | None) -> None:
        """Start reporting (off, no config or no task id: not), once until ``close()``."""
        if self._tried:
            return
        self._tried = True
        if config is None and not self._chief and job_in_env():
            try:
                config = BarrierConfig.from_env()
            except ConfigurationError:
                return  # the settings' own error is said where they are used
        if config is None or not config.report_progress:
            return
        task_id = 0 if config.task_id is None and self._chief else config.task_id
        if task_id is None:
            return  # nothing to report as (a worker's id comes from its launcher)
        try:
            self._reporter = ProgressReporter(config, task_id=task_id, optional=True)
        except ConfigurationError as exc:  # settings the reporter refuses: say so, train on
            log.info("job %s: this task's progress is not reported: %s", config.job, exc)

    def due(self) -> bool:
        """True once per reporter interval while reporting: a worker fetches its step
        from its framework only then, not with every run."""
        if self._reporter is None:
            return False
        now = time.monotonic()
        if now < self._next:
            return False
        self._next = now + DEFAULT_INTERVAL
        return True

    def report(self, step: int) -> None:
        if self._reporter is not None:
            self._reporter.report(step)

    def close(self, step: int | None = None) -> None:
        """Report ``step`` (if given) as the last one, and stop; a next start reports anew."""
        reporter, self._reporter, self._tried = self._reporter, None, False
        if reporter is None:
            return
        if step is not None:
            reporter.report(step)
        reporter.close()


class ChiefPublishing:
    """The chief's ``StepPublisher`` and progress (as task 0) across its sessions, each
    a new chief generation; at its end the job is finished if the step reached
    ``last_step``, else the publisher pauses until the next session
    (docs/tensorflow-keras.md#how-a-job-is-finished)."""

    def __init__(self, config: BarrierConfig | None, last_step: int | None) -> None:
        self.config = config
        self.last_step = None if last_step is None else operator.index(last_step)
        self.publisher: StepPublisher | None = None
        """The publisher of the current session (``None`` outside a session)."""
        self._paused: StepPublisher | None = None  # between two sessions
        self._progress = TaskProgress(chief=True)

    def configure(self) -> BarrierConfig:
        if self.config is None:
            self.config = BarrierConfig.from_env()
        return self.config

    def new_session(self, step: int) -> StepPublisher:
        """A new generation starts at ``step``: publish it, and report it as task 0's progress."""
        if self.publisher is None:
            paused, self._paused = self._paused, None
            active = paused if paused is not None and paused.active else None
            self.publisher = active or StepPublisher(self.configure())
        self.publisher.new_generation()
        self.publisher.publish(step)
        self._progress.start(self.config)
        self._progress.report(step)
        return self.publisher

    def publish(self, step: int) -> None:
        if self.publisher is not None:
            self.publisher.publish(step)
            self._progress.report(step)

    def end(self, final_step: Callable[[], int | None]) -> None:
        publisher, self.publisher = self.publisher, None
        if publisher is None:
            return
        final = final_step()
        if final is not None:
            publisher.publish(final)
        self._progress.close(final)
        # close() and pause() warn if the final step did not get through
        if self.last_step is not None and final is not None and final >= self.last_step:
            publisher.close(done=True)
            return
        publisher.pause(flush_timeout=10.0)
        self._paused = publisher

    def close(self) -> None:
        for publisher in (self._paused, self.publisher):
            if publisher is not None:
                publisher.close(done=False)
        self._paused = self.publisher = None
        self._progress.close()
