"""When a stored step may release a worker (stepbarrier.freshness), rule by rule."""

from __future__ import annotations

from dataclasses import replace

from stepbarrier.freshness import confirm_window, fresh_heartbeat_limit, vouches_for_step
from stepbarrier.protocol import ChiefState

NOW = 1_000_000_000


def state(**fields: object) -> ChiefState:
    base = ChiefState(
        step=10,
        generation=1,
        done=False,
        heartbeat_ms=NOW,
        chief="h:1",
        published_ms=NOW,
        heartbeat_period_ms=1000,
        confirm_ms=5000,
    )
    return replace(base, **fields)  # type: ignore[arg-type]


def test_a_fresh_heartbeat_and_a_recent_publish_vouch() -> None:
    assert vouches_for_step(state(), NOW, default_heartbeat=1.0)


def test_freshness_is_judged_by_the_chiefs_period_not_the_readers() -> None:
    slow_chief = state(heartbeat_ms=NOW - 20_000, heartbeat_period_ms=10_000, confirm_ms=60_000)
    # 20 s is stale for the reader's own 0.2 s heartbeat, fresh for the chief's 10 s
    assert vouches_for_step(slow_chief, NOW, default_heartbeat=0.2)
    assert not vouches_for_step(state(heartbeat_ms=NOW - 20_000), NOW, default_heartbeat=10.0)


def test_a_step_the_loop_has_not_published_lately_does_not_vouch() -> None:
    recovering = state(published_ms=NOW - 8_000)  # heartbeating, but no publish for 8 s
    assert not vouches_for_step(recovering, NOW, default_heartbeat=1.0)


def test_a_slow_loop_has_a_long_window() -> None:
    window = confirm_window(1.0, step_time=180.0)
    assert window == 720.0
    slow = state(published_ms=NOW - 300_000, confirm_ms=int(window * 1000))
    assert vouches_for_step(slow, NOW, default_heartbeat=1.0)


def test_a_finished_jobs_step_is_final() -> None:
    assert vouches_for_step(state(done=True, heartbeat_ms=0, published_ms=0), NOW, 1.0)


def test_an_older_chief_without_publish_times_is_judged_by_its_heartbeat() -> None:
    old = state(published_ms=None, confirm_ms=None, heartbeat_period_ms=None)
    assert vouches_for_step(old, NOW, default_heartbeat=1.0)
    stale = replace(old, heartbeat_ms=NOW - 6_000)
    assert not vouches_for_step(stale, NOW, default_heartbeat=1.0)


def test_no_heartbeat_never_vouches() -> None:
    assert not vouches_for_step(state(heartbeat_ms=None), NOW, default_heartbeat=1.0)


def test_the_heartbeat_limit_is_three_periods_at_least_five_seconds() -> None:
    assert fresh_heartbeat_limit(0.1) == 5.0
    assert fresh_heartbeat_limit(10.0) == 30.0
