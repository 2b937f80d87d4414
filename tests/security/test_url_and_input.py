"""Issue 23, findings 7, 13 and 14: URLs that weaken TLS, passwords on the command
line, and input that used to hang, take seconds or end in exit 1.

Each test attacks one finding: a weakening or unknown URL query argument is a
``ConfigurationError`` (exit 2 from the command) at configuration time; the
``STEPBARRIER_TLS_INSECURE=1`` opt-out reaches a real TLS server whose
certificate does not verify, with a WARNING for each client; ``/dev/zero`` or a
pipe as a password file fails at once; a 100 000-character job name fails fast
and shortly; bad option values are click usage errors naming the option.

No test prints a password: a leak is asserted as a bare boolean, never by
showing the output that holds it.
"""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import logging
import math
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from examples.demo.__main__ import demo
from stepbarrier import (
    BarrierConfig,
    ConfigurationError,
    RedisRefused,
    StepPublisher,
    read_status,
)
from stepbarrier._config.checks import mask_url
from stepbarrier._config.environment import MAX_PASSWORD_FILE
from stepbarrier._config.settings import ENVIRONMENT_VARIABLES
from stepbarrier._redis.aio_client import make_async_client
from stepbarrier._redis.client import make_client
from stepbarrier.cli import cli
from stepbarrier.cli._commands.jobs import _bind
from stepbarrier.cli._context import EXIT_USAGE, mask_secrets
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer
from tests.security.certificates import Authority, Issued
from tests.security.test_tls import TlsSetup, start_tls_server

URL_VARIABLE = "STEPBARRIER_REDIS_URL"
INSECURE = "STEPBARRIER_TLS_INSECURE"
PASSWORD = "Pw-6d1f0c9e-not-for-any-output"
"""A distinctive fake password: finding it in any output means a leak."""


def cli_env(**values: str) -> dict[str, str | None]:
    """CliRunner's environment: every STEPBARRIER_* variable of this process unset."""
    cleared: dict[str, str | None] = {
        name: None for name in os.environ if name.startswith("STEPBARRIER_") or name == "TF_CONFIG"
    }
    return {**cleared, **values}


def invoke(*args: str, **env: str) -> Result:
    if args[:1] == ("demo",):  # the demo's own command (`python -m examples.demo`)
        return CliRunner().invoke(demo, list(args[1:]), env=cli_env(**env))
    return CliRunner().invoke(cli, list(args), env=cli_env(**env))


def one_error_line(result: Result) -> str:
    """The single ``Error:`` line of a failed command (and never a traceback)."""
    assert "Traceback" not in result.output + result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def verification(client: object) -> tuple[object, object]:
    """``(ssl_cert_reqs, ssl_check_hostname)`` of a redis-py client's connections."""
    kwargs = client.connection_pool.connection_kwargs  # type: ignore[attr-defined]
    return kwargs.get("ssl_cert_reqs"), kwargs.get("ssl_check_hostname")


# -- finding 7: URL query arguments that weaken TLS ---------------------------------

WEAKENING = [
    ("rediss://redis:6380/0?ssl_cert_reqs=none", "ssl_cert_reqs=none"),
    ("rediss://redis:6380/0?ssl_cert_reqs=optional", "ssl_cert_reqs=optional"),
    ("rediss://redis:6380/0?ssl_check_hostname=false", "ssl_check_hostname=false"),
    ("rediss://redis:6380/0?ssl_check_hostname=0", "ssl_check_hostname=0"),
    ("rediss://redis:6380/0?ssl_check_hostname=No", "ssl_check_hostname=No"),
    # percent-encoded names are what redis-py reads after decoding
    ("rediss://redis:6380/0?ssl%5Fcert%5Freqs=none", "ssl_cert_reqs=none"),
    ("rediss://redis:6380/0?ssl_cert_reqs=required&ssl_cert_reqs=none", "given twice"),
    ("rediss://redis:6380/0?ssl_cert_reqs=NONE", "ssl_cert_reqs"),
    ("rediss://redis:6380/0?ssl_check_hostname=nope", "ssl_check_hostname"),
]

