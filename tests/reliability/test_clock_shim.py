"""The stateful fault test's clock shim puts a redis-server's TIME behind, and only its own."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.reliability.clock_shim import ClockShiftedRedisServer, ShimUnavailable, build_clock_shim

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(60)]

HOUR = 3600.0


@pytest.fixture
def shim(tmp_path: Path) -> Path:
    try:
        return build_clock_shim(tmp_path / "shim")
    except ShimUnavailable as exc:
        print(f"clock shim not built: {exc}")
        pytest.skip(str(exc))  # a platform without a C compiler


@pytest.fixture
def shifted(shim: Path) -> Iterator[ClockShiftedRedisServer]:
    server = ClockShiftedRedisServer(shim)
    server.shift = -HOUR
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


def redis_time(server: ClockShiftedRedisServer) -> float:
    client = server.client()
    try:
        seconds, micros = client.time()
    finally:
        client.close()
    return seconds + micros / 1e6


def test_a_shifted_redis_servers_time_is_behind(shifted: ClockShiftedRedisServer) -> None:
    before = time.time()
    behind = redis_time(shifted)
    after = time.time()
    # an hour behind, give or take the round trip (a clock compared with a clock here
    # is the point of the test, not a bound on how fast anything runs)
    assert before - HOUR - 60 <= behind <= after - HOUR + 60


def test_scripts_read_the_shifted_clock_and_expiries_still_run(
    shifted: ClockShiftedRedisServer,
) -> None:
    client = shifted.client()
    try:
        seconds = int(client.eval("return redis.call('TIME')[1]", 0))
        ours = time.time()
        assert seconds <= ours - HOUR + 60
        client.set("short", "1", px=50)
        deadline = time.monotonic() + 30
        while client.exists("short") and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not client.exists("short")  # monotonic timers are left alone
    finally:
        client.close()


def test_a_restart_without_shift_brings_the_clock_back(shifted: ClockShiftedRedisServer) -> None:
    shifted.shift = 0.0
    shifted.restart_empty()
    theirs, ours = redis_time(shifted), time.time()
    assert abs(theirs - ours) < 60
