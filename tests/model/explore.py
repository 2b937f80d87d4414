"""Explore the protocol model's scopes and print what each one reached.

``python -m tests.model.explore`` explores the bounded scopes (the ones CI's
tests/model checks) with every fix on; ``--large`` adds the large scopes
(``make model``), which take minutes; ``--scope NAME`` picks scopes by name
(bounded, large, or a limit's); ``--fixes`` and ``--limits`` also explore each
fix turned off and each limit lifted, and print the counterexample found. Scopes
are explored ``--jobs`` at a time (2 by default), in separate processes.

Prints, for each scope, the states explored, the ticks it runs, the longest any
waiter was owed an end against its bound, and the time taken; and a violation in
full. Exits 1 if a scope with every fix on breaks an invariant, or a fix turned
off or a limit lifted does not.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from concurrent.futures import ProcessPoolExecutor

from tests.model.protocol_model import (
    FIXES,
    LARGE_SCOPES,
    LIMITS,
    SCOPES,
    Flags,
    Result,
    Scope,
    explore,
)

Job = tuple[str, str, Flags, Scope, str | None]
"""(kind, what, flags, scope, the invariant a counterexample must break or None)."""


def _run(job: Job) -> tuple[Result, float]:
    _, _, flags, scope, _ = job
    started = time.perf_counter()
    result = explore(flags, scope, limit=5_000_000)
    return result, time.perf_counter() - started


def jobs(*, large: bool, fixes: bool, limits: bool, names: Sequence[str] = ()) -> list[Job]:
    # the large ones first: the pool then ends with the short ones
    scopes = (list(LARGE_SCOPES) if large else []) + list(SCOPES)
    every = {scope.name: scope for scope in (*SCOPES, *LARGE_SCOPES)}
    every.update({limit.scope.name: limit.scope for limit in LIMITS})
    if names:
        unknown = [name for name in names if name not in every]
        if unknown:
            raise SystemExit(f"unknown scope(s): {', '.join(unknown)}; known: {', '.join(every)}")
        scopes = [every[name] for name in names]
    found: list[Job] = [("scope", scope.name, Flags(), scope, None) for scope in scopes]
    if fixes:
        found += [
            ("fix off", fix.flag, Flags()._replace(**{fix.flag: False}), fix.scope, fix.invariant)
            for fix in FIXES
            if not names or fix.scope.name in names
        ]
    if limits:
        found += [
            ("limit", limit.name, Flags(), limit.scope, limit.invariant)
            for limit in LIMITS
            if not names or limit.scope.name in names
        ]
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.model.explore", description=__doc__)
    parser.add_argument("--large", action="store_true", help="add the large scopes (minutes)")
    parser.add_argument("--scope", action="append", default=[], help="only this scope (repeat)")
    parser.add_argument("--fixes", action="store_true", help="also each fix turned off")
    parser.add_argument("--limits", action="store_true", help="also each limit lifted")
    parser.add_argument("--jobs", type=int, default=2, help="processes (default 2)")
    args = parser.parse_args(argv)
    todo = jobs(large=args.large, fixes=args.fixes, limits=args.limits, names=args.scope)
    failed = 0
    total = 0
    started = time.perf_counter()
    print(f"{'':8} {'scope':30} {'states':>10} {'ticks':>5} {'owed/bound':>10} {'seconds':>8}")
    with ProcessPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
        for job, (result, seconds) in zip(todo, pool.map(_run, todo), strict=True):
            kind, what, _, scope, expected = job
            total += result.states
            owed = f"{result.worst_owed}/{scope.bound}"
            label = what if kind == "scope" else f"{what} ({scope.name})"
            print(
                f"{kind:8} {label:30} {result.states:10} {scope.max_ticks:5} {owed:>10} "
                f"{seconds:8.1f}",
                flush=True,
            )
            violation = result.violation
            if expected is None:
                if violation is not None or result.stuck or result.worst_owed > scope.bound:
                    failed += 1
                    print(f"  FAILED ({result.stuck} stuck states)")
                if violation is not None:
                    print(violation.report())
            elif violation is None or violation.invariant != expected:
                failed += 1
                print(f"  FAILED: expected a counterexample breaking {expected}, found {violation}")
            else:
                print(violation.report())
    seconds = time.perf_counter() - started
    print(f"{'all':8} {'':30} {total:10} {'':5} {'':>10} {seconds:8.1f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
