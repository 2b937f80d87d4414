"""The protocol model (tests/model/protocol_model.py) checked exhaustively at small scope.

- With every fix on, no reachable state of any scope breaks an invariant: never
  early, aborted only for real, runs kept apart, never lost (bounded liveness).
- Reverting any one fix makes the exploration find a counterexample: the fix is
  needed, and the model is sharp enough to see what it rules out (issue 21).
- Each limit of docs/protocol.md#limits is real: lifting it, the model finds the
  promise broken there.
- A few runs of chosen events show single rules at work: the fence a begin
  sets (docs/protocol.md#generations), also on an empty job, and where it does
  not reach; a remade state's beat above the lost one's.

The counterexamples are printed (``pytest -s`` shows them) as numbered events.
"""

from __future__ import annotations

from concurrent.futures import ProcessPoolExecutor
from functools import cache

import pytest

from tests.model.protocol_model import (
    BEAT,
    BEGIN,
    BEGIN_PAUSED,
    FINAL,
    FIXES,
    LIMITS,
    LIVENESS,
    LIVENESS_SHARP,
    SCOPES,
    ZOMBIE,
    Fix,
    Flags,
    Limit,
    Model,
    Result,
    Scope,
    Violation,
    WaiterSpec,
    World,
    explore,
)

MIN_STATES = 10_000
"""Each scope explores at least this many states (so a pass means something)."""


def _explore_all_on(scope: Scope) -> Result:
    return explore(Flags(), scope)


@cache
def all_on() -> dict[Scope, Result]:
    """Every scope explored with every fix on, two at a time (the later, larger ones first)."""
    order = SCOPES[::-1]
    with ProcessPoolExecutor(max_workers=2) as pool:
        results = dict(zip(order, pool.map(_explore_all_on, order), strict=True))
    return {scope: results[scope] for scope in SCOPES}


def test_every_fix_on_no_state_of_any_scope_breaks_an_invariant() -> None:
    results = all_on()
    print()
    for scope, result in results.items():
        print(
            f"{scope.name:20} {result.states:7} states, {scope.max_ticks} ticks, "
            f"longest owed an end: {result.worst_owed} ticks (bound {scope.bound})"
        )
    print(f"{'all':20} {sum(r.states for r in results.values()):7} states")
    found = [r.violation.report() for r in results.values() if r.violation is not None]
    assert found == []
    assert [s.name for s, r in results.items() if r.states < MIN_STATES] == []
    assert [s.name for s, r in results.items() if r.stuck] == []
    assert all(r.worst_owed <= s.bound for s, r in results.items())


@pytest.mark.parametrize("fix", FIXES, ids=[fix.flag for fix in FIXES])
def test_reverting_a_fix_finds_its_counterexample(fix: Fix) -> None:
    result = explore(Flags()._replace(**{fix.flag: False}), fix.scope)
    assert result.violation is not None, f"{fix.flag} off: no counterexample in {fix.scope.name}"
    defect = f"defect {fix.defect}" if fix.defect else "not in the review's list"
    print(f"\n{fix.flag} off ({defect}: {fix.what}):\n{result.violation.report()}")
    assert result.violation.invariant == fix.invariant
    trace = result.violation.trace
    assert trace and all(isinstance(event, str) and event for event in trace)
    # and with the fix on, that scope is clean
    assert all_on()[fix.scope].violation is None


def test_every_flag_is_a_fix_with_a_counterexample_and_the_defects_are_covered() -> None:
    assert sorted(fix.flag for fix in FIXES) == sorted(Flags._fields)
    assert all(getattr(Flags(), flag) is True for flag in Flags._fields)
    assert {fix.defect for fix in FIXES} - {None} == {1, 2, 4, 5, 6, 10, 11, 12}


@pytest.mark.parametrize("limit", LIMITS, ids=[limit.name for limit in LIMITS])
def test_a_limit_lifted_breaks_a_promise(limit: Limit) -> None:
    result = explore(Flags(), limit.scope)
    assert result.violation is not None, f"{limit.name}: the model finds no counterexample"
    print(f"\nlimit {limit.name} ({limit.what}):\n{result.violation.report()}")
    assert result.violation.invariant == limit.invariant


def test_the_liveness_bound_is_met_exactly_and_checked() -> None:
    # the bound is heartbeat + FENCE + fallback = 1 + 2 + 2 ticks; the worst wait of a
    # waiter owed an end is within it in LIVENESS (one lost announcement costs only a
    # heartbeat: the next write's announcement releases), and just that when two are
    # lost in a row (the fallback read releases): one tick less is broken
    assert LIVENESS.bound == LIVENESS.heartbeat + LIVENESS.fence + LIVENESS.fallback
    assert all_on()[LIVENESS].worst_owed <= LIVENESS.bound
    scope = LIVENESS_SHARP
    sharp = explore(Flags(), scope)
    print(f"\n{scope.name}: {sharp.states} states, longest owed an end: {sharp.worst_owed} ticks")
    assert sharp.violation is None and sharp.worst_owed == scope.bound
    result = explore(Flags(), scope._replace(bound=scope.bound - 1))
    assert result.violation is not None and result.violation.invariant == "never lost"


