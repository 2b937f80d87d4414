"""How a large job's waiters look in a terminal: counts, the nearest targets, a histogram.

Renders a ``WaiterSummary`` (``stepbarrier._inspect.summary``) for ``status`` and
``watch`` in place of one row per worker: a bounded view, whatever the number
of workers.
"""

from __future__ import annotations

from rich.console import Group, RenderableType
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stepbarrier._inspect.summary import WaiterSummary

BAR_WIDTH = 30
"""Characters of the longest histogram bar, and of the widest progress bar."""
MIN_BAR = 10
"""Characters of the narrowest progress bar (a narrow terminal)."""


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
    table = Table(box=None, header_style="bold", pad_edge=False, title_justify="left")
    table.title = "nearest targets"
    table.add_column("wait until step", justify="right", no_wrap=True)
    table.add_column("workers", justify="right", no_wrap=True)
    table.add_column("progress", min_width=MIN_BAR, max_width=BAR_WIDTH)  # what is left
    table.add_column("", justify="right", no_wrap=True)
    for target, waiters in summary.nearest:
        done = min(step, target)
        bar = ProgressBar(total=target, completed=done)
        table.add_row(str(target), f"{waiters:,}", bar, f"{done}/{target}")
    return table


def _histogram(summary: WaiterSummary) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False, title_justify="left")
    table.title = "targets"
    table.add_column("steps", justify="right", no_wrap=True)
    table.add_column("workers", justify="right", no_wrap=True)
    table.add_column("")
    most = max(n for _, _, n in summary.histogram) or 1
    for first, last, waiters in summary.histogram:
        steps = str(first) if first == last else f"{first}-{last}"
        bar = "#" * max(1 if waiters else 0, round(BAR_WIDTH * waiters / most))
        table.add_row(steps, f"{waiters:,}", bar)
    return table
