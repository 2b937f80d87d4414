"""The asyncio side of the connection: a ``redis.asyncio`` client, retries, and our code.

The same rules as ``stepbarrier._redis.client`` and ``stepbarrier._redis.functions``, on
``redis.asyncio``: the client's own retries are off and transient errors are
retried (with the same backoff) within the caller's deadline; everything else
becomes a clear ``RedisRefused`` at once; the Lua code runs as the Functions
library (loaded by the client if it may), or as ``EVALSHA`` scripts with
``use_eval``.

The client is made by the same builder as the blocking side's
(``stepbarrier._redis.client.build_client`` with ``ASYNC``): a Redis named by
URL (``redis://``, ``rediss://`` with the TLS settings, ``unix://``), with ACL
users, a Redis Cluster, or the master that Sentinels name. On a Cluster, as on
the blocking side, a job's calls go in one plain pipeline to the owner of its
slot, and its channel is sharded (``SSUBSCRIBE`` on that owner):
``SlotOwners`` keeps one plain client per master for that.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import redis.asyncio
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from tenacity import AsyncRetrying

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.calls import Call
from stepbarrier._redis.client import (
    SOCKET_TIMEOUT,
    ClientKind,
    build_client,
    no_master,
    sentinel_address,
)
from stepbarrier._redis.failures import REDIS_ERRORS, translate
from stepbarrier._redis.functions import (
    explain_refusal,
    function_command,
    is_missing_function,
    library_source,
    parse_versions,
)
from stepbarrier._redis.retries import retry_settings

T = TypeVar("T")

AsyncClient = redis.asyncio.Redis | AsyncCluster
"""The client of an ``AsyncStepWaiter``: one server (direct or through Sentinel) or a Cluster."""


class _AsyncSentinels(AsyncSentinel):
    """``redis.asyncio``'s ``Sentinel``, except when every Sentinel refused us (as
    ``stepbarrier._redis.client._Sentinels``: the first refusal is raised, at once)."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[tuple[str, rex.RedisError]] = []
        for index, node in enumerate(self.sentinels):
            try:
                masters = cast(dict[str, dict[str, Any]], await node.sentinel_masters())
            except (rex.ConnectionError, rex.TimeoutError) as exc:
                errors.append((sentinel_address(node), exc))
                continue
            state = masters.get(service_name)
            if state and self.check_master_state(state, service_name):
                self.sentinels[0], self.sentinels[index] = node, self.sentinels[0]
                return str(state["ip"]), int(state["port"])
        raise no_master(service_name, errors)


ASYNC = ClientKind(
    redis=redis.asyncio.Redis, cluster=AsyncCluster, sentinels=_AsyncSentinels, retry=Retry
)
"""The asyncio side's classes."""


def make_async_client(config: BarrierConfig) -> AsyncClient:
    """A ``redis.asyncio`` client for the job's Redis (no I/O until first used): as
    ``make_client`` makes the blocking one, from the same settings.

    Raises:
        ConfigurationError: Sentinels with a ``unix://`` URL.
    """
    client: AsyncClient = build_client(config, ASYNC, socket_timeout=SOCKET_TIMEOUT)
    return client


class SlotOwners:
    """Plain clients of a cluster's masters, one per node, each made on first use.

    A job's keys and its channel live in one slot: its calls go to that slot's
    owner in a plain pipeline (a cluster pipeline would first ask a node for the
    keys of each ``FCALL``), and its subscription is made there (``SSUBSCRIBE``).
    A ``MOVED`` reply, or a lost connection, has the caller ``refresh`` the slot
    map before it retries.

    Args:
        cluster: The waiter's cluster client (its slot map and its settings).
    """

    def __init__(self, cluster: AsyncCluster) -> None:
        self.cluster = cluster
        self._clients: dict[str, redis.asyncio.Redis] = {}

    async def owner(self, key: str) -> redis.asyncio.Redis:
        """The plain client of the master that owns ``key``'s slot (one try).

        Raises:
            redis.RedisError: The slot map could not be read.
        """
        await self.cluster.initialize()
        node = self.cluster.get_node_from_key(key)
        assert node is not None
        client = self._clients.get(node.name)
        if client is None:
            pool = redis.asyncio.ConnectionPool(
                connection_class=node.connection_class, **node.connection_kwargs
            )
            client = self._clients[node.name] = redis.asyncio.Redis(connection_pool=pool)
        return client

    async def refresh(self) -> None:
        """Read the slot map again (best effort: the caller's retry then reaches the owner)."""
        with contextlib.suppress(Exception):
            await self.cluster.nodes_manager.initialize()

    async def aclose(self) -> None:
        """Close the plain clients (not the cluster client)."""
        clients, self._clients = list(self._clients.values()), {}
        for client in clients:
            with contextlib.suppress(Exception):
                await client.aclose()


