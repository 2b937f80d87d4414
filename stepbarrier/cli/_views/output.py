"""Printing a view: rich on a terminal; plain lines without trailing spaces when piped.

Piped output is for logs and scripts: no colours, no cursor moves, no padding
at line ends, and each frame flushed as it is written (``watch`` in a CI log).
"""

from __future__ import annotations

import io
import sys

from rich.console import Console, RenderableType


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
    if console.is_terminal:
        console.print(renderable)
        return
    sys.stdout.write(plain_text(renderable, console.width) + "\n")
    sys.stdout.flush()
