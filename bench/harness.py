"""What every benchmark shares: its own redis-server, child processes, statistics.

Each benchmark starts a private ``redis-server`` on a free loopback port (never
a shared one), starts its helper processes with ``child_process`` and stops all
of them in ``finally`` blocks. Results go to ``bench/results/<name>.json``
(``bench/results/quick/`` for ``--quick`` runs).
"""

from __future__ import annotations

import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import redis

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
QUICK = "--quick" in sys.argv[1:]
RESULTS_DIR = BENCH_DIR / "results" / ("quick" if QUICK else "")
"""Full runs write ``bench/results/`` (committed); quick runs ``bench/results/quick/``
(ignored), so a smoke run never overwrites the published numbers."""


def free_port() -> int:
    """A TCP port that was free a moment ago on 127.0.0.1."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """One private ``redis-server`` without persistence, on a free loopback port."""

    def __init__(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed (`make bench` installs it as root)")
        self.port = free_port()
        self.dir = tempfile.mkdtemp(prefix="stepbarrier-bench-redis-")
        self.process = subprocess.Popen(
            [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
             "--appendonly", "no", "--dir", self.dir, "--logfile", f"{self.dir}/redis.log"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while True:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                    break
            except OSError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not start on port {self.port}") from None
                time.sleep(0.02)

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def child_env(**extra: str) -> dict[str, str]:
    """Environment for helper processes: this checkout importable, TF quiet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPBARRIER_")}
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(BENCH_DIR), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def child_process(
    script: str, *args: str, stdout: Any = subprocess.PIPE, **env: str
) -> subprocess.Popen[str]:
    """Start ``bench/<script>`` with ``args`` in a new Python process."""
    return subprocess.Popen(
        [sys.executable, str(BENCH_DIR / script), *args],
        stdout=stdout,
        stderr=None,
        text=True,
        env=child_env(**env),
        cwd=str(ROOT),
    )


def stop_process(process: subprocess.Popen[Any] | None, timeout: float = 10.0) -> None:
    """Terminate one process we started (and reap it)."""
    if process is None or process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """The ``q``-th percentile (0-100) by linear interpolation; values must be sorted."""
    if not sorted_values:
        return math.nan
    position = (len(sorted_values) - 1) * q / 100.0
    low = math.floor(position)
    high = min(low + 1, len(sorted_values) - 1)
    return sorted_values[low] + (sorted_values[high] - sorted_values[low]) * (position - low)


def summarize(values: Iterable[float]) -> dict[str, float]:
    """n, mean, median, p90, p99, max and min of ``values``."""
    data = sorted(values)
    if not data:
        return {"n": 0}
    return {
        "n": len(data),
        "mean": sum(data) / len(data),
        "min": data[0],
        "median": percentile(data, 50),
        "p90": percentile(data, 90),
        "p99": percentile(data, 99),
        "max": data[-1],
    }


def load_average() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        redis_version = subprocess.run(
            ["redis-server", "--version"], capture_output=True, text=True, check=False
        ).stdout.split()[2].removeprefix("v=")
    except (OSError, IndexError):
        redis_version = "unknown"
    try:
        import hiredis

        hiredis_version = hiredis.__version__
    except ImportError:
        hiredis_version = None
    return {
        "nproc": os.cpu_count(),
        "cpu": cpu,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "redis_server": redis_version,
        "redis_py": redis.__version__,
        "hiredis": hiredis_version,
    }


def save(name: str, data: dict[str, Any]) -> Path:
    """Write one benchmark's results to ``bench/results/<name>.json``."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.json"
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    tmp.replace(path)
    return path


def ms(seconds: Iterable[float]) -> list[float]:
    """Seconds to milliseconds."""
    return [s * 1000.0 for s in seconds]
