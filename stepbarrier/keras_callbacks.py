"""Keras callbacks: the chief publishes its training step, workers wait for theirs.

``StepPublisherCallback`` goes into the chief's ``model.fit``; it publishes
``model.optimizer.iterations`` after every training batch. ``StepWaiterCallback``
goes into a worker's ``model.fit`` and holds it, before its first batch, until
the chief's step reaches the worker's step. ``callbacks_from_env`` picks the
right one for the host it runs on:

```python
model.fit(x, y, callbacks=stepbarrier.keras_callbacks.callbacks_from_env())
```

Start and end barriers (``StartBarrierCallback``, ``EndBarrierCallback``):
``callbacks_from_env(start_barrier=True, end_barrier=True)``.

A "step" is an optimizer update, ``model.optimizer.iterations``: with
``gradient_accumulation_steps=N`` it advances once every N batches. Keras calls
the batch callbacks once per execution, so with ``steps_per_execution=N`` in
``compile`` the chief publishes once every N batches (a worker waiting for a
step in between is released at the end of that execution).

Written for Keras 3 (``tf.keras`` in TensorFlow 2.16 and later) on any backend
that can train (TensorFlow, JAX; the NumPy backend cannot ``fit``).

``StepWaiterCallback`` fits the default strategy and ``OneDeviceStrategy``;
under a synchronous ``tf.distribute`` strategy (``MirroredStrategy``,
``MultiWorkerMirroredStrategy``, ``TPUStrategy``, ``CentralStorageStrategy``)
it raises ``ConfigurationError`` before it waits: there the start and end
barrier callbacks fit instead. Keras 3's ``fit`` trains under no strategy that
spans processes (``MultiWorkerMirroredStrategy`` with a cluster,
``ParameterServerStrategy``): see docs/tensorflow-keras.md#distribution-strategies.
"""

from __future__ import annotations

import logging
import operator
import sys
import time
from collections.abc import Mapping
from typing import Any

try:
    import keras
except ImportError as exc:  # pragma: no cover - depends on the installation
    if exc.name == "keras":
        raise ImportError(
            "stepbarrier.keras_callbacks needs Keras 3 (it comes with TensorFlow): "
            "pip install 'stepbarrier[tensorflow]', or 'stepbarrier[jax]' for Keras "
            f"on JAX ({exc})",
            name=exc.name,
        ) from exc
    # Keras is there but its backend (KERAS_BACKEND) or a dependency is not
    raise ImportError(
        f"stepbarrier.keras_callbacks could not import Keras: {exc} (is the backend "
        "that KERAS_BACKEND or ~/.keras/keras.json names installed?)",
        name=exc.name,
    ) from exc

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.environment import (
    barrier_parties_from_env,
    barrier_role_from_env,
)
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations.keras_barriers import (
    EndBarrierCallback,
    StartBarrierCallback,
    barrier_callbacks,
)
from stepbarrier._integrations.progress import (
    ProgressTicker,
    close_progress,
    progress_config,
    start_progress,
)
from stepbarrier._integrations.wait_until_step import target_step
from stepbarrier._progress.reporter import ProgressReporter
from stepbarrier._worker.waiter import StepWaiter
from stepbarrier.errors import ConfigurationError

__all__ = [
    "EndBarrierCallback",
    "StartBarrierCallback",
    "StepPublisherCallback",
    "StepWaiterCallback",
    "callbacks_from_env",
]

log = logging.getLogger("stepbarrier.keras_callbacks")


class StepPublisherCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Publishes the chief's training step (``model.optimizer.iterations``).

    The step is handed to a ``StepPublisher`` at the end of every execution
    (every ``steps_per_execution`` batches; no I/O on the training thread); its
    thread writes to Redis once per heartbeat and whenever a worker's step is
    reached. Each ``fit`` starts a new chief
    generation, so a model restored from a checkpoint publishes its real step.

    How a job ends: the end of a ``fit`` does not finish the job by itself, so
    a loop of ``fit`` calls (one per epoch, or staged training) keeps its
    waiting workers waiting. Give ``last_step`` (the optimizer step at which
    training is over) and the ``fit`` that ends at or above it finishes the
    job: workers still waiting for a later step are aborted. Or finish it
    explicitly with ``stepbarrier publish STEP --done``. Between two ``fit``
    calls the publisher pauses (``StepPublisher.pause``): its heartbeat goes
    on, vouching for nothing new, so that workers wait on through the gap;
    ``close()`` ends the pause without finishing the job.

    Args:
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            when training begins.
        last_step: The job is finished when a ``fit`` ends at or above it.

    Example:
        ```python
        publisher = StepPublisherCallback(last_step=3 * steps_per_fit)
        for _ in range(3):
            model.fit(x, y, callbacks=[publisher])
        ```
    """

    def __init__(self, config: BarrierConfig | None = None, *, last_step: int | None = None):
        super().__init__()
        self._config = config
        self._last_step = None if last_step is None else operator.index(last_step)
        self._publisher: StepPublisher | None = None
        self._progress: ProgressReporter | None = None  # the chief's own step, as task 0
        self._paused: StepPublisher | None = None  # between two fit() calls

    @property
    def publisher(self) -> StepPublisher | None:
        """The publisher while training runs, else ``None``."""
        return self._publisher

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._config is None:
            self._config = BarrierConfig.from_env()
        if self._publisher is None:
            paused, self._paused = self._paused, None
            self._publisher = paused if paused is not None and paused.active else None
        if self._publisher is None:
            self._publisher = StepPublisher(self._config)
        self._publisher.new_generation()
        step = self._iterations()
        self._publisher.publish(step)
        if self._progress is None:
            self._progress = start_progress(self._config, chief=True)
        if self._progress is not None:
            self._progress.report(step)

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._publisher is not None:
            step = self._iterations()
            self._publisher.publish(step)
            if self._progress is not None:
                self._progress.report(step)

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is None:
            return
        final = self._iterations()
        publisher.publish(final)
        progress, self._progress = self._progress, None
        close_progress(progress, final)
        done = self._last_step is not None and final >= self._last_step
        if done:
            publisher.close(done=True)  # it warns if the final step did not get through
            return
        # another fit() may follow: the heartbeat goes on, so waiting workers
        # wait on through the gap (see StepPublisher.pause)
        publisher.pause(flush_timeout=10.0)  # it warns if the final step did not get through
        self._paused = publisher

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        # a validation inside fit hands no step over, however long it takes: it
        # is a pause, not a loop that died (the next batch's step ends it)
        if self._publisher is not None:
            self._publisher.pause()

    def close(self) -> None:
        """End the pause after the last ``fit`` without finishing the job."""
        for publisher in (self._paused, self._publisher):
            if publisher is not None:
                publisher.close(done=False)
        self._paused = self._publisher = None
        progress, self._progress = self._progress, None
        close_progress(progress)

    def _iterations(self) -> int:
        return _iterations(self.model)


def _iterations(model: Any) -> int:
    """The model's optimizer updates: its training step."""
    # with gradient accumulation ``iterations`` is a backend array (a jax Array
    # has no .numpy()), not a variable
    iterations = model.optimizer.iterations
    if hasattr(iterations, "numpy"):  # a variable: the fast path, on every batch
        return int(iterations.numpy())
    return int(keras.ops.convert_to_numpy(iterations))


_FITTING_STRATEGIES = (
    "distribute.OneDeviceStrategy",
    "distribute.ParameterServerStrategy",
    "distribute.experimental.ParameterServerStrategy",
    "compat.v1.distribute.OneDeviceStrategy",
    "compat.v1.distribute.experimental.ParameterServerStrategy",
)
"""Besides the default strategy, the ``tf.distribute`` strategies not refused: a
step wait fits ``OneDeviceStrategy``; under ``ParameterServerStrategy`` Keras 3's
``fit`` raises on its own before the first batch, so no wait ever begins."""

_SYNCHRONOUS_STRATEGIES = (
    "distribute.MultiWorkerMirroredStrategy",
    "distribute.MirroredStrategy",
    "distribute.TPUStrategy",
    "distribute.experimental.TPUStrategy",
    "distribute.experimental.CentralStorageStrategy",
    "compat.v1.distribute.experimental.MultiWorkerMirroredStrategy",
    "compat.v1.distribute.MirroredStrategy",
    "compat.v1.distribute.experimental.TPUStrategy",
    "compat.v1.distribute.experimental.CentralStorageStrategy",
)
"""The public names a refused strategy is called by, the most specific first; a
strategy in neither list (a subclass of ``tf.distribute.Strategy``) is refused too."""


def _tf_class(tf: Any, dotted: str) -> type | None:
    """``tf.<dotted>`` when this TensorFlow has that class, else ``None``."""
    found: Any = tf
    for part in dotted.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else None


