"""Fixtures of the cluster tests: one real local Redis Cluster per test module, and timings."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from tests.cluster_harness import LocalCluster

_timings: list[tuple[str, str, float]] = []


class Timings:
    """How long the cluster operations of one test took, printed in pytest's summary."""

    def __init__(self, test: str) -> None:
        self.test = test

    def record(self, what: str, seconds: float) -> float:
        _timings.append((self.test, what, seconds))
        return seconds


@pytest.fixture
def timings(request: pytest.FixtureRequest) -> Timings:
    return Timings(request.node.name)


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not _timings:
        return
    terminalreporter.section("stepbarrier cluster: start, migration and failover times")
    for test, what, seconds in _timings:
        terminalreporter.write_line(f"{test}: {what}: {seconds:.3f} s")


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """A 6-node cluster (3 masters, 3 replicas) of this test module alone."""
    started = time.monotonic()
    with LocalCluster() as local:
        Timings(request.module.__name__).record("cluster start", time.monotonic() - started)
        yield local
