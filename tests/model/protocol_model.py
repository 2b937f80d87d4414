"""An explicit-state model of the stepbarrier protocol (v3), explored exhaustively at small scope.

The rules are docs/protocol.md's (protocol v3, issue 32), which states the code's
(stepbarrier/_protocol/lua/'s ``begin_generation.lua`` and ``publish_step.lua``,
stepbarrier/_chief/, stepbarrier/_worker/wait_state.py). Nothing here does I/O or imports
stepbarrier: the model states the protocol's rules once more, small enough to enumerate
every state that a few participants and faults reach.

**Time** is discrete: a ``tick`` event advances every clock by one. Nobody reads an
absolute time: each participant keeps counters of elapsed ticks (its own monotonic
clock), capped where larger values decide nothing. The heartbeat (one per chief),
``FENCE``, the grace and the waiter's fallback read interval are counts of ticks. A tick
may pass only when nobody owes an action its timers made due (a live chief's heartbeat
write or the retry of a write whose reply it lost, a begun chief's first write, a
waiter's due read, a watch's end, the begin of a rerun's chief or of a supervisor's
restart whose delay is over): that is
what "live" means, and what makes the bounded liveness check meaningful. A paused
process owes nothing; its clock runs on. Processes start, pause, resume and crash, and
an operator publishes, at the start of a tick; the protocol's actions follow in every
order, and Redis's faults and a reset may come between any two of them (``Model.events``).

**Redis** is the state hash (or none; with its ``fence``, ``begun`` and ``probation``; or a
hash of a begin's fence alone, which reads as no state), the reset token, the Redis clock
that numbers generations, and the announcements. Generations are numbered as the code
numbers them: ``max(clock, stored generation + 1, fence + 1, begun + 1, the caller's
floor + 1)``, with ``+ 1`` done in Lua doubles (the model's ``Scope.top`` stands for
``2**53``: above it ``n + 1 == n``). The clock advances by one at every begin and, unless
a scope lets it go back (a Limit), stays above every number it handed out. A state a
write (re)makes beats from the Redis clock: above every beat of its generation anyone
holds (``Model.made_beat``). An announcement reaches a waiting, connected waiter as the
write happens (it handles it at once), unless the fault budget makes it lost or late (it
waits in the waiter's inbox, handled at any later moment); a waiter whose first read is
still due buffers it and handles it right after that read. Faults: Redis loses the state
or the fence-only hash (restart empty, eviction, expiry), a chief's write is applied but
its reply is lost (the chief retries at once), an announcement is lost or late, a process
pauses and resumes (a waiter's pause is a disconnection: it hears nothing meanwhile and
reads again when back), a chief crashes. Only when a scope asks: a new generation's begin
apart from its first write (two calls, as in the code), and a pause between the two; a
chief configured with a longer heartbeat; a fence-only hash whose fence is at the top of
the numbers (a broken or hostile client); and, outside the promises
(docs/protocol.md#limits), the newest chief cut off (paused, or finished) while a zombie
writes, the reset token lost, a failover to a lagging replica, a failover to an empty
Redis whose clock is behind, a rerun's chief that begins later than the grace, two runs
with one run id.

**Ground truth** that no participant reads rides along: which run each generation
really belongs to (generations are told apart by their begin, not by their number: two
may share a number), whether a stored step was handed over by the newest generation of
that run (``legit``), and which waiters were waiting when it was written
(``witnesses``). The invariants compare decisions with that truth:

- *never early*: a release is by a legit state of the waiter's own run with step
  >= its target, either a final fact (done, pinned) or seen live: written during
  the wait, or its chief has not crashed (a crashed chief's restart may go back
  to an older checkpoint, so its stale step must release no newcomer);
- *aborted only for real*: "done" by a legit done state of its own run below its
  target, "reset" by a reset that came after its wait began (its first read);
- *runs kept apart*: a chief that wrote within its last heartbeat is neither taken
  over by a chief of another run nor superseded by one (once another run's chief has
  replaced its state, checked then, it is that run's zombie and no longer counts);
- *never lost* (bounded liveness): a waiter owed an end (the newest generation of its
  run live at >= its target; its run's final fact, done and vouching or pinned, that it
  can know of: it carries its run id, it heard it, or no newer begin is on record, so
  that the grace applies; a reset after its wait began) ends within ``Scope.bound``
  ticks, counted again from any loss of the state.

*Never hung* (every wait ends within its limits) is about the stall and overall
timeouts, which the model leaves out: it checks only that no state is stuck (time may
not pass and nobody can act).

Each flag of ``Flags`` is one fix of the design: with it off, ``explore`` finds the
counterexample the fix rules out (``FIXES``; tests/model/test_protocol_model.py), and each
limit lifted (``LIMITS``) shows the promise it names broken. ``SCOPES`` are explored by
tests/model (CI), ``LARGE_SCOPES`` by ``make model`` (``python -m tests.model.explore
--large``), which prints each scope's state count.

The state space is kept in check by capping every counter where larger values decide
nothing, by canonical beats (the least above every beat held, ``Model.made_beat``), by a
Redis clock that moves only at a begin, by placing process events at the start of a tick,
by fault budgets, and in the large scopes by restarting a paused newest chief at once (a
later restart is the limit ``newest-cut-off``). Waiters and chiefs differ in target or
role in every scope, so no symmetry is left to reduce.

Left out, on purpose: the confirmation window (a chief out of probation always vouches:
its loop is taken to hand its step over within the window, and a final write or a step
higher than any it vouched for vouches without it anyway), the stall and overall
timeouts (never hung), registrations and targets (guidance only), a contributor joining
the generation its own wait was released by (it joins the one it finds), a lost reply of
a refused write (the retry is refused again, or is the same as a later write), and beats
from a clock that goes back (a remade state's beats are above the lost ones'; a failover
to a server whose clock is behind numbers generations from it, see ``clock_back``, but
not beats).
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from typing import NamedTuple, TypeVar

# ---------------------------------------------------------------- configuration


class Flags(NamedTuple):
    """The design's fixes, one flag each; all on is the protocol of docs/protocol.md (v3).

    "Rule N" is the design note's of issue 21, "defect N" the review's; "case N" is issue
    32's (protocol v3).
    """

    probation: bool = True
    """Rule 5: a write that made the state without its own begin on record vouches for
    nothing during FENCE (defect 2)."""
    observed_write_required: bool = True
    """Rule 2: the first read alone is not an observation (defect 4)."""
    no_clock_comparison: bool = True
    """Rule 1 (defect 5). Off: a first read whose stamp is fresh by the server's clock
    counts as an observation (the old freshness test)."""
    contributor_pins_generation: bool = True
    """Rule 6: a contributor stops when the state carries another generation (defect 1)."""
    done_needs_observation_or_run_id: bool = True
    """Rules 3 and 9 (defect 6). Off: the old rule, a done state is trusted with a run id
    or when it was not done yet at the wait's first read (done_ms >= start_ms)."""
    runs_kept_apart: bool = True
    """Rule 7: a chief watches another run's state for FENCE before taking over (defect 10)."""
    operator_pin: bool = True
    """Rule 10 (defect 11). Off: an operator's step is an ordinary write, which releases
    only the waiters that see it written."""
    reset_token_equality: bool = True
    """Rule 8 (defect 12). Off: the marker is a time, and only a marker later than one's
    begin (first read) counts: a reset in the same millisecond is missed."""
    announcement_is_hint_for_reset: bool = True
    """Rule 8. Off: a reset announcement aborts the waiter by itself."""
    contributor_keeps_probation: bool = True
    """Found by this model (v2): a contributor's write never changes the stored ``vouch``
    nor ``probation``. Off: a contributor's write vouches and clears the probation."""
    begin_fences: bool = True
    """Found by this model (v2): ``begin_generation`` records the new generation as the
    ``fence`` of its own run's state, so that an older generation's chief writes are
    SUPERSEDED from the begin on, a joined contributor of an older generation stops and one
    not joined yet waits. Off: a generation fences the older ones only from its first
    write."""
    begin_fences_empty_job: bool = True
    """Found by this model (v2): a ``begin_generation`` that finds no valid state leaves a
    hash holding only its ``fence`` (and ``begun``), which reads as no state, so that an
    older generation's write, even the first write of a chief that paused between its
    begin and it, is SUPERSEDED. Off: such a begin records nothing. (In v3 such a paused
    first write of the same run is also on probation, its begin not on record; what the
    fence-only hash still decides is another run's chief begun on no state before it.)"""
    beat_from_clock: bool = True
    """Found by this model (v2): a state (re)made starts its ``beat`` from the Redis clock,
    so that after Redis forgot the state the remade state's beats are above every beat a
    waiter saw before. Off: a remade state's beat starts again at 1."""
    abort_needs_vouch: bool = True
    """Found by this model (v2): a done state below the target aborts a wait only if it is
    trusted and vouched for (``vouch=1``), as a release by it is."""
    # ---------------------------------------------------------- protocol v3 (issue 32)
    fence_job_wide: bool = True
    """Case 8: ``FENCE`` is one constant of the job (3 s), and a heartbeat above
    ``FENCE / 3`` is refused at start. Off: v2's ``FENCE = max(3 x heartbeat, 3 s)`` of
    each process's own heartbeat (a zombie with a short heartbeat counts a short probation
    while the newest chief writes every long heartbeat). In the model a chief whose
    heartbeat is not below ``FENCE`` (two heartbeats here, three in the library) does not
    start."""
    probation_unless_begun: bool = True
    """Cases 4 and 5: every begin records ``begun = <its generation>`` on the hash, whatever
    the run, and a chief write that makes or replaces the state (no valid state, or a lower
    generation stored) is on probation unless the hash it replaces shows ``begun == its
    generation``. Off: v2's rule, probation only for a write that finds no valid state and
    is not ``first`` (no write of its generation accepted yet, within FENCE of its begin);
    a write replacing a lower generation never is."""
    probation_in_redis: bool = True
    """Case 4: probation is stored as ``probation = <the beat of the write that made it>``,
    the stored ``vouch`` is 0 while it is set, every reply carries it, the chief counts
    FENCE from the first reply that showed it and then writes ``served = <id>``, which
    alone clears it. Off: v2's rule, the creating write alone stores ``vouch=0`` and says
    ``created=1`` in its reply, from which the chief counts FENCE: a lost reply skips the
    probation."""
    generation_floor: bool = True
    """Case 6: a begin numbers its generation ``max(clock, stored + 1, fence + 1,
    begun + 1, floor + 1)``, the floor being the highest generation the process knows of
    (its own earlier ones, any a reply showed it). Off: v2's ``max(clock, stored + 1,
    fence + 1)``."""
    numbers_bounded: bool = True
    """Case 7: every stored number is at most ``MAX_STEP = 2**53 - 2``, so that ``n + 1``
    is exact in Lua doubles; a larger one reads as malformed (and a begin that would need a
    larger number is refused). Off: v2's bound, ``2**53``, where ``2**53 + 1 == 2**53``."""
    grace: bool = True
    """The grace (v3 point 5): a waiter that reads a finished (done, vouching) or pinned
    state of its run that it did not see written, and that does not carry its own
    non-empty run id, trusts it once it has read it unchanged (same ``(generation,
    beat)``, no ``begun`` or ``fence`` above its generation) for ``GRACE`` on its own clock
    since the first read that found it. Off: v2's rule, such a state is never trusted (a
    late worker after the job finished waits for ever)."""


