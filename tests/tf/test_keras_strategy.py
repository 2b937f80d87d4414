"""The Keras callbacks under the ``tf.distribute`` strategies that Keras 3's
``model.fit`` trains under (all of them in one process; what it does under the
cluster strategies is in test_keras_strategies_keras3.py).

``StepWaiterCallback`` refuses a synchronous strategy before it waits (across
workers a step wait would be a deadlock: the chief blocks in its first
all-reduce while the worker waits for its step); the default strategy and
``OneDeviceStrategy`` are not refused, and the publisher and the start and end
barriers run under any.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from stepbarrier import BarrierConfig, ConfigurationError, StepPublisher, read_status
from stepbarrier import keras_callbacks as callbacks
from stepbarrier.keras_callbacks import (
    EndBarrierCallback,
    StartBarrierCallback,
    StepPublisherCallback,
    StepWaiterCallback,
)

pytestmark = pytest.mark.tensorflow

CLOSED_PORT = "redis://127.0.0.1:1/0"
"""Nothing listens there: a wait that started would end in ``RedisUnavailable``."""


class Batches(keras.callbacks.Callback):  # type: ignore[misc]
    """Counts the training batches that began."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.count += 1


def fit_under(
    strategy: tf.distribute.Strategy | None,
    batches: int,
    *extra: Any,
    fit_in_scope: bool = False,
) -> keras.Model:
    """``model.fit`` of a model built in ``strategy``'s scope (``None``: the default)."""
    scope: Callable[[], AbstractContextManager[Any]] = (
        nullcontext if strategy is None else strategy.scope
    )
    with scope():
        model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((batches * 4, 2), dtype="float32")
    with scope() if fit_in_scope else nullcontext():
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=list(extra))
    return model


@pytest.fixture
def closed_config() -> BarrierConfig:
    """A config whose Redis is unreachable; short timeouts, so that a wait that
    did start fails within seconds (with a Redis error) instead of hanging."""
    return BarrierConfig(job="strategy", redis_url=CLOSED_PORT, timeout=5.0, stall_timeout=5.0)


@pytest.fixture
def no_redis_client(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the callback created a Redis client")

    monkeypatch.setattr(callbacks, "StepWaiter", refuse)


@pytest.fixture
def mirrored() -> tf.distribute.Strategy:
    """A real single-process MirroredStrategy (one replica on a CPU-only host)."""
    return tf.distribute.MirroredStrategy()


SYNCHRONOUS_IN_ONE_PROCESS = {
    "tf.distribute.MirroredStrategy": tf.distribute.MirroredStrategy,
    "tf.distribute.experimental.CentralStorageStrategy": (
        tf.distribute.experimental.CentralStorageStrategy
    ),
}
"""The synchronous strategies Keras 3's ``fit`` trains under here, by the name
the refusal gives (``MultiWorkerMirroredStrategy`` without a cluster needs a
process of its own: test_keras_strategies_keras3.py)."""


@pytest.mark.usefixtures("no_redis_client")  # a wait begun would fail on its own
@pytest.mark.parametrize("wait_until_step", [5, 2.5, 0])
@pytest.mark.parametrize("fit_in_scope", [False, True])
@pytest.mark.parametrize("name", list(SYNCHRONOUS_IN_ONE_PROCESS))
def test_the_waiter_refuses_a_synchronous_strategy_at_once_before_touching_redis(
    name: str,
    closed_config: BarrierConfig,
    wait_until_step: float,
    fit_in_scope: bool,
) -> None:
    strategy = SYNCHRONOUS_IN_ONE_PROCESS[name]()
    waiter = StepWaiterCallback(wait_until_step, closed_config)
    batches = Batches()
    # refused before any wait began: no StepWaiter was made (the fixture would
    # raise AssertionError instead), whatever the machine's speed
    with pytest.raises(ConfigurationError) as refused:
        fit_under(strategy, 3, waiter, batches, fit_in_scope=fit_in_scope)
    assert batches.count == 0
    assert waiter.released_at_step is None
    message = str(refused.value)
    assert f"under {name}," in message
    assert "deadlock" in message and "all-reduce" in message
    assert "StartBarrierCallback" in message and "EndBarrierCallback" in message
    assert "docs/tensorflow-keras.md#distribution-strategies" in message


def test_the_refusal_comes_before_the_environment_is_read(
    mirrored: tf.distribute.Strategy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No config and no STEPBARRIER_* variable: the strategy is what is named."""
    for name in list(os.environ):
        if name.startswith("STEPBARRIER_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    with pytest.raises(ConfigurationError, match="MirroredStrategy"):
        fit_under(mirrored, 1, StepWaiterCallback(5))


@pytest.mark.usefixtures("no_redis_client")
@pytest.mark.parametrize("strategy_name", ["default", "one-device"])
def test_the_default_and_one_device_strategies_are_not_refused(
    strategy_name: str, closed_config: BarrierConfig
) -> None:
    strategy = None if strategy_name == "default" else tf.distribute.OneDeviceStrategy("/cpu:0")
    waiter = StepWaiterCallback(0, closed_config)
    batches = Batches()
    fit_under(strategy, 3, waiter, batches, fit_in_scope=strategy is not None)
    assert batches.count == 3


def test_a_worker_under_one_device_strategy_waits_for_the_chief(config: BarrierConfig) -> None:
    with StepPublisher(config) as publisher:
        publisher.publish(3)
        assert publisher.flush(10)
        waiter = StepWaiterCallback(3, config)
        batches = Batches()
        fit_under(tf.distribute.OneDeviceStrategy("/cpu:0"), 2, waiter, batches)
    assert waiter.released_at_step == 3
    assert batches.count == 2


def test_the_publisher_under_a_mirrored_strategy_publishes_its_steps(
    mirrored: tf.distribute.Strategy, config: BarrierConfig
) -> None:
    """The chief's side has nothing to wait for: a sync strategy is harmless there."""
    fit_under(mirrored, 4, StepPublisherCallback(config))
    status = read_status(config)
    assert (status.step, status.done) == (4, False)


def test_the_waiter_refuses_tpu_strategy_by_its_class() -> None:
    """No TPU here: the rule is checked on a bare instance of the class."""

    class Model:
        distribute_strategy = tf.distribute.TPUStrategy.__new__(tf.distribute.TPUStrategy)

    assert callbacks._synchronous_strategy(Model()) == "tf.distribute.TPUStrategy"


def test_the_start_and_end_barrier_callbacks_run_under_a_mirrored_strategy(
    mirrored: tf.distribute.Strategy, config: BarrierConfig
) -> None:
    """They look at no strategy: a chief alone (one party) starts, trains and finishes the job."""
    chief = dataclasses.replace(config, task_id=0)
    start, end = StartBarrierCallback(1, config=chief), EndBarrierCallback(1, config=chief)
    batches = Batches()
    fit_under(mirrored, 3, start, StepPublisherCallback(chief), batches, end)
    assert start.released_at is not None and batches.count == 3
    assert end.complete
    status = read_status(config)
    assert (status.step, status.done) == (3, True)
