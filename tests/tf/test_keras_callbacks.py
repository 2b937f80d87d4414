"""The Keras callbacks in-process (model.fit), and chief and worker as two processes."""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from examples.demo.local import free_port
from stepbarrier import BarrierAborted, BarrierConfig, StepPublisher, StepWaiter, read_status
from stepbarrier import keras_callbacks as callbacks
from stepbarrier.keras_callbacks import StepPublisherCallback, StepWaiterCallback
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer
from tests.tf.example_processes import ExampleProcesses
from tests.tf.tf_graphs import Waiting, wait_registered

pytestmark = pytest.mark.tensorflow


def fit(batches: int, *extra: Any) -> keras.Model:
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((batches * 4, 2), dtype="float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=list(extra))
    return model


class FirstBatch(keras.callbacks.Callback):  # type: ignore[misc]
    """Notes what the waiter callback had done when the first batch began."""

    def __init__(self, waiter: StepWaiterCallback) -> None:
        super().__init__()
        self.waiter = waiter
        self.released_at_step: int | None = None
        self.batches = 0

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        if self.batches == 0:
            self.released_at_step = self.waiter.released_at_step
        self.batches += 1


@pytest.fixture
def no_redis_client(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the callback created a Redis client")

    monkeypatch.setattr(callbacks, "StepWaiter", refuse)


def test_the_publisher_callback_publishes_the_iterations_without_finishing_the_job(
    config: BarrierConfig,
) -> None:
    publisher = StepPublisherCallback(config)
    fit(6, publisher)
    status = read_status(config)
    assert (status.step, status.done) == (6, False)  # no last_step: more fits may follow
    assert publisher.publisher is None


def fit_three_times(chief: StepPublisherCallback, config: BarrierConfig) -> list[bool]:
    """Three one-epoch ``fit`` calls of 4 batches (steps 4, 8, 12); ``done`` after each."""
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((16, 2), dtype="float32")
    done = []
    for _ in range(3):
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[chief])
        done.append(read_status(config).done)
    assert read_status(config).step == 12
    return done


def test_a_loop_of_fits_keeps_a_worker_waiting_for_a_step_of_the_last_fit(
    config: BarrierConfig,
) -> None:
    worker = Waiting(lambda: StepWaiter(config).wait(10, timeout=60))
    wait_registered(config)
    assert fit_three_times(StepPublisherCallback(config), config) == [False, False, False]
    assert 10 <= (worker.join() or 0) <= 12


def test_the_fit_that_reaches_last_step_finishes_the_job(config: BarrierConfig) -> None:
    in_time = Waiting(lambda: StepWaiter(config).wait(10, timeout=60))
    too_late = Waiting(lambda: StepWaiter(config).wait(15, timeout=60))
    wait_registered(config, 2)
    chief = StepPublisherCallback(config, last_step=12)
    assert fit_three_times(chief, config) == [False, False, True]
    assert 10 <= (in_time.join() or 0) <= 12
    aborted = too_late.outcome()
    assert isinstance(aborted, BarrierAborted), repr(aborted)
    assert (aborted.reason, aborted.last_step) == ("done", 12)


def keras_quick_start(page: str) -> str:
    """The Keras quick start's code on ``page`` (the block that fits with ``last_step``)."""
    from tests.repository.test_docs_snippets import ROOT, snippets

    (found,) = [
        snippet.code
        for snippet in snippets(ROOT / page)
        if snippet.lang == "python" and "callbacks=callbacks_from_env(last_step=" in snippet.code
    ]
    return found


def test_the_readme_s_keras_quick_start_finishes_its_job(
    config: BarrierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As the README says: the chief's fit that reaches ``last_step`` marks the job done."""
    monkeypatch.setenv("STEPBARRIER_JOB", config.job)
    monkeypatch.setenv("STEPBARRIER_REDIS_URL", config.redis_url)
    monkeypatch.setenv("STEPBARRIER_ROLE", "chief")
    exec(keras_quick_start("README.md"), {"__name__": "readme"})  # the README's own code
    status = read_status(config)
    assert (status.step, status.done) == (16, True)


def test_the_waiter_callback_waits_before_the_first_batch(config: BarrierConfig) -> None:
    waiter = StepWaiterCallback(4, config)
    first = FirstBatch(waiter)

    def chief() -> None:
        with StepPublisher(config) as publisher:
            for step in range(1, 7):
                time.sleep(0.05)
                publisher.publish(step)

    thread = threading.Thread(target=chief, daemon=True)
    thread.start()
    fit(3, waiter, first)
    thread.join(30)
    assert first.released_at_step is not None and first.released_at_step >= 4
    assert first.batches == 3


@pytest.mark.usefixtures("no_redis_client")
def test_a_waiter_callback_for_step_zero_touches_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("STEPBARRIER_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    waiter = StepWaiterCallback(0)
    fit(2, waiter)
    assert waiter.released_at_step is None


def test_a_second_fit_does_not_wait_again(
    config: BarrierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StepPublisher(config) as publisher:
        publisher.publish(5)
        assert publisher.flush(10)
        waiter = StepWaiterCallback(5, config)
        fit(1, waiter)
        assert waiter.released_at_step == 5
        monkeypatch.setattr(callbacks, "StepWaiter", None)  # a second wait would fail
        fit(1, waiter)


def test_model_fit_in_a_chief_and_a_worker_process(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    """The chief is configured by TF_CONFIG alone, the worker by STEPBARRIER_* alone."""
    base = subprocess_env(
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_TIMEOUT="180",
        TRAIN_STEPS="40",
        STEP_SLEEP="0.05",
    )
    cluster = {"chief": [f"localhost:{free_port()}"], "worker": [f"localhost:{free_port()}"]}
    chief_env = {
        **base,
        "TF_CONFIG": json.dumps({"cluster": cluster, "task": {"type": "chief", "index": 0}}),
        "WAIT_FOR_WAITERS": "1",
    }
    worker_env = {
        **base,
        "STEPBARRIER_ROLE": "worker",
        "STEPBARRIER_TASK_ID": "1",
        "STEPBARRIER_WAIT_UNTIL_STEP": "15",
    }
    with ExampleProcesses(tmp_path) as job_processes:
        job_processes.start("chief", "keras_fit.py", chief_env)
        job_processes.start("worker", "keras_fit.py", worker_env)
        records = job_processes.finish("chief", "worker")
    chief, worker = records["chief"], records["worker"]
    assert chief["task_type"] == "chief" and chief["steps_trained"] == 40
    assert [step for step, _ in chief["step_times"]] == list(range(1, 41))
    assert worker["wait_until_step"] == 15
    assert 15 <= worker["released_at_step"] <= 15 + 10
    assert worker["released_at"] <= worker["first_step_at"]
    assert worker["steps_trained"] == 40
    assert read_status(BarrierConfig(job=job, redis_url=redis_server.url)).done


def test_a_worker_waits_on_through_a_gap_between_two_fit_calls(
    make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepbarrier._protocol import freshness

    monkeypatch.setattr(freshness, "MIN_CONFIRM", 1.0)  # the idle limit: 1 s
    # the gap is longer than the stall timeout: the paused publisher heartbeats on
    config = make_config(heartbeat=0.1, stall_timeout=1.0)
    chief = StepPublisherCallback(config)
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((5 * 4, 2), dtype="float32")
    try:
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[chief])
        assert read_status(config).step == 5
        waiting = Waiting(lambda: StepWaiter(config).wait(8, timeout=60))
        wait_registered(config)
        time.sleep(3.0)  # the gap: three stall timeouts (and idle limits)
        assert waiting.thread.is_alive(), waiting.error
        model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[chief])
        assert waiting.join() >= 8
    finally:
        chief.close()


class SlowValidation(keras.callbacks.Callback):  # type: ignore[misc]
    """A validation that takes ``seconds``: the training loop hands no step over."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds

    def on_test_begin(self, logs: Any = None) -> None:
        time.sleep(self.seconds)


def test_a_long_validation_inside_fit_is_a_pause_not_a_dead_loop(
    make_config: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stepbarrier import BarrierTimeout
    from stepbarrier._protocol import freshness

    monkeypatch.setattr(freshness, "MIN_CONFIRM", 1.0)  # the idle limit: 1 s
    config = make_config(heartbeat=0.1, stall_timeout=1.0)
    chief = StepPublisherCallback(config)
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((3 * 4, 2), dtype="float32")
    started: list[Waiting] = []

    class StartWaiting(keras.callbacks.Callback):  # type: ignore[misc]
        # once the first batch is done: the training function's compile before
        # it hands no step over, and would count against the 1 s stall timeout
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            if not started:
                started.append(Waiting(lambda: StepWaiter(config).wait(100, timeout=4.0)))

    try:
        model.fit(
            x,
            x[:, :1],
            batch_size=4,
            epochs=1,
            verbose=0,
            validation_data=(x[:4], x[:4, :1]),
            # three stall timeouts of validation
            callbacks=[chief, StartWaiting(), SlowValidation(3.0)],
        )
        error = started[0].outcome()
        # the overall timeout, not the stall: the chief's heartbeat went on
        assert isinstance(error, BarrierTimeout) and not error.stalled, error
    finally:
        chief.close()