class ChiefSpec(NamedTuple):
    name: str
    run: str
    first_step: int
    """The step its first write hands over (a restore from a checkpoint)."""
    last_step: int
    after: str | None = None
    """Begins only once this chief has begun (a restart, a later session)."""
    may_pause: bool = False
    may_crash: bool = False
    may_finish: bool = False
    heartbeat: int | None = None
    """Its own heartbeat in ticks (None: the scope's)."""
    process: str | None = None
    """Chiefs with the same process are sessions of one process, and share its floor (the
    highest generation it knows of). None: a process of its own, whose floor is unused."""
    after_waiter: str | None = None
    """Begins only once this waiter has started waiting (a rerun's chief starting after
    its first worker), and then ``begin_within`` ticks later at the latest."""
    restarts: bool = False
    """A supervisor's restart: it begins ``begin_within`` ticks at the latest (0: at once)
    after the chief it comes ``after`` pauses, so that the newest generation is not cut off
    for FENCE (the limit ``newest-cut-off``: with FENCE of two heartbeats, one tick late is
    already that limit)."""
    begin_within: int = 0
    after_done: str | None = None
    """Begins only once this chief has finished (a rerun)."""


class WaiterSpec(NamedTuple):
    name: str
    run: str
    target: int
    may_pause: bool = False
    after_done: str | None = None
    """Starts waiting only once this chief has finished (a late worker)."""


class OperatorSpec(NamedTuple):
    run: str
    """Whose run id ``stepbarrier publish`` writes (its STEPBARRIER_RUN_ID)."""
    step: int


class Scope(NamedTuple):
    """Who takes part, which faults may happen how often, and the timing (in ticks)."""

    name: str
    chiefs: tuple[ChiefSpec, ...]
    waiters: tuple[WaiterSpec, ...]
    run_ids: tuple[tuple[str, str], ...] = (("A", ""), ("B", "b"))
    """Each run's run id ('' for none); two runs with one id are one run to a waiter."""
    contributor: str | None = None
    """The run of a contributor (a worker's step reporter), or None."""
    operator: OperatorSpec | None = None
    resets: int = 0
    lose_state: int = 0
    lose_replies: int = 0
    """Writes of a chief applied in Redis whose reply is lost (the chief retries at once)."""
    lose_announcements: int = 0
    late_announcements: int = 0
    pauses: int = 0
    max_ticks: int = 6
    heartbeat: int = 1
    fence: int = 2
    """FENCE: more than a heartbeat (3 x the largest heartbeat allowed, in the library)."""
    grace: int | None = None
    """GRACE (None: FENCE, as in the library)."""
    fallback: int = 2
    """Ticks between a waiter's reads of the stored state."""
    fresh_window: int = 1
    """Ticks a stored stamp counts as fresh under the old clock rule."""
    bound: int = 5
    """Ticks within which a waiter owed an end ends (never lost)."""
    inbox: int = 2
    """Announcements a connection buffers; more drop the oldest (lost)."""
    top: int = 1_000
    """The model's ``2**53``: the first number whose ``+ 1`` Lua's doubles get wrong
    (``top + 1 == top``); v3 stores numbers up to ``top - 2`` (``MAX_STEP``), v2 up to
    ``top``."""
    initial_fence: int = 0
    """A fence-only hash at the start (0: none), left by a broken or hostile client."""
    # off unless asked: the begin as a call of its own, and the Limits
    # (docs/protocol.md#limits), outside the promises
    split_begin: bool = False
    """A new generation's begin and its first write are two events (its first write is
    due at once, in the tick of its begin)."""
    pause_after_begin: bool = False
    """With ``split_begin``: a chief that may pause may do so between its begin and its
    first write (shorter than FENCE or not)."""
    lose_token: int = 0
    failovers: int = 0
    """Failovers to a lagging replica: the state goes back to an older copy."""
    clock_back: int = 0
    """Failovers to an empty Redis whose clock is behind every generation numbered so far
    (and stays behind: by more than the time between two begins)."""
    clock_back_after: str | None = None
    """Such a failover comes only once this chief has begun."""
    excuse: tuple[str, ...] = ()
    """Limits (``LIMITS``' names) whose outcome is not counted as a violation here: only
    ``runs-while-redis-forgot``, so that a large scope may have two runs beside Redis
    losses (a live chief superseded or taken over by another run's while Redis has lost
    its state since its last write is that limit, not a defect)."""

    def run_id(self, run: str) -> str:
        return dict(self.run_ids)[run]


# ---------------------------------------------------------------- state

Mark = tuple[int, int]
"""(generation, beat): which write a participant saw."""


class Stored(NamedTuple):
    """The state hash as Redis holds it; from ``origin`` on, the ground truth about it."""

    run_id: str
    gen: int
    step: int
    done: bool
    beat: int
    vouch: bool
    pinned: bool
    fence: int = 0
    """The generation a begin of this state's run recorded (0: none): a chief write of a
    lower generation is SUPERSEDED. A write that replaces the state clears it."""
    begun: int = 0
    """The generation the latest begin recorded, whatever its run (0: none)."""
    probation: int = 0
    """The probation id (the beat of the write that made it; 0: none): vouch stays 0."""
    age: int = 0
    """Ticks since its write by the server's clock: read only by the old clock rule."""
    origin: int = 0
    """Truth: the generation (its begin's index in ``World.gens``) that wrote it last."""
    run: str = ""
    legit: bool = False
    witnesses: frozenset[int] = frozenset()

    def describe(self) -> str:
        extra = "".join(
            f", {name} {value}"
            for name, value in (
                ("fence", self.fence),
                ("begun", self.begun),
                ("probation", self.probation),
            )
            if value
        )
        return (
            f"step {self.step} (run id '{self.run_id}', generation {self.gen}, beat {self.beat}, "
            f"vouch={int(self.vouch)}, done={int(self.done)}, pinned={int(self.pinned)}{extra})"
        )


class Gen(NamedTuple):
    """Ground truth about one generation: one begin (its index in ``World.gens`` + 1)."""

    run: str
    chief: int
    """Index of its chief; -1 for an operator's pinned step."""
    step: int
    """An operator's pinned step (a chief's step is the chief's own)."""
    reset_ended: bool
    """A reset came after it began: it hands nothing over any more."""
    number: int
    """The generation number its begin got (two generations may share one)."""
    blind: bool = False
    """Truth, kept only for ``Scope.excuse``: at its begin Redis had lost the state of another
    run's live chief, or all state (the limit ``runs-while-redis-forgot``)."""


class Chief(NamedTuple):
    status: str = "idle"
    """idle, watching, begun, active, or an end: superseded, reset, conflict, done, crashed,
    refused."""
    gid: int = 0
    """Truth: its generation's index in ``World.gens`` + 1."""
    gen: int = 0
    """Its generation number."""
    step: int = 0
    paused: bool = False
    since_write: int = 0
    probation: int = 0
    """Ticks of probation left, on its own clock (counted from the reply that showed it)."""
    serving: int = 0
    """v3: the probation id it counts FENCE for (0: none known); it writes ``served`` with
    it once that count is over."""
    since_begin: int = 0
    """Ticks since its begin while it has not written (capped at FENCE); while idle, ticks
    since the waiter it starts after began (``begin_within``)."""
    reset_seen: int = 0
    watch_left: int = 0
    watch_mark: Mark | None = None
    wrote: bool = False
    """Truth: a write of its generation was accepted (its reply may have been lost)."""
    acked: bool = False
    """It received the reply of an accepted write (v2's ``first`` reads it)."""
    began_this_tick: bool = False
    """Only for the old same-millisecond rule (reset_token_equality off)."""
    since_accepted: int = 0
    """Truth: ticks since its last accepted write (capped at heartbeat + 1)."""
    final: bool = False
    """Its final write landed on probation: it writes it again when the probation ends."""
    floor: int = 0
    """The highest generation its process knows of (only for a ``ChiefSpec.process``)."""
    overtaken: bool = False
    """Truth: another run's chief replaced its state (a take-over, checked when it happens);
    from then on it is a zombie to the other run, and never live."""
    forgotten: bool = False
    """Truth, kept only for ``Scope.excuse``: Redis lost the state since its last accepted
    write."""


ENDED = ("superseded", "reset", "conflict", "done", "crashed", "refused")


class Contributor(NamedTuple):
    status: str = "idle"
    """idle, joined, stopped."""
    gen: int = 0
    gid: int = 0
    """Truth: the generation it joined."""
    step: int = 0
    wrote: bool = False
    """It wrote in this tick (one write per tick)."""


# a stored state, or None for a reset announcement
Msg = Stored | None


class Waiter(NamedTuple):
    phase: str = "idle"
    """idle, subscribed (confirmed; first read due), waiting, released, aborted."""
    paused: bool = False
    inbox: tuple[Msg, ...] = ()
    max_gen: int = 0
    """The generation of its latest read of its own run's state (the code's
    ``WaitRules.generation``): reads and announcements of a lower one are ignored. An
    announcement of a higher one does not set it: it makes the waiter read."""
    prev_read: Mark | None = None
    live_mark: Mark | None = None
    baseline: int = 0
    """The reset token its first read found (0: none)."""
    since_read: int = 0
    done_at_start: int = 0
    """The old done rule: the generation of a done state its first read found."""
    first_read_this_tick: bool = False
    grace_mark: Mark | None = None
    """The grace: the unobserved final fact of its run it read, unchanged since."""
    grace_for: int = 0
    """Ticks since the first read that found ``grace_mark`` (capped at GRACE)."""
    reset_during: bool = False
    """Truth: a reset came after its first read."""
    heard_final: bool = False
    """Truth: it heard a done or pinned announcement of its own run."""
    owed: int = 0
    """Truth: ticks it has been owed an end."""


class Budget(NamedTuple):
    resets: int
    lose_state: int
    lose_replies: int
    lose_announcements: int
    late_announcements: int
    pauses: int
    publishes: int
    lose_token: int
    failovers: int
    clock_back: int


class World(NamedTuple):
    tick: int
    stored: Stored | None
    replica: Stored | None
    token: int
    next_token: int
    same_tick: frozenset[str]
    """The old rule: who began (made a first read) in the last reset's tick, before it."""
    gens: tuple[Gen, ...]
    chiefs: tuple[Chief, ...]
    contributor: Contributor
    waiters: tuple[Waiter, ...]
    budget: Budget
    quiet: bool = True
    """No protocol action yet in this tick: the environment may still act (see ``events``)."""
    fenced: int = 0
    """A hash holding only a ``fence`` (and ``begun``, the same number) (0: none; never
    beside a ``stored`` state): a begin found no valid state and left the fence of its
    generation. It reads as no state."""
    replica_fenced: int = 0
    """The lagging replica's copy of ``fenced``."""
    clock: int = 1
    """The Redis clock, in generation numbers: what a begin reads as TIME."""


class Violation(NamedTuple):
    invariant: str
    """never early, aborted only for real, runs kept apart, never lost."""
    detail: str
    trace: tuple[str, ...] = ()

    def report(self) -> str:
        steps = "\n".join(f"  {number:2}. {event}" for number, event in enumerate(self.trace, 1))
        return f"{self.invariant}: {self.detail}\n{steps}"


class Result(NamedTuple):
    states: int
    violation: Violation | None
    worst_owed: int
    """The longest any waiter was owed an end (ticks), over every state explored."""
    stuck: int
    """States where time may not pass and nobody can act (a modelling error if any)."""


Outcome = tuple[World, str, Violation | None]
"""A world an event leads to, what happened, and the invariant it broke if any."""

T = TypeVar("T")


def _put(items: tuple[T, ...], index: int, value: T) -> tuple[T, ...]:
    return (*items[:index], value, *items[index + 1 :])


def _first(*violations: Violation | None) -> Violation | None:
    return next((v for v in violations if v is not None), None)


# ---------------------------------------------------------------- the model


