"""What our GlobalStepWaiterHook adds to TensorFlow's: timeouts, aborts, a registry."""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable

import pytest
import tensorflow as tf

from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    BarrierTimeout,
    ConfigurationError,
    StepPublisher,
    read_status,
)
from stepbarrier.tf_hooks import GlobalStepWaiterHook
from tests.redis_harness import RedisServer
from tests.tf.tf_graphs import NO_EXTRAS, SessionAt, context

pytestmark = pytest.mark.tensorflow


def started_hook(wait_until_step: int, config: BarrierConfig | None) -> GlobalStepWaiterHook:
    tf.compat.v1.train.get_or_create_global_step()
    hook = GlobalStepWaiterHook(wait_until_step, config)
    hook.begin()
    return hook


def test_the_overall_timeout_raises_barrier_timeout_from_before_run(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(timeout=0.3)
    with tf.Graph().as_default():
        hook = started_hook(5, config)
        with pytest.raises(BarrierTimeout) as caught:
            hook.before_run(context(SessionAt()))
    assert caught.value.target == 5
    assert hook.released_at_step is None


def test_on_timeout_proceed_starts_training_with_the_last_step_seen(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(timeout=0.3, on_timeout="proceed")
    with tf.Graph().as_default():
        hook = started_hook(5, config)
        assert hook.before_run(context(SessionAt())) is None
        assert hook.released_at_step == 0  # no chief was ever seen
        assert hook.before_run(context(SessionAt())) is None  # started: no second wait


def test_a_job_finished_below_the_step_aborts_the_worker(config: BarrierConfig) -> None:
    # the run id says the finished job is this worker's own run, not an earlier one
    config = dataclasses.replace(config, run_id="run-1")
    with StepPublisher(config) as publisher:
        publisher.publish(3)
    with tf.Graph().as_default():
        hook = started_hook(5, config)
        with pytest.raises(BarrierAborted) as caught:
            hook.before_run(context(SessionAt()))
    assert (caught.value.reason, caught.value.last_step) == ("done", 3)


def test_a_released_worker_leaves_the_registry(config: BarrierConfig) -> None:
    with StepPublisher(config) as publisher:
        publisher.publish(7)
        assert publisher.flush(10)
        with tf.Graph().as_default():
            hook = started_hook(5, config)
            hook.before_run(context(SessionAt()))
            hook.end(None)
        assert hook.released_at_step == 7
        assert read_status(config).waiters == ()


def test_without_a_config_the_environment_is_read_at_begin_not_at_construction(
    redis_server: RedisServer, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in list(os.environ):
        if name.startswith("STEPBARRIER_") or name == "TF_CONFIG":
            monkeypatch.delenv(name)
    with tf.Graph().as_default():
        tf.compat.v1.train.get_or_create_global_step()
        hook = GlobalStepWaiterHook(5)  # built anywhere, like TensorFlow's hook
        monkeypatch.setenv("STEPBARRIER_JOB", job)
        monkeypatch.setenv("STEPBARRIER_TIMEOUT", "soon")
        with pytest.raises(ConfigurationError, match="STEPBARRIER_TIMEOUT"):
            hook.begin()  # a bad setting fails before the session
        monkeypatch.delenv("STEPBARRIER_TIMEOUT")
        monkeypatch.setenv("STEPBARRIER_REDIS_URL", redis_server.url)
        config = BarrierConfig.from_env()
        with StepPublisher(config) as publisher:
            publisher.publish(6)
            assert publisher.flush(10)
            hook.begin()
            hook.before_run(context(SessionAt()))
    assert hook.released_at_step == 6


def train_30_steps(make_hook: Callable[[], GlobalStepWaiterHook]) -> None:
    """A session of 30 steps with the hook ``make_hook`` makes in its graph."""
    with tf.Graph().as_default():
        step = tf.compat.v1.train.get_or_create_global_step()
        increment = tf.compat.v1.assign_add(step, 1)
        with tf.compat.v1.train.MonitoredTrainingSession(
            hooks=[make_hook()], **NO_EXTRAS
        ) as session:
            for _ in range(30):
                session.run(increment)


def test_a_hook_for_step_0_on_a_job_without_a_publisher_ends_without_a_warning(
    config: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # it reports the step, but no chief generation is there to report into:
    # nothing timed out, so nothing is said to have timed out
    caplog.set_level(logging.INFO)
    train_30_steps(lambda: GlobalStepWaiterHook(0, config, report_every=1))
    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert said == [], [r.getMessage() for r in said]
    assert any("was not reported" in r.getMessage() for r in caplog.records)


def test_report_every_0_in_the_config_turns_the_hooks_default_reporting_off(
    config: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # STEPBARRIER_REPORT_EVERY=0 (the compose file's workers): the same run as
    # above reports nothing, so nothing is said about reporting
    caplog.set_level(logging.DEBUG)
    train_30_steps(lambda: GlobalStepWaiterHook(0, dataclasses.replace(config, report_every=0)))
    assert [r.getMessage() for r in caplog.records if "report" in r.getMessage()] == []
