"""Error kinds as types: ``BarrierTimeout.limit`` says which limit ended a wait."""

from __future__ import annotations

import asyncio
import logging
import typing

import pytest
import redis

from stepbarrier import BarrierConfig
from stepbarrier._worker.wait_state import WaitRules
from stepbarrier.errors import (
    BarrierTimeout,
    RedisRefused,
    RedisUnavailable,
    RefusalKind,
    TimeoutLimit,
)


def rules(**settings: object) -> WaitRules:
    config = BarrierConfig(job="kinds", task_id=1, **settings)  # type: ignore[arg-type]
    return WaitRules(config, 5, 30.0, lambda: 100.0, logging.getLogger("test"))


@pytest.mark.parametrize(
    ("stalled", "progress", "limit"),
    [(False, False, "deadline"), (True, False, "stall"), (True, True, "progress")],
)
def test_a_step_waits_timeout_names_its_limit(
    stalled: bool, progress: bool, limit: TimeoutLimit
) -> None:
    error = rules(progress_timeout=10.0).timed_out(limit)
    assert error.limit == limit and error.stalled is stalled


def test_an_unreachable_redis_names_the_limit_it_retried_until() -> None:
    wait = rules(stall_timeout=60.0)
    wait.reset_marker = None  # Redis was reached once
    error = wait.unreachable(RedisUnavailable("down"))
    assert isinstance(error, BarrierTimeout)
    assert (error.limit, error.stalled) == ("deadline", False)  # 30 s comes before 60 s


def test_the_limit_defaults_from_stalled_and_the_literals_are_the_documented_ones() -> None:
    assert BarrierTimeout("late").limit == "deadline"
    assert BarrierTimeout("late", stalled=True).limit == "stall"
    assert set(typing.get_args(TimeoutLimit)) == {"deadline", "stall", "progress"}
    kinds = {"authentication", "permission", "tls", "response", "functions"}
    assert set(typing.get_args(RefusalKind)) == kinds
    assert RedisRefused("no", kind="tls").kind == "tls"


class _LostWhileLoading:
    """Stands in for a redis-py client whose every command fails with ``error`` as it
    loads the library (a Redis restarted at that moment, a replica not yet synced)."""

    def __init__(self, error: redis.RedisError) -> None:
        self.error = error

    def execute_command(self, *command: object) -> object:
        raise self.error

    async def function_load(self, *args: object, **kwargs: object) -> object:
        raise self.error

    async def function_list(self, *args: object, **kwargs: object) -> object:
        raise self.error


@pytest.mark.parametrize(
    "error",
    [
        redis.ConnectionError("Connection closed by server."),
        redis.ReadOnlyError("You can't write against a read only replica."),
        redis.ResponseError("LOADING Redis is loading the dataset in memory"),
    ],
    ids=["connection lost", "READONLY", "LOADING"],
)
def test_a_connection_lost_while_loading_the_library_is_transient_not_a_refusal(
    error: redis.RedisError,
) -> None:
    """The library found missing (a Redis restarted empty) and the connection lost as
    the client loads it: the call fails with the connection error, which its caller
    retries, not with RedisRefused("... may not load it"), which ended a wait (seen
    in the stateful fault test, a Redis restarted twice in a row)."""
    from stepbarrier._redis.aio_client import AsyncRedisCode
    from stepbarrier._redis.functions import RedisCode

    config = BarrierConfig(job="j", redis_url="redis://127.0.0.1:1/0")
    missing = redis.ResponseError("ERR Function not found")
    with pytest.raises(type(error)):
        RedisCode(_LostWhileLoading(error), config)._load_or_explain(missing)  # type: ignore[arg-type]
    code = AsyncRedisCode(_LostWhileLoading(error), config)  # type: ignore[arg-type]
    with pytest.raises(type(error)):
        asyncio.run(code._load_or_explain(missing))
