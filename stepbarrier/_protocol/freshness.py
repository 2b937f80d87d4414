"""When a writer vouches for its step: probation and the confirmation window.

A writer (the chief, or a contributor) decides on its **own monotonic clock**
whether the step it writes may release a worker, and says so in each write
(``vouch``); waiters never compare a stored time with their own or Redis's
clock (docs/protocol.md#vouch). It vouches when both hold:

- it is out of **probation**: a write that found no valid state (Redis
  restarted empty, the key was evicted or deleted, or the job is new) made
  the state, and whoever wrote it may be a zombie whose newer successor has
  not written since Redis forgot it. Any live newer chief writes within one
  heartbeat and supersedes it, so the state vouches only after
  ``FENCE`` has passed on the writer's clock since it learned of it;
- its training loop handed the step over within the **confirmation window**
  (``confirm_window``): a chief whose session is recovering (a preempted
  parameter server, a checkpoint restore) keeps writing a step it may never
  reach again, and stops vouching for it once the window passes.

The final write of a finished job vouches without the window (its step is
final), and so does the first write of a step the generation has not stored yet
(its loop did hand it over, however late the write comes): the window is for a
stale step rewritten heartbeat after heartbeat.
"""

from __future__ import annotations

MIN_CONFIRM = 5.0
"""Seconds a handed-over step vouches for itself at least."""
CONFIRM_STEPS = 4.0
"""How many of the loop's mean step times a handed-over step vouches for itself."""
FENCE = 3.0
"""Seconds a state made anew stays on probation, and a chief watches another run's
state before taking it over: one value for the whole job, whatever each process's
heartbeat (a zombie with a short heartbeat must not end its probation before a
newest chief with a long one writes: docs/protocol.md#probation)."""
MAX_HEARTBEAT = FENCE / 3
"""The longest heartbeat a chief may have: a live chief writes three times within
``FENCE``, so one lost or late write does not let a zombie's state vouch."""
GRACE = FENCE
"""Seconds a waiter reads a finished or pinned state it did not see written, unchanged
and with no newer begin on record, before it trusts it without a run id: a rerun's
chief that begins within it leaves its begin on the state (docs/protocol.md#grace)."""
STALE_HEARTBEATS = 3.0
"""For operators' views only: a chief unheard for this many heartbeats (at least
``MIN_CONFIRM`` seconds, by Redis's clock) is shown as stale."""


def confirm_window(step_time: float | None) -> float:
    """Seconds a step handed over by a loop of mean ``step_time`` vouches for itself."""
    if step_time is None:
        return MIN_CONFIRM
    return max(MIN_CONFIRM, CONFIRM_STEPS * step_time)


def vouches(
    *,
    now: float,
    probation_until: float,
    handed_at: float,
    step_time: float | None,
    done: bool,
    new_step: bool = False,
) -> bool:
    """True if a write made at ``now`` (the writer's clock) vouches for its step.

    ``done``: the job's final write; ``new_step``: a step the generation has not
    stored before. Neither needs the confirmation window; both need the end of
    probation.
    """
    if now < probation_until:
        return False
    return done or new_step or now - handed_at <= confirm_window(step_time)


def stale_after(heartbeat: float) -> float:
    """Seconds after which an operator's view calls a chief of period ``heartbeat``
    stale (display only: no waiter decides by it)."""
    return max(STALE_HEARTBEATS * heartbeat, MIN_CONFIRM)
