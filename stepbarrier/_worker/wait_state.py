"""What one wait decides, without any I/O: shared by the threaded and the asyncio waiter.

``StepWaiter`` and ``AsyncStepWaiter`` drive a wait (subscribe, read, receive, keep
time); what each of those means is decided here, once, by docs/protocol.md#waiters:
no stored time is compared with any clock.
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
from stepbarrier.errors import BarrierAborted, BarrierTimeout, RedisRefused, RedisUnavailable

Mark = tuple[int, int]
"""Which write a state or announcement is: ``(generation, beat)``, in order."""

REDIS_RETRY_EVERY = 5.0
"""Seconds between tries to reach a lost Redis while a wait with an outside witness
waits on the witness alone."""


def wait_target(until_step: object) -> int:
    """``until_step`` as a wait's target: an integer (not ``True``, nor ``2.0``) up to
    ``MAX_STEP`` (a wait above it would never end); ``<= 0``: no wait."""
    target = _integer(until_step, "until_step must be an integer")
    if target > MAX_STEP:
        raise ValueError(
            f"until_step must be at most {MAX_STEP_TEXT} ({MAX_STEP}), the largest step a "
            f"chief can publish, got {target}"
        )
    return target


def _integer(value: object, must: str) -> int:
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{must}, got {type(value).__name__} {value!r}")
    return operator.index(value)


class ReadNow:
    """An announcement's answer: read the state before deciding anything."""


READ_NOW = ReadNow()
"""Returned for a reset notice, or a write of a chief generation the wait has not read yet."""

_UNSET = object()


