"""How every ``stepbarrier`` command takes its settings and reports its outcome.

Options stand for ``STEPBARRIER_*`` variables (laid over the environment and
read by ``BarrierConfig.from_env``); an error becomes one masked line on stderr
and an exit code; ``--debug`` adds the traceback, ``--verbose`` the library's
log lines, and every log line is masked too.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import re
import signal
import sys
import textwrap
import threading
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

import click

from stepbarrier._config.checks import DURATION_EXAMPLES, mask_url, parse_duration
from stepbarrier._config.defaults import DEFAULT_REDIS_URL, DEFAULT_STALL_TIMEOUT
from stepbarrier._config.environment import MAX_PASSWORD_FILE
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
    EXIT_DEAD: "with --check: the job is dead (no chief heartbeat within the stall timeout)",
    EXIT_STALE: "with --check: the chief is stale (no heartbeat for three of its periods, at "
    "least 5 s, but within the stall timeout): it may be gone",
    EXIT_STUCK: "with --check: a task is stuck (behind the chief, no progress for the stall "
    "timeout while the chief advances); the line names it",
    EXIT_COMMAND_FAILED: "COMMAND failed for a multiple (the line says which)",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C, or SIGTERM or SIGHUP while waiting)",
    EXIT_FAILED: "anything else (a bug: please report it with the --debug output)",
}


def exit_codes(
    *entries: int | tuple[int, str],
    redis: bool = False,
    heading: str = "Exit codes:",
    width: int = 3,
) -> str:
    """The "Exit codes:" epilog of one command: only the codes it can end with.

    Each entry is a code (with its usual words) or ``(code, words)``. Unless given,
    2 (usage) is added, 5 and 8 too for a command that reads Redis (``redis``), each
    in its place in the group's list; 130 (Ctrl-C) and 1 (a bug) end every list.
    """
    rows = [entry if isinstance(entry, tuple) else (entry, _EXIT_TEXT[entry]) for entry in entries]
    order = list(_EXIT_TEXT)
    # a command that can find Redis unreachable can find it busy: BUSY is a
    # RedisUnavailable too, told apart by its exit code
    for implied in EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_BUSY:
        given = [code for code, _ in rows]
        wanted = implied == EXIT_USAGE or redis or EXIT_UNAVAILABLE in given
        if wanted and implied not in given:
            later = (i for i, code in enumerate(given) if order.index(code) > order.index(implied))
            rows.insert(next(later, len(rows)), (implied, _EXIT_TEXT[implied]))
    given = [code for code, _ in rows]
    rows += [
        (code, _EXIT_TEXT[code]) for code in (EXIT_INTERRUPTED, EXIT_FAILED) if code not in given
    ]
    lines = []
    for code, words in rows:
        first, *rest = textwrap.wrap(words, 72, break_on_hyphens=False)
        lines.append(f"  {code:<{width}} {first}")
        lines += [" " * (width + 3) + more for more in rest]
    return f"\b\n{heading}\n" + "\n".join(lines) + "\n"


_ONE_COMMAND = {
    EXIT_DEAD: "status ",
    EXIT_STALE: "status ",
    EXIT_STUCK: "status ",
    EXIT_COMMAND_FAILED: "follow: ",
}
"""The codes only one command ends with: the group's epilog names it."""
EXIT_CODES = exit_codes(
    *((code, f"{_ONE_COMMAND.get(code, '')}{words}") for code, words in _EXIT_TEXT.items()),
    heading="Exit codes (each command's --help, or -h, lists its own):",
    width=2,
)
"""The group's epilog: every code any command ends with."""

log = logging.getLogger("stepbarrier.cli")
"""The command's own warnings, shown whatever the verbosity (``command_logging``)."""
_SHOWN_WARNINGS = ("stepbarrier.cli", "stepbarrier.tls")
"""Loggers whose WARNINGs every command shows (``stepbarrier.tls``'s once: ``command_logging``)."""

URL_PASSWORD_WARNING = (
    "--redis-url holds a password, which every user of this host can read in the process "
    "list (ps) while the command runs: leave it out of the URL and give it in a file with "
    "--password-file PATH (or STEPBARRIER_REDIS_PASSWORD_FILE), or in the environment "
    "(STEPBARRIER_REDIS_PASSWORD, or the whole URL in STEPBARRIER_REDIS_URL)"
)


