"""When a wait acts by itself, and what it does next: the one loop of every wait.

Every wait (a step wait, threaded or asyncio, and a named barrier's) is a
loop that asks ``WaitTiming.next_action`` what to do, does it, and feeds what
came of it back to its rules. The drivers differ only in their I/O; when to
read, when a limit has passed and how long to listen are decided here, once:

- ``READ``: the fallback interval passed since the last read (a lost
  message, a half-open connection or a Redis restart costs at most that).
- ``LastChance(limit)``: a limit passed. The driver reads once more (a
  release may have come), and if nothing released the wait it calls
  ``raise_if_passed``, which raises the wait's timeout unless the read saw
  its writer alive again.
- ``RESUBSCRIBE``: the rules judged the subscription dead.
- ``READ_SOURCE``: the outside witness's interval passed (a threaded step
  wait given a ``StepSource``; ``source_at`` is its schedule).
- ``Receive(timeout)``: listen for a message for at most ``timeout`` seconds.

A subclass adds what its wait knows: ``WaitRules`` (a step wait's stall and
progress limits, its outside witness, its progress lines), a barrier's wait
(its progress lines and timeout). The driver calls ``read_done`` after each
read of its own that registers (a read made for many waits at once does not:
it refreshes no registration).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from stepbarrier.errors import BarrierTimeout, TimeoutLimit

PROGRESS_EVERY = 30.0
"""Seconds between progress lines while a wait goes on."""

Limit = TimeoutLimit
"""Which limit of a wait has passed (``BarrierTimeout.limit``)."""


class Read:
    """Read the stored state: the fallback interval passed."""


class ReadSource:
    """Read the outside witness of the step (``StepSource``): its interval passed."""


class Resubscribe:
    """Subscribe anew: the rules judged the subscription dead."""


@dataclass(frozen=True)
class LastChance:
    """A limit passed: read once more, then ``raise_if_passed(limit)`` if nothing released."""

    limit: Limit


@dataclass(frozen=True)
class Receive:
    """Listen for a message for at most ``timeout`` seconds."""

    timeout: float


READ = Read()
READ_SOURCE = ReadSource()
RESUBSCRIBE = Resubscribe()

Action = Read | ReadSource | Resubscribe | LastChance | Receive
"""What a wait's driver does next."""


class WaitTiming:
    """A wait's deadlines and reads over time, on its own monotonic clock.

    Args:
        clock: Monotonic clock.
        timeout: Overall limit in seconds, or ``None``.
        stall_timeout: Seconds without a sign of life of the writer the wait
            depends on (the chief; a barrier's other tasks) before it gives up.
        fallback_interval: Seconds between reads when no message comes.
    """

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
        self.last_alive = self.started
        """When the writer was last seen alive (``clock()`` time)."""
        self.read_at = self.started
        """When the next fallback read is due (``read_done`` moves it)."""
        self.source_at = math.inf
        """When the outside witness is read next (``math.inf``: the wait has none)."""
        self.next_progress = self.started + PROGRESS_EVERY
        """When ``log_progress`` is due."""
        self.resubscribe = False
        """Set by the rules when the subscription looks dead."""
        self._turn = 0  # where the current pass stands (see next_action)

    # -- what a subclass knows ---------------------------------------------------

    def stall_at(self) -> float:
        """When the stall timeout passes, unless the writer is seen alive again."""
        return self.last_alive + self.stall_timeout

    def progress_at(self) -> float | None:
        """When the progress timeout passes (``None``: the wait has none)."""
        return None

    def log_progress(self) -> None:
        """Say how the wait goes (a subclass says more), and when it says so next."""
        self.next_progress = self.clock() + PROGRESS_EVERY

    def timed_out(self, limit: Limit) -> BarrierTimeout:
        """The error of a wait whose ``limit`` passed."""
        return BarrierTimeout(
            f"gave up after {self.clock() - self.started:.1f} s ({limit})", limit=limit
        )

    # -- the decisions -------------------------------------------------------------

    def read_done(self) -> None:
        """A read of the stored state was judged: the next fallback read is one interval away."""
        self.read_at = self.clock() + self.fallback_interval

    def retry_deadline(self) -> float:
        """How long the wait may retry a failing call: its nearest limit (stall,
        progress or overall)."""
        limits = [self.stall_at()]
        if self.deadline is not None:
            limits.append(self.deadline)
        progress_at = self.progress_at()
        if progress_at is not None:
            limits.append(progress_at)
        return min(limits)

    def next_stop(self, *, reading: bool = True) -> float:
        """The earliest moment the driver must act by itself (``reading``: its
        fallback reads count; not while it cannot reach Redis)."""
        stop = min(self.next_progress, self.stall_at(), self.source_at)
        if reading:
            stop = min(stop, self.read_at)
        if self.deadline is not None:
            stop = min(stop, self.deadline)
        progress_at = self.progress_at()
        if progress_at is not None:
            stop = min(stop, progress_at)
        return stop

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

    def raise_if_passed(self, limit: Limit) -> None:
        """After the last chance's read released nothing: raise if ``limit`` still holds.

        Raises:
            BarrierTimeout: The overall limit passed, or the stall or progress
                limit still holds after the read (it may have seen life).
        """
        if limit == "deadline":
            raise self.timed_out(limit)
        now = self.clock()
        if limit == "stall" and now >= self.stall_at():
            raise self.timed_out(limit)
        progress_at = self.progress_at()
        if limit == "progress" and progress_at is not None and now >= progress_at:
            raise self.timed_out(limit)

    def next_action(self, now: float) -> Action:
        """What the driver does next, at ``clock()`` time ``now``.

        The actions come in passes, as one turn of a loop would take them: the
        outside witness's read, the fallback read and a resubscription, each
        if due, then a ``Receive``. So a read that takes longer than its
        interval cannot keep the wait from listening, and a passed limit (looked
        at before anything else, at every call, after at most the witness's due
        read of this pass) or a due progress line (said at every call) cannot
        be kept waiting by anything.
        """
        limit = self.passed(now)
        if limit is not None:
            if self._turn < 1 and now >= self.source_at:
                # the witness's due read first, as a pass takes it: a limit that
                # passes just as it is due (stall_timeout equal to its interval,
                # a deadline on its schedule) must not hide its release or its
                # sign of life; once per pass, so it cannot delay the limit more
                self._turn = 1
                return READ_SOURCE
            return LastChance(limit)
        if now >= self.next_progress:
            self.log_progress()
        turn = self._turn
        if turn < 1 and now >= self.source_at:
            self._turn = 1
            return READ_SOURCE
        if turn < 2 and now >= self.read_at:
            self._turn = 2
            return READ
        if turn < 3 and self.resubscribe:
            self._turn = 3
            self.resubscribe = False  # one new subscription per verdict
            return RESUBSCRIBE
        self._turn = 0  # the pass ends by listening
        listen = min(self.next_stop() - now, self.fallback_interval)
        return Receive(max(0.001, listen))
