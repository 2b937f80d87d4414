"""Small in-process TensorFlow fixtures: a chief that advances the global step, waits in threads."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import tensorflow as tf

from stepbarrier import BarrierConfig, StepPublisher, read_status

NO_EXTRAS: dict[str, Any] = {
    "save_checkpoint_secs": None,
    "save_checkpoint_steps": None,
    "save_summaries_steps": None,
    "save_summaries_secs": None,
    "log_step_count_steps": None,
}
"""``MonitoredTrainingSession`` arguments that turn off its checkpoints, summaries and logs."""


class ForbiddenSession:
    """A session that fails the test if a hook reads from it."""

    def run(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the hook read the global step")


class SessionAt:
    """A session whose global step stays at ``step``: what a hook reads from it."""

    def __init__(self, step: int = 0) -> None:
        self.step = step
        self.reads = 0

    def run(self, *args: Any, **kwargs: Any) -> int:
        self.reads += 1
        return self.step


def context(session: Any) -> Any:
    return tf.compat.v1.train.SessionRunContext(original_args=None, session=session)


class AdvancingChief:
    """A thread that plays the chief: increments the global step and publishes it.

    TensorFlow's hook sees the step in the session, ours through Redis; both
    see the same chief.
    """

    def __init__(
        self,
        session: Any,
        increment: Any,
        publisher: StepPublisher,
        until: int,
        *,
        delay: float = 0.3,
        pause: float = 0.01,
    ) -> None:
        self.session, self.increment, self.publisher = session, increment, publisher
        self.until, self.delay, self.pause = until, delay, pause
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            time.sleep(self.delay)  # a hook that does not wait returns before this
            step = 0
            while step < self.until:
                step = int(self.session.run(self.increment))
                self.publisher.publish(step)
                time.sleep(self.pause)
            self.publisher.flush(10)
        except BaseException as exc:  # reported by join()
            self.error = exc

    def join(self) -> None:
        self.thread.join(60)
        assert not self.thread.is_alive(), "the chief thread hangs"
        assert self.error is None, repr(self.error)


class Waiting:
    """A worker's wait in a thread (a StepWaiter or our hook)."""

    def __init__(self, wait: Callable[[], int | None]) -> None:
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(wait,), daemon=True)
        self.thread.start()

    def _run(self, wait: Callable[[], int | None]) -> None:
        try:
            self.result = wait()
        except BaseException as exc:
            self.error = exc

    def join(self) -> int | None:
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker is still waiting"
        assert self.error is None, repr(self.error)
        return self.result

    def outcome(self) -> BaseException | None:
        """The error that ended the wait (``None`` if it was released)."""
        self.thread.join(30)
        assert not self.thread.is_alive(), "the worker is still waiting"
        return self.error


def wait_registered(config: BarrierConfig, count: int = 1) -> None:
    """Return once ``count`` workers wait (fails after 30 s)."""
    deadline = time.monotonic() + 30
    while len(read_status(config).waiters) < count:
        assert time.monotonic() < deadline, "the worker never registered"
        time.sleep(0.01)


def waits_logged(caplog: pytest.LogCaptureFixture) -> int:
    """How many waits the hooks announced (both hooks log the same line)."""
    return sum(
        1
        for record in caplog.records
        if record.levelno == logging.INFO
        and record.getMessage().startswith("Waiting for global step")
        and record.getMessage().endswith("before starting training.")
    )


class CrashOnce(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Raises ``AbortedError`` after the next run once armed, as a restarted ps would.

    ``MonitoredSession`` answers by creating a new session and calling every
    hook's ``after_create_session`` again (not ``begin``), then retrying the run.
    """

    def __init__(self) -> None:
        self.armed = False
        self.crashes = 0
        self.sessions = 0

    def after_create_session(self, session: Any, coord: Any) -> None:
        self.sessions += 1

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self.armed:
            self.armed = False
            self.crashes += 1
            raise tf.errors.AbortedError(None, None, "simulated: a parameter server restarted")
