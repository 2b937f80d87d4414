"""The review's defects of the step protocol, one regression test each (issue 21).

Each test reproduces a counterexample to a promise of docs/protocol.md against
a real redis-server (chiefs in threads, or in their own processes where a
pause or a crash is the point) and asserts that the promise now holds. The
defect's number in the issue is in each test's docstring.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    BarrierTimeout,
    StepPublisher,
    StepWaiter,
    read_status,
)
from stepbarrier._protocol.wire import MAX_STEP
from stepbarrier.cli import cli as cli_main
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer


class Wait:
    """``StepWaiter.wait`` in a thread, keeping its result or error."""

    def __init__(self, config: BarrierConfig, target: int, timeout: float) -> None:
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(config, target, timeout))
        self.thread.daemon = True
        self.thread.start()

    def _run(self, config: BarrierConfig, target: int, timeout: float) -> None:
        try:
            with StepWaiter(config) as waiter:
                self.result = waiter.wait(target, timeout=timeout)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 30.0) -> Wait:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the wait did not end"
        return self


class ChiefProcess:
    """A chief in its own process (tests/protocol/chief_process.py)."""

    def __init__(self, config: BarrierConfig, heartbeat: float) -> None:
        env = subprocess_env(
            STEPBARRIER_REDIS_URL=config.redis_url,
            STEPBARRIER_JOB=config.job,
            STEPBARRIER_ROLE="chief",
            STEPBARRIER_HEARTBEAT=str(heartbeat),
        )
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.protocol.chief_process"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            text=True,
        )

    def send(self, command: str) -> str:
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(command + "\n")
        self.process.stdin.flush()
        reply = self.process.stdout.readline().strip()
        assert reply == "ok", f"{command}: {reply}"
        return reply

    def signal(self, signum: int) -> None:
        os.kill(self.process.pid, signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(10)


@pytest.fixture
def chief_process() -> Iterator[Callable[[BarrierConfig, float], ChiefProcess]]:
    started: list[ChiefProcess] = []

    def start(config: BarrierConfig, heartbeat: float) -> ChiefProcess:
        chief = ChiefProcess(config, heartbeat)
        started.append(chief)
        return chief

    yield start
    for chief in started:
        with_signal_cont(chief)
        chief.stop()


def with_signal_cont(chief: ChiefProcess) -> None:
    if chief.process.poll() is None:
        chief.signal(signal.SIGCONT)


def until(predicate: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "the condition never held"
        time.sleep(0.02)


# -- early releases --------------------------------------------------------------


def test_an_earlier_runs_reporting_worker_never_pushes_its_step_into_a_new_run(
    make_config: Callable[..., BarrierConfig],
) -> None:
    """Defect 1: a contributor reports only into the generation it joined."""
    config = make_config(heartbeat=0.1, stall_timeout=30.0)
    old_chief = StepPublisher(config)
    old_chief.publish(5000)
    assert old_chief.flush(5.0)
    reporter = StepPublisher(config, contributor=True)  # a worker of the old run, training
    reporter.publish(5001)
    assert reporter.flush(5.0)
    old_chief.close(done=False)
    new_chief = StepPublisher(config)  # the new run (same job name, no run id)
    new_chief.publish(10)
    assert new_chief.flush(5.0)
    reporter.publish(5026)  # the old worker keeps training and reporting
    time.sleep(0.5)
    try:
        with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as info:
            waiter.wait(100, timeout=1.5)
        assert info.value.last_step == 10
        assert read_status(config).step == 10
        assert not reporter.active  # it stopped rather than join the new generation
    finally:
        reporter.close(done=False)
        new_chief.close(done=False)


def test_a_zombie_chief_that_writes_after_redis_restarted_empty_releases_nobody(
    own_server: RedisServer, job: str, chief_process: Callable[..., ChiefProcess]
) -> None:
    """Defect 2: a state (re)made after Redis forgot it is on probation until fenced."""
    config = BarrierConfig(job=job, redis_url=own_server.url, heartbeat=0.2, stall_timeout=30.0)
    zombie = chief_process(config, 0.2)
    zombie.send("publish 115")
    zombie.send("flush")
    zombie.signal(signal.SIGSTOP)  # paused: a GC pause, a partition...
    current = chief_process(config, 0.2)  # the chief that took over, at step 80
    current.send("publish 80")
    current.send("flush")
    until(lambda: read_status(config).step == 80)
    current.signal(signal.SIGSTOP)  # a short pause of the current chief too
    own_server.restart_empty()
    newcomer = Wait(config, 110, timeout=5.0)
    time.sleep(0.5)  # subscribed, registered, and read the empty state
    zombie.signal(signal.SIGCONT)  # it writes 115 into the empty Redis at once
    time.sleep(0.3)
    current.signal(signal.SIGCONT)  # back well within the zombie's probation
    newcomer.join(10)
    assert isinstance(newcomer.error, BarrierTimeout), f"released at {newcomer.result}"
    assert read_status(config).step == 80  # the current chief fenced the zombie


def test_a_killed_chiefs_stored_step_releases_no_newcomer_whatever_its_heartbeat(
    make_config: Callable[..., BarrierConfig], chief_process: Callable[..., ChiefProcess]
) -> None:
    """Defect 4: a release needs a write the waiter sees happen (no confirmation window)."""
    config = make_config(heartbeat=1.0, stall_timeout=60.0)  # the longest heartbeat
    chief = chief_process(config, 1.0)
    chief.send("publish 50")
    chief.send("flush")
    chief.signal(signal.SIGKILL)
    chief.process.wait(10)
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as info:
        waiter.wait(40, timeout=2.0)
    assert info.value.last_step == 50
    assert "no write of this run's chief observed" in str(info.value)


def test_a_stored_time_in_the_future_does_not_make_a_dead_chiefs_step_fresh(
    config: BarrierConfig, client: redis.Redis
) -> None:
    """Defect 5: no stored time is compared with any clock."""
    chief = StepPublisher(config)
    chief.publish(50)
    assert chief.flush(5.0)
    chief.close(done=False)  # gone
    seconds, micros = client.time()
    future = str(int(seconds * 1000 + micros // 1000) + 3_600_000)  # a failover to a clock ahead
    client.hset(
        config.keys.state,
        mapping={"heartbeat_ms": future, "published_ms": future},
    )
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout):
        waiter.wait(40, timeout=1.5)


def test_an_operator_publish_releases_later_arrivals_but_not_higher_targets(
    make_config: Callable[..., BarrierConfig],
) -> None:
    """Defect 11: an operator's publish pins the step (docs/protocol.md#operator-publish)."""
    config = make_config(heartbeat=0.2, stall_timeout=30.0, run_id="run-7")
    env = {
        "STEPBARRIER_REDIS_URL": config.redis_url,
        "STEPBARRIER_JOB": config.job,
        "STEPBARRIER_RUN_ID": "run-7",
    }
    result = CliRunner().invoke(cli_main, ["publish", "100"], env=env)
    assert result.exit_code == 0, result.output
    time.sleep(6.0)  # longer than any window of the old rules (5 s)
    with StepWaiter(config) as waiter:
        assert waiter.wait(50, timeout=5.0) == 100
        with pytest.raises(BarrierTimeout):
            waiter.wait(101, timeout=1.0)


