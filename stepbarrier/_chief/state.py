"""What the chief's writes mean: its generation, the steps waited for, its end.

``PublisherState`` is the chief's decisions without threads, retries or Redis
calls, as ``WaitRules`` is a wait's (docs/protocol.md#chief is its state diagram).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stepbarrier._chief.publish_call import Beginning, StepWrite, StoredSummary, WriteResult
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.calls import WriterMode
from stepbarrier._protocol.freshness import FENCE, confirm_window, vouches

# the name these messages always had: log filters and tests select by it
log = logging.getLogger("stepbarrier._chief.publisher")

MAX_IDLE_MS = 10**12
"""The longest loop idleness a write states (ms): about 30 years, a whole number Lua reads."""


@dataclass(slots=True, eq=False)
class Handover:
    """The step the training thread hands over, and the threshold it reads back.

    No lock: publish() runs on every training step. Each field is replaced whole
    (atomic under the GIL); the training thread alone writes all but
    ``next_threshold`` (and new_generation's ``latest = None``), written under the
    state's lock, which publish() never takes. A value read late counts at the next wake.
    """

    handed_at: float  # monotonic time of the last hand-over (of the start, before one)
    latest: int | None = None  # None before one, and after a new generation
    handed: int = 0  # how many were handed over: flush() waits for a write of this many
    step_time: float | None = None  # running mean of the time between two (None before two)
    next_threshold: float = -1.0  # publish() wakes the writer at it (-1: write the next at once)
    # the time to the next hand-over is a pause's or a new session's, not a step's:
    # it would stretch the confirmation window a stale step vouches in
    skip_gap: bool = False
    paused_at: int | None = None  # ``handed`` at pause(): paused until the next hand-over

    @property
    def paused(self) -> bool:
        return self.paused_at == self.handed


class PublisherState:
    """The generation, targets and end of one publisher, shared by its threads.

    Each public method takes ``lock`` itself (``stored``, a condition on it, is notified
    whenever ``stored_seq`` or ``refusals`` grows or it ends); it sets ``wake`` when a
    write is due at once. ``quiet``: a default contributor's, said at INFO.
    """

    def __init__(
        self,
        config: BarrierConfig,
        handover: Handover,
        wake: threading.Event,
        *,
        clock: Callable[[], float],
        mode: WriterMode = "chief",
        quiet: bool = False,
    ) -> None:
        self._config = config
        self.handover = handover
        self.wake = wake
        self._clock = clock
        self.mode = mode
        self.contributor = mode == "contributor"
        self.level = logging.INFO if quiet else logging.WARNING  # of its refusals and outages
        self.lock = threading.Lock()
        self.stored = threading.Condition(self.lock)
        self.stored_seq = 0  # the hand-overs counted by the last write that counted
        self._joined_after = 0  # (a contributor) hand-overs before it found its generation
        self.refusals = 0  # writes that failed for good
        self.pending: tuple[int, ...] = ()  # the lowest targets, from the last write
        self._stored_step = -1
        # the highest step a vouching write carried since this generation began
        # (or since Redis last lost its state): a higher one is news
        self._vouched_step = -1
        self._sent: tuple[int, bool] = (-1, False)  # the last write's step and vouch
        self._registered_targets: set[int] = set()
        self.generation: int | None = None
        # the reset marker this writer began under: a write under another is refused
        self.reset_marker = ""
        self._marker_taken = False  # the first generation took its marker (maybe none)
        # the writer's own clock: until then its writes do not vouch (it made the
        # state from nothing; docs/protocol.md#probation)
        self.probation_until = -math.inf
        self._probation_id = 0  # the probation Redis says the state is on (0: none)
        # a contributor joins one generation (the first it finds, or the one its
        # own wait was released by) and never another
        self.joined: int | None = None
        self._generation_wanted = 1
        self._generation_begun = 0
        self._idle_said = False
        # "superseded", "reset", "conflict" (another run's live chief owns the
        # job) or "refused" (a contributor): this writer is done for good
        self.ended: str | None = None
        self.end_message: str | None = None  # why, as one line (set before ``ended``)

    def new_generation(self) -> None:
        """Drop the handed-over step and, for a chief, ask for a new generation."""
        if self.ended is not None:
            return  # superseded or reset: this publisher never writes again
        with self.lock:
            self.handover.latest = None
            self._stored_step = -1
            self._vouched_step = -1
            self.handover.next_threshold = -1.0
            self._registered_targets = set()
            self.handover.skip_gap = True  # the new session's first step ends a gap
            if not self.contributor:
                self._generation_wanted += 1

    def generation_to_begin(self) -> tuple[int, bool]:
        """The generation asked for (for the next calls), and whether to begin it."""
        with self.lock:
            wanted = self._generation_wanted
            return wanted, not self.contributor and self._generation_begun != wanted

    def begin_generation(self, wanted: int, beginning: Beginning) -> bool:
        """Take in the generation Redis began for ``wanted``; False if it came too late."""
        with self.lock:
            if self._generation_wanted != wanted:
                return False  # yet another generation was asked for meanwhile
            self.generation, self._generation_begun = beginning.generation, wanted
            # the new generation's first reply says whether it is on probation
            self._probation_id, self.probation_until = 0, -math.inf
            if not self._marker_taken:
                # the first generation takes the marker it found (maybe none);
                # later ones of this publisher keep it, so that a reset since the
                # publisher began still stops it
                self.reset_marker, self._marker_taken = beginning.reset_marker, True
            return True

    def join(self, generation: int) -> None:
        """(A contributor) report into ``generation`` only: the one this worker's wait saw."""
        with self.lock:
            self.joined = self.generation = generation

    def watches(self, found: StoredSummary) -> bool:
        """Whether ``found`` is another run's unfinished state, to watch for ``FENCE``
        before taking the job over (docs/protocol.md#runs)."""
        run_id = self._config.run_id
        if self.mode == "operator" or found.done or found.run_id == run_id:
            return False
        log.info(
            "job %s: the stored state belongs to run %s (chief %s); watching it for %.1f s "
            "before taking the job over",
            self._config.job,
            found.run_id or "(none)",
            found.chief or "unknown",
            FENCE,
        )
        return True

    def takes_over(self, found: StoredSummary, again: StoredSummary | None) -> bool:
        """After watching ``found`` for ``FENCE``, ``again`` is the state now: False (and
        ended) if that run's writes went on, for both runs would share one job's keys."""
        if again is None or again.run_id != found.run_id:
            return True
        run = found.run_id or "(none)"
        if again.done or (again.generation, again.beat) == (found.generation, found.beat):
            log.warning(
                "job %s: taking the job over from run %s, whose chief wrote nothing for %.1f s",
                self._config.job,
                run,
                FENCE,
            )
            return True
        self.conflict(
            f"job {self._config.job} is in use by run {run} (chief {again.chief or 'unknown'}, "
            f"still writing); this chief of run {self._config.run_id or '(none)'} does not "
            "take it over and publishes nothing. Give each concurrent run its own "
            "STEPBARRIER_JOB, or stop the other run (`stepbarrier reset` clears its state)"
        )
        return False

    def conflict(self, message: str) -> None:
        """Another run's live chief owns the job: stop for good, saying ``message``."""
        with self.stored:
            self._end("conflict", message)

    def idle_limit(self) -> float:
        """How long the loop may hand nothing over before the heartbeat stops: the stall
        timeout, or the confirmation window if longer (a slow chief's long steps)."""
        return max(self._config.stall_timeout, confirm_window(self.handover.step_time))

    def loop_idle(self) -> bool:
        """True once the loop, out of a pause, handed nothing over for ``idle_limit()`` and
        its last step is stored: the heartbeat stops (docs/protocol.md#loop-alive)."""
        handover = self.handover
        idle = self._clock() - handover.handed_at
        stored = self.stored_seq >= handover.handed
        stopped = idle >= self.idle_limit() and stored and not handover.paused
        if stopped and not self._idle_said:
            log.warning(
                "job %s: the training loop handed no step over for %.0f s (the stall "
                "timeout, or its confirmation window); the heartbeat stops, so that "
                "waiting workers see that this chief no longer trains; the next step "
                "resumes it",
                self._config.job,
                idle,
            )
        elif not stopped and self._idle_said:
            log.info("job %s: the training loop hands steps over again", self._config.job)
        self._idle_said = stopped
        return stopped

    def next_write(self, *, done: bool) -> tuple[StepWrite, int] | None:
        """The values of the next write and the hand-overs it counts; ``None``: nothing new."""
        handover = self.handover
        with self.lock:
            step, seq = handover.latest, handover.handed
            if step is None or seq <= self._joined_after:
                return None
            now, paused = self._clock(), handover.paused_at == seq
            # beyond its own confirmation window: a slow loop within it is a healthy one
            quiet = now - handover.handed_at - confirm_window(handover.step_time)
            values = StepWrite(
                generation=self.generation or 0,
                step=step,
                done=done,
                vouch=vouches(
                    now=now,
                    probation_until=self.probation_until,
                    handed_at=handover.handed_at,
                    step_time=handover.step_time,
                    done=done,
                    # a step this generation has not stored yet is news however
                    # late its write: the loop did hand it over (only a stale one,
                    # rewritten heartbeat after heartbeat, needs the window); not
                    # in a pause: the step is old, and if Redis forgot it
                    # meanwhile, it must not come back as news
                    new_step=step > self._vouched_step and not paused,
                ),
                reset_marker=self.reset_marker,
                served=self._probation_id if now >= self.probation_until else 0,
                idle_ms=0 if paused else max(0, min(MAX_IDLE_MS, round(quiet * 1000))),
            )
            self._sent = (values.step, values.vouch)
        return values, seq

    def take_reply(self, result: WriteResult, seq: int, wanted: int) -> bool:
        """Take in a write's reply (of ``seq`` hand-overs, in ``wanted``); True if it counts."""
        with self.stored:
            if self._generation_wanted != wanted:
                # new_generation() came while this write was on its way: its
                # results describe the old generation and must not count
                self.wake.set()
                return False
            if result.status == scripts.SUPERSEDED:
                self._end(
                    "superseded",
                    f"a newer chief (generation {result.stored_generation}) has taken over; this "
                    f"chief (generation {self.generation}) stops publishing",
                )
                return False
            if result.status == scripts.WAS_RESET:
                self._end(
                    "reset",
                    "the job was reset (stepbarrier reset) after this chief began; it stops "
                    "publishing and waiting workers abort. Start a new chief to run the job again",
                )
                return False
            if result.status == scripts.NOTHING_TO_JOIN:
                return False  # no live chief state of this run yet: try again next heartbeat
            if result.status == scripts.OTHER_GENERATION:
                if self.joined is None and self.generation is None:
                    # not yet joined: the generation found is the one to report into,
                    # with the steps handed over from now on. Those handed over before
                    # may have been read before that generation began (a chief that
                    # restored an older checkpoint meanwhile): they are not written
                    self.joined = self.generation = result.stored_generation or 0
                    self._joined_after = self.handover.handed  # every one before this reply
                    self.stored_seq = max(self.stored_seq, self._joined_after)
                    self.stored.notify_all()
                    return False
                # another chief generation took over: a contributor reports only into
                # the generation it joined (its steps may be an earlier run's, or read
                # before that chief restored an older checkpoint), so it stops
                self._end(
                    "superseded",
                    f"the job now has chief generation {result.stored_generation}; this worker "
                    f"reported into generation {self.generation} only and stops reporting",
                )
                return False
            new_probation = not self.contributor and result.probation != self._probation_id
            if new_probation and result.probation:
                # a newer chief whose state Redis forgot may exist (docs/protocol.md#probation)
                self.probation_until = self._clock() + FENCE
                self._vouched_step = -1  # the stored vouch was dropped
                log.info(
                    "job %s: this chief's write made the job's state anew (a new job, or Redis "
                    "forgot the state); its step releases workers after %.1f s of probation",
                    self._config.job,
                    FENCE,
                )
            if not self.contributor:
                self._probation_id = result.probation
            if self._sent[1] and not result.probation:
                self._vouched_step = max(self._vouched_step, self._sent[0])
            stored = -1 if result.stored_step is None else result.stored_step
            self._stored_step = stored
            self._registered_targets = {t for t in self._registered_targets if t > stored}
            self.pending = result.targets
            self._refresh_threshold()
            self.stored_seq = max(self.stored_seq, seq)
            self.stored.notify_all()
            return True

    def refused(self, error: str, *, forbidden: bool) -> None:
        """A write failed for good (``forbidden``: the user may not write): ends ``flush``
        waits, and a contributor that may not write the step."""
        with self.stored:
            self.refusals += 1
            self.stored.notify_all()
            if self.contributor and forbidden:
                # a worker whose user may not write the step (the shipped
                # worker role): reporting is optional, so say it once and stop
                self._end(
                    "refused",
                    f"this worker does not report the global step: {error} "
                    "(reporting needs a user with the chief role's rights; see "
                    "docs/tensorflow-keras.md#workers-keep-the-step-moving)",
                    level=self.level,
                )

    def _end(self, why: str, message: str, *, level: int | None = None) -> None:
        """Stop this writer for good (holding the lock)."""
        if self.ended is None:
            self.end_message = message
            self.ended = why
            if level is None:
                level = logging.ERROR if why in ("reset", "conflict") else logging.WARNING
            log.log(level, "job %s: %s", self._config.job, message)
        self.handover.next_threshold = math.inf
        self.stored.notify_all()
        self.wake.set()

    def _refresh_threshold(self) -> None:
        """Set the step at which the next write is due (holding the lock)."""
        if self._stored_step < 0:
            # No write in this generation yet: the next publish must write at once,
            # even if a registration was heard first (it would wait a heartbeat).
            self.handover.next_threshold = -1.0
            return
        candidates = [*self.pending[:1], *self._registered_targets]
        self.handover.next_threshold = float(min(candidates)) if candidates else math.inf
        latest = self.handover.latest
        if latest is not None and latest >= self.handover.next_threshold:
            self.wake.set()

    def on_registration(self, target: int) -> None:
        """A new waiter registered ``target`` (called by the registration listener)."""
        if self.ended is not None:
            return
        if target <= self._stored_step:
            # a late worker: its step is reached, and it is released by a write it
            # sees happen (docs/protocol.md#observed-writes): write one now
            self.wake.set()
            return
        with self.lock:
            self._registered_targets.add(target)
            self._refresh_threshold()
