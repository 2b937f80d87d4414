"""Error kinds as types: ``BarrierTimeout.limit`` says which limit ended a wait."""

from __future__ import annotations

import logging
import typing

import pytest

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
def test_a_step_waits_timeout_names_its_limit(stalled: bool, progress: bool, limit: str) -> None:
    error = rules(progress_timeout=10.0).timeout(stalled=stalled, progress=progress)
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
