"""What one wait decides, without any I/O: shared by the threaded and the asyncio waiter.

``StepWaiter`` (``stepbarrier.waiter``) and ``AsyncStepWaiter``
(``stepbarrier.aio``) each drive a wait: they subscribe, read the stored state,
receive announcements and keep time. What each of those means is decided here,
once: which run's state a wait trusts, when a reset marker aborts it, how chief
generations are ordered, when a stored step may release it
(``freshness.vouches_for_step``), and when its overall, stall or progress
timeout has passed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Literal

from stepbarrier.config import BarrierConfig
from stepbarrier.errors import BarrierAborted, BarrierTimeout, RedisUnavailable
from stepbarrier.freshness import heartbeat_age, vouches_for_step
from stepbarrier.protocol import ChiefState, StepAnnouncement, preview
from stepbarrier.waiter_link import Snapshot

PROGRESS_EVERY = 30.0
"""Seconds between progress lines while a wait goes on."""

Limit = Literal["deadline", "stall", "progress"]
"""Which limit of a wait has passed."""


class ReadNow:
    """An announcement's answer: read the state before deciding anything."""


READ_NOW = ReadNow()
"""Returned for an announcement of a chief generation the wait has not read yet."""


class WaitRules:
    """The decisions of one wait for ``target``.

    Args:
        config: The job's settings.
        target: The step waited for (``>= 1``).
        timeout: Overall limit in seconds, or ``None``.
        clock: Monotonic clock.
        log: Where the wait's lines go (the driver's logger).
    """

    def __init__(
        self,
        config: BarrierConfig,
        target: int,
        timeout: float | None,
        clock: Callable[[], float],
        log: logging.Logger,
    ) -> None:
        self.config = config
        self.target = target
        self.clock = clock
        self.log = log
        self.started = clock()
        self.deadline = None if timeout is None else self.started + timeout
        self.last_step: int | None = None
        self.generation = 0
        self.heartbeat_age: float | None = None
        self.last_alive = self.started
        self.start_ms: int | None = None
        self.reads_without_message = 0
        self.read_step: int | None = None
        self.resubscribe = False
        self.next_progress = self.started + PROGRESS_EVERY
        self.last_progress = self.started
        self.warned: set[str] = set()

    def begin(self) -> None:
        """Say that the wait begins."""
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

        A step returned here was announced by the chief's script that also
        removed the wait's target from the index.

        Raises:
            BarrierAborted: The job was reset, or finished short of the target.
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
            raise self.aborted("reset")
        assert announcement.step is not None and announcement.generation is not None
        if announcement.run_id != self.config.run_id:
            return None  # another run's chief: it neither releases nor aborts us
        if announcement.generation < self.generation:
            return None  # an older chief's announcement, overtaken by what we read
        if announcement.generation > self.generation:
            # a chief generation this wait has not read yet: the state (and a
            # reset marker this wait may have missed the announcement of) decide
            return READ_NOW
        self._seen_step(announcement.step)
        self.last_alive = self.clock()
        self.heartbeat_age = 0.0
        if announcement.step >= self.target:
            return self.released(announcement.step, by="an announcement")
        if announcement.done:
            raise self.aborted("done")
        return None

    def on_snapshot(self, snapshot: Snapshot) -> int | None:
        """Judge a read of the stored state (the truth): the releasing step, or ``None``.

        Raises:
            BarrierAborted: The job was reset since the wait began, or finished
                short of the target.
        """
        now_ms, reset_ms, state = snapshot.now_ms, snapshot.reset_ms, snapshot.state
        if self.start_ms is None:
            self.start_ms = now_ms
        if reset_ms is not None and reset_ms >= self.start_ms:
            raise self.aborted("reset")  # whatever a chief wrote since
        if state.problem:
            self.log.warning("job %s: %s; waiting for a valid step", self.config.job, state.problem)
        if state.step is None or state.generation is None or not self.trusts(state):
            return None
        if state.generation < self.generation:
            return None  # e.g. a failover lost the newest write; the chief rewrites it
        self.generation = state.generation
        self._seen_step(state.step)
        self.heartbeat_age = heartbeat_age(state, now_ms)
        if self.heartbeat_age is not None:
            self.last_alive = max(self.last_alive, self.clock() - self.heartbeat_age)
        if state.step >= self.target and vouches_for_step(state, now_ms, self.config.heartbeat):
            return self.released(state.step, by="a read of the state")
        if state.done and state.step < self.target:
            raise self.aborted("done")
        self._check_subscription(state.step)
        return None

    def trusts(self, state: ChiefState) -> bool:
        """False for state this wait must ignore: another run's, or an old finished one."""
        run_id = self.config.run_id
        if state.run_id != run_id:
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
        assert self.start_ms is not None
        done_ms = state.done_ms if state.done else None
        if run_id is None and done_ms is not None and done_ms < self.start_ms:
            # finished before we started, and no run id says it is ours:
            # most likely an earlier run under the same job name
            self._warn_once(
                "old-done",
                logging.WARNING,
                "job %s: found a job finished %.0f s before this worker started (step %s); "
                "not trusting it and waiting for a new chief. Give each run its own "
                "STEPBARRIER_RUN_ID, or wait STEPBARRIER_DONE_TTL (%d s) for the finished "
                "state to expire, or clear it with `stepbarrier reset`",
                self.config.job,
                (self.start_ms - done_ms) / 1000.0,
                state.step,
                self.config.done_ttl,
            )
            return False
        return True

    def heard(self, announcement: StepAnnouncement | None, at: float) -> None:
        """Take in an announcement judged elsewhere not to concern this wait: the
        subscription is alive, and (if it is this run's and generation's) so is
        the chief, at ``clock()`` time ``at``, at its step. Never a release or an
        abort: a step below the target (``AsyncStepWaiter`` shares one
        subscription among many waits and wakes only those an announcement
        concerns; the others take in the rest when they next act).
        """
        self.reads_without_message = 0
        if announcement is None or announcement.step is None:
            return
        if announcement.run_id != self.config.run_id or announcement.generation != self.generation:
            return
        if self.last_step is not None and announcement.step < self.last_step:
            return  # older than what this wait has read
        self._seen_step(announcement.step, at)
        if at > self.last_alive:
            self.last_alive = at
            self.heartbeat_age = max(0.0, self.clock() - at)

    def subscribed(self) -> None:
        """A new confirmed subscription: what the old one missed no longer counts."""
        self.reads_without_message = 0
        self.read_step = None
        self.resubscribe = False

    def _warn_once(self, topic: str, level: int, message: str, *args: object) -> None:
        if topic not in self.warned:
            self.warned.add(topic)
            self.log.log(level, message, *args)

    def _seen_step(self, step: int, at: float | None = None) -> None:
        if step != self.last_step:
            self.last_progress = self.clock() if at is None else max(self.last_progress, at)
        self.last_step = step

    def _check_subscription(self, step: int) -> None:
        # The chief announces every change of step within a heartbeat. If reads
        # keep finding a step that moved while no message arrived, the
        # subscription is dead (say, a half-open connection): start a new one.
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
        """When the stall timeout passes, unless the chief is seen alive again."""
        return self.last_alive + self.config.stall_timeout

    def retry_deadline(self) -> float:
        """How long Redis may stay unreachable: the stall or the overall timeout."""
        stall = self.stall_at()
        return stall if self.deadline is None else min(stall, self.deadline)

    def progress_at(self) -> float | None:
        """When the progress timeout passes, unless the step moves."""
        limit = self.config.progress_timeout
        return None if limit is None else self.last_progress + limit

    def next_stop(self, next_read: float) -> float:
        """The earliest moment the driver must act again by itself."""
        moments = (
            next_read,
            self.next_progress,
            self.stall_at(),
            self.deadline,
            self.progress_at(),
        )
        return min(t for t in moments if t is not None)

    def passed(self, now: float) -> Limit | None:
        """The limit passed at ``now``: the driver then reads once more (a release
        may have come) and hands the outcome to ``after_last_chance``."""
        if self.deadline is not None and now >= self.deadline:
            return "deadline"
        if now >= self.stall_at():
            return "stall"
        progress_at = self.progress_at()
        if progress_at is not None and now >= progress_at:
            return "progress"
        return None

    def after_last_chance(self, limit: Limit, released: int | None) -> int | None:
        """The wait's end after the last read: released, or the timeout, or go on.

        Raises:
            BarrierTimeout: The limit still holds after the last read.
        """
        if released is not None:
            return released
        if limit == "deadline":
            raise self.timeout(stalled=False)
        if limit == "stall" and self.clock() >= self.stall_at():
            raise self.timeout(stalled=True)
        progress_at = self.progress_at()
        if limit == "progress" and progress_at is not None and self.clock() >= progress_at:
            raise self.timeout(stalled=True, progress=True)
        return None  # the read saw the chief alive (or moving) again

    # -- logging and endings --------------------------------------------------------

    def log_progress(self) -> None:
        """A progress line (call when ``clock() >= next_progress``)."""
        self.next_progress = self.clock() + PROGRESS_EVERY
        age = "unknown" if self.heartbeat_age is None else f"{self.heartbeat_age:.1f} s"
        self.log.info(
            "job %s: still waiting for step %d after %.0f s (chief at step %s, heartbeat %s ago)",
            self.config.job,
            self.target,
            self.clock() - self.started,
            "none yet" if self.last_step is None else self.last_step,
            age,
        )

    def released(self, step: int, *, by: str) -> int:
        """Log the release and return the step."""
        self.log.info(
            "job %s: released at step %d (target %d) after %.3f s, by %s",
            self.config.job,
            step,
            self.target,
            self.clock() - self.started,
            by,
        )
        self.last_step = step
        return step

    def timeout(self, *, stalled: bool, progress: bool = False) -> BarrierTimeout:
        """The error of a passed limit, with the wait's context."""
        age = "never seen" if self.heartbeat_age is None else f"{self.heartbeat_age:.1f} s old"
        seen = "none" if self.last_step is None else str(self.last_step)
        if progress:
            why = (
                f"the chief's step did not move for {self.config.progress_timeout:g} s "
                "(progress timeout, STEPBARRIER_PROGRESS_TIMEOUT)"
            )
        elif stalled:
            why = f"no chief heartbeat for {self.config.stall_timeout:g} s (stall timeout)"
        else:
            why = f"overall timeout of {self.deadline and self.deadline - self.started:g} s passed"
        return BarrierTimeout(
            f"job {self.config.job}: gave up waiting for step {self.target}: {why}; "
            f"last step seen {seen}, chief heartbeat {age}",
            job=self.config.job,
            target=self.target,
            last_step=self.last_step,
            heartbeat_age=self.heartbeat_age,
            stalled=stalled,
        )

    def unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        """The error for a wait whose retries ran out: ``exc`` with this wait's context.

        A wait that had reached Redis and then lost it until its stall or overall
        timeout ends with ``BarrierTimeout`` (its chief went unseen for that long;
        the message says why); one that never reached Redis at all (a wrong URL, a
        server that is down) ends with ``RedisUnavailable``.
        """
        overall = self.deadline is not None and self.deadline <= self.stall_at()
        if overall and self.deadline is not None:
            limit = f"overall timeout ({self.deadline - self.started:g} s)"
        else:
            limit = f"stall timeout ({self.config.stall_timeout:g} s)"
        age = None if self.heartbeat_age is None else max(0.0, self.clock() - self.last_alive)
        seen = "none" if self.last_step is None else str(self.last_step)
        message = (
            f"job {self.config.job}: gave up waiting for step {self.target}: {exc}; retried "
            f"until the {limit}; last step seen {seen}, chief heartbeat "
            + ("never seen" if age is None else f"{age:.1f} s old")
        )
        job, target, last = self.config.job, self.target, self.last_step
        if self.start_ms is None:
            return RedisUnavailable(
                message, job=job, target=target, last_step=last, heartbeat_age=age
            )
        return BarrierTimeout(
            message, job=job, target=target, last_step=last, heartbeat_age=age, stalled=not overall
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
            heartbeat_age=self.heartbeat_age,
            reason=reason,
        )
