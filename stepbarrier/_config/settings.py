"""The barrier's settings: ``BarrierConfig``, and the one description of each setting.

Each field says, once, its type, default, ``STEPBARRIER_*`` variable and kind
(``checks.Kind``), which checks its value from the environment and from code alike.
"""

from __future__ import annotations

import fnmatch
import logging
import os
import threading
from collections.abc import Callable, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field, fields
from functools import cached_property
from typing import Any, get_args
from urllib.parse import urlsplit

from stepbarrier._config.checks import (
    FILE,
    FLAG,
    KEY_NAME,
    TASK_ID,
    Kind,
    Sentinels,
    Validated,
    check_url,
    choice,
    integer,
    mask_url,
    seconds,
)
from stepbarrier._config.defaults import (
    DEFAULT_HEARTBEAT,
    DEFAULT_REDIS_URL,
    DEFAULT_STALL_TIMEOUT,
    FALLBACK_INTERVAL,
    LAUNCHER_RANKS,
    LAUNCHER_RUN_IDS,
    RUN_ID_SOURCES,
    TASK_ID_SOURCES,
    OnTimeout,
    Role,
    RunIdSource,
    TaskIdSource,
)
from stepbarrier._config.environment import ROLE, settings_from_env
from stepbarrier._config.schedule import schedule_wait_until_step, validate_schedule
from stepbarrier._config.tf_config import HostTask
from stepbarrier._protocol.freshness import FENCE, MAX_HEARTBEAT
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.roles import validate_jobs_pattern
from stepbarrier._protocol.wire import MAX_STEP
from stepbarrier.errors import ConfigurationError

log = logging.getLogger("stepbarrier.config")

_TEXT = Kind()
_SCHEDULE = Validated(validate=validate_schedule)
_TTL = 10 * 365 * 24 * 3600
_NAMING: ContextVar[Callable[[str], str]] = ContextVar("_NAMING", default=str)
"""How a message of ``BarrierConfig``'s check names a field (``config_from_env``: its variable)."""


def setting(default: Any, kind: Kind, variable: str | None = None) -> Any:
    """A ``BarrierConfig`` field of ``kind``, read from ``variable`` (if any)."""
    return field(default=default, metadata={"kind": kind, "variable": variable})


