"""``stepbarrier doctor``: check the settings against the Redis, and say what to fix.

One command for "why does nothing work": it reaches the server (host name,
port), compares TLS on both sides, authenticates, reads the Redis version and
the Functions library, and tries what the configured role needs (with
``ACL DRYRUN`` when the user may run it, else by harmless reads: the job's
state, the waiters' index, ``may_write`` for a chief, a one-key ``SCAN``).
It also says which run id the settings give and where it came from, and
whether the job's stored state is that run's (a note either way: an earlier
run's state is normal until the new chief writes). Nothing is written. Each
failing check says what to fix; the exit code is 1 if any check failed.
"""

from __future__ import annotations

import os
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import click
from redis import exceptions as rex

from stepbarrier._config.checks import lone_userinfo_as_password, url_username
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import read_status
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.failures import REDIS_ERRORS, describe_redis, translate
from stepbarrier._redis.functions import (
    LIBRARY_NAME,
    LIBRARY_VERSION,
    RedisCode,
    function_name,
    loaded_versions,
)
from stepbarrier.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    connection_options,
    current_session,
    exit_codes,
    reporting,
)
from stepbarrier.errors import StepBarrierError

PROBE_SECONDS = 3.0
"""Seconds each network probe (connect, TLS handshake, reply) may take."""
MIN_REDIS = (7, 0)
"""The oldest Redis with Functions (without STEPBARRIER_USE_EVAL=1)."""
PASS, FAIL, INFO = "ok", "FAIL", "note"


@dataclass(frozen=True)
class Check:
    """One line of the report: ``PASS``, ``FAIL`` or ``INFO``, what was found, what to do."""

    name: str
    outcome: str
    detail: str
    fix: str = ""


class _Report:
    def __init__(self) -> None:
        self.checks: list[Check] = []

    def add(self, name: str, outcome: str, detail: str, fix: str = "") -> None:
        check = Check(name, outcome, " ".join(detail.split()), " ".join(fix.split()))
        self.checks.append(check)
        click.echo(f"{check.outcome:<4}  {check.name}: {check.detail}")
        if check.fix:
            click.echo(f"      fix: {check.fix}")

    @property
    def failed(self) -> bool:
        return any(check.outcome == FAIL for check in self.checks)


@click.command(
    epilog=exit_codes(
        (EXIT_OK, "every check passed"),
        (EXIT_FAILED, "a check failed (each says what to fix)"),
        (EXIT_USAGE, "usage or configuration error (the settings themselves are invalid)"),
    )
)
@connection_options
@reporting
def doctor() -> None:
    """Check the connection, TLS, authentication, permissions, Redis and the library.

    Takes the same settings as every other command and tries them: the host
    name and port, TLS on both sides (a rediss:// URL against a plain server,
    and the reverse), the password, what the role may do (ACL DRYRUN when
    this user may run it, else harmless reads; nothing is written), Redis's
    version and the stepbarrier Functions library. Each failing check says
    what to fix.

    \b
    Example:
      stepbarrier doctor --redis-url rediss://redis:6380/0 --username worker \\
          --password-file /run/secrets/worker --job mnist-42
    """
    session = current_session()
    no_job = "STEPBARRIER_JOB" not in session.overrides and not os.environ.get("STEPBARRIER_JOB")
    if no_job:
        session.overrides["STEPBARRIER_JOB"] = "stepbarrier-doctor"  # only for the key names
    config = session.config()
    report = _Report()
    click.echo(f"stepbarrier doctor: {describe_redis(config)}, job {config.job!r}")
    report.add("run id", INFO, config.describe_run_id())
    report.add("task", INFO, config.describe_task())
    if _network(config, report):
        client = make_client(config, socket_timeout=PROBE_SECONDS)
        try:
            if _authenticate(config, client, report):
                _server(config, client, report)
                loaded = _library(config, client, report)
                if _permissions(config, client, report, loaded=loaded) and not no_job:
                    _stored_run(config, client, report)
        finally:
            client.close()
    click.echo(
        "some checks failed" if report.failed else "every check passed",
        err=report.failed,
    )
    raise SystemExit(EXIT_FAILED if report.failed else EXIT_OK)


def _address(config: BarrierConfig) -> tuple[str, int] | None:
    """Host and port of a direct URL (``None``: Sentinels, unix socket)."""
    if config.sentinels:
        return None
    parts = urlsplit(config.redis_url)
    if parts.scheme not in ("redis", "rediss") or not parts.hostname:
        return None
    return parts.hostname, parts.port or 6379


