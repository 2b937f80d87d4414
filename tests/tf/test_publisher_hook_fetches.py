"""What the chief's GlobalStepPublisherHook fetches, and when it may skip a fetch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import tensorflow as tf

import stepbarrier._integrations.fetch_schedule
from stepbarrier import BarrierConfig, StepWaiter, read_status
from stepbarrier.tf_hooks import FETCH_EVERY, GlobalStepPublisherHook, StepLead
from tests.tf.tf_graphs import NO_EXTRAS, Waiting, wait_registered

pytestmark = pytest.mark.tensorflow


class CountingHook(GlobalStepPublisherHook):
    """The publisher hook, counting the runs it fetched the global step with."""

    fetches = 0

    def before_run(self, run_context: Any) -> Any:
        request = super().before_run(run_context)
        self.fetches += request is not None
        return request


@pytest.fixture
def short_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run counts as short, whatever this machine's load: skipping is by runs alone."""
    monkeypatch.setattr(stepbarrier._integrations.fetch_schedule, "FETCH_WITHIN", 1e9)


@pytest.fixture
def increment() -> Iterator[Any]:
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        yield tf.compat.v1.assign_add(global_step, 1)


def test_with_tensorflows_step_counter_the_hook_fetches_the_tensor_it_fetches(
    config: BarrierConfig, increment: Any
) -> None:
    counter = tf.compat.v1.train.StepCounterHook(every_n_steps=100, output_dir=None)
    hook = GlobalStepPublisherHook(config)  # first: its begin() runs before the counter's
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook, counter], **NO_EXTRAS) as session:
        session.run(increment)
        # one tensor: a run that fetches it for both reads the step once
        assert hook._global_step is counter._global_step_tensor


def test_alone_the_hook_fetches_the_variable(config: BarrierConfig, increment: Any) -> None:
    hook = GlobalStepPublisherHook(config)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        session.run(increment)
        assert hook._global_step is tf.compat.v1.train.get_global_step()


def test_with_no_worker_waiting_the_step_is_fetched_with_one_run_in_fetch_every(
    config: BarrierConfig, increment: Any, short_runs: None
) -> None:
    hook = CountingHook(config)
    runs = 400
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        for _ in range(runs):
            session.run(increment)
        assert hook.publisher is not None and hook.publisher.flush(10)
        stored = read_status(config).step
    assert hook.fetches <= runs / FETCH_EVERY + 5, hook.fetches
    assert stored is not None and runs - FETCH_EVERY <= stored <= runs  # never ahead
    assert read_status(config).step == runs  # end() publishes the exact final step


def test_a_worker_is_released_by_the_run_that_reaches_its_step_while_fetches_are_skipped(
    config: BarrierConfig, increment: Any, short_runs: None
) -> None:
    target = 150
    worker = Waiting(lambda: StepWaiter(config).wait(target, timeout=60))
    wait_registered(config)
    hook = CountingHook(config)
    stored: list[tuple[int, int]] = []
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        for _ in range(target + 20):
            truth = int(session.run(increment))
            assert hook.publisher is not None and hook.publisher.flush(10)
            stored.append((truth, read_status(config).step or 0))
            if truth < target:
                assert worker.thread.is_alive(), f"released at chief step {truth}"
            elif truth == target:
                assert worker.join() == target  # by the run that reached it
    assert all(published <= truth for truth, published in stored), stored
    assert hook.fetches < target / 2, hook.fetches  # far from the target, runs skipped it


def test_runs_longer_than_fetch_within_fetch_the_step_every_time(
    config: BarrierConfig, increment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # every run counts as long
    monkeypatch.setattr(stepbarrier._integrations.fetch_schedule, "FETCH_WITHIN", 1e-9)
    hook = CountingHook(config)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        for _ in range(50):
            session.run(increment)
    assert hook.fetches == 50


def test_the_lead_is_learnt_per_run_from_sparse_fetches() -> None:
    lead = StepLead()
    lead.restart(0)
    assert lead.observe(40, runs=8) == 5  # 40 steps over 8 runs: 5 a run
    assert lead.observe(43, runs=2) == 5  # the largest recent move is kept
    assert lead.observed == 2