def test_an_operator_publish_without_a_run_id_releases_the_workers_that_see_it(
    config: BarrierConfig,
) -> None:
    """Defect 11, without run ids: the waiting workers are released; a later arrival
    cannot tell an earlier run's pin from this one's, so it waits (and says why)."""
    env = {"STEPBARRIER_REDIS_URL": config.redis_url, "STEPBARRIER_JOB": config.job}
    waiting = Wait(config, 50, timeout=10.0)
    until(lambda: len(read_status(config).waiters) == 1)
    result = CliRunner().invoke(cli_main, ["publish", "100"], env=env)
    assert result.exit_code == 0, result.output
    assert waiting.join().result == 100
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as info:
        waiter.wait(50, timeout=1.0)
    assert "pinned step 100" in str(info.value)


# -- lost releases ---------------------------------------------------------------


def finish_before_the_first_read(
    monkeypatch: pytest.MonkeyPatch, chief: StepPublisher, final_step: int
) -> threading.Event:
    """Make the chief finish at ``final_step`` after the next wait subscribed, before
    its first read (what 20 ms of link latency does to some workers)."""
    from stepbarrier._worker import links as waiter_link

    original = waiter_link.WaiterLink.register_and_read
    first = threading.Event()

    def late_first_read(self: Any) -> Any:
        if not first.is_set():
            first.set()
            chief.publish(final_step)
            chief.close(done=True)
        return original(self)

    monkeypatch.setattr(waiter_link.WaiterLink, "register_and_read", late_first_read)
    return first


