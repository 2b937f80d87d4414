"""The barrier's default settings, and where a run id or a task id may come from
(shared by ``settings`` and ``environment``, so that neither needs the other's internals).
"""

from __future__ import annotations

from typing import Literal, get_args

Role = Literal["chief", "worker"]
OnTimeout = Literal["raise", "proceed"]
RunIdSource = Literal["STEPBARRIER_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"]
"""Where ``from_env`` looks for the run id, first to last (docs/configuration.md#run-id)."""
TaskIdSource = Literal[
    "STEPBARRIER_TASK_ID", "STEPBARRIER_ROLE", "TF_CONFIG", "RANK", "SLURM_PROCID"
]
"""Where ``from_env`` looks for the task id, first to last
(docs/configuration.md#task-id-and-role)."""

RUN_ID_SOURCES: tuple[RunIdSource, ...] = get_args(RunIdSource)
TASK_ID_SOURCES: tuple[TaskIdSource, ...] = get_args(TaskIdSource)

LAUNCHER_RANKS: dict[TaskIdSource, str] = {
    "RANK": "torchrun's global rank",
    "SLURM_PROCID": "the rank of the Slurm task",
}
"""The launchers' rank variables, in the order ``from_env`` reads them, for messages."""
LAUNCHER_RUN_IDS: dict[RunIdSource, str] = {
    "TORCHELASTIC_RUN_ID": "torchrun's rendezvous id",
    "SLURM_JOB_ID": "the Slurm job",
}
"""The launchers' run id variables and what each is, for messages."""

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
"""Where Redis is when ``STEPBARRIER_REDIS_URL`` is unset."""
DEFAULT_STALL_TIMEOUT = 600.0
"""Seconds without a chief heartbeat after which a waiter gives up."""
DEFAULT_HEARTBEAT = 1.0
"""Seconds between the chief's heartbeats."""
FALLBACK_INTERVAL = 5.0
"""Seconds between a waiter's re-reads of the stored step (pub/sub is only a hint)."""

LAUNCHER_VARIABLES: tuple[str, ...] = (*LAUNCHER_RUN_IDS, "SLURM_RESTART_COUNT", *LAUNCHER_RANKS)
"""The launchers' variables ``from_env`` reads (for tests that must see no launcher)."""
