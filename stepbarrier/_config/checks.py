"""The checks a setting must pass, shared by ``BarrierConfig`` and the environment reader.

Each check raises ``ConfigurationError`` naming the setting (or the variable it
came from) and what was expected; none repeats a password.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, parse_qsl, unquote_plus, urlsplit

from stepbarrier._protocol.wire import MAX_TASK_ID, NAME
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
_TLS_ARGUMENTS = {  # their words, and what a word that weakens TLS does (_weakens)
    "ssl_cert_reqs": (
        ("required", "optional", "none"),
        f"'required' (the default; 'optional' or 'none' only with {TLS_INSECURE}=1)",
        "switches off the verification of Redis's TLS certificate, so any server could pose "
        "as Redis: remove it (stepbarrier verifies the certificate; for a private CA set "
        f"STEPBARRIER_TLS_CA_FILE), or set {TLS_INSECURE}=1 to accept an unverified server "
        "knowingly",
    ),
    "ssl_check_hostname": (
        _TRUE_WORDS + _FALSE_WORDS,
        "true or false",
        "skips the check that Redis's TLS certificate names the URL's host, so any "
        "certificate the CA signed would do: remove it (the certificate must be valid for "
        f"the URL's host), or set {TLS_INSECURE}=1 to accept that knowingly",
    ),
}

# Query arguments redis-py's from_url would pass to the connection that have a
# remedy of their own, and why each is refused (docs/configuration.md#redis-urls);
# any other name (a connection setting such as socket_timeout) is refused as unknown.
_SECRET_ARGUMENTS = ("password", "ssl_password")
_REFUSED_ARGUMENTS = {
    **dict.fromkeys(
        ("ssl_ca_certs", "ssl_ca_path", "ssl_ca_data"),
        "would replace stepbarrier's CA: remove it and name the CA's certificate "
        "file with STEPBARRIER_TLS_CA_FILE",
    ),
    **dict.fromkeys(
        ("ssl_certfile", "ssl_keyfile", "ssl_password"),
        "would replace stepbarrier's client certificate: remove it and set "
        "STEPBARRIER_TLS_CERT_FILE and STEPBARRIER_TLS_KEY_FILE (an unencrypted key)",
    ),
    **dict.fromkeys(
        ("username", "password"),
        "is not taken: give the user and the password in the URL's user part, before "
        "'@' and the host (percent-encoded), or set STEPBARRIER_REDIS_USERNAME and "
        "STEPBARRIER_REDIS_PASSWORD_FILE",
    ),
}


def mask_url(url: str) -> str:
    """Return ``url`` with any password replaced by ``***``, malformed or not (a
    password may hold ``?``, ``#`` or ``@``, which confuse URL parsers): all between
    ``scheme://user:`` and the last ``@``, and a ``password`` (or ``ssl_password``)
    query argument's value. Linear in the length of ``url``."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    userinfo, at, host = rest.rpartition("@")
    if at:
        user, colon, _secret = userinfo.partition(":")
        # a lone userinfo is the password (as redis-cli reads it): masked whole
        rest = f"{user}:***@{host}" if colon else f"***@{host}"
    # a password given as a query argument (refused by check_url, but shown
    # in its other messages) is masked as well
    head, mark, query = rest.partition("?")
    query, hash_mark, fragment = query.partition("#")
    fields = query.split("&")
    for index, item in enumerate(fields):
        name, equals, _value = item.partition("=")
        if equals and unquote_plus(name).lower() in _SECRET_ARGUMENTS:
            fields[index] = f"{name}=***"
    return f"{scheme}{sep}{head}{mark}{'&'.join(fields)}{hash_mark}{fragment}"


def lone_userinfo_as_password(url: str) -> str:
    """``url`` with a lone userinfo moved to the password's place: redis-cli reads
    ``redis://SECRET@host:6379/0`` as the password ``SECRET``, redis-py as a user
    name with none. It becomes ``redis://:SECRET@host:6379/0``; any other URL stays."""
    scheme, sep, rest = url.partition("://")
    netloc_end = min(
        (i for i in (rest.find("/"), rest.find("?"), rest.find("#")) if i >= 0), default=len(rest)
    )
    netloc = rest[:netloc_end]
    userinfo, at, host = netloc.rpartition("@")
    if not sep or not at or not userinfo or ":" in userinfo:
        return url
    return f"{scheme}{sep}:{userinfo}@{host}{rest[netloc_end:]}"


def refused(variable: str, why: str) -> ConfigurationError:
    """The error of ``variable``'s value: ``why``, after the variable's name."""
    return ConfigurationError(f"{variable}: {why}", variable=variable)


def check_url(url: str, variable: str, *, tls_insecure: bool = False) -> None:
    """Raise ``ConfigurationError`` unless ``url`` is a usable Redis URL
    (docs/configuration.md#redis-urls); a query argument that weakens TLS only under
    ``tls_insecure``. The message masks the password, and names a refused query
    argument, never its value if it may be a secret."""

    def refuse(message: str) -> ConfigurationError:
        return ConfigurationError(message, variable=variable)

    # a control character (a newline from a file or a shell) is shown escaped:
    # the error stays one line, and says where the URL went wrong
    masked = repr(url)
    if isinstance(url, str):
        masked = "".join(c if c.isprintable() else repr(c)[1:-1] for c in mask_url(url))
    try:
        parts = urlsplit(url)
        port = parts.port
    except (ValueError, TypeError, AttributeError):
        raise refuse(
            f"{variable} must be a redis://, rediss:// or unix:// URL, got {masked}"
        ) from None
    stray_at = "@" in url.partition("://")[2] and "@" not in parts.netloc
    if stray_at or "@" in parts.query or parts.fragment:
        raise refuse(
            f"{variable} is not a valid URL ({masked}): percent-encode special characters "
            "such as '#', '?', '/' and '@' in the password, or set "
            "STEPBARRIER_REDIS_PASSWORD(_FILE) instead"
        )
    if parts.scheme not in _SCHEMES or not url.startswith(f"{parts.scheme}://"):
        # in lower case: redis-py takes no other (urlsplit lowers the scheme)
        raise refuse(
            f"{variable} must start with redis://, rediss:// or unix:// (in lower case), "
            f"got {masked}"
        )
    if parts.scheme == "unix" and not parts.path:
        raise refused(variable, f"a unix:// URL needs a socket path, got {masked}")
    if parts.scheme != "unix":
        if not parts.hostname:
            raise refuse(f"{variable} needs a host, e.g. redis://localhost:6379/0, got {masked}")
        _check_host(parts.hostname, variable, masked)
        if port is not None and not 0 < port < 65536:
            raise refused(variable, f"port must be 1-65535, got {masked}")
        path = parts.path.lstrip("/")
        if path and _DATABASE.fullmatch(path) is None:
            raise refused(variable, f"the path must be a database number such as /0, got {masked}")
    _check_query(parts, variable, tls_insecure=tls_insecure)


def url_username(url: str) -> str | None:
    """The ACL user ``url`` logs in as (``None``: the default user), as percent-encoded
    in the URL; a lone userinfo is the password, never a user name."""
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
        raise refused(
            variable,
            "the host must be a DNS name (labels of 1 to 63 characters, 253 in all) or an "
            f"IP address, got {masked[:200]}",
        )


def url_tls_weakening(url: str) -> dict[str, str | bool]:
    """The TLS settings by which the query of ``url`` (which ``check_url`` accepted)
    weakens verification, as redis-py's options; ``{}`` when it weakens nothing."""
    if not url.startswith("rediss://"):
        return {}
    return {
        name: value if name == "ssl_cert_reqs" else False
        for name, value in _query_pairs(urlsplit(url).query)
        if _weakens(name, value)
    }


def _weakens(name: str, value: str) -> bool:
    """Whether the (valid) query argument ``name=value`` weakens TLS verification."""
    if name == "ssl_cert_reqs":
        return value != "required"
    return name == "ssl_check_hostname" and value.lower() in _FALSE_WORDS


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
        raise refused(
            variable,
            "the query of the URL (after '?') is malformed: it must be at most "
            f"{_MAX_QUERY_FIELDS} name=value pairs joined by '&', e.g. "
            "rediss://redis:6380/0?ssl_cert_reqs=required",
        ) from None
    seen: set[str] = set()
    for name, value in pairs:
        if name in seen:
            raise refused(
                variable, f"the query argument {name[:40]!r} is given twice; give it once"
            )
        seen.add(name)
        _check_argument(name, value, parts.scheme, variable, tls_insecure=tls_insecure)


def _check_argument(
    name: str, value: str, scheme: str, variable: str, *, tls_insecure: bool
) -> None:
    def refuse(why: str) -> ConfigurationError:
        return refused(variable, f"the query argument {name[:40]!r} {why}")

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
    if name in _TLS_ARGUMENTS:
        if scheme != "rediss":
            raise refuse(f"is a TLS setting, but the URL is {scheme}://; use rediss:// for TLS")
        words, expected, weakening = _TLS_ARGUMENTS[name]
        if (value if name == "ssl_cert_reqs" else value.lower()) not in words:
            raise refuse(f"must be {expected}, got {value[:20]!r}")
        if _weakens(name, value) and not tls_insecure:
            raise refused(
                variable, f"the query argument {name}={value} {weakening} (for tests only)"
            )
        return
    if name in _REFUSED_ARGUMENTS:
        raise refuse(_REFUSED_ARGUMENTS[name])
    if name == "ssl" or name.startswith("ssl_"):
        raise refuse(
            "changes how TLS is negotiated or verified, which stepbarrier does not "
            "support: remove it (rediss:// uses Python's secure defaults; "
            "STEPBARRIER_TLS_CA_FILE and STEPBARRIER_TLS_CERT_FILE set the certificates)"
        )
    raise refuse(
        "is unknown, or a connection setting that stepbarrier chooses itself (timeouts, "
        "retries, replies): remove it (a URL may hold only client_name; ssl_cert_reqs and "
        "ssl_check_hostname on rediss://; db on unix://)"
    )


@dataclass(frozen=True)
class Kind:
    """One kind of setting: ``parse`` reads its variable's text (stripped, not blank),
    ``check`` a value given in code; each returns the value or raises ``ConfigurationError``
    naming ``name``, what was expected and the bad value, cut short (so no secret has one)."""

    expected: str = "text"
    convert: Callable[[str], Any] = str
    """The value a text stands for; ``None`` if it stands for none."""
    valid: Callable[[Any], bool] = lambda value: True

    def parse(self, text: str, name: str) -> Any:
        value = self.convert(text)
        if value is None or not self.valid(value):
            raise self.refuse(name, text)
        return value

    def check(self, value: Any, name: str) -> Any:
        if not self.valid(value):
            raise self.refuse(name, value)
        return value

    def refuse(self, name: str, value: object) -> ConfigurationError:
        if not isinstance(value, str):
            shown = repr(value)[:80]
        elif len(value) > 80:  # said by its length, and cut short
            shown = f"{len(value)} characters ({value[:40]!r}...)"
        else:
            shown = repr(value)
        return ConfigurationError(
            f"{name} must be {self.expected}, got {shown}", variable=name.partition(" ")[0]
        )


def integer(low: int, high: int) -> Kind:
    """A whole number from ``low`` to ``high`` (no bool), in base 10."""
    return Kind(
        f"an integer from {low} to {high}",
        _whole,
        lambda value: _number(value, int) and low <= value <= high,
    )


def seconds(high: float = 1e9) -> Kind:
    """A duration in seconds, above 0 and at most ``high``; the text may have a unit."""
    return Kind(
        f"a duration above 0 and at most {high:g} s ({DURATION_EXAMPLES})",
        parse_duration,
        lambda value: _number(value, int, float) and math.isfinite(value) and 0 < value <= high,
    )


def choice(*words: str) -> Kind:
    """One of ``words`` (the text in any case)."""
    return Kind(" or ".join(map(repr, words)), str.lower, lambda value: value in words)


_FLAG_WORDS: dict[str, bool] = {
    **dict.fromkeys(("1", "true", "yes", "on"), True),
    **dict.fromkeys(("0", "false", "no", "off"), False),
}
FLAG = Kind(
    "1 or 0 (True or False)",
    lambda text: _FLAG_WORDS.get(text.lower()),
    lambda value: isinstance(value, bool),
)
"""On or off: ``1``/``true``/``yes``/``on`` or ``0``/``false``/``no``/``off`` (any case)."""
FILE = Kind("the path of a readable file", str, lambda value: os.path.isfile(value))


def _whole(text: str) -> int | None:
    try:
        return int(text, 10)
    except ValueError:
        return None


def _number(value: object, *types: type) -> bool:
    return isinstance(value, types) and not isinstance(value, bool)


TASK_ID = integer(0, MAX_TASK_ID)
KEY_NAME = Kind(
    f"1 to {MAX_JOB_NAME} characters from letters, digits, '.', '_' and '-'",
    # the length first: a name of any size costs no more than a long one
    valid=lambda value: (
        isinstance(value, str) and len(value) <= MAX_JOB_NAME and NAME.fullmatch(value) is not None
    ),
)
"""A job name or a run id: part of Redis key names."""


@dataclass(frozen=True)
class Validated(Kind):
    """A text that ``validate`` checks and may normalise (a job name, a run id, a schedule)."""

    validate: Callable[..., str] = str

    def check(self, value: Any, name: str) -> Any:
        return self.validate(value, variable=name)

    def parse(self, text: str, name: str) -> Any:
        return self.check(text, name)


class Sentinels(Kind):
    """Sentinels' ``host:port`` pairs, separated by commas (in code: a tuple of pairs)."""

    def parse(self, text: str, name: str) -> tuple[tuple[str, int], ...]:
        result: list[tuple[str, int]] = []
        for item in text.split(","):
            host, sep, port_text = item.strip().rpartition(":")
            host = host.strip("[]")
            valid_host = bool(host) and re.match(r"^[A-Za-z0-9.:_-]+$", host) is not None
            if not sep or not valid_host or not port_text.isdigit():
                raise ConfigurationError(
                    f"{name} must be host:port pairs separated by commas, "
                    f"e.g. 10.0.0.5:26379,10.0.0.6:26379; got {item.strip()[:80]!r}",
                    variable=name,
                )
            if not 0 < int(port_text) < 65536:
                raise refused(name, f"port must be 1-65535, got {item.strip()!r}")
            result.append((host, int(port_text)))
        return tuple(result)


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
