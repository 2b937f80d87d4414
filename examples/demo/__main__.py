"""``python -m examples.demo`` (what ``make demo`` runs): the demo's command line."""

from __future__ import annotations

import sys
from typing import Any

import click

from examples.demo.run import run_demo
from stepbarrier._config.checks import KEY_NAME
from stepbarrier.cli._context import (
    CONTEXT_SETTINGS,
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    Duration,
    reporting,
)
from stepbarrier.errors import ConfigurationError

EXIT_CODES = f"""\b
Exit codes:
  {EXIT_OK}    the job ran to its end, or Ctrl-C stopped it (the partial summary is
        shown; nothing is left running)
  {EXIT_FAILED}    a task failed (its last log lines are shown)
  {EXIT_USAGE}    usage or configuration error, or something the demo needs is not
        installed (TensorFlow; redis-server or fakeredis)
"""


def _job(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # checked as it is parsed (exit 2), before the demo looks for TensorFlow
    if value is None:
        return None
    try:
        return KEY_NAME.check(value, "--job")
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc).removeprefix("--job ")) from None


@click.command(context_settings=CONTEXT_SETTINGS, epilog=EXIT_CODES)
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
    type=Duration(0, 5, low_open=False),
    default=None,
    metavar="SECONDS",
    help="Extra seconds after each training step (default: chosen so the chief alone "
    "takes about 10 s to reach the first worker's step).",
)
@click.option(
    "--job", default=None, metavar="NAME", callback=_job, help="Job name (default demo-<random>)."
)
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
    sys.exit(run_demo(**options))


if __name__ == "__main__":
    demo.main(prog_name="python -m examples.demo")
