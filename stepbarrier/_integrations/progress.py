"""Each task's progress as the TF hooks and Keras callbacks report it (no TensorFlow here):
the chief's step as task 0, a worker's own step once it is released, through a
``ProgressReporter`` (docs/who-is-slow.md). Optional: a Redis user that may not
write the progress hash is said at INFO, and training goes on.
"""

from __future__ import annotations

import logging
import time

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
