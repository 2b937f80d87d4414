"""How every ``stepbarrier`` command takes its settings and reports its outcome.

Options stand for ``STEPBARRIER_*`` variables (laid over the environment and
read by ``BarrierConfig.from_env``); an error becomes one masked line on stderr
and an exit code; ``--debug`` adds the traceback, ``--verbose`` the library's
log lines, and every log line is masked too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
import os
import re
import signal
import sys
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar
from urllib.parse import unquote

import click

from stepbarrier._config.checks import DURATION_EXAMPLES, mask_url, parse_duration
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._redis.failures import RedisBusy
from stepbarrier.errors import (
    BarrierAborted,
    BarrierTimeout,
    ConfigurationError,
    RedisRefused,
    RedisUnavailable,
)

F = TypeVar("F", bound=Callable[..., Any])

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3
EXIT_ABORTED = 4
EXIT_UNAVAILABLE = 5
EXIT_NO_JOB = 6
EXIT_DEAD = 7
EXIT_BUSY = 8
EXIT_STALE = 9
EXIT_STUCK = 10
EXIT_COMMAND_FAILED = 11
EXIT_INTERRUPTED = 130

_EXIT_TEXT = {
    EXIT_OK: "success",
    EXIT_USAGE: "usage, configuration, authentication or permission error",
    EXIT_TIMEOUT: "timeout (the overall timeout, or no chief heartbeat for the stall timeout)",
    EXIT_ABORTED: "aborted: the job finished or was reset before the step came",
    EXIT_UNAVAILABLE: "Redis unreachable after retries",
    EXIT_BUSY: "Redis busy running a script (BUSY) after retries: wait, or have an "
    "administrator end it (FUNCTION KILL, SCRIPT KILL)",
    EXIT_NO_JOB: "no such job on this Redis (the message lists a few that exist)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, or SIGTERM or SIGHUP while waiting)",
    EXIT_FAILED: "anything else (a bug: please report it with the --debug output)",
}


def exit_codes(*entries: int | tuple[int, str]) -> str:
    """The "Exit codes:" epilog of one command: only the codes it can end with.

    Each entry is a code (with its usual words) or ``(code, words)``; 130
    (Ctrl-C) and 1 (a bug) end every list unless given.
    """
    rows = [entry if isinstance(entry, tuple) else (entry, _EXIT_TEXT[entry]) for entry in entries]
    given = {code for code, _ in rows}
    if EXIT_UNAVAILABLE in given and EXIT_BUSY not in given:
        # a command that can find Redis unreachable can find it busy: BUSY is
        # a RedisUnavailable too, told apart by its exit code
        at = [code for code, _ in rows].index(EXIT_UNAVAILABLE) + 1
        rows.insert(at, (EXIT_BUSY, _EXIT_TEXT[EXIT_BUSY]))
        given.add(EXIT_BUSY)
    rows += [
        (code, _EXIT_TEXT[code]) for code in (EXIT_INTERRUPTED, EXIT_FAILED) if code not in given
    ]
    lines = []
    for code, words in rows:
        first, *rest = _wrap(words, 72)
        lines.append(f"  {code:<3} {first}")
        lines += [f"      {more}" for more in rest]
    return "\b\nExit codes:\n" + "\n".join(lines) + "\n"


def _wrap(text: str, width: int) -> list[str]:
    lines: list[str] = []
    for word in text.split():
        if lines and len(lines[-1]) + 1 + len(word) <= width:
            lines[-1] += " " + word
        else:
            lines.append(word)
    return lines or [""]


EXIT_CODES = f"""\b
Exit codes (each command's --help lists its own):
  {EXIT_OK}  success
  {EXIT_USAGE}  usage, configuration, authentication or permission error (also: publish
     refused because a chief still heartbeats; --force overrides)
  {EXIT_TIMEOUT}  timeout (the overall timeout, or no chief heartbeat for the stall timeout)
  {EXIT_ABORTED}  aborted: the job finished or was reset before the step came
  {EXIT_UNAVAILABLE}  Redis unreachable after retries
  {EXIT_NO_JOB}  no such job (reset; status --check)
  {EXIT_DEAD}  status --check: the job is dead (no chief heartbeat within the stall timeout)
  {EXIT_BUSY}  Redis busy running a script (BUSY) after retries: Redis is up; wait, or have
     an administrator end the script (FUNCTION KILL, SCRIPT KILL)
  {EXIT_STALE}  status --check: the chief is stale (no heartbeat for three of its periods,
     at least 5 s, but within the stall timeout): it may be gone
  {EXIT_STUCK} status --check: a task is stuck (no progress for the stall timeout while
     the chief advances); the line names it
  {EXIT_COMMAND_FAILED} follow: the COMMAND run for a multiple failed (the line says which and how)
  {EXIT_FAILED}  anything else (a bug: please report it with the --debug output); doctor:
     a check failed
  {EXIT_INTERRUPTED}  interrupted (Ctrl-C; wait, follow and arrive also on SIGTERM or SIGHUP,
       leaving the registry first)
"""
"""The group's epilog: every code any command ends with."""

DEMO_EXIT_CODES = f"""\b
Exit codes:
  {EXIT_OK}    the job ran to its end, or Ctrl-C stopped it (the partial summary is
        shown; nothing is left running)
  {EXIT_FAILED}    a task failed (its last log lines are shown)
  {EXIT_USAGE}    usage or configuration error, or something the demo needs is not
        installed (TensorFlow; redis-server or fakeredis)
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
    "STEPBARRIER_REDIS_CLUSTER": "--cluster",
}

_WHITESPACE = re.compile(r"(\s+)")

log = logging.getLogger("stepbarrier.cli")
"""The command's own warnings, shown whatever the verbosity (``command_logging``)."""
_SHOWN_WARNINGS = ("stepbarrier.cli", "stepbarrier.tls")
"""Loggers whose WARNINGs every command shows; ``stepbarrier.tls`` (a client made
with weakened TLS, each time) only once per command, unless --debug."""

URL_PASSWORD_WARNING = (
    "--redis-url holds a password, which every user of this host can read in the process "
    "list (ps) while the command runs: leave it out of the URL and give it in a file with "
    "--password-file PATH (or STEPBARRIER_REDIS_PASSWORD_FILE), or in the environment "
    "(STEPBARRIER_REDIS_PASSWORD, or the whole URL in STEPBARRIER_REDIS_URL)"
)


def mask_secrets(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with URL passwords and each of ``secrets`` replaced by ``***``.

    A URL's password is masked word by word: ``mask_url`` on each word that
    holds ``://`` (which also masks a ``password=`` query argument). The cost is
    linear in the length of ``text``, however it is made; a regular expression
    here took quadratic time on a long word, such as a 100 000-character job
    name in a message.
    """
    words = _WHITESPACE.split(text)
    for index, word in enumerate(words):
        if "://" in word:
            words[index] = mask_url(word)
    text = "".join(words)
    for secret in secrets:
        if secret:
            text = text.replace(secret, "***")
    return text


def url_password(url: str) -> str | None:
    """The password in ``url`` (as ``mask_url`` finds it: between ``user:`` and the
    last ``@``, or a lone userinfo), or ``None`` if it holds none."""
    rest = url.partition("://")[2] or url
    userinfo, at, _host = rest.rpartition("@")
    user, colon, secret = userinfo.partition(":") if at else ("", "", "")
    # a lone userinfo is the password, as redis-cli reads it
    return (secret if colon else user) or None


class Duration(click.ParamType):  # type: ignore[type-arg]
    """A duration as people type it: plain seconds (``600``) or ``90s``, ``10m``, ``1h``.

    Converts to seconds (a float) within ``[low, high]`` (``low`` excluded
    with ``low_open``); anything else is a usage error (exit 2) that says how
    to write one.
    """

    name = "duration"

    def __init__(self, low: float = 0.0, high: float = 1e9, *, low_open: bool = True) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def get_metavar(self, param: click.Parameter, *args: Any) -> str:
        return "DURATION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            seconds: float | None = float(value)
        else:
            seconds = parse_duration(str(value))
        if seconds is None:
            self.fail(f"{str(value)[:40]!r} is no duration: give {DURATION_EXAMPLES}", param, ctx)
        too_low = seconds <= self.low if self.low_open else seconds < self.low
        if too_low or seconds > self.high:
            low = f"above {self.low:g}" if self.low_open else f"at least {self.low:g}"
            self.fail(
                f"{str(value)[:40]!r} is out of range: {low} and at most {self.high:g} seconds",
                param,
                ctx,
            )
        return seconds


class FiniteFloatRange(click.FloatRange):
    """click's ``FloatRange``, which also refuses ``nan`` and infinities.

    ``nan`` passes every comparison, so ``FloatRange(0.05, 60)`` takes it (and
    ``time.sleep(nan)`` fails later, as an unexpected error); an open range
    takes ``inf``. Both are a usage error (exit 2) naming the option here.
    """

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(
                f"{number} is not a finite number in the range {self._describe_range()}.",
                param,
                ctx,
            )
        return number


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
"""Every command's context: ``-h`` is ``--help`` too (subcommands inherit it)."""


def exit_code_for(exc: BaseException) -> int:
    """The exit code that stands for ``exc``."""
    if isinstance(exc, (ConfigurationError, RedisRefused)):
        return EXIT_USAGE
    if isinstance(exc, BarrierTimeout):
        return EXIT_TIMEOUT
    if isinstance(exc, BarrierAborted):
        return EXIT_ABORTED
    if isinstance(exc, RedisBusy):  # a RedisUnavailable: Redis is up, but busy
        return EXIT_BUSY
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
        self.password_on_command_line = False

    def config(self) -> BarrierConfig:
        environ = {**os.environ, **self.overrides}
        if "STEPBARRIER_REDIS_PASSWORD_FILE" in self.overrides:
            environ.pop("STEPBARRIER_REDIS_PASSWORD", None)  # the option wins
        self.secrets.add(environ.get("STEPBARRIER_REDIS_PASSWORD", ""))
        self.add_url_secret(environ.get("STEPBARRIER_REDIS_URL", ""))
        config = BarrierConfig.from_env(environ)
        self.secrets.add(config.redis_password or "")
        return config

    def add_url_secret(self, url: str) -> bool:
        """Mask the password of ``url`` too (also percent-decoded); True if it has one."""
        secret = url_password(url)
        if secret is None:
            return False
        self.secrets.update((secret, unquote(secret)))
        return True


def current_session() -> _Session:
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
def stopped_like_ctrl_c() -> Iterator[None]:
    """SIGTERM and SIGHUP end a waiting command as Ctrl-C does (exit 130), so that it
    leaves the job's registry on its way out: a launcher's or a container's stop
    would else leave the wait listed in ``status`` until its entry expired. A signal
    the command was started with ignored stays ignored (a ``nohup``); off the main
    thread (an embedding program's) nothing is changed."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    previous = {}
    for sig in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(sig) is signal.SIG_DFL:
            previous[sig] = signal.signal(sig, interrupt)
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def command_logging(session: _Session, quiet_level: int) -> Iterator[None]:
    """Send log lines to stderr, masked, for one command; then restore what was there.

    ``quiet_level`` is the library's level without ``--verbose``: the error line
    says what went wrong, so most commands keep the library's warnings out of it.
    Restoring matters when the CLI runs inside another program (or a test run):
    a command must not change that program's logging for good.
    """
    root, library = logging.getLogger(), logging.getLogger("stepbarrier")
    shown = [logging.getLogger(name) for name in _SHOWN_WARNINGS]
    saved = (root.level, library.level, [logger.level for logger in shown])
    handler = _StderrHandler()
    handler.setFormatter(_MaskingFormatter(session))
    if not session.debug:
        handler.addFilter(_FirstOnly("stepbarrier.tls"))
    root.addHandler(handler)
    root.setLevel(logging.DEBUG if session.debug else logging.WARNING)
    level = logging.DEBUG if session.debug else logging.INFO if session.verbose else quiet_level
    library.setLevel(level)
    for logger in shown:  # security warnings are shown even when the library is quiet
        logger.setLevel(min(level, logging.WARNING))
    try:
        yield
    finally:
        root.removeHandler(handler)
        root.setLevel(saved[0])
        library.setLevel(saved[1])
        for logger, previous in zip(shown, saved[2], strict=True):
            logger.setLevel(previous)


class _FirstOnly(logging.Filter):
    """Passes the first record of logger ``name`` (and every other logger's records)."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.only = name
        self.seen = False

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != self.only:
            return True
        first, self.seen = not self.seen, True
        return first


def variable_option(*decls: str, variable: str, help: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that sets ``variable`` for this invocation."""

    def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            session = ctx.ensure_object(_Session)
            session.overrides[variable] = str(value)
            if variable == "STEPBARRIER_REDIS_URL" and session.add_url_secret(str(value)):
                session.password_on_command_line = True  # told once the command logs
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
    return _redis_options(command, job=True)


def server_options(command: F) -> F:
    """The options of a command about every job of a Redis: ``connection_options``
    without ``--job``."""
    return _redis_options(command, job=False)


def _redis_options(command: F, *, job: bool) -> F:
    decorators = [
        variable_option(
            "--redis-url",
            variable="STEPBARRIER_REDIS_URL",
            metavar="URL",
            help="Redis URL, e.g. redis://host:6379/0 (default redis://localhost:6379/0); "
            "keep the password out of it (ps shows it): use --password-file.",
        ),
        *(
            [variable_option("--job", variable="STEPBARRIER_JOB", metavar="NAME", help="Job name.")]
            if job
            else []
        ),
        variable_option(
            "--username",
            variable="STEPBARRIER_REDIS_USERNAME",
            metavar="USER",
            help="Redis ACL user.",
        ),
        variable_option(
            "--password-file",
            variable="STEPBARRIER_REDIS_PASSWORD_FILE",
            metavar="PATH",
            help="File holding the Redis password, a regular file of at most 4096 bytes "
            "(never pass a password on the command line; STEPBARRIER_REDIS_PASSWORD works too).",
        ),
        variable_option(
            "--cluster",
            variable="STEPBARRIER_REDIS_CLUSTER",
            is_flag=True,
            flag_value="1",
            default=None,
            help="Redis is a Redis Cluster; --redis-url names one of its nodes.",
        ),
    ]
    for decorate in reversed(decorators):
        command = decorate(command)
    return command


def reporting(command: F, *, quiet_level: int = logging.CRITICAL) -> F:
    """Adds ``--debug``/``--verbose`` and turns errors into one line and an exit code."""

    @functools.wraps(command)
    def run(*args: Any, **kwargs: Any) -> Any:
        session = current_session()
        try:
            with command_logging(session, quiet_level):
                if session.password_on_command_line:
                    log.warning(URL_PASSWORD_WARNING)
                return command(*args, **kwargs)
        except (click.ClickException, click.exceptions.Exit, click.Abort):
            raise
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            sys.exit(EXIT_INTERRUPTED)
        except Exception as exc:
            fail(exc, session)

    return verbosity_options(run)  # type: ignore[return-value]


def verbosity_options(command: F) -> F:
    """``--debug`` and ``--verbose``: on each command, and on the group before it
    (``stepbarrier --debug status`` is ``stepbarrier status --debug``)."""
    command = click.option(
        "--verbose",
        "-v",
        is_flag=True,
        expose_value=False,
        callback=_flag("verbose"),
        help="Log what the barrier does (INFO lines on stderr).",
    )(command)
    return click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        callback=_flag("debug"),
        help="Log everything and print tracebacks.",
    )(command)


def reporting_warnings(command: F) -> F:
    """``reporting`` that also shows the library's warnings without ``--verbose``.

    For a command that may run long (``wait``, ``arrive``, ``exporter``): a lost
    connection or a stalled chief is news while it runs, not only in the last line.
    """
    return reporting(command, quiet_level=logging.WARNING)


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
