"""``stepbarrier acl``: one users.acl line for a role (``stepbarrier._protocol.roles``),
confined to the jobs of a pattern; the password is printed only as its SHA-256."""

from __future__ import annotations

import sys

import click

from stepbarrier._config.environment import read_password_file
from stepbarrier._protocol.roles import ROLES, acl_line, password_hash, rules_for, validate_user
from stepbarrier.cli._context import EXIT_OK, command, current_session
from stepbarrier.errors import ConfigurationError


@command(
    (EXIT_OK, "the line is printed"),
    options=None,
    epilog="""
\b
Then, as an administrator, append the line to users.acl and run ACL LOAD, or
give its words after `user NAME` to `ACL SETUSER NAME` and run ACL SAVE.
""",
)
@click.argument("role", type=click.Choice(ROLES))
@click.option("--user", required=True, metavar="NAME", help="The ACL user name.")
@click.option(
    "--jobs",
    metavar="PATTERN",
    help="Jobs the user may touch: a job name, or a glob such as 'team-a-*' ('*': every "
    "job). Required for chief, worker and monitor; emergency and installer touch no job.",
)
@click.option(
    "--password-file",
    type=click.Path(dir_okay=False),
    metavar="FILE",
    help="File holding the password (trailing newlines are ignored, as by the clients). "
    "Without it, the password comes from stdin: typed twice, hidden, on a terminal; "
    "else its first line.",
)
def acl(role: str, user: str, jobs: str | None, password_file: str | None) -> None:
    """Print a users.acl line giving USER the rights of ROLE on the jobs of PATTERN.

    \b
    ROLE is one of:
      chief      publish the step, hear registrations, reset, read the status
      worker     wait: register, read the state, subscribe to the job's channel
      monitor    read the status
      emergency  end a runaway function or script (FUNCTION KILL, SCRIPT KILL)
      installer  load the Functions library (stepbarrier functions install)

    Redis keeps only the password's hash. What the roles may do, and what
    their passwords can do to a shared Redis: docs/reliability-security.md.

    \b
    Example:
      stepbarrier acl worker --user team-a-worker --jobs 'team-a-*' \\
          --password-file team-a-worker.password >> users.acl
    """
    rules_for(role, jobs)  # a mistake is told before the password is asked for
    validate_user(user)
    password = _read_password(password_file)
    current_session().secrets.add(password)  # masked in any error message
    click.echo(acl_line(user, role, jobs, password_hash(password)))
    if role == "chief" and jobs != "*":
        click.echo(
            f"Give this user's chiefs STEPBARRIER_JOBS_PATTERN='{jobs}': their jobs are then "
            "listed from the team's job index, which no other team can fill or empty "
            "(docs/operations.md#jobs-metrics-and-alerts).",
            err=True,
        )


def _read_password(path: str | None) -> str:
    if path is not None:
        # a regular file of at most 4 KiB: /dev/zero or a pipe is refused, not read for ever
        password = read_password_file(path, name="--password-file", variable="password-file")
        where = f"the password file {path[:200]!r}"
    elif sys.stdin.isatty():
        password = click.prompt(
            "Password",
            hide_input=True,
            confirmation_prompt=True,
            err=True,  # the prompt stays out of the line on stdout
            default="",
            show_default=False,
        )
        where = "the password typed"
    else:
        try:
            password = sys.stdin.readline().rstrip("\r\n")
        except UnicodeDecodeError:
            raise ConfigurationError("stdin is not UTF-8 text", variable="password") from None
        where = "stdin's first line"
    if not password:
        raise ConfigurationError(f"{where} is empty: a user needs a password", variable="password")
    return password
