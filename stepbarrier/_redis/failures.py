"""How a failed Redis call is judged and explained: transient (a retry may cure it:
``is_transient``) or not, and ``translate`` into a clear ``RedisUnavailable`` or
``RedisRefused`` (a BUSY reply, retried like an outage, ends as ``RedisBusy``: Redis is
up, and answers again once the script ends).
"""

from __future__ import annotations

import re
import socket
import ssl
import time
from collections.abc import Callable
from contextvars import ContextVar
from urllib.parse import urlsplit

from redis import exceptions as rex

from stepbarrier._config.checks import url_username
from stepbarrier._config.defaults import DEFAULT_REDIS_URL
from stepbarrier._config.settings import BarrierConfig
from stepbarrier.errors import RedisRefused, RedisUnavailable, RefusalKind, StepBarrierError

REDIS_ERRORS = (rex.RedisError, rex.RedisClusterException)
"""What redis-py raises (its cluster client's own exception is no RedisError)."""


class RedisBusy(RedisUnavailable):
    """Redis answered BUSY after retries: a ``RedisUnavailable``, so code that rides out
    an outage rides this out too."""


def is_transient(exc: BaseException) -> bool:
    """True for failures that a retry may cure."""
    exc = _cause(exc)
    if isinstance(exc, (rex.AskError, rex.SlotNotCoveredError, rex.ClusterError)):
        # a slot on the move (MOVED is an AskError; TRYAGAIN ends as ClusterError
        # "TTL exhausted" once redis-py's own retries ran out), or not yet covered
        return True
    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError)):
        return False
    if isinstance(exc, rex.ConnectionError) and _is_tls_failure(exc):
        return False
    # (a TLS mismatch is not judged here: that takes a probe of the server, too
    # slow for a retry's predicate; ``translate`` names it once a failure is final)
    if (
        UNKNOWN_HOST_IS_FINAL.get()
        and isinstance(exc, (rex.ConnectionError, rex.TimeoutError))
        and unknown_host(exc)
    ):
        return False  # a host name that does not resolve
    if isinstance(exc, (rex.ReadOnlyError, rex.TryAgainError, rex.ClusterDownError)):
        return True  # a failover is in progress; the new master will answer
    if isinstance(exc, rex.ResponseError):
        text = str(exc)
        return text.startswith(("LOADING", "MASTERDOWN", "BUSY", "READONLY"))
    return isinstance(exc, (rex.ConnectionError, rex.TimeoutError, ConnectionError))


def _cause(exc: BaseException) -> BaseException:
    # a cluster client that reached no node folds the last node's error into
    # "Redis Cluster cannot be connected": judge and report that error instead
    if isinstance(exc, rex.RedisClusterException) and isinstance(
        exc.__cause__, (rex.RedisError, OSError)
    ):
        return exc.__cause__
    return exc


def _is_tls_failure(exc: BaseException) -> bool:
    return any(
        isinstance(seen, ssl.SSLError) or "CERTIFICATE_VERIFY_FAILED" in str(seen)
        for seen in _chain(exc)
    )


UNKNOWN_HOST_IS_FINAL: ContextVar[bool] = ContextVar("unknown_host_is_final", default=False)
"""Whether a host name that does not resolve fails at once, not retried: the CLI's
interactive commands set it (a typo should not cost the retries); the library does
not, for a worker may start before its Redis's DNS name exists (a Kubernetes Service)."""
_UNKNOWN_HOST_ERRNOS = frozenset(
    code
    for code in (getattr(socket, "EAI_NONAME", None), getattr(socket, "EAI_NODATA", None))
    if code is not None
)
"""getaddrinfo's answers for a name that does not exist (``EAI_AGAIN``, a DNS
server that did not answer, stays transient)."""
_HANDSHAKE_TIMEOUT = "handshake operation timed out"
_ADDRESS = re.compile(r"(?:connecting to|reading from|writing to) ([^\s:]+):(\d+)")
_PLAIN_RESET = re.compile(r"Error while reading from (\S+):(\d+) : \(104,")
_TLS_PROBE_SECONDS = 1.0
_TLS_PROBES: dict[tuple[str, str, int], tuple[float, bool]] = {}
"""(probe, host, port) -> (when probed, its answer): one probe of each kind per
address every ``_TLS_PROBE_CACHE`` seconds."""
_TLS_PROBE_CACHE = 30.0


def _chain(exc: BaseException) -> list[BaseException]:
    found: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(found) < 6:
        found.append(seen)
        seen = seen.__cause__ or seen.__context__
    return found


def unknown_host(exc: BaseException) -> bool:
    """True if ``exc`` comes from a host name that does not resolve (not a DNS outage)."""
    return any(
        isinstance(seen, socket.gaierror) and seen.errno in _UNKNOWN_HOST_ERRNOS
        for seen in _chain(exc)
    )