@dataclass(frozen=True)
class BarrierConfig:
    """Settings for a chief, a worker or an operator tool of one job.

    Build it directly in code, or from the environment with ``from_env``.
    Unset optional settings are ``None``. ``run_id_source`` and ``task_id_source``
    name the variable the run id and the task id came from (``RunIdSource``,
    ``TaskIdSource``); ``None`` when given in code or unknown. ``run_id_source``
    ``"STEPBARRIER_RUN_ID"`` with no ``run_id`` is that variable set empty: no run
    id, on purpose (docs/configuration.md#run-id).

    Examples:
        >>> cfg = BarrierConfig(job="mnist-42", redis_url="redis://redis:6379/0")
        >>> cfg.keys.channel
        'stepbarrier:{mnist-42}:steps'
    """

    job: str = field(metadata={"kind": KEY_NAME, "variable": "STEPBARRIER_JOB"})
    redis_url: str = setting(DEFAULT_REDIS_URL, _TEXT, "STEPBARRIER_REDIS_URL")
    redis_username: str | None = setting(None, _TEXT, "STEPBARRIER_REDIS_USERNAME")
    # also from STEPBARRIER_REDIS_PASSWORD_FILE
    redis_password: str | None = setting(None, _TEXT, "STEPBARRIER_REDIS_PASSWORD")
    tls_ca_file: str | None = setting(None, FILE, "STEPBARRIER_TLS_CA_FILE")
    tls_cert_file: str | None = setting(None, FILE, "STEPBARRIER_TLS_CERT_FILE")
    tls_key_file: str | None = setting(None, FILE, "STEPBARRIER_TLS_KEY_FILE")
    sentinels: tuple[tuple[str, int], ...] = setting((), Sentinels(), "STEPBARRIER_SENTINELS")
    sentinel_service: str = setting("mymaster", _TEXT, "STEPBARRIER_SENTINEL_SERVICE")
    role: Role | None = setting(None, ROLE, "STEPBARRIER_ROLE")
    task_id: int | None = setting(None, TASK_ID, "STEPBARRIER_TASK_ID")
    wait_until_step: int | None = setting(None, integer(0, MAX_STEP), "STEPBARRIER_WAIT_UNTIL_STEP")
    schedule: str | None = setting(None, _SCHEDULE, "STEPBARRIER_SCHEDULE")
    timeout: float | None = setting(None, seconds(), "STEPBARRIER_TIMEOUT")
    stall_timeout: float = setting(DEFAULT_STALL_TIMEOUT, seconds(), "STEPBARRIER_STALL_TIMEOUT")
    on_timeout: OnTimeout = setting("raise", choice(*get_args(OnTimeout)), "STEPBARRIER_ON_TIMEOUT")
    heartbeat: float = setting(DEFAULT_HEARTBEAT, seconds(), "STEPBARRIER_HEARTBEAT")
    key_ttl: int = setting(7 * 24 * 3600, integer(60, _TTL), "STEPBARRIER_KEY_TTL")
    fallback_interval: float = setting(FALLBACK_INTERVAL, seconds(5.0))
    run_id: str | None = setting(None, KEY_NAME, "STEPBARRIER_RUN_ID")
    # the chief keeps a finished job at least its stall timeout plus a minute, whatever
    # this says: a worker cut off that long still sees it done (docs/protocol.md#done)
    done_ttl: int = setting(3600, integer(1, _TTL), "STEPBARRIER_DONE_TTL")
    progress_timeout: float | None = setting(None, seconds(), "STEPBARRIER_PROGRESS_TIMEOUT")
    no_chief_warning: float = setting(20.0, seconds(), "STEPBARRIER_NO_CHIEF_WARNING")
    use_eval: bool = setting(False, FLAG, "STEPBARRIER_USE_EVAL")
    redis_cluster: bool = setting(False, FLAG, "STEPBARRIER_REDIS_CLUSTER")
    tls_insecure: bool = setting(False, FLAG, "STEPBARRIER_TLS_INSECURE")
    run_id_source: RunIdSource | None = setting(None, choice(*RUN_ID_SOURCES))
    task_id_source: TaskIdSource | None = setting(None, choice(*TASK_ID_SOURCES))
    # GlobalStepWaiterHook's report_every when the hook is given none: 0 never
    # reports; None leaves the hook's default
    report_every: int | None = setting(None, integer(0, 1_000_000), "STEPBARRIER_REPORT_EVERY")
    # the TF hooks and the Keras callbacks report each task's own step (ProgressReporter)
    report_progress: bool = setting(True, FLAG, "STEPBARRIER_REPORT_PROGRESS")
    # a chief's team on a shared Redis: the jobs pattern of its user's ACL rules; the
    # chief keeps its job in that pattern's job index, which listings read
    # (docs/operations.md#jobs-metrics-and-alerts)
    jobs_pattern: str | None = setting(
        None, Validated(validate=validate_jobs_pattern), "STEPBARRIER_JOBS_PATTERN"
    )

    def __post_init__(self) -> None:
        # the one check of every setting; a message names a field as it is called,
        # or by its variable when config_from_env builds it
        name_of = _NAMING.get()
        for item in fields(self):
            value = getattr(self, item.name)
            if value is not None or item.default is not None:  # None: an unset optional
                checked = item.metadata["kind"].check(value, name_of(item.name))
                object.__setattr__(self, item.name, checked)
        check_relations(vars(self), name_of)

    def __repr__(self) -> str:
        # never the password, whether it came in the URL or on its own
        masked = {"redis_url": self.safe_url}
        if self.redis_password is not None:
            masked["redis_password"] = "***"
        shown = (f"{f.name}={masked.get(f.name, getattr(self, f.name))!r}" for f in fields(self))
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
        run_id, source = self.run_id, self.run_id_source
        if run_id is None and source == "STEPBARRIER_RUN_ID":
            return "none (STEPBARRIER_RUN_ID is set empty, so no launcher's id is used either)"
        if run_id is None:
            return f"none (no {', '.join(RUN_ID_SOURCES[:-1])} or {RUN_ID_SOURCES[-1]} is set)"
        return f"{run_id} ({_origin(source, LAUNCHER_RUN_IDS)})"

    def describe_task(self) -> str:
        """The task id and role in force, and where the id came from, for logs and ``doctor``.

        Examples:
            >>> config = BarrierConfig(job="j", role="worker", task_id=2, task_id_source="RANK")
            >>> config.describe_task()
            "task 2, worker (from RANK, torchrun's global rank)"
            >>> BarrierConfig(job="j", role="chief", task_id=0).describe_task()
            'task 0, chief (given in code)'
        """
        role, task_id, source = self.role, self.task_id, self.task_id_source
        who = role or "no role"
        if task_id is None:
            return (
                f"no task id, {who} (no STEPBARRIER_TASK_ID, no task in TF_CONFIG, no RANK "
                "under torchrun, no SLURM_PROCID)"
            )
        if source == "STEPBARRIER_ROLE":
            return f"task {task_id}, {who} (STEPBARRIER_ROLE=chief: the chief is task 0)"
        return f"task {task_id}, {who} ({_origin(source, LAUNCHER_RANKS)})"

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
        """Build the configuration from ``environ`` (``None``: ``os.environ``): the
        ``STEPBARRIER_*`` variables, ``TF_CONFIG`` and the launchers'
        (docs/configuration.md). The run id in force is said in one INFO line.

        Raises:
            ConfigurationError: A variable is missing or invalid; the message names
                it and says what was expected (never its value if it is a secret).
        """
        return config_from_env(environ)


