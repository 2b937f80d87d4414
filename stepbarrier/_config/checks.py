"""The checks a setting must pass, shared by ``BarrierConfig`` and the environment reader.

Each check raises ``ConfigurationError`` naming the setting (or the variable it
came from) and what was expected; none repeats a password.
"""

from __future__ import annotations

import math
import re
from urllib.parse import SplitResult, parse_qsl, unquote_plus, urlsplit

from stepbarrier._protocol.wire import NAME, RUN_ID
from stepbarrier.errors import ConfigurationError

JOB_NAME = NAME
MAX_JOB_NAME = 64
"""The longest job name (docs/configuration.md): a longer one is refused before it is parsed."""
TLS_INSECURE = "STEPBARRIER_TLS_INSECURE"
"""The variable that lets a ``rediss://`` URL weaken TLS verification (tests only)."""
_SCHEMES = ("redis", "rediss", "unix")
# a database number below 100000, in ASCII digits: isdigit() also takes '²', which
# int() refuses, and int() takes no more than 4300 digits
_DATABASE = re.compile(r"0*[0-9]{1,5}")
_MAX_QUERY_FIELDS = 16
# Redis's CLIENT SETNAME takes '!' to '~' (no spaces); the length is stepbarrier's limit
_CLIENT_NAME = re.compile(r"[!-~]{1,128}")

# redis-py reads these words for True and False (redis.connection.to_bool, any case);
# any other word would silently be True there, so it is refused here
_TRUE_WORDS = ("1", "t", "true", "y", "yes")
_FALSE_WORDS = ("0", "f", "false", "n", "no")
_CERT_REQS = ("required", "optional", "none")

# Query arguments redis-py's from_url would pass to the connection, which
# stepbarrier sets itself or does not take; any other name is unknown. Only
# client_name, ssl_cert_reqs and ssl_check_hostname (rediss://), db (unix://) are taken.
_CA_ARGUMENTS = ("ssl_ca_certs", "ssl_ca_path", "ssl_ca_data")
_CLIENT_CERT_ARGUMENTS = ("ssl_certfile", "ssl_keyfile", "ssl_password")
_CREDENTIAL_ARGUMENTS = ("username", "password")
_SECRET_ARGUMENTS = ("password", "ssl_password")
_CONNECTION_ARGUMENTS = (
    "socket_timeout",
    "socket_connect_timeout",
    "socket_keepalive",
    "socket_keepalive_options",
    "socket_read_size",
    "socket_type",
    "retry",
    "retry_on_timeout",
    "retry_on_error",
    "health_check_interval",
    "max_connections",
    "timeout",
    "decode_responses",
    "encoding",
    "encoding_errors",
    "protocol",
    "legacy_responses",
    "lib_name",
    "lib_version",
    "single_connection_client",
    "connection_class",
    "credential_provider",
    "host",
    "port",
    "path",
)


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``.

    Works on malformed URLs too (a password may hold ``?``, ``#`` or ``@``, which
    confuse URL parsers): everything between ``scheme://user:`` and the last
    ``@`` is masked, and so is the value of a ``password`` (or ``ssl_password``)
    query argument. Linear in the length of ``url``.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if at:
        user, colon, _secret = userinfo.partition(":")
        # a lone userinfo is the password (as redis-cli reads it): masked whole
        rest = f"{user}:***@{host}" if colon else f"***@{host}"
    return f"{scheme}{sep}{_mask_query(rest)}"


def lone_userinfo_as_password(url: str) -> str:
    """``url`` with a lone userinfo moved to the password's place, as redis-cli reads it.

    ``redis://SECRET@host:6379/0`` is the password ``SECRET`` for ``redis-cli -u``;
    redis-py would send it as a user name with no password. It becomes
    ``redis://:SECRET@host:6379/0``; any other URL is returned as it is.

    Examples:
        >>> lone_userinfo_as_password("redis://s3cret@redis:6379/0")
        'redis://:s3cret@redis:6379/0'
        >>> lone_userinfo_as_password("redis://alice:s3cret@redis:6379/0")
        'redis://alice:s3cret@redis:6379/0'
    """
    scheme, sep, rest = url.partition("://")
    netloc_end = min(
        (i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest)
    )
    netloc = rest[:netloc_end]
    userinfo, at, host = netloc.rpartition("@")
    if not sep or not at or not userinfo or ":" in userinfo:
        return url
    return f"{scheme}{sep}:{userinfo}@{host}{rest[netloc_end:]}"


