"""Fixtures of the reliability scenarios: a Redis per test, a fleet of processes, timings."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig, read_status
from tests.redis_harness import RedisServer
from tests.reliability.processes import Fleet, Worker, wait_until

HEARTBEAT = 0.2
"""The chief's heartbeat in every scenario (seconds)."""
FALLBACK = 1.0
"""The library workers' re-read interval (the default is 5 s)."""

_timings: list[tuple[str, str, float]] = []


class Timings:
    """Recovery times of one scenario, printed in pytest's summary."""

    def __init__(self, test: str) -> None:
        self.test = test
        self.values: dict[str, float] = {}

    def record(self, what: str, seconds: float) -> float:
        self.values[what] = seconds
        _timings.append((self.test, what, seconds))
        return seconds


@pytest.fixture
def timings(request: pytest.FixtureRequest) -> Timings:
    return Timings(request.node.name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _timings:
        return
    terminalreporter.section("stepbarrier reliability: recovery times")
    for test, what, seconds in _timings:
        terminalreporter.write_line(f"{test}: {what}: {seconds:.3f} s")


@pytest.fixture
def server() -> Iterator[RedisServer]:
    """A redis-server of this test alone (it is killed and restarted)."""
    redis_server = RedisServer()
    redis_server.start()
    try:
        yield redis_server
    finally:
        redis_server.cleanup()


@pytest.fixture
def fleet(tmp_path: Path, job: str, server: RedisServer) -> Iterator[Fleet]:
    """The job's processes, configured for ``server``; all killed at the end."""
    processes = Fleet(
        tmp_path,
        {
            "STEPBARRIER_JOB": job,
            "STEPBARRIER_REDIS_URL": server.url,
            "STEPBARRIER_HEARTBEAT": str(HEARTBEAT),
            "STEPBARRIER_STALL_TIMEOUT": "30",
        },
    )
    try:
        yield processes
    finally:
        processes.stop_all()


def wait_for_waiters(
    config: BarrierConfig, count: int, workers: Sequence[Worker] = (), timeout: float = 30.0
) -> None:
    """Until ``count`` workers are registered on the job; fails at once if one of
    ``workers`` has already ended (released by something it should not trust)."""

    def registered() -> bool:
        for worker in workers:
            outcome = worker.outcome()
            if outcome is not None:
                raise AssertionError(f"{worker.name} ended before every worker waited: {outcome}")
        return len(read_status(config).waiters) >= count

    wait_until(registered, timeout, f"{count} waiters registered on job {config.job}", 0.05)