def tls_mismatch(
    exc: BaseException, address: tuple[str, int] | None = None, *, tls: bool | None = None
) -> str | None:
    """``"tls-to-plain"`` or ``"plain-to-tls"`` if ``exc`` shows TLS on one side only
    (``tls``: whether the client spoke it; ``None``: judge both ways).

    A TLS client at a plain server sees its handshake time out; a plain client at a
    TLS-only server is reset as soon as it speaks, like one of a server going down, so
    the address is probed (blocking: only ``translate`` calls this, once a failure is
    final) and only a server that answers the probe counts. A TLS client reset by a TLS
    server is no mismatch: that reset (a load balancer, a buffer limit) stays a retry.
    """
    chain = _chain(exc)
    if tls is not False and any(_HANDSHAKE_TIMEOUT in str(seen) for seen in chain):
        # a TLS server that is paused or overloaded times the handshake out too:
        # only a server that answers a plain PING is plain Redis
        named = next((m for seen in chain if (m := _ADDRESS.search(str(seen)))), None)
        address = (named.group(1), int(named.group(2))) if named else address
        if address is not None and _probed(address, speaks_plain_redis):
            return "tls-to-plain"
        return None
    match = _PLAIN_RESET.search(str(exc))
    if tls is True or match is None or not isinstance(exc, rex.ConnectionError):
        return None
    address = (match.group(1), int(match.group(2)))
    return "plain-to-tls" if _probed(address, speaks_tls) else None


def _probed(address: tuple[str, int], probe: Callable[[str, int], bool]) -> bool:
    """``probe``'s answer for ``address``, asked at most once per ``_TLS_PROBE_CACHE`` s."""
    key = (probe.__name__, *address)
    now = time.monotonic()
    probed = _TLS_PROBES.get(key)
    if probed is None or now - probed[0] > _TLS_PROBE_CACHE:
        probed = (now, probe(*address))
        _TLS_PROBES[key] = probed
    return probed[1]


def speaks_plain_redis(host: str, port: int, timeout: float = _TLS_PROBE_SECONDS) -> bool:
    """True if a plain-text ``PING`` gets a Redis reply (not nothing, nor a reset)."""
    try:
        with socket.create_connection((host, port), timeout=timeout) as raw:
            raw.sendall(b"PING\r\n")
            answer = raw.recv(64)
    except OSError:
        return False
    # +PONG, or -NOAUTH / -ERR from a server that wants a password first
    return answer[:1] in (b"+", b"-")


