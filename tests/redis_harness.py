"""Real ``redis-server`` processes for the tests, each on a free port.

Never a shared server and never a fixed port: every server is started here,
by the test session or by a single test, and stopped at its end.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import redis

_PICKER = random.SystemRandom()  # not the seeded `random`: two suites must not pick alike
_LOWEST_PORT = 10_000


def _ephemeral_low() -> int:
    """The lowest port the kernel hands out for bind(0) and outgoing connections."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768  # Linux's default


def free_port() -> int:
    """A TCP port that was free a moment ago, below the kernel's ephemeral range.

    Not the port of a ``bind(("", 0))``, which comes from the ephemeral range:
    between the moment it is freed and the moment a server (a TensorFlow task,
    a redis-server) binds it, any outgoing connection on the machine may take
    it as its source port ("Could not start gRPC server" in a suite run beside
    another). A random port below that range is taken by no outgoing
    connection, only by another server that picked it too. The harness's own
    (not the demo's): ``bench.before_after`` imports it in processes that run
    another checkout's ``stepbarrier``.
    """
    high = _ephemeral_low()
    for _ in range(200) if high - _LOWEST_PORT >= 1000 else ():
        port = _PICKER.randrange(_LOWEST_PORT, high)
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("0.0.0.0", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def redis_binary() -> str:
    """Path of ``redis-server``; fails with a clear message if it is missing."""
    path = shutil.which("redis-server")
    if path is None:
        raise RuntimeError(
            "redis-server is not installed: `make test` installs it (as root, "
            "through apt-get); elsewhere install it with your package manager"
        )
    return path


class RedisServer:
    """One ``redis-server`` process without persistence, on loopback.

    Args:
        port: The port; a free one is picked if omitted.
        args: Extra command-line arguments (e.g. ``["--aclfile", path]``).
        tls: ``(cert, key, ca)`` file paths: serve TLS only on ``port`` (no
            plain-text port at all).
    """

    def __init__(
        self,
        port: int | None = None,
        args: list[str] | None = None,
        tls: tuple[str, str, str] | None = None,
    ) -> None:
        self.port = port or free_port()
        self.args = list(args or [])
        self.tls = tls
        self.dir = Path(tempfile.mkdtemp(prefix="stepbarrier-redis-"))
        self.process: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "redis.log"

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def command(self) -> list[str]:
        listen = ["--port", str(self.port)]
        if self.tls is not None:
            cert, key, ca = self.tls
            listen = ["--port", "0", "--tls-port", str(self.port)]
            listen += ["--tls-cert-file", cert, "--tls-key-file", key, "--tls-ca-cert-file", ca]
        return [
            redis_binary(),
            *listen,
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.dir),
            "--logfile",
            str(self.log),
            *self.args,
        ]

    def start(self, wait: bool = True) -> RedisServer:
        self.process = subprocess.Popen(
            self.command(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
        if wait:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 10.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            assert self.process is not None
            if self.process.poll() is not None:
                err = self.process.stderr.read().decode() if self.process.stderr else ""
                log = self.log.read_text() if self.log.exists() else ""
                raise RuntimeError(f"redis-server exited at start: {err}{log[-2000:]}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    return
            except OSError:
                time.sleep(0.02)
        raise RuntimeError(f"redis-server did not listen on port {self.port} within {timeout} s")

    def client(self, **kwargs: object) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port, **kwargs)  # type: ignore[arg-type]

    def kill(self) -> None:
        """SIGKILL, as a crash would."""
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(10)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process is not None and self.process.stderr:
            self.process.stderr.close()
        self.process = None

    def restart_empty(self) -> None:
        """Kill and start again on the same port with no data."""
        self.kill()
        self.start()

    def cleanup(self) -> None:
        self.stop()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.cleanup()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except OSError:
        return False
    return True
