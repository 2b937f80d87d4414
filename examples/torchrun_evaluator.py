"""A PyTorch job under torchrun with an evaluator that follows training: no checkpoint missed.

Rank 0 (the chief) trains and, every ``--every`` steps, saves a checkpoint
(written to a temporary file, then renamed: never read half-written) before it
publishes that step. Every other rank does not train: it is an evaluator (here
each evaluates the same held-out set; in a job, each its own), and
``StepWaiter.follow(every=N, start=0)`` yields each multiple of N the chief's
step reaches, in order, **each one** even when the chief's step jumps past
several at once (``--publish-every``: a chief that publishes only at its log
interval), so it evaluates every checkpoint, never one not yet written. It ends
when the job finishes: leaving the chief's ``StepPublisher`` block marks it
done. No polling of the checkpoint directory, and no ``checkpoints_iterator``
that "can miss checkpoints" (docs/following.md).

torchrun names each process (``RANK``, ``WORLD_SIZE``) and the run
(``TORCHELASTIC_RUN_ID``): an evaluator, a rank of the same launch, follows the
same run, and takes no part in training (under DDP, keep it out of the training's
process group). It needs no barrier: started late, it still yields every multiple
from ``--every`` on, each with the step it saw.

Environment variables (torchrun sets ``RANK``, ``WORLD_SIZE`` and
``TORCHELASTIC_RUN_ID`` itself):
    STEPBARRIER_JOB             required: the job's name, the same on every node.
    STEPBARRIER_REDIS_URL       Redis, e.g. redis://redis:6379/0 (default localhost).

Options: --steps N (the chief's training steps, default 300), --every N (checkpoint
and evaluate every N steps, default 50), --publish-every K (the chief publishes its
step only every K steps, and at the end; default 1), --step-sleep S (extra seconds
after each step, default 0), --checkpoint-dir DIR (default: a temporary directory
named after the run id, on this machine: give a shared one on several nodes), --follow-timeout S
(default 600: the longest wait for the next multiple), --record-dir DIR (each rank
writes DIR/rank-<r>.json: what it did or saw).

Run a chief and an evaluator on one machine (Redis on localhost):
    export STEPBARRIER_JOB=torch-eval STEPBARRIER_REDIS_URL=redis://localhost:6379/0
    torchrun --standalone --nproc-per-node 2 examples/torchrun_evaluator.py \\
        --steps 300 --every 50 --publish-every 120 --checkpoint-dir /tmp/ckpt
The shell's equivalent of the evaluator is
    stepbarrier follow --every 50 --from 0 -- python evaluate.py   # reads $STEPBARRIER_STEP
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter

TRUE_WEIGHTS = torch.tensor([[1.0], [-2.0], [3.0], [0.5]])


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--every", type=int, default=50)
    parser.add_argument("--publish-every", type=int, default=1)
    parser.add_argument("--step-sleep", type=float, default=0.0)
    parser.add_argument("--checkpoint-dir", type=Path, default=None)
    parser.add_argument("--follow-timeout", type=float, default=600.0)
    parser.add_argument("--record-dir", type=Path, default=None)
    return parser.parse_args()


def checkpoint_path(directory: Path, step: int) -> Path:
    return directory / f"step-{step}.pt"


def train(config: BarrierConfig, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """Rank 0: train, checkpoint every ``args.every`` steps, then publish."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    published: list[int] = []
    with StepPublisher(config) as publisher:
        publisher.publish(0)
        for step in range(1, args.steps + 1):
            x = torch.randn(32, 4)
            loss = torch.nn.functional.mse_loss(model(x), x @ TRUE_WEIGHTS)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            if step % args.every == 0:
                # the checkpoint is on disk before its step is published
                path = checkpoint_path(directory, step)
                torch.save(model.state_dict(), path.with_suffix(".tmp"))
                os.replace(path.with_suffix(".tmp"), path)
            if step % args.publish_every == 0 or step == args.steps:
                publisher.publish(step)  # microseconds: a background thread writes
                published.append(step)
            time.sleep(args.step_sleep)
    # leaving the block marked the job done: the evaluator ends after the last multiple
    return {"published": published}


def evaluate(config: BarrierConfig, args: argparse.Namespace, directory: Path) -> dict[str, Any]:
    """The evaluator: every multiple of ``args.every``, in order, none skipped."""
    torch.manual_seed(1234)
    x = torch.randn(256, 4)
    y = x @ TRUE_WEIGHTS
    model = torch.nn.Linear(4, 1)
    followed: list[dict[str, Any]] = []
    with StepWaiter(config) as waiter:
        for crossed in waiter.follow(every=args.every, start=0, timeout=args.follow_timeout):
            state = torch.load(checkpoint_path(directory, crossed.multiple), weights_only=True)
            model.load_state_dict(state)
            with torch.no_grad():
                loss = torch.nn.functional.mse_loss(model(x), y).item()
            print(
                f"evaluator: checkpoint of step {crossed.multiple}: eval loss {loss:.4f} "
                f"(the chief at step {crossed.step})",
                flush=True,
            )
            followed.append({"multiple": crossed.multiple, "step": crossed.step, "loss": loss})
    return {"followed": followed}


def main() -> int:
    args = parse_args()
    logging.basicConfig(format="%(asctime)s %(name)s %(message)s")
    logging.getLogger("stepbarrier").setLevel(logging.INFO)
    config = BarrierConfig.from_env()  # rank and run id: torchrun's
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = config.task_id if config.task_id is not None else 0
    if world < 2:
        print("run at least 2 ranks: rank 0 trains, the others evaluate", file=sys.stderr)
        return 2
    if min(args.steps, args.every, args.publish_every) < 1:
        print("--steps, --every and --publish-every must be positive", file=sys.stderr)
        return 2
    directory = args.checkpoint_dir or Path(tempfile.gettempdir(), f"ckpt-{config.run_id}")
    directory.mkdir(parents=True, exist_ok=True)
    record: dict[str, Any] = {"rank": rank, "role": config.role, "run_id": config.run_id}
    if rank == 0:
        record.update(train(config, args, directory))
        print(f"rank 0 (chief): trained {args.steps} steps", flush=True)
    else:
        record.update(evaluate(config, args, directory))
        print(f"rank {rank} (evaluator): {len(record['followed'])} checkpoints", flush=True)
    if args.record_dir is not None:
        path = args.record_dir / f"rank-{rank}.json"
        path.write_text(json.dumps(record), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
