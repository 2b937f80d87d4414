"""``stepbarrier wait``, ``publish`` and ``reset``: act on one job's step from a shell.

A thin click layer over ``StepWaiter``, ``StepPublisher`` and ``reset_job``:
a script waits like a worker, sets the step like a chief, or clears the job.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from typing import Any

import click

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.settings import BarrierConfig
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
    connection_options,
    current_session,
    exit_codes,
    reporting,
    reporting_warnings,
    stopped_like_ctrl_c,
    variable_option,
)
from stepbarrier.cli._guidance import NoSuchJob, missing_job_message
from stepbarrier.cli._views.status import describe_age
from stepbarrier.cli._wait_options import task_id_option, timeout_options
from stepbarrier.cli._wait_progress import WaitProgress
from stepbarrier.errors import RedisUnavailable


@click.command(
    epilog=exit_codes(
        (EXIT_OK, "the step came (it is printed on stdout)"),
        EXIT_USAGE,
        EXIT_TIMEOUT,
        EXIT_ABORTED,
        EXIT_UNAVAILABLE,
    )
)
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
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object instead of the step: job, wait_until_step, step, "
    "waited_seconds, released_by.",
)
@click.option("--quiet", "-q", is_flag=True, help="Show no progress on stderr.")
@reporting_warnings
def wait(as_json: bool, quiet: bool, **_: Any) -> None:
    """Wait like a worker until the chief's step reaches N; print the step seen.

    While it waits, stderr shows what for: on a terminal a live block (the job,
    the step, the chief's step, its heartbeat's age, the time left), piped one
    line every 10 s. stdout gets only the step (or, with --json, one object).
    A job that no chief has written yet is said so, with a few jobs that exist.

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
    if as_json:
        data = {
            "job": config.job,
            "wait_until_step": target,
            "step": step,
            "waited_seconds": round(time.monotonic() - started, 3),
            "released_by": waiter.last_released_by,
        }
        click.echo(json.dumps(data, sort_keys=True))
    else:
        click.echo(step)


@click.command(
    epilog=exit_codes(
        (EXIT_OK, "published"),
        (
            EXIT_USAGE,
            "usage, configuration, authentication or permission error; also "
            "refused because a chief still heartbeats (--force overrides)",
        ),
        EXIT_UNAVAILABLE,
    )
)
@connection_options
@click.argument("step", type=click.IntRange(0, MAX_STEP))
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
    workers waiting for it now and, with a run id (STEPBARRIER_RUN_ID), those of
    the run that arrive later, until a chief begins a newer generation or the
    job is reset; workers waiting for a
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


@click.command(
    epilog=exit_codes(
        (EXIT_OK, "reset"),
        EXIT_USAGE,
        EXIT_UNAVAILABLE,
        (EXIT_NO_JOB, "no such job on this Redis: nothing was reset"),
    )
)
@connection_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@reporting
def reset(yes: bool) -> None:
    """Delete the job's keys; workers still waiting are aborted (exit 4), not left hanging.

    A job of named barriers only (`stepbarrier arrive`, no chief) is reset too:
    its barriers go, and a task waiting in one is aborted. A job with no keys on
    this Redis is not reset (exit 6): the message names a few jobs that exist.
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