def _origin(source: str | None, launchers: Mapping[Any, str]) -> str:
    """Where a value came from, for ``describe_run_id`` and ``describe_task``."""
    if source is None:
        return "given in code"
    return f"from {source}, {launchers[source]}" if source in launchers else f"from {source}"


def config_from_env(
    environ: Mapping[str, str] | None, task: HostTask | None = None
) -> BarrierConfig:
    """``BarrierConfig.from_env``, with the role and task id ``task`` if it was read
    already (``hooks_from_env`` reads it first: a ps or evaluator task reads no more)."""
    env = os.environ if environ is None else environ
    values = settings_from_env(env, SETTINGS, task)
    naming = _NAMING.set(lambda name: SETTINGS[name]["variable"] if name in SETTINGS else name)
    try:
        config = BarrierConfig(**values)
    finally:
        _NAMING.reset(naming)
    _log_run_id(config)
    return config


SETTINGS = {item.name: item.metadata for item in fields(BarrierConfig) if item.metadata["variable"]}
"""The fields that variables give, each with its ``variable`` and ``kind``, in the
order ``from_env`` reads them."""
ENVIRONMENT_VARIABLES = (
    *(s["variable"] for s in SETTINGS.values()),
    "STEPBARRIER_REDIS_PASSWORD_FILE",
)
"""Every ``STEPBARRIER_*`` variable ``from_env`` reads, for documentation and tooling."""


