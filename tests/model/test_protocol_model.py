"""The protocol model (tests/model/protocol_model.py) checked exhaustively at small scope.

- With every fix on, no reachable state of any scope breaks an invariant: never
  early, aborted only for real, runs kept apart, never lost (bounded liveness).
- Reverting any one fix makes the exploration find a counterexample: the fix is
  needed, and the model is sharp enough to see what it rules out (issues 21, 32).
- Each limit of docs/protocol.md#limits is real: lifting it, the model finds the
  promise broken there.
- A few runs of chosen events show single rules at work: the fence and ``begun`` a begin
  records (docs/protocol.md#generations), probation stored in Redis and learnt from
  replies, the numbering of generations, the grace.

Every exploration runs once, two at a time in separate processes (``results``); the
counterexamples are printed (``pytest -s`` shows them) as numbered events. The large
scopes are not explored here: ``make model`` (``python -m tests.model.explore --large``).
"""

from __future__ import annotations

from functools import cache

import pytest

from tests.model.explore import Job, _run, jobs, main
from tests.model.protocol_model import (
    BEAT,
    BEGIN,
    BEGIN_PAUSED,
    CLOCK,
    FENCE_HEARTBEAT,
    FINAL,
    FIXES,
    LARGE_SCOPES,
    LATE,
    LIMITS,
    LIVENESS,
    LIVENESS_SHARP,
    LOST_REPLY,
    NUMBERS,
    RERUN,
    RUNS_SPLIT,
    SCOPES,
    TWO_ZOMBIES,
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

MIN_STATES = 1_000
"""Each scope explores at least this many states (so a pass means something)."""


@cache
def results() -> dict[tuple[str, str], Result]:
    """Every bounded exploration (the scopes with every fix on, each fix off, each limit
    lifted), two at a time, the larger ones first; by (kind, name)."""
    from concurrent.futures import ProcessPoolExecutor

    todo: list[Job] = jobs(large=False, fixes=True, limits=True)
    tight = LIVENESS_SHARP._replace(name="liveness-sharp-tight", bound=LIVENESS_SHARP.bound - 1)
    todo += [
        ("extra", LIVENESS_SHARP.name, Flags(), LIVENESS_SHARP, None),
        ("extra", tight.name, Flags(), tight, "never lost"),
    ]
    # the larger explorations first (every fix on; the rest stop at a counterexample)
    todo.sort(key=lambda job: (job[0] == "fix off" or job[0] == "limit", -job[3].max_ticks))
    with ProcessPoolExecutor(max_workers=2) as pool:
        done = list(pool.map(_run, todo))
    return {(kind, what): result for (kind, what, *_), (result, _) in zip(todo, done, strict=True)}


def all_on(scope: Scope) -> Result:
    return results()[("scope", scope.name)]


def test_every_fix_on_no_state_of_any_scope_breaks_an_invariant() -> None:
    print()
    for scope in SCOPES:
        result = all_on(scope)
        print(
            f"{scope.name:20} {result.states:7} states, {scope.max_ticks} ticks, "
            f"longest owed an end: {result.worst_owed} ticks (bound {scope.bound})"
        )
    print(f"{'all':20} {sum(all_on(s).states for s in SCOPES):7} states")
    found = [v.report() for s in SCOPES if (v := all_on(s).violation) is not None]
    assert found == []
    assert [s.name for s in SCOPES if all_on(s).states < MIN_STATES] == []
    assert [s.name for s in SCOPES if all_on(s).stuck] == []
    assert all(all_on(s).worst_owed <= s.bound for s in SCOPES)
    assert len({s.name for s in (*SCOPES, *LARGE_SCOPES)}) == len(SCOPES) + len(LARGE_SCOPES)


@pytest.mark.parametrize("fix", FIXES, ids=[fix.flag for fix in FIXES])
def test_reverting_a_fix_finds_its_counterexample(fix: Fix) -> None:
    result = results()[("fix off", fix.flag)]
    assert result.violation is not None, f"{fix.flag} off: no counterexample in {fix.scope.name}"
    origin = (
        f"defect {fix.defect}"
        if fix.defect
        else f"issue 32, case {fix.case}"
        if fix.case
        else "not in the review's list"
    )
    print(f"\n{fix.flag} off ({origin}: {fix.what}):\n{result.violation.report()}")
    assert result.violation.invariant == fix.invariant
    trace = result.violation.trace
    assert trace and all(isinstance(event, str) and event for event in trace)
    # and with the fix on, that scope is clean
    assert fix.scope in SCOPES and all_on(fix.scope).violation is None


def test_every_flag_is_a_fix_with_a_counterexample_and_the_defects_are_covered() -> None:
    assert sorted(fix.flag for fix in FIXES) == sorted(Flags._fields)
    assert all(getattr(Flags(), flag) is True for flag in Flags._fields)
    assert {fix.defect for fix in FIXES} - {None} == {1, 2, 4, 5, 6, 10, 11, 12}
    assert {fix.case for fix in FIXES} - {None} == {4, 5, 6, 7, 8}


@pytest.mark.parametrize("limit", LIMITS, ids=[limit.name for limit in LIMITS])
def test_a_limit_lifted_breaks_a_promise(limit: Limit) -> None:
    result = results()[("limit", limit.name)]
    assert result.violation is not None, f"{limit.name}: the model finds no counterexample"
    print(f"\nlimit {limit.name} ({limit.what}):\n{result.violation.report()}")
    assert result.violation.invariant == limit.invariant


def test_the_liveness_bound_is_met_exactly_and_checked() -> None:
    # the bound is heartbeat + FENCE + fallback = 1 + 2 + 2 ticks; the worst wait of a
    # waiter owed an end is within it in LIVENESS (one lost announcement costs only a
    # heartbeat: the next write's announcement releases), and just that when two are
    # lost in a row (the fallback read releases): one tick less is broken
    assert LIVENESS.bound == LIVENESS.heartbeat + LIVENESS.fence + LIVENESS.fallback
    assert all_on(LIVENESS).worst_owed <= LIVENESS.bound
    scope = LIVENESS_SHARP
    sharp = results()[("extra", scope.name)]
    print(f"\n{scope.name}: {sharp.states} states, longest owed an end: {sharp.worst_owed} ticks")
    assert sharp.violation is None and sharp.worst_owed == scope.bound
    result = results()[("extra", "liveness-sharp-tight")]
    assert result.violation is not None and result.violation.invariant == "never lost"


def test_a_probation_no_longer_than_a_heartbeat_lets_a_zombie_release() -> None:
    # FENCE must exceed the heartbeat: a live newer chief writes within one, and that write
    # must come before the zombie's probation ends. v3 refuses a heartbeat that does not
    # (above FENCE / 3 in the library; FENCE or more in the model): no chief starts
    scope = ZOMBIE._replace(name="fence-is-heartbeat", fence=ZOMBIE.heartbeat)
    _, world, labels, _ = walk(scope, "A1")
    assert labels == ["A1 refuses to start: its heartbeat is above FENCE / 3"]
    assert world.chiefs[0].status == "refused"
    # FENCE counted from each process's own heartbeat (v2): the zombie's probation ends
    # before the newest chief, with a longer heartbeat, writes again
    result = results()[("fix off", "fence_job_wide")]
    assert result.violation is not None and result.violation.invariant == "never early"
    print(f"\nFENCE of the zombie's heartbeat:\n{result.violation.report()}")


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


def test_without_the_empty_job_fence_another_run_takes_a_live_chief_over() -> None:
    # begin_fences_empty_job off: a begin on no state records nothing (no fence, no begun),
    # so the job's first write has no begin on record (on probation) and another run's
    # chief, beginning on no state, is not refused by a fence
    result = results()[("fix off", "begin_fences_empty_job")]
    assert result.violation is not None and result.violation.invariant == "runs kept apart"
    assert not any("leaves the fence" in event for event in result.violation.trace)
    assert all_on(RUNS_SPLIT).violation is None


def test_the_v2_limit_of_a_paused_first_write_after_redis_forgot_is_gone() -> None:
    # v2's limit paused-first-write-after-redis-forgot: A1 began (on no state) and paused,
    # shorter than FENCE; A2 began and wrote; Redis lost the state, A2's fence with it.
    # In v3 A1's first write finds no begun of its own: on probation, it releases nobody
    scope = BEGIN._replace(name="paused-begin", pause_after_begin=True, fence=3, bound=6)
    path = (
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
    _, world, labels, found = walk(scope, *path)
    assert found is None and "created it on probation" in labels[-1]
    assert (
        world.stored is not None
        and not world.stored.vouch
        and world.waiters[0].phase != ("released")
    )
    # v2's rule (probation only for a write that finds no state and is not its generation's
    # first within FENCE of its begin): the same events release W1 early
    _, _, labels, found = walk(scope, *path, flags=Flags(probation_unless_begun=False))
    assert "its generation's first write: no probation" in labels[-1]
    assert labels[-1].endswith("RELEASED at step 2")
    assert found is not None and found.invariant == "never early"
    assert all_on(BEGIN_PAUSED).violation is None and BEGIN_PAUSED.lose_state


def test_without_the_beat_from_the_clock_reads_release_late_after_redis_forgot() -> None:
    # the counterexample beat_from_clock rules out: the remade state's beat starts at 1
    # again, below the wait's live_mark, and its announcements are lost
    result = results()[("fix off", "beat_from_clock")]
    assert result.violation is not None and result.violation.invariant == "never lost"
    trace = result.violation.trace
    lost = next(n for n, event in enumerate(trace) if event.startswith("Redis loses the state"))
    assert any("beat 1," in event for event in trace[lost:])
    assert all_on(BEAT).worst_owed <= BEAT.bound


def test_without_the_vouch_a_zombie_final_write_on_probation_aborts() -> None:
    # the counterexample abort_needs_vouch rules out: A1's final write recreates the state
    # Redis lost (A2's), done on probation, and aborts W1 (target 3) though A2 is live
    result = results()[("fix off", "abort_needs_vouch")]
    assert result.violation is not None and result.violation.invariant == "aborted only for real"
    trace = result.violation.trace
    final = next(n for n, event in enumerate(trace) if "as final (done)" in event)
    assert "vouch=0, done=1" in trace[final] and "on probation" in trace[final]
    assert trace[-1].endswith("ABORTED (done)")
    assert all_on(FINAL).violation is None


def test_two_zombies_after_redis_forgot_need_the_begun_rule() -> None:
    # issue 32, case 5: zombie 1 (A1) recreates the state on probation; zombie 2 (A2, a
    # higher generation) replaces it; v2 put no probation on a write replacing a lower
    # generation, so A2's step 2 vouches while A3, the newest, is at step 1
    result = results()[("fix off", "probation_unless_begun")]
    assert result.violation is not None and result.violation.invariant == "never early"
    trace = result.violation.trace
    first = next(n for n, e in enumerate(trace) if e.startswith("A1 writes") and "probation" in e)
    second = next(n for n, e in enumerate(trace) if e.startswith("A2 writes") and n > first)
    assert "replaces generation 1" in trace[second] and "vouch=1" in trace[second]
    assert any(event.startswith("A3 begins") for event in trace[:first])
    assert trace[-1].endswith("RELEASED at step 2")
    assert all_on(TWO_ZOMBIES).violation is None


def test_a_lost_reply_does_not_skip_probation() -> None:
    # issue 32, case 4: in v2 only the creating call stored vouch=0 and said created=1;
    # its reply lost, the zombie's retry vouched
    result = results()[("fix off", "probation_in_redis")]
    assert result.violation is not None and result.violation.invariant == "never early"
    trace = result.violation.trace
    lost = next(n for n, event in enumerate(trace) if "its reply to A1 is lost" in event)
    assert "on probation" in trace[lost]
    assert any(e.startswith("A1 writes") and "vouch=1" in e for e in trace[lost + 1 :])
    # v3: the retry's reply shows the stored probation, and the chief counts FENCE from it
    model, world, labels, found = walk(
        LOST_REPLY,
        "A1 begins generation 1",
        "tick 1",
        "A1 pauses",
        "A2 begins generation 2",
        "Redis loses the state",
        "tick 2",
        "A1 resumes",
    )
    lost_reply = [
        (label, after)
        for label, after, _ in model.successors(world)
        if label.startswith("A1 writes step 2") and label.endswith("its reply to A1 is lost")
    ]
    assert lost_reply, labels
    _label, after = lost_reply[0]
    stored, chief = after.stored, after.chiefs[0]
    assert stored is not None and stored.probation and not stored.vouch
    assert chief.serving == 0 and chief.probation == 0  # it learnt nothing
    retry = [a for lbl, a, _ in model.successors(after) if lbl.startswith("A1 writes step 2")]
    assert retry
    again = retry[0]
    assert again.stored is not None and again.stored.probation == stored.probation
    assert not again.stored.vouch  # its vouch=1 is stored as 0 while on probation
    assert again.chiefs[0].serving == stored.probation
    assert again.chiefs[0].probation == LOST_REPLY.fence  # FENCE from this reply
    assert found is None and all_on(LOST_REPLY).violation is None


def test_a_probation_is_cleared_only_by_the_write_that_served_it() -> None:
    # the live chief recreates the state Redis lost: on probation (no begin of its own on
    # record); FENCE ticks after the reply that showed it, its write carries served=<id>,
    # which clears it, and vouches
    model, world, labels, _ = walk(
        BEAT,
        "B1 begins generation 1",
        "tick 1",
        "B1 writes step 2",
        "Redis loses the state",
        "tick 2",
        "B1 writes step 2",
        "tick 3",
        "B1 writes step 2",
        "tick 4",
    )
    assert "created it on probation" in labels[5]
    chief = world.chiefs[0]
    assert world.stored is not None and world.stored.probation == chief.serving != 0
    assert not world.stored.vouch and chief.probation == 0
    served = [a for lbl, a, _ in model.successors(world) if lbl.startswith("B1 writes step 2")]
    assert served and served[0].stored is not None
    assert served[0].stored.probation == 0 and served[0].stored.vouch
    assert served[0].chiefs[0].serving == 0


def test_fence_is_the_jobs_and_a_long_heartbeat_is_refused() -> None:
    # issue 32, case 8: with FENCE from each process's heartbeat, a zombie with a short one
    # serves a short probation while the newest chief writes every long heartbeat
    result = results()[("fix off", "fence_job_wide")]
    assert result.violation is not None and result.violation.invariant == "never early"
    assert not any("A2 writes" in event for event in result.violation.trace[-6:])
    # v3: the chief with a heartbeat above FENCE / 3 does not start
    _model, world, labels, _ = walk(FENCE_HEARTBEAT, "A1 begins generation 1", "tick 1", "A2")
    assert labels[-1] == "A2 refuses to start: its heartbeat is above FENCE / 3"
    assert world.chiefs[1].status == "refused"
    assert all_on(FENCE_HEARTBEAT).violation is None


def test_a_new_session_is_numbered_above_what_its_process_saw() -> None:
    # issue 32, case 6: after a failover to an empty Redis whose clock is behind, the
    # process P's next session (A3) is numbered above A2's, and so above A1's (a zombie)
    _model, world, labels, found = walk(
        CLOCK,
        "A1 begins generation 1",
        "tick 1",
        "A1 pauses",
        "A2 begins generation 2",
        "Redis fails over to an empty server whose clock is behind",
        "tick 2",
        "A3 begins generation 3",
    )
    assert found is None and world.clock < world.chiefs[2].gen == 3
    # without the floor, the clock numbers it 1, as A1
    _, _, labels, found = walk(
        CLOCK,
        "A1 begins generation 1",
        "tick 1",
        "A1 pauses",
        "A2 begins generation 2",
        "Redis fails over to an empty server whose clock is behind",
        "tick 2",
        "A3 begins generation 1",
        flags=Flags(generation_floor=False),
    )
    assert labels[-1].startswith("A3 begins generation 1")
    result = results()[("fix off", "generation_floor")]
    assert result.violation is not None and result.violation.invariant == "never early"


def test_a_number_at_the_top_reads_as_malformed() -> None:
    # issue 32, case 7: the job's key holds a fence of 2**53 (the model's top, 8); v2 took
    # it as valid, and fence + 1 == fence in Lua doubles: A1 and A2 got one number
    model, world, _labels, _ = walk(NUMBERS, "A1 begins generation 1")
    assert world.chiefs[0].gen == 1 and Model(Flags(), NUMBERS).max_number == NUMBERS.top - 2
    model = Model(Flags(numbers_bounded=False), NUMBERS)
    result = results()[("fix off", "numbers_bounded")]
    assert result.violation is not None and result.violation.invariant == "never early"
    trace = result.violation.trace
    assert trace[0].startswith(f"A1 begins generation {NUMBERS.top}")
    assert any(e.startswith(f"A2 begins generation {NUMBERS.top}") for e in trace)
    assert model.inc(NUMBERS.top) == NUMBERS.top


def test_a_begin_that_would_number_above_max_step_is_refused() -> None:
    # the model's reading of case 7 (an assumption about the code): a valid fence at
    # MAX_STEP (top - 2) leaves no number a begin could store; the begin is refused, and so
    # no generation shares a number
    top = NUMBERS.top
    scope = NUMBERS._replace(name="numbers-max", initial_fence=top - 2)
    _, world, labels, _ = walk(scope, "A1")
    assert labels == [f"A1's begin would need generation {top - 1}, above MAX_STEP: refused"]
    assert world.chiefs[0].status == "refused"
    assert explore(Flags(), scope).violation is None


def test_the_grace_releases_and_aborts_late_workers_within_the_bound() -> None:
    # without the grace a late worker (no run id) never trusts a finished state it did not
    # see written (found above: never lost); with it, W1 is released and W2 aborted
    assert all_on(LATE).violation is None and all_on(LATE).worst_owed <= LATE.bound
    _model, world, _, _ = walk(
        LATE._replace(name="late-walk"),
        "A1 begins generation 1",
        "tick 1",
        "A1 writes step 2 as final",
        "tick 2",
        "W1 (target 2) starts waiting",
        "W2 (target 3) starts waiting",
        "W1 reads",
        "W2 reads",
        "tick 3",
        "tick 4",
        "W1 reads",
        "W2 reads",
    )
    assert [w.phase for w in world.waiters] == ["released", "aborted"]


def test_a_rerun_without_run_id_is_kept_apart_only_if_its_chief_begins_within_the_grace() -> None:
    # a rerun's worker (no run id) reads the previous run's finished state; its chief begins
    # on it within a tick of the worker's start, shorter than the grace, and leaves begun
    # and fence above it: the worker never trusts it. Later than the grace: the limit
    grace = RERUN.grace or RERUN.fence
    assert RERUN.chiefs[1].begin_within < grace and all_on(RERUN).violation is None
    limit = next(limit for limit in LIMITS if limit.name == "rerun-begins-after-grace")
    assert limit.scope.chiefs[1].begin_within == grace
    result = results()[("limit", limit.name)]
    assert result.violation is not None and result.violation.invariant == "never early"
    assert "the state is run A's" in result.violation.detail


def test_the_explore_command_prints_each_scope() -> None:
    assert main(["--scope", "rerun", "--jobs", "1"]) == 0


def walk(
    scope: Scope, *events: str, flags: Flags | None = None
) -> tuple[Model, World, list[str], Violation | None]:
    """Follow, from the initial state, the first event that starts with each of ``events``."""
    model = Model(flags or Flags(), scope)
    world = model.initial()
    labels: list[str] = []
    found = None
    for prefix in events:
        options = [out for out in model.successors(world) if out[0].startswith(prefix)]
        assert options, f"no event {prefix!r} after {labels}: {next_events(model, world)}"
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
    assert found is None and "(fences generation 1, records its begin)" in labels[-1]
    assert begun.stored is not None
    assert (begun.stored.gen, begun.stored.fence, begun.stored.begun) == (1, 2, 2)
    events = next_events(model, begun)
    assert "A1 writes step 2: SUPERSEDED by the fence of generation 2" in events
    assert any(e.startswith("the contributor finds the fence of generation 2") for e in events)
    # a contributor that has not joined yet waits for the new generation's first write
    model, begun, _, _ = walk(
        scope, "A1 begins generation 1", "A1 writes step 2", "tick 1", "A2 begins generation 2"
    )
    assert not any(e.startswith("the contributor") for e in next_events(model, begun))
    model, written, labels, _ = walk(
        scope,
        "A1 begins generation 1",
        "A1 writes step 2",
        "tick 1",
        "A2 begins generation 2",
        "A2 writes step 1",
    )
    assert "its begin on record: no probation" in labels[-1]
    assert written.stored is not None and written.stored.fence == written.stored.begun == 0
    assert "the contributor joins generation 2 at step 1" in next_events(model, written)


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
    _, written, labels, _ = walk(
        BEGIN_PAUSED,
        "A1 begins generation 1 at step 2 (no state: leaves the fence of generation 1); A1 pauses",
        "tick 1",
        "A2 begins generation 2",
        "A2 writes step 1",
    )
    assert written.fenced == 0 and written.stored is not None and written.stored.gen == 2
    assert "its begin on record: no probation" in labels[-1]


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
