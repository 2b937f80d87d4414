"""The demo's local machinery: an embedded Redis and a group of child processes.

Everything listens on loopback only and everything started here is stopped
here: each child runs in its own process group (so a terminal's Ctrl-C reaches
only the demo, which then stops the children in order) and ``stop`` ends the
whole group, its own children included.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import FrameType
from typing import IO, Any

import redis

LOOPBACK = "127.0.0.1"
STOP_GRACE = 5.0
"""Seconds a child gets to exit after SIGTERM before it is killed."""


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
"""The signals that stop the demo (Ctrl-C, a kill, a closed terminal)."""


@contextlib.contextmanager
def stop_signals_deferred() -> Iterator[None]:
    """Hold Ctrl-C, SIGTERM and SIGHUP until the block ends, then act on them.

    A child is started in a block like this: a stop that came between its
    fork and the moment it is recorded would leave it running with nobody to
    end it (the demo only stops the children it knows). Outside the main
    thread (where signals cannot be handled) it changes nothing; a signal that
    is ignored, or whose handler Python did not install, is left as it is (a
    child started here inherits an ignored signal as ignored).
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    held: list[int] = []

    def hold(signum: int, frame: FrameType | None) -> None:
        held.append(signum)

    previous = {
        sig: signal.signal(sig, hold)
        for sig in STOP_SIGNALS
        if signal.getsignal(sig) not in (None, signal.SIG_IGN)
    }
    try:
        yield
    finally:
        # blocked while the handlers go back: a signal that comes meanwhile
        # waits for its own handler instead of landing between two of them
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            for signum in dict.fromkeys(held):  # each once, in the order they came
                signal.raise_signal(signum)  # pending until the mask goes back
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)


def free_port() -> int:
    """A TCP port on loopback that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((LOOPBACK, 0))
        return int(sock.getsockname()[1])


NO_REDIS_TO_EMBED = (
    "the demo needs a Redis to embed, and neither redis-server nor fakeredis is "
    "installed: install redis-server (Debian/Ubuntu: sudo apt-get install redis-server; "
    "macOS: brew install redis), or the demo extra, which brings fakeredis "
    "(pip install -e '.[demo]' from the checkout's top folder)"
)


def redis_missing(kind: str = "auto") -> str | None:
    """Why an ``EmbeddedRedis`` of ``kind`` cannot start here, or ``None`` if it can."""
    binary = shutil.which("redis-server") is not None
    # fakeredis runs the barrier's Lua only with lupa (the fakeredis[lua] extra)
    fake = all(importlib.util.find_spec(name) is not None for name in ("fakeredis", "lupa"))
    if kind == "redis-server" and not binary:
        return "redis-server is not installed (Debian/Ubuntu: sudo apt-get install redis-server)"
    if kind == "fakeredis" and not fake:
        return "fakeredis with Lua is not installed: pip install 'fakeredis[lua]'"
    if kind == "auto" and not (binary or fake):
        return NO_REDIS_TO_EMBED
    return None


class EmbeddedRedis:
    """A throwaway Redis on a free loopback port.

    A real ``redis-server`` (no persistence) when the binary is installed,
    otherwise fakeredis's TCP server in a thread (it needs ``lupa`` for Lua).

    Args:
        workdir: Directory for redis-server's files.
        env: Environment of the redis-server process.
        kind: ``"auto"``, ``"redis-server"`` or ``"fakeredis"``.
    """

    def __init__(self, workdir: Path, env: Mapping[str, str], kind: str = "auto") -> None:
        self.workdir = workdir
        self.env = dict(env)
        self.kind = kind
        self.port = 0
        self.description = ""
        self._process: subprocess.Popen[bytes] | None = None
        self._fake: Any = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"redis://{LOOPBACK}:{self.port}/0"

    @property
    def pid(self) -> int | None:
        """The redis-server's pid (``None`` for fakeredis or once stopped)."""
        return None if self._process is None else self._process.pid

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        binary = shutil.which("redis-server")
        self.port = free_port()
        if self.kind == "redis-server" or (self.kind == "auto" and binary):
            if binary is None:
                raise RuntimeError("redis-server is not installed")
            with stop_signals_deferred():
                self._process = subprocess.Popen(
                    [binary, "--port", str(self.port), "--bind", LOOPBACK, "--save", "",
                     "--appendonly", "no", "--dir", str(self.workdir),
                     "--logfile", str(self.workdir / "redis.log")],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                    env=self.env, start_new_session=True,
                )  # fmt: skip
            self.description = f"redis-server (pid {self._process.pid})"
        else:
            import fakeredis  # only needed when there is no redis-server

            self._fake = fakeredis.TcpFakeServer((LOOPBACK, self.port), server_type="redis")
            self._thread = threading.Thread(
                target=self._fake.serve_forever, name="stepbarrier-fakeredis", daemon=True
            )
            self._thread.start()
            self.description = "fakeredis (in-process; redis-server is not installed)"
        self._wait_ready(timeout)
        return self

    def _wait_ready(self, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        client = redis.Redis(host=LOOPBACK, port=self.port, socket_timeout=1.0)
        try:
            while True:
                if self._process is not None and self._process.poll() is not None:
                    raise RuntimeError(f"redis-server exited at start (see {self.workdir})")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(
                            f"Redis did not answer on port {self.port} within {timeout:g} s"
                        ) from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        if self._process is not None:
            stop_process_group(self._process)
            self._process = None
        if self._fake is not None:
            self._fake.shutdown()
            self._fake.server_close()
            self._fake = None


def stop_process_group(process: subprocess.Popen[Any], grace: float = STOP_GRACE) -> None:
    """SIGTERM the process's group, then SIGKILL what is left after ``grace``; returns
    once no process of the group is left (or after ``grace`` more)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        _signal_group(process, sig)
        try:
            process.wait(grace)
        except subprocess.TimeoutExpired:
            continue
        _signal_group(process, signal.SIGKILL)  # the leader is gone; so must its children
        break
    # a killed process takes a moment to go (a TensorFlow one frees gigabytes):
    # "stopped" means gone, not only signalled
    deadline = time.monotonic() + grace
    while _group_alive(process) and time.monotonic() < deadline:
        time.sleep(0.05)


def _group_alive(process: subprocess.Popen[Any]) -> bool:
    try:
        os.killpg(process.pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _signal_group(process: subprocess.Popen[Any], sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, sig)


class ProcessGroup:
    """Child processes, each in its own process group, logging to files."""

    def __init__(self, logdir: Path) -> None:
        self.logdir = logdir
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: list[IO[bytes]] = []

    def start(self, name: str, command: list[str], env: Mapping[str, str]) -> None:
        log = open(self.log_path(name), "wb")  # noqa: SIM115 (closed in stop_all)
        self._logs.append(log)
        with stop_signals_deferred():  # recorded before a stop may end the demo
            self.processes[name] = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )

    def log_path(self, name: str) -> Path:
        return self.logdir / f"{name}.log"

    def log_tail(self, name: str, lines: int = 15) -> str:
        try:
            text = self.log_path(name).read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def returncode(self, name: str) -> int | None:
        return self.processes[name].poll()

    def stop(self, name: str) -> None:
        stop_process_group(self.processes[name])

    def stop_all(self) -> None:
        """Stop every child (the latest started first) and close the logs."""
        for process in reversed(list(self.processes.values())):
            stop_process_group(process)  # also ends what an exited child left behind
        for log in self._logs:
            log.close()
        self._logs.clear()
