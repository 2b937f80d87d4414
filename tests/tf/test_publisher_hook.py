"""The chief's GlobalStepPublisherHook in real (local) MonitoredSessions."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from examples.demo.local import free_port
from stepbarrier import BarrierAborted, BarrierConfig, StepPublisher, StepWaiter, read_status
from stepbarrier.tf_hooks import FETCH_EVERY, GlobalStepPublisherHook, GlobalStepWaiterHook
from tests.tf.tf_graphs import NO_EXTRAS, CrashOnce, SessionAt, Waiting, context, wait_registered

pytestmark = pytest.mark.tensorflow


@pytest.fixture
def graph() -> Iterator[tuple[Any, Any]]:
    """A fresh graph with a global step and its increment (the train op's result)."""
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        yield global_step, tf.compat.v1.assign_add(global_step, 1)


def test_begin_without_a_global_step_raises_runtime_error(config: BarrierConfig) -> None:
    with tf.Graph().as_default(), pytest.raises(RuntimeError, match="Global step"):
        GlobalStepPublisherHook(config).begin()


def test_the_chief_publishes_its_exact_final_step_at_the_end_without_finishing_the_job(
    config: BarrierConfig, graph: tuple[Any, Any]
) -> None:
    _, increment = graph
    hook = GlobalStepPublisherHook(config)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        for _ in range(5):
            session.run(increment)
        assert hook.publisher is not None and hook.publisher.flush(10)
        status = read_status(config)
        # never ahead; behind by the runs since the last fetch (no worker waits)
        assert status.step is not None and 5 - FETCH_EVERY <= status.step <= 5
        assert not status.done
    status = read_status(config)
    # no last_step: a session's end is not the job's (test_chief_lifecycle.py)
    assert (status.step, status.done) == (5, False)
    assert hook.publisher is None


def test_a_worker_wakes_with_the_run_that_reached_its_step_and_never_earlier(
    config: BarrierConfig, graph: tuple[Any, Any]
) -> None:
    _, increment = graph
    worker = Waiting(lambda: StepWaiter(config).wait(7, timeout=60))
    wait_registered(config)
    hook = GlobalStepPublisherHook(config)
    stored: list[tuple[int, int]] = []
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        for _ in range(20):
            truth = int(session.run(increment))
            assert hook.publisher is not None and hook.publisher.flush(10)
            stored.append((truth, read_status(config).step or 0))
            if truth == 7:
                assert worker.join() == 7
    assert all(published <= truth for truth, published in stored), stored
    assert (7, 7) in stored
    # the extra read happens only around the step someone waits for
    assert hook.verifications <= 3


def test_with_redis_down_the_hook_reads_no_extra_global_step(
    job: str, graph: tuple[Any, Any]
) -> None:
    """Until a generation's first write gets through, ``next_threshold`` is -1:
    an extra ``session.run(global_step)`` per step would confirm nothing."""
    _, increment = graph
    config = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    hook = GlobalStepPublisherHook(config)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        for _ in range(2000):
            session.run(increment)
        publisher = hook.publisher
        assert publisher is not None and publisher.next_threshold == -1  # nothing got through
        publisher.close(done=False, timeout=0.1)  # spares end() its 10 s of retries
    assert hook.verifications == 0


@pytest.mark.usefixtures("long_heartbeats")
def test_a_new_session_publishes_its_step_without_waiting_for_a_heartbeat(
    make_config: Callable[..., BarrierConfig], graph: tuple[Any, Any]
) -> None:
    _, increment = graph
    config = make_config(heartbeat=60.0, stall_timeout=120.0)
    worker = Waiting(lambda: StepWaiter(config).wait(1000, timeout=60))
    wait_registered(config)  # the chief hears of this worker before its first write
    hook = GlobalStepPublisherHook(config, last_step=3)
    with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as session:
        deadline = time.monotonic() + 20  # far below the 60 s heartbeat
        while read_status(config).step is None:
            assert time.monotonic() < deadline, "the session's step waits for a heartbeat"
            time.sleep(0.01)
        for _ in range(3):
            session.run(increment)
    assert isinstance(worker.outcome(), BarrierAborted)  # the job ended at 3, below 1000


@pytest.mark.usefixtures("long_heartbeats")
def test_the_first_publish_writes_at_once_even_when_a_registration_came_first(
    make_config: Callable[..., BarrierConfig],
) -> None:
    """Guards the core fix the hooks rely on after ``new_generation()``.

    A registration heard before a generation's first write used to raise
    ``next_threshold`` above the step, so that write waited for a heartbeat.
    """
    config = make_config(heartbeat=60.0, stall_timeout=120.0)
    worker = Waiting(lambda: StepWaiter(config).wait(1000, timeout=60))
    wait_registered(config)
    with StepPublisher(config) as publisher:
        time.sleep(0.5)  # let the publisher's listener hear of the worker first
        assert publisher.next_threshold == -1.0
        publisher.publish(3)
        deadline = time.monotonic() + 20  # far below the 60 s heartbeat
        while read_status(config).step != 3:
            assert time.monotonic() < deadline, "the first write waits for a heartbeat"
            time.sleep(0.01)
    assert isinstance(worker.outcome(), BarrierAborted)


def test_a_chief_restored_from_a_checkpoint_makes_workers_wait_for_the_real_step(
    config: BarrierConfig, tmp_path: Path
) -> None:
    checkpoints = tmp_path / "checkpoints"
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        saver = tf.compat.v1.train.Saver()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            session.run(global_step.assign(10))
            saver.save(session, str(checkpoints / "model"), global_step=10)

    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(global_step, 1)
        hook, crash = GlobalStepPublisherHook(config), CrashOnce()
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=str(checkpoints), hooks=[hook, crash], **NO_EXTRAS
        ) as session:
            assert [int(session.run(increment)) for _ in range(20)][-1] == 30
            assert hook.publisher is not None and hook.publisher.flush(10)
            before = read_status(config)
            assert before.step is not None and 30 - FETCH_EVERY <= before.step <= 30

            # The ps restarts: MonitoredSession restores the checkpoint (step 10).
            crash.armed = True
            assert int(session.run(increment)) == 11
            assert hook.publisher is not None and hook.publisher.flush(10)
            after = read_status(config)
            assert after.step in (10, 11)
            assert after.generation is not None and before.generation is not None
            assert after.generation > before.generation

            # A worker waiting for 20 (between 11 and the old 30) waits for the real 20.
            def wait_with_hook() -> int | None:
                with tf.Graph().as_default():
                    tf.compat.v1.train.get_or_create_global_step()
                    waiter = GlobalStepWaiterHook(20, config)
                    waiter.begin()
                    waiter.before_run(context(SessionAt()))
                    return waiter.released_at_step

            worker = Waiting(wait_with_hook)
            wait_registered(config)
            for expected in range(12, 21):
                assert int(session.run(increment)) == expected
                assert hook.publisher is not None and hook.publisher.flush(10)
                if expected < 20:
                    assert worker.thread.is_alive(), f"released at chief step {expected}"
            assert worker.join() == 20
    assert crash.sessions == 2