def test_a_probation_no_longer_than_a_heartbeat_lets_a_zombie_release() -> None:
    # FENCE must exceed the heartbeat: a live newer chief writes within one, and
    # that write must come before the zombie's probation ends
    result = explore(Flags(), ZOMBIE._replace(fence=ZOMBIE.heartbeat))
    assert result.violation is not None and result.violation.invariant == "never early"
    print(f"\nFENCE = heartbeat:\n{result.violation.report()}")


def test_the_counterexample_is_a_shortest_readable_trace() -> None:
    result = explore(Flags(probation=False), ZOMBIE)
    assert result.violation is not None
    trace = result.violation.trace
    assert "Redis loses the state" in " ".join(trace)
    assert trace[-1].endswith("RELEASED at step 2")
    assert result.violation.report().splitlines()[1].startswith("   1. A1 begins generation 1")


def test_without_the_fence_a_generation_still_writes_between_a_begin_and_its_first_write() -> None:
    # the counterexample begin_fences rules out: A2 has begun (the newest generation,
    # at step 1) but not written yet, and A1's write of step 2 is accepted and releases
    result = explore(Flags(begin_fences=False), BEGIN)
    assert result.violation is not None and result.violation.invariant == "never early"
    trace = result.violation.trace
    begun = next(n for n, event in enumerate(trace) if event.startswith("A2 begins"))
    assert not any(event.startswith("A2 writes") for event in trace)
    assert any(event.startswith("A1 writes") and "accepted" in event for event in trace[begun:])
    assert trace[-1].endswith("RELEASED at step 2")


def test_without_the_empty_job_fence_a_chief_paused_before_its_first_write_releases() -> None:
    # the counterexample begin_fences_empty_job rules out: A1 began on no state and paused;
    # A2 began on no state too (nothing to fence); A1's first write, within FENCE of its
    # begin, needs no probation, vouches and releases
    result = explore(Flags(begin_fences_empty_job=False), BEGIN_PAUSED)
    assert result.violation is not None and result.violation.invariant == "never early"
    trace = result.violation.trace
    assert trace[0].endswith("A1 pauses before its first write")
    begun = next(n for n, event in enumerate(trace) if event.startswith("A2 begins"))
    written = next(n for n, event in enumerate(trace) if event.startswith("A1 writes"))
    assert begun < written and "no probation" in trace[written]
    assert trace[-1].endswith("RELEASED at step 2")


def test_without_the_beat_from_the_clock_reads_release_late_after_redis_forgot() -> None:
    # the counterexample beat_from_clock rules out: the remade state's beat starts at 1
    # again, below the wait's live_mark, and its announcements are lost
    result = explore(Flags(beat_from_clock=False), BEAT)
    assert result.violation is not None and result.violation.invariant == "never lost"
    trace = result.violation.trace
    lost = next(n for n, event in enumerate(trace) if event.startswith("Redis loses the state"))
    assert any("beat 1," in event for event in trace[lost:])
    assert all_on()[BEAT].worst_owed <= BEAT.bound


def test_without_the_vouch_a_zombie_final_write_on_probation_aborts() -> None:
    # the counterexample abort_needs_vouch rules out: A1's final write recreates the state
    # Redis lost (A2's), done on probation, and aborts W1 (target 3) though A2 is live
    result = explore(Flags(abort_needs_vouch=False), FINAL)
    assert result.violation is not None and result.violation.invariant == "aborted only for real"
    trace = result.violation.trace
    final = next(n for n, event in enumerate(trace) if "as final (done)" in event)
    assert "vouch=0, done=1" in trace[final] and "on probation" in trace[final]
    assert trace[-1].endswith("ABORTED (done)")


def walk(scope: Scope, *events: str) -> tuple[Model, World, list[str], Violation | None]:
    """Follow, from the initial state, the first event that starts with each of ``events``."""
    model = Model(Flags(), scope)
    world = model.initial()
    labels: list[str] = []
    found = None
    for prefix in events:
        options = [out for out in model.successors(world) if out[0].startswith(prefix)]
        assert options, f"no event {prefix!r} after {labels}"
        label, world, violation = options[0]
        labels.append(label)
        found = found or violation
    return model, world, labels, found


def next_events(model: Model, world: World) -> list[str]:
    return [label for label, _, _ in model.successors(world)]


