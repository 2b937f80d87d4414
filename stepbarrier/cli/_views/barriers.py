"""How a job's open barriers look in a terminal (``stepbarrier status`` and ``watch``)."""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from stepbarrier._barriers.index import BarrierInfo
from stepbarrier._protocol.barrier_record import describe_tasks


def _age(seconds: float | None, suffix: str = "") -> str:
    return "?" if seconds is None else f"{seconds:.1f} s{suffix}"


def barriers_table(barriers: tuple[BarrierInfo, ...]) -> Table:
    """One row per open barrier: how many of its parties arrived, and who is missing."""
    table = Table(box=None, header_style="bold", pad_edge=False)
    table.add_column("barrier")
    table.add_column("run")
    table.add_column("arrived", justify="right")
    table.add_column("missing tasks")
    table.add_column("open for", justify="right")
    table.add_column("last arrival", justify="right")
    for barrier in barriers:
        table.add_row(
            Text(barrier.name),
            Text(barrier.run_id or "-"),
            f"{barrier.arrived}/{barrier.parties}",
            Text(describe_tasks(barrier.missing)),
            _age(barrier.open_for),
            _age(barrier.last_arrival_age, " ago"),
        )
    return table
