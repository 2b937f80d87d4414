"""The demo's run: a real local parameter-server job held back by the barrier.

It starts an embedded Redis, then ``examples/tf1_parameter_server.py`` as
separate processes: one ps, the chief and N workers (task ids 1..N, the
numbering everywhere: process names, the live view, the summary) whose
``wait_until_step`` comes from a ``log:K`` schedule. Workers start once the
chief's session is up (a non-chief session that starts earlier re-checks only
every 30 s). Every process of one demo run shares its own run id
(``STEPBARRIER_RUN_ID=demo-<12 hex digits>``). It shows the live view
(progress lines when piped), then a summary of each worker's release; Ctrl-C
shows the summary so far.

This module never imports TensorFlow: the training runs in the child processes.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
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
from collections.abc import Iterable
from pathlib import Path
from types import FrameType
from typing import Any

from rich.console import Console, RenderableType
from rich.live import Live

from examples.demo.local import LOOPBACK, EmbeddedRedis, ProcessGroup, free_port, redis_missing
from examples.demo.views import (
    DemoFrame,
    WorkerRow,
    demo_view,
    progress_line,
    release_summary,
    step_times_of,
    wake_latency,
)
from stepbarrier import (
    BarrierConfig,
    ConfigurationError,
    JobStatus,
    StepBarrierError,
    read_status,
    schedule_wait_until_step,
)
from stepbarrier._config.checks import KEY_NAME
from stepbarrier._config.schedule import validate_schedule
from stepbarrier.cli._views.output import plain_text

PROGRAM = Path(__file__).resolve().parents[1] / "tf1_parameter_server.py"
"""The training program each of the demo's processes runs."""
PIPED_EVERY = 5.0
"""Seconds between progress lines when the output is not a terminal."""
OTHER_WAITERS = 20
"""Most registered waiters the live view lists that are none of the demo's workers."""
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
    """Run the demo; returns the exit code (0 when every task finished well).

    ``example`` runs another training script (a path) instead of ``PROGRAM``.
    """
    if example is not None and not Path(example).is_file():
        raise ConfigurationError(f"--example {example} is not a file")
    missing = redis_missing(redis_kind)
    if missing is not None:
        raise ConfigurationError(missing)
    if example is None and importlib.util.find_spec("tensorflow") is None:
        raise ConfigurationError(
            "the demo needs TensorFlow: install the demo extra, pip install -e '.[demo]' "
            "from the checkout's top folder (or run `make demo` there)"
        )
    spec = validate_schedule(schedule or default_schedule(workers, steps), variable="--schedule")
    targets = [schedule_wait_until_step(task, spec) for task in range(1, workers + 1)]
    sleep = default_step_sleep(targets) if step_sleep is None else step_sleep
    name = KEY_NAME.check(job, "--job") if job else f"demo-{uuid.uuid4().hex[:8]}"
    command = [sys.executable, example or str(PROGRAM)]
    return _Demo(name, workers, spec, targets, steps, sleep, command, redis_kind).run()


