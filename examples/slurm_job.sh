#!/bin/bash
# A Slurm job whose tasks start gradually: task r trains from the chief's step
# int(K * log(r + 1)), instead of `sleep $((SLURM_PROCID * 30))` or a flock.
#
# srun starts one process per task, and each takes from Slurm what it needs:
# its task id (SLURM_PROCID: task 0 is the chief, which publishes its step;
# every other task is a worker that holds until the chief's step reaches its
# own) and the run id (SLURM_JOB_ID, as slurm-<id>; a requeued job,
# slurm-<id>-r<n>, is a new run). So only the job's name and Redis are set
# here (docs/configuration.md#task-id-and-role). The training loop is
# examples/plain_loop.py; any program that calls BarrierConfig.from_env() works.
#
# Submit from the repository's root, with Redis reachable from the nodes:
#   STEPBARRIER_REDIS_URL=redis://redis.internal:6379/0 sbatch examples/slurm_job.sh
# and watch it from any shell:
#   stepbarrier watch --job slurm-gradual --redis-url redis://redis.internal:6379/0
#
# Every task reports its own step (a ProgressReporter in plain_loop.py), so
# `status` and `watch` show how far each task is behind the chief and name the
# stragglers and the stuck (docs/who-is-slow.md). Make task 3 the slow rank:
#   SLOW_TASK=3 SLOW_STEP_SLEEP=2 STEPBARRIER_REDIS_URL=... sbatch examples/slurm_job.sh
#   stepbarrier status --job slurm-gradual --straggler-steps 100     # task 3: straggler
#   stepbarrier status --check --job slurm-gradual --stall-timeout 1m   # exit 10: stuck
#
#SBATCH --job-name=stepbarrier-gradual
#SBATCH --ntasks=4
#SBATCH --cpus-per-task=1
#SBATCH --time=00:30:00
#SBATCH --output=stepbarrier-gradual-%j.out

set -euo pipefail

: "${STEPBARRIER_REDIS_URL:?set STEPBARRIER_REDIS_URL to your Redis, e.g. redis://redis.internal:6379/0}"
export STEPBARRIER_REDIS_URL
export STEPBARRIER_JOB="${STEPBARRIER_JOB:-slurm-gradual}"
# task r waits for the chief's step int(40 * log(r + 1)): 27, 43, 55, ...
export STEPBARRIER_SCHEDULE="${STEPBARRIER_SCHEDULE:-log:40}"
# a worker gives up after an hour of waiting, or 10 minutes without the chief's heartbeat
export STEPBARRIER_TIMEOUT="${STEPBARRIER_TIMEOUT:-1h}"
export TRAIN_STEPS="${TRAIN_STEPS:-200}" STEP_SLEEP="${STEP_SLEEP:-0.05}"
# the slow rank, when set: task SLOW_TASK sleeps SLOW_STEP_SLEEP more seconds per step
export SLOW_TASK="${SLOW_TASK:-}" SLOW_STEP_SLEEP="${SLOW_STEP_SLEEP:-0}"
# the chief trains once every other task waits (up to 120 s): the ramp shows
export WAIT_FOR_WAITERS="${WAIT_FOR_WAITERS:-$((SLURM_NTASKS - 1))}"

cd "${SLURM_SUBMIT_DIR:-.}"
srun --kill-on-bad-exit=1 "${PYTHON:-python3}" examples/plain_loop.py
