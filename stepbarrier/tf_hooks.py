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
``hooks_from_env(start_barrier=True, end_barrier=True)``.

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
from collections import deque
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
from stepbarrier.publisher import StepPublisher
from stepbarrier.target_step import target_step
from stepbarrier.tf_barrier_hooks import EndBarrierHook, StartBarrierHook, barrier_hooks
from stepbarrier.waiter import StepWaiter

__all__ = [
    "EndBarrierHook",
    "GlobalStepPublisherHook",
    "GlobalStepWaiterHook",
    "FETCH_EVERY",
    "REPORT_EVERY",
    "StartBarrierHook",
    "StepLead",
    "hooks_from_env",
]

log = logging.getLogger("stepbarrier.tf_hooks")

REPORT_EVERY = 10
"""A started worker reports the global step with every this many runs (a fetch
through ``SessionRunArgs`` costs about 0.25 ms, so 0.025 ms a run on average)."""
FETCH_EVERY = 16
"""The chief's hook fetches the global step with at least one run in this many
(with every run while a waiting worker's step is within reach)."""
FETCH_WITHIN = 0.05
"""...and at least once in this many seconds of runs: where a run takes longer
than this, the step is fetched with every run (its cost is then small anyway)."""


def _global_step_or_raise(hook_name: str) -> Any:
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is None:
        raise RuntimeError(f"Global step should be created to use {hook_name}.")
    return global_step


def _step_tensor(global_step: Any) -> Any:
    """What to fetch for the global step: the tensor TensorFlow's own hooks fetch, if any.

    ``StepCounterHook``, ``SummarySaverHook`` and ``CheckpointSaverHook`` (the
    hooks ``MonitoredTrainingSession`` adds) create, in their ``begin()``, a
    cached read of the step (``training_util._get_or_create_global_step_read``)
    and fetch it with every run. Fetching the same tensor, a run reads the step
    once for all. Without those hooks that tensor does not exist, and the
    variable is fetched: alone, it is the cheaper read (the cached one checks
    that the variable is initialised on the parameter server first). Looked up
    once every hook's ``begin()`` has run, so the order of the hooks does not
    matter; a TensorFlow without that cache gets the variable.
    """
    try:
        from tensorflow.python.training import training_util

        cached = global_step.graph.get_collection(training_util.GLOBAL_STEP_READ_KEY)
    except Exception as exc:  # not in this TensorFlow: the variable does the same job
        log.debug("no cached global-step read (%s); fetching the variable", exc)
        return global_step
    return cached[0] if cached else global_step


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
        self._global_step = _global_step_or_raise("GlobalStepWaiterHook")
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
            self._reporter = StepPublisher(self._config, contributor=True)

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


class GlobalStepPublisherHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Publishes the chief's global step for ``GlobalStepWaiterHook`` workers.

    Add it to the chief's ``chief_only_hooks``. The global step is fetched with
    the training runs and handed to a ``StepPublisher``, whose thread writes to
    Redis once per heartbeat and whenever the step crosses a step some worker
    waits for. Redis being down never stops training.

    What it costs a run. With TensorFlow's own hooks (``StepCounterHook``,
    ``SummarySaverHook``, ``CheckpointSaverHook``) the hook fetches the tensor
    they fetch, so a run reads the step from the parameter server once for all
    (see ``_step_tensor``). And it fetches only where a
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
    itself, finish the job, because TensorFlow also calls it when a crashed
    chief's ``try/finally`` closes its session, and at the end of each session
    of a chief that trains in several. Waiting workers go on waiting: in
    asynchronous training the released workers keep the step moving (see
    ``GlobalStepWaiterHook``). Give ``last_step`` (the step at which your
    ``StopAtStepHook`` or loop ends) and ``end()`` finishes the job once the
    step reached it: workers still waiting for a later step are aborted. Or
    finish it explicitly: ``stepbarrier publish STEP --done``.

    Args:
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()``.
        last_step: The job is finished when a session ends at or above it.

    Attributes:
        verifications: Extra global-step reads done so far (for tests and
            benchmarks).

    Example:
        >>> with tf.compat.v1.train.MonitoredTrainingSession(  # doctest: +SKIP
        ...     master=server.target,
        ...     is_chief=True,
        ...     chief_only_hooks=[GlobalStepPublisherHook(last_step=10_000)],
        ... ) as sess:
        ...     while not sess.should_stop():
        ...         sess.run(train_op)
    """

    def __init__(self, config: BarrierConfig | None = None, *, last_step: int | None = None):
        self._config = config
        self._last_step = None if last_step is None else operator.index(last_step)
        self._publisher: StepPublisher | None = None
        self._global_step: Any = None
        self._lead = StepLead()
        self._step: int | None = None  # the last step fetched (or read)
        self._since = 0  # runs whose move that step lacks
        self._unobserved = 0  # runs since the lead last took in a fetched step
        self._skipped = 0  # runs without a fetch since the last one
        self._fetching = True
        self._gaps: deque[float] = deque(maxlen=8)  # seconds between the last runs' ends
        self._run_ended: float | None = None
        self._variable: Any = None
        self.verifications = 0

    @property
    def publisher(self) -> StepPublisher | None:
        """The publisher of the current session (``None`` outside a session)."""
        return self._publisher

    def begin(self) -> None:
        self._variable = self._global_step = _global_step_or_raise("GlobalStepPublisherHook")
        if self._config is None:
            self._config = BarrierConfig.from_env()

    def after_create_session(self, session: Any, coord: Any) -> None:
        if self._publisher is None:
            assert self._config is not None, "begin() was not called"
            self._publisher = StepPublisher(self._config)
        self._publisher.new_generation()
        self._global_step = _step_tensor(self._variable)
        step = int(session.run(self._global_step))
        self._lead.restart(step)
        self._step, self._since, self._unobserved, self._skipped = step, 0, 0, 0
        self._gaps.clear()
        self._run_ended = None
        self._publisher.publish(step)
        log.info("job %s: chief session starts at global step %d", self._publisher.config.job, step)

    def before_run(self, run_context: Any) -> Any:
        publisher = self._publisher
        self._fetching = publisher is None or self._fetch_due(publisher)
        return tf.compat.v1.train.SessionRunArgs(self._global_step) if self._fetching else None

    def _fetch_due(self, publisher: StepPublisher) -> bool:
        if self._step is None or self._lead.observed < 2 or len(self._gaps) < 3:
            return True  # nothing to extrapolate from yet
        cadence = sorted(self._gaps)[len(self._gaps) // 2]  # one pause does not count
        every = min(FETCH_EVERY, int(FETCH_WITHIN / max(cadence, 1e-6)))
        if self._skipped + 1 >= every:
            return True
        # where the step may be once this run returns, plus one run of margin:
        # the run that may cross a waiting worker's step fetches it
        reach = self._step + self._lead.lead * (self._since + 2)
        return 0 <= publisher.next_threshold <= reach

    def after_run(self, run_context: Any, run_values: Any) -> None:
        publisher = self._publisher
        if publisher is None:
            return
        now = time.monotonic()
        if self._run_ended is not None:
            self._gaps.append(now - self._run_ended)
        self._run_ended = now
        self._unobserved += 1
        if not self._fetching:
            self._skipped += 1
            self._since += 1  # one more run whose move the last fetched step lacks
            if self._step is not None:
                publisher.publish(self._step)
            return
        step = int(run_values.results)
        lead = self._lead.observe(step, runs=self._unobserved)
        self._unobserved, self._since, self._skipped = 0, 1, 0
        threshold = publisher.next_threshold
        # -1: the generation's first write is still to come (Redis may be down);
        # it goes out with any step, so there is nothing to confirm yet
        if 0 <= threshold <= step + lead:
            # The fetched value predates this run's own move: read the truth.
            step = int(run_context.session.run(self._global_step))
            self.verifications += 1
            self._since = 0
        self._step = step
        publisher.publish(step)

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
        done = self._last_step is not None and final is not None and final >= self._last_step
        publisher.close(done=done)  # it warns if the final step did not get through


class StepLead:
    """How far the global step may move during one run: the largest recent move.

    In asynchronous training the step moves by more than one per chief run (the
    other workers push it too). The lead is the largest move of the last
    ``WINDOW`` runs, so a burst is not forgotten at once and a slow-down is
    learnt within that many runs.
    """

    WINDOW = 16

    def __init__(self) -> None:
        self._previous: int | None = None
        self._moves: deque[int] = deque(maxlen=self.WINDOW)

    def restart(self, step: int) -> None:
        """A new session starts at ``step``."""
        self._previous = step

    def observe(self, step: int, runs: int = 1) -> int:
        """Take in a step fetched ``runs`` runs after the last one; return the lead."""
        if self._previous is not None and step > self._previous:
            self._moves.append(-(-(step - self._previous) // max(1, runs)))  # per run, rounded up
        self._previous = step
        return self.lead

    @property
    def observed(self) -> int:
        """How many moves the lead is learnt from (at most ``WINDOW``)."""
        return len(self._moves)

    @property
    def lead(self) -> int:
        """The move to expect from one run: the largest recent one (at least 1)."""
        return max(self._moves, default=1)


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
