"""Issue 34: every library function bounds its work by construction, whatever a role sends.

The review's attack: one worker call, ``FCALL barrier_arrive`` with 700,000 pairs
of "arrivals" to record again, held Redis for seconds, and since the function
had already written when its loop ran, ``FUNCTION KILL`` answered UNKILLABLE:
every other team got BUSY. Now each function checks how many keys and arguments
it was given, and their sizes and shapes, before it reads, writes or loops over
anything, and a barrier arrival reads all it needs before it writes.

Each test attacks with a worker's own ACL user (``stepbarrier acl`` rules), on
a redis-server of this module's own, and judges by what Redis measured: the
library's refusal held Redis (``SLOWLOG``) no longer than a function that
refuses at once without looking at its arguments, called with the same 1.4
million arguments beside it (Redis itself must build them into Lua first: tens
of milliseconds on a quiet machine, hundreds on a loaded one, so the floor, not
a fixed number of milliseconds, is the measure; a function that did work per
argument would hold it for seconds), the refusal came before anything was
written, and what runs long
(a read of a barrier's task fields, at most ``MAX_PARTIES``) only reads, so the
``emergency`` user's ``FUNCTION KILL`` ends it.

And issue 34's barrier item: a barrier completes from its arrivals, counted
against the caller's own number of parties, never from a stored ``parties``,
``arrived`` or ``completed_ms``, nor from fields that are no task's arrival,
that a worker planted.
"""

from __future__ import annotations

import dataclasses
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from stepbarrier import Barrier, BarrierConfig, BarrierTimeout, ConfigurationError
from stepbarrier._protocol import library
from stepbarrier._protocol.barrier_record import MAX_PARTIES, state_from_read
from stepbarrier._protocol.calls import arrival_reply, barrier_arrive_call, split_arrival
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.library import MAX_RESTORED
from stepbarrier._protocol.roles import emergency_rules, role_rules
from stepbarrier._redis.functions import function_name, install_functions
from tests.barrier_helpers import Waiting, as_task, eventually, subscribed
from tests.redis_harness import RedisServer
from tests.security.test_bounded_work import acl_arguments

FLOOR_FACTOR = 2.0
"""A refused library call may hold Redis at most this many times as long as the floor
(a function that refuses at once) with the same arguments, measured beside it."""
FLOOR_SLACK_US = 20_000
"""And this much more: the library's checks of its keys and arguments' sizes."""
FLOOR = """#!lua name=stepbarrier_test_floor
redis.register_function('stepbarrier_test_floor', function(keys, args)
  return redis.error_reply('floor: refused without a look at the arguments')
end)
"""
"""The floor: a function that refuses without a look at its arguments."""
PAIRS = 700_000
"""The review's attack: pairs of a task and a time to record again (1.4 million
arguments; no ACL rule bounds how many arguments a command has)."""
TRIES = 5
"""Attempts of one refused call, each beside the floor's, until one is within
``FLOOR_FACTOR`` of it (a loaded machine may pause either of them)."""
KILL_TRIES = 100
"""Attempts to catch a read with FUNCTION KILL while it runs: the largest takes tens
of milliseconds (MAX_PARTIES), and Redis takes the KILL only where its Lua hook
finds the call past the BUSY threshold, so a loaded machine lets many run through
(20 tries were not enough once, beside another suite)."""


@dataclasses.dataclass
class Roles:
    """The server, its admin client, and users with the roles' rules (jobs ``*``)."""

    server: RedisServer
    admin: redis.Redis
    users: dict[str, tuple[str, str]]

    def client(self, role: str) -> redis.Redis:
        user, password = self.users[role]
        return self.server.client(username=user, password=password)

    def config(self, role: str, job: str, task: int) -> BarrierConfig:
        user, password = self.users[role]
        return BarrierConfig(
            job=job,
            task_id=task,
            redis_url=self.server.url,
            redis_username=user,
            redis_password=password,
            stall_timeout=30.0,
            fallback_interval=0.2,
        )


