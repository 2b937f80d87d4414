"""Keras callbacks: the chief publishes its training step, workers wait for theirs.

``StepPublisherCallback`` goes into the chief's ``model.fit``, ``StepWaiterCallback``
into a worker's, holding it before its first batch until the chief's step reaches
the worker's; ``callbacks_from_env`` picks them, and the start and end barriers
(``StartBarrierCallback``, ``EndBarrierCallback``), for this host
(docs/tensorflow-keras.md#keras-callbacks).

A "step" is an optimizer update, ``model.optimizer.iterations`` (with
``gradient_accumulation_steps=N``, one every N batches); with
``steps_per_execution=N`` the chief publishes once every N batches. Written for
Keras 3 on any backend that can train (TensorFlow, JAX); which ``tf.distribute``
strategies fit: docs/tensorflow-keras.md#distribution-strategies.
"""

from __future__ import annotations

import logging
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
    raise ImportError(
        f"stepbarrier.keras_callbacks could not import Keras: {exc} (is the backend "
        "that KERAS_BACKEND or ~/.keras/keras.json names installed?)",
        name=exc.name,
    ) from exc

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.schedule import target_step
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations import settings
from stepbarrier._integrations.barrier_arrival import EndBarrier, StartBarrier
from stepbarrier._integrations.progress import ChiefPublishing, TaskProgress
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

    The step goes to a ``StepPublisher`` after every execution (no I/O on the
    training thread). Each ``fit`` is a session of
    ``stepbarrier.tf_hooks.GlobalStepPublisherHook``'s, and ends the same way, so a
    loop of ``fit`` calls keeps its workers waiting through the gaps.

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
        self._chief = ChiefPublishing(config, last_step)

    @property
    def publisher(self) -> StepPublisher | None:
        """The publisher while training runs, else ``None``."""
        return self._chief.publisher

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._chief.configure()
        self._chief.new_session(_iterations(self.model))

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._chief.publisher is not None:
            self._chief.publish(_iterations(self.model))

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self._chief.end(lambda: _iterations(self.model))

    def on_test_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        # a validation inside fit hands no step over, however long it takes: it
        # is a pause, not a loop that died (the next batch's step ends it)
        if self._chief.publisher is not None:
            self._chief.publisher.pause()

    def close(self) -> None:
        """End the pause after the last ``fit`` without finishing the job."""
        self._chief.close()


def _iterations(model: Any) -> int:
    """The model's optimizer updates: its training step."""
    # with gradient accumulation a backend array (a jax Array has no .numpy())
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


def _tf_class(tf: Any, dotted: str) -> type | tuple[()]:
    """``tf.<dotted>`` when this TensorFlow has that class, else ``()`` (matches nothing)."""
    found: Any = tf
    for part in dotted.split("."):
        found = getattr(found, part, None)
    return found if isinstance(found, type) else ()


def _synchronous_strategy(model: Any) -> str | None:
    """The public name of the synchronous ``tf.distribute`` strategy ``model`` trains
    under (the one whose scope built it, as callbacks run outside that scope, or
    the one entered now), or ``None``. Without TensorFlow imported there is none."""
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
    fitting = tuple(_tf_class(tf, name) for name in _FITTING_STRATEGIES)
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
            if isinstance(strategy, _tf_class(tf, name)):
                return f"tf.{name}"
        return f"{type(strategy).__module__}.{type(strategy).__qualname__}"
    return None


def _refuse_a_synchronous_strategy(model: Any) -> None:
    """Raise ``ConfigurationError`` if ``model`` trains under a synchronous strategy."""
    if (name := _synchronous_strategy(model)) is not None:
        raise ConfigurationError(
            f"StepWaiterCallback does not run under {name}, a synchronous strategy: "
            "across workers it takes every training step in one all-reduce of them all, "
            "so the chief's first step would wait for this worker while this worker waits "
            "for the chief's step, a deadlock (refused by the kind of strategy, in a single "
            "process too). Use StartBarrierCallback and EndBarrierCallback instead; a step "
            "wait fits the default strategy and OneDeviceStrategy "
            "(docs/tensorflow-keras.md#distribution-strategies)."
        )


class StepWaiterCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Holds a worker's training until the chief's step reaches ``wait_until_step``.

    The wait happens once per object, before the first training batch; it ends, and
    stops ``fit``, with ``BarrierTimeout`` or ``BarrierAborted`` as
    ``GlobalStepWaiterHook``'s does. Under a synchronous ``tf.distribute`` strategy
    ``fit`` raises ``ConfigurationError`` before any wait: across workers it would
    be a deadlock (docs/tensorflow-keras.md#distribution-strategies).

    Args:
        wait_until_step: The chief's step to wait for, as ``GlobalStepWaiterHook``
            reads it (``<= 0``: no wait, a float *t*: step ``math.ceil(t)``).
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            when training begins (if there is something to wait for).

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
        self._progress = TaskProgress(chief=False)  # its optimizer's iterations, once released

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
        self.released_at, self.released_at_step, self._started = time.time(), step, True

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if not self._started:
            return
        self._progress.start(self._config)
        if self._progress.due():
            self._progress.report(_iterations(self.model))

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        # another fit() reports anew
        self._progress.close(_iterations(self.model) if self._progress.reporting else None)


class StartBarrierCallback(StartBarrier, keras.callbacks.Callback):  # type: ignore[misc]
    """Holds training before its first batch until every party has arrived.

    The arguments and ``released_at`` are ``stepbarrier.tf_hooks.StartBarrierHook``'s;
    ``config`` ``None`` reads ``BarrierConfig.from_env()`` when training begins.

    Example:
        ```python
        model.fit(x, y, callbacks=[StartBarrierCallback(parties=3)])
        ```
    """

    _log = log

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        self._arrive_once()


class EndBarrierCallback(EndBarrier, keras.callbacks.Callback):  # type: ignore[misc]
    """Arrives at the end barrier when ``fit`` ends; the chief waits for every worker.

    On the chief put it after ``StepPublisherCallback`` (callbacks run in order);
    it acts once per object: for a loop of ``fit`` calls, give it to the last one.
    The arguments and attributes are ``stepbarrier.tf_hooks.EndBarrierHook``'s
    but ``last_step``; the job is finished at the chief's optimizer step.
    """

    _log = log

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        self._arrive_once(lambda: _iterations(self.model))


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

    ``stepbarrier.tf_hooks.hooks_from_env`` for Keras, with its arguments and errors
    (``last_step`` counts optimizer steps). No connection is made until training starts.
    """
    return settings.from_env(
        environ,
        publisher=lambda config: StepPublisherCallback(config, last_step=last_step),
        waiter=StepWaiterCallback,
        start=StartBarrierCallback,
        end=EndBarrierCallback,
        start_barrier=start_barrier,
        end_barrier=end_barrier,
        parties=parties,
        barrier_timeout=barrier_timeout,
    )