def _synchronous_strategy(model: Any) -> str | None:
    """The public name of the synchronous ``tf.distribute`` strategy ``model``
    trains under, or ``None``.

    Both the model's ``distribute_strategy`` (Keras on TensorFlow: the strategy
    whose scope built the model; callbacks run outside that scope) and the
    strategy whose scope is entered now count. TensorFlow is never imported
    here: if nothing imported it, there can be no strategy.
    """
    tf = sys.modules.get("tensorflow")
    distribute = getattr(tf, "distribute", None)
    if distribute is None:
        return None
    candidates = [getattr(model, "distribute_strategy", None)]
    if distribute.has_strategy():
        candidates.append(distribute.get_strategy())
        default = None
    else:
        default = distribute.get_strategy()  # outside every scope: the default strategy
    fitting = tuple(c for c in (_tf_class(tf, name) for name in _FITTING_STRATEGIES) if c)
    for strategy in candidates:
        if (
            strategy is None
            or strategy is default
            # the default strategy seen from inside another strategy's scope
            or type(strategy).__name__ == "_DefaultDistributionStrategy"
            or isinstance(strategy, fitting)
        ):
            continue
        for name in _SYNCHRONOUS_STRATEGIES:
            cls = _tf_class(tf, name)
            if cls is not None and isinstance(strategy, cls):
                return f"tf.{name}"
        return f"{type(strategy).__module__}.{type(strategy).__qualname__}"
    return None


def _refuse_a_synchronous_strategy(model: Any) -> None:
    """Raise ``ConfigurationError`` if ``model`` trains under a synchronous strategy."""
    name = _synchronous_strategy(model)
    if name is None:
        return
    raise ConfigurationError(
        f"StepWaiterCallback does not run under {name}, a synchronous strategy: "
        "across workers it takes every training step in one all-reduce of them all, "
        "so the chief would block in its first step until this worker joins it while "
        "this worker waits for the chief's step, a deadlock that the chief's heartbeat "
        "keeps the stall timeout from ending; the refusal goes by the kind of "
        "strategy, in a single process too. To hold the tasks together at the start "
        "and the end of training, use StartBarrierCallback and EndBarrierCallback "
        "instead (or callbacks_from_env(start_barrier=True, end_barrier=True) with "
        "neither STEPBARRIER_WAIT_UNTIL_STEP nor STEPBARRIER_SCHEDULE for the "
        "workers). A step wait fits the default strategy and OneDeviceStrategy "
        "(docs/tensorflow-keras.md#distribution-strategies)."
    )


class StepWaiterCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Holds a worker's training until the chief's step reaches ``wait_until_step``.

    The wait happens once, before the first training batch this callback sees
    (a later ``fit`` with the same callback does not wait again). It ends with
    ``BarrierTimeout`` after the configured timeouts (unless
    ``STEPBARRIER_ON_TIMEOUT=proceed``), or ``BarrierAborted`` when the chief
    finished below the step; either stops ``fit``. The chief's step counts its
    optimizer updates (``model.optimizer.iterations``, one per
    ``gradient_accumulation_steps`` batches) and is published once per
    execution (every ``steps_per_execution`` batches).

    Under a synchronous ``tf.distribute`` strategy (``MirroredStrategy``,
    ``MultiWorkerMirroredStrategy``, ``TPUStrategy``, ``CentralStorageStrategy``)
    ``fit`` raises ``ConfigurationError`` at once, before any wait, for any
    ``wait_until_step``: across workers the wait would be a deadlock (the chief
    waits in its first step for this worker, this worker for the chief's step),
    and the refusal goes by the kind of strategy, in one process too.
    ``StartBarrierCallback`` and ``EndBarrierCallback`` fit those strategies.
    The default strategy and ``OneDeviceStrategy`` are fine. Keras 3's ``fit``
    trains under neither ``MultiWorkerMirroredStrategy`` with a cluster nor
    ``ParameterServerStrategy`` (docs/tensorflow-keras.md#distribution-strategies).

    Args:
        wait_until_step: The chief's step to wait for; ``<= 0`` starts at once
            without touching Redis. As in ``GlobalStepWaiterHook``, a float *t*
            waits for step ``math.ceil(t)``, the first step ``>= t``; NaN and
            ``+inf`` raise ``ConfigurationError``, a ``bool`` ``TypeError``.
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            when training begins (only if there is something to wait for).

    Attributes:
        released_at_step: The chief's step that released the worker (``None``
            until a wait ended).
        released_at: ``time.time()`` of that release.

    Example:
        ```python
        waiter = StepWaiterCallback(wait_until_step=13)
        model.fit(x, y, epochs=3, callbacks=[waiter])
        ```
    """

    def __init__(self, wait_until_step: float, config: BarrierConfig | None = None) -> None:
        super().__init__()
        self._wait_until_step = target_step(wait_until_step)
        self._config = config
        self._started = self._wait_until_step <= 0
        self.released_at_step: int | None = None
        self.released_at: float | None = None
        # this worker's own step (its optimizer's iterations), once released
        self._progress: ProgressReporter | None = None
        self._progress_due = ProgressTicker()
        self._progress_tried = False

    @property
    def wait_until_step(self) -> int:
        """The chief's step this callback waits for (a float argument rounded up)."""
        return self._wait_until_step

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        _refuse_a_synchronous_strategy(self.model)  # a deadlock: before Redis or the wait
        if not self._started and self._config is None:
            self._config = BarrierConfig.from_env()  # a bad setting fails before training

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._started:
            return
        _refuse_a_synchronous_strategy(self.model)  # also without on_train_begin
        if self._config is None:
            self._config = BarrierConfig.from_env()
        log.info("Waiting for step %d before starting training.", self._wait_until_step)
        with StepWaiter(self._config) as waiter:
            step = waiter.wait(self._wait_until_step)
        self.released_at = time.time()
        self.released_at_step = step
        self._started = True

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if not self._started:
            return
        if not self._progress_tried:
            self._progress_tried = True
            self._progress = start_progress(progress_config(self._config), chief=False)
        if self._progress is not None and self._progress_due.due():
            self._progress.report(_iterations(self.model))

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        progress, self._progress = self._progress, None
        self._progress_tried = False  # another fit() reports anew
        if progress is not None:
            close_progress(progress, _iterations(self.model))


def callbacks_from_env(
    environ: Mapping[str, str] | None = None,
    *,
    last_step: int | None = None,
    start_barrier: bool = False,
    end_barrier: bool = False,
    parties: int | None = None,
    barrier_timeout: float | None = None,
) -> list[Any]:
    """The stepbarrier callbacks this host needs, from its environment.

    The chief gets a ``StepPublisherCallback``; a worker gets a
    ``StepWaiterCallback`` for ``STEPBARRIER_WAIT_UNTIL_STEP`` or its
    ``STEPBARRIER_SCHEDULE`` step; a ps or evaluator task of ``TF_CONFIG`` gets
    none (and needs no ``STEPBARRIER_*`` variable). The role and task id come
    from ``STEPBARRIER_ROLE``/``STEPBARRIER_TASK_ID``, else from ``TF_CONFIG``.
    No connection is made until training starts.

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.
        last_step: For the chief: the job is finished when a ``fit`` ends at or
            above this step (see ``StepPublisherCallback``).
        start_barrier: Every task waits before its first batch until the chief
            and all workers are there (``StartBarrierCallback``, first). A
            worker with no wait step nor schedule then gets no step waiter.
        end_barrier: The chief holds at the end of ``fit`` until every worker
            has finished, then marks the job done (``EndBarrierCallback``, last).
        parties: The barriers' parties; ``None``: the chief and worker tasks
            of ``TF_CONFIG``.
        barrier_timeout: Seconds a barrier waits; ``None``: ``STEPBARRIER_TIMEOUT``.

    Raises:
        ConfigurationError: A variable is missing or invalid: no role at all
            (neither ``STEPBARRIER_ROLE`` nor ``TF_CONFIG``), or for a worker
            neither a wait step nor a schedule.

    Example:
        ```python
        model.fit(x, y, callbacks=callbacks_from_env())
        ```
    """
    if barrier_role_from_env(environ) is None:
        return []  # a ps or evaluator task takes no part in the barrier
    config = BarrierConfig.from_env(environ)
    before: list[Any] = []
    after: list[Any] = []
    if start_barrier or end_barrier:
        count = barrier_parties_from_env(environ, parties)
        before, after = barrier_callbacks(
            config, count, start=start_barrier, end=end_barrier, timeout=barrier_timeout
        )
    if config.role == "chief":
        return [*before, StepPublisherCallback(config, last_step=last_step), *after]
    if start_barrier and config.wait_until_step is None and config.schedule is None:
        return [*before, *after]  # the start barrier is this worker's start
    return [*before, StepWaiterCallback(config.resolved_wait_until_step(), config), *after]