def check_relations(values: Mapping[str, Any], name_of: Callable[[str], str]) -> None:
    """Check the settings that depend on each other; ``name_of`` says how a message
    names a field (by its variable when the values came from the environment)."""

    def refuse(message: str, field: str) -> ConfigurationError:
        return ConfigurationError(message, variable=name_of(field))

    url, heartbeat, stall = values["redis_url"], values["heartbeat"], values["stall_timeout"]
    url_name, shown = name_of("redis_url"), mask_url(url)
    # a rediss:// URL weakens TLS (?ssl_cert_reqs=none) only under tls_insecure
    check_url(url, url_name, tls_insecure=values["tls_insecure"])
    if heartbeat > MAX_HEARTBEAT:
        # FENCE is one value for the whole job: a chief must write three times within
        # it, whatever another process's heartbeat
        raise refuse(
            f"{name_of('heartbeat')} must be at most {MAX_HEARTBEAT:g} s (a third of the "
            f"protocol's {FENCE:g} s fence, the same for every process of a job), got "
            f"{heartbeat!r}",
            "heartbeat",
        )
    if stall <= heartbeat:
        raise refuse(
            f"{name_of('stall_timeout')} ({stall:g} s) must be longer than "
            f"{name_of('heartbeat')} ({heartbeat:g} s)",
            "stall_timeout",
        )
    cert, key, ca = values["tls_cert_file"], values["tls_key_file"], values["tls_ca_file"]
    if (cert is None) != (key is None):  # the message names the missing one first
        missing, given = ("tls_key_file", "tls_cert_file")[:: 1 if key is None else -1]
        raise refuse(
            f"{name_of(missing)} and {name_of(given)} go together: set both or neither", missing
        )
    if (ca or cert) and not url.startswith("rediss://"):
        # never let a TLS setting be silently ignored on a plain connection
        tls = "tls_ca_file" if ca else "tls_cert_file"
        raise refuse(
            f"{name_of(tls)} is set but {url_name} is not a rediss:// URL ({shown}); use "
            "rediss:// for TLS",
            tls,
        )
    if values["redis_cluster"] and values["sentinels"]:
        raise refuse(
            f"{name_of('redis_cluster')} and {name_of('sentinels')} do not go together: a "
            "Redis Cluster fails over by itself; set one or the other",
            "redis_cluster",
        )
    if values["redis_cluster"] and urlsplit(url).scheme not in ("redis", "rediss"):
        raise refuse(
            f"{name_of('redis_cluster')} needs a redis:// or rediss:// {url_name} naming one "
            f"node of the cluster, got {shown}",
            "redis_url",
        )
    if values["redis_cluster"] and urlsplit(url).path.lstrip("/") not in ("", "0"):
        raise refuse(
            f"a Redis Cluster has only database 0: {url_name} must end in /0 or name no "
            f"database, got {shown}",
            "redis_url",
        )
    pattern, job = values["jobs_pattern"], values["job"]
    if pattern is not None and not fnmatch.fnmatchcase(job, pattern):
        # Redis's glob and fnmatch's agree on a valid pattern ('*', '?', no brackets)
        raise refuse(
            f"the job {job!r} does not match {name_of('jobs_pattern')} {pattern!r}: give the "
            "jobs pattern of the chief's Redis user (its team's), which its job matches",
            "jobs_pattern",
        )
    for name in ("run_id", "task_id"):
        value, source, what = values[name], values[f"{name}_source"], name.replace("_", " ")
        # only STEPBARRIER_RUN_ID can say "no run id" (set empty); a launcher's variable,
        # TF_CONFIG or a rank always gives one
        if value is None and source not in (None, "STEPBARRIER_RUN_ID"):
            raise refuse(
                f"{name_of(f'{name}_source')} {source} names where the {what} came from, but "
                f"{name} is None: give the {what} too, or no {name}_source",
                f"{name}_source",
            )


_logged_lock = threading.Lock()
_logged: dict[str, tuple[str | None, RunIdSource | None, int | None]] = {}
_MAX_LOGGED_JOBS = 64


def _log_run_id(config: BarrierConfig) -> None:
    """One INFO line per job and run id (each hook, callback and waiter reads the
    environment; one line tells the run), and one for the task when a launcher's
    rank gave its id."""
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