class Model:
    """The protocol's rules under one ``Flags``, for the participants of one ``Scope``."""

    def __init__(self, flags: Flags, scope: Scope) -> None:
        self.flags = flags
        self.scope = scope
        self.chief_index = {spec.name: index for index, spec in enumerate(scope.chiefs)}
        self.waiter_index = {spec.name: index for index, spec in enumerate(scope.waiters)}
        self.same_ms = not flags.reset_token_equality and scope.resets > 0
        self.two_runs = len({spec.run for spec in scope.chiefs}) > 1
        self.grace = scope.fence if scope.grace is None else scope.grace
        self.max_number = scope.top - 2 if flags.numbers_bounded else scope.top
        """The largest stored number that reads as valid."""
        self.tracked = tuple(spec.process is not None for spec in scope.chiefs)
        """Whose floor is kept (only a process's may decide anything)."""

    def initial(self) -> World:
        scope = self.scope
        return World(
            tick=0,
            stored=None,
            replica=None,
            token=0,
            next_token=1,
            same_tick=frozenset(),
            gens=(),
            chiefs=tuple(Chief() for _ in scope.chiefs),
            contributor=Contributor(),
            waiters=tuple(Waiter() for _ in scope.waiters),
            budget=Budget(
                resets=scope.resets,
                lose_state=scope.lose_state,
                lose_replies=scope.lose_replies,
                lose_announcements=scope.lose_announcements,
                late_announcements=scope.late_announcements,
                pauses=scope.pauses,
                publishes=1 if scope.operator else 0,
                lose_token=scope.lose_token,
                failovers=scope.failovers,
                clock_back=scope.clock_back,
            ),
            fenced=scope.initial_fence,
        )

    # ------------------------------------------------------------ per chief

    def heartbeat(self, i: int) -> int:
        return self.scope.chiefs[i].heartbeat or self.scope.heartbeat

    def fence_of(self, i: int) -> int:
        """FENCE as chief ``i`` counts it: the job's (v3), or v2's, of its own heartbeat
        (``max(3 x heartbeat, 3 s)``: two heartbeats, at least the scope's FENCE, here)."""
        if self.flags.fence_job_wide:
            return self.scope.fence
        return max(self.scope.fence, 2 * self.heartbeat(i))

    # ------------------------------------------------------------ numbers

    def inc(self, number: int) -> int:
        """``number + 1`` in Lua doubles: at the model's ``2**53`` it stays put."""
        return min(number + 1, self.scope.top)

    def fence_only(self, world: World) -> int:
        """The fence of the fence-only hash as a reader takes it (0: none, or malformed)."""
        return world.fenced if world.fenced <= self.max_number else 0

    def number(self, world: World, floor: int) -> int:
        """The generation number ``begin_generation`` returns (and stores as fence, begun)."""
        stored = world.stored
        candidates = [world.clock]
        if stored is not None:
            candidates += [self.inc(stored.gen), self.inc(stored.fence)]
            begun = stored.begun
        else:
            candidates.append(self.inc(self.fence_only(world)))
            begun = self.fence_only(world)
        if self.flags.generation_floor:
            candidates += [self.inc(begun), self.inc(floor)]
        return max(candidates)

    def blind(self, world: World, run: str) -> bool:
        """Truth, for ``Scope.excuse``: a begin of ``run`` now cannot see another run's live
        chief because Redis lost its state (since that chief's last write), or lost the
        state altogether."""
        if not self.scope.excuse:
            return False
        if world.stored is None and not self.fence_only(world) and world.gens:
            return True
        return any(
            spec.run != run and chief.forgotten and chief.status == "active"
            for spec, chief in zip(self.scope.chiefs, world.chiefs, strict=True)
        )

    def excused(self, world: World, victim: str, gid: int) -> bool:
        """Truth, for ``Scope.excuse``: the limit ``runs-while-redis-forgot`` (Redis lost the
        state since the last accepted write of ``victim``'s live chief, or generation ``gid``
        of the other run began finding no state because Redis had lost it)."""
        if "runs-while-redis-forgot" not in self.scope.excuse:
            return False
        return world.gens[gid - 1].blind or any(
            spec.run == victim and chief.forgotten
            for spec, chief in zip(self.scope.chiefs, world.chiefs, strict=True)
        )

    def floor(self, world: World, i: int) -> int:
        """The highest generation chief ``i``'s process knows of."""
        process = self.scope.chiefs[i].process
        if process is None:
            return 0
        return max(
            chief.floor
            for spec, chief in zip(self.scope.chiefs, world.chiefs, strict=True)
            if spec.process == process
        )

    def learn(self, chief: Chief, i: int, *numbers: int) -> Chief:
        """A reply showed ``numbers``: the floor of a tracked process rises."""
        if not self.tracked[i]:
            return chief
        return chief._replace(floor=max(chief.floor, *numbers))

    # ------------------------------------------------------------ truth

    def newest(self, world: World, run: str) -> int:
        return max((n for n, gen in enumerate(world.gens, 1) if gen.run == run), default=0)

    def handed(self, world: World, gid: int) -> int:
        info = world.gens[gid - 1]
        return info.step if info.chief < 0 else world.chiefs[info.chief].step

    def legit(self, world: World, gid: int, step: int) -> bool:
        info = world.gens[gid - 1]
        return (
            gid == self.newest(world, info.run)
            and not info.reset_ended
            and step <= self.handed(world, gid)
        )

    def owed(self, world: World, j: int) -> bool:
        """Truth: is an end due to waiter ``j`` (it must come within the bound)?"""
        waiter, spec = world.waiters[j], self.scope.waiters[j]
        if not waiting(waiter) or waiter.paused:
            return False
        if waiter.reset_during and world.token:
            return True
        gid = self.newest(world, spec.run)
        if gid == 0:
            return False
        info, stored = world.gens[gid - 1], world.stored
        final = stored is not None and stored.origin == gid and stored.gen == info.number
        # a final fact it can know of: its run id, heard happen, or the grace (no newer
        # begin on record)
        knows = final and (
            self.scope.run_id(spec.run) != ""
            or waiter.heard_final
            or (stored is not None and max(stored.begun, stored.fence) <= stored.gen)
        )
        if info.chief < 0:
            return knows and info.step >= spec.target
        chief = world.chiefs[info.chief]
        if chief.gid != gid:
            return False
        if chief.status == "active" and not info.reset_ended:
            return not chief.paused and chief.wrote and chief.step >= spec.target
        if chief.status == "done":
            return knows and stored is not None and stored.done and stored.vouch
        return False

    def dead(self, world: World, gid: int) -> bool:
        """Truth: the chief of ``gid`` crashed (its restart may go back to a checkpoint)."""
        chief = world.gens[gid - 1].chief
        return chief >= 0 and world.chiefs[chief].status == "crashed"

    def check_release(self, world: World, j: int, state: Stored) -> Violation | None:
        spec = self.scope.waiters[j]
        final = state.pinned or state.done
        seen_live = final or j in state.witnesses or not self.dead(world, state.origin)
        if state.run == spec.run and state.step >= spec.target and state.legit and seen_live:
            return None
        why = []
        if state.run != spec.run:
            why.append(f"the state is run {state.run}'s")
        if not state.legit:
            info = world.gens[state.origin - 1]
            newest = self.newest(world, info.run)
            if info.reset_ended:
                why.append(f"generation {state.gen} was reset")
            elif info.number != state.gen:
                why.append(
                    f"its step was written by a participant of generation {info.number} of run "
                    f"{info.run}, older than the newest, {world.gens[newest - 1].number}, which "
                    f"has handed over step {self.handed(world, newest)}"
                )
            elif newest != state.origin and world.gens[newest - 1].number == state.gen:
                why.append(
                    f"it was written by an older begin of run {info.run} that got the same "
                    f"generation number {state.gen} as the newest one, which has handed over "
                    f"step {self.handed(world, newest)}"
                )
            else:
                why.append(
                    f"the newest generation of run {info.run} is "
                    f"{world.gens[newest - 1].number}, which has handed over step "
                    f"{self.handed(world, newest)}"
                )
        if not seen_live:
            why.append(
                f"the chief of generation {state.gen} had crashed, and its state was written "
                "before the wait began (never seen live)"
            )
        return Violation(
            "never early",
            f"{spec.name} (target {spec.target}) released at step {state.step} of generation "
            f"{state.gen}: " + "; ".join(why),
        )

    def check_abort(
        self, world: World, j: int, reason: str, state: Stored | None
    ) -> Violation | None:
        spec, waiter = self.scope.waiters[j], world.waiters[j]
        if reason == "reset":
            if waiter.reset_during:
                return None
            detail = "no reset came after its wait began"
        else:
            assert state is not None
            if state.run == spec.run and state.legit and state.done and state.step < spec.target:
                return None
            detail = (
                f"the done state (run {state.run}, generation {state.gen}, step {state.step}) is "
                "not its own run's newest generation finishing below its target"
            )
        return Violation("aborted only for real", f"{spec.name} aborted ({reason}): {detail}")

    def live_chief_of(self, world: World, run: str) -> str | None:
        """Truth: a chief of ``run`` that wrote within its last heartbeat."""
        for i, (spec, chief) in enumerate(zip(self.scope.chiefs, world.chiefs, strict=True)):
            if (
                spec.run == run
                and chief.status == "active"
                and not chief.overtaken
                and not chief.paused
                and chief.wrote
                and chief.since_accepted <= self.heartbeat(i)
            ):
                return spec.name
        return None

    # ------------------------------------------------------------ exploration hooks

    def successors(self, world: World) -> Iterator[tuple[str, World, Violation | None]]:
        for after, label, violation in self.events(world):
            yield label, self.settle(after), violation

    def settle(self, world: World) -> World:
        """After an event: a waiter no longer owed an end starts its count again."""
        if not any(w.owed for w in world.waiters):
            return world
        waiters = tuple(
            w if w.owed == 0 or self.owed(world, j) else w._replace(owed=0)
            for j, w in enumerate(world.waiters)
        )
        return world._replace(waiters=waiters)

    def events(self, world: World) -> Iterator[Outcome]:
        """Every event possible in ``world``.

        The processes' environment (starting, pausing, resuming, crashing; an
        operator publishing) acts at the start of a tick, before the protocol's
        actions of that tick (writes, reads, deliveries, watch ends), in every
        order; Redis's faults and a reset come at any moment, between any two
        actions. A process event placed later in a tick is, to every clock, the
        same as one at the start of the next, where its effects can still be
        ordered before or after any action: this prunes interleavings no
        participant could tell apart. (Redis losing the state is not such an
        event: when it comes within a tick decides whose probation started when.)
        """
        yield from self.tick(world)
        if world.quiet:
            for i in range(len(self.scope.chiefs)):
                yield from self.chief_environment(world, i)
            for j in range(len(self.scope.waiters)):
                yield from self.waiter_environment(world, j)
            yield from self.publish(world)
        for after, text, violation in self.actions(world):
            yield after._replace(quiet=False), text, violation

    def actions(self, world: World) -> Iterator[Outcome]:
        for i in range(len(self.scope.chiefs)):
            yield from self.chief_actions(world, i)
        if self.scope.contributor is not None:
            yield from self.contributor_events(world)
        for j in range(len(self.scope.waiters)):
            yield from self.waiter_actions(world, j)
        if world.budget.resets:
            yield from self.reset(world)
        yield from self.fault_events(world)

    # ------------------------------------------------------------ time

    def may_begin(self, world: World, i: int) -> bool:
        spec = self.scope.chiefs[i]
        if spec.after is not None and world.chiefs[self.chief_index[spec.after]].status == "idle":
            return False
        if (
            spec.after_done is not None
            and world.chiefs[self.chief_index[spec.after_done]].status != "done"
        ):
            return False
        if spec.after_waiter is not None:
            return world.waiters[self.waiter_index[spec.after_waiter]].phase != "idle"
        return True

    def begin_counts(self, world: World, i: int) -> bool:
        """The delay of a rerun's chief, or of a restart, runs (``since_begin`` counts it)."""
        spec, chief = self.scope.chiefs[i], world.chiefs[i]
        if chief.status != "idle" or not self.may_begin(world, i):
            return False
        if spec.after_waiter is not None:
            return True
        if spec.restarts and spec.after is not None:
            return chief.since_begin > 0 or world.chiefs[self.chief_index[spec.after]].paused
        return False

    def begin_due(self, world: World, i: int) -> bool:
        """A rerun's chief, or a restart, whose delay is over: it begins now."""
        spec = self.scope.chiefs[i]
        return self.begin_counts(world, i) and world.chiefs[i].since_begin >= spec.begin_within

    def due(self, world: World) -> bool:
        """Somebody owes an action now: time may not pass."""
        for i, chief in enumerate(world.chiefs):
            if chief.paused:
                continue
            if (
                chief.status == "active"
                and chief.since_write >= self.heartbeat(i)
                and not (chief.final and chief.probation)
            ):
                return True
            if chief.status == "begun" or (chief.status == "watching" and not chief.watch_left):
                return True
            if self.begin_due(world, i):
                return True
        return any(
            waiting(w) and not w.paused and w.since_read >= self.scope.fallback
            for w in world.waiters
        )

    def tick(self, world: World) -> Iterator[Outcome]:
        scope = self.scope
        if world.tick >= scope.max_ticks or self.due(world):
            return
        chiefs = []
        for i, chief in enumerate(world.chiefs):
            heartbeat, spec = self.heartbeat(i), scope.chiefs[i]
            since_write = min(chief.since_write + 1, heartbeat)
            probation = chief.probation
            if probation:
                probation -= 1
                if probation == 0:
                    since_write = heartbeat  # the end of probation is a write at once
            since_begin = chief.since_begin
            if chief.status == "begun":
                since_begin = min(since_begin + 1, self.fence_of(i))
            elif self.begin_counts(world, i):
                since_begin = min(since_begin + 1, spec.begin_within)
            chiefs.append(
                chief._replace(
                    since_write=since_write,
                    probation=probation,
                    since_begin=since_begin,
                    watch_left=max(chief.watch_left - 1, 0),
                    began_this_tick=False,
                    since_accepted=(
                        min(chief.since_accepted + 1, heartbeat + 1) if self.two_runs else 0
                    ),
                )
            )
        stored = world.stored
        if stored is not None and not self.flags.no_clock_comparison:
            stored = stored._replace(age=min(stored.age + 1, scope.fresh_window + 1))
        world = world._replace(
            tick=world.tick + 1,
            stored=stored,
            chiefs=tuple(chiefs),
            contributor=world.contributor._replace(wrote=False),
            waiters=tuple(
                w._replace(
                    since_read=min(w.since_read + 1, scope.fallback),
                    first_read_this_tick=False,
                    grace_for=min(w.grace_for + 1, self.grace) if w.grace_mark else 0,
                )
                for w in world.waiters
            ),
        )
        violation = None
        waiters = []
        for j, waiter in enumerate(world.waiters):
            owed = waiter.owed + 1 if self.owed(world, j) else 0
            if owed > scope.bound and violation is None:
                violation = Violation(
                    "never lost",
                    f"{scope.waiters[j].name} has been owed an end for {owed} ticks "
                    f"(bound {scope.bound}) and has none",
                )
            waiters.append(waiter._replace(owed=min(owed, scope.bound + 1)))
        yield world._replace(waiters=tuple(waiters), quiet=True), f"tick {world.tick}", violation

    # ------------------------------------------------------------ chiefs

    def _chief(self, world: World, i: int, chief: Chief) -> World:
        return world._replace(chiefs=_put(world.chiefs, i, chief))

    def chief_environment(self, world: World, i: int) -> Iterator[Outcome]:
        spec, chief = self.scope.chiefs[i], world.chiefs[i]
        name = spec.name
        if chief.status == "idle":
            if self.may_begin(world, i):
                for after, text, violation in self.begin(world, i):
                    yield after._replace(quiet=False), text, violation
                    if (
                        after.chiefs[i].status == "begun"
                        and self.scope.pause_after_begin
                        and spec.may_pause
                        and after.budget.pauses
                    ):
                        # a pause between the begin and the first write (a GC pause,
                        # SIGSTOP): the first write is due only once the chief is back
                        paused = self._chief(after, i, after.chiefs[i]._replace(paused=True))
                        budget = after.budget._replace(pauses=after.budget.pauses - 1)
                        text += f"; {name} pauses before its first write"
                        yield paused._replace(budget=budget, quiet=False), text, violation
            return
        if chief.status in ENDED:
            return
        if chief.paused:
            yield self._chief(world, i, chief._replace(paused=False)), f"{name} resumes", None
            return
        if spec.may_pause and world.budget.pauses:
            paused = self._chief(world, i, chief._replace(paused=True))
            budget = world.budget._replace(pauses=world.budget.pauses - 1)
            yield paused._replace(budget=budget), f"{name} pauses", None
        if spec.may_crash:
            yield self._chief(world, i, chief._replace(status="crashed")), f"{name} crashes", None

    def chief_actions(self, world: World, i: int) -> Iterator[Outcome]:
        spec, chief = self.scope.chiefs[i], world.chiefs[i]
        if self.begin_due(world, i):
            yield from self.begin(world, i)  # its delay is over: it begins now
            return
        if chief.status == "idle" or chief.status in ENDED or chief.paused:
            return
        if chief.status == "watching":
            if chief.watch_left == 0:
                yield from self.decide(world, i)
            return
        if chief.final:
            if chief.since_write >= 1 and chief.probation == 0:
                yield from self.write(world, i, done=True)
            return
        if chief.since_write >= 1 or chief.status == "begun":
            steps = [chief.step] + ([chief.step + 1] if chief.step < spec.last_step else [])
            for step in steps:
                moved = (
                    world
                    if step == chief.step
                    else self._chief(world, i, chief._replace(step=step))
                )
                yield from self.write(moved, i, done=False)
                if spec.may_finish and step == spec.last_step and chief.probation == 0:
                    # a final write waits out its probation (it would vouch for nothing)
                    yield from self.write(moved, i, done=True)

    def begin(self, world: World, i: int) -> Iterator[Outcome]:
        spec, chief = self.scope.chiefs[i], world.chiefs[i]
        if self.flags.fence_job_wide and self.heartbeat(i) >= self.scope.fence:
            text = f"{spec.name} refuses to start: its heartbeat is above FENCE / 3"
            yield self._chief(world, i, chief._replace(status="refused")), text, None
            return
        floor = self.floor(world, i)
        gen = self.number(world, floor)
        if gen > self.max_number:
            text = f"{spec.name}'s begin would need generation {gen}, above MAX_STEP: refused"
            yield self._chief(world, i, chief._replace(status="refused")), text, None
            return
        stored = world.stored
        seen = 0 if stored is None else stored.gen
        world = world._replace(
            gens=(*world.gens, Gen(spec.run, i, 0, False, gen, self.blind(world, spec.run))),
            clock=self.inc(world.clock),
        )
        chief = Chief(
            status="active",
            gid=len(world.gens),
            gen=gen,
            step=spec.first_step,
            since_write=self.heartbeat(i),
            reset_seen=world.token,
            began_this_tick=self.same_ms,
            since_accepted=self.heartbeat(i) + 1 if self.two_runs else 0,
            floor=chief.floor,
        )
        chief = self.learn(chief, i, gen, seen)
        label = f"{spec.name} begins generation {gen} at step {spec.first_step}"
        world, note = self.record_begin(world, i, gen)
        label += note
        if (
            self.flags.runs_kept_apart
            and stored is not None
            and stored.run_id != self.scope.run_id(spec.run)
            and not stored.done
        ):
            chief = chief._replace(
                status="watching", watch_left=self.fence_of(i), watch_mark=mark(stored)
            )
            label += f", finds another run's state (generation {stored.gen}) and watches it"
            yield self._chief(world, i, chief), label, None
            return
        if self.scope.split_begin:
            yield self._chief(world, i, chief._replace(status="begun")), label, None
            return
        for after, text, violation in self.write(self._chief(world, i, chief), i, done=False):
            yield after, f"{label}; {text}", violation

    def record_begin(self, world: World, i: int, gen: int) -> tuple[World, str]:
        """What ``begin_generation`` records: ``begun`` on any state (v3), the fence of its
        own run's state, or, finding no valid state, a hash of the fence (and begun) alone."""
        stored = world.stored
        if stored is None:
            if self.flags.begin_fences_empty_job:
                note = f" (no state: leaves the fence of generation {gen})"
                return world._replace(fenced=gen), note
            return world, ""
        notes = []
        if self.flags.begin_fences and stored.run_id == self.scope.run_id(self.scope.chiefs[i].run):
            # it fences its own run's state (another run's is watched, not fenced)
            stored = stored._replace(fence=gen)
            notes.append(f"fences generation {stored.gen}")
        if self.flags.probation_unless_begun:
            stored = stored._replace(begun=gen)
            notes.append("records its begin")
        note = f" ({', '.join(notes)})" if notes else ""
        return world._replace(stored=stored), note

    def decide(self, world: World, i: int) -> Iterator[Outcome]:
        spec, chief = self.scope.chiefs[i], world.chiefs[i]
        stored = world.stored
        if (
            stored is not None
            and stored.run_id != self.scope.run_id(spec.run)
            and not stored.done
            and mark(stored) != chief.watch_mark
        ):
            text = f"{spec.name} sees the other run's state change: refuses (conflict)"
            yield self._chief(world, i, chief._replace(status="conflict")), text, None
            return
        # the watch's end is a second begin_generation: the generation it then gets is
        # the one it writes (the other run's state is not fenced, no state is)
        floor = max(self.floor(world, i), chief.gen)
        gen = self.number(world, floor if self.flags.generation_floor else 0)
        if gen > self.max_number:
            text = f"{spec.name}'s begin would need generation {gen}, above MAX_STEP: refused"
            yield self._chief(world, i, chief._replace(status="refused")), text, None
            return
        world = world._replace(
            gens=(*world.gens, Gen(spec.run, i, 0, False, gen, self.blind(world, spec.run))),
            clock=self.inc(world.clock),
        )
        world, note = self.record_begin(world, i, gen)
        chief = chief._replace(status="active", gid=len(world.gens), gen=gen, since_begin=0)
        chief = self.learn(chief, i, gen, 0 if stored is None else stored.gen)
        world = self._chief(world, i, chief)
        label = f"{spec.name}'s watch ends quiet: begins generation {gen}{note}"
        for after, text, violation in self.write(world, i, done=False):
            yield after, f"{label}; {text}", violation

    def reset_refuses(self, world: World, name: str, seen: int) -> bool:
        if not world.token:
            return False
        if self.flags.reset_token_equality:
            return world.token != seen
        # the old rule: the marker is a time; only one later than the begin counts
        return world.token > seen and name not in world.same_tick

    def write(self, world: World, i: int, *, done: bool) -> Iterator[Outcome]:
        flags, spec, chief = self.flags, self.scope.chiefs[i], world.chiefs[i]
        name, run_id, fence_i = spec.name, self.scope.run_id(spec.run), self.fence_of(i)
        what = f"{name} writes step {chief.step}" + (" as final (done)" if done else "")
        if self.reset_refuses(world, name, chief.reset_seen):
            yield self._chief(world, i, chief._replace(status="reset")), f"{what}: WAS_RESET", None
            return
        stored = world.stored
        # v2: the first write of a generation just begun (on its own clock), whose reply
        # it has not had: if it finds no state, it needs no probation
        first = not chief.acked and chief.since_begin < fence_i
        fence = (
            self.fence_only(world) if stored is None else stored.fence if flags.begin_fences else 0
        )
        newer = max(0 if stored is None else stored.gen, fence)
        if newer > chief.gen:
            # who supersedes it: the stored generation, or the begin that left the fence
            by = (
                stored.origin
                if stored is not None and newer == stored.gen
                else max((n for n, g in enumerate(world.gens, 1) if g.number == newer), default=0)
            )
            violation = None
            if by:
                info = world.gens[by - 1]
                if (
                    info.run != spec.run
                    and info.chief >= 0
                    and self.live_chief_of(world, spec.run)
                    and not self.excused(world, spec.run, by)
                ):
                    violation = Violation(
                        "runs kept apart",
                        f"{name} of run {spec.run}, live, is superseded by run {info.run}'s "
                        f"generation {newer}",
                    )
            superseded = self.learn(chief._replace(status="superseded"), i, newer)
            how = (
                "generation"
                if stored is not None and newer == stored.gen
                else "the fence of generation"
            )
            text = f"{what}: SUPERSEDED by {how} {newer}"
            yield self._chief(world, i, superseded), text, violation
            return
        violation = None
        note = ""
        made = stored is None or stored.gen < chief.gen
        on_probation = False
        if made:
            begun = self.fence_only(world) if stored is None else stored.begun
            if not flags.probation:
                on_probation = False
            elif flags.probation_unless_begun:
                on_probation = begun != chief.gen
            else:
                on_probation = stored is None and not first
            if stored is None:
                note = "; created it"
            else:
                note = f"; replaces generation {stored.gen}"
                other = self.live_chief_of(world, stored.run)
                if (
                    stored.run != spec.run
                    and not stored.pinned
                    and other is not None
                    and not self.excused(world, stored.run, chief.gid)
                ):
                    violation = Violation(
                        "runs kept apart",
                        f"{name} of run {spec.run} took the job over from {other} of run "
                        f"{stored.run}, which is live",
                    )
            if on_probation:
                note += " on probation"
            elif flags.probation_unless_begun:
                note += " (its begin on record: no probation)"
            elif stored is None and first:
                note += " (its generation's first write: no probation)"
            if stored is not None and stored.run != spec.run:
                world = world._replace(
                    chiefs=tuple(
                        c._replace(overtaken=True) if s.run == stored.run else c
                        for s, c in zip(self.scope.chiefs, world.chiefs, strict=True)
                    )
                )
            beat = self.made_beat(world, chief.gen)
            new = Stored(
                run_id,
                chief.gen,
                chief.step,
                done,
                beat,
                False,
                False,
                probation=beat if on_probation and flags.probation_in_redis else 0,
                origin=chief.gid,
            )
            world = world._replace(fenced=0)  # the write replaces the whole hash
        else:
            assert stored is not None
            new = stored._replace(
                step=max(stored.step, chief.step),
                done=stored.done or done,
                beat=stored.beat + 1,
                origin=chief.gid,
            )
            if new.probation and chief.serving == new.probation and chief.probation == 0:
                new = new._replace(probation=0)
                note = f"; served probation {chief.serving}: cleared"
        # the writer vouches out of probation as it knows it; Redis stores vouch=0 while
        # the state is on probation (v3), or in the call that created it (v2)
        vouch = chief.probation == 0 and not new.probation and not on_probation
        new = new._replace(vouch=vouch)
        # the chief as its reply leaves it
        answered = chief._replace(
            status="active",
            forgotten=False,
            since_write=0,
            wrote=True,
            acked=True,
            since_accepted=0,
            since_begin=fence_i,
        )
        answered = self.learn(answered, i, new.gen)
        if flags.probation_in_redis:
            if not new.probation:
                answered = answered._replace(serving=0, probation=0)
            elif new.probation != chief.serving:
                # a probation id it has not counted for: FENCE from this reply
                answered = answered._replace(serving=new.probation, probation=fence_i)
        elif on_probation:
            answered = answered._replace(probation=fence_i)
        if done and answered.probation:
            answered = answered._replace(final=True)  # waits its probation out, writes again
        elif done:
            answered = answered._replace(status="done", final=False)
        # the chief whose reply is lost: it knows nothing new, and retries at once
        unanswered = chief._replace(
            status="active",
            forgotten=False,
            wrote=True,
            since_accepted=0,
            since_write=self.heartbeat(i),
        )
        text = f"{what}: {new.describe()} accepted{note}"
        may_lose = world.budget.lose_replies > 0
        for after, heard, later in self.store(self._chief(world, i, answered), new):
            yield after, text + heard, _first(violation, later)
            if may_lose:
                lost = self._chief(after, i, unanswered)
                budget = lost.budget._replace(lose_replies=lost.budget.lose_replies - 1)
                yield (
                    lost._replace(budget=budget),
                    f"{text}{heard}; its reply to {name} is lost",
                    _first(violation, later),
                )

    # ------------------------------------------------------------ the contributor

    def contributor_events(self, world: World) -> Iterator[Outcome]:
        run = self.scope.contributor
        assert run is not None
        mine, stored = world.contributor, world.stored
        if (
            stored is None
            or stored.run_id != self.scope.run_id(run)
            or stored.done
            or stored.pinned
            or mine.status == "stopped"
            or mine.wrote
        ):
            return
        if self.flags.begin_fences and stored.fence > stored.gen:
            # a newer generation has begun and not written yet
            if mine.status == "idle":
                return  # NOTHING_TO_JOIN: it joins the new one after its first write
            text = (
                f"the contributor finds the fence of generation {stored.fence} above its "
                f"generation {mine.gen}: stops"
            )
            yield world._replace(contributor=mine._replace(status="stopped")), text, None
            return
        if mine.status == "idle":
            step = self.handed(world, stored.origin)
            joined = mine._replace(status="joined", gen=stored.gen, gid=stored.origin, step=step)
            text = f"the contributor joins generation {stored.gen} at step {step}"
            yield world._replace(contributor=joined), text, None
            return
        if stored.gen != mine.gen:
            if self.flags.contributor_pins_generation:
                text = f"the contributor finds generation {stored.gen}, not its {mine.gen}: stops"
                yield world._replace(contributor=mine._replace(status="stopped")), text, None
                return
            mine = mine._replace(gen=stored.gen)  # rejoins: the defect
        new = stored._replace(step=max(stored.step, mine.step), beat=stored.beat + 1)
        if not self.flags.contributor_keeps_probation:
            new = new._replace(vouch=True, probation=0)
        new = new._replace(origin=mine.gid)
        world = world._replace(contributor=mine._replace(wrote=True))
        text = f"the contributor writes step {mine.step}: {new.describe()} accepted"
        for after, heard, violation in self.store(world, new):
            yield after, text + heard, violation

    # ------------------------------------------------------------ Redis: store, announce

    def store(self, world: World, state: Stored) -> Iterator[Outcome]:
        """The write of ``state`` (truth filled in) and its announcement to every waiter."""
        state = state._replace(
            age=0,
            run=world.gens[state.origin - 1].run,
            legit=self.legit(world, state.origin, state.step),
            witnesses=frozenset(j for j, w in enumerate(world.waiters) if waiting(w)),
        )
        yield from self.announce(world._replace(stored=state), state)

    def made_beat(self, world: World, gen: int) -> int:
        """The beat a write that (re)makes the state of ``gen`` stores: the Redis clock, in
        the code TIME in microseconds (- 1, + the write's 1), above every beat stored before
        (a write takes a microsecond at least). Only the order of a generation's beats
        decides anything (marks compare the generation first; a probation id is compared
        for equality), so the model takes the least value above every beat of ``gen`` that
        anyone still holds: a state, the replica's, an announcement in an inbox, a waiter's,
        a watch's or a chief's probation id."""
        if not self.flags.beat_from_clock:
            return 1
        return max((beat for of, beat in self.marks(world) if of == gen), default=0) + 1

    def marks(self, world: World) -> Iterator[Mark]:
        """Every ``(generation, beat)`` held anywhere: what a decision can compare."""
        for state in (world.stored, world.replica):
            if state is not None:
                yield mark(state)
                if state.probation:
                    yield (state.gen, state.probation)
        for waiter in world.waiters:
            for m in (waiter.prev_read, waiter.live_mark, waiter.grace_mark):
                if m is not None:
                    yield m
            yield from (mark(m) for m in waiter.inbox if m is not None)
        for chief in world.chiefs:
            if chief.watch_mark is not None:
                yield chief.watch_mark
            if chief.serving:
                yield (chief.gen, chief.serving)

    def announce(self, world: World, message: Msg) -> Iterator[Outcome]:
        outcomes: list[Outcome] = [(world, "", None)]
        for j in range(len(self.scope.waiters)):
            outcomes = [
                (after, text + more, _first(violation, later))
                for before, text, violation in outcomes
                for after, more, later in self.hear(before, j, message)
            ]
        yield from outcomes

    def hear(self, world: World, j: int, message: Msg) -> Iterator[Outcome]:
        """Waiter ``j`` and one announcement: handled now, buffered, lost or late."""
        waiter, name = world.waiters[j], self.scope.waiters[j].name
        if not waiting(waiter) or waiter.paused:
            yield world, "", None
            return
        if waiter.phase == "subscribed" or waiter.inbox:
            inbox = (*waiter.inbox, message)[-self.scope.inbox :]
            yield self._waiter(world, j, waiter._replace(inbox=inbox)), "", None
            return
        after, text, violation = self.handle(world, j, message)
        yield after, f"; {text}", violation
        budget = world.budget
        if budget.lose_announcements:
            lost = world._replace(
                budget=budget._replace(lose_announcements=budget.lose_announcements - 1)
            )
            yield lost, f"; its announcement to {name} is lost", None
        if budget.late_announcements:
            late = self._waiter(world, j, waiter._replace(inbox=(message,)))
            late = late._replace(
                budget=budget._replace(late_announcements=budget.late_announcements - 1)
            )
            yield late, f"; its announcement to {name} is late", None

    # ------------------------------------------------------------ waiters

    def _waiter(self, world: World, j: int, waiter: Waiter) -> World:
        return world._replace(waiters=_put(world.waiters, j, waiter))

    def waiter_environment(self, world: World, j: int) -> Iterator[Outcome]:
        spec, waiter = self.scope.waiters[j], world.waiters[j]
        name = spec.name
        if waiter.phase == "idle":
            if (
                spec.after_done is not None
                and world.chiefs[self.chief_index[spec.after_done]].status != "done"
            ):
                return
            started = waiter._replace(phase="subscribed", since_read=self.scope.fallback)
            text = f"{name} (target {spec.target}) starts waiting: subscribes (confirmed)"
            yield self._waiter(world, j, started), text, None
            return
        if not waiting(waiter):
            return
        if waiter.paused:
            back = waiter._replace(paused=False, since_read=self.scope.fallback)
            yield self._waiter(world, j, back), f"{name} reconnects and subscribes again", None
            return
        budget = world.budget
        if spec.may_pause and budget.pauses:
            cut = self._waiter(world, j, waiter._replace(paused=True, inbox=()))
            cut = cut._replace(budget=budget._replace(pauses=budget.pauses - 1))
            yield cut, f"{name} is cut off from Redis", None

    def waiter_actions(self, world: World, j: int) -> Iterator[Outcome]:
        waiter = world.waiters[j]
        if not waiting(waiter) or waiter.paused:
            return
        if waiter.since_read >= self.scope.fallback:
            yield self.read(world, j)
        if waiter.phase == "waiting" and waiter.inbox:
            message, rest = waiter.inbox[0], waiter.inbox[1:]
            yield self.handle(self._waiter(world, j, waiter._replace(inbox=rest)), j, message)

    def read(self, world: World, j: int, *, scheduled: bool = True) -> Outcome:
        """A read of the state and the reset token (one call), and what it decides.

        ``scheduled``: the first read, or a fallback read (the next one is due a fallback
        interval later); a read an announcement asked for leaves that schedule alone.
        """
        spec, waiter, stored = self.scope.waiters[j], world.waiters[j], world.stored
        shown = "no state" if stored is None else stored.describe()
        if world.fenced:
            shown += f" (a hash with only the fence of generation {world.fenced})"
        text = f"{spec.name} reads {shown}, reset token {world.token or 'none'}"
        first = waiter.phase == "subscribed"
        if scheduled or first:
            waiter = waiter._replace(since_read=0)
        if first:
            waiter = waiter._replace(
                phase="waiting",
                baseline=world.token,
                first_read_this_tick=self.same_ms,
                done_at_start=stored.gen if stored is not None and stored.done else 0,
            )
            text += " (its first read)"
        elif self.token_aborts(world, spec.name, waiter.baseline):
            return self.end(self._waiter(world, j, waiter), j, "reset", None, text)
        world = self._waiter(world, j, waiter)
        violation = None
        if stored is not None:
            world, text, violation = self.consider(world, j, stored, "read", first, text)
        elif waiter.grace_mark is not None:
            world = self._waiter(world, j, waiter._replace(grace_mark=None, grace_for=0))
        # what it buffered before its first read, in order
        while first and waiting(world.waiters[j]) and world.waiters[j].inbox:
            waiter = world.waiters[j]
            message, rest = waiter.inbox[0], waiter.inbox[1:]
            world, more, later = self.handle(
                self._waiter(world, j, waiter._replace(inbox=rest)), j, message
            )
            text, violation = f"{text}; then {more}", _first(violation, later)
        return world, text, violation

    def token_aborts(self, world: World, name: str, baseline: int) -> bool:
        if not world.token:
            return False
        if self.flags.reset_token_equality:
            return world.token != baseline
        return world.token > baseline and name not in world.same_tick

    def handle(self, world: World, j: int, message: Msg) -> Outcome:
        """Waiter ``j`` handles one announcement (already taken off its inbox)."""
        spec, waiter = self.scope.waiters[j], world.waiters[j]
        if message is None:
            if self.flags.announcement_is_hint_for_reset:
                world, text, violation = self.read(world, j, scheduled=False)
                return world, f"{spec.name} hears a reset, so {text}", violation
            return self.end(world, j, "reset", None, f"{spec.name} hears a reset")
        if message.run == spec.run and (message.done or message.pinned):
            world = self._waiter(world, j, waiter._replace(heard_final=True))
        text = f"{spec.name} hears {message.describe()}"
        return self.consider(world, j, message, "announcement", False, text)

    def consider(
        self, world: World, j: int, state: Stored, via: str, first: bool, text: str
    ) -> Outcome:
        """What a read or an announcement of ``state`` does to waiter ``j``: the code's
        ``WaitRules.on_snapshot`` and ``on_announcement``, then ``_judge``."""
        flags, spec, waiter = self.flags, self.scope.waiters[j], world.waiters[j]
        run_id = self.scope.run_id(spec.run)
        if state.run_id != run_id or state.gen < waiter.max_gen:
            if via == "read" and waiter.grace_mark is not None:
                world = self._waiter(world, j, waiter._replace(grace_mark=None, grace_for=0))
            return world, text, None  # another run's, or older than what it read
        key = mark(state)
        live_mark = waiter.live_mark

        def observed(write: Mark) -> Mark:
            # the newest write it knows happened during its wait: it only grows
            return write if live_mark is None or write > live_mark else live_mark

        if via == "announcement":
            live_mark = observed(key)
            if state.gen > waiter.max_gen:
                # a generation it has not read yet: the read decides
                world = self._waiter(world, j, waiter._replace(live_mark=live_mark))
                world, more, violation = self.read(world, j, scheduled=False)
                return world, f"{text}, so {more}", violation
            live = True  # heard on its confirmed subscription: written during the wait
        else:
            if waiter.prev_read is not None and key > waiter.prev_read:
                live_mark = observed(key)  # a write came between two of its reads
            elif first and (
                not flags.observed_write_required
                or (not flags.no_clock_comparison and state.age <= self.scope.fresh_window)
            ):
                live_mark = observed(key)  # the defects: a first read taken for an observation
            waiter = waiter._replace(prev_read=key, max_gen=state.gen)
            live = live_mark is not None and key >= live_mark
        own = run_id != "" and state.run_id == run_id
        graced = False
        if via == "read" and flags.grace:
            # the grace: an unobserved final fact of its run, read unchanged for GRACE with
            # no newer begin on record
            final = (state.done and state.vouch) or (state.pinned and not state.done)
            if not final or live or own:
                waiter = waiter._replace(grace_mark=None, grace_for=0)
            elif max(state.begun, state.fence) > state.gen:
                waiter = waiter._replace(grace_mark=None, grace_for=0)
                text += " (a newer begin is on record: no grace)"
            elif waiter.grace_mark == key:
                graced = waiter.grace_for >= self.grace
                if graced:
                    text += f" (unchanged for {self.grace} ticks: trusted)"
            else:
                waiter = waiter._replace(grace_mark=key, grace_for=0)
        waiter = waiter._replace(live_mark=live_mark)
        world = self._waiter(world, j, waiter)
        if flags.done_needs_observation_or_run_id:
            final_trusted = live or own or graced
        else:
            final_trusted = own or state.gen != waiter.done_at_start or graced
        if state.step >= spec.target:
            if state.pinned and not state.done:
                released = live or own or graced  # an operator's pin: a final fact of its run
            elif state.done:
                released = final_trusted and state.vouch
            else:
                released = state.vouch and live
            if released:
                return self.end(world, j, "released", state, text)
        elif state.done and final_trusted and (state.vouch or not flags.abort_needs_vouch):
            # a zombie's final write on probation (vouch=0) aborts nobody
            return self.end(world, j, "done", state, text)
        return world, text, None

    def end(self, world: World, j: int, how: str, state: Stored | None, text: str) -> Outcome:
        if how == "released":
            assert state is not None
            violation = self.check_release(world, j, state)
            text = f"{text}: RELEASED at step {state.step}"
            phase = "released"
        else:
            violation = self.check_abort(world, j, how, state)
            text = f"{text}: ABORTED ({how})"
            phase = "aborted"
        waiter = world.waiters[j]._replace(
            phase=phase, inbox=(), owed=0, grace_mark=None, grace_for=0
        )
        return self._waiter(world, j, waiter), text, violation

    # ------------------------------------------------------------ operators

    def publish(self, world: World) -> Iterator[Outcome]:
        budget = world.budget
        operator = self.scope.operator
        if operator is not None and budget.publishes:
            gen = self.number(world, 0)
            if gen > self.max_number:
                return
            world = world._replace(
                gens=(*world.gens, Gen(operator.run, -1, operator.step, False, gen)),
                budget=budget._replace(publishes=0),
                clock=self.inc(world.clock),
            )
            new = Stored(
                self.scope.run_id(operator.run),
                gen,
                operator.step,
                False,
                self.made_beat(world, gen),
                True,
                self.flags.operator_pin,
                origin=len(world.gens),
            )
            world = world._replace(fenced=0)
            text = f"an operator publishes step {operator.step}: {new.describe()}"
            for after, heard, violation in self.store(world, new):
                yield after._replace(quiet=False), text + heard, violation

    def reset(self, world: World) -> Iterator[Outcome]:
        same = frozenset(
            [
                s.name
                for s, c in zip(self.scope.chiefs, world.chiefs, strict=True)
                if c.began_this_tick
            ]
            + [
                s.name
                for s, w in zip(self.scope.waiters, world.waiters, strict=True)
                if w.first_read_this_tick
            ]
        )
        world = world._replace(
            stored=None,
            fenced=0,
            token=world.next_token,
            next_token=world.next_token + 1,
            same_tick=same,
            gens=tuple(gen._replace(reset_ended=True) for gen in world.gens),
            budget=world.budget._replace(resets=world.budget.resets - 1),
            waiters=tuple(
                w._replace(reset_during=True) if w.phase == "waiting" else w for w in world.waiters
            ),
        )
        text = f"an operator resets the job (token {world.token})"
        for after, heard, violation in self.announce(world, None):
            yield after, text + heard, violation

    # ------------------------------------------------------------ faults

    def fault_events(self, world: World) -> Iterator[Outcome]:
        budget = world.budget
        restart = tuple(w._replace(owed=0) for w in world.waiters)  # the bound starts again
        if budget.lose_state and (world.stored is not None or world.fenced):
            what = "the state" if world.stored is not None else "the fence-only hash"
            lost = world._replace(
                chiefs=self.forget(world),
                stored=None,
                fenced=0,
                budget=budget._replace(lose_state=budget.lose_state - 1),
                waiters=restart,
            )
            yield lost, f"Redis loses {what} (restarted empty, evicted, expired)", None
        if budget.lose_token and world.token:
            lost = world._replace(token=0, budget=budget._replace(lose_token=budget.lose_token - 1))
            yield lost, "Redis loses the reset token", None
        if budget.failovers and (world.replica, world.replica_fenced) != (
            world.stored,
            world.fenced,
        ):
            caught_up = world._replace(replica=world.stored, replica_fenced=world.fenced)
            yield caught_up, "the replica catches up", None
            back = world._replace(
                stored=world.replica,
                fenced=world.replica_fenced,
                budget=budget._replace(failovers=budget.failovers - 1),
                waiters=restart,
            )
            yield back, "Redis fails over to its lagging replica", None
        after = self.scope.clock_back_after
        if (
            budget.clock_back
            and world.gens
            and (after is None or world.chiefs[self.chief_index[after]].status != "idle")
        ):
            back = world._replace(
                chiefs=self.forget(world),
                stored=None,
                fenced=0,
                clock=1,
                budget=budget._replace(clock_back=budget.clock_back - 1),
                waiters=restart,
            )
            yield back, "Redis fails over to an empty server whose clock is behind", None

    def forget(self, world: World) -> tuple[Chief, ...]:
        """Truth, for ``Scope.excuse``: Redis lost every chief's state."""
        if not self.scope.excuse:
            return world.chiefs
        return tuple(c._replace(forgotten=c.status == "active") for c in world.chiefs)


