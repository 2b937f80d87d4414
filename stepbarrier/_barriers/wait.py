"""One arrival at a named barrier, from the arrival to the release (``Barrier.arrive``).

Read the job's reset marker and arrive (one round trip), subscribe (and read
Redis's confirmation), then read the barrier and the marker: whatever happened
before the subscription is in what is read, whatever happens after it is
announced. Announcements are hints: the last arrival's, or a reset's, only
makes the wait read again, and the stored barrier decides: complete once each
party's own arrival is stored under the epoch this task arrived in; aborted
once the stored reset marker differs from the one read before the arrival (a
token, compared for equality only).

The wait remembers every arrival it has read. A read that finds the barrier
gone, begun anew, or missing arrivals it had seen (a Redis that restarted
empty, an eviction) arrives again and records them again on their tasks'
behalf, so a worker that arrived and left (``wait=False``) is not lost; an
arrival lost before any waiting party read it is named as missing, and the
timeout says that Redis lost arrivals.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

import redis

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.barrier_library import (
    BARRIER_EPOCH_ENDED,
    BARRIER_OTHER_PARTIES,
    BARRIER_RESTORABLE,
)
from stepbarrier._protocol.barrier_record import (
    BarrierState,
    describe_tasks,
    epoch_token,
    list_tasks,
    parse_barrier_notice,
    state_from_read,
)
from stepbarrier._protocol.calls import Call, barrier_arrive_call
from stepbarrier._protocol.wire import parse_int
from stepbarrier._redis.bounded import call_timeout
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode, publish_command
from stepbarrier._redis.retries import call_with_retries
from stepbarrier._redis.subscription import Subscription
from stepbarrier._worker.timing import READ, RESUBSCRIBE, LastChance, Limit, Receive, WaitTiming
from stepbarrier.errors import BarrierAborted, BarrierTimeout, ConfigurationError, RedisUnavailable

log = logging.getLogger("stepbarrier._barriers.barrier")

T = TypeVar("T")

MAX_INDEXED_BARRIERS = 1000
"""Most barriers a job's index keeps (the newest; ``status`` shows them). Nothing
else depends on the index: older barriers expire, and are stale after a reset
or the job's finish whatever it holds."""
_UNREAD = object()
"""The reset marker before the wait has read it."""


@dataclass(frozen=True)
class Party:
    """What one arrival needs of its ``Barrier``: who arrives where, and its links.

    Attributes:
        config: The job's settings.
        name: The barrier's name.
        member: Its member in the job's index (the name, with the run id).
        key: Its hash.
        parties: How many tasks it waits for.
        task_id: The arriving task.
        code: The Functions runner on the barrier's client (made on first use).
        connected: The barrier's client (made on first use).
        clock: Monotonic seconds.
        sleep: Sleeps between retries.
    """

    config: BarrierConfig
    name: str
    member: str
    key: str
    parties: int
    task_id: int
    code: Callable[[], RedisCode]
    connected: Callable[[], RedisClient]
    clock: Callable[[], float]
    sleep: Callable[[float], None]


class _BarrierTiming(WaitTiming):
    """A barrier wait's timing: the stall limit counts from the last arrival seen."""

    def __init__(self, wait: BarrierWait, timeout: float | None) -> None:
        config = wait.config
        super().__init__(
            wait.clock,
            timeout,
            stall_timeout=config.stall_timeout,
            fallback_interval=config.fallback_interval,
        )
        self.wait = wait

    def log_progress(self) -> None:
        super().log_progress()
        self.wait.log_progress()

    def timed_out(self, limit: Limit) -> BarrierTimeout:
        return self.wait.timeout(stalled=limit != "deadline")