@pytest.fixture(scope="module")
def roles() -> Iterator[Roles]:
    server = RedisServer().start()
    admin = server.client()
    install_functions(admin, replace=True)  # the roles may not load it
    admin.function_load(FLOOR, replace=True)
    users: dict[str, tuple[str, str]] = {}
    for role in ("chief", "worker", "monitor", "emergency"):
        rules = emergency_rules() if role == "emergency" else role_rules(role, "*")
        user, password = f"{role}-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
        admin.execute_command(  # type: ignore[no-untyped-call]
            "ACL", "SETUSER", user, "on", f">{password}", *acl_arguments(rules)
        )
        users[role] = (user, password)
    try:
        yield Roles(server, admin, users)
    finally:
        admin.close()
        server.cleanup()


def job_keys() -> JobKeys:
    return JobKeys.for_job(f"bounded-{uuid.uuid4().hex[:10]}")


def logged_calls(admin: redis.Redis) -> list[tuple[int, str]]:
    """The function calls SLOWLOG holds, oldest first (duration in us, the call's
    first words)."""
    calls = []
    for entry in reversed(admin.slowlog_get(128)):
        raw = entry["command"]
        words = (raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw).split()
        if len(words) > 1 and words[0].upper() in ("FCALL", "FCALL_RO"):
            calls.append((int(entry["duration"]), " ".join(words[:3])))
    return calls


def refused_in_time(roles: Roles, call: Callable[[], object], floor: Callable[[], object]) -> str:
    """Run ``call``, which the library must refuse, beside ``floor`` (the floor function
    with the same keys and arguments); the refusal's text, once a try held Redis at
    most ``FLOOR_FACTOR`` times as long as the floor, plus ``FLOOR_SLACK_US``."""
    admin = roles.admin
    admin.config_set("slowlog-log-slower-than", 0)
    seen: list[tuple[int, int]] = []
    try:
        for _ in range(TRIES):
            admin.slowlog_reset()
            with pytest.raises(redis.ResponseError, match="floor"):
                floor()
            with pytest.raises(redis.ResponseError) as info:
                call()
            logged = logged_calls(admin)
            assert [words.split()[1] for _, words in logged][-2:] == [
                "stepbarrier_test_floor",
                logged[-1][1].split()[1],
            ], logged
            floor_us, call_us = logged[-2][0], logged[-1][0]
            if call_us <= FLOOR_FACTOR * floor_us + FLOOR_SLACK_US:
                return str(info.value)
            seen.append((call_us, floor_us))
    finally:
        admin.config_set("slowlog-log-slower-than", 10_000)
    pytest.fail(
        f"every try held Redis longer than {FLOOR_FACTOR}x the floor: (us, floor us) {seen}"
    )


def floor_call(roles: Roles, names: list[Any], arguments: list[Any]) -> Callable[[], object]:
    """The floor function called by the admin with ``names`` as keys and ``arguments``."""
    return lambda: roles.admin.execute_command(  # type: ignore[no-untyped-call]
        "FCALL", "stepbarrier_test_floor", len(names), *names, *arguments
    )


def worker_attacks(keys: JobKeys) -> dict[str, tuple[list[Any], list[Any]]]:
    """Each function as a worker calls it, on keys its rules let it write: (keys, the
    function's own arguments); the attack adds 1.4 million more."""
    w = keys.waiter
    publish = [1, 5, 0, 60, keys.channel, "h:1", 10, "", 1, 1000, 60, "", "chief", "PUBLISH", 0, 0]
    arrive = ["b", 0, 2, 60, keys.barrier_channel, "PUBLISH", "", 1000, ""]
    return {
        "begin_generation": ([w("s"), w("m")], ["", 0]),
        "publish_step": ([w("s"), w("t"), w("m")], publish),
        "reset_job": (
            [w("a"), w("b"), w("c"), w("d"), w("e"), w("f")],
            [keys.channel, 60, "PUBLISH", keys.barrier_channel],
        ),
        "waiter_register": ([w("w"), keys.targets, keys.registrations], [30, 60, "w", 9]),
        "waiter_read": ([keys.barrier("b"), keys.reset], []),
        "index_read": ([keys.targets], [0, 10]),
        "waiter_leave": ([w("w"), keys.targets], ["w"]),
        "may_write": ([w("x")], []),
        "barrier_arrive": ([keys.barrier("b"), keys.barrier_index, keys.barrier_epoch], arrive),
        "report_progress": ([keys.progress], [1, 5, 60]),
        "job_index": ([w("j")], [keys.job, 60]),
    }


