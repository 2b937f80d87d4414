"""The job's barrier epoch against a real redis-server (issue 21, defect 3): a reset or
the job's finish makes every older barrier stale, however many barriers the job had
and whatever the barrier index still names, so that a rerun under the same job name
(without a run id) begins each barrier anew instead of passing it at once. Forgetting
(an epoch gone) can only make a task wait; the keys' TTLs stay bounded."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import redis

from stepbarrier import Barrier, BarrierAborted, BarrierConfig, BarrierTimeout, read_status
from stepbarrier._barriers.barrier import BarrierWait
from stepbarrier._barriers.finish import finish_job
from stepbarrier._barriers.wait import MAX_INDEXED_BARRIERS
from stepbarrier._inspect.reset import RESET_MARKER_TTL, reset_job
from tests.barrier_helpers import as_task


def complete_start_then_overflow_the_index(config: BarrierConfig, client: redis.Redis) -> None:
    """Run 1: both tasks pass "start", then so many barriers that the index forgets it."""
    assert not Barrier(as_task(config, 1), "start", 2, client).arrive(wait=False)
    assert Barrier(as_task(config, 0), "start", 2, client).arrive(timeout=10)
    for number in range(MAX_INDEXED_BARRIERS):
        assert Barrier(as_task(config, 0), f"step-{number}", 1, client).arrive(timeout=10)
    assert client.zscore(config.keys.barrier_index, "start") is None  # the index forgot it
    assert client.exists(config.keys.barrier("start")) == 1  # but it is stored


def assert_rerun_waits_at_start(config: BarrierConfig, client: redis.Redis) -> None:
    """Run 2 (same job name, no run id): its chief waits at "start" for task 1."""
    with pytest.raises(BarrierTimeout) as info:
        Barrier(as_task(config, 0), "start", 2, client).arrive(timeout=0.5)
    assert info.value.missing == (1,)
    assert Barrier(as_task(config, 1), "start", 2, client).arrive(timeout=10)


def test_a_rerun_after_the_jobs_finish_begins_a_barrier_the_index_forgot_anew(
    config: BarrierConfig, client: redis.Redis
) -> None:
    complete_start_then_overflow_the_index(config, client)
    assert finish_job(as_task(config, 0), 100, client)
    assert_rerun_waits_at_start(config, client)


def test_a_rerun_after_a_reset_begins_a_barrier_the_index_forgot_anew(
    config: BarrierConfig, client: redis.Redis
) -> None:
    complete_start_then_overflow_the_index(config, client)
    reset_job(config, client)
    assert_rerun_waits_at_start(config, client)


def test_a_stale_barrier_of_other_parties_begins_anew_rather_than_refusing(
    config: BarrierConfig, client: redis.Redis
) -> None:
    assert Barrier(as_task(config, 0), "start", 1, client).arrive(timeout=10)
    assert finish_job(as_task(config, 0), 5, client)
    # the rerun has two parties: no "begun with 1 parties" error, a new barrier
    assert not Barrier(as_task(config, 1), "start", 2, client).arrive(wait=False)
    state = Barrier(as_task(config, 0), "start", 2, client).read()
    assert state is not None and (state.parties, state.arrived) == (2, (1,))


def test_a_lost_epoch_makes_every_barrier_stale(config: BarrierConfig, client: redis.Redis) -> None:
    assert Barrier(as_task(config, 0), "start", 1, client).arrive(timeout=10)
    client.delete(config.keys.barrier_epoch)  # evicted, or a Redis restored without it
    rerun = Barrier(as_task(config, 0), "start", 2, client)
    assert not rerun.arrive(wait=False)  # begun anew, not "begun with 1 parties"
    assert client.hget(config.keys.barrier_epoch, "by") == b"arrival"


def test_a_task_still_waiting_at_a_barrier_completed_before_the_finish_is_released(
    config: BarrierConfig, client: redis.Redis
) -> None:
    """The finish ends the epoch, but a barrier complete in it released its parties:
    a worker that reads only after the chief finished is released all the same."""
    worker = Barrier(as_task(config, 1), "end", 2, client)
    wait = BarrierWait(worker, 30.0)
    assert not wait._arrive(read_marker=True)
    assert Barrier(as_task(config, 0), "end", 2, client).arrive(timeout=10)
    assert finish_job(as_task(config, 0), 7, client)
    assert client.hget(config.keys.barrier_epoch, "by") == b"finish"  # a new epoch
    assert wait._read()  # its own epoch's barrier, complete
    wait._close_pubsub()


def test_status_shows_no_stale_barrier(config: BarrierConfig, client: redis.Redis) -> None:
    Barrier(as_task(config, 0), "start", 3, client).arrive(wait=False)
    assert [b.name for b in read_status(config, client).barriers] == ["start"]
    assert finish_job(as_task(config, 0), 9, client)
    assert read_status(config, client).barriers == ()  # it would begin anew


def test_the_epoch_and_the_barriers_keep_bounded_ttls(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(key_ttl=600, heartbeat=0.2, stall_timeout=30.0)
    keys = config.keys
    Barrier(as_task(config, 0), "start", 2, client).arrive(wait=False)
    for key in (keys.barrier("start"), keys.barrier_index, keys.barrier_epoch):
        assert 590 <= client.ttl(key) <= 600
    reset_job(config, client)
    assert 0 < client.ttl(keys.barrier_epoch) <= RESET_MARKER_TTL
    assert client.hget(keys.barrier_epoch, "by") == b"reset"
    Barrier(as_task(config, 1), "start", 2, client).arrive(wait=False)
    for key in (keys.barrier("start"), keys.barrier_index, keys.barrier_epoch):
        assert 590 <= client.ttl(key) <= 600


def test_each_reset_begins_a_greater_epoch(config: BarrierConfig, client: redis.Redis) -> None:
    Barrier(as_task(config, 0), "start", 2, client).arrive(wait=False)
    tokens = [int(client.hget(config.keys.barrier_epoch, "token") or 0)]
    for _ in range(3):
        reset_job(config, client)
        tokens.append(int(client.hget(config.keys.barrier_epoch, "token") or 0))
    assert tokens == sorted(set(tokens)) and tokens[0] > 0


def test_a_stale_party_does_not_carry_its_arrivals_into_a_rerun_after_the_finish(
    config: BarrierConfig, client: redis.Redis
) -> None:
    """A party of the finished run, still waiting, re-asserts nothing into the rerun's
    barrier of the same name (only Redis forgetting is made good)."""
    stale = BarrierWait(Barrier(as_task(config, 1), "start", 3, client), 30.0)
    assert not stale._arrive(read_marker=True)  # the old run's task 1, waiting
    assert finish_job(as_task(config, 0), 7, client)
    rerun = Barrier(as_task(config, 0), "start", 3, client)
    rerun.arrive(wait=False)  # the rerun's task 0 begins the barrier anew
    with pytest.raises(BarrierAborted) as info:
        stale._read()  # its epoch ended with the job: it is no party of the rerun's
    assert info.value.reason == "done"
    state = rerun.read()
    assert state is not None and [task for task, _ in state.arrivals] == [0]
    stale._close_pubsub()
