"""``stepbarrier status`` and ``stepbarrier watch``: one job as it stands, or live."""

from __future__ import annotations

import functools
import json
import sys
import time
from contextlib import nullcontext

import click
from rich.console import Console
from rich.live import Live

from stepbarrier._config.defaults import DEFAULT_STALL_TIMEOUT
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.missing import is_missing
from stepbarrier._inspect.status import chief_heard, is_stale, read_status, stale_limit
from stepbarrier._inspect.summary import read_overview
from stepbarrier._redis.failures import RedisBusy
from stepbarrier.cli._context import (
    EXIT_BUSY,
    EXIT_DEAD,
    EXIT_NO_JOB,
    EXIT_OK,
    EXIT_STALE,
    EXIT_STUCK,
    EXIT_UNAVAILABLE,
    Duration,
    command,
    current_session,
    stall_timeout_option,
    stopped_like_ctrl_c,
)
from stepbarrier.cli._guidance import missing_job_message, note_if_missing
from stepbarrier.cli._views.output import interactive, plain_text, show
from stepbarrier.cli._views.status import (
    describe_age,
    describe_duration,
    describe_stuck,
    live_view,
    status_view,
)
from stepbarrier.errors import RedisUnavailable

STRAGGLER_STEPS = click.option(
    "--straggler-steps",
    type=click.IntRange(0, 2**53 - 2),
    default=None,
    metavar="N",
    help="A task behind the chief by more than N steps is a straggler (default: "
    "max(100, 5% of the chief's step)).",
)


@command(
    (EXIT_OK, "success (with --check: the job is live, or done)"),
    (EXIT_NO_JOB, "with --check: no such job on this Redis"),
    EXIT_DEAD,
    EXIT_STALE,
    EXIT_STUCK,
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--check",
    is_flag=True,
    help="Only say whether the job is live: one line (or JSON object) and an exit code "
    "(below); for scripts.",
)
@stall_timeout_option(
    "A chief silent for longer is dead (--check), and a task without progress "
    f"for longer while the chief advances is stuck (default {DEFAULT_STALL_TIMEOUT:g} s)."
)
@STRAGGLER_STEPS
def status(as_json: bool, check: bool, straggler_steps: int | None) -> None:
    """Show the chief's step, heartbeat and the waiting workers.

    More than 20 waiting workers are summarised (counts, the nearest targets, a
    histogram); --json lists each of them. Each task that reports its progress
    is listed with how far it is behind the chief, and whether it is a
    straggler or stuck (docs/who-is-slow.md). A chief whose heartbeat is older
    than three of its periods is marked STALE. A job with no keys on this Redis
    is said so on stderr. "run" is the run id the chief stored; "run here" the
    one these settings give (docs/configuration.md#run-id; --json: "config").

    \b
    Example:
      stepbarrier status --job mnist-42 --redis-url redis://redis:6379/0
      stepbarrier status --check --job mnist-42 || echo "job mnist-42 is not live"
    """
    config = current_session().config()
    if check:
        _check(config, as_json, straggler_steps)
    elif as_json:
        # allow_nan=False: whatever sits in the keys, the output stays valid JSON
        job_status = read_status(config, straggler_steps=straggler_steps)
        data = job_status.to_dict()
        # "run_id" is the chief's stored one; this is the run id the command's
        # own settings give (a shell inside a Slurm job gets that job's)
        data["config"] = {"run_id": config.run_id, "run_id_source": config.run_id_source}
        note_if_missing(config, job_status)
        click.echo(json.dumps(data, indent=2, sort_keys=True, allow_nan=False))
    else:
        job_status, summary = read_overview(config, straggler_steps=straggler_steps)
        note_if_missing(config, job_status, summary)
        show(status_view(job_status, summary=summary, here=config))


