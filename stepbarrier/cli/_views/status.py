"""How a job's status looks in a terminal (``status``, ``watch``): the chief, the
waiters (one per row while few, else a ``WaiterSummary``: a bounded view
whatever their number), the tasks and the open barriers, with who is missing.

Everything a worker or a chief wrote (host names, the chief's name, problems)
goes in as ``Text``, never as a markup string: ``[bold]`` in a host name is
shown as written, and ``[/x]`` cannot break the view.
"""

from __future__ import annotations

import math
import time

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Column, Table
from rich.text import Text

from stepbarrier._barriers.barrier import BarrierInfo
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import JobStatus, OpenBarrier, is_stale, stale_limit
from stepbarrier._inspect.summary import WaiterSummary
from stepbarrier._protocol.barrier_record import describe_tasks
from stepbarrier._protocol.freshness import FENCE
from stepbarrier.cli._views.output import bare_table, number

UNKNOWN = "?"
"""Shown for a time a waiter's entry does not hold plausibly."""
MIN_HOST = 16
"""Narrowest host column: a longer host name folds onto more lines, never cut."""
TASKS_LISTED = 20
"""Most tasks the terminal lists (``tasks_by_concern``); ``--json`` lists every one read."""
BAR_WIDTH = 30
"""Characters of the longest histogram bar, and of the widest progress bar."""
MIN_BAR = 10
"""Characters of the narrowest progress bar (a narrow terminal)."""


def describe_duration(seconds: float | None, unknown: str = "never") -> str:
    """``"0.4 s"``, ``"3 min"`` or ``"1.5 h"`` (``unknown`` for none)."""
    if seconds is None or not math.isfinite(seconds):
        return unknown
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"


def describe_age(seconds: float | None) -> str:
    """``"0.4 s ago"``, ``"3 min ago"`` or ``"never"``."""
    shown = describe_duration(seconds)
    return shown if shown == "never" else f"{shown} ago"


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


def describe_vouch(status: JobStatus) -> str:
    """The ``vouched`` row: whether the stored step may release a worker, and why not."""
    if status.pinned:
        return "yes: pinned by an operator (stepbarrier publish)"
    if status.vouch:
        return "yes: the step may release the workers waiting for it"
    if status.probation:
        return f"no: on probation (a chief made the state anew after Redis lost it; {FENCE:g} s)"
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
        # no row for the beat (JobStatus.beat): the heartbeat row is the age of the last write
    grid.add_row("done", "yes" if status.done else "no")
    if status.reset_at is not None:
        grid.add_row("reset", f"at {_clock_time(status.reset_at)}")
    grid.add_row("waiting", f"{waiting:,} worker(s)")
    for problem in status.problems:
        grid.add_row(Text("problem", style="red"), Text(problem, style="red"))
    return grid


def waiters_table(status: JobStatus, *, progress: bool, now: float | None = None) -> Table:
    """The waiting workers, lowest target first; with a progress bar per worker."""
    now = time.time() if now is None else now
    # at 80 columns too: numbers never wrap, the host folds rather than being cut, the
    # bar takes what is left (watch drops "waiting since": "for" says as much in less room)
    table = bare_table(
        number("task"),
        number("wait until step"),
        *(progress_columns() if progress else [Column("waiting since", no_wrap=True)]),
        number("for"),
        Column("host", overflow="fold", min_width=MIN_HOST),
    )
    step = status.step or 0
    for waiter in status.waiters:
        target, since = waiter.wait_until_step, waiter.since
        table.add_row(
            "-" if waiter.task_id is None else str(waiter.task_id),
            str(target),
            *(progress_cells(step, target) if progress else [_clock_time(since)]),
            _seconds(None if since is None else max(0.0, now - since)),
            Text(waiter.host if waiter.pid is None else f"{waiter.host}:{waiter.pid}"),
        )
    return table


def describe_stuck(status: JobStatus, stall_timeout: float) -> str:
    """Why ``status --check`` says ``stuck``: which tasks, at which step, since when."""
    stuck = status.stuck_tasks
    named = ", ".join(
        f"task {t.task_id} at step {t.step} ({t.behind} behind, no progress for "
        f"{describe_duration(t.changed_age_s)})"
        for t in stuck[:10]
    )
    more = f" and {len(stuck) - 10} more" if len(stuck) > 10 else ""
    return (
        f"{named}{more}: no progress for the stall timeout of {stall_timeout:g} s while the "
        f"chief advanced to step {status.step}"
    )


