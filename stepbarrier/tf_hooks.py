"""TensorFlow session hooks: the chief publishes its global step, workers wait for it.

``GlobalStepWaiterHook`` replaces ``tf.compat.v1.train.GlobalStepWaiterHook`` by
changing the import; instead of reading the parameter server twice a second, a
waiting worker is woken through Redis within milliseconds of the chief's step.
The chief adds ``GlobalStepPublisherHook``. ``hooks_from_env`` picks the right
one for the host it runs on::

    hooks = stepbarrier.tf_hooks.hooks_from_env()
    with tf.compat.v1.train.MonitoredTrainingSession(..., hooks=hooks) as sess:
        ...

The start and end of training get named barriers (``StartBarrierHook``,
``EndBarrierHook``, from ``stepbarrier.tf_barrier_hooks``):
``hooks_from_env(start_barrier=True, end_barrier=True)``. The chief's hook
lives in ``stepbarrier.tf_publisher_hook`` and the schedule of its step fetches
in ``stepbarrier.fetch_schedule``; all are importable from here.

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
    if exc.name == "tensorflow":
        raise ImportError(
            f"stepbarrier.tf_hooks needs TensorFlow: pip install 'stepbarrier[tensorflow]' ({exc})",
            name=exc.name,
        ) from exc
    # TensorFlow is there but something it imports is not: name that, not TensorFlow
    raise ImportError(
        f"stepbarrier.tf_hooks could not import TensorFlow: {exc}", name=exc.name
    ) from exc

from stepbarrier.config import BarrierConfig
from stepbarrier.environment import barrier_parties_from_env, barrier_role_from_env
from stepbarrier.fetch_schedule import FETCH_EVERY, FETCH_WITHIN, StepLead
from stepbarrier.publisher import StepPublisher
from stepbarrier.target_step import target_step
from stepbarrier.tf_barrier_hooks import EndBarrierHook, StartBarrierHook, barrier_hooks
from stepbarrier.tf_global_step import global_step_or_raise
from stepbarrier.tf_publisher_hook import GlobalStepPublisherHook
from stepbarrier.waiter import StepWaiter

__all__ = [
    "EndBarrierHook",
    "GlobalStepPublisherHook",
    "GlobalStepWaiterHook",
    "FETCH_EVERY",
    "FETCH_WITHIN",
    "REPORT_EVERY",
    "StartBarrierHook",
    "StepLead",
    "hooks_from_env",
]

log = logging.getLogger("stepbarrier.tf_hooks")

REPORT_EVERY = 10
"""A started worker reports the global step with every this many runs (a fetch
through ``SessionRunArgs`` costs about 0.25 ms, so 0.025 ms a run on average)."""


class GlobalStepWaiterHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Delays a worker's training until the chief's global step reaches a step.

    A drop-in replacement for ``tf.compat.v1.train.GlobalStepWaiterHook``: the
    same argument and the same lifecycle, but the step comes from the chief's
    ``GlobalStepPublisherHook`` through Redis, so the worker starts within
    milliseconds of the step and does not poll the parameter server.

    Args:
        wait_until_step: The global step to wait for; ``<= 0`` starts at once
            without touching Redis. TensorFlow's ramp is
            ``int(K * math.log(task_id + 1))``, the chief being task 0. Like
            TensorFlow's hook, which releases once ``global_step >=
            wait_until_step``, it takes any real number: a float *t* waits for
            step ``math.ceil(t)`` (``20 * math.log(2)``, 13.86, waits for 14).
            NaN and ``+inf`` (which TensorFlow's hook would wait for forever)
            raise ``ConfigurationError``, a ``bool`` ``TypeError``.
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()`` (only when there is something to wait for).
        report_every: Once started, the worker fetches the global step with
            every ``report_every``-th run and adds it to the job's published
            step (``None`` or 0: never). In asynchronous parameter-server
            training every worker moves the global step, and training goes on
            after the chief's session ends; TensorFlow's hook, which reads the
            step on the parameter server, then still releases waiting workers,
            and so does this one, through the steps the started workers report.
            A report only raises the step of the chief's current generation
            (never above what the worker read), and never finishes the job.
            Reporting needs a config: given here, or read in ``begin()``, which
            happens only when there is something to wait for (so
            ``GlobalStepWaiterHook(0)`` without a config, like TensorFlow's,
            never touches Redis; ``hooks_from_env`` always passes one).

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

    def __init__(
        self,
        wait_until_step: float,
        config: BarrierConfig | None = None,
        *,
        report_every: int | None = REPORT_EVERY,
    ) -> None:
        self._wait_until_step = target_step(wait_until_step)
        self._config = config
        self._report_every = operator.index(report_every or 0)
        if self._report_every < 0:
            raise ValueError(f"report_every must be 0 or more, got {report_every}")
        self._reporter: StepPublisher | None = None
        self._global_step: Any = None
        self._runs = 0
        self._worker_is_started = False
        self._waiter: StepWaiter | None = None
        self.released_at_step: int | None = None
        self.released_at: float | None = None

    @property
    def wait_until_step(self) -> int:
        """The global step this hook waits for (a float argument rounded up)."""
        return self._wait_until_step

    def begin(self) -> None:
        self._worker_is_started = False
        self._global_step = global_step_or_raise("GlobalStepWaiterHook")
        if self._wait_until_step > 0 and self._config is None:
            self._config = BarrierConfig.from_env()  # a bad setting fails before the session

    def before_run(self, run_context: Any) -> Any:
        if self._worker_is_started:
            return self._report_request()
        if self._wait_until_step <= 0:
            self._worker_is_started = True
            self._start_reporting()
            return self._report_request()
        if self._config is None:
            self._config = BarrierConfig.from_env()
        log.info("Waiting for global step %d before starting training.", self._wait_until_step)
        self._waiter = StepWaiter(self._config)
        try:
            step = self._waiter.wait(self._wait_until_step)
        except BaseException:
            self._close_waiter()
            raise
        # the waiter's connections are closed after this first run, not on its way
        self.released_at = time.time()
        self.released_at_step = step
        self._worker_is_started = True
        self._start_reporting()
        return self._report_request()

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self._waiter is not None:
            self._close_waiter()
        reporter = self._reporter
        if reporter is not None and run_values.results is not None:
            reporter.publish(int(run_values.results))

    def end(self, session: Any) -> None:
        self._close_waiter()
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.close(done=False, timeout=2.0)

    def _start_reporting(self) -> None:
        if self._report_every and self._config is not None and self._reporter is None:
            # report into the generation this worker's wait was released by, and
            # no other: a later chief may be another run's, or one that restored
            # an older checkpoint (docs/protocol.md#contributors)
            joined = None if self._waiter is None else self._waiter.last_generation
            self._reporter = StepPublisher(self._config, contributor=True, join_generation=joined)

    def _report_request(self) -> Any:
        if self._reporter is None:
            return None
        self._runs += 1
        if self._runs % self._report_every:
            return None
        return tf.compat.v1.train.SessionRunArgs(self._global_step)

    def _close_waiter(self) -> None:
        # The wait itself unregisters when it ends; this releases the connections.
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.close()


def hooks_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    last_step: int | None = None,
    start_barrier: bool = False,
    end_barrier: bool = False,
    parties: int | None = None,
    barrier_timeout: float | None = None,
) -> list[Any]:
    """The stepbarrier hooks this host needs, from its environment.

    The chief gets a ``GlobalStepPublisherHook``; a worker gets a
    ``GlobalStepWaiterHook`` for ``STEPBARRIER_WAIT_UNTIL_STEP`` or its
    ``STEPBARRIER_SCHEDULE`` step; a ps or evaluator task of ``TF_CONFIG`` gets
    none (and needs no ``STEPBARRIER_*`` variable). The role and task id come
    from ``STEPBARRIER_ROLE``/``STEPBARRIER_TASK_ID``, else from ``TF_CONFIG``.
    No connection is made until the session starts.

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.
        last_step: For the chief: the job is finished when a session ends at or
            above this step (see ``GlobalStepPublisherHook``).
        start_barrier: Every task waits before its first step until the chief
            and all workers are there (``StartBarrierHook``, first in the list).
            A worker with neither ``STEPBARRIER_WAIT_UNTIL_STEP`` nor
            ``STEPBARRIER_SCHEDULE`` then gets no step waiter.
        end_barrier: The chief holds in ``end()`` until every worker has
            finished, then marks the job done (``EndBarrierHook``, last).
        parties: The barriers' parties; ``None``: the chief and worker tasks
            of ``TF_CONFIG``.
        barrier_timeout: Seconds a barrier waits; ``None``: ``STEPBARRIER_TIMEOUT``.

    Raises:
        ConfigurationError: A variable is missing or invalid: no role at all
            (neither ``STEPBARRIER_ROLE`` nor ``TF_CONFIG``, as with launchers
            that pass ``--job_name``/``--task_index`` flags), or for a worker
            neither a wait step nor a schedule.

    Example:
        >>> hooks = hooks_from_env()  # doctest: +SKIP
        >>> session = tf.compat.v1.train.MonitoredTrainingSession(  # doctest: +SKIP
        ...     master=server.target, hooks=hooks
        ... )
    """
    if barrier_role_from_env(environ) is None:
        return []  # a ps or evaluator task takes no part in the barrier
    config = BarrierConfig.from_env(environ)
    before: list[Any] = []
    after: list[Any] = []
    if start_barrier or end_barrier:
        count = barrier_parties_from_env(environ, parties)
        before, after = barrier_hooks(
            config, count, start=start_barrier, end=end_barrier, timeout=barrier_timeout
        )
    if config.role == "chief":
        return [*before, GlobalStepPublisherHook(config, last_step=last_step), *after]
    if start_barrier and config.wait_until_step is None and config.schedule is None:
        return [*before, *after]  # the start barrier is this worker's start
    return [*before, GlobalStepWaiterHook(config.resolved_wait_until_step(), config), *after]