def test_every_function_is_attacked() -> None:
    assert set(worker_attacks(job_keys())) == set(library.BODIES)


@pytest.mark.parametrize("name", sorted(library.BODIES))
def test_a_worker_call_with_a_million_arguments_is_refused_at_once_before_any_write(
    roles: Roles, name: str
) -> None:
    keys = job_keys()
    names, own = worker_attacks(keys)[name]
    flood = [1] * (2 * PAIRS)  # (task 1, time 1) 700,000 times, for barrier_arrive
    read_only = library.BODIES[name][1]
    worker = roles.client("worker")
    command = "FCALL_RO" if read_only else "FCALL"
    try:
        message = refused_in_time(
            roles,
            lambda: worker.execute_command(  # type: ignore[no-untyped-call]
                command, function_name(name), len(names), *names, *own, *flood
            ),
            floor_call(roles, names, [*own, *flood]),
        )
    finally:
        worker.close()
    assert message.startswith("stepbarrier:"), message  # the library's refusal, not the ACL's
    assert "arguments" in message or "pairs" in message or "fields" in message, message
    # refused before anything was written: no key it names exists
    assert roles.admin.exists(*names, keys.barrier_index, keys.barrier_epoch) == 0


def test_the_reviews_attack_is_refused_at_once_and_writes_nothing(
    roles: Roles,
) -> None:
    """700,000 pairs to barrier_arrive, with an open barrier of the job in place."""
    keys = job_keys()
    worker = roles.client("worker")
    barrier = [keys.barrier("b"), keys.barrier_index, keys.barrier_epoch]
    fixed = ["b", 0, 4, 60, keys.barrier_channel, "PUBLISH", "", 1000, ""]
    try:
        opened = worker.fcall(function_name("barrier_arrive"), 3, *barrier, *fixed)
        before = roles.admin.hgetall(keys.barrier("b"))
        epoch = roles.admin.hgetall(keys.barrier_epoch)
        roles.admin.expire(keys.barrier_epoch, 3600)  # an arrival's write would make it 60 s
        flood = [value for task in range(PAIRS) for value in (task % 4, 1)]
        attack = ["b", 1, 4, 60, keys.barrier_channel, "PUBLISH", "", 1000, opened[6], *flood]
        message = refused_in_time(
            roles,
            lambda: worker.fcall(function_name("barrier_arrive"), 3, *barrier, *attack),
            floor_call(roles, barrier, attack),
        )
    finally:
        worker.close()
    assert f"at most {MAX_RESTORED} pairs of a task and its time, not {PAIRS}" in message, message
    assert roles.admin.hgetall(keys.barrier("b")) == before  # task 1 not recorded either
    assert roles.admin.hgetall(keys.barrier_epoch) == epoch
    assert roles.admin.ttl(keys.barrier_epoch) > 60
    assert roles.admin.ping()


@pytest.mark.parametrize("name", ["reset_job", "may_write"])
def test_a_function_with_keys_to_spare_refuses_more_than_its_limit_before_any_write(
    roles: Roles, name: str
) -> None:
    """The variadic keys: 100,000 where at most ``MAX_RESET_KEYS`` + 6 (a reset) or
    ``MAX_WRITE_KEYS`` are taken. (Redis's own handling of the keys, before any
    function runs, grows with their number whatever the function does.)"""
    keys = job_keys()
    names = [keys.waiter(f"k{i}") for i in range(100_000)]
    args = [keys.channel, 60, "PUBLISH", keys.barrier_channel] if name == "reset_job" else []
    worker = roles.client("worker")
    try:
        with pytest.raises(redis.ResponseError, match=r"^stepbarrier: .* keys"):
            worker.fcall(function_name(name), len(names), *names, *args)
    finally:
        worker.close()
    assert roles.admin.exists(*names[:1000], *names[-1000:]) == 0
    assert roles.admin.exists(keys.reset, keys.barrier_epoch) == 0


