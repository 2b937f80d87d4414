"""Redis clients built from a ``BarrierConfig`` (from its URL, or through
Sentinel), and how their errors are handled.

Two kinds of failure are told apart here. Transient ones (connection refused or
reset, timeouts, a server still loading, a replica that just lost its master)
are retried with tenacity's exponential backoff and jitter, never past the
caller's deadline. Everything else (a wrong password, a missing ACL permission,
a TLS certificate that does not verify, a key of the wrong type) cannot get
better by retrying, so it is turned into a clear ``RedisRefused`` at once.
"""

from __future__ import annotations

import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any, TypeAlias, TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis import exceptions as rex
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel
from tenacity import (
    RetryCallState,
    Retrying,
    retry_if_exception,
    wait_exponential,
    wait_random,
)
from tenacity.wait import wait_base

from stepbarrier.config import BarrierConfig
from stepbarrier.errors import (
    ConfigurationError,
    RedisRefused,
    RedisUnavailable,
    StepBarrierError,
)

log = logging.getLogger("stepbarrier.connection")

T = TypeVar("T")

REDIS_ERRORS = (rex.RedisError, rex.RedisClusterException)
"""What redis-py raises (its cluster client's own exception is no RedisError)."""

RedisClient: TypeAlias = "redis.Redis | RedisCluster"
"""A client of the job's Redis: one server (direct or through Sentinel) or a Cluster."""

SOCKET_TIMEOUT = 10.0
"""Seconds a command may wait for its reply before the connection counts as dead."""
CONNECT_TIMEOUT = 3.0
"""Seconds to establish a TCP (and TLS) connection."""
BACKOFF_INITIAL = 0.05
"""First retry delay in seconds; it doubles up to ``BACKOFF_MAX``, with jitter."""
BACKOFF_MAX = 2.0
"""Longest delay between two retries, in seconds."""
BACKOFF_JITTER = 0.25
"""Up to this many seconds of random delay added to each retry, so clients spread out."""


def backoff() -> wait_base:
    """Exponential backoff with jitter: 50 ms doubling up to 2 s, plus up to 250 ms."""
    return wait_exponential(multiplier=BACKOFF_INITIAL, max=BACKOFF_MAX) + wait_random(
        0, BACKOFF_JITTER
    )


def backoff_attempt(number: int) -> RetryCallState:
    """What ``backoff()`` needs to give the delay before try ``number + 1`` by hand.

    tenacity's wait strategies read only ``attempt_number`` from its call state.
    """
    return cast(RetryCallState, SimpleNamespace(attempt_number=number))


def make_client(
    config: BarrierConfig, *, socket_timeout: float | None = SOCKET_TIMEOUT
) -> RedisClient:
    """A redis-py client for the job's Redis: ``config.redis_url``, or the master
    that ``config.sentinels`` name.

    With Sentinels the URL still gives the scheme (``rediss://`` means TLS), the
    username and password, and the database number, as in
    ``rediss://trainer:secret@ignored/3``; its host and port are ignored, because
    the Sentinels name the master. ``config.redis_username`` and
    ``config.redis_password`` win over the URL's. The Sentinels are reached with
    the same TLS settings and the same username and password as the master: give
    them the same ACL user (``user`` lines in sentinel.conf) or a ``requirepass``
    with the same password. Over TLS, the master's certificate must be valid for
    the address the Sentinels announce (an IP address, unless they run with
    ``announce-hostnames yes``).

    The client's own retries are switched off: stepbarrier retries transient
    errors itself, within the caller's deadline.

    Raises:
        ConfigurationError: Sentinels with a ``unix://`` URL.
        TypeError: This redis-py does not take a connection setting (a bug). It
            is raised here, not at the first command, where it would look like
            a Redis error and could be retried for ever.
    """
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "decode_responses": False,
    }
    if config.sentinels:
        return _master_through_sentinels(config, options)
    if config.redis_username is not None:
        options["username"] = config.redis_username
    if config.redis_password is not None:
        options["password"] = config.redis_password
    if config.redis_url.startswith("rediss://"):
        options.update(_tls_options(config))
    if config.redis_cluster:
        return _cluster(config, options)
    client = redis.Redis.from_url(config.redis_url, **options)
    _check_settings(client.connection_pool)
    return client


