"""A wait with a second witness of the step (``StepSource``), on a real Redis.

TensorFlow's hook hands the waiter the session's global step this way; here a
plain counter plays it. The wait is released by whichever comes first, and is
never less patient than the source alone: Redis down or refusing leaves the
source to wait on, and the stall timeout holds only once a chief was seen.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from stepbarrier import (
    BarrierConfig,
    BarrierTimeout,
    StepPublisher,
    StepSource,
    StepWaiter,
    read_status,
)
from stepbarrier._worker.waiter import SOURCE_SOCKET_TIMEOUT
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer, free_port

NAME = "the counter"


class Counter:
    """A step that a test moves; counts its reads."""

    def __init__(self, step: int = 0) -> None:
        self.step = step
        self.reads = 0

    def read(self) -> int:
        self.reads += 1
        return self.step

    def source(self, **overrides: Any) -> StepSource:
        settings: dict[str, Any] = {"read": self.read, "name": NAME, "interval": 0.05}
        settings.update(overrides)
        return StepSource(**settings)

    def move_to(self, step: int, after: float) -> threading.Timer:
        def move() -> None:
            self.step = step

        timer = threading.Timer(after, move)
        timer.daemon = True
        timer.start()
        return timer


class ForbiddenClient:
    """A Redis client that fails the test when the waiter uses it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the waiter touched Redis ({name})")


def down_config(make_config: Callable[..., BarrierConfig], **overrides: Any) -> BarrierConfig:
    return make_config(redis_url=f"redis://127.0.0.1:{free_port()}/0", **overrides)