def _network(config: BarrierConfig, report: _Report) -> bool:
    """Name resolution, the TCP connection and TLS on both sides; False if the rest
    cannot run."""
    address = _address(config)
    if address is None:
        how = "Sentinels" if config.sentinels else "a unix socket"
        report.add("connection", INFO, f"through {how}: checked by connecting below")
        return True
    host, port = address
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        report.add(
            "host name",
            FAIL,
            f"{host!r} does not resolve ({exc.strerror})",
            "check the host in STEPBARRIER_REDIS_URL or --redis-url",
        )
        return False
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except OSError as exc:
        default = "" if os.environ.get("STEPBARRIER_REDIS_URL") else " (the default URL)"
        report.add(
            "connection",
            FAIL,
            f"cannot connect to {host}:{port}{default}: {exc.strerror or exc}",
            "start Redis there, or set STEPBARRIER_REDIS_URL or --redis-url to your Redis",
        )
        return False
    report.add("connection", PASS, f"{host}:{port} accepts connections")
    wants_tls = config.redis_url.startswith("rediss://")
    plain_reply = _plain_reply(host, port)
    speaks_tls = plain_reply is None and _tls_handshake(host, port)
    if wants_tls and plain_reply is not None:
        report.add(
            "TLS",
            FAIL,
            "the URL asks for TLS (rediss://) but the server answers plain Redis on that port",
            "use redis:// in the URL, or enable TLS on the server (tls-port)",
        )
        return False
    if not wants_tls and speaks_tls:
        report.add(
            "TLS",
            FAIL,
            "the URL asks for plain Redis (redis://) but the server speaks only TLS on that port",
            "use rediss:// and set STEPBARRIER_TLS_CA_FILE to the CA that signed its certificate",
        )
        return False
    if wants_tls:
        report.add("TLS", PASS, "the server speaks TLS (its certificate is verified below)")
    else:
        report.add(
            "TLS",
            INFO if plain_reply is not None else FAIL,
            "not used: plain Redis (redis://); the password crosses the network in clear"
            if plain_reply is not None
            else "the server answers neither plain Redis nor TLS",
            "" if plain_reply is not None else "check that the port is Redis's",
        )
        if plain_reply is None:
            return False
    return True


def _plain_reply(host: str, port: int) -> bytes | None:
    """The first bytes a plain-text ``PING`` gets back (``None``: nothing, or a reset)."""
    try:
        with socket.create_connection((host, port), timeout=PROBE_SECONDS) as sock:
            sock.sendall(b"PING\r\n")
            reply = sock.recv(64)
    except OSError:
        return None
    return reply if reply[:1] in (b"+", b"-") else None


def _tls_handshake(host: str, port: int) -> bool:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # a probe of the protocol only
    try:
        with (
            socket.create_connection((host, port), timeout=PROBE_SECONDS) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):
        return False


def _explain(config: BarrierConfig, exc: BaseException, action: str) -> str:
    error = exc if isinstance(exc, StepBarrierError) else translate(exc, config, action=action)
    return " ".join(str(error).split())


def _authenticate(config: BarrierConfig, client: RedisClient, report: _Report) -> bool:
    user = _user(config)
    try:
        client.ping()
    except rex.NoPermissionError:
        pass  # authenticated: only PING itself is not among the user's commands
    except (*REDIS_ERRORS, OSError) as exc:
        text = _explain(config, exc, "connect")
        kind = getattr(translate(exc, config, action="connect"), "kind", "")
        name = {"authentication": "authentication", "tls": "TLS"}.get(kind, "connection")
        report.add(name, FAIL, text, _fix_for(kind))
        return False
    given = config.redis_password or ":" in _userinfo(config)
    how = "with a password" if given else "no password"
    report.add("authentication", PASS, f"connected as user {user!r} ({how})")
    return True


def _userinfo(config: BarrierConfig) -> str:
    # a lone userinfo is the password, as redis-cli and the client read it
    return urlsplit(lone_userinfo_as_password(config.redis_url)).netloc.rpartition("@")[0]


def _user(config: BarrierConfig) -> str:
    """The ACL user the client logs in as."""
    return config.redis_username or url_username(config.redis_url) or "default"


def _fix_for(kind: str) -> str:
    return {
        "authentication": "set the user (--username, STEPBARRIER_REDIS_USERNAME) and the "
        "password (--password-file, STEPBARRIER_REDIS_PASSWORD_FILE) that Redis knows",
        "tls": "check STEPBARRIER_TLS_CA_FILE (and STEPBARRIER_TLS_CERT_FILE/_KEY_FILE if "
        "the server wants client certificates) and the host name in the URL",
    }.get(kind, "see the message")


