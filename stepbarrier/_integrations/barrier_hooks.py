"""TensorFlow session hooks for the start and the end of training: named barriers.

Instead of sleeping and hoping (TensorFlow issues #21492, #32549, #51892):
``StartBarrierHook`` holds every task before its first step until the chief
and every worker are there, and ``EndBarrierHook`` holds the chief in ``end()``
until every worker has finished, so that the chief (whose exit often ends the
whole job) never leaves first. ``hooks_from_env`` adds both:

```python
hooks = stepbarrier.tf_hooks.hooks_from_env(start_barrier=True, end_barrier=True)
```

or, by hand, on every task (the parties are the chief and the workers):

```python
hooks = [StartBarrierHook(parties=3), ..., EndBarrierHook(parties=3, timeout=600)]
```

A worker arrives at the end barrier without waiting; the chief waits, and
once every worker has arrived it marks the job done (``finish_job``; see
``stepbarrier._barriers.finish``). ``end()`` is called only when training ends
normally, so a worker that crashed never arrives: the chief's wait ends with
``BarrierTimeout`` naming it (or, under ``STEPBARRIER_ON_TIMEOUT=proceed``, a
warning).
"""

from __future__ import annotations

import logging
import operator
import time
from typing import Any

try:
    import tensorflow as tf
except ImportError as exc:  # pragma: no cover - depends on the installation
    raise ImportError(
        "stepbarrier._integrations.barrier_hooks needs TensorFlow: pip install "
        f"'stepbarrier[tensorflow]' ({exc})",
        name=exc.name,
    ) from exc

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._integrations.barrier_arrival import (
    BarrierSpec,
    around,
    arrive,
    arrive_at_end,
    check_task,
)

log = logging.getLogger("stepbarrier.tf_hooks")


class StartBarrierHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Holds the task before its first step until every party has arrived.

    Put it before a ``GlobalStepWaiterHook`` in the same list (hooks run in
    order): the chief, also at the barrier, takes no step before every worker
    is there. A session that ``MonitoredSession`` recreates does not wait again.

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

    def __init__(
        self,
        parties: int,
        *,
        name: str = "start",
        config: BarrierConfig | None = None,
        timeout: float | None = None,
    ) -> None:
        self._spec = BarrierSpec(parties, name, timeout)
        self.parties = self._spec.parties
        self.name = self._spec.name
        self._config = config
        self.released_at: float | None = None

    def begin(self) -> None:
        if self._config is None:
            self._config = BarrierConfig.from_env()  # a bad setting fails before the session
        check_task(self._config, self._spec)

    def before_run(self, run_context: Any) -> Any:
        if self.released_at is None:
            assert self._config is not None, "begin() was not called"
            log.info("Waiting at barrier %r for all %d tasks.", self.name, self.parties)
            arrive(self._config, self._spec, log, then="starting")
            self.released_at = time.time()
        return None


class EndBarrierHook(tf.compat.v1.train.SessionRunHook):  # type: ignore[misc]
    """Arrives at the end barrier in ``end()``; the chief waits there for every worker.

    On the chief put it after ``GlobalStepPublisherHook`` (or in ``hooks`` when
    the publisher is in ``chief_only_hooks``): the publisher's ``end()`` runs
    first, then the chief holds here.

    Args:
        parties: The chief and the workers: task ids ``0..parties-1``.
        name: The barrier's name (one per run).
        config: The job's settings; ``None`` reads ``BarrierConfig.from_env()``
            in ``begin()``.
        timeout: Seconds the chief waits before ``BarrierTimeout``; ``None``
            uses ``STEPBARRIER_TIMEOUT`` (the stall timeout holds in any case).
        last_step: Arrive only at the end of a session at or above this global
            step (for a chief that trains in several sessions); ``None``: at
            the first ``end()``.
        wait: Whether this task waits for the others; ``None``: only the chief
            (task 0) does, a worker arrives and goes.
        finish_job: The chief marks the job done once every worker has arrived
            (see ``stepbarrier._barriers.finish``).

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
        last_step: int | None = None,
        wait: bool | None = None,
        finish_job: bool = True,
    ) -> None:
        self._spec = BarrierSpec(parties, name, timeout)
        self.parties = self._spec.parties
        self.name = self._spec.name
        self._config = config
        self._last_step = None if last_step is None else operator.index(last_step)
        self._wait = wait
        self._finish_job = finish_job
        self._global_step: Any = None
        self._arrived = False
        self.complete = False
        self.missing: tuple[int, ...] = ()

    def begin(self) -> None:
        if self._config is None:
            self._config = BarrierConfig.from_env()
        check_task(self._config, self._spec)
        self._global_step = tf.compat.v1.train.get_global_step()

    def end(self, session: Any) -> None:
        assert self._config is not None, "begin() was not called"
        if self._arrived:
            return
        if self._last_step is not None:
            step = self._read_step(session)
            if step is None or step < self._last_step:
                return  # a session that ends before the last step: not the end of training
        self._arrived = True
        arrival = arrive_at_end(
            self._config,
            self._spec,
            log,
            wait=self._wait,
            finish=self._finish_job,
            final_step=lambda: self._read_step(session),
        )
        self.complete, self.missing = arrival.complete, arrival.missing

    def _read_step(self, session: Any) -> int | None:
        if self._global_step is None:
            return None
        try:
            return int(session.run(self._global_step))
        except Exception as exc:  # the session may be unusable by now
            log.warning("could not read the global step: %s", exc)
            return None


def barrier_hooks(
    config: BarrierConfig,
    parties: int,
    *,
    start: bool,
    end: bool,
    timeout: float | None = None,
) -> tuple[list[Any], list[Any]]:
    """The start and end barrier hooks that ``hooks_from_env`` puts around the others."""
    return around(StartBarrierHook, EndBarrierHook, config, parties, start, end, timeout)
