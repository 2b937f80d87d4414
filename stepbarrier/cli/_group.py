"""The ``stepbarrier`` command: a thin click layer over the library (how each command
takes its settings and reports its outcome: ``stepbarrier.cli._context``)."""

from __future__ import annotations

import sys

import click
import redis

from stepbarrier import __version__
from stepbarrier._redis import failures
from stepbarrier.cli._commands.acl import acl
from stepbarrier.cli._commands.arrive import arrive
from stepbarrier.cli._commands.doctor import doctor
from stepbarrier.cli._commands.follow import follow
from stepbarrier.cli._commands.functions import functions
from stepbarrier.cli._commands.jobs import exporter, jobs
from stepbarrier.cli._commands.status import status, watch
from stepbarrier.cli._commands.step import publish, reset, wait
from stepbarrier.cli._context import CONTEXT_SETTINGS, EXIT_CODES, verbosity_options


class _Group(click.Group):
    """A group whose command list shows each command's whole first sentence
    (click cuts it at 45 characters)."""

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        commands = [(name, self.get_command(ctx, name)) for name in self.list_commands(ctx)]
        rows = [
            (name, c.get_short_help_str(limit=1000)) for name, c in commands if c and not c.hidden
        ]
        if rows:
            with formatter.section("Commands"):
                formatter.write_dl(rows)


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
\b
Shell completion:
  eval "$(_STEPBARRIER_COMPLETE=bash_source stepbarrier)"   # zsh_source, fish_source
""",
)
@click.version_option(
    __version__,
    prog_name="stepbarrier",
    message=f"stepbarrier {__version__} (redis-py {redis.__version__}, "
    f"Python {sys.version.split()[0]})",
)
@verbosity_options
def cli() -> None:
    """Hold distributed-training workers until the chief reaches a global step."""
    # a shell user's typo in a host name fails an interactive command at once;
    # the commands that wait (wait, arrive, watch, exporter) retry it, as the
    # library does: a launcher's `stepbarrier wait ... && ./train.sh` may start
    # before its Redis's DNS name exists
    context = click.get_current_context()
    if context.invoked_subcommand in INTERACTIVE:
        token = failures.UNKNOWN_HOST_IS_FINAL.set(True)
        context.call_on_close(lambda: failures.UNKNOWN_HOST_IS_FINAL.reset(token))


INTERACTIVE = frozenset({"status", "doctor", "jobs", "reset", "publish", "functions", "acl"})
"""The commands a user runs and reads at once (an unknown host name fails them)."""


for command in (status, watch, wait, follow, publish, reset, arrive, functions, acl, jobs, doctor):
    cli.add_command(command)
cli.add_command(exporter)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="stepbarrier")
