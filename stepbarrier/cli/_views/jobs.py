"""How the ``stepbarrier jobs`` listing looks in a terminal: one row per job.

Only renders a ``JobListing``; finding and reading the jobs is
``stepbarrier._inspect.listing``'s job. A chief the listing calls stale
(``JobSummary.stale``: the rule ``status`` marks STALE by) is marked so.
Whatever came from Redis (run ids, problems) goes in as ``Text``, never as
markup.
"""

from __future__ import annotations

from rich.console import Group, JustifyMethod, RenderableType
from rich.table import Table
from rich.text import Text

from stepbarrier._inspect.listing import JobListing, JobSummary
from stepbarrier.cli._views.status import describe_age


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    return describe_age(value).removesuffix(" ago")


def _heartbeat(job: JobSummary) -> Text:
    """Its age, marked STALE by the rule ``status`` marks it with (``JobSummary.stale``)."""
    text = Text(describe_age(job.heartbeat_age))
    if job.stale:
        text.append(" STALE", style="bold red")
    return text


def _row(job: JobSummary, *, problems: bool) -> list[RenderableType]:
    cells: list[RenderableType] = [
        Text(job.job),
        Text(job.run_id or "-"),
        "-" if job.step is None else str(job.step),
        "yes" if job.done else "no",
        _heartbeat(job),
        str(job.waiting_workers),
        "-" if job.next_wait_until_step is None else str(job.next_wait_until_step),
        _seconds(job.oldest_wait),
    ]
    if problems:
        cells.append(Text(str(len(job.problems)), style="red") if job.problems else "")
    return cells


def truncation_lines(listing: JobListing) -> list[str]:
    """What a truncated listing left out, one line per pattern (none: nothing)."""
    lines = []
    if not listing.scan_complete:
        lines.append(
            "the scan for jobs stopped at its bound of SCAN calls: jobs past it are not listed"
        )
    for part in listing.patterns:
        if part.found > part.read:
            lines.append(
                f"{part.found:,} jobs match {part.pattern!r}: only {part.read:,} are listed "
                "(the lowest names; its share of the jobs one listing reads)"
            )
    if any(part.pattern == "*" for part in listing.patterns) and lines:
        lines.append(
            "give each team's pattern (--job 'team-a-*' --job 'team-b-*'): each then gets "
            "its own share, and one team's jobs never hide another's"
        )
    return lines


def jobs_view(listing: JobListing, *, where: str) -> RenderableType:
    """The jobs as a table, then each job's problems, then what a truncated listing
    left out; ``where`` names the Redis."""
    left_out = [Text(line, style="yellow") for line in truncation_lines(listing)]
    if not listing.jobs:
        return Group(Text(f"no jobs on {where}"), *left_out)
    table = Table(box=None, header_style="bold", pad_edge=False)
    # at 80 columns too, and piped: the names fold onto more lines rather than
    # being cut, the numbers never wrap
    columns: list[tuple[str, JustifyMethod, bool]] = [  # (header, justify, may wrap)
        ("job", "left", True),
        ("run", "left", True),
        ("step", "right", False),
        ("done", "left", False),
        ("heartbeat", "left", True),
        ("waiting", "right", False),
        ("next step", "right", False),
        ("oldest wait", "right", False),
    ]
    problems = any(job.problems for job in listing.jobs)
    if problems:
        columns.append(("problems", "right", False))
    for header, justify, wraps in columns:
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold")
    for job in listing.jobs:
        table.add_row(*_row(job, problems=problems))
    parts: list[RenderableType] = [table]
    for job in listing.jobs:
        for problem in job.problems:
            parts.append(Text(f"{job.job}: {problem}", style="red"))
    return Group(*parts, *left_out)
