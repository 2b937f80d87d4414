"""What the demo shows: the live view (or, piped, one progress line) and the summary.

The live view has one row per worker (task ids 1..N, the numbering of
``status`` and the summary), kept after its release with the step that
released it and its wake latency; the chief's progress toward the job's last
step; the ps and the chief's processes. No generation ids or other internals.
Other registered waiters are listed as ``stepbarrier status`` lists them.
Everything the tasks wrote goes in as ``Text``, never as markup.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stepbarrier import JobStatus
from stepbarrier.cli._views.status import describe_age, waiters_table


@dataclass(frozen=True)
class WorkerRow:
    """One worker as the demo sees it.

    Attributes:
        task_id: Its task id (1..N).
        target: Its ``wait_until_step``.
        state: ``starting``, ``waiting``, ``training``, ``finished`` or ``exited N``.
        released_at: The chief's step that released it (``None``: not yet, or it did not wait).
        latency: Its wake latency (``"3.1 ms"``), or ``"-"``.
        note: Why there is no latency, if there is none.
    """

    task_id: int
    target: int
    state: str
    released_at: int | None = None
    latency: str = "-"
    note: str = ""


@dataclass(frozen=True)
class DemoFrame:
    """What one frame shows."""

    phase: str
    job: str
    steps: int
    step: int | None
    heartbeat_age: float | None
    ps: str
    chief: str
    workers: tuple[WorkerRow, ...]
    chief_name: str | None = None
    others: JobStatus | None = None
    """The job's status with only the registered waiters that are none of the workers."""


def demo_view(frame: DemoFrame) -> RenderableType:
    """The terminal view of ``frame``."""
    head = Table.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    head.add_row("job", Text(frame.job))
    step = frame.step or 0
    chief = Table.grid(padding=(0, 1))
    chief.add_row(
        ProgressBar(total=frame.steps, completed=min(step, frame.steps), width=30),
        Text(chief_step(frame.step, frame.steps, "step {step} of {steps}")),
    )
    head.add_row("chief", chief)
    heartbeat = Text(describe_age(frame.heartbeat_age))
    if frame.chief_name:
        heartbeat.append(f" (chief {frame.chief_name})")
    head.add_row("heartbeat", heartbeat)
    head.add_row("processes", Text(f"ps {frame.ps}, chief {frame.chief}"))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for header in ("worker", "wait until step", "progress", "state", "released at", "wake latency"):
        table.add_column(header, justify="left" if header in ("progress", "state") else "right")
    for row in frame.workers:
        reached = min(step, row.target) if row.target > 0 else 0
        table.add_row(
            str(row.task_id),
            str(row.target),
            ProgressBar(total=max(1, row.target), completed=reached if row.target else 1, width=20),
            Text(row.state, style=_state_style(row.state)),
            "-" if row.released_at is None else str(row.released_at),
            Text(row.latency if row.latency != "-" else row.note or "-"),
        )
    parts: list[RenderableType] = [Text(frame.phase, style="bold"), head, Text(""), table]
    if frame.others is not None and frame.others.waiters:
        parts += [Text(""), Text("other waiters (no worker of the demo)", style="bold")]
        parts.append(waiters_table(frame.others, progress=False))
    return Group(*parts)


def chief_step(step: int | None, steps: int, within: str) -> str:
    """The chief's step against the job's last step, ``within`` formatted up to it.

    Past it, says why: every task of the asynchronous job adds to the global
    step, and each stops only after the run it had under way when the step
    reached the last one, so the step ends above it by up to one per other task.
    """
    if step is None:
        return "no step yet"
    if step <= steps:
        return within.format(step=step, steps=steps)
    return f"step {step}: the last step {steps}, plus {step - steps} that other tasks had under way"


def _state_style(state: str) -> str:
    if state.startswith("exited"):
        return "red"
    return {"waiting": "yellow", "training": "green", "finished": "green"}.get(state, "")


def progress_line(frame: DemoFrame) -> str:
    """``frame`` as one line, for piped output."""
    step = chief_step(frame.step, frame.steps, "step {step}/{steps}")
    workers = []
    for row in frame.workers:
        if row.released_at is not None:
            latency = f", {row.latency}" if row.latency != "-" else ""
            workers.append(f"worker {row.task_id} released at {row.released_at}{latency}")
        elif row.state == "waiting":
            workers.append(f"worker {row.task_id} waiting for {row.target}")
        else:
            workers.append(f"worker {row.task_id} {row.state}")
    return f"{frame.phase}: chief at {step}; " + "; ".join(workers)


def release_summary(
    title: str,
    *,
    chief: dict[str, Any],
    workers: list[dict[str, Any]],
    targets: list[int],
    first_wait: dict[int, float],
) -> RenderableType:
    """The table the demo ends with: one row per worker, its target, the step that
    released it and its wake latency.

    Args:
        title: The table's title.
        chief: The chief's record (``step_times``: pairs of step and time).
        workers: Each worker's record, in task order (task ids 1..N); ``{}`` if missing.
        targets: Each worker's ``wait_until_step``, for records that lack it.
        first_wait: When each task id was first seen waiting, by the demo's polls.
    """
    step_times = step_times_of(chief)
    rows = []
    for index, record in enumerate(workers):
        task_id = record.get("task_id", index + 1)
        target = record.get("wait_until_step", targets[index])
        latency, note = wake_latency(record, target, step_times, task_id, first_wait)
        released, trained = (record.get(key) for key in ("released_at_step", "steps_trained"))
        rows.append(
            [f"worker {task_id}", str(target), _text(released), latency, _text(trained), note]
        )
    table = Table(title=title)
    headers = ["task", "wait_until_step", "released at", "wake latency", "steps trained"]
    if any(row[-1] for row in rows):
        headers.append("note")
    for header in headers:
        table.add_column(header, justify="left" if header == "note" else "right", no_wrap=True)
    for row in rows:
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


def step_times_of(chief: dict[str, Any]) -> list[tuple[int, float]]:
    """The chief record's ``step_times`` (``[]`` if malformed)."""
    try:
        return [(int(s), float(t)) for s, t in chief.get("step_times") or []]
    except (TypeError, ValueError):
        return []


def wake_latency(
    record: dict[str, Any],
    target: int,
    step_times: list[tuple[int, float]],
    task_id: Any,
    first_wait: dict[int, float],
) -> tuple[str, str]:
    """A released worker's wake latency, or ``"-"`` and why there is none."""
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
