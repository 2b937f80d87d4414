"""PublisherState: what each write's reply means, without threads or Redis."""

from __future__ import annotations

import logging
import math
import threading

import pytest

from stepbarrier import BarrierConfig
from stepbarrier._chief.publish_call import Beginning, StepWrite, WriteResult
from stepbarrier._chief.state import Handover, PublisherState
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.freshness import FENCE

HEARTBEAT = 1.0


class Clock:
    def __init__(self) -> None:
        self.now = 1.0

    def __call__(self) -> float:
        return self.now


def make_state(*, contributor: bool = False, clock: Clock | None = None) -> PublisherState:
    handover = Handover(handed_at=0.0)
    return PublisherState(
        BarrierConfig(job="unit", heartbeat=HEARTBEAT),
        handover,
        threading.Event(),
        clock=clock or Clock(),
        mode="contributor" if contributor else "chief",
    )


def hand_over(state: PublisherState, step: int, at: float | None = None) -> None:
    """What ``StepPublisher.publish`` does to the hand-over."""
    state.handover.latest = step
    state.handover.handed += 1
    if at is not None:
        state.handover.handed_at = at


def accepted(stored_step: int, targets: tuple[int, ...] = (), *, probation: int = 0) -> WriteResult:
    return WriteResult(scripts.ACCEPTED, stored_step, 1, False, targets, probation=probation)


def begun(state: PublisherState, generation: int = 1, marker: str = "") -> int:
    """Begin a chief's generation as the writer thread would; the generation asked for."""
    wanted, needed = state.generation_to_begin()
    assert needed
    assert state.begin_generation(wanted, Beginning(generation, marker, None))
    return wanted


def next_values(state: PublisherState, *, done: bool = False) -> StepWrite:
    upcoming = state.next_write(done=done)
    assert upcoming is not None
    return upcoming[0]


def test_an_accepted_reply_counts_its_hand_overs_and_sets_the_next_threshold() -> None:
    state = make_state()
    wanted = begun(state, marker="tok-1")
    hand_over(state, 10)
    upcoming = state.next_write(done=False)
    assert upcoming is not None
    values, seq = upcoming
    assert (values.generation, values.step, values.reset_marker, seq) == (1, 10, "tok-1", 1)
    assert state.take_reply(accepted(10, (15, 20)), seq, wanted)
    assert state.stored_seq == 1
    assert state.pending == (15, 20)
    assert state.handover.next_threshold == 15.0


def test_the_next_threshold_is_the_smallest_pending_target_and_inf_without_one() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 5)
    assert state.take_reply(accepted(5, (7, 9)), 1, wanted)
    assert state.handover.next_threshold == 7.0
    assert state.take_reply(accepted(8, ()), 1, wanted)
    assert state.handover.next_threshold == math.inf


def test_a_reply_to_a_write_of_an_older_generation_is_discarded() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 100)
    state.new_generation()  # while the write of 100 is on its way
    assert not state.take_reply(accepted(100, (150,)), 1, wanted)
    assert state.stored_seq == 0
    assert state.pending == ()
    assert state.handover.next_threshold == -1.0
    assert state.wake.is_set()  # the step of the new generation goes out at once


def test_a_new_generation_drops_the_step_and_asks_a_chief_for_a_generation() -> None:
    state = make_state()
    begun(state)
    hand_over(state, 30)
    state.new_generation()
    assert state.handover.latest is None
    assert state.next_write(done=False) is None
    wanted, needed = state.generation_to_begin()
    assert needed and wanted == 2


def test_a_generation_begun_for_an_outdated_request_is_not_taken() -> None:
    state = make_state()
    wanted, _ = state.generation_to_begin()
    state.new_generation()
    assert not state.begin_generation(wanted, Beginning(7, "tok", None))
    assert state.generation is None and state.reset_marker == ""


def test_a_contributor_never_begins_a_generation() -> None:
    state = make_state(contributor=True)
    assert state.generation_to_begin() == (1, False)
    state.new_generation()
    assert state.generation_to_begin() == (1, False)


