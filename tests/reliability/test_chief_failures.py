"""Scenarios 4, 5 and 8: the chief dies, finishes early, or comes back from an older checkpoint.

Guarantees:
- a SIGKILLed chief: workers give up after the stall timeout with ``BarrierTimeout``
  (CLI exit 3) naming the last step and the heartbeat's age, or start with a
  warning under ``on_timeout="proceed"``; none hangs;
- a chief that finishes (``close``, or a TensorFlow session that reaches the
  ``last_step`` of its ``GlobalStepPublisherHook``) before a worker's step: that
  worker is aborted at once (``BarrierAborted``, CLI exit 4), not after a timeout;
- a chief restarted from an older checkpoint: waiters follow its real, lower step;
  neither the dead chief's stale higher step nor the writes of the old chief,
  still running as a zombie, release anyone.
"""

from __future__ import annotations

import signal
import time

import pytest

from stepbarrier import BarrierConfig, read_status
from stepbarrier._config.defaults import FALLBACK_INTERVAL
from stepbarrier._protocol.freshness import stale_after
from tests.redis_harness import RedisServer
from tests.reliability.conftest import FALLBACK, HEARTBEAT, Timings, wait_for_waiters
from tests.reliability.processes import (
    Fleet,
    assert_chief_never_blocked,
    assert_not_early,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

STALL = 3.0
"""The workers' stall timeout when the chief is killed (seconds)."""
EXIT_TIMEOUT = 3
EXIT_ABORTED = 4


def test_a_killed_chief_ends_every_wait_after_the_stall_timeout(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url)
    stall = {"STEPBARRIER_STALL_TIMEOUT": str(STALL)}
    fast = {"fallback_interval": FALLBACK}
    chief = fleet.chief()
    chief.wait_ready()
    chief.train_to(20)
    raising = fleet.worker("raising", 50, task_id=1, env=stall, overrides=fast)
    proceeding = fleet.worker(
        "proceeding", 50, task_id=2, env={**stall, "STEPBARRIER_ON_TIMEOUT": "proceed"}
    )
    cli = fleet.cli_wait("cli", 50, task_id=3, env=stall)
    wait_for_waiters(config, 3, [raising, proceeding])
    # each worker sees a write of the live chief happen (it heartbeats), so its
    # error can say how long ago that was; a worker that saw none says so instead
    time.sleep(1.5)

    chief.kill()
    killed = time.time()

    error = raising.wait_outcome(timeout=STALL + 20)
    assert error["event"] == "error" and error["type"] == "BarrierTimeout", error
    assert error["stalled"] is True
    assert error["last_step"] == 20
    assert error["heartbeat_age"] >= STALL - 0.25
    assert "last step seen 20" in error["message"]
    assert f"observed {error['heartbeat_age']:.1f} s ago" in error["message"]
    assert error["t"] - killed >= STALL - HEARTBEAT, "gave up before the stall timeout"
    timings.record("BarrierTimeout after the kill", error["t"] - killed)

    started = proceeding.released(timeout=STALL + 20)
    assert started["step"] == 20
    assert any("proceeding" in line and "stall timeout" in line for line in started["warnings"])
    timings.record("proceeded after the kill", started["t"] - killed)

    assert cli.exit_code(timeout=STALL + 20) == EXIT_TIMEOUT, cli.stderr_text()
    assert "stall timeout" in cli.stderr_text()
    assert "last step seen 20" in cli.stderr_text()
    timings.record("CLI exit 3 after the kill", cli.ended - killed)


def test_a_chief_finishing_first_aborts_the_remaining_waits_at_once(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url)
    patient = {"STEPBARRIER_STALL_TIMEOUT": "120"}  # a timeout cannot be what ends them
    chief = fleet.chief()
    chief.wait_ready()
    chief.train_to(10)
    reached = fleet.worker("reached", 30, task_id=1, env=patient)
    library = fleet.worker("library", 100, task_id=2, env=patient)
    cli = fleet.cli_wait("cli", 100, task_id=3, env=patient)
    wait_for_waiters(config, 3, [reached, library])

    chief.train_to(40)
    assert_not_early(reached.released(timeout=15.0), chief)
    closing = time.time()
    assert_chief_never_blocked(chief.close(done=True))

    error = library.wait_outcome(timeout=15.0)
    assert error["event"] == "error" and error["type"] == "BarrierAborted", error
    assert error["reason"] == "done" and error["last_step"] == 40
    delay = timings.record("BarrierAborted after close", error["t"] - closing)
    assert delay < FALLBACK_INTERVAL, "aborted by a later re-read, not by the announcement"

    assert cli.exit_code(timeout=15.0) == EXIT_ABORTED, cli.stderr_text()
    assert "finished before step 100" in cli.stderr_text()
    delay = timings.record("CLI exit 4 after close", cli.ended - closing)
    assert delay < FALLBACK_INTERVAL


def test_a_chief_restarted_from_an_older_checkpoint_is_followed(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url, heartbeat=HEARTBEAT)
    old = fleet.chief("old")
    old.wait_ready()
    old.train_to(100)
    wait_until(lambda: read_status(config).step == 100, 10.0, "the old chief stored step 100")
    # The old chief hangs (SIGSTOP): it is not dead, it will come back as a zombie.
    old.signal(signal.SIGSTOP)
    limit = stale_after(config.heartbeat)
    wait_until(
        lambda: (read_status(config).heartbeat_age or 0.0) > limit + 0.2,
        limit + 10,
        "the old chief's heartbeat is stale",
        interval=0.1,
    )
    workers = [
        fleet.worker(f"worker{i}", target, task_id=i, overrides={"fallback_interval": FALLBACK})
        for i, target in ((1, 70), (2, 90))
    ]
    wait_for_waiters(config, 2, workers)
    time.sleep(FALLBACK * 1.5)  # at least one more read of the stale step 100
    assert all(w.still_waiting() for w in workers), "released by a dead chief's step"

    old_generation = read_status(config).generation
    new = fleet.chief("new", start_step=50)  # restored from the checkpoint of step 50
    new.wait_ready()
    wait_until(
        lambda: read_status(config).generation != old_generation,
        10.0,
        "the new chief began a new generation",
    )
    status = read_status(config)
    assert status.step == 50, "the restored step did not replace the stale one"
    assert (status.generation or 0) > (old_generation or 0)

    old.signal(signal.SIGCONT)  # the zombie trains on, above every target
    old.start_training(150, step_seconds=0.01)
    time.sleep(0.5)
    assert all(w.still_waiting() for w in workers), "released by the zombie's writes"
    assert read_status(config).step == 50
    assert_chief_never_blocked(new.train_to(100, step_seconds=0.02))

    for worker in workers:
        record = worker.released(timeout=15.0)
        assert_not_early(record, new)
        # the step the worker saw is one the new chief had handed over by then
        assert new.reached(record["step"]) <= record["t"]
        timings.record(
            f"{worker.name} released after the new chief's step",
            record["t"] - new.reached(worker.target),
        )

    wait_until(lambda: read_status(config).step == 100, 10.0, "the new chief stored step 100")
    old.wait_trained(150)
    old.close(done=True)  # a zombie cannot end the job either
    status = read_status(config)
    assert (status.step, status.done) == (100, False)
    assert status.chief is not None and status.chief.endswith(f":{new.pid}")
    assert_chief_never_blocked(new.close(done=True))
    assert read_status(config).done


@pytest.mark.tensorflow
def test_a_tensorflow_chief_ending_early_aborts_the_remaining_waits_at_once(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url)
    patient = {"STEPBARRIER_STALL_TIMEOUT": "120"}
    library = fleet.worker("library", 100, task_id=1, env=patient)
    cli = fleet.cli_wait("cli", 100, task_id=2, env=patient)
    wait_for_waiters(config, 2, [library])
    chief = fleet.program("tf-chief", "tests.reliability.tf_chief", "40")
    trained = wait_until(
        lambda: chief.records("trained") or (not chief.alive() and chief.log_tail()),
        120.0,
        "the TensorFlow chief trained to step 40",
        interval=0.05,
    )
    assert isinstance(trained, list), f"the TensorFlow chief failed:\n{trained}"
    stopped = trained[0]["t"]  # the session closes (and end() runs) right after this

    error = library.wait_outcome(timeout=30.0)
    assert error["event"] == "error" and error["type"] == "BarrierAborted", error
    # the hook publishes the step fetched with each run: it may predate the last increment
    assert error["reason"] == "done" and error["last_step"] in (39, 40)
    delay = timings.record("BarrierAborted after the session ended", error["t"] - stopped)
    assert delay < FALLBACK_INTERVAL, "aborted by a later re-read, not by the announcement"
    assert cli.exit_code(timeout=30.0) == EXIT_ABORTED, cli.stderr_text()
    assert cli.ended - stopped < FALLBACK_INTERVAL
    assert wait_until(lambda: chief.records("ended"), 30.0, "the TensorFlow chief exited")
    assert read_status(config).done
