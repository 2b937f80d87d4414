"""How the ``stepbarrier jobs`` listing looks in a terminal: one row per job.

Whatever came from Redis (run ids, problems) goes in as ``Text``, never as markup.
"""

from __future__ import annotations

from collections.abc import Callable

from rich.console import Group, JustifyMethod, RenderableType
from rich.text import Text

from stepbarrier._inspect.listing import JobListing, JobSummary, truncation_lines
from stepbarrier.cli._views.output import bare_table
from stepbarrier.cli._views.status import describe_age, describe_duration


def _heartbeat(job: JobSummary) -> Text:
    text = Text(describe_age(job.heartbeat_age))
    if job.stale:
        text.append(" STALE", style="bold red")
    return text


def _number(value: int | None) -> str:
    return "-" if value is None else str(value)


Cell = Callable[[JobSummary], RenderableType]
COLUMNS: list[tuple[str, JustifyMethod, bool, Cell]] = [
    # (header, justify, may wrap, cell): at 80 columns too, and piped, the names
    # fold onto more lines rather than being cut, the numbers never wrap
    ("job", "left", True, lambda job: Text(job.job)),
    ("run", "left", True, lambda job: Text(job.run_id or "-")),
    ("step", "right", False, lambda job: _number(job.step)),
    ("done", "left", False, lambda job: "yes" if job.done else "no"),
    ("heartbeat", "left", True, _heartbeat),
    ("waiting", "right", False, lambda job: str(job.waiting_workers)),
    ("next step", "right", False, lambda job: _number(job.next_wait_until_step)),
    ("oldest wait", "right", False, lambda job: describe_duration(job.oldest_wait, "-")),
]
PROBLEMS: tuple[str, JustifyMethod, bool, Cell] = (
    "problems",
    "right",
    False,
    lambda job: Text(str(len(job.problems)), style="red") if job.problems else "",
)


def jobs_view(listing: JobListing, *, where: str) -> RenderableType:
    """The jobs as a table, then each job's problems, then what a truncated listing
    left out; ``where`` names the Redis."""
    left_out = [Text(line, style="yellow") for line in truncation_lines(listing)]
    if not listing.jobs:
        return Group(Text(f"no jobs on {where}"), *left_out)
    table = bare_table()
    columns = [*COLUMNS, PROBLEMS] if any(job.problems for job in listing.jobs) else COLUMNS
    for header, justify, wraps, _cell in columns:
        table.add_column(header, justify=justify, no_wrap=not wraps, overflow="fold")
    for job in listing.jobs:
        table.add_row(*(cell(job) for *_, cell in columns))
    problems = [Text(f"{job.job}: {p}", style="red") for job in listing.jobs for p in job.problems]
    return Group(table, *problems, *left_out)
