"""Run the examples as real OS processes and read the records they write."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.conftest import ROOT

EXAMPLES = Path(ROOT) / "examples"
FINISH_TIMEOUT = 240.0
"""Seconds a group of example processes may take (a hang fails instead of blocking)."""


class ExampleProcesses:
    """A group of example processes, each with its own log and record file.

    Use it as a context manager: whatever is still running at the end is killed.
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}

    def start(self, name: str, example: str, env: dict[str, str]) -> None:
        env = {**env, "RECORD_FILE": str(self.record_path(name))}
        log = (self.workdir / f"{name}.log").open("wb")
        self.processes[name] = subprocess.Popen(
            [sys.executable, str(EXAMPLES / example)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
        )
        log.close()

    def record_path(self, name: str) -> Path:
        return self.workdir / f"{name}.json"

    def log(self, name: str) -> str:
        text = (self.workdir / f"{name}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-40:])

    def finish(self, *names: str) -> dict[str, dict[str, Any]]:
        """Wait for the named processes; return their records (fail with their logs)."""
        for name in names:
            code = self.exit_code(name)
            assert code == 0, f"{name} exited with {code}:\n{self.log(name)}"
        return {name: self.record(name) for name in names}

    def exit_code(self, name: str) -> int:
        """Wait for the named process and return its exit status (fail if it hangs)."""
        try:
            return self.processes[name].wait(FINISH_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.close()
            raise AssertionError(f"{name} did not finish:\n{self.all_logs()}") from None

    def record(self, name: str) -> dict[str, Any]:
        result: dict[str, Any] = json.loads(self.record_path(name).read_text())
        return result

    def all_logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)}" for name in self.processes)

    def close(self) -> None:
        for process in self.processes.values():
            if process.poll() is None:
                process.kill()
                process.wait(30)

    def __enter__(self) -> ExampleProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