def _server(config: BarrierConfig, client: RedisClient, report: _Report) -> None:
    version = _redis_version(client)
    if version is None:
        report.add("Redis version", INFO, "not known: this user may run neither HELLO nor INFO")
        return
    numbers = tuple(int(part) for part in version.split(".")[:2] if part.isdigit())
    if config.use_eval or numbers >= MIN_REDIS:
        report.add("Redis version", PASS, f"Redis {version}")
    else:
        report.add(
            "Redis version",
            FAIL,
            f"Redis {version} has no Functions (Redis 7.0 or later needed)",
            "upgrade Redis, or set STEPBARRIER_USE_EVAL=1 (the roles then need +eval "
            "and +evalsha: docs/reliability-security.md)",
        )


def _redis_version(client: RedisClient) -> str | None:
    try:
        hello: Any = client.execute_command("HELLO")  # type: ignore[no-untyped-call]
    except (*REDIS_ERRORS, OSError):
        hello = None
    if isinstance(hello, list):
        hello = dict(zip(hello[0::2], hello[1::2], strict=False))
    if isinstance(hello, dict):
        raw = hello.get(b"version", hello.get("version"))
        if raw is not None:
            return raw.decode() if isinstance(raw, bytes) else str(raw)
    try:
        info: Any = client.info("server")
    except (*REDIS_ERRORS, OSError):
        return None
    raw = info.get("redis_version") if isinstance(info, dict) else None
    return None if raw is None else str(raw)


def _library(config: BarrierConfig, client: RedisClient, report: _Report) -> bool:
    """Check the library (never loading it); True if it is there and answers."""
    if config.use_eval:
        report.add("Functions library", INFO, "not used: STEPBARRIER_USE_EVAL=1 runs EVAL scripts")
        return True
    install = (
        "run `stepbarrier functions install` as an administrator (the installer user of "
        "ops/redis/users.acl); a user with FUNCTION LOAD also loads it at its first call"
    )
    try:
        answer = client.execute_command("FCALL_RO", function_name("version"), 0)  # type: ignore[no-untyped-call]
    except rex.NoPermissionError:
        answer = None
    except rex.ResponseError as exc:
        if "unknown command" in str(exc).lower():
            report.add(
                "Functions library",
                FAIL,
                "this Redis has no Functions (FCALL_RO is unknown)",
                "use Redis 7 or later, or set STEPBARRIER_USE_EVAL=1",
            )
            return False
        versions = loaded_versions(client)
        found = (
            "cannot list the libraries (no FUNCTION LIST)"
            if versions is None
            else "no stepbarrier library is loaded"
            if not versions
            else "only version(s) " + ", ".join(map(str, versions)) + " loaded"
        )
        missing = f"{LIBRARY_NAME} is not loaded: {found}; this stepbarrier needs version "
        if _dry_run_allows(config, client, ["FUNCTION", "LOAD", "#!lua name=x\n"]):
            report.add(
                "Functions library",
                INFO,
                f"{missing}{LIBRARY_VERSION}. This user may load it (FUNCTION LOAD), and "
                "does at its first call",
            )
        else:
            report.add("Functions library", FAIL, f"{missing}{LIBRARY_VERSION}", install)
        return False
    except (*REDIS_ERRORS, OSError) as exc:
        report.add("Functions library", FAIL, _explain(config, exc, "call the library"))
        return False
    if answer is None:
        report.add(
            "Functions library",
            FAIL,
            f"this user may not call {LIBRARY_NAME} (no +fcall_ro)",
            "give the user its role's rules: `stepbarrier acl ROLE --user NAME --jobs PATTERN`",
        )
        return False
    report.add("Functions library", PASS, f"{LIBRARY_NAME} is loaded and answers")
    return True


