"""docker-compose.cluster.yml (the job on a 6-node Redis Cluster) run for real.

Exactly as docs/operations.md says: ``STEPBARRIER_RUN_ID=$(date +%s) docker
compose -f docker-compose.cluster.yml up --build --exit-code-from chief``, and,
while the workers wait, ``docker compose -f docker-compose.cluster.yml exec
chief stepbarrier status --job compose-demo`` (nothing is published on the
host). `up` returns the chief's exit status: the chief's container is the
first to exit; each worker prints "worker exit status: N" and stays, and so
do the one-shot services cluster-acl and cluster-create once done (healthy),
as the file's header says. The base images are LOCAL STAND-INS built from debootstrap
(ops/compose-standins/), not the official ones.
"""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

from tests.compose_run.harness import (
    CLUSTER_FILE,
    JOB,
    JUST_PAST,
    REPO,
    TARGETS,
    WORKERS,
    Project,
    exit_line_times,
    exit_statuses,
    first_exits,
    interrupt,
    problems,
    releases,
    wait_for,
)


def test_the_job_runs_on_the_cluster_and_the_workers_go_at_their_steps(
    cleanup: list[Project],
) -> None:
    project = Project([CLUSTER_FILE])  # its own project name: stepbarrier-cluster
    cleanup.append(project)
    project.down()  # a cluster left by an earlier run (its volume holds the ACL)
    started = time.monotonic()
    up = project.popen("up", "--build", "--exit-code-from", "chief")

    def status(*json_flag: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            project.argv("exec", "chief", "stepbarrier", "status", "--job", JOB, *json_flag),
            cwd=REPO, env=project.env(), capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip

    def three_waiting() -> dict[str, Any] | None:
        result = status("--json")
        if result.returncode != 0:
            return None
        data: dict[str, Any] = json.loads(result.stdout)
        return data if len(data["waiters"]) == 3 else None

    try:
        waiting = wait_for("three waiting workers", three_waiting, timeout=600, interval=0.5)
        assert {w["task_id"]: w["wait_until_step"] for w in waiting["waiters"]} == {
            1: TARGETS["worker-1"], 2: TARGETS["worker-2"], 3: TARGETS["worker-3"]
        }  # fmt: skip
        text = status()  # the docs' command
        assert text.returncode == 0, text.stderr
        assert JOB in text.stdout and str(TARGETS["worker-3"]) in text.stdout, text.stdout
        up_output, _ = up.communicate(timeout=600)
    finally:
        if up.poll() is None:
            interrupt(up, timeout=60)
    print(
        f"docker compose -f docker-compose.cluster.yml up took {time.monotonic() - started:.0f} s"
    )
    assert up.returncode == 0, up_output[-5000:]  # --exit-code-from chief: the chief's 0
    exits = first_exits(up_output)
    print("containers exited in this order:", exits)
    assert exits[:1] == ["chief"], (exits, up_output[-5000:])  # not a one-shot, not a worker
    logs = project.logs()
    assert "cluster-create: stepbarrier_v" in logs and "loaded on all 3 primaries" in logs
    for one_shot in ("cluster-acl", "cluster-create"):
        assert any(
            line.startswith(one_shot) and "done; the container stays" in line
            for line in logs.splitlines()
        ), (one_shot, logs[-3000:])
    statuses = exit_statuses(logs)
    assert statuses == {"chief": 0, **{worker: 0 for worker in WORKERS}}, logs[-5000:]
    times = exit_line_times(project)
    print(
        "exit status lines after the chief's (s; it exits 5 s after its own):",
        {worker: round(times[worker] - times["chief"], 2) for worker in WORKERS},
    )
    released = releases(logs)
    assert set(released) == set(TARGETS), logs[-5000:]
    for worker, (step, target) in released.items():
        assert target == TARGETS[worker]
        assert target <= step <= target + JUST_PAST, (worker, step, target)
    assert problems(logs) == []
