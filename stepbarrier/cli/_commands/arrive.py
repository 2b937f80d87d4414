"""``stepbarrier arrive``: ``stepbarrier.Barrier`` from a shell, e.g. a launcher holding
each task until all are up (``arrive start``) instead of sleeping."""

from __future__ import annotations

from typing import Any

import click

from stepbarrier._barriers.barrier import Barrier
from stepbarrier._protocol.barrier_record import MAX_PARTIES
from stepbarrier.cli._context import (
    EXIT_ABORTED,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    command,
    current_session,
    stopped_like_ctrl_c,
    wait_options,
)


@command(
    (EXIT_OK, "every party arrived (with --no-wait: this task's arrival is recorded)"),
    (
        EXIT_USAGE,
        "usage, configuration, authentication or permission error (a bad name, a task id "
        "outside 0..N-1, another N than the barrier was begun with)",
    ),
    (
        EXIT_TIMEOUT,
        "timeout (the overall timeout, or no arrival for the stall timeout); the message "
        "names the tasks that did not arrive",
    ),
    (EXIT_ABORTED, "aborted: the job was reset while this task waited"),
    long_running=True,
)
@click.argument("name")
@click.option(
    "--parties",
    type=click.IntRange(1, MAX_PARTIES),
    required=True,
    metavar="N",
    help="How many tasks arrive: task ids 0..N-1 (the chief is 0).",
)
@wait_options("a new arrival", task_id="This task's id (or TF_CONFIG says it).")
@click.option("--no-wait", is_flag=True, help="Record the arrival and exit at once.")
def arrive(name: str, parties: int, no_wait: bool, **_: Any) -> None:
    """Arrive at barrier NAME and wait until tasks 0..N-1 have all arrived.

    Each name is one barrier per run (STEPBARRIER_RUN_ID): use "epoch-3", not
    "epoch" again. Arriving again at a completed barrier returns at once.

    \b
    Example:
      stepbarrier arrive start --parties 3 --task-id 1 --timeout 600 && python train.py
    """
    config = current_session().config()
    with stopped_like_ctrl_c(), Barrier(config, name, parties) as barrier:
        complete = barrier.arrive(wait=not no_wait)
    if complete:
        click.echo(f"job {config.job}: barrier {name} complete: all {parties} tasks arrived")
    else:
        click.echo(f"job {config.job}: task {config.task_id} arrived at barrier {name}")
