"""Issue 10: reruns, recoveries and resets never release a worker early.

Each test is a reproduction from the issue, against the session's real
redis-server; a test that involves processes uses real ones.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import redis

from stepbarrier import BarrierAborted, BarrierConfig, BarrierTimeout, StepPublisher, StepWaiter
from stepbarrier._inspect.reset import reset_job
from tests.conftest import subprocess_env
from tests.integration.test_waiter import Background, wait_for_waiters
from tests.redis_harness import RedisServer

CLI = [sys.executable, "-m", "stepbarrier"]


def eventually(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return predicate()


class ShiftedClock:
    """A monotonic clock that a test can move forward (a chief that went quiet)."""

    def __init__(self) -> None:
        self.offset = 0.0

    def __call__(self) -> float:
        return time.monotonic() + self.offset


def cli(env: dict[str, str], *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


# -- 1. a rerun under the same job name ----------------------------------------------


def test_a_late_worker_without_run_id_trusts_a_finished_job_after_the_grace(
    redis_server: RedisServer, job: str
) -> None:
    # issue 32: `stepbarrier wait` after the job finished is released (or aborted)
    # once the finished state has stood for the grace with no new chief begun on
    # it; before v3 it timed out (a rerun's protection: see tests/protocol)
    env = subprocess_env(STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=job)
    assert cli(env, "publish", "100", "--done").returncode == 0
    below = cli(env, "wait", "--until", "50", "--timeout", "30")
    above = cli(env, "wait", "--until", "200", "--timeout", "30")
    assert below.returncode == 0, below.stderr
    assert above.returncode == 4, above.stderr  # aborted: finished below its step
    # a wait that ends within the grace says why it was not released yet
    short = cli(env, "wait", "--until", "50", "--timeout", "1")
    assert short.returncode == 3, short.stderr
    assert "gives a new chief 3 s to begin" in short.stderr


def test_a_worker_ignores_another_runs_chief_and_follows_its_own(
    make_config: Callable[..., BarrierConfig],
) -> None:
    old = make_config(heartbeat=0.2, stall_timeout=30.0, run_id="run-1")
    new = make_config(heartbeat=0.2, stall_timeout=30.0, run_id="run-2")
    with StepPublisher(old) as previous:
        previous.publish(100)
        assert previous.flush(5.0)
        below, above = Background(new, 50), Background(new, 200)
        wait_for_waiters(new, 2)
        previous.publish(300)  # a live chief of another run moves on, then finishes
        assert previous.flush(5.0)
    time.sleep(0.5)
    assert below.thread.is_alive() and above.thread.is_alive()
    with StepPublisher(new) as chief:  # this run's chief takes the job over
        chief.publish(60)
        assert below.join().result == 60
        assert above.thread.is_alive()
        chief.publish(200)
        assert above.join().result == 200


def test_a_same_run_worker_trusts_its_finished_job(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=30.0, run_id="run-1")
    with StepPublisher(config) as chief:
        chief.publish(100)
    with StepWaiter(config) as waiter:
        assert waiter.wait(50, timeout=10) == 100
        with pytest.raises(BarrierAborted):
            waiter.wait(200, timeout=10)


def test_a_finished_jobs_keys_expire_after_the_done_ttl(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=30.0, done_ttl=5000)
    chief = StepPublisher(config)
    chief.publish(5)
    assert chief.flush(5.0)
    assert client.ttl(config.keys.state) > 6000  # the key TTL while the job runs
    assert chief.close(done=True)
    assert 4990 < client.ttl(config.keys.state) <= 5000


def test_a_finished_jobs_keys_outlive_the_stall_timeout_whatever_the_done_ttl(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    # a worker cut off while the job finished reads it once its link is back
    config = make_config(heartbeat=0.2, stall_timeout=30.0, done_ttl=1)
    chief = StepPublisher(config)
    chief.publish(5)
    assert chief.close(done=True)
    assert 30 + 60 - 10 < client.ttl(config.keys.state) <= 30 + 60


def test_status_shows_the_run_id(redis_server: RedisServer, job: str) -> None:
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=job, STEPBARRIER_RUN_ID="r-42"
    )
    assert cli(env, "publish", "3").returncode == 0
    shown = cli(env, "status", "--json")
    assert shown.returncode == 0, shown.stderr
    assert '"run_id": "r-42"' in shown.stdout


# -- 2. a recovering chief, and new_generation() racing a write --------------------


def test_a_step_no_loop_confirmed_lately_releases_no_new_worker(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=30.0, fallback_interval=0.2)
    clock = ShiftedClock()
    with StepPublisher(config, clock=clock) as chief:
        for step in range(1, 101):
            chief.publish(step)
        assert chief.flush(5.0)
        # the session fails: no publish for a minute, but the thread heartbeats
        clock.offset += 60.0
        time.sleep(0.5)  # a few heartbeats carry the old publish time
        late = Background(config, 80)
        wait_for_waiters(config, 1)
        time.sleep(0.6)  # three fallback reads
        assert late.thread.is_alive(), "released by a step the chief may never reach again"
        chief.new_generation()
        chief.publish(50)  # the restore: the real step is lower
        time.sleep(0.5)
        assert late.thread.is_alive()
        chief.publish(80)
        assert late.join().result == 80


def test_a_slow_chief_still_releases_a_worker_arriving_between_its_steps(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=30.0)
    clock = ShiftedClock()
    with StepPublisher(config, clock=clock) as chief:
        for step in range(1, 4):  # three-minute steps
            clock.offset += 180.0
            chief.publish(step)
        clock.offset += 100.0  # well into the next step
        assert chief.flush(5.0)
        with StepWaiter(config) as waiter:
            assert waiter.wait(3, timeout=10) == 3


@pytest.mark.usefixtures("long_heartbeats")
def test_new_generation_during_a_write_in_flight_never_counts_the_old_write(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    # a long heartbeat: a slipped first write of the new generation would miss the flush
    config = make_config(heartbeat=30.0, stall_timeout=60.0)
    chief = StepPublisher(config)
    try:
        chief.publish(100)
        assert chief.flush(5.0)
        gate, entered = threading.Event(), threading.Event()
        writer = chief._step_writer()
        real_write = writer.write

        def slow_write(values):  # type: ignore[no-untyped-def]
            entered.set()
            gate.wait(10)
            return real_write(values)

        writer.write = slow_write  # type: ignore[method-assign]
        chief.publish(101)  # an old-generation write goes out, held by the gate
        chief._wake.set()
        assert entered.wait(5)
        chief.new_generation()
        chief.publish(50)
        gate.set()
        assert chief.flush(5.0)
        state = client.hgetall(config.keys.state)
        assert state[b"step"] == b"50"  # flush returned only once 50 was stored
        assert chief.next_threshold != -1.0
    finally:
        chief.close(done=False)


# -- 4. a live chief does not undo a reset ---------------------------------------------


def test_a_live_chief_stops_after_a_reset_and_late_waiters_abort(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(heartbeat=0.1, stall_timeout=30.0)
    chief = StepPublisher(config)
    chief.publish(10)
    assert chief.flush(5.0)
    reset_job(config)
    assert eventually(lambda: not chief.active)
    chief.publish(20)
    assert not chief.flush(2.0)
    time.sleep(0.5)  # five heartbeats: none brings the job back
    assert not client.exists(config.keys.state)
    assert not chief.close(done=True)
    assert not client.exists(config.keys.state)


def test_a_waiter_that_missed_the_reset_announcement_aborts_even_under_a_new_chief(
    make_config: Callable[..., BarrierConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(heartbeat=0.1, stall_timeout=30.0, fallback_interval=0.2)
    with StepPublisher(config) as chief:
        chief.publish(10)
        assert chief.flush(5.0)
        import stepbarrier._worker.waiter as waiter_module

        real_parse = waiter_module.parse_announcement

        def drop_resets(data):  # type: ignore[no-untyped-def]
            parsed = real_parse(data)
            return None if parsed is not None and parsed.reset else parsed

        monkeypatch.setattr(waiter_module, "parse_announcement", drop_resets)
        waiting = Background(config, 50)
        wait_for_waiters(config, 1)
        reset_job(config)
    with StepPublisher(config) as successor:  # a new chief, begun after the reset
        successor.publish(100)
        waiting.join()
    assert isinstance(waiting.error, BarrierAborted) and waiting.error.reason == "reset"


# -- 6. hostile targets, 7. the listener, and refusals -------------------------------


def test_an_infinite_target_score_does_not_poison_the_chief(
    config: BarrierConfig, client: redis.Redis
) -> None:
    client.zadd(config.keys.targets, {"evil": float("inf"), "evil2": float("-inf")})
    chief = StepPublisher(config)
    chief.publish(3)
    assert chief.flush(5.0)
    assert chief.last_error is None
    assert chief.close(done=False)


def test_a_programming_error_in_the_thread_is_not_called_a_redis_error(
    config: BarrierConfig, caplog: pytest.LogCaptureFixture
) -> None:
    chief = StepPublisher(config)
    try:

        def broken(values):  # type: ignore[no-untyped-def]
            raise ValueError("a bug")

        chief._step_writer().write = broken  # type: ignore[method-assign]
        with caplog.at_level(logging.ERROR, logger="stepbarrier"):
            chief.publish(3)
            assert not chief.flush(5.0)
        assert chief.last_failure is None
        assert chief.last_error is not None and chief.last_error.startswith("internal error")
        assert "internal error while publishing" in caplog.text
    finally:
        chief.close(done=False, timeout=0.5)


def test_no_registration_listener_outlives_close(
    config: BarrierConfig, client: redis.Redis
) -> None:
    # only this job's threads and connections: another test's may still be winding down
    mine = (f"stepbarrier-publisher-{config.job}", f"stepbarrier-registrations-{config.job}")
    before = int(client.info("clients")["blocked_clients"])
    for _ in range(40):
        StepPublisher(config).close(done=False)
    alive = [t for t in threading.enumerate() if t.name in mine]
    assert alive == []
    assert eventually(lambda: int(client.info("clients")["blocked_clients"]) <= before, timeout=3.0)


def test_a_superseded_chief_stops_both_threads(config: BarrierConfig) -> None:
    old = StepPublisher(config)
    old.publish(5)
    assert old.flush(5.0)
    with StepPublisher(config) as new:
        new.publish(1)
        assert new.flush(5.0)
        old.publish(6)
        assert eventually(lambda: not old.active)
        assert eventually(lambda: not old._thread.is_alive())
        listener = old._listener
        assert listener is not None
        assert eventually(lambda: not listener.is_alive())
    old.close(done=False)


def test_flush_without_timeout_returns_under_a_permanent_refusal(
    redis_server: RedisServer, client: redis.Redis, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    client.execute_command(
        "ACL",
        "SETUSER",
        f"nope-{job}",
        "on",
        ">pw",
        "~*",
        "&*",
        "+@all",
        "-evalsha",
        "-eval",
        "-fcall",
        "-blpop",
    )
    url = redis_server.url.replace("redis://", f"redis://nope-{job}:pw@")
    config = BarrierConfig(job=job, redis_url=url, heartbeat=0.1, stall_timeout=30.0)
    chief = StepPublisher(config)
    outcome: list[bool] = []
    with caplog.at_level(logging.WARNING, logger="stepbarrier"):
        chief.publish(1)
        flusher = threading.Thread(target=lambda: outcome.append(chief.flush(None)))
        flusher.start()
        flusher.join(15)
        assert not flusher.is_alive() and outcome == [False]
        assert eventually(lambda: "hear new waiters" in caplog.text)  # the listener says so
    assert chief.last_failure is not None and chief.last_failure.kind == "permission"
    assert "pw" not in str(chief.last_failure).replace("permission", "")
    chief.close(done=False, timeout=0.5)


def test_a_waiter_puts_its_target_back_when_the_targets_zset_is_lost(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(heartbeat=0.2, stall_timeout=30.0, fallback_interval=0.2)
    waiting = Background(config, 40)
    assert eventually(lambda: client.zcard(config.keys.targets) == 1)
    client.delete(config.keys.targets)
    assert eventually(lambda: client.zcard(config.keys.targets) == 1)
    with StepPublisher(config) as chief:
        chief.publish(40)
        assert waiting.join().result == 40


def test_a_progress_timeout_ends_a_wait_on_a_live_chief_that_stopped_moving(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=0.1, stall_timeout=30.0, progress_timeout=1.0)
    with StepPublisher(config) as chief:
        chief.publish(3)
        assert chief.flush(5.0)
        with StepWaiter(config) as waiter, pytest.raises(BarrierTimeout) as info:
            waiter.wait(10, timeout=20)
    assert info.value.stalled and "progress timeout" in str(info.value)


def test_a_contributor_whose_user_may_not_write_the_step_says_so_once_and_stops(
    redis_server: RedisServer, client: redis.Redis, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    from stepbarrier._protocol.roles import role_rules

    client.execute_command(
        "ACL", "SETUSER", f"w-{job}", "on", ">pw", *role_rules("worker", job).split()
    )
    chief_config = BarrierConfig(
        job=job, redis_url=redis_server.url, heartbeat=0.1, stall_timeout=30.0
    )
    worker_url = redis_server.url.replace("redis://", f"redis://w-{job}:pw@")
    worker_config = BarrierConfig(job=job, redis_url=worker_url, heartbeat=0.1, stall_timeout=30.0)
    with StepPublisher(chief_config) as chief, caplog.at_level(logging.WARNING, "stepbarrier"):
        chief.publish(5)
        assert chief.flush(5.0)
        reporter = StepPublisher(worker_config, contributor=True)
        reporter.publish(9)
        assert eventually(lambda: not reporter.active)
        assert "does not report the global step" in caplog.text
        assert caplog.text.count("does not report the global step") == 1
        reporter.close(done=False, timeout=0.5)
    assert client.hget(chief_config.keys.state, "step") == b"5"
