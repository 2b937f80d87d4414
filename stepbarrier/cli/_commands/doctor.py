"""``stepbarrier doctor``: check the settings against the Redis, and say what to fix.

Nothing is written and the library is never loaded: permissions are tried with
``ACL DRYRUN`` when the user may run it, else by harmless reads. The checks and
their lines are listed in docs/cli.md#doctor.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import click
from redis import exceptions as rex

from stepbarrier._config.defaults import DEFAULT_REDIS_URL
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import read_status
from stepbarrier._protocol.calls import Call, may_write_call, read_call
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.failures import (
    REDIS_ERRORS,
    describe_redis,
    redis_user,
    speaks_plain_redis,
    speaks_tls,
    translate,
)
from stepbarrier._redis.functions import (
    LIBRARY_NAME,
    LIBRARY_VERSION,
    RedisCode,
    function_command,
    function_name,
    loaded_versions,
)
from stepbarrier.cli._context import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    command,
    url_password,
)
from stepbarrier.cli._guidance import config_for_any_job
from stepbarrier.errors import StepBarrierError

PROBE_SECONDS = 3.0
"""Seconds each network probe (connect, TLS handshake, reply) may take."""
MIN_REDIS = (7, 0)
"""The oldest Redis with Functions (without STEPBARRIER_USE_EVAL=1)."""
PASS, FAIL, INFO = "ok", "FAIL", "note"
FIXES = {
    "authentication": "set the user (--username, STEPBARRIER_REDIS_USERNAME) and the "
    "password (--password-file, STEPBARRIER_REDIS_PASSWORD_FILE) that Redis knows",
    "tls": "check STEPBARRIER_TLS_CA_FILE (and STEPBARRIER_TLS_CERT_FILE/_KEY_FILE if "
    "the server wants client certificates) and the host name in the URL",
}
"""What to fix when connecting failed, by the kind of ``RedisRefused``."""


class _Report:
    failed = False

    def add(self, name: str, outcome: str, detail: str, fix: str = "") -> None:
        self.failed = self.failed or outcome == FAIL
        click.echo(f"{outcome:<4}  {name}: {' '.join(detail.split())}")
        if fix:
            click.echo(f"      fix: {' '.join(fix.split())}")


@command(
    (EXIT_OK, "every check passed"),
    (EXIT_FAILED, "a check failed (each says what to fix)"),
    (EXIT_USAGE, "usage or configuration error (the settings themselves are invalid)"),
    redis_errors=False,  # each check says what it found
)
def doctor() -> None:
    """Check the connection, TLS, authentication, permissions, Redis and the library.

    Tries the settings every command takes; nothing is written.

    \b
    Example:
      stepbarrier doctor --redis-url rediss://redis:6380/0 --username worker \\
          --password-file /run/secrets/worker --job mnist-42
    """
    config, named = config_for_any_job("stepbarrier-doctor")
    report = _Report()
    click.echo(f"stepbarrier doctor: {describe_redis(config)}, job {config.job!r}")
    report.add("run id", INFO, config.describe_run_id())
    report.add("task", INFO, config.describe_task())
    if _network(config, report):
        client = make_client(config, socket_timeout=PROBE_SECONDS)
        try:
            if _authenticate(config, client, report):
                _server(config, client, report)
                outcome, detail, fix = _library(config, client)
                report.add("Functions library", outcome, detail, fix)
                loaded = outcome == PASS or config.use_eval
                if _permissions(config, client, report, loaded=loaded) and named:
                    _stored_run(config, client, report)
        finally:
            client.close()
    click.echo("some checks failed" if report.failed else "every check passed", err=report.failed)
    raise SystemExit(EXIT_FAILED if report.failed else EXIT_OK)


def _network(config: BarrierConfig, report: _Report) -> bool:
    """Name resolution, TCP and TLS on both sides; False if the rest cannot run."""
    parts = urlsplit(config.redis_url)
    if config.sentinels or parts.scheme not in ("redis", "rediss") or not parts.hostname:
        how = "Sentinels" if config.sentinels else "a unix socket"
        report.add("connection", INFO, f"through {how}: checked by connecting below")
        return True
    host, port = parts.hostname, parts.port or 6379
    try:
        socket.create_connection((host, port), timeout=PROBE_SECONDS).close()
    except socket.gaierror as exc:
        report.add(
            "host name",
            FAIL,
            f"{host!r} does not resolve ({exc.strerror})",
            "check the host in STEPBARRIER_REDIS_URL or --redis-url",
        )
        return False
    except OSError as exc:
        default = " (the default URL)" if config.redis_url == DEFAULT_REDIS_URL else ""
        report.add(
            "connection",
            FAIL,
            f"cannot connect to {host}:{port}{default}: {exc.strerror or exc}",
            "start Redis there, or set STEPBARRIER_REDIS_URL or --redis-url to your Redis",
        )
        return False
    report.add("connection", PASS, f"{host}:{port} accepts connections")
    tls, plain = parts.scheme == "rediss", speaks_plain_redis(host, port, PROBE_SECONDS)
    if tls and not plain:
        report.add("TLS", PASS, "the server speaks TLS (its certificate is verified below)")
    elif plain and not tls:
        detail = "not used: plain Redis (redis://); the password crosses the network in clear"
        report.add("TLS", INFO, detail)
    elif tls:
        detail = "the URL asks for TLS (rediss://) but the server answers plain Redis on that port"
        fix = "use redis:// in the URL, or enable TLS on the server (tls-port)"
        report.add("TLS", FAIL, detail, fix)
    elif speaks_tls(host, port, PROBE_SECONDS):
        detail = "the URL asks for plain Redis (redis://) but the server speaks only TLS on that "
        detail += "port"
        fix = "use rediss:// and set STEPBARRIER_TLS_CA_FILE to the CA that signed its certificate"
        report.add("TLS", FAIL, detail, fix)
    else:
        detail = "the server answers neither plain Redis nor TLS"
        report.add("TLS", FAIL, detail, "check that the port is Redis's")
    return not report.failed


def _authenticate(config: BarrierConfig, client: RedisClient, report: _Report) -> bool:
    try:
        client.ping()
    except rex.NoPermissionError:
        pass  # authenticated: only PING itself is not among the user's commands
    except (*REDIS_ERRORS, OSError) as exc:
        error = translate(exc, config, action="connect")
        kind = getattr(error, "kind", "")
        name = {"authentication": "authentication", "tls": "TLS"}.get(kind, "connection")
        report.add(name, FAIL, str(error), FIXES.get(kind, "see the message"))
        return False
    secret = config.redis_password or url_password(config.redis_url)
    how = "with a password" if secret else "no password"
    report.add("authentication", PASS, f"connected as user {redis_user(config)!r} ({how})")
    return True


def _server(config: BarrierConfig, client: RedisClient, report: _Report) -> None:
    version = _redis_version(client)
    numbers = tuple(int(part) for part in (version or "").split(".")[:2] if part.isdigit())
    if version is None:
        report.add("Redis version", INFO, "not known: this user may run neither HELLO nor INFO")
    elif config.use_eval or numbers >= MIN_REDIS:
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
    """From ``HELLO`` (which a user may run without +info), else ``INFO server``."""
    for ask in ("HELLO",), ("INFO", "server"):
        try:
            reply: Any = client.execute_command(*ask)  # type: ignore[no-untyped-call]
        except (*REDIS_ERRORS, OSError):
            continue
        if isinstance(reply, list):
            reply = dict(zip(reply[0::2], reply[1::2], strict=False))
        if isinstance(reply, dict):
            raw = reply.get(b"version", reply.get("version", reply.get("redis_version")))
            if raw is not None:
                return raw.decode() if isinstance(raw, bytes) else str(raw)
    return None


def _library(config: BarrierConfig, client: RedisClient) -> tuple[str, str, str]:
    """The library's outcome, what was found and what to do (``""``: nothing); it is
    never loaded here."""
    if config.use_eval:
        return INFO, "not used: STEPBARRIER_USE_EVAL=1 runs EVAL scripts", ""
    try:
        client.execute_command("FCALL_RO", function_name("version"), 0)  # type: ignore[no-untyped-call]
    except rex.NoPermissionError:
        return (
            FAIL,
            f"this user may not call {LIBRARY_NAME} (no +fcall_ro)",
            "give the user its role's rules: `stepbarrier acl ROLE --user NAME --jobs PATTERN`",
        )
    except rex.ResponseError as exc:
        if "unknown command" in str(exc).lower():
            return (
                FAIL,
                "this Redis has no Functions (FCALL_RO is unknown)",
                "use Redis 7 or later, or set STEPBARRIER_USE_EVAL=1",
            )
    except (*REDIS_ERRORS, OSError) as exc:
        return FAIL, str(translate(exc, config, action="call the library")), ""
    else:
        return PASS, f"{LIBRARY_NAME} is loaded and answers", ""
    versions = loaded_versions(client)  # any other error: the library is not loaded
    found = (
        "cannot list the libraries (no FUNCTION LIST)"
        if versions is None
        else "only version(s) " + ", ".join(map(str, versions)) + " loaded"
        if versions
        else "no stepbarrier library is loaded"
    )
    missing = f"{LIBRARY_NAME} is not loaded: {found}; this stepbarrier needs version "
    missing += str(LIBRARY_VERSION)
    if _dry_run(config, client, ("FUNCTION", "LOAD", "#!lua name=x\n")) == "OK":
        loads = ". This user may load it (FUNCTION LOAD), and does at its first call"
        return INFO, missing + loads, ""
    return (
        FAIL,
        missing,
        "run `stepbarrier functions install` as an administrator (the installer user of "
        "ops/redis/users.acl); a user with FUNCTION LOAD also loads it at its first call",
    )


def _permissions(
    config: BarrierConfig, client: RedisClient, report: _Report, *, loaded: bool
) -> bool:
    """Try what the role needs; True if the job's state could be read."""
    role, keys = config.role or "worker", config.keys

    def code(call: Call) -> Callable[[], object]:
        if config.use_eval:
            return lambda: RedisCode(client, config).call(*call)
        # FCALL itself, not RedisCode: a missing library must not be loaded here
        return lambda: client.execute_command(*function_command(*call))  # type: ignore[no-untyped-call]

    read_state = "read the job's state (every role)"
    trials: dict[str, tuple[bool, Callable[[], object]]] = {
        read_state: (True, code(read_call(keys.state, keys.reset))),
        "list the waiters (status, watch: chief, monitor)": (
            False,
            lambda: client.zrangebyscore(keys.targets, "-inf", "+inf", start=0, num=1),
        ),
        "write the job's state (publish: the chief)": (
            role == "chief",
            code(may_write_call(keys.state)),
        ),
        "SCAN for jobs (jobs, exporter, names in messages: monitor)": (
            False,
            lambda: client.scan(cursor=0, match=keys.state, count=1),
        ),
    }
    if not loaded:
        report.add("permission", INFO, "the library's calls not tried: it does not answer")
        trials = {what: trial for what, trial in trials.items() if "state" not in what}
    state_read = False
    for what, (needed, trial) in trials.items():
        outcome = FAIL if needed else INFO
        try:
            trial()
        except rex.NoPermissionError as exc:
            fix = (
                f"give the user the {role} role's rules: `stepbarrier acl {role} --user NAME "
                "--jobs PATTERN` (ops/redis/users.acl)"
            )
            why = " ".join(str(exc).split())[:160]
            report.add("permission", outcome, f"may not {what}: {why}", fix if needed else "")
        except (StepBarrierError, *REDIS_ERRORS, OSError) as exc:
            if needed or not isinstance(exc, StepBarrierError):
                report.add(
                    "permission", outcome, f"cannot {what}: {translate(exc, config, action=what)}"
                )
        else:
            report.add("permission", PASS, f"may {what}")
            state_read = state_read or what == read_state
    answer = _dry_run(config, client, function_command("publish_step", [keys.state], []))
    if answer is not None:  # else no ACL DRYRUN for this user (or Redis < 7): the reads tell
        may = "may" if answer == "OK" else "may not"
        why = "" if answer == "OK" else f" ({answer[:120]})"
        detail = f"ACL DRYRUN: user {redis_user(config)!r} {may} publish the step{why}"
        report.add("permission", INFO, detail)
    return state_read


