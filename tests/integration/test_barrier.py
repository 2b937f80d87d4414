"""Named barriers (``stepbarrier.Barrier``) against a real redis-server: tasks as real
processes arriving staggered in time, timeouts that name the missing tasks, a reset
that aborts, re-arrival, runs kept apart, and the keys under the job's hash tag."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

from stepbarrier import (
    Barrier,
    BarrierAborted,
    BarrierConfig,
    BarrierTimeout,
    ConfigurationError,
    read_status,
)
from stepbarrier._config.environment import barrier_parties_from_env
from stepbarrier._inspect.reset import RESET_MARKER_TTL, reset_job
from stepbarrier._protocol.barrier_record import MAX_PARTIES
from tests.conftest import subprocess_env

CLI = [sys.executable, "-m", "stepbarrier"]


def as_task(config: BarrierConfig, task_id: int, **changes: Any) -> BarrierConfig:
    return dataclasses.replace(config, task_id=task_id, **changes)


def env_of(config: BarrierConfig, task_id: int) -> dict[str, str]:
    return subprocess_env(
        STEPBARRIER_JOB=config.job,
        STEPBARRIER_REDIS_URL=config.redis_url,
        STEPBARRIER_TASK_ID=str(task_id),
        STEPBARRIER_STALL_TIMEOUT="60",
    )


def start_task(
    config: BarrierConfig, task_id: int, name: str, parties: int, *, delay: float = 0.0
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.barrier_task", name, str(parties), "60", str(delay)],
        env=env_of(config, task_id),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def outcome(process: subprocess.Popen[str]) -> dict[str, Any]:
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err
    record: dict[str, Any] = json.loads(out)
    return record


def eventually(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


def test_staggered_arrivals_are_all_released_by_the_last_one(config: BarrierConfig) -> None:
    parties = 4
    tasks = [start_task(config, task, "start", parties, delay=0.5 * task) for task in range(4)]
    records = [outcome(task) for task in tasks]
    state = Barrier(as_task(config, 0), "start", parties).read()
    assert state is not None and state.completed_ms is not None
    assert [record["outcome"] for record in records] == ["released"] * parties
    assert state.arrived == (0, 1, 2, 3)
    assert state.completed_ms == max(at for _task, at in state.arrivals)
    for record in records:  # nobody left before the last one came
        assert record["released_at"] * 1000 >= state.completed_ms
    spread = [record["released_at"] * 1000 - state.completed_ms for record in records]
    print(f"\nreleased {min(spread):.1f} to {max(spread):.1f} ms after the last arrival")


def test_a_timeout_names_the_missing_tasks(config: BarrierConfig) -> None:
    for task in (1, 3):
        assert not Barrier(as_task(config, task), "epoch-1", 5).arrive(wait=False)
    with pytest.raises(BarrierTimeout) as info:
        Barrier(as_task(config, 0), "epoch-1", 5).arrive(timeout=0.5)
    assert isinstance(info.value, TimeoutError)
    error = info.value
    assert (error.missing, error.barrier, error.stalled) == ((2, 4), "epoch-1", False)
    assert "missing task(s) 2, 4" in str(info.value)
    assert "3 of 5 tasks arrived" in str(info.value)


def test_the_stall_timeout_ends_a_wait_without_new_arrivals(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(task_id=0, heartbeat=0.2, stall_timeout=1.0, fallback_interval=0.2)
    with pytest.raises(BarrierTimeout) as info:
        Barrier(config, "start", 3).arrive()
    assert (info.value.missing, info.value.stalled) == ((1, 2), True)
    assert "no task arrived for 1 s (stall timeout)" in str(info.value)


def test_the_cli_exits_3_and_names_the_missing_tasks(config: BarrierConfig) -> None:
    assert not Barrier(as_task(config, 2), "end", 4).arrive(wait=False)
    done = subprocess.run(
        [*CLI, "arrive", "end", "--parties", "4", "--task-id", "0", "--timeout", "0.5"],
        env=env_of(config, 0),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 3, done.stderr
    assert "missing task(s) 1, 3" in done.stderr
    assert done.stderr.count("\n") == 1


def test_the_cli_exits_0_once_every_party_arrived(config: BarrierConfig) -> None:
    arriving = [
        subprocess.Popen(
            [*CLI, "arrive", "start", "--parties", "2", "--timeout", "60"],
            env=env_of(config, task),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for task in (0, 1)
    ]
    for process in arriving:
        out, err = process.communicate(timeout=60)
        assert process.returncode == 0, err
        assert "barrier start complete: all 2 tasks arrived" in out


def test_a_reset_aborts_a_waiting_arrival(config: BarrierConfig, client: redis.Redis) -> None:
    waiting = subprocess.Popen(
        [*CLI, "arrive", "start", "--parties", "2", "--timeout", "60"],
        env=env_of(config, 1),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    eventually(lambda: len(read_status(config).barriers) == 1)
    reset_job(config)
    _out, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 4, err
    assert "was reset" in err and "barrier 'start'" in err
    assert not client.exists(config.keys.barrier("start"), config.keys.barrier_index)
    # the run starts again: its barrier starts empty
    assert not Barrier(as_task(config, 0), "start", 2).arrive(wait=False)


def test_a_reset_marker_aborts_an_arrival_that_missed_the_announcement(
    config: BarrierConfig, client: redis.Redis
) -> None:
    barrier = Barrier(as_task(config, 0, fallback_interval=0.2), "start", 2)
    errors: list[BaseException] = []

    def arrive() -> None:
        try:
            barrier.arrive(timeout=30)
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=arrive)
    thread.start()
    eventually(lambda: client.exists(config.keys.barrier("start")) == 1)
    time.sleep(0.05)
    # a reset as the script leaves it, without its announcement
    now = client.time()
    client.set(config.keys.reset, now[0] * 1000 + now[1] // 1000 + 1, ex=RESET_MARKER_TTL)
    thread.join(30)
    assert not thread.is_alive()
    [error] = errors
    assert isinstance(error, BarrierAborted) and error.reason == "reset"


def test_arriving_again_at_a_completed_barrier_returns_at_once(config: BarrierConfig) -> None:
    assert not Barrier(as_task(config, 0), "start", 2).arrive(wait=False)
    assert Barrier(as_task(config, 1), "start", 2).arrive(timeout=10)
    first = Barrier(as_task(config, 1), "start", 2).read()
    started = time.monotonic()
    assert Barrier(as_task(config, 0), "start", 2).arrive(timeout=10)  # a restarted task
    print(f"\nre-arrival returned after {1000 * (time.monotonic() - started):.1f} ms")
    assert Barrier(as_task(config, 0), "start", 2).read() == first  # first arrivals kept


def test_a_barrier_of_another_run_is_not_this_runs(config: BarrierConfig) -> None:
    assert Barrier(as_task(config, 0, run_id="run-a"), "start", 1).arrive(timeout=10)
    other = Barrier(as_task(config, 0, run_id="run-b"), "start", 2)
    assert not other.arrive(wait=False)
    state = other.read()
    assert state is not None and (state.run_id, state.arrived) == ("run-b", (0,))
    assert other.key == config.keys.barrier("start:run-b")


def test_a_task_id_missing_or_outside_the_parties_is_a_configuration_error(
    config: BarrierConfig,
) -> None:
    with pytest.raises(ConfigurationError, match="STEPBARRIER_TASK_ID"):
        Barrier(config, "start", 3)
    with pytest.raises(ConfigurationError, match=r"0\.\.2\), but this is task 3"):
        Barrier(as_task(config, 3), "start", 3)


@pytest.mark.parametrize("name", ["", "a b", "x" * 65, "a:b", "{x}", "ü", "*"])
def test_a_bad_barrier_name_is_refused(config: BarrierConfig, name: str) -> None:
    with pytest.raises(ConfigurationError, match="barrier name"):
        Barrier(as_task(config, 0), name, 2)


@pytest.mark.parametrize("parties", [0, -1, True, MAX_PARTIES + 1, 1.5, "2"])
def test_a_bad_number_of_parties_is_refused(config: BarrierConfig, parties: Any) -> None:
    with pytest.raises(ConfigurationError, match="parties"):
        Barrier(as_task(config, 0), "start", parties)


def test_every_party_must_give_the_same_number_of_parties(config: BarrierConfig) -> None:
    assert not Barrier(as_task(config, 0), "start", 3).arrive(wait=False)
    with pytest.raises(ConfigurationError, match="begun with 3 parties, but this task says 4"):
        Barrier(as_task(config, 1), "start", 4).arrive(timeout=5)


def test_the_barrier_sits_under_the_jobs_hash_tag_with_the_jobs_ttl(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(task_id=0, key_ttl=600)
    barrier = Barrier(config, "start", 2)
    barrier.arrive(wait=False)
    for key in (barrier.key, config.keys.barrier_index, config.keys.barrier_epoch):
        assert key.startswith(f"stepbarrier:{{{config.job}}}:")
        assert 590 <= client.ttl(key) <= 600


def test_status_shows_an_open_barrier_and_the_missing_tasks(config: BarrierConfig) -> None:
    for task in (0, 2):
        Barrier(as_task(config, task), "start", 4).arrive(wait=False)
    [shown] = read_status(config).barriers
    assert (shown.name, shown.parties, shown.arrived, shown.missing) == ("start", 4, 2, (1, 3))
    env = env_of(config, 0)
    text = subprocess.run([*CLI, "status"], env=env, capture_output=True, text=True, timeout=60)
    assert text.returncode == 0, text.stderr
    row = next(line for line in text.stdout.splitlines() if line.startswith("start"))
    assert "2/4" in row and "1, 3" in row
    data = subprocess.run(
        [*CLI, "status", "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert json.loads(data.stdout)["barriers"][0]["missing"] == [1, 3]
    for task in (1, 3):
        Barrier(as_task(config, task), "start", 4).arrive(wait=False)
    assert read_status(config).barriers == ()  # complete: no longer open


def test_a_barrier_that_lost_this_arrival_is_arrived_at_again(
    config: BarrierConfig, client: redis.Redis
) -> None:
    """A Redis that restarted empty, say: the next read finds the arrival gone."""
    barrier = Barrier(as_task(config, 0, fallback_interval=0.2), "start", 2)
    result: list[bool] = []
    thread = threading.Thread(target=lambda: result.append(barrier.arrive(timeout=30)))
    thread.start()
    key = config.keys.barrier("start")
    eventually(lambda: client.exists(key) == 1)
    client.delete(key)
    eventually(lambda: client.exists(key) == 1)  # arrived again
    assert Barrier(as_task(config, 1), "start", 2).arrive(timeout=10)
    thread.join(30)
    assert result == [True]


def test_a_reset_makes_stale_a_barrier_its_index_no_longer_names(
    config: BarrierConfig, client: redis.Redis
) -> None:
    """The index only guides ``status``: a barrier it forgot is stale after a reset too."""
    assert Barrier(as_task(config, 0), "start", 1).arrive(timeout=10)
    keys = config.keys
    client.zrem(keys.barrier_index, "start")  # forgotten (the index keeps the newest 1000)
    reset_job(config, client)
    assert client.exists(keys.barrier("start")) == 1  # still stored, but stale
    other = Barrier(as_task(config, 0), "start", 2)
    assert not other.arrive(wait=False)  # begun anew: one of two arrived
    state = other.read()
    assert state is not None and (state.parties, state.arrived) == (2, (0,))


def test_status_reports_malformed_barriers_instead_of_failing(
    config: BarrierConfig, client: redis.Redis
) -> None:
    keys = config.keys
    seconds, micros = client.time()
    now_ms = seconds * 1000 + micros // 1000  # the index forgets members older than the TTL
    names = ["ok", "bad name!", "gone", "wrong-type", "no-parties"]
    client.zadd(keys.barrier_index, {name: now_ms - age for age, name in enumerate(names)})
    client.hset(keys.barrier_epoch, mapping={"token": "5", "by": "arrival"})
    client.hset(
        keys.barrier("ok"), mapping={"parties": "2", "t0": "1", "t7": "1", "tx": "1", "epoch": "5"}
    )
    client.set(keys.barrier("wrong-type"), "x")
    client.hset(keys.barrier("no-parties"), mapping={"t0": "1"})
    status = read_status(config, client)
    [ok] = status.barriers
    assert (ok.name, ok.arrived, ok.missing) == ("ok", 1, (1,))
    assert any("malformed barrier name" in problem for problem in status.problems)
    assert any("'no-parties' is malformed" in problem for problem in status.problems)
    # an arrival begins anew what it cannot read as a barrier
    assert not Barrier(as_task(config, 1), "no-parties", 2).arrive(wait=False)
    assert not Barrier(as_task(config, 1), "wrong-type", 2).arrive(wait=False)
    assert {b.name for b in read_status(config, client).barriers} == {
        "ok",
        "no-parties",
        "wrong-type",
    }


def test_an_index_of_the_wrong_type_is_a_problem_until_an_arrival_repairs_it(
    config: BarrierConfig, client: redis.Redis
) -> None:
    client.set(config.keys.barrier_index, "not a sorted set")
    assert any("barriers not shown" in p for p in read_status(config, client).problems)
    assert not Barrier(as_task(config, 0), "start", 2).arrive(wait=False)
    assert [b.name for b in read_status(config, client).barriers] == ["start"]


def test_a_barrier_works_with_eval_scripts_too(make_config: Callable[..., BarrierConfig]) -> None:
    config = make_config(use_eval=True, heartbeat=0.2, stall_timeout=30.0)
    assert not Barrier(as_task(config, 0), "start", 2).arrive(wait=False)
    assert Barrier(as_task(config, 1), "start", 2).arrive(timeout=10)
    reset_job(config)
    assert Barrier(as_task(config, 0), "start", 2).read() is None


def test_an_unreachable_redis_is_exit_5_not_a_timeout(config: BarrierConfig) -> None:
    env = env_of(dataclasses.replace(config, redis_url="redis://127.0.0.1:1/0"), 0)
    done = subprocess.run(
        [*CLI, "arrive", "start", "--parties", "2", "--timeout", "1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 5, done.stderr
    assert "unreachable" in done.stderr


@pytest.mark.parametrize(
    ("cluster", "parties"),
    [
        ({"ps": ["p:1"], "chief": ["c:1"], "worker": ["w:1", "w:2"]}, 3),
        ({"ps": ["p:1"], "worker": ["w:1", "w:2"], "evaluator": ["e:1"]}, 2),  # worker 0 chiefs
        ({"master": ["m:1"], "worker": ["w:1"]}, 2),
    ],
)
def test_the_parties_are_the_chief_and_the_workers_of_tf_config(
    cluster: dict[str, list[str]], parties: int
) -> None:
    tf_config = json.dumps({"cluster": cluster, "task": {"type": "ps", "index": 0}})
    assert barrier_parties_from_env({"TF_CONFIG": tf_config}) == parties
    assert barrier_parties_from_env({"TF_CONFIG": tf_config}, parties=7) == 7


def test_without_tf_config_the_parties_must_be_given() -> None:
    with pytest.raises(ConfigurationError, match="parties=N"):
        barrier_parties_from_env({})
    with pytest.raises(ConfigurationError, match="parties"):
        barrier_parties_from_env({}, parties=0)