def warnings_of(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def test_a_source_already_at_the_step_releases_before_redis_is_touched(
    config: BarrierConfig,
) -> None:
    counter = Counter(12)
    waiter = StepWaiter(config, client=ForbiddenClient())  # type: ignore[arg-type]
    assert waiter.wait(10, source=counter.source()) == 12
    assert waiter.last_released_by == NAME
    assert counter.reads == 1


def test_without_a_publisher_the_source_releases_and_says_how_to_add_one(
    config: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    counter = Counter(3)
    counter.move_to(10, after=0.4)
    with StepWaiter(config) as waiter:
        step = waiter.wait(10, timeout=30, source=counter.source(hint="add a publisher"))
    assert (step, waiter.last_released_by) == (10, NAME)
    said = warnings_of(caplog, "before any write of this job's chief was seen")
    assert len(said) == 1 and said[0].endswith("add a publisher"), said
    assert read_status(config).waiters == ()  # it left the registry


def test_redis_down_from_the_start_is_said_once_and_the_source_releases(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    config = down_config(make_config)
    counter = Counter(0)
    counter.move_to(7, after=2.5)  # past the first retries and the first try again
    with StepWaiter(config) as waiter:
        assert waiter.wait(7, timeout=60, source=counter.source()) == 7
    assert len(warnings_of(caplog, f"waiting on {NAME} alone")) == 1
    # the retries say nothing more (the one line above says what it means)
    assert warnings_of(caplog, "retrying") == []


def test_redis_refusing_is_said_once_and_the_source_releases(
    make_config: Callable[..., BarrierConfig],
    redis_server: RedisServer,
    caplog: pytest.LogCaptureFixture,
) -> None:
    url = redis_server.url.replace("redis://", "redis://nobody:wrong-secret@")
    config = make_config(redis_url=url)
    counter = Counter(0)
    counter.move_to(4, after=1.0)
    with StepWaiter(config) as waiter:
        assert waiter.wait(4, timeout=60, source=counter.source()) == 4
    said = warnings_of(caplog, f"waiting on {NAME} alone")
    assert len(said) == 1 and "wrong-secret" not in said[0], said
    assert "trying Redis again" not in said[0]  # a refusal needs an operator


def test_no_stall_timeout_before_a_chief_was_seen(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.1, stall_timeout=0.5)
    counter = Counter(0)
    counter.move_to(5, after=1.5)  # three stall timeouts later
    with StepWaiter(config) as waiter:
        assert waiter.wait(5, timeout=30, source=counter.source()) == 5


def test_once_a_chief_was_seen_its_silence_ends_the_wait_at_the_stall_timeout(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.1, stall_timeout=1.0)
    counter = Counter(3)  # the session's step does not move either
    publisher = StepPublisher(config)
    publisher.publish(3)
    assert publisher.flush(10)
    seen = threading.Event()

    def stop_chief_once_seen() -> None:
        deadline = time.monotonic() + 20
        while not read_status(config).waiters and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the registration's write is seen
        publisher.close(done=False)
        seen.set()

    threading.Thread(target=stop_chief_once_seen, daemon=True).start()
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as caught:
        waiter.wait(10, timeout=30, source=counter.source())
    assert seen.is_set() and caught.value.stalled
    assert f"{NAME} at 3" in str(caught.value)


def test_a_moving_source_counts_as_training_going_on(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.1, stall_timeout=1.0)
    counter = Counter(3)
    with StepPublisher(config) as publisher:
        publisher.publish(3)
        assert publisher.flush(10)
    # the chief is gone; other workers move the step, slower than the stall timeout
    stop = threading.Event()

    def train() -> None:
        while not stop.wait(0.3):
            counter.step += 1

    threading.Thread(target=train, daemon=True).start()
    try:
        with StepWaiter(config) as waiter:
            assert waiter.wait(12, timeout=30, source=counter.source()) >= 12
        assert waiter.last_released_by == NAME
    finally:
        stop.set()


def test_the_overall_timeout_still_holds_and_says_no_chief_was_seen(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = down_config(make_config)
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as caught:
        waiter.wait(5, timeout=2.0, source=Counter(1).source())
    message = str(caught.value)
    assert "no write of this job's chief was ever seen" in message
    # the likely cause: not a missing publisher, but a Redis that never answered
    assert "did not answer this wait" in message and f"{NAME} at 1" in message


def test_an_announcement_releases_first_and_the_source_is_then_read_slowly(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.1)
    counter = Counter(0)
    read_at: list[float] = []

    def read() -> int:
        read_at.append(time.monotonic())
        return counter.read()

    with StepPublisher(config) as publisher:
        publisher.publish(1)

        def chief() -> None:
            deadline = time.monotonic() + 20
            while not read_status(config).waiters and time.monotonic() < deadline:
                time.sleep(0.01)
            # the source is read every 0.05 s until a write of the chief (every
            # 0.1 s) was seen, then every 30 s: step 8 comes only once no read
            # came for ten fast intervals. Reads that go on at the fast pace keep
            # it from coming, and the wait then ends in its timeout
            while time.monotonic() < deadline:
                before = len(read_at)
                time.sleep(0.5)
                if before and len(read_at) == before:
                    publisher.publish(8)
                    return

        threading.Thread(target=chief, daemon=True).start()
        with StepWaiter(config) as waiter:
            source = StepSource(read=read, name=NAME, interval=0.05, interval_with_chief=30.0)
            assert waiter.wait(8, timeout=30, source=source) == 8
    assert waiter.last_released_by == "an announcement"
    assert counter.step == 0  # the source never had step 8: the chief's write released it


def test_what_the_source_raises_ends_the_wait_and_the_worker_leaves_the_registry(
    config: BarrierConfig,
) -> None:
    reads = 0

    def broken() -> int:
        nonlocal reads
        reads += 1
        if reads > 3:
            raise RuntimeError("the parameter server is gone")
        return 0

    with StepWaiter(config) as waiter, pytest.raises(RuntimeError, match="parameter server"):
        waiter.wait(5, timeout=30, source=StepSource(read=broken, name=NAME, interval=0.05))
    assert read_status(config).waiters == ()


def test_no_chief_seen_is_warned_early_naming_the_job_the_url_and_the_causes(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(no_chief_warning=0.3)
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as caught:
        waiter.wait(5, timeout=1.2)
    said = warnings_of(caplog, "no write of this job's chief seen")
    assert len(said) == 1, said
    assert config.job in said[0] and config.safe_url in said[0]  # safe_url: masked
    assert "Likely causes" in said[0] and "STEPBARRIER_JOB" in said[0]
    assert "no write of this job's chief was ever seen" in str(caught.value)


def test_the_warning_is_not_given_once_a_chief_was_seen(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    # the chief's heartbeats (every 0.1 s) are writes the wait sees well before 1 s
    config = make_config(no_chief_warning=1.0, heartbeat=0.1)
    with StepPublisher(config) as publisher:
        publisher.publish(1)
        with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout):
            waiter.wait(5, timeout=2.0)
    assert warnings_of(caplog, "no write of this job's chief seen") == []


def test_the_asyncio_waiter_warns_early_too(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    from stepbarrier.aio import AsyncStepWaiter

    config = make_config(no_chief_warning=0.3)

    async def scenario() -> None:
        async with AsyncStepWaiter(config) as waiter:
            await waiter.wait(5, timeout=1.2)

    with pytest.raises(BarrierTimeout) as caught:
        asyncio.run(scenario())
    said = warnings_of(caplog, "no write of this job's chief seen")
    assert len(said) == 1 and config.job in said[0] and "Likely causes" in said[0], said
    assert "no write of this job's chief was ever seen" in str(caught.value)


def test_stepbarrier_wait_warns_early_too(redis_server: RedisServer, job: str) -> None:
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_JOB=job,
        STEPBARRIER_NO_CHIEF_WARNING="0.3",
    )
    result = subprocess.run(
        [sys.executable, "-m", "stepbarrier", "wait", "--until", "5", "--timeout", "1.5"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode != 0
    assert result.stderr.count("no write of this job's chief seen") == 1, result.stderr
    assert "Likely causes" in result.stderr
    assert "no write of this job's chief was ever seen" in result.stderr


def test_a_hung_redis_delays_the_source_s_reads_by_one_short_socket_timeout_at_most(
    job: str,
) -> None:
    # a stopped redis-server: TCP connects succeed, nothing is ever answered
    server = RedisServer()
    server.start()
    try:
        assert server.process is not None
        config = BarrierConfig(job=job, redis_url=server.url)
        server.process.send_signal(signal.SIGSTOP)
        counter = Counter(0)
        read_at: list[float] = []

        def read() -> int:
            read_at.append(time.monotonic())
            return counter.read()

        counter.move_to(3, after=3.0)
        started = time.monotonic()
        with StepWaiter(config, socket_timeout=SOURCE_SOCKET_TIMEOUT) as waiter:
            source = StepSource(read=read, name=NAME, interval=0.1)
            assert waiter.wait(3, timeout=60, source=source) == 3
            returned = time.monotonic()
        gaps = [b - a for a, b in zip([started, *read_at], read_at, strict=False)]
        # a reply waited for 10 s (the default socket timeout) would leave a gap that long
        assert max(gaps) < 4 * SOURCE_SOCKET_TIMEOUT, gaps
        assert returned - read_at[-1] < 4 * SOURCE_SOCKET_TIMEOUT  # no unregister try
    finally:
        if server.process is not None:
            server.process.send_signal(signal.SIGCONT)
        server.cleanup()


def reads_stop(counter: Counter, quiet: float = 0.5) -> None:
    """Return once ``counter`` was read, then not for ``quiet`` s: the slow pace (the
    deadline only ends a test whose reads go on at the fast pace)."""
    deadline = time.monotonic() + 20
    while True:
        before = counter.reads
        time.sleep(quiet)
        if before and counter.reads == before:
            return
        assert time.monotonic() < deadline, "the source is still read at the fast pace"


def test_once_redis_is_lost_the_source_is_read_at_its_own_pace_again(job: str) -> None:
    """A chief was seen (the source is then read only every ``interval_with_chief``,
    an hour here), then Redis is lost: the source is the only witness left and is
    read every ``interval`` again, so its step releases the wait, not a slow read
    an hour later."""
    server = RedisServer()
    server.start()
    try:
        config = BarrierConfig(job=job, redis_url=server.url, heartbeat=0.1)
        counter = Counter(0)
        result: dict[str, Any] = {}

        def wait() -> None:
            with StepWaiter(config) as waiter:
                source = counter.source(interval=0.05, interval_with_chief=3600.0)
                result["step"] = waiter.wait(8, timeout=60, source=source)
                result["by"] = waiter.last_released_by

        with StepPublisher(config) as publisher:
            publisher.publish(1)
            thread = threading.Thread(target=wait, daemon=True)
            thread.start()
            deadline = time.monotonic() + 20
            while not read_status(config).waiters and time.monotonic() < deadline:
                time.sleep(0.01)
            # heartbeats every 0.1 s: once the worker has seen its chief, the slow pace
            reads_stop(counter)
            server.kill()
            time.sleep(0.5)
            counter.step = 8
            thread.join(25)  # (only ends a test that hangs: the slow pace is an hour)
    finally:
        server.cleanup()
    assert result == {"step": 8, "by": NAME}, result  # read again at the fast pace
