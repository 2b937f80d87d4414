"""What one arrival at a named barrier decides, without any I/O (``BarrierRules``).

The arrival (``Barrier.arrive``, driven by ``BarrierWait``) waits as
docs/protocol.md#barriers says (its **Wait**): announcements are hints, and the
stored barrier and reset marker decide. The wait remembers every arrival it has
read, so that arrivals Redis lost are recorded again on their tasks' behalf.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.barrier_record import (
    BarrierState,
    describe_tasks,
    epoch_token,
    state_from_read,
)
from stepbarrier._protocol.library import (
    BARRIER_EPOCH_ENDED,
    BARRIER_OTHER_PARTIES,
    BARRIER_RESTORABLE,
)
from stepbarrier._protocol.wire import parse_int
from stepbarrier._worker.timing import Limit, WaitTiming
from stepbarrier.errors import BarrierAborted, BarrierTimeout, ConfigurationError, RedisUnavailable

log = logging.getLogger("stepbarrier._barriers.barrier")

MAX_INDEXED_BARRIERS = 1000
"""Most barriers a job's index keeps (the newest; ``status`` shows them). Nothing
else depends on the index: older barriers expire, and are stale after a reset
or the job's finish whatever it holds."""
_UNREAD = object()  # the reset marker before the wait has read it
READ_ALL: Literal["read all"] = "read all"
"""A party's O(1) read's answer: arrivals may be lost; read every one to know which."""


@dataclass(frozen=True)
class ArriveAgain:
    """A read's answer: Redis lost arrivals; arrive again, and record those of
    ``restore`` (as this wait saw them) on their tasks' behalf."""

    restore: tuple[int, ...]


