"""What ``stepbarrier wait`` shows on stderr while it waits (docs/cli.md#wait-progress).

A thread of its own reads the job's state with its own client (the read every
role may run: ``read_status`` without waiters or barriers); it never touches
the wait itself, and a failed read is shown, not raised.
"""

from __future__ import annotations

import contextlib
import threading
import time

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.missing import is_missing
from stepbarrier._inspect.status import JobStatus, is_stale, read_status
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier.cli._guidance import missing_job_message, one_line
from stepbarrier.cli._views.output import interactive
from stepbarrier.cli._views.status import describe_age
from stepbarrier.errors import StepBarrierError

TERMINAL_EVERY, PIPED_EVERY = 1.0, 10.0
"""Seconds between reads on a terminal, and between lines when stderr is not one."""
READ_SOCKET_TIMEOUT = 5.0


def describe_duration(seconds: float) -> str:
    """``"42 s"``, ``"3 min 5 s"``, ``"1 h 4 min"``."""
    whole = max(0, int(seconds))
    if whole < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{max(0.0, seconds):.1f} s"
    if whole < 3600:
        return f"{whole // 60} min {whole % 60} s"
    return f"{whole // 3600} h {whole % 3600 // 60} min"


class WaitProgress:
    """Shows the wait for ``target`` on stderr (or ``console``) from a thread, between
    ``start`` and ``stop``; ``config.timeout`` bounds the time left."""

    def __init__(self, config: BarrierConfig, target: int, console: Console | None = None) -> None:
        self.config, self.target = config, target
        self.console = console or Console(stderr=True, highlight=False)
        self.started = time.monotonic()
        self.status: JobStatus | None = None
        self.note: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="stepbarrier-progress", daemon=True)
        self._client: RedisClient | None = None

    def start(self) -> WaitProgress:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=READ_SOCKET_TIMEOUT + 1)

    def _run(self) -> None:
        live = None
        if interactive(self.console):
            live = Live(self.view(), console=self.console, transient=True, auto_refresh=False)
        try:
            with live or contextlib.nullcontext():
                while not self._stop.is_set():
                    self._read()
                    if live is not None:
                        live.update(self.view(), refresh=True)
                    elif not self._stop.is_set():
                        self.console.file.write(self.line() + "\n")
                        self.console.file.flush()
                    self._stop.wait(PIPED_EVERY if live is None else TERMINAL_EVERY)
        finally:
            if self._client is not None:
                self._client.close()

    def _read(self) -> None:
        first = self.status is None and self.note is None
        try:
            if self._client is None:
                self._client = make_client(self.config, socket_timeout=READ_SOCKET_TIMEOUT)
            self.status = read_status(self.config, self._client, waiters=False, barriers=False)
        except Exception as exc:  # the progress must never end the wait
            why = one_line(str(exc)) if isinstance(exc, StepBarrierError) else type(exc).__name__
            self.note = f"status unavailable: {why}"
            return
        if is_missing(self.status):
            if first or self.note is None or not self.note.startswith("no job"):
                self.note = missing_job_message(self.config, yet=True)
        else:
            self.note = None

    def _facts(self) -> tuple[int | None, float | None, bool, float, float | None]:
        """The chief's step, its heartbeat's age, whether it is stale, the time waited and
        the time left."""
        waited = time.monotonic() - self.started
        left = None if self.config.timeout is None else max(0.0, self.config.timeout - waited)
        if self.status is None:
            return None, None, False, waited, left
        return self.status.step, self.status.heartbeat_age, is_stale(self.status), waited, left

    def line(self) -> str:
        """One progress line (piped output)."""
        step, heartbeat, stale, waited, left = self._facts()
        parts = [
            f"waiting for job {self.config.job} to reach step {self.target}: chief at "
            + ("no step yet" if step is None else f"step {step}"),
            f"heartbeat {describe_age(heartbeat)}" + (" (stale)" if stale else ""),
            f"waited {describe_duration(waited)}",
            "no timeout" if left is None else f"{describe_duration(left)} left",
        ]
        line = ", ".join(parts)
        return line if self.note is None else f"{line}; {self.note}"

    def view(self) -> RenderableType:
        """The live block (terminal)."""
        step, heartbeat_age, stale, waited, left = self._facts()
        grid = Table.grid(padding=(0, 2))
        grid.add_column(style="bold")
        grid.add_column()
        grid.add_row("job", Text(self.config.job))
        grid.add_row("waiting for", f"step {self.target}")
        if step is None:
            grid.add_row("chief's step", "none yet")
        else:
            bar = ProgressBar(total=max(1, self.target), completed=min(step, self.target), width=30)
            grid.add_row("chief's step", Group(Text(f"{step} of {self.target}"), bar))
        heartbeat = Text(describe_age(heartbeat_age))
        if stale:
            heartbeat.append(" (stale: is the chief running?)", style="red")
        grid.add_row("heartbeat", heartbeat)
        grid.add_row("waited", describe_duration(waited))
        grid.add_row("time left", "no timeout" if left is None else describe_duration(left))
        parts: list[RenderableType] = [grid]
        if self.note:
            parts.append(Text(self.note, style="yellow"))
        parts.append(Text("Ctrl-C to stop waiting", style="dim"))
        return Group(*parts)
