"""The one loop of every wait (stepbarrier._worker.timing): what a driver does next."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._worker.timing import (
    READ,
    READ_SOURCE,
    RESUBSCRIBE,
    LastChance,
    Receive,
    WaitTiming,
)
from stepbarrier._worker.wait_state import WaitRules
from stepbarrier.errors import BarrierTimeout


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def timing(clock: Clock, timeout: float | None = 60.0, stall: float = 20.0) -> WaitTiming:
    return WaitTiming(clock, timeout, stall_timeout=stall, fallback_interval=1.0)


def test_a_new_wait_reads_first_then_listens_at_most_one_interval() -> None:
    clock = Clock()
    t = timing(clock)
    assert t.next_action(clock.now) is READ
    t.read_done()
    action = t.next_action(clock.now)
    assert isinstance(action, Receive) and action.timeout == pytest.approx(1.0)
    clock.now += 0.75
    action = t.next_action(clock.now)
    assert isinstance(action, Receive) and action.timeout == pytest.approx(0.25)


def test_a_passed_limit_comes_before_a_due_read() -> None:
    """Reads slower than their interval must not keep a wait from its limits."""
    clock = Clock()
    t = timing(clock, timeout=5.0)
    clock.now += 5.0
    assert t.next_action(clock.now) == LastChance("deadline")
    with pytest.raises(BarrierTimeout) as info:
        t.after_last_chance("deadline", None)
    assert info.value.limit == "deadline"


def test_life_seen_by_the_last_chance_read_lifts_the_stall() -> None:
    clock = Clock()
    t = timing(clock, timeout=None, stall=3.0)
    t.read_done()
    clock.now += 3.0
    assert t.next_action(clock.now) == LastChance("stall")
    t.last_alive = clock.now  # the last read saw the writer alive
    t.after_last_chance("stall", None)  # no timeout
    t.read_done()
    assert isinstance(t.next_action(clock.now), Receive)


def test_resubscribe_is_asked_once_per_verdict() -> None:
    clock = Clock()
    t = timing(clock)
    t.read_done()
    t.resubscribe = True
    assert t.next_action(clock.now) is RESUBSCRIBE
    assert isinstance(t.next_action(clock.now), Receive)


def test_receive_never_listens_past_the_deadline_and_never_for_zero() -> None:
    clock = Clock()
    t = timing(clock, timeout=0.5)
    t.read_done()
    action = t.next_action(clock.now)
    assert isinstance(action, Receive) and action.timeout == pytest.approx(0.5)
    clock.now += 0.4999999
    action = t.next_action(clock.now)
    assert isinstance(action, Receive) and action.timeout == 0.001


def test_the_progress_line_is_said_when_due_and_scheduled_again() -> None:
    said: list[float] = []

    class Said(WaitTiming):
        def log_progress(self) -> None:
            super().log_progress()
            said.append(self.clock())

    clock = Clock()
    t = Said(clock, None, stall_timeout=1e9, fallback_interval=1e9)
    t.read_done()
    clock.now += 30.0
    assert isinstance(t.next_action(clock.now), Receive)
    assert said == [clock.now] and t.next_progress == clock.now + 30.0
    assert isinstance(t.next_action(clock.now), Receive)
    assert len(said) == 1  # not again before it is due


def test_a_step_wait_reads_its_outside_witness_first_and_on_its_intervals() -> None:
    clock = Clock()
    rules = WaitRules(
        BarrierConfig(job="timing"),
        10,
        None,
        clock,
        logging.getLogger("test.timing"),
        outside="the counter",
        outside_every=(0.5, 5.0),
    )
    assert rules.next_action(clock.now) is READ_SOURCE  # before Redis is touched
    assert rules.on_outside_step(1) is None
    assert rules.source_at == clock.now + 0.5
    assert rules.next_action(clock.now) is READ
    rules.read_done()
    action = rules.next_action(clock.now)
    assert isinstance(action, Receive) and action.timeout == pytest.approx(0.5)


def witness_rules(clock: Clock, *, timeout: float | None = None) -> WaitRules:
    return WaitRules(
        BarrierConfig(job="timing", stall_timeout=5.0),
        10,
        timeout,
        clock,
        logging.getLogger("test.timing"),
        outside="the counter",
        outside_every=(0.5, 5.0),
    )


def test_a_limit_that_passes_as_the_witness_is_due_reads_the_witness_first() -> None:
    """The stall limit and the witness's read fall on the same instant (a stall
    timeout equal to its interval): the witness's read comes first, and a step
    that moved is life, not a timeout."""
    clock = Clock()
    rules = witness_rules(clock)
    assert rules.next_action(clock.now) is READ_SOURCE
    assert rules.on_outside_step(1) is None
    assert rules.next_action(clock.now) is READ
    rules.read_done()
    rules.chief_seen = True  # the read saw a write of the chief: the witness at 5 s
    assert isinstance(rules.next_action(clock.now), Receive)
    clock.now += 0.5
    assert rules.next_action(clock.now) is READ_SOURCE
    assert rules.on_outside_step(2) is None  # moved: life now, next read in 5 s
    assert rules.source_at == rules.stall_at() == clock.now + 5.0
    rules.read_done()
    assert isinstance(rules.next_action(clock.now), Receive)
    clock.now += 5.0  # the chief said nothing since; the witness is due
    assert rules.next_action(clock.now) is READ_SOURCE
    assert rules.on_outside_step(3) is None  # it moved again
    assert rules.passed(clock.now) is None


def test_a_deadline_on_the_witness_schedule_still_takes_its_release() -> None:
    clock = Clock()
    rules = witness_rules(clock, timeout=3.0)
    rules.source_at = clock.now + 3.0  # its next read falls on the deadline
    rules.read_at = clock.now + 10.0
    clock.now += 3.0
    assert rules.next_action(clock.now) is READ_SOURCE
    assert rules.on_outside_step(10) == 10  # released by the witness, not timed out
    # and the limit is not delayed further: the pass took the witness's read
    assert rules.next_action(clock.now) == LastChance("deadline")


def test_while_redis_is_lost_the_witness_is_read_at_its_own_pace() -> None:
    clock = Clock()
    rules = witness_rules(clock)
    rules.chief_seen = True
    assert rules.on_outside_step(1) is None
    assert rules.source_at == clock.now + 5.0  # Redis wakes the wait: the safety net
    rules.redis_lost = True
    assert rules.on_outside_step(1) is None
    assert rules.source_at == clock.now + 0.5  # the only witness left


def test_reads_slower_than_their_interval_still_leave_a_turn_to_listen_and_to_log() -> None:
    """A pass takes each due read once, then listens: a read always due again (its
    interval shorter than the read) neither starves the messages nor the progress
    lines (nor, above, the limits)."""
    said: list[float] = []

    class Said(WaitTiming):
        def log_progress(self) -> None:
            super().log_progress()
            said.append(self.clock())

    clock = Clock()
    t = Said(clock, None, stall_timeout=1e9, fallback_interval=1e-6)
    t.source_at = clock.now
    actions = []
    for _ in range(6):
        action = t.next_action(clock.now)
        actions.append(type(action).__name__)
        clock.now += 10.0  # every action takes longer than any interval
        if action is READ:
            t.read_done()
        elif action is READ_SOURCE:
            t.source_at = clock.now + 1e-6
    assert actions == ["ReadSource", "Read", "Receive"] * 2
    assert said  # 60 s passed: the progress lines were said


def test_a_step_source_refuses_an_interval_that_is_not_positive() -> None:
    from stepbarrier._worker.waiter import StepSource

    for bad in (0, -1.0, float("nan"), True, "1"):
        with pytest.raises(ValueError, match=r"StepSource\.interval must be a positive"):
            StepSource(read=lambda: 0, name="n", interval=bad)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="interval_with_chief"):
        StepSource(read=lambda: 0, name="n", interval_with_chief=0.0)
    with pytest.raises(TypeError, match="read must be callable"):
        StepSource(read=3, name="n")  # type: ignore[arg-type]


@settings(deadline=None)  # a pure loop of up to ~10,000 actions: no I/O, but loaded CI cores
@given(
    st.lists(st.floats(min_value=0.0, max_value=7.0), min_size=1, max_size=50),
    st.floats(min_value=0.1, max_value=30.0),
)
def test_a_wait_without_news_ends_at_its_deadline_whatever_its_actions_cost(
    costs: list[float], timeout: float
) -> None:
    """Never hung: however long each read takes (cycled from ``costs``), a wait
    that hears nothing gives up, no later than three reads past its deadline."""
    clock = Clock()
    t = timing(clock, timeout=timeout, stall=1e9)
    t.source_at = clock.now  # an outside witness read every 10 ms
    deadline = clock.now + timeout
    for turn in range(100_000):
        action = t.next_action(clock.now)
        cost = costs[turn % len(costs)]
        if isinstance(action, LastChance):
            clock.now += cost  # the last read
            with pytest.raises(BarrierTimeout):
                t.after_last_chance(action.limit, None)
            assert clock.now <= deadline + 3 * max(costs) + 0.002
            return
        if action is READ:
            clock.now += cost
            t.read_done()
        elif action is READ_SOURCE:
            clock.now += cost
            t.source_at = clock.now + 0.01
        else:
            assert isinstance(action, Receive)
            assert 0.001 <= action.timeout <= 1.0
            clock.now += action.timeout  # nothing came
    pytest.fail("the wait never reached its deadline")
