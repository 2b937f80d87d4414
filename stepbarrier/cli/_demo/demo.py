"""``stepbarrier demo``: a real local parameter-server job held back by the barrier.

It starts an embedded Redis, then ``examples/tf1_parameter_server.py`` as
separate processes: one ps, the chief and N workers (task ids 1..N) whose
``wait_until_step`` comes from a ``log:K`` schedule. Workers start once the
chief's session is up (a non-chief session that starts earlier re-checks only
every 30 s). It shows the live view, then a summary of each worker's release.

This module never imports TensorFlow: the training runs in the child processes.
"""

from __future__ import annotations

import atexit
import importlib.util
import json
import math
import os
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from stepbarrier._config.checks import validate_job
from stepbarrier._config.schedule import schedule_wait_until_step, validate_schedule
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import JobStatus, read_status
from stepbarrier.cli._demo.local_processes import LOOPBACK, EmbeddedRedis, ProcessGroup, free_port
from stepbarrier.cli._views.demo_summary import release_summary
from stepbarrier.cli._views.status import status_view
from stepbarrier.errors import ConfigurationError, StepBarrierError

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "tf1_parameter_server.py"
"""The training script the demo runs (in a source checkout)."""
RAMP_SECONDS = 10.0
"""About how long the chief alone takes to reach the first worker's step."""
CHIEF_READY_TIMEOUT = 180.0
"""Seconds the chief may take to create its session."""
CHIEF_READY = "chief ready at global step"
"""What the example's chief prints once its session is up."""
LAST_WORKER_AT = 0.6
"""With the default schedule the last worker starts at this fraction of the steps."""


class _Stopped(Exception):
    """SIGTERM or SIGHUP arrived: stop like after Ctrl-C."""


def default_schedule(workers: int, steps: int) -> str:
    """``log:K`` such that the last worker's step is ``LAST_WORKER_AT`` of ``steps``."""
    factor = max(1, round(LAST_WORKER_AT * steps / math.log(workers + 1)))
    return f"log:{factor}"


def default_step_sleep(targets: list[int]) -> float:
    """A training pace slow enough to watch the ramp (about ``RAMP_SECONDS``)."""
    first = min((t for t in targets if t > 0), default=0)
    return 0.0 if first == 0 else round(min(0.25, RAMP_SECONDS / first), 3)


def run_demo(
    workers: int = 3,
    schedule: str | None = None,
    steps: int = 200,
    step_sleep: float | None = None,
    job: str | None = None,
    example: str | None = None,
    redis_kind: str = "auto",
) -> int:
    """Run the demo; returns the exit code (0 when every task finished well)."""
    script = Path(example) if example else EXAMPLE
    if not script.is_file():
        raise ConfigurationError(
            f"the demo runs {script}, which is missing: run it from a source checkout (`make demo`)"
        )
    if example is None and importlib.util.find_spec("tensorflow") is None:
        raise ConfigurationError(
            "the demo needs TensorFlow: pip install 'stepbarrier[tensorflow]' (or `make demo`)"
        )
    spec = validate_schedule(schedule or default_schedule(workers, steps), variable="--schedule")
    targets = [schedule_wait_until_step(task, spec) for task in range(1, workers + 1)]
    sleep = default_step_sleep(targets) if step_sleep is None else step_sleep
    name = validate_job(job, variable="--job") if job else f"demo-{uuid.uuid4().hex[:8]}"
    return _Demo(name, workers, spec, targets, steps, sleep, script, redis_kind).run()