# The restore of lost arrivals: at most MAX_RESTORED per call, more as several


def test_an_arrival_takes_at_most_max_restored_arrivals_to_record_again(roles: Roles) -> None:
    keys = job_keys()
    parties = 2 * MAX_RESTORED + 10
    barrier = [keys.barrier("b"), keys.barrier_index, keys.barrier_epoch]
    fixed = ["b", 0, parties, 60, keys.barrier_channel, "PUBLISH", "", 1000, ""]
    worker = roles.client("worker")
    try:
        too_many = [v for task in range(1, MAX_RESTORED + 2) for v in (task, 1)]
        with pytest.raises(redis.ResponseError, match=f"at most {MAX_RESTORED} pairs"):
            worker.fcall(function_name("barrier_arrive"), 3, *barrier, *fixed, *too_many)
        assert roles.admin.exists(*barrier) == 0
        enough = too_many[:-2]
        reply = worker.fcall(function_name("barrier_arrive"), 3, *barrier, *fixed, *enough)
        assert reply[2] == str(MAX_RESTORED + 1).encode()  # this task and the restored ones
    finally:
        worker.close()


def test_a_longer_restore_is_sent_as_several_calls_and_answered_as_one() -> None:
    restore = [(task, 1_000 + task) for task in range(1, 2 * MAX_RESTORED + 501)]
    call = barrier_arrive_call(
        barrier="b",
        index="i",
        epoch="e",
        member="m",
        task_id=0,
        parties=len(restore) + 1,
        key_ttl=60,
        channel="c",
        publish_command="PUBLISH",
        run_id="",
        max_indexed=1000,
        arrived_under="",
        restore=restore,
    )
    parts = split_arrival(call)
    assert len(parts) == 3
    assert all(part[2][:9] == call[2][:9] for part in parts)  # the same arrival each time
    assert [v for part in parts for v in part[2][9:]] == list(call[2][9:])  # every pair, in order
    assert all(len(part[2]) <= 9 + 2 * MAX_RESTORED for part in parts)
    assert split_arrival(barrier_arrive_call(**{**_arrival(), "restore": restore[:10]})) == [
        barrier_arrive_call(**{**_arrival(), "restore": restore[:10]})
    ]
    recorded, other = (
        [1, b"5", b"3", b"9", b"0", 0, b"7", 1],
        [0, b"5", b"1", b"2", b"0", 0, b"7", 1],
    )
    error = redis.ResponseError("stepbarrier: no")
    assert arrival_reply([recorded, [1, b"6"], [1, b"7"]]) == [1, b"7"]  # the last
    assert arrival_reply([recorded, other, [1, b"7"]]) is other  # the first refusal
    assert arrival_reply([recorded, error, recorded]) is error


def _arrival() -> dict[str, Any]:
    return {
        "barrier": "b",
        "index": "i",
        "epoch": "e",
        "member": "m",
        "task_id": 0,
        "parties": 3000,
        "key_ttl": 60,
        "channel": "c",
        "publish_command": "PUBLISH",
        "run_id": "",
        "max_indexed": 1000,
        "arrived_under": "",
    }


# What may run long only reads: FUNCTION KILL ends it, and nothing was written


def plant_barrier(client: redis.Redis, key: str, parties: int, arrived: int, epoch: str) -> None:
    """A barrier of ``parties`` in ``epoch`` with tasks ``0..arrived-1`` arrived, as a
    worker may write it directly."""
    client.hset(key, mapping={"parties": str(parties), "arrived": "0", "epoch": epoch})
    for first in range(0, arrived, 10_000):
        last = min(first + 10_000, arrived)
        client.hset(key, mapping={f"t{i}": "1700000000000" for i in range(first, last)})


