"""Start and end barriers in Keras (``model.fit``) and what ``hooks_from_env`` and
``callbacks_from_env`` build for them; the real multi-process job with TensorFlow's
hooks is in test_barrier_hooks_job.py."""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from typing import Any

import keras
import numpy as np
import pytest

from stepbarrier import Barrier, BarrierConfig, BarrierTimeout, ConfigurationError, read_status
from stepbarrier.keras_callbacks import (
    EndBarrierCallback,
    StartBarrierCallback,
    StepPublisherCallback,
    StepWaiterCallback,
    callbacks_from_env,
)
from stepbarrier.tf_hooks import (
    EndBarrierHook,
    GlobalStepPublisherHook,
    GlobalStepWaiterHook,
    StartBarrierHook,
    hooks_from_env,
)

pytestmark = pytest.mark.tensorflow

CLUSTER = {
    "ps": ["localhost:2222"],
    "chief": ["localhost:2223"],
    "worker": ["localhost:2224", "localhost:2225"],
}
UNREACHABLE = "redis://127.0.0.1:1/0"
"""Nothing listens there: building the hooks must not connect."""


def as_task(config: BarrierConfig, task_id: int) -> BarrierConfig:
    return dataclasses.replace(config, task_id=task_id)


def env_of(job: str, kind: str, index: int, **extra: str) -> dict[str, str]:
    tf_config = json.dumps({"cluster": CLUSTER, "task": {"type": kind, "index": index}})
    return {"STEPBARRIER_JOB": job, "STEPBARRIER_REDIS_URL": UNREACHABLE, "TF_CONFIG": tf_config}


def fit(batches: int, *extra: Any) -> keras.Model:
    model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    x = np.zeros((batches * 4, 2), dtype="float32")
    model.fit(x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=list(extra))
    return model


def test_the_start_callback_holds_fit_until_every_party_arrived(config: BarrierConfig) -> None:
    callbacks = [StartBarrierCallback(3, config=as_task(config, task)) for task in (1, 2)]
    threads = [threading.Thread(target=callback.on_train_begin) for callback in callbacks]
    for thread in threads:
        thread.start()
    time.sleep(0.3)
    assert all(callback.released_at is None for callback in callbacks)
    chief = StartBarrierCallback(3, config=as_task(config, 0))
    fit(2, chief)
    for thread in threads:
        thread.join(30)
    state = Barrier(as_task(config, 0), "start", 3).read()
    assert state is not None and state.completed_ms is not None
    for callback in [*callbacks, chief]:
        assert callback.released_at is not None
        assert callback.released_at * 1000 >= state.completed_ms


def test_under_proceed_the_hooks_and_callbacks_go_on_and_name_who_is_missing(
    config: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """STEPBARRIER_ON_TIMEOUT=proceed: a start barrier that times out lets the
    task start, an end barrier records the missing tasks; neither raises."""
    chief = dataclasses.replace(as_task(config, 0), on_timeout="proceed")
    start_hook = StartBarrierHook(3, config=chief, timeout=0.3)
    start_hook.begin()
    start_hook.before_run(None)
    end_hook = EndBarrierHook(3, name="end-hook", config=chief, timeout=0.3)
    end_hook.begin()
    end_hook.end(None)
    start_callback = StartBarrierCallback(3, name="start-cb", config=chief, timeout=0.3)
    start_callback.on_train_begin()
    end_callback = EndBarrierCallback(3, name="end-cb", config=chief, timeout=0.3)
    end_callback.on_train_end()
    assert start_hook.released_at is not None and start_callback.released_at is not None
    assert (end_hook.complete, end_hook.missing) == (False, (1, 2))
    assert (end_callback.complete, end_callback.missing) == (False, (1, 2))
    said = [r.getMessage() for r in caplog.records if "ON_TIMEOUT=proceed" in r.getMessage()]
    assert len(said) == 4 and sum("; starting as" in line for line in said) == 2
    assert not read_status(config).done  # an incomplete end barrier finishes nothing
    with pytest.raises(BarrierTimeout):  # and without proceed, the same wait raises
        hook = StartBarrierHook(3, name="strict", config=as_task(config, 0), timeout=0.3)
        hook.begin()
        hook.before_run(None)


def test_the_chiefs_end_callback_waits_for_the_workers_then_finishes_the_job(
    config: BarrierConfig,
) -> None:
    workers = [EndBarrierCallback(3, config=as_task(config, task)) for task in (1, 2)]

    def finish_workers() -> None:
        while Barrier(as_task(config, 0), "end", 3).read() is None:
            time.sleep(0.02)  # the chief is there: now the workers finish
        for worker in workers:
            worker.on_train_end()  # a worker arrives and goes

    thread = threading.Thread(target=finish_workers)
    thread.start()
    chief = EndBarrierCallback(3, config=as_task(config, 0), timeout=60)
    model = fit(5, StepPublisherCallback(as_task(config, 0)), chief)
    thread.join(30)
    assert chief.complete
    assert [worker.complete for worker in workers] == [False, True]  # the last one completed it
    status = read_status(config)
    assert status.done and status.step == int(model.optimizer.iterations.numpy()) == 5


def test_hooks_from_env_puts_the_barriers_around_the_step_hooks(job: str) -> None:
    chief = hooks_from_env(env_of(job, "chief", 0), start_barrier=True, end_barrier=True)
    assert [type(hook) for hook in chief] == [
        StartBarrierHook,
        GlobalStepPublisherHook,
        EndBarrierHook,
    ]
    assert {hook.parties for hook in (chief[0], chief[2])} == {3}  # chief and two workers
    scheduled = {**env_of(job, "worker", 1), "STEPBARRIER_SCHEDULE": "log:10"}
    worker = hooks_from_env(scheduled, start_barrier=True, end_barrier=True)
    assert [type(hook) for hook in worker] == [
        StartBarrierHook,
        GlobalStepWaiterHook,
        EndBarrierHook,
    ]


def test_with_a_start_barrier_a_worker_needs_no_step_to_wait_for(job: str) -> None:
    hooks = hooks_from_env(env_of(job, "worker", 0), start_barrier=True, parties=5)
    assert [type(hook) for hook in hooks] == [StartBarrierHook]
    assert hooks[0].parties == 5
    callbacks = callbacks_from_env(env_of(job, "worker", 0), start_barrier=True, end_barrier=True)
    assert [type(callback) for callback in callbacks] == [StartBarrierCallback, EndBarrierCallback]


def test_callbacks_from_env_puts_the_barriers_around_the_step_callbacks(job: str) -> None:
    env = {**env_of(job, "worker", 0), "STEPBARRIER_WAIT_UNTIL_STEP": "3"}
    built = callbacks_from_env(env, start_barrier=True, end_barrier=True)
    assert [type(c) for c in built] == [
        StartBarrierCallback,
        StepWaiterCallback,
        EndBarrierCallback,
    ]


def test_barriers_without_tf_config_need_the_parties(job: str) -> None:
    env = {"STEPBARRIER_JOB": job, "STEPBARRIER_ROLE": "chief"}
    with pytest.raises(ConfigurationError, match="parties=N"):
        hooks_from_env(env, end_barrier=True)
    assert [type(hook) for hook in hooks_from_env(env, end_barrier=True, parties=2)] == [
        GlobalStepPublisherHook,
        EndBarrierHook,
    ]
