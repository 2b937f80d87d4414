"""The options of the commands that wait (``wait``, ``arrive``): who waits, how long.

Both commands take a task id and wait under the same two limits, set by the
same variables, so the options are written once here; only their words differ.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import click

from stepbarrier.cli._context import EXIT_TIMEOUT, Duration, variable_option

F = TypeVar("F", bound=Callable[..., Any])


def timeout_options(stall: str) -> Callable[[F], F]:
    """``--timeout`` and ``--stall-timeout``, in that order.

    Args:
        stall: What the stall timeout waits for, e.g. ``"a chief heartbeat"``.

    Example:
        ``@timeout_options("a new arrival")`` under the command's other options.
    """
    timeout = variable_option(
        "--timeout",
        variable="STEPBARRIER_TIMEOUT",
        type=Duration(),
        metavar="DURATION",
        help=f"Give up (exit {EXIT_TIMEOUT}) after this long (seconds, or 90s, 10m, 1h); "
        "no limit by default.",
    )
    stall_timeout = variable_option(
        "--stall-timeout",
        variable="STEPBARRIER_STALL_TIMEOUT",
        type=Duration(),
        metavar="DURATION",
        help=f"Give up (exit {EXIT_TIMEOUT}) after this long without {stall} (default 600 s).",
    )

    def decorate(command: F) -> F:
        return timeout(stall_timeout(command))

    return decorate


def task_id_option(help: str) -> Callable[[F], F]:
    """``--task-id``: the waiting task's id, ``help`` saying what it is used for."""
    return variable_option(
        "--task-id",
        variable="STEPBARRIER_TASK_ID",
        type=click.IntRange(0),
        metavar="ID",
        help=help,
    )
