"""One arrival at a named barrier, from the arrival to the release (``Barrier.arrive``).

Arrive, subscribe (and read Redis's confirmation), then read the barrier and the
job's reset marker: whatever happened before the subscription is in what is
read, whatever happens after it is announced. The announcement of the last
arrival releases the wait; the stored barrier is the truth and is read again
after every reconnect and every ``fallback_interval``. A barrier that lost this
task's arrival (expired, or a Redis that restarted empty) is arrived at again.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import redis

from stepbarrier.barrier_scripts import BARRIER_OTHER_PARTIES
from stepbarrier.barrier_state import (
    BarrierState,
    describe_tasks,
    list_tasks,
    parse_barrier_notice,
    state_from_read,
)
from stepbarrier.connection import call_with_retries
from stepbarrier.errors import BarrierAborted, BarrierTimeout, ConfigurationError, RedisUnavailable
from stepbarrier.protocol import parse_int
from stepbarrier.redis_code import publish_command
from stepbarrier.subscription import Subscription

if TYPE_CHECKING:
    from stepbarrier.barrier import Barrier

log = logging.getLogger("stepbarrier.barrier")

MAX_INDEXED_BARRIERS = 1000
"""Most barriers a job's index keeps (the newest); older ones only expire."""
PROGRESS_EVERY = 30.0
"""Seconds between progress lines while a wait goes on."""


