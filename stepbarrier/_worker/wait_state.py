"""What one wait decides, without any I/O: shared by the threaded and the asyncio waiter.

``StepWaiter`` (``stepbarrier._worker.waiter``) and ``AsyncStepWaiter``
(``stepbarrier.aio``) each drive a wait: they subscribe, read the stored state,
receive announcements and keep time. What each of those means is decided here,
once, by the rules of docs/protocol.md:

- **Observed writes.** The wait keeps the newest write (``(generation, beat)``)
  it knows happened *while it watched*: an announcement of its run received
  on its confirmed subscription, or a read whose write differs from the
  previous read's. The first read alone proves nothing (a dead chief's last
  state looks the same). Liveness and the stall timeout are judged from these
  observations on the wait's own monotonic clock; no stored time is compared
  with any clock.
- **Release** (never early): a write of the wait's own run, of the newest
  generation it has seen, with a step at or above the target, that the writer
  vouches for, observed live; or a finished (or operator-pinned) state that is
  either observed live or carries the wait's own, non-empty run id.
- **Abort** only for real: a reset marker other than the one the wait first
  read, or a trusted finished state below the target. A reset notice on the
  channel is a hint: it makes the wait read, and the marker decides.
"""

from __future__ import annotations

import logging
import math
import operator
from collections.abc import Callable

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.freshness import GRACE
from stepbarrier._protocol.wire import (
    MAX_STEP,
    MAX_STEP_TEXT,
    ChiefState,
    StepAnnouncement,
    preview,
)
from stepbarrier._worker.snapshot import Snapshot
from stepbarrier._worker.timing import PROGRESS_EVERY, Limit, WaitTiming
from stepbarrier.errors import BarrierAborted, BarrierTimeout, RedisUnavailable

Mark = tuple[int, int]
"""Which write a state or announcement is: ``(generation, beat)``, in order."""


def wait_target(until_step: object) -> int:
    """``until_step`` as a wait's target: an integer up to ``MAX_STEP`` (``<= 0``: no wait).

    Raises:
        TypeError: not an integer (``True`` is not step 1, nor is ``2.0``).
        ValueError: above ``MAX_STEP``, which no chief can publish: such a wait
            would never end while its chief lives.
    """
    if isinstance(until_step, bool) or not hasattr(until_step, "__index__"):
        raise TypeError(
            f"until_step must be an integer, got {type(until_step).__name__} {until_step!r}"
        )
    target = operator.index(until_step)
    if target > MAX_STEP:
        raise ValueError(
            f"until_step must be at most {MAX_STEP_TEXT} ({MAX_STEP}), the largest step a "
            f"chief can publish, got {target}"
        )
    return target


class ReadNow:
    """An announcement's answer: read the state before deciding anything."""


READ_NOW = ReadNow()
"""Returned for a reset notice, or a write of a chief generation the wait has not read yet."""

_UNSET = object()