def _cluster(config: BarrierConfig, options: dict[str, Any]) -> RedisCluster:
    # The cluster client follows MOVED, ASK and TRYAGAIN itself (its own retry
    # object, with backoff, re-reading the slot map): a migration or a failover
    # is never shown to the caller as such. The seed node is only where the
    # slot map is first read; the client connects to every master it lists.
    # It reads the map at once: an unreachable seed is a ConnectionError here,
    # which the callers retry like any other.
    del options["retry"]  # RedisCluster takes its retry object apart from the nodes'
    return RedisCluster.from_url(config.redis_url, **options)


def refresh_topology(client: RedisClient) -> None:
    """Re-read a cluster's slot map after a connection failure (best effort).

    redis-py re-reads it after a failed single command, but not after a failed
    pipeline, and a re-read during a failover can still name the dead master:
    reading it again before each retry lets the retry reach the promoted one.
    """
    if isinstance(client, RedisCluster):
        with contextlib.suppress(Exception):
            client.nodes_manager.initialize()


def disconnect_all(client: RedisClient) -> None:
    """Close every connection of ``client``, in use or not (cuts a blocked call short)."""
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect(inuse_connections=True)
    else:
        client.connection_pool.disconnect(inuse_connections=True)


def _tls_options(config: BarrierConfig) -> dict[str, Any]:
    options: dict[str, Any] = {"ssl_cert_reqs": "required"}
    if config.tls_ca_file:
        options["ssl_ca_certs"] = config.tls_ca_file
    if config.tls_cert_file:
        options["ssl_certfile"] = config.tls_cert_file
        options["ssl_keyfile"] = config.tls_key_file
    return options


def _master_through_sentinels(config: BarrierConfig, options: dict[str, Any]) -> redis.Redis:
    if config.redis_url.startswith("unix://"):
        raise ConfigurationError(
            "STEPBARRIER_SENTINELS needs a redis:// or rediss:// STEPBARRIER_REDIS_URL "
            "(for TLS, the user, the password and the database; the Sentinels name the "
            f"master), got {config.safe_url}",
            variable="STEPBARRIER_REDIS_URL",
            job=config.job,
        )
    from_url: dict[str, Any] = parse_url(config.redis_url)  # type: ignore[no-untyped-call]
    access: dict[str, Any] = {}  # for the master and the Sentinels alike
    username = config.redis_username or from_url.get("username")
    password = config.redis_password or from_url.get("password")
    if username is not None:
        access["username"] = username
    if password is not None:
        access["password"] = password
    if config.redis_url.startswith("rediss://"):
        access.update(ssl=True, **_tls_options(config))
    sentinels = _Sentinels(  # type: ignore[no-untyped-call]
        list(config.sentinels),
        sentinel_kwargs={
            "socket_timeout": CONNECT_TIMEOUT,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "retry": Retry(NoBackoff(), 0),
            **access,
        },
    )
    client: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call]
        config.sentinel_service, db=from_url.get("db", 0), **options, **access
    )
    for pool in [client.connection_pool, *(node.connection_pool for node in sentinels.sentinels)]:
        _check_settings(pool)
    return client


def _check_settings(pool: redis.ConnectionPool) -> None:
    # redis-py passes the settings to a connection class only when it first
    # connects, inside an operation that callers retry. Building one (no I/O)
    # makes a setting it does not take fail now, with a plain TypeError.
    pool.connection_class(**pool.connection_kwargs)


class _Sentinels(Sentinel):
    """redis-py's ``Sentinel``, except when every Sentinel refused us.

    redis-py folds each Sentinel's error into the text of a ``MasterNotFoundError``,
    a ``ConnectionError`` that looks transient, so a wrong password would be
    retried until the deadline. Here, when no Sentinel names the master and every
    error was a refusal (authentication, a certificate that does not verify), the
    first refusal is raised instead, and reported at once.
    """

    def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[tuple[str, rex.RedisError]] = []
        for index, node in enumerate(self.sentinels):
            try:
                masters = cast(dict[str, dict[str, Any]], node.sentinel_masters())
            except (rex.ConnectionError, rex.TimeoutError) as exc:
                address = "{host}:{port}".format_map(node.connection_pool.connection_kwargs)
                errors.append((address, exc))
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                self.sentinels[0], self.sentinels[index] = node, self.sentinels[0]
                return str(state["ip"]), int(state["port"])
        if errors and not any(is_transient(exc) for _, exc in errors):
            address, refusal = errors[0]
            raise type(refusal)(f"Sentinel {address}: {_one_line(refusal)}") from refusal
        seen = "; ".join(f"Sentinel {address}: {_one_line(exc)}" for address, exc in errors)
        raise MasterNotFoundError(
            f"no Sentinel names a healthy master {service_name!r}" + (f" ({seen})" if seen else "")
        )


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
    detail = _one_line(exc)
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