class _Demo:
    def __init__(
        self,
        job: str,
        workers: int,
        schedule: str,
        targets: list[int],
        steps: int,
        step_sleep: float,
        command: list[str],
        redis_kind: str,
    ) -> None:
        self.job, self.workers, self.schedule, self.targets = job, workers, schedule, targets
        self.steps, self.step_sleep, self.command = steps, step_sleep, command
        self.console = Console(highlight=False)
        self.live: Live | None = None
        self.printed_at = 0.0  # piped: when the last progress line was printed
        self.ps_stopped = False
        self.workdir = Path(tempfile.mkdtemp(prefix="stepbarrier-demo-"))
        # one run id per demo run, shared by its chief and workers: each trusts
        # only its own run's chief, and a launcher's id of the shell that runs
        # the demo (a Slurm job's, torchrun's) is never theirs
        self.run_id = f"demo-{uuid.uuid4().hex[:12]}"
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
            STEPBARRIER_RUN_ID=self.run_id,
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
            if self.live is not None:
                with contextlib.suppress(Exception):
                    self.live.stop()
            self.console.print("[yellow]interrupted: stopping every process of the demo[/]")
            with contextlib.suppress(Exception):  # the summary so far, from the records
                self.console.print(self._summary(partial=True))
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
        self.config = BarrierConfig(job=self.job, redis_url=self.redis.url, run_id=self.run_id)
        self.env["STEPBARRIER_REDIS_URL"] = self.redis.url
        cluster = {
            "ps": [f"{LOOPBACK}:{free_port()}"],
            "chief": [f"{LOOPBACK}:{free_port()}"],
            "worker": [f"{LOOPBACK}:{free_port()}" for _ in range(self.workers)],
        }
        self.console.print(
            f"job [bold]{self.job}[/] (run {self.run_id}): Redis {self.redis.description} at "
            f"{self.redis.url}; "
            f"1 ps, the chief and {self.workers} workers, {self.steps} steps, schedule "
            f"{self.schedule} (workers wait for steps {', '.join(map(str, self.targets))}), "
            f"+{self.step_sleep:g} s per training step"
        )
        self._start_task("ps", 0, cluster)
        # The chief trains once every worker that has a step to wait for waits.
        waiting = sum(1 for t in self.targets if t > 0)
        self._start_task("chief", 0, cluster, WAIT_FOR_WAITERS=str(waiting))
        with self._live():
            self._show("starting the ps and the chief")
            if not self._wait_for_chief():
                return self._failed()
            for index in range(self.workers):
                self._start_task("worker", index, cluster)
            deadline = time.monotonic() + 300 + self.steps * self.step_sleep * 2
            while any(self._alive(n for n in self.group.processes if n != "ps-0")):
                if time.monotonic() > deadline:
                    self._show("the demo took too long", force=True)
                    return self._failed()
                self._poll("training")
            self.group.stop("ps-0")  # the job is over: the ps is not left "running"
            self.ps_stopped = True
            self._poll("finished", force=True)
            if self.live is None:  # piped: the whole last frame, as a terminal keeps it
                self.console.file.write(
                    plain_text(demo_view(self._frame("finished")), self.console.width) + "\n"
                )
        if any(self.group.returncode(n) for n in self.group.processes if n != "ps-0"):
            return self._failed()
        self.console.print(self._summary())
        return 0

    def _start_task(
        self, kind: str, index: int, cluster: dict[str, list[str]], **extra: str
    ) -> None:
        # workers are named by task id (worker i of TF_CONFIG is task i + 1), as
        # everywhere else the demo shows them
        name = f"worker-{index + 1}" if kind == "worker" else f"{kind}-{index}"
        env = dict(self.env, **extra)
        env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        env["RECORD_FILE"] = str(self.workdir / f"{name}.json")
        self.group.start(name, list(self.command), env)

    @contextlib.contextmanager
    def _live(self) -> Any:
        if not self.console.is_terminal:
            yield
            return
        with Live(console=self.console, auto_refresh=False) as live:
            self.live = live
            try:
                yield
            finally:
                self.live = None

    def _show(self, phase: str, *, force: bool = False) -> None:
        frame = self._frame(phase)
        if self.live is not None:
            self.live.update(demo_view(frame), refresh=True)
        elif force or time.monotonic() - self.printed_at >= PIPED_EVERY:
            self.console.file.write(progress_line(frame) + "\n")
            self.console.file.flush()
            self.printed_at = time.monotonic()

    def _wait_for_chief(self) -> bool:
        deadline = time.monotonic() + CHIEF_READY_TIMEOUT
        while time.monotonic() < deadline:
            if not all(self._alive(("ps-0", "chief-0"))):
                return False
            self._poll("waiting for the chief's session (TensorFlow starts slowly)")
            if CHIEF_READY in self.group.log_tail("chief-0", lines=1000):
                return True
        return False

    def _alive(self, names: Iterable[str]) -> list[bool]:
        return [self.group.returncode(name) is None for name in names]

    def _poll(self, phase: str, *, force: bool = False) -> None:
        time.sleep(0.25)
        assert self.config is not None
        try:
            self.status = read_status(self.config, barriers=False)
        except StepBarrierError as exc:
            phase = f"{phase}; status unavailable: {exc}"
        else:
            for waiter in self.status.waiters:
                if waiter.task_id is not None and waiter.since is not None:
                    self.first_wait.setdefault(waiter.task_id, waiter.since)
        self._show(phase, force=force)

    def _process_state(self, name: str) -> str:
        if name not in self.group.processes:
            return "not started"
        code = self.group.returncode(name)
        if name == "ps-0" and self.ps_stopped:
            return "stopped"
        return "running" if code is None else "finished" if code == 0 else f"exited {code}"

    def _frame(self, phase: str) -> DemoFrame:
        status = self.status
        waiting = {w.task_id for w in status.waiters} if status is not None else set()
        step_times = step_times_of(self._record("chief-0"))
        rows = []
        for task_id, target in enumerate(self.targets, start=1):
            record = self._record(f"worker-{task_id}")
            released = record.get("released_at_step")
            released = released if isinstance(released, int) else None
            state = self._process_state(f"worker-{task_id}")
            if state == "running":
                trains = released is not None or (target <= 0 and record)
                state = "training" if trains else "waiting" if task_id in waiting else "starting"
            latency, note = ("-", "")
            if released is not None:
                latency, note = wake_latency(record, target, step_times, task_id, self.first_wait)
            rows.append(WorkerRow(task_id, target, state, released, latency, note))
        others = None
        if status is not None:
            theirs = [w for w in status.waiters if w.task_id not in range(1, self.workers + 1)]
            others = dataclasses.replace(status, waiters=tuple(theirs[:OTHER_WAITERS]))
        return DemoFrame(
            phase=phase,
            job=self.job,
            steps=self.steps,
            step=None if status is None else status.step,
            heartbeat_age=None if status is None else status.heartbeat_age,
            ps=self._process_state("ps-0"),
            chief=self._process_state("chief-0"),
            workers=tuple(rows),
            chief_name=None if status is None else status.chief,
            others=others,
        )

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

    def _summary(self, *, partial: bool = False) -> RenderableType:
        title = f"job {self.job}: {self.schedule}, {self.steps} steps"
        return release_summary(
            f"{title} (interrupted: the summary so far)" if partial else title,
            chief=self._record("chief-0"),
            workers=[self._record(f"worker-{task}") for task in range(1, self.workers + 1)],
            targets=self.targets,
            first_wait=self.first_wait,
        )
