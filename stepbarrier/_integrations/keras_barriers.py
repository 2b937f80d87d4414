"""Keras callbacks for the start and the end of training: named barriers.

``StartBarrierCallback`` holds ``fit`` before its first batch until the chief
and every worker are there; ``EndBarrierCallback`` holds the chief at the end
of ``fit`` until every worker has finished (a worker arrives and goes), then
marks the job done (see ``stepbarrier._barriers.finish``). ``callbacks_from_env``
adds both:

```python
model.fit(x, y, callbacks=callbacks_from_env(start_barrier=True, end_barrier=True))
```

Both act once per callback object: for a loop of ``fit`` calls, give the end
callback to the last one only.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Any

try:
    import keras
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        f"stepbarrier._integrations.keras_barriers needs Keras 3 ({exc})", name=exc.name
    ) from exc

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations.barrier_arrival import BarrierSpec, around, arrive, arrive_at_end

log = logging.getLogger("stepbarrier.keras_callbacks")


class StartBarrierCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Holds training before its first batch until every party has arrived.

    Args:
        parties: The chief and the workers: task ids ``0..parties-1``.
        name: The barrier's name (one per run).
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            when training begins.
        timeout: Seconds before ``BarrierTimeout``; ``None`` uses
            ``STEPBARRIER_TIMEOUT`` (the stall timeout holds in any case).

    Attributes:
        released_at: ``time.time()`` when the barrier released this task (or,
            under ``STEPBARRIER_ON_TIMEOUT=proceed``, when it gave up and started).

    Example:
        ```python
        model.fit(x, y, callbacks=[StartBarrierCallback(parties=3)])
        ```
    """

    def __init__(
        self,
        parties: int,
        *,
        name: str = "start",
        config: BarrierConfig | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__()
        self._spec = BarrierSpec(parties, name, timeout)
        self.parties = self._spec.parties
        self.name = self._spec.name
        self._config = config
        self.released_at: float | None = None

    def on_train_begin(self, logs: Mapping[str, Any] | None = None) -> None:
        if self.released_at is not None:
            return
        if self._config is None:
            self._config = BarrierConfig.from_env()
        log.info("Waiting at barrier %r for all %d tasks.", self.name, self.parties)
        arrive(self._config, self._spec, log, then="starting")
        self.released_at = time.time()


class EndBarrierCallback(keras.callbacks.Callback):  # type: ignore[misc]
    """Arrives at the end barrier when ``fit`` ends; the chief waits for every worker.

    On the chief put it after ``StepPublisherCallback`` (callbacks run in order).

    Args:
        parties: The chief and the workers: task ids ``0..parties-1``.
        name: The barrier's name (one per run).
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``.
        timeout: Seconds the chief waits before ``BarrierTimeout``; ``None``
            uses ``STEPBARRIER_TIMEOUT`` (the stall timeout holds in any case).
        wait: Whether this task waits for the others; ``None``: only the chief
            (task 0) does.
        finish_job: The chief marks the job done at its optimizer step once
            every worker has arrived.

    Attributes:
        complete: True once the barrier released the chief.
        missing: The tasks that never arrived, when a timeout was let pass
            (``STEPBARRIER_ON_TIMEOUT=proceed``).
    """

    def __init__(
        self,
        parties: int,
        *,
        name: str = "end",
        config: BarrierConfig | None = None,
        timeout: float | None = None,
        wait: bool | None = None,
        finish_job: bool = True,
    ) -> None:
        super().__init__()
        self._spec = BarrierSpec(parties, name, timeout)
        self.parties = self._spec.parties
        self.name = self._spec.name
        self._config = config
        self._wait = wait
        self._finish_job = finish_job
        self._arrived = False
        self.complete = False
        self.missing: tuple[int, ...] = ()

    def on_train_end(self, logs: Mapping[str, Any] | None = None) -> None:
        if self._arrived:
            return
        self._arrived = True
        if self._config is None:
            self._config = BarrierConfig.from_env()
        arrival = arrive_at_end(
            self._config,
            self._spec,
            log,
            wait=self._wait,
            finish=self._finish_job,
            final_step=self._optimizer_step,
        )
        self.complete, self.missing = arrival.complete, arrival.missing

    def _optimizer_step(self) -> int:
        return int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))


def barrier_callbacks(
    config: BarrierConfig,
    parties: int,
    *,
    start: bool,
    end: bool,
    timeout: float | None = None,
) -> tuple[list[Any], list[Any]]:
    """The start and end barrier callbacks that ``callbacks_from_env`` puts around the others."""
    return around(StartBarrierCallback, EndBarrierCallback, config, parties, start, end, timeout)
