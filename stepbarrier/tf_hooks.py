"""TensorFlow session hooks: the chief publishes its global step, workers wait for it.

``GlobalStepWaiterHook`` replaces ``tf.compat.v1.train.GlobalStepWaiterHook`` by
changing the import; instead of reading the parameter server twice a second, a
waiting worker is woken through Redis within milliseconds of the chief's step.
The chief adds ``GlobalStepPublisherHook``. ``hooks_from_env`` picks the right
one for the host it runs on::

    hooks = stepbarrier.tf_hooks.hooks_from_env()
    with tf.compat.v1.train.MonitoredTrainingSession(..., hooks=hooks) as sess:
        ...

Lifecycle rules shared with TensorFlow's hook: ``begin()`` raises
``RuntimeError`` when the graph has no global step; ``wait_until_step <= 0``
never waits (and never touches Redis); only the first ``before_run`` after
``begin()`` waits, also when ``MonitoredSession`` recovers a failed session
(it calls ``after_create_session`` again, not ``begin``).

.. warning::
    Unlike TensorFlow's hook, a wait can end with an exception (raised from
    ``before_run``, so the training loop stops): ``BarrierTimeout`` after the
    configured overall or stall timeout (unless ``STEPBARRIER_ON_TIMEOUT=proceed``),
    ``BarrierAborted`` when the chief finished the job below the awaited step,
    and ``RedisUnavailable``/``RedisRefused``.
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Mapping
from typing import Any

try:
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "stepbarrier.tf_hooks needs TensorFlow: pip install 'stepbarrier[tensorflow]'"
    ) from exc

from stepbarrier.config import BarrierConfig
from stepbarrier.publisher import StepPublisher
from stepbarrier.waiter import StepWaiter

log = logging.getLogger("stepbarrier.tf_hooks")


def _global_step_or_raise(hook_name: str) -> Any:
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is None:
        raise RuntimeError(f"Global step should be created to use {hook_name}.")
    return global_step


class GlobalStepWaiterHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Delays a worker's training until the chief's global step reaches a step.

    A drop-in replacement for ``tf.compat.v1.train.GlobalStepWaiterHook``: the
    same argument and the same lifecycle, but the step comes from the chief's
    ``GlobalStepPublisherHook`` through Redis, so the worker starts within
    milliseconds of the step and does not poll the parameter server.

    Args:
        wait_until_step: The global step to wait for; ``<= 0`` starts at once
            without touching Redis. TensorFlow's ramp is
            ``int(K * math.log(task_id + 1))``, the chief being task 0.
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()`` (only when there is something to wait for).

    Attributes:
        released_at_step: The chief's step that released this worker (``None``
            until a wait ended; under ``on_timeout="proceed"`` it may be below
            ``wait_until_step``).
        released_at: ``time.time()`` of that release.

    Example:
        >>> hook = GlobalStepWaiterHook(wait_until_step=13)  # doctest: +SKIP
        >>> with tf.compat.v1.train.MonitoredTrainingSession(  # doctest: +SKIP
        ...     master=server.target, hooks=[hook]
        ... ) as sess:
        ...     while not sess.should_stop():
        ...         sess.run(train_op)
    """

    def __init__(self, wait_until_step: int, config: BarrierConfig | None = None) -> None:
        self._wait_until_step = operator.index(wait_until_step)
        self._config = config
        self._worker_is_started = False
        self._waiter: StepWaiter | None = None
        self.released_at_step: int | None = None
        self.released_at: float | None = None

    @property
    def wait_until_step(self) -> int:
        """The global step this hook waits for."""
        return self._wait_until_step

    def begin(self) -> None:
        self._worker_is_started = False
        _global_step_or_raise("GlobalStepWaiterHook")
        if self._wait_until_step > 0 and self._config is None:
            self._config = BarrierConfig.from_env()  # a bad setting fails before the session

    def before_run(self, run_context: Any) -> None:
        if self._worker_is_started:
            return None
        if self._wait_until_step <= 0:
            self._worker_is_started = True
            return None
        if self._config is None:
            self._config = BarrierConfig.from_env()
        log.info("Waiting for global step %d before starting training.", self._wait_until_step)
        self._waiter = StepWaiter(self._config)
        try:
            step = self._waiter.wait(self._wait_until_step)
        finally:
            self._close_waiter()
        self.released_at = time.time()
        self.released_at_step = step
        self._worker_is_started = True
        return None

    def end(self, session: Any) -> None:
        self._close_waiter()

    def _close_waiter(self) -> None:
        # The wait itself unregisters when it ends; this releases the connection.
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.close()


class GlobalStepPublisherHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Publishes the chief's global step for ``GlobalStepWaiterHook`` workers.

    Add it to the chief's ``chief_only_hooks``. The global step is fetched with
    each training run (about 0.25 ms) and handed to a ``StepPublisher``, whose
    thread writes to Redis once per heartbeat and whenever the step crosses a
    step some worker waits for. Redis being down never stops training.

    The fetched value may be the one from before the run's own increment. It is
    published as is (a published step must never be ahead of the truth), except
    when one more step would reach a waiting worker's step: then one extra read
    (about 1.7 ms, once per crossed target) confirms the true step, so that
    worker wakes when the chief's run that reached its step returns.

    ``after_create_session`` starts a new chief generation and publishes the
    session's step, so a chief restored from a checkpoint (or re-initialised by
    a recovering ``MonitoredSession``) publishes its real, lower step. ``end()``
    marks the job finished: workers still waiting for a step that will not come
    are aborted. ``end()`` reads the final step once more, so it is exact.

    Args:
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()``.

    Attributes:
        verifications: Extra global-step reads done so far (for tests and
            benchmarks).

    Example:
        >>> with tf.compat.v1.train.MonitoredTrainingSession(  # doctest: +SKIP
        ...     master=server.target,
        ...     is_chief=True,
        ...     chief_only_hooks=[GlobalStepPublisherHook()],
        ... ) as sess:
        ...     while not sess.should_stop():
        ...         sess.run(train_op)
    """

    def __init__(self, config: BarrierConfig | None = None) -> None:
        self._config = config
        self._publisher: StepPublisher | None = None
        self._global_step: Any = None
        self.verifications = 0

    @property
    def publisher(self) -> StepPublisher | None:
        """The publisher of the current session (``None`` outside a session)."""
        return self._publisher

    def begin(self) -> None:
        self._global_step = _global_step_or_raise("GlobalStepPublisherHook")
        if self._config is None:
            self._config = BarrierConfig.from_env()

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self._publisher is None:
            assert self._config is not None, "begin() was not called"
            self._publisher = StepPublisher(self._config)
        self._publisher.new_generation()
        step = int(session.run(self._global_step))
        self._publisher.publish(step)
        log.info("job %s: chief session starts at global step %d", self._publisher.config.job, step)

    def before_run(self, run_context: Any) -> Any:
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def after_run(self, run_context: Any, run_values: Any) -> None:
        publisher = self._publisher
        if publisher is None:
            return
        step = int(run_values.results)
        if step + 1 >= publisher.next_threshold:
            # The fetched value may predate this run's increment: read the truth.
            step = int(run_context.session.run(self._global_step))
            self.verifications += 1
        publisher.publish(step)

    def end(self, session: Any) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is None:
            return
        try:
            # The last fetched value may lag by one run; the final step must not,
            # or a worker waiting for exactly that step would be aborted.
            publisher.publish(int(session.run(self._global_step)))
        except Exception as exc:  # the session may be unusable; the lower bound stands
            log.warning("could not read the final global step: %s", exc)
        publisher.close(done=True)  # it warns if the final step did not get through


def hooks_from_env(environ: Mapping[str, str] | None = None) -> list[Any]:
    """The stepbarrier hooks this host needs, from its environment.

    The chief gets a ``GlobalStepPublisherHook``; a worker gets a
    ``GlobalStepWaiterHook`` for ``STEPBARRIER_WAIT_UNTIL_STEP`` or its
    ``STEPBARRIER_SCHEDULE`` step; a ps or evaluator task gets none. The role
    and task id come from ``STEPBARRIER_ROLE``/``STEPBARRIER_TASK_ID``, else
    from ``TF_CONFIG``. No connection is made until the session starts.

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.

    Raises:
        ConfigurationError: A variable is missing or invalid (for a worker:
            neither a wait step nor a schedule is set).

    Example:
        >>> hooks = hooks_from_env()  # doctest: +SKIP
        >>> session = tf.compat.v1.train.MonitoredTrainingSession(  # doctest: +SKIP
        ...     master=server.target, hooks=hooks
        ... )
    """
    config = BarrierConfig.from_env(environ)
    if config.role == "chief":
        return [GlobalStepPublisherHook(config)]
    if config.role == "worker":
        return [GlobalStepWaiterHook(config.resolved_wait_until_step(), config)]
    return []