def _mask_query(text: str) -> str:
    # a password given as a query argument (refused by check_url, but shown
    # in its other messages) is masked as well
    head, mark, query = text.partition("?")
    if not mark:
        return text
    query, hash_mark, fragment = query.partition("#")
    fields = query.split("&")
    for index, item in enumerate(fields):
        name, equals, _value = item.partition("=")
        if equals and unquote_plus(name).lower() in _SECRET_ARGUMENTS:
            fields[index] = f"{name}=***"
    return f"{head}?{'&'.join(fields)}{hash_mark}{fragment}"


def validate_job(job: str, *, variable: str = "STEPBARRIER_JOB") -> str:
    """Return ``job`` if it is a valid job name, else raise ``ConfigurationError``.

    A job name becomes part of Redis key names, so only letters, digits, ``.``,
    ``_`` and ``-`` are allowed (no glob characters, no braces, no spaces).
    """
    expected = (
        f"{variable} must be 1 to {MAX_JOB_NAME} characters from letters, digits, '.', '_' and '-'"
    )
    if isinstance(job, str) and len(job) > MAX_JOB_NAME:
        # refused on its length alone, and shown cut short: a name of any size costs no more
        raise ConfigurationError(
            f"{expected}, got {len(job)} characters ({job[:40]!r}...)", variable=variable
        )
    if not isinstance(job, str) or JOB_NAME.fullmatch(job) is None:
        shown = repr(job[:80]) if isinstance(job, str) else repr(job)[:80]
        raise ConfigurationError(f"{expected}, got {shown}", variable=variable)
    return job


def validate_run_id(run_id: str, *, variable: str = "STEPBARRIER_RUN_ID") -> str:
    """Return ``run_id`` if it is a valid run id, else raise ``ConfigurationError``."""
    if not isinstance(run_id, str) or RUN_ID.fullmatch(run_id) is None:
        raise ConfigurationError(
            f"{variable} must be 1 to 64 characters from letters, digits, '.', '_' "
            f"and '-', got {str(run_id)[:80]!r}",
            variable=variable,
        )
    return run_id


def check_url(url: str, variable: str, *, tls_insecure: bool = False) -> None:
    """Raise ``ConfigurationError`` unless ``url`` is a usable Redis URL.

    A ``redis://`` or ``rediss://`` URL needs a host, a port (if any) from 1 to
    65535 and, as its path, a database number; a ``unix://`` URL a socket path.
    The message shows the URL with its password masked.

    Its query may hold only ``client_name``; ``ssl_cert_reqs=required`` and
    ``ssl_check_hostname=true`` (on ``rediss://``; the defaults); and ``db=N``
    (on ``unix://``, which has no path for it). A query argument that would
    weaken TLS (``ssl_cert_reqs`` other than ``required``,
    ``ssl_check_hostname=false``) is refused unless ``tls_insecure``
    (``STEPBARRIER_TLS_INSECURE=1``); one that would replace stepbarrier's
    TLS, timeout or retry settings, credentials, or any unknown or malformed
    one is always refused, naming the argument (never its value if it may be
    a secret).
    """
    # a control character (a newline from a file or a shell) is shown escaped:
    # the error stays one line, and says where the URL went wrong
    masked = _visible(mask_url(url)) if isinstance(url, str) else repr(url)
    try:
        parts = urlsplit(url)
        port = parts.port
    except (ValueError, TypeError, AttributeError):
        raise ConfigurationError(
            f"{variable} must be a redis://, rediss:// or unix:// URL, got {masked}",
            variable=variable,
        ) from None
    stray_at = "@" in url.partition("://")[2] and "@" not in parts.netloc
    if stray_at or "@" in parts.query or parts.fragment:
        raise ConfigurationError(
            f"{variable} is not a valid URL ({masked}): percent-encode special characters "
            "such as '#', '?', '/' and '@' in the password, or set "
            "STEPBARRIER_REDIS_PASSWORD(_FILE) instead",
            variable=variable,
        )
    if parts.scheme not in _SCHEMES or not url.startswith(f"{parts.scheme}://"):
        # in lower case: redis-py takes no other (urlsplit lowers the scheme)
        raise ConfigurationError(
            f"{variable} must start with redis://, rediss:// or unix:// (in lower case), "
            f"got {masked}",
            variable=variable,
        )
    if parts.scheme == "unix":
        if not parts.path:
            raise ConfigurationError(
                f"{variable}: a unix:// URL needs a socket path, got {masked}",
                variable=variable,
            )
        _check_query(parts, variable, tls_insecure=tls_insecure)
        return
    if not parts.hostname:
        raise ConfigurationError(
            f"{variable} needs a host, e.g. redis://localhost:6379/0, got {masked}",
            variable=variable,
        )
    _check_host(parts.hostname, variable, masked)
    if port is not None and not 0 < port < 65536:
        raise ConfigurationError(
            f"{variable}: port must be 1-65535, got {masked}", variable=variable
        )
    path = parts.path.lstrip("/")
    if path and _DATABASE.fullmatch(path) is None:
        raise ConfigurationError(
            f"{variable}: the path must be a database number such as /0, got {masked}",
            variable=variable,
        )
    _check_query(parts, variable, tls_insecure=tls_insecure)


