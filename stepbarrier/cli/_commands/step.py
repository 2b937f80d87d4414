"""``stepbarrier wait``, ``publish`` and ``reset``: act on one job's step from a shell.

A thin click layer over ``StepWaiter``, ``StepPublisher`` and ``reset_job``:
a script waits like a worker, sets the step like a chief, or clears the job.
"""

from __future__ import annotations

import os
import socket
import sys
from typing import Any

import click

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.live_chief import HAND_PUBLISHED, find_live_chief
from stepbarrier._inspect.reset import reset_job
from stepbarrier._worker.waiter import StepWaiter
from stepbarrier.cli._context import (
    EXIT_CODES,
    EXIT_USAGE,
    connection_options,
    current_session,
    reporting,
    reporting_warnings,
    variable_option,
)
from stepbarrier.cli._views.status import describe_age
from stepbarrier.cli._wait_options import task_id_option, timeout_options
from stepbarrier.errors import RedisUnavailable


@click.command(epilog=EXIT_CODES)
@connection_options
@variable_option(
    "--until",
    variable="STEPBARRIER_WAIT_UNTIL_STEP",
    type=click.IntRange(0),
    metavar="N",
    help="The step to wait for (or set STEPBARRIER_SCHEDULE and a task id).",
)
@timeout_options("a chief heartbeat")
@task_id_option("Task id shown in `status` (the chief is 0).")
@reporting_warnings
def wait(**_: Any) -> None:
    """Wait like a worker until the chief's step reaches N; print the step seen.

    \b
    Example:
      stepbarrier wait --until 500 --timeout 3600 && python train.py
    """
    config = current_session().config()
    target = config.resolved_wait_until_step()
    with StepWaiter(config) as waiter:
        step = waiter.wait(target)
    click.echo(step)


@click.command(epilog=EXIT_CODES)
@connection_options
@click.argument("step", type=click.IntRange(0, 2**53))
@click.option(
    "--done", is_flag=True, help="Also mark the job finished (aborts workers still waiting)."
)
@click.option(
    "--force",
    is_flag=True,
    help="Publish even while a chief heartbeats: that chief is superseded for good.",
)
@reporting
def publish(step: int, done: bool, force: bool) -> None:
    """Pin the job's step: release every worker waiting for STEP or less.

    The step is pinned (docs/protocol.md#operator-publish): it releases the
    workers waiting for it now and those that arrive later, until a chief
    begins a newer generation or the job is reset; workers waiting for a
    higher step keep waiting. Each call is a new generation: the stored step is
    replaced, even by a lower one, and a running chief stops publishing for
    good, so it is refused (exit 2) while a chief heartbeats, unless --force.
    With --done the job is also finished: workers waiting for a higher step
    are aborted.

    \b
    Example:
      stepbarrier publish 1000 --done
    """
    config = current_session().config()
    if not force:
        _refuse_if_a_chief_is_live(config)
    publisher = StepPublisher(
        config,
        description=f"{HAND_PUBLISHED}{socket.gethostname()}:{os.getpid()}",
        operator=True,
    )
    publisher.publish(step)
    if not publisher.close(done=done):
        failure = publisher.last_failure
        raise failure or RedisUnavailable(f"could not publish step {step} to {config.safe_url}")
    click.echo(
        f"job {config.job}: step {step} published"
        + (", job marked done" if done else " and pinned: it releases later arrivals too")
    )


class ChiefIsLive(click.ClickException):
    """``publish`` refused: a chief still heartbeats the job."""

    exit_code = EXIT_USAGE


def _refuse_if_a_chief_is_live(config: BarrierConfig) -> None:
    live = find_live_chief(config)
    if live is None:
        return
    current, limit = live
    raise ChiefIsLive(
        f"job {config.job}: chief {current.chief or '(unnamed)'} is live (heartbeat "
        f"{describe_age(current.heartbeat_age)}, under {limit:g} s); publishing would "
        "supersede it for good. Stop it first, or pass --force"
    )


@click.command(epilog=EXIT_CODES)
@connection_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@reporting
def reset(yes: bool) -> None:
    """Delete the job's keys; workers still waiting are aborted (exit 4), not left hanging."""
    config = current_session().config()
    if not yes:
        if not sys.stdin.isatty():
            raise click.UsageError("reset needs --yes when not run from a terminal")
        click.confirm(
            f"Delete the keys of job {config.job} on {config.safe_url}? Waiting workers "
            "will be aborted",
            abort=True,
        )
    removed = reset_job(config)
    click.echo(
        f"job {config.job}: reset; {removed} waiter entr{'y' if removed == 1 else 'ies'} removed"
    )
