"""The asyncio side of the connection: the blocking side's rules on ``redis.asyncio``
(``build_client``, ``retry_settings``, ``CodeCommands``), and ``SlotOwners``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

import redis.asyncio
from redis import exceptions as rex
from redis.asyncio.cluster import RedisCluster as AsyncCluster
from redis.asyncio.retry import Retry
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from tenacity import AsyncRetrying

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import Call
from stepbarrier._redis.client import (
    SOCKET_TIMEOUT,
    ClientKind,
    build_client,
    healthy_master,
    no_master,
    sentinel_address,
)
from stepbarrier._redis.failures import REDIS_ERRORS, translate
from stepbarrier._redis.functions import (
    CodeCommands,
    load_library,
    needs_refresh,
    raise_first,
)
from stepbarrier._redis.retries import retry_settings

T = TypeVar("T")

AsyncClient = redis.asyncio.Redis | AsyncCluster
"""The client of an ``AsyncStepWaiter``: one server (direct or through Sentinel) or a Cluster."""


class _AsyncSentinels(AsyncSentinel):
    """``stepbarrier._redis.client._Sentinels`` on ``redis.asyncio``."""

    async def discover_master(self, service_name: str) -> tuple[str, int]:
        errors: list[tuple[str, rex.RedisError]] = []
        for index, node in enumerate(self.sentinels):
            try:
                masters = cast(dict[str, dict[str, Any]], await node.sentinel_masters())
            except (rex.ConnectionError, rex.TimeoutError) as exc:
                errors.append((sentinel_address(node), exc))
                continue
            if (found := healthy_master(self, index, masters, service_name)) is not None:
                return found
        raise no_master(service_name, errors)


ASYNC = ClientKind(
    redis=redis.asyncio.Redis, cluster=AsyncCluster, sentinels=_AsyncSentinels, retry=Retry
)
"""The asyncio side's classes."""


def make_async_client(config: BarrierConfig) -> AsyncClient:
    """A ``redis.asyncio`` client for the job's Redis, as ``make_client`` (no I/O)."""
    return cast(AsyncClient, build_client(config, ASYNC, socket_timeout=SOCKET_TIMEOUT))


class SlotOwners:
    """Plain clients of a cluster's masters, one per node, made on first use (a cluster
    pipeline would first ask a node for the keys of each ``FCALL``)."""

    def __init__(self, cluster: AsyncCluster) -> None:
        self.cluster = cluster
        self._clients: dict[str, redis.asyncio.Redis] = {}

    async def owner(self, key: str) -> redis.asyncio.Redis:
        """The plain client of ``key``'s slot's master (one try at the slot map)."""
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
    """``stepbarrier._redis.retries.call_with_retries`` for a coroutine (no probe of the
    server in its messages: it would block the event loop)."""
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
    except (*REDIS_ERRORS, OSError) as exc:  # OSError: a raw socket error redis-py did not wrap
        error = exc if isinstance(exc, REDIS_ERRORS) else rex.ConnectionError(str(exc))
        raise translate(error, config, action=action, probe=False) from exc


async def within(awaitable: Awaitable[T], seconds: float) -> T:
    """``await awaitable``, for ``seconds`` at most (``stepbarrier._redis.bounded``), else a
    ``redis.TimeoutError``; a future or task is cancelled at the bound unless shielded."""
    try:
        return await asyncio.wait_for(awaitable, seconds)
    except asyncio.TimeoutError as exc:
        raise _no_reply(seconds) from exc


def expiring(future: asyncio.Future[T], seconds: float) -> asyncio.Future[T]:
    """``future``, failed with ``redis.TimeoutError`` unless done within ``seconds``:
    ``within`` at the cost of a timer only (a wait's read, on every wait's path)."""
    timer = future.get_loop().call_later(seconds, _expire, future, seconds)
    future.add_done_callback(lambda _done: timer.cancel())
    return future


def _expire(future: asyncio.Future[Any], seconds: float) -> None:
    if not future.done():
        future.set_exception(_no_reply(seconds))


def _no_reply(seconds: float) -> rex.TimeoutError:
    return rex.TimeoutError(f"no reply from Redis within {seconds:.3g} s")


class AsyncRedisCode:
    """Runs stepbarrier's Lua code on a ``redis.asyncio`` client, as ``RedisCode`` does
    (``owners``: a Cluster's, which the calls go to)."""

    def __init__(
        self, client: AsyncClient, config: BarrierConfig, owners: SlotOwners | None = None
    ) -> None:
        self._client = client
        self._config = config
        self._owners = owners
        self._load_lock = asyncio.Lock()
        self._code = CodeCommands(config.use_eval)

    async def replies(self, calls: Sequence[Call]) -> list[Any]:
        """``RedisCode.replies`` (without its bound: see ``within``)."""
        replies = await self._run(calls)
        sources, missing = self._code.lacking(calls, replies)
        for source in sources:
            await (await self._target(calls)).script_load(source)
        if missing is not None:
            await self._load_or_explain(missing)
        return await self._run(calls) if sources or missing is not None else replies

    async def pipeline(self, calls: Sequence[Call]) -> list[Any]:
        """``RedisCode.pipeline``."""
        replies = await self.replies(calls)
        raise_first(replies)
        return replies

    async def _target(self, calls: Sequence[Call]) -> Any:
        # every call of one job touches one slot: straight to its owner
        return self._client if self._owners is None else await self._owners.owner(calls[0][1][0])

    async def _run(self, calls: Sequence[Call]) -> list[Any]:
        try:
            pipe = (await self._target(calls)).pipeline(transaction=False)
            for command in self._code.commands(calls):
                pipe.execute_command(*command)
            replies = list(await pipe.execute(raise_on_error=False))
        except (rex.ConnectionError, rex.TimeoutError, rex.ClusterError, OSError):
            if self._owners is not None:
                await self._owners.refresh()  # the retry then reaches the current owner
            raise
        if self._owners is not None and needs_refresh(replies):
            await self._owners.refresh()
        return replies

    async def _load_or_explain(self, missing: BaseException) -> None:
        """``RedisCode._load_or_explain``."""
        steps = load_library(self._config, missing)
        async with self._load_lock:
            with contextlib.suppress(StopIteration):
                command = next(steps)
                while True:
                    try:  # the reply, or the Redis error in its place
                        reply = await self._client.execute_command(*command)
                    except rex.RedisError as exc:
                        reply = exc
                    command = steps.send(reply)