def url_username(url: str) -> str | None:
    """The ACL user ``url`` logs in as (``None``: the default user), as percent-encoded
    in the URL; a lone userinfo is the password, never a user name.

    Examples:
        >>> url_username("redis://worker:s3cret@redis:6379/0")
        'worker'
        >>> url_username("redis://s3cret@redis:6379/0") is None
        True
    """
    try:
        return urlsplit(lone_userinfo_as_password(url)).username or None
    except ValueError:
        return None


def _check_host(host: str, variable: str, masked: str) -> None:
    # a name the resolver cannot take (a label over 63 characters, a name over
    # 253, a character IDNA refuses) would fail at the first connect, inside
    # the socket module, as a UnicodeError
    if ":" in host:  # an IPv6 address in brackets: urlsplit checked it
        return
    try:
        encoded = host.encode("idna")
    except UnicodeError:
        encoded = b""
    labels = encoded.rstrip(b".").split(b".")
    if not encoded or len(encoded) > 253 or not all(0 < len(label) < 64 for label in labels):
        raise ConfigurationError(
            f"{variable}: the host must be a DNS name (labels of 1 to 63 characters, "
            f"253 in all) or an IP address, got {masked[:200]}",
            variable=variable,
        )


def _visible(text: str) -> str:
    """``text`` with each character that is not printable escaped (``\\n``, ``\\x00``)."""
    return "".join(char if char.isprintable() else repr(char)[1:-1] for char in text)


def url_tls_weakening(url: str) -> dict[str, str | bool]:
    """The TLS settings by which the query of ``url`` weakens verification, as
    redis-py's options: ``ssl_cert_reqs`` other than ``"required"`` and
    ``ssl_check_hostname=False``; ``{}`` when it weakens nothing.

    Only meaningful for a URL that ``check_url`` accepted.
    """
    weakened: dict[str, str | bool] = {}
    if not url.startswith("rediss://"):
        return weakened
    for name, value in _query_pairs(urlsplit(url).query):
        if name == "ssl_cert_reqs" and value != "required":
            weakened[name] = value
        elif name == "ssl_check_hostname" and value.lower() in _FALSE_WORDS:
            weakened[name] = False
    return weakened


def _query_pairs(query: str) -> list[tuple[str, str]]:
    # as redis-py's parse_url reads them (parse_qs percent-decodes names and
    # values), but keeping blank values and refusing stray '&' or a missing '='
    if not query:
        return []
    return parse_qsl(
        query, keep_blank_values=True, strict_parsing=True, max_num_fields=_MAX_QUERY_FIELDS
    )


def _check_query(parts: SplitResult, variable: str, *, tls_insecure: bool) -> None:
    try:
        pairs = _query_pairs(parts.query)
    except ValueError:
        raise ConfigurationError(
            f"{variable}: the query of the URL (after '?') is malformed: it must be at most "
            f"{_MAX_QUERY_FIELDS} name=value pairs joined by '&', e.g. "
            "rediss://redis:6380/0?ssl_cert_reqs=required",
            variable=variable,
        ) from None
    seen: set[str] = set()
    for name, value in pairs:
        if name in seen:
            raise ConfigurationError(
                f"{variable}: the query argument {name[:40]!r} is given twice; give it once",
                variable=variable,
            )
        seen.add(name)
        _check_argument(name, value, parts.scheme, variable, tls_insecure=tls_insecure)