def waiting(waiter: Waiter) -> bool:
    return waiter.phase in ("subscribed", "waiting")


def mark(state: Stored) -> Mark:
    return (state.gen, state.beat)


# ---------------------------------------------------------------- exploration


def explore(
    flags: Flags | None = None, scope: Scope | None = None, *, limit: int = 3_000_000
) -> Result:
    """Every state reachable in ``scope`` under ``flags``, breadth first.

    Stops at the first violation, which is then one of the shortest (in events);
    its trace lists the events from the initial state. Each state keeps only its
    parent: a trace's labels are found again from the parents when one is needed.
    """
    model = Model(flags or Flags(), scope or ZOMBIE)
    start = model.initial()
    parent: dict[World, World | None] = {start: None}
    queue: deque[World] = deque([start])
    worst = stuck = 0
    while queue:
        world = queue.popleft()
        if model.due(world) and next(model.actions(world), None) is None:
            stuck += 1
        for label, after, violation in model.successors(world):
            if violation is not None:
                found = violation._replace(trace=(*trace(model, parent, world), label))
                return Result(len(parent), found, worst, stuck)
            if after in parent:
                continue
            parent[after] = world
            if after.waiters:
                worst = max(worst, *(w.owed for w in after.waiters))
            queue.append(after)
        if len(parent) > limit:
            raise RuntimeError(f"more than {limit} states in scope {model.scope.name}")
    return Result(len(parent), None, worst, stuck)