def _stored_run(config: BarrierConfig, client: RedisClient, report: _Report) -> None:
    """Whether the job's stored state is the run these settings give: a worker
    trusts only its own run's chief, so a run id that differs from the live
    chief's (e.g. a Slurm chief and workers in two Slurm jobs) holds it for good."""
    try:
        status = read_status(config, client, waiters=False, barriers=False)
    except (StepBarrierError, *REDIS_ERRORS, OSError):
        return  # the permission lines above already said what went wrong
    stored = status.run_id or "none"
    if status.generation is None:
        report.add("run id", INFO, "no chief has written the job's state yet")
    elif status.run_id == config.run_id:
        report.add("run id", PASS, f"the job's state is this run's (run id {stored})")
    else:
        age = status.heartbeat_age
        heard = "never" if age is None else f"{age:.1f} s ago"
        report.add(
            "run id",
            INFO,
            f"the job's state belongs to run {stored} (its chief's last write {heard}), not to "
            f"this run ({config.run_id or 'none'}): a worker with these settings ignores it "
            "and waits for its own run's chief",
            "if they are one run, give every host of it the same run id (the same launcher "
            "variable, or STEPBARRIER_RUN_ID; set empty: none); see docs/configuration.md#run-id",
        )


def _dry_run(config: BarrierConfig, client: RedisClient, command: Sequence[object]) -> str | None:
    """``ACL DRYRUN``'s answer for this user running ``command`` (``"OK"``: it may);
    ``None`` if this user may not ask."""
    try:
        answer: Any = client.execute_command("ACL", "DRYRUN", redis_user(config), *command)  # type: ignore[no-untyped-call]
    except (*REDIS_ERRORS, OSError):
        return None
    return answer.decode() if isinstance(answer, bytes) else str(answer)
