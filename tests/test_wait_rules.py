"""The decisions of one wait, without Redis (``stepbarrier.wait_rules``)."""

from __future__ import annotations

import logging

import pytest

from stepbarrier import BarrierAborted, BarrierConfig
from stepbarrier.protocol import ChiefState, StepAnnouncement
from stepbarrier.wait_rules import READ_NOW, WaitRules
from stepbarrier.waiter_link import Snapshot

GENERATION = 7
NOW_MS = 1_000_000


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def rules_after_a_read(step: int, clock: Clock, run_id: str | None = None) -> WaitRules:
    config = BarrierConfig(job="rules", heartbeat=1.0, run_id=run_id)
    rules = WaitRules(config, 50, None, clock, logging.getLogger("test"))
    state = ChiefState(step, GENERATION, False, NOW_MS, "chief", run_id=run_id, published_ms=NOW_MS)
    assert rules.on_snapshot(Snapshot(now_ms=NOW_MS, reset_ms=None, state=state)) is None
    return rules


def announced(
    step: int, *, run_id: str | None = None, generation: int = GENERATION
) -> StepAnnouncement:
    return StepAnnouncement(step, generation, False, False, run_id)


def test_an_announcement_heard_in_passing_keeps_the_chief_alive_and_moving() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock)
    rules.reads_without_message = 1
    clock.now = 130.0
    rules.heard(announced(20), at=125.0)
    assert (rules.last_step, rules.last_alive, rules.last_progress) == (20, 125.0, 125.0)
    assert rules.reads_without_message == 0 and rules.heartbeat_age == 5.0


@pytest.mark.parametrize(
    "announcement",
    [announced(20, run_id="other"), announced(20, generation=GENERATION - 1), announced(5)],
    ids=["another run", "an older generation", "an older step"],
)
def test_an_announcement_heard_in_passing_that_is_not_ours_changes_nothing(
    announcement: StepAnnouncement,
) -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock)
    before = (rules.last_step, rules.last_alive, rules.last_progress)
    rules.heard(announcement, at=clock.now + 5)
    assert (rules.last_step, rules.last_alive, rules.last_progress) == before


def test_a_malformed_message_heard_still_proves_the_subscription_alive() -> None:
    rules = rules_after_a_read(10, Clock())
    rules.reads_without_message = 1
    rules.heard(None, at=0.0)
    assert rules.reads_without_message == 0


def test_announcements_release_abort_or_ask_for_a_read() -> None:
    rules = rules_after_a_read(10, Clock())
    assert rules.on_announcement(announced(20), b"") is None
    assert rules.on_announcement(announced(60, generation=GENERATION + 1), b"") is READ_NOW
    assert rules.on_announcement(announced(50), b"") == 50
    with pytest.raises(BarrierAborted):
        rules.on_announcement(StepAnnouncement(None, None, False, True), b"")
