"""schedule_wait_until_step: TF's log ramp, a linear ramp, none."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stepbarrier import ConfigurationError, schedule_wait_until_step


def test_log_ramp_matches_tensorflows_formula() -> None:
    for task in range(10):
        assert schedule_wait_until_step(task, "log:10") == int(10 * math.log(task + 1))


def test_chief_never_waits() -> None:
    assert schedule_wait_until_step(0, "log:100") == 0
    assert schedule_wait_until_step(0, "linear:100") == 0


def test_linear_and_none() -> None:
    assert schedule_wait_until_step(4, "linear:25") == 100
    assert schedule_wait_until_step(4, "none") == 0
    assert schedule_wait_until_step(3, " LOG : 2.5 ") == int(2.5 * math.log(4))


@pytest.mark.parametrize("spec", ["", "log", "log:", "log:x", "exp:2", "log:-1", "linear:1e400"])
def test_bad_specs(spec: str) -> None:
    with pytest.raises(ConfigurationError):
        schedule_wait_until_step(1, spec)


@pytest.mark.parametrize("task", [-1, True, 1.5])
def test_bad_task_ids(task: object) -> None:
    with pytest.raises(ConfigurationError):
        schedule_wait_until_step(task, "log:1")  # type: ignore[arg-type]


@given(st.integers(0, 10_000), st.floats(0, 1e6, allow_nan=False))
def test_log_ramp_is_non_decreasing_in_the_task_id(task: int, factor: float) -> None:
    spec = f"log:{factor:.6f}"
    assert schedule_wait_until_step(task, spec) <= schedule_wait_until_step(task + 1, spec)
