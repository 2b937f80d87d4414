"""The chief's heartbeat says its training loop lives, not only its process.

A loop that hands no step over for the stall timeout (it died in a process that
lives on) stops the heartbeat, so waiting workers reach their stall timeout; a
loop that ends a session in order and pauses keeps it going through the gap.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any

import pytest

from stepbarrier import (
    BarrierConfig,
    BarrierTimeout,
    StepPublisher,
    StepWaiter,
    read_status,
)
from stepbarrier._protocol import freshness

STALL = 1.0
HEARTBEAT = 0.1
WINDOW = 1.0
"""The shortest confirmation window in these tests (5 s in the library): a step
that still vouches is heartbeated, so the idle limit is at least this long."""
IDLE = WINDOW + 0.5
"""How long the loop stays idle in a test: past the stall timeout and the window."""


@pytest.fixture(autouse=True)
def short_window(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(freshness, "MIN_CONFIRM", WINDOW)


@pytest.fixture
def quick(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    return make_config(heartbeat=HEARTBEAT, stall_timeout=STALL)


def beat(config: BarrierConfig) -> int:
    return read_status(config).beat


def beats_during(config: BarrierConfig, seconds: float) -> int:
    """How many writes the chief made in the next ``seconds``."""
    first = beat(config)
    time.sleep(seconds)
    return beat(config) - first


def beats_go_on(
    config: BarrierConfig, count: int = 2, hand_over: Callable[[], None] | None = None
) -> None:
    """The chief writes on: its beat moves ``count`` times, however slowly (a busy
    machine may stretch a heartbeat; the deadline only ends a test that hangs).
    ``hand_over`` keeps a live loop handing its step over meanwhile: a machine slow
    enough to stretch two heartbeats past the idle limit must not make it idle."""
    first = beat(config)
    deadline = time.monotonic() + 30
    while beat(config) < first + count:
        assert time.monotonic() < deadline, "the heartbeat stopped"
        if hand_over is not None:
            hand_over()
        time.sleep(0.02)


def test_an_idle_loop_stops_the_heartbeat_and_the_next_step_resumes_it(
    quick: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    with StepPublisher(quick) as publisher:
        publisher.publish(5)
        assert publisher.flush(10)
        beats_go_on(quick, hand_over=lambda: publisher.publish(5))  # alive: a write per beat
        time.sleep(IDLE)  # the loop hands nothing over for longer than its idle limit
        assert beats_during(quick, 0.6) == 0
        assert any("the heartbeat stops" in r.getMessage() for r in caplog.records)
        publisher.publish(6)
        assert publisher.flush(10)
        beats_go_on(quick, hand_over=lambda: publisher.publish(6))
        assert read_status(quick).step == 6


def test_a_paused_loop_keeps_the_heartbeat_through_the_gap(quick: BarrierConfig) -> None:
    with StepPublisher(quick) as publisher:
        publisher.publish(5)
        assert publisher.flush(10)
        publisher.pause()
        time.sleep(IDLE)
        beats_go_on(quick)
        for step in range(6, 20):  # the next session's steps end the pause
            publisher.publish(step)  # (quick ones: the idle limit is the stall timeout again)
            time.sleep(0.01)
        time.sleep(IDLE)
        assert beats_during(quick, 0.6) == 0


def test_a_worker_of_a_dead_loop_times_out_and_one_of_a_paused_loop_waits_on(
    quick: BarrierConfig,
) -> None:
    with StepPublisher(quick) as publisher:
        publisher.publish(5)
        assert publisher.flush(10)
        with StepWaiter(quick) as waiter, pytest.raises(BarrierTimeout) as caught:
            waiter.wait(10, timeout=30)
        assert caught.value.stalled and caught.value.limit == "stall"  # not the overall timeout
        publisher.publish(5)
        publisher.pause()
        with StepWaiter(quick) as waiter, pytest.raises(BarrierTimeout) as caught:
            waiter.wait(10, timeout=IDLE + 2 * STALL)
        assert not caught.value.stalled  # the overall timeout: the pause kept it alive


def test_a_paused_step_releases_nobody_new(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    # the next session may restore an older checkpoint: the paused step is not vouched for
    config = make_config(heartbeat=HEARTBEAT, stall_timeout=30.0)
    caplog.set_level(logging.INFO)
    with StepPublisher(config) as publisher:
        publisher.publish(5)
        assert publisher.flush(10)
        publisher.pause()
        time.sleep(IDLE)  # past the confirmation window
        assert not read_status(config).vouch
        with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout):
            waiter.wait(5, timeout=1.5)


def test_a_new_chief_publisher_of_the_job_closes_the_paused_one_quietly(
    quick: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    # a hook or callback made anew for each session (hooks_from_env() per session)
    first = StepPublisher(quick)
    first.publish(5)
    assert first.pause(flush_timeout=10.0)
    with StepPublisher(quick) as second:
        assert first._closed  # closed by the next session's publisher, not superseded
        second.new_generation()
        second.publish(3)
        assert second.flush(10)
    assert not any("taken over" in r.getMessage() for r in caplog.records)


def test_a_paused_step_is_no_news_after_redis_forgot_the_state(
    make_config: Callable[..., BarrierConfig], client: Any
) -> None:
    config = make_config(heartbeat=HEARTBEAT, stall_timeout=30.0)
    with StepPublisher(config) as publisher:
        publisher.publish(5)
        assert publisher.pause(flush_timeout=10.0)
        time.sleep(IDLE)  # the step no longer vouches
        for key in client.scan_iter(match=f"stepbarrier:{{{config.job}}}:*"):
            client.delete(key)  # Redis forgot the job (a restart, an eviction)
        time.sleep(3.5)  # the probation of the state the heartbeat made again
        assert read_status(config).step == 5 and not read_status(config).vouch
        with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout):
            waiter.wait(5, timeout=2.0)


def test_the_gap_of_a_pause_is_no_step_time(quick: BarrierConfig) -> None:
    started = time.monotonic()
    with StepPublisher(quick) as publisher:
        for step in range(10):
            publisher.publish(step)
            time.sleep(0.01)
        before = publisher.step_time
        # a mean of the gaps of this loop: none of them longer than the loop
        assert before is not None and before <= time.monotonic() - started
        publisher.pause()
        time.sleep(1.0)
        publisher.publish(10)
        assert publisher.step_time == before  # the next session's first step ends a gap
        publisher.new_generation()
        time.sleep(0.5)
        publisher.publish(0)
        assert publisher.step_time == before
