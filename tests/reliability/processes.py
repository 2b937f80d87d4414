"""The test's handles on the chief and worker processes of one scenario.

A ``Fleet`` starts every process of a job (optionally inside a network
namespace, through a command prefix), reads the JSON records they write, and
kills whatever is still running when the test ends. Every wait here has a
deadline: a scenario that goes wrong fails, it never hangs.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from tests.conftest import ROOT, subprocess_env

T = TypeVar("T")

Record = dict[str, Any]


def wait_until(
    check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.02
) -> T:
    """Poll ``check`` until it returns something other than ``None`` or ``False``."""
    deadline = time.monotonic() + timeout
    while True:
        result = check()
        if result is not None and result is not False:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"not within {timeout:g} s: {what}")
        time.sleep(interval)


class Process:
    """One child process writing JSON records to its own file."""

    def __init__(
        self,
        name: str,
        command: Sequence[str],
        env: dict[str, str],
        workdir: Path,
        *,
        stdin: bool = False,
    ) -> None:
        self.name = name
        self.records_path = workdir / f"{name}.jsonl"
        self.log_path = workdir / f"{name}.log"
        self._log = open(self.log_path, "wb")  # noqa: SIM115
        self.popen = subprocess.Popen(
            list(command),
            env=env,
            cwd=ROOT,
            stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )

    @property
    def pid(self) -> int:
        return self.popen.pid

    def records(self, event: str | None = None) -> list[Record]:
        if not self.records_path.exists():
            return []
        lines = self.records_path.read_text(encoding="utf-8").splitlines()
        found = [json.loads(line) for line in lines if line.strip()]
        return [r for r in found if event is None or r["event"] == event]

    def log_tail(self, size: int = 3000) -> str:
        self._log.flush()
        return self.log_path.read_text(encoding="utf-8", errors="replace")[-size:]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive():
            self.popen.send_signal(signum)

    def kill(self) -> None:
        """SIGKILL, as a crash would; reaps the process."""
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
        self.popen.wait(10)

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGKILL)
            self.popen.wait(10)
        if self.popen.stdin is not None:
            self.popen.stdin.close()
        self._log.close()


class Chief(Process):
    """The chief: trains on command, records each step and how long publish took."""

    def send(self, **command: Any) -> None:
        assert self.popen.stdin is not None
        self.popen.stdin.write((json.dumps(command) + "\n").encode())
        self.popen.stdin.flush()

    def wait_ready(self, timeout: float = 30.0) -> Record:
        return wait_until(
            lambda: self._first("ready") or self._died(), timeout, f"{self.name} ready"
        )

    def train_to(self, step: int, step_seconds: float = 0.005, timeout: float = 60.0) -> Record:
        """Train up to ``step`` and return the ``trained`` record."""
        self.start_training(step, step_seconds)
        return self.wait_trained(step, timeout)

    def start_training(self, step: int, step_seconds: float = 0.005) -> None:
        self.send(train_to=step, step_seconds=step_seconds)

    def wait_trained(self, step: int, timeout: float = 60.0) -> Record:
        def trained() -> Record | None:
            self._died()
            done = [r for r in self.records("trained") if r["step"] >= step]
            return done[0] if done else None

        return wait_until(trained, timeout, f"{self.name} trained to step {step}")

    def close(self, done: bool = True, timeout: float = 30.0) -> Record:
        self.send(close=True, done=done)
        return wait_until(
            lambda: self._first("closed") or self._died(), timeout, f"{self.name} closed"
        )

    def reached(self, step: int) -> float:
        """Wall-clock time at which the chief handed over ``step`` (or the first above)."""
        times = [r["t"] for r in self.records("step") if r["step"] >= step]
        assert times, f"{self.name} never reached step {step}"
        return float(min(times))

    def current_step(self) -> int:
        steps = [r["step"] for r in self.records() if "step" in r]
        return max(steps, default=0)

    def _first(self, event: str) -> Record | None:
        found = self.records(event)
        return found[0] if found else None

    def _died(self) -> None:
        if not self.alive() and not self.records("closed"):
            raise AssertionError(
                f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}"
            )


class Worker(Process):
    """A worker: one ``StepWaiter.wait``, recorded as ``released`` or ``error``."""

    target: int

    def outcome(self) -> Record | None:
        found = self.records("released") + self.records("error")
        if found:
            return found[0]
        if not self.alive() and self.popen.returncode not in (0, 1):
            raise AssertionError(
                f"{self.name} crashed ({self.popen.returncode}):\n{self.log_tail()}"
            )
        return None

    def wait_outcome(self, timeout: float) -> Record:
        return wait_until(self.outcome, timeout, f"{self.name} (target {self.target}) to end")

    def released(self, timeout: float) -> Record:
        """The ``released`` record; fails if the wait ended any other way."""
        result = self.wait_outcome(timeout)
        assert result["event"] == "released", f"{self.name}: {result}\n{self.log_tail()}"
        return result

    def still_waiting(self) -> bool:
        return self.outcome() is None and self.alive()


class CliWait(Process):
    """``python -m stepbarrier wait`` as an operator or a shell script runs it."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        self.started = time.time()
        super().__init__(*args, **kwargs)

    def exit_code(self, timeout: float) -> int:
        code = wait_until(self.popen.poll, timeout, f"{self.name} to exit", interval=0.05)
        self.ended = time.time()
        return code

    def stderr_text(self) -> str:
        return self.log_tail(20_000)


