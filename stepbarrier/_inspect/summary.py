"""A large job's waiters in numbers: how many, the nearest targets, a histogram.

Out of the targets index alone, never one read per worker: a refresh costs the
same few commands whatever the number of waiters (up to ``SUMMARY_LIMIT``).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.registry import index_length, parse_index, read_index
from stepbarrier._inspect.status import JobStatus, operator_read, read_status
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode

LIST_UP_TO = 20
"""``status`` and ``watch`` list each waiter up to this many, and summarise beyond."""
NEAREST = 5
"""How many of the lowest targets the summary names, with their waiters."""
BUCKETS = 10
"""Bars of the targets' histogram."""
PAGE = 5_000
"""Index members read per command."""
SUMMARY_LIMIT = 100_000
"""Most waiters one summary counts (the lowest targets first)."""


@dataclass(frozen=True)
class WaiterSummary:
    """How many workers wait for what.

    Attributes:
        waiting: Registered waiters (the index's members with a valid target).
        reached: Those whose target the chief's stored step has reached.
        nearest: ``(target, waiters)`` for the lowest targets, lowest first.
        histogram: ``(first step, last step, waiters)`` per bar, lowest to highest.
    """

    waiting: int
    reached: int
    nearest: tuple[tuple[int, int], ...]
    histogram: tuple[tuple[int, int, int], ...]
    complete: bool = True

    @classmethod
    def of(
        cls, targets: Sequence[int], step: int | None, *, complete: bool = True
    ) -> WaiterSummary:
        """The summary of waiters waiting for ``targets``, the chief being at ``step``."""
        counts = Counter(targets)
        distinct = sorted(counts)
        reached = sum(n for t, n in counts.items() if step is not None and t <= step)
        nearest = tuple((t, counts[t]) for t in distinct[:NEAREST])
        return cls(len(targets), reached, nearest, _histogram(counts, distinct), complete)


def _histogram(counts: Counter[int], distinct: list[int]) -> tuple[tuple[int, int, int], ...]:
    if len(distinct) <= BUCKETS:  # none, or a bar each
        return tuple((t, t, counts[t]) for t in distinct)
    low, high = distinct[0], distinct[-1]
    width = -(-(high - low + 1) // BUCKETS)  # ceiling: BUCKETS bars cover low..high
    bars = [0] * BUCKETS
    for target, number in counts.items():
        bars[(target - low) // width] += number
    return tuple(
        (low + i * width, min(high, low + (i + 1) * width - 1), n) for i, n in enumerate(bars)
    )


def read_overview(
    config: BarrierConfig, client: RedisClient | None = None, *, straggler_steps: int | None = None
) -> tuple[JobStatus, WaiterSummary | None]:
    """``read_status``, its waiters listed if at most ``LIST_UP_TO``, else summarised
    from the index, read in pages (``summary`` not ``None``); raises as it does."""

    def read(active: RedisClient) -> tuple[JobStatus, WaiterSummary | None]:
        problems: list[str] = []
        targets: list[int] = []
        code = RedisCode(active, config)
        for start in range(0, SUMMARY_LIMIT, PAGE):
            # BUSY: retried, then said as such (not a malformed index)
            raw = read_index(code, config.keys.targets, start=start, count=PAGE)
            targets += [target for _, target in parse_index(raw, problems)]
            if index_length(raw) < PAGE:
                break
        else:
            problems.append(
                f"more than {SUMMARY_LIMIT:,} indexed waiters: the summary counts the first"
            )
        if len(targets) <= LIST_UP_TO:
            return read_status(config, active, straggler_steps=straggler_steps), None
        status = read_status(config, active, waiters=False, straggler_steps=straggler_steps)
        if problems:  # malformed index members, or more than SUMMARY_LIMIT
            status = dataclasses.replace(status, problems=(*status.problems, *problems))
        return status, WaiterSummary.of(targets, status.step, complete=len(targets) < SUMMARY_LIMIT)

    return operator_read(config, client, read)