def _check_argument(
    name: str, value: str, scheme: str, variable: str, *, tls_insecure: bool
) -> None:
    shown = repr(name[:40])

    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(
            f"{variable}: the query argument {shown} {why}", variable=variable
        )

    if name == "db":
        if scheme != "unix":
            raise refuse(
                "is not taken: give the database as the URL's path, e.g. redis://redis:6379/3"
            )
        if _DATABASE.fullmatch(value) is None:
            raise refuse(f"must be a database number such as db=0, got {value[:20]!r}")
        return
    if name == "client_name":  # names the connections in CLIENT LIST: harmless
        if _CLIENT_NAME.fullmatch(value) is None:
            raise refuse(
                "must be 1 to 128 characters from '!' to '~' (no spaces), as Redis's "
                f"CLIENT SETNAME takes them, got {value[:40]!r}"
            )
        return
    if name in ("ssl_cert_reqs", "ssl_check_hostname") and scheme != "rediss":
        raise refuse(f"is a TLS setting, but the URL is {scheme}://; use rediss:// for TLS")
    if name == "ssl_cert_reqs":
        if value not in _CERT_REQS:
            raise refuse(
                "must be 'required' (the default; 'optional' or 'none' only with "
                f"{TLS_INSECURE}=1), got {value[:20]!r}"
            )
        if value != "required" and not tls_insecure:
            raise ConfigurationError(
                f"{variable}: the query argument ssl_cert_reqs={value} switches off the "
                "verification of Redis's TLS certificate, so any server could pose as Redis: "
                "remove it (stepbarrier verifies the certificate; for a private CA set "
                f"STEPBARRIER_TLS_CA_FILE), or set {TLS_INSECURE}=1 to accept an unverified "
                "server knowingly (for tests only)",
                variable=variable,
            )
        return
    if name == "ssl_check_hostname":
        word = value.lower()
        if word not in _TRUE_WORDS and word not in _FALSE_WORDS:
            raise refuse(f"must be true or false, got {value[:20]!r}")
        if word in _FALSE_WORDS and not tls_insecure:
            raise ConfigurationError(
                f"{variable}: the query argument ssl_check_hostname={value} skips the check "
                "that Redis's TLS certificate names the URL's host, so any certificate the CA "
                "signed would do: remove it (the certificate must be valid for the URL's "
                f"host), or set {TLS_INSECURE}=1 to accept that knowingly (for tests only)",
                variable=variable,
            )
        return
    if name in _CA_ARGUMENTS:
        raise refuse(
            "would replace stepbarrier's CA: remove it and name the CA's certificate "
            "file with STEPBARRIER_TLS_CA_FILE"
        )
    if name in _CLIENT_CERT_ARGUMENTS:
        raise refuse(
            "would replace stepbarrier's client certificate: remove it and set "
            "STEPBARRIER_TLS_CERT_FILE and STEPBARRIER_TLS_KEY_FILE (an unencrypted key)"
        )
    if name == "ssl" or name.startswith("ssl_"):
        raise refuse(
            "changes how TLS is negotiated or verified, which stepbarrier does not "
            "support: remove it (rediss:// uses Python's secure defaults; "
            "STEPBARRIER_TLS_CA_FILE and STEPBARRIER_TLS_CERT_FILE set the certificates)"
        )
    if name in _CREDENTIAL_ARGUMENTS:
        raise refuse(
            "is not taken: give the user and the password in the URL's user part, before "
            "'@' and the host (percent-encoded), or set STEPBARRIER_REDIS_USERNAME and "
            "STEPBARRIER_REDIS_PASSWORD_FILE"
        )
    if name in _CONNECTION_ARGUMENTS:
        raise refuse(
            "is a connection setting that stepbarrier chooses itself (timeouts, retries, "
            "replies): remove it from the URL"
        )
    raise refuse(
        "is unknown: remove it (a URL may hold only client_name; ssl_cert_reqs and "
        "ssl_check_hostname on rediss://; db on unix://)"
    )


def check_int(value: object, name: str, *, low: int, high: int) -> None:
    """Raise ``ConfigurationError`` unless ``value`` is an int (no bool) in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ConfigurationError(
            f"{name} must be an integer from {low} to {high}, got {value!r}",
            variable=name,
        )


def check_seconds(value: object, name: str, *, high: float = 1e9) -> None:
    """Raise ``ConfigurationError`` unless ``value`` is a number of seconds in ``(0, high]``."""
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and 0 < value <= high
    )
    if not ok:
        raise ConfigurationError(
            f"{name} must be a number of seconds above 0 and at most {high:g}, got {value!r}",
            variable=name,
        )


_DURATION = re.compile(
    # a number as float() reads one (600, 0.5, 1e3, +5), then an optional unit
    r"\s*(\+?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:e[+-]?[0-9]{1,3})?)\s*(ms|s|sec|m|min|h)?\s*",
    re.IGNORECASE,
)
_DURATION_UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0}
DURATION_EXAMPLES = "seconds, e.g. 600, or with a unit: 90s, 10m, 1h"
"""How a duration is written, for messages and help texts."""


def parse_duration(text: str) -> float | None:
    """Seconds in ``text``: plain seconds (``600``, ``0.5``) or with a unit (``90s``,
    ``10m``, ``1h``, ``250ms``); ``None`` if it is neither (or not finite)."""
    if len(text) > 40:
        return None
    match = _DURATION.fullmatch(text)
    if match is None:
        return None
    value = float(match.group(1)) * _DURATION_UNITS[(match.group(2) or "s").lower()]
    return value if math.isfinite(value) else None
