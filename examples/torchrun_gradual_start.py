"""A PyTorch job under torchrun, started gradually: rank r trains from rank 0's step K*log(r+1).

torchrun already names each process (``RANK``) and the run (``TORCHELASTIC_RUN_ID``);
stepbarrier takes both from there, so the only settings are the job and Redis:
rank 0 is the chief, which publishes its step, and every other rank is a worker
that holds until rank 0's step reaches its own. No sleep per rank, no file lock,
no rank-0-only load behind a barrier that times out after 1800 s:

1. the start barrier (``Barrier(config, "start", parties=WORLD_SIZE)``): no rank
   trains before every rank is up (rank 0 would, in a real job, load the data
   or the checkpoint first);
2. rank 0 trains and hands each step to a ``StepPublisher`` (no I/O on the
   training thread); rank r waits with a ``StepWaiter`` for step
   ``int(K * log(r + 1))`` (``--ramp K``), then trains;
3. the end barrier: rank 0 keeps publishing until every rank has finished,
   then leaving the publisher's block marks the job done.

Every rank trains its own tiny model (a linear regression on synthetic data,
on the CPU): a gradual start fits asynchronous training (parameter servers,
local SGD, independent models). Under DDP, whose ``backward()`` all-reduces
across every rank, a rank that waits blocks everyone: keep only the barriers
there (docs/coming-from.md#from-torchrun).

Environment variables (torchrun sets ``RANK``, ``WORLD_SIZE`` and
``TORCHELASTIC_RUN_ID`` itself):
    STEPBARRIER_JOB             required: the job's name, the same on every node.
    STEPBARRIER_REDIS_URL       Redis, e.g. redis://redis:6379/0 (default localhost).
    (STEPBARRIER_TASK_ID, STEPBARRIER_ROLE and STEPBARRIER_RUN_ID, when set, win
    over torchrun's: docs/configuration.md#task-id-and-role.)

Options: --steps N (training steps of every rank, default 200), --ramp K (default
20), --step-sleep S (extra seconds after each step, default 0: makes the ramp
visible), --barrier-timeout S (default 600), --record-dir DIR (each rank writes
DIR/rank-<r>.json: what it saw).

Run 3 ranks on one machine (Redis on localhost):
    export STEPBARRIER_JOB=torch-demo STEPBARRIER_REDIS_URL=redis://localhost:6379/0
    torchrun --standalone --nproc-per-node 3 examples/torchrun_gradual_start.py \\
        --steps 60 --ramp 20 --step-sleep 0.02
On several nodes, give torchrun a fresh --rdzv-id per launch: it is the run id.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from stepbarrier import Barrier, BarrierConfig, StepPublisher, StepWaiter


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--ramp", type=float, default=20.0, help="K of int(K * log(rank + 1))")
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--barrier-timeout", type=float, default=600.0)
    parser.add_argument("--record-dir", type=Path, default=None)
    return parser.parse_args()


def wait_step(rank: int, ramp: float) -> int:
    """The step of rank 0 that rank ``rank`` starts training at (0 for rank 0)."""
    return int(ramp * math.log(rank + 1))


class Trainer:
    """A linear regression on synthetic data: the stand-in for your model."""

    def __init__(self, seed: int) -> None:
        torch.manual_seed(seed)
        self.true_weights = torch.tensor([[1.0], [-2.0], [3.0], [0.5]])
        self.model = torch.nn.Linear(4, 1)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05)

    def step(self) -> float:
        x = torch.randn(32, 4)
        loss = torch.nn.functional.mse_loss(self.model(x), x @ self.true_weights)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return loss.detach().item()


def main() -> int:
    args = parse_args()
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("stepbarrier").setLevel(logging.INFO)
    config = BarrierConfig.from_env()  # rank and run id: torchrun's
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = config.task_id if config.task_id is not None else 0
    last_wait = wait_step(world - 1, args.ramp)
    if last_wait > args.steps:
        print(
            f"--ramp {args.ramp:g} makes rank {world - 1} wait for step {last_wait}, but rank 0 "
            f"trains only {args.steps} steps: lower --ramp or raise --steps",
            file=sys.stderr,
        )
        return 2
    record: dict[str, Any] = {
        "rank": rank,
        "role": config.role,
        "task": config.describe_task(),
        "run_id": config.run_id,
        "run_id_source": config.run_id_source,
        "wait_until_step": 0,
        "released_at_step": None,
        "published_at": {},  # rank 0: step -> time.monotonic() just before publish()
        "first_step_at": None,  # time.monotonic() when its first training step began
        "steps_trained": 0,
    }
    trainer = Trainer(seed=rank)
    loss = math.nan
    with Barrier(config, "start", parties=world) as start:
        start.arrive(timeout=args.barrier_timeout)
    if config.role == "chief":
        with StepPublisher(config) as publisher:
            publisher.publish(0)
            for step in range(1, args.steps + 1):
                record["first_step_at"] = record["first_step_at"] or time.monotonic()
                loss = trainer.step()
                record["published_at"][step] = time.monotonic()
                publisher.publish(step)  # microseconds: a background thread writes
                record["steps_trained"] = step
                time.sleep(args.step_sleep)
            with Barrier(config, "end", parties=world) as end:
                end.arrive(timeout=args.barrier_timeout)
        # leaving the block marked the job done, after every rank finished
    else:
        target = wait_step(rank, args.ramp)
        record["wait_until_step"] = target
        with StepWaiter(config) as waiter:
            record["released_at_step"] = waiter.wait(target)
        record["first_step_at"] = time.monotonic()
        for _ in range(args.steps):
            loss = trainer.step()
            record["steps_trained"] += 1
            time.sleep(args.step_sleep)
        with Barrier(config, "end", parties=world) as end:
            end.arrive(timeout=args.barrier_timeout)
    seen = record["released_at_step"]
    released = "" if seen is None else f", released at rank 0's step {seen}"
    print(
        f"rank {rank} ({config.role}): waited for step {record['wait_until_step']}{released}, "
        f"trained {record['steps_trained']} steps, loss {loss:.4f}",
        flush=True,
    )
    if args.record_dir is not None:
        path = args.record_dir / f"rank-{rank}.json"
        path.write_text(json.dumps(record), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
