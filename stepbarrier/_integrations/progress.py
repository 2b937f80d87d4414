"""Each task's progress as the TF hooks and Keras callbacks report it (no TensorFlow here).

The chief's publisher hook and callback report the chief's step as task 0; a
worker's waiter hook and callback report the worker's own step (its session's
global step, its optimizer's iterations) once it is released. Both through a
``ProgressReporter`` (docs/who-is-slow.md), unless ``STEPBARRIER_REPORT_PROGRESS=0``
(``BarrierConfig.report_progress``) or the task has no id. Reporting is
optional: a Redis user that may not write the progress hash is said at INFO,
and training goes on.

``ProgressTicker`` tells a front end when a report is due (once per interval,
by a monotonic clock), so that a worker fetches its step from TensorFlow only
then, not at every run.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from stepbarrier._config.environment import job_in_env
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._progress.reporter import DEFAULT_INTERVAL, ProgressReporter
from stepbarrier.errors import ConfigurationError

log = logging.getLogger("stepbarrier")


def start_progress(config: BarrierConfig | None, *, chief: bool) -> ProgressReporter | None:
    """A reporter of this task's progress, or ``None`` (off, no config, no task id).

    Args:
        config: The job's settings (``None``: no reporting).
        chief: The chief's hook or callback: task 0 unless the config names another.
    """
    if config is None or not config.report_progress:
        return None
    task_id = config.task_id
    if task_id is None and chief:
        task_id = 0
    if task_id is None:
        return None  # nothing to report as (a worker's id comes from its launcher)
    try:
        return ProgressReporter(config, task_id=task_id, optional=True)
    except ConfigurationError as exc:  # settings the reporter refuses: say so, train on
        log.info("job %s: this task's progress is not reported: %s", config.job, exc)
        return None


def progress_config(config: BarrierConfig | None) -> BarrierConfig | None:
    """The settings a worker's progress is reported with: ``config``, or, for a worker
    that waits for nothing and so read none, the environment's (``None``: none)."""
    if config is not None or not job_in_env():
        return config
    try:
        return BarrierConfig.from_env()
    except ConfigurationError:
        return None  # the settings' own error is said where they are used


def close_progress(reporter: ProgressReporter | None, step: int | None = None) -> None:
    """Report ``step`` (if given) as the last one, and close ``reporter`` (if any)."""
    if reporter is None:
        return
    if step is not None:
        reporter.report(step)
    reporter.close()


class ProgressTicker:
    """When a front end's next report is due: once per ``interval`` seconds.

    Args:
        interval: Seconds between two reports (the reporter's own interval).
        clock: Monotonic clock (injectable for tests).
    """

    def __init__(
        self, interval: float = DEFAULT_INTERVAL, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self._interval = interval
        self._clock = clock
        self._next = -float("inf")

    def due(self) -> bool:
        """True once per interval (and at the first call): fetch the step and report it."""
        now = self._clock()
        if now < self._next:
            return False
        self._next = now + self._interval
        return True
