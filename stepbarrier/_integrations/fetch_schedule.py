"""When the chief's ``GlobalStepPublisherHook`` fetches the global step (no TensorFlow
here): only where a step may matter, docs/tensorflow-keras.md#how-the-chief-publishes.
"""

from __future__ import annotations

from collections import deque

FETCH_EVERY = 16
"""The chief's hook fetches the global step with at least one run in this many
(with every run while a waiting worker's step is within reach)."""
FETCH_WITHIN = 0.05
"""...and at least once in this many seconds of runs: where a run takes longer
than this, the step is fetched with every run (its cost is then small anyway)."""


class StepLead:
    """How far the global step may move during one run: the largest move of the last
    ``WINDOW`` runs (in asynchronous training other workers push it too), so a burst
    is not forgotten at once and a slow-down is learnt within that many runs."""

    WINDOW = 16

    def __init__(self) -> None:
        self._previous: int | None = None
        self._moves: deque[int] = deque(maxlen=self.WINDOW)

    def restart(self, step: int) -> None:
        self._previous = step  # a new session's

    def observe(self, step: int, runs: int = 1) -> int:
        """Take in a step fetched ``runs`` runs after the last one; return the lead."""
        if self._previous is not None and step > self._previous:
            self._moves.append(-(-(step - self._previous) // max(1, runs)))  # per run, rounded up
        self._previous = step
        return self.lead

    @property
    def observed(self) -> int:
        """How many moves the lead is learnt from (at most ``WINDOW``)."""
        return len(self._moves)

    @property
    def lead(self) -> int:
        """The move to expect from one run: the largest recent one (at least 1)."""
        return max(self._moves, default=1)


class FetchSchedule:
    """Which runs fetch the global step (``due``), and the step to hand over between
    fetches: the last fetched one, never ahead of the truth."""

    def __init__(self) -> None:
        self.step: int | None = None
        """The last step fetched (or read); ``None`` before the session's first."""
        self.unobserved = 0
        """Runs since the lead last took in a fetched step."""
        self._since = 0  # runs whose move that step lacks
        self._skipped = 0  # runs without a fetch since the last one
        self._gaps: deque[float] = deque(maxlen=8)  # seconds between the last runs' ends
        self._run_ended: float | None = None

    def restart(self, step: int) -> None:
        """A session starts at ``step`` (read, not extrapolated)."""
        self.step, self._since, self.unobserved, self._skipped = step, 0, 0, 0
        self._gaps.clear()
        self._run_ended = None

    def due(self, lead: StepLead, next_threshold: float) -> bool:
        """Whether the next run fetches the step; ``next_threshold`` is the lowest step
        a worker waits for (``-1`` before the generation's first write, ``inf``: none)."""
        if self.step is None or lead.observed < 2 or len(self._gaps) < 3:
            return True  # nothing to extrapolate from yet
        cadence = sorted(self._gaps)[len(self._gaps) // 2]  # one pause does not count
        every = min(FETCH_EVERY, int(FETCH_WITHIN / max(cadence, 1e-6)))
        if self._skipped + 1 >= every:
            return True
        # where the step may be once this run returns, plus one run of margin:
        # the run that may cross a waiting worker's step fetches it
        reach = self.step + lead.lead * (self._since + 2)
        return 0 <= next_threshold <= reach

    def run_ended(self, now: float) -> None:
        """A run returned at ``now`` (monotonic seconds), with a fetch or without."""
        if self._run_ended is not None:
            self._gaps.append(now - self._run_ended)
        self._run_ended = now
        self.unobserved += 1

    def skipped(self) -> int | None:
        """The run fetched nothing: the step to hand over again (``None``: none yet)."""
        self._skipped += 1
        self._since += 1  # one more run whose move the last fetched step lacks
        return self.step

    def fetched(self, step: int) -> None:
        """The run fetched ``step``, the value from before its own move."""
        self.unobserved, self._since, self._skipped = 0, 1, 0
        self.step = step

    def confirmed(self, step: int) -> None:
        """An extra read after the run gave the true ``step``."""
        self.step, self._since = step, 0
