"""``stepbarrier exporter``: the metrics of live jobs on a real Redis, served over
HTTP; the exporter keeps serving, with ``stepbarrier_up 0``, while Redis is gone."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import IO

import pytest

from stepbarrier import BarrierConfig, RedisUnavailable
from stepbarrier._inspect.listing import JobListing, JobSummary
from stepbarrier.cli._exporter import JOB_GAUGES, METRIC_NAMES, JobsCollector, serve
from tests.conftest import subprocess_env
from tests.observability import eventually, job_value, live_job, prefix, scrape
from tests.redis_harness import RedisServer

CLI = [sys.executable, "-m", "stepbarrier"]


@pytest.fixture
def make(redis_server: RedisServer) -> Callable[[str], BarrierConfig]:
    def build(job: str) -> BarrierConfig:
        return BarrierConfig(job=job, redis_url=redis_server.url, heartbeat=0.2, stall_timeout=30)

    return build


def test_a_live_job_is_served_as_gauges_labelled_job_name(
    make: Callable[[str], BarrierConfig],
) -> None:
    name = prefix("served")
    job = f"{name}-job"
    before = time.time()  # the clock of Redis and of the waiters, on this machine
    with (
        live_job(make(job), 7, waits=(9, 15)),
        serve(make("any"), port=0, pattern=f"{name}-*") as server,
    ):
        samples = scrape(server.url)
    lasted = time.time() - before + 0.01  # (the ages are rounded to the millisecond)
    assert samples["stepbarrier_up"] == [({}, 1.0)]
    assert samples["stepbarrier_jobs"] == [({}, 1.0)]
    assert samples["stepbarrier_scrape_duration_seconds"][0][1] >= 0
    assert job_value(samples, "stepbarrier_step", job) == 7
    assert job_value(samples, "stepbarrier_waiting_workers", job) == 2
    assert job_value(samples, "stepbarrier_next_wait_until_step", job) == 9
    assert job_value(samples, "stepbarrier_done", job) == 0
    assert job_value(samples, "stepbarrier_problems", job) == 0
    assert (job_value(samples, "stepbarrier_generation", job) or 0) >= 1
    # both began within the test: no older than it (however long it took)
    assert 0 <= (job_value(samples, "stepbarrier_heartbeat_age_seconds", job) or -1) <= lasted
    assert 0 <= (job_value(samples, "stepbarrier_oldest_wait_seconds", job) or -1) <= lasted


def test_every_series_is_labelled_job_name_alone_never_job_or_a_worker(
    make: Callable[[str], BarrierConfig],
) -> None:
    name = prefix("labels")
    with (
        live_job(make(f"{name}-a"), 3, waits=(4, 5, 6)),
        live_job(make(f"{name}-b"), 8),
        serve(make("any"), port=0, pattern=f"{name}-*") as server,
    ):
        samples = scrape(server.url)
    assert set(samples) <= METRIC_NAMES
    for metric in JOB_GAUGES:
        for labels, _ in samples.get(metric, []):
            assert set(labels) == {"job_name"}, (metric, labels)
    assert len(samples["stepbarrier_waiting_workers"]) == 2  # one series per job, not per worker


def test_the_next_awaited_step_is_absent_when_no_worker_waits(
    make: Callable[[str], BarrierConfig],
) -> None:
    name = prefix("idle")
    with live_job(make(name), 4), serve(make("any"), port=0, pattern=name) as server:
        samples = scrape(server.url)
    assert job_value(samples, "stepbarrier_step", name) == 4
    assert job_value(samples, "stepbarrier_next_wait_until_step", name) is None
    assert job_value(samples, "stepbarrier_waiting_workers", name) == 0
    assert job_value(samples, "stepbarrier_oldest_wait_seconds", name) == 0


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def summary(job: str, step: int) -> JobSummary:
    return JobSummary(job, None, step, 1, False, 0.5, 0, None, None)


def test_scrapes_within_the_min_interval_share_one_reading_of_redis() -> None:
    reads: list[tuple[str, ...]] = []
    clock = FakeClock()

    def read(config: BarrierConfig, patterns: tuple[str, ...]) -> JobListing:
        reads.append(patterns)
        return JobListing((summary("j", len(reads)),))

    collector = JobsCollector(
        BarrierConfig(job="any"), pattern="t-*", min_interval=2.0, read=read, clock=clock
    )
    first = collector.reading()
    clock.now += 1.9
    assert collector.reading() is first and reads == [("t-*",)]
    clock.now += 0.1
    assert collector.reading().listing == JobListing((summary("j", 2),))
    assert reads == [("t-*",), ("t-*",)]


def test_a_failed_reading_is_up_0_with_no_job_series_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = FakeClock()
    failing = [True]

    def read(config: BarrierConfig, patterns: tuple[str, ...]) -> JobListing:
        if failing[0]:
            raise RedisUnavailable("Redis at redis://nowhere:6379/0 is unreachable")
        return JobListing((summary("back", 3),))

    collector = JobsCollector(BarrierConfig(job="any"), min_interval=0.0, read=read, clock=clock)
    with caplog.at_level("WARNING", logger="stepbarrier.exporter"):
        for _ in range(3):
            names = {family.name: family for family in collector.collect()}
            assert set(names) == {
                "stepbarrier_up",
                "stepbarrier_redis_busy",
                "stepbarrier_scrape_duration_seconds",
            }
            assert names["stepbarrier_up"].samples[0].value == 0
        failing[0] = False
        names = {family.name: family for family in collector.collect()}
    assert names["stepbarrier_up"].samples[0].value == 1
    assert names["stepbarrier_step"].samples[0].labels == {"job_name": "back"}
    assert [record.getMessage().split(" (")[0] for record in caplog.records] == [
        "cannot read the jobs",
        "reading the jobs again",
    ]


class ExporterProcess:
    """``stepbarrier exporter --port 0`` in a process of its own; the URL it prints."""

    def __init__(self, redis_url: str, *args: str) -> None:
        command = [*CLI, "exporter", "--port", "0", "--min-interval", "0.2"]
        self.process = subprocess.Popen(
            [*command, "--redis-url", redis_url, *args],
            env=subprocess_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        line = stdout.readline()
        found = re.search(r"serving (http://\S+/metrics)", line)
        assert found, line + self.stop()[1]
        self.url = found.group(1)

    def stop(self) -> tuple[int, str]:
        """SIGTERM, as a container's stop: the exit code and stderr."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        _, err = self.process.communicate(timeout=30)
        return self.process.returncode, err


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    server = RedisServer()
    server.start()
    yield server
    server.cleanup()


