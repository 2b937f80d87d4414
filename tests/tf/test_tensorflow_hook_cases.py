"""TensorFlow's own ``GlobalStepWaiterHookTest`` cases, run against stepbarrier's hook.

TensorFlow tests its hook (``basic_session_run_hooks_test.py``) with a real
session: step 0 never waits; for step 1000, ``time.sleep`` is patched so that
its first call assigns the global step 500 and its second 1100, and
``before_run`` must return right after the second. The same cases run here
against TensorFlow's hook and ours, unconfigured (no ``STEPBARRIER_*``) and
configured for a Redis on which no chief publishes. Every test names the row of
the comparison table in docs/tensorflow-keras.md ("Parity with TensorFlow's
hook") it proves.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any
from unittest import mock

import pytest
import tensorflow as tf

from stepbarrier import BarrierConfig, StepSource, StepWaiter, tf_hooks
from tests.tf.tf_graphs import context

pytestmark = pytest.mark.tensorflow

SESSION = "the session's global step"
TENSORFLOW_PACE = 0.5
"""Seconds TensorFlow's hook sleeps between two reads of the global step."""


@pytest.fixture
def unconfigured(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("STEPBARRIER_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    monkeypatch.setattr(tf_hooks, "_warned_unconfigured", False)


def make_hook(kind: str, step: int, config: BarrierConfig | None) -> Any:
    if kind == "tensorflow":
        return tf.compat.v1.train.GlobalStepWaiterHook(wait_until_step=step)
    return tf_hooks.GlobalStepWaiterHook(wait_until_step=step, config=config)


@pytest.mark.parametrize("kind", ["tensorflow", "unconfigured", "configured"])
def test_not_wait_for_step_zero(
    kind: str, unconfigured: None, make_config: Callable[..., BarrierConfig]
) -> None:
    """Row "TensorFlow's own `GlobalStepWaiterHookTest`" of the comparison table in
    docs/tensorflow-keras.md: its ``test_not_wait_for_step_zero``, on a real session."""
    config = make_config() if kind == "configured" else None
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook = make_hook(kind, 0, config)
        hook.begin()
        with tf.compat.v1.Session() as sess:
            # returns without waiting for the global step to move
            assert hook.before_run(context(sess)) is None


@pytest.mark.parametrize("kind", ["tensorflow", "unconfigured"])
def test_wait_for_step_with_time_sleep_patched_as_tensorflow_does(
    kind: str, unconfigured: None, caplog: pytest.LogCaptureFixture
) -> None:
    """Row "TensorFlow's own `GlobalStepWaiterHookTest`" of the comparison table in
    docs/tensorflow-keras.md: its ``test_wait_for_step``, ``time.sleep`` patched to
    move the step 0, 500, 1100. Unconfigured, ours also proves rows "how it learns
    the step" (it sleeps TensorFlow's 0.5 s between two reads, as TensorFlow's
    does here) and "no `STEPBARRIER_*` variable at all" (one WARNING)."""
    slept: list[float] = []
    with tf.Graph().as_default():
        gstep = tf.compat.v1.train.get_or_create_global_step()
        hook = make_hook(kind, 1000, None)
        hook.begin()
        with tf.compat.v1.Session() as sess:
            counter = 0
            to_500 = tf.compat.v1.assign(gstep, 500)
            to_1100 = tf.compat.v1.assign(gstep, 1100)

            def sleep_side_effect(seconds: float) -> None:
                nonlocal counter
                counter += 1
                slept.append(seconds)
                if counter == 1:
                    sess.run(to_500)  # the first sleep: the step goes from 0 to 500
                elif counter == 2:
                    sess.run(to_1100)  # the second: from 500 to 1100
                else:
                    raise AssertionError(
                        "Expected before_run() to terminate after the second call to time.sleep()"
                    )

            sess.run(tf.compat.v1.global_variables_initializer())
            with mock.patch.object(time, "sleep", side_effect=sleep_side_effect):
                hook.before_run(context(sess))
            assert counter == 2
    assert slept == [TENSORFLOW_PACE, TENSORFLOW_PACE]  # TensorFlow's pace, in both hooks
    if kind == "unconfigured":
        assert (hook.released_at_step, hook.released_by) == (1100, SESSION)
        warned = [r for r in caplog.records if "STEPBARRIER_JOB is not set" in r.getMessage()]
        assert len(warned) == 1 and warned[0].levelno == logging.WARNING


def test_wait_for_step_configured_with_no_publisher(
    unconfigured: None,
    make_config: Callable[..., BarrierConfig],
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Row "TensorFlow's own `GlobalStepWaiterHookTest`" of the comparison table in
    docs/tensorflow-keras.md: its ``test_wait_for_step`` with Redis configured and no
    publisher. The wait reads the session on its own clock (not ``time.sleep``), so a
    thread moves the step: 500, then 1100. Also row "how it learns the step": the
    hook hands the wait the session's step to read at TensorFlow's 0.5 s, before
    and after a chief was seen."""
    sources: list[StepSource] = []
    wait = StepWaiter.wait

    def recorded(self: StepWaiter, step: int, **kwargs: Any) -> int:
        sources.append(kwargs["source"])
        return wait(self, step, **kwargs)

    monkeypatch.setattr(StepWaiter, "wait", recorded)
    config = make_config()
    with tf.Graph().as_default():
        gstep = tf.compat.v1.train.get_or_create_global_step()
        hook = make_hook("configured", 1000, config)
        hook.begin()
        with tf.compat.v1.Session() as sess:
            sess.run(tf.compat.v1.global_variables_initializer())
            to_500 = tf.compat.v1.assign(gstep, 500)
            to_1100 = tf.compat.v1.assign(gstep, 1100)
            moved: list[int] = []

            def chief() -> None:
                time.sleep(0.6)
                moved.append(int(sess.run(to_500)))
                time.sleep(0.6)
                moved.append(int(sess.run(to_1100)))

            thread = threading.Thread(target=chief, daemon=True)
            thread.start()
            hook.before_run(context(sess))
            assert moved == [500, 1100]  # it returned only after the step passed 1000
            thread.join(10)
    assert (hook.released_at_step, hook.released_by) == (1100, SESSION)
    [source] = sources
    assert source.name == SESSION
    assert source.intervals == (TENSORFLOW_PACE, TENSORFLOW_PACE)
    hinted = [r.getMessage() for r in caplog.records if "GlobalStepPublisherHook" in r.getMessage()]
    assert hinted and "chief_only_hooks" in hinted[0]
