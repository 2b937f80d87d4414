"""`stepbarrier demo`: a real local job that ends with a summary and leaves nothing behind."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter, read_status
from stepbarrier._config.schedule import schedule_wait_until_step
from stepbarrier.cli._demo.demo import default_schedule, default_step_sleep
from stepbarrier.cli._demo.local_processes import EmbeddedRedis
from tests.conftest import subprocess_env
from tests.redis_harness import pid_alive

CLI = [sys.executable, "-m", "stepbarrier"]


def processes_of(job: str) -> list[int]:
    """Pids of live processes whose environment names ``job`` (the demo's children)."""
    marker = f"STEPBARRIER_JOB={job}\0".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker in environ and state != "Z":
            found.append(int(entry.name))
    return found


def demo_job() -> str:
    return f"demo-test-{uuid.uuid4().hex[:8]}"


def test_default_schedule_starts_the_last_worker_at_60_percent() -> None:
    spec = default_schedule(3, 200)
    targets = [schedule_wait_until_step(task, spec) for task in (1, 2, 3)]
    assert targets == sorted(targets) and targets[0] > 0
    assert 100 <= targets[-1] <= 125


def test_default_pace_is_bounded() -> None:
    assert default_step_sleep([0, 0]) == 0.0
    assert 0 < default_step_sleep([55, 87]) <= 0.25
    assert default_step_sleep([2]) == 0.25


def test_the_demo_and_the_cli_do_not_import_tensorflow() -> None:
    code = (
        "import sys, stepbarrier.cli, stepbarrier.cli._demo.demo\n"
        "assert 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], env=subprocess_env(), check=True)


@pytest.mark.parametrize("kind", ["redis-server", "fakeredis"])
def test_the_embedded_redis_serves_the_barrier_and_stops(tmp_path: Path, kind: str) -> None:
    server = EmbeddedRedis(tmp_path, {}, kind=kind).start()
    try:
        config = BarrierConfig(job="embedded", redis_url=server.url, heartbeat=0.2)
        with StepPublisher(config) as publisher, StepWaiter(config) as waiter:
            publisher.publish(3)
            assert waiter.wait(3, timeout=30) == 3
        assert read_status(config).step == 3
        pid = server.pid
        assert (pid is not None) == (kind == "redis-server")
    finally:
        server.stop()
    assert pid is None or not pid_alive(pid)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()


def test_a_bad_schedule_is_exit_2() -> None:
    result = subprocess.run(
        [*CLI, "demo", "--schedule", "square:3"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--schedule" in result.stderr


@pytest.mark.tensorflow
def test_demo_runs_a_job_to_a_summary_and_leaves_nothing_running() -> None:
    job = demo_job()
    result = subprocess.run(
        [*CLI, "demo", "--workers", "2", "--steps", "40", "--job", job],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    targets = [schedule_wait_until_step(task, default_schedule(2, 40)) for task in (1, 2)]
    rows = {
        line.split("│")[1].strip(): [cell.strip() for cell in line.split("│")[2:-1]]
        for line in result.stdout.splitlines()
        if line.startswith("│ worker")
    }
    assert set(rows) == {"worker 1", "worker 2"}
    for task, target in zip((1, 2), targets, strict=True):
        wait_until, released_at, latency, trained = rows[f"worker {task}"][:4]
        assert int(wait_until) == target
        assert int(released_at) >= target
        assert latency.endswith("ms")
        assert int(trained) >= 1
    assert processes_of(job) == []


@pytest.mark.tensorflow
def test_ctrl_c_stops_every_process_and_exits_0() -> None:
    job = demo_job()
    demo = subprocess.Popen(
        [*CLI, "demo", "--workers", "2", "--steps", "5000", "--job", job],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while len(processes_of(job)) < 3:  # redis-server, the ps and the chief
            assert demo.poll() is None, demo.communicate()
            assert time.monotonic() < deadline, "the demo never started its processes"
            time.sleep(0.2)
        demo.send_signal(signal.SIGINT)
        out, err = demo.communicate(timeout=60)
    finally:
        if demo.poll() is None:
            demo.kill()
    assert demo.returncode == 0, out + err
    assert "interrupted" in out
    assert processes_of(job) == []