def _check(config: BarrierConfig, as_json: bool, straggler_steps: int | None = None) -> None:
    """``status --check``: one verdict, as a line (or a JSON object) and an exit code."""
    # one waiter is enough to tell a job only workers wait on from no job at all
    job_status = read_status(config, max_waiters=1, barriers=False, straggler_steps=straggler_steps)
    age = job_status.heartbeat_age
    stuck = job_status.stuck_tasks
    if is_missing(job_status):
        verdict, code, why = "missing", EXIT_NO_JOB, missing_job_message(config)
    elif job_status.done:
        verdict, code, why = "done", EXIT_OK, "the chief marked the job done"
    elif age is None or not chief_heard(job_status, config.stall_timeout):
        verdict, code = "dead", EXIT_DEAD
        why = (
            "no chief has written a heartbeat (only waiters, tasks' progress or a reset "
            "marker are there)"
            if age is None
            else f"no chief heartbeat for {describe_duration(age)} (over the stall timeout "
            f"of {config.stall_timeout:g} s)"
        )
    elif is_stale(job_status):  # the rule `status` marks STALE by
        verdict, code = "stale", EXIT_STALE
        why = (
            f"no chief heartbeat for {describe_duration(age)}, step {job_status.step} (stale "
            f"after {stale_limit(job_status) or 0:g} s, dead after the stall timeout of "
            f"{config.stall_timeout:g} s): the chief may be gone"
        )
    elif stuck:
        verdict, code, why = "stuck", EXIT_STUCK, describe_stuck(job_status, config.stall_timeout)
    else:
        verdict, code = "live", EXIT_OK
        why = f"chief heartbeat {describe_age(age)}, step {job_status.step}"
    if as_json:
        data: dict[str, object] = {"job": config.job, "verdict": verdict, "reason": why}
        data["exit_code"] = code
        if stuck:
            data["stuck_tasks"] = [task.task_id for task in stuck]
        click.echo(json.dumps(data, sort_keys=True))
    else:
        click.echo(f"job {config.job}: {verdict}: {why}")
    sys.exit(code)


PIPED_EVERY = 30.0
"""Piped, ``watch`` prints a frame when the job changes, and at least this often."""


@command(
    (EXIT_OK, "stopped by Ctrl-C, SIGTERM or SIGHUP, or (--until-done) the job is done"),
    (EXIT_UNAVAILABLE, "Redis unreachable at the first read (later outages are shown)"),
    (EXIT_BUSY, "Redis busy running a script at the first read (later, it is shown)"),
)
@click.option("--until-done", is_flag=True, help="Stop (exit 0) once the chief marks the job done.")
@click.option(
    "--interval",
    type=Duration(0.05, 60, low_open=False),
    default=0.5,
    show_default=True,
    help="Seconds between refreshes.",
)
@stall_timeout_option(
    "A task without progress for longer while the chief advances is stuck "
    f"(default {DEFAULT_STALL_TIMEOUT:g} s)."
)
@STRAGGLER_STEPS
def watch(until_done: bool, interval: float, straggler_steps: int | None) -> None:
    """A live view of the job: each waiting worker's progress toward its step.

    More than 20 waiting workers are summarised: counts, the nearest targets and
    a histogram, read from the job's index in a few commands. Redis outages are
    shown and ridden out. Piped (a CI log), it prints a plain frame whenever the
    job changes and at least every 30 s, each flushed at once; the last frame
    stays when it stops.
    """
    config = current_session().config()
    read = functools.partial(read_overview, config, straggler_steps=straggler_steps)
    current, summary = read()  # the first read fails loudly, with its exit code
    # as status says it: a typo in --job watches nothing, and the view alone
    # would show an empty job; watch goes on (its chief may not have started)
    note_if_missing(config, current, summary)
    note: str | None = None
    console = Console(highlight=False)
    terminal = interactive(console)
    printed: tuple[object, float] = (None, 0.0)  # piped: the last frame's key, and when

    def piped_frame(last: bool = False) -> None:
        nonlocal printed
        key: tuple[object, ...] = (current.step, current.done, current.generation, note)
        key += (len(current.waiters), None if summary is None else summary.waiting)
        key += (is_stale(current),)
        key += tuple((t.task_id, t.step, t.stuck, t.straggler) for t in current.tasks)
        now = time.monotonic()
        if last or key != printed[0] or now - printed[1] >= PIPED_EVERY:
            view = live_view(current, note=note, summary=summary)
            sys.stdout.write(plain_text(view, console.width) + "\n\n")
            sys.stdout.flush()
            printed = (key, now)

    try:
        first = live_view(current, summary=summary)
        with (
            stopped_like_ctrl_c(),
            Live(first, console=console, auto_refresh=False) if terminal else nullcontext() as live,
        ):
            if live is None:
                piped_frame()
            while not (until_done and current.done):
                time.sleep(interval)
                try:
                    (current, summary), note = read(), None
                except RedisUnavailable as exc:
                    note = _outage_note(exc)
                if live is None:
                    piped_frame()
                else:
                    live.update(live_view(current, note=note, summary=summary), refresh=True)
    except KeyboardInterrupt:  # Ctrl-C, SIGTERM or SIGHUP: the last frame stays
        if not terminal:
            piped_frame(last=True)


def _outage_note(exc: RedisUnavailable) -> str:
    """What ``watch`` says while a read fails: Redis unreachable, or busy with a script."""
    what = "busy running a script" if isinstance(exc, RedisBusy) else "unreachable"
    return f"Redis {what}, retrying: {exc}"
