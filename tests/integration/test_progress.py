"""Each task's progress (issue 38): the library's ``report_progress``, ``ProgressReporter``,
and what ``status`` reads of it, against a real redis-server."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import pytest
import redis

from stepbarrier import (
    BarrierConfig,
    ConfigurationError,
    ProgressReporter,
    StepPublisher,
    read_status,
)
from stepbarrier._config.tf_config import MAX_TASK_ID as CONFIG_MAX_TASK_ID
from stepbarrier._inspect.progress import MAX_TASKS_READ, judge_tasks, straggler_threshold
from stepbarrier._inspect.reset import reset_job
from stepbarrier._protocol.library import MAX_PROGRESS_TASKS
from stepbarrier._protocol.wire import MAX_STEP, MAX_TASK_ID, parse_progress
from stepbarrier._redis.functions import RedisCode, function_name
from stepbarrier.cli._context import EXIT_STUCK
from stepbarrier.cli._exporter import serve
from tests.conftest import ROOT, subprocess_env
from tests.observability import scrape
from tests.redis_harness import RedisServer, free_port

CLI = [sys.executable, "-m", "stepbarrier"]

TTL = 600


def report(config: BarrierConfig, *args: object) -> object:
    client = redis.Redis.from_url(config.redis_url)
    try:
        return RedisCode(client, config).call("report_progress", [config.keys.progress], args)
    finally:
        client.close()


def fcall(config: BarrierConfig, keys: list[str], *args: object) -> object:
    client = redis.Redis.from_url(config.redis_url)
    try:
        RedisCode(client, config).call("report_progress", [config.keys.progress], [0, 0, TTL])
        return client.execute_command(
            "FCALL", function_name("report_progress"), len(keys), *keys, *args
        )
    finally:
        client.close()


def stored(config: BarrierConfig) -> dict[int, tuple[int, int]]:
    client = redis.Redis.from_url(config.redis_url)
    try:
        raw = client.hgetall(config.keys.progress)
    finally:
        client.close()
    result = {}
    for name, value in raw.items():
        parsed = parse_progress(value)
        assert parsed is not None, value
        result[int(name)] = parsed
    return result


def wait_until(condition: Callable[[], bool], what: str) -> None:
    """Until ``condition()`` holds (``what`` it is; no clock: pytest-timeout bounds
    the test, so a loaded machine only makes it slower)."""
    while not condition():
        time.sleep(0.01)


# -- the library's function --------------------------------------------------------


def test_the_task_id_bound_is_the_settings_one() -> None:
    assert MAX_TASK_ID == CONFIG_MAX_TASK_ID


def test_a_report_stores_step_and_time_and_keeps_the_time_until_the_step_increases(
    config: BarrierConfig,
) -> None:
    first = report(config, 2, 10, TTL)
    step, changed = stored(config)[2]
    assert (step, f"{step}:{changed}") == (10, first.decode())  # type: ignore[union-attr]
    # the same step, and a lower one (a restored checkpoint): the time stays
    time.sleep(0.01)
    report(config, 2, 10, TTL)
    assert stored(config)[2] == (10, changed)
    report(config, 2, 7, TTL)
    assert stored(config)[2] == (7, changed)
    time.sleep(0.01)
    report(config, 2, 11, TTL)
    assert stored(config)[2][0] == 11 and stored(config)[2][1] > changed
    client = redis.Redis.from_url(config.redis_url)
    assert 0 < client.ttl(config.keys.progress) <= TTL
    client.close()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("x", "1", str(TTL)), "the task id must be a whole number from 0 to 1000000"),
        ((str(MAX_TASK_ID + 1), "1", str(TTL)), "the task id must be"),
        (("-1", "1", str(TTL)), "the task id must be"),
        (("1", "-1", str(TTL)), "the step must be a whole number from 0 to"),
        (("1", str(MAX_STEP + 1), str(TTL)), "the step must be"),
        (("1", "1.5", str(TTL)), "the step must be"),
        (("1", "1", "0"), "takes a TTL in seconds"),
        (("1", "1"), "names 1 keys and takes 3 arguments, not 1 and 2"),
        (("1", "1", str(TTL), "extra"), "takes 3 arguments, not 1 and 4"),
        (("1", "1", "9" * 300), "argument 3 is longer than 256 bytes"),
    ],
)
def test_bad_arguments_are_refused_before_anything_is_written(
    config: BarrierConfig, args: tuple[str, ...], message: str
) -> None:
    client = redis.Redis.from_url(config.redis_url)
    with pytest.raises(redis.ResponseError, match=r"^stepbarrier: .*" + re.escape(message)):
        fcall(config, [config.keys.progress], *args)
    assert stored(config) == {0: (0, stored(config)[0][1])}  # only fcall's own first report
    client.close()


def test_a_call_naming_two_keys_is_refused(config: BarrierConfig) -> None:
    keys = [config.keys.progress, config.keys.progress + "x"]
    with pytest.raises(redis.ResponseError, match="names 1 keys"):
        fcall(config, keys, "1", "1", str(TTL))


def test_a_full_hash_refuses_a_new_task_but_takes_its_known_ones(config: BarrierConfig) -> None:
    client = redis.Redis.from_url(config.redis_url)
    client.hset(config.keys.progress, mapping={str(i): "1:1" for i in range(MAX_PROGRESS_TASKS)})
    with pytest.raises(redis.ResponseError, match=f"holds {MAX_PROGRESS_TASKS} tasks already"):
        report(config, MAX_PROGRESS_TASKS, 5, TTL)
    assert client.hlen(config.keys.progress) == MAX_PROGRESS_TASKS
    report(config, 17, 5, TTL)  # a task already there reports on
    assert client.hget(config.keys.progress, "17").startswith(b"5:")  # type: ignore[union-attr]
    client.close()


def test_hostile_content_is_replaced_never_read_whole(config: BarrierConfig) -> None:
    client = redis.Redis.from_url(config.redis_url)
    key = config.keys.progress
    client.hset(key, "3", "9" * 100_000)  # oversized: overwritten, its time not kept
    report(config, 3, 4, TTL)
    assert stored(config)[3][0] == 4
    client.hset(key, "3", "5:99999999999999")  # a time from the future is not kept
    report(config, 3, 4, TTL)
    assert stored(config)[3][1] < 99999999999999
    client.delete(key)
    client.set(key, "not a hash")
    report(config, 1, 2, TTL)
    assert client.type(key) == b"hash" and stored(config)[1][0] == 2
    client.close()


# -- the reporter ------------------------------------------------------------------


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_report_writes_at_most_once_per_interval_of_its_clock(config: BarrierConfig) -> None:
    clock = ManualClock()
    reporter = ProgressReporter(config, task_id=4, interval=0.05, clock=clock)
    try:
        for step in range(1, 501):
            reporter.report(step)
        wait_until(lambda: reporter.writes == 1, "the first write")
        # many more steps, and many real intervals, but no interval of its clock
        for step in range(501, 1001):
            reporter.report(step)
        time.sleep(0.3)
        assert reporter.writes == 1
        assert stored(config)[4][0] <= 500
        clock.now += 0.05
        wait_until(lambda: reporter.writes == 2, "the write of the next interval")
        assert stored(config)[4][0] == 1000
        # no change: nothing to write until the key needs keeping alive
        clock.now += 10
        time.sleep(0.3)
        assert reporter.writes == 2
        clock.now += config.key_ttl / 3
        wait_until(lambda: reporter.writes == 3, "the write that keeps the key alive")
    finally:
        assert reporter.close()


def test_close_writes_the_last_step_at_once(config: BarrierConfig) -> None:
    clock = ManualClock()
    with ProgressReporter(config, task_id=1, interval=0.05, clock=clock) as reporter:
        reporter.report(3)
        wait_until(lambda: reporter.writes == 1, "the first write")
        reporter.report(9)  # within the interval: close writes it
    assert stored(config)[1][0] == 9
    assert reporter.written == 9


def test_report_checks_its_step(config: BarrierConfig) -> None:
    with ProgressReporter(config, task_id=1, interval=0.05) as reporter:
        with pytest.raises(TypeError, match="step must be an integer, got bool"):
            reporter.report(True)
        with pytest.raises(ValueError, match="step must be from 0 to"):
            reporter.report(-1)
        with pytest.raises(TypeError, match="got float"):
            reporter.report(1.0)  # type: ignore[arg-type]
        reporter.report(MAX_STEP)
        assert reporter.step == MAX_STEP


def test_a_reporter_needs_a_task_id(make_config: Callable[..., BarrierConfig]) -> None:
    with pytest.raises(ConfigurationError, match="needs the task id: set STEPBARRIER_TASK_ID"):
        ProgressReporter(make_config())
    with pytest.raises(ConfigurationError, match="task_id must be an integer from 0 to 1000000"):
        ProgressReporter(make_config(), task_id=MAX_TASK_ID + 1)
    with pytest.raises(ConfigurationError, match="interval must be a number of seconds"):
        ProgressReporter(make_config(task_id=1), interval=0)
    chief = ProgressReporter(make_config(role="chief"))  # the chief is task 0
    assert chief.task_id == 0
    chief.close()


def test_redis_down_never_raises_into_training(job: str, caplog: pytest.LogCaptureFixture) -> None:
    config = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{free_port()}/0", task_id=2)
    reporter = ProgressReporter(config, interval=0.05)
    for step in range(1000):
        reporter.report(step)
    wait_until(lambda: reporter.failing, "a failed write")
    assert reporter.active and reporter.written is None
    assert reporter.last_error is not None and "127.0.0.1" in reporter.last_error
    assert reporter.close(timeout=1.0) is False  # said, never raised


def test_a_refusal_ends_the_reporting_once(
    redis_server: RedisServer, job: str, caplog: pytest.LogCaptureFixture
) -> None:
    admin = redis.Redis.from_url(redis_server.url)
    user, password = f"p-{job}"[:60], "progress-test-secret"
    admin.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        keys=["stepbarrier:{other}:*"],
        commands=["+@all"],
    )
    try:
        config = BarrierConfig(
            job=job,
            redis_url=redis_server.url,
            redis_username=user,
            redis_password=password,
            task_id=1,
        )
        with caplog.at_level(logging.INFO, logger="stepbarrier"):
            reporter = ProgressReporter(config, interval=0.05)
            reporter.report(5)
            wait_until(lambda: not reporter.active, "the refusal")
            assert reporter.close() is False
        said = [r for r in caplog.records if "progress is not reported" in r.getMessage()]
        assert len(said) == 1 and said[0].levelno == logging.WARNING
        assert password not in caplog.text
    finally:
        admin.acl_deluser(user)
        admin.close()


def test_many_reporters_report_from_threads(config: BarrierConfig) -> None:
    reporters = [ProgressReporter(config, task_id=i, interval=0.05) for i in range(1, 6)]

    def train(reporter: ProgressReporter) -> None:
        for step in range(1, 2001):
            reporter.report(step)

    threads = [threading.Thread(target=train, args=(r,)) for r in reporters]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(r.close() for r in reporters)
    assert {task: step for task, (step, _) in stored(config).items()} == {
        i: 2000 for i in range(1, 6)
    }


# -- what status reads -------------------------------------------------------------


def test_judging_tasks() -> None:
    now = 10_000_000
    entries = {0: (500, now - 1000), 1: (490, now - 2000), 2: (300, now - 700_000), 3: (500, 0)}
    tasks = {
        t.task_id: t
        for t in judge_tasks(
            entries, chief_step=500, chief_live=True, now_ms=now, stall_timeout=600
        )
    }
    assert [tasks[i].behind for i in range(4)] == [0, 10, 200, 0]
    assert [tasks[i].stuck for i in range(4)] == [False, False, True, False]  # 3 is not behind
    assert [tasks[i].straggler for i in range(4)] == [False, False, True, False]
    assert tasks[2].changed_age_s == 700.0
    # the chief's own report shows it did not advance: nobody is stuck
    entries[0] = (500, now - 601_000)
    judged = judge_tasks(entries, chief_step=500, chief_live=True, now_ms=now, stall_timeout=600)
    assert not any(t.stuck for t in judged)
    # a chief that is not live (dead, done): nobody is stuck
    del entries[0]
    judged = judge_tasks(entries, chief_step=500, chief_live=False, now_ms=now, stall_timeout=600)
    assert not any(t.stuck for t in judged)
    judged = judge_tasks(entries, chief_step=500, chief_live=True, now_ms=now, stall_timeout=600)
    assert [t.task_id for t in judged if t.stuck] == [2]
    assert straggler_threshold(None, None) == 100 and straggler_threshold(10_000, None) == 500


def test_status_reads_the_tasks_in_bounded_work(config: BarrierConfig) -> None:
    client = redis.Redis.from_url(config.redis_url)
    key = config.keys.progress
    report(config, 1, 5, TTL)
    client.hset(key, "2", "x" * 1000)  # oversized
    client.hset(key, "3", "bad")  # malformed
    client.hset(key, str(MAX_TASKS_READ + 5), "1:1")  # beyond what is read
    status = read_status(config)
    assert [(t.task_id, t.step, t.behind) for t in status.tasks] == [(1, 5, None)]
    assert status.tasks_more == 1
    assert any("malformed progress of task(s) 2, 3" in p for p in status.problems)
    assert status.to_dict()["tasks"][0]["task_id"] == 1
    client.delete(key)
    client.set(key, "x")
    assert any("progress key is not a hash" in p for p in read_status(config).problems)
    client.close()


# -- real processes: a stuck task named while the others advance --------------------


def test_status_names_the_stuck_task_while_the_others_advance(
    redis_server: RedisServer, job: str
) -> None:
    env = subprocess_env(STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=job)
    tasks = {
        task: subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.progress_task",
                redis_server.url,
                job,
                str(task),
                "20" if task == 2 else "0",
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for task in (1, 2, 3)
    }
    chief_config = BarrierConfig(
        job=job, redis_url=redis_server.url, role="chief", heartbeat=0.2, stall_timeout=2.0
    )
    training = threading.Event()

    def chief() -> None:
        with (
            StepPublisher(chief_config) as publisher,
            ProgressReporter(chief_config, interval=0.1) as progress,
        ):
            step = 0
            while not training.wait(0.02):
                step += 1
                publisher.publish(step)
                progress.report(step)

    thread = threading.Thread(target=chief)
    thread.start()
    try:
        for process in tasks.values():
            assert process.stdout is not None and process.stdout.readline() == "started\n"
        check = [*CLI, "status", "--check", "--json", "--stall-timeout", "2"]
        deadline = time.monotonic() + 60
        while True:
            result = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
            if result.returncode == EXIT_STUCK or time.monotonic() > deadline:
                break
            assert result.returncode == 0, result.stdout + result.stderr
            time.sleep(0.2)
        verdict = json.loads(result.stdout)
        assert result.returncode == EXIT_STUCK, verdict
        assert verdict["verdict"] == "stuck" and verdict["stuck_tasks"] == [2]
        assert "task 2 at step 20" in verdict["reason"]
        plain = subprocess.run(
            [c for c in check if c != "--json"], env=env, capture_output=True, text=True
        )
        assert plain.returncode == EXIT_STUCK
        assert plain.stdout.startswith(f"job {job}: stuck: task 2 at step 20 (")
        shown = subprocess.run(
            [*CLI, "status", "--json", "--stall-timeout", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        data = json.loads(shown.stdout)
        by_task = {t["task_id"]: t for t in data["tasks"]}
        assert set(by_task) == {0, 1, 2, 3}
        assert all(
            {"task_id", "step", "behind", "stuck", "straggler", "changed_age_s"} <= set(t)
            for t in data["tasks"]
        )
        assert [t for t, e in by_task.items() if e["stuck"]] == [2]
        assert by_task[2]["step"] == 20 and by_task[2]["behind"] > 0
        assert by_task[2]["changed_age_s"] >= 2
        table = subprocess.run(
            [*CLI, "status", "--stall-timeout", "2"],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert table.returncode == 0
        row = next(line for line in table.stdout.splitlines() if "STUCK" in line)
        assert row.split()[:2] == ["2", "20"]
    finally:
        training.set()
        thread.join(30)
        for process in tasks.values():
            process.communicate(timeout=30)
    # every task wrote its last step as it closed
    assert stored(BarrierConfig(job=job, redis_url=redis_server.url))[2][0] == 20


# -- the exporter ------------------------------------------------------------------


def test_the_exporter_serves_each_tasks_step_lag_and_stuck(
    redis_server: RedisServer, job: str
) -> None:
    config = BarrierConfig(job=job, redis_url=redis_server.url, heartbeat=0.2, stall_timeout=30)
    client = redis.Redis.from_url(redis_server.url)
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000
    with StepPublisher(config) as publisher:
        publisher.publish(50)
        assert publisher.flush(10)
        client.hset(
            config.keys.progress,
            mapping={"1": f"5:{now_ms - 700_000}", "2": f"49:{now_ms}"},  # 1: stuck for 700 s
        )
        with serve(config, port=0, pattern=job) as server:
            samples = scrape(server.url)
    client.close()

    def value(metric: str, task: str) -> float | None:
        found = [v for labels, v in samples[metric] if labels == {"job_name": job, "task": task}]
        return found[0] if found else None

    assert value("stepbarrier_task_step", "1") == 5 and value("stepbarrier_task_step", "2") == 49
    assert value("stepbarrier_task_behind", "1") == 45
    assert value("stepbarrier_task_behind", "2") == 1
    assert value("stepbarrier_task_stuck", "1") == 1 and value("stepbarrier_task_stuck", "2") == 0


def test_a_reset_deletes_the_jobs_progress(config: BarrierConfig) -> None:
    report(config, 1, 5, TTL)
    with StepPublisher(config) as publisher:
        publisher.publish(3)
        assert publisher.flush(10)
        assert [t.task_id for t in read_status(config).tasks] == [1]
        reset_job(config)
    assert stored(config) == {} and read_status(config).tasks == ()


def test_a_moment_of_a_full_redis_does_not_end_reporting() -> None:
    """Review of issue 38: Redis refusing writes for want of memory (``maxmemory``)
    passes; a reporter that stopped for good would show a healthy task as stuck."""
    with RedisServer(args=["--maxmemory", "4mb", "--maxmemory-policy", "noeviction"]) as server:
        admin = server.client()
        config = BarrierConfig(job="oom", redis_url=server.url, heartbeat=0.2)
        with ProgressReporter(config, task_id=1, interval=0.05) as worker:
            worker.report(1)
            assert worker.flush(5)
            ballast = 0
            with pytest.raises(redis.exceptions.OutOfMemoryError):
                while True:  # until Redis refuses a write for want of memory
                    admin.set(f"ballast:{ballast}", "x" * 100_000)
                    ballast += 1
            # and far below what it holds now: freed buffers (Redis shrinks idle
            # clients' query buffers) must not let a small write slip through
            admin.config_set("maxmemory", "1mb")
            worker.report(2)
            deadline = time.monotonic() + 10
            while worker.last_error is None and time.monotonic() < deadline:
                time.sleep(0.02)
            assert worker.last_error is not None and "maxmemory" in worker.last_error
            assert worker.active  # it retries
            admin.delete(*(f"ballast:{n}" for n in range(ballast)))
            admin.config_set("maxmemory", "4mb")
            worker.report(3)
            assert worker.flush(10)
            assert worker.written == 3
        admin.close()


def test_the_exporter_stops_reading_tasks_once_redis_is_unavailable(
    config: BarrierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Review of issue 38: each job's read retries for seconds; under the collector's
    lock, 50 of them would hold every scrape for minutes of an outage."""
    from stepbarrier.cli import _exporter
    from stepbarrier.errors import RedisUnavailable

    tried: list[str] = []

    def unavailable(job_config: BarrierConfig, *args: object, **kwargs: object) -> None:
        tried.append(job_config.job)
        raise RedisUnavailable("gone", job=job_config.job)

    monkeypatch.setattr(_exporter, "read_status", unavailable)
    assert _exporter.read_job_tasks(config, ["a", "b", "c", "d"]) == {}
    assert tried == ["a"]


def test_a_worker_is_not_stuck_while_the_chief_s_own_loop_is_quiet() -> None:
    """Review of issue 38: a core-API chief (no task 0 report) whose loop stopped still
    heartbeats; its state's ``idle_ms`` says the loop was quiet, so the chief did not
    advance and a worker behind it that stopped too is not the stuck one."""
    entries = {1: (95, 0)}
    [busy, quiet] = [
        judge_tasks(
            entries,
            chief_step=100,
            chief_live=True,
            now_ms=700_000,
            stall_timeout=600.0,
            chief_idle_s=idle,
        )[0]
        for idle in (0.0, 650.0)
    ]
    assert busy.stuck and not quiet.stuck