# -- endings ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("status", "why", "words"),
    [(scripts.SUPERSEDED, "superseded", "a newer chief"), (scripts.WAS_RESET, "reset", "reset")],
)
def test_a_superseded_or_reset_reply_ends_the_writer_for_good(
    status: int, why: str, words: str
) -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 10)
    assert not state.take_reply(WriteResult(status, 10, 2, False, (11,)), 1, wanted)
    assert state.ended == why
    assert state.end_message is not None and words in state.end_message
    assert state.handover.next_threshold == math.inf
    assert state.stored_seq == 0
    assert state.wake.is_set()
    state.new_generation()  # an ended writer ignores it
    assert state.handover.latest == 10
    assert state.generation_to_begin()[0] == 1


def test_a_superseded_chief_names_both_generations() -> None:
    state = make_state()
    wanted = begun(state, generation=41)
    hand_over(state, 10)
    state.take_reply(WriteResult(scripts.SUPERSEDED, 3, 42, False, ()), 1, wanted)
    assert state.end_message is not None
    assert "generation 42" in state.end_message and "generation 41" in state.end_message


def test_a_conflict_ends_the_chief_with_an_error(caplog: pytest.LogCaptureFixture) -> None:
    state = make_state()
    hand_over(state, 10)
    with caplog.at_level(logging.WARNING, logger="stepbarrier._chief.publisher"):
        state.conflict("job unit is in use by run a; this chief of run b does not take it over")
    assert state.ended == "conflict"
    assert state.end_message is not None and "in use by run a" in state.end_message
    assert state.handover.next_threshold == math.inf and state.wake.is_set()
    assert [r.levelno for r in caplog.records] == [logging.ERROR]
    assert "in use by run a" in caplog.records[0].getMessage()
    state.new_generation()  # it never writes again
    assert state.generation_to_begin()[0] == 1


# -- targets ---------------------------------------------------------------------------


def test_registered_targets_merge_with_the_pending_ones_and_the_lowest_wins() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 10)
    assert state.take_reply(accepted(10, (50,)), 1, wanted)
    state.on_registration(30)
    assert state.handover.next_threshold == 30.0
    state.on_registration(40)
    assert state.handover.next_threshold == 30.0
    assert not state.wake.is_set()
    # a write that stores 35 drops the heard 30, keeps 40 below the pending 50
    hand_over(state, 35)
    assert state.take_reply(accepted(35, (50,)), 2, wanted)
    assert state.handover.next_threshold == 40.0


def test_a_late_joiner_whose_step_is_stored_gets_a_write_at_once() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 10)
    assert state.take_reply(accepted(10, (50,)), 1, wanted)
    state.on_registration(5)  # released only by a write it sees happen: one goes out now
    assert state.wake.is_set()
    assert state.handover.next_threshold == 50.0  # and it is no target to reach


def test_a_heard_target_already_handed_over_asks_for_a_write_at_once() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 10)
    assert state.take_reply(accepted(10), 1, wanted)
    hand_over(state, 20)  # not written yet
    state.on_registration(15)
    assert state.handover.next_threshold == 15.0
    assert state.wake.is_set()


def test_before_the_first_write_a_heard_target_keeps_the_next_write_immediate() -> None:
    state = make_state()
    state.on_registration(30)
    assert state.handover.next_threshold == -1.0


# -- vouch and probation ---------------------------------------------------------------


def test_a_write_that_created_the_state_puts_the_chief_on_probation() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert next_values(state).vouch
    assert state.take_reply(accepted(10, probation=77), 1, wanted)
    assert state.probation_until == pytest.approx(clock.now + FENCE)
    hand_over(state, 11, at=clock.now)  # the loop is busy: only probation stops the vouch
    assert not next_values(state).vouch
    assert not next_values(state, done=True).vouch  # not even a final write vouches
    clock.now += FENCE - 0.01
    state.handover.handed_at = clock.now
    assert not next_values(state).vouch
    clock.now += 0.02
    state.handover.handed_at = clock.now
    assert next_values(state).vouch


