"""TensorFlow session hooks: the chief publishes its global step, workers wait for it.

``GlobalStepWaiterHook`` replaces ``tf.compat.v1.train.GlobalStepWaiterHook`` by
changing the import; instead of reading the parameter server twice a second, a
waiting worker is woken through Redis within milliseconds of the chief's step.
The chief adds ``GlobalStepPublisherHook``. ``hooks_from_env`` picks the right
one for the host it runs on:

```python
hooks = stepbarrier.tf_hooks.hooks_from_env()
with tf.compat.v1.train.MonitoredTrainingSession(master=server.target, hooks=hooks) as sess:
    while not sess.should_stop():
        sess.run(train_op)
```

The start and end of training get named barriers (``StartBarrierHook``,
``EndBarrierHook``, from ``stepbarrier._integrations.barrier_hooks``):
``hooks_from_env(start_barrier=True, end_barrier=True)``. The chief's hook
lives in ``stepbarrier._integrations.publisher_hook`` and the schedule of its step fetches
in ``stepbarrier._integrations.fetch_schedule``; all are importable from here.

Lifecycle rules shared with TensorFlow's hook: ``begin()`` raises
``RuntimeError`` when the graph has no global step; ``wait_until_step <= 0``
never waits (and never touches Redis); only the first ``before_run`` after
``begin()`` waits, also when ``MonitoredSession`` recovers a failed session
(it calls ``after_create_session`` again, not ``begin``).

Warning:
    Unlike TensorFlow's hook, a wait can end with an exception (raised from
    ``before_run``, so the training loop stops): ``BarrierTimeout`` after the
    configured overall or stall timeout (unless ``STEPBARRIER_ON_TIMEOUT=proceed``),
    ``BarrierAborted`` when the chief finished the job below the awaited step,
    and ``RedisUnavailable``/``RedisRefused``.
"""

from __future__ import annotations

