"""The decisions of one wait, without Redis (``stepbarrier._worker.wait_state``)."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepbarrier import BarrierAborted, BarrierConfig
from stepbarrier._protocol.freshness import GRACE
from stepbarrier._protocol.wire import ChiefState, StepAnnouncement
from stepbarrier._worker.snapshot import Snapshot
from stepbarrier._worker.wait_state import READ_NOW, WaitRules

GENERATION = 7
TARGET = 50
STALL = 600.0
NOW_MS = 1_000_000
RESET = StepAnnouncement(None, None, False, True)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_rules(clock: Clock, run_id: str | None = None) -> WaitRules:
    config = BarrierConfig(job="rules", heartbeat=1.0, run_id=run_id, stall_timeout=STALL)
    return WaitRules(config, TARGET, None, clock, logging.getLogger("test.wait_rules"))


def chief(
    step: int,
    *,
    beat: int = 1,
    generation: int = GENERATION,
    run_id: str | None = None,
    vouch: bool = True,
    done: bool = False,
    pinned: bool = False,
    fence: int = 0,
) -> ChiefState:
    return ChiefState(
        step,
        generation,
        done,
        NOW_MS,
        "chief",
        run_id=run_id,
        beat=beat,
        vouch=vouch,
        pinned=pinned,
        fence=fence,
    )


def read(state: ChiefState, marker: str | None = None) -> Snapshot:
    return Snapshot(now_ms=NOW_MS, reset_marker=marker, state=state)


def announced(
    step: int,
    *,
    beat: int = 2,
    run_id: str | None = None,
    generation: int = GENERATION,
    vouch: bool = True,
    done: bool = False,
    pinned: bool = False,
) -> StepAnnouncement:
    return StepAnnouncement(step, generation, done, False, run_id, beat, vouch, pinned)


def rules_after_a_read(
    step: int, clock: Clock, run_id: str | None = None, *, beat: int = 1, marker: str | None = None
) -> WaitRules:
    rules = make_rules(clock, run_id)
    assert rules.on_snapshot(read(chief(step, beat=beat, run_id=run_id), marker)) is None
    return rules


# -- observed writes -------------------------------------------------------------------


@pytest.mark.parametrize("run_id", [None, "run-1"])
def test_the_first_read_alone_never_releases(run_id: str | None) -> None:
    clock = Clock()
    rules = make_rules(clock, run_id)
    clock.now += 2.0
    # a dead chief's last state looks just like this
    assert rules.on_snapshot(read(chief(60, beat=9, run_id=run_id))) is None
    assert rules.holding is not None and "no write of a live chief was seen" in rules.holding
    assert not rules.chief_seen and rules.live_mark is None
    assert rules.last_alive == rules.started  # nor is it a sign of life


def test_a_second_read_of_the_same_write_does_not_release() -> None:
    clock = Clock()
    rules = rules_after_a_read(60, clock, beat=9)
    clock.now += 5.0
    assert rules.on_snapshot(read(chief(60, beat=9))) is None
    assert not rules.chief_seen and rules.last_alive == rules.started


def test_a_read_of_another_write_is_an_observed_write_and_releases() -> None:
    clock = Clock()
    rules = rules_after_a_read(60, clock, beat=9)
    clock.now += 5.0
    assert rules.on_snapshot(read(chief(60, beat=10))) == 60
    assert rules.chief_seen and rules.live_mark == (GENERATION, 10)
    assert rules.last_alive == clock.now


def test_a_read_of_a_newer_generation_is_an_observed_write() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock, beat=9)
    assert rules.on_snapshot(read(chief(60, beat=1, generation=GENERATION + 1))) == 60
    assert rules.generation == GENERATION + 1


def test_a_read_below_the_target_still_observes_the_write() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock, beat=1)
    clock.now += 3.0
    assert rules.on_snapshot(read(chief(20, beat=2))) is None
    assert rules.chief_seen and rules.last_alive == clock.now and rules.last_step == 20
    # the next write reaches the target: it is seen happen, so it releases
    assert rules.on_snapshot(read(chief(50, beat=3))) == 50


def test_an_announcement_on_the_subscription_is_an_observed_write() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock)
    clock.now += 1.0
    assert rules.on_announcement(announced(60, beat=2), b"") == 60
    assert rules.chief_seen and rules.last_alive == clock.now


def test_an_announcement_below_the_target_makes_its_state_live_for_a_read() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock, beat=1)
    assert rules.on_announcement(announced(40, beat=4), b"") is None
    assert rules.live_mark == (GENERATION, 4)
    # the state written by that write (or a later one) is live; an older one is not
    assert rules.on_snapshot(read(chief(60, beat=3))) is None
    assert rules.holding is not None and "no write of a live chief" in rules.holding
    assert rules.on_snapshot(read(chief(60, beat=4))) == 60


def test_a_new_generations_read_is_asked_for_and_released_by() -> None:
    rules = rules_after_a_read(10, Clock(), beat=5)
    newer = announced(60, beat=1, generation=GENERATION + 1)
    assert rules.on_announcement(newer, b"") is READ_NOW
    # no older generation counts from now on (a zombie's write that remakes the
    # state Redis lost before the read is older than what the wait heard)
    assert rules.generation == GENERATION + 1
    assert rules.on_snapshot(read(chief(60, beat=9, generation=GENERATION))) is None
    # the read made for that announcement shows its write: observed live
    assert rules.on_snapshot(read(chief(60, beat=1, generation=GENERATION + 1)), newer) == 60


def test_a_read_made_for_an_announcement_of_another_run_observes_nothing() -> None:
    rules = rules_after_a_read(60, Clock(), "mine", beat=5)
    theirs = announced(60, beat=6, run_id="theirs")
    assert rules.on_snapshot(read(chief(60, beat=5, run_id="mine")), theirs) is None
    assert not rules.chief_seen and rules.live_mark is None


def test_a_write_that_does_not_vouch_does_not_release() -> None:
    rules = rules_after_a_read(10, Clock())
    assert rules.on_announcement(announced(60, beat=2, vouch=False), b"") is None
    assert rules.holding is not None and "does not vouch" in rules.holding
    assert rules.on_snapshot(read(chief(60, beat=3, vouch=False))) is None
    assert rules.on_snapshot(read(chief(60, beat=4, vouch=True))) == 60


def test_an_older_generation_is_ignored() -> None:
    rules = rules_after_a_read(10, Clock())
    assert rules.on_announcement(announced(60, generation=GENERATION - 1), b"") is None
    assert not rules.chief_seen
    # e.g. a failover lost the newest write: the newer chief writes it again
    assert rules.on_snapshot(read(chief(60, beat=5, generation=GENERATION - 1))) is None
    assert rules.generation == GENERATION and not rules.chief_seen


def test_another_runs_writes_neither_release_nor_abort() -> None:
    rules = rules_after_a_read(10, Clock(), "mine")
    assert rules.on_announcement(announced(20, run_id="theirs", done=True), b"") is None
    assert rules.on_announcement(announced(60, run_id="theirs"), b"") is None
    assert not rules.chief_seen
    assert rules.on_snapshot(read(chief(20, beat=3, run_id="theirs", done=True))) is None
    assert rules.other_run == "theirs"
    assert rules.holding is not None and "run theirs" in rules.holding


def test_a_malformed_message_changes_nothing_but_is_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rules = rules_after_a_read(10, Clock())
    rules.reads_without_message = 1
    with caplog.at_level(logging.WARNING, logger="test.wait_rules"):
        assert rules.on_announcement(None, b"{nonsense") is None
    assert "malformed message" in caplog.text
    assert rules.reads_without_message == 0 and not rules.chief_seen


# -- done and pinned -------------------------------------------------------------------


def test_a_finished_state_of_its_own_run_releases_on_the_first_read() -> None:
    rules = make_rules(Clock(), "run-1")
    assert rules.on_snapshot(read(chief(60, run_id="run-1", done=True))) == 60


def test_a_finished_state_of_its_own_run_below_the_target_aborts_on_the_first_read() -> None:
    rules = make_rules(Clock(), "run-1")
    with pytest.raises(BarrierAborted) as caught:
        rules.on_snapshot(read(chief(20, run_id="run-1", done=True)))
    assert caught.value.reason == "done"


def test_an_unobserved_finished_state_without_a_run_id_is_trusted_after_the_grace() -> None:
    # it may be an earlier run's under the same job name: a rerun's chief that
    # begins within the grace leaves its begin on it; none did, so it is this job's
    clock = Clock()
    rules = make_rules(clock)
    assert rules.on_snapshot(read(chief(60, done=True))) is None
    assert rules.holding is not None and "no run id" in rules.holding
    assert rules.read_at <= clock.now + GRACE  # the wait reads again when the grace ends
    clock.now += GRACE - 0.01
    assert rules.on_snapshot(read(chief(60, done=True))) is None
    clock.now += 0.02
    assert rules.on_snapshot(read(chief(60, done=True))) == 60
    # a late worker above the finished step: aborted after the grace, not before
    clock = Clock()
    rules = make_rules(clock)
    assert rules.on_snapshot(read(chief(20, done=True))) is None
    clock.now += GRACE
    with pytest.raises(BarrierAborted) as caught:
        rules.on_snapshot(read(chief(20, done=True)))
    assert caught.value.reason == "done"


def test_a_finished_state_a_new_chief_began_on_is_not_trusted(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # a rerun's chief began (its begin is on record, above the state's
    # generation): the finished state is the previous run's
    clock = Clock()
    rules = make_rules(clock)
    assert rules.on_snapshot(read(chief(60, done=True))) is None
    clock.now += GRACE - 1.0
    with caplog.at_level(logging.WARNING, logger="test.wait_rules"):
        newer = chief(60, done=True, fence=GENERATION + 1)
        assert rules.on_snapshot(read(newer)) is None
        clock.now += 2 * GRACE
        assert rules.on_snapshot(read(newer)) is None
    assert rules.holding is not None and "newer chief has begun" in rules.holding
    assert "run id" in caplog.text


def test_a_final_write_seen_happening_within_the_grace_is_trusted_at_once() -> None:
    clock = Clock()
    rules = make_rules(clock)
    assert rules.on_snapshot(read(chief(20, done=False))) is None
    clock.now += 0.5
    # the state moved between two reads: a write happened while the wait watched
    assert rules.on_snapshot(read(chief(60, beat=2, done=True))) == 60


def test_an_observed_finished_state_without_a_run_id_is_trusted() -> None:
    rules = rules_after_a_read(10, Clock())
    assert rules.on_announcement(announced(60, beat=2, done=True), b"") == 60
    rules = rules_after_a_read(10, Clock())
    with pytest.raises(BarrierAborted) as caught:
        rules.on_announcement(announced(20, beat=2, done=True), b"")
    assert caught.value.reason == "done"
    rules = rules_after_a_read(10, Clock())
    assert rules.on_snapshot(read(chief(60, beat=2, done=True))) == 60  # a read saw it happen


def test_a_finished_state_written_on_probation_does_not_release() -> None:
    rules = make_rules(Clock(), "run-1")
    assert rules.on_snapshot(read(chief(60, run_id="run-1", done=True, vouch=False))) is None
    assert rules.holding is not None and "probation" in rules.holding
    assert rules.on_announcement(announced(60, run_id="run-1", done=True, vouch=False), b"") is None


def test_a_pinned_step_of_this_run_releases_on_the_first_read() -> None:
    rules = make_rules(Clock(), "run-1")
    state = chief(60, run_id="run-1", vouch=False, pinned=True)
    assert rules.on_snapshot(read(state)) == 60


def test_a_pinned_step_without_a_run_id_releases_a_wait_that_saw_it_or_after_the_grace() -> None:
    # an earlier run's pin under the same job name must not release a rerun at
    # once: a rerun's chief that begins within the grace is on record by then
    rules = make_rules(Clock())
    assert rules.on_snapshot(read(chief(60, vouch=False, pinned=True))) is None
    assert rules.holding is not None and "pinned" in rules.holding
    assert rules.on_announcement(announced(60, beat=2, vouch=False, pinned=True), b"") == 60
    clock = Clock()
    rules = make_rules(clock)
    assert rules.on_snapshot(read(chief(60, vouch=False, pinned=True))) is None
    clock.now += GRACE
    assert rules.on_snapshot(read(chief(60, vouch=False, pinned=True))) == 60
    rules = make_rules(clock)
    assert rules.on_snapshot(read(chief(60, vouch=False, pinned=True, fence=9))) is None
    clock.now += GRACE
    assert rules.on_snapshot(read(chief(60, vouch=False, pinned=True, fence=9))) is None


def test_a_pinned_step_below_the_target_keeps_the_wait_going() -> None:
    rules = make_rules(Clock(), "run-1")
    assert rules.on_snapshot(read(chief(20, run_id="run-1", vouch=False, pinned=True))) is None
    assert rules.on_announcement(announced(20, beat=2, run_id="run-1", pinned=True), b"") is None
    assert rules.on_announcement(announced(50, beat=3, run_id="run-1", pinned=True), b"") == 50


# -- the reset marker ------------------------------------------------------------------


def test_the_first_read_records_the_marker_and_the_same_one_goes_on() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock, marker="1700000000000")
    assert rules.reset_marker == "1700000000000"
    assert rules.on_snapshot(read(chief(60, beat=2), "1700000000000")) == 60


@pytest.mark.parametrize(
    ("first", "later"),
    [("1700000000000", "1700000000001"), ("1700000000000", "1699999999999"), (None, "17")],
    ids=["a later token", "an earlier token", "a token where there was none"],
)
def test_a_different_marker_aborts_whatever_the_state_says(first: str | None, later: str) -> None:
    rules = rules_after_a_read(10, Clock(), marker=first)
    with pytest.raises(BarrierAborted) as caught:
        rules.on_snapshot(read(chief(60, beat=2), later))
    assert caught.value.reason == "reset"


def test_a_marker_gone_since_the_first_read_is_no_reset() -> None:
    rules = rules_after_a_read(10, Clock(), marker="1700000000000")
    assert rules.on_snapshot(read(chief(60, beat=2), None)) == 60


def test_a_reset_announcement_only_asks_for_a_read() -> None:
    rules = rules_after_a_read(10, Clock(), marker="17")
    assert rules.on_announcement(RESET, b"") is READ_NOW
    assert rules.on_snapshot(read(chief(20, beat=2), "17")) is None  # the read decides
    with pytest.raises(BarrierAborted):
        rules.on_snapshot(read(ChiefState.empty(), "18"))


def test_announcements_release_or_ask_for_a_read() -> None:
    rules = rules_after_a_read(10, Clock())
    assert rules.on_announcement(announced(20, beat=2), b"") is None
    assert rules.on_announcement(announced(50, beat=3), b"") == 50
    rules = rules_after_a_read(10, Clock())
    assert rules.on_announcement(announced(60, beat=1, generation=GENERATION + 1), b"") is READ_NOW
    assert rules.on_announcement(announced(50, beat=3), b"") is None  # older than heard
    assert rules.on_announcement(RESET, b"") is READ_NOW


# -- heard in passing ------------------------------------------------------------------


def test_an_announcement_heard_in_passing_keeps_the_chief_alive_and_moving() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock)
    rules.reads_without_message = 1
    clock.now = 130.0
    rules.take_in(announced(20, beat=2), at=125.0)
    assert (rules.last_step, rules.last_alive, rules.last_progress) == (20, 125.0, 125.0)
    assert rules.reads_without_message == 0 and rules.heartbeat_age == 5.0
    assert rules.live_mark == (GENERATION, 2)


@pytest.mark.parametrize(
    "announcement",
    [announced(20, run_id="other"), announced(20, generation=GENERATION - 1)],
    ids=["another run", "an older generation"],
)
def test_an_announcement_heard_in_passing_that_is_not_ours_changes_nothing(
    announcement: StepAnnouncement,
) -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock)
    before = (rules.last_step, rules.last_alive, rules.last_progress, rules.live_mark)
    rules.take_in(announcement, at=clock.now + 5)
    assert (rules.last_step, rules.last_alive, rules.last_progress, rules.live_mark) == before
    assert not rules.chief_seen


@pytest.mark.parametrize("how", ["heard in passing", "received"])
def test_an_older_write_announced_late_does_not_move_the_step_back(how: str) -> None:
    # an announcement can come after a read of a later write (another connection)
    clock = Clock()
    rules = rules_after_a_read(10, clock, beat=5)
    clock.now += 20.0
    older = announced(5, beat=3)
    if how == "received":
        assert rules.on_announcement(older, b"") is None
    else:
        rules.take_in(older, at=clock.now)
    assert rules.last_step == 10
    assert rules.last_progress == rules.started  # the step did not move


def test_a_malformed_message_heard_still_proves_the_subscription_alive() -> None:
    rules = rules_after_a_read(10, Clock())
    rules.reads_without_message = 1
    rules.take_in(None, at=0.0)
    assert rules.reads_without_message == 0


def wants_new_subscription(rules: WaitRules) -> bool:
    return rules.resubscribe


def test_a_step_that_moves_without_announcements_asks_for_a_new_subscription() -> None:
    rules = rules_after_a_read(10, Clock(), beat=1)
    rules.on_snapshot(read(chief(20, beat=2)))
    assert not wants_new_subscription(rules)
    rules.on_snapshot(read(chief(30, beat=3)))
    assert wants_new_subscription(rules)
    rules.subscribed()
    assert not wants_new_subscription(rules) and rules.reads_without_message == 0


# -- stall and messages ----------------------------------------------------------------


def test_the_stall_timeout_runs_from_the_last_observed_write() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock, beat=1)
    assert rules.stall_at() == rules.started + STALL
    clock.now += 100.0
    rules.on_snapshot(read(chief(10, beat=1)))  # the same write again: no sign of life
    assert rules.stall_at() == rules.started + STALL
    rules.on_snapshot(read(chief(10, beat=2)))
    assert rules.stall_at() == clock.now + STALL
    clock.now += STALL
    assert rules.passed(clock.now) == "stall"


def test_a_timeout_before_any_observed_write_says_so() -> None:
    clock = Clock()
    rules = rules_after_a_read(60, clock, beat=9)
    clock.now += STALL
    error = rules.timed_out("stall")
    text = str(error)
    assert f"no write of this run's chief observed for {STALL:g} s" in text
    assert "no write of this run's chief observed since the wait began" in text
    assert "last step seen 60" in text and "no write of a live chief was seen" in text
    assert "never seen" not in text and "0.0 s old" not in text
    assert error.heartbeat_age is None and error.stalled


def test_a_timeout_after_an_observed_write_says_how_long_ago() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock, beat=1)
    clock.now += 10.0
    rules.on_snapshot(read(chief(20, beat=2)))
    clock.now += 12.5
    error = rules.timed_out("stall")
    text = str(error)
    assert "last write of this run's chief observed 12.5 s ago" in text
    assert "never seen" not in text and "0.0 s old" not in text
    assert error.heartbeat_age == pytest.approx(12.5)


def test_a_progress_line_says_what_was_observed(caplog: pytest.LogCaptureFixture) -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock)
    clock.now += 30.0
    with caplog.at_level(logging.INFO, logger="test.wait_rules"):
        rules.log_progress()
    assert "still waiting for step 50 after 30 s" in caplog.text
    assert "no write of this run's chief observed since the wait began" in caplog.text
    assert "never seen" not in caplog.text and "0.0 s old" not in caplog.text


def test_a_finished_state_written_on_probation_aborts_nobody() -> None:
    # a zombie's final write after Redis forgot the state: not this run's truth
    rules = make_rules(Clock(), "run-1")
    state = chief(20, run_id="run-1", done=True, vouch=False)
    assert rules.on_snapshot(read(state)) is None
    assert rules.on_announcement(announced(20, run_id="run-1", done=True, vouch=False), b"") is None


# -- the no-chief warning and an outside witness -----------------------------------------


def test_the_no_chief_warning_is_due_once_and_never_again_once_a_chief_was_seen() -> None:
    clock = Clock()
    rules = rules_after_a_read(10, clock)
    assert rules.on_announcement(announced(11), None) is None  # a write seen
    clock.now = rules.no_chief_at + 1.0
    rules.log_progress()
    # nothing is due before the next progress line: no busy loop of log_progress
    assert rules.next_progress == rules.progress_line_at > clock.now + 5.0
    assert "no-chief" not in rules.warned


def test_without_a_chief_the_warning_comes_once_then_only_progress_lines() -> None:
    clock = Clock()
    rules = make_rules(clock)
    assert rules.next_progress == rules.no_chief_at  # due before the first progress line
    clock.now = rules.no_chief_at
    rules.log_progress()
    assert "no-chief" in rules.warned
    assert rules.next_progress == rules.progress_line_at


@pytest.mark.parametrize("bad", [True, 2.0, float("nan"), "7", None])
def test_an_outside_witness_must_give_an_integer_step(bad: object) -> None:
    clock = Clock()
    config = BarrierConfig(job="rules")
    rules = WaitRules(config, 1, None, clock, logging.getLogger("t"), outside="the counter")
    with pytest.raises(TypeError, match="the counter must be an integer step"):
        rules.on_outside_step(bad)  # type: ignore[arg-type]


def test_an_outside_witness_releases_at_the_target_and_moving_counts_as_life() -> None:
    clock = Clock()
    config = BarrierConfig(job="rules", heartbeat=1.0, stall_timeout=STALL)
    log = logging.getLogger("t")
    rules = WaitRules(config, TARGET, None, clock, log, outside="the counter")
    assert rules.stall_at() == float("inf")  # no chief seen: no stall timeout
    assert rules.on_outside_step(3) is None
    clock.now += 100.0
    assert rules.on_outside_step(4) is None
    assert rules.last_alive == clock.now
    assert rules.on_outside_step(TARGET) == TARGET
    assert rules.released_by == "the counter"


# -- the grace, as a property on an injected clock ------------------------------------


@settings(deadline=None)
@given(
    st.lists(
        st.tuples(
            st.floats(min_value=0.0, max_value=2.0),  # seconds before this read
            st.booleans(),  # a newer chief's begin is on the state
            st.integers(min_value=1, max_value=2),  # which write (beat) is stored
        ),
        min_size=1,
        max_size=30,
    ),
    st.sampled_from([20, 60]),
)
def test_an_unobserved_final_fact_is_trusted_only_once_settled(
    reads: list[tuple[float, bool, int]], step: int
) -> None:
    """Never early (rule 2): a finished state the wait did not see written, without
    a run id, releases (or aborts) only when it has been read unchanged for GRACE
    since the first read of that very write, with no newer begin on it; and it
    always does once that holds (never lost)."""
    clock = Clock()
    rules = make_rules(clock)
    first_read_of: dict[int, float] = {}
    previous: int | None = None
    for gap, newer_begun, beat in reads:
        clock.now += gap
        if beat != previous and previous is not None:
            return  # a write seen happening between two reads: observed, not a grace case
        previous = beat
        first_read_of.setdefault(beat, clock.now)
        state = chief(step, beat=beat, done=True, fence=GENERATION + 1 if newer_begun else 0)
        settled = not newer_begun and clock.now - first_read_of[beat] >= GRACE
        if step >= TARGET:
            assert (rules.on_snapshot(read(state)) == step) == settled
        elif settled:
            with pytest.raises(BarrierAborted):
                rules.on_snapshot(read(state))
        else:
            assert rules.on_snapshot(read(state)) is None
        if settled:
            return
        if newer_begun:
            first_read_of.pop(beat)  # the grace starts again after a begin went away


# -- the chief's training loop, judged by the waiter's own stall timeout ---------------


def test_a_chief_whose_loop_went_quiet_stalls_the_wait_though_its_process_writes() -> None:
    # issue 33, case 3: the chief's heartbeat goes on (its own stall timeout is
    # long), its loop handed nothing over since; this wait's stall timeout judges
    # the loop by how long its writes say it has been quiet
    clock = Clock()
    config = BarrierConfig(job="rules", heartbeat=1.0, stall_timeout=8.0)
    rules = WaitRules(config, TARGET, None, clock, logging.getLogger("test.wait_rules"))
    assert rules.on_snapshot(read(chief(10, beat=1))) is None
    for beat in range(2, 20):
        clock.now += 1.0
        idle_ms = (beat - 2) * 1000  # the loop's last step was handed over at beat 2
        said = StepAnnouncement(10, GENERATION, False, False, None, beat, True, False, idle_ms)
        assert rules.on_announcement(said, b"") is None
    assert rules.stall_at() == pytest.approx(rules.loop_alive + 8.0)
    assert rules.passed(clock.now) == "stall"
    error = rules.timed_out("stall")
    assert "training loop has handed no step over for 8 s" in str(error)


def test_a_chief_in_a_pause_between_sessions_keeps_the_wait_alive() -> None:
    clock = Clock()
    config = BarrierConfig(job="rules", heartbeat=1.0, stall_timeout=8.0)
    rules = WaitRules(config, TARGET, None, clock, logging.getLogger("test.wait_rules"))
    assert rules.on_snapshot(read(chief(10, beat=1))) is None
    for beat in range(2, 40):
        clock.now += 1.0
        said = StepAnnouncement(10, GENERATION, False, False, None, beat, False, False, 0)
        assert rules.on_announcement(said, b"") is None
        assert rules.passed(clock.now) is None


def test_a_loop_quiet_since_before_the_wait_still_gets_the_waits_own_stall_timeout() -> None:
    # review: idle laid back before the wait began must not end it at once
    clock = Clock()
    config = BarrierConfig(job="rules", heartbeat=1.0, stall_timeout=5.0)
    rules = WaitRules(config, TARGET, None, clock, logging.getLogger("test.wait_rules"))
    assert rules.on_snapshot(read(chief(10, beat=1))) is None
    clock.now += 0.5
    said = StepAnnouncement(10, GENERATION, False, False, None, 2, True, False, 3_600_000)
    assert rules.on_announcement(said, b"") is None
    assert rules.stall_at() == pytest.approx(rules.started + 5.0)


def test_a_read_made_for_a_newer_generations_announcement_raises_the_waits_generation() -> None:
    # review: the asyncio path judges that announcement only through the read
    rules = rules_after_a_read(10, Clock())
    newer = announced(60, beat=1, generation=GENERATION + 1, vouch=False)
    zombie = chief(2000, beat=9, generation=GENERATION)  # Redis lost the newer state
    assert rules.on_snapshot(read(zombie), newer) is None
    assert rules.generation == GENERATION + 1
    assert rules.on_announcement(announced(2000, beat=10), b"") is None


def test_another_runs_begin_does_not_keep_a_finished_state_from_settling() -> None:
    # review: a refused chief of another run leaves only `begun`, no fence
    clock = Clock()
    rules = make_rules(clock)
    finished = ChiefState(60, GENERATION, True, NOW_MS, "chief", beat=1, vouch=True, fence=0)
    assert rules.on_snapshot(read(finished)) is None
    clock.now += GRACE
    assert rules.on_snapshot(read(finished)) == 60
