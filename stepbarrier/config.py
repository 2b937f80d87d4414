"""The barrier's settings: ``BarrierConfig``, its defaults and its validation.

Every host (chief, worker, operator shell) is configured through
``STEPBARRIER_*`` variables, falling back to TensorFlow's ``TF_CONFIG`` for the
role and task id. ``BarrierConfig.from_env`` (through ``stepbarrier.environment``,
the only code that reads them) turns them into a frozen ``BarrierConfig``;
everything else in the library takes that object.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Literal
from urllib.parse import urlsplit

from stepbarrier.errors import ConfigurationError
from stepbarrier.keys import JobKeys
from stepbarrier.protocol import RUN_ID
from stepbarrier.schedule import MAX_STEP, schedule_wait_until_step, validate_schedule

Role = Literal["chief", "worker"]
OnTimeout = Literal["raise", "proceed"]

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
DEFAULT_DONE_TTL = 300
"""Seconds a finished job's keys live after the chief marks it done, so that a
rerun under the same job name (without a run id) starts clean after that."""
FALLBACK_INTERVAL = 5.0
"""Seconds between a waiter's re-reads of the stored step (pub/sub is only a hint)."""

JOB_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SCHEMES = ("redis", "rediss", "unix")

#: Every variable ``from_env`` reads, for documentation and tooling.
ENVIRONMENT_VARIABLES: tuple[str, ...] = (
    "STEPBARRIER_REDIS_URL",
    "STEPBARRIER_REDIS_USERNAME",
    "STEPBARRIER_REDIS_PASSWORD",
    "STEPBARRIER_REDIS_PASSWORD_FILE",
    "STEPBARRIER_TLS_CA_FILE",
    "STEPBARRIER_TLS_CERT_FILE",
    "STEPBARRIER_TLS_KEY_FILE",
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
    "STEPBARRIER_USE_EVAL",
    "STEPBARRIER_REDIS_CLUSTER",
)


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``.

    Works on malformed URLs too (a password may hold ``?``, ``#`` or ``@``, which
    confuse URL parsers): everything between ``scheme://user:`` and the last
    ``@`` is masked.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if not at:
        return url
    user, colon, _secret = userinfo.partition(":")
    masked = f"{user}:***" if colon else user
    return f"{scheme}{sep}{masked}@{host}"


def validate_job(job: str, *, variable: str = "STEPBARRIER_JOB") -> str:
    """Return ``job`` if it is a valid job name, else raise ``ConfigurationError``.

    A job name becomes part of Redis key names, so only letters, digits, ``.``,
    ``_`` and ``-`` are allowed (no glob characters, no braces, no spaces).
    """
    if not isinstance(job, str) or JOB_NAME.fullmatch(job) is None:
        raise ConfigurationError(
            f"{variable} must be 1 to 64 characters from letters, digits, '.', '_' "
            f"and '-', got {job!r}",
            variable=variable,
        )
    return job


def validate_run_id(run_id: str, *, variable: str = "STEPBARRIER_RUN_ID") -> str:
    """Return ``run_id`` if it is a valid run id, else raise ``ConfigurationError``."""
    if not isinstance(run_id, str) or RUN_ID.fullmatch(run_id) is None:
        raise ConfigurationError(
            f"{variable} must be 1 to 64 characters from letters, digits, '.', '_' "
            f"and '-', got {str(run_id)[:80]!r}",
            variable=variable,
        )
    return run_id


@dataclass(frozen=True)
class BarrierConfig:
    """Settings for a chief, a worker or an operator tool of one job.

    Build it directly in code, or from the environment with ``from_env``.
    Unset optional settings are ``None``.

    Example:
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
    use_eval: bool = False
    redis_cluster: bool = False

    def __post_init__(self) -> None:
        validate_job(self.job, variable="job")
        if self.run_id is not None:
            validate_run_id(self.run_id, variable="run_id")
        _check_int(self.done_ttl, "done_ttl", low=1, high=10 * 365 * 24 * 3600)
        if self.progress_timeout is not None:
            _check_seconds(self.progress_timeout, "progress_timeout")
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
        _check_url(self.redis_url, "redis_url")
        if self.role not in (None, "chief", "worker"):
            raise ConfigurationError(
                f"role must be 'chief' or 'worker', got {self.role!r}", variable="role"
            )
        if self.task_id is not None:
            _check_int(self.task_id, "task_id", low=0, high=1_000_000)
        if self.wait_until_step is not None:
            _check_int(self.wait_until_step, "wait_until_step", low=0, high=MAX_STEP)
        if self.schedule is not None:
            object.__setattr__(self, "schedule", validate_schedule(self.schedule))
        if self.timeout is not None:
            _check_seconds(self.timeout, "timeout")
        _check_seconds(self.stall_timeout, "stall_timeout")
        _check_seconds(self.heartbeat, "heartbeat", high=3600.0)
        _check_seconds(self.fallback_interval, "fallback_interval", high=5.0)
        _check_int(self.key_ttl, "key_ttl", low=60, high=10 * 365 * 24 * 3600)
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

    @property
    def keys(self) -> JobKeys:
        """The Redis key and channel names of this job."""
        return JobKeys.for_job(self.job)

    @property
    def safe_url(self) -> str:
        """The Redis URL with any password masked, for messages and logs."""
        return mask_url(self.redis_url)

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
                f"schedule {self.schedule!r} needs a task id: set STEPBARRIER_TASK_ID or TF_CONFIG",
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
        from stepbarrier.environment import config_from_env  # it builds on this module

        return config_from_env(os.environ if environ is None else environ)


def _check_url(url: str, variable: str) -> None:
    masked = mask_url(url) if isinstance(url, str) else repr(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except (ValueError, TypeError, AttributeError):
        raise ConfigurationError(
            f"{variable} must be a redis://, rediss:// or unix:// URL, got {masked}",
            variable=variable,
        ) from None
    stray_at = "@" in url.partition("://")[2] and "@" not in parts.netloc
    if stray_at or "@" in parts.query or parts.fragment:
        raise ConfigurationError(
            f"{variable} is not a valid URL ({masked}): percent-encode special characters "
            "such as '#', '?', '/' and '@' in the password, or set "
            "STEPBARRIER_REDIS_PASSWORD(_FILE) instead",
            variable=variable,
        )
    if parts.scheme not in _SCHEMES:
        raise ConfigurationError(
            f"{variable} must start with redis://, rediss:// or unix://, got {masked}",
            variable=variable,
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigurationError(
                f"{variable}: a unix:// URL needs a socket path, got {masked}",
                variable=variable,
            )
        return
    if not parts.hostname:
        raise ConfigurationError(
            f"{variable} needs a host, e.g. redis://localhost:6379/0, got {masked}",
            variable=variable,
        )
    if port is not None and not 0 < port < 65536:
        raise ConfigurationError(
            f"{variable}: port must be 1-65535, got {masked}", variable=variable
        )
    path = parts.path.lstrip("/")
    if path and not (path.isdigit() and int(path) < 100_000):
        raise ConfigurationError(
            f"{variable}: the path must be a database number such as /0, got {masked}",
            variable=variable,
        )


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


def _check_int(value: object, name: str, *, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(
            f"{name} must be an integer from {low} to {high}, got {value!r}",
            variable=name,
        )


def _check_seconds(value: object, name: str, *, high: float = 1e9) -> None:
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= high
    )
    if not ok:
        raise ConfigurationError(
            f"{name} must be a number of seconds above 0 and at most {high:g}, got {value!r}",
            variable=name,
        )
