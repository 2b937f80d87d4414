"""Each training task's own progress in Redis: the ``progress`` hash's limits and
values, ``<task id>`` -> ``<step>:<changed_ms>`` (docs/protocol.md#progress).

Every worker may write the hash (directly too: it holds ``HSET``), so readers
check each value's size before they read it, and treat what does not parse as
malformed.
"""

from __future__ import annotations

from stepbarrier._protocol.barrier_record import MAX_PARTIES
from stepbarrier._protocol.wire import MAX_STEP, parse_int

MAX_TASK_ID = 1_000_000
"""Highest task id a report, and the settings, may carry."""
MAX_PROGRESS_TASKS = MAX_PARTIES
"""Most tasks (fields) a job's progress hash holds: a report of a new task into a
full hash is refused (``HLEN``, O(1))."""
MAX_PROGRESS_VALUE = 33
"""Longest value of a task's field: ``<step>:<changed_ms>``, two numbers of at
most 16 digits; a longer one is malformed (never read whole)."""


def parse_progress(raw: object) -> tuple[int, int] | None:
    """A stored ``step:changed_ms`` as two whole numbers, or ``None`` if malformed.

    Example:
        >>> parse_progress(b"120:1796017269266")
        (120, 1796017269266)
        >>> parse_progress(b"12x:1") is None
        True
    """
    if isinstance(raw, bytes):
        if len(raw) > MAX_PROGRESS_VALUE:
            return None
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str) or len(raw) > MAX_PROGRESS_VALUE:
        return None
    step_text, colon, changed_text = raw.partition(":")
    if not colon:
        return None
    step, changed = parse_int(step_text, high=MAX_STEP), parse_int(changed_text, high=MAX_STEP)
    if step is None or changed is None:
        return None
    return step, changed