def trace(model: Model, parent: dict[World, World | None], world: World) -> tuple[str, ...]:
    """The labels of the events from the initial state to ``world``."""
    path = [world]
    while (before := parent[path[-1]]) is not None:
        path.append(before)
    path.reverse()
    return tuple(
        next(label for label, after, _ in model.successors(before) if after == world)
        for before, world in itertools.pairwise(path)
    )


# ---------------------------------------------------------------- scopes

ZOMBIE = Scope(
    name="zombie",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True),
        ChiefSpec("A2", "A", 1, 2, after="A1"),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    lose_state=1,
    pauses=1,
)
"""Run A: A1 (at step 2) pauses and comes back a zombie; A2, the newest generation,
restarts from a checkpoint at step 1; Redis forgets once."""

DEAD = Scope(
    name="dead",
    chiefs=(
        ChiefSpec("A1", "A", 1, 2, may_crash=True),
        ChiefSpec("A2", "A", 1, 2, after="A1"),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    late_announcements=1,
)
"""A1 crashes at any moment; A2 restarts from a checkpoint; an announcement is late."""

CONTRIBUTOR = Scope(
    name="contributor",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_crash=True, may_pause=True),
        ChiefSpec("A2", "A", 1, 1, after="A1"),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    contributor="A",
    pauses=1,
    max_ticks=4,
)
"""A contributor joins A1's generation at step 2; A1 crashes or pauses; A2 restarts
from a checkpoint at step 1."""

