"""How a job's status looks in a terminal: the ``status`` table and the live view.

Shared by the ``stepbarrier`` command (``status``, ``watch``) and the demo. Only
renders a ``JobStatus``; reading it is ``stepbarrier._inspect.status.read_status``'s job.
Everything a worker or a chief wrote (host names, the chief's name, problems)
goes in as ``Text``, never as a markup string: ``[bold]`` in a host name is
shown as written, and ``[/x]`` cannot break the view.
"""

from __future__ import annotations

import math
import time

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.live_chief import is_stale, stale_limit
from stepbarrier._inspect.progress import TaskProgress
from stepbarrier._inspect.registry import WaiterInfo
from stepbarrier._inspect.status import JobStatus
from stepbarrier._inspect.summary import WaiterSummary
from stepbarrier.cli._views.barriers import barriers_table
from stepbarrier.cli._views.waiter_summary import BAR_WIDTH, MIN_BAR, summary_view

UNKNOWN = "?"
"""Shown for a time a waiter's entry does not hold plausibly."""
MIN_HOST = 16
"""Narrowest host column: a longer host name folds onto more lines, never cut."""
TASKS_LISTED = 20
"""Most tasks the terminal lists (stuck first, then stragglers, then the most
behind); the others are counted under the table (``--json`` lists every one read)."""


def describe_age(seconds: float | None) -> str:
    """``"0.4 s ago"``, ``"3 min ago"`` or ``"never"``."""
    if seconds is None or not math.isfinite(seconds):
        return "never"
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def _clock_time(unix: float | None) -> str:
    if unix is None:
        return UNKNOWN
    try:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(unix))
    except (OverflowError, OSError, ValueError):  # read_status keeps times plausible
        return UNKNOWN


OTHER_RUN = (
    " - not the run of the chief's state: a worker with these settings ignores it "
    "and waits for its own run's chief (docs/configuration.md#run-id)"
)
"""Said after ``run here`` when the stored state is another run's."""


def describe_vouch(status: JobStatus) -> str:
    """The ``vouched`` row: whether the stored step may release a worker, and why not."""
    if status.pinned:
        return "yes: pinned by an operator (stepbarrier publish)"
    if status.vouch:
        return "yes: the step may release the workers waiting for it"
    if status.probation:
        return "no: on probation (a chief made the state anew after Redis lost it; 3 s)"
    return "no: the chief's training loop has not handed a step over lately"


def _summary(status: JobStatus, waiting: int, here: BarrierConfig | None) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold")
    grid.add_column()
    grid.add_row("job", Text(status.job))
    if status.run_id is not None:
        grid.add_row("run", Text(status.run_id))
    if here is not None:
        # the run id this command's settings give: what a worker started with
        # them would trust, e.g. a Slurm job's in a shell of that job
        run_here = Text(here.describe_run_id())
        if status.generation is not None and status.run_id != here.run_id:
            run_here.append(OTHER_RUN, style="yellow")
        grid.add_row("run here", run_here)
    grid.add_row("step", "none yet" if status.step is None else str(status.step))
    grid.add_row("generation", "-" if status.generation is None else str(status.generation))
    heartbeat = Text(describe_age(status.heartbeat_age))
    if status.chief:
        heartbeat.append(f" (chief {status.chief})")
    if is_stale(status):
        heartbeat.append(
            f" STALE: no heartbeat for over {stale_limit(status) or 0:g} s; is the chief running?",
            style="bold red",
        )
    grid.add_row("heartbeat", heartbeat)
    if status.step is not None:
        grid.add_row("vouched", Text(describe_vouch(status)))
        # no row for the beat: it starts from the Redis clock in microseconds,
        # so as a number it says nothing (status --json keeps it); the
        # heartbeat row is the age of the last write
    grid.add_row("done", "yes" if status.done else "no")
    if status.reset_at is not None:
        grid.add_row("reset", f"at {_clock_time(status.reset_at)}")
    grid.add_row("waiting", f"{waiting:,} worker(s)")
    for problem in status.problems:
        grid.add_row(Text("problem", style="red"), Text(problem, style="red"))
    return grid


def _waited(waiter: WaiterInfo, now: float) -> str:
    if waiter.since is None:
        return UNKNOWN
    return f"{max(0.0, now - waiter.since):.1f} s"


