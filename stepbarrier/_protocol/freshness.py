"""When a writer vouches for its step: probation and the confirmation window
(docs/protocol.md#vouch, #probation), and the operators' chief-liveness rule.

A writer decides on its **own monotonic clock** whether the step it writes may
release a worker, and says so in each write (``vouch``); waiters never compare
a stored time with their own or Redis's clock.
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
HAND_PUBLISHED = "cli:"
"""Prefix of the ``chief`` field written by ``stepbarrier publish``: it wrote once
and left, so it is no running chief that a later ``publish`` would supersede."""


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
    """Seconds after which a chief of period ``heartbeat`` is stale (``stale_limit``)."""
    return max(STALE_HEARTBEATS * heartbeat, MIN_CONFIRM)


def stale_limit(
    *, done: bool, heartbeat_age: float | None, chief: str | None, period: float
) -> float | None:
    """The heartbeat age from which a job's chief counts as stale, if the question arises.

    The one chief-liveness rule of every operator's view (``status``, ``watch``,
    ``jobs``, ``wait``'s progress, ``status --check``) and of ``publish``'s
    refusal (``STALE_HEARTBEATS``); no waiter decides by it (they judge observed
    writes). ``None`` when no running chief is in question: the job is done
    (however recent its last write), no chief wrote a heartbeat, or the step was
    published by hand (``HAND_PUBLISHED``).
    """
    if done or heartbeat_age is None or (chief or "").startswith(HAND_PUBLISHED):
        return None
    return stale_after(period)


def is_stale(*, done: bool, heartbeat_age: float | None, chief: str | None, period: float) -> bool:
    """True if the chief is stale by ``stale_limit``: it may be gone."""
    limit = stale_limit(done=done, heartbeat_age=heartbeat_age, chief=chief, period=period)
    return limit is not None and heartbeat_age is not None and heartbeat_age >= limit
