"""The barrier's settings: ``BarrierConfig``, its defaults and its validation.

Every host (chief, worker, operator shell) is configured through
``STEPBARRIER_*`` variables, falling back to TensorFlow's ``TF_CONFIG`` for the
role and task id. ``stepbarrier._config.environment``, the only code that reads them,
turns them into checked values, and ``BarrierConfig.from_env`` builds a frozen
``BarrierConfig`` of them; everything else in the library takes that object.
The defaults live in ``stepbarrier._config.defaults``, the checks of single settings in
``stepbarrier._config.checks``.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from functools import cached_property
from urllib.parse import urlsplit

from stepbarrier._config.checks import (
    check_int,
    check_seconds,
    check_url,
    mask_url,
    validate_job,
    validate_run_id,
)
from stepbarrier._config.defaults import (
    DEFAULT_DONE_TTL,
    DEFAULT_HEARTBEAT,
    DEFAULT_KEY_TTL,
    DEFAULT_NO_CHIEF_WARNING,
    DEFAULT_REDIS_URL,
    DEFAULT_SENTINEL_SERVICE,
    DEFAULT_STALL_TIMEOUT,
    FALLBACK_INTERVAL,
    LAUNCHER_RANKS,
    MAX_REPORT_EVERY,
    RUN_ID_SOURCES,
    TASK_ID_SOURCES,
    OnTimeout,
    Role,
    RunIdSource,
    TaskIdSource,
)
from stepbarrier._config.environment import settings_from_env
from stepbarrier._config.schedule import schedule_wait_until_step, validate_schedule
from stepbarrier._protocol.freshness import FENCE, MAX_HEARTBEAT
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.wire import MAX_STEP
from stepbarrier.errors import ConfigurationError

log = logging.getLogger("stepbarrier.config")


@dataclass(frozen=True)
class BarrierConfig:
    """Settings for a chief, a worker or an operator tool of one job.

    Build it directly in code, or from the environment with ``from_env``.
    Unset optional settings are ``None``. ``run_id_source`` says which variable
    ``run_id`` came from (docs/configuration.md#run-id): ``"STEPBARRIER_RUN_ID"``,
    ``"TORCHELASTIC_RUN_ID"`` or ``"SLURM_JOB_ID"``; ``None`` for a run id given
    in code, or when nothing gave one. ``"STEPBARRIER_RUN_ID"`` with ``run_id``
    ``None`` is that variable set empty: no run id, on purpose.
    ``task_id_source`` says the same of ``task_id``
    (docs/configuration.md#task-id-and-role): ``"STEPBARRIER_TASK_ID"``,
    ``"STEPBARRIER_ROLE"`` (the chief, task 0), ``"TF_CONFIG"``, ``"RANK"``
    (torchrun's) or ``"SLURM_PROCID"``; ``None`` when given in code or unknown.

    Examples:
        >>> cfg = BarrierConfig(job="mnist-42", redis_url="redis://redis:6379/0")
        >>> cfg.keys.channel
        'stepbarrier:{mnist-42}:steps'
    """

    job: str
    redis_url: str = DEFAULT_REDIS_URL
    redis_username: str | None = None
    redis_password: str | None = field(default=None, repr=False)
    tls_ca_file: str | None = None
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    sentinels: tuple[tuple[str, int], ...] = ()
    sentinel_service: str = DEFAULT_SENTINEL_SERVICE
    role: Role | None = None
    task_id: int | None = None
    wait_until_step: int | None = None
    schedule: str | None = None
    timeout: float | None = None
    stall_timeout: float = DEFAULT_STALL_TIMEOUT
    on_timeout: OnTimeout = "raise"
    heartbeat: float = DEFAULT_HEARTBEAT
    key_ttl: int = DEFAULT_KEY_TTL
    fallback_interval: float = FALLBACK_INTERVAL
    run_id: str | None = None
    done_ttl: int = DEFAULT_DONE_TTL
    progress_timeout: float | None = None
    no_chief_warning: float = DEFAULT_NO_CHIEF_WARNING
    use_eval: bool = False
    redis_cluster: bool = False
    tls_insecure: bool = False
    run_id_source: RunIdSource | None = None
    task_id_source: TaskIdSource | None = None
    # GlobalStepWaiterHook's report_every when the hook is given none: 0 never
    # reports; None leaves the hook's default (STEPBARRIER_REPORT_EVERY)
    report_every: int | None = None
    # the TF hooks and the Keras callbacks report each task's own step
    # (ProgressReporter; STEPBARRIER_REPORT_PROGRESS=0 turns it off)
    report_progress: bool = True

    def __post_init__(self) -> None:
        validate_job(self.job, variable="job")
        if self.run_id is not None:
            validate_run_id(self.run_id, variable="run_id")
        _check_run_id_source(self.run_id, self.run_id_source)
        check_int(self.done_ttl, "done_ttl", low=1, high=10 * 365 * 24 * 3600)
        if self.progress_timeout is not None:
            check_seconds(self.progress_timeout, "progress_timeout")
        check_seconds(self.no_chief_warning, "no_chief_warning")
        if self.report_every is not None:
            check_int(self.report_every, "report_every", low=0, high=MAX_REPORT_EVERY)
        if not isinstance(self.report_progress, bool):
            raise ConfigurationError(
                f"report_progress must be True or False, got {self.report_progress!r}",
                variable="report_progress",
            )
        if not isinstance(self.use_eval, bool):
            raise ConfigurationError(
                f"use_eval must be True or False, got {self.use_eval!r}", variable="use_eval"
            )
        if not isinstance(self.redis_cluster, bool):
            raise ConfigurationError(
                f"redis_cluster must be True or False, got {self.redis_cluster!r}",
                variable="redis_cluster",
            )
        if self.redis_cluster:
            _check_cluster(self)
        if not isinstance(self.tls_insecure, bool):
            raise ConfigurationError(
                f"tls_insecure must be True or False, got {self.tls_insecure!r}",
                variable="tls_insecure",
            )
        # a rediss:// URL weakens TLS (?ssl_cert_reqs=none) only under tls_insecure
        check_url(self.redis_url, "redis_url", tls_insecure=self.tls_insecure)
        if self.role not in (None, "chief", "worker"):
            raise ConfigurationError(
                f"role must be 'chief' or 'worker', got {self.role!r}", variable="role"
            )
        if self.task_id is not None:
            check_int(self.task_id, "task_id", low=0, high=1_000_000)
        _check_task_id_source(self.task_id, self.task_id_source)
        if self.wait_until_step is not None:
            check_int(self.wait_until_step, "wait_until_step", low=0, high=MAX_STEP)
        if self.schedule is not None:
            object.__setattr__(self, "schedule", validate_schedule(self.schedule))
        if self.timeout is not None:
            check_seconds(self.timeout, "timeout")
        check_seconds(self.stall_timeout, "stall_timeout")
        check_seconds(self.heartbeat, "heartbeat")
        if self.heartbeat > MAX_HEARTBEAT:
            # FENCE is one value for the whole job: a chief must write three
            # times within it, whatever another process's heartbeat
            raise ConfigurationError(
                f"heartbeat must be at most {MAX_HEARTBEAT:g} s (a third of the protocol's "
                f"{FENCE:g} s fence, the same for every process of a job), got "
                f"{self.heartbeat!r}",
                variable="heartbeat",
            )
        check_seconds(self.fallback_interval, "fallback_interval", high=5.0)
        check_int(self.key_ttl, "key_ttl", low=60, high=10 * 365 * 24 * 3600)
        if self.on_timeout not in ("raise", "proceed"):
            raise ConfigurationError(
                f"on_timeout must be 'raise' or 'proceed', got {self.on_timeout!r}",
                variable="on_timeout",
            )
        if self.stall_timeout <= self.heartbeat:
            raise ConfigurationError(
                f"stall_timeout ({self.stall_timeout:g} s) must be longer than the "
                f"heartbeat ({self.heartbeat:g} s)",
                variable="stall_timeout",
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigurationError(
                "tls_cert_file and tls_key_file go together: set both or neither",
                variable="tls_cert_file",
            )

    def __repr__(self) -> str:
        # never the password, whether it came in the URL or on its own
        shown = []
        for item in fields(self):
            value = getattr(self, item.name)
            if item.name == "redis_url":
                value = self.safe_url
            elif item.name == "redis_password" and value is not None:
                value = "***"
            shown.append(f"{item.name}={value!r}")
        return f"BarrierConfig({', '.join(shown)})"

    @cached_property
    def keys(self) -> JobKeys:
        """The Redis key and channel names of this job."""
        # made once: every write and read of the job names its keys
        return JobKeys.for_job(self.job)

    @property
    def safe_url(self) -> str:
        """The Redis URL with any password masked, for messages and logs."""
        return mask_url(self.redis_url)

    def describe_run_id(self) -> str:
        """The run id in force and where it came from, for logs, ``status`` and ``doctor``.

        Examples:
            >>> config = BarrierConfig(job="j", run_id="slurm-81", run_id_source="SLURM_JOB_ID")
            >>> config.describe_run_id()
            'slurm-81 (from SLURM_JOB_ID, the Slurm job)'
            >>> BarrierConfig(job="j", run_id="r-1").describe_run_id()
            'r-1 (given in code)'
        """
        return describe_run_id(self.run_id, self.run_id_source)

    def describe_task(self) -> str:
        """The task id and role in force, and where the task id came from, for logs
        and ``doctor``.

        Examples:
            >>> config = BarrierConfig(job="j", role="worker", task_id=2, task_id_source="RANK")
            >>> config.describe_task()
            "task 2, worker (from RANK, torchrun's global rank)"
            >>> BarrierConfig(job="j", role="chief", task_id=0).describe_task()
            'task 0, chief (given in code)'
        """
        return describe_task(self.role, self.task_id, self.task_id_source)

    def resolved_wait_until_step(self) -> int:
        """The step this host waits for: the explicit value, else its schedule.

        Raises:
            ConfigurationError: Neither is set, or a schedule needs a task id.
        """
        if self.wait_until_step is not None:
            return self.wait_until_step
        if self.schedule is None:
            raise ConfigurationError(
                "set STEPBARRIER_WAIT_UNTIL_STEP or STEPBARRIER_SCHEDULE to say which "
                "step this worker waits for",
                variable="STEPBARRIER_WAIT_UNTIL_STEP",
            )
        if self.task_id is None:
            raise ConfigurationError(
                f"schedule {self.schedule!r} needs a task id: set STEPBARRIER_TASK_ID or "
                "TF_CONFIG, or start the task with torchrun or srun (their rank is its task id)",
                variable="STEPBARRIER_TASK_ID",
            )
        return schedule_wait_until_step(self.task_id, self.schedule)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> BarrierConfig:
        """Build the configuration from ``STEPBARRIER_*`` variables and ``TF_CONFIG``.

        Args:
            environ: The variables to read; ``os.environ`` when ``None``.

        Raises:
            ConfigurationError: A variable is missing or invalid; the message names
                it and says what was expected (never its value if it is a secret).
        """
        return config_from_env(os.environ if environ is None else environ)


def _check_cluster(config: BarrierConfig) -> None:
    variable = "STEPBARRIER_REDIS_CLUSTER"
    if config.sentinels:
        raise ConfigurationError(
            "STEPBARRIER_REDIS_CLUSTER and STEPBARRIER_SENTINELS do not go together: a "
            "Redis Cluster fails over by itself; set one or the other",
            variable=variable,
        )
    parts = urlsplit(config.redis_url)
    if parts.scheme not in ("redis", "rediss"):
        raise ConfigurationError(
            "STEPBARRIER_REDIS_CLUSTER needs a redis:// or rediss:// STEPBARRIER_REDIS_URL "
            f"naming one node of the cluster, got {mask_url(config.redis_url)}",
            variable="STEPBARRIER_REDIS_URL",
        )
    if parts.path.lstrip("/") not in ("", "0"):
        raise ConfigurationError(
            "a Redis Cluster has only database 0: STEPBARRIER_REDIS_URL must end in /0 or "
            f"name no database, got {mask_url(config.redis_url)}",
            variable="STEPBARRIER_REDIS_URL",
        )


def config_from_env(env: Mapping[str, str]) -> BarrierConfig:
    """The configuration that ``env`` (``STEPBARRIER_*``, ``TF_CONFIG`` and the
    launchers' run ids) describes. The first time a process reads a job's run
    id (and whenever it differs from the last one logged), one INFO line says
    which run id is in force and where it came from.

    Raises:
        ConfigurationError: A variable is missing or invalid; the message names it.
    """
    config = BarrierConfig(**settings_from_env(env))
    _log_run_id(config)
    return config


def _check_source(name: str, source: object, sources: tuple[str, ...]) -> None:
    """``source`` is ``None`` or one of ``sources`` (``name`` is ``run_id`` or ``task_id``)."""
    if source is not None and source not in sources:
        raise ConfigurationError(
            f"{name}_source must be None or one of {', '.join(sources)} (the variable the "
            f"{name.replace('_', ' ')} came from), got {str(source)[:80]!r}",
            variable=f"{name}_source",
        )


def _check_run_id_source(run_id: str | None, source: object) -> None:
    _check_source("run_id", source, RUN_ID_SOURCES)
    if run_id is None and source not in (None, "STEPBARRIER_RUN_ID"):
        # only STEPBARRIER_RUN_ID can say "no run id" (set empty); a launcher's
        # variable always gives one
        raise ConfigurationError(
            f"run_id_source {source} names where the run id came from, but run_id is None: "
            "give the run id too, or no run_id_source",
            variable="run_id_source",
        )


def _check_task_id_source(task_id: int | None, source: object) -> None:
    _check_source("task_id", source, TASK_ID_SOURCES)
    if task_id is None and source is not None:
        raise ConfigurationError(
            f"task_id_source {source} names where the task id came from, but task_id is "
            "None: give the task id too, or no task_id_source",
            variable="task_id_source",
        )


def describe_task(role: Role | None, task_id: int | None, source: TaskIdSource | None) -> str:
    """The task id, role and where the task id came from, in words: ``"task 2, worker
    (from SLURM_PROCID, the rank of the Slurm task)"``."""
    who = role or "no role"
    if task_id is None:
        return (
            f"no task id, {who} (no STEPBARRIER_TASK_ID, no task in TF_CONFIG, no RANK "
            "under torchrun, no SLURM_PROCID)"
        )
    if source is None:
        return f"task {task_id}, {who} (given in code)"
    if source in LAUNCHER_RANKS:
        return f"task {task_id}, {who} (from {source}, {LAUNCHER_RANKS[source]})"
    if source == "STEPBARRIER_ROLE":
        return f"task {task_id}, {who} (STEPBARRIER_ROLE=chief: the chief is task 0)"
    return f"task {task_id}, {who} (from {source})"


_LAUNCHERS = {
    "TORCHELASTIC_RUN_ID": "torchrun's rendezvous id",
    "SLURM_JOB_ID": "the Slurm job",
}


def describe_run_id(run_id: str | None, source: RunIdSource | None) -> str:
    """``run_id`` and where it came from, in words: ``"slurm-81 (from SLURM_JOB_ID, the
    Slurm job)"``, ``"none (...)"`` saying why there is none."""
    if run_id is None and source == "STEPBARRIER_RUN_ID":
        return "none (STEPBARRIER_RUN_ID is set empty, so no launcher's id is used either)"
    if run_id is None:
        return f"none (no {', '.join(RUN_ID_SOURCES[:-1])} or {RUN_ID_SOURCES[-1]} is set)"
    if source is None:
        return f"{run_id} (given in code)"
    if source in _LAUNCHERS:
        return f"{run_id} (from {source}, {_LAUNCHERS[source]})"
    return f"{run_id} (from {source})"


_logged_lock = threading.Lock()
_logged: dict[str, tuple[str | None, RunIdSource | None, int | None]] = {}
_MAX_LOGGED_JOBS = 64


def _log_run_id(config: BarrierConfig) -> None:
    """One INFO line per job and run id: hooks, callbacks and waiters of one
    process each read the environment, and one line is enough to tell which run
    the process belongs to (a new one when it changes); a second when a
    launcher's rank gave the task id, saying the task and role."""
    launched = config.task_id_source in LAUNCHER_RANKS
    shown = (config.run_id, config.run_id_source, config.task_id if launched else None)
    with _logged_lock:
        if _logged.get(config.job) == shown:
            return
        if len(_logged) >= _MAX_LOGGED_JOBS:
            _logged.clear()  # bounded, whatever a process reads; a line again costs nothing
        _logged[config.job] = shown
    log.info("job %s: run id %s", config.job, config.describe_run_id())
    if launched:
        # the role and task id a launcher gave: which rank is the chief is no
        # longer written anywhere in the job's own settings
        log.info("job %s: %s", config.job, config.describe_task())