import enum
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

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.environment import (
    barrier_parties_from_env,
    barrier_role_from_env,
    job_in_env,
)
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations.barrier_hooks import EndBarrierHook, StartBarrierHook, barrier_hooks
from stepbarrier._integrations.fetch_schedule import FETCH_EVERY, FETCH_WITHIN, StepLead
from stepbarrier._integrations.global_step import global_step_or_raise
from stepbarrier._integrations.progress import (
    ProgressTicker,
    close_progress,
    progress_config,
    start_progress,
)
from stepbarrier._integrations.publisher_hook import GlobalStepPublisherHook
from stepbarrier._integrations.tf_logging import follow_tensorflow_logging
from stepbarrier._integrations.wait_until_step import target_step
from stepbarrier._progress.reporter import ProgressReporter
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
"""Seconds between two reads of the session's global step once a write of the
chief was seen: TensorFlow's pace still. Redis then wakes the worker within
milliseconds; the read is the safety net for a Redis that hangs or dies in the
middle of a wait, which a worker notices only by its silence: read at
TensorFlow's pace, such a worker never starts later than TensorFlow's would."""

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

    A drop-in replacement for ``tf.compat.v1.train.GlobalStepWaiterHook``: the
    same argument and the same lifecycle. It reads the session's global step,
    as TensorFlow's hook does (once before anything else, then every 0.5 s),
    and it listens to the chief's ``GlobalStepPublisherHook`` through Redis,
    which wakes it within milliseconds of the step. Whichever comes first
    releases the worker, so it starts no later than with TensorFlow's hook (a
    Redis that hangs can hold one read back by its bounded call, about a
    second), and never earlier (the session's step is what TensorFlow trusts).

    Without ``STEPBARRIER_JOB`` (and no ``config``) it is TensorFlow's hook: it
    reads the session's step every 0.5 s, after one WARNING naming the
    variables that turn on the Redis wake-ups. With Redis unreachable or
    refusing, it says so once and waits on the session's step. Its lines go
    to TensorFlow's logger, at TensorFlow's verbosity, when the application
    has configured no logging for ``stepbarrier`` (``follow_tensorflow_logging``).

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
            in ``begin()`` (only when there is something to wait for, and only
            if ``STEPBARRIER_JOB`` is set).
        report_every: Once started, the worker fetches the global step with
            every ``report_every``-th run and adds it to the job's published
            step (``None`` or 0: never), for waiters that listen to Redis only
            (``stepbarrier wait``, the asyncio waiter) when the chief's session
            ends first in asynchronous training; waiting hooks read the
            session's step anyway. A report only raises the step of the
            generation this worker's wait was released by, never finishes
            the job, and never vouches for the step: a Redis-only waiter is
            released by reports only while the chief's own vouch stands, so
            reports that begin more than a few seconds after the chief's
            session ended may release none (such a waiter ends at its
            timeout, saying the chief does not vouch for the step). It
            needs a user allowed to write the step: by default
            (``REPORT_EVERY``) a worker whose user may not (the shipped
            ``worker`` role) says so at INFO and trains on; given explicitly,
            that refusal is a WARNING. Not given, the config's
            ``report_every`` (``STEPBARRIER_REPORT_EVERY``) counts as given,
            when set: 0 turns reporting off for workers whose user may not
            write (the shipped compose file does so). Reporting needs a
            config: given here, or read in ``begin()``.

    Attributes:
        released_at_step: The step that released this worker (``None`` until a
            wait ended; under ``on_timeout="proceed"`` it may be below
            ``wait_until_step``).
        released_at: ``time.time()`` of that release.
        released_by: What released it: ``"an announcement"`` or ``"a read of
            the state"`` (Redis), ``"the session's global step"``; ``None``
            before a release.

    Example:
        ```python
        hook = GlobalStepWaiterHook(wait_until_step=13)
        with tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, hooks=[hook]
        ) as sess:
            while not sess.should_stop():
                sess.run(train_op)
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
        # this worker's own step, once released (docs/who-is-slow.md)
        self._progress: ProgressReporter | None = None
        self._progress_due = ProgressTicker()
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
        self._worker_is_started = False
        self._global_step = global_step_or_raise("GlobalStepWaiterHook")
        if self._wait_until_step > 0:
            follow_tensorflow_logging()
            if self._config is None:
                self._config = _config_or_warn()  # a bad setting fails before the session

    def before_run(self, run_context: Any) -> Any:
        if self._worker_is_started:
            return self._report_request()
        if self._wait_until_step <= 0:
            self._worker_is_started = True
            self._start_reporting()
            self._start_progress()
            return self._report_request()
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
        self.released_at = time.time()
        self.released_at_step = step
        self.released_by = by
        self._worker_is_started = True
        if self._waiter is None or self._waiter.last_generation is not None:
            # (released by the session before any chief state was read: there is
            # no generation to report into, and Redis may be out of reach)
            self._start_reporting()
        self._start_progress()
        return self._report_request()

    def after_run(self, run_context: Any, run_values: Any) -> None:
        if self._waiter is not None:
            self._close_waiter()
        if run_values.results is None:
            return
        step = int(run_values.results)
        if self._reporter is not None:
            self._reporter.publish(step)
        if self._progress is not None:
            self._progress.report(step)

    def end(self, session: Any) -> None:
        self._close_waiter()
        reporter, self._reporter = self._reporter, None
        if reporter is not None:
            reporter.close(done=False, timeout=2.0)
        progress, self._progress = self._progress, None
        close_progress(progress)

    def _start_progress(self) -> None:
        if self._progress is not None:
            return
        self._progress = start_progress(progress_config(self._config), chief=False)

    def _start_reporting(self) -> None:
        config = self._config
        if self._report_optional and config is not None and config.report_every is not None:
            # STEPBARRIER_REPORT_EVERY in place of the default: asked for
            self._report_every, self._report_optional = config.report_every, False
        if self._report_every and self._config is not None and self._reporter is None:
            # report into the generation this worker's wait was released by, and
            # no other: a later chief may be another run's, or one that restored
            # an older checkpoint (docs/protocol.md#contributors)
            joined = None if self._waiter is None else self._waiter.last_generation
            self._reporter = StepPublisher(
                self._config,
                contributor=True,
                join_generation=joined,
                optional=self._report_optional,
            )

    def _report_request(self) -> Any:
        fetch = False
        if self._reporter is not None:
            self._runs += 1
            fetch = not self._runs % self._report_every
        if self._progress is not None and self._progress_due.due():
            fetch = True  # this worker's own step, once per interval
        return tf.compat.v1.train.SessionRunArgs(self._global_step) if fetch else None

    def _close_waiter(self) -> None:
        # The wait itself unregisters when it ends; this releases the connections.
        waiter, self._waiter = self._waiter, None
        if waiter is not None:
            waiter.close()


def wait_on_session(session: StepSource, target: int) -> int:
    """TensorFlow's own wait: read the session's step until it reaches ``target``.

    What ``GlobalStepWaiterHook`` does without ``STEPBARRIER_JOB``: the same reads
    at the same pace as ``tf.compat.v1.train.GlobalStepWaiterHook``, and a line
    when the step moved by more than 1000 since the last one, as TensorFlow says.
    """
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


_warned_unconfigured = False


def _config_or_warn() -> BarrierConfig | None:
    """``BarrierConfig.from_env()``, or ``None`` (after one WARNING) without ``STEPBARRIER_JOB``.

    Raises:
        ConfigurationError: ``STEPBARRIER_JOB`` is set and a variable is invalid.
    """
    global _warned_unconfigured
    if job_in_env():
        return BarrierConfig.from_env()
    if not _warned_unconfigured:
        _warned_unconfigured = True
        log.warning(
            "STEPBARRIER_JOB is not set: GlobalStepWaiterHook waits as TensorFlow's hook "
            "does, reading the session's global step every %g s. For wake-ups within "
            "milliseconds of the step, set STEPBARRIER_JOB and STEPBARRIER_REDIS_URL (and "
            "STEPBARRIER_REDIS_USERNAME/STEPBARRIER_REDIS_PASSWORD_FILE on a Redis with "
            "users) on every host, and add GlobalStepPublisherHook to the chief",
            SESSION_READ_EVERY,
        )
    return None


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
        ```python
        hooks = hooks_from_env()
        session = tf.compat.v1.train.MonitoredTrainingSession(
            master=server.target, hooks=hooks
        )
        ```
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
