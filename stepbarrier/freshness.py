"""When a stored step may release a worker: the chief's heartbeat and its last publish.

Two clocks vouch for a stored step, both measured by Redis's own clock:

- the **heartbeat** says the writer's process is alive; it is fresh for three of
  the writer's own heartbeat periods (at least ``MIN_FRESH`` seconds), the
  period being the one the writer stored, not the reader's setting;
- the **last publish** says the training loop itself handed the step over; a
  step vouches for itself for its *confirmation window*: ``CONFIRM_STEPS``
  times the loop's running mean time per step, at least the heartbeat limit.
  A chief whose session is recovering (a preempted parameter server, a
  checkpoint restore) keeps heartbeating a step it may never reach again; once
  the window passes, that step releases no newly arriving worker until the
  loop publishes again. A slow chief (long steps) has a long window.

A finished job's step (``done``) needs neither: it is final.
"""

from __future__ import annotations

from stepbarrier.protocol import ChiefState

MIN_FRESH = 5.0
"""Seconds a heartbeat or a publish is fresh at least, whatever the periods."""
CONFIRM_STEPS = 4.0
"""How many of the loop's mean step times a published step vouches for itself."""


def fresh_heartbeat_limit(heartbeat: float) -> float:
    """Seconds after which a heartbeat of period ``heartbeat`` no longer vouches."""
    return max(3 * heartbeat, MIN_FRESH)


def confirm_window(heartbeat: float, step_time: float | None) -> float:
    """Seconds a step handed over by a loop of mean ``step_time`` vouches for itself."""
    window = fresh_heartbeat_limit(heartbeat)
    if step_time is not None:
        window = max(window, CONFIRM_STEPS * step_time)
    return window


def heartbeat_age(state: ChiefState, now_ms: int) -> float | None:
    """Seconds since the writer's last heartbeat, by Redis's clock."""
    if state.heartbeat_ms is None:
        return None
    return max(0.0, (now_ms - state.heartbeat_ms) / 1000.0)


def vouches_for_step(state: ChiefState, now_ms: int, default_heartbeat: float) -> bool:
    """True if ``state``'s step may release a worker that reads it now.

    Args:
        state: The stored state, with a step.
        now_ms: Redis's clock when it was read.
        default_heartbeat: The reader's heartbeat setting, used only when the
            writer (an older version) did not store its own period.
    """
    if state.done:
        return True
    age = heartbeat_age(state, now_ms)
    if age is None:
        return False
    period = (
        state.heartbeat_period_ms / 1000.0
        if state.heartbeat_period_ms is not None
        else default_heartbeat
    )
    if age > fresh_heartbeat_limit(period):
        return False
    if state.published_ms is None:
        return True  # written by a version that did not say; the heartbeat decides
    window = (
        state.confirm_ms / 1000.0 if state.confirm_ms is not None else fresh_heartbeat_limit(period)
    )
    return (now_ms - state.published_ms) / 1000.0 <= window