OVERRIDING = [
    (
        "rediss://redis:6380/0?ssl_ca_certs=/tmp/evil-ca.pem",
        "ssl_ca_certs",
        "STEPBARRIER_TLS_CA_FILE",
    ),
    ("rediss://redis:6380/0?ssl_ca_path=/tmp", "ssl_ca_path", "STEPBARRIER_TLS_CA_FILE"),
    ("rediss://redis:6380/0?ssl_ca_data=x", "ssl_ca_data", "STEPBARRIER_TLS_CA_FILE"),
    ("rediss://redis:6380/0?ssl_certfile=/c.pem", "ssl_certfile", "STEPBARRIER_TLS_CERT_FILE"),
    ("rediss://redis:6380/0?ssl_keyfile=/c.key", "ssl_keyfile", "STEPBARRIER_TLS_KEY_FILE"),
    ("rediss://redis:6380/0?ssl_password=x", "ssl_password", "STEPBARRIER_TLS_CERT_FILE"),
    ("rediss://redis:6380/0?ssl_min_version=2", "ssl_min_version", "secure defaults"),
    ("rediss://redis:6380/0?ssl_ciphers=NULL", "ssl_ciphers", "secure defaults"),
    ("rediss://redis:6380/0?ssl_exclude_verify_flags=x", "ssl_exclude_verify_flags", "remove it"),
    ("rediss://redis:6380/0?ssl_include_verify_flags=x", "ssl_include_verify_flags", "remove it"),
    ("rediss://redis:6380/0?ssl_validate_ocsp=true", "ssl_validate_ocsp", "remove it"),
    ("redis://redis:6379/0?ssl_cert_reqs=none", "ssl_cert_reqs", "rediss://"),
    ("redis://redis:6379/0?ssl=true", "'ssl'", "remove it"),
]


@pytest.mark.parametrize(("url", "named"), WEAKENING)
def test_a_url_that_weakens_tls_is_refused(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", URL_VARIABLE: url})
    assert info.value.variable == URL_VARIABLE
    assert named in str(info.value)
    with pytest.raises(ConfigurationError) as direct:
        BarrierConfig(job="j", redis_url=url)
    assert direct.value.variable == "redis_url"


@pytest.mark.parametrize(
    "url",
    [
        "rediss://redis:6380/0?ssl_cert_reqs=none",
        "rediss://redis:6380/0?ssl_check_hostname=false",
    ],
)
def test_the_refusal_says_what_to_do(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", URL_VARIABLE: url})
    message = str(info.value)
    assert "remove it" in message and f"{INSECURE}=1" in message


@pytest.mark.parametrize(("url", "named", "instead"), OVERRIDING)
def test_a_url_that_overrides_tls_settings_is_refused_even_under_the_opt_out(
    url: str, named: str, instead: str
) -> None:
    for insecure in ("0", "1"):
        with pytest.raises(ConfigurationError) as info:
            BarrierConfig.from_env({"STEPBARRIER_JOB": "j", URL_VARIABLE: url, INSECURE: insecure})
        assert info.value.variable == URL_VARIABLE
        assert named in str(info.value) and instead in str(info.value)


@pytest.mark.parametrize(("url", "named"), WEAKENING[:5])
def test_the_cli_exits_with_the_configuration_error_code(url: str, named: str) -> None:
    result = invoke("status", "--job", "j", "--redis-url", url)
    assert result.exit_code == EXIT_USAGE == 2
    line = one_error_line(result)
    assert named in line and "--redis-url" in line and INSECURE in line


def test_the_opt_out_takes_only_the_two_weakenings() -> None:
    for url in (
        "rediss://redis:6380/0?ssl_cert_reqs=none",
        "rediss://redis:6380/0?ssl_cert_reqs=optional&ssl_check_hostname=false",
    ):
        config = BarrierConfig.from_env({"STEPBARRIER_JOB": "j", URL_VARIABLE: url, INSECURE: "1"})
        assert config.tls_insecure is True
    assert BarrierConfig.from_env({"STEPBARRIER_JOB": "j"}).tls_insecure is False
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", INSECURE: "maybe"})
    assert info.value.variable == INSECURE
    with pytest.raises(ConfigurationError) as typed:
        BarrierConfig(job="j", tls_insecure="yes")  # type: ignore[arg-type]
    assert typed.value.variable == "tls_insecure"
    assert INSECURE in ENVIRONMENT_VARIABLES


def test_verification_is_off_in_the_client_only_under_the_opt_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="stepbarrier.tls")
    secure = BarrierConfig(job="j", redis_url="rediss://127.0.0.1:1/0")
    assert verification(make_client(secure)) == ("required", True)
    explicit = BarrierConfig(
        job="j", redis_url="rediss://127.0.0.1:1/0?ssl_cert_reqs=required&ssl_check_hostname=yes"
    )
    assert verification(make_client(explicit)) == ("required", True)
    alone = BarrierConfig(job="j", redis_url="rediss://127.0.0.1:1/0", tls_insecure=True)
    assert verification(make_client(alone)) == ("required", True)  # the opt-out alone: nothing
    assert not caplog.records

    weak = BarrierConfig(
        job="j", redis_url="rediss://127.0.0.1:1/0?ssl_cert_reqs=none", tls_insecure=True
    )
    assert verification(make_client(weak)) == ("none", True)  # redis-py: no host check then
    assert verification(make_async_client(weak)) == ("none", True)
    no_host = BarrierConfig(
        job="j", redis_url="rediss://127.0.0.1:1/0?ssl_check_hostname=false", tls_insecure=True
    )
    assert verification(make_client(no_host)) == ("required", False)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 3  # one for each client made
    assert all(INSECURE in r.getMessage() for r in warnings)
    assert "ssl_check_hostname=false" in warnings[-1].getMessage()


def test_sentinel_clients_are_weakened_alike_and_only_under_the_opt_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="stepbarrier.tls")
    sentinels = (("127.0.0.1", 1),)
    secure = BarrierConfig(job="j", redis_url="rediss://ignored/0", sentinels=sentinels)
    assert verification(make_client(secure)) == ("required", True)
    weak = BarrierConfig(
        job="j",
        redis_url="rediss://ignored/0?ssl_cert_reqs=none",
        sentinels=sentinels,
        tls_insecure=True,
    )
    assert verification(make_client(weak)) == ("none", True)
    assert len(caplog.records) == 1


