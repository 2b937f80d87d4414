"""How a failed Redis call is judged and explained.

Two kinds of failure are told apart here. Transient ones (connection refused or
reset, timeouts, a server still loading, a replica that just lost its master)
may be cured by a retry (``stepbarrier._redis.retries`` retries them). Everything else
(a wrong password, a missing ACL permission, a TLS certificate that does not
verify, a key of the wrong type) cannot get better by retrying, so ``translate``
turns it into a clear ``RedisRefused`` at once.
"""

from __future__ import annotations

import ssl
from urllib.parse import urlsplit

from redis import exceptions as rex

from stepbarrier._config.settings import BarrierConfig
from stepbarrier.errors import RedisRefused, RedisUnavailable, StepBarrierError

REDIS_ERRORS = (rex.RedisError, rex.RedisClusterException)
"""What redis-py raises (its cluster client's own exception is no RedisError)."""


def is_transient(exc: BaseException) -> bool:
    """True for failures that a retry may cure."""
    cause = _cluster_cause(exc)
    if cause is not None:
        return is_transient(cause)
    if isinstance(exc, (rex.AskError, rex.SlotNotCoveredError, rex.ClusterError)):
        # a slot on the move (MOVED is an AskError; TRYAGAIN ends as ClusterError
        # "TTL exhausted" once redis-py's own retries ran out), or not yet covered
        return True
    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError)):
        return False
    if isinstance(exc, rex.ConnectionError) and _is_tls_failure(exc):
        return False
    if isinstance(exc, (rex.ReadOnlyError, rex.TryAgainError, rex.ClusterDownError)):
        return True  # a failover is in progress; the new master will answer
    if isinstance(exc, rex.ResponseError):
        text = str(exc)
        return text.startswith(("LOADING", "MASTERDOWN", "BUSY", "READONLY"))
    return isinstance(exc, (rex.ConnectionError, rex.TimeoutError, ConnectionError))


def _cluster_cause(exc: BaseException) -> BaseException | None:
    # a cluster client that reached no node folds the last node's error into
    # "Redis Cluster cannot be connected": judge and report that error instead
    if isinstance(exc, rex.RedisClusterException) and isinstance(
        exc.__cause__, (rex.RedisError, OSError)
    ):
        return exc.__cause__
    return None


def _is_tls_failure(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def translate(exc: BaseException, config: BarrierConfig, *, action: str) -> StepBarrierError:
    """The stepbarrier error that explains ``exc`` (a redis-py error) to a user.

    Anything that is neither a redis-py nor an OS error is a bug, not a Redis
    problem: it becomes a plain ``StepBarrierError`` that says so.
    """
    cause = _cluster_cause(exc)
    if cause is not None:
        return translate(cause, config, action=action)
    where = describe_redis(config)
    user = config.redis_username or _url_username(config.redis_url) or "default"
    detail = one_line(exc)
    if isinstance(exc, StepBarrierError):
        return exc
    if isinstance(exc, rex.RedisClusterException):
        return RedisRefused(
            f"{where} cannot be used as a Redis Cluster while trying to {action}: {detail}. "
            "Check that STEPBARRIER_REDIS_URL names a node of a cluster (or unset "
            "STEPBARRIER_REDIS_CLUSTER), and that the user may run CLUSTER SLOTS and COMMAND",
            kind="response",
            job=config.job,
        )
    if not isinstance(exc, (rex.RedisError, OSError)):
        return StepBarrierError(
            f"internal error while trying to {action} on {where}: {type(exc).__name__}: "
            f"{detail} (a bug in stepbarrier or redis-py, not a Redis problem: please report it)",
            job=config.job,
        )
    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError)) or (
        isinstance(exc, rex.ResponseError) and str(exc).startswith(("NOAUTH", "WRONGPASS"))
    ):
        return RedisRefused(
            f"{where} refused authentication as user {user!r} while trying to "
            f"{action}: {detail}. Check STEPBARRIER_REDIS_USERNAME and "
            "STEPBARRIER_REDIS_PASSWORD(_FILE)"
            + (" (the Sentinels get the same user and password)." if config.sentinels else "."),
            kind="authentication",
            job=config.job,
        )
    text = str(exc)
    # inside a script, Redis words an ACL refusal as "ERR The user executing the
    # script can't run this command or subcommand" (or "... access ... keys")
    in_script = "user executing the script can't" in text
    if isinstance(exc, rex.NoPermissionError) or text.startswith("NOPERM") or in_script:
        return RedisRefused(
            f"user {user!r} may not {action} on {where}: {detail}. Its ACL does not "
            "allow this (see ops/redis/users.acl for the roles).",
            kind="permission",
            job=config.job,
        )
    if isinstance(exc, rex.ConnectionError) and _is_tls_failure(exc):
        if "CERTIFICATE_VERIFY_FAILED" in _chain_text(exc):
            names = (
                "that it names the address the Sentinels announce"
                if config.sentinels
                else "the host name in STEPBARRIER_REDIS_URL"
            )
            hint = (
                "The server's certificate does not verify: check STEPBARRIER_TLS_CA_FILE "
                f"(the CA that signed it) and {names}."
            )
        else:
            hint = (
                "If the server requires client certificates, set STEPBARRIER_TLS_CERT_FILE "
                "and STEPBARRIER_TLS_KEY_FILE; check STEPBARRIER_TLS_CA_FILE too."
            )
        return RedisRefused(
            f"TLS to {where} failed while trying to {action}: {detail}. {hint}",
            kind="tls",
            job=config.job,
        )
    if is_transient(exc):
        return RedisUnavailable(
            f"{where} is unreachable (while trying to {action}): {detail}",
            job=config.job,
        )
    return RedisRefused(
        f"{where} answered with an error while trying to {action}: {detail}",
        kind="response",
        job=config.job,
    )


def describe_redis(config: BarrierConfig) -> str:
    """Where the job's Redis is, for messages: its masked URL, or its Sentinels."""
    if config.redis_cluster:
        return f"Redis Cluster at {config.safe_url}"
    if not config.sentinels:
        return f"Redis at {config.safe_url}"
    nodes = ",".join(f"{host}:{port}" for host, port in config.sentinels)
    return f"Redis master {config.sentinel_service!r} of Sentinels {nodes}"


def _url_username(url: str) -> str | None:
    try:
        return urlsplit(url).username or None
    except ValueError:
        return None


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    return text[:300]


def _chain_text(exc: BaseException) -> str:
    parts = []
    seen: BaseException | None = exc
    for _ in range(5):
        if seen is None:
            break
        parts.append(f"{seen!r} {seen}")
        seen = seen.__cause__ or seen.__context__
    return " ".join(parts)
