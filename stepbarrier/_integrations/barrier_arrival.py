"""Start and end barriers as the TF hooks and Keras callbacks make them (no framework
here): a timeout raises ``BarrierTimeout`` unless the job says
``STEPBARRIER_ON_TIMEOUT=proceed``; then the task logs who is missing and goes on.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from stepbarrier._barriers.barrier import Barrier
from stepbarrier._barriers.finish import finish_job
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.barrier_record import validate_barrier_name, validate_parties
from stepbarrier.errors import BarrierTimeout


@dataclass(frozen=True)
class BarrierSpec:
    """Which barrier a hook or callback arrives at, validated when it is made."""

    parties: int
    name: str
    timeout: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "parties", validate_parties(self.parties))
        object.__setattr__(self, "name", validate_barrier_name(self.name))


@dataclass(frozen=True)
class Arrival:
    """How an arrival ended: ``complete`` when the barrier released this task
    while waiting; ``missing`` names the absent tasks of a timeout let pass."""

    complete: bool
    missing: tuple[int, ...] = ()


def arrive(
    config: BarrierConfig,
    spec: BarrierSpec,
    log: logging.Logger,
    *,
    wait: bool = True,
    then: str = "proceeding",
) -> Arrival:
    """Arrive at ``spec``'s barrier (and wait for every party if ``wait``). A timeout
    raises ``BarrierTimeout``, or under ``on_timeout="proceed"`` is logged ("<reason>;
    <then> as STEPBARRIER_ON_TIMEOUT=proceed says") and returned as incomplete."""
    try:
        with Barrier(config, spec.name, spec.parties) as barrier:
            return Arrival(barrier.arrive(spec.timeout, wait=wait))
    except BarrierTimeout as exc:
        if config.on_timeout != "proceed":
            raise
        log.warning("%s; %s as STEPBARRIER_ON_TIMEOUT=proceed says", exc, then)
        return Arrival(False, exc.missing)


def arrive_at_end(
    config: BarrierConfig,
    spec: BarrierSpec,
    log: logging.Logger,
    *,
    wait: bool | None,
    finish: bool,
    final_step: Callable[[], int | None],
) -> Arrival:
    """Arrive at the end barrier (``wait`` and ``finish``: ``EndBarrierHook``'s ``wait``
    and ``finish_job``); once complete the chief finishes the job at ``final_step()``,
    read after the wait: the workers may have moved it meanwhile."""
    waits = config.task_id == 0 if wait is None else wait
    log.info("Arriving at barrier %r%s.", spec.name, " to wait for all" if waits else "")
    arrival = arrive(config, spec, log, wait=waits)
    if arrival.complete and waits and finish and config.task_id == 0:
        step = final_step()
        if step is None:
            log.warning("job %s: no global step to finish the job at", config.job)
        else:
            finish_job(config, step)
    return arrival


def check_task(config: BarrierConfig, spec: BarrierSpec) -> None:
    """Fail early (ConfigurationError) if ``config``'s task cannot be a party; no I/O."""
    Barrier(config, spec.name, spec.parties).close()


class _BarrierParty:
    """A start or end barrier hook or callback; ``config`` ``None`` reads
    ``BarrierConfig.from_env()`` when the framework first calls it."""

    _log: ClassVar[logging.Logger]

    def __init__(
        self, parties: int, *, name: str, config: BarrierConfig | None, timeout: float | None
    ) -> None:
        super().__init__()  # the framework's base class, next in the method order
        self._spec = BarrierSpec(parties, name, timeout)
        self.parties = self._spec.parties
        self.name = self._spec.name
        self._config = config

    def _configure(self) -> BarrierConfig:
        if self._config is None:
            self._config = BarrierConfig.from_env()  # a bad setting fails before training
        return self._config


class StartBarrier(_BarrierParty):
    """Holds the task before its first step until every party has arrived, once."""

    def __init__(
        self,
        parties: int,
        *,
        name: str = "start",
        config: BarrierConfig | None = None,
        timeout: float | None = None,
    ) -> None:
        super().__init__(parties, name=name, config=config, timeout=timeout)
        self.released_at: float | None = None

    def _arrive_once(self) -> None:
        if self.released_at is None:
            config = self._configure()
            self._log.info("Waiting at barrier %r for all %d tasks.", self.name, self.parties)
            arrive(config, self._spec, self._log, then="starting")
            self.released_at = time.time()


class EndBarrier(_BarrierParty):
    """Arrives at the end barrier once; the chief waits there for every worker."""

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
        super().__init__(parties, name=name, config=config, timeout=timeout)
        self._wait = wait
        self._finish_job = finish_job
        self._arrived = False
        self.complete = False
        self.missing: tuple[int, ...] = ()

    def _arrive_once(self, final_step: Callable[[], int | None]) -> None:
        if self._arrived:
            return
        self._arrived = True
        arrival = arrive_at_end(
            self._configure(),
            self._spec,
            self._log,
            wait=self._wait,
            finish=self._finish_job,
            final_step=final_step,
        )
        self.complete, self.missing = arrival.complete, arrival.missing