CONTRIBUTOR_FORGETS = CONTRIBUTOR._replace(
    name="contributor-forgets",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True),
        ChiefSpec("A2", "A", 1, 1, after="A1"),
    ),
    lose_state=1,
    max_ticks=3,
)
"""As CONTRIBUTOR, and Redis forgets once while A1 is paused."""

RUNS = Scope(
    name="runs",
    chiefs=(
        ChiefSpec("A1", "A", 1, 2, may_pause=True, may_finish=True),
        ChiefSpec("B1", "B", 1, 2, after="A1"),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    pauses=1,
    max_ticks=5,
)
"""Two runs overlap: A without a run id, B with one; A1 may pause or finish."""

DONE = Scope(
    name="done",
    chiefs=(ChiefSpec("A1", "A", 1, 2, may_finish=True),),
    waiters=(WaiterSpec("W1", "A", 2), WaiterSpec("W2", "A", 3)),
    max_ticks=8,
)
"""Run A (no run id) finishes at step 2: W1 (target 2) must be released, W2 (3) aborted,
whenever they arrive (after the finish, by the grace)."""

RESET = Scope(
    name="reset",
    chiefs=(ChiefSpec("B1", "B", 1, 2),),
    waiters=(WaiterSpec("W1", "B", 2), WaiterSpec("W2", "B", 1)),
    resets=1,
    max_ticks=5,
)
"""A reset at any moment of run B's job."""

PUBLISH = Scope(
    name="publish",
    chiefs=(ChiefSpec("B1", "B", 1, 1, may_crash=True),),
    waiters=(WaiterSpec("W1", "B", 1), WaiterSpec("W2", "B", 2)),
    operator=OperatorSpec("B", 1),
    max_ticks=7,
)
"""An operator publishes step 1 for run B (a run id); its chief may have crashed."""

PIN_WITHOUT_RUN_ID = PUBLISH._replace(
    name="pin-without-run-id",
    chiefs=(ChiefSpec("A1", "A", 1, 1, may_crash=True),),
    waiters=(WaiterSpec("W1", "A", 1), WaiterSpec("W2", "A", 1)),
    operator=OperatorSpec("A", 1),
)
"""An operator publishes step 1 for run A (no run id): a waiter that arrives after the pin
is released by the grace (v2's limit ``pin-without-run-id``, now a promise)."""

LIVENESS = Scope(
    name="liveness",
    chiefs=(ChiefSpec("B1", "B", 1, 2, may_finish=True),),
    waiters=(WaiterSpec("W1", "B", 2, may_pause=True),),
    lose_state=1,
    lose_announcements=1,
    pauses=1,
    max_ticks=6,
)
"""One chief and one waiter, and the faults that only delay: Redis forgets, an
announcement is lost, the waiter is cut off."""

LIVENESS_SHARP = LIVENESS._replace(name="liveness-sharp", lose_announcements=2, pauses=0)
"""As LIVENESS, with two announcements lost (in a row: only then does a waiter need its
fallback read) and no cut-off: the worst wait meets the bound exactly."""

BEGIN = ZOMBIE._replace(name="begin", split_begin=True, max_ticks=5)
"""As ZOMBIE, but a begin and its first write are two calls: A1 may write between A2's,
and Redis may forget the state (and the fence) between them."""

BEGIN_PAUSED = BEGIN._replace(name="begin-paused", pause_after_begin=True, max_ticks=4)
"""As BEGIN, and A1 may pause between its begin (on no state: the job is new) and its first
write, while A2 begins, writes, and Redis forgets (v2's limit
``paused-first-write-after-redis-forgot``: A1's first write now finds no ``begun`` of its
own and is on probation)."""

RUNS_SPLIT = RUNS._replace(name="runs-split", split_begin=True)
"""As RUNS, but a begin and its first write are two calls: B1 may begin on no state while
A1, begun on no state too, has not written yet."""

BEAT = Scope(
    name="beat",
    chiefs=(ChiefSpec("B1", "B", 2, 2),),
    waiters=(WaiterSpec("W1", "B", 2),),
    lose_state=1,
    lose_announcements=3,
    max_ticks=9,
)
"""One chief of run B at step 2 and one waiter; Redis forgets once, and up to three
announcements are lost (a subscription that silently died): only reads release."""

FINAL = ZOMBIE._replace(
    name="final",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True, may_finish=True),
        ChiefSpec("A2", "A", 1, 3, after="A1"),
    ),
    waiters=(WaiterSpec("W1", "A", 3),),
    max_ticks=5,
)
"""As ZOMBIE (over five ticks), but A1 may finish: its final write may be the one that
recreates the state Redis lost, after A2 superseded it; W1 waits for step 3, above it."""

