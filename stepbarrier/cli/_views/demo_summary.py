"""The table ``stepbarrier demo`` ends with: when each worker was released, how late.

Built from the record files the demo's tasks write (``RECORD_FILE``): the
chief's time of each step and each worker's target and release. Their cells
go in as ``Text``, never as markup.
"""

from __future__ import annotations

from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text


def release_summary(
    title: str,
    *,
    chief: dict[str, Any],
    workers: list[dict[str, Any]],
    targets: list[int],
    first_wait: dict[int, float],
) -> RenderableType:
    """One row per worker: its target, the step that released it and its wake latency.

    Args:
        title: The table's title.
        chief: The chief's record (``step_times``: pairs of step and time).
        workers: Each worker's record, in task order (task ids 1..N); ``{}`` if missing.
        targets: Each worker's ``wait_until_step``, for records that lack it.
        first_wait: When each task id was first seen waiting, by the demo's polls.
    """
    step_times = [(int(s), float(t)) for s, t in chief.get("step_times") or []]
    rows = []
    for index, record in enumerate(workers):
        task_id = record.get("task_id", index + 1)
        target = record.get("wait_until_step", targets[index])
        latency, note = wake_latency(record, target, step_times, task_id, first_wait)
        released = _text(record.get("released_at_step"))
        trained = _text(record.get("steps_trained"))
        rows.append((f"worker {task_id}", str(target), released, latency, trained, note))
    table = Table(title=title)
    headers = ["task", "wait_until_step", "released at", "wake latency", "steps trained"]
    if any(row[-1] for row in rows):
        headers.append("note")
    for header in headers:
        table.add_column(header, justify="left" if header == "note" else "right", no_wrap=True)
    for row in rows:  # the cells come from the tasks' record files: never markup
        table.add_row(*(Text(cell) for cell in row[: len(headers)]))
    return Group(
        Text(""),
        table,
        Text(
            "released at: the chief's step that released the worker; wake latency: its "
            "release time minus the time the chief finished its first step at or past "
            "the target",
            style="dim",
        ),
    )


def wake_latency(
    record: dict[str, Any],
    target: int,
    step_times: list[tuple[int, float]],
    task_id: Any,
    first_wait: dict[int, float],
) -> tuple[str, str]:
    released = record.get("released_at")
    if not record:
        return "-", "no record"
    if target <= 0:
        return "-", "did not wait"
    if not isinstance(released, (int, float)):
        return "-", "not released (aborted?)"
    reached = next((t for s, t in step_times if s >= target), None)
    if reached is None:
        return "-", "chief's step times missing"
    started = first_wait.get(task_id) if isinstance(task_id, int) else None
    if started is None or started > reached:
        return "-", "its step had passed when it started"
    return f"{(released - reached) * 1000:.1f} ms", ""


def _text(value: Any) -> str:
    return "-" if value is None else str(value)
