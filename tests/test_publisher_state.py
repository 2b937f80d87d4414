"""PublisherState: what each write's reply means, without threads or Redis."""

from __future__ import annotations

import math
import threading

import pytest

from stepbarrier import BarrierConfig, scripts
from stepbarrier.publisher_state import Handover, PublisherState
from stepbarrier.step_write import WriteResult


def make_state(*, contributor: bool = False) -> PublisherState:
    handover = Handover(handed_at=0.0)
    return PublisherState(
        BarrierConfig(job="unit"),
        handover,
        threading.Event(),
        clock=lambda: 1.0,
        contributor=contributor,
    )


def hand_over(state: PublisherState, step: int) -> None:
    """What ``StepPublisher.publish`` does to the hand-over."""
    state.handover.latest = step
    state.handover.handed += 1


def accepted(stored_step: int, targets: tuple[int, ...] = ()) -> WriteResult:
    return WriteResult(scripts.ACCEPTED, stored_step, 1, False, targets)


def begun(state: PublisherState, generation: int = 1) -> int:
    """Begin a chief's generation as the writer thread would; the generation asked for."""
    wanted, needed = state.generation_to_begin()
    assert needed
    assert state.begin_generation(wanted, generation)
    return wanted


def test_an_accepted_reply_counts_its_hand_overs_and_sets_the_next_threshold() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 10)
    upcoming = state.next_write(done=False)
    assert upcoming is not None
    values, seq = upcoming
    assert (values.generation, values.step, values.epoch, seq) == (1, 10, 1, 1)
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
    assert not state.begin_generation(wanted, 7)
    assert state.generation is None and state.epoch == 0


def test_a_contributor_never_begins_a_generation() -> None:
    state = make_state(contributor=True)
    assert state.generation_to_begin() == (1, False)


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


def test_heard_targets_merge_with_the_pending_ones_and_the_lowest_wins() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 10)
    assert state.take_reply(accepted(10, (50,)), 1, wanted)
    state.heard(30)
    assert state.handover.next_threshold == 30.0
    state.heard(40)
    state.heard(5)  # already stored: that waiter needs no write
    assert state.handover.next_threshold == 30.0
    assert not state.wake.is_set()
    # a write that stores 35 drops the heard 30, keeps 40 below the pending 50
    hand_over(state, 35)
    assert state.take_reply(accepted(35, (50,)), 2, wanted)
    assert state.handover.next_threshold == 40.0


def test_a_heard_target_already_reached_asks_for_a_write_at_once() -> None:
    state = make_state()
    wanted = begun(state)
    hand_over(state, 10)
    assert state.take_reply(accepted(10), 1, wanted)
    hand_over(state, 20)  # not written yet
    state.heard(15)
    assert state.handover.next_threshold == 15.0
    assert state.wake.is_set()


def test_before_the_first_write_a_heard_target_keeps_the_next_write_immediate() -> None:
    state = make_state()
    state.heard(30)
    assert state.handover.next_threshold == -1.0


def test_a_rejoin_reply_drops_the_steps_handed_over_before_it() -> None:
    state = make_state(contributor=True)
    wanted, _ = state.generation_to_begin()
    hand_over(state, 10)
    rejoin = WriteResult(scripts.REJOIN, 12, 4, False, ())
    assert not state.take_reply(rejoin, 1, wanted)
    assert (state.generation, state.epoch) == (4, 4)
    assert state.next_write(done=False) is None  # step 10 may predate a restore
    hand_over(state, 11)
    upcoming = state.next_write(done=False)
    assert upcoming is not None and upcoming[0].generation == 4 and upcoming[1] == 2


def test_a_refused_contributor_ends_and_a_refused_chief_carries_on() -> None:
    worker, chief = make_state(contributor=True), make_state()
    worker.refused("NOPERM", forbidden=True)
    chief.refused("NOPERM", forbidden=True)
    assert worker.ended == "refused" and worker.end_message is not None
    assert "NOPERM" in worker.end_message
    assert chief.ended is None
    assert (worker.refusals, chief.refusals) == (1, 1)
