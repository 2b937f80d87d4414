"""StepWaiter against a real redis-server, in threads and in separate processes."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    BarrierTimeout,
    RedisUnavailable,
    StepPublisher,
    StepWaiter,
    read_status,
)
from stepbarrier._inspect.reset import reset_job
from tests.conftest import subprocess_env
from tests.redis_harness import free_port


class Background:
    """Runs ``wait`` in a thread and keeps its result or error."""

    def __init__(self, config: BarrierConfig, target: int, timeout: float | None = 30.0) -> None:
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(
            target=self._run, args=(config, target, timeout), daemon=True
        )
        self.thread.start()

    def _run(self, config: BarrierConfig, target: int, timeout: float | None) -> None:
        try:
            with StepWaiter(config) as waiter:
                self.result = waiter.wait(target, timeout=timeout)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 30.0) -> Background:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the wait did not end"
        return self


def wait_for_waiters(config: BarrierConfig, count: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if len(read_status(config).waiters) >= count:
            return
        time.sleep(0.02)
    raise AssertionError(f"{count} waiters did not register")


class FakeClock:
    """A monotonic clock that jumps ahead on every reading."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_until_step_zero_or_less_returns_at_once_without_redis(job: str) -> None:
    nowhere = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    waiter = StepWaiter(nowhere)
    assert waiter.wait(0) == 0
    assert waiter.wait(-5) == 0


def test_a_waiter_arriving_after_its_step_returns_at_once(config: BarrierConfig) -> None:
    with StepPublisher(config) as publisher:
        publisher.publish(40)
        assert publisher.flush(5.0)
        with StepWaiter(config) as waiter:
            assert waiter.wait(25, timeout=10) == 40


def test_a_waiter_arriving_before_any_chief_is_released_by_it(config: BarrierConfig) -> None:
    waiting = Background(config, 3)
    wait_for_waiters(config, 1)
    assert waiting.result is None
    with StepPublisher(config) as publisher:
        for step in range(1, 6):
            publisher.publish(step)
            time.sleep(0.01)
        waiting.join()
    assert waiting.error is None
    assert waiting.result is not None and waiting.result >= 3


def test_no_waiter_is_released_before_its_step(config: BarrierConfig) -> None:
    targets = [5, 20, 60]
    waiters = {t: Background(config, t) for t in targets}
    wait_for_waiters(config, 3)
    released_at: dict[int, int] = {}
    with StepPublisher(config) as publisher:
        for step in range(1, 81):
            publisher.publish(step)
            time.sleep(0.005)
            for target, bg in waiters.items():
                if target not in released_at and not bg.thread.is_alive():
                    released_at[target] = step
        for bg in waiters.values():
            bg.join()
    for target, bg in waiters.items():
        assert bg.error is None
        assert bg.result is not None and bg.result >= target
        # a waiter released while the chief was at step s saw a step <= s
        assert target <= released_at.get(target, 80)