def test_a_begin_fences_the_older_chief_and_contributor_of_its_run_before_its_first_write() -> None:
    scope = BEGIN._replace(name="fence", contributor="A")
    model, begun, labels, found = walk(
        scope,
        "A1 begins generation 1",
        "A1 writes step 2",
        "the contributor joins",
        "tick 1",
        "A2 begins generation 2",
    )
    assert found is None and "(fences generation 1)" in labels[-1]
    assert begun.stored is not None and (begun.stored.gen, begun.stored.fence) == (1, 2)
    events = next_events(model, begun)
    assert "A1 writes step 2: SUPERSEDED by the fence of generation 2" in events
    assert any(e.startswith("the contributor finds the fence of generation 2") for e in events)
    # a contributor that has not joined yet waits for the new generation's first write
    model, begun, _, _ = walk(
        scope, "A1 begins generation 1", "A1 writes step 2", "tick 1", "A2 begins generation 2"
    )
    assert not any(e.startswith("the contributor") for e in next_events(model, begun))
    model, written, _, _ = walk(
        scope,
        "A1 begins generation 1",
        "A1 writes step 2",
        "tick 1",
        "A2 begins generation 2",
        "A2 writes step 1",
    )
    assert written.stored is not None and written.stored.fence == 0  # replaced: fence gone
    assert "the contributor joins generation 2 at step 1" in next_events(model, written)


def test_the_fence_does_not_cover_a_paused_first_write_after_redis_forgot() -> None:
    # docs/protocol.md#limits: A1 began (on no state) and paused, shorter than FENCE;
    # A2 began and wrote; Redis lost the state, A2's with it. A1's first write finds
    # no state, needs no probation (its generation's first, within FENCE of its begin),
    # vouches at once and releases W1, who never saw generation 2
    scope = BEGIN._replace(name="paused-begin", pause_after_begin=True, fence=3, bound=6)
    _, _, labels, found = walk(
        scope,
        "A1 begins generation 1 at step 2 (no state: leaves the fence of generation 1); A1 pauses",
        "tick 1",
        "A2 begins generation 2",
        "A2 writes step 1",
        "Redis loses the state",
        "tick 2",
        "A1 resumes",
        "W1 (target 2) starts waiting",
        "W1 reads no state",
        "A1 writes step 2",
    )
    assert "its generation's first write: no probation" in labels[-1]
    assert labels[-1].endswith("RELEASED at step 2")
    assert found is not None and found.invariant == "never early"


def test_a_begin_on_no_state_leaves_its_fence_which_reads_as_no_state() -> None:
    # docs/protocol.md#generations: A1 began on no state and paused; A2's begin finds the
    # fence-only hash (no state), raises the fence, and A1's first write is SUPERSEDED
    model, begun, _, found = walk(
        BEGIN_PAUSED,
        "A1 begins generation 1 at step 2 (no state: leaves the fence of generation 1); A1 pauses",
        "tick 1",
        "A1 resumes",
        "W1 (target 2) starts waiting",
        "A2 begins generation 2 at step 1 (no state: leaves the fence of generation 2)",
        "W1 reads no state (a hash with only the fence of generation 2)",
    )
    assert found is None and begun.stored is None and begun.fenced == 2
    events = next_events(model, begun)
    assert "A1 writes step 2: SUPERSEDED by the fence of generation 2" in events
    _, written, _, _ = walk(
        BEGIN_PAUSED,
        "A1 begins generation 1 at step 2 (no state: leaves the fence of generation 1); A1 pauses",
        "tick 1",
        "A2 begins generation 2",
        "A2 writes step 1",
    )
    assert written.fenced == 0 and written.stored is not None and written.stored.gen == 2


def test_a_state_remade_after_redis_forgot_beats_above_the_lost_one() -> None:
    # docs/protocol.md#keys: the remade state's beat starts from the Redis clock, above
    # every beat the waiter saw, so that its next read of it is an observation even when
    # the announcement is lost (W1 waits for step 3, which never comes)
    scope = BEAT._replace(name="remade", waiters=(WaiterSpec("W1", "B", 3),))
    model, forgot, _, found = walk(
        scope,
        "B1 begins generation 1",
        "tick 1",
        "W1 (target 3) starts waiting",
        "W1 reads step 2",
        "B1 writes step 2",
        "Redis loses the state",
        "tick 2",
    )
    waiter = forgot.waiters[0]
    assert found is None and forgot.stored is None and waiter.live_mark == (1, 2)
    remade = [
        world
        for label, world, _ in model.successors(forgot)
        if label.startswith("B1 writes step 2") and label.endswith("to W1 is lost")
    ]
    assert remade and remade[0].stored is not None
    beat = remade[0].stored.beat
    assert beat == 3 and waiter.prev_read is not None and (1, beat) > waiter.live_mark
    # with the beat starting again at 1, the same read is below what the wait saw
    model = Model(Flags(beat_from_clock=False), scope)
    again = [
        world
        for label, world, _ in model.successors(forgot)
        if label.startswith("B1 writes step 2") and label.endswith("to W1 is lost")
    ]
    assert again and again[0].stored is not None and again[0].stored.beat == 1