def waiters_table(status: JobStatus, *, progress: bool, now: float | None = None) -> Table:
    """The waiting workers, lowest target first; with a progress bar per worker."""
    now = time.time() if now is None else now
    # at 80 columns too, and piped: the numbers never wrap, the host folds onto
    # more lines rather than being cut, and the bar takes what is left (watch
    # drops "waiting since": "for" says as much in less room)
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("task", justify="right", no_wrap=True)
    table.add_column("wait until step", justify="right", no_wrap=True)
    if progress:
        table.add_column("progress", min_width=MIN_BAR, max_width=BAR_WIDTH)
        table.add_column("", justify="right", no_wrap=True)
    else:
        table.add_column("waiting since", no_wrap=True)
    table.add_column("for", justify="right", no_wrap=True)
    table.add_column("host", overflow="fold", min_width=MIN_HOST)
    step = status.step or 0
    for waiter in status.waiters:
        cells: list[RenderableType] = [
            "-" if waiter.task_id is None else str(waiter.task_id),
            str(waiter.wait_until_step),
        ]
        if progress:
            done = min(step, waiter.wait_until_step)
            cells.append(ProgressBar(total=waiter.wait_until_step, completed=done))
            cells.append(f"{done}/{waiter.wait_until_step}")
        else:
            cells.append(_clock_time(waiter.since))
        host = waiter.host if waiter.pid is None else f"{waiter.host}:{waiter.pid}"
        cells += [_waited(waiter, now), Text(host)]
        table.add_row(*cells)
    return table


def describe_stuck(status: JobStatus, stall_timeout: float) -> str:
    """Why ``status --check`` says ``stuck``: which tasks, at which step, since when."""
    stuck = status.stuck_tasks
    named = ", ".join(
        f"task {t.task_id} at step {t.step} ({t.behind} behind, no progress for "
        f"{describe_age(t.changed_age_s).removesuffix(' ago')})"
        for t in stuck[:10]
    )
    more = f" and {len(stuck) - 10} more" if len(stuck) > 10 else ""
    return (
        f"{named}{more}: no progress for the stall timeout of {stall_timeout:g} s while the "
        f"chief advanced to step {status.step}"
    )


def _task_state(task: TaskProgress) -> Text:
    if task.stuck:
        return Text("STUCK", style="bold red")
    if task.straggler:
        return Text("straggler", style="yellow")
    return Text("ok")


def tasks_table(status: JobStatus) -> RenderableType:
    """Each task's reported step and how far behind the chief: the stuck first, then
    the stragglers, then the most behind (at most ``TASKS_LISTED``; the rest counted)."""
    ordered = sorted(
        status.tasks, key=lambda t: (not t.stuck, not t.straggler, -(t.behind or 0), t.task_id)
    )
    table = Table(box=None, header_style="bold", pad_edge=False)
    for name in ("task", "step", "behind", "last progress"):
        table.add_column(name, justify="right", no_wrap=True)
    table.add_column("", no_wrap=True)
    for task in ordered[:TASKS_LISTED]:
        table.add_row(
            str(task.task_id),
            str(task.step),
            "-" if task.behind is None else str(task.behind),
            describe_age(task.changed_age_s),
            _task_state(task),
        )
    parts: list[RenderableType] = [table]
    stuck = len(status.stuck_tasks)
    stragglers = sum(1 for t in status.tasks if t.straggler)
    notes = [f"{len(status.tasks):,} task(s) report their progress"]
    if stuck:
        notes.append(f"{stuck} stuck")
    if stragglers:
        notes.append(
            f"{stragglers} straggler(s) (behind by more than {status.straggler_threshold})"
        )
    if len(ordered) > TASKS_LISTED:
        notes.append(f"{len(ordered) - TASKS_LISTED:,} more not listed (--json lists them)")
    if status.tasks_more:
        notes.append(f"{status.tasks_more:,} more not read")
    parts.append(Text("; ".join(notes), style="dim"))
    return Group(*parts)


def status_view(
    status: JobStatus,
    *,
    progress: bool = False,
    summary: WaiterSummary | None = None,
    here: BarrierConfig | None = None,
    now: float | None = None,
) -> RenderableType:
    """The whole status: a summary, the waiting workers and the open barriers (if any).

    With a ``summary`` (a large job) the workers are summarised, not listed.
    With ``here`` (the command's settings) the summary also says which run id
    they give and where it came from (``run here``), and whether the stored
    state is another run's. ``now``: the Unix time the waits are measured to
    (the clock's by default).
    """
    waiting = len(status.waiters) if summary is None else summary.waiting
    parts: list[RenderableType] = [_summary(status, waiting, here)]
    if summary is not None:
        parts += [Text(""), summary_view(summary, status.step)]
    elif status.waiters:
        parts += [Text(""), waiters_table(status, progress=progress, now=now)]
    if status.tasks:
        parts += [Text(""), tasks_table(status)]
    if status.barriers:
        parts += [Text(""), barriers_table(status.barriers)]
    return Group(*parts)


def live_view(
    status: JobStatus | None, *, note: str | None = None, summary: WaiterSummary | None = None
) -> RenderableType:
    """The ``watch`` view: the status with progress bars, and a note (e.g. an error)."""
    parts: list[RenderableType] = []
    if status is not None:
        parts.append(status_view(status, progress=True, summary=summary))
    if note:
        parts.append(Text(note, style="yellow"))
    parts.append(Text(f"updated {time.strftime('%H:%M:%S')} - Ctrl-C to stop", style="dim"))
    return Group(*parts)