TWO_ZOMBIES = Scope(
    name="two-zombies",
    chiefs=(
        ChiefSpec("A1", "A", 1, 1, may_pause=True),
        ChiefSpec("A2", "A", 2, 2, after="A1", may_pause=True),
        ChiefSpec("A3", "A", 1, 1, after="A2", restarts=True),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    lose_state=1,
    pauses=2,
    max_ticks=4,
)
"""Three generations of run A: A1 and A2 pause and come back zombies after Redis forgot A3's
state; A2's write replaces A1's (a lower generation) at step 2, while A3, the newest, is at
step 1 (issue 32, case 5). A3 begins as A2 pauses (a supervisor's restart), so that the
newest generation is never cut off (the limit ``newest-cut-off``)."""

LOST_REPLY = ZOMBIE._replace(name="lost-reply", lose_replies=1, max_ticks=4)
"""As ZOMBIE, and a chief's write may be applied with its reply lost (issue 32, case 4)."""

FENCE_HEARTBEAT = Scope(
    name="fence-heartbeat",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True),
        ChiefSpec("A2", "A", 1, 2, after="A1", heartbeat=3),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    lose_state=1,
    pauses=1,
    max_ticks=6,
    bound=7,
)
"""As ZOMBIE, but A2, the newest, is configured with a heartbeat of three ticks, A1 with one
(issue 32, case 8: a zombie with a 0.2 s heartbeat, a newest chief with a 4 s one)."""

CLOCK = Scope(
    name="clock",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True),
        ChiefSpec("A2", "A", 1, 1, after="A1", process="P"),
        ChiefSpec("A3", "A", 1, 2, after="A2", process="P"),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    clock_back=1,
    clock_back_after="A2",
    pauses=1,
    max_ticks=4,
)
"""A1 pauses (a zombie); A2 and then A3 are two sessions of one process P; Redis fails over
to an empty server whose clock is behind, between A2's begin and A3's (issue 32, case 6):
A3's number must stay above A1's, which P saw."""

NUMBERS = ZOMBIE._replace(name="numbers", lose_state=0, top=8, initial_fence=8)
"""As ZOMBIE without a loss, on a job whose key holds a fence of ``2**53`` (the model's top,
8), left by a broken or hostile client (issue 32, case 7)."""

LATE = Scope(
    name="late",
    chiefs=(ChiefSpec("A1", "A", 1, 2, may_finish=True),),
    waiters=(
        WaiterSpec("W1", "A", 2, after_done="A1", may_pause=True),
        WaiterSpec("W2", "A", 3, after_done="A1"),
    ),
    lose_announcements=1,
    pauses=1,
    max_ticks=8,
)
"""Run A (no run id) finishes at step 2; W1 (target 2) and W2 (3) are late workers that
start waiting after it finished: released and aborted by the grace."""

LATE_RUN_ID = LATE._replace(
    name="late-run-id",
    chiefs=(ChiefSpec("B1", "B", 1, 2, may_finish=True),),
    waiters=(
        WaiterSpec("W1", "B", 2, after_done="B1", may_pause=True),
        WaiterSpec("W2", "B", 3, after_done="B1"),
    ),
)
"""As LATE, for run B, which has a run id: the late workers trust the finished state by it."""

RERUN = Scope(
    name="rerun",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_finish=True),
        ChiefSpec("C1", "C", 2, 2, after_done="A1", after_waiter="WC", begin_within=1),
    ),
    waiters=(WaiterSpec("WC", "C", 2, after_done="A1"),),
    run_ids=(("A", ""), ("C", "")),
    lose_announcements=1,
    lose_replies=1,
    max_ticks=7,
)
"""Run A (no run id) finishes at step 2; a rerun C of the job (no run id either) starts: its
worker WC first, its chief C1 within a tick (shorter than the grace) of WC's start, on A's
finished state."""

SCOPES = (
    ZOMBIE,
    DEAD,
    CONTRIBUTOR,
    CONTRIBUTOR_FORGETS,
    RUNS,
    DONE,
    RESET,
    PUBLISH,
    PIN_WITHOUT_RUN_ID,
    LIVENESS,
    BEGIN,
    BEGIN_PAUSED,
    RUNS_SPLIT,
    BEAT,
    FINAL,
    TWO_ZOMBIES,
    LOST_REPLY,
    FENCE_HEARTBEAT,
    CLOCK,
    NUMBERS,
    LATE,
    LATE_RUN_ID,
    RERUN,
)
"""The bounded scopes (CI: tests/model)."""

# the large scopes (``make model``: python -m tests.model.explore --large)

LARGE_GENERATIONS = Scope(
    name="large-generations",
    chiefs=(
        ChiefSpec("A1", "A", 1, 1, may_pause=True),
        ChiefSpec("A2", "A", 2, 2, after="A1", may_pause=True),
        ChiefSpec("A3", "A", 1, 2, after="A2", restarts=True),
        ChiefSpec("B1", "B", 1, 1, after="A1"),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    lose_state=1,
    lose_replies=1,
    pauses=2,
    max_ticks=4,
    excuse=("runs-while-redis-forgot",),
)
"""Three chief generations of run A (two of them may come back zombies; A3 begins as A2
pauses) beside run B's chief; Redis forgets once, a reply is lost (a take-over
between the runs while Redis has lost the live one's state is the limit
``runs-while-redis-forgot``, not counted)."""

LARGE_SPLIT = Scope(
    name="large-split",
    chiefs=(
        ChiefSpec("A1", "A", 1, 1, may_pause=True),
        ChiefSpec("A2", "A", 2, 2, after="A1", may_pause=True),
        ChiefSpec("A3", "A", 1, 2, after="A2", restarts=True),
    ),
    waiters=(WaiterSpec("W1", "A", 2),),
    lose_state=2,
    lose_replies=1,
    pauses=2,
    split_begin=True,
    pause_after_begin=True,
    max_ticks=3,
)
"""Three generations of run A with their begins apart from their first writes (pauses between
them), Redis forgetting the state or the fence twice, a reply lost."""

LARGE_REPLIES = ZOMBIE._replace(
    name="large-replies",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True, may_finish=True),
        ChiefSpec("A2", "A", 1, 3, after="A1"),
    ),
    waiters=(WaiterSpec("W1", "A", 3),),
    lose_state=2,
    lose_replies=2,
    max_ticks=4,
)
"""A zombie that may finish and the newest generation; Redis forgets twice, two replies are
lost."""

