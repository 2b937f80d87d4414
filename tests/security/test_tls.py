"""TLS: chief and workers over rediss:// with a private CA; never a silent downgrade."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from stepbarrier import (
    BarrierConfig,
    RedisRefused,
    StepPublisher,
    StepWaiter,
    read_status,
)
from tests.redis_harness import RedisServer
from tests.security.certificates import Authority, Issued


@dataclass
class TlsSetup:
    server: RedisServer
    ca: Authority
    other_ca: Authority
    client: Issued

    @property
    def url(self) -> str:
        return f"rediss://127.0.0.1:{self.server.port}/0"


def start_tls_server(tmp_path: Path, *, require_client_cert: bool) -> TlsSetup:
    ca = Authority(tmp_path, "good")
    other = Authority(tmp_path, "other")
    server_cert = ca.issue("server", server=True)
    client_cert = ca.issue("client", server=False)
    server = RedisServer(
        tls=(str(server_cert.cert), str(server_cert.key), str(ca.path)),
        args=["--tls-auth-clients", "yes" if require_client_cert else "no"],
    )
    server.start()
    return TlsSetup(server, ca, other, client_cert)


@pytest.fixture
def tls(tmp_path: Path) -> Iterator[TlsSetup]:
    setup = start_tls_server(tmp_path, require_client_cert=False)
    yield setup
    setup.server.cleanup()


@pytest.fixture
def mutual_tls(tmp_path: Path) -> Iterator[TlsSetup]:
    setup = start_tls_server(tmp_path, require_client_cert=True)
    yield setup
    setup.server.cleanup()


def release_over(config: BarrierConfig) -> int:
    result: dict[str, int] = {}

    def wait() -> None:
        with StepWaiter(config) as waiter:
            result["step"] = waiter.wait(3, timeout=30)

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 15
    while not read_status(config).waiters and time.monotonic() < deadline:
        time.sleep(0.02)
    with StepPublisher(config) as publisher:
        publisher.publish(3)
        thread.join(30)
    return result["step"]


def test_chief_and_worker_over_tls_with_a_private_ca(tls: TlsSetup, job: str) -> None:
    config = BarrierConfig.from_env(
        {
            "STEPBARRIER_JOB": job,
            "STEPBARRIER_REDIS_URL": tls.url,
            "STEPBARRIER_TLS_CA_FILE": str(tls.ca.path),
            "STEPBARRIER_HEARTBEAT": "0.2",
        }
    )
    assert release_over(config) == 3


def test_client_certificates(mutual_tls: TlsSetup, job: str) -> None:
    config = BarrierConfig.from_env(
        {
            "STEPBARRIER_JOB": job,
            "STEPBARRIER_REDIS_URL": mutual_tls.url,
            "STEPBARRIER_TLS_CA_FILE": str(mutual_tls.ca.path),
            "STEPBARRIER_TLS_CERT_FILE": str(mutual_tls.client.cert),
            "STEPBARRIER_TLS_KEY_FILE": str(mutual_tls.client.key),
            "STEPBARRIER_HEARTBEAT": "0.2",
        }
    )
    assert release_over(config) == 3


def test_a_server_requiring_client_certificates_refuses_a_client_without_one(
    mutual_tls: TlsSetup, job: str
) -> None:
    config = BarrierConfig(job=job, redis_url=mutual_tls.url, tls_ca_file=str(mutual_tls.ca.path))
    with pytest.raises(RedisRefused) as info:
        read_status(config)
    assert info.value.kind == "tls"
    assert "STEPBARRIER_TLS_CERT_FILE" in str(info.value)


def test_a_wrong_ca_is_refused_with_a_clear_error_and_no_retries(
    tls: TlsSetup, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = BarrierConfig(job=job, redis_url=tls.url, tls_ca_file=str(tls.other_ca.path))
    caplog.set_level(logging.DEBUG, logger="stepbarrier")
    with pytest.raises(RedisRefused) as info:
        StepWaiter(config).wait(5, timeout=30)
    assert info.value.kind == "tls"
    assert "STEPBARRIER_TLS_CA_FILE" in str(info.value)
    assert "does not verify" in str(info.value)
    # refused at once, not retried for 30 s: every retry logs "...; retrying to ..."
    assert not [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]


def test_a_plain_connection_to_a_tls_only_server_does_not_downgrade(
    tls: TlsSetup, job: str
) -> None:
    config = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{tls.server.port}/0")
    # the TLS-only server drops plain text: named as a TLS mismatch, never downgraded
    with pytest.raises(RedisRefused) as info:
        StepWaiter(config).wait(5, timeout=2)
    assert info.value.kind == "tls" and "TLS" in str(info.value)


def test_a_worker_waiting_over_tls_outlives_a_restart_of_its_redis(tls: TlsSetup, job: str) -> None:
    """A TLS Redis killed and started again (empty) mid-wait: the link drops, which
    is an outage to retry, not a TLS refusal; the worker waits on and is released
    by the chief's next write, never early."""
    config = BarrierConfig.from_env(
        {
            "STEPBARRIER_JOB": job,
            "STEPBARRIER_REDIS_URL": tls.url,
            "STEPBARRIER_TLS_CA_FILE": str(tls.ca.path),
            "STEPBARRIER_HEARTBEAT": "0.2",
        }
    )
    result: dict[str, object] = {}

    def wait() -> None:
        try:
            with StepWaiter(config) as waiter:
                result["step"] = waiter.wait(5, timeout=60)
        except Exception as exc:  # the assertion below shows it
            result["error"] = exc

    thread = threading.Thread(target=wait)
    thread.start()
    deadline = time.monotonic() + 15
    while not read_status(config).waiters and time.monotonic() < deadline:
        time.sleep(0.02)
    assert read_status(config).waiters, "the worker never registered"
    tls.server.restart_empty()  # SIGKILL, then the same port again with no data
    time.sleep(1.0)  # the worker's subscription is gone with the old server
    assert thread.is_alive(), result  # still waiting: not failed, not released
    with StepPublisher(config) as publisher:
        publisher.publish(4)
        publisher.flush(10)
        time.sleep(0.5)  # the announcement of step 4 has reached the worker
        assert thread.is_alive(), result  # step 4 releases nobody waiting for 5
        publisher.publish(5)
        thread.join(60)
    assert result == {"step": 5}
