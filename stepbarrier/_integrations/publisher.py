"""The chief's publisher across sessions or ``fit`` calls (no TensorFlow here)."""

from __future__ import annotations

import operator
from collections.abc import Callable

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations.progress import TaskProgress


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
