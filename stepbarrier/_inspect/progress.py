"""Who is slow: each task's reported step, how far behind the chief, stragglers and stuck tasks.

The tasks report their own step into the job's progress hash
(``stepbarrier._progress.reporter``, docs/protocol.md#progress); ``read_progress``
reads it in bounded work, and ``judge_tasks`` judges each task against the
chief by the rules docs/who-is-slow.md states (and why those thresholds).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import redis

from stepbarrier._inspect.registry import one_line, replies_of
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.library import MAX_PROGRESS_TASKS
from stepbarrier._protocol.wire import MAX_PROGRESS_VALUE, parse_progress
from stepbarrier._redis.client import RedisClient

MAX_TASKS_READ = 1000
"""Most task ids one read checks (``0`` .. ``999``); the others are counted only."""
SPAN_MARGIN = 64
"""Task ids read beyond the hash's size (ids need not be dense)."""
DEFAULT_STRAGGLER_STEPS = 100
"""The straggler threshold's floor, in steps."""
STRAGGLER_FRACTION = 0.05
"""The straggler threshold's share of the chief's step, when that is more."""
CHIEF_TASK = 0
"""The chief's task id: its own report says when the chief's step last increased."""


@dataclass(frozen=True)
class TaskProgress:
    """One task's reported progress, judged against the chief.

    Attributes:
        behind: The chief's stored step less ``step``, at least 0 (``None``
            while the chief has stored no step).
        changed_age_s: Seconds since the task's step last increased (Redis's clock).
    """

    task_id: int
    step: int
    behind: int | None
    changed_age_s: float
    stuck: bool = False
    straggler: bool = False


def straggler_threshold(chief_step: int | None, straggler_steps: int | None) -> int:
    """Steps behind the chief beyond which a task is a straggler.

    Example:
        >>> straggler_threshold(1_000, None), straggler_threshold(100_000, None)
        (100, 5000)
        >>> straggler_threshold(100_000, 20)
        20
    """
    if straggler_steps is not None:
        return straggler_steps
    return max(DEFAULT_STRAGGLER_STEPS, int((chief_step or 0) * STRAGGLER_FRACTION))


def judge_tasks(
    entries: Mapping[int, tuple[int, int]],
    *,
    chief_step: int | None,
    chief_live: bool,
    now_ms: int,
    stall_timeout: float,
    straggler_steps: int | None = None,
    chief_idle_s: float = 0.0,
) -> tuple[TaskProgress, ...]:
    """Each task's progress (``read_progress``'s entries), by task id, judged against
    the chief (no I/O); ``now_ms`` is Redis's time of the node that holds the hash.

    ``chief_idle_s`` is how long the chief's training loop had been quiet at its
    last write (the state's ``idle_ms``): its publisher heartbeats while the loop hangs.
    """
    threshold = straggler_threshold(chief_step, straggler_steps)
    chief = entries.get(CHIEF_TASK)
    # the chief's own report, else its heartbeat and the loop behind it handing steps over
    quiet_s = chief_idle_s if chief is None else (now_ms - chief[1]) / 1000
    advanced = chief_live and quiet_s < stall_timeout
    tasks = []
    for task_id in sorted(entries):
        step, changed_ms = entries[task_id]
        age = max(0.0, (now_ms - changed_ms) / 1000)
        behind = None if chief_step is None else max(0, chief_step - step)
        lagging = task_id != CHIEF_TASK and behind is not None and behind > 0
        tasks.append(
            TaskProgress(
                task_id=task_id,
                step=step,
                behind=behind,
                changed_age_s=round(age, 3),
                stuck=lagging and advanced and age >= stall_timeout,
                straggler=lagging and behind is not None and behind > threshold,
            )
        )
    return tuple(tasks)


def read_progress(
    client: RedisClient, keys: JobKeys, problems: list[str]
) -> tuple[dict[int, tuple[int, int]], int]:
    """The job's progress hash, in bounded work (every worker may write it): task id ->
    (step, changed_ms) of the tasks read, and how many more it holds (past
    ``MAX_TASKS_READ``, or malformed); what could not be read, or is malformed, is
    appended to ``problems`` (a transient failure raises: retried)."""
    first = client.pipeline(transaction=False)
    first.hlen(keys.progress)
    (size,) = replies_of(first)
    if isinstance(size, redis.exceptions.NoPermissionError):
        problems.append(
            "tasks not shown: this user may not read the job's progress hash (an older "
            "users.acl: `stepbarrier acl` prints the current rules)"
        )
        return {}, 0
    if isinstance(size, Exception):
        problems.append(
            f"the job's progress key is not a hash: tasks not shown ({one_line(size, 160)})"
        )
        return {}, 0
    if not size:
        return {}, 0
    if size > MAX_PROGRESS_TASKS:
        problems.append(
            f"the job's progress hash holds {size:,} fields (reports keep at most "
            f"{MAX_PROGRESS_TASKS:,}): tasks 0-{MAX_TASKS_READ - 1} shown"
        )
    span = min(MAX_TASKS_READ, int(size) + SPAN_MARGIN)
    second = client.pipeline(transaction=False)
    for task in range(span):
        second.hstrlen(keys.progress, str(task))
    lengths = replies_of(second)
    names = [task for task, n in enumerate(lengths) if isinstance(n, int) and n > 0]
    oversized = [task for task in names if lengths[task] > MAX_PROGRESS_VALUE]
    readable = [task for task in names if lengths[task] <= MAX_PROGRESS_VALUE]
    values: Any = []
    if readable:
        third = client.pipeline(transaction=False)
        third.hmget(keys.progress, [str(task) for task in readable])
        (values,) = replies_of(third)
        if isinstance(values, Exception):
            return {}, int(size)  # gone or replaced meanwhile
    entries: dict[int, tuple[int, int]] = {}
    malformed = list(oversized)
    for task, raw in zip(readable, values, strict=True):
        parsed = None if raw is None else parse_progress(raw)
        if parsed is None:
            if raw is not None:
                malformed.append(task)
        else:
            entries[task] = parsed
    if malformed:
        shown = ", ".join(str(task) for task in malformed[:10])
        problems.append(f"malformed progress of task(s) {shown}: not shown")
    return entries, max(0, int(size) - len(entries) - len(malformed))
