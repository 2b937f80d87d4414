"""docker-compose.yml run for real, exactly as docs/operations.md says.

``STEPBARRIER_RUN_ID=$(date +%s) docker compose up --build --exit-code-from chief``
in the repository, and from the host, while the workers wait, `stepbarrier
status` and `stepbarrier watch` as the monitor user (with this run's password,
copied out with `docker compose cp`, against the port Redis is published on:
`docker compose port redis 6379`) and the exporter's /metrics.
`up` returns the chief's exit status: the chief's container is the first to
exit (a worker's prints "worker exit status: N" and stays, as the file's header
says), and each worker's status is read from that line; no container logs a
warning or a refusal (the passwords are made fresh at each `up`, so start-redis.sh
has no example password to warn of; Redis's "Memory overcommit" warning, of the
host's kernel, is the only one allowed). A Redis of the host's own on 127.0.0.1:6379 does not stop
`up`. The base images are LOCAL STAND-INS built from debootstrap
(ops/compose-standins/; tests/compose_run/conftest.py), not the official ones.
"""

from __future__ import annotations

import re
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest
import redis

from tests.compose_run.harness import (
    COMPOSE_FILE,
    JOB,
    JUST_PAST,
    MONITOR_PASSWORD,
    REDIS_PORT,
    REPO,
    STEPBARRIER,
    TARGETS,
    TRACEBACK,
    WORKERS,
    Project,
    exit_line_times,
    exit_statuses,
    first_exits,
    interrupt,
    interruptible,
    problems,
    releases,
    wait_for,
    waiting_at,
    warnings_and_refusals,
)
from tests.ops_redis import PASSWORDS
from tests.redis_harness import RedisServer


def test_the_job_runs_and_the_host_sees_the_waiting_workers(cleanup: list[Project]) -> None:
    project = Project([COMPOSE_FILE])  # no -p, no override: the user's command
    cleanup.append(project)
    started = time.monotonic()
    up = project.popen("up", "--build", "--exit-code-from", "chief")
    try:
        # the chief trains once all three wait: the host sees them before the first release
        status = wait_for("three waiting workers", waiting_at(project, 0), timeout=600)
        assert {w["task_id"]: w["wait_until_step"] for w in status["waiters"]} == {
            1: TARGETS["worker-1"], 2: TARGETS["worker-2"], 3: TARGETS["worker-3"]
        }  # fmt: skip
        assert status["job"] == JOB and not status["done"]
        text = subprocess.run(
            [STEPBARRIER, "status", *project.monitor()],
            cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        assert text.returncode == 0, text.stderr
        assert JOB in text.stdout and "waiting" in text.stdout
        assert str(TARGETS["worker-3"]) in text.stdout, text.stdout  # the last to go
        with urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=10) as reply:
            metrics = reply.read().decode()
        waiting = re.search(
            rf'^stepbarrier_waiting_workers{{job_name="{JOB}"}} (\S+)$', metrics, re.MULTILINE
        )
        assert waiting is not None and float(waiting.group(1)) >= 1, metrics
        assert "stepbarrier_up 1.0" in metrics
        watch = subprocess.Popen(
            [STEPBARRIER, "watch", *project.monitor()], cwd=REPO,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
            preexec_fn=interruptible,
        )  # fmt: skip
        time.sleep(3)
        code, output = interrupt(watch)
        assert code == 0, output  # Ctrl-C ends watch with 0
        assert JOB in output and str(TARGETS["worker-3"]) in output, output
        up_output, _ = up.communicate(timeout=600)
    finally:
        if up.poll() is None:
            interrupt(up, timeout=60)
    print(f"docker compose up took {time.monotonic() - started:.0f} s")
    assert up.returncode == 0, up_output[-5000:]  # --exit-code-from chief: the chief's 0
    exits = first_exits(up_output)
    print("containers exited in this order:", exits)
    assert exits[:1] == ["chief"], (exits, up_output[-5000:])  # the first to exit: no race
    logs = project.logs()
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
    # every container's log (Redis, ps, the chief, the workers, the exporter): the
    # shipped configuration asks no role for what its ACL forbids, and warns of nothing
    assert warnings_and_refusals(logs) == []


HOST_REDIS_PORT = 6379
"""Redis's default port, where a developer's own Redis may listen on the host."""


def listening(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(2)
        return sock.connect_ex(("127.0.0.1", port)) == 0


def test_a_redis_on_the_hosts_port_6379_does_not_stop_compose(
    cleanup: list[Project], built: None
) -> None:
    """A Redis of the host's own on 127.0.0.1:6379 (started here when nothing
    listens there: the one place a fixed port is the point of a test) stays
    as it is, and `up` starts the job's Redis beside it, on the port Docker
    picked; only the services that publish a port start (Redis, the exporter)."""
    own = None if listening(HOST_REDIS_PORT) else RedisServer(port=HOST_REDIS_PORT).start()
    try:
        assert listening(HOST_REDIS_PORT)
        project = Project([COMPOSE_FILE], name="stepbarrier-beside-6379")
        cleanup.append(project)
        project.down()  # anything a killed earlier run left
        project.compose("up", "--detach", "--wait", "--no-build", "redis", "exporter", timeout=300)
        address = project.published("redis", REDIS_PORT)
        assert address is not None and address != f"127.0.0.1:{HOST_REDIS_PORT}", address
        host, port = address.rsplit(":", 1)
        password = project.monitor_password().read_text().strip()  # this run's
        assert password != PASSWORDS["monitor"]
        job_redis = redis.Redis(host=host, port=int(port), username="monitor", password=password)
        try:
            assert job_redis.ping()  # the job's Redis, its ACL users and all
        finally:
            job_redis.close()
        # the public EXAMPLE passwords are in use nowhere: Redis refuses every one
        for user, example in PASSWORDS.items():
            client = redis.Redis(host=host, port=int(port), username=user, password=example)
            try:
                with pytest.raises(redis.AuthenticationError):
                    client.ping()
            finally:
                client.close()
        # each container sees its own role's files alone
        listed = {
            service: sorted(
                project.compose("exec", "-T", service, "ls", "/run/stepbarrier").split()
            )
            for service in ("redis", "exporter")
        }
        assert listed == {
            "redis": ["emergency.password", "installer.password", "users.acl"],
            "exporter": [Path(MONITOR_PASSWORD).name],
        }
        with urllib.request.urlopen("http://127.0.0.1:9464/metrics", timeout=10) as reply:
            assert "stepbarrier_up 1.0" in reply.read().decode()
        if own is not None:
            assert own.process is not None and own.process.poll() is None
            assert own.client().ping()  # still the host's own, no password
        logs = project.logs()
        assert warnings_and_refusals(logs) == [] and TRACEBACK not in logs, logs[-5000:]
    finally:
        if own is not None:
            own.cleanup()