def killed(roles: Roles, call: Callable[[], object]) -> str | None:
    """Run ``call`` in a thread and end it with the emergency user's FUNCTION KILL once
    Redis says it runs long; the call's error, or ``None`` if it ended first."""
    outcome: dict[str, str] = {}

    def run() -> None:
        try:
            call()
        except redis.ResponseError as error:
            outcome["error"] = str(error)

    emergency = roles.client("emergency")
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    try:
        while thread.is_alive():
            try:
                emergency.function_kill()
                break
            except redis.ResponseError as error:
                if "NOTBUSY" not in str(error):  # not running yet, or any more
                    raise
        thread.join(60)
        assert not thread.is_alive()
        assert emergency.ping()
    finally:
        emergency.close()
    return outcome.get("error")


@pytest.fixture
def busy_soon(roles: Roles) -> Iterator[None]:
    """Redis turns BUSY (and takes FUNCTION KILL) after 1 ms of a call, not 1 s."""
    saved = str(roles.admin.config_get("busy-reply-threshold")["busy-reply-threshold"])
    roles.admin.config_set("busy-reply-threshold", 1)
    try:
        yield
    finally:
        roles.admin.config_set("busy-reply-threshold", saved)


def test_a_read_of_the_largest_barrier_only_reads_and_function_kill_ends_it(
    roles: Roles, busy_soon: None
) -> None:
    keys = job_keys()
    worker = roles.client("worker")
    try:
        plant_barrier(worker, keys.barrier("big"), MAX_PARTIES, MAX_PARTIES, "1")
        for _ in range(KILL_TRIES):
            error = killed(
                roles,
                lambda: worker.fcall_ro(
                    function_name("waiter_read"), 2, keys.barrier("big"), keys.reset
                ),
            )
            if error is not None:
                break
        assert error is not None and "killed" in error.lower(), error
    finally:
        worker.close()
        roles.admin.unlink(keys.barrier("big"))


def test_an_arrival_counting_the_largest_barrier_is_ended_before_it_writes(
    roles: Roles, busy_soon: None
) -> None:
    """A worker's planted fields bring the arrivals' upper bound to the parties, so an
    arrival counts every task field: a read of ``MAX_PARTIES`` fields, before any
    write, that FUNCTION KILL ends with nothing written."""
    keys = job_keys()
    barrier = [keys.barrier("big"), keys.barrier_index, keys.barrier_epoch]
    worker = roles.client("worker")
    try:
        fixed = ["big", 0, MAX_PARTIES, 60, keys.barrier_channel, "PUBLISH", "", 1000, ""]
        epoch = worker.fcall(function_name("barrier_arrive"), 3, *barrier, *fixed)[6].decode()
        plant_barrier(worker, keys.barrier("big"), MAX_PARTIES, MAX_PARTIES - KILL_TRIES, epoch)
        # fields that are no arrival bring the upper bound to the parties from the first try
        worker.hset(keys.barrier("big"), mapping={f"x{i}": "1" for i in range(KILL_TRIES + 10)})
        roles.admin.expire(keys.barrier_epoch, 3600)
        roles.admin.unlink(keys.barrier_index)
        length = roles.admin.hlen(keys.barrier("big"))
        for task in range(MAX_PARTIES - KILL_TRIES, MAX_PARTIES):
            arrive = [
                "big",
                task,
                MAX_PARTIES,
                60,
                keys.barrier_channel,
                "PUBLISH",
                "",
                1000,
                epoch,
            ]

            def call(arrive: list[Any] = arrive) -> object:
                return worker.fcall(function_name("barrier_arrive"), 3, *barrier, *arrive)

            error = killed(roles, call)
            if error is not None:
                break
            length = roles.admin.hlen(keys.barrier("big"))  # it ran through: it wrote
            roles.admin.expire(keys.barrier_epoch, 3600)
            roles.admin.unlink(keys.barrier_index)
        assert error is not None and "killed" in error.lower(), error
        assert not roles.admin.hexists(keys.barrier("big"), f"t{task}")
        assert roles.admin.hlen(keys.barrier("big")) == length
        assert roles.admin.ttl(keys.barrier_epoch) > 60
        assert not roles.admin.exists(keys.barrier_index)
    finally:
        worker.close()
        roles.admin.unlink(*barrier)