def test_a_worker_that_subscribed_before_the_job_finished_but_read_after_is_released(
    make_config: Callable[..., BarrierConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 6: a finished state seen happen (its announcement) is trusted without a run id."""
    config = make_config(heartbeat=0.2, stall_timeout=3.0)
    chief = StepPublisher(config)
    chief.publish(10)
    assert chief.flush(5.0)
    finished = finish_before_the_first_read(monkeypatch, chief, 20)
    with StepWaiter(config) as waiter:
        assert waiter.wait(15, timeout=10.0) == 20
    assert finished.is_set()


def test_a_worker_that_subscribed_before_the_job_finished_short_of_its_step_aborts(
    make_config: Callable[..., BarrierConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect 6, the abort side: seen happen, a finish below the target is real."""
    config = make_config(heartbeat=0.2, stall_timeout=3.0)
    chief = StepPublisher(config)
    chief.publish(10)
    assert chief.flush(5.0)
    finish_before_the_first_read(monkeypatch, chief, 10)
    with StepWaiter(config) as waiter, pytest.raises(BarrierAborted) as info:
        waiter.wait(30, timeout=10.0)
    assert info.value.reason == "done"


def test_a_finished_job_of_unknown_run_neither_releases_nor_aborts_a_late_worker(
    config: BarrierConfig,
) -> None:
    """Without a run id, a finished state the worker did not see happen may be an earlier run's."""
    chief = StepPublisher(config)
    chief.publish(20)
    chief.close(done=True)
    with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as info:
        waiter.wait(10, timeout=1.0)
    assert "did not see it happen" in str(info.value)


def test_a_finished_jobs_record_outlives_the_stall_timeout(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    """Defect 8: the done record lives at least the stall timeout, whatever DONE_TTL says."""
    config = make_config(heartbeat=0.2, stall_timeout=600.0, done_ttl=60)
    chief = StepPublisher(config)
    chief.publish(5)
    assert chief.close(done=True)
    assert client.ttl(config.keys.state) >= 600


def test_a_full_redis_does_not_fail_a_wait_whose_read_succeeds(
    own_server: RedisServer, job: str
) -> None:
    """Defect 9: a refused registration (noeviction, maxmemory) does not end the wait."""
    config = BarrierConfig(job=job, redis_url=own_server.url, heartbeat=0.1, stall_timeout=30.0)
    client = own_server.client()
    chief = StepPublisher(config)
    chief.publish(50)
    assert chief.flush(5.0)
    for filler in range(50):
        client.set(f"filler:{filler}", "x" * 100_000)
    used = int(client.info("memory")["used_memory"])
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", str(used // 2))  # full: every write is refused
    with pytest.raises(redis.exceptions.OutOfMemoryError):
        client.set("one-more", "x")
    waiting = Wait(config, 40, timeout=20.0)
    time.sleep(1.5)
    assert waiting.thread.is_alive(), f"ended at once: {waiting.error!r}"
    client.config_set("maxmemory", "0")  # memory again: the chief's writes get through
    waiting.join(20)
    assert waiting.error is None and waiting.result == 50
    chief.close(done=False)
    client.close()


def test_a_second_run_never_silently_supersedes_a_live_one(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    """Defect 10: a chief of another run refuses a job whose chief is live."""
    run_a = make_config(heartbeat=0.1, stall_timeout=30.0, run_id="run-a")
    run_b = make_config(heartbeat=0.1, stall_timeout=30.0, run_id="run-b")
    chief_a = StepPublisher(run_a)
    chief_a.publish(10)
    assert chief_a.flush(5.0)
    stop = threading.Event()

    def train_a() -> None:
        step = 10
        while not stop.is_set():
            step += 1
            chief_a.publish(step)
            time.sleep(0.05)

    trainer = threading.Thread(target=train_a, daemon=True)
    trainer.start()
    try:
        with caplog.at_level(logging.ERROR, logger="stepbarrier._chief.publisher"):
            chief_b = StepPublisher(run_b)
            chief_b.publish(1)
            until(lambda: not chief_b.active, timeout=15.0)
        assert "is in use by run run-a" in caplog.text and "run-b" in caplog.text
        with StepWaiter(run_a) as waiter:
            assert waiter.wait(int(read_status(run_a).step or 0) + 5, timeout=10.0)
        assert read_status(run_a).run_id == "run-a"
        chief_b.close(done=False)
    finally:
        stop.set()
        trainer.join(5)
        chief_a.close(done=False)


def test_a_reset_right_after_a_chief_began_stops_that_chief(
    make_config: Callable[..., BarrierConfig],
    client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 12: the reset marker is a token, compared for equality, never with a clock."""
    from stepbarrier._chief import publish_call as step_write

    config = make_config(heartbeat=0.1, stall_timeout=30.0)
    begin = step_write.StepWriter.begin_generation
    keys = config.keys
    # what `stepbarrier reset` leaves, done in one round trip right after the
    # begin (in the same millisecond, most times): the state deleted, a marker
    # holding the Redis time in ms
    marker_now = (
        "local t = redis.call('TIME') redis.call('DEL', KEYS[2]) "
        "local m = t[1] * 1000 + math.floor(t[2] / 1000) "
        "local old = tonumber(redis.call('GET', KEYS[1]) or '0') "
        "if old >= m then m = old + 1 end "
        "redis.call('SET', KEYS[1], string.format('%.0f', m)) return 1"
    )

    def begin_then_reset(self: Any) -> Any:
        begun = begin(self)
        client.eval(marker_now, 2, keys.reset, keys.state)
        return begun

    monkeypatch.setattr(step_write.StepWriter, "begin_generation", begin_then_reset)
    for attempt in range(20):
        chief = StepPublisher(config)
        chief.publish(1)
        chief.flush(5.0)
        chief.publish(2)
        assert not chief.flush(5.0), f"attempt {attempt}: the chief wrote after the reset"
        assert not chief.active
        chief.close(done=False)
        assert read_status(config).step is None


# -- messages and input ----------------------------------------------------------


def test_a_timeout_says_whose_state_it_saw_and_never_claims_a_chief_heartbeat_it_did_not_see(
    make_config: Callable[..., BarrierConfig],
) -> None:
    """Defect 13: the timeout names the other run, not "never seen" / "0.0 s old"."""
    chief = StepPublisher(make_config(heartbeat=0.1, stall_timeout=30.0, run_id="run-a"))
    chief.publish(100)
    assert chief.flush(5.0)
    try:
        other = make_config(heartbeat=0.1, stall_timeout=1.0, run_id="run-b")
        with StepWaiter(other) as waiter, pytest.raises(BarrierTimeout) as info:
            waiter.wait(50, timeout=10.0)
        message = str(info.value)
        assert "belongs to run run-a" in message
        assert "heartbeat 0.0 s old" not in message and "never seen" not in message
        assert info.value.stalled and info.value.heartbeat_age is None
    finally:
        chief.close(done=False)


def test_a_progress_line_says_why_a_step_above_the_target_does_not_release(
    config: BarrierConfig,
    client: redis.Redis,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Defect 13: "chief at step 100" while waiting for 50 says why that does not release."""
    from stepbarrier._worker import wait_state as wait_rules

    monkeypatch.setattr(wait_rules, "PROGRESS_EVERY", 0.3)
    # a chief on probation: it writes (its beat moves) but does not vouch
    client.hset(
        config.keys.state,
        mapping={"generation": "7", "step": "100", "done": "0", "run_id": "", "vouch": "0"},
    )
    stop = threading.Event()

    def beat() -> None:
        while not stop.is_set():
            client.hincrby(config.keys.state, "beat", 1)
            time.sleep(0.05)

    writer = threading.Thread(target=beat, daemon=True)
    writer.start()
    try:
        with (
            caplog.at_level(logging.INFO, logger="stepbarrier._worker.waiter"),
            StepWaiter(config) as waiter,
            pytest.raises(BarrierTimeout),
        ):
            waiter.wait(50, timeout=1.2)
    finally:
        stop.set()
        writer.join(5)
    progress = [r.getMessage() for r in caplog.records if "still waiting" in r.getMessage()]
    assert progress and "does not vouch for it" in progress[-1]


@pytest.mark.parametrize("bad", [True, False, 2.0, "5"])
def test_a_wait_refuses_a_target_that_is_not_an_integer(config: BarrierConfig, bad: Any) -> None:
    """Defect 14: ``True`` is not step 1."""
    with StepWaiter(config) as waiter, pytest.raises(TypeError, match="must be an integer"):
        waiter.wait(bad)


def test_a_wait_refuses_a_target_no_chief_can_publish(config: BarrierConfig) -> None:
    """Defect 14: above ``MAX_STEP`` a wait would never end while its chief lives."""
    with StepWaiter(config) as waiter, pytest.raises(ValueError, match="at most 2\\*\\*53 - 2"):
        waiter.wait(MAX_STEP + 1)


@pytest.mark.parametrize("bad", [True, 2.0])
def test_publish_refuses_a_step_that_is_not_an_integer(config: BarrierConfig, bad: Any) -> None:
    """Defect 14: ``publish(True)`` is not step 1."""
    publisher = StepPublisher(config)
    try:
        with pytest.raises(TypeError, match="must be an integer"):
            publisher.publish(bad)
    finally:
        publisher.close(done=False)
