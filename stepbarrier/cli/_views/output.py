"""Printing a view: rich on a terminal; plain lines when piped (docs/cli.md#commands).

Whether the output is a terminal is the stream's own ``isatty()``: rich also
calls a pipe a terminal under ``FORCE_COLOR`` or ``TTY_COMPATIBLE`` (which CI
systems set), and would then redraw live views and cut every line at the width.
"""

from __future__ import annotations

import io
import sys

from rich.console import Console, RenderableType
from rich.table import Column, Table


def interactive(console: Console) -> bool:
    """True if ``console`` writes to a real terminal."""
    try:
        return console.is_terminal and console.file.isatty()
    except (AttributeError, ValueError, OSError):  # a closed or unusual stream
        return False


def plain_text(renderable: RenderableType, width: int = 100) -> str:
    """``renderable`` as plain text, ``width`` columns wide, each line right-stripped."""
    console = Console(
        file=io.StringIO(), width=width, highlight=False, color_system=None, force_terminal=False
    )
    with console.capture() as captured:
        console.print(renderable)
    return "\n".join(line.rstrip() for line in captured.get().splitlines())


def show(renderable: RenderableType, console: Console | None = None) -> None:
    """Print ``renderable`` to stdout: rich on a terminal, else ``plain_text``, flushed."""
    console = console or Console(highlight=False)
    if interactive(console):
        console.print(renderable)
        return
    sys.stdout.write(plain_text(renderable, console.width) + "\n")
    sys.stdout.flush()


def bare_table(*columns: Column | str, title: str | None = None) -> Table:
    """A table of the views' own look: no box, bold headers, no padding at its edges."""
    return Table(
        *columns, box=None, header_style="bold", pad_edge=False, title=title, title_justify="left"
    )


def number(header: str) -> Column:
    """A column of numbers: right-justified, never wrapped (at 80 columns too)."""
    return Column(header, justify="right", no_wrap=True)
