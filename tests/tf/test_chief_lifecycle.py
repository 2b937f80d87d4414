"""How a TensorFlow chief's sessions end, and what that does to waiting workers.

``GlobalStepPublisherHook.end()`` runs whenever a chief's session closes: at the
end of training, but also when a crashed chief's ``try/finally`` closes it, and
at the end of each session of a chief that trains in several. Only reaching
``last_step`` finishes the job. A chief that a newer one took over stays quiet.
The tests that prove a row of the comparison table in docs/tensorflow-keras.md
("Parity with TensorFlow's hook") name it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import tensorflow as tf

from stepbarrier import BarrierAborted, BarrierConfig, StepPublisher, StepWaiter, read_status
from stepbarrier.tf_hooks import GlobalStepPublisherHook
from tests.tf.tf_graphs import NO_EXTRAS, CrashOnce, Waiting, wait_registered

pytestmark = pytest.mark.tensorflow


class SimulatedCrash(Exception):
    """The chief's training code fails."""


def waiting_for(config: BarrierConfig, step: int) -> Waiting:
    return Waiting(lambda: StepWaiter(config).wait(step, timeout=60))


def train_segment(
    hook: GlobalStepPublisherHook, checkpoints: Path, last_step: int
) -> list[tuple[int, int]]:
    """One session of a chief that trains in several: restores the step, stops at
    ``last_step``, checkpoints at the end. Returns ``(truth, published)`` per run."""
    runs: list[tuple[int, int]] = []
    with tf.Graph().as_default():
        increment = tf.compat.v1.assign_add(tf.compat.v1.train.get_or_create_global_step(), 1)
        stop = tf.compat.v1.train.StopAtStepHook(last_step=last_step)
        with tf.compat.v1.train.MonitoredTrainingSession(
            checkpoint_dir=str(checkpoints),
            hooks=[hook, stop],
            **{**NO_EXTRAS, "save_checkpoint_steps": 10_000},  # saved at the session's end
        ) as session:
            while not session.should_stop():
                truth = int(session.run(increment))
                assert hook.publisher is not None and hook.publisher.flush(10)
                runs.append((truth, read_status(hook.publisher.config).step or 0))
    return runs


@pytest.fixture
def increment() -> Iterator[Any]:
    """The increment of a fresh graph's global step (the train op's result)."""
    with tf.Graph().as_default():
        yield tf.compat.v1.assign_add(tf.compat.v1.train.get_or_create_global_step(), 1)


def test_a_crashed_chief_closing_its_session_in_finally_does_not_abort_the_waiters(
    config: BarrierConfig, increment: Any
) -> None:
    """Row "the chief's training code fails, and it closes its session in
    `try/finally`" of the comparison table in docs/tensorflow-keras.md: the end of
    the session (``end()`` runs) does not finish the job, the worker waits on, and a
    new chief releases it at its step."""
    worker = waiting_for(config, 30)
    wait_registered(config)
    with pytest.raises(SimulatedCrash):
        session = tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[GlobalStepPublisherHook(config)], **NO_EXTRAS
        )
        try:
            for _ in range(10):
                session.run(increment)
            raise SimulatedCrash
        finally:
            session.close()  # runs end(), as in any chief's try/finally
    status = read_status(config)
    assert (status.step, status.done) == (10, False)

    # A new chief (no checkpoint: it starts again from 0) releases the worker.
    with tf.Graph().as_default():
        restarted = tf.compat.v1.assign_add(tf.compat.v1.train.get_or_create_global_step(), 1)
        hook = GlobalStepPublisherHook(config)
        with tf.compat.v1.train.MonitoredTrainingSession(hooks=[hook], **NO_EXTRAS) as new:
            while int(new.run(restarted)) < 30:
                assert hook.publisher is not None and hook.publisher.flush(10)
                assert worker.thread.is_alive(), "released below step 30"
            assert worker.join() == 30


def test_a_chief_training_in_two_sessions_keeps_the_workers_of_the_second_waiting(
    config: BarrierConfig, tmp_path: Path
) -> None:
    """Row "a chief trains in two sessions, with a gap longer than the stall timeout"
    of the comparison table in docs/tensorflow-keras.md, without the gap (that is
    ``tests/tf/test_drop_in.py``): the first session's end finishes nothing, the
    worker waits on and the second session releases it."""
    worker = waiting_for(config, 30)
    wait_registered(config)
    hook = GlobalStepPublisherHook(config)
    first = train_segment(hook, tmp_path, last_step=20)
    status = read_status(config)
    assert (status.step, status.done) == (20, False)  # end() published the exact step
    assert worker.thread.is_alive()

    second = train_segment(hook, tmp_path, last_step=40)
    assert second[0][0] == 21  # restored from the first session's checkpoint
    assert worker.join() == 30
    assert all(published <= truth for truth, published in first + second)
    status = read_status(config)
    assert (status.step, status.done) == (40, False)  # no last_step: the job goes on


def test_the_session_that_reaches_last_step_finishes_the_job(
    config: BarrierConfig, tmp_path: Path
) -> None:
    """Row "the chief's training code fails, and it closes its session in
    `try/finally`" of the comparison table in docs/tensorflow-keras.md, its other
    side: only the session that reaches ``last_step`` finishes the job."""
    in_time, too_late = waiting_for(config, 30), waiting_for(config, 45)
    wait_registered(config, 2)
    hook = GlobalStepPublisherHook(config, last_step=40)
    train_segment(hook, tmp_path, last_step=20)
    assert not read_status(config).done  # 20 < last_step
    train_segment(hook, tmp_path, last_step=40)
    assert in_time.join() == 30
    aborted = too_late.outcome()
    assert isinstance(aborted, BarrierAborted), repr(aborted)
    assert (aborted.reason, aborted.last_step) == ("done", 40)
    status = read_status(config)
    assert (status.step, status.done) == (40, True)


def test_a_superseded_chief_reads_no_extra_steps_and_warns_of_nothing_at_its_end(
    config: BarrierConfig, increment: Any, caplog: pytest.LogCaptureFixture
) -> None:
    old, crash = GlobalStepPublisherHook(config), CrashOnce()
    session = tf.compat.v1.train.MonitoredTrainingSession(hooks=[old, crash], **NO_EXTRAS)
    with StepPublisher(config) as new:
        for _ in range(5):
            session.run(increment)
        assert old.publisher is not None and old.publisher.flush(10)
        new.publish(100)  # a newer chief generation takes the job over
        assert new.flush(10)
        deadline = time.monotonic() + 30
        while old.publisher.active:  # the old chief's next heartbeat write learns it
            assert time.monotonic() < deadline, "the old chief never learnt of the new one"
            session.run(increment)
        verifications = old.verifications
        for _ in range(100):
            session.run(increment)
        # A parameter server restarts: MonitoredSession makes a new session and
        # calls after_create_session (and so new_generation()) again.
        crash.armed = True
        session.run(increment)
        assert crash.sessions == 2 and not old.publisher.active
        for _ in range(300):
            session.run(increment)
        assert old.verifications - verifications <= 2
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="stepbarrier"):
            session.close()
        assert not [r for r in caplog.records if "may not have reached" in r.getMessage()]
        status = read_status(config)
        assert (status.step, status.done) == (100, False)  # the new chief's, untouched
