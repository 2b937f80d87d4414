"""``stepbarrier jobs`` and ``stepbarrier exporter``: every job of a Redis, for operators
(docs/operations.md#jobs-metrics-and-alerts)."""

from __future__ import annotations

import contextlib
import ipaddress
import json
import re
import signal
import threading
from collections.abc import Callable

import click

from stepbarrier._config.checks import MAX_JOB_NAME
from stepbarrier._inspect.listing import MAX_JOBS, list_jobs, truncation_lines, validate_patterns
from stepbarrier._redis.failures import describe_redis
from stepbarrier.cli._context import (
    EXIT_OK,
    EXIT_USAGE,
    Duration,
    F,
    command,
    current_session,
    server_options,
)
from stepbarrier.cli._exporter import (
    DEFAULT_BIND,
    DEFAULT_PORT,
    EXPORTED_JOBS,
    MIN_READ_INTERVAL,
    serve,
)
from stepbarrier.cli._views.jobs import jobs_view
from stepbarrier.cli._views.output import show
from stepbarrier.errors import ConfigurationError

ALL_JOBS = "all-jobs"
"""The job of the settings these commands build, whatever ``STEPBARRIER_JOB`` says:
a ``BarrierConfig`` needs one, and they read no job's keys through it."""


def _patterns(
    ctx: click.Context, param: click.Parameter, values: tuple[str, ...]
) -> tuple[str, ...]:
    for value in values:
        if len(value) > MAX_JOB_NAME:  # refused on its length alone, and shown cut short
            raise click.BadParameter(
                f"a job name or pattern is at most {MAX_JOB_NAME} characters, got "
                f"{len(value)} ({value[:40]!r}...)"
            )
    try:
        return validate_patterns(values or ("*",))
    except ConfigurationError as exc:
        raise click.BadParameter(str(exc)) from None


_HOST_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")
MAX_HOST_NAME = 253
"""The longest host name (RFC 1035); a label is at most 63 characters."""


def _bind(ctx: click.Context, param: click.Parameter, value: str) -> str:
    """``--bind``: an IP address or a host name, checked before anything listens."""
    with contextlib.suppress(ValueError):
        ipaddress.ip_address(value)
        return value
    name = value[:-1] if value.endswith(".") else value
    if 0 < len(name) <= MAX_HOST_NAME and all(
        _HOST_LABEL.fullmatch(label) for label in name.split(".")
    ):
        return value
    shown = repr(value) if len(value) <= 60 else f"{len(value)} characters ({value[:40]!r}...)"
    raise click.BadParameter(
        "must be an IP address such as 127.0.0.1, 0.0.0.0 (every interface) or :: (no "
        f"brackets), or a host name of at most {MAX_HOST_NAME} characters (labels of 1 to 63 "
        f"letters, digits and '-', joined by '.'), got {shown}"
    )


def _pattern_option(metavar: str, help: str) -> Callable[[F], F]:
    return click.option(
        "--job",
        "patterns",
        multiple=True,
        metavar=metavar,
        callback=_patterns,
        help=f"{help} Repeat it once per team ('team-a-*', 'team-b-*'): each team's jobs "
        "then get their own share of what is read, so one team's many jobs never hide "
        "another's. A job counts for the first pattern it matches. [default: *]",
    )


@command(EXIT_OK, options=server_options)
@_pattern_option(
    "PATTERN", "Only the jobs whose names match: a name, or a glob such as 'team-a-*'."
)
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help='Print one JSON object: "jobs" (one object per job), "complete", "scan_complete" '
    'and "patterns" (per pattern: jobs found, jobs read, "truncated").',
)
def jobs(patterns: tuple[str, ...], as_json: bool) -> None:
    """List every job on this Redis: run, step, heartbeat and who waits.

    The jobs are found by SCAN (on every master of a Redis Cluster), a walk of
    the whole keyspace: for an operator now and then, not a tight loop. At most
    10,000 jobs are read, shared fairly among the --job patterns; a pattern with
    more is truncated, and a line under the table (and on stderr) says so.

    \b
    Example:
      stepbarrier jobs --redis-url redis://redis:6379/0 --username monitor \\
          --password-file monitor.password --job 'team-a-*' --job 'team-b-*'
    """
    config = current_session().config(ALL_JOBS)
    listing = list_jobs(config, patterns=patterns, limit=MAX_JOBS)
    if as_json:
        # allow_nan=False: whatever sits in the keys, the output stays valid JSON
        click.echo(json.dumps(listing.to_dict(), indent=2, sort_keys=True, allow_nan=False))
    else:
        show(jobs_view(listing, where=describe_redis(config)))
    for line in truncation_lines(listing):
        click.echo(f"Warning: {line}", err=True)


@command(
    (EXIT_OK, "stopped by Ctrl-C or SIGTERM"),
    (EXIT_USAGE, "usage or configuration error, or the port is taken"),
    options=server_options,
    long_running=True,  # Redis outages are logged
    redis_errors=False,  # and ridden out
)
@click.option(
    "--port",
    type=click.IntRange(0, 65535),
    default=DEFAULT_PORT,
    show_default=True,
    help="Port of /metrics (0: any free port, printed at start).",
)
@click.option(
    "--bind",
    default=DEFAULT_BIND,
    show_default=True,
    metavar="ADDRESS",
    callback=_bind,
    help="Address to listen on (0.0.0.0: every interface, e.g. in a container).",
)
@_pattern_option("NAME", "Export only this job, or the jobs a glob such as 'team-a-*' matches.")
@click.option(
    "--max-jobs",
    type=click.IntRange(1, MAX_JOBS),
    default=EXPORTED_JOBS,
    show_default=True,
    help="Most jobs one reading of Redis reads, shared fairly among the --job patterns "
    "(stepbarrier_jobs_truncated says when a pattern has more).",
)
@click.option(
    "--min-interval",
    type=Duration(0, 300, low_open=False),
    default=MIN_READ_INTERVAL,
    show_default=True,
    help="Serve a reading of Redis again to scrapes this soon after it.",
)
def exporter(
    port: int, bind: str, patterns: tuple[str, ...], max_jobs: int, min_interval: float
) -> None:
    """Serve every job's progress to Prometheus on http://ADDRESS:PORT/metrics.

    The metrics: docs/operations.md#jobs-metrics-and-alerts. Redis is read when
    scraped, at most once per --min-interval; while it cannot be read the
    exporter keeps serving, with stepbarrier_up 0.

    \b
    Example:
      stepbarrier exporter --bind 0.0.0.0 --redis-url redis://redis:6379/0 \\
          --username monitor --password-file monitor.password \\
          --job 'team-a-*' --job 'team-b-*'
    """
    config = current_session().config(ALL_JOBS)
    try:
        server = serve(
            config,
            port=port,
            bind=bind,
            patterns=patterns,
            min_interval=min_interval,
            max_jobs=max_jobs,
        )
    except ImportError as exc:  # prometheus-client, imported only here
        raise ConfigurationError(str(exc), variable="exporter") from exc
    except OSError as exc:
        raise ConfigurationError(
            f"cannot listen on {bind}:{port}: {exc.strerror or exc}", variable="port"
        ) from exc
    stop = threading.Event()
    previous = signal.signal(signal.SIGTERM, lambda *_: stop.set())  # a container's stop
    try:
        with contextlib.suppress(KeyboardInterrupt), server:
            shown = ", ".join(repr(pattern) for pattern in patterns)
            click.echo(f"serving {server.url} (jobs {shown} of {describe_redis(config)})")
            while not stop.wait(60):
                pass
    finally:
        signal.signal(signal.SIGTERM, previous)
