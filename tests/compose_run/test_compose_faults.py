"""Faults across the containers of docker-compose.yml, while the workers wait.

The chief paused and resumed, then Redis killed and started again (one run);
a waiting worker cut off the network and connected again; the chief killed. The user's
file runs unchanged; a second ``-f`` (written by the test) only adds each
task's RECORD_FILE (examples/tf1_parameter_server.py writes the step and time
of its release there), a shorter TRAIN_STEPS where the end of the job does
not matter, and, for the killed chief, a shorter STEPBARRIER_STALL_TIMEOUT.
A worker's container stays after its program (the compose file's header): its
program's exit status is read from its "worker exit status: N" line, the
chief's from its container. The base images are LOCAL STAND-INS built from
debootstrap (ops/compose-standins/), not the official ones.
"""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

from tests.compose_run.harness import (
    COMPOSE_FILE,
    JUST_PAST,
    REPO,
    TARGETS,
    TRACEBACK,
    WORKERS,
    Project,
    docker,
    exit_statuses,
    host_status,
    read_record,
    records_override,
    wait_for,
    waiting_at,
)

SHORT_JOB = {"TRAIN_STEPS": "600"}  # past every worker's step (415), sooner done


def start(
    tmp_path: Path, cleanup: list[Project], extra: dict[str, dict[str, str]] | None = None
) -> Project:
    override = records_override(tmp_path, extra)
    project = Project([COMPOSE_FILE, override], name="stepbarrier-faults")
    cleanup.append(project)
    project.down()  # anything a killed earlier run left
    project.compose("up", "--detach", "--no-build", timeout=600)
    return project


def worker_statuses(project: Project, timeout: float) -> dict[str, int]:
    """Each worker's program's exit status, once all three printed it."""
    statuses: dict[str, int] = wait_for(
        "every worker's exit status line",
        lambda: (found := exit_statuses(project.logs())).keys() >= set(WORKERS) and found,
        timeout=timeout,
        interval=0.5,
    )
    for worker in WORKERS:  # the container stays after the line
        assert project.state(worker)["Status"] == "running", worker
    return {worker: statuses[worker] for worker in WORKERS}


def every_task_exits_0(project: Project) -> None:
    code = project.exit_code("chief", timeout=300)
    assert code == 0, (code, project.logs("chief")[-3000:])
    statuses = worker_statuses(project, timeout=60)
    assert statuses == {worker: 0 for worker in WORKERS}, (statuses, project.logs()[-5000:])
    logs = project.logs()
    assert TRACEBACK not in logs, logs[-5000:]


def test_a_waiting_worker_cut_off_the_network_is_released_after_it_reconnects(
    tmp_path: Path, cleanup: list[Project], built: None
) -> None:
    project = start(tmp_path, cleanup, {name: SHORT_JOB for name in ("chief", *WORKERS)})
    wait_for("training under way", waiting_at(project, 20), timeout=300)
    worker = project.container("worker-3")
    network = project.network("worker-3")
    docker("network", "disconnect", network, worker)
    target = TARGETS["worker-3"]
    passed = wait_for(
        "the chief past worker-3's step",
        lambda: (
            (status := host_status(project)) is not None
            and status["step"] >= target + 20
            and status
        ),
        timeout=120,
    )
    assert "released at step" not in project.logs("worker-3")
    reconnected = time.time()
    docker("network", "connect", "--alias", "worker-3", network, worker)
    every_task_exits_0(project)
    record = read_record(tmp_path, "worker-3")
    assert record["released_at"] >= reconnected, record
    assert record["released_at_step"] >= passed["step"], (record, passed["step"])
    for other in ("worker-1", "worker-2"):
        step = read_record(tmp_path, other)["released_at_step"]
        assert TARGETS[other] <= step <= TARGETS[other] + JUST_PAST, (other, step)
    delay = record["released_at"] - reconnected
    [line] = [line for line in project.logs("worker-3").splitlines() if "released at" in line]
    print(f"worker-3 reconnected at step >= {passed['step']}, {delay:.1f} s later:", line)


PAUSE = 10.0  # seconds; the stall timeout is docker-compose.yml's 120 s
OUTAGE = 3.0  # seconds Redis is down