class _Demo:
    def __init__(
        self,
        job: str,
        workers: int,
        schedule: str,
        targets: list[int],
        steps: int,
        step_sleep: float,
        script: Path,
        redis_kind: str,
    ) -> None:
        self.job, self.workers, self.schedule, self.targets = job, workers, schedule, targets
        self.steps, self.step_sleep, self.script = steps, step_sleep, script
        self.console = Console(highlight=False)
        self.workdir = Path(tempfile.mkdtemp(prefix="stepbarrier-demo-"))
        self.env = self._base_env()
        self.redis = EmbeddedRedis(self.workdir, self.env, kind=redis_kind)
        self.group = ProcessGroup(self.workdir)
        self.first_wait: dict[int, float] = {}  # task id -> when it was first seen waiting
        self.status: JobStatus | None = None
        self.config: BarrierConfig | None = None
        self.keep_workdir = False  # logs stay only when something failed

    def _base_env(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith("STEPBARRIER_") and k != "TF_CONFIG"
        }
        env.update(
            STEPBARRIER_JOB=self.job,
            STEPBARRIER_SCHEDULE=self.schedule,
            STEPBARRIER_TIMEOUT="900",
            TRAIN_STEPS=str(self.steps),
            STEP_SLEEP=str(self.step_sleep),
            TF_CPP_MIN_LOG_LEVEL="2",
            PYTHONUNBUFFERED="1",
        )
        return env

    def run(self) -> int:
        atexit.register(self._cleanup)
        previous = {
            sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGHUP)
        }
        try:
            return self._run()
        except (KeyboardInterrupt, _Stopped):
            self.console.print("[yellow]interrupted: stopping every process of the demo[/]")
            return 0
        finally:
            signal.signal(
                signal.SIGINT, signal.SIG_IGN
            )  # a second Ctrl-C must not cut cleanup short
            try:
                self._cleanup()
            finally:
                signal.signal(signal.SIGINT, signal.default_int_handler)
                for sig, handler in previous.items():
                    signal.signal(sig, handler)
                atexit.unregister(self._cleanup)

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        raise _Stopped(signal.Signals(signum).name)

    def _cleanup(self) -> None:
        self.group.stop_all()
        self.redis.stop()
        if not self.keep_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def _run(self) -> int:
        self.redis.start()
        self.config = BarrierConfig(job=self.job, redis_url=self.redis.url)
        self.env["STEPBARRIER_REDIS_URL"] = self.redis.url
        cluster = {
            "ps": [f"{LOOPBACK}:{free_port()}"],
            "chief": [f"{LOOPBACK}:{free_port()}"],
            "worker": [f"{LOOPBACK}:{free_port()}" for _ in range(self.workers)],
        }
        self.console.print(
            f"job [bold]{self.job}[/]: Redis {self.redis.description} at {self.redis.url}; "
            f"1 ps, the chief and {self.workers} workers, {self.steps} steps, schedule "
            f"{self.schedule} (workers wait for steps {', '.join(map(str, self.targets))}), "
            f"+{self.step_sleep:g} s per training step"
        )
        self._start_task("ps", 0, cluster)
        # The chief trains once every worker that has a step to wait for waits.
        waiting = sum(1 for t in self.targets if t > 0)
        self._start_task("chief", 0, cluster, WAIT_FOR_WAITERS=str(waiting))
        with Live(self._view("starting the ps and the chief"), console=self.console) as live:
            if not self._wait_for_chief(live):
                return self._failed()
            for index in range(self.workers):
                self._start_task("worker", index, cluster)
            deadline = time.monotonic() + 300 + self.steps * self.step_sleep * 2
            while self._running(exclude="ps-0"):
                if time.monotonic() > deadline:
                    live.update(self._view("the demo took too long"))
                    return self._failed()
                self._poll(live, "training")
            self._poll(live, "finished")
        self.group.stop("ps-0")
        if any(self.group.returncode(n) for n in self.group.processes if n != "ps-0"):
            return self._failed()
        self.console.print(self._summary())
        return 0

    def _start_task(
        self, kind: str, index: int, cluster: dict[str, list[str]], **extra: str
    ) -> None:
        name = f"{kind}-{index}"
        env = dict(self.env, **extra)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        env["RECORD_FILE"] = str(self.workdir / f"{name}.json")
        self.group.start(name, [sys.executable, str(self.script)], env)

    def _wait_for_chief(self, live: Live) -> bool:
        deadline = time.monotonic() + CHIEF_READY_TIMEOUT
        while time.monotonic() < deadline:
            if not self._running(only=("ps-0", "chief-0"), all_of=True):
                return False
            self._poll(live, "waiting for the chief's session (TensorFlow starts slowly)")
            if CHIEF_READY in self.group.log_tail("chief-0", lines=1000):
                return True
        return False

    def _running(
        self, *, exclude: str | None = None, only: tuple[str, ...] = (), all_of: bool = False
    ) -> bool:
        names = [n for n in self.group.processes if n != exclude and (not only or n in only)]
        alive = [self.group.returncode(n) is None for n in names]
        return all(alive) if all_of else any(alive)

    def _poll(self, live: Live, phase: str) -> None:
        time.sleep(0.25)
        assert self.config is not None
        try:
            self.status = read_status(self.config)
        except StepBarrierError as exc:
            phase = f"{phase}; status unavailable: {exc}"
        else:
            for waiter in self.status.waiters:
                if waiter.task_id is not None and waiter.since is not None:
                    self.first_wait.setdefault(waiter.task_id, waiter.since)
        live.update(self._view(phase))

    def _view(self, phase: str) -> RenderableType:
        tasks = Text()
        for name in self.group.processes:
            code = self.group.returncode(name)
            state = "running" if code is None else f"exited {code}"
            tasks.append(f"{name}: {state}  ", style="green" if code in (None, 0) else "red")
        parts: list[RenderableType] = [Text(phase, style="bold"), tasks]
        if self.status is not None:
            parts.append(status_view(self.status, progress=True))
        return Group(*parts)

    def _failed(self) -> int:
        for name in self.group.processes:
            code = self.group.returncode(name)
            if code not in (None, 0) or name == "chief-0":
                self.console.print(f"[red]{name} exited with {code}; its last lines:[/]")
                self.console.print(self.group.log_tail(name), markup=False)
        self.console.print(f"[red]the demo failed[/]; logs kept in {self.workdir}")
        self.keep_workdir = True
        return 1

    def _record(self, name: str) -> dict[str, Any]:
        try:
            data = json.loads((self.workdir / f"{name}.json").read_text())
        except (OSError, ValueError):
            return {}
        return data if isinstance(data, dict) else {}

    def _summary(self) -> RenderableType:
        return release_summary(
            f"job {self.job}: {self.schedule}, {self.steps} steps",
            chief=self._record("chief-0"),
            workers=[self._record(f"worker-{index}") for index in range(self.workers)],
            targets=self.targets,
            first_wait=self.first_wait,
        )
