"""The checks a setting must pass, shared by ``BarrierConfig`` and the environment reader.

Each check raises ``ConfigurationError`` naming the setting (or the variable it
came from) and what was expected; none repeats a password.
"""

from __future__ import annotations

import math
import re
from urllib.parse import urlsplit

from stepbarrier.errors import ConfigurationError
from stepbarrier.protocol import RUN_ID

JOB_NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
_SCHEMES = ("redis", "rediss", "unix")


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


def check_url(url: str, variable: str) -> None:
    """Raise ``ConfigurationError`` unless ``url`` is a usable Redis URL.

    A ``redis://`` or ``rediss://`` URL needs a host, a port (if any) from 1 to
    65535 and, as its path, a database number; a ``unix://`` URL a socket path.
    The message shows the URL with its password masked.
    """
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


def check_int(value: object, name: str, *, low: int, high: int) -> None:
    """Raise ``ConfigurationError`` unless ``value`` is an int (no bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(
            f"{name} must be an integer from {low} to {high}, got {value!r}",
            variable=name,
        )


def check_seconds(value: object, name: str, *, high: float = 1e9) -> None:
    """Raise ``ConfigurationError`` unless ``value`` is a number of seconds in ``(0, high]``."""
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
