"""``stepbarrier status`` and ``stepbarrier watch``: one job as it stands, or live.

A thin click layer over ``stepbarrier._inspect.status`` and ``stepbarrier._inspect.summary``;
``stepbarrier.cli._views.status`` draws what they read.
"""

from __future__ import annotations

import json
import time

import click
from rich.console import Console
from rich.live import Live

from stepbarrier._inspect.status import read_status
from stepbarrier._inspect.summary import read_overview
from stepbarrier.cli._context import (
    EXIT_CODES,
    FiniteFloatRange,
    connection_options,
    current_session,
    reporting,
)
from stepbarrier.cli._views.status import live_view, status_view
from stepbarrier.errors import RedisUnavailable


@click.command(epilog=EXIT_CODES)
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


@click.command(epilog=EXIT_CODES)
@connection_options
@click.option("--until-done", is_flag=True, help="Stop (exit 0) once the chief marks the job done.")
@click.option(
    "--interval",
    type=FiniteFloatRange(0.05, 60),
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