def test_a_write_that_found_the_state_brings_no_probation() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert state.take_reply(accepted(10), 1, wanted)
    assert state.probation_until == -math.inf
    assert next_values(state).vouch


def test_a_contributor_is_never_on_probation() -> None:
    clock = Clock()
    state = make_state(contributor=True, clock=clock)
    state.join(5)
    hand_over(state, 10, at=clock.now)
    assert state.take_reply(accepted(10, probation=77), 1, 1)
    assert state.probation_until == -math.inf
    assert next_values(state).vouch


def test_a_rewritten_step_vouches_only_within_the_confirmation_window_unless_final() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert next_values(state).vouch
    assert state.take_reply(accepted(10), 1, wanted)
    clock.now += 5.0  # MIN_CONFIRM: a loop without a mean step time yet
    assert next_values(state).vouch
    clock.now += 0.01
    assert not next_values(state).vouch  # the loop has not handed a step over lately
    assert next_values(state, done=True).vouch  # the final step stands for itself
    state.handover.step_time = 10.0  # a slow loop: four of its steps
    assert next_values(state).vouch
    clock.now = state.handover.handed_at + 40.01
    assert not next_values(state).vouch


def test_a_step_not_yet_vouched_for_vouches_however_late_its_write() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert next_values(state).vouch
    assert state.take_reply(accepted(10), 1, wanted)
    hand_over(state, 11, at=clock.now)
    clock.now += 60.0  # e.g. Redis was unreachable meanwhile
    assert next_values(state).vouch  # the loop did hand step 11 over
    assert state.take_reply(accepted(11), 2, wanted)
    assert not next_values(state).vouch  # its rewrites need the window again


def test_a_write_that_did_not_vouch_leaves_its_step_news() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert state.take_reply(accepted(10, probation=77), 1, wanted)  # probation
    clock.now += FENCE + 60.0  # probation over, and the window long passed
    assert next_values(state).vouch  # step 10 was never vouched for: it is news


def test_a_chief_says_it_served_its_probation_once_fence_passed_since_it_learned_of_it() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert next_values(state).served == 0  # no probation known
    assert state.take_reply(accepted(10, probation=77), 1, wanted)
    assert next_values(state).served == 0
    clock.now += FENCE - 0.01
    assert next_values(state).served == 0
    clock.now += 0.02
    assert next_values(state).served == 77  # the very probation Redis named
    assert state.take_reply(accepted(10), 2, wanted)  # Redis cleared it
    assert next_values(state).served == 0


def test_a_lost_reply_costs_no_probation_the_next_reply_names_it() -> None:
    # the write that made the state on probation had its reply lost; the retry's
    # reply shows the stored probation, and the chief counts FENCE from then
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    clock.now += 2.0
    assert state.take_reply(accepted(10, probation=77), 1, wanted)  # the retry's reply
    assert state.probation_until == pytest.approx(clock.now + FENCE)
    clock.now += FENCE - 0.01
    hand_over(state, 11, at=clock.now)
    assert not next_values(state).vouch and next_values(state).served == 0


def test_the_same_probation_named_again_does_not_restart_it_a_new_one_does() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert state.take_reply(accepted(10, probation=77), 1, wanted)
    until = state.probation_until
    clock.now += 1.0
    assert state.take_reply(accepted(10, probation=77), 2, wanted)
    assert state.probation_until == until
    assert state.take_reply(accepted(10, probation=99), 3, wanted)  # Redis forgot again
    assert state.probation_until == pytest.approx(clock.now + FENCE)


def test_a_new_generation_forgets_the_old_ones_probation() -> None:
    clock = Clock()
    state = make_state(clock=clock)
    wanted = begun(state)
    hand_over(state, 10, at=clock.now)
    assert state.take_reply(accepted(10, probation=77), 1, wanted)
    state.new_generation()
    begun(state, generation=2)
    hand_over(state, 3, at=clock.now)
    values = next_values(state)
    assert values.vouch and values.served == 0  # Redis says at the first reply


