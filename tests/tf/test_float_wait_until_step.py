"""A float ``wait_until_step``, as TensorFlow's hook takes it, in our hook and callback.

TensorFlow's ``GlobalStepWaiterHook`` releases once ``global_step >=
wait_until_step``, whatever number it was given. The real hook is asked, for
each target and each step around it, whether it would release; ours must wait
for exactly the first step at which it does. The tests that prove the row
"`wait_until_step` is a float" of the comparison table in docs/tensorflow-keras.md
("Parity with TensorFlow's hook") name it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from tensorflow.python.training import basic_session_run_hooks

from stepbarrier import BarrierConfig, BarrierTimeout, ConfigurationError, StepPublisher
from stepbarrier.keras_callbacks import StepWaiterCallback
from stepbarrier.tf_hooks import GlobalStepWaiterHook
from tests.tf.tf_graphs import SessionAt, context

pytestmark = pytest.mark.tensorflow

TARGETS = [
    20 * math.log(2),  # 13.86: TensorFlow's ramp for task 1 without the int()
    20 * math.log(3),
    0.5,
    1e-9,
    2.0000000001,
    7.0,
    2.0**51 + 0.5,  # a step where float64 still has halves
    -0.5,
    -math.inf,
]


class StillWaiting(Exception):
    """TensorFlow's hook went to sleep: it did not release at this step."""


class NoSleep:
    """Stands in for the ``time`` module of TensorFlow's hooks: sleeping means waiting."""

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        raise StillWaiting


class GlobalStepAt:
    """A real session whose global step can be set to any value."""

    def __init__(self, session: Any, global_step: Any) -> None:
        self.session = session
        self.value = tf.compat.v1.placeholder(tf.int64, [])
        self.assign = tf.compat.v1.assign(global_step, self.value)

    def __call__(self, step: int) -> Any:
        self.session.run(self.assign, {self.value: step})
        return self.session


@pytest.fixture
def global_step_at(monkeypatch: pytest.MonkeyPatch) -> Iterator[GlobalStepAt]:
    monkeypatch.setattr(basic_session_run_hooks, "time", NoSleep())
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.compat.v1.Session() as session:
            session.run(tf.compat.v1.global_variables_initializer())
            yield GlobalStepAt(session, global_step)


def tensorflow_releases(target: float, session: Any) -> bool:
    hook = tf.compat.v1.train.GlobalStepWaiterHook(target)
    hook.begin()
    try:
        hook.before_run(context(session))
    except StillWaiting:
        return False
    return True


def steps_around(target: float) -> list[int]:
    near = [] if math.isinf(target) else [math.floor(target) + d for d in (-1, 0, 1, 2)]
    return sorted({s for s in [*range(0, 25), *near] if s >= 0})


@pytest.mark.parametrize("target", TARGETS)
def test_our_hook_waits_for_the_first_step_at_which_tensorflows_hook_releases(
    target: float, global_step_at: GlobalStepAt
) -> None:
    """Row "`wait_until_step` is a float (`20 * math.log(2)`)" of the comparison table
    in docs/tensorflow-keras.md: ours waits for the first step at which TensorFlow's
    hook, asked at each step around the target, releases."""
    ours = GlobalStepWaiterHook(target).wait_until_step
    for step in steps_around(target):
        released = tensorflow_releases(target, global_step_at(step))
        assert released == (step >= ours), (target, step, ours)


def test_a_float_step_releases_at_the_next_integer_step_not_before(
    make_config: Callable[..., BarrierConfig],
) -> None:
    """Row "`wait_until_step` is a float (`20 * math.log(2)`)" of the comparison table
    in docs/tensorflow-keras.md: 13.86 waits for step 14 (``math.ceil``), not 13."""
    config = make_config(timeout=0.5)
    with StepPublisher(config) as publisher, tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook = GlobalStepWaiterHook(20 * math.log(2), config)  # 13.86
        hook.begin()
        publisher.publish(13)
        assert publisher.flush(10)
        with pytest.raises(BarrierTimeout) as caught:
            hook.before_run(context(SessionAt()))
        assert caught.value.target == 14
        publisher.publish(14)
        assert publisher.flush(10)
        hook.before_run(context(SessionAt()))
    assert hook.released_at_step == 14


def test_the_keras_callback_takes_the_same_floats(config: BarrierConfig) -> None:
    waiter = StepWaiterCallback(20 * math.log(2), config)
    assert waiter.wait_until_step == 14
    with StepPublisher(config) as publisher:
        publisher.publish(14)
        assert publisher.flush(10)
        model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        x = np.zeros((4, 2), dtype="float32")
        model.fit(x, x[:, :1], batch_size=4, verbose=0, callbacks=[waiter])
    assert waiter.released_at_step == 14


@pytest.mark.parametrize("kind", [GlobalStepWaiterHook, StepWaiterCallback])
@pytest.mark.parametrize("target", [math.nan, math.inf])
def test_a_step_that_never_comes_is_refused_at_construction(kind: Any, target: float) -> None:
    with pytest.raises(ConfigurationError, match="wait_until_step"):
        kind(target)


@pytest.mark.parametrize("kind", [GlobalStepWaiterHook, StepWaiterCallback])
@pytest.mark.parametrize("target", [True, "13", None])
def test_a_step_that_is_not_a_number_is_a_type_error(kind: Any, target: object) -> None:
    with pytest.raises(TypeError, match="wait_until_step"):
        kind(target)