def tasks_table(status: JobStatus) -> RenderableType:
    """Each task's reported step and how far behind the chief (``TASKS_LISTED``)."""
    ordered = status.tasks_by_concern
    table = bare_table(
        *map(number, ("task", "step", "behind", "last progress")), Column("", no_wrap=True)
    )
    for task in ordered[:TASKS_LISTED]:
        table.add_row(
            str(task.task_id),
            str(task.step),
            "-" if task.behind is None else str(task.behind),
            describe_age(task.changed_age_s),
            Text("STUCK", style="bold red")
            if task.stuck
            else Text("straggler", style="yellow")
            if task.straggler
            else Text("ok"),
        )
    stuck = len(status.stuck_tasks)
    stragglers = sum(1 for t in status.tasks if t.straggler)
    unlisted = len(ordered) - TASKS_LISTED
    notes = [
        f"{len(status.tasks):,} task(s) report their progress",
        f"{stuck} stuck" if stuck else "",
        f"{stragglers} straggler(s) (behind by more than {status.straggler_threshold})"
        if stragglers
        else "",
        f"{unlisted:,} more not listed (--json lists them)" if unlisted > 0 else "",
        f"{status.tasks_more:,} more not read" if status.tasks_more else "",
    ]
    return Group(table, Text("; ".join(filter(None, notes)), style="dim"))


def status_view(
    status: JobStatus,
    *,
    progress: bool = False,
    summary: WaiterSummary | None = None,
    here: BarrierConfig | None = None,
    now: float | None = None,
) -> RenderableType:
    """The whole status; with ``here`` (the command's settings) it also says which
    run id they give (``run here``). ``now``: the Unix time the waits are measured to."""
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
    status: JobStatus, *, note: str | None = None, summary: WaiterSummary | None = None
) -> RenderableType:
    """The ``watch`` view: the status with progress bars, and a note (e.g. an error)."""
    view = status_view(status, progress=True, summary=summary)
    noted = [Text(note, style="yellow")] if note else []
    updated = Text(f"updated {time.strftime('%H:%M:%S')} - Ctrl-C to stop", style="dim")
    return Group(view, *noted, updated)


def summary_view(summary: WaiterSummary, step: int | None) -> RenderableType:
    """The counts, the nearest targets (with the chief's progress) and the histogram."""
    parts: list[RenderableType] = []
    if summary.reached:
        parts.append(Text(f"{summary.reached:,} of them wait for a step the chief has reached"))
    if summary.nearest:
        parts += [_nearest(summary, step or 0), Text("")]
    if summary.histogram:
        parts.append(_histogram(summary))
    return Group(*parts)


def _nearest(summary: WaiterSummary, step: int) -> Table:
    table = bare_table(
        number("wait until step"), number("workers"), *progress_columns(), title="nearest targets"
    )
    for target, waiters in summary.nearest:
        table.add_row(str(target), f"{waiters:,}", *progress_cells(step, target))
    return table


def _histogram(summary: WaiterSummary) -> Table:
    table = bare_table(number("steps"), number("workers"), "", title="targets")
    most = max(n for _, _, n in summary.histogram) or 1
    for first, last, waiters in summary.histogram:
        steps = str(first) if first == last else f"{first}-{last}"
        bar = "#" * max(1 if waiters else 0, round(BAR_WIDTH * waiters / most))
        table.add_row(steps, f"{waiters:,}", bar)
    return table


def progress_columns() -> list[Column]:
    """The columns of ``progress_cells``: the bar takes what room is left."""
    return [Column("progress", min_width=MIN_BAR, max_width=BAR_WIDTH), number("")]


def progress_cells(step: int, target: int) -> list[RenderableType]:
    """A progress bar toward ``target`` with the chief at ``step``, and ``done/target``."""
    done = min(step, target)
    return [ProgressBar(total=target, completed=done), f"{done}/{target}"]


def _seconds(seconds: float | None, suffix: str = "") -> str:
    return UNKNOWN if seconds is None else f"{seconds:.1f} s{suffix}"


def missing_tasks(barrier: BarrierInfo) -> str:
    """Who is missing: the ids as short ranges, and how many more among the tasks
    ``read_open_barriers`` did not check."""
    shown = describe_tasks(barrier.missing)
    if not isinstance(barrier, OpenBarrier) or not barrier.missing_more:
        return shown
    unchecked = f"{barrier.tasks_checked}-{barrier.parties - 1}"
    rest = f"{barrier.missing_more:,} more among tasks {unchecked}"
    return rest if not barrier.missing else f"{shown}, and {rest}"


def barriers_table(barriers: tuple[BarrierInfo, ...]) -> Table:
    """One row per open barrier: how many of its parties arrived, and who is missing."""
    # at 80 columns too: names fold rather than being cut
    table = bare_table(
        Column("barrier", overflow="fold"),
        Column("run", overflow="fold"),
        number("arrived"),
        Column("missing tasks", overflow="fold"),
        number("open for"),
        number("last arrival"),
    )
    for barrier in barriers:
        table.add_row(
            Text(barrier.name),
            Text(barrier.run_id or "-"),
            f"{barrier.arrived:,}/{barrier.parties:,}",
            Text(missing_tasks(barrier)),
            _seconds(barrier.open_for),
            _seconds(barrier.last_arrival_age, " ago"),
        )
    return table
