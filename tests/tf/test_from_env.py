"""``hooks_from_env`` and ``callbacks_from_env``: the right pieces for each host."""

from __future__ import annotations

import json
import math
import threading
from typing import Any

import pytest
import tensorflow as tf

from stepbarrier import BarrierConfig, ConfigurationError, read_status
from stepbarrier.keras_callbacks import (
    StepPublisherCallback,
    StepWaiterCallback,
    callbacks_from_env,
)
from stepbarrier.tf_hooks import GlobalStepPublisherHook, GlobalStepWaiterHook, hooks_from_env
from tests.redis_harness import RedisServer
from tests.tf.tf_graphs import SessionAt, context

pytestmark = pytest.mark.tensorflow

CLUSTER = {
    "ps": ["localhost:2222"],
    "chief": ["localhost:2223"],
    "worker": ["localhost:2224", "localhost:2225"],
}
UNREACHABLE = "redis://127.0.0.1:1/0"
"""Nothing listens there: building the hooks must not connect."""


def tf_config(kind: str, index: int) -> str:
    return json.dumps({"cluster": CLUSTER, "task": {"type": kind, "index": index}})


def job_only(job: str, url: str = UNREACHABLE) -> dict[str, str]:
    return {"STEPBARRIER_JOB": job, "STEPBARRIER_REDIS_URL": url}


FROM_ENV = [
    pytest.param(hooks_from_env, id="hooks_from_env"),
    pytest.param(callbacks_from_env, id="callbacks_from_env"),
]


@pytest.mark.parametrize("kind", ["chief", "master"])
def test_tf_config_alone_makes_the_chief_a_publisher(job: str, kind: str) -> None:
    hooks = hooks_from_env({**job_only(job), "TF_CONFIG": tf_config(kind, 0)})
    assert [type(hook) for hook in hooks] == [GlobalStepPublisherHook]


def test_tf_config_alone_gives_a_worker_its_scheduled_step(job: str) -> None:
    env = {**job_only(job), "STEPBARRIER_SCHEDULE": "log:10", "TF_CONFIG": tf_config("worker", 1)}
    [hook] = hooks_from_env(env)
    assert isinstance(hook, GlobalStepWaiterHook)
    assert hook.wait_until_step == int(10 * math.log(2 + 1))  # worker 1 is task 2


@pytest.mark.parametrize("kind", ["ps", "evaluator"])
def test_tf_config_alone_gives_other_tasks_no_hooks(job: str, kind: str) -> None:
    assert hooks_from_env({**job_only(job), "TF_CONFIG": tf_config(kind, 0)}) == []


@pytest.mark.parametrize("from_env", FROM_ENV)
@pytest.mark.parametrize("kind", ["ps", "evaluator"])
def test_ps_and_evaluator_tasks_need_no_stepbarrier_variable(from_env: Any, kind: str) -> None:
    assert from_env({"TF_CONFIG": tf_config(kind, 0)}) == []


@pytest.mark.parametrize("from_env", FROM_ENV)
def test_a_host_with_no_role_anywhere_is_a_configuration_error(from_env: Any, job: str) -> None:
    """As on every host of a TF1 job launched with --job_name/--task_index flags."""
    with pytest.raises(ConfigurationError) as info:
        from_env({**job_only(job), "STEPBARRIER_WAIT_UNTIL_STEP": "5"})
    for name in ("STEPBARRIER_ROLE", "STEPBARRIER_TASK_ID", "TF_CONFIG"):
        assert name in str(info.value)


@pytest.mark.parametrize("from_env", FROM_ENV)
def test_a_task_type_with_no_role_is_an_error_until_the_role_is_set(
    from_env: Any, job: str
) -> None:
    text = json.dumps({"cluster": {"client": ["h:1"]}, "task": {"type": "client", "index": "0"}})
    env = {**job_only(job), "TF_CONFIG": text, "STEPBARRIER_WAIT_UNTIL_STEP": "5"}
    with pytest.raises(ConfigurationError, match="'client'"):
        from_env(env)
    [waiter] = from_env({**env, "STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": "4"})
    assert waiter.wait_until_step == 5


