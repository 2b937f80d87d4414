"""The asyncio side of the connection: a ``redis.asyncio`` client, retries, and our code.

The same rules as ``stepbarrier._redis.client`` and ``stepbarrier._redis.functions``, on
``redis.asyncio``: the client's own retries are off and transient errors are
retried (with the same backoff) within the caller's deadline; everything else
becomes a clear ``RedisRefused`` at once; the Lua code runs as the Functions
library (loaded by the client if it may), or as ``EVALSHA`` scripts with
``use_eval``.

Supported: a Redis named by URL (``redis://``, ``rediss://`` with the TLS
settings, ``unix://``), with ACL users. Not yet: Redis Cluster and Sentinel,
which raise ``ConfigurationError`` (``StepWaiter`` supports both).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

import redis.asyncio
from redis import exceptions as rex
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from tenacity import AsyncRetrying

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol import library as scripts
from stepbarrier._redis.client import CONNECT_TIMEOUT, SOCKET_TIMEOUT, url_for_client
from stepbarrier._redis.client import _tls_options as tls_options
from stepbarrier._redis.failures import REDIS_ERRORS, translate
from stepbarrier._redis.functions import (
    Call,
    explain_refusal,
    function_command,
    is_missing_function,
    library_source,
    parse_versions,
)
from stepbarrier._redis.retries import retry_settings
from stepbarrier.errors import ConfigurationError

T = TypeVar("T")

AsyncClient = redis.asyncio.Redis
"""The client of an ``AsyncStepWaiter``."""


def check_async_support(config: BarrierConfig) -> None:
    """Raise ``ConfigurationError`` for a deployment the asyncio waiter does not support yet.

    Raises:
        ConfigurationError: ``config`` names a Redis Cluster or Sentinels.
    """
    unsupported = (
        ("Redis Cluster", "STEPBARRIER_REDIS_CLUSTER")
        if config.redis_cluster
        else ("Sentinel", "STEPBARRIER_SENTINELS")
        if config.sentinels
        else None
    )
    if unsupported is not None:
        what, variable = unsupported
        raise ConfigurationError(
            f"AsyncStepWaiter does not support {what} yet ({variable} is set); StepWaiter "
            "does: run it in a thread, e.g. `await asyncio.to_thread(StepWaiter(config).wait, "
            "step)`, or use a Redis named by STEPBARRIER_REDIS_URL",
            variable=variable,
            job=config.job,
        )


def make_async_client(config: BarrierConfig) -> AsyncClient:
    """A ``redis.asyncio`` client for ``config.redis_url`` (no I/O until first used).

    Raises:
        ConfigurationError: A Redis Cluster or Sentinels (not supported yet).
    """
    check_async_support(config)
    options: dict[str, Any] = {
        "socket_timeout": SOCKET_TIMEOUT,
        "socket_connect_timeout": CONNECT_TIMEOUT,
        "retry": Retry(NoBackoff(), 0),
        "health_check_interval": 0,
        "decode_responses": False,
    }
    if config.redis_username is not None:
        options["username"] = config.redis_username
    if config.redis_password is not None:
        options["password"] = config.redis_password
    if config.redis_url.startswith("rediss://"):
        options.update(tls_options(config))
    return redis.asyncio.Redis.from_url(url_for_client(config), **options)


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
    except (*REDIS_ERRORS, OSError):
        pass  # judged again below, by one more try and its retries
    settings = retry_settings(config, action=action, deadline=deadline, clock=clock)
    try:
        return await AsyncRetrying(sleep=sleep, **settings)(operation)
    except REDIS_ERRORS as exc:
        raise translate(exc, config, action=action) from exc
    except OSError as exc:  # a raw socket error (or a timeout) that redis-py did not wrap
        raise translate(rex.ConnectionError(str(exc)), config, action=action) from exc


class AsyncRedisCode:
    """Runs stepbarrier's Lua code on a ``redis.asyncio`` client (see ``RedisCode``).

    Args:
        client: The client.
        config: The job's settings (``use_eval``, and the URL for messages).
    """

    def __init__(self, client: AsyncClient, config: BarrierConfig) -> None:
        self._client = client
        self._config = config
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
        pipe = self._client.pipeline(transaction=False)
        for name, keys, args in calls:
            if self._config.use_eval:
                pipe.execute_command("EVALSHA", self._shas[name], len(keys), *keys, *args)
            else:
                pipe.execute_command(*function_command(name, keys, args))
        return list(await pipe.execute(raise_on_error=False))

    async def _load_scripts(self, calls: Sequence[Call]) -> None:
        for name in sorted({name for name, _keys, _args in calls}):
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
