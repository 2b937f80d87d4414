"""The chief's TensorFlow session hook: ``GlobalStepPublisherHook``.

It hands the global step, fetched with the training runs (on the schedule of
``stepbarrier._integrations.fetch_schedule``), to a ``StepPublisher``. Import it from
``stepbarrier.tf_hooks``, which checks that TensorFlow can be imported.
"""

from __future__ import annotations

import logging
import operator
import time
from typing import Any

import tensorflow as tf

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations.fetch_schedule import (
    FetchSchedule,
    StepLead,
)
from stepbarrier._integrations.global_step import global_step_or_raise, step_tensor
from stepbarrier._integrations.progress import close_progress, start_progress
from stepbarrier._integrations.tf_logging import follow_tensorflow_logging
from stepbarrier._progress.reporter import ProgressReporter

log = logging.getLogger("stepbarrier.tf_hooks")


class GlobalStepPublisherHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Publishes the chief's global step for ``GlobalStepWaiterHook`` workers.

    Add it to the chief's ``chief_only_hooks``. The global step is fetched with
    the training runs and handed to a ``StepPublisher``, whose thread writes to
    Redis once per heartbeat and whenever the step crosses a step some worker
    waits for. Redis being down never stops training.

    What it costs a run. With TensorFlow's own hooks (``StepCounterHook``,
    ``SummarySaverHook``, ``CheckpointSaverHook``) the hook fetches the tensor
    they fetch, so a run reads the step from the parameter server once for all
    (see ``stepbarrier._integrations.global_step.step_tensor``). And it fetches only where a
    step may matter: with every run while the step, extrapolated by its
    largest recent move per run, comes within reach of a waiting worker's step,
    and otherwise with one run in ``FETCH_EVERY``. Between fetches it hands
    over the last fetched step again (never ahead of the truth, and the
    training loop is still seen to hand steps over). A step that outruns the
    extrapolation is seen at the next fetch: a worker is then released late by
    at most ``FETCH_EVERY`` runs and about ``FETCH_WITHIN`` seconds of runs
    (the median time between runs decides; slower runs fetch every time),
    never early.

    The fetched value is the one from before the run's own increment, and in
    asynchronous parameter-server training other workers move the step during
    the run too. It is published as is (a published step must never be ahead
    of the truth), except when the step plus the largest recent move per run
    would reach a waiting worker's step: then one extra read (about 1.7 ms,
    about once per crossed target) confirms the true step, so that worker wakes
    when the chief's run that crossed its step returns, whatever the step's
    increment per run.

    ``after_create_session`` starts a new chief generation and publishes the
    session's step, so a chief restored from a checkpoint (or re-initialised by
    a recovering ``MonitoredSession``) publishes its real, lower step.

    How a job ends: ``end()`` publishes the exact final step but does not, by
    itself, finish the job, because TensorFlow calls it at the end of each
    session of a chief that trains in several (train/evaluate loops). The
    publisher then pauses (``StepPublisher.pause``): its heartbeat goes on while
    the process lives, vouching for nothing new, so waiting workers wait on
    through the gap, as TensorFlow's do; the next session (of this hook, or of a
    new one) takes over. In asynchronous training the released workers keep
    the step moving meanwhile (see ``GlobalStepWaiterHook``). Give
    ``last_step`` (the step at which your ``StopAtStepHook`` or loop ends) and
    ``end()`` finishes the job once the step reached it: workers still waiting
    for a later step are aborted. Or finish it explicitly: ``stepbarrier
    publish STEP --done``; ``close()`` ends a pause without finishing.

    A training loop that dies of an error skips ``end()`` (TensorFlow calls it
    only when the loop stops in order). If the process lives on (a notebook, a
    caught exception), the heartbeat stops once the loop has handed no step over
    for the stall timeout (or its confirmation window, if longer), so that
    waiting workers reach theirs.

    Args:
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()``.
        last_step: The job is finished when a session ends at or above it.

    Attributes:
        verifications: Extra global-step reads done so far (for tests and
            benchmarks).

    Example:
        ```python
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target,
            is_chief=True,
            chief_only_hooks=[GlobalStepPublisherHook(last_step=10_000)],
        ) as sess:
            while not sess.should_stop():
                sess.run(train_op)
        ```
    """

    def __init__(self, config: BarrierConfig | None = None, *, last_step: int | None = None):
        self._config = config
        self._last_step = None if last_step is None else operator.index(last_step)
        self._publisher: StepPublisher | None = None
        self._paused: StepPublisher | None = None  # between two sessions
        self._progress: ProgressReporter | None = None  # the chief's own step, as task 0
        self._global_step: Any = None
        self._lead = StepLead()
        self._fetches = FetchSchedule()
        self._fetching = True
        self._variable: Any = None
        self.verifications = 0

    @property
    def publisher(self) -> StepPublisher | None:
        """The publisher of the current session (``None`` outside a session)."""
        return self._publisher

    def begin(self) -> None:
        self._variable = self._global_step = global_step_or_raise("GlobalStepPublisherHook")
        follow_tensorflow_logging()
        if self._config is None:
            self._config = BarrierConfig.from_env()

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self._publisher is None:
            assert self._config is not None, "begin() was not called"
            paused, self._paused = self._paused, None
            self._publisher = paused if paused is not None and paused.active else None
            if self._publisher is None:
                self._publisher = StepPublisher(self._config)
        self._publisher.new_generation()
        self._global_step = step_tensor(self._variable)
        step = int(session.run(self._global_step))
        self._lead.restart(step)
        self._fetches.restart(step)
        self._publisher.publish(step)
        if self._progress is None:
            self._progress = start_progress(self._config, chief=True)
        if self._progress is not None:
            self._progress.report(step)
        log.info("job %s: chief session starts at global step %d", self._publisher.config.job, step)

    def before_run(self, run_context: Any) -> Any:
        publisher = self._publisher
        self._fetching = publisher is None or self._fetch_due(publisher)
        return tf.compat.v1.train.SessionRunArgs(self._global_step) if self._fetching else None

    def _fetch_due(self, publisher: StepPublisher) -> bool:
        return self._fetches.due(self._lead, publisher.next_threshold)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        publisher = self._publisher
        if publisher is None:
            return
        self._fetches.run_ended(time.monotonic())
        if not self._fetching:
            last = self._fetches.skipped()
            if last is not None:
                publisher.publish(last)
                if self._progress is not None:
                    self._progress.report(last)
            return
        step = int(run_values.results)
        lead = self._lead.observe(step, runs=self._fetches.unobserved)
        self._fetches.fetched(step)
        threshold = publisher.next_threshold
        # -1: the generation's first write is still to come (Redis may be down);
        # it goes out with any step, so there is nothing to confirm yet
        if 0 <= threshold <= step + lead:
            # The fetched value predates this run's own move: read the truth.
            step = int(run_context.session.run(self._global_step))
            self.verifications += 1
            self._fetches.confirmed(step)
        publisher.publish(step)
        if self._progress is not None:
            self._progress.report(step)

    def end(self, session: Any) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is None:
            return
        final: int | None = None
        try:
            # The last fetched value may lag by one run; the final step must not,
            # or a worker waiting for exactly that step would wait on.
            final = int(session.run(self._global_step))
            publisher.publish(final)
        except Exception as exc:  # the session may be unusable; the lower bound stands
            log.warning("could not read the final global step: %s", exc)
        progress, self._progress = self._progress, None
        close_progress(progress, final)
        done = self._last_step is not None and final is not None and final >= self._last_step
        if done:
            publisher.close(done=True)  # it warns if the final step did not get through
            return
        # another session may follow: waiting workers wait on (it warns if the
        # final step did not get through)
        publisher.pause(flush_timeout=10.0)
        self._paused = publisher

    def close(self) -> None:
        """End the pause after the last session without finishing the job: the
        heartbeat stops (waiting workers then reach their stall timeout)."""
        for publisher in (self._paused, self._publisher):
            if publisher is not None:
                publisher.close(done=False)
        self._paused = self._publisher = None
        progress, self._progress = self._progress, None
        close_progress(progress)
