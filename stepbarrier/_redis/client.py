"""Redis clients built from a ``BarrierConfig`` (its URL with TLS, Sentinel, or a
Cluster), one operation on a client made for it (``with_client``), and the one
walk of a keyspace (``scan_keys``).

The clients' own retries are off: stepbarrier retries transient errors itself,
within the caller's deadline (``stepbarrier._redis.retries``).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, TypeAlias, TypeVar, cast
from urllib.parse import urlsplit

import redis
from redis import exceptions as rex
from redis.backoff import NoBackoff
from redis.cluster import RedisCluster
from redis.connection import HiredisRespSerializer, parse_url
from redis.retry import Retry
from redis.sentinel import MasterNotFoundError, Sentinel
from redis.utils import HIREDIS_AVAILABLE

from stepbarrier._config.checks import TLS_INSECURE, lone_userinfo_as_password, url_tls_weakening
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._redis.failures import is_transient, one_line
from stepbarrier._redis.retries import call_with_retries
from stepbarrier.errors import ConfigurationError

T = TypeVar("T")

RedisClient: TypeAlias = "redis.Redis | RedisCluster"
"""A client of the job's Redis: one server (direct or through Sentinel) or a Cluster."""

_tls_log = logging.getLogger("stepbarrier.tls")
"""Where a client made with weakened TLS is told (``STEPBARRIER_TLS_INSECURE``)."""

_CONSEQUENCES = {  # of a weakened TLS connection, by its ssl_cert_reqs
    "none": "the server's certificate is not verified, so any server can pose as Redis",
    "optional": "the server's certificate is no longer required",
    "required": "the certificate need not name the host, so any certificate the CA signed "
    "is accepted",
}

SOCKET_TIMEOUT = 10.0
"""Seconds a command may wait for its reply before the connection counts as dead."""
CONNECT_TIMEOUT = 3.0
"""Seconds to establish a TCP (and TLS) connection."""


@dataclass(frozen=True)
class ClientKind:
    """The redis-py classes of one side, blocking (``SYNC``) or asyncio (``ASYNC``)."""

    redis: Any
    cluster: Any
    sentinels: Any
    retry: Any
    command_packer: Any = None


def make_client(
    config: BarrierConfig, *, socket_timeout: float | None = SOCKET_TIMEOUT
) -> RedisClient:
    """A redis-py client for the job's Redis: ``config.redis_url``, or the master that
    ``config.sentinels`` name (docs/operations.md#sentinel).

    Raises:
        ConfigurationError: Sentinels with a ``unix://`` URL.
        TypeError: This redis-py does not take a connection setting (a bug), raised
            here, not at the first command, where it would be retried as a Redis error.
    """
    return cast(RedisClient, build_client(config, SYNC, socket_timeout=socket_timeout))


def build_client(config: BarrierConfig, kind: ClientKind, *, socket_timeout: float | None) -> Any:
    """A client of ``kind`` (see ``make_client``): both sides connect alike."""
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
    if kind.command_packer is not None:
        options["command_packer"] = kind.command_packer
    if config.sentinels:
        return _master_through_sentinels(config, kind, options)
    options.update(_credentials(config.redis_username, config.redis_password))
    if config.redis_url.startswith("rediss://"):
        options.update(_tls_options(config))
    if config.redis_cluster:
        # it follows MOVED, ASK and TRYAGAIN itself, with its own retry object; the
        # blocking one reads the slot map at once (an unreachable seed: a ConnectionError)
        del options["retry"]  # RedisCluster takes its retry object apart from the nodes'
        options.pop("command_packer", None)  # and passes no packer on to them
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
    user, colon, password = userinfo.partition(":")
    kept = ("" if config.redis_username is not None else user) + (
        "" if config.redis_password is not None else colon + password
    )
    # (not urlunsplit: it drops the "//" of an empty netloc, unix:///path -> unix:/path)
    return url.replace(f"//{parts.netloc}", f"//{kept}@{host}" if kept else f"//{host}", 1)


def refresh_topology(client: RedisClient) -> None:
    """Re-read a cluster's slot map after a connection failure (best effort).

    redis-py re-reads it after a failed single command, but not after a failed
    pipeline, and a re-read during a failover can still name the dead master:
    reading it again before each retry lets the retry reach the promoted one.
    """
    if isinstance(client, RedisCluster):
        with contextlib.suppress(Exception):
            client.nodes_manager.initialize()


@dataclass
class ScanTally:
    """What a ``scan_keys`` walk did: its calls, and ``cut`` if it stopped short."""

    calls: int = 0
    cut: bool = False


def scan_keys(
    client: RedisClient, match: str, *, count: int, most: int, tally: ScanTally | None = None
) -> Iterator[bytes | str]:
    """The keys matching ``match``, by ``SCAN`` of ``count`` keys per call, at most
    ``most`` calls per master (on a Cluster each master in turn)."""
    tally = ScanTally() if tally is None else tally
    nodes: list[Any] = [None]
    if isinstance(client, RedisCluster):
        nodes = list(client.get_primaries())  # type: ignore[no-untyped-call]
    for node in nodes:
        cursor: Any = "0"
        for _ in range(most):
            target = {} if node is None else {"target_nodes": node}
            cursor, keys = client.scan(cursor=cursor, match=match, count=count, **target)
            if isinstance(cursor, dict):
                # a cluster client answers {node name: cursor} for the node it asked
                cursor = next(iter(cursor.values()), 0)
            tally.calls += 1
            yield from keys
            if int(cursor) == 0:
                break
        else:
            tally.cut = True