def test_the_chief_paused_then_redis_killed_and_started_again_mid_wait(
    tmp_path: Path, cleanup: list[Project], built: None
) -> None:
    """Both before worker-1's step (207), the chief a little slower (STEP_SLEEP)
    to leave room: the chief paused for less than the stall timeout (the workers
    wait on, none aborts), then Redis killed and started again (no persistence:
    it comes back empty, start-redis.sh loads the library again, the chief
    publishes again, the workers register again). Every worker is then
    released at or just past its step, after both faults, none early."""
    slower = {"STEP_SLEEP": "0.08"}
    project = start(
        tmp_path, cleanup, {"chief": {**SHORT_JOB, **slower}, **{w: SHORT_JOB for w in WORKERS}}
    )
    wait_for("training under way", waiting_at(project, 20), timeout=300)
    chief = project.container("chief")
    docker("pause", chief)
    paused = wait_for("the status", lambda: host_status(project), timeout=30)
    time.sleep(PAUSE)
    status = wait_for("the status", lambda: host_status(project), timeout=30)
    assert status["step"] == paused["step"] < TARGETS["worker-1"], (paused, status)
    assert len(status["waiters"]) == 3, status  # all still wait, none gave up
    assert all(project.state(w)["Status"] == "running" for w in WORKERS)
    docker("unpause", chief)
    wait_for("the chief on again", waiting_at(project, paused["step"] + 10), timeout=60)

    redis = project.container("redis")
    docker("kill", redis)
    time.sleep(OUTAGE)
    restarted = time.time()
    docker("start", redis)
    # back, empty: the chief publishes again and all three register again
    back = wait_for("three waiting on the new Redis", waiting_at(project, 1), timeout=60)
    assert back["step"] < TARGETS["worker-1"], back  # the test left the room it needs
    every_task_exits_0(project)
    for worker in WORKERS:
        record = read_record(tmp_path, worker)
        assert record["wait_until_step"] == TARGETS[worker]
        assert record["released_at"] >= restarted, (worker, record)
        step = record["released_at_step"]
        assert TARGETS[worker] <= step <= TARGETS[worker] + JUST_PAST, (worker, step)
    print(
        f"chief paused {PAUSE:.0f} s at step {paused['step']} (heartbeat age then "
        f"{status['heartbeat_age']} s); Redis down {OUTAGE:.0f} s; three waiting again at step "
        f"{back['step']}; released at",
        {w: read_record(tmp_path, w)["released_at_step"] for w in WORKERS},
    )


STALL = 15  # seconds: the workers' STEPBARRIER_STALL_TIMEOUT here


def test_the_chief_killed_the_workers_end_with_the_stall_timeout(
    tmp_path: Path, cleanup: list[Project], built: None
) -> None:
    """examples/tf1_parameter_server.py, the compose file's worker program,
    exits 1 when its wait ends without its step (BarrierTimeout); `stepbarrier
    wait` exits 3 (docs/cli.md#exit-codes)."""
    stall = {"STEPBARRIER_STALL_TIMEOUT": str(STALL)}
    project = start(tmp_path, cleanup, {name: stall for name in WORKERS})
    wait_for("training under way", waiting_at(project, 1), timeout=300)
    docker("kill", project.container("chief"))
    killed = time.time()
    statuses = worker_statuses(project, timeout=STALL + 60)
    after = time.time() - killed  # when the last one printed it (polled every 0.5 s)
    print(f"the workers gave up {after:.1f} s after the chief was killed (stall timeout {STALL} s)")
    assert statuses == {worker: 1 for worker in WORKERS}, statuses
    for worker in WORKERS:
        logs = project.logs(worker)
        assert "gave up waiting: BarrierTimeout" in logs, logs[-3000:]
        # the stall timeout ended each wait (no write of the chief for STALL s), no
        # other limit: the cause, not the seconds, which a busy host stretches
        assert "(stall timeout)" in logs, logs[-3000:]
        assert TRACEBACK not in logs, logs[-3000:]
        record = read_record(tmp_path, worker)
        assert record["released_at_step"] is None and record["steps_trained"] == 0, record
    # the command line's waiter, in a worker's container: exit 3, a timeout
    started = time.monotonic()
    wait = subprocess.run(
        project.argv("run", "--rm", "--no-deps", "worker-1",
                     "stepbarrier", "wait", "--until", "100000", "--stall-timeout", "5"),
        cwd=REPO, env=project.env(), capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert wait.returncode == 3, (wait.returncode, wait.stdout, wait.stderr)
    assert TRACEBACK not in wait.stderr
    print(f"stepbarrier wait: exit 3 after {time.monotonic() - started:.1f} s:",
          wait.stderr.strip().splitlines()[-1])  # fmt: skip