@pytest.mark.parametrize("from_env", FROM_ENV)
def test_a_string_index_in_tf_config_is_read_as_tensorflow_reads_it(
    from_env: Any, job: str
) -> None:
    text = json.dumps({"cluster": CLUSTER, "task": {"type": "worker", "index": "1"}})
    env = {**job_only(job), "STEPBARRIER_SCHEDULE": "log:10", "TF_CONFIG": text}
    [waiter] = from_env(env)
    assert waiter.wait_until_step == int(10 * math.log(2 + 1))  # worker 1 is task 2


def test_stepbarrier_variables_alone_make_the_chief_a_publisher(job: str) -> None:
    hooks = hooks_from_env({**job_only(job), "STEPBARRIER_ROLE": "chief"})
    assert [type(hook) for hook in hooks] == [GlobalStepPublisherHook]


@pytest.mark.parametrize(
    ("variable", "value", "expected"),
    [("STEPBARRIER_WAIT_UNTIL_STEP", "7", 7), ("STEPBARRIER_SCHEDULE", "log:10", 13)],
)
def test_stepbarrier_variables_alone_give_a_worker_its_step(
    job: str, variable: str, value: str, expected: int
) -> None:
    env = {**job_only(job), "STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": "3"}
    [hook] = hooks_from_env({**env, variable: value})
    assert isinstance(hook, GlobalStepWaiterHook)
    assert hook.wait_until_step == expected


def test_a_worker_without_a_step_or_a_schedule_is_a_configuration_error(job: str) -> None:
    env = {**job_only(job), "STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": "3"}
    with pytest.raises(ConfigurationError, match="STEPBARRIER_WAIT_UNTIL_STEP"):
        hooks_from_env(env)


def test_the_hooks_from_the_environment_work_together(redis_server: RedisServer, job: str) -> None:
    base = job_only(job, redis_server.url)
    [publisher] = hooks_from_env({**base, "STEPBARRIER_ROLE": "chief"})
    env = {**base, "STEPBARRIER_ROLE": "worker", "STEPBARRIER_WAIT_UNTIL_STEP": "3"}
    [waiter] = hooks_from_env(env)
    released = threading.Event()

    def worker() -> None:
        with tf.Graph().as_default():
            tf.compat.v1.train.get_or_create_global_step()
            waiter.begin()
            waiter.before_run(context(SessionAt()))
            released.set()

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    with tf.Graph().as_default():
        increment = tf.compat.v1.assign_add(tf.compat.v1.train.get_or_create_global_step(), 1)
        with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[publisher], log_step_count_steps=None, save_summaries_steps=None
        ) as session:
            for _ in range(6):
                session.run(increment)
                if released.wait(0.05):
                    break
    thread.join(30)
    assert released.is_set()
    assert waiter.released_at_step is not None and waiter.released_at_step >= 3
    # hooks_from_env gives the chief no last_step: its session's end does not end the job
    assert not read_status(BarrierConfig(job=job, redis_url=redis_server.url)).done


def test_callbacks_from_the_environment_follow_the_same_rules(job: str) -> None:
    chief = callbacks_from_env({**job_only(job), "TF_CONFIG": tf_config("chief", 0)})
    assert [type(c) for c in chief] == [StepPublisherCallback]
    env = {**job_only(job), "STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": "2"}
    [waiter] = callbacks_from_env({**env, "STEPBARRIER_SCHEDULE": "log:10"})
    assert isinstance(waiter, StepWaiterCallback)
    assert waiter.wait_until_step == int(10 * math.log(3))
    assert callbacks_from_env({**job_only(job), "TF_CONFIG": tf_config("ps", 0)}) == []