class WaitRules(WaitTiming):
    """The decisions of one wait for ``target`` (``>= 1``); its timing is a ``WaitTiming``,
    its lines go to ``log`` (the driver's logger).

    ``outside``: the name of a second witness of the step the driver also reads
    (``StepSource.name``; docs/protocol.md#source), or ``None``; ``outside_every``:
    seconds between its reads, while no write of the chief was seen and once one was.
    """

    # Every wait a step releases reads these: in slots they are cheap to read (an
    # object with more than 30 attributes in its dict has them looked up by name).
    __slots__ = (
        "chief_seen",
        "config",
        "final_mark",
        "final_since",
        "first_step",
        "generation",
        "holding",
        "last_progress",
        "last_step",
        "live_mark",
        "log",
        "loop_alive",
        "no_chief_at",
        "other_run",
        "outside",
        "outside_every",
        "outside_step",
        "progress_line_at",
        "read_mark",
        "read_step",
        "reads_without_message",
        "redis_full",
        "released_by",
        "reset_marker",
        "run_id",
        "snapshots",
        "target",
        "warned",
    )

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
        self.run_id = config.run_id
        self.outside = outside
        self.outside_every = outside_every
        if outside is not None:
            self.source_at = self.started  # at once: before Redis is touched
        self.outside_step: int | None = None
        self.target = target
        self.log = log
        self.last_step: int | None = None
        self.generation = 0
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
        self.last_progress = self.started
        self.warned: set[str] = set()
        self.released_by: str | None = None
        self.snapshots = 0  # reads of the stored state judged
        self.first_step: int | None = None  # this run's step the first read found
        # a finished or pinned state this wait did not see written, and since when
        # it has read it unchanged (docs/protocol.md#grace)
        self.final_mark: Mark | None = None
        self.final_since = self.started
        self.redis_full = False  # Redis refused this wait's registration: out of memory
        # when the chief's training loop last handed a step over, by its writes
        self.loop_alive: float | None = None
        if log.isEnabledFor(logging.INFO):
            log.info("job %s: waiting for step %d (task %s)", config.job, target, config.task_id)

    @property
    def reached(self) -> bool:
        """True once the wait has read Redis at least once."""
        return self.reset_marker is not _UNSET

    # -- what a message and a read mean ---------------------------------------------

    def on_announcement(
        self, announcement: StepAnnouncement | None, raw: object
    ) -> int | ReadNow | None:
        """The step that releases the wait, ``READ_NOW``, or ``None`` to go on waiting (an
        announcement is a write observed live); raises ``BarrierAborted`` (a finish
        short of the target)."""
        self.reads_without_message = 0
        if announcement is None:
            channel = self.config.keys.channel
            self._say(
                logging.WARNING, "ignored a malformed message on %s: %s", channel, preview(raw)
            )
            return None
        if announcement.reset:
            return READ_NOW  # a hint: the reset marker decides
        step, generation = announcement.step, announcement.generation
        assert step is not None and generation is not None
        if announcement.run_id != self.run_id or generation < self.generation:
            # another run's chief (it neither releases nor aborts us), or an older
            # chief's write, overtaken by what we read
            return None
        if (
            step >= self.target
            and generation == self.generation
            and announcement.vouch
            and not (announcement.done or announcement.pinned)
        ):
            # _judge's release of a live, vouched step, the release of most waits,
            # without its checks nor the bookkeeping only a wait that goes on needs
            # (_observed's): the wake's instruction count (docs/performance.md)
            self.chief_seen = True
            self.last_alive = self.clock()
            return self.released(step, "an announcement")
        mark = (generation, announcement.beat)
        now = self.clock()
        self._observed(mark, now, announcement.idle_ms)
        if generation > self.generation:
            # a generation not read yet: the state and reset marker decide, and no
            # lower generation counts from now on (the model's zombie-after-finish)
            self.generation = generation
            return READ_NOW
        read_mark = self.read_mark
        if read_mark is None or mark >= read_mark:  # not an older write, late
            if step != self.last_step and now > self.last_progress:
                self.last_progress = now
            self.last_step = step
        return self._judge(step, announcement, live=True, by="an announcement")

    def take_in(self, announcement: StepAnnouncement | None, at: float) -> None:
        """Take in, as ``on_announcement`` does but never a release or an abort, an
        announcement heard at ``clock()`` time ``at`` that ``AsyncStepWaiter``'s shared
        subscription judged not to concern this wait (inline in ``on_announcement``:
        every wake runs it)."""
        self.reads_without_message = 0
        if announcement is None or announcement.step is None or announcement.generation is None:
            return
        if announcement.run_id != self.run_id or announcement.generation < self.generation:
            return
        mark = (announcement.generation, announcement.beat)
        self._observed(mark, at, announcement.idle_ms)
        if announcement.generation == self.generation and (
            self.read_mark is None or mark >= self.read_mark  # not an older write, late
        ):
            if announcement.step != self.last_step and at > self.last_progress:
                self.last_progress = at
            self.last_step = announcement.step

    def on_snapshot(self, snapshot: Snapshot, after: StepAnnouncement | None = None) -> int | None:
        """Judge a read of the stored state (the truth): the releasing step, or ``None``;
        ``after``: the announcement (a write observed live) it was read for. Raises
        ``BarrierAborted`` (a reset since the first read, or a finish short of the target).
        """
        self.snapshots += 1
        if (
            after is not None
            and after.generation is not None
            and after.run_id == self.run_id
            and after.generation >= self.generation
        ):
            self._observed((after.generation, after.beat), self.clock(), after.idle_ms)
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
            self._say(logging.WARNING, "%s; waiting for a valid step", state.problem)
        mark = state.mark
        if mark is None or state.step is None:
            self.holding = "no chief state is stored"
            return None
        if not self.trusts(state):
            return None
        if state.generation is not None and state.generation < self.generation:
            return None  # e.g. a failover lost the newest write; the chief rewrites it
        if self.read_mark is not None and mark > self.read_mark:
            self._observed(mark, self.clock(), state.idle_ms)  # a write happened between two reads
        self.read_mark = mark
        self.generation = mark[0]
        if self.snapshots == 1:
            self.first_step = state.step
        if state.step != self.last_step:
            self.last_progress = self.clock()
        self.last_step = state.step
        live = self.live_mark is not None and mark >= self.live_mark
        settled = self._settled(state, mark)
        released = self._judge(
            state.step, state, live=live, by="a read of the state", settled=settled
        )
        if released is not None:
            return released
        # The chief announces every write. If reads keep finding a step that
        # moved while no message arrived, the subscription is dead (say, a
        # half-open connection): start a new one.
        if self.read_step is not None and state.step != self.read_step:
            self.reads_without_message += 1
        self.read_step = state.step
        if self.reads_without_message >= 2:
            self._say(logging.INFO, "the step moves but no announcement comes; resubscribing")
            self.resubscribe = True
        return None

    def _settled(self, state: ChiefState, mark: Mark) -> bool:
        """True once a finished or pinned state has stood unchanged for ``GRACE`` with no
        newer begin on record (docs/protocol.md#grace)."""
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
        if self.redis_lost:
            # the stall timeout holds again, counted from now: while Redis was
            # lost, no chief could be seen
            self.redis_lost = False
            self.last_alive = max(self.last_alive, self.clock())
            self._say(logging.INFO, "Redis answers again")
        if self.final_mark is not None and self.final_since + GRACE > self.clock():
            self.read_at = min(self.read_at, self.final_since + GRACE)

    def _judge(
        self,
        step: int,
        write: ChiefState | StepAnnouncement,
        *,
        live: bool,
        by: str,
        settled: bool = False,
    ) -> int | None:
        """Release, abort or go on at ``step`` by what ``write`` says, by
        docs/protocol.md#release."""
        vouch, done, pinned = write.vouch, write.done, write.pinned
        final_trusted = live or settled or self.run_id is not None
        if step >= self.target:
            if pinned and not done:
                if final_trusted:
                    return self.released(step, by=f"{by} (a step pinned by an operator)")
                self.holding = self._unseen(f"an operator pinned step {step}")
                self._warn_final(step)
                return None
            if done:
                if final_trusted and vouch:
                    return self.released(step, by=by)
                self.holding = (
                    self._unseen(f"the job's state says finished at step {step}")
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

    def _unseen(self, fact: str) -> str:
        grace = (
            "a newer chief has begun on it (it has not written yet)"
            if self.final_mark is None
            else f"gives a new chief {GRACE:g} s to begin before trusting it"
        )
        return (
            f"{fact}, but this wait did not see it happen, has no run id to tell it is "
            f"this run's, and {grace}"
        )

    def _warn_final(self, step: int) -> None:
        if self.final_mark is not None:
            return  # within the grace: trusted or not in a few seconds
        if self.run_id is None and not self.chief_seen:
            self._say(
                logging.WARNING,
                "found a job finished at step %s that this worker did not see "
                "finish, and a newer chief has begun on it without writing yet; without a "
                "run id it may be an earlier run's, so it neither releases nor aborts this "
                "wait, which waits for the new chief. Give each run its own run id "
                "(STEPBARRIER_RUN_ID, or the launcher's), or clear it with `stepbarrier reset`",
                step,
                topic="old-done",
            )

    def trusts(self, state: ChiefState) -> bool:
        """False for state this wait must ignore: another run's."""
        if state.run_id == self.run_id:
            return True
        self.other_run = state.run_id or "(none)"
        self.holding = f"the stored state belongs to run {self.other_run}"
        self._say(
            logging.INFO,
            "the stored state belongs to run %s, not to this worker's run %s; "
            "waiting for this run's chief",
            self.other_run,
            self.run_id or "(none)",
            topic="run",
        )
        return False

    def on_outside_step(self, step: int, hint: str = "") -> int | None:
        """Judge a read of the outside witness, trusted as it stands: the releasing step,
        or ``None`` (docs/protocol.md#source). ``hint`` is said once, in a WARNING, when
        it released a wait that never saw a write of its chief."""
        step = _integer(step, f"{self.outside} must be an integer step")
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
        if (  # Redis answered with no state of this job at all: "add a publisher"
            not self.chief_seen
            and self.reached
            and not self.redis_lost
            and self.read_mark is None
            and self.other_run is None
        ):
            self._say(
                logging.WARNING,
                "%s reached step %d before any write of this job's chief was seen on %s%s",
                self.outside,
                step,
                self.config.safe_url,
                f"; {hint}" if hint else "",
                topic="outside",
            )
        return self.released(step, by=str(self.outside))

    def on_redis_lost(self, exc: RedisUnavailable | RedisRefused) -> None:
        """Without an outside witness, the wait ends; with one, it goes on on the witness
        alone, and tries Redis again every ``REDIS_RETRY_EVERY`` seconds (never after a
        refusal: that needs an operator)."""
        if self.outside is None:
            super().on_redis_lost(exc)
        refused = isinstance(exc, RedisRefused)
        now = self.clock()
        self.read_at = math.inf if refused else now + REDIS_RETRY_EVERY
        self.resubscribe = False
        if self.redis_lost:
            return
        self.redis_lost = True
        # the witness alone now: at its own pace, not the pace Redis allowed
        self.source_at = min(self.source_at, now + self.outside_every[0])
        self._say(
            logging.WARNING,
            "%s; waiting on %s alone%s",
            exc,
            self.outside,
            "" if refused else f", and trying Redis again every {REDIS_RETRY_EVERY:g} s",
        )

    def subscribed(self) -> None:
        """A new confirmed subscription: what the old one missed no longer counts."""
        self.reads_without_message = 0
        self.read_step = None
        self.resubscribe = False

    def _observed(self, mark: Mark, when: float, idle_ms: int | None) -> None:
        """A write ``mark`` of this run, whose writer's loop had handed a step over
        ``idle_ms`` before it, was seen at ``clock()`` time ``when``."""
        if idle_ms is not None:
            # a duration on the writer's clock laid back from when this wait saw the
            # write (no clock compared with another), not before the wait began
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

    def _say(self, level: int, message: str, *args: object, topic: str = "") -> None:
        """Log ``message`` about the job (once per wait, with a ``topic``)."""
        if topic:
            if topic in self.warned:
                return
            self.warned.add(topic)
        self.log.log(level, "job %s: " + message, self.config.job, *args, stacklevel=2)

    # -- limits ---------------------------------------------------------------------

    def stall_at(self) -> float:
        """When the stall timeout passes, unless the chief is seen alive again (with an
        outside witness, never before a write of the chief was seen, nor while Redis is
        lost: docs/protocol.md#source)."""
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

    # -- logging and endings --------------------------------------------------------

    @property
    def heartbeat_age(self) -> float | None:
        """Seconds since the wait last observed a write of its run's chief (``None``: never)."""
        return max(0.0, self.clock() - self.last_alive) if self.chief_seen else None

    def _situation(self) -> str:
        """Where the wait stands, for progress lines and errors (all on this wait's clock)."""
        seen = "none" if self.last_step is None else str(self.last_step)
        age = self.heartbeat_age
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
            self._say(
                logging.WARNING,
                "no write of this job's chief seen on %s in %.0f s of waiting for "
                "step %d (%s). %s Still waiting%s",
                self.config.safe_url,
                now - self.started,
                self.target,
                self._situation(),
                self.no_chief_causes(),
                f"; {self.outside} can still release this worker" if self.outside else "",
                topic="no-chief",
            )
        if now >= self.progress_line_at:
            self.progress_line_at = now + PROGRESS_EVERY
            self._say(
                logging.INFO,
                "still waiting for step %d after %.0f s (%s)",
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
                f"{self.run_id or '(none)'}"
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

    def released(self, step: int, by: str) -> int:
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

    def timed_out(self, limit: Limit) -> BarrierTimeout:
        """The error of a passed limit, with the wait's context."""
        # the chief was heard within the stall timeout but its loop was not (a write
        # heard lately: a chief killed just after its loop went quiet is a process
        # that stopped writing, and is said so)
        quiet = (
            limit == "stall"
            and self.loop_alive is not None
            and self.clock() - self.last_alive < self.stall_timeout / 2
            and self.loop_alive < self.last_alive
        )
        if limit == "progress":
            why = (
                f"the chief's step did not move for {self.config.progress_timeout:g} s "
                "(progress timeout, STEPBARRIER_PROGRESS_TIMEOUT)"
            )
        elif quiet:
            why = (
                "the chief's process still writes, but its training loop has handed no "
                f"step over for {self.config.stall_timeout:g} s (stall timeout); a loop that "
                "died or hangs in a process that lives on, such as a caught error or a "
                "notebook"
            )
        elif limit == "stall":
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
        elif limit == "stall" and not quiet:
            hint = (
                "; if the job finished while this worker was cut off from Redis and Redis "
                "has since forgotten it (a restart, an eviction), no record of it is left"
            )
        return self._gave_up(why, limit, hint)

    def unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        """The error for a wait whose retries ran out: the timeout of the limit they ran
        to, or ``exc`` with this wait's context if it never reached Redis at all (a
        wrong URL, a server that is down)."""
        reached = self.limit_of_retries()
        if reached == "deadline" and self.deadline is not None:
            limit = f"overall timeout ({self.deadline - self.started:g} s)"
        elif reached == "progress":
            limit = f"progress timeout ({self.config.progress_timeout:g} s)"
        else:
            limit = f"stall timeout ({self.config.stall_timeout:g} s)"
        error = self._gave_up(f"{exc}; retried until the {limit}", reached)
        if self.reached:
            return error
        return RedisUnavailable(
            str(error),
            job=error.job,
            target=self.target,
            last_step=self.last_step,
            heartbeat_age=error.heartbeat_age,
        )

    def _gave_up(self, why: str, limit: Limit, hint: str = "") -> BarrierTimeout:
        return BarrierTimeout(
            f"job {self.config.job}: gave up waiting for step {self.target}: {why}; "
            f"{self._situation()}{hint}",
            job=self.config.job,
            target=self.target,
            last_step=self.last_step,
            heartbeat_age=self.heartbeat_age,
            stalled=limit != "deadline",
            limit=limit,
        )

    def proceed_after(self, exc: BarrierTimeout | RedisUnavailable) -> int:
        """The last step seen (0 if none), after a warning, for a wait that ended with
        ``exc`` under ``on_timeout="proceed"``; else raises ``exc``."""
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
            heartbeat_age=self.heartbeat_age,
            reason=reason,
        )
