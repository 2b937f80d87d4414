"""Issue 23: no library call does work proportional to what a role can write.

Redis checks what a function runs against the CALLER's ACL, so a role that may
write a job's keys through the library may write them directly too, with any
size, and call any function on them. Each test here attacks as the role would
(redis-py with the role's own ACL user, the rules of ``stepbarrier._protocol.roles``),
then checks the defence by what Redis itself measured: every library command in
``SLOWLOG`` took less than ``LIMIT_US``, the oversized key is reported and not
read, and another job's chief keeps publishing meanwhile.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import re
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from stepbarrier import Barrier, BarrierConfig, StepPublisher, read_status
from stepbarrier._chief.publisher import (
    REGISTRATION_BATCH,
    REPORT_PER_WAKE,
    RegistrationListener,
    lowest_targets,
)
from stepbarrier._inspect import listing as job_listing
from stepbarrier._inspect.listing import LISTING_WAITERS, SCAN_COUNT, list_jobs
from stepbarrier._inspect.registry import entry_key
from stepbarrier._inspect.reset import reset_job
from stepbarrier._protocol.library import MAX_FIELDS, MAX_REMOVED, MAX_RESET_KEYS
from stepbarrier._protocol.roles import JOB_ROLES, role_rules
from stepbarrier._redis.functions import LIBRARY_VERSION, function_name, install_functions
from tests.redis_harness import RedisServer

LIMIT_US = 50_000
"""Longest any library command may run, as SLOWLOG measures it (50 ms)."""
BIG = 200_000
"""Fields, members or entries of an attacker's key: about a second to write."""
CHUNK = 10_000


@dataclasses.dataclass
class Roles:
    """The job roles' users (rules for every job: ``*``) and the admin client."""

    server: RedisServer
    admin: redis.Redis
    users: dict[str, tuple[str, str]]

    def client(self, role: str) -> redis.Redis:
        user, password = self.users[role]
        return self.server.client(username=user, password=password)

    def config(self, role: str, job: str, **extra: Any) -> BarrierConfig:
        user, password = self.users[role]
        settings: dict[str, Any] = {"heartbeat": 0.2, "stall_timeout": 30.0, **extra}
        return BarrierConfig(
            job=job,
            redis_url=self.server.url,
            redis_username=user,
            redis_password=password,
            **settings,
        )


def acl_arguments(rules: str) -> list[str]:
    """The rules as ACL SETUSER arguments (a selector ``(...)`` is one)."""
    return re.findall(r"\([^)]*\)|\S+", rules)


@pytest.fixture(scope="module")
def roles(redis_server: RedisServer) -> Iterator[Roles]:
    admin = redis_server.client()
    install_functions(admin, replace=True)  # the roles may not load it
    users: dict[str, tuple[str, str]] = {}
    for role in JOB_ROLES:
        user, password = f"bounded-{role}-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
        admin.execute_command(
            "ACL", "SETUSER", user, "on", f">{password}", *acl_arguments(role_rules(role, "*"))
        )
        users[role] = (user, password)
    saved = admin.config_get("slowlog-*")
    admin.config_set("slowlog-max-len", 200_000)
    try:
        yield Roles(redis_server, admin, users)
    finally:
        for name, value in saved.items():
            admin.config_set(name, value)
        admin.acl_deluser(*(user for user, _ in users.values()))
        admin.close()


Entry = tuple[int, list[str]]
"""A SLOWLOG entry: its duration (us, as Redis measured it) and its command's words."""


@pytest.fixture
def slowlog(roles: Roles) -> Iterator[Callable[..., list[Entry]]]:
    """Log every command from now on (until the next ``SLOWLOG RESET``); returns the
    entries of the commands whose first word is one of ``commands``."""
    roles.admin.config_set("slowlog-log-slower-than", 0)
    roles.admin.slowlog_reset()

    def entries(*commands: str) -> list[Entry]:
        found = []
        for entry in roles.admin.slowlog_get(200_000):
            raw = entry["command"]
            words = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).split()
            if words and words[0].upper() in commands:
                found.append((int(entry["duration"]), words))
        return found

    yield entries
    roles.admin.config_set("slowlog-log-slower-than", 10_000)


