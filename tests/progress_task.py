"""A training task for the progress tests: reports a step that rises every 20 ms.

``python -m tests.progress_task URL JOB TASK_ID FREEZE_AT [cluster]``: after
``FREEZE_AT`` (``0``: never) the step stops rising while the process lives on (a
stuck task); ``cluster``: URL is a Redis Cluster node. It ends when its stdin closes.
"""

from __future__ import annotations

import sys
import threading

from stepbarrier import BarrierConfig, ProgressReporter


def main() -> None:
    url, job, task, freeze_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    ended = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.read(), ended.set()), daemon=True).start()
    cluster = sys.argv[5:] == ["cluster"]
    config = BarrierConfig(job=job, redis_url=url, task_id=task, redis_cluster=cluster)
    with ProgressReporter(config, interval=0.1) as progress:
        step = 0
        print("started", flush=True)
        while not ended.wait(0.02):
            if not freeze_at or step < freeze_at:
                step += 1
            progress.report(step)


if __name__ == "__main__":
    main()
