"""Sentinel over TLS with ACL users: servers and Sentinels that speak TLS only.

Guarantee: with ``STEPBARRIER_SENTINELS`` set, a ``rediss://user:password@host/db``
URL gives TLS, the user, the password and the database, to the master and to the
Sentinels alike (its host is ignored: the Sentinels name the master). A wrong
password is a ``RedisRefused`` at once, without the password, and exit code 2 in
the CLI; a setting redis-py does not take fails when the client is made, not at
every retry.
"""

from __future__ import annotations

import contextlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig, RedisRefused, StepPublisher, read_status
from stepbarrier._redis import client as connection_module
from stepbarrier._redis.client import make_client
from stepbarrier.cli._context import EXIT_USAGE
from tests.conftest import subprocess_env
from tests.reliability.sentinel import Lockdown, SentinelGroup
from tests.security.test_tls import release_over

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

USER = "trainer"
SECRET = "tls-sentinel-secret-not-for-logs"
WRONG = "tls-sentinel-wrong-guess"
DB = 3


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SentinelGroup]:
    """A TLS-only master, replica and three Sentinels; only ACL users get in."""
    lockdown = Lockdown.create(tmp_path_factory.mktemp("pki"), user=USER, password=SECRET)
    sentinels = SentinelGroup(lockdown)
    try:
        yield sentinels.start()
    finally:
        sentinels.cleanup()


def lockdown_of(group: SentinelGroup) -> Lockdown:
    assert group.lockdown is not None
    return group.lockdown


def environment(group: SentinelGroup, job: str, *, password: str = SECRET) -> dict[str, str]:
    """The ``STEPBARRIER_*`` variables of a host of ``job`` in ``group``."""
    lockdown = lockdown_of(group)
    return {
        "STEPBARRIER_JOB": job,
        # the host is never looked up: the Sentinels name the master
        "STEPBARRIER_REDIS_URL": f"rediss://{USER}:{password}@master.invalid:6379/{DB}",
        "STEPBARRIER_SENTINELS": group.env_value,
        "STEPBARRIER_SENTINEL_SERVICE": group.service,
        "STEPBARRIER_TLS_CA_FILE": str(lockdown.ca.path),
        "STEPBARRIER_TLS_CERT_FILE": str(lockdown.client.cert),
        "STEPBARRIER_TLS_KEY_FILE": str(lockdown.client.key),
        "STEPBARRIER_HEARTBEAT": "0.2",
    }


def sentinel_connections(group: SentinelGroup) -> int:
    """Connections the Sentinels have accepted so far (including this count's own)."""
    total = 0
    for sentinel in group.sentinels:
        admin = group.client(sentinel)
        try:
            total += int(admin.info("stats")["total_connections_received"])
        finally:
            admin.close()
    return total


@contextlib.contextmanager
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="stepbarrier"):
        yield


def test_a_chief_and_a_worker_meet_through_tls_only_sentinels(
    group: SentinelGroup, job: str
) -> None:
    assert release_over(BarrierConfig.from_env(environment(group, job))) == 3


def test_the_database_number_comes_from_the_url(group: SentinelGroup, job: str) -> None:
    config = BarrierConfig.from_env(environment(group, job))
    with StepPublisher(config) as publisher:
        publisher.publish(7)
        assert publisher.flush(10.0), publisher.last_error
    chosen, default = group.client(group.master, db=DB), group.client(group.master, db=0)
    try:
        assert chosen.hget(config.keys.state, "step") == b"7"
        assert not default.exists(config.keys.state)
    finally:
        chosen.close()
        default.close()


def test_the_configured_password_wins_over_the_urls(group: SentinelGroup, job: str) -> None:
    variables = environment(group, job, password=WRONG)
    variables["STEPBARRIER_REDIS_PASSWORD"] = SECRET
    assert read_status(BarrierConfig.from_env(variables)).step is None


def test_a_wrong_password_is_refused_at_once_and_never_shown(
    group: SentinelGroup, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = BarrierConfig.from_env(environment(group, job, password=WRONG))
    before = sentinel_connections(group)
    with debug_logs(caplog), pytest.raises(RedisRefused) as info:
        read_status(config)
    # one try per Sentinel (plus the count's own three), not retries for seconds
    attempts = sentinel_connections(group) - before - len(group.sentinels)
    assert attempts <= 2 * len(group.sentinels), f"{attempts} connections: the refusal was retried"
    message = str(info.value)
    assert info.value.kind == "authentication"
    assert f"refused authentication as user {USER!r}" in message
    assert group.service in message and "Sentinel" in message
    for text in [message, repr(info.value), caplog.text]:
        assert WRONG not in text and SECRET not in text


def test_the_cli_exits_2_on_a_wrong_password_with_one_line_and_no_password(
    group: SentinelGroup, job: str
) -> None:
    env = subprocess_env(**environment(group, job, password=WRONG))
    result = subprocess.run(
        [sys.executable, "-m", "stepbarrier", "status"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == EXIT_USAGE, result.stderr
    assert "refused authentication" in result.stderr
    assert "Traceback" not in result.stderr
    assert WRONG not in result.stderr + result.stdout


def test_no_password_in_the_clients_repr(group: SentinelGroup, job: str) -> None:
    client = make_client(BarrierConfig.from_env(environment(group, job)))
    try:
        assert client.ping()
        assert SECRET not in repr(client) and SECRET not in repr(client.connection_pool)
    finally:
        client.close()


def test_a_setting_redis_py_does_not_take_fails_when_the_client_is_made(
    group: SentinelGroup, job: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # the bug of issue 10: a TLS setting the connection class did not take
    # surfaced at the first command, where the chief retried it for ever
    original = connection_module._tls_options
    monkeypatch.setattr(
        connection_module,
        "_tls_options",
        lambda config: {**original(config), "ssl_no_such_setting": True},
    )
    with pytest.raises(TypeError, match="ssl_no_such_setting"):
        make_client(BarrierConfig.from_env(environment(group, job)))