def library_calls(entries: Callable[..., list[Entry]], name: str | None = None) -> list[Entry]:
    """The FCALL/FCALL_RO entries (of the function ``name``, if given)."""
    calls = entries("FCALL", "FCALL_RO")
    if name is None:
        return [c for c in calls if c[1][1].startswith("stepbarrier_v")]
    return [c for c in calls if c[1][1] == function_name(name)]


def assert_short(calls: list[Entry]) -> None:
    assert calls, "the library call was not seen in SLOWLOG"
    slow = [(us, " ".join(words)[:120]) for us, words in calls if us >= LIMIT_US]
    assert not slow, f"library calls of {LIMIT_US} us or more: {slow}"


def fill_hash(client: redis.Redis, key: str, fields: int = BIG) -> None:
    for first in range(0, fields, CHUNK):
        client.hset(key, mapping={f"f{i}": "x" for i in range(first, first + CHUNK)})


def fill_zset(client: redis.Redis, key: str, members: int = BIG, score: int = 1) -> None:
    for first in range(0, members, CHUNK):
        client.zadd(key, {f"m{i}": score for i in range(first, first + CHUNK)})


def kind_of(reply: list[Any]) -> str:
    raw = reply[2]
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def job_name() -> str:
    return f"bounded-{uuid.uuid4().hex[:10]}"


# High 3: a hash of unbounded size, read by a function


