"""Authentication failures: a clean error at once, never retried, never leaking the password."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from stepbarrier import BarrierConfig, RedisRefused, StepPublisher, StepWaiter, read_status
from tests.redis_harness import RedisServer

SECRET = "correct-horse-battery-staple"
WRONG = "Tr0ub4dor-and-3-wrong"


@pytest.fixture(scope="module")
def protected() -> Iterator[RedisServer]:
    server = RedisServer(args=["--requirepass", SECRET])
    server.start()
    admin = server.client(password=SECRET)
    admin.execute_command("ACL", "SETUSER", "alice", "on", f">{SECRET}", "~*", "&*", "+@all")
    admin.close()
    yield server
    server.cleanup()


def connections(server: RedisServer) -> int:
    admin = server.client(password=SECRET)
    try:
        return int(admin.info("stats")["total_connections_received"])
    finally:
        admin.close()


@contextlib.contextmanager
def debug_logs(caplog: pytest.LogCaptureFixture) -> Iterator[None]:
    """Capture every log record, whatever levels earlier code set on our loggers."""
    with caplog.at_level(logging.DEBUG), caplog.at_level(logging.DEBUG, logger="stepbarrier"):
        yield


CASES = {
    "wrong password": {"redis_password": WRONG},
    "missing password": {},
    "unknown user": {"redis_username": "mallory", "redis_password": WRONG},
    "known user, wrong password": {"redis_username": "alice", "redis_password": WRONG},
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("operation", ["wait", "status"])
def test_refused_at_once_without_retries_and_without_the_password(
    protected: RedisServer,
    job: str,
    case: str,
    operation: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    config = BarrierConfig(job=job, redis_url=protected.url, **CASES[case])
    run: Callable[[], Any] = (
        (lambda: StepWaiter(config).wait(5, timeout=30))
        if operation == "wait"
        else (lambda: read_status(config))
    )
    before = connections(protected)
    with debug_logs(caplog), pytest.raises(RedisRefused) as info:
        run()
    attempts = connections(protected) - before - 1  # minus our own INFO connection
    assert info.value.kind == "authentication"
    # refused at once, not retried until the 30 s timeout: every retry of the
    # library logs "...; retrying to ..."
    assert attempts <= 2, f"{attempts} connection attempts: authentication was retried"
    assert not [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    message = str(info.value)
    assert "authentication" in message and "STEPBARRIER_REDIS_PASSWORD" in message
    for text in [message, *(r.getMessage() for r in caplog.records), caplog.text]:
        assert WRONG not in text and SECRET not in text


def test_a_password_in_the_url_is_masked_in_errors(protected: RedisServer, job: str) -> None:
    url = f"redis://default:{WRONG}@127.0.0.1:{protected.port}/0"
    with pytest.raises(RedisRefused) as info:
        read_status(BarrierConfig(job=job, redis_url=url))
    assert WRONG not in str(info.value)
    assert "***" in str(info.value)


def test_the_chief_keeps_training_and_reports_the_refusal(
    protected: RedisServer, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    config = BarrierConfig(job=job, redis_url=protected.url, redis_password=WRONG, heartbeat=0.2)
    with debug_logs(caplog):
        publisher = StepPublisher(config)
        for step in range(100):
            publisher.publish(step)  # never raises for a Redis problem
        assert not publisher.flush(1.0)
        assert publisher.last_error is not None
        assert not publisher.close(timeout=1.0)
    assert any("authentication" in r.getMessage() for r in caplog.records)
    assert WRONG not in caplog.text


def test_the_right_credentials_work(protected: RedisServer, job: str) -> None:
    config = BarrierConfig(
        job=job, redis_url=protected.url, redis_username="alice", redis_password=SECRET
    )
    with StepPublisher(config) as publisher:
        publisher.publish(4)
        assert publisher.flush(5.0)
        assert StepWaiter(config).wait(4, timeout=10) == 4
    assert read_status(config).done
