"""The arrival rule the TF hooks and Keras callbacks share (``barrier_arrival``):
a timeout raises unless the job says ``on_timeout="proceed"``, and then the task
logs who is missing and goes on. Against a real redis-server; the hooks and
callbacks themselves under "proceed" are in tests/tf/test_barrier_callbacks.py."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable

import pytest

from stepbarrier import Barrier, BarrierConfig, BarrierTimeout, ConfigurationError, read_status
from stepbarrier._integrations.barrier_arrival import (
    Arrival,
    BarrierSpec,
    arrive,
    arrive_at_end,
    check_task,
)

log = logging.getLogger("tests.barrier_arrival")


def test_a_timeout_raises_unless_the_job_says_proceed(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(task_id=0)
    assert not Barrier(dataclasses.replace(config, task_id=2), "start", 3).arrive(wait=False)
    with pytest.raises(BarrierTimeout) as info:
        arrive(config, BarrierSpec(3, "start", timeout=0.3), log)
    assert info.value.missing == (1,)


def test_proceed_logs_the_missing_tasks_and_returns_them(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(task_id=0, on_timeout="proceed")
    with caplog.at_level(logging.WARNING, logger=log.name):
        arrival = arrive(config, BarrierSpec(4, "end", timeout=0.3), log, then="starting")
    assert arrival == Arrival(complete=False, missing=(1, 2, 3))
    (record,) = caplog.records
    assert "missing task(s) 1, 2, 3" in record.getMessage()
    assert record.getMessage().endswith("; starting as STEPBARRIER_ON_TIMEOUT=proceed says")


def test_a_complete_barrier_and_an_arrival_that_does_not_wait(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(task_id=1)
    spec = BarrierSpec(2, "end", timeout=5.0)
    assert arrive(config, spec, log, wait=False) == Arrival(complete=False)
    chief = dataclasses.replace(config, task_id=0)
    assert arrive(chief, spec, log) == Arrival(complete=True)


@pytest.mark.parametrize(
    ("parties", "name"), [(0, "start"), (-1, "start"), (3, ""), (3, "a b"), (3, "x" * 65)]
)
def test_a_bad_spec_is_refused_when_made(parties: int, name: str) -> None:
    with pytest.raises(ConfigurationError):
        BarrierSpec(parties, name)


def test_a_task_outside_the_parties_is_refused_without_io() -> None:
    config = BarrierConfig(job="j", redis_url="redis://127.0.0.1:1/0", task_id=5)
    with pytest.raises(ConfigurationError, match="task"):
        check_task(config, BarrierSpec(3, "start"))


def test_the_chief_finishes_the_job_only_once_the_end_barrier_is_complete(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    chief = make_config(task_id=0, on_timeout="proceed")
    worker = dataclasses.replace(chief, task_id=1)
    spec = BarrierSpec(2, "end", timeout=0.3)
    # alone at the barrier: the timeout is let pass, and nothing is finished
    incomplete = arrive_at_end(chief, spec, log, wait=None, finish=True, final_step=lambda: 7)
    assert incomplete == Arrival(complete=False, missing=(1,))
    assert not read_status(chief).done
    # a worker arrives and goes (wait=None: only the chief waits) ...
    assert arrive_at_end(worker, spec, log, wait=None, finish=True, final_step=lambda: 99) == (
        Arrival(complete=True)
    )
    assert not read_status(chief).done  # ... and never finishes the job itself
    # the chief, again, at a complete barrier: the job ends at the step read after the wait
    done = arrive_at_end(chief, spec, log, wait=None, finish=True, final_step=lambda: 7)
    assert done == Arrival(complete=True)
    status = read_status(chief)
    assert status.done and status.step == 7
    # no global step to finish at: a warning, not a wrong step
    other = make_config(job=f"{chief.job}-b", task_id=0)
    arrive(dataclasses.replace(other, task_id=1), spec, log, wait=False)
    with caplog.at_level(logging.WARNING, logger=log.name):
        arrive_at_end(other, spec, log, wait=None, finish=True, final_step=lambda: None)
    assert "no global step to finish the job at" in caplog.text
    assert not read_status(other).done
