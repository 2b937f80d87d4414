"""`stepbarrier doctor` against servers with each misconfiguration, and the error
messages the same misconfigurations give every other command."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis

from stepbarrier._redis.functions import LIBRARY_NAME, install_functions
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer, free_port
from tests.security.certificates import Authority

CLI = [sys.executable, "-m", "stepbarrier"]
PASSWORD = "doctor-secret"


def run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        env=subprocess_env(STEPBARRIER_JOB="doctor-job", **env),
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )


@pytest.fixture(scope="module")
def guarded() -> Iterator[RedisServer]:
    """A server with a password for the default user, ACL users, and no library."""
    server = RedisServer(args=["--requirepass", PASSWORD]).start()
    admin = server.client(password=PASSWORD)
    try:
        # may do everything but run the library (a role missing +fcall_ro)
        admin.acl_setuser(
            "nofcall", enabled=True, passwords=["+nofcall-pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-fcall", "-fcall_ro"],
        )  # fmt: skip
        # may call the library but not load it
        admin.acl_setuser(
            "noload", enabled=True, passwords=["+noload-pw"], keys=["*"], channels=["*"],
            commands=["+@all", "-function|load"],
        )  # fmt: skip
        yield server
    finally:
        admin.close()
        server.cleanup()


@pytest.fixture(scope="module")
def ready() -> Iterator[RedisServer]:
    """A server without a password, with the library loaded."""
    server = RedisServer().start()
    client = server.client()
    try:
        install_functions(client)
        yield server
    finally:
        client.close()
        server.cleanup()


@dataclass
class Tls:
    server: RedisServer
    ca: Path


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Tls]:
    directory = tmp_path_factory.mktemp("doctor-tls")
    ca = Authority(directory, "doctor")
    cert = ca.issue("server", server=True)
    server = RedisServer(
        tls=(str(cert.cert), str(cert.key), str(ca.path)), args=["--tls-auth-clients", "no"]
    ).start()
    try:
        yield Tls(server, ca.path)
    finally:
        server.cleanup()


def test_a_sound_setup_passes_every_check(ready: RedisServer) -> None:
    result = run("doctor", STEPBARRIER_REDIS_URL=ready.url, STEPBARRIER_ROLE="chief")
    assert result.returncode == 0, result.stdout + result.stderr
    for line in ["connection", "authentication", "Redis version", "Functions library"]:
        assert any(row.startswith("ok") and line in row for row in result.stdout.splitlines())
    assert "FAIL" not in result.stdout
    assert f"{LIBRARY_NAME} is loaded" in result.stdout


def test_a_password_required_and_none_given(guarded: RedisServer) -> None:
    result = run("doctor", STEPBARRIER_REDIS_URL=guarded.url)
    assert result.returncode == 1
    assert "requires a password and none was configured" in result.stdout
    assert "fix:" in result.stdout


def test_a_wrong_password(guarded: RedisServer) -> None:
    result = run("doctor", STEPBARRIER_REDIS_URL=guarded.url, STEPBARRIER_REDIS_PASSWORD="wrong")
    assert result.returncode == 1
    assert "refused authentication as user 'default'" in result.stdout
    assert "wrong password" in result.stdout
    assert "wrong" not in result.stdout.replace("wrong password", "")  # the password is not shown


def test_tls_against_a_plain_server(ready: RedisServer) -> None:
    url = ready.url.replace("redis://", "rediss://")
    result = run("doctor", STEPBARRIER_REDIS_URL=url)
    assert result.returncode == 1
    assert "FAIL  TLS: the URL asks for TLS (rediss://) but the server answers plain" in (
        result.stdout
    )
    assert "use redis://" in result.stdout


def test_plain_against_a_tls_server(tls: Tls) -> None:
    result = run("doctor", STEPBARRIER_REDIS_URL=tls.server.url)
    assert result.returncode == 1
    assert "server speaks only TLS" in result.stdout
    assert "use rediss://" in result.stdout


def test_tls_with_its_ca_passes_the_tls_check(tls: Tls) -> None:
    url = tls.server.url.replace("redis://", "rediss://")
    result = run("doctor", STEPBARRIER_REDIS_URL=url, STEPBARRIER_TLS_CA_FILE=str(tls.ca))
    assert "ok    TLS: the server speaks TLS" in result.stdout
    assert "ok    authentication" in result.stdout


def test_a_user_lacking_a_permission(guarded: RedisServer) -> None:
    install_library(guarded)
    result = run(
        "doctor",
        STEPBARRIER_REDIS_URL=guarded.url,
        STEPBARRIER_REDIS_USERNAME="nofcall",
        STEPBARRIER_REDIS_PASSWORD="nofcall-pw",
    )
    assert result.returncode == 1
    assert "may not call" in result.stdout  # the library, for want of +fcall_ro
    assert "stepbarrier acl" in result.stdout


def test_the_library_missing_for_a_user_that_may_not_load_it(guarded: RedisServer) -> None:
    remove_library(guarded)
    result = run(
        "doctor",
        STEPBARRIER_REDIS_URL=guarded.url,
        STEPBARRIER_REDIS_USERNAME="noload",
        STEPBARRIER_REDIS_PASSWORD="noload-pw",
    )
    assert result.returncode == 1
    assert f"FAIL  Functions library: {LIBRARY_NAME} is not loaded" in result.stdout
    assert "stepbarrier functions install" in result.stdout
    assert not library_loaded(guarded)  # the doctor loads nothing


def test_another_library_version_is_named(guarded: RedisServer) -> None:
    remove_library(guarded)
    admin = guarded.client(password=PASSWORD)
    try:
        admin.function_load(
            "#!lua name=stepbarrier_v1\n"
            "redis.register_function{function_name='stepbarrier_v1_version', "
            "callback=function() return 1 end, flags={'no-writes'}}\n",
            replace=True,
        )
        result = run(
            "doctor",
            STEPBARRIER_REDIS_URL=guarded.url,
            STEPBARRIER_REDIS_USERNAME="noload",
            STEPBARRIER_REDIS_PASSWORD="noload-pw",
        )
    finally:
        admin.function_delete("stepbarrier_v1")
        admin.close()
    assert result.returncode == 1
    assert "only version(s) 1 loaded" in result.stdout


def test_an_unknown_host_and_a_refused_port() -> None:
    unknown = run("doctor", STEPBARRIER_REDIS_URL="redis://no-such-host.invalid:6379/0")
    assert unknown.returncode == 1
    assert "'no-such-host.invalid' does not resolve" in unknown.stdout
    refused = run("doctor", STEPBARRIER_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0")
    assert refused.returncode == 1
    assert "cannot connect to 127.0.0.1" in refused.stdout
    assert "STEPBARRIER_REDIS_URL" in refused.stdout


def install_library(server: RedisServer) -> None:
    admin = server.client(password=PASSWORD)
    try:
        install_functions(admin)
    finally:
        admin.close()


def remove_library(server: RedisServer) -> None:
    admin = server.client(password=PASSWORD)
    try:
        admin.function_delete(LIBRARY_NAME)
    except redis.ResponseError:
        pass  # not loaded
    finally:
        admin.close()


def library_loaded(server: RedisServer) -> bool:
    admin = server.client(password=PASSWORD)
    try:
        return bool(admin.function_list(library=LIBRARY_NAME))
    finally:
        admin.close()


# -- the same misconfigurations in every other command's error ---------------------------------


def test_status_without_a_password_says_one_is_required(guarded: RedisServer) -> None:
    result = run("status", STEPBARRIER_REDIS_URL=guarded.url)
    assert result.returncode == 2
    assert "requires a password and none was configured" in result.stderr
    assert "HELLO" not in result.stderr and "NOAUTH" not in result.stderr


def test_tls_mismatch_is_named_not_unreachable(tls: Tls, ready: RedisServer) -> None:
    # a reset by a TLS server looks like one going down: retried until the status
    # deadline, then named (the probe), never left as "unreachable"
    plain_to_tls = run("status", STEPBARRIER_REDIS_URL=tls.server.url)
    assert plain_to_tls.returncode == 2
    assert "TLS mismatch" in plain_to_tls.stderr and "use rediss://" in plain_to_tls.stderr.lower()
    assert "unreachable" not in plain_to_tls.stderr
    tls_to_plain = run(
        "status",
        STEPBARRIER_REDIS_URL=ready.url.replace("redis://", "rediss://"),
        STEPBARRIER_TLS_CA_FILE=str(tls.ca),
    )
    assert tls_to_plain.returncode == 2
    assert "TLS mismatch" in tls_to_plain.stderr and "unreachable" not in tls_to_plain.stderr


def test_an_unknown_host_fails_at_once() -> None:
    result = run("status", "--verbose", STEPBARRIER_REDIS_URL="redis://no-such-host.invalid:6379/0")
    assert "retrying" not in result.stderr  # not retried for STATUS_RETRY_SECONDS
    assert result.returncode == 2
    assert "host name 'no-such-host.invalid' is unknown" in result.stderr


def test_a_refused_default_url_names_the_variable_and_the_option() -> None:
    probe = redis.Redis(host="localhost", port=6379, socket_connect_timeout=1)
    try:
        probe.ping()
        pytest.skip("a Redis listens on localhost:6379 here")
    except redis.ConnectionError:
        pass
    finally:
        probe.close()
    result = run("status")
    assert result.returncode == 5
    assert "STEPBARRIER_REDIS_URL" in result.stderr and "--redis-url" in result.stderr


def handshake_timeout() -> BaseException:
    try:
        try:
            raise TimeoutError("_ssl.c:980: The handshake operation timed out")
        except TimeoutError as inner:
            raise redis.exceptions.TimeoutError("Timeout connecting to server") from inner
    except redis.exceptions.TimeoutError as exc:
        return exc


def test_a_handshake_timeout_is_a_mismatch_only_at_a_server_that_answers_plain_redis(
    ready: RedisServer,
) -> None:
    """A paused or overloaded TLS server times the handshake out too: its clients
    retry. Only a server that answers a plain PING is a TLS mismatch."""
    import socket

    from stepbarrier._redis import failures

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()  # accepts the connection, then says nothing: a paused server
    try:
        exc = handshake_timeout()
        assert failures.is_transient(exc)  # no address in the error: retried
        assert failures.tls_mismatch(exc, silent.getsockname()) is None
        assert failures.tls_mismatch(exc, ("127.0.0.1", ready.port)) == "tls-to-plain"
    finally:
        silent.close()


def test_a_reset_of_a_tls_client_is_no_mismatch_and_stays_a_retry() -> None:
    """A healthy TLS connection reset (a load balancer, an output-buffer limit) is
    an outage to retry, whatever a probe of the server would say."""
    from stepbarrier._redis import failures

    reset = redis.exceptions.ConnectionError(
        "Error while reading from 127.0.0.1:6380 : (104, 'Connection reset by peer')"
    )
    assert failures.is_transient(reset)  # no probe on the retry path
    assert failures.tls_mismatch(reset, tls=True) is None  # judged without a probe
