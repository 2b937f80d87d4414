"""stepbarrier on a real local Redis Cluster: one slot per job, sharded
announcements, and waits that survive a slot migration and a failover."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis

from stepbarrier import BarrierConfig, ProgressReporter, StepPublisher, StepWaiter, read_status
from stepbarrier._inspect.reset import reset_job
from stepbarrier._redis.functions import install_functions
from tests.cluster.conftest import Timings
from tests.cluster_harness import LocalCluster
from tests.conftest import ROOT, subprocess_env

pytestmark = pytest.mark.cluster

CLI = [sys.executable, "-m", "stepbarrier"]


def cluster_config(cluster: LocalCluster, job: str, **overrides: object) -> BarrierConfig:
    settings: dict[str, object] = {
        "job": job,
        "redis_url": cluster.seed_url,
        "redis_cluster": True,
        "heartbeat": 0.2,
        "stall_timeout": 60.0,
    }
    settings.update(overrides)
    return BarrierConfig(**settings)  # type: ignore[arg-type]


class Waiting:
    """A wait in a thread; keeps its result or error."""

    def __init__(self, config: BarrierConfig, target: int) -> None:
        self.result: int | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(config, target), daemon=True)
        self.thread.start()

    def _run(self, config: BarrierConfig, target: int) -> None:
        try:
            with StepWaiter(config) as waiter:
                self.result = waiter.wait(target, timeout=60)
        except BaseException as exc:
            self.error = exc

    def join(self, timeout: float = 60.0) -> Waiting:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the wait did not end"
        return self


def eventually(predicate: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def registered(config: BarrierConfig, count: int = 1) -> Callable[[], bool]:
    return lambda: len(read_status(config).waiters) >= count


def subscribers(cluster: LocalCluster, channel: str) -> int:
    owner = cluster.node_client(cluster.owner_of(channel))
    reply = owner.execute_command("PUBSUB", "SHARDNUMSUB", channel)
    return int(reply[1])


@pytest.fixture(scope="module", autouse=True)
def library(cluster: LocalCluster) -> None:
    """The Functions library on every master, loaded as an administrator would."""
    with cluster.client() as client:
        install_functions(client)


def test_a_hundred_jobs_each_in_one_slot_spread_over_every_master(cluster: LocalCluster) -> None:
    jobs = [f"spread-{number}-{uuid.uuid4().hex[:6]}" for number in range(100)]
    owners = set()
    for job in jobs:
        keys = cluster_config(cluster, job).keys
        names = [*keys.all_fixed(), keys.channel, keys.waiter("1-abc")]
        assert len({cluster.slot_of(name) for name in names}) == 1
        owners.add(cluster.owner_of(keys.state))
    assert owners == set(cluster.masters)
    # every job's chief releases its own waiter; none is released by another's step
    waits = []
    for number, job in enumerate(jobs):
        waits.append((job, Waiting(cluster_config(cluster, job), 10 + number)))
    publishers = []
    for number, job in enumerate(jobs):
        publisher = StepPublisher(cluster_config(cluster, job))
        publisher.publish(10 + number)
        publishers.append(publisher)
    for number, (_job, waiting) in enumerate(waits):
        assert waiting.join().error is None
        assert waiting.result == 10 + number
    for publisher in publishers:
        publisher.close(done=False)


def test_publish_and_wait_across_processes_with_the_cli(cluster: LocalCluster) -> None:
    job = f"cli-{uuid.uuid4().hex[:8]}"
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=cluster.seed_url, STEPBARRIER_JOB=job, STEPBARRIER_REDIS_CLUSTER="1"
    )
    waiter = subprocess.Popen(
        [*CLI, "wait", "--until", "7", "--timeout", "60"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    config = cluster_config(cluster, job)
    eventually(registered(config))
    shown = subprocess.run([*CLI, "status", "--json"], env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and '"wait_until_step": 7' in shown.stdout, shown.stderr
    published = subprocess.run([*CLI, "publish", "7"], env=env, capture_output=True, text=True)
    assert published.returncode == 0, published.stderr
    out, err = waiter.communicate(timeout=60)
    assert waiter.returncode == 0, err
    assert out.strip().endswith("7")
    later = subprocess.Popen(
        [*CLI, "wait", "--cluster", "--until", "50", "--timeout", "60"],
        env={k: v for k, v in env.items() if k != "STEPBARRIER_REDIS_CLUSTER"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    eventually(registered(config))
    reset = subprocess.run([*CLI, "reset", "--yes"], env=env, capture_output=True, text=True)
    assert reset.returncode == 0, reset.stderr
    later.communicate(timeout=60)
    assert later.returncode == 4  # aborted by the reset


def test_a_wait_across_a_slot_migration_is_woken_by_the_next_announcement(
    cluster: LocalCluster, timings: Timings, caplog: pytest.LogCaptureFixture
) -> None:
    job = f"moving-{uuid.uuid4().hex[:8]}"
    config = cluster_config(cluster, job, fallback_interval=5.0)
    keys = config.keys
    with StepPublisher(config) as chief, caplog.at_level(logging.INFO, logger="stepbarrier"):
        chief.publish(10)
        assert chief.flush(10)
        waiting = Waiting(config, 50)
        eventually(registered(config))
        eventually(lambda: subscribers(cluster, keys.channel) == 1)
        source = cluster.owner_of(keys.state)
        target = next(port for port in cluster.masters if port != source)
        started = time.monotonic()
        cluster.migrate_slot(cluster.slot_of(keys.state), target)
        timings.record("slot migration", time.monotonic() - started)
        # the waiter notices the server's sunsubscribe and subscribes on the new owner
        eventually(lambda: subscribers(cluster, keys.channel) == 1)
        assert cluster.owner_of(keys.channel) == target
        chief.publish(30)
        assert chief.flush(10)
        assert waiting.thread.is_alive()  # 30 is not its step
        released_at = time.monotonic()
        chief.publish(50)
        waiting.join()
        timings.record(
            "release after the step, across the migration", time.monotonic() - released_at
        )
    assert waiting.error is None and waiting.result == 50
    assert "by an announcement" in caplog.text


def test_a_wait_across_a_failover_is_released_after_the_promotion_never_before(
    cluster: LocalCluster, timings: Timings, monkeypatch: pytest.MonkeyPatch
) -> None:
    job = f"failover-{uuid.uuid4().hex[:8]}"
    owner = cluster.owner_of(cluster_config(cluster, job).keys.state)
    # the worst case: the seed node of every client is the master that dies
    config = cluster_config(
        cluster, job, fallback_interval=1.0, redis_url=f"redis://127.0.0.1:{owner}/0"
    )
    keys = config.keys
    # publish() only hands the step over: it never waits on Redis (here: a dead
    # master), whatever the time it takes. Any Redis I/O of the training thread
    # while in publish() is recorded
    publishing = threading.local()
    io_in_publish: list[str] = []

    def watched(name: str) -> Callable[..., Any]:
        original = getattr(redis.connection.AbstractConnection, name)

        def call(self: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(publishing, "on", False):
                io_in_publish.append(name)
            return original(self, *args, **kwargs)

        return call

    for name in ("connect", "send_packed_command", "read_response"):
        monkeypatch.setattr(redis.connection.AbstractConnection, name, watched(name))
    chief = StepPublisher(config)
    try:
        chief.publish(5)
        assert chief.flush(10)
        waiting = Waiting(config, 40)
        eventually(registered(config))
        assert cluster.owner_of(keys.state) == owner
        with cluster.node_client(owner) as node:
            node.execute_command("WAIT", 1, 2000)  # the replica has the state
        killed = time.monotonic()
        cluster.kill_master(owner)
        for step in range(6, 40):  # the chief trains on through the failover
            publishing.on = True
            try:
                chief.publish(step)
            finally:
                publishing.on = False
            time.sleep(0.05)
        promoted = cluster.wait_promoted(owner)
        timings.record("promotion after the kill", time.monotonic() - killed)
        assert waiting.thread.is_alive(), "released before its step"
        assert promoted != owner
        chief.publish(40)
        waiting.join()
        timings.record("release after the promotion", time.monotonic() - killed)
        assert waiting.error is None and waiting.result is not None and waiting.result >= 40
    finally:
        chief.close(done=False, timeout=2.0)
    assert io_in_publish == [], "publish() waited on Redis"  # it only hands over


def test_status_and_reset_read_the_slots_owner(cluster: LocalCluster) -> None:
    job = f"status-{uuid.uuid4().hex[:8]}"
    config = cluster_config(cluster, job)
    before = time.time()  # the clock of the cluster's nodes, on this machine
    with StepPublisher(config) as chief:
        chief.publish(3)
        assert chief.flush(10)
        waiting = Waiting(config, 9)
        eventually(registered(config))
        status = read_status(config)
        lasted = time.time() - before + 0.01  # (the age is rounded to the millisecond)
        assert status.step == 3 and [w.wait_until_step for w in status.waiters] == [9]
        # the owner's clock: the chief's write is no older than this test
        assert status.heartbeat_age is not None and 0 <= status.heartbeat_age <= lasted
        assert reset_job(config) == 1
        waiting.join()
    assert waiting.error is not None and type(waiting.error).__name__ == "BarrierAborted"


def test_each_tasks_progress_lives_in_the_jobs_slot_and_status_reads_it(
    cluster: LocalCluster,
) -> None:
    job = f"progress-{uuid.uuid4().hex[:8]}"
    config = cluster_config(cluster, job)
    assert cluster.slot_of(config.keys.progress) == cluster.slot_of(config.keys.state)
    with StepPublisher(config) as chief:
        chief.publish(40)
        assert chief.flush(10)
        for task, step in ((0, 40), (1, 31)):
            with ProgressReporter(config, task_id=task) as progress:
                progress.report(step)
                assert progress.flush(10), progress.last_error
        status = read_status(config)
        assert [(t.task_id, t.step, t.behind, t.stuck) for t in status.tasks] == [
            (0, 40, 0, False),
            (1, 31, 9, False),
        ]
        reset_job(config)  # the progress goes with the job's other keys
    assert read_status(config).tasks == ()


def test_follow_sees_every_multiple_while_the_chief_jumps_on_the_cluster(
    cluster: LocalCluster,
) -> None:
    """Issue 38 on Redis Cluster: ``stepbarrier follow`` (a process) and
    ``StepWaiter.follow`` (a thread) each yield every multiple of 10, in order, while
    the chief's step jumps past several at once; the job's end ends both."""
    job = f"follow-{uuid.uuid4().hex[:8]}"
    config = cluster_config(cluster, job, run_id="follow-run")
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=cluster.seed_url,
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_CLUSTER="1",
        STEPBARRIER_RUN_ID="follow-run",
    )
    seen: list[tuple[int, int]] = []

    def follower() -> None:
        with StepWaiter(config) as waiter:
            seen.extend((c.multiple, c.step) for c in waiter.follow(every=10, timeout=60))

    with StepPublisher(config) as chief:
        chief.publish(3)
        assert chief.flush(10)
        command = subprocess.Popen(
            [*CLI, "follow", "--every", "10", "--timeout", "60"],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        thread = threading.Thread(target=follower, daemon=True)
        thread.start()
        eventually(registered(config, 2))
        for step in (35, 41, 97):  # 10, 20, 30; 40; 50 .. 90
            chief.publish(step)
            assert chief.flush(10)
        chief.close(done=True)
    out, err = command.communicate(timeout=60)
    thread.join(60)
    assert command.returncode == 0, err
    assert out.split() == [str(m) for m in range(10, 100, 10)], err
    assert [m for m, _ in seen] == list(range(10, 100, 10))
    assert all(step in (35, 41, 97) and step >= m for m, step in seen), seen


def test_status_names_a_stuck_task_reported_from_its_own_process_on_the_cluster(
    cluster: LocalCluster,
) -> None:
    """Each task reports through a ``ProgressReporter`` in its own process; task 2
    stops at step 20 while the others advance, and ``status`` on the cluster lists
    every task and names task 2 stuck (issue 38)."""
    job = f"stuck-{uuid.uuid4().hex[:8]}"
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=cluster.seed_url, STEPBARRIER_JOB=job, STEPBARRIER_REDIS_CLUSTER="1"
    )
    tasks = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.progress_task",
                cluster.seed_url,
                job,
                str(task),
                "20" if task == 2 else "0",
                "cluster",
            ],
            env=env,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=ROOT,
        )
        for task in (1, 2)
    ]
    config = cluster_config(cluster, job, role="chief")
    training, reported = threading.Event(), threading.Event()

    def chief() -> None:
        with (
            StepPublisher(config) as publisher,
            ProgressReporter(config, interval=0.1) as progress,
        ):
            step = 0
            while not training.wait(0.02):
                step += 1
                publisher.publish(step)
                progress.report(step)
                reported.set()

    thread = threading.Thread(target=chief)
    thread.start()
    try:
        for process in tasks:
            assert process.stdout is not None and process.stdout.readline() == "started\n"
        # the chief's thread may start after both tasks on a loaded machine: before its
        # first write status finds no chief (exit 7), which this test is not about
        assert reported.wait(60), "the chief's thread published nothing in 60 s"
        check = [*CLI, "status", "--check", "--stall-timeout", "2"]
        while True:  # (no clock: pytest-timeout bounds the test)
            result = subprocess.run(check, env=env, capture_output=True, text=True, timeout=60)
            if result.returncode == 10:
                break
            assert result.returncode == 0, result.stdout + result.stderr
            time.sleep(0.2)
        assert result.stdout.startswith(f"job {job}: stuck: task 2 at step 20 ("), result.stdout
        shown = subprocess.run(
            [*CLI, "status", "--json", "--stall-timeout", "2"],
            env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        by_task = {t["task_id"]: t for t in json.loads(shown.stdout)["tasks"]}
        assert set(by_task) == {0, 1, 2}
        assert [t for t, e in by_task.items() if e["stuck"]] == [2]
        assert by_task[2]["step"] == 20 and by_task[2]["behind"] > 0
    finally:
        training.set()
        thread.join(30)
        for process in tasks:
            process.communicate(timeout=30)


def test_an_unreachable_cluster_is_a_clear_error_not_a_traceback(cluster: LocalCluster) -> None:
    from tests.redis_harness import free_port

    env = subprocess_env(
        STEPBARRIER_REDIS_URL=f"redis://127.0.0.1:{free_port()}/0",
        STEPBARRIER_JOB="nowhere",
        STEPBARRIER_REDIS_CLUSTER="1",
    )
    shown = subprocess.run([*CLI, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 5, shown.stderr
    assert "Traceback" not in shown.stderr and "Redis Cluster at" in shown.stderr


def test_a_cluster_config_rejects_a_database_and_sentinels() -> None:
    with pytest.raises(ValueError, match="only database 0"):
        BarrierConfig(job="j", redis_url="redis://h:7000/3", redis_cluster=True)
    with pytest.raises(ValueError, match="do not go together"):
        BarrierConfig(
            job="j", redis_url="redis://h:7000/0", redis_cluster=True, sentinels=(("h", 1),)
        )
    assert redis.__version__ >= "8.1"
