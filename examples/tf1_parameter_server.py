"""A between-graph parameter-server job (TF1-style graph mode) with stepbarrier hooks.

The code is ``stepbarrier/cli/_demo/job.py``, shipped in the package because
``stepbarrier demo`` runs it (also from an installed wheel); this file runs
that same code, so the compose file, the Kubernetes manifests and the tests
that start ``python examples/tf1_parameter_server.py`` run what the demo runs.
Read it there.

Each task is its own process: one or more ps tasks serve the variables, the
chief trains and publishes its global step (``GlobalStepPublisherHook``), and
every worker starts training once the global step reaches its
``wait_until_step`` (``GlobalStepWaiterHook``, a drop-in for TensorFlow's hook).
The only stepbarrier line is ``hooks = hooks_from_env(last_step=...)``. The model
is a tiny linear regression on synthetic data.

Environment variables (this script reads no command-line arguments):
    TF_CONFIG                   required: the cluster ("ps", "chief", "worker"
                                addresses) and this task, e.g.
                                {"cluster": {"ps": ["localhost:2222"],
                                             "chief": ["localhost:2223"],
                                             "worker": ["localhost:2224"]},
                                 "task": {"type": "worker", "index": 0}}
                                The chief (or a TF1 "master") is task id 0,
                                worker i is task id i + 1; without a chief job
                                worker 0 is the chief, as in TensorFlow.
    STEPBARRIER_JOB             required (chief and workers): the job's name.
    STEPBARRIER_REDIS_URL       Redis, e.g. redis://redis:6379/0 (default localhost).
    STEPBARRIER_WAIT_UNTIL_STEP a worker's step to wait for, or
    STEPBARRIER_SCHEDULE        a ramp such as "log:20": int(20 * log(task_id + 1)).
    STEPBARRIER_ROLE, STEPBARRIER_TASK_ID
                                override the barrier role and task id that
                                TF_CONFIG gives; the barrier's chief is also
                                the session's chief (every other STEPBARRIER_*
                                variable works too: docs/configuration.md).
    TRAIN_STEPS                 every task stops once the global step reaches it
                                (default 200); the chief's session ending there
                                finishes the job (workers still waiting abort).
    STEP_SLEEP                  extra seconds of sleep after each training step of
                                every training task (default 0): slows the job down
                                so that the ramp is visible.
    WAIT_FOR_WAITERS            chief only: once its session is up, wait (up to
                                120 s) until this many workers wait before
                                training (default 0): makes demos and tests
                                deterministic.
    RECORD_FILE                 if set, the task writes one JSON object there when
                                it ends (and, for the demo's live view, a worker
                                right after its release and the chief every 0.5 s
                                while it trains): task_type, task_index, task_id,
                                wait_until_step, released_at_step (the chief's step
                                the worker saw when released, null if it did not
                                wait), released_at (time.time(), null),
                                steps_trained, first_step_at (time.time() after its
                                first training run), first_global_step (the global
                                step right after that run, read from the ps),
                                step_times (chief only: [global_step, time.time()]
                                after each run).

A ps task serves until it is killed. The chief prints "chief ready at global
step N" once its session exists; starting the workers after that spares them
TensorFlow's 30 s re-check (they also tolerate an earlier start: they poll the
ps every 0.1 s until the chief has initialised the variables).

Exit status: 0 when the task trained to the end; 1 when a worker's wait ended
without its step (BarrierAborted: the chief finished below it; BarrierTimeout),
so that Kubernetes does not count that worker as done; 2 without TF_CONFIG.
"""

from __future__ import annotations

import sys

from stepbarrier.cli._demo.job import main

if __name__ == "__main__":
    sys.exit(main())