class BarrierWait:
    """One ``Barrier.arrive`` call: arrive, subscribe, read, then wait for the news."""

    def __init__(self, barrier: Party, timeout: float | None) -> None:
        self.barrier = barrier
        self.config = barrier.config
        self.clock = barrier.clock
        self.timing = _BarrierTiming(self, timeout)
        self.started = self.timing.started
        self.start_ms: int | None = None
        self.state: BarrierState | None = None  # the latest read of this task's epoch
        self.epoch = ""  # the epoch token this task's arrival was recorded under
        self.seen: dict[int, int] = {}  # task -> arrival (ms): every arrival read
        self.reset_marker: object = _UNREAD  # the marker read before the arrival
        self.lost = False  # a read found arrivals gone that were stored before
        self.seen_last_ms: int | None = None
        self.pubsub: Subscription | None = None
        self.subscriptions = 0
        self._code_of: RedisCode | None = None

    def run(self, *, wait: bool) -> bool:
        try:
            if self._arrive(read_marker=wait):
                return True
            return self._wait() if wait else False
        except RedisUnavailable as exc:
            error = self._unreachable(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            self._close_pubsub()
            code, self._code_of = self._code_of, None
            if code is not None:
                code.close()

    def _code(self) -> RedisCode:
        """This wait's code runner, on the barrier's client: its calls are bounded
        by the wait's time (on a connection of their own, closed at the end)."""
        if self._code_of is None:
            self._code_of = RedisCode(self.barrier.connected(), self.config)
        return self._code_of

    def _retry(self, operation: Callable[[float], T], action: str) -> T:
        """``operation(timeout)``, retried until the wait's limit; each try may take
        the time left to it (``CALL_FLOOR`` at least), so that the wait ends within
        its limits against a Redis that hangs too."""
        deadline = self.timing.retry_deadline()
        return call_with_retries(
            lambda: operation(call_timeout(deadline, self.clock())),
            self.config,
            action=action,
            deadline=deadline,
            clock=self.clock,
            sleep=self.barrier.sleep,
        )

    def _arrive(self, *, read_marker: bool = False, restore: Sequence[int] = ()) -> bool:
        """Record this task (again), and the arrivals of ``restore`` on their behalf;
        True if the stored arrivals complete the barrier (now or before).

        ``read_marker``: read the reset marker first, in the same round trip.
        """
        b, keys = self.barrier, self.config.keys
        calls: list[Call] = [("waiter_read", [b.key, keys.reset], [])] if read_marker else []
        arrive = barrier_arrive_call(
            barrier=b.key,
            index=keys.barrier_index,
            epoch=keys.barrier_epoch,
            member=b.member,
            task_id=b.task_id,
            parties=b.parties,
            key_ttl=self.config.key_ttl,
            channel=keys.barrier_channel,
            publish_command=publish_command(self.config),
            run_id=self.config.run_id or "",
            max_indexed=MAX_INDEXED_BARRIERS,
            arrived_under=self.epoch,
            restore=[(task, self.seen[task]) for task in restore],
        )
        calls.append(arrive)
        replies = self._retry(
            lambda timeout: self._code().pipeline(calls, timeout=timeout),
            f"arrive at barrier {b.name!r}",
        )
        if read_marker:
            self._check_reset(replies[0][1])
        reply = replies[-1]
        status, now_ms, _arrived, parties, completed_ms = (parse_int(r) or 0 for r in reply[:5])
        if status == BARRIER_OTHER_PARTIES:
            raise ConfigurationError(
                f"barrier {b.name!r} of job {self.config.job} was begun with {parties} "
                f"parties, but this task says {b.parties}: every party must give the same number",
                variable="parties",
                job=self.config.job,
            )
        if status == BARRIER_EPOCH_ENDED:
            ended_by = reply[8].decode() if isinstance(reply[8], bytes) else str(reply[8])
            raise self._aborted("done" if ended_by == "finish" else "reset")
        epoch = epoch_token(reply[6]) or ""
        if epoch != self.epoch:
            if self.epoch and parse_int(reply[7]) != BARRIER_RESTORABLE:
                # a reset began the new epoch: what this wait saw belongs to the old one
                self.seen.clear()
            self.epoch, self.state = epoch, None
        self.seen.setdefault(b.task_id, now_ms)
        if self.start_ms is None:
            self.start_ms = now_ms
            log.info(
                "job %s: task %d arrived at barrier %r (%d parties)",
                self.config.job,
                b.task_id,
                b.name,
                b.parties,
            )
        if completed_ms:
            self._released("an arrival")
            return True
        return False

    def _wait(self) -> bool:
        timing = self.timing
        released = self._reconnect()
        while not released:
            action = timing.next_action(self.clock())
            if isinstance(action, Receive):
                released = self._receive(action.timeout)
            elif action is READ:
                released = self._read()
            elif isinstance(action, LastChance):
                released = self._last_chance()
                if not released:
                    timing.raise_if_passed(action.limit)
            else:
                assert action is RESUBSCRIBE, action  # a barrier wait has no outside witness
                released = self._reconnect()
        return True

    def _receive(self, timeout: float) -> bool:
        """Take the next notice, if one comes within ``timeout`` seconds; True once complete."""
        assert self.pubsub is not None
        try:
            message = self.pubsub.get_message(timeout=timeout)
        except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
            log.info("job %s: barrier subscription lost (%s)", self.config.job, exc)
            return self._reconnect()
        notice = None if message is None else parse_barrier_notice(message)
        # a hint (anyone who may arrive may announce): the stored barrier and
        # reset marker, read after it, decide
        return (notice == "reset" or notice == self.barrier.member) and self._read()

    def _reconnect(self) -> bool:
        """Subscribe, read the confirmation, then read the barrier (in that order)."""
        self._close_pubsub()
        refresh = self.subscriptions > 0  # a cluster's slot may have moved
        self.pubsub = self._retry(
            lambda timeout: Subscription.open(
                self.barrier.connected(),
                self.config.keys.barrier_channel,
                refresh_topology=refresh,
                timeout=timeout,
            ),
            f"subscribe to {self.config.keys.barrier_channel}",
        )
        self.subscriptions += 1
        return self._read()

    def _read(self) -> bool:
        """Read the barrier and the reset marker: the truth. True once complete."""
        b = self.barrier
        reply = self._retry(
            lambda timeout: list(
                self._code().call(
                    "waiter_read", [b.key, self.config.keys.reset], [], timeout=timeout
                )
            ),
            f"read barrier {b.name!r}",
        )
        self.timing.read_done()
        self._check_reset(reply[1])
        state = state_from_read(b.member, reply, parties=b.parties)
        if state is not None and state.epoch == self.epoch:
            for task, at in state.arrivals:
                self.seen.setdefault(task, at)
            stored = set(state.arrived)
            lost = sorted(task for task in self.seen if task not in stored)
        else:
            # gone (expired, evicted, a Redis that restarted empty), or begun anew
            # under another epoch since this task arrived: nothing of it is ours
            lost = sorted(self.seen)
        if lost:
            self.lost = True
            log.warning(
                "job %s: barrier %r lost arrivals of task(s) %s; arriving again and "
                "recording them again",
                self.config.job,
                b.name,
                describe_tasks(lost),
            )
            return self._arrive(restore=[task for task in lost if task != b.task_id])
        assert state is not None
        self.state = state
        if state.complete:
            self._released("a read of the barrier")
            return True
        if state.last_ms is not None and state.last_ms != self.seen_last_ms:
            self.seen_last_ms = state.last_ms
            age = max(0.0, ((parse_int(reply[0]) or 0) - state.last_ms) / 1000)
            self.timing.last_alive = max(self.timing.last_alive, self.clock() - age)
        return False

    def _last_chance(self) -> bool:
        """One last read at a passed limit (the release may have come)."""
        try:
            return self._read()
        except RedisUnavailable:
            return False

    def _check_reset(self, marker: object) -> None:
        """Abort if the stored reset marker is another than the one read first.

        The marker is a token: only equality counts, never its value. A marker
        that is gone (expired, or a Redis that restarted empty) is no reset.
        """
        if self.reset_marker is _UNREAD:
            self.reset_marker = marker
        elif marker is not None and marker != self.reset_marker:
            raise self._aborted()

    def _missing(self) -> tuple[int, ...]:
        """The tasks this wait has not seen arrive (in any read, or stored now)."""
        arrived = set(self.seen) | set(self.state.arrived if self.state is not None else ())
        return tuple(task for task in range(self.barrier.parties) if task not in arrived)

    def timeout(self, *, stalled: bool, cause: str | None = None) -> BarrierTimeout:
        """The error of a passed limit, with the barrier's missing tasks."""
        b, missing = self.barrier, self._missing()
        if cause is not None:
            why = cause
        elif stalled:
            why = f"no task arrived for {self.config.stall_timeout:g} s (stall timeout)"
        else:
            assert self.timing.deadline is not None
            why = f"overall timeout of {self.timing.deadline - self.started:g} s passed"
        lost = ""
        if self.lost:
            lost = (
                "; Redis lost arrivals at this barrier while this task waited (its record "
                "disappeared or was begun anew: a restart or an eviction?), so a missing "
                "task may have arrived before that, unseen by this task"
            )
        return BarrierTimeout(
            f"job {self.config.job}: gave up at barrier {b.name!r} after "
            f"{self.clock() - self.started:.1f} s: {why}; {b.parties - len(missing)} of "
            f"{b.parties} tasks arrived, missing task(s) {list_tasks(missing)}{lost}",
            job=self.config.job,
            stalled=stalled,
            limit="stall" if stalled else "deadline",
            barrier=b.name,
            missing=missing,
        )

    def _unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        if self.start_ms is None:  # never reached Redis at all
            return exc
        deadline = self.timing.deadline
        overall = deadline is not None and deadline <= self.timing.stall_at()
        return self.timeout(stalled=not overall, cause=f"{exc}; retried until the timeout")

    def _aborted(self, reason: str = "reset") -> BarrierAborted:
        what = "finished" if reason == "done" else "was reset"
        return BarrierAborted(
            f"job {self.config.job} {what} while task {self.barrier.task_id} waited at "
            f"barrier {self.barrier.name!r}",
            job=self.config.job,
            reason=reason,
            barrier=self.barrier.name,
        )

    def _released(self, by: str) -> None:
        log.info(
            "job %s: barrier %r complete after %.3f s, by %s",
            self.config.job,
            self.barrier.name,
            self.clock() - self.started,
            by,
        )

    def log_progress(self) -> None:
        """The progress line: how long, and who is missing."""
        log.info(
            "job %s: still waiting at barrier %r after %.0f s; missing task(s) %s",
            self.config.job,
            self.barrier.name,
            self.clock() - self.started,
            describe_tasks(self._missing()),
        )

    def _close_pubsub(self) -> None:
        pubsub, self.pubsub = self.pubsub, None
        if pubsub is not None:
            pubsub.close()