# -- the reset marker ------------------------------------------------------------------


def test_a_chief_writes_under_the_marker_it_began_under() -> None:
    state = make_state()
    begun(state, marker="1700000000000")
    hand_over(state, 10)
    assert next_values(state).reset_marker == "1700000000000"


def test_a_later_generation_keeps_the_first_generations_marker() -> None:
    state = make_state()
    begun(state, marker="tok-1")
    state.new_generation()
    begun(state, generation=2, marker="tok-2")  # a reset came since this publisher began
    hand_over(state, 10)
    assert next_values(state).reset_marker == "tok-1"  # so its writes are refused


def test_a_later_generation_keeps_the_first_generations_absent_marker() -> None:
    # the same rule when the job had never been reset as this publisher began: a
    # reset since then must stop it, not become the marker of its next generation
    state = make_state()
    begun(state, marker="")
    state.new_generation()
    begun(state, generation=2, marker="tok-2")
    hand_over(state, 10)
    assert next_values(state).reset_marker == ""


# -- contributors ----------------------------------------------------------------------


def test_a_contributor_joins_the_generation_it_finds_and_no_other() -> None:
    state = make_state(contributor=True)
    wanted, _ = state.generation_to_begin()
    hand_over(state, 10)
    assert next_values(state).generation == 0  # not joined yet: it asks
    other = WriteResult(scripts.OTHER_GENERATION, 12, 4, False, ())
    assert not state.take_reply(other, 1, wanted)
    assert (state.joined, state.generation, state.ended) == (4, 4, None)
    # the step handed over before it joined may have been read before generation
    # 4 began (its chief restored an older checkpoint): it is never written
    assert state.next_write(done=False) is None
    assert state.stored_seq == 1  # counted all the same: a flush does not hang on it
    hand_over(state, 11)
    assert next_values(state).generation == 4 and next_values(state).step == 11
    assert state.take_reply(WriteResult(scripts.ACCEPTED, 12, 4, False, ()), 2, wanted)
    # a newer chief generation took over: the contributor stops for good
    newer = WriteResult(scripts.OTHER_GENERATION, 3, 5, False, ())
    assert not state.take_reply(newer, 3, wanted)
    assert state.ended == "superseded"
    assert state.end_message is not None and "generation 5" in state.end_message
    assert state.generation == 4


def test_a_contributor_told_its_generation_never_reports_into_another() -> None:
    state = make_state(contributor=True)
    state.join(7)
    wanted, _ = state.generation_to_begin()
    hand_over(state, 10)
    assert next_values(state).generation == 7
    assert not state.take_reply(WriteResult(scripts.OTHER_GENERATION, 12, 6, False, ()), 1, wanted)
    assert state.ended == "superseded" and state.generation == 7


def test_a_contributor_with_nothing_to_join_tries_again() -> None:
    state = make_state(contributor=True)
    wanted, _ = state.generation_to_begin()
    hand_over(state, 10)
    assert not state.take_reply(WriteResult(scripts.NOTHING_TO_JOIN, None, 0, False, ()), 1, wanted)
    assert state.ended is None and state.joined is None
    assert state.next_write(done=False) is not None


def test_a_contributor_never_says_it_served_a_probation() -> None:
    state = make_state(contributor=True)
    state.join(7)
    hand_over(state, 10)
    assert state.take_reply(accepted(10, probation=77), 1, 1)
    assert next_values(state).served == 0


def test_a_refused_contributor_ends_and_a_refused_chief_carries_on() -> None:
    worker, chief = make_state(contributor=True), make_state()
    worker.refused("NOPERM", forbidden=True)
    chief.refused("NOPERM", forbidden=True)
    assert worker.ended == "refused" and worker.end_message is not None
    assert "NOPERM" in worker.end_message
    assert chief.ended is None
    assert (worker.refusals, chief.refusals) == (1, 1)