class WaitRules(WaitTiming):
    """The decisions of one wait for ``target`` (its timing: ``WaitTiming``).

    Args:
        config: The job's settings.
        target: The step waited for (``>= 1``).
        timeout: Overall limit in seconds, or ``None``.
        clock: Monotonic clock.
        log: Where the wait's lines go (the driver's logger).
        outside: The name of a second witness of the step the driver also
            reads (``StepSource.name``, e.g. the TensorFlow session's global
            step), or ``None``. With one, the wait is at least as patient as
            that witness alone: the stall timeout holds only once a write of
            this run's chief was seen and while Redis answers.
        outside_every: Seconds between reads of the outside witness: while no
            write of the chief was seen, and once one was.
    """

    def __init__(
        self,
        config: BarrierConfig,
        target: int,
        timeout: float | None,
        clock: Callable[[], float],
        log: logging.Logger,
        *,
        outside: str | None = None,
        outside_every: tuple[float, float] = (0.5, 5.0),
    ) -> None:
        super().__init__(
            clock,
            timeout,
            stall_timeout=config.stall_timeout,
            fallback_interval=config.fallback_interval,
        )
        self.config = config
        self.outside = outside
        self.outside_every = outside_every
        if outside is not None:
            self.source_at = self.started  # at once: before Redis is touched
        self.outside_step: int | None = None  # the witness's last step read
        self.redis_lost = False  # the driver cannot reach Redis (it waits on the witness)
        self.target = target
        self.log = log
        self.last_step: int | None = None
        self.generation = 0
        self.heartbeat_age: float | None = None
        self.reset_marker: object = _UNSET  # the marker the first read found
        self.read_mark: Mark | None = None  # the write the last read found
        self.live_mark: Mark | None = None  # the newest write observed while watching
        self.chief_seen = False  # a write of this run was observed
        self.other_run: str | None = None  # another run's state was found instead
        self.holding: str | None = None  # why the last step seen did not release
        self.reads_without_message = 0
        self.read_step: int | None = None
        self.progress_line_at = self.started + PROGRESS_EVERY
        self.no_chief_at = self.started + config.no_chief_warning
        self.next_progress = min(self.progress_line_at, self.no_chief_at)
        # (a progress line, or the warning that no chief was seen)
        self.last_progress = self.started
        self.warned: set[str] = set()
        self.released_by: str | None = None  # what released the wait, once it was
        self.snapshots = 0  # reads of the stored state judged
        # the step of this run that the wait's first read found (``None``: none, or
        # not this run's): the chief had reached it before the wait began
        self.first_step: int | None = None
        # a finished or pinned state this wait did not see written, and since when
        # it has read it unchanged (docs/protocol.md#grace)
        self.final_mark: Mark | None = None
        self.final_since = self.started
        self.redis_full = False  # Redis refused this wait's registration: out of memory
        # when (on this wait's clock) the chief's training loop last handed a step
        # over, by what its writes said (None: none said it)
        self.loop_alive: float | None = None

    @property
    def reached(self) -> bool:
        """True once the wait has read Redis at least once."""
        return self.reset_marker is not _UNSET

    def begin(self) -> None:
        """Say that the wait begins."""
        if self.log.isEnabledFor(logging.INFO):
            self.log.info(
                "job %s: waiting for step %d (task %s)",
                self.config.job,
                self.target,
                self.config.task_id,
            )

    # -- what a message and a read mean ---------------------------------------------

    def on_announcement(
        self, announcement: StepAnnouncement | None, raw: object
    ) -> int | ReadNow | None:
        """The step that releases the wait, ``READ_NOW``, or ``None`` to go on waiting.

        An announcement is the chief's script telling of a write it just made,
        received on the wait's confirmed subscription: a write observed live.

        Raises:
            BarrierAborted: The job finished short of the target.
        """
        self.reads_without_message = 0
        if announcement is None:
            self.log.warning(
                "job %s: ignored a malformed message on %s: %s",
                self.config.job,
                self.config.keys.channel,
                preview(raw),
            )
            return None
        if announcement.reset:
            return READ_NOW  # a hint: the reset marker decides
        assert announcement.step is not None and announcement.generation is not None
        if announcement.run_id != self.config.run_id:
            return None  # another run's chief: it neither releases nor aborts us
        if announcement.generation < self.generation:
            return None  # an older chief's write, overtaken by what we read
        mark = (announcement.generation, announcement.beat)
        self._observed(mark, idle_ms=announcement.idle_ms)
        if announcement.generation > self.generation:
            # a chief generation this wait has not read yet: the state (and a
            # reset marker this wait may have missed the announcement of) decide.
            # No lower generation counts from now on: if Redis loses the state
            # before the read, a zombie's write that remakes it is older than
            # what this wait heard (found by the model: zombie-after-finish)
            self.generation = announcement.generation
            return READ_NOW
        step = announcement.step
        if self.read_mark is None or mark >= self.read_mark:
            self._seen_step(step)  # not an older write announced late
        if (
            step >= self.target
            and announcement.vouch
            and not (announcement.done or announcement.pinned)
        ):
            # (_judge's release of a live, vouched step: the release of most waits)
            return self.released(step, by="an announcement")
        return self._judge(
            announcement.step,
            vouch=announcement.vouch,
            done=announcement.done,
            pinned=announcement.pinned,
            live=True,
            by="an announcement",
        )

    def on_snapshot(self, snapshot: Snapshot, after: StepAnnouncement | None = None) -> int | None:
        """Judge a read of the stored state (the truth): the releasing step, or ``None``.

        Args:
            snapshot: What the read found.
            after: The announcement the read was made for (a write observed
                live), if any.

        Raises:
            BarrierAborted: The job was reset since the wait's first read, or
                finished short of the target.
        """
        self.snapshots += 1
        if (
            after is not None
            and after.generation is not None
            and after.run_id == self.config.run_id
            and after.generation >= self.generation
        ):
            self._observed((after.generation, after.beat), idle_ms=after.idle_ms)
            # no older generation counts once a newer one was heard (asyncio
            # reads for it without the announcement's own judgement)
            self.generation = max(self.generation, after.generation)
        self.redis_full = snapshot.full
        marker = snapshot.reset_marker
        if self.reset_marker is _UNSET:
            self.reset_marker = marker
        elif marker is not None and marker != self.reset_marker:
            raise self.aborted("reset")  # whatever a chief wrote since
        state = snapshot.state
        if state.problem:
            self.log.warning("job %s: %s; waiting for a valid step", self.config.job, state.problem)
        mark = state.mark
        if mark is None or state.step is None:
            self.holding = "no chief state is stored"
            return None
        if not self.trusts(state):
            return None
        if state.generation is not None and state.generation < self.generation:
            return None  # e.g. a failover lost the newest write; the chief rewrites it
        if self.read_mark is not None and mark > self.read_mark:
            self._observed(mark, idle_ms=state.idle_ms)  # a write happened between two reads
        self.read_mark = mark
        self.generation = mark[0]
        if self.snapshots == 1:
            self.first_step = state.step
        self._seen_step(state.step)
        live = self.live_mark is not None and mark >= self.live_mark
        released = self._judge(
            state.step,
            vouch=state.vouch,
            done=state.done,
            pinned=state.pinned,
            live=live,
            by="a read of the state",
            settled=self._settled(state, mark),
        )
        if released is None:
            self._check_subscription(state.step)
        return released

    def _settled(self, state: ChiefState, mark: Mark) -> bool:
        """True once a finished or pinned state has stood unchanged for ``GRACE``.

        Without a run id, such a state the wait did not see written may be an
        earlier run's under the same job name. A rerun's chief that begins
        records its begin on the state (``begun``), and its first write replaces
        it; so a state read unchanged for ``GRACE``, with no newer begin on record,
        is trusted as the job's final fact (docs/protocol.md#grace).
        """
        if not (state.done or state.pinned) or state.fence > mark[0]:
            self.final_mark = None
            return False
        now = self.clock()
        if self.final_mark != mark:
            self.final_mark, self.final_since = mark, now
        due = self.final_since + GRACE
        if now < due:
            self.read_at = min(self.read_at, due)  # read it again when the grace ends
            return False
        return True

    def read_done(self) -> None:
        super().read_done()
        if self.final_mark is not None and self.final_since + GRACE > self.clock():
            self.read_at = min(self.read_at, self.final_since + GRACE)

    def _judge(
        self,
        step: int,
        *,
        vouch: bool,
        done: bool,
        pinned: bool,
        live: bool,
        by: str,
        settled: bool = False,
    ) -> int | None:
        """Release, abort or go on, by docs/protocol.md#release."""
        # a final fact (a finished job, an operator's pinned step) stands without
        # a live writer when it names this wait's own run, or once it has stood
        # unchanged for the grace with no newer chief begun on it: without a run
        # id it may be an earlier run's under the same job name
        final_trusted = live or settled or self.config.run_id is not None
        if step >= self.target:
            if pinned and not done:
                # an operator pinned the step (docs/protocol.md#operator-publish): a
                # final fact like a finish, so without a run id only a wait that saw
                # it happen trusts it (an earlier run's pin must not release a rerun)
                if final_trusted:
                    return self.released(step, by=f"{by} (a step pinned by an operator)")
                self.holding = (
                    f"an operator pinned step {step}, but this wait did not see it happen, "
                    "has no run id to tell it is this run's, and " + self._grace_situation()
                )
                self._warn_final(step)
                return None
            if done:
                if final_trusted and vouch:
                    return self.released(step, by=by)
                self.holding = (
                    f"the job's state says finished at step {step}, but this wait did not "
                    "see it happen, has no run id to tell it is this run's, and "
                    + self._grace_situation()
                    if not final_trusted
                    else "the finished job's last write came while its chief was on probation"
                )
                self._warn_final(step)
                return None
            if not vouch:
                self.holding = (
                    f"the chief is at step {step} but does not vouch for it (it is on "
                    "probation after Redis lost the job's state, or its training loop has "
                    "not handed a step over lately)"
                )
                return None
            if not live:
                self.holding = (
                    f"step {step} is stored, but no write of a live chief was seen yet "
                    "(waiting for the chief's next write)"
                )
                return None
            return self.released(step, by=by)
        if done and final_trusted and vouch:
            raise self.aborted("done")  # (a zombie's final write on probation aborts nobody)
        if done:
            self._warn_final(step)
        self.holding = None
        return None

    def _grace_situation(self) -> str:
        if self.final_mark is None:
            return "a newer chief has begun on it (it has not written yet)"
        return f"gives a new chief {GRACE:g} s to begin before trusting it"

    def _warn_final(self, step: int) -> None:
        if self.final_mark is not None:
            return  # within the grace: trusted or not in a few seconds
        if self.config.run_id is None and not self.chief_seen:
            self._warn_once(
                "old-done",
                logging.WARNING,
                "job %s: found a job finished at step %s that this worker did not see "
                "finish, and a newer chief has begun on it without writing yet; without a "
                "run id it may be an earlier run's, so it neither releases nor aborts this "
                "wait, which waits for the new chief. Give each run its own run id "
                "(STEPBARRIER_RUN_ID, or the launcher's), or clear it with `stepbarrier reset`",
                self.config.job,
                step,
            )

    def trusts(self, state: ChiefState) -> bool:
        """False for state this wait must ignore: another run's."""
        run_id = self.config.run_id
        if state.run_id != run_id:
            self.other_run = state.run_id or "(none)"
            self.holding = f"the stored state belongs to run {self.other_run}"
            self._warn_once(
                "run",
                logging.INFO,
                "job %s: the stored state belongs to run %s, not to this worker's run %s; "
                "waiting for this run's chief",
                self.config.job,
                state.run_id or "(none)",
                run_id or "(none)",
            )
            return False
        return True

    def on_passing_announcement(self, announcement: StepAnnouncement | None, at: float) -> None:
        """Take in an announcement judged elsewhere not to concern this wait (a step
        below its target; ``AsyncStepWaiter`` shares one subscription among many
        waits and wakes only those an announcement concerns): the subscription
        is alive, and a write of this run was observed at ``clock()`` time ``at``.
        Never a release or an abort.
        """
        self.reads_without_message = 0
        if announcement is None or announcement.step is None or announcement.generation is None:
            return
        if announcement.run_id != self.config.run_id or announcement.generation < self.generation:
            return
        mark = (announcement.generation, announcement.beat)
        self._observed(mark, at, idle_ms=announcement.idle_ms)
        if announcement.generation == self.generation and (
            self.read_mark is None or mark >= self.read_mark
        ):
            self._seen_step(announcement.step, at)  # not an older write announced late

    def on_outside_step(self, step: int, hint: str = "") -> int | None:
        """Judge a read of the outside witness (``outside``): the releasing step, or ``None``.

        The witness is trusted as it stands (TensorFlow's own hook trusts the
        session's global step): a step at or above the target releases. A step
        that moved shows that training goes on, which counts as life for the
        stall timeout. ``hint`` is said once, in a WARNING, when the witness
        released a wait that never saw a write of its chief.
        """
        if isinstance(step, bool) or not hasattr(step, "__index__"):
            raise TypeError(
                f"{self.outside} must be an integer step, got {type(step).__name__} {step!r}"
            )
        step = operator.index(step)
        now = self.clock()
        # the slow pace only while Redis can wake the wait: with Redis lost the
        # witness is the only one left, read as TensorFlow's own hook reads it
        relaxed = self.chief_seen and not self.redis_lost
        self.source_at = now + self.outside_every[1 if relaxed else 0]
        if self.outside_step is not None and step != self.outside_step:
            self.last_alive = max(self.last_alive, now)
            self.last_progress = max(self.last_progress, now)
            if self.loop_alive is not None:
                self.loop_alive = max(self.loop_alive, now)  # training goes on
        self.outside_step = step
        if step < self.target:
            return None
        if self._no_chief_in_redis():
            self._warn_once(
                "outside",
                logging.WARNING,
                "job %s: %s reached step %d before any write of this job's chief was seen on %s%s",
                self.config.job,
                self.outside,
                step,
                self.config.safe_url,
                f"; {hint}" if hint else "",
            )
        return self.released(step, by=str(self.outside))

    def _no_chief_in_redis(self) -> bool:
        """True if Redis answered this wait and shows no sign that a chief publishes
        (no state of this job at all): only then is "add a publisher" the advice.
        A witness that released the wait before Redis was asked, a Redis that
        refused, or a state found (another run's, or this run's) says nothing so."""
        return (
            not self.chief_seen
            and self.reached
            and not self.redis_lost
            and self.read_mark is None
            and self.other_run is None
        )

    def subscribed(self) -> None:
        """A new confirmed subscription: what the old one missed no longer counts."""
        self.reads_without_message = 0
        self.read_step = None
        self.resubscribe = False

    def _observed(self, mark: Mark, at: float | None = None, *, idle_ms: int | None = None) -> None:
        """A write ``mark`` of this run happened while the wait watched; its
        writer's training loop had handed a step over ``idle_ms`` before it."""
        now = self.clock()
        when = now if at is None else at
        if idle_ms is not None:
            # a duration on the writer's clock, laid back from when this wait saw
            # the write: no clock is compared with another
            # (not before the wait began: its stall timeout is its own to serve)
            handed = when - idle_ms / 1000
            if handed < self.started:
                handed = self.started
            if self.loop_alive is None or handed > self.loop_alive:
                self.loop_alive = handed
        if self.live_mark is None or mark > self.live_mark:
            self.live_mark = mark
        self.chief_seen = True
        if when >= self.last_alive:
            self.last_alive = when
        age = now - self.last_alive
        self.heartbeat_age = age if age > 0.0 else 0.0

    def _warn_once(self, topic: str, level: int, message: str, *args: object) -> None:
        if topic not in self.warned:
            self.warned.add(topic)
            self.log.log(level, message, *args)

    def _seen_step(self, step: int, at: float | None = None) -> None:
        if step != self.last_step:
            self.last_progress = self.clock() if at is None else max(self.last_progress, at)
        self.last_step = step

    def _check_subscription(self, step: int) -> None:
        # The chief announces every write. If reads keep finding a step that
        # moved while no message arrived, the subscription is dead (say, a
        # half-open connection): start a new one.
        if self.read_step is not None and step != self.read_step:
            self.reads_without_message += 1
        self.read_step = step
        if self.reads_without_message >= 2:
            self.log.info(
                "job %s: the step moves but no announcement comes; resubscribing",
                self.config.job,
            )
            self.resubscribe = True

    # -- limits ---------------------------------------------------------------------

    def stall_at(self) -> float:
        """When the stall timeout passes, unless the chief is seen alive again.

        With an outside witness, never before a write of the chief was seen,
        nor while Redis is lost: the witness alone may still release the wait,
        as it would without stepbarrier.
        """
        if self.outside is not None and (not self.chief_seen or self.redis_lost):
            return math.inf
        # a live process whose training loop died writes on: the stall timeout
        # judges the loop (its writes say how long it has been quiet)
        alive = (
            self.last_alive if self.loop_alive is None else min(self.last_alive, self.loop_alive)
        )
        return alive + self.stall_timeout

    def progress_at(self) -> float | None:
        """When the progress timeout passes, unless the step moves."""
        limit = self.config.progress_timeout
        return None if limit is None else self.last_progress + limit

    def after_last_chance(self, limit: Limit, released: int | None) -> int | None:
        """The wait's end after the last read: released, or the timeout, or go on.

        Raises:
            BarrierTimeout: The limit still holds after the last read.
        """
        if released is not None:
            return released
        self.raise_if_passed(limit)
        return None  # the read saw the chief alive (or moving) again

    def timed_out(self, limit: Limit) -> BarrierTimeout:
        return self.timeout(stalled=limit != "deadline", progress=limit == "progress")

    # -- logging and endings --------------------------------------------------------

    def writer_age(self) -> float | None:
        """Seconds since the wait last observed a write of its run's chief (``None``: never)."""
        if not self.chief_seen:
            return None
        return max(0.0, self.clock() - self.last_alive)

    def _situation(self) -> str:
        """Where the wait stands, for progress lines and errors (all on this wait's clock)."""
        seen = "none" if self.last_step is None else str(self.last_step)
        age = self.writer_age()
        if age is None:
            writer = "no write of this run's chief observed since the wait began"
        else:
            writer = f"last write of this run's chief observed {age:.1f} s ago"
        parts = [f"last step seen {seen}", writer]
        if self.outside is not None and self.outside_step is not None:
            parts.append(f"{self.outside} at {self.outside_step}")
        if self.holding is not None:
            parts.append(f"not released because {self.holding}")
        elif self.other_run is not None and not self.chief_seen:
            parts.append(f"the stored state belongs to run {self.other_run}")
        return "; ".join(parts)

    def log_progress(self) -> None:
        """A progress line, or the warning that no chief was seen (due at
        ``next_progress``)."""
        now = self.clock()
        if now >= self.no_chief_at and not self.chief_seen:
            self._warn_once(
                "no-chief",
                logging.WARNING,
                "job %s: no write of this job's chief seen on %s in %.0f s of waiting for "
                "step %d (%s). %s Still waiting%s",
                self.config.job,
                self.config.safe_url,
                now - self.started,
                self.target,
                self._situation(),
                self.no_chief_causes(),
                f"; {self.outside} can still release this worker" if self.outside else "",
            )
        if now >= self.progress_line_at:
            self.progress_line_at = now + PROGRESS_EVERY
            self.heartbeat_age = self.writer_age()
            self.log.info(
                "job %s: still waiting for step %d after %.0f s (%s)",
                self.config.job,
                self.target,
                now - self.started,
                self._situation(),
            )
        # once warned, or once a chief was seen, the warning is never due again
        said = "no-chief" in self.warned or self.chief_seen
        no_chief = math.inf if said else self.no_chief_at
        self.next_progress = min(self.progress_line_at, max(no_chief, now + 0.001))

    def no_chief_causes(self) -> str:
        """The likely causes of a wait that never saw its chief, for messages."""
        if self.redis_lost or not self.reached:
            return (
                f"Redis at {self.config.safe_url} did not answer this wait (see the error "
                "above): is the URL right, and is Redis up?"
            )
        if self.redis_full:
            return (
                f"Redis at {self.config.safe_url} refuses writes because it is full (out of "
                "memory: it refused this wait's registration, and refuses the chief's writes "
                "the same way): raise its maxmemory or free memory (docs/operations.md#memory)."
            )
        if self.other_run is not None and self.read_mark is None:
            source = self.config.run_id_source
            return (
                f"The stored state belongs to run {self.other_run}, not this worker's run "
                f"{self.config.run_id or '(none)'}"
                + (f" (from {source})" if source else "")
                + ": do the chief and this worker share one run id (STEPBARRIER_RUN_ID, or "
                "the launcher's: a chief and workers launched as separate Slurm jobs or "
                "torchrun runs get different ones; set STEPBARRIER_RUN_ID on both)?"
            )
        if self.read_mark is not None:
            return (
                f"This run's chief state is stored (step {self.last_step}, generation "
                f"{self.read_mark[0]}), but no write of its chief happened while this wait "
                "watched: the chief may have stopped, crashed or paused, or may be unable to "
                "write to Redis (refused, cut off); `stepbarrier status` shows its last write."
            )
        return (
            "Likely causes: the chief runs no publisher (add GlobalStepPublisherHook, "
            "StepPublisherCallback or a StepPublisher to it, or build its hooks with "
            "hooks_from_env()); or STEPBARRIER_JOB or the Redis URL differ from the chief's."
        )

    def released(self, step: int, *, by: str) -> int:
        """Log the release and return the step."""
        if self.log.isEnabledFor(logging.INFO):
            self.log.info(
                "job %s: released at step %d (target %d) after %.3f s, by %s",
                self.config.job,
                step,
                self.target,
                self.clock() - self.started,
                by,
            )
        self.last_step = step
        self.released_by = by
        return step

    def _loop_quiet(self) -> bool:
        """True if the chief was heard within the stall timeout but its loop was not."""
        # (a write heard lately: a chief killed just after its loop went quiet is
        # a process that stopped writing, and is said so)
        return (
            self.loop_alive is not None
            and self.clock() - self.last_alive < self.stall_timeout / 2
            and self.loop_alive < self.last_alive
        )

    def timeout(self, *, stalled: bool, progress: bool = False) -> BarrierTimeout:
        """The error of a passed limit, with the wait's context."""
        self.heartbeat_age = self.writer_age()
        if progress:
            why = (
                f"the chief's step did not move for {self.config.progress_timeout:g} s "
                "(progress timeout, STEPBARRIER_PROGRESS_TIMEOUT)"
            )
        elif stalled and self._loop_quiet():
            why = (
                "the chief's process still writes, but its training loop has handed no "
                f"step over for {self.config.stall_timeout:g} s (stall timeout); a loop that "
                "died or hangs in a process that lives on, such as a caught error or a "
                "notebook"
            )
        elif stalled:
            why = (
                f"no write of this run's chief observed for {self.config.stall_timeout:g} s "
                "(stall timeout)"
            )
        else:
            why = f"overall timeout of {self.deadline and self.deadline - self.started:g} s passed"
        hint = ""
        if not self.chief_seen:
            hint = f"; no write of this job's chief was ever seen on {self.config.safe_url}. " + (
                self.no_chief_causes()
            )
        elif stalled and not progress and not self._loop_quiet():
            hint = (
                "; if the job finished while this worker was cut off from Redis and Redis "
                "has since forgotten it (a restart, an eviction), no record of it is left"
            )
        return BarrierTimeout(
            f"job {self.config.job}: gave up waiting for step {self.target}: {why}; "
            f"{self._situation()}{hint}",
            job=self.config.job,
            target=self.target,
            last_step=self.last_step,
            heartbeat_age=self.heartbeat_age,
            stalled=stalled,
            limit="progress" if progress else "stall" if stalled else "deadline",
        )

    def unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        """The error for a wait whose retries ran out: ``exc`` with this wait's context.

        A wait that had reached Redis and then lost it until its stall or overall
        timeout ends with ``BarrierTimeout`` (its chief went unseen for that long;
        the message says why); one that never reached Redis at all (a wrong URL, a
        server that is down) ends with ``RedisUnavailable``.
        """
        nearest = self.retry_deadline()
        overall = self.deadline is not None and self.deadline <= nearest
        progress = not overall and self.progress_at() == nearest < self.stall_at()
        if overall and self.deadline is not None:
            limit = f"overall timeout ({self.deadline - self.started:g} s)"
        elif progress:
            limit = f"progress timeout ({self.config.progress_timeout:g} s)"
        else:
            limit = f"stall timeout ({self.config.stall_timeout:g} s)"
        age = self.writer_age()
        message = (
            f"job {self.config.job}: gave up waiting for step {self.target}: {exc}; retried "
            f"until the {limit}; {self._situation()}"
        )
        job, target, last = self.config.job, self.target, self.last_step
        if not self.reached:
            return RedisUnavailable(
                message, job=job, target=target, last_step=last, heartbeat_age=age
            )
        return BarrierTimeout(
            message,
            job=job,
            target=target,
            last_step=last,
            heartbeat_age=age,
            stalled=not overall,
            limit="deadline" if overall else "progress" if progress else "stall",
        )

    def proceed_after(self, exc: BarrierTimeout | RedisUnavailable) -> int:
        """What a wait that ended with ``exc`` returns under ``on_timeout="proceed"``.

        Returns:
            The last step seen (0 if none), after a warning.

        Raises:
            BarrierTimeout: ``exc`` itself, unless the config says proceed.
            RedisUnavailable: ``exc`` itself, likewise.
        """
        if self.config.on_timeout != "proceed":
            raise exc
        self.log.warning("%s; proceeding as STEPBARRIER_ON_TIMEOUT=proceed says", exc)
        return self.last_step or 0

    def aborted(self, reason: str) -> BarrierAborted:
        """The error of a job that finished (``"done"``) or was reset (``"reset"``)."""
        what = "finished" if reason == "done" else "was reset"
        seen = "none" if self.last_step is None else str(self.last_step)
        return BarrierAborted(
            f"job {self.config.job} {what} before step {self.target} came (last step {seen})",
            job=self.config.job,
            target=self.target,
            last_step=self.last_step,
            heartbeat_age=self.writer_age(),
            reason=reason,
        )