LARGE_CLOCK = CLOCK._replace(
    name="large-clock",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True),
        ChiefSpec("A2", "A", 1, 1, after="A1", process="P", may_pause=True),
        ChiefSpec("A3", "A", 1, 2, after="A2", process="P", restarts=True),
    ),
    lose_state=1,
    lose_replies=1,
    pauses=2,
    max_ticks=4,
)
"""CLOCK with both older sessions possibly zombies, a loss and a lost reply."""

LARGE_CONTRIBUTOR = CONTRIBUTOR._replace(
    name="large-contributor",
    chiefs=(
        ChiefSpec("A1", "A", 2, 2, may_pause=True),
        ChiefSpec("A2", "A", 1, 2, after="A1", may_pause=True),
        ChiefSpec("A3", "A", 1, 1, after="A2", restarts=True),
    ),
    lose_state=1,
    lose_replies=1,
    pauses=2,
    max_ticks=3,
)
"""Three generations of run A and a contributor; Redis forgets, a reply is lost."""

LARGE_FINAL = Scope(
    name="large-final",
    chiefs=(
        ChiefSpec("A1", "A", 1, 2, may_finish=True, may_pause=True),
        ChiefSpec("C1", "C", 2, 2, after_done="A1"),
    ),
    waiters=(
        WaiterSpec("W1", "A", 2, may_pause=True),
        WaiterSpec("W2", "A", 3, after_done="A1"),
        WaiterSpec("WC", "C", 2, after_done="A1"),
    ),
    run_ids=(("A", ""), ("C", "c")),
    operator=OperatorSpec("A", 2),
    lose_announcements=1,
    lose_replies=1,
    pauses=1,
    max_ticks=5,
)
"""Finished states and pins without a run id: run A (none) finishes or an operator pins its
step, workers of it arrive late; a rerun C (with a run id) takes the finished state over."""

LARGE_RERUN = RERUN._replace(
    name="large-rerun",
    waiters=(WaiterSpec("WC", "C", 2, after_done="A1", may_pause=True),),
    pauses=1,
    lose_state=1,
    lose_announcements=2,
    lose_replies=2,
    max_ticks=10,
)
"""RERUN (no run ids, C's chief beginning within the grace) over more ticks and faults, a
loss of the finished state included."""

LARGE_SCOPES = (
    LARGE_GENERATIONS,
    LARGE_SPLIT,
    LARGE_REPLIES,
    LARGE_CLOCK,
    LARGE_CONTRIBUTOR,
    LARGE_FINAL,
    LARGE_RERUN,
)
"""The large scopes (``make model``), beyond CI's time."""


# ---------------------------------------------------------------- what each fix rules out


class Fix(NamedTuple):
    flag: str
    defect: int | None
    """The number of the defect in the review of issue 21 (None: not one of its list)."""
    what: str
    """The defect, as the review (or issue 32) put it."""
    scope: Scope
    """Where turning the flag off shows the defect."""
    invariant: str
    """The invariant its counterexample breaks."""
    case: int | None = None
    """The case of issue 32 (protocol v3) it answers (None: not one)."""


FIXES = (
    Fix(
        "contributor_pins_generation",
        1,
        "an old run's contributor adopts a new chief's generation and pushes its old step",
        CONTRIBUTOR,
        "never early",
    ),
    Fix(
        "probation",
        2,
        "a zombie's write after Redis restarted empty is accepted",
        ZOMBIE,
        "never early",
    ),
    Fix(
        "observed_write_required",
        4,
        "a dead chief's stale state releases a newcomer (the confirmation window)",
        DEAD,
        "never early",
    ),
    Fix(
        "no_clock_comparison",
        5,
        "a stored timestamp counts as fresh by a clock comparison (one in the future, always)",
        DEAD,
        "never early",
    ),
    Fix(
        "done_needs_observation_or_run_id",
        6,
        "a worker that subscribed before the chief's done but read after distrusts it (lost)",
        DONE,
        "never lost",
    ),
    Fix(
        "runs_kept_apart",
        10,
        "a second run silently supersedes a live one",
        RUNS,
        "runs kept apart",
    ),
    Fix(
        "operator_pin",
        11,
        "an operator's publish releases only the waiters arriving within 5 s",
        PUBLISH,
        "never lost",
    ),
    Fix(
        "reset_token_equality",
        12,
        "a reset in the same millisecond as a chief's begin is not seen",
        RESET,
        "never early",
    ),
    Fix(
        "announcement_is_hint_for_reset",
        None,
        "the note's rule 8: a reset announcement (late, or of a reset before the wait's "
        "first read) aborts a wait by itself",
        RESET,
        "aborted only for real",
    ),
    Fix(
        "contributor_keeps_probation",
        None,
        "found by this model (v2): a contributor's vouching write ends the probation of a "
        "zombie that recreated the state",
        CONTRIBUTOR_FORGETS,
        "never early",
    ),
    Fix(
        "begin_fences",
        None,
        "found by this model (v2): between a new chief's begin_generation and its first write "
        "(two calls) the generation before it still writes, and releases",
        BEGIN,
        "never early",
    ),
    Fix(
        "begin_fences_empty_job",
        None,
        "found by this model (v2): a chief begins its generation on no state and has not "
        "written yet when another run's chief begins on no state too, with nothing to fence; "
        "the first chief's first write makes the state, and the other run's first write then "
        "takes the job over from it, live (with the fence-only hash the first chief's write "
        "is SUPERSEDED before it wrote anything; in v3 a paused first write of the same run "
        "is on probation, without its begin on record, so the fence no longer decides never "
        "early there)",
        RUNS_SPLIT,
        "runs kept apart",
    ),
    Fix(
        "beat_from_clock",
        None,
        "found by this model (v2): Redis loses the state and the live generation recreates "
        "it, its beat starting again at 1, below the wait's live_mark: with its announcements "
        "lost, reads release only once the beat passes it, later than the bound",
        BEAT,
        "never lost",
    ),
    Fix(
        "abort_needs_vouch",
        None,
        "found by this model (v2): a zombie's final write recreates the state Redis lost, "
        "done on probation (vouch=0), and aborts a wait above its step that saw it happen "
        "though the newest generation is live",
        FINAL,
        "aborted only for real",
    ),
    Fix(
        "fence_job_wide",
        None,
        "FENCE from each process's heartbeat: a zombie with a short heartbeat counts a short "
        "probation, shorter than the newest chief's long heartbeat, and its recreated state "
        "vouches before the newest chief writes again",
        FENCE_HEARTBEAT,
        "never early",
        case=8,
    ),
    Fix(
        "probation_unless_begun",
        None,
        "two zombies after Redis forgot: zombie 1 recreates the state on probation, zombie 2 "
        "(a higher generation) replaces it without probation (a lower generation replaced) and "
        "releases a wait at its step while the newest chief is lower",
        TWO_ZOMBIES,
        "never early",
        case=5,
    ),
    Fix(
        "probation_in_redis",
        None,
        "a lost reply skips probation: a zombie's write recreates the state on probation, its "
        "reply (created=1) is lost, it retries and its retry, the same generation's, vouches",
        LOST_REPLY,
        "never early",
        case=4,
    ),
    Fix(
        "generation_floor",
        None,
        "after a failover to an empty Redis whose clock is behind, a process's new session is "
        "numbered by that clock, at or below a zombie generation it saw: the zombie's writes "
        "count as the newest's (or supersede it)",
        CLOCK,
        "never early",
        case=6,
    ),
    Fix(
        "numbers_bounded",
        None,
        "2**53: a fence of 2**53 (stored by a broken client) is valid, and a begin's fence + 1 "
        "is 2**53 again in Lua doubles: two generations share the number, and the older one's "
        "step counts as the newest's",
        NUMBERS,
        "never early",
        case=7,
    ),
    Fix(
        "grace",
        None,
        "without the grace, a late worker after the job finished (no run id) never trusts the "
        "finished state it did not see written, and waits for ever",
        LATE,
        "never lost",
    ),
)
"""Every flag, the defect it rules out, and the scope that shows it."""


class Limit(NamedTuple):
    name: str
    what: str
    scope: Scope
    invariant: str


LIMITS = (
    Limit(
        "newest-cut-off",
        "Redis loses the state and the newest generation cannot write for FENCE while a "
        "zombie can: the zombie's state vouches after FENCE (the note's first limit)",
        ZOMBIE._replace(
            name="newest-cut-off",
            chiefs=(
                ChiefSpec("A1", "A", 2, 2, may_pause=True),
                ChiefSpec("A2", "A", 1, 2, after="A1", may_pause=True),
            ),
            pauses=2,
        ),
        "never early",
    ),
    Limit(
        "zombie-after-finish",
        "the newest generation has finished (it writes no more) when Redis loses the state: "
        "a zombie's write recreates it on probation, nobody newer replaces it, and after FENCE "
        "it vouches (a case of newest-cut-off: a finished generation cannot write; found by "
        "this model)",
        ZOMBIE._replace(
            name="zombie-after-finish",
            chiefs=(
                ChiefSpec("A1", "A", 2, 2, may_pause=True),
                ChiefSpec("A2", "A", 1, 1, after="A1", may_finish=True),
            ),
        ),
        "never early",
    ),
    Limit(
        "reset-token-lost",
        "Redis loses a reset's token before the old chief's next write: that chief goes on, "
        "and a waiter arriving after the reset can be released by it (the note's fourth limit)",
        RESET._replace(name="reset-token-lost", lose_token=1),
        "never early",
    ),
    Limit(
        "lagging-replica",
        "a failover to a replica that missed the newest generation's writes: until its next "
        "write, a zombie writing onto the older state releases a waiter that has not seen the "
        "newest generation",
        ZOMBIE._replace(name="lagging-replica", lose_state=0, failovers=1),
        "never early",
    ),
    Limit(
        "clock-back-unseen-generation",
        "a failover to an empty Redis whose clock is behind (by more than the time between two "
        "begins) numbers a new process's generation at or below a zombie's that this process "
        "never saw: the zombie's writes count as the newest's, or supersede it",
        CLOCK._replace(
            name="clock-back-unseen-generation",
            chiefs=(
                ChiefSpec("A1", "A", 2, 2, may_pause=True),
                ChiefSpec("A2", "A", 1, 1, after="A1", process="P"),
                ChiefSpec("A3", "A", 1, 1, after="A2", process="Q"),
            ),
        ),
        "never early",
    ),
    Limit(
        "rerun-begins-after-grace",
        "a rerun without a run id whose chief begins later than the grace after its first "
        "worker: the worker trusts the previous run's finished state (its run id, none, is the "
        "same) and is released, or aborted, by it",
        RERUN._replace(
            name="rerun-begins-after-grace",
            chiefs=(
                ChiefSpec("A1", "A", 2, 2, may_finish=True),
                ChiefSpec("C1", "C", 2, 2, after_done="A1", after_waiter="WC", begin_within=2),
            ),
        ),
        "never early",
    ),
    Limit(
        "runs-while-redis-forgot",
        "a second run's chief begins while Redis has just lost the state: it finds nothing to "
        "watch and takes the job over; the live run's chief is SUPERSEDED",
        RUNS._replace(name="runs-while-redis-forgot", lose_state=1),
        "runs kept apart",
    ),
    Limit(
        "runs-share-a-run-id",
        "two runs with the same run id (or none) are one run: the second takes the first over",
        RUNS._replace(name="runs-share-a-run-id", run_ids=(("A", ""), ("B", ""))),
        "runs kept apart",
    ),
)
"""Faults outside the promises (docs/protocol.md#limits): the model finds each one."""