def slot_client(client: RedisClient, key: str, *, refresh: bool = False) -> redis.Redis:
    """``client``, or on a Cluster the plain client of ``key``'s slot's owner."""
    if not isinstance(client, RedisCluster):
        return client
    if refresh:
        client.nodes_manager.initialize()
    owner = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
    return client.get_redis_connection(owner)


def disconnect_all(client: RedisClient) -> None:
    """Close every connection of ``client``, in use or not (cuts a blocked call short)."""
    if isinstance(client, RedisCluster):
        for node in client.get_nodes():  # type: ignore[no-untyped-call]
            if node.redis_connection is not None:
                node.redis_connection.connection_pool.disconnect(inuse_connections=True)
    else:
        client.connection_pool.disconnect(inuse_connections=True)


def _tls_options(config: BarrierConfig) -> dict[str, Any]:
    """The TLS options of a ``rediss://`` client: certificate and host name verified,
    unless the URL weakens that under ``STEPBARRIER_TLS_INSECURE=1`` (a WARNING each
    time). Not left to the URL, so that Sentinel clients (no URL query) are alike."""
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
            _CONSEQUENCES[str(weakened.get("ssl_cert_reqs", "required"))],
        )
    return options


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
    access: dict[str, Any] = _credentials(  # for the master and the Sentinels alike
        config.redis_username or from_url.get("username"),
        config.redis_password or from_url.get("password"),
    )
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


def _credentials(username: str | None, password: str | None) -> dict[str, str]:
    given = {"username": username, "password": password}
    return {name: value for name, value in given.items() if value is not None}


def _check_settings(pool: Any) -> None:
    # redis-py passes the settings to a connection class only when it first
    # connects, inside an operation that callers retry. Building one (no I/O)
    # makes a setting it does not take fail now, with a plain TypeError.
    pool.connection_class(**pool.connection_kwargs)


class _Sentinels(Sentinel):
    """redis-py's ``Sentinel``, except when every Sentinel refused us (``no_master``)."""

    def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[tuple[str, rex.RedisError]] = []
        for index, node in enumerate(self.sentinels):
            try:
                masters = cast(dict[str, dict[str, Any]], node.sentinel_masters())
            except (rex.ConnectionError, rex.TimeoutError) as exc:
                errors.append((sentinel_address(node), exc))
                continue
            if (found := healthy_master(self, index, masters, service_name)) is not None:
                return found
        raise no_master(service_name, errors)


def healthy_master(
    sentinels: Any, index: int, masters: dict[str, dict[str, Any]], service_name: str
) -> tuple[str, int] | None:
    """The healthy master Sentinel ``index`` names, if any (that one is asked first next)."""
    state = masters.get(service_name)
    if not (state and sentinels.check_master_state(state, service_name)):
        return None
    nodes = sentinels.sentinels
    nodes[0], nodes[index] = nodes[index], nodes[0]
    return str(state["ip"]), int(state["port"])


def sentinel_address(node: Any) -> str:
    """``host:port`` of a Sentinel's client (blocking or asyncio)."""
    return "{host}:{port}".format_map(node.connection_pool.connection_kwargs)


def no_master(service_name: str, errors: list[tuple[str, rex.RedisError]]) -> rex.RedisError:
    """What to raise when no Sentinel named a healthy master: a ``MasterNotFoundError``
    (transient) naming the ``errors``, or the first refusal if every one refused us,
    which redis-py would fold into one, and a wrong password be retried for ever."""
    if errors and not any(is_transient(exc) for _, exc in errors):
        address, refusal = errors[0]
        error = type(refusal)(f"Sentinel {address}: {one_line(refusal)}")
        error.__cause__ = refusal
        return error
    seen = "; ".join(f"Sentinel {address}: {one_line(exc)}" for address, exc in errors)
    return MasterNotFoundError(
        f"no Sentinel names a healthy master {service_name!r}" + (f" ({seen})" if seen else "")
    )


SYNC = ClientKind(
    redis=redis.Redis,
    cluster=RedisCluster,
    sentinels=_Sentinels,
    retry=Retry,
    # redis-py 8.2 runs every argument through its Python encoder before hiredis
    # packs it, which hiredis does itself in C: about 120k instructions more per
    # FCALL or pipeline (bench.instructions: a whole wait() 2.3x -> 2.9x its floor).
    # stepbarrier sends only str (UTF-8), bytes and int, which hiredis packs alike.
    command_packer=HiredisRespSerializer() if HIREDIS_AVAILABLE else None,  # type: ignore[no-untyped-call]
)
"""The blocking side's classes."""


def with_client(
    config: BarrierConfig,
    client: RedisClient | None,
    operation: Callable[[RedisClient], T],
    *,
    action: str,
    retry_seconds: float,
) -> T:
    """Run ``operation`` on ``client``, or on one made (and closed) for it within the
    retries (a cluster client's first read may fail), retried for ``retry_seconds``."""
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
