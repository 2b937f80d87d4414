"""Which hooks or callbacks a host needs, from its environment (no framework here):
the one choice of ``hooks_from_env`` and ``callbacks_from_env``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from stepbarrier._config.environment import barrier_parties_from_env, barrier_role, task_from_env
from stepbarrier._config.settings import BarrierConfig, config_from_env


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
    task = task_from_env(environ)  # TF_CONFIG is read once, the role first
    if barrier_role(task) is None:
        return []  # a ps or evaluator task takes no part in the barrier, and reads no more
    config = config_from_env(environ, task)
    count = None
    if start_barrier or end_barrier:
        count = barrier_parties_from_env(environ, parties, tf_config=task.tf_config)
    before = [start(count, config=config, timeout=barrier_timeout)] if start_barrier else []
    after = [end(count, config=config, timeout=barrier_timeout)] if end_barrier else []
    if config.role == "chief":
        return [*before, publisher(config), *after]
    if start_barrier and config.wait_until_step is None and config.schedule is None:
        return [*before, *after]  # the start barrier is this worker's start
    return [*before, waiter(config.resolved_wait_until_step(), config), *after]
