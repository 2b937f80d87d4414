"""Following training: every multiple of ``every`` the chief's step reaches, in order.

Polling (TensorFlow's ``checkpoints_iterator``) can miss a multiple when the chief
moves past two between polls; following waits for the next multiple and yields each
multiple the step it saw has passed. ``FollowPlan`` decides without I/O;
``StepWaiter.follow`` and ``AsyncStepWaiter.follow`` drive it.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepbarrier._protocol.wire import MAX_STEP, checked_step
from stepbarrier.errors import BarrierAborted


@dataclass(frozen=True, slots=True)
class Crossed:
    """A multiple of ``every`` that the chief's step reached.

    Attributes:
        multiple: The multiple (``every``, ``2 * every``, ...), in increasing order
            from one ``Crossed`` to the next, none skipped.
        step: The chief's step that the wait saw when it crossed ``multiple``
            (``>= multiple``; several multiples crossed at once share it).
    """

    multiple: int
    step: int


class FollowPlan:
    """Which step to wait for next, and which multiples a released wait crossed
    (``every`` and ``start`` as ``StepWaiter.follow`` takes them, checked as steps)."""

    def __init__(self, every: int, start: int | None) -> None:
        self.every = self.target = checked_step(every, what="every")
        if start is not None:
            start = checked_step(start, what="start", low=0)
            self.target = max(self.every, -(-start // self.every) * self.every)
        self.skip_at_once = start is None

    def released(self, step: int, before: int | None) -> list[Crossed]:
        """The multiples that a wait for ``target``, released at ``step``, crossed (the
        next target set after them). ``before``: the step its first read found; the
        first wait's multiples at or below it came before the following began, and are
        not yielded without a ``start``."""
        first, every = self.target, self.every
        if self.skip_at_once:
            self.skip_at_once = False
            if before is not None and before >= first:
                first = (before // every + 1) * every
        self.target = (step // every + 1) * every
        if step < first + every:  # one multiple at most, the common case: no range made
            return [Crossed(first, step)] if step >= first else []
        return [Crossed(m, step) for m in range(first, step + 1, every)]

    @property
    def exhausted(self) -> bool:
        """True once the next multiple is above ``MAX_STEP``: no chief can reach it."""
        return self.target > MAX_STEP

    @staticmethod
    def ends(exc: BarrierAborted) -> bool:
        """True if the abort ends the following cleanly: the job finished (short of the
        next multiple). A reset is an error, as it is for ``wait``."""
        return exc.reason == "done"
