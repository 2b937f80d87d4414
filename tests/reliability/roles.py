"""The chief and worker programs of the reliability scenarios, run as OS processes.

    python -m tests.reliability.roles chief RECORDS [--overrides JSON] [--start-step N]
    python -m tests.reliability.roles worker RECORDS TARGET [--overrides JSON] [--timeout S]

Both read their settings with ``BarrierConfig.from_env()`` (``STEPBARRIER_*``), then
apply ``--overrides`` (fields with no variable, such as ``fallback_interval``).
Each appends JSON records, one a line, to the file RECORDS; every record has an
``event`` and a wall-clock time ``t`` (all processes share the host's clock).

The chief trains on command: it reads one JSON object a line from stdin.

- ``{"train_to": N, "step_seconds": S}``: one ``publish`` per step up to N, a
  ``step`` record before each, then a ``trained`` record;
- ``{"close": true, "done": true}``: ``close(done=...)``, a ``closed`` record, exit;
- end of input: ``close(done=False)`` and exit, as a chief that crashed cleanly.

Every ``trained`` and ``closed`` record counts the Redis I/O (connect, send,
read) the training thread did inside ``publish`` calls, says how long the
slowest call took (for information only: a busy machine can stall any call),
and lists any exception it raised: the training thread must never wait on
Redis nor see its errors.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import os
import select
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

import redis.connection

from stepbarrier import BarrierConfig, StepBarrierError, StepPublisher, StepWaiter

REDIS_IO = ("connect", "send_packed_command", "read_response")
"""What every redis-py connection (plain, TLS, Sentinel-managed) does on the wire."""


class Records:
    """Appends JSON records to a file, one a line, flushed at once."""

    def __init__(self, path: str) -> None:
        self._file: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115

    def write(self, event: str, **fields: Any) -> None:
        record = {"event": event, "t": time.time(), "pid": os.getpid(), **fields}
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()


class WarningLog(logging.Handler):
    """Keeps the library's warnings, so a record can show them."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


class RedisIoWatch:
    """Counts the Redis I/O that a thread does while it is marked (``with watch:``).

    Patches redis-py's connections for the whole process: the publisher's own
    threads go on unmarked, so only I/O of the marked training thread counts.
    """

    def __init__(self) -> None:
        self._marked = threading.local()
        self.calls: list[str] = []
        for name in REDIS_IO:
            setattr(redis.connection.AbstractConnection, name, self._watched(name))

    def _watched(self, name: str) -> Callable[..., Any]:
        original = getattr(redis.connection.AbstractConnection, name)

        def call(connection: Any, *args: Any, **kwargs: Any) -> Any:
            if getattr(self._marked, "on", False):
                self.calls.append(name)
            return original(connection, *args, **kwargs)

        return call

    def __enter__(self) -> None:
        self._marked.on = True

    def __exit__(self, *exc: object) -> None:
        self._marked.on = False


def load_config(overrides: str | None) -> BarrierConfig:
    config = BarrierConfig.from_env()
    extra = json.loads(overrides) if overrides else {}
    return dataclasses.replace(config, **extra)


class TrainingChief:
    """A training loop that hands every step to a ``StepPublisher`` and times it."""

    def __init__(self, config: BarrierConfig, records: Records, start_step: int) -> None:
        self.records = records
        self.step = start_step
        self.calls = 0
        self.slowest = 0.0
        self.errors: list[str] = []
        self.io = RedisIoWatch()
        self.publisher = StepPublisher(config)
        if start_step > 0:  # restored from a checkpoint: say so at once
            self._publish(start_step)

    def _publish(self, step: int) -> None:
        started = time.perf_counter()
        try:
            with self.io:
                self.publisher.publish(step)
        except Exception as exc:  # recorded: the test asserts there is none
            self.errors.append(f"{type(exc).__name__}: {exc}")
        self.slowest = max(self.slowest, time.perf_counter() - started)
        self.calls += 1

    def stats(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "publish_calls": self.calls,
            "max_publish_seconds": self.slowest,
            "publish_redis_io": self.io.calls[:20],
            "publish_errors": self.errors[:20],
            "writes": self.publisher.writes,
            "chief": f"{os.uname().nodename}:{os.getpid()}",
        }

    def train_to(self, target: int, step_seconds: float) -> None:
        while self.step < target:
            self.step += 1
            self.records.write("step", step=self.step)
            self._publish(self.step)
            time.sleep(step_seconds)
        self.records.write("trained", **self.stats())

    def keep_alive(self) -> None:
        """The loop hands its current step over again (no new step: no record)."""
        self.publisher.publish(self.step)

    def close(self, done: bool) -> None:
        ok = self.publisher.close(done=done)
        self.records.write("closed", ok=ok, done=done, **self.stats())


KEEP_ALIVE = 0.2
"""Seconds between two hand-overs of the current step while the chief waits for
its next command: its training loop is alive, as a real one between steps of a
fixed step is (a worker's stall timeout judges the loop, not only the process)."""


def commands(chief: TrainingChief) -> Iterator[str]:
    """The lines on stdin; while none comes, the loop hands its step over again."""
    buffered = b""
    while True:
        while b"\n" not in buffered:
            ready, _, _ = select.select([sys.stdin.fileno()], [], [], KEEP_ALIVE)
            if not ready:
                if chief.step > 0:
                    chief.keep_alive()
                continue
            chunk = os.read(sys.stdin.fileno(), 65536)
            if not chunk:
                return
            buffered += chunk
        line, buffered = buffered.split(b"\n", 1)
        yield line.decode()


def run_chief(args: argparse.Namespace) -> int:
    records = Records(args.records)
    chief = TrainingChief(load_config(args.overrides), records, args.start_step)
    records.write("ready", **chief.stats())
    for line in commands(chief):
        command = json.loads(line)
        if "train_to" in command:
            chief.train_to(int(command["train_to"]), float(command.get("step_seconds", 0.01)))
        elif command.get("close"):
            chief.close(bool(command.get("done", True)))
            return 0
    chief.close(done=False)
    return 0


def run_worker(args: argparse.Namespace) -> int:
    records = Records(args.records)
    warnings = WarningLog()
    logging.getLogger("stepbarrier").addHandler(warnings)
    config = load_config(args.overrides)
    records.write("waiting", target=args.target, task_id=config.task_id)
    started = time.monotonic()
    try:
        with StepWaiter(config) as waiter:
            step = waiter.wait(args.target, timeout=args.timeout)
    except StepBarrierError as exc:
        records.write(
            "error",
            type=type(exc).__name__,
            message=str(exc),
            stalled=getattr(exc, "stalled", None),
            reason=getattr(exc, "reason", None),
            last_step=getattr(exc, "last_step", None),
            heartbeat_age=getattr(exc, "heartbeat_age", None),
            waited=time.monotonic() - started,
            warnings=warnings.messages,
        )
        return 1
    records.write(
        "released",
        step=step,
        target=args.target,
        waited=time.monotonic() - started,
        warnings=warnings.messages,
    )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.reliability.roles")
    roles = parser.add_subparsers(dest="role", required=True)
    chief = roles.add_parser("chief")
    chief.add_argument("records")
    chief.add_argument("--overrides")
    chief.add_argument("--start-step", type=int, default=0)
    worker = roles.add_parser("worker")
    worker.add_argument("records")
    worker.add_argument("target", type=int)
    worker.add_argument("--overrides")
    worker.add_argument("--timeout", type=float)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format="%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s",
    )
    return run_chief(args) if args.role == "chief" else run_worker(args)


if __name__ == "__main__":
    sys.exit(main())
