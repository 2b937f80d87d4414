"""Keras callbacks: the chief publishes its training step, workers wait for theirs.

``StepPublisherCallback`` goes into the chief's ``model.fit``; it publishes
``model.optimizer.iterations`` after every training batch. ``StepWaiterCallback``
goes into a worker's ``model.fit`` and holds it, before its first batch, until
the chief's step reaches the worker's step. ``callbacks_from_env`` picks the
right one for the host it runs on::

    model.fit(x, y, callbacks=stepbarrier.keras_callbacks.callbacks_from_env())

Written for Keras 3 (``tf.keras`` in TensorFlow 2.16 and later).
"""

from __future__ import annotations

import logging
import operator
import time
from collections.abc import Mapping
from typing import Any

try:
    import keras
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "stepbarrier.keras_callbacks needs Keras 3 (it comes with TensorFlow): "
        "pip install 'stepbarrier[tensorflow]'"
    ) from exc

from stepbarrier.config import BarrierConfig
from stepbarrier.publisher import StepPublisher
from stepbarrier.waiter import StepWaiter

log = logging.getLogger("stepbarrier.keras_callbacks")


class StepPublisherCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Publishes the chief's training step (``model.optimizer.iterations``).

    The step is handed to a ``StepPublisher`` after every training batch (no
    I/O on the training thread); its thread writes to Redis once per heartbeat
    and whenever a worker's step is reached. Each ``fit`` starts a new chief
    generation, so a model restored from a checkpoint publishes its real step.
    At the end of training the job is marked finished: workers still waiting
    for a step that will not come are aborted.

    Args:
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            when training begins.

    Example:
        >>> model.fit(x, y, epochs=3, callbacks=[StepPublisherCallback()])  # doctest: +SKIP
    """

    def __init__(self, config: BarrierConfig | None = None) -> None:
        super().__init__()
        self._config = config
        self._publisher: StepPublisher | None = None

    @property
    def publisher(self) -> StepPublisher | None:
        """The publisher while training runs, else ``None``."""
        return self._publisher

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._config is None:
            self._config = BarrierConfig.from_env()
        if self._publisher is None:
            self._publisher = StepPublisher(self._config)
        self._publisher.new_generation()
        self._publisher.publish(self._iterations())

    def on_train_batch_end(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._publisher is not None:
            self._publisher.publish(self._iterations())

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            publisher.close(done=True)  # it warns if the final step did not get through

    def _iterations(self) -> int:
        return int(self.model.optimizer.iterations.numpy())


class StepWaiterCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Holds a worker's training until the chief's step reaches ``wait_until_step``.

    The wait happens once, before the first training batch this callback sees
    (a later ``fit`` with the same callback does not wait again). It ends with
    ``BarrierTimeout`` after the configured timeouts (unless
    ``STEPBARRIER_ON_TIMEOUT=proceed``), or ``BarrierAborted`` when the chief
    finished below the step; either stops ``fit``.

    Args:
        wait_until_step: The chief's step to wait for; ``<= 0`` starts at once
            without touching Redis.
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            when training begins (only if there is something to wait for).

    Attributes:
        released_at_step: The chief's step that released the worker (``None``
            until a wait ended).
        released_at: ``time.time()`` of that release.

    Example:
        >>> waiter = StepWaiterCallback(wait_until_step=13)  # doctest: +SKIP
        >>> model.fit(x, y, epochs=3, callbacks=[waiter])  # doctest: +SKIP
    """

    def __init__(self, wait_until_step: int, config: BarrierConfig | None = None) -> None:
        super().__init__()
        self._wait_until_step = operator.index(wait_until_step)
        self._config = config
        self._started = self._wait_until_step <= 0
        self.released_at_step: int | None = None
        self.released_at: float | None = None

    @property
    def wait_until_step(self) -> int:
        """The chief's step this callback waits for."""
        return self._wait_until_step

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if not self._started and self._config is None:
            self._config = BarrierConfig.from_env()  # a bad setting fails before training

    def on_train_batch_begin(self, batch: int, logs: Mapping[str, Any] | None = None) -> None:
        if self._started:
            return
        if self._config is None:
            self._config = BarrierConfig.from_env()
        log.info("Waiting for step %d before starting training.", self._wait_until_step)
        with StepWaiter(self._config) as waiter:
            step = waiter.wait(self._wait_until_step)
        self.released_at = time.time()
        self.released_at_step = step
        self._started = True


def callbacks_from_env(environ: Mapping[str, str] | None = None) -> list[Any]:
    """The stepbarrier callbacks this host needs, from its environment.

    The chief gets a ``StepPublisherCallback``; a worker gets a
    ``StepWaiterCallback`` for ``STEPBARRIER_WAIT_UNTIL_STEP`` or its
    ``STEPBARRIER_SCHEDULE`` step; any other task gets none. The role and task
    id come from ``STEPBARRIER_ROLE``/``STEPBARRIER_TASK_ID``, else from
    ``TF_CONFIG``. No connection is made until training starts.

    Args:
        environ: The variables to read; ``os.environ`` when ``None``.

    Raises:
        ConfigurationError: A variable is missing or invalid.

    Example:
        >>> model.fit(x, y, callbacks=callbacks_from_env())  # doctest: +SKIP
    """
    config = BarrierConfig.from_env(environ)
    if config.role == "chief":
        return [StepPublisherCallback(config)]
    if config.role == "worker":
        return [StepWaiterCallback(config.resolved_wait_until_step(), config)]
    return []
