"""Our ``GlobalStepWaiterHook`` keeps TensorFlow's lifecycle rules, rule by rule.

Each scenario runs with ``tf.compat.v1.train.GlobalStepWaiterHook`` and with
``stepbarrier.tf_hooks.GlobalStepWaiterHook`` and expects the same outcome. The
chief is a thread that increments the global step in the same local session
(what TensorFlow's hook reads) and publishes it (what ours reads). Every test
names the row of the comparison table in docs/tensorflow-keras.md ("Parity with
TensorFlow's hook") it proves.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from typing import Any

import pytest
import redis
import redis.cluster
import redis.sentinel
import tensorflow as tf

from stepbarrier import BarrierConfig, StepPublisher, tf_hooks
from tests.tf.tf_graphs import AdvancingChief, CrashOnce, ForbiddenSession, context, waits_logged

pytestmark = pytest.mark.tensorflow

IMPLEMENTATIONS = ("tensorflow", "stepbarrier")


def make_hook(implementation: str, wait_until_step: int, config: BarrierConfig | None) -> Any:
    if implementation == "tensorflow":
        return tf.compat.v1.train.GlobalStepWaiterHook(wait_until_step)
    return tf_hooks.GlobalStepWaiterHook(wait_until_step, config)


@pytest.fixture
def no_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """No STEPBARRIER_* variables: reading the configuration would fail. The
    unconfigured hook's one WARNING is due again."""
    for name in list(os.environ):
        if name.startswith("STEPBARRIER_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    monkeypatch.setattr(tf_hooks, "_warned_unconfigured", False)


@pytest.fixture
def no_redis_client(monkeypatch: pytest.MonkeyPatch) -> None:
    """Creating a waiter, a reporter or any redis-py client fails the test."""

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("the hook created a Redis client")

    monkeypatch.setattr(tf_hooks, "StepWaiter", refuse)
    monkeypatch.setattr(tf_hooks, "StepPublisher", refuse)
    for client in (redis.Redis, redis.cluster.RedisCluster, redis.sentinel.Sentinel):
        monkeypatch.setattr(client, "__init__", refuse)


ENVIRONMENTS = {
    "none": {},
    # a job named, with a setting that fails when read: the hook must not read it
    "a job with a bad setting": {
        "STEPBARRIER_JOB": "parity",
        "STEPBARRIER_REDIS_URL": "redis://127.0.0.1:1/0",
        "STEPBARRIER_TIMEOUT": "soon",
    },
}


@pytest.fixture
def publisher(config: BarrierConfig) -> Iterator[StepPublisher]:
    with StepPublisher(config) as publisher:
        yield publisher


@pytest.fixture(autouse=True)
def info_logs(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("wait_until_step", [0, -3])
@pytest.mark.parametrize("environment", ENVIRONMENTS)
@pytest.mark.usefixtures("no_environment", "no_redis_client")
def test_a_step_of_zero_or_less_starts_at_once_and_reads_nothing(
    implementation: str,
    wait_until_step: int,
    environment: str,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Row "`wait_until_step <= 0`" of the comparison table in docs/tensorflow-keras.md:
    both start at once and read nothing; ours (``config=None``, the drop-in) reads
    no ``STEPBARRIER_*`` variable and creates no Redis client, whatever the
    environment, and gives no WARNING (row "no `STEPBARRIER_*` variable at all")."""
    for name, value in ENVIRONMENTS[environment].items():
        monkeypatch.setenv(name, value)
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook = make_hook(implementation, wait_until_step, None)
        hook.begin()
        for _ in range(3):
            assert hook.before_run(context(ForbiddenSession())) is None
        hook.end(ForbiddenSession())
    assert waits_logged(caplog) == 0
    assert not [r for r in caplog.records if "STEPBARRIER" in r.getMessage()]


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("wait_until_step", [0, 5])
@pytest.mark.usefixtures("no_environment", "no_redis_client")
def test_begin_without_a_global_step_raises_runtime_error(
    implementation: str, wait_until_step: int
) -> None:
    """Row "`begin()` in a graph without a global step" of the comparison table in
    docs/tensorflow-keras.md: ``RuntimeError`` from both, with TensorFlow's message."""
    with tf.Graph().as_default():
        hook = make_hook(implementation, wait_until_step, None)
        with pytest.raises(RuntimeError, match="Global step should be created to use"):
            hook.begin()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_the_first_before_run_waits_until_the_global_step_is_reached(
    implementation: str,
    config: BarrierConfig,
    publisher: StepPublisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "which `before_run` waits" of the comparison table in
    docs/tensorflow-keras.md: the first ``before_run`` after ``begin()`` waits until
    the step is reached (with the next test)."""
    with tf.Graph().as_default() as graph:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(global_step, 1)
        hook = make_hook(implementation, 5, config)
        hook.begin()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            chief = AdvancingChief(session, increment, publisher, until=8)
            assert hook.before_run(context(session)) is None
            seen = int(session.run(global_step))
            chief.join()
    assert seen >= 5
    assert waits_logged(caplog) == 1


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_only_the_first_before_run_waits(
    implementation: str,
    config: BarrierConfig,
    publisher: StepPublisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "which `before_run` waits" of the comparison table in
    docs/tensorflow-keras.md: only the first after ``begin()``; the later ones read
    nothing, even once the step went back."""
    with tf.Graph().as_default() as graph:
        global_step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(global_step, 1)
        back_to_zero = global_step.assign(0)
        hook = make_hook(implementation, 5, config)
        hook.begin()
        with tf.compat.v1.Session(graph=graph) as session:
            session.run(tf.compat.v1.global_variables_initializer())
            chief = AdvancingChief(session, increment, publisher, until=8)
            hook.before_run(context(session))
            chief.join()
            session.run(back_to_zero)  # even a step that went back does not stop a started worker
            for _ in range(3):
                assert hook.before_run(context(ForbiddenSession())) is None
    assert waits_logged(caplog) == 1


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_recovered_session_does_not_wait_again(
    implementation: str,
    config: BarrierConfig,
    publisher: StepPublisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "`MonitoredSession` recovers a session (`after_create_session` again)" of
    the comparison table in docs/tensorflow-keras.md: no new wait."""
    publisher.publish(10)
    assert publisher.flush(10)
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(global_step, 1)
        start_at_ten = global_step.assign(10)
        scaffold = tf.compat.v1.train.Scaffold(init_fn=lambda _, session: session.run(start_at_ten))
        creator = tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold)
        hook, crash = make_hook(implementation, 5, config), CrashOnce()
        with tf.compat.v1.train.MonitoredSession(creator, hooks=[hook, crash]) as session:
            crash.armed = True
            first = session.run(increment)  # crashes, recovers (step 10 again), retries
            second = session.run(increment)
    assert (crash.crashes, crash.sessions) == (1, 2)
    assert (first, second) == (11, 12)
    assert waits_logged(caplog) == 1


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_a_new_session_begins_again_and_waits_again(
    implementation: str,
    config: BarrierConfig,
    publisher: StepPublisher,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Row "a new session (`begin()` again)" of the comparison table in
    docs/tensorflow-keras.md: both wait again."""
    publisher.publish(10)
    assert publisher.flush(10)
    with tf.Graph().as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(global_step, 1)
        start_at_ten = global_step.assign(10)
        scaffold = tf.compat.v1.train.Scaffold(init_fn=lambda _, session: session.run(start_at_ten))
        hook = make_hook(implementation, 5, config)
        for _ in range(2):
            creator = tf.compat.v1.train.ChiefSessionCreator(scaffold=scaffold)
            with tf.compat.v1.train.MonitoredSession(creator, hooks=[hook]) as session:
                assert session.run(increment) == 11
                assert session.run(increment) == 12
    assert waits_logged(caplog) == 2
