"""The ``stepbarrier`` command: a thin click layer over the library.

Each option stands for a ``STEPBARRIER_*`` variable: the command line is laid
over the environment and the result goes through ``BarrierConfig.from_env``,
the one place that reads settings. Errors become one line on stderr and an
exit code (``EXIT_CODES``); ``--debug`` adds the traceback. Passwords are
masked in every message and log line.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import sys
import time
from typing import Any

import click
from rich.console import Console
from rich.live import Live

from stepbarrier import __version__
from stepbarrier.cli_acl import acl
from stepbarrier.cli_barrier import arrive
from stepbarrier.cli_functions import functions
from stepbarrier.cli_ops import exporter, jobs
from stepbarrier.cli_reporting import (
    DEMO_EXIT_CODES,
    EXIT_CODES,
    EXIT_USAGE,
    connection_options,
    current_session,
    reporting,
    variable_option,
)
from stepbarrier.config import BarrierConfig
from stepbarrier.errors import RedisUnavailable
from stepbarrier.live_chief import HAND_PUBLISHED, find_live_chief
from stepbarrier.publisher import StepPublisher
from stepbarrier.reset import reset_job
from stepbarrier.status import read_status
from stepbarrier.status_view import describe_age, live_view, status_view
from stepbarrier.waiter import StepWaiter
from stepbarrier.waiter_summary import read_overview


@click.group(
    epilog=EXIT_CODES
    + """
\b
Every option also comes from its STEPBARRIER_* variable, e.g.:
  export STEPBARRIER_REDIS_URL=redis://redis:6379/0 STEPBARRIER_JOB=mnist-42
  stepbarrier status
  stepbarrier wait --until 500 --timeout 600 && ./train.sh
  stepbarrier demo --workers 3
"""
)
@click.version_option(__version__, prog_name="stepbarrier")
def cli() -> None:
    """Hold distributed-training workers until the chief reaches a global step."""


@cli.command(epilog=EXIT_CODES)
@connection_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@reporting
def status(as_json: bool) -> None:
    """Show the chief's step, heartbeat and the waiting workers.

    More than 20 waiting workers are summarised (counts, the nearest targets, a
    histogram); --json lists each of them.

    \b
    Example:
      stepbarrier status --job mnist-42 --redis-url redis://redis:6379/0
    """
    config = current_session().config()
    if as_json:
        # allow_nan=False: whatever sits in the keys, the output stays valid JSON
        data = read_status(config).to_dict()
        click.echo(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))
    else:
        job_status, summary = read_overview(config)
        Console(highlight=False).print(status_view(job_status, summary=summary))


@cli.command(epilog=EXIT_CODES)
@connection_options
@click.option("--until-done", is_flag=True, help="Stop (exit 0) once the chief marks the job done.")
@click.option(
    "--interval",
    type=click.FloatRange(0.05, 60),
    default=0.5,
    show_default=True,
    help="Seconds between refreshes.",
)
@reporting
def watch(until_done: bool, interval: float) -> None:
    """A live view of the job: each waiting worker's progress toward its step.

    More than 20 waiting workers are summarised: counts, the nearest targets and
    a histogram, read from the job's index in a few commands. Runs until Ctrl-C
    (exit 0). Redis outages are shown and ridden out.
    """
    config = current_session().config()
    current, summary = read_overview(config)  # the first read fails loudly, with its exit code
    note: str | None = None
    view = live_view(current, summary=summary)
    try:
        with Live(view, console=Console(highlight=False), auto_refresh=False) as live:
            while not (until_done and current.done):
                time.sleep(interval)
                try:
                    (current, summary), note = read_overview(config), None
                except RedisUnavailable as exc:
                    note = f"Redis unreachable, retrying: {exc}"
                live.update(live_view(current, note=note, summary=summary), refresh=True)
    except KeyboardInterrupt:
        pass


@cli.command(epilog=EXIT_CODES)
@connection_options
@variable_option(
    "--until",
    variable="STEPBARRIER_WAIT_UNTIL_STEP",
    type=click.IntRange(0),
    metavar="N",
    help="The step to wait for (or set STEPBARRIER_SCHEDULE and a task id).",
)
@variable_option(
    "--timeout",
    variable="STEPBARRIER_TIMEOUT",
    type=click.FloatRange(0, min_open=True),
    metavar="SECONDS",
    help="Give up (exit 3) after this long; no limit by default.",
)
@variable_option(
    "--stall-timeout",
    variable="STEPBARRIER_STALL_TIMEOUT",
    metavar="SECONDS",
    type=click.FloatRange(0, min_open=True),
    help="Give up (exit 3) after this long without a chief heartbeat (default 600).",
)
@variable_option(
    "--task-id",
    variable="STEPBARRIER_TASK_ID",
    type=click.IntRange(0),
    metavar="ID",
    help="Task id shown in `status` (the chief is 0).",
)
@functools.partial(reporting, quiet_level=logging.WARNING)  # a long wait tells of trouble
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


@cli.command(epilog=EXIT_CODES)
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
    """Set the job's step as a chief would.

    Each call acts as a new chief incarnation: the stored step is replaced, even
    by a lower one, and a running chief stops publishing for good. So it is
    refused (exit 2) while a chief heartbeats, unless --force.

    \b
    Example:
      stepbarrier publish 1000 --done
    """
    config = current_session().config()
    if not force:
        _refuse_if_a_chief_is_live(config)
    publisher = StepPublisher(
        config, description=f"{HAND_PUBLISHED}{socket.gethostname()}:{os.getpid()}"
    )
    publisher.publish(step)
    if not publisher.close(done=done):
        failure = publisher.last_failure
        raise failure or RedisUnavailable(f"could not publish step {step} to {config.safe_url}")
    click.echo(f"job {config.job}: step {step} published" + (", job marked done" if done else ""))


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


@cli.command(epilog=EXIT_CODES)
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


@cli.command(epilog=DEMO_EXIT_CODES)
@click.option(
    "--workers", type=click.IntRange(1, 16), default=3, show_default=True, help="Number of workers."
)
@click.option(
    "--schedule",
    metavar="log:K",
    default=None,
    help="The workers' ramp (default: log:K with K chosen so the last worker starts at "
    "60% of the steps).",
)
@click.option(
    "--steps",
    type=click.IntRange(10, 100_000),
    default=200,
    show_default=True,
    help="Global steps to train.",
)
@click.option(
    "--step-sleep",
    type=click.FloatRange(0, 5),
    default=None,
    metavar="SECONDS",
    help="Extra seconds after each training step (default: chosen so the chief alone "
    "takes about 10 s to reach the first worker's step).",
)
@click.option("--job", default=None, metavar="NAME", help="Job name (default demo-<random>).")
@click.option("--example", default=None, hidden=True, help="Training script to run.")
@click.option(
    "--redis-kind",
    type=click.Choice(["auto", "redis-server", "fakeredis"]),
    default="auto",
    hidden=True,
    help="Which embedded Redis to start.",
)
@reporting
def demo(**options: Any) -> None:
    """Run a local TensorFlow parameter-server job held back by the barrier.

    Starts an embedded Redis on loopback (redis-server if installed, else
    fakeredis), one ps, the chief and the workers as separate processes, shows
    the live view and ends with a summary. Ctrl-C stops everything (exit 0).
    """
    from stepbarrier.demo import run_demo  # the demo's imports are only paid for here

    sys.exit(run_demo(**options))


cli.add_command(functions)
cli.add_command(acl)
cli.add_command(jobs)
cli.add_command(exporter)
cli.add_command(arrive)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="stepbarrier")
