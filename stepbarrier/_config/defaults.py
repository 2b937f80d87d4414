"""The barrier's default settings, and the variables the settings are read from.

Shared by ``stepbarrier._config.settings`` (which builds a ``BarrierConfig``) and
``stepbarrier._config.environment`` (which reads the variables), so that neither needs
the other's internals.
"""

from __future__ import annotations

from typing import Literal

Role = Literal["chief", "worker"]
OnTimeout = Literal["raise", "proceed"]
RunIdSource = Literal["STEPBARRIER_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"]
"""The variable a run id came from (``BarrierConfig.run_id_source``)."""

TaskIdSource = Literal[
    "STEPBARRIER_TASK_ID", "STEPBARRIER_ROLE", "TF_CONFIG", "RANK", "SLURM_PROCID"
]
"""Where a task id came from (``BarrierConfig.task_id_source``): ``STEPBARRIER_ROLE``
is ``chief`` (task 0), ``RANK`` is torchrun's rank, ``SLURM_PROCID`` Slurm's."""

TASK_ID_SOURCES: tuple[TaskIdSource, ...] = (
    "STEPBARRIER_TASK_ID",
    "STEPBARRIER_ROLE",
    "TF_CONFIG",
    "RANK",
    "SLURM_PROCID",
)
"""Where ``from_env`` looks for the task id, first to last: the first one that
gives it wins (docs/configuration.md#task-id-and-role)."""

LAUNCHER_RANKS: dict[TaskIdSource, str] = {
    "RANK": "torchrun's global rank",
    "SLURM_PROCID": "the rank of the Slurm task",
}
"""The launchers' rank variables, in the order ``from_env`` reads them, and what
each is, for messages (``RANK`` only counts with ``TORCHELASTIC_RUN_ID`` set)."""

RUN_ID_SOURCES: tuple[RunIdSource, ...] = (
    "STEPBARRIER_RUN_ID",
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
)
"""Where ``from_env`` looks for the run id, first to last: the first one set
wins (docs/configuration.md#run-id)."""

DEFAULT_REDIS_URL = "redis://localhost:6379/0"
"""Where Redis is when ``STEPBARRIER_REDIS_URL`` is unset."""
DEFAULT_STALL_TIMEOUT = 600.0
"""Seconds without a chief heartbeat after which a waiter gives up."""
DEFAULT_HEARTBEAT = 1.0
"""Seconds between the chief's heartbeats."""
DEFAULT_KEY_TTL = 7 * 24 * 3600
"""Seconds a job's keys live after the chief's last write."""
DEFAULT_SENTINEL_SERVICE = "mymaster"
"""Sentinel service name when only ``STEPBARRIER_SENTINELS`` is set."""
DEFAULT_DONE_TTL = 3600
"""Seconds a finished job's keys live after the chief marks it done. A rerun
under the same job name needs no wait (its chief's newer generation replaces
the finished state); the record must outlive the longest a worker may be cut
off and still be waiting, so the chief keeps it at least its stall timeout
plus a minute, whatever this says (docs/protocol.md#done)."""
DEFAULT_NO_CHIEF_WARNING = 20.0
"""Seconds a wait goes on without any write of its job's chief seen before it
warns that the chief may not publish (or publishes under another job or Redis)."""
MAX_REPORT_EVERY = 1_000_000
"""The most runs between two reports of a TensorFlow worker's step (``report_every``)."""
FALLBACK_INTERVAL = 5.0
"""Seconds between a waiter's re-reads of the stored step (pub/sub is only a hint)."""

#: Every variable ``from_env`` reads, for documentation and tooling.
ENVIRONMENT_VARIABLES: tuple[str, ...] = (
    "STEPBARRIER_REDIS_URL",
    "STEPBARRIER_REDIS_USERNAME",
    "STEPBARRIER_REDIS_PASSWORD",
    "STEPBARRIER_REDIS_PASSWORD_FILE",
    "STEPBARRIER_TLS_CA_FILE",
    "STEPBARRIER_TLS_CERT_FILE",
    "STEPBARRIER_TLS_KEY_FILE",
    "STEPBARRIER_TLS_INSECURE",
    "STEPBARRIER_SENTINELS",
    "STEPBARRIER_SENTINEL_SERVICE",
    "STEPBARRIER_JOB",
    "STEPBARRIER_ROLE",
    "STEPBARRIER_TASK_ID",
    "STEPBARRIER_WAIT_UNTIL_STEP",
    "STEPBARRIER_SCHEDULE",
    "STEPBARRIER_TIMEOUT",
    "STEPBARRIER_STALL_TIMEOUT",
    "STEPBARRIER_ON_TIMEOUT",
    "STEPBARRIER_HEARTBEAT",
    "STEPBARRIER_KEY_TTL",
    "STEPBARRIER_RUN_ID",
    "STEPBARRIER_DONE_TTL",
    "STEPBARRIER_PROGRESS_TIMEOUT",
    "STEPBARRIER_NO_CHIEF_WARNING",
    "STEPBARRIER_USE_EVAL",
    "STEPBARRIER_REDIS_CLUSTER",
    "STEPBARRIER_REPORT_EVERY",
    "STEPBARRIER_REPORT_PROGRESS",
)

#: The launchers' variables ``from_env`` reads when no ``STEPBARRIER_*``
#: variable (nor ``TF_CONFIG``) says it: for the run id
#: (docs/configuration.md#run-id) torchrun's rendezvous id, the Slurm job and
#: how often Slurm requeued it; for the task id and role
#: (docs/configuration.md#task-id-and-role) torchrun's ``RANK`` (only with
#: ``TORCHELASTIC_RUN_ID`` set) and Slurm's ``SLURM_PROCID``. A test or a tool
#: that must see no launcher unsets these along with ``STEPBARRIER_*``.
LAUNCHER_VARIABLES: tuple[str, ...] = (
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
    "RANK",
    "SLURM_PROCID",
)
