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
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import IO, Any

import redis

from tests.redis_harness import RedisServer as TestRedisServer

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
QUICK = "--quick" in sys.argv[1:]
RESULTS_DIR = BENCH_DIR / "results" / ("quick" if QUICK else "")
"""Full runs write ``bench/results/`` (committed); quick runs ``bench/results/quick/``
(ignored), so a smoke run never overwrites the published numbers."""


class RedisServer:
    """One private ``redis-server`` without persistence, on a free loopback port.

    The tests' server (``tests/redis_harness.py``: ``--save ""``, ``--appendonly
    no``, bound to 127.0.0.1, its files in a temporary directory), started at
    once, stopped (SIGTERM, then SIGKILL after 10 s) and its directory removed
    by ``stop``. Always a real ``redis-server``: fakeredis would measure
    fakeredis's 10 ms polling, not Redis.
    """

    def __init__(self) -> None:
        self._server = TestRedisServer()
        try:
            self._server.start()
        except BaseException:
            self._server.cleanup()
            raise
        self.port = self._server.port

    @property
    def url(self) -> str:
        return self._server.url

    def client(self) -> redis.Redis:
        return redis.Redis(host="127.0.0.1", port=self.port)

    def stop(self) -> None:
        self._server.cleanup()

    def __enter__(self) -> RedisServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def child_env(**extra: str) -> dict[str, str]:
    """Environment for helper processes: this checkout (``stepbarrier``, ``bench``,
    ``tests``) importable, TF quiet."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("STEPBARRIER_")}
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env["PYTHONUNBUFFERED"] = "1"
    env.update(extra)
    return env


def child_process(
    module: str, *args: str, stdout: int | IO[str] | None = subprocess.PIPE, **env: str
) -> subprocess.Popen[str]:
    """Start ``python -m <module> args`` (e.g. ``bench.fleet``) in a new Python
    process, in the repository's root."""
    return subprocess.Popen(
        [sys.executable, "-m", module, *args],
        stdout=stdout,
        stderr=None,
        text=True,
        env=child_env(**env),
        cwd=str(ROOT),
    )


def stop_process(
    process: subprocess.Popen[str] | subprocess.Popen[bytes] | None, timeout: float = 10.0
) -> None:
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


def git(*args: str) -> str:
    """Output of ``git ARGS`` in this checkout ("" if git is missing)."""
    try:
        return subprocess.run(
            ["git", *args], cwd=ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()
    except OSError:
        return ""


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
        redis_version = (
            subprocess.run(
                ["redis-server", "--version"], capture_output=True, text=True, check=False
            )
            .stdout.split()[2]
            .removeprefix("v=")
        )
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


def run_threads(count: int, run: Callable[[int], None]) -> None:
    """Run ``run(0) .. run(count - 1)`` at once in daemon threads; return when all end.

    The helper processes use it to stand in for ``count`` waiting workers.
    """
    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