def test_publish_and_wait_across_separate_processes(config: BarrierConfig) -> None:
    code = (
        "import json, sys, time; from stepbarrier import *; "
        f"cfg = BarrierConfig(job={config.job!r}, redis_url={config.redis_url!r}, "
        "task_id=int(sys.argv[1])); "
        "w = StepWaiter(cfg); got = w.wait(int(sys.argv[2]), timeout=60); "
        "print(json.dumps({'got': got}))"
    )
    children = [
        subprocess.Popen(
            [sys.executable, "-c", code, str(task), str(target)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=subprocess_env(),
        )
        for task, target in ((1, 10), (2, 30))
    ]
    wait_for_waiters(config, 2, timeout=30)
    status = read_status(config)
    assert sorted((w.task_id, w.wait_until_step) for w in status.waiters) == [(1, 10), (2, 30)]
    with StepPublisher(config) as publisher:
        for step in range(1, 41):
            publisher.publish(step)
            time.sleep(0.01)
        outputs = [child.communicate(timeout=60) for child in children]
    for (out, err), child, target in zip(outputs, children, (10, 30), strict=True):
        assert child.returncode == 0, err.decode()
        assert json.loads(out)["got"] >= target


def test_close_with_done_aborts_waiters_whose_step_did_not_come(config: BarrierConfig) -> None:
    waiting = Background(config, 1000)
    wait_for_waiters(config, 1)
    publisher = StepPublisher(config)
    publisher.publish(10)
    publisher.close(done=True)
    waiting.join(10)
    assert isinstance(waiting.error, BarrierAborted)
    assert waiting.error.reason == "done"
    assert waiting.error.target == 1000 and waiting.error.last_step == 10


def test_a_waiter_arriving_after_the_job_finished_short_of_its_step_aborts(
    make_config: Callable[..., BarrierConfig],
) -> None:
    # the same run id says the finished state is this run's own, not an earlier one's
    config = make_config(heartbeat=0.2, stall_timeout=30.0, run_id="run-1")
    publisher = StepPublisher(config)
    publisher.publish(10)
    publisher.close(done=True)
    with StepWaiter(config) as waiter:
        assert waiter.wait(5, timeout=10) == 10  # its step came before the end
        with pytest.raises(BarrierAborted):
            waiter.wait(11, timeout=10)


def test_reset_aborts_waiters(config: BarrierConfig) -> None:
    waiting = Background(config, 50)
    wait_for_waiters(config, 1)
    removed = reset_job(config)
    waiting.join(10)
    assert removed == 1
    assert isinstance(waiting.error, BarrierAborted) and waiting.error.reason == "reset"
    assert read_status(config).step is None


def test_overall_timeout_with_an_injected_clock(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(stall_timeout=100_000.0)
    clock = FakeClock(step=7.0)
    waiter = StepWaiter(config, clock=clock)
    # far longer than any test may run (pytest's --timeout): only the fake clock,
    # not real time, can have run out
    with pytest.raises(BarrierTimeout) as info:
        waiter.wait(10, timeout=3600.0)
    assert clock.now >= 1000.0 + 3600.0  # the wait read the fake time past its deadline
    error = info.value
    assert not error.stalled
    assert error.target == 10 and error.job == config.job
    assert "overall timeout" in str(error)


def test_stall_timeout_when_the_chief_stops_heartbeating(
    make_config: Callable[..., BarrierConfig],
) -> None:
    cfg = make_config(heartbeat=0.1, stall_timeout=1.0)
    publisher = StepPublisher(cfg)
    publisher.publish(3)
    assert publisher.flush(5.0)
    publisher.close(done=False)  # the chief is gone, without finishing the job
    with StepWaiter(cfg) as waiter, pytest.raises(BarrierTimeout) as info:
        waiter.wait(10, timeout=60)
    assert info.value.stalled
    assert info.value.last_step == 3
    # the wait saw no write happen: it says so, and claims no heartbeat age
    assert info.value.heartbeat_age is None
    assert "no write of this run's chief observed since the wait began" in str(info.value)
    assert "stall timeout" in str(info.value)


def test_stall_timeout_with_an_injected_clock_and_no_chief(
    make_config: Callable[..., BarrierConfig],
) -> None:
    cfg = make_config(heartbeat=1.0, stall_timeout=60.0)
    waiter = StepWaiter(cfg, clock=FakeClock(step=5.0))
    with pytest.raises(BarrierTimeout) as info:
        waiter.wait(10)
    assert info.value.stalled and info.value.last_step is None


def test_proceed_starts_with_a_warning_instead_of_raising(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    cfg = make_config(on_timeout="proceed")
    with StepPublisher(cfg) as publisher:
        publisher.publish(4)
        assert publisher.flush(5.0)
        waiter = StepWaiter(cfg, clock=FakeClock(step=3.0))
        with caplog.at_level(logging.WARNING, logger="stepbarrier"):
            assert waiter.wait(10, timeout=20.0) == 4
    assert any("proceeding" in r.getMessage() for r in caplog.records)


def test_a_dead_chiefs_step_is_not_trusted(make_config: Callable[..., BarrierConfig]) -> None:
    """A crashed chief may restart from an older checkpoint: its step is not the truth."""
    cfg = make_config(heartbeat=0.1, stall_timeout=30.0)
    old = StepPublisher(cfg)
    old.publish(100)
    assert old.flush(5.0)
    old.close(done=False)
    time.sleep(5.2)  # longer than the freshness limit: the chief is dead
    waiting = Background(cfg, 50)
    wait_for_waiters(cfg, 1)
    restarted = StepPublisher(cfg)  # restored at step 30
    restarted.publish(30)
    assert restarted.flush(5.0)
    time.sleep(0.3)
    assert waiting.thread.is_alive(), "released by the stale step 100"
    for step in range(31, 55):
        restarted.publish(step)
        time.sleep(0.005)
    waiting.join()
    restarted.close()
    assert waiting.error is None and waiting.result is not None
    assert 50 <= waiting.result < 100


def test_the_registry_shows_waiters_and_forgets_them(config: BarrierConfig) -> None:
    cfg = BarrierConfig(job=config.job, redis_url=config.redis_url, task_id=4, heartbeat=0.2)
    before = time.time()
    waiting = Background(cfg, 25)
    wait_for_waiters(cfg, 1)
    (entry,) = read_status(cfg).waiters
    assert (entry.task_id, entry.wait_until_step) == (4, 25)
    # when the wait began: after `before`, and before the entry was read (the 1 ms is
    # its rounding to "%.3f")
    assert entry.host and entry.pid and entry.since is not None
    assert before - 0.001 <= entry.since <= time.time() + 0.001
    with StepPublisher(cfg) as publisher:
        publisher.publish(25)
        waiting.join()
        assert read_status(cfg).waiters == ()


def test_malformed_payloads_are_logged_and_ignored(
    config: BarrierConfig, client: redis.Redis, caplog: pytest.LogCaptureFixture
) -> None:
    client.hset(config.keys.state, mapping={"step": "lots", "generation": "\xff"})
    with caplog.at_level(logging.WARNING, logger="stepbarrier"):
        waiting = Background(config, 5)
        wait_for_waiters(config, 1)
        for garbage in [b"\xff\xfe", b"not json", b'{"step": "99"}', b"[]", b'{"step":99}']:
            client.publish(config.keys.channel, garbage)
        time.sleep(0.3)
        assert waiting.thread.is_alive()
        with StepPublisher(config) as publisher:
            publisher.publish(5)
            waiting.join()
    assert waiting.error is None and waiting.result == 5
    messages = " ".join(r.getMessage() for r in caplog.records)
    assert "malformed" in messages


def test_wrong_type_in_the_state_key_does_not_crash_a_waiter(
    config: BarrierConfig, client: redis.Redis
) -> None:
    client.lpush(config.keys.state, "x")
    waiting = Background(config, 2)
    wait_for_waiters(config, 1)
    assert waiting.thread.is_alive()
    with StepPublisher(config) as publisher:  # the chief repairs its key
        publisher.publish(2)
        waiting.join()
    assert waiting.error is None and waiting.result == 2


def test_unreachable_redis_ends_with_redis_unavailable(job: str) -> None:
    cfg = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    with pytest.raises(RedisUnavailable) as info:
        StepWaiter(cfg).wait(5, timeout=1.0)
    assert isinstance(info.value, ConnectionError)
    assert job == info.value.job


def test_wait_logs_its_start_and_release(
    config: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO, logger="stepbarrier"), StepPublisher(config) as publisher:
        publisher.publish(8)
        assert publisher.flush(5.0)
        StepWaiter(config).wait(8, timeout=10)
    lines = [r.getMessage() for r in caplog.records if r.name == "stepbarrier._worker.waiter"]
    assert any("waiting for step 8" in line for line in lines)
    assert any("released at step 8" in line for line in lines)


def test_errors_carry_their_context() -> None:
    from stepbarrier import ConfigurationError, StepBarrierError

    error: Any = BarrierTimeout("x", job="j", target=3, last_step=1, heartbeat_age=2.0)
    assert isinstance(error, TimeoutError) and isinstance(error, StepBarrierError)
    assert (error.job, error.target, error.last_step, error.heartbeat_age) == ("j", 3, 1, 2.0)
    assert issubclass(ConfigurationError, ValueError)
    assert issubclass(RedisUnavailable, ConnectionError)
    assert issubclass(BarrierAborted, StepBarrierError)
