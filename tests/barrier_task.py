"""One task at a named barrier, as a process of its own: arrive, then print the outcome.

Run as ``python -m tests.barrier_task NAME PARTIES TIMEOUT DELAY`` with the job's
``STEPBARRIER_*`` variables (the task id among them). It sleeps DELAY seconds,
arrives, and prints one JSON object: ``task``, ``arrived_at`` and
``released_at`` (``time.time()``), ``outcome`` (``released``, ``timeout`` or
``aborted``) and, after a timeout, ``missing``.
"""

from __future__ import annotations

import json
import sys
import time

from stepbarrier import Barrier, BarrierAborted, BarrierConfig, BarrierTimeout


def main(name: str, parties: str, timeout: str, delay: str) -> int:
    config = BarrierConfig.from_env()
    record: dict[str, object] = {"task": config.task_id}
    time.sleep(float(delay))
    record["arrived_at"] = time.time()
    try:
        with Barrier(config, name, int(parties)) as barrier:
            barrier.arrive(timeout=float(timeout))
        record["outcome"] = "released"
    except BarrierTimeout as exc:
        record.update(outcome="timeout", missing=list(exc.missing), message=str(exc))
    except BarrierAborted:
        record["outcome"] = "aborted"
    record["released_at"] = time.time()
    print(json.dumps(record), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:5]))
