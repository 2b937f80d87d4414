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
)

#: The launchers' variables ``from_env`` reads for the run id when
#: ``STEPBARRIER_RUN_ID`` is not set (docs/configuration.md#run-id): torchrun's
#: rendezvous id, the Slurm job and how often Slurm requeued it. A test or a
#: tool that must see no run id unsets these along with ``STEPBARRIER_*``.
LAUNCHER_VARIABLES: tuple[str, ...] = (
    "TORCHELASTIC_RUN_ID",
    "SLURM_JOB_ID",
    "SLURM_RESTART_COUNT",
)
