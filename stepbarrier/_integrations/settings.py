"""Which hooks or callbacks a host needs, from its environment (no framework here):
the one choice of ``hooks_from_env`` and ``callbacks_from_env``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stepbarrier._config.settings import BarrierConfig, host_from_env


def from_env(
    environ: Mapping[str, str] | None,
    *,
    publisher: Callable[[BarrierConfig], Any],
    waiter: Callable[[int, BarrierConfig], Any],
    start: Callable[..., Any],
    end: Callable[..., Any],
    start_barrier: bool,
    end_barrier: bool,
    parties: int | None,
    barrier_timeout: float | None,
) -> list[Any]:
    """This host's hooks or callbacks (see ``hooks_from_env``), made by ``publisher``
    (the chief's), ``waiter`` (a worker's) and the barriers' ``start`` and ``end``."""
    config, count = host_from_env(environ, parties, barriers=start_barrier or end_barrier)
    if config is None:
        return []  # a ps or evaluator task takes no part in the barrier
    before = [start(count, config=config, timeout=barrier_timeout)] if start_barrier else []
    after = [end(count, config=config, timeout=barrier_timeout)] if end_barrier else []
    if config.role == "chief":
        return [*before, publisher(config), *after]
    if start_barrier and config.wait_until_step is None and config.schedule is None:
        return [*before, *after]  # the start barrier is this worker's start
    return [*before, waiter(config.resolved_wait_until_step(), config), *after]
