"""``stepbarrier wait``, ``publish`` and ``reset``: a shell script waits like a worker
(``StepWaiter``), sets the step like a chief (``StepPublisher``) or clears the job."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import sys
import threading
import time
from typing import Any

import click
from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stepbarrier._chief.publisher import StepPublisher
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.missing import has_barrier_keys, is_missing
from stepbarrier._inspect.reset import reset_job
from stepbarrier._inspect.status import JobStatus, find_live_chief, is_stale, read_status
from stepbarrier._protocol.freshness import GRACE, HAND_PUBLISHED
from stepbarrier._protocol.wire import MAX_STEP
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._worker.waiter import StepWaiter
from stepbarrier.cli._context import (
    EXIT_ABORTED,
    EXIT_NO_JOB,
    EXIT_OK,
    EXIT_TIMEOUT,
    EXIT_USAGE,
    command,
    current_session,
    stopped_like_ctrl_c,
    variable_option,
    wait_options,
)
from stepbarrier.cli._guidance import NoSuchJob, missing_job_message, one_line
from stepbarrier.cli._views.output import interactive
from stepbarrier.cli._views.status import describe_age
from stepbarrier.errors import RedisUnavailable, StepBarrierError


@command(
    (EXIT_OK, "the step came (it is printed on stdout)"),
    EXIT_TIMEOUT,
    EXIT_ABORTED,
    long_running=True,
)
@variable_option(
    "--until",
    variable="STEPBARRIER_WAIT_UNTIL_STEP",
    type=click.IntRange(0),
    metavar="N",
    help="The step to wait for (or set STEPBARRIER_SCHEDULE and a task id).",
)
@wait_options("a chief heartbeat", task_id="Task id shown in `status` (the chief is 0).")
@click.option(
    "--json",
    "as_json",
    is_flag=True,
    help="Print one JSON object instead of the step: job, wait_until_step, step, "
    "waited_seconds, released_by.",
)
@click.option("--quiet", "-q", is_flag=True, help="Show no progress on stderr.")
def wait(as_json: bool, quiet: bool, **_: Any) -> None:
    """Wait like a worker until the chief's step reaches N; print the step seen.

    stderr shows what it waits for (a live block on a terminal, a line every
    10 s piped); stdout gets only the step (or, with --json, one object).

    \b
    Example:
      stepbarrier wait --until 500 --timeout 1h && python train.py
      step=$(stepbarrier wait --until 500 2>>wait.log)
    """
    config = current_session().config()
    target = config.resolved_wait_until_step()
    started = time.monotonic()
    progress = contextlib.nullcontext() if quiet or target <= 0 else WaitProgress(config, target)
    with progress, stopped_like_ctrl_c(), StepWaiter(config) as waiter:
        step = waiter.wait(target)
    if not as_json:
        click.echo(step)
        return
    waited = round(time.monotonic() - started, 3)
    data = {"job": config.job, "wait_until_step": target, "step": step, "waited_seconds": waited}
    click.echo(json.dumps({**data, "released_by": waiter.last_released_by}, sort_keys=True))


@command(
    (EXIT_OK, "published"),
    (
        EXIT_USAGE,
        "usage, configuration, authentication or permission error; also "
        "refused because a chief still heartbeats (--force overrides)",
    ),
)
@click.argument("step", type=click.IntRange(0, MAX_STEP))
@click.option(
    "--done", is_flag=True, help="Also mark the job finished (aborts workers still waiting)."
)
@click.option(
    "--force",
    is_flag=True,
    help="Publish even while a chief heartbeats: that chief is superseded for good.",
)
def publish(step: int, done: bool, force: bool) -> None:
    """Pin the job's step: release every worker waiting for STEP or less.

    Each call is a new generation (docs/protocol.md#operator-publish): the
    stored step is replaced, even by a lower one, and a running chief is
    superseded for good.

    \b
    Example:
      stepbarrier publish 1000 --done
    """
    config = current_session().config()
    live = None if force else find_live_chief(config)
    if live is not None:
        chief, limit = live
        raise ChiefIsLive(
            f"job {config.job}: chief {chief.chief or '(unnamed)'} is live (heartbeat "
            f"{describe_age(chief.heartbeat_age)}, under {limit:g} s); publishing would "
            "supersede it for good. Stop it first, or pass --force"
        )
    publisher = StepPublisher(
        config, description=f"{HAND_PUBLISHED}{socket.gethostname()}:{os.getpid()}", operator=True
    )
    publisher.publish(step)
    if not publisher.close(done=done):
        failure = publisher.last_failure
        raise failure or RedisUnavailable(f"could not publish step {step} to {config.safe_url}")
    if done:
        outcome = ", job marked done"
    elif config.run_id:
        outcome = f" and pinned: it releases later arrivals of run {config.run_id} too"
    else:
        # a worker without a run id cannot tell this pin from an earlier run's at
        # once: one that arrives later trusts it after the grace, unless a new
        # chief begins meanwhile (docs/protocol.md#grace)
        outcome = (
            " and pinned: it released the workers waiting now; a worker that arrives "
            f"later is released by it after {GRACE:g} s, unless a new chief begins first"
        )
    click.echo(f"job {config.job}: step {step} published{outcome}")


class ChiefIsLive(click.ClickException):
    exit_code = EXIT_USAGE


@command(
    (EXIT_OK, "reset"),
    (EXIT_NO_JOB, "no such job on this Redis: nothing was reset"),
)
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
def reset(yes: bool) -> None:
    """Delete the job's keys; workers still waiting are aborted (exit 4), not left hanging.

    A job of named barriers only (`stepbarrier arrive`) is reset too; a job
    with no keys on this Redis is not (exit 6).
    """
    config = current_session().config()
    if is_missing(read_status(config, barriers=False)) and not has_barrier_keys(config):
        raise NoSuchJob(f"{missing_job_message(config)}: nothing reset")
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


TERMINAL_EVERY, PIPED_EVERY = 1.0, 10.0
"""Seconds between reads on a terminal, and between lines when stderr is not one."""
READ_SOCKET_TIMEOUT = 5.0


def describe_duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 5 s"``, ``"1 h 4 min"``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{max(0.0, seconds):.1f} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


class WaitProgress:
    """Shows the wait for ``target`` on stderr (or ``console``) while entered
    (docs/cli.md#wait-progress); ``config.timeout`` bounds the time left.

    A thread of its own reads the job's state with its own client (the read every
    role may run: ``read_status`` without waiters or barriers); it never touches the
    wait itself, and a failed read is shown, not raised.
    """

    def __init__(self, config: BarrierConfig, target: int, console: Console | None = None) -> None:
        self.config, self.target = config, target
        self.console = console or Console(stderr=True, highlight=False)
        self.started = time.monotonic()
        self.status: JobStatus | None = None
        self.note: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepbarrier-progress", daemon=True)
        self._client: RedisClient | None = None

    def __enter__(self) -> WaitProgress:
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        self._thread.join(timeout=READ_SOCKET_TIMEOUT + 1)

    def _run(self) -> None:
        live = None
        if interactive(self.console):
            live = Live(self.view(), console=self.console, transient=True, auto_refresh=False)
        try:
            with live or contextlib.nullcontext():
                while not self._stop.is_set():
                    self._read()
                    if live is not None:
                        live.update(self.view(), refresh=True)
                    elif not self._stop.is_set():
                        self.console.file.write(self.line() + "\n")
                        self.console.file.flush()
                    self._stop.wait(PIPED_EVERY if live is None else TERMINAL_EVERY)
        finally:
            if self._client is not None:
                self._client.close()

    def _read(self) -> None:
        try:
            if self._client is None:
                self._client = make_client(self.config, socket_timeout=READ_SOCKET_TIMEOUT)
            self.status = read_status(self.config, self._client, waiters=False, barriers=False)
        except Exception as exc:  # the progress must never end the wait
            why = one_line(str(exc)) if isinstance(exc, StepBarrierError) else type(exc).__name__
            self.note = f"status unavailable: {why}"
            return
        if is_missing(self.status):
            # listing the other jobs is a SCAN: once, not at every read
            if self.note is None or not self.note.startswith("no job"):
                self.note = missing_job_message(self.config, yet=True)
        else:
            self.note = None

    def _facts(self) -> tuple[int | None, float | None, bool, float, float | None]:
        """The chief's step, its heartbeat's age, whether it is stale, the time waited and
        the time left."""
        waited = time.monotonic() - self.started
        left = None if self.config.timeout is None else max(0.0, self.config.timeout - waited)
        if self.status is None:
            return None, None, False, waited, left
        return self.status.step, self.status.heartbeat_age, is_stale(self.status), waited, left

    def line(self) -> str:
        """One progress line (piped output)."""
        step, heartbeat, stale, waited, left = self._facts()
        parts = [
            f"waiting for job {self.config.job} to reach step {self.target}: chief at "
            + ("no step yet" if step is None else f"step {step}"),
            f"heartbeat {describe_age(heartbeat)}" + (" (stale)" if stale else ""),
            f"waited {describe_duration(waited)}",
            "no timeout" if left is None else f"{describe_duration(left)} left",
        ]
        line = ", ".join(parts)
        return line if self.note is None else f"{line}; {self.note}"

    def view(self) -> RenderableType:
        """The live block (terminal)."""
        step, heartbeat_age, stale, waited, left = self._facts()
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("job", Text(self.config.job))
        grid.add_row("waiting for", f"step {self.target}")
        if step is None:
            grid.add_row("chief's step", "none yet")
        else:
            bar = ProgressBar(total=max(1, self.target), completed=min(step, self.target), width=30)
            grid.add_row("chief's step", Group(Text(f"{step} of {self.target}"), bar))
        heartbeat = Text(describe_age(heartbeat_age))
        if stale:
            heartbeat.append(" (stale: is the chief running?)", style="red")
        grid.add_row("heartbeat", heartbeat)
        grid.add_row("waited", describe_duration(waited))
        grid.add_row("time left", "no timeout" if left is None else describe_duration(left))
        noted = [Text(self.note, style="yellow")] if self.note else []
        return Group(grid, *noted, Text("Ctrl-C to stop waiting", style="dim"))
