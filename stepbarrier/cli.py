"""The ``stepbarrier`` command: a thin click layer over the library.

Each option stands for a ``STEPBARRIER_*`` variable: the command line is laid
over the environment and the result goes through ``BarrierConfig.from_env``,
the one place that reads settings. Errors become one line on stderr and an
exit code (``EXIT_CODES``); ``--debug`` adds the traceback. Passwords are
masked in every message and log line.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import re
import sys
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import click
from rich.console import Console
from rich.live import Live

from stepbarrier import __version__
from stepbarrier.config import BarrierConfig
from stepbarrier.errors import (
    BarrierAborted,
    BarrierTimeout,
    ConfigurationError,
    RedisRefused,
    RedisUnavailable,
)
from stepbarrier.publisher import StepPublisher
from stepbarrier.reset import reset_job
from stepbarrier.status import read_status
from stepbarrier.status_view import live_view, status_view
from stepbarrier.waiter import StepWaiter

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_ABORTED = 4
EXIT_UNAVAILABLE = 5
EXIT_INTERRUPTED = 130

EXIT_CODES = f"""\b
Exit codes:
  {EXIT_OK}  success
  {EXIT_USAGE}  usage, configuration, authentication or permission error
  {EXIT_TIMEOUT}  timeout (the overall timeout, or no chief heartbeat for the stall timeout)
  {EXIT_ABORTED}  aborted: the job finished or was reset before the step came
  {EXIT_UNAVAILABLE}  Redis unreachable after retries
  {EXIT_FAILED}  anything else (a bug: please report it with the --debug output)
"""

DEMO_EXIT_CODES = f"""\b
Exit codes:
  {EXIT_OK}  the job ran to its end, or Ctrl-C stopped it (nothing is left running)
  {EXIT_FAILED}  a task failed (its last log lines are shown)
  {EXIT_USAGE}  usage or configuration error (e.g. TensorFlow is not installed)
"""

#: Options that stand for a variable, for hints in configuration errors.
OPTION_FOR_VARIABLE = {
    "STEPBARRIER_REDIS_URL": "--redis-url",
    "STEPBARRIER_JOB": "--job",
    "STEPBARRIER_REDIS_USERNAME": "--username",
    "STEPBARRIER_REDIS_PASSWORD_FILE": "--password-file",
    "STEPBARRIER_WAIT_UNTIL_STEP": "--until",
    "STEPBARRIER_TIMEOUT": "--timeout",
    "STEPBARRIER_STALL_TIMEOUT": "--stall-timeout",
    "STEPBARRIER_TASK_ID": "--task-id",
}

_URL_CREDENTIALS = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.-]*://[^:@/\s]*:)(?P<secret>\S*)@")


def mask_secrets(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with URL passwords and each of ``secrets`` replaced by ``***``."""
    text = _URL_CREDENTIALS.sub(r"\g<head>***@", text)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def exit_code_for(exc: BaseException) -> int:
    """The exit code that stands for ``exc``."""
    if isinstance(exc, (ConfigurationError, RedisRefused)):
        return EXIT_USAGE
    if isinstance(exc, BarrierTimeout):
        return EXIT_TIMEOUT
    if isinstance(exc, BarrierAborted):
        return EXIT_ABORTED
    if isinstance(exc, RedisUnavailable):
        return EXIT_UNAVAILABLE
    return EXIT_FAILED


class _Session:
    """What one invocation collected: variables from options, verbosity, secrets."""

    def __init__(self) -> None:
        self.overrides: dict[str, str] = {}
        self.debug = False
        self.verbose = False
        self.secrets: set[str] = set()

    def config(self) -> BarrierConfig:
        environ = {**os.environ, **self.overrides}
        if "STEPBARRIER_REDIS_PASSWORD_FILE" in self.overrides:
            environ.pop("STEPBARRIER_REDIS_PASSWORD", None)  # the option wins
        self.secrets.add(environ.get("STEPBARRIER_REDIS_PASSWORD", ""))
        config = BarrierConfig.from_env(environ)
        self.secrets.add(config.redis_password or "")
        return config


def _session() -> _Session:
    return click.get_current_context().ensure_object(_Session)