# Completion follows from the arrivals against the caller's own parties


def test_a_workers_forged_counts_and_fields_do_not_complete_a_barrier(roles: Roles) -> None:
    job = f"forged-{uuid.uuid4().hex[:8]}"
    chief = roles.config("worker", job, 0)
    keys = chief.keys
    assert not Barrier(chief, "start", 4).arrive(wait=False)
    attacker = roles.client("worker")
    try:
        # counts, a completion mark, fields that are no task's arrival (another
        # name, a task beyond the parties, a task field with no time in it)
        attacker.hset(
            keys.barrier("start"),
            mapping={
                "arrived": "4",
                "completed_ms": "1700000000000",
                "x1": "1",
                "x2": "1",
                "t7": "1700000000000",
                "t2": "soon",
            },
        )
    finally:
        attacker.close()
    assert not Barrier(as_task(chief, 1), "start", 4).arrive(wait=False)
    state = Barrier(chief, "start", 4).read()
    assert state is not None and not state.complete and state.missing == (2, 3)
    assert roles.admin.hget(keys.barrier("start"), "arrived") == b"2"  # counted, not taken
    with pytest.raises(BarrierTimeout) as info:
        Barrier(chief, "start", 4).arrive(timeout=2)
    assert info.value.missing == (2, 3)
    # the real arrivals still complete it
    assert not Barrier(as_task(chief, 2), "start", 4).arrive(wait=False)
    assert Barrier(as_task(chief, 3), "start", 4).arrive(wait=False)
    assert Barrier(chief, "start", 4).arrive(timeout=10)


def test_a_forged_number_of_parties_completes_nothing(roles: Roles) -> None:
    job = f"forged-{uuid.uuid4().hex[:8]}"
    chief = roles.config("worker", job, 0)
    keys = chief.keys
    assert not Barrier(chief, "end", 4).arrive(wait=False)
    attacker = roles.client("worker")
    try:
        attacker.hset(keys.barrier("end"), mapping={"parties": "1", "arrived": "1"})
        # an arrival counts against its own parties: the stored 1 is another barrier's
        with pytest.raises(ConfigurationError, match="begun with 1 parties"):
            Barrier(as_task(chief, 1), "end", 4).arrive(wait=False)
        assert not roles.admin.hexists(keys.barrier("end"), "t1")
        # a party reading with its own number of parties finds task 0 alone
        reply = attacker.fcall_ro(function_name("waiter_read"), 2, keys.barrier("end"), keys.reset)
    finally:
        attacker.close()
    state = state_from_read("end", list(reply), parties=4)
    assert state is not None and not state.complete and state.missing == (1, 2, 3)


def test_a_waiting_party_is_not_released_by_a_forged_number_of_parties(roles: Roles) -> None:
    """A waiting task counts the arrivals against its own parties: a worker's
    ``parties=1`` and a forged announcement release nobody."""
    job = f"forged-{uuid.uuid4().hex[:8]}"
    chief = roles.config("worker", job, 0)
    keys = chief.keys
    waiting = Waiting(chief, "end", 4, timeout=8)
    eventually(subscribed(roles.admin, keys.barrier_channel))
    eventually(lambda: bool(roles.admin.hexists(keys.barrier("end"), "t0")))
    attacker = roles.client("worker")
    try:
        attacker.hset(keys.barrier("end"), mapping={"parties": "1", "arrived": "1"})
        attacker.publish(keys.barrier_channel, '{"barrier":"end","complete":true}')
    finally:
        attacker.close()
    waiting.join()
    assert isinstance(waiting.error, BarrierTimeout), (waiting.result, waiting.error)
    assert waiting.error.missing == (1, 2, 3)
    # a read with the party's own number finds task 0 alone as well
    state = Barrier(chief, "end", 4).read()
    assert state is not None and not state.complete and state.missing == (1, 2, 3)
