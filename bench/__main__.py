"""Run every benchmark, then write ``bench/results/results.md`` and the plot.

Usage: ``python -m bench [--quick] [--only NAME ...]`` from the repository's
root (``make bench``, ``make bench-quick``). Each benchmark runs in its own
process (``python -m bench.<name>``) with its own redis-server; one that fails
is reported and the others still run. Results go to ``bench/results/``
(``bench/results/quick/`` with ``--quick``): one JSON file per benchmark,
``run.json`` (machine, load, commit), ``results.md``, ``wake_latency.png`` and
``fleet_wake.png``.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time

from bench.harness import RESULTS_DIR, ROOT, child_env, git, load_average, machine, save

BENCHMARKS = (
    "wake_floor", "wake_path", "fanout", "publish_call", "redis_load", "tf_job", "async_lateness",
    "cluster", "fleet", "instructions", "progress_cost",
)  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short smoke run (about 6 minutes)")
    parser.add_argument("--only", nargs="+", choices=BENCHMARKS, help="run only these")
    args = parser.parse_args()
    started = time.monotonic()
    load_before = load_average()
    failed: list[str] = []
    per_benchmark: dict[str, list[float]] = {}
    for name in args.only or BENCHMARKS:
        print(f"== {name}", file=sys.stderr, flush=True)
        per_benchmark[name] = load_average()
        command = [sys.executable, "-m", f"bench.{name}"]
        if args.quick:
            command.append("--quick")
        if subprocess.run(command, cwd=ROOT, env=child_env(), check=False).returncode != 0:
            failed.append(name)
            print(f"!! {name} failed", file=sys.stderr)
    save(
        "run",
        {
            "command": "make bench-quick" if args.quick else "make bench",
            "quick": args.quick,
            "seconds": time.monotonic() - started,
            "machine": machine(),
            "load_before": load_before,
            "load_after": load_average(),
            "load": per_benchmark,
            "commit": git("rev-parse", "--short", "HEAD"),
            "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
            "failed": failed,
        },
    )
    report = [sys.executable, "-m", "bench.report", *(["--quick"] if args.quick else [])]
    subprocess.run(report, cwd=ROOT, check=True)
    print(f"results: {RESULTS_DIR / 'results.md'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