def _issue_for_another_host(ca: Authority, directory: Path) -> Issued:
    """A server certificate of ``ca`` valid only for elsewhere.invalid, not 127.0.0.1."""
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "elsewhere.invalid")]))
        .issuer_name(ca.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("elsewhere.invalid"),
                    x509.IPAddress(ipaddress.ip_address("192.0.2.1")),
                ]
            ),
            critical=False,
        )
        .sign(ca.key, hashes.SHA256())
    )
    issued = Issued(directory / "elsewhere.pem", directory / "elsewhere.key")
    issued.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    issued.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return issued


@dataclass
class WrongHost:
    server: RedisServer
    ca: Authority

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.server.port}/0"


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[TlsSetup]:
    setup = start_tls_server(tmp_path, require_client_cert=False)
    yield setup
    setup.server.cleanup()


@pytest.fixture
def wrong_host(tmp_path: Path) -> Iterator[WrongHost]:
    ca = Authority(tmp_path, "hostcheck")
    issued = _issue_for_another_host(ca, tmp_path)
    server = RedisServer(
        tls=(str(issued.cert), str(issued.key), str(ca.path)),
        args=["--tls-auth-clients", "no"],
    )
    server.start()
    yield WrongHost(server, ca)
    server.cleanup()


@pytest.mark.timeout(60)
def test_the_opt_out_reaches_a_real_server_whose_certificate_does_not_verify(
    tls: TlsSetup, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stepbarrier.tls")
    base = {"STEPBARRIER_JOB": job, INSECURE: "1"}
    # the opt-out alone weakens nothing: a CA the client does not know is refused
    with pytest.raises(RedisRefused) as info:
        read_status(BarrierConfig.from_env({**base, URL_VARIABLE: tls.url}))
    assert info.value.kind == "tls"
    assert not caplog.records
    # without the opt-out the weakening URL is refused before anything connects
    weak_url = f"{tls.url}?ssl_cert_reqs=none"
    with pytest.raises(ConfigurationError):
        BarrierConfig.from_env({"STEPBARRIER_JOB": job, URL_VARIABLE: weak_url})
    # with both, the unverified server is reached, and each client made says so
    config = BarrierConfig.from_env({**base, URL_VARIABLE: weak_url})
    assert read_status(config).step is None
    assert read_status(config).step is None
    warnings = [r for r in caplog.records if r.name == "stepbarrier.tls"]
    assert len(warnings) == 2
    assert all(r.levelno == logging.WARNING for r in warnings)
    assert "not verified" in warnings[0].getMessage()


@pytest.mark.timeout(60)
def test_the_host_name_is_checked_unless_the_opt_out_lets_the_url_skip_it(
    wrong_host: WrongHost, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="stepbarrier.tls")
    base = {"STEPBARRIER_JOB": job, "STEPBARRIER_TLS_CA_FILE": str(wrong_host.ca.path)}
    with pytest.raises(RedisRefused) as info:  # the right CA, but not this host's certificate
        read_status(BarrierConfig.from_env({**base, URL_VARIABLE: wrong_host.url}))
    assert info.value.kind == "tls"
    skip = f"{wrong_host.url}?ssl_check_hostname=false"
    with pytest.raises(ConfigurationError, match="ssl_check_hostname=false"):
        BarrierConfig.from_env({**base, URL_VARIABLE: skip})
    config = BarrierConfig.from_env({**base, URL_VARIABLE: skip, INSECURE: "1"})
    assert read_status(config).step is None
    assert len(caplog.records) == 1
    assert "need not name the host" in caplog.records[0].getMessage()


@pytest.mark.timeout(60)
def test_the_cli_under_the_opt_out_shows_the_warning_once(tls: TlsSetup, job: str) -> None:
    url = f"{tls.url}?ssl_cert_reqs=none"
    result = invoke("status", "--json", "--job", job, "--redis-url", url, **{INSECURE: "1"})
    assert result.exit_code == 0, result.stderr
    warnings = [line for line in result.stderr.splitlines() if "WARNING stepbarrier.tls" in line]
    assert len(warnings) == 1
    assert INSECURE in warnings[0] and "ssl_cert_reqs=none" in warnings[0]


# -- finding 7, second part: unknown or malformed query arguments --------------------

BAD_QUERIES = [
    # what the review saw end in exit 1 ("unexpected error") or fail late
    ("rediss://127.0.0.1:1/0?foo=bar", "'foo' is unknown"),
    ("rediss://127.0.0.1:1/0?db=x", "'db'"),
    ("redis://127.0.0.1:1/0?db=3", "path"),
    ("rediss://127.0.0.1:1/0?socket_timeout=abc", "'socket_timeout'"),
    ("rediss://127.0.0.1:1/0?socket_timeout=nan", "'socket_timeout'"),
    ("rediss://127.0.0.1:1/0?retry_on_error=x", "'retry_on_error'"),
    ("rediss://127.0.0.1:1/0?ssl_cert_reqs=bogus", "'ssl_cert_reqs'"),
    ("rediss://127.0.0.1:1/0?protocol=9", "'protocol'"),
    ("rediss://127.0.0.1:1/0?decode_responses=1", "'decode_responses'"),
    ("rediss://127.0.0.1:1/0?max_connections=0", "'max_connections'"),
    ("redis://127.0.0.1:1/0?health_check_interval=1", "'health_check_interval'"),
    ("redis://127.0.0.1:1/0?client_name=two%20words", "'client_name'"),
    ("redis://127.0.0.1:1/0?ssl_cert_reqs", "malformed"),
    ("redis://127.0.0.1:1/0?a=1&&b=2", "malformed"),
    ("redis://127.0.0.1:1/0?" + "&".join(f"x{i}=1" for i in range(40)), "malformed"),
    ("unix:///run/redis.sock?db=%C2%B2", "'db'"),
    ("unix:///run/redis.sock?ssl_cert_reqs=required", "rediss://"),
    ("REDIS://127.0.0.1:1/0", "lower case"),
    ("Rediss://127.0.0.1:1/0", "lower case"),
    ("redis://127.0.0.1:1/\N{SUPERSCRIPT TWO}", "database number"),
    ("redis://127.0.0.1:1/" + "1" * 5000, "database number"),
]


@pytest.mark.parametrize(("url", "named"), BAD_QUERIES)
def test_a_bad_query_is_a_configuration_error_naming_it(url: str, named: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", URL_VARIABLE: url})
    assert info.value.variable == URL_VARIABLE
    assert named in str(info.value)


@pytest.mark.parametrize(("url", "named"), BAD_QUERIES[:12])
def test_a_bad_query_exits_2_not_1(url: str, named: str) -> None:
    result = invoke("status", "--job", "j", "--redis-url", url)
    assert result.exit_code == 2, result.stderr
    line = one_error_line(result)
    assert "unexpected" not in line and named in line


def test_a_password_in_the_query_is_refused_and_masked() -> None:
    for url in (
        f"redis://redis:6379/0?password={PASSWORD}",
        f"rediss://redis:6380/0?ssl_password={PASSWORD}",
        f"redis://redis:99999/0?password={PASSWORD}",  # refused first for its port
    ):
        with pytest.raises(ConfigurationError) as info:
            BarrierConfig(job="j", redis_url=url)
        leaked = PASSWORD in str(info.value)
        assert not leaked, "the password is in the message"
        masked = mask_url(url)
        assert PASSWORD not in masked and "=***" in masked


def test_the_accepted_query_arguments() -> None:
    for url in (
        "rediss://redis:6380/0?ssl_cert_reqs=required",
        "rediss://redis:6380/0?ssl_check_hostname=true&ssl_cert_reqs=required",
        "unix:///run/redis.sock?db=3&client_name=trainer-0",
        "rediss://redis:6380/0?client_name=chief:mnist-42",
        "redis://redis:6379/0?",
        "redis://redis:6379/00012",
    ):
        assert BarrierConfig(job="j", redis_url=url).redis_url == url


query_names = st.sampled_from(
    [
        "ssl_cert_reqs",
        "ssl_check_hostname",
        "db",
        "ssl_ca_certs",
        "socket_timeout",
        "protocol",
        "client_name",
        "foo",
        "ssl",
        "SSL_CERT_REQS",
        "ssl%5Fcert%5Freqs",
        "",
    ]
) | st.text(alphabet="abcdefghijklmnopqrstuvwxyz_%25=&", max_size=12)
query_values = st.sampled_from(
    ["required", "none", "optional", "true", "false", "0", "1", "yes", "x", "", "nan", "%00"]
) | st.text(max_size=8)


@st.composite
def urls(draw: st.DrawFn) -> str:
    base = draw(
        st.sampled_from(["rediss://127.0.0.1:1/0", "redis://127.0.0.1:1/0", "unix:///tmp/r.sock"])
    )
    pairs = draw(st.lists(st.tuples(query_names, query_values), max_size=4))
    query = "&".join(f"{name}={value}" for name, value in pairs)
    return f"{base}?{query}" if pairs or draw(st.booleans()) else base


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(urls(), st.booleans())
def test_any_query_is_refused_or_gives_a_client_that_verifies(url: str, insecure: bool) -> None:
    try:
        config = BarrierConfig(job="j", redis_url=url, tls_insecure=insecure)
    except ConfigurationError as error:
        assert error.variable == "redis_url" and "\n" not in str(error)
        return
    client = make_client(config)  # builds its connection class: a bad setting fails here
    if url.startswith("rediss://") and not insecure:
        assert verification(client) == ("required", True)
    client.close()


# -- finding 13: a password in --redis-url ----------------------------------------------


def password_url(server: RedisServer, secret: str = PASSWORD) -> str:
    return f"redis://worker:{secret}@127.0.0.1:{server.port}/0"


@pytest.mark.parametrize("extra", [[], ["--debug"], ["--verbose"]])
def test_a_password_on_the_command_line_warns_once_and_never_shows(
    redis_server: RedisServer, job: str, extra: list[str]
) -> None:
    result = invoke("status", *extra, "--job", job, "--redis-url", password_url(redis_server))
    assert result.exit_code == 2  # this Redis has no user 'worker': refused, exit 2
    output = result.output + result.stderr
    leaked = PASSWORD in output
    assert not leaked, "the password shows in the command's output"
    warnings = [line for line in result.stderr.splitlines() if "WARNING stepbarrier.cli" in line]
    assert len(warnings) == 1
    assert "--redis-url holds a password" in warnings[0]
    assert "ps" in warnings[0] and "--password-file" in warnings[0]
    assert "STEPBARRIER_REDIS_PASSWORD_FILE" in warnings[0]


def test_a_percent_encoded_password_never_shows_either(redis_server: RedisServer, job: str) -> None:
    encoded = "Pw%40b7c1-not-for-any-output"  # '%40' is '@'
    decoded = "Pw@b7c1-not-for-any-output"
    result = invoke(
        "status", "--debug", "--job", job, "--redis-url", password_url(redis_server, encoded)
    )
    output = result.output + result.stderr
    leaked = encoded in output or decoded in output
    assert not leaked, "the password shows in the command's output"
    assert "--redis-url holds a password" in result.stderr


def test_no_warning_without_a_password_on_the_command_line(
    redis_server: RedisServer, job: str
) -> None:
    in_env = invoke("status", "--job", job, **{URL_VARIABLE: password_url(redis_server)})
    user_only = invoke(
        "status", "--job", job, "--redis-url", f"redis://worker:@127.0.0.1:{redis_server.port}/0"
    )
    plain = invoke("status", "--job", job, "--redis-url", redis_server.url)
    assert plain.exit_code == 0, plain.stderr
    for result in (in_env, user_only, plain):
        assert "holds a password" not in result.stderr
    leaked = PASSWORD in in_env.output + in_env.stderr
    assert not leaked, "the password shows in the command's output"


@pytest.mark.timeout(60)
def test_a_real_process_warns_and_hides_the_password(redis_server: RedisServer, job: str) -> None:
    url = password_url(redis_server)
    done = subprocess.run(
        [sys.executable, "-m", "stepbarrier", "status", "--job", job, "--redis-url", url],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    leaked = PASSWORD in done.stdout + done.stderr
    assert not leaked, "the password shows in the command's output"
    assert done.returncode == 2
    assert done.stderr.count("--redis-url holds a password") == 1


def test_a_lone_userinfo_is_the_password_as_redis_cli_reads_it_and_never_shows(
    job: str,
) -> None:
    """Issue 34, case 7: ``redis://PASSWORD@host`` (as ``redis-cli -u`` takes it)
    authenticates with that password, and no output shows it; redis-py alone
    would send it as a user name and print it whole."""
    with RedisServer(args=["--requirepass", PASSWORD]) as server:
        url = f"redis://{PASSWORD}@127.0.0.1:{server.port}/0"
        config = BarrierConfig(job=job, redis_url=url)
        assert PASSWORD not in config.safe_url and "***@127.0.0.1" in config.safe_url
        client = make_client(config)
        assert client.ping()  # authenticated by the lone userinfo
        client.close()
        results = [
            invoke(command, *extra, "--job", job, "--redis-url", url)
            for command, extra in (("status", []), ("status", ["--debug"]), ("doctor", []))
        ]
        results.append(invoke("status", "--job", job, **{URL_VARIABLE: url}))
        for result in results:
            output = result.output + result.stderr
            assert "Traceback" not in output
            leaked = PASSWORD in output
            assert not leaked, "the password shows in the command's output"
        assert results[0].exit_code == 0, results[0].stderr
        assert "--redis-url holds a password" in results[0].stderr
        assert results[3].exit_code == 0, results[3].stderr
        wrong = invoke(
            "status", "--job", job, "--redis-url", f"redis://not-it@127.0.0.1:{server.port}/0"
        )
        assert wrong.exit_code != 0 and "not-it" not in wrong.output + wrong.stderr


def test_a_refused_lone_userinfo_never_shows_in_errors_or_logs(
    job: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The review's repro: a wrong lone userinfo was named as the user in the
    library's RedisRefused, the chief's log lines and ``doctor -v``."""
    secret = "Zq9SECRETzq"
    with RedisServer(args=["--requirepass", PASSWORD]) as server:
        for given in (secret, f"{secret}%40x"):
            url = f"redis://{given}@127.0.0.1:{server.port}/0"
            config = BarrierConfig(job=job, redis_url=url)
            with pytest.raises(RedisRefused) as refused:
                read_status(config)
            assert secret not in str(refused.value)
            assert "as user 'default'" in str(refused.value)
            caplog.clear()
            with caplog.at_level(logging.DEBUG):
                publisher = StepPublisher(config)
                publisher.publish(1)
                deadline = time.monotonic() + 30  # the writer thread says it: a bounded wait
                while "refused authentication" not in caplog.text:
                    assert time.monotonic() < deadline, "the chief never said Redis refused it"
                    time.sleep(0.05)
                publisher.close(done=False, timeout=1)
            logged = "\n".join(record.getMessage() for record in caplog.records)
            assert secret not in logged
            doctor = invoke("doctor", "-v", "--job", job, **{URL_VARIABLE: url})
            assert secret not in doctor.output + doctor.stderr
            assert "Traceback" not in doctor.output + doctor.stderr


@pytest.mark.parametrize(
    "host",
    ["a" * 64, ("b" * 60 + ".") * 5, "a" * 63 + "." + "c" * 64],
    ids=["label-64", "name-over-253", "second-label-64"],
)
def test_a_host_no_resolver_takes_is_a_usage_error(host: str, job: str) -> None:
    """Issue 34: a hostile host label ended ``status`` with "unexpected
    UnicodeError" (exit 1); it is a usage error (exit 2) naming the host's rules."""
    result = invoke("status", "--job", job, "--redis-url", f"redis://{host}:6379/0")
    assert result.exit_code == EXIT_USAGE, result.output + result.stderr
    assert "the host must be a DNS name" in one_error_line(result)
    with pytest.raises(ConfigurationError, match="labels of 1 to 63 characters"):
        BarrierConfig(job=job, redis_url=f"redis://{host}:6379/0")
    env = invoke("status", "--job", job, **{URL_VARIABLE: f"redis://{host}:6379/0"})
    assert env.exit_code == EXIT_USAGE and "STEPBARRIER_REDIS_URL" in one_error_line(env)


# -- finding 14: bad input ----------------------------------------------------------------


def password_file_error(path: str) -> ConfigurationError:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", "STEPBARRIER_REDIS_PASSWORD_FILE": path})
    assert info.value.variable == "STEPBARRIER_REDIS_PASSWORD_FILE"
    return info.value


@pytest.mark.timeout(10)
def test_dev_zero_as_the_password_file_fails_fast(tmp_path: Path) -> None:
    # refused for what it is, before a byte is read (a read would never end)
    assert "not a regular file" in str(password_file_error("/dev/zero"))
    link = tmp_path / "innocent.password"
    link.symlink_to("/dev/zero")
    assert "not a regular file" in str(password_file_error(str(link)))


@pytest.mark.timeout(10)
def test_a_pipe_without_a_writer_or_a_directory_fails_fast(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    assert "not a regular file" in str(password_file_error(str(fifo)))  # not blocked in open()
    assert "not a regular file" in str(password_file_error(str(tmp_path)))


@pytest.mark.timeout(10)
def test_a_password_file_larger_than_the_limit_is_refused(tmp_path: Path) -> None:
    big = tmp_path / "big.password"
    big.write_bytes(b"x" * (MAX_PASSWORD_FILE + 1))
    assert f"more than {MAX_PASSWORD_FILE} bytes" in str(password_file_error(str(big)))
    fits = tmp_path / "fits.password"
    fits.write_bytes(b"y" * (MAX_PASSWORD_FILE - 1) + b"\n")
    link = tmp_path / "link.password"
    link.symlink_to(fits)  # a Kubernetes secret is a link to a regular file
    for path in (fits, link):
        config = BarrierConfig.from_env(
            {"STEPBARRIER_JOB": "j", "STEPBARRIER_REDIS_PASSWORD_FILE": str(path)}
        )
        assert config.redis_password == "y" * (MAX_PASSWORD_FILE - 1)


@pytest.mark.timeout(10)
def test_dev_zero_through_the_cli_options_fails_fast() -> None:
    status = invoke("status", "--job", "j", "--password-file", "/dev/zero")
    assert status.exit_code == 2
    line = one_error_line(status)
    assert "--password-file" in line and "not a regular file" in line
    acl = invoke("acl", "worker", "--user", "w", "--jobs", "team-*", "--password-file", "/dev/zero")
    assert acl.exit_code == 2
    assert "not a regular file" in one_error_line(acl)
    env = invoke("status", "--job", "j", STEPBARRIER_REDIS_PASSWORD_FILE="/dev/zero")
    assert env.exit_code == 2 and "not a regular file" in one_error_line(env)


LONG_JOB = "a" * 100_000


@pytest.mark.timeout(10)
def test_a_100k_character_job_name_fails_fast_and_shortly() -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig(job=LONG_JOB)
    message = str(info.value)
    assert "1 to 64 characters" in message and "100000 characters" in message
    assert len(message) < 300
    with pytest.raises(ConfigurationError) as from_env:
        BarrierConfig.from_env({"STEPBARRIER_JOB": LONG_JOB})
    assert from_env.value.variable == "STEPBARRIER_JOB" and len(str(from_env.value)) < 300
    # fast: the masking of a message is linear (test_masking_is_linear), and the name
    # is checked by a bounded pattern


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "args",
    [
        ["status", "--job", LONG_JOB],
        ["status", "--debug", "--job", LONG_JOB],
        ["wait", "--until", "3", "--job", LONG_JOB],
        ["jobs", "--job", LONG_JOB],
        ["demo", "--job", LONG_JOB],
    ],
)
def test_a_100k_character_job_name_through_the_cli_fails_fast(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    # --debug adds the traceback, and the error line still comes last
    line = result.stderr.splitlines()[-1] if "--debug" in args else one_error_line(result)
    assert line.startswith("Error:")
    assert "--job" in line and "64" in line and "100000" in line
    assert len(line) < 400


@pytest.mark.timeout(10)
@pytest.mark.parametrize(
    "text",
    [
        "got " + "a" * 200_000,
        "a://a:" * 40_000,
        "redis://u:p@h " * 20_000,
        "x://" + "@" * 200_000,
    ],
)
def test_masking_is_linear(text: str) -> None:
    # eight times the text costs about eight times the CPU (a quadratic masking: 64
    # times); a ratio of CPU times, so neither a slow machine nor a busy one fails it
    def cpu_seconds(part: str) -> float:
        best = math.inf
        for _ in range(5):
            started = time.process_time()
            mask_secrets(part, ["not-there"])
            best = min(best, time.process_time() - started)
        return best

    whole, eighth = cpu_seconds(text), cpu_seconds(text[: len(text) // 8])
    assert whole <= 24 * max(eighth, 1e-4), (whole, eighth)


@pytest.mark.parametrize(
    ("args", "option"),
    [
        (["watch", "--interval", "nan"], "--interval"),
        (["watch", "--interval", "inf"], "--interval"),
        (["watch", "--interval", "-1"], "--interval"),
        (["watch", "--interval", "0"], "--interval"),
        (["wait", "--until", "1", "--timeout", "nan"], "--timeout"),
        (["wait", "--until", "1", "--timeout", "inf"], "--timeout"),
        (["wait", "--until", "1", "--stall-timeout", "nan"], "--stall-timeout"),
        (["exporter", "--min-interval", "nan"], "--min-interval"),
        (["demo", "--step-sleep", "nan"], "--step-sleep"),
    ],
)
def test_a_number_that_is_not_one_is_a_usage_error_naming_the_option(
    args: list[str], option: str
) -> None:
    result = invoke(*args, STEPBARRIER_JOB="j")
    assert result.exit_code == 2
    line = one_error_line(result)
    assert f"Invalid value for '{option}'" in line
    # what was expected: a range of numbers, or a duration ("seconds, e.g. 600")
    assert "range" in line or "seconds, e.g. 600" in line
    assert "unexpected" not in line


@pytest.mark.parametrize(
    "bind",
    ["a" * 300, "a" * 64, f"{'a' * 60}." * 5, "[::1]", "", "a b", "bad\x00host", "-lead", "é.com"],
)
def test_a_bad_bind_is_a_usage_error_naming_the_option(bind: str) -> None:
    result = invoke("exporter", "--bind", bind)
    assert result.exit_code == 2
    line = one_error_line(result)
    assert "Invalid value for '--bind'" in line and "IP address" in line
    assert len(line) < 500


@pytest.mark.parametrize(
    "bind", ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "metrics.example.com", "a" * 63]
)
def test_a_good_bind_is_taken(bind: str) -> None:
    assert _bind(None, None, bind) == bind  # type: ignore[arg-type]


# The username and password settings win over a URL's credentials


@pytest.fixture
def user_server(redis_server: RedisServer) -> Iterator[tuple[RedisServer, str, str]]:
    admin = redis_server.client()
    user, password = "precedence-user", "precedence-secret-1"
    admin.acl_setuser(user, enabled=True, passwords=[f"+{password}"], commands=["+@all"])
    yield redis_server, user, password
    admin.acl_deluser(user)
    admin.close()


@pytest.mark.parametrize(
    ("credentials", "give_user", "expected"),
    [
        ("wrong-user:wrong-pass@", True, "precedence-user"),  # both replaced
        ("precedence-user:bad@", False, "precedence-user"),  # the password replaced
        (":wrong-pass@", False, "default"),  # no user anywhere: the default user
    ],
)
def test_the_settings_win_over_the_urls_credentials(
    user_server: tuple[RedisServer, str, str], credentials: str, give_user: bool, expected: str
) -> None:
    server, user, password = user_server
    url = server.url.replace("redis://", f"redis://{credentials}")
    config = BarrierConfig(
        job="precedence",
        redis_url=url,
        redis_username=user if give_user else None,
        redis_password=password,
    )
    client = make_client(config)
    assert client.acl_whoami() == expected
    client.close()


def test_the_urls_credentials_stand_without_settings(
    user_server: tuple[RedisServer, str, str],
) -> None:
    server, user, password = user_server
    url = server.url.replace("redis://", f"redis://{user}:{password}@")
    client = make_client(BarrierConfig(job="precedence", redis_url=url))
    assert client.acl_whoami() == user
    client.close()


def test_the_async_client_takes_the_settings_over_the_urls_too(
    user_server: tuple[RedisServer, str, str],
) -> None:
    server, user, password = user_server
    url = server.url.replace("redis://", "redis://wrong-user:wrong-pass@")
    config = BarrierConfig(
        job="precedence", redis_url=url, redis_username=user, redis_password=password
    )

    async def whoami() -> str:
        client = make_async_client(config)
        try:
            return str(await client.acl_whoami())
        finally:
            await client.aclose()

    assert asyncio.run(whoami()) == user


def test_the_settings_win_over_a_unix_socket_urls_credentials() -> None:
    """A ``unix://`` URL has an empty host: replacing its credentials must keep its
    ``//`` (``unix:/path`` is no URL redis-py reads)."""
    server = RedisServer()
    socket_path = server.dir / "redis.sock"
    server.args += ["--unixsocket", str(socket_path), "--unixsocketperm", "700"]
    server.start()
    try:
        admin = server.client()
        admin.acl_setuser(
            "socket-user", enabled=True, passwords=["+socket-secret-1"], commands=["+@all"]
        )
        admin.close()
        config = BarrierConfig(
            job="precedence",
            redis_url=f"unix://wrong-user:wrong-pass@{socket_path}?db=0",
            redis_username="socket-user",
            redis_password="socket-secret-1",
        )
        client = make_client(config)
        assert client.acl_whoami() == "socket-user"
        client.close()
    finally:
        server.stop()
