"""``stepbarrier wait``, ``publish`` and ``reset``: a shell script waits like a worker
(``StepWaiter``), sets the step like a chief (``StepPublisher``) or clears the job."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import click

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._inspect.live_chief import HAND_PUBLISHED, find_live_chief
from stepbarrier._inspect.missing import has_barrier_keys, is_missing
from stepbarrier._inspect.reset import reset_job
from stepbarrier._inspect.status import read_status
from stepbarrier._protocol.freshness import GRACE
from stepbarrier._protocol.wire import MAX_STEP
from stepbarrier._worker.waiter import StepWaiter
from stepbarrier.cli._context import (
    EXIT_ABORTED,
    EXIT_NO_JOB,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    command,
    current_session,
    stopped_like_ctrl_c,
    variable_option,
    wait_options,
)
from stepbarrier.cli._guidance import NoSuchJob, missing_job_message
from stepbarrier.cli._views.status import describe_age
from stepbarrier.cli._wait_progress import WaitProgress
from stepbarrier.errors import RedisUnavailable


@command(
    (EXIT_OK, "the step came (it is printed on stdout)"),
    EXIT_TIMEOUT,
    EXIT_ABORTED,
    EXIT_UNAVAILABLE,
    long_running=True,
)
@variable_option(
    "--until",
    variable="STEPBARRIER_WAIT_UNTIL_STEP",
    type=click.IntRange(0),
    metavar="N",
    help="The step to wait for (or set STEPBARRIER_SCHEDULE and a task id).",
)
@wait_options("a chief heartbeat", task_id="Task id shown in `status` (the chief is 0).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object instead of the step: job, wait_until_step, step, "
    "waited_seconds, released_by.",
)
@click.option("--quiet", "-q", is_flag=True, help="Show no progress on stderr.")
def wait(as_json: bool, quiet: bool, **_: Any) -> None:
    """Wait like a worker until the chief's step reaches N; print the step seen.

    stderr shows what it waits for (a live block on a terminal, a line every
    10 s piped); stdout gets only the step (or, with --json, one object).

    \b
    Example:
      stepbarrier wait --until 500 --timeout 1h && python train.py
      step=$(stepbarrier wait --until 500 2>>wait.log)
    """
    config = current_session().config()
    target = config.resolved_wait_until_step()
    started = time.monotonic()
    progress = None if quiet or target <= 0 else WaitProgress(config, target).start()
    try:
        with stopped_like_ctrl_c(), StepWaiter(config) as waiter:
            step = waiter.wait(target)
    finally:
        if progress is not None:
            progress.stop()
    if not as_json:
        click.echo(step)
        return
    waited = round(time.monotonic() - started, 3)
    data = {"job": config.job, "wait_until_step": target, "step": step, "waited_seconds": waited}
    click.echo(json.dumps({**data, "released_by": waiter.last_released_by}, sort_keys=True))


@command(
    (EXIT_OK, "published"),
    (
        EXIT_USAGE,
        "usage, configuration, authentication or permission error; also "
        "refused because a chief still heartbeats (--force overrides)",
    ),
    EXIT_UNAVAILABLE,
)
@click.argument("step", type=click.IntRange(0, MAX_STEP))
@click.option(
    "--done", is_flag=True, help="Also mark the job finished (aborts workers still waiting)."
)
@click.option(
    "--force",
    is_flag=True,
    help="Publish even while a chief heartbeats: that chief is superseded for good.",
)
def publish(step: int, done: bool, force: bool) -> None:
    """Pin the job's step: release every worker waiting for STEP or less.

    Each call is a new generation (docs/protocol.md#operator-publish): the
    stored step is replaced, even by a lower one, and a running chief is
    superseded for good, so it is refused while a chief heartbeats, unless
    --force. With --done the job also ends: workers waiting for more are aborted.

    \b
    Example:
      stepbarrier publish 1000 --done
    """
    config = current_session().config()
    live = None if force else find_live_chief(config)
    if live is not None:
        chief, limit = live
        raise ChiefIsLive(
            f"job {config.job}: chief {chief.chief or '(unnamed)'} is live (heartbeat "
            f"{describe_age(chief.heartbeat_age)}, under {limit:g} s); publishing would "
            "supersede it for good. Stop it first, or pass --force"
        )
    publisher = StepPublisher(
        config, description=f"{HAND_PUBLISHED}{socket.gethostname()}:{os.getpid()}", operator=True
    )
    publisher.publish(step)
    if not publisher.close(done=done):
        failure = publisher.last_failure
        raise failure or RedisUnavailable(f"could not publish step {step} to {config.safe_url}")
    if done:
        outcome = ", job marked done"
    elif config.run_id:
        outcome = f" and pinned: it releases later arrivals of run {config.run_id} too"
    else:
        # a worker without a run id cannot tell this pin from an earlier run's at
        # once: one that arrives later trusts it after the grace, unless a new
        # chief begins meanwhile (docs/protocol.md#grace)
        outcome = (
            " and pinned: it released the workers waiting now; a worker that arrives "
            f"later is released by it after {GRACE:g} s, unless a new chief begins first"
        )
    click.echo(f"job {config.job}: step {step} published{outcome}")


class ChiefIsLive(click.ClickException):
    """``publish`` refused: a chief still heartbeats the job."""

    exit_code = EXIT_USAGE


@command(
    (EXIT_OK, "reset"),
    EXIT_UNAVAILABLE,
    (EXIT_NO_JOB, "no such job on this Redis: nothing was reset"),
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def reset(yes: bool) -> None:
    """Delete the job's keys; workers still waiting are aborted (exit 4), not left hanging.

    A job of named barriers only (`stepbarrier arrive`) is reset too; a job
    with no keys on this Redis is not (exit 6).
    """
    config = current_session().config()
    if is_missing(read_status(config, barriers=False)) and not has_barrier_keys(config):
        raise NoSuchJob(f"{missing_job_message(config)}: nothing reset")
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
