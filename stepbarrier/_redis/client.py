"""Redis clients built from a ``BarrierConfig``: from its URL (with TLS), through
Sentinel, or as a Redis Cluster client; and ``with_client``, which runs one
operation on a given client or on one made (and closed) for it.

The clients' own retries are off. How their failures are judged and explained
is ``stepbarrier._redis.failures``; how the transient ones are retried within the
caller's deadline is ``stepbarrier._redis.retries``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis import exceptions as rex
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel

from stepbarrier._config.checks import TLS_INSECURE, lone_userinfo_as_password, url_tls_weakening
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._redis.failures import (
    is_transient,
    one_line,
)
from stepbarrier._redis.retries import (
    call_with_retries,
)
from stepbarrier.errors import ConfigurationError

T = TypeVar("T")

RedisClient: TypeAlias = "redis.Redis | RedisCluster"
"""A client of the job's Redis: one server (direct or through Sentinel) or a Cluster."""

_tls_log = logging.getLogger("stepbarrier.tls")
"""Where a client made with weakened TLS is told (``STEPBARRIER_TLS_INSECURE``)."""

SOCKET_TIMEOUT = 10.0
"""Seconds a command may wait for its reply before the connection counts as dead."""
CONNECT_TIMEOUT = 3.0
"""Seconds to establish a TCP (and TLS) connection."""


@dataclass(frozen=True)
class ClientKind:
    """The redis-py classes of one side: blocking (``SYNC``) or ``redis.asyncio``
    (``stepbarrier._redis.aio_client.ASYNC``). ``build_client`` makes a client of
    either from the same settings, so the two sides connect alike."""

    redis: Any
    cluster: Any
    sentinels: Any
    retry: Any


def make_client(
    config: BarrierConfig, *, socket_timeout: float | None = SOCKET_TIMEOUT
) -> RedisClient:
    """A redis-py client for the job's Redis: ``config.redis_url``, or the master
    that ``config.sentinels`` name (``build_client`` on the blocking side).

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
    client: RedisClient = build_client(config, SYNC, socket_timeout=socket_timeout)
    return client


def build_client(config: BarrierConfig, kind: ClientKind, *, socket_timeout: float | None) -> Any:
    """A client of ``kind`` for the job's Redis (see ``make_client``): direct, a
    Cluster or the master the Sentinels name; no I/O, except a blocking cluster
    client's first read of the slot map."""
    options: dict[str, Any] = {
        "socket_timeout": socket_timeout,
        # a caller with a short reply limit gets no longer a connect
        "socket_connect_timeout": CONNECT_TIMEOUT
        if socket_timeout is None
        else min(CONNECT_TIMEOUT, socket_timeout),
        "retry": kind.retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "decode_responses": False,
    }
    if config.sentinels:
        return _master_through_sentinels(config, kind, options)
    if config.redis_username is not None:
        options["username"] = config.redis_username
    if config.redis_password is not None:
        options["password"] = config.redis_password
    if config.redis_url.startswith("rediss://"):
        options.update(_tls_options(config))
    if config.redis_cluster:
        # The cluster client follows MOVED, ASK and TRYAGAIN itself (its own retry
        # object, with backoff, re-reading the slot map): a migration or a failover
        # is never shown to the caller as such. The seed node is only where the
        # slot map is first read; the client connects to every master it lists.
        # The blocking one reads the map at once: an unreachable seed is a
        # ConnectionError here, which the callers retry like any other.
        del options["retry"]  # RedisCluster takes its retry object apart from the nodes'
        return kind.cluster.from_url(url_for_client(config), **options)
    client = kind.redis.from_url(url_for_client(config), **options)
    _check_settings(client.connection_pool)
    return client


