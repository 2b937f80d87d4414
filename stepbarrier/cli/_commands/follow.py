"""``stepbarrier follow``: ``StepWaiter.follow`` in a shell, for an evaluator or a
checkpoint exporter beside training."""

from __future__ import annotations

import os
import subprocess
from typing import Any

import click

from stepbarrier._protocol.wire import MAX_STEP
from stepbarrier._worker.waiter import StepWaiter
from stepbarrier.cli._context import (
    EXIT_ABORTED,
    EXIT_COMMAND_FAILED,
    EXIT_OK,
    EXIT_TIMEOUT,
    command,
    current_session,
    stopped_like_ctrl_c,
    wait_options,
)


@command(
    (EXIT_OK, "the job finished (each multiple up to its last step was followed)"),
    (EXIT_TIMEOUT, "timeout while waiting for the next multiple"),
    (EXIT_ABORTED, "the job was reset"),
    EXIT_COMMAND_FAILED,
    long_running=True,
)
@click.option(
    "--every",
    type=click.IntRange(1, MAX_STEP),
    required=True,
    metavar="N",
    help="Follow every multiple of N steps.",
)
@click.option(
    "--from",
    "start",
    type=click.IntRange(0, MAX_STEP),
    metavar="S",
    help="Start at the first multiple at or above S (default: the first above the "
    "chief's step when following begins).",
)
@wait_options("a chief heartbeat", task_id="Task id shown in `status` while it waits.")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="[-- COMMAND ...]")
def follow(every: int, start: int | None, command: tuple[str, ...], **_: Any) -> None:
    """Follow training: each multiple of N the chief's step reaches, in order.

    None is skipped when the chief jumps past several. Each is printed on its
    own line, or COMMAND runs for it with STEPBARRIER_STEP set to it (and
    STEPBARRIER_STEP_SEEN to the chief's step), never two at once. It ends
    when the job finishes.

    \b
    Example:
      stepbarrier follow --every 1000 -- python evaluate.py
      stepbarrier follow --every 500 --from 0 | while read step; do ...; done
    """
    config = current_session().config()
    with stopped_like_ctrl_c(), StepWaiter(config) as waiter:
        for crossed in waiter.follow(every, start):
            if not command:
                click.echo(crossed.multiple)
                continue
            env = {
                **os.environ,
                "STEPBARRIER_STEP": str(crossed.multiple),
                "STEPBARRIER_STEP_SEEN": str(crossed.step),
            }
            try:
                done = subprocess.run(command, env=env, check=False)
            except OSError as exc:
                click.echo(f"Error: cannot run {command[0]!r}: {exc.strerror or exc}", err=True)
                raise SystemExit(EXIT_COMMAND_FAILED) from None
            if done.returncode != 0:
                click.echo(
                    f"Error: {command[0]!r} exited {done.returncode} at step {crossed.multiple} "
                    f"(the chief at {crossed.step}); following stops",
                    err=True,
                )
                raise SystemExit(EXIT_COMMAND_FAILED)
