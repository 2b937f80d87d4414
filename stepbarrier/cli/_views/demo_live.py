"""The live view of ``stepbarrier demo``: the chief's progress and every worker, to the end.

One row per worker (task ids 1..N, the numbering of ``status`` and the
summary), kept after its release with the step that released it and its wake
latency; the chief's progress toward the job's last step; the ps and the
chief's processes. No generation ids or other internals. Piped, one line of the
same (``progress_line``) instead.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stepbarrier.cli._views.status import describe_age


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
    others: tuple[tuple[str, int], ...] = ()
    """Registered waiters that are none of the demo's workers: (host, target)."""


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
        heartbeat.append(f" (chief {frame.chief_name})")  # as written: Text, never markup
    head.add_row("heartbeat", heartbeat)
    head.add_row("processes", Text(f"ps {frame.ps}, chief {frame.chief}"))
    table = Table(box=None, header_style="bold", pad_edge=False)
    for header, justify in [
        ("worker", "right"),
        ("wait until step", "right"),
        ("progress", "left"),
        ("state", "left"),
        ("released at", "right"),
        ("wake latency", "right"),
    ]:
        table.add_column(header, justify=justify)  # type: ignore[arg-type]
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
    if frame.others:
        others = Table(box=None, header_style="bold", pad_edge=False, title_justify="left")
        others.add_column("other waiter (not a worker of the demo)")
        others.add_column("wait until step", justify="right")
        for host, target in frame.others:
            others.add_row(Text(host), str(target))
        parts += [Text(""), others]
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