def mask_secrets(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with URL passwords and each of ``secrets`` replaced by ``***``.

    Word by word (``mask_url`` on each word holding ``://``), in linear time: a
    regular expression here took quadratic time on a 100 000-character job name.
    """
    text = "".join(mask_url(word) if "://" in word else word for word in re.split(r"(\s+)", text))
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
    """A duration as people type it (``600``, ``90s``, ``10m``, ``1h``), in seconds
    within ``[low, high]`` (``low`` excluded with ``low_open``); else a usage error."""

    name = "duration"

    def __init__(self, low: float = 0.0, high: float = 1e9, *, low_open: bool = True) -> None:
        self.low, self.high, self.low_open = low, high, low_open

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        seconds = parse_duration(str(value))  # a default too: str(0.5) is "0.5"
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


CONTEXT_SETTINGS = {"help_option_names": ["-h", "--help"]}
"""Every command's context: ``-h`` is ``--help`` too (subcommands inherit it)."""


_EXIT_FOR: tuple[tuple[type[BaseException] | tuple[type[BaseException], ...], int], ...] = (
    ((ConfigurationError, RedisRefused), EXIT_USAGE),
    (BarrierTimeout, EXIT_TIMEOUT),
    (BarrierAborted, EXIT_ABORTED),
    (RedisBusy, EXIT_BUSY),  # a RedisUnavailable: Redis is up, but busy
    (RedisUnavailable, EXIT_UNAVAILABLE),
)


def exit_code_for(exc: BaseException) -> int:
    """The exit code that stands for ``exc`` (the first of ``_EXIT_FOR`` it is)."""
    return next((code for kinds, code in _EXIT_FOR if isinstance(exc, kinds)), EXIT_FAILED)


@dataclass
class _Session:
    """What one invocation collected from its options, and the secrets to mask."""

    overrides: dict[str, str] = field(default_factory=dict)
    debug: bool = False
    verbose: bool = False
    secrets: set[str] = field(default_factory=set)
    password_on_command_line: bool = False

    def config(self, job: str | None = None) -> BarrierConfig:
        """The settings of this invocation; ``job`` names the job whatever the options
        and the environment say (a command about every job, or none)."""
        environ = {**os.environ, **self.overrides}
        if job is not None:
            environ["STEPBARRIER_JOB"] = job
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


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes each line masked, to whatever ``sys.stderr`` is at the time (click's test
    runner swaps it)."""

    def __init__(self, session: _Session) -> None:
        super().__init__()
        self.session = session
        self.setFormatter(
            logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S")
        )

    def format(self, record: logging.LogRecord) -> str:
        return mask_secrets(super().format(record), self.session.secrets)

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
    """Send log lines to stderr, masked, for one command; then restore what was there
    (the CLI may run inside another program, or a test run).

    ``quiet_level`` is the library's level without ``--verbose``: the error line
    says what went wrong, so most commands keep the library's warnings out of it.
    """
    root, library = logging.getLogger(), logging.getLogger("stepbarrier")
    shown = [logging.getLogger(name) for name in _SHOWN_WARNINGS]
    saved = [(logger, logger.level) for logger in (root, library, *shown)]
    handler = _StderrHandler(session)
    if not session.debug:  # a weakened-TLS warning once per command, not per client
        tls_told = itertools.count()
        handler.addFilter(lambda record: record.name != "stepbarrier.tls" or next(tls_told) == 0)
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
        for logger, previous in saved:
            logger.setLevel(previous)


class _VariableOption(click.Option):
    def __init__(self, *args: Any, variable: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.variable = variable


def variable_option(*decls: str, variable: str, help: str, **kwargs: Any) -> Callable[[F], F]:
    """An option that sets ``variable`` for this invocation (and that an error about
    ``variable`` names)."""

    def remember(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
        if value is not None:
            session = ctx.ensure_object(_Session)
            session.overrides[variable] = str(value)
            if variable == "STEPBARRIER_REDIS_URL" and session.add_url_secret(str(value)):
                session.password_on_command_line = True  # told once the command logs
        return value

    return click.option(
        *decls,
        cls=_VariableOption,
        variable=variable,
        callback=remember,
        expose_value=False,
        is_eager=True,
        help=f"{help} [env: {variable}]",
        **kwargs,
    )


def _flag(ctx: click.Context, param: click.Parameter, value: bool) -> bool:
    """``--debug``/``--verbose``: set on the group or the command, either counts."""
    name = str(param.name)
    setattr(ctx.ensure_object(_Session), name, getattr(ctx.obj, name) or value)
    return value


def _options(*decorators: Callable[[F], F]) -> Callable[[F], F]:
    """The ``decorators`` as one, applied so that ``--help`` lists them in order."""

    def decorate(command: F) -> F:
        for option in reversed(decorators):
            command = option(command)
        return command

    return decorate


_REDIS_URL = variable_option(
    "--redis-url",
    variable="STEPBARRIER_REDIS_URL",
    metavar="URL",
    help=f"Redis URL, e.g. redis://host:6379/0 (default {DEFAULT_REDIS_URL}); "
    "keep the password out of it (ps shows it): use --password-file.",
)
_CREDENTIALS = (
    variable_option(
        "--username", variable="STEPBARRIER_REDIS_USERNAME", metavar="USER", help="Redis ACL user."
    ),
    variable_option(
        "--password-file",
        variable="STEPBARRIER_REDIS_PASSWORD_FILE",
        metavar="PATH",
        help="File holding the Redis password, a regular file of at most "
        f"{MAX_PASSWORD_FILE} bytes (never pass a password on the command line; "
        "STEPBARRIER_REDIS_PASSWORD works too).",
    ),
    variable_option(
        "--cluster",
        variable="STEPBARRIER_REDIS_CLUSTER",
        is_flag=True,
        flag_value="1",
        default=None,
        help="Redis is a Redis Cluster; --redis-url names one of its nodes.",
    ),
)
_JOB = variable_option("--job", variable="STEPBARRIER_JOB", metavar="NAME", help="Job name.")

connection_options = _options(_REDIS_URL, _JOB, *_CREDENTIALS)
"""The options every command that talks to the job's Redis takes."""
server_options = _options(_REDIS_URL, *_CREDENTIALS)  # a command about every job of a Redis


def stall_timeout_option(help: str) -> Callable[[F], F]:
    return variable_option(
        "--stall-timeout", variable="STEPBARRIER_STALL_TIMEOUT", type=Duration(), help=help
    )


def wait_options(stall: str, task_id: str) -> Callable[[F], F]:
    """The options of the commands that wait; ``stall``: what they wait for."""
    return _options(
        variable_option(
            "--timeout",
            variable="STEPBARRIER_TIMEOUT",
            type=Duration(),
            help=f"Give up (exit {EXIT_TIMEOUT}) after this long ({DURATION_EXAMPLES}); no "
            "limit by default.",
        ),
        stall_timeout_option(
            f"Give up (exit {EXIT_TIMEOUT}) after this long without {stall} "
            f"(default {DEFAULT_STALL_TIMEOUT:g} s)."
        ),
        variable_option(
            "--task-id",
            variable="STEPBARRIER_TASK_ID",
            type=click.IntRange(0),
            metavar="ID",
            help=task_id,
        ),
    )


def reporting(command: F, *, quiet_level: int = logging.CRITICAL) -> F:
    """Adds ``--debug``/``--verbose`` and turns errors into one line and an exit code
    (``quiet_level``: ``command_logging``)."""

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


verbosity_options = _options(
    click.option(
        "--debug",
        is_flag=True,
        expose_value=False,
        callback=_flag,
        help="Log everything and print tracebacks.",
    ),
    click.option(
        "--verbose",
        "-v",
        is_flag=True,
        expose_value=False,
        callback=_flag,
        help="Log what the barrier does (INFO lines on stderr).",
    ),
)
"""``--debug`` and ``--verbose``: on each command, and on the group before it
(``stepbarrier --debug status`` is ``stepbarrier status --debug``)."""


def command(
    *codes: int | tuple[int, str],
    options: Callable[[F], F] | None = connection_options,
    group: click.Group | None = None,
    long_running: bool = False,
    redis_errors: bool = True,
    epilog: str = "",
) -> Callable[[Callable[..., Any]], click.Command]:
    """A ``stepbarrier`` command: ``options`` before its own, ``reporting``'s after
    them, and an epilog listing ``codes`` (``exit_codes``), then ``epilog``.

    ``long_running`` shows the library's warnings without ``--verbose`` too: for a
    command that may run long (``wait``, ``arrive``, ``exporter``), a lost
    connection or a stalled chief is news while it runs, not only in the last line.
    """

    def decorate(function: Callable[..., Any]) -> click.Command:
        # reporting's options go last in --help, the command's own before them
        own = function.__dict__.pop("__click_params__", [])
        quiet_level = logging.WARNING if long_running else logging.CRITICAL
        run: Any = reporting(function, quiet_level=quiet_level)
        run.__click_params__.extend(own)
        if options is not None:
            run = options(run)
        make = click.command if group is None else group.command
        redis = redis_errors and options is not None
        return make(epilog=exit_codes(*codes, redis=redis) + epilog)(run)

    return decorate


def fail(exc: BaseException, session: _Session) -> None:
    """Print ``exc`` as one masked line (plus the traceback under --debug) and exit."""
    code = exit_code_for(exc)
    message = " ".join(str(exc).split()) or type(exc).__name__
    variable = exc.variable if isinstance(exc, ConfigurationError) else None
    context = click.get_current_context(silent=True)
    for param in context.command.params if context and variable else ():
        if isinstance(param, _VariableOption) and param.variable == variable:
            message += f" (option {param.opts[0]})"  # the option that set the variable
    if code == EXIT_FAILED:
        message = f"unexpected {type(exc).__name__}: {message} (run with --debug for details)"
    if session.debug:
        trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        click.echo(mask_secrets(trace, session.secrets), err=True, nl=False)
    click.echo(f"Error: {mask_secrets(message, session.secrets)}", err=True)
    sys.exit(code)