class Fleet:
    """Starts a job's processes with a shared environment and cleans them up.

    Args:
        workdir: Where records and logs go.
        env: ``STEPBARRIER_*`` variables every process of the job gets.
    """

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir = workdir
        self.env = dict(env)
        self.processes: list[Process] = []

    def _env(self, extra: dict[str, str] | None) -> dict[str, str]:
        return subprocess_env(**{**self.env, **(extra or {})})

    def chief(
        self,
        name: str = "chief",
        *,
        start_step: int = 0,
        overrides: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> Chief:
        command = [
            *prefix,
            sys.executable,
            "-m",
            "tests.reliability.roles",
            "chief",
            str(self.workdir / f"{name}.jsonl"),
            "--start-step",
            str(start_step),
            "--overrides",
            json.dumps(overrides or {}),
        ]
        extra = {"STEPBARRIER_ROLE": "chief", **(env or {})}
        chief = Chief(name, command, self._env(extra), self.workdir, stdin=True)
        self.processes.append(chief)
        return chief

    def worker(
        self,
        name: str,
        target: int,
        *,
        task_id: int,
        timeout: float | None = None,
        overrides: dict[str, Any] | None = None,
        env: dict[str, str] | None = None,
        prefix: Sequence[str] = (),
    ) -> Worker:
        command = [
            *prefix,
            sys.executable,
            "-m",
            "tests.reliability.roles",
            "worker",
            str(self.workdir / f"{name}.jsonl"),
            str(target),
            "--overrides",
            json.dumps(overrides or {}),
        ]
        if timeout is not None:
            command += ["--timeout", str(timeout)]
        extra = {"STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": str(task_id), **(env or {})}
        worker = Worker(name, command, self._env(extra), self.workdir)
        worker.target = target
        self.processes.append(worker)
        return worker

    def cli_wait(
        self, name: str, target: int, *, task_id: int, env: dict[str, str] | None = None
    ) -> CliWait:
        command = [
            sys.executable,
            "-m",
            "stepbarrier",
            "wait",
            "--until",
            str(target),
            "--task-id",
            str(task_id),
        ]
        cli = CliWait(name, command, self._env(env), self.workdir)
        self.processes.append(cli)
        return cli

    def program(
        self, name: str, module: str, *args: str, env: dict[str, str] | None = None
    ) -> Process:
        """``python -m module RECORDS *args`` with the job's environment."""
        records = str(self.workdir / f"{name}.jsonl")
        command = [sys.executable, "-m", module, records, *args]
        process = Process(name, command, self._env(env), self.workdir)
        self.processes.append(process)
        return process

    def stop_all(self) -> None:
        for process in self.processes:
            process.stop()


def assert_chief_never_blocked(record: Record) -> None:
    """The training thread's ``publish`` calls did no Redis I/O and raised nothing.

    A call that waited on Redis would connect, send or read on the training
    thread (then take seconds: a connect or socket timeout, a paused server);
    its duration is not asserted, as a busy machine can stall any call.
    """
    assert record["publish_errors"] == [], record["publish_errors"]
    assert record["publish_redis_io"] == [], (
        f"publish() did Redis I/O on the training thread: {record['publish_redis_io']} "
        f"(the slowest call took {record['max_publish_seconds']:.3f} s)"
    )


def assert_not_early(worker: Record, chief: Chief) -> None:
    """Released at a step >= its target, and not before the chief handed that step over."""
    assert worker["step"] >= worker["target"], worker
    assert worker["t"] >= chief.reached(worker["target"]), (
        f"released at {worker['t']:.3f}, before the chief reached step {worker['target']} "
        f"at {chief.reached(worker['target']):.3f}"
    )