class BarrierRules(WaitTiming):
    """The decisions of one arrival of ``task_id`` at barrier ``name`` (``member``: its
    member in the job's index, the name with the run id), for ``parties`` tasks; its
    timing is a ``WaitTiming`` whose stall limit counts from the last arrival seen."""

    def __init__(
        self,
        config: BarrierConfig,
        name: str,
        member: str,
        parties: int,
        task_id: int,
        clock: Callable[[], float],
        timeout: float | None,
    ) -> None:
        super().__init__(
            clock,
            timeout,
            stall_timeout=config.stall_timeout,
            fallback_interval=config.fallback_interval,
        )
        self.config = config
        self.name, self.member, self.parties, self.task_id = name, member, parties, task_id
        self.start_ms: int | None = None  # Redis's time of this task's first arrival
        self.state: BarrierState | None = None  # the latest read of this task's epoch
        self.epoch = ""  # the epoch token this task's arrival was recorded under
        self.seen: dict[int, int] = {}  # task -> arrival (ms): every arrival read
        self.reset_marker: object = _UNREAD  # the marker read before the arrival
        self.lost = False  # a read found arrivals gone that were stored before
        self.seen_last_ms: int | None = None
        self.read_all_last_ms: int | None = None  # the stored last_ms at the last full read

    def on_arrival(self, reply: list[Any]) -> Literal[True] | None:
        """Judge an arrival's reply: ``True`` if the stored arrivals complete the
        barrier (now or before); raises ``ConfigurationError`` (begun with another
        number of parties) or ``BarrierAborted`` (the job's barrier epoch ended)."""
        status, now_ms, _arrived, parties, completed_ms = (parse_int(r) or 0 for r in reply[:5])
        if status == BARRIER_OTHER_PARTIES:
            raise ConfigurationError(
                f"barrier {self.name!r} of job {self.config.job} was begun with {parties} "
                f"parties, but this task says {self.parties}: every party must give the same "
                "number",
                variable="parties",
                job=self.config.job,
            )
        if status == BARRIER_EPOCH_ENDED:
            ended_by = reply[8].decode() if isinstance(reply[8], bytes) else str(reply[8])
            raise self.aborted("done" if ended_by == "finish" else "reset")
        epoch = epoch_token(reply[6]) or ""
        if epoch != self.epoch:
            if self.epoch and parse_int(reply[7]) != BARRIER_RESTORABLE:
                # a reset began the new epoch: what this wait saw belongs to the old one
                self.seen.clear()
            self.epoch, self.state = epoch, None
        self.seen.setdefault(self.task_id, now_ms)
        if self.start_ms is None:
            self.start_ms = now_ms
            log.info(
                "job %s: task %d arrived at barrier %r (%d parties)",
                self.config.job,
                self.task_id,
                self.name,
                self.parties,
            )
        return self.released("an arrival") if completed_ms else None

    def on_read(self, reply: list[Any]) -> Literal[True, "read all"] | ArriveAgain | None:
        """Judge a read of the barrier and the reset marker (the truth): ``True`` once
        complete, ``ArriveAgain`` if Redis lost arrivals, ``READ_ALL`` if a party's
        O(1) read finds arrivals to learn or lost, else ``None``; raises ``BarrierAborted``
        (a reset since this task arrived)."""
        self.check_reset(reply[1])
        state = state_from_read(self.member, reply, parties=self.parties)
        lost = sorted(self.seen)
        if state is not None and state.epoch == self.epoch and state.counted is not None:
            # fewer task fields than parties: read them all only if this task's is not
            # stored, they are not as many as the arrivals seen (new ones to learn,
            # which Redis may lose, or lost ones; a forged field costs a full read), or
            # an arrival happened since the last full read (every arrival rewrites
            # last_ms): one lost while another arrived leaves the count as it was
            if (
                self.task_id not in state.arrived
                or state.counted != len(self.seen)
                or state.last_ms != self.read_all_last_ms
            ):
                return READ_ALL
            lost = []
        elif state is not None and state.epoch == self.epoch:
            self.read_all_last_ms = state.last_ms
            for task, at in state.arrivals:
                self.seen.setdefault(task, at)
            stored = set(state.arrived)
            lost = sorted(task for task in self.seen if task not in stored)
        # else gone (expired, evicted, a Redis that restarted empty), or begun anew
        # under another epoch since this task arrived: nothing of it is ours
        if lost:
            self.lost = True
            log.warning(
                "job %s: barrier %r lost arrivals of task(s) %s; arriving again and "
                "recording them again",
                self.config.job,
                self.name,
                describe_tasks(lost),
            )
            return ArriveAgain(tuple(task for task in lost if task != self.task_id))
        assert state is not None
        self.state = state
        if state.complete:
            return self.released("a read of the barrier")
        if state.last_ms is not None and state.last_ms != self.seen_last_ms:
            self.seen_last_ms = state.last_ms
            age = max(0.0, ((parse_int(reply[0]) or 0) - state.last_ms) / 1000)
            self.last_alive = max(self.last_alive, self.clock() - age)
        return None

    def concerns(self, notice: str | None) -> bool:
        """True if a notice of the barrier channel is worth a read: a hint (anyone who
        may arrive may announce); the stored barrier and reset marker decide."""
        return notice == "reset" or notice == self.member

    def check_reset(self, marker: object) -> None:
        """Abort if the stored reset marker is another than the one read first (a token:
        only equality counts; one gone is no reset)."""
        if self.reset_marker is _UNREAD:
            self.reset_marker = marker
        elif marker is not None and marker != self.reset_marker:
            raise self.aborted()

    def missing(self) -> tuple[int, ...]:
        """The tasks this wait has not seen arrive (in any read, or stored now)."""
        arrived = set(self.seen) | set(self.state.arrived if self.state is not None else ())
        return tuple(task for task in range(self.parties) if task not in arrived)

    def timed_out(self, limit: Limit, cause: str | None = None) -> BarrierTimeout:
        """The error of a passed limit, with the barrier's missing tasks."""
        stalled, missing = limit != "deadline", self.missing()
        if cause is not None:
            why = cause
        elif stalled:
            why = f"no task arrived for {self.config.stall_timeout:g} s (stall timeout)"
        else:
            assert self.deadline is not None
            why = f"overall timeout of {self.deadline - self.started:g} s passed"
        listed = describe_tasks(missing, limit=50, spans=False)
        lost = ""
        if self.lost:
            lost = (
                "; Redis lost arrivals at this barrier while this task waited (its record "
                "disappeared or was begun anew: a restart or an eviction?), so a missing "
                "task may have arrived before that, unseen by this task"
            )
        return BarrierTimeout(
            f"job {self.config.job}: gave up at barrier {self.name!r} after "
            f"{self.clock() - self.started:.1f} s: {why}; {self.parties - len(missing)} of "
            f"{self.parties} tasks arrived, missing task(s) {listed}{lost}",
            job=self.config.job,
            stalled=stalled,
            barrier=self.name,
            missing=missing,
        )

    def unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        """The error for a wait whose retries ran out: ``exc`` if it never reached
        Redis, else the timeout its retries ran to."""
        if self.start_ms is None:
            return exc
        return self.timed_out(self.limit_of_retries(), f"{exc}; retried until the timeout")

    def aborted(self, reason: str = "reset") -> BarrierAborted:
        what = "finished" if reason == "done" else "was reset"
        return BarrierAborted(
            f"job {self.config.job} {what} while task {self.task_id} waited at "
            f"barrier {self.name!r}",
            job=self.config.job,
            reason=reason,
            barrier=self.name,
        )

    def released(self, by: str) -> Literal[True]:
        log.info(
            "job %s: barrier %r complete after %.3f s, by %s",
            self.config.job,
            self.name,
            self.clock() - self.started,
            by,
        )
        return True

    def log_progress(self) -> None:
        """The progress line: how long, and who is missing (after an O(1) read: how
        many arrived at most)."""
        super().log_progress()
        counted = self.state.counted if self.state is not None else None
        log.info(
            "job %s: still waiting at barrier %r after %.0f s; %s",
            self.config.job,
            self.name,
            self.clock() - self.started,
            f"missing task(s) {describe_tasks(self.missing())}"
            if counted is None
            else f"at most {counted} of {self.parties} tasks arrived",
        )
