"""The ``stepbarrier`` command: a thin click layer over the library.

Each option stands for a ``STEPBARRIER_*`` variable: the command line is laid
over the environment and the result goes through ``BarrierConfig.from_env``,
the one place that reads settings. Errors become one line on stderr and an
exit code (``EXIT_CODES``); ``--debug`` adds the traceback. Passwords are
masked in every message and log line.
"""

from __future__ import annotations

import sys
from importlib import metadata
from typing import Any

import click

from stepbarrier import __version__
from stepbarrier._config.checks import validate_job
from stepbarrier._redis import failures
from stepbarrier.cli._commands.acl import acl
from stepbarrier.cli._commands.arrive import arrive
from stepbarrier.cli._commands.doctor import doctor
from stepbarrier.cli._commands.follow import follow
from stepbarrier.cli._commands.functions import functions
from stepbarrier.cli._commands.jobs import exporter, jobs
from stepbarrier.cli._commands.status import status, watch
from stepbarrier.cli._commands.step import publish, reset, wait
from stepbarrier.cli._context import (
    CONTEXT_SETTINGS,
    DEMO_EXIT_CODES,
    EXIT_CODES,
    FiniteFloatRange,
    reporting,
    verbosity_options,
)
from stepbarrier.errors import ConfigurationError


class _Group(click.Group):
    """A group whose command list shows each command's whole first sentence
    (click cuts it at 45 characters)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        rows = []
        for name in self.list_commands(ctx):
            command = self.get_command(ctx, name)
            if command is not None and not command.hidden:
                rows.append((name, command.get_short_help_str(limit=1000)))
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


def _versions() -> str:
    try:
        redis_py = metadata.version("redis")
    except metadata.PackageNotFoundError:  # pragma: no cover - redis-py is a dependency
        redis_py = "?"
    return f"stepbarrier {__version__} (redis-py {redis_py}, Python {sys.version.split()[0]})"


@click.group(
    cls=_Group,
    context_settings=CONTEXT_SETTINGS,
    epilog=EXIT_CODES
    + """
\b
Every option also comes from its STEPBARRIER_* variable, e.g.:
  export STEPBARRIER_REDIS_URL=redis://redis:6379/0 STEPBARRIER_JOB=mnist-42
  stepbarrier doctor
  stepbarrier status
  stepbarrier wait --until 500 --timeout 10m && ./train.sh
  stepbarrier demo --workers 3
\b
Each command's --help (or -h) lists its own exit codes. Shell completion:
  eval "$(_STEPBARRIER_COMPLETE=bash_source stepbarrier)"   # zsh_source, fish_source
""",
)
@click.version_option(__version__, prog_name="stepbarrier", message=_versions())
@verbosity_options
def cli() -> None:
    """Hold distributed-training workers until the chief reaches a global step."""
    # a shell user's typo in a host name fails an interactive command at once;
    # the commands that wait (wait, arrive, watch, exporter) retry it, as the
    # library does: a launcher's `stepbarrier wait ... && ./train.sh` may start
    # before its Redis's DNS name exists
    context = click.get_current_context()
    if context.invoked_subcommand in INTERACTIVE:
        before, failures.UNKNOWN_HOST_IS_FINAL = failures.UNKNOWN_HOST_IS_FINAL, True
        context.call_on_close(lambda: setattr(failures, "UNKNOWN_HOST_IS_FINAL", before))


INTERACTIVE = frozenset({"status", "doctor", "jobs", "reset", "publish", "functions", "acl"})
"""The commands a user runs and reads at once (an unknown host name fails them)."""


def _demo_job(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    # checked as it is parsed (exit 2), before the demo looks for TensorFlow
    if value is None:
        return None
    try:
        return validate_job(value, variable="--job")
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc).removeprefix("--job ")) from None


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
    type=FiniteFloatRange(0, 5),
    default=None,
    metavar="SECONDS",
    help="Extra seconds after each training step (default: chosen so the chief alone "
    "takes about 10 s to reach the first worker's step).",
)
@click.option(
    "--job",
    default=None,
    metavar="NAME",
    callback=_demo_job,
    help="Job name (default demo-<random>).",
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
    from stepbarrier.cli._demo.demo import run_demo  # the demo's imports are only paid for here

    sys.exit(run_demo(**options))


cli.add_command(status)
cli.add_command(watch)
cli.add_command(wait)
cli.add_command(follow)
cli.add_command(publish)
cli.add_command(reset)
cli.add_command(arrive)
cli.add_command(functions)
cli.add_command(acl)
cli.add_command(jobs)
cli.add_command(exporter)
cli.add_command(doctor)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="stepbarrier")
