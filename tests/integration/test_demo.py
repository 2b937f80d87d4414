"""`make demo` (`python -m examples.demo`): a real local job that ends with a summary
and leaves nothing behind."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import uuid
import zipfile
from pathlib import Path

import pytest

from examples.demo.local import EmbeddedRedis, ProcessGroup
from examples.demo.run import PROGRAM, default_schedule, default_step_sleep
from examples.demo.views import DemoFrame, WorkerRow, demo_view, progress_line
from stepbarrier import BarrierConfig, StepPublisher, StepWaiter, read_status
from stepbarrier._config.schedule import schedule_wait_until_step
from stepbarrier.cli._views.output import plain_text
from tests.conftest import ROOT, subprocess_env
from tests.redis_harness import pid_alive

DEMO = [sys.executable, "-m", "examples.demo"]


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


def left_behind(job: str, within: float = 15.0) -> dict[int, str]:
    """The demo's processes still alive ``within`` seconds after it exited, with their
    command lines: a killed process takes a moment to go on a loaded machine, one
    that was never stopped stays."""
    deadline = time.monotonic() + within
    while (pids := processes_of(job)) and time.monotonic() < deadline:
        time.sleep(0.2)
    left = {}
    for pid in pids:
        try:
            left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
    return left


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
        "import sys, stepbarrier.cli, examples.demo.__main__\n"
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
        [*DEMO, "--schedule", "square:3"],
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 2
    assert "--schedule" in result.stderr


def demo_without(module: str, path: str) -> subprocess.CompletedProcess[str]:
    """The demo where ``module`` cannot be imported, with ``path`` as PATH."""
    code = (
        f"import sys\nsys.modules[{module!r}] = None  # import {module} fails\n"
        "from examples.demo.__main__ import demo\ndemo.main(['--steps', '10'])\n"
    )
    return subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env(PATH=path),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_demo_without_a_redis_to_embed_says_what_to_install(tmp_path: Path) -> None:
    result = demo_without("fakeredis", path=str(tmp_path))  # empty: no redis-server
    assert result.returncode == 2, result.stderr
    assert result.stdout == ""  # nothing started
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: the demo needs a Redis to embed"), line
    assert "apt-get install redis-server" in line and "'.[demo]'" in line
    assert "unexpected" not in line


def test_the_demo_without_tensorflow_names_the_demo_extra() -> None:
    result = demo_without("tensorflow", path=os.environ["PATH"])  # with redis-server
    assert result.returncode == 2, result.stderr
    (line,) = result.stderr.splitlines()
    assert line.startswith("Error: the demo needs TensorFlow"), line
    assert "'.[demo]'" in line and "[tensorflow]" not in line


@pytest.mark.tensorflow
def test_demo_runs_a_job_to_a_summary_and_leaves_nothing_running() -> None:
    job = demo_job()
    result = subprocess.run(
        [*DEMO, "--workers", "2", "--steps", "40", "--job", job],
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
    assert left_behind(job) == {}


@pytest.mark.tensorflow
def interruptible() -> None:
    """Ctrl-C as a terminal gives it: the suite itself may run with SIGINT
    ignored (``make test &`` in a shell without job control), which the demo
    would rightly keep ignored (test_a_signal_the_demo_ignores_stays_ignored...)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_ctrl_c_stops_every_process_and_exits_0() -> None:
    job = demo_job()
    demo = subprocess.Popen(
        [*DEMO, "--workers", "2", "--steps", "5000", "--job", job],
        env=subprocess_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
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
    assert "the summary so far" in out  # what ran until Ctrl-C
    assert left_behind(job) == {}


def test_a_stop_that_comes_while_a_child_starts_finds_it_recorded(tmp_path: Path) -> None:
    """Ctrl-C between a child's fork and its record would leave it running with
    nobody to stop it: the stop is held until the child is recorded."""
    group = ProcessGroup(tmp_path)
    real_popen = subprocess.Popen

    def popen_then_ctrl_c(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        child = real_popen(*args, **kwargs)  # type: ignore[call-overload]
        os.kill(os.getpid(), signal.SIGINT)  # as the child has just started
        time.sleep(0.05)  # delivered here, if nothing holds it
        return child  # type: ignore[no-any-return]

    subprocess.Popen = popen_then_ctrl_c  # type: ignore[assignment,misc]
    # Python's own Ctrl-C handler, also when the suite runs with SIGINT ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], {})
    finally:
        subprocess.Popen = real_popen  # type: ignore[misc]
        signal.signal(signal.SIGINT, previous)
        recorded = dict(group.processes)
        group.stop_all()
    assert "sleeper" in recorded  # the interrupt came after the record
    assert recorded["sleeper"].poll() is not None  # and stop_all ended it


def test_a_signal_the_demo_ignores_stays_ignored_in_its_children(tmp_path: Path) -> None:
    """The stop signals are held while a child starts, but one the demo ignores
    (started with nohup, say) is not taken over: the child inherits it ignored."""
    group = ProcessGroup(tmp_path)
    previous = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        group.start("sleeper", [sys.executable, "-c", "import time; time.sleep(600)"], {})
        status = Path(f"/proc/{group.processes['sleeper'].pid}/status").read_text()
    finally:
        signal.signal(signal.SIGHUP, previous)
        group.stop_all()
    ignored = int(
        next(line for line in status.splitlines() if line.startswith("SigIgn:")).split()[1], 16
    )
    assert ignored & (1 << (signal.SIGHUP - 1)), status


def frame(**changes: object) -> DemoFrame:
    settings: dict[str, object] = {
        "phase": "training",
        "job": "demo-x",
        "steps": 200,
        "step": 60,
        "heartbeat_age": 0.2,
        "ps": "running",
        "chief": "running",
        "workers": (
            WorkerRow(1, 22, "training", released_at=22, latency="1.9 ms"),
            WorkerRow(2, 35, "finished", released_at=36, latency="2.4 ms"),
            WorkerRow(3, 87, "waiting"),
        ),
    }
    settings.update(changes)
    return DemoFrame(**settings)  # type: ignore[arg-type]


def test_the_live_view_keeps_released_workers_and_shows_no_internals() -> None:
    text = plain_text(demo_view(frame()), width=120)
    assert "generation" not in text
    assert "step 60 of 200" in text
    rows = [line.split() for line in text.splitlines() if line.split()[:1] in (["1"], ["2"], ["3"])]
    assert [(row[0], row[1]) for row in rows] == [("1", "22"), ("2", "35"), ("3", "87")]
    assert "1.9 ms" in text and "2.4 ms" in text  # released workers stay, with their latency
    assert "finished" in text and "waiting" in text


def test_the_finished_frame_shows_no_running_ps() -> None:
    text = plain_text(demo_view(frame(phase="finished", ps="stopped", chief="finished")))
    assert "ps stopped, chief finished" in text
    assert "running" not in text


def test_the_piped_progress_line_names_each_worker() -> None:
    line = progress_line(frame())
    assert line.startswith("training: chief at step 60/200; ")
    assert "worker 1 released at 22, 1.9 ms" in line
    assert "worker 3 waiting for 87" in line


def test_a_step_past_the_last_one_is_explained_not_shown_as_203_of_200() -> None:
    past = frame(phase="finished", step=203)
    text = plain_text(demo_view(past), width=160)
    assert "step 203: the last step 200, plus 3 that other tasks had under way" in text
    assert "of 200" not in text
    line = progress_line(past)
    assert line.startswith("finished: chief at step 203: the last step 200, plus 3 "), line
    assert "203/200" not in line
    assert "step 200 of 200" in plain_text(demo_view(frame(step=200)), width=160)


def test_the_demo_runs_the_examples_file() -> None:
    assert Path(ROOT, "examples", "tf1_parameter_server.py") == PROGRAM


def installed_copy(tmp_path: Path) -> Path:
    """The wheel, built and unpacked into a directory of its own (what pip installs)."""
    from tests.repository.test_packaging import build

    wheel = build("wheel", tmp_path / "dist")
    target = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        assert not [name for name in archive.namelist() if name.startswith("examples/")]
        archive.extractall(target)
    return target


def installed_env(target: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPBARRIER_")}
    # the unpacked wheel, not this checkout's package; the demo from the checkout
    env["PYTHONPATH"] = str(target) + os.pathsep + ROOT
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra)
    return env


def test_the_demo_runs_on_the_installed_package(tmp_path: Path) -> None:
    target = installed_copy(tmp_path)
    code = (
        "import stepbarrier\n"
        "from examples.demo.run import PROGRAM\n"
        "print(stepbarrier.__file__)\n"
        "print(PROGRAM)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        env=installed_env(target),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    package, program = result.stdout.split()
    assert package.startswith(str(target)) and program == str(PROGRAM)


@pytest.mark.tensorflow
def test_the_demo_runs_from_an_installed_wheel(tmp_path: Path) -> None:
    target = installed_copy(tmp_path)
    job = demo_job()
    result = subprocess.run(
        [
            *DEMO,
            "--workers",
            "1",
            "--steps",
            "20",
            "--job",
            job,
        ],
        env=installed_env(target),
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "│ worker 1 " in result.stdout
    # piped: progress lines, not a live view
    assert "training: chief at step" in result.stdout
    assert "\x1b[" not in result.stdout
    assert left_behind(job) == {}
