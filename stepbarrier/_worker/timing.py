"""When a wait acts by itself, and what it does next: the one loop of every wait.

Every wait (a step wait, threaded or asyncio, and a named barrier's) is a loop
that asks ``WaitTiming.next_action`` what to do (an ``Action``), does it, and
feeds what came of it back to its rules (a subclass: ``WaitRules``,
``BarrierRules``); the drivers differ only in their I/O.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

from stepbarrier.errors import BarrierTimeout, RedisRefused, RedisUnavailable, TimeoutLimit

PROGRESS_EVERY = 30.0
"""Seconds between progress lines while a wait goes on."""

Limit = TimeoutLimit
"""Which limit of a wait has passed (``BarrierTimeout.limit``)."""

R = TypeVar("R")


class Read:
    """Read the stored state: the fallback interval passed."""


class ReadSource:
    """Read the outside witness of the step (``StepSource``): its interval passed."""


class Resubscribe:
    """Subscribe anew: the subscription seems dead, or it is time to try a lost Redis."""


@dataclass(frozen=True)
class LastChance:
    """A limit passed: read once more (a release may have come), then
    ``after_last_chance``."""

    limit: Limit


@dataclass(frozen=True)
class Receive:
    """Listen for a message for at most ``timeout`` seconds (with Redis lost: sleep)."""

    timeout: float


READ, READ_SOURCE, RESUBSCRIBE = Read(), ReadSource(), Resubscribe()

Action = Read | ReadSource | Resubscribe | LastChance | Receive
"""What a wait's driver does next."""


class WaitTiming:
    """A wait's deadlines and reads over time, on its own monotonic ``clock``: its overall
    ``timeout`` (or ``None``), the ``stall_timeout`` without a sign of life of the writer
    it depends on (the chief; a barrier's other tasks), and the ``fallback_interval``
    between reads when no message comes."""

    def __init__(
        self,
        clock: Callable[[], float],
        timeout: float | None,
        *,
        stall_timeout: float,
        fallback_interval: float,
    ) -> None:
        self.clock = clock
        self.started = clock()
        self.deadline = None if timeout is None else self.started + timeout
        self.stall_timeout = stall_timeout
        self.fallback_interval = fallback_interval
        self.last_alive = self.started  # when the writer was last seen alive
        self.read_at = self.started  # when the next fallback read is due
        self.source_at = math.inf  # when the outside witness is read next (inf: none)
        self.next_progress = self.started + PROGRESS_EVERY  # when log_progress is due
        self.resubscribe = False  # the rules judged the subscription dead
        # Redis is lost: the wait is on its outside witness alone, and tries Redis
        # again at read_at (a step wait's rules set it)
        self.redis_lost = False
        self._turn = 0  # where the current pass stands (see next_action)

    # -- what a subclass knows ---------------------------------------------------

    def stall_at(self) -> float:
        """When the stall timeout passes, unless the writer is seen alive again."""
        return self.last_alive + self.stall_timeout

    def progress_at(self) -> float | None:
        """When the progress timeout passes (``None``: the wait has none)."""
        return None

    def log_progress(self) -> None:
        self.next_progress = self.clock() + PROGRESS_EVERY

    def timed_out(self, limit: Limit) -> BarrierTimeout:
        return BarrierTimeout(
            f"gave up after {self.clock() - self.started:.1f} s ({limit})", limit=limit
        )

    def unreachable(self, exc: RedisUnavailable) -> BarrierTimeout | RedisUnavailable:
        """The error for a wait whose retries ran out (``exc``, or a timeout)."""
        return exc

    # -- the decisions -------------------------------------------------------------

    def on_redis_lost(self, exc: RedisUnavailable | RedisRefused) -> None:
        """Redis stayed unreachable through the retries, or refused: raise what ends the
        wait (a refusal as it is; a subclass may go on without Redis)."""
        error = exc if isinstance(exc, RedisRefused) else self.unreachable(exc)
        if error is exc:
            raise exc
        raise error from exc

    def subscribed(self) -> None:
        self.resubscribe = False

    def read_done(self) -> None:
        """A read of the wait's own that registers was made (not one made for many waits):
        the next fallback read is one interval away."""
        self.read_at = self.clock() + self.fallback_interval

    def retry_deadline(self) -> float:
        """Until when the wait may retry a failing call: its nearest limit."""
        nearest = self.stall_at()
        if self.deadline is not None and self.deadline < nearest:
            nearest = self.deadline
        progress_at = self.progress_at()
        if progress_at is not None and progress_at < nearest:
            nearest = progress_at
        return nearest

    def next_stop(self) -> float:
        """The earliest moment the driver must act by itself."""
        return min(self.next_progress, self.source_at, self.read_at, self.retry_deadline())

    def passed(self, now: float) -> Limit | None:
        """The limit passed at ``now``, if any (the overall one first)."""
        if self.deadline is not None and now >= self.deadline:
            return "deadline"
        if now >= self.stall_at():
            return "stall"
        progress_at = self.progress_at()
        if progress_at is not None and now >= progress_at:
            return "progress"
        return None

    def after_last_chance(self, limit: Limit, released: R | None) -> R | None:
        """The wait's end after the last chance's read: released, or go on (the read saw
        life), or raises the limit's ``BarrierTimeout``."""
        if released is not None:
            return released
        now = self.clock()
        progress_at = self.progress_at()
        if (
            limit == "deadline"
            or (limit == "stall" and now >= self.stall_at())
            or (limit == "progress" and progress_at is not None and now >= progress_at)
        ):
            raise self.timed_out(limit)
        return None  # the read saw the writer alive (or moving) again

    def limit_of_retries(self) -> Limit:
        """The limit a wait's retries of an unreachable Redis ran to: its nearest."""
        nearest = self.retry_deadline()
        if self.deadline is not None and self.deadline <= nearest:
            return "deadline"
        return "progress" if self.progress_at() == nearest < self.stall_at() else "stall"

    def next_action(self, now: float) -> Action:
        """What the driver does next, at ``clock()`` time ``now``.

        The actions come in passes, as one turn of a loop would take them: the
        witness's read, the fallback read and a resubscription, each if due, then
        a ``Receive``. So a slow read cannot keep the wait from listening, and a
        passed limit or a due progress line (looked at on every call) cannot be
        kept waiting by anything.
        """
        limit = self.passed(now)
        if limit is None and now >= self.next_progress:
            self.log_progress()
        turn = self._turn
        if turn < 1 and now >= self.source_at:
            # the witness's due read first, as a pass takes it, even past a limit: a
            # limit that passes just as it is due (stall_timeout equal to its interval,
            # a deadline on its schedule) must not hide its release or its sign of
            # life; once per pass, so it cannot delay the limit more
            self._turn = 1
            return READ_SOURCE
        if limit is not None:
            if self.redis_lost:
                raise self.timed_out(limit)  # no read can show life: Redis is lost
            return LastChance(limit)
        if turn < 2 and now >= self.read_at:
            self._turn = 2
            return RESUBSCRIBE if self.redis_lost else READ  # (lost: try Redis again)
        if turn < 3 and self.resubscribe:
            self._turn = 3
            self.resubscribe = False  # one new subscription per verdict
            return RESUBSCRIBE
        self._turn = 0  # the pass ends by listening
        listen = min(self.next_stop() - now, self.fallback_interval)
        return Receive(max(0.001, listen))