def speaks_tls(host: str, port: int, timeout: float = _TLS_PROBE_SECONDS) -> bool:
    """True if a TLS handshake succeeds (nothing else is sent)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # a probe of the protocol only
    try:
        with (
            socket.create_connection((host, port), timeout=timeout) as raw,
            context.wrap_socket(raw, server_hostname=host),
        ):
            return True
    except (OSError, ValueError):
        return False


def translate(
    exc: BaseException, config: BarrierConfig, *, action: str, probe: bool = True
) -> StepBarrierError:
    """The stepbarrier error that explains ``exc`` (a redis-py error) to a user; anything
    else is a bug, not a Redis problem, and becomes a ``StepBarrierError`` saying so."""
    exc = _cause(exc)

    def refused(kind: RefusalKind, message: str) -> RedisRefused:
        return RedisRefused(message, kind=kind, job=config.job)

    where, user = describe_redis(config), redis_user(config)
    detail, text = one_line(exc), str(exc)
    if isinstance(exc, StepBarrierError):
        return exc
    if isinstance(exc, rex.RedisClusterException):
        return refused(
            "response",
            f"{where} cannot be used as a Redis Cluster while trying to {action}: {detail}. "
            "Check that STEPBARRIER_REDIS_URL names a node of a cluster (or unset "
            "STEPBARRIER_REDIS_CLUSTER), and that the user may run CLUSTER SLOTS and COMMAND",
        )
    if not isinstance(exc, (rex.RedisError, OSError)):
        return StepBarrierError(
            f"internal error while trying to {action} on {where}: {type(exc).__name__}: "
            f"{detail} (a bug in stepbarrier or redis-py, not a Redis problem: please report it)",
            job=config.job,
        )
    if isinstance(exc, (rex.AuthenticationError, rex.AuthorizationError)) or (
        isinstance(exc, rex.ResponseError) and text.startswith(("NOAUTH", "WRONGPASS"))
    ):
        sentinels = " (the Sentinels get the same user and password)" if config.sentinels else ""
        asks_for_a_password = text.startswith("NOAUTH") or any(
            phrase in text
            for phrase in (
                "Authentication required",
                "HELLO must be called with the client already",
            )
        )
        if config.redis_password is None and asks_for_a_password:
            return refused(
                "authentication",
                f"{where} requires a password and none was configured (authentication "
                f"needed while trying to {action}): give it with --password-file PATH or "
                "STEPBARRIER_REDIS_PASSWORD_FILE (or STEPBARRIER_REDIS_PASSWORD), and "
                f"the user with --username or STEPBARRIER_REDIS_USERNAME{sentinels}",
            )
        reason = (
            "wrong password, or no such user, or the user is disabled"
            if "invalid username-password pair" in text
            else detail
        )
        return refused(
            "authentication",
            f"{where} refused authentication as user {user!r} while trying to "
            f"{action}: {reason}. Check STEPBARRIER_REDIS_USERNAME and "
            f"STEPBARRIER_REDIS_PASSWORD(_FILE){sentinels}.",
        )
    # inside a script, Redis words an ACL refusal as "ERR The user executing the
    # script can't run this command or subcommand" (or "... access ... keys")
    in_script = "user executing the script can't" in text
    if isinstance(exc, rex.NoPermissionError) or text.startswith("NOPERM") or in_script:
        return refused(
            "permission",
            f"user {user!r} may not {action} on {where}: {detail}. Its ACL does not "
            "allow this (see ops/redis/users.acl for the roles).",
        )
    if isinstance(exc, rex.ConnectionError) and _is_tls_failure(exc):
        if any("CERTIFICATE_VERIFY_FAILED" in f"{seen!r} {seen}" for seen in _chain(exc)):
            names = (
                "that it names the address the Sentinels announce"
                if config.sentinels
                else "the host name in STEPBARRIER_REDIS_URL"
            )
            hint = (
                "The server's certificate does not verify: check STEPBARRIER_TLS_CA_FILE "
                f"(the CA that signed it) and {names}."
            )
        else:
            hint = (
                "If the server requires client certificates, set STEPBARRIER_TLS_CERT_FILE "
                "and STEPBARRIER_TLS_KEY_FILE; check STEPBARRIER_TLS_CA_FILE too."
            )
        return refused("tls", f"TLS to {where} failed while trying to {action}: {detail}. {hint}")
    if isinstance(exc, (rex.ConnectionError, rex.TimeoutError)) and unknown_host(exc):
        host = (_url_address(config.redis_url) or ("?",))[0]
        message = (
            f"the host name {host!r} is unknown (it does not resolve) while trying to "
            f"{action} on {where}: check the host in STEPBARRIER_REDIS_URL or --redis-url"
        )
        if not UNKNOWN_HOST_IS_FINAL.get():
            return RedisUnavailable(message, job=config.job)  # retried until the deadline
        return refused("response", message)
    mismatch = (
        tls_mismatch(
            exc, _url_address(config.redis_url), tls=config.redis_url.startswith("rediss://")
        )
        if probe and isinstance(exc, (rex.ConnectionError, rex.TimeoutError))
        else None
    )
    if mismatch is not None:
        return refused(
            "tls", f"TLS mismatch with {where} while trying to {action}: {_MISMATCH[mismatch]}"
        )
    if isinstance(exc, rex.ResponseError) and text.partition(" ")[0] == "BUSY":
        # (not BUSYKEY nor BUSYGROUP, other errors alike)
        return RedisBusy(
            f"{where} is busy running a script (BUSY: a function or an EVAL script has run "
            f"longer than busy-reply-threshold, and Redis answers nothing else meanwhile) while "
            f"trying to {action}: {detail}. Redis is up: wait for the script to end, or have an "
            "administrator end it with FUNCTION KILL (SCRIPT KILL for an EVAL script; the "
            "emergency user may), which works while the script has written nothing; "
            "FUNCTION STATS names what runs",
            job=config.job,
        )
    if is_transient(exc):
        hint = ""
        refused_here = "Connection refused" in text or any(
            isinstance(seen, ConnectionRefusedError) for seen in _chain(exc)
        )
        if config.redis_url == DEFAULT_REDIS_URL and not config.sentinels and refused_here:
            hint = (
                f". Nothing listens at {DEFAULT_REDIS_URL}, the default URL: set "
                "STEPBARRIER_REDIS_URL or --redis-url to your Redis"
            )
        return RedisUnavailable(
            f"{where} is unreachable (while trying to {action}): {detail}{hint}", job=config.job
        )
    return refused("response", f"{where} answered with an error while trying to {action}: {detail}")


_MISMATCH = {
    "tls-to-plain": "the URL asks for TLS (rediss://) but the server never completed a TLS "
    "handshake: it serves plain Redis on that port. Use redis:// (or enable TLS on the server)",
    "plain-to-tls": "the URL asks for plain Redis (redis://) but the server speaks only TLS on "
    "that port. Use rediss:// with STEPBARRIER_TLS_CA_FILE",
}
"""What a user is told of each ``tls_mismatch``."""


def describe_redis(config: BarrierConfig) -> str:
    """Where the job's Redis is, for messages: its masked URL, or its Sentinels."""
    if config.redis_cluster:
        return f"Redis Cluster at {config.safe_url}"
    if not config.sentinels:
        return f"Redis at {config.safe_url}"
    nodes = ",".join(f"{host}:{port}" for host, port in config.sentinels)
    return f"Redis master {config.sentinel_service!r} of Sentinels {nodes}"


def redis_user(config: BarrierConfig) -> str:
    """The ACL user the client logs in as."""
    return config.redis_username or url_username(config.redis_url) or "default"


def _url_address(url: str) -> tuple[str, int] | None:
    try:
        parts = urlsplit(url)
        return (parts.hostname, parts.port or 6379) if parts.hostname else None
    except ValueError:
        return None


def one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()).rstrip(".") or type(exc).__name__
    return text[:300]
