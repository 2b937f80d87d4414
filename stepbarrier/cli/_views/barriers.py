"""How a job's open barriers look in a terminal (``stepbarrier status`` and ``watch``)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from stepbarrier._barriers.index import BarrierInfo
from stepbarrier._inspect.status import OpenBarrier
from stepbarrier._protocol.barrier_record import describe_tasks


def _age(seconds: float | None, suffix: str = "") -> str:
    return "?" if seconds is None else f"{seconds:.1f} s{suffix}"


def missing_tasks(barrier: BarrierInfo) -> str:
    """Who is missing: the ids as short ranges, and how many more were not checked.

    ``status`` checks a bounded number of task fields per read
    (``stepbarrier._inspect.status.read_open_barriers``): of a larger barrier, the missing
    tasks past those checked are counted, not named.
    """
    shown = describe_tasks(barrier.missing)
    if not isinstance(barrier, OpenBarrier) or not barrier.missing_more:
        return shown
    unchecked = f"{barrier.tasks_checked}-{barrier.parties - 1}"
    rest = f"{barrier.missing_more:,} more among tasks {unchecked}"
    return rest if not barrier.missing else f"{shown}, and {rest}"


def barriers_table(barriers: tuple[BarrierInfo, ...]) -> Table:
    """One row per open barrier: how many of its parties arrived, and who is missing."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    # at 80 columns too: names fold rather than being cut, numbers never wrap
    table.add_column("barrier", overflow="fold")
    table.add_column("run", overflow="fold")
    table.add_column("arrived", justify="right", no_wrap=True)
    table.add_column("missing tasks", overflow="fold")
    table.add_column("open for", justify="right", no_wrap=True)
    table.add_column("last arrival", justify="right", no_wrap=True)
    for barrier in barriers:
        table.add_row(
            Text(barrier.name),
            Text(barrier.run_id or "-"),
            f"{barrier.arrived:,}/{barrier.parties:,}",
            Text(missing_tasks(barrier)),
            _age(barrier.open_for),
            _age(barrier.last_arrival_age, " ago"),
        )
    return table
