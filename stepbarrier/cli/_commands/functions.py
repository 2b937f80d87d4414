"""``stepbarrier functions``: load, show and check the Redis Functions library.

Loading code into Redis is an administrator's act (``FUNCTION LOAD``), done
once per Redis and again after it restarts empty; the shipped ``installer``
user of ``ops/redis/users.acl`` may do exactly that, and the roles that train
may not. See ``stepbarrier._redis.functions``.
"""

from __future__ import annotations

import os

import click

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._redis.client import with_client
from stepbarrier._redis.functions import (
    LIBRARY_NAME,
    LIBRARY_VERSION,
    install_functions,
    library_source,
    loaded_versions,
)
from stepbarrier.cli._context import (
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    connection_options,
    current_session,
    exit_codes,
    reporting,
)

RETRY_SECONDS = 5.0
"""How long the commands retry an unreachable Redis."""


def _config() -> BarrierConfig:
    # the library serves every job: a job name is only needed for messages
    session = current_session()
    if "STEPBARRIER_JOB" not in session.overrides and not os.environ.get("STEPBARRIER_JOB"):
        session.overrides["STEPBARRIER_JOB"] = "stepbarrier-functions"
    return session.config()


@click.group()
def functions() -> None:
    """Manage the stepbarrier Functions library in Redis (Redis 7)."""


@functions.command(epilog=exit_codes((EXIT_OK, "loaded"), EXIT_USAGE, EXIT_UNAVAILABLE))
@connection_options
@reporting
def install() -> None:
    """Load this version's library, or upgrade it in place (idempotent).

    Run it as an administrator (the `installer` user of ops/redis/users.acl)
    once per Redis, and after Redis restarted without persistence. Libraries of
    other stepbarrier versions stay for their clients.

    \b
    Example:
      stepbarrier functions install --username installer --password-file /run/secrets/installer
    """
    config = _config()
    name = with_client(
        config,
        None,
        install_functions,
        action="load the stepbarrier Functions library",
        retry_seconds=RETRY_SECONDS,
    )
    click.echo(f"loaded {name} on Redis at {config.safe_url}")


@functions.command(
    epilog=exit_codes(
        (EXIT_OK, "the needed version is loaded"),
        (
            EXIT_USAGE,
            "it is not loaded; or a usage, configuration, authentication or permission error",
        ),
        EXIT_UNAVAILABLE,
    )
)
@connection_options
@reporting
def status() -> None:
    """Say which stepbarrier library versions Redis has, and which this one needs.

    Exit 0 when the needed version is loaded, 2 when it is not.
    """
    config = _config()
    versions = with_client(
        config,
        None,
        loaded_versions,
        action="list the Functions libraries",
        retry_seconds=RETRY_SECONDS,
    )
    shown = (
        "cannot tell (may this user run FUNCTION LIST?)"
        if versions is None
        else (", ".join(map(str, versions)) or "none")
    )
    click.echo(
        f"loaded: {shown}; this stepbarrier needs version {LIBRARY_VERSION} ({LIBRARY_NAME})"
    )
    if versions is None or LIBRARY_VERSION not in versions:
        raise click.exceptions.Exit(2)


@functions.command()
def source() -> None:
    """Print the library's Lua source, as FUNCTION LOAD takes it.

    \b
    Example:
      stepbarrier functions source > ops/redis/stepbarrier-functions.lua
    """
    click.echo(library_source(), nl=False)