def test_with_redis_gone_the_exporter_serves_up_0_then_recovers(own_redis: RedisServer) -> None:
    name = prefix("outage")
    config = BarrierConfig(job=name, redis_url=own_redis.url, heartbeat=0.2, stall_timeout=30)
    exporter = ExporterProcess(own_redis.url, "--job", name)
    try:
        with live_job(config, 6):
            eventually(lambda: job_value(scrape(exporter.url), "stepbarrier_step", name) == 6)
        own_redis.kill()
        eventually(lambda: scrape(exporter.url)["stepbarrier_up"] == [({}, 0.0)], what="up 0")
        down = scrape(exporter.url)  # still serving, and no stale job series
        assert "stepbarrier_step" not in down and "stepbarrier_jobs" not in down
        own_redis.start()
        with live_job(config, 11):
            eventually(lambda: job_value(scrape(exporter.url), "stepbarrier_step", name) == 11)
        assert scrape(exporter.url)["stepbarrier_up"] == [({}, 1.0)]
    finally:
        code, err = exporter.stop()
    assert code == 0, err
    assert err.count("cannot read the jobs") == 1 and "reading the jobs again" in err


def test_the_exporter_starts_and_serves_while_redis_is_unreachable() -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        port = unused.getsockname()[1]
    exporter = ExporterProcess(f"redis://127.0.0.1:{port}/0")
    try:
        assert scrape(exporter.url)["stepbarrier_up"] == [({}, 0.0)]
    finally:
        code, err = exporter.stop()
    assert code == 0, err


def test_a_port_in_use_is_a_clean_usage_error(redis_server: RedisServer) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [*CLI, "exporter", "--port", str(port), "--redis-url", redis_server.url],
            env=subprocess_env(),
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "Traceback" not in done.stderr


def test_without_prometheus_client_the_error_names_the_extra() -> None:
    block = "import sys; sys.modules['prometheus_client'] = None; "
    made = subprocess.run(
        [sys.executable, "-c", block + "from stepbarrier.cli._exporter import serve; "
         "from stepbarrier import BarrierConfig; serve(BarrierConfig(job='j'), port=0)"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )  # fmt: skip
    assert made.returncode == 1
    assert "ImportError: the stepbarrier exporter needs prometheus-client" in made.stderr
    assert "pip install 'stepbarrier[exporter]'" in made.stderr
    command = subprocess.run(
        [sys.executable, "-c", block + "from stepbarrier.cli import main; main(['exporter'])"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert command.returncode == 2
    assert command.stderr.startswith("Error: the stepbarrier exporter needs prometheus-client")
    assert "stepbarrier[exporter]" in command.stderr


def test_close_stops_serving_and_releases_the_port(
    make: Callable[[str], BarrierConfig],
) -> None:
    with serve(make("any"), port=0, pattern=prefix("plain")) as server:
        request = urllib.request.Request(server.url, headers={"Accept": "text/plain"})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.headers["Content-Type"].startswith("text/plain")
            assert b"stepbarrier_up 1.0" in response.read()
    with pytest.raises(urllib.error.URLError):  # closed: nothing listens there any more
        urllib.request.urlopen(server.url, timeout=5)
    with serve(make("any"), port=server.port, pattern=prefix("plain")) as again:  # a restart
        assert scrape(again.url)["stepbarrier_up"] == [({}, 1.0)]