def _permissions(
    config: BarrierConfig, client: RedisClient, report: _Report, *, loaded: bool
) -> bool:
    """Try what the role needs; True if the job's state could be read."""
    role = config.role or "worker"
    state_read = False
    keys = config.keys

    def code(name: str, *keys: str) -> Callable[[], object]:
        if config.use_eval:
            return lambda: RedisCode(client, config).call(name, list(keys), [])
        command = "FCALL_RO" if name == "waiter_read" else "FCALL"
        # FCALL itself, not RedisCode: a missing library must not be loaded here
        return lambda: client.execute_command(command, function_name(name), len(keys), *keys)  # type: ignore[no-untyped-call]

    trials: list[tuple[str, bool, Callable[[], object]]] = [
        ("read the job's state (every role)", True, code("waiter_read", keys.state, keys.reset)),
        (
            "list the waiters (status, watch: chief, monitor)",
            False,
            lambda: client.zrangebyscore(keys.targets, "-inf", "+inf", start=0, num=1),
        ),
        (
            "write the job's state (publish: the chief)",
            role == "chief",
            code("may_write", keys.state),
        ),
        (
            "SCAN for jobs (jobs, exporter, names in messages: monitor)",
            False,
            lambda: client.scan(cursor=0, match=keys.state, count=1),
        ),
    ]
    if not loaded:
        report.add("permission", INFO, "the library's calls not tried: it does not answer")
        trials = [trial for trial in trials if "state" not in trial[0]]
    for what, needed, trial in trials:
        try:
            trial()
        except rex.NoPermissionError as exc:
            outcome = FAIL if needed else INFO
            fix = (
                f"give the user the {role} role's rules: `stepbarrier acl {role} --user NAME "
                "--jobs PATTERN` (ops/redis/users.acl)"
                if needed
                else ""
            )
            report.add(
                "permission", outcome, f"may not {what}: {' '.join(str(exc).split())[:160]}", fix
            )
            continue
        except StepBarrierError as exc:
            if needed:
                report.add("permission", FAIL, f"cannot {what}: {_explain(config, exc, what)}")
            continue
        except (*REDIS_ERRORS, OSError) as exc:
            text = _explain(config, exc, what)
            report.add("permission", FAIL if needed else INFO, f"cannot {what}: {text}")
            continue
        report.add("permission", PASS, f"may {what}")
        state_read = state_read or what.startswith("read the job's state")
    _dry_run(config, client, report)
    return state_read


def _stored_run(config: BarrierConfig, client: RedisClient, report: _Report) -> None:
    """Whether the job's stored state is the run these settings give: a worker
    trusts only its own run's chief, so a run id that differs from the live
    chief's (e.g. a Slurm chief and workers in two Slurm jobs) holds it for good."""
    try:
        status = read_status(config, client, waiters=False, barriers=False)
    except (StepBarrierError, *REDIS_ERRORS, OSError):
        return  # the permission lines above already said what went wrong
    if status.generation is None:
        report.add("run id", INFO, "no chief has written the job's state yet")
        return
    stored = status.run_id or "none"
    if status.run_id == config.run_id:
        report.add("run id", PASS, f"the job's state is this run's (run id {stored})")
        return
    age = status.heartbeat_age
    heard = "never" if age is None else f"{age:.1f} s ago"
    report.add(
        "run id",
        INFO,
        f"the job's state belongs to run {stored} (its chief's last write {heard}), not to this "
        f"run ({config.run_id or 'none'}): a worker with these settings ignores it and "
        "waits for its own run's chief",
        "if they are one run, give every host of it the same run id (the same launcher "
        "variable, or STEPBARRIER_RUN_ID; set empty: none); see docs/configuration.md#run-id",
    )


def _dry_run_allows(config: BarrierConfig, client: RedisClient, command: list[str]) -> bool:
    """True if ``ACL DRYRUN`` says this user may run ``command`` (False: it may not,
    or this user may not ask)."""
    user = _user(config)
    try:
        answer: Any = client.execute_command("ACL", "DRYRUN", user, *command)  # type: ignore[no-untyped-call]
    except (*REDIS_ERRORS, OSError):
        return False
    return (answer.decode() if isinstance(answer, bytes) else str(answer)) == "OK"


def _dry_run(config: BarrierConfig, client: RedisClient, report: _Report) -> None:
    """``ACL DRYRUN`` of the role's publish as this user, when the user may run it."""
    user = _user(config)
    command = ["FCALL", function_name("publish_step"), "1", config.keys.state]
    try:
        answer: Any = client.execute_command("ACL", "DRYRUN", user, *command)  # type: ignore[no-untyped-call]
    except (*REDIS_ERRORS, OSError):
        return  # no ACL DRYRUN for this user (or Redis < 7): the reads above tell enough
    text = answer.decode() if isinstance(answer, bytes) else str(answer)
    allowed = text == "OK"
    report.add(
        "permission",
        INFO,
        f"ACL DRYRUN: user {user!r} "
        + ("may publish the step" if allowed else f"may not publish the step ({text[:120]})"),
    )
