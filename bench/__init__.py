"""stepbarrier's benchmarks: wake latency, fan-out, the chief's cost, Redis load, fleet scale.

Not part of the installed package (the wheel ships ``stepbarrier`` only): run
them from the repository's root, where ``bench`` (and ``tests``, whose
redis-server harness they share) is importable:

- ``python -m bench [--quick] [--only NAME ...]`` (``make bench``,
  ``make bench-quick``): every benchmark, each in its own process, then
  ``bench/results/results.md`` and its plots (``python -m bench.report``).
- ``python -m bench.<name> [--quick]`` (``wake_floor``, ``fanout``,
  ``publish_call``, ``redis_load``, ``tf_job``, ``async_lateness``, ``cluster``,
  ``fleet``, ``instructions``): one benchmark; ``python -m bench.before_after
  BEFORE_TREE`` compares two checkouts' waiters. ``instructions`` counts
  instructions with Callgrind (``valgrind``, which ``make bench`` installs
  when missing).

Each benchmark starts its own redis-server on a free loopback port and writes
``bench/results/<name>.json`` (``bench/results/quick/`` with ``--quick``).
"""
