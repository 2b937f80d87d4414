"""When a writer vouches for its step (``_protocol.freshness``), rule by rule, on its own clock."""

from __future__ import annotations

import math

from stepbarrier._protocol.freshness import (
    FENCE,
    GRACE,
    MAX_HEARTBEAT,
    MIN_CONFIRM,
    confirm_window,
    stale_after,
    vouches,
)


def test_a_step_handed_over_just_now_vouches() -> None:
    assert vouches(now=100.0, probation_until=-math.inf, handed_at=99.9, step_time=0.1, done=False)


def test_a_writer_on_probation_vouches_for_nothing_not_even_a_final_step() -> None:
    assert not vouches(now=100.0, probation_until=101.0, handed_at=100.0, step_time=0.1, done=False)
    assert not vouches(now=100.0, probation_until=101.0, handed_at=100.0, step_time=0.1, done=True)
    assert vouches(now=101.0, probation_until=101.0, handed_at=100.9, step_time=0.1, done=False)


def test_a_step_the_loop_has_not_handed_over_lately_does_not_vouch() -> None:
    # a chief recovering its session keeps writing a step it may never reach again
    assert not vouches(
        now=100.0,
        probation_until=-math.inf,
        handed_at=100.0 - MIN_CONFIRM - 0.1,
        step_time=0.1,
        done=False,
    )


def test_a_slow_loop_has_a_long_confirmation_window() -> None:
    assert confirm_window(180.0) == 720.0
    assert vouches(
        now=1000.0, probation_until=-math.inf, handed_at=400.0, step_time=180.0, done=False
    )
    assert confirm_window(None) == MIN_CONFIRM == confirm_window(0.01)


def test_a_final_step_vouches_without_the_window() -> None:
    assert vouches(now=1e6, probation_until=-math.inf, handed_at=0.0, step_time=0.1, done=True)


def test_the_fence_is_one_value_for_the_job_three_of_the_longest_heartbeats() -> None:
    assert FENCE == 3.0 == 3 * MAX_HEARTBEAT
    assert GRACE == FENCE


def test_an_operator_view_calls_a_chief_stale_after_three_heartbeats() -> None:
    assert stale_after(0.1) == 5.0
    assert stale_after(10.0) == 30.0


def test_a_step_not_stored_before_vouches_however_late_its_write() -> None:
    # the loop handed it over (a write delayed by an outage still carries news)
    late = dict(now=100.0, probation_until=-math.inf, handed_at=0.0, step_time=0.1, done=False)
    assert not vouches(**late)
    assert vouches(**late, new_step=True)
    assert not vouches(**{**late, "probation_until": 101.0}, new_step=True)