async def call_with_retries(
    operation: Callable[[], Awaitable[T]],
    config: BarrierConfig,
    *,
    action: str,
    deadline: float | None,
    clock: Callable[[], float],
    sleep: Callable[[float], Awaitable[None]],
) -> T:
    """``stepbarrier._redis.client.call_with_retries`` for a coroutine.

    Raises:
        RedisUnavailable: Still unreachable at the deadline.
        RedisRefused: A non-transient error, at once.
    """
    try:  # the first try without tenacity's machinery: thousands of waits call this
        return await operation()
    except (*REDIS_ERRORS, OSError) as exc:
        if deadline is not None and clock() >= deadline:
            # as tenacity would: no try starts after the deadline (the first one
            # may have ended past it: a bounded call, at a passed limit)
            error = exc if isinstance(exc, REDIS_ERRORS) else rex.ConnectionError(str(exc))
            raise translate(error, config, action=action, probe=False) from exc
        # else judged again below, by one more try and its retries
    settings = retry_settings(config, action=action, deadline=deadline, clock=clock)
    try:
        return await AsyncRetrying(sleep=sleep, **settings)(operation)
    except REDIS_ERRORS as exc:
        # no probe of the server: it would block the event loop
        raise translate(exc, config, action=action, probe=False) from exc
    except OSError as exc:  # a raw socket error (or a timeout) that redis-py did not wrap
        raise translate(rex.ConnectionError(str(exc)), config, action=action, probe=False) from exc


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable``, for ``seconds`` at most (a bounded call: see
    ``stepbarrier._redis.bounded``); a future or task is cancelled at the bound
    unless shielded.

    Raises:
        redis.TimeoutError: It took longer (transient: the caller retries within
            its deadline).
    """
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError as exc:
        raise _no_reply(seconds) from exc


def expiring(future: asyncio.Future[T], seconds: float) -> asyncio.Future[T]:
    """``future``, failed with ``redis.TimeoutError`` unless it is done within
    ``seconds``: ``within`` for a future of the caller's own, at the cost of a timer
    (a wait's read, on the path of every wait)."""
    timer = future.get_loop().call_later(seconds, _expire, future, seconds)
    future.add_done_callback(lambda _done: timer.cancel())
    return future


def _expire(future: asyncio.Future[Any], seconds: float) -> None:
    if not future.done():
        future.set_exception(_no_reply(seconds))


def _no_reply(seconds: float) -> rex.TimeoutError:
    return rex.TimeoutError(f"no reply from Redis within {seconds:.3g} s")


class AsyncRedisCode:
    """Runs stepbarrier's Lua code on a ``redis.asyncio`` client (see ``RedisCode``).

    Args:
        client: The client.
        config: The job's settings (``use_eval``, and the URL for messages).
    """

    def __init__(
        self, client: AsyncClient, config: BarrierConfig, owners: SlotOwners | None = None
    ) -> None:
        self._client = client
        self._config = config
        self._owners = owners
        self._load_lock = asyncio.Lock()
        self._sources = {
            name: scripts.HELPERS + body for name, (body, _read_only) in scripts.BODIES.items()
        }
        self._shas = {
            name: hashlib.sha1(source.encode()).hexdigest()
            for name, source in self._sources.items()
        }

    async def replies(self, calls: Sequence[Call]) -> list[Any]:
        """Run ``calls`` in one round trip, in order; each reply, or the error in its place.

        Code missing from the server is loaded (if this user may) and the calls
        run again.

        Raises:
            RedisRefused: The library is missing and this user may not load it,
                or the server has no Functions.
            redis.RedisError: The round trip itself failed (a connection error).
        """
        replies = await self._run(calls)
        if self._config.use_eval:
            if any(isinstance(r, rex.NoScriptError) for r in replies):
                await self._load_scripts(calls)
                replies = await self._run(calls)
        elif any(isinstance(r, Exception) and is_missing_function(r) for r in replies):
            await self._load_or_explain(next(r for r in replies if is_missing_function(r)))
            replies = await self._run(calls)
        return replies

    async def pipeline(self, calls: Sequence[Call]) -> list[Any]:
        """Like ``replies``, but raise the first call's error (as ``RedisCode.pipeline``)."""
        replies = await self.replies(calls)
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return replies

    async def _run(self, calls: Sequence[Call]) -> list[Any]:
        owners = self._owners
        if owners is None:
            return await self._send(self._client, calls)
        # every call of one job touches one slot: straight to its owner (as
        # RedisCode does on the blocking side)
        try:
            replies = await self._send(await owners.owner(calls[0][1][0]), calls)
        except (rex.ConnectionError, rex.TimeoutError, rex.ClusterError, OSError):
            await owners.refresh()  # the retry then reaches the current owner
            raise
        if any(
            isinstance(r, (rex.ConnectionError, rex.TimeoutError, rex.AskError)) for r in replies
        ):
            await owners.refresh()  # AskError: MOVED too
        return replies

    async def _send(self, client: Any, calls: Sequence[Call]) -> list[Any]:
        pipe = client.pipeline(transaction=False)
        for name, keys, args in calls:
            if self._config.use_eval:
                pipe.execute_command("EVALSHA", self._shas[name], len(keys), *keys, *args)
            else:
                pipe.execute_command(*function_command(name, keys, args))
        return list(await pipe.execute(raise_on_error=False))

    async def _load_scripts(self, calls: Sequence[Call]) -> None:
        for name in sorted({name for name, _keys, _args in calls}):
            if self._owners is not None:
                owner = await self._owners.owner(calls[0][1][0])
                await owner.script_load(self._sources[name])
            else:
                await self._client.script_load(self._sources[name])

    async def _load_or_explain(self, missing: BaseException) -> None:
        if "unknown command" in str(missing).lower():
            raise explain_refusal(self._config, missing, None) from missing
        async with self._load_lock:
            try:
                await self._client.function_load(library_source(), replace=False)
                return
            except rex.ResponseError as exc:
                if "already exists" in str(exc):
                    return  # another client loaded it meanwhile
                refusal: BaseException = exc
            except rex.RedisError as exc:
                refusal = exc
        try:
            versions: list[int] | None = parse_versions(
                await self._client.function_list(library="stepbarrier_v*")
            )
        except rex.RedisError:
            versions = None
        raise explain_refusal(self._config, missing, versions) from refusal
