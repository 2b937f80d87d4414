"""``status``, ``watch`` and ``reset`` find a job's waiters through the job's own index
(the targets sorted set), never by scanning the keyspace."""

from __future__ import annotations

import math
import subprocess
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from stepbarrier import BarrierConfig, read_status
from stepbarrier._inspect.registry import MAX_INDEXED, parse_index
from stepbarrier._inspect.reset import RESET_BATCH, reset_job
from tests.integration.test_cli import finish, start, wait_for_waiters
from tests.redis_harness import RedisServer


@pytest.fixture
def user_without(
    redis_server: RedisServer, client: redis.Redis
) -> Iterator[Callable[..., tuple[str, str]]]:
    """Make a Redis user that may do everything but the given commands."""
    made: list[str] = []

    def make(*denied: str) -> tuple[str, str]:
        name, password = f"no-{uuid.uuid4().hex[:8]}", uuid.uuid4().hex
        client.acl_setuser(
            name,
            enabled=True,
            passwords=[f"+{password}"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", *(f"-{command}" for command in denied)],
        )
        made.append(name)
        return name, password

    yield make
    if made:
        client.acl_deluser(*made)


def as_user(config: BarrierConfig, user: tuple[str, str]) -> BarrierConfig:
    return BarrierConfig(
        job=config.job,
        redis_url=config.redis_url,
        redis_username=user[0],
        redis_password=user[1],
    )


def waiting_process(config: BarrierConfig, until: int, task_id: int) -> subprocess.Popen[str]:
    from tests.conftest import subprocess_env

    env = subprocess_env(STEPBARRIER_REDIS_URL=config.redis_url, STEPBARRIER_JOB=config.job)
    return start(env, "wait", "--until", str(until), "--task-id", str(task_id), "--timeout", "60")


def test_status_finds_waiters_for_a_user_that_may_not_scan(
    redis_server: RedisServer,
    make_config: Callable[..., BarrierConfig],
    user_without: Callable[..., tuple[str, str]],
) -> None:
    user = user_without("scan", "keys")
    config = make_config()
    no_scan = as_user(config, user)
    denied = redis_server.client(username=user[0], password=user[1])
    with pytest.raises(redis.exceptions.NoPermissionError):
        denied.scan(count=1)  # so the reads below cannot have scanned
    denied.close()
    waiting = waiting_process(config, 9, 3)
    wait_for_waiters(no_scan, 1, waiting)
    [waiter] = read_status(no_scan).waiters
    assert (waiter.task_id, waiter.wait_until_step) == (3, 9)
    assert reset_job(no_scan) == 1
    code, _, err = finish(waiting)
    assert code == 4, err  # aborted by the reset
    assert read_status(no_scan).waiters == ()


def test_a_user_that_may_not_read_the_index_sees_the_step_and_a_problem(
    client: redis.Redis,
    make_config: Callable[..., BarrierConfig],
    user_without: Callable[..., tuple[str, str]],
) -> None:
    config = make_config()
    client.hset(config.keys.state, mapping={"step": "4", "generation": "1"})
    user = as_user(config, user_without("zrangebyscore"))
    # no waiter: nothing is hidden from it (ZCARD, which it may run, says so)
    assert not any("waiters not shown" in problem for problem in read_status(user).problems)
    client.zadd(config.keys.targets, {"w-1": 9})
    status = read_status(user)
    assert status.step == 4
    assert any("waiters not shown" in problem for problem in status.problems)


def test_an_index_member_whose_entry_expired_is_skipped_quietly(
    client: redis.Redis, config: BarrierConfig
) -> None:
    client.zadd(config.keys.targets, {"gone-1234": 7})
    status = read_status(config, client)
    assert (status.waiters, status.problems) == ((), ())


def test_an_entry_missing_from_the_index_is_not_shown(
    client: redis.Redis, config: BarrierConfig
) -> None:
    client.hset(config.keys.waiter("unindexed"), mapping={"wait_until_step": "7", "since": "1"})
    assert read_status(config, client).waiters == ()


def test_an_index_of_the_wrong_type_is_a_problem_and_reset_still_clears_it(
    client: redis.Redis, config: BarrierConfig
) -> None:
    client.set(config.keys.targets, "not a sorted set")
    status = read_status(config, client)
    assert any("waiter index unreadable" in problem for problem in status.problems)
    assert reset_job(config, client) == 0
    assert not client.exists(config.keys.targets)


def test_index_scores_must_be_whole_steps_in_range() -> None:
    problems: list[str] = []
    raw = [
        (b"ok", b"5"),
        (b"resp3", 6.0),
        (b"nan", math.nan),
        (b"inf", b"inf"),
        (b"neg", b"-3"),
        (b"zero", b"0"),
        (b"half", b"1.5"),
        (b"huge", b"1e+20"),
        (b"over", str(2**53 + 2).encode()),
    ]
    flat = [0, *(part for pair in raw for part in pair)]  # index_read's reply
    assert parse_index(flat, problems) == [(b"ok", 5), (b"resp3", 6)]
    assert len(problems) == len(raw) - 2


def test_a_full_index_says_that_more_waiters_exist() -> None:
    problems: list[str] = []
    raw = [0, *(part for i in range(MAX_INDEXED) for part in (f"w{i}".encode(), b"3"))]
    members = parse_index(raw, problems)
    assert len(members) == MAX_INDEXED
    assert problems == [f"more than {MAX_INDEXED} indexed waiters: only the first are shown"]


def test_reset_deletes_more_entries_than_one_batch(
    client: redis.Redis, config: BarrierConfig
) -> None:
    keys = config.keys
    count = 2 * RESET_BATCH + 17
    pipe = client.pipeline(transaction=False)
    for index in range(count):
        pipe.hset(keys.waiter(f"w{index}"), mapping={"wait_until_step": "9", "since": "1"})
    pipe.zadd(keys.targets, {f"w{index}": 9 for index in range(count)})
    pipe.hset(keys.state, mapping={"step": "1", "generation": "1"})
    pipe.execute()
    assert len(read_status(config, client).waiters) == count
    assert reset_job(config, client) == count
    assert client.exists(*(keys.waiter(f"w{index}") for index in range(count))) == 0
    assert client.exists(keys.state, keys.targets) == 0
    assert client.exists(keys.reset) == 1