class _MaskingFormatter(logging.Formatter):
    def __init__(self, session: _Session) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        self.session = session

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record), self.session.secrets)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to whatever ``sys.stderr`` is at the time (click's test runner swaps it)."""

    def emit(self, record: logging.LogRecord) -> None:
        self.stream = sys.stderr
        super().emit(record)


@contextlib.contextmanager
def command_logging(session: _Session, quiet_level: int) -> Iterator[None]:
    """Send log lines to stderr, masked, for one command; then restore what was there.

    ``quiet_level`` is the library's level without ``--verbose``: the error line
    says what went wrong, so most commands keep the library's warnings out of it.
    Restoring matters when the CLI runs inside another program (or a test run):
    a command must not change that program's logging for good.
    """
    root, library = logging.getLogger(), logging.getLogger("stepbarrier")
    saved = (root.level, library.level)
    handler = _StderrHandler()
    handler.setFormatter(_MaskingFormatter(session))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if session.debug else logging.WARNING)
    level = logging.DEBUG if session.debug else logging.INFO if session.verbose else quiet_level
    library.setLevel(level)
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        library.setLevel(saved[1])


def _variable_option(*decls: str, variable: str, help: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that sets ``variable`` for this invocation."""

    def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            ctx.ensure_object(_Session).overrides[variable] = str(value)
        return value

    return click.option(
        *decls,
        callback=remember,
        expose_value=False,
        is_eager=True,
        help=f"{help} [env: {variable}]",
        **kwargs,
    )


def _flag(name: str) -> Callable[[click.Context, click.Parameter, bool], bool]:
    def remember(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
        setattr(ctx.ensure_object(_Session), name, getattr(ctx.obj, name) or value)
        return value

    return remember


def connection_options(command: F) -> F:
    """The options every command that talks to the job's Redis takes."""
    decorators = [
        _variable_option(
            "--redis-url",
            variable="STEPBARRIER_REDIS_URL",
            metavar="URL",
            help="Redis URL, e.g. redis://host:6379/0 (default redis://localhost:6379/0).",
        ),
        _variable_option("--job", variable="STEPBARRIER_JOB", metavar="NAME", help="Job name."),
        _variable_option(
            "--username",
            variable="STEPBARRIER_REDIS_USERNAME",
            metavar="USER",
            help="Redis ACL user.",
        ),
        _variable_option(
            "--password-file",
            variable="STEPBARRIER_REDIS_PASSWORD_FILE",
            metavar="PATH",
            help="File holding the Redis password (never pass a password on the command "
            "line; STEPBARRIER_REDIS_PASSWORD works too).",
        ),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def reporting(command: F, *, quiet_level: int = logging.CRITICAL) -> F:
    """Adds ``--debug``/``--verbose`` and turns errors into one line and an exit code."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        session = _session()
        try:
            with command_logging(session, quiet_level):
                return command(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            fail(exc, session)

    run = click.option(
        "--verbose",
        "-v",
        is_flag=True,
        expose_value=False,
        callback=_flag("verbose"),
        help="Log what the barrier does (INFO lines on stderr).",
    )(run)
    run = click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        callback=_flag("debug"),
        help="Log everything and print tracebacks.",
    )(run)
    return run  # type: ignore[return-value]


def fail(exc: BaseException, session: _Session) -> None:
    """Print ``exc`` as one masked line (plus the traceback under --debug) and exit."""
    code = exit_code_for(exc)
    message = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, ConfigurationError) and exc.variable in OPTION_FOR_VARIABLE:
        message += f" (option {OPTION_FOR_VARIABLE[exc.variable]})"
    if code == EXIT_FAILED:
        message = f"unexpected {type(exc).__name__}: {message} (run with --debug for details)"
    if session.debug:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        click.echo(mask_secrets(trace, session.secrets), err=True, nl=False)
    click.echo(f"Error: {mask_secrets(message, session.secrets)}", err=True)
    sys.exit(code)


@click.group(
    epilog=EXIT_CODES
    + """
\b
Every option also comes from its STEPBARRIER_* variable, e.g.:
  export STEPBARRIER_REDIS_URL=redis://redis:6379/0 STEPBARRIER_JOB=mnist-42
  stepbarrier status
  stepbarrier wait --until 500 --timeout 600 && ./train.sh
  stepbarrier demo --workers 3
"""
)
@click.version_option(__version__, prog_name="stepbarrier")
def cli() -> None:
    """Hold distributed-training workers until the chief reaches a global step."""


@cli.command(epilog=EXIT_CODES)
@connection_options
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@reporting
def status(as_json: bool) -> None:
    """Show the chief's step, heartbeat and the waiting workers.

    \b
    Example:
      stepbarrier status --job mnist-42 --redis-url redis://redis:6379/0
    """
    job_status = read_status(_session().config())
    if as_json:
        click.echo(json.dumps(job_status.to_dict(), indent=2, sort_keys=True))
    else:
        Console(highlight=False).print(status_view(job_status))


@cli.command(epilog=EXIT_CODES)
@connection_options
@click.option("--until-done", is_flag=True, help="Stop (exit 0) once the chief marks the job done.")
@click.option(
    "--interval",
    type=click.FloatRange(0.05, 60),
    default=0.5,
    show_default=True,
    help="Seconds between refreshes.",
)
@reporting
def watch(until_done: bool, interval: float) -> None:
    """A live view of the job: each waiting worker's progress toward its step.

    Runs until Ctrl-C (exit 0). Redis outages are shown and ridden out.
    """
    config = _session().config()
    current = read_status(config)  # the first read fails loudly, with its exit code
    note: str | None = None
    try:
        with Live(live_view(current), console=Console(highlight=False), auto_refresh=False) as live:
            while not (until_done and current.done):
                time.sleep(interval)
                try:
                    current, note = read_status(config), None
                except RedisUnavailable as exc:
                    note = f"Redis unreachable, retrying: {exc}"
                live.update(live_view(current, note=note), refresh=True)
    except KeyboardInterrupt:
        pass


@cli.command(epilog=EXIT_CODES)
@connection_options
@_variable_option(
    "--until",
    variable="STEPBARRIER_WAIT_UNTIL_STEP",
    type=click.IntRange(0),
    metavar="N",
    help="The step to wait for (or set STEPBARRIER_SCHEDULE and a task id).",
)
@_variable_option(
    "--timeout",
    variable="STEPBARRIER_TIMEOUT",
    type=click.FloatRange(0, min_open=True),
    metavar="SECONDS",
    help="Give up (exit 3) after this long; no limit by default.",
)
@_variable_option(
    "--stall-timeout",
    variable="STEPBARRIER_STALL_TIMEOUT",
    metavar="SECONDS",
    type=click.FloatRange(0, min_open=True),
    help="Give up (exit 3) after this long without a chief heartbeat (default 600).",
)
@_variable_option(
    "--task-id",
    variable="STEPBARRIER_TASK_ID",
    type=click.IntRange(0),
    metavar="ID",
    help="Task id shown in `status` (the chief is 0).",
)
@functools.partial(reporting, quiet_level=logging.WARNING)  # a long wait tells of trouble
def wait(**_: Any) -> None:
    """Wait like a worker until the chief's step reaches N; print the step seen.

    \b
    Example:
      stepbarrier wait --until 500 --timeout 3600 && python train.py
    """
    config = _session().config()
    target = config.resolved_wait_until_step()
    with StepWaiter(config) as waiter:
        step = waiter.wait(target)
    click.echo(step)


@cli.command(epilog=EXIT_CODES)
@connection_options
@click.argument("step", type=click.IntRange(0, 2**53))
@click.option(
    "--done", is_flag=True, help="Also mark the job finished (aborts workers still waiting)."
)
@reporting
def publish(step: int, done: bool) -> None:
    """Set the job's step as a chief would.

    Each call acts as a new chief incarnation: the stored step is replaced, even
    by a lower one.

    \b
    Example:
      stepbarrier publish 1000 --done
    """
    config = _session().config()
    publisher = StepPublisher(config)
    publisher.publish(step)
    if not publisher.close(done=done):
        failure = publisher.last_failure
        raise failure or RedisUnavailable(f"could not publish step {step} to {config.safe_url}")
    click.echo(f"job {config.job}: step {step} published" + (", job marked done" if done else ""))


@cli.command(epilog=EXIT_CODES)
@connection_options
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@reporting
def reset(yes: bool) -> None:
    """Delete the job's keys; workers still waiting are aborted (exit 4), not left hanging."""
    config = _session().config()
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
    type=click.FloatRange(0, 5),
    default=None,
    metavar="SECONDS",
    help="Extra seconds after each training step (default: chosen so the chief alone "
    "takes about 10 s to reach the first worker's step).",
)
@click.option("--job", default=None, metavar="NAME", help="Job name (default demo-<random>).")
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
    from stepbarrier.demo import run_demo  # the demo's imports are only paid for here

    sys.exit(run_demo(**options))


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    cli.main(args=argv, prog_name="stepbarrier")