def _one_line(exc: BaseException) -> str:
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


def _stop_at(
    deadline: float | None, clock: Callable[[], float]
) -> Callable[[RetryCallState], bool]:
    def stop(state: RetryCallState) -> bool:
        return deadline is not None and clock() >= deadline

    return stop


def _wait_until(
    deadline: float | None, clock: Callable[[], float]
) -> Callable[[RetryCallState], float]:
    # Never sleep past the deadline, and never give up before it: the last try
    # starts at the deadline (Redis may be back by then).
    strategy = backoff()

    def wait(state: RetryCallState) -> float:
        delay = strategy(state)
        return delay if deadline is None else max(0.0, min(delay, deadline - clock()))

    return wait


def call_with_retries(
    operation: Callable[[], T],
    config: BarrierConfig,
    *,
    action: str,
    deadline: float | None,
    clock: Callable[[], float],
    sleep: Callable[[float], None],
) -> T:
    """Run ``operation``, retrying transient Redis errors until ``deadline``.

    Args:
        operation: The Redis work to do; it is run again after a transient error.
        config: For error messages (job, masked URL, user).
        action: What the operation does, for messages ("read the job's state").
        deadline: ``clock()`` value at which the last try starts (sleeps are cut
            short to reach it); ``None`` retries for as long as the errors are
            transient.
        clock: Monotonic clock.
        sleep: Sleeps between tries (injectable for tests).

    Raises:
        RedisUnavailable: Still unreachable at the deadline.
        RedisRefused: A non-transient error, at once.
    """
    settings = retry_settings(config, action=action, deadline=deadline, clock=clock)
    try:
        return Retrying(sleep=sleep, **settings)(operation)
    except REDIS_ERRORS as exc:
        raise translate(exc, config, action=action) from exc
    except OSError as exc:  # a raw socket error that redis-py did not wrap
        raise translate(rex.ConnectionError(str(exc)), config, action=action) from exc


def retry_settings(
    config: BarrierConfig, *, action: str, deadline: float | None, clock: Callable[[], float]
) -> dict[str, Any]:
    """tenacity's settings for ``call_with_retries`` (and its asyncio twin), all but ``sleep``.

    Transient errors are retried with backoff until ``deadline``, where the last
    try starts; the first one is raised (``reraise``) for the caller to translate.
    """

    def note(state: RetryCallState) -> None:
        if state.attempt_number in (1, 10) or state.attempt_number % 50 == 0:
            error = state.outcome.exception() if state.outcome else None
            log.warning(
                "%s unavailable (%s); retrying to %s",
                describe_redis(config),
                _one_line(error) if error else "?",
                action,
            )

    return {
        "retry": retry_if_exception(is_transient),
        "wait": _wait_until(deadline, clock),
        "stop": _stop_at(deadline, clock),
        "before_sleep": note,
        "reraise": True,
    }


def with_client(
    config: BarrierConfig,
    client: RedisClient | None,
    operation: Callable[[RedisClient], T],
    *,
    action: str,
    retry_seconds: float,
) -> T:
    """Run ``operation`` on ``client``, or on a client made (and closed) for it.

    A made client is made within the retries: a cluster client reads the slot
    map at once, so a Redis that is down fails there, as a transient error.

    Raises:
        RedisUnavailable: Redis stayed unreachable for ``retry_seconds``.
        RedisRefused: Redis refused the operation (authentication, ACL, TLS).
    """
    made: list[RedisClient] = []

    def run() -> T:
        if client is not None:
            return operation(client)
        if not made:
            made.append(make_client(config))
        return operation(made[0])

    try:
        return call_with_retries(
            run,
            config,
            action=action,
            deadline=time.monotonic() + retry_seconds,
            clock=time.monotonic,
            sleep=time.sleep,
        )
    finally:
        for own in made:
            own.close()