def test_waiter_read_refuses_a_workers_oversized_hash_in_constant_time(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    keys = roles.config("worker", job).keys
    worker = roles.client("worker")
    big, wide = keys.waiter("big"), keys.waiter("wide")
    fill_hash(worker, big)
    worker.hset(wide, mapping={"step": "1" * 4_000_000, "generation": "1"})  # one huge value
    roles.admin.slowlog_reset()
    for key in (big, wide):
        reply = worker.fcall_ro(function_name("waiter_read"), 2, key, keys.reset)
        assert kind_of(reply) == "oversized" and len(reply) == 3  # nothing of it read
    assert_short(library_calls(slowlog, "waiter_read"))
    worker.close()
    roles.admin.unlink(big, wide)


def test_every_function_a_worker_calls_on_its_oversized_hash_is_short(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    # the worker names its own 200k-field hash where a function expects a small key
    keys = roles.config("worker", job_name()).keys
    worker = roles.client("worker")
    big, other = keys.waiter("big"), keys.waiter("other")
    publish = [0, 5, 0, 60, keys.channel, "h:1", 10, "", 1, 1000, 60, "", "contributor"]
    arrive = ["b", 0, 2, 60, keys.barrier_channel, "PUBLISH", "", 1000, ""]
    calls: dict[str, tuple[Any, ...]] = {
        "begin_generation": (2, big, other, ""),
        "publish_step": (3, big, keys.targets, other, *publish, "PUBLISH", 0),
        "waiter_register": (3, big, keys.targets, keys.registrations, 30, 60, "big", 3),
        "barrier_arrive": (3, keys.barrier("b"), keys.barrier_index, big, *arrive),
        "may_write": (1, big),
        "waiter_leave": (2, big, keys.targets, "big"),
    }
    for name, arguments in calls.items():
        fill_hash(worker, big)
        roles.admin.slowlog_reset()
        # refused part-way (the worker's rights) is fine: only the call's time counts
        with contextlib.suppress(redis.ResponseError):
            worker.fcall(function_name(name), *arguments)
        assert_short(library_calls(slowlog, name))
    roles.admin.unlink(big, other, *keys.all_fixed(), keys.barrier("b"), keys.barrier_index)
    worker.close()


def test_another_jobs_chief_keeps_publishing_while_a_worker_attacks(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    attacked, other = job_name(), job_name()
    big = roles.config("worker", attacked).keys.waiter("big")
    attacker = roles.client("worker")
    fill_hash(attacker, big)
    stop = threading.Event()
    kinds: list[str] = []

    def attack() -> None:
        reset = roles.config("worker", attacked).keys.reset
        while not stop.is_set():
            kinds.append(kind_of(attacker.fcall_ro(function_name("waiter_read"), 2, big, reset)))

    roles.admin.slowlog_reset()
    thread = threading.Thread(target=attack)
    thread.start()
    try:
        with StepPublisher(roles.config("chief", other)) as chief:
            for step in range(1, 6):
                chief.publish(step)
                assert chief.flush(5.0), chief.last_failure
    finally:
        stop.set()
        thread.join(10)
    assert kinds and set(kinds) == {"oversized"}
    assert read_status(roles.config("monitor", other)).step == 5
    assert_short(library_calls(slowlog, "waiter_read"))
    assert_short(library_calls(slowlog, "publish_step"))
    attacker.close()
    roles.admin.unlink(big)


def test_a_chiefs_oversized_state_is_reported_and_replaced_in_constant_time(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    config = roles.config("chief", job)
    chief = roles.client("chief")
    fill_hash(chief, config.keys.state)
    chief.hset(config.keys.state, mapping={"step": "7", "generation": "1"})
    roles.admin.slowlog_reset()
    status = read_status(roles.config("monitor", job))
    assert status.step is None
    assert any("state key is oversized" in problem for problem in status.problems)
    with StepPublisher(config) as publisher:  # begin_generation, publish_step
        publisher.publish(3)
        assert publisher.flush(5.0), publisher.last_failure
    assert roles.admin.hlen(config.keys.state) < MAX_FIELDS  # replaced, not read
    assert read_status(roles.config("monitor", job)).step == 3
    calls = library_calls(slowlog)
    assert {"begin_generation", "publish_step", "waiter_read"} <= {
        words[1].rsplit(f"_v{LIBRARY_VERSION}_", 1)[-1] for _, words in calls
    }
    assert_short(calls)
    chief.close()


def test_publish_removes_a_bounded_number_of_a_flooded_targets_index(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    config = roles.config("chief", job)
    worker = roles.client("worker")
    fill_zset(worker, config.keys.targets, score=1)  # 200k "waiters" released by step 1
    roles.admin.slowlog_reset()
    with StepPublisher(config) as publisher:
        publisher.publish(5)
        assert publisher.flush(5.0), publisher.last_failure
    remaining = roles.admin.zcard(config.keys.targets)
    writes = len(library_calls(slowlog, "publish_step"))
    assert BIG - writes * MAX_REMOVED <= remaining < BIG  # at most MAX_REMOVED a write
    assert_short(library_calls(slowlog, "publish_step"))
    worker.close()
    roles.admin.unlink(config.keys.targets)


def test_waiter_register_drops_a_flooded_registrations_list_whole(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    keys = roles.config("worker", job).keys
    worker = roles.client("worker")
    for first in range(0, BIG, CHUNK):
        worker.rpush(keys.registrations, *range(first + 1, first + CHUNK + 1))
    roles.admin.slowlog_reset()
    worker.fcall(
        function_name("waiter_register"),
        3,
        keys.waiter("w1"),
        keys.targets,
        keys.registrations,
        30,
        600,
        "w1",
        9,
        "wait_until_step",
        "9",
    )
    assert roles.admin.lrange(keys.registrations, 0, -1) == [b"9"]
    too_many = ["f", "v"] * (MAX_FIELDS + 1)
    with pytest.raises(redis.ResponseError, match="at most"):
        worker.fcall(
            function_name("waiter_register"),
            3,
            keys.waiter("w2"),
            keys.targets,
            keys.registrations,
            30,
            600,
            "w2",
            9,
            *too_many,
        )
    assert not roles.admin.exists(keys.waiter("w2"))
    assert_short(library_calls(slowlog, "waiter_register"))
    worker.close()
    roles.admin.unlink(*keys.all_fixed(), keys.waiter("w1"))


def test_an_arrival_begins_an_oversized_barrier_anew_and_drops_a_flooded_index(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    first, second = roles.config("worker", job, task_id=0), roles.config("worker", job, task_id=1)
    keys = first.keys
    worker = roles.client("worker")
    worker.hset(keys.barrier("start"), mapping={"parties": "2", "arrived": "0", "epoch": "1"})
    fill_hash(worker, keys.barrier("start"))
    fill_zset(worker, keys.barrier_index)
    roles.admin.slowlog_reset()
    reply = worker.fcall_ro(function_name("waiter_read"), 2, keys.barrier("start"), keys.reset)
    assert kind_of(reply) == "oversized"
    assert not Barrier(first, "start", 2).arrive(wait=False)
    assert roles.admin.zcard(keys.barrier_index) == 1  # dropped whole, then this arrival
    assert roles.admin.hlen(keys.barrier("start")) < MAX_FIELDS  # begun anew, not read
    assert Barrier(second, "start", 2).arrive(timeout=10)
    assert_short(library_calls(slowlog, "barrier_arrive"))
    assert_short(library_calls(slowlog, "waiter_read"))
    worker.close()


# Medium 6: a reset of a job whose indexes a worker flooded


def test_reset_passes_a_bounded_number_of_keys_and_stays_short(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    config = roles.config("chief", job)
    keys = config.keys
    worker = roles.client("worker")
    fill_zset(worker, keys.barrier_index)
    fill_zset(worker, keys.targets, members=20_000, score=9)
    fill_hash(worker, keys.waiter("m0"))  # an indexed entry of 200k fields
    roles.admin.slowlog_reset()
    reset_job(config)
    [(duration, words)] = library_calls(slowlog, "reset_job")
    assert int(words[2]) <= 6 + MAX_RESET_KEYS  # numkeys, as Redis logged the call
    assert duration < LIMIT_US
    assert_short(slowlog("UNLINK", "EXISTS", "ZRANGEBYSCORE"))
    assert not roles.admin.exists(keys.barrier_index, keys.targets, keys.waiter("m0"))
    assert roles.admin.hget(keys.barrier_epoch, "by") == b"reset"
    with pytest.raises(redis.ResponseError, match="at most"):  # the function refuses more
        roles.client("chief").fcall(
            function_name("reset_job"),
            6 + MAX_RESET_KEYS + 1,
            *keys.all_fixed(),
            keys.barrier_index,
            keys.barrier_epoch,
            *(keys.waiter(f"x{i}") for i in range(MAX_RESET_KEYS + 1)),
            keys.channel,
            60,
            "PUBLISH",
            keys.barrier_channel,
        )
    worker.close()


# Low 9: a flood of the registrations list, heard by the chief


def test_the_chiefs_listener_takes_a_flood_in_batches_and_reports_few_targets(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    config = roles.config("chief", job)
    worker = roles.client("worker")
    flood = 100_000
    for first in range(0, flood, CHUNK):
        worker.rpush(config.keys.registrations, *range(flood - first, flood - first - CHUNK, -1))
    worker.rpush(config.keys.registrations, "garbage", "-3", "1e9")
    heard: list[int] = []
    drained = threading.Event()

    def on_target(target: int) -> None:
        heard.append(target)

    roles.admin.slowlog_reset()
    listener = RegistrationListener(config, on_target)
    listener.start()
    try:
        for _ in range(200):
            if not roles.admin.exists(config.keys.registrations):
                drained.set()
                break
            drained.wait(0.05)
    finally:
        listener.stop(2.0)
    assert drained.is_set(), "the listener did not take the flood"
    wakes = math.ceil((flood + 3) / REGISTRATION_BATCH)
    assert 1 <= len(heard) <= wakes * REPORT_PER_WAKE
    assert min(heard) <= REPORT_PER_WAKE  # the lowest targets are the ones handed over
    assert_short(slowlog("LPOP", "BLPOP"))
    worker.close()


def test_lowest_targets_dedupes_and_keeps_the_lowest() -> None:
    items: list[object] = [
        b"7",
        b"7",
        b"3",
        b"x",
        b"0",
        b"9" * 20,
        *(str(i).encode() for i in range(100, 200)),
    ]
    assert lowest_targets(items) == [3, 7, *range(100, 100 + REPORT_PER_WAKE - 2)]


# Low 10: the monitor's listing of the jobs


def test_the_listing_scans_with_a_bounded_count_and_a_bounded_number_of_calls(
    roles: Roles, slowlog: Callable[..., Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    job = job_name()
    with StepPublisher(roles.config("chief", job)) as publisher:
        publisher.publish(1)
        assert publisher.flush(5.0)
    monitor = roles.config("monitor", "any")
    roles.admin.slowlog_reset()
    listing = list_jobs(monitor, pattern=job)
    assert [j.job for j in listing.jobs] == [job] and listing.complete
    scans = slowlog("SCAN")
    assert scans and all(words[words.index("COUNT") + 1] == str(SCAN_COUNT) for _, words in scans)
    # past its bound of SCAN calls, the listing stops and says it is incomplete
    filler = roles.admin.pipeline(transaction=False)
    for i in range(200):
        filler.set(f"bounded-filler:{job}:{i}", 1, ex=60)
    filler.execute()
    monkeypatch.setattr(job_listing, "SCAN_COUNT", 10)
    monkeypatch.setattr(job_listing, "MAX_SCAN_CALLS", 2)
    assert not list_jobs(monitor, pattern="no-such-job-*").complete


# Low 11: waiters a worker invents


def test_invented_waiters_are_bounded_in_status_and_in_the_listing(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    with StepPublisher(roles.config("chief", job)) as publisher:  # a job the listing finds
        publisher.publish(1)
        assert publisher.flush(5.0)
    keys = roles.config("worker", job).keys
    worker = roles.client("worker")
    invented = LISTING_WAITERS + 500
    pipe = worker.pipeline(transaction=False)
    for i in range(invented):
        pipe.hset(keys.waiter(f"fake-{i}"), mapping={"wait_until_step": str(i + 10), "since": "1"})
    pipe.zadd(keys.targets, {f"fake-{i}": i + 10 for i in range(invented)})
    pipe.execute()
    fill_hash(worker, keys.waiter("fake-0"))  # and one of them oversized
    monitor = roles.client("monitor")
    roles.admin.slowlog_reset()
    status = read_status(roles.config("monitor", job), monitor, max_waiters=100)
    assert [w.wait_until_step for w in status.waiters] == list(range(11, 110))  # lowest 100
    assert any("fake-0" in p and "oversized" in p for p in status.problems)
    assert any("more than 100 indexed waiters" in p for p in status.problems)
    [summary] = list_jobs(roles.config("monitor", "any"), monitor, pattern=job).jobs
    assert summary.waiting_workers == LISTING_WAITERS - 1  # the oversized one is not read
    assert any("oversized" in p for p in summary.problems)
    assert all(us < LIMIT_US for us, _ in slowlog("HMGET", "HLEN", "HSTRLEN", "ZRANGEBYSCORE"))
    assert not slowlog("HGETALL")  # the monitor's reads were the only commands meanwhile
    assert_short(library_calls(slowlog, "waiter_read"))
    monitor.close()
    worker.close()
    fakes = (entry_key(keys, f"fake-{i}".encode()) for i in range(invented))
    roles.admin.unlink(keys.targets, *fakes)


def test_status_reports_an_oversized_barrier_index_and_barrier(
    roles: Roles, slowlog: Callable[..., Any]
) -> None:
    job = job_name()
    config = roles.config("worker", job, task_id=0)
    keys = config.keys
    assert not Barrier(config, "open", 2).arrive(wait=False)
    worker = roles.client("worker")
    fill_hash(worker, keys.barrier("open"))  # a barrier of 2 parties with 200k fields
    roles.admin.slowlog_reset()
    status = read_status(roles.config("monitor", job))
    assert any("barrier 'open' is oversized" in p for p in status.problems)
    fill_zset(worker, keys.barrier_index)
    status = read_status(roles.config("monitor", job))
    assert any("barrier index is oversized" in p for p in status.problems)
    assert status.barriers == ()
    assert not slowlog("HGETALL")
    assert_short(library_calls(slowlog, "waiter_read"))
    worker.close()
    roles.admin.unlink(keys.barrier("open"), keys.barrier_index)