class BarrierWait:
    """One ``Barrier.arrive`` call: arrive, subscribe, read, then wait for the news."""

    def __init__(self, barrier: Barrier, timeout: float | None) -> None:
        self.barrier = barrier
        self.config = barrier.config
        self.clock = barrier._clock
        self.started = self.clock()
        self.deadline = None if timeout is None else self.started + timeout
        self.last_alive = self.started
        self.start_ms: int | None = None
        self.state: BarrierState | None = None
        self.seen_last_ms: int | None = None
        self.pubsub: Subscription | None = None
        self.subscriptions = 0
        self.next_progress = self.started + PROGRESS_EVERY

    def run(self, *, wait: bool) -> bool:
        try:
            if self._arrive():
                return True
            return self._wait() if wait else False
        except RedisUnavailable as exc:
            error = self._unreachable(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            self._close_pubsub()

    def _retry(self, operation: Callable[[], Any], action: str) -> Any:
        stall = self.last_alive + self.config.stall_timeout
        deadline = stall if self.deadline is None else min(stall, self.deadline)
        return call_with_retries(
            operation,
            self.config,
            action=action,
            deadline=deadline,
            clock=self.clock,
            sleep=self.barrier._sleep,
        )

    def _arrive(self) -> bool:
        """Record this task (again); True if that completed the barrier or it was."""
        b, keys = self.barrier, self.config.keys
        args = [b.member, b.task_id, b.parties, self.config.key_ttl, keys.barrier_channel]
        args += [publish_command(self.config), self.config.run_id or "", MAX_INDEXED_BARRIERS]
        reply = self._retry(
            lambda: b._code().call("barrier_arrive", [b.key, keys.barrier_index], args),
            f"arrive at barrier {b.name!r}",
        )
        status, now_ms, _arrived, parties, completed_ms = (parse_int(r) or 0 for r in reply[:5])
        if status == BARRIER_OTHER_PARTIES:
            raise ConfigurationError(
                f"barrier {b.name!r} of job {self.config.job} was begun with {parties} "
                f"parties, but this task says {b.parties}: every party must give the same number",
                variable="parties",
                job=self.config.job,
            )
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
        if self._reconnect():
            return True
        next_read = self.clock() + self.config.fallback_interval
        while True:
            now = self.clock()
            if now >= next_read:
                if self._read():
                    return True
                next_read = self.clock() + self.config.fallback_interval
                now = self.clock()
            if self._limits_passed(now):
                return True
            if now >= self.next_progress:
                self._log_progress()
            stall = self.last_alive + self.config.stall_timeout
            stops = [next_read, self.next_progress, stall]
            stop = min([*stops, self.deadline] if self.deadline is not None else stops)
            assert self.pubsub is not None
            try:
                message = self.pubsub.get_message(timeout=max(0.001, stop - now))
            except (redis.ConnectionError, redis.TimeoutError, OSError) as exc:
                log.info("job %s: barrier subscription lost (%s)", self.config.job, exc)
                if self._reconnect():
                    return True
                next_read = self.clock() + self.config.fallback_interval
                continue
            notice = None if message is None else parse_barrier_notice(message)
            if notice == "reset":
                raise self._aborted()
            if notice == self.barrier.member:
                self._released("the last arrival's announcement")
                return True

    def _reconnect(self) -> bool:
        """Subscribe, read the confirmation, then read the barrier (in that order)."""
        self._close_pubsub()
        refresh = self.subscriptions > 0  # a cluster's slot may have moved
        self.pubsub = self._retry(
            lambda: Subscription.open(
                self.barrier._connected(),
                self.config.keys.barrier_channel,
                refresh_topology=refresh,
            ),
            f"subscribe to {self.config.keys.barrier_channel}",
        )
        self.subscriptions += 1
        return self._read()

    def _read(self) -> bool:
        """Read the barrier and the reset marker: the truth. True once complete."""
        b = self.barrier
        reply = self._retry(
            lambda: list(b._code().call("waiter_read", [b.key, self.config.keys.reset], [])),
            f"read barrier {b.name!r}",
        )
        reset_ms = parse_int(reply[1]) if reply[1] else None
        assert self.start_ms is not None
        if reset_ms is not None and reset_ms >= self.start_ms:
            raise self._aborted()
        state = state_from_read(b.member, reply)
        if state is None or b.task_id not in state.arrived:
            # gone (expired, or a Redis that restarted empty) or not ours: arrive again
            log.info("job %s: barrier %r lost our arrival; arriving again", self.config.job, b.name)
            return self._arrive()
        self.state = state
        if state.complete:
            self._released("a read of the barrier")
            return True
        if state.last_ms is not None and state.last_ms != self.seen_last_ms:
            self.seen_last_ms = state.last_ms
            age = max(0.0, ((parse_int(reply[0]) or 0) - state.last_ms) / 1000)
            self.last_alive = max(self.last_alive, self.clock() - age)
        return False

    def _limits_passed(self, now: float) -> bool:
        """Raise at a passed deadline, after one last read (the release may have come)."""
        overall = self.deadline is not None and now >= self.deadline
        if not overall and now < self.last_alive + self.config.stall_timeout:
            return False
        try:
            if self._read():
                return True
        except RedisUnavailable:
            pass
        if overall or self.clock() >= self.last_alive + self.config.stall_timeout:
            raise self._timeout(stalled=not overall)
        return False

    def _missing(self) -> tuple[int, ...]:
        if self.state is not None:
            return self.state.missing
        b = self.barrier  # never read: only this task is known to have arrived
        return tuple(task for task in range(b.parties) if task != b.task_id)

    def _timeout(self, *, stalled: bool, cause: str | None = None) -> BarrierTimeout:
        b, missing = self.barrier, self._missing()
        if cause is not None:
            why = cause
        elif stalled:
            why = f"no task arrived for {self.config.stall_timeout:g} s (stall timeout)"
        else:
            assert self.deadline is not None
            why = f"overall timeout of {self.deadline - self.started:g} s passed"
        return BarrierTimeout(
            f"job {self.config.job}: gave up at barrier {b.name!r} after "
            f"{self.clock() - self.started:.1f} s: {why}; {b.parties - len(missing)} of "
            f"{b.parties} tasks arrived, missing task(s) {list_tasks(missing)}",
            job=self.config.job,
            stalled=stalled,
            barrier=b.name,
            missing=missing,
        )

    def _unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        if self.start_ms is None:  # never reached Redis at all
            return exc
        overall = self.deadline is not None and self.deadline <= (
            self.last_alive + self.config.stall_timeout
        )
        return self._timeout(stalled=not overall, cause=f"{exc}; retried until the timeout")

    def _aborted(self) -> BarrierAborted:
        return BarrierAborted(
            f"job {self.config.job} was reset while task {self.barrier.task_id} waited at "
            f"barrier {self.barrier.name!r}",
            job=self.config.job,
            reason="reset",
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

    def _log_progress(self) -> None:
        self.next_progress = self.clock() + PROGRESS_EVERY
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
