"""TensorFlow session hooks: the chief publishes its global step, workers wait for it.

``GlobalStepWaiterHook`` replaces ``tf.compat.v1.train.GlobalStepWaiterHook`` by
changing the import; ``StartBarrierHook`` and ``EndBarrierHook`` hold every task
together at the start and the end of training; ``hooks_from_env`` picks what this
host needs (how to use them: docs/tensorflow-keras.md#session-hooks).

Warning:
    Unlike TensorFlow's hook, a wait can end with an exception from ``before_run``,
    which stops training: ``BarrierTimeout`` (unless ``STEPBARRIER_ON_TIMEOUT=proceed``)
    or ``BarrierAborted`` (docs/tensorflow-keras.md#what-is-different).
"""

from __future__ import annotations

import enum
import functools
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
    raise ImportError(
        f"stepbarrier.tf_hooks could not import TensorFlow: {exc}", name=exc.name
    ) from exc

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.environment import job_in_env
from stepbarrier._config.schedule import target_step
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations import settings
from stepbarrier._integrations.barrier_arrival import EndBarrier, StartBarrier, check_task
from stepbarrier._integrations.fetch_schedule import (
    FETCH_EVERY,
    FETCH_WITHIN,
    FetchSchedule,
    StepLead,
)
from stepbarrier._integrations.progress import ChiefPublishing, TaskProgress
from stepbarrier._worker.waiter import SOURCE_SOCKET_TIMEOUT, StepSource, StepWaiter

__all__ = [
    "EndBarrierHook",
    "GlobalStepPublisherHook",
    "GlobalStepWaiterHook",
    "FETCH_EVERY",
    "FETCH_WITHIN",
    "REPORT_EVERY",
    "SESSION_READ_EVERY",
    "SESSION_READ_WITH_CHIEF",
    "StartBarrierHook",
    "StepLead",
    "follow_tensorflow_logging",
    "hooks_from_env",
    "wait_on_session",
]

log = logging.getLogger("stepbarrier.tf_hooks")

REPORT_EVERY = 10
"""A started worker reports the global step with every this many runs (a fetch
through ``SessionRunArgs`` costs about 0.25 ms, so 0.025 ms a run on average)."""
SESSION_READ_EVERY = 0.5
"""Seconds between two reads of the session's global step while no chief of the
job was seen on Redis: TensorFlow's own hook reads it this often."""
SESSION_READ_WITH_CHIEF = 0.5
"""Seconds between two reads once a write of the chief was seen: TensorFlow's pace
still, the safety net for a Redis that hangs in the middle of a wait
(docs/tensorflow-keras.md#the-sessions-step-the-safety-net)."""

_NO_PUBLISHER_HINT = (
    "no GlobalStepPublisherHook was heard; for wake-ups within milliseconds of the step, "
    "add GlobalStepPublisherHook() to the chief's chief_only_hooks (or build every host's "
    "hooks with stepbarrier.tf_hooks.hooks_from_env()), with the same STEPBARRIER_JOB and "
    "Redis on the chief"
)


class _Default(enum.Enum):
    REPORT_EVERY = "REPORT_EVERY"  # the default, not asked for: a refusal is INFO


class GlobalStepWaiterHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Delays a worker's training until the job's global step reaches a step.

    A drop-in for ``tf.compat.v1.train.GlobalStepWaiterHook``
    (docs/tensorflow-keras.md#parity-with-tensorflows-hook): it reads the session's
    global step at TensorFlow's pace and listens to the chief's
    ``GlobalStepPublisherHook`` through Redis; whichever comes first releases the
    worker. Without ``STEPBARRIER_JOB`` (and no ``config``) it is TensorFlow's hook.

    Args:
        wait_until_step: The global step to wait for; ``<= 0`` starts at once
            without touching Redis; a float *t* waits for step ``math.ceil(t)``.
            NaN and ``+inf`` raise ``ConfigurationError``, a ``bool`` ``TypeError``.
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()``, if there is something to wait for and
            ``STEPBARRIER_JOB`` is set.
        report_every: Once started, the worker adds the global step of every
            ``report_every``-th run to the job's published step (``None`` or 0:
            never; docs/tensorflow-keras.md#workers-keep-the-step-moving).

    Attributes:
        released_at_step: The step that released this worker (``None`` until a
            wait ended; below ``wait_until_step`` under ``on_timeout="proceed"``).
        released_at: ``time.time()`` of that release.
        released_by: ``"an announcement"`` or ``"a read of the state"`` (Redis),
            ``"the session's global step"``; ``None`` before a release.

    Example:
        ```python
        hooks = [GlobalStepWaiterHook(wait_until_step=int(20 * math.log(task_id + 1)))]
        ```
    """

    def __init__(
        self,
        wait_until_step: float,
        config: BarrierConfig | None = None,
        *,
        report_every: int | _Default | None = _Default.REPORT_EVERY,
    ) -> None:
        self._wait_until_step = target_step(wait_until_step)
        self._config = config
        self._report_optional = report_every is _Default.REPORT_EVERY
        if isinstance(report_every, _Default):
            report_every = REPORT_EVERY
        self._report_every = operator.index(report_every or 0)
        if self._report_every < 0:
            raise ValueError(f"report_every must be 0 or more, got {report_every}")
        self._reporter: StepPublisher | None = None
        self._progress = TaskProgress(chief=False)  # this worker's own step, once released
        self._global_step: Any = None
        self._runs = 0
        self._worker_is_started = False
        self._waiter: StepWaiter | None = None
        self.released_at_step: int | None = None
        self.released_at: float | None = None
        self.released_by: str | None = None

    @property
    def wait_until_step(self) -> int:
        """The global step this hook waits for (a float argument rounded up)."""
        return self._wait_until_step

    def begin(self) -> None:
        global _warned_unconfigured
        self._worker_is_started = False
        self._global_step = _global_step_or_raise("GlobalStepWaiterHook")
        if self._wait_until_step <= 0:
            return
        follow_tensorflow_logging()
        if self._config is None and job_in_env():
            self._config = BarrierConfig.from_env()  # a bad setting fails before the session
        elif self._config is None and not _warned_unconfigured:
            _warned_unconfigured = True
            log.warning(
                "STEPBARRIER_JOB is not set: GlobalStepWaiterHook waits as TensorFlow's hook "
                "does, reading the session's global step every %g s. For wake-ups within "
                "milliseconds of the step, set STEPBARRIER_JOB and STEPBARRIER_REDIS_URL (and "
                "STEPBARRIER_REDIS_USERNAME/STEPBARRIER_REDIS_PASSWORD_FILE on a Redis with "
                "users) on every host, and add GlobalStepPublisherHook to the chief",
                SESSION_READ_EVERY,
            )

    def before_run(self, run_context: Any) -> Any:
        if not self._worker_is_started:
            if self._wait_until_step > 0:
                self._wait(run_context)
            self._worker_is_started = True
            if self._waiter is None or self._waiter.last_generation is not None:
                # (released by the session before any chief state was read: there is
                # no generation to report into, and Redis may be out of reach)
                self._start_reporting()
            self._progress.start(self._config)
        return self._report_request()

    def _wait(self, run_context: Any) -> None:
        follow_tensorflow_logging()  # TensorFlow's verbosity may have changed since
        target = self._wait_until_step
        log.info("Waiting for global step %d before starting training.", target)
        global_step = self._global_step
        session = StepSource(
            read=lambda: int(run_context.session.run(global_step)),
            name="the session's global step",
            interval=SESSION_READ_EVERY,
            interval_with_chief=SESSION_READ_WITH_CHIEF,
            hint=_NO_PUBLISHER_HINT,
        )
        if self._config is None:
            step = wait_on_session(session, target)
            by: str | None = session.name
        else:
            self._waiter = StepWaiter(self._config, socket_timeout=SOURCE_SOCKET_TIMEOUT)
            try:
                step = self._waiter.wait(target, source=session)
            except BaseException:
                self._close_waiter()
                raise
            by = self._waiter.last_released_by
        # the waiter's connections are closed after this first run, not on its way
        self.released_at, self.released_at_step, self.released_by = time.time(), step, by

    def after_run(self, run_context: Any, run_values: Any) -> None:
        self._close_waiter()
        if run_values.results is None:
            return
        step = int(run_values.results)
        if self._reporter is not None:
            self._reporter.publish(step)
        self._progress.report(step)

    def end(self, session: Any) -> None:
        self._close_waiter()
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.close(done=False, timeout=2.0)
        self._progress.close()

    def _start_reporting(self) -> None:
        config = self._config
        if config is None or self._reporter is not None:
            return
        if self._report_optional and config.report_every is not None:
            # STEPBARRIER_REPORT_EVERY in place of the default: asked for
            self._report_every, self._report_optional = config.report_every, False
        if self._report_every:
            # report into the generation this worker's wait was released by, and
            # no other: a later chief may be another run's, or one that restored
            # an older checkpoint (docs/protocol.md#contributors)
            joined = None if self._waiter is None else self._waiter.last_generation
            self._reporter = StepPublisher(
                config,
                contributor=True,
                join_generation=joined,
                optional=self._report_optional,
            )

    def _report_request(self) -> Any:
        fetch = self._progress.due()  # this worker's own step, once per interval
        if self._reporter is not None:
            self._runs += 1
            fetch = fetch or not self._runs % self._report_every
        return tf.compat.v1.train.SessionRunArgs(self._global_step) if fetch else None

    def _close_waiter(self) -> None:
        # The wait itself unregisters when it ends; this releases the connections.
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.close()


class GlobalStepPublisherHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Publishes the chief's global step for ``GlobalStepWaiterHook`` workers.

    Add it to the chief's ``chief_only_hooks``. The global step is fetched with the
    runs where it may matter and handed to a ``StepPublisher``, whose thread writes
    to Redis; Redis being down never stops training
    (docs/tensorflow-keras.md#how-the-chief-publishes).

    Args:
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()``.
        last_step: The job is finished when a session ends at or above it; a
            session that ends below it pauses the publisher until the next one
            (docs/tensorflow-keras.md#how-a-job-is-finished).

    Attributes:
        verifications: Extra global-step reads done so far (for tests and
            benchmarks).

    Example:
        ```python
        chief_only_hooks = [GlobalStepPublisherHook(last_step=10_000)]
        ```
    """

    def __init__(self, config: BarrierConfig | None = None, *, last_step: int | None = None):
        self._chief = ChiefPublishing(config, last_step)
        self._global_step: Any = None
        self._variable: Any = None
        self._lead = StepLead()
        self._fetches = FetchSchedule()
        self._fetching = True
        self.verifications = 0

    @property
    def publisher(self) -> StepPublisher | None:
        """The publisher of the current session (``None`` outside a session)."""
        return self._chief.publisher

    def begin(self) -> None:
        self._variable = self._global_step = _global_step_or_raise("GlobalStepPublisherHook")
        follow_tensorflow_logging()
        self._chief.configure()

    def after_create_session(self, session: Any, coord: Any) -> None:
        self._global_step = _step_tensor(self._variable)
        step = int(session.run(self._global_step))
        self._lead.restart(step)
        self._fetches.restart(step)
        publisher = self._chief.new_session(step)
        log.info("job %s: chief session starts at global step %d", publisher.config.job, step)

    def before_run(self, run_context: Any) -> Any:
        publisher = self._chief.publisher
        self._fetching = publisher is None or self._fetches.due(
            self._lead, publisher.next_threshold
        )
        return tf.compat.v1.train.SessionRunArgs(self._global_step) if self._fetching else None

    def after_run(self, run_context: Any, run_values: Any) -> None:
        publisher = self._chief.publisher
        if publisher is None:
            return
        self._fetches.run_ended(time.monotonic())
        if not self._fetching:
            last = self._fetches.skipped()
            if last is not None:
                self._chief.publish(last)
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
        self._chief.publish(step)

    def end(self, session: Any) -> None:
        # The last fetched value may lag by one run; the final step must not, or
        # a worker waiting for exactly that step would wait on.
        self._chief.end(lambda: _read_step(session, self._global_step, "the final global step"))

    def close(self) -> None:
        """End the pause after the last session without finishing the job: the
        heartbeat stops (waiting workers then reach their stall timeout)."""
        self._chief.close()


class StartBarrierHook(StartBarrier, tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Holds the task before its first step until every party has arrived.

    Put it before a ``GlobalStepWaiterHook`` (hooks run in order): the chief, also at
    the barrier, takes no step before every worker is there
    (docs/tensorflow-keras.md#start-and-end-barriers). It waits once per object.

    Args:
        parties: The chief and the workers: task ids ``0..parties-1``.
        name: The barrier's name (one per run).
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()``.
        timeout: Seconds before ``BarrierTimeout``; ``None`` uses
            ``STEPBARRIER_TIMEOUT`` (the stall timeout holds in any case).

    Attributes:
        released_at: ``time.time()`` when the barrier released this task (or,
            under ``STEPBARRIER_ON_TIMEOUT=proceed``, when it gave up and started).

    Example:
        ```python
        hooks = [StartBarrierHook(parties=3, timeout=600), *other_hooks]
        ```
    """

    _log = log

    def begin(self) -> None:
        check_task(self._configure(), self._spec)

    def before_run(self, run_context: Any) -> Any:
        self._arrive_once()
        return None


class EndBarrierHook(EndBarrier, tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Arrives at the end barrier in ``end()``; the chief waits there for every worker.

    The chief (whose exit often ends the whole job) so never leaves first, and marks
    the job done once all have arrived (docs/tensorflow-keras.md#start-and-end-barriers).
    On the chief put it after ``GlobalStepPublisherHook`` (or in ``hooks`` when the
    publisher is in ``chief_only_hooks``), whose ``end()`` must run first.

    Args:
        parties: As ``StartBarrierHook``'s (so are ``name``, ``config`` and
            ``timeout``, which holds for the tasks that wait).
        last_step: Arrive only at the end of a session at or above this global
            step (for a chief that trains in several sessions); ``None``: at
            the first ``end()``.
        wait: Whether this task waits for the others; ``None``: only the chief
            (task 0) does, a worker arrives and goes.
        finish_job: The chief marks the job done once every worker has arrived.

    Attributes:
        complete: True once the barrier released the chief.
        missing: The tasks that never arrived, when a timeout was let pass
            (``STEPBARRIER_ON_TIMEOUT=proceed``).

    Example:
        ```python
        hooks = [StartBarrierHook(parties=3), *other_hooks, EndBarrierHook(parties=3)]
        ```
    """

    _log = log

    def __init__(
        self,
        parties: int,
        *,
        name: str = "end",
        config: BarrierConfig | None = None,
        timeout: float | None = None,
        last_step: int | None = None,
        wait: bool | None = None,
        finish_job: bool = True,
    ) -> None:
        super().__init__(
            parties, name=name, config=config, timeout=timeout, wait=wait, finish_job=finish_job
        )
        self._last_step = None if last_step is None else operator.index(last_step)
        self._global_step: Any = None

    def begin(self) -> None:
        check_task(self._configure(), self._spec)
        self._global_step = tf.compat.v1.train.get_global_step()

    def end(self, session: Any) -> None:
        if self._arrived:
            return
        read = functools.partial(_read_step, session, self._global_step, "the global step")
        if self._last_step is not None:
            step = read()
            if step is None or step < self._last_step:
                return  # a session that ends before the last step: not the end of training
        self._arrive_once(read)


def wait_on_session(session: StepSource, target: int) -> int:
    """TensorFlow's own wait, as ``GlobalStepWaiterHook`` does it without
    ``STEPBARRIER_JOB``: TensorFlow's reads, pace and lines (one per 1000 steps)."""
    started = time.monotonic()
    logged: int | None = None
    while True:
        step = session.read()
        if step >= target:
            log.info(
                "released at step %d (target %d) after %.3f s, by %s",
                step,
                target,
                time.monotonic() - started,
                session.name,
            )
            return step
        if logged is None or step - logged > 1000:
            log.info(
                "Waiting for global step %d before starting training. Current step is %d.",
                target,
                step,
            )
            logged = step
        time.sleep(session.interval)  # looked up now: tests patch it, as TensorFlow's do


_warned_unconfigured = False  # the WARNING of a hook without STEPBARRIER_JOB: once


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

    The chief gets a ``GlobalStepPublisherHook``; a worker a ``GlobalStepWaiterHook``
    for ``STEPBARRIER_WAIT_UNTIL_STEP`` or its ``STEPBARRIER_SCHEDULE`` step; a ps or
    evaluator task of ``TF_CONFIG`` none (docs/tensorflow-keras.md#session-hooks).

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.
        last_step: For the chief: the job is finished when a session ends at or
            above this step (see ``GlobalStepPublisherHook``).
        start_barrier: Every task waits before its first step until the chief
            and all workers are there (``StartBarrierHook``, first in the list;
            docs/tensorflow-keras.md#start-and-end-barriers).
        end_barrier: The chief holds in ``end()`` until every worker has
            finished, then marks the job done (``EndBarrierHook``, last).
        parties: The barriers' parties; ``None``: the chief and worker tasks
            of ``TF_CONFIG``.
        barrier_timeout: Seconds a barrier waits; ``None``: ``STEPBARRIER_TIMEOUT``.

    Raises:
        ConfigurationError: A variable is missing or invalid: no role at all, or
            for a worker neither a wait step nor a schedule.
    """
    return settings.from_env(
        environ,
        publisher=lambda config: GlobalStepPublisherHook(config, last_step=last_step),
        waiter=GlobalStepWaiterHook,
        start=StartBarrierHook,
        end=EndBarrierHook,
        start_barrier=start_barrier,
        end_barrier=end_barrier,
        parties=parties,
        barrier_timeout=barrier_timeout,
    )


def _global_step_or_raise(hook_name: str) -> Any:
    """The graph's global step; ``RuntimeError`` (TensorFlow's words) if it has none."""
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is None:
        raise RuntimeError(f"Global step should be created to use {hook_name}.")
    return global_step


def _step_tensor(global_step: Any) -> Any:
    """What to fetch for the global step: the cached read that the hooks of
    ``MonitoredTrainingSession`` fetch with every run (one read for all), else the
    variable (cheaper than the cached read, which checks that it is initialised).
    Looked up after every hook's ``begin()``, so their order does not matter."""
    try:
        from tensorflow.python.training import training_util

        cached = global_step.graph.get_collection(training_util.GLOBAL_STEP_READ_KEY)
    except Exception as exc:  # not in this TensorFlow: the variable does the same job
        log.debug("no cached global-step read (%s); fetching the variable", exc)
        return global_step
    return cached[0] if cached else global_step


def _read_step(session: Any, tensor: Any, what: str) -> int | None:
    """``tensor``'s value in ``session``; ``None`` without one, or (with a WARNING)
    when the session is unusable by now."""
    if tensor is None:
        return None
    try:
        return int(session.run(tensor))
    except Exception as exc:
        log.warning("could not read %s: %s", what, exc)
        return None


class _ToTensorFlow(logging.Handler):
    """Hands stepbarrier's records to TensorFlow's logger, at its verbosity."""

    level_set: int | None = None  # the level follow_tensorflow_logging gave the logger

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            return  # the application configured logging since: the record goes there
        tf_logger = tf.get_logger()
        if record.levelno >= tf_logger.getEffectiveLevel():
            tf_logger.handle(record)


_to_tensorflow = _ToTensorFlow()


def follow_tensorflow_logging() -> None:
    """Let stepbarrier's lines follow TensorFlow's logger and verbosity, unless the
    application configured logging for them: a user who sets
    ``tf.compat.v1.logging.set_verbosity(INFO)`` with no ``logging.basicConfig`` sees
    the hooks' lines with TensorFlow's."""
    sb_logger = logging.getLogger("stepbarrier")
    handler = _to_tensorflow
    ours = handler in sb_logger.handlers
    # the logger's level is ours to follow TensorFlow's only if the application
    # left it unset (or we set it): an application's own level stands
    level_ours = sb_logger.level in (logging.NOTSET, handler.level_set)
    if ours and logging.getLogger().handlers:
        # the application configured logging since: its settings decide
        sb_logger.removeHandler(handler)
        if level_ours and handler.level_set is not None:
            sb_logger.setLevel(logging.NOTSET)
        handler.level_set = None
        return
    if not ours and sb_logger.hasHandlers():
        return  # the application's own logging decides
    if not ours:
        sb_logger.addHandler(handler)
    if level_ours:
        handler.level_set = tf.get_logger().getEffectiveLevel()
        sb_logger.setLevel(handler.level_set)