def url_for_client(config: BarrierConfig) -> str:
    """``config.redis_url`` without the credentials that ``redis_username`` and
    ``redis_password`` replace: redis-py lets a URL's user and password win over
    the options given beside it, and the settings are meant to win."""
    url = lone_userinfo_as_password(config.redis_url)
    if config.redis_username is None and config.redis_password is None:
        return url
    parts = urlsplit(url)
    if "@" not in parts.netloc:
        return url
    userinfo, host = parts.netloc.rsplit("@", 1)
    user, has_password, password = userinfo.partition(":")
    if config.redis_username is not None:
        user = ""
    if config.redis_password is not None:
        has_password, password = "", ""
    kept = f"{user}{has_password}{password}"
    netloc = f"{kept}@{host}" if kept else host
    # (not urlunsplit: it drops the "//" of an empty netloc, unix:///path -> unix:/path)
    query = f"?{parts.query}" if parts.query else ""
    fragment = f"#{parts.fragment}" if parts.fragment else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}{fragment}"


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
    """The TLS options of a client of ``config``'s ``rediss://`` Redis (sync or asyncio,
    direct, Cluster or through Sentinel): the certificate and the host name verified.

    Only under ``STEPBARRIER_TLS_INSECURE=1`` may the URL weaken that
    (``?ssl_cert_reqs=none``, ``?ssl_check_hostname=false``; ``check_url``
    refuses it otherwise); each client made so is logged as a WARNING. The
    weakening is applied here too, so that Sentinel clients, which take no
    URL query, are made alike.
    """
    options: dict[str, Any] = {"ssl_cert_reqs": "required", "ssl_check_hostname": True}
    if config.tls_ca_file:
        options["ssl_ca_certs"] = config.tls_ca_file
    if config.tls_cert_file:
        options["ssl_certfile"] = config.tls_cert_file
        options["ssl_keyfile"] = config.tls_key_file
    weakened = url_tls_weakening(config.redis_url)
    if weakened:
        if not config.tls_insecure:  # BarrierConfig refuses this; never trust it blindly
            raise ConfigurationError(
                f"STEPBARRIER_REDIS_URL weakens TLS ({_described(weakened)}) without "
                f"{TLS_INSECURE}=1",
                variable="STEPBARRIER_REDIS_URL",
                job=config.job,
            )
        options.update(weakened)
        _tls_log.warning(
            "%s=1: the TLS connection to Redis at %s is weakened (%s): %s; use it for tests only",
            TLS_INSECURE,
            config.safe_url,
            _described(weakened),
            _consequence(weakened),
        )
    return options


def _consequence(weakened: dict[str, str | bool]) -> str:
    reqs = weakened.get("ssl_cert_reqs", "required")
    if reqs == "none":
        return "the server's certificate is not verified, so any server can pose as Redis"
    if reqs == "optional":
        return "the server's certificate is no longer required"
    return "the certificate need not name the host, so any certificate the CA signed is accepted"


def _described(weakened: dict[str, str | bool]) -> str:
    return ", ".join(f"{name}={str(value).lower()}" for name, value in sorted(weakened.items()))


def _master_through_sentinels(
    config: BarrierConfig, kind: ClientKind, options: dict[str, Any]
) -> Any:
    if config.redis_url.startswith("unix://"):
        raise ConfigurationError(
            "STEPBARRIER_SENTINELS needs a redis:// or rediss:// STEPBARRIER_REDIS_URL "
            "(for TLS, the user, the password and the database; the Sentinels name the "
            f"master), got {config.safe_url}",
            variable="STEPBARRIER_REDIS_URL",
            job=config.job,
        )
    from_url: dict[str, Any] = parse_url(lone_userinfo_as_password(config.redis_url))  # type: ignore[no-untyped-call]
    access: dict[str, Any] = {}  # for the master and the Sentinels alike
    username = config.redis_username or from_url.get("username")
    password = config.redis_password or from_url.get("password")
    if username is not None:
        access["username"] = username
    if password is not None:
        access["password"] = password
    if config.redis_url.startswith("rediss://"):
        access.update(ssl=True, **_tls_options(config))
    sentinels = kind.sentinels(
        list(config.sentinels),
        sentinel_kwargs={
            "socket_timeout": CONNECT_TIMEOUT,
            "socket_connect_timeout": CONNECT_TIMEOUT,
            "retry": kind.retry(NoBackoff(), 0),
            **access,
        },
    )
    client = sentinels.master_for(
        config.sentinel_service, db=from_url.get("db", 0), **options, **access
    )
    for pool in [client.connection_pool, *(node.connection_pool for node in sentinels.sentinels)]:
        _check_settings(pool)
    return client


def _check_settings(pool: Any) -> None:
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
                errors.append((sentinel_address(node), exc))
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):  # type: ignore[no-untyped-call]
                self.sentinels[0], self.sentinels[index] = node, self.sentinels[0]
                return str(state["ip"]), int(state["port"])
        raise no_master(service_name, errors)


def sentinel_address(node: Any) -> str:
    """``host:port`` of a Sentinel's client (blocking or asyncio)."""
    return "{host}:{port}".format_map(node.connection_pool.connection_kwargs)


def no_master(service_name: str, errors: list[tuple[str, rex.RedisError]]) -> rex.RedisError:
    """What to raise when no Sentinel named a healthy master (``errors``: the
    Sentinels that failed): the first refusal if every one refused us, else a
    ``MasterNotFoundError`` (transient) naming them."""
    if errors and not any(is_transient(exc) for _, exc in errors):
        address, refusal = errors[0]
        error = type(refusal)(f"Sentinel {address}: {one_line(refusal)}")
        error.__cause__ = refusal
        return error
    seen = "; ".join(f"Sentinel {address}: {one_line(exc)}" for address, exc in errors)
    return MasterNotFoundError(
        f"no Sentinel names a healthy master {service_name!r}" + (f" ({seen})" if seen else "")
    )


SYNC = ClientKind(redis=redis.Redis, cluster=RedisCluster, sentinels=_Sentinels, retry=Retry)
"""The blocking side's classes."""


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
