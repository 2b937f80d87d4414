"""``stepbarrier functions``: load, show and check the Redis Functions library
(``stepbarrier._redis.functions``); loading it is an administrator's act."""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import click

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._redis.client import RedisClient, with_client
from stepbarrier._redis.functions import (
    LIBRARY_NAME,
    LIBRARY_VERSION,
    install_functions,
    library_source,
    loaded_versions,
)
from stepbarrier.cli._context import EXIT_OK, EXIT_USAGE, command
from stepbarrier.cli._guidance import config_for_any_job

RETRY_SECONDS = 5.0
"""How long the commands retry an unreachable Redis."""
T = TypeVar("T")


def _on_redis(operation: Callable[[RedisClient], T], action: str) -> tuple[BarrierConfig, T]:
    # the library serves every job: a job name is only needed for messages
    config, _ = config_for_any_job("stepbarrier-functions")
    return config, with_client(config, None, operation, action=action, retry_seconds=RETRY_SECONDS)


@click.group()
def functions() -> None:
    """Manage the stepbarrier Functions library in Redis (Redis 7)."""


@command((EXIT_OK, "loaded"), group=functions)
def install() -> None:
    """Load this version's library, or upgrade it in place (idempotent).

    As an administrator (the `installer` user of ops/redis/users.acl), once per
    Redis and after it restarted empty; other versions' libraries stay.

    \b
    Example:
      stepbarrier functions install --username installer --password-file /run/secrets/installer
    """
    config, name = _on_redis(install_functions, "load the stepbarrier Functions library")
    click.echo(f"loaded {name} on Redis at {config.safe_url}")


@command(
    (EXIT_OK, "the needed version is loaded"),
    (EXIT_USAGE, "it is not loaded; or a usage, configuration, authentication or permission error"),
    group=functions,
)
def status() -> None:
    """Say which stepbarrier library versions Redis has, and which this one needs."""
    _, versions = _on_redis(loaded_versions, "list the Functions libraries")
    shown = (
        "cannot tell (may this user run FUNCTION LIST?)"
        if versions is None
        else (", ".join(map(str, versions)) or "none")
    )
    click.echo(
        f"loaded: {shown}; this stepbarrier needs version {LIBRARY_VERSION} ({LIBRARY_NAME})"
    )
    if versions is None or LIBRARY_VERSION not in versions:
        raise click.exceptions.Exit(EXIT_USAGE)


@functions.command()
def source() -> None:
    """Print the library's Lua source, as FUNCTION LOAD takes it.

    \b
    Example:
      stepbarrier functions source > ops/redis/stepbarrier-functions.lua
    """
    click.echo(library_source(), nl=False)
