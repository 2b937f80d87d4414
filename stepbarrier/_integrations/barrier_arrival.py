"""One arrival at a named barrier as the TF hooks and Keras callbacks make it.

Both frameworks' start and end barriers do the same thing around
``Barrier.arrive``: a timeout raises ``BarrierTimeout`` unless the job says
``STEPBARRIER_ON_TIMEOUT=proceed``, in which case the task logs who is missing
and goes on. This module holds that rule once, with no framework import.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from stepbarrier._barriers.barrier import Barrier
from stepbarrier._barriers.finish import finish_job
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.barrier_record import validate_barrier_name, validate_parties
from stepbarrier.errors import BarrierTimeout


@dataclass(frozen=True)
class BarrierSpec:
    """Which barrier a hook or callback arrives at, validated when it is made.

    Args:
        parties: The chief and the workers: task ids ``0..parties-1``.
        name: The barrier's name (one per run).
        timeout: Seconds before ``BarrierTimeout``; ``None`` uses
            ``STEPBARRIER_TIMEOUT`` (the stall timeout holds in any case).
    """

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
    """Arrive at ``spec``'s barrier (and wait for every party if ``wait``).

    Raises:
        BarrierTimeout: The barrier did not complete in time and the job's
            ``on_timeout`` is ``"raise"``. Under ``"proceed"`` the timeout is
            logged (``"<reason>; <then> as STEPBARRIER_ON_TIMEOUT=proceed says"``)
            and returned as an incomplete ``Arrival`` instead.
    """
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
    """Arrive at the end barrier; the chief waits and, once complete, finishes the job.

    Args:
        wait: Whether this task waits for the others; ``None``: only the chief
            (task 0) does, a worker arrives and goes.
        finish: Whether the chief marks the job done (``finish_job``) once
            every party has arrived.
        final_step: Reads the global step to finish at, after the wait (the
            workers may have moved it meanwhile); ``None`` when there is none.
    """
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


class _BarrierParty(Protocol):
    def __init__(
        self, parties: int, *, config: BarrierConfig | None, timeout: float | None
    ) -> None: ...


def around(
    start_type: type[_BarrierParty],
    end_type: type[_BarrierParty],
    config: BarrierConfig,
    parties: int,
    start: bool,
    end: bool,
    timeout: float | None,
) -> tuple[list[Any], list[Any]]:
    """The start barrier to put before a framework's other hooks or callbacks,
    and the end barrier to put after them (each list empty when not asked for)."""
    before = [start_type(parties, config=config, timeout=timeout)] if start else []
    after = [end_type(parties, config=config, timeout=timeout)] if end else []
    return before, after
