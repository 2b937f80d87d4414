"""What the chief's writes mean: its generation, the steps waited for, and its end.

``PublisherState`` is the bookkeeping of ``stepbarrier.publisher_loop``
without its threads, retries or Redis calls: it says what to write next, takes
in each write's reply (the targets of waiting workers, a newer chief, a reset)
and the targets of newly registered workers, and sets the threshold at which
the training thread asks for the next write.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

from stepbarrier import scripts
from stepbarrier.config import BarrierConfig
from stepbarrier.freshness import confirm_window
from stepbarrier.step_write import StepWrite, WriteResult

# the name these messages always had: log filters and tests select by it
log = logging.getLogger("stepbarrier.publisher")


@dataclass(slots=True, eq=False)
class Handover:
    """The step the training thread hands over, and the threshold it reads back.

    Attributes:
        handed_at: Monotonic time of the last hand-over (of the start, before one).
        latest: The last step handed over; ``None`` before one and after a new generation.
        handed: How many steps were handed over; ``flush`` waits for a write of this many.
        step_time: Running mean of the seconds between two hand-overs (``None`` before two).
        next_threshold: The training thread sets ``PublisherLoop.wake`` once ``latest``
            reaches it (``-1``: the next step must be written at once).
    """

    # No lock: publish() runs on every training step and must cost a fraction of a
    # microsecond. Each field is one reference, replaced whole (atomic under the
    # GIL); publish() alone writes the first four, and the rest is written under
    # the state's lock, which publish() never takes (next_threshold by the writer
    # and the listener, latest = None by new_generation). A value read a moment
    # late counts at the next wake or heartbeat.
    handed_at: float
    latest: int | None = None
    handed: int = 0
    step_time: float | None = None
    next_threshold: float = -1.0


class PublisherState:
    """The generation, targets and end of one publisher, shared by its threads.

    Starts no thread and does no I/O. It owns ``lock`` (and ``stored``, a
    condition on it, notified whenever ``stored_seq`` or ``refusals`` grows or
    the publisher ends): each public method takes the lock itself, so call none
    of them holding it; ``wait_stored`` reads the attributes under ``stored``.
    It sets ``wake`` when a write is due at once.

    Args:
        config: The job's settings (its name for log lines, its heartbeat).
        handover: What the training thread hands over.
        wake: The writer thread's event.
        clock: Monotonic clock, for a write's ``publish_age``.
        contributor: A training worker: never begins a generation; ends if refused.
    """

    def __init__(
        self,
        config: BarrierConfig,
        handover: Handover,
        wake: threading.Event,
        *,
        clock: Callable[[], float],
        contributor: bool,
    ) -> None:
        self._config = config
        self.handover = handover
        self.wake = wake
        self._clock = clock
        self.contributor = contributor
        self.lock = threading.Lock()
        self.stored = threading.Condition(self.lock)
        self.stored_seq = 0  # the hand-overs counted by the last write that counted
        self.refusals = 0  # writes that failed for good
        self.pending: tuple[int, ...] = ()  # the lowest targets, from the last write
        self._stored_step = -1
        self._heard_targets: set[int] = set()
        self.generation: int | None = None
        self.epoch = 0
        self._generation_wanted = 1
        self._generation_begun = 0
        self._ignore_until_handed = 0
        # "superseded", "reset" or "refused" (a contributor): this writer is done for good
        self.ended: str | None = None
        self.end_message: str | None = None  # why, as one line (set before ``ended``)

    # -- the training thread ---------------------------------------------------------

    def new_generation(self) -> None:
        """Drop the handed-over step and, for a chief, ask for a new generation."""
        if self.ended is not None:
            return  # superseded or reset: this publisher never writes again
        with self.lock:
            self.handover.latest = None
            self._stored_step = -1
            self.handover.next_threshold = -1.0
            self._heard_targets = set()
            if not self.contributor:
                self._generation_wanted += 1

    # -- the writer thread -----------------------------------------------------------

    def generation_to_begin(self) -> tuple[int, bool]:
        """The generation asked for (pass it on to the next calls), and whether to begin it."""
        with self.lock:
            wanted = self._generation_wanted
            return wanted, not self.contributor and self._generation_begun != wanted

    def begin_generation(self, wanted: int, generation: int) -> bool:
        """Take in the ``generation`` Redis began for ``wanted``; False if it came too late."""
        with self.lock:
            if self._generation_wanted != wanted:
                return False  # yet another generation was asked for meanwhile
            self.generation, self._generation_begun = generation, wanted
            self.epoch = self.epoch or generation
            return True

    def next_write(self, *, done: bool) -> tuple[StepWrite, int] | None:
        """The values of the next write and the hand-overs it counts; ``None``: nothing new."""
        handover = self.handover
        with self.lock:
            step, seq = handover.latest, handover.handed
            if step is None or seq <= self._ignore_until_handed:
                return None
            values = StepWrite(
                generation=self.generation or 0,
                step=step,
                done=done,
                publish_age=max(0.0, self._clock() - handover.handed_at),
                confirm_window=confirm_window(self._config.heartbeat, handover.step_time),
                epoch=self.epoch,
            )
        return values, seq

    def take_reply(self, result: WriteResult, seq: int, wanted: int) -> bool:
        """Take in the reply to a write of ``seq`` hand-overs in generation ``wanted``.

        Returns:
            True if the write counts: its step is stored and its targets are known.
        """
        with self.stored:
            if self._generation_wanted != wanted:
                # new_generation() came while this write was on its way: its
                # results describe the old generation and must not count
                self.wake.set()
                return False
            return self._apply(result, seq)

    def refused(self, error: str, *, forbidden: bool) -> None:
        """A write failed for good with ``error``; ``forbidden``: the user may not write.

        Ends ``flush`` waits; ends a contributor that may not write the step.
        """
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
                )

    def _apply(self, result: WriteResult, seq: int) -> bool:
        """Take in a write's reply (holding the lock)."""
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
        if result.status == scripts.REJOIN:
            # steps handed over before we learnt of the new generation may have
            # been read before the chief restored an older checkpoint: drop them
            self.generation = result.stored_generation or 0
            self.epoch = self.epoch or (result.stored_generation or 0)
            self._ignore_until_handed = self.handover.handed
            self._stored_step = -1
            self.wake.set()
            return False
        stored = -1 if result.stored_step is None else result.stored_step
        self._stored_step = stored
        self._heard_targets = {t for t in self._heard_targets if t > stored}
        self.pending = result.targets
        self._refresh_threshold()
        self.stored_seq = max(self.stored_seq, seq)
        self.stored.notify_all()
        return True

    def _end(self, why: str, message: str) -> None:
        """Stop this writer for good (holding the lock)."""
        if self.ended is None:
            self.end_message = message
            self.ended = why
            level = logging.ERROR if why == "reset" else logging.WARNING
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
        candidates = [*self.pending[:1], *self._heard_targets]
        self.handover.next_threshold = float(min(candidates)) if candidates else math.inf
        latest = self.handover.latest
        if latest is not None and latest >= self.handover.next_threshold:
            self.wake.set()

    # -- the registration listener's thread ------------------------------------------

    def heard(self, target: int) -> None:
        """A new waiter registered ``target`` (called by the registration listener)."""
        if target <= self._stored_step or self.ended is not None:
            return  # that waiter reads a step it already has
        with self.lock:
            self._heard_targets.add(target)
            self._refresh_threshold()
