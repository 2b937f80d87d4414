"""Issue 34, item 2: one variadic write stalls a shared Redis.

Redis bounds neither how many arguments one command has nor, through ACLs,
which of a user's commands come through the library: ACLs grant commands, not
their arity, and the library's functions run their writes as the calling
user. The docs, the roles' comments and ``redis.conf`` say so; these tests keep
it true on ``ops/redis/start-redis.sh`` with the shipped ``redis.conf``:

- ``client-query-buffer-limit`` (1mb) closes a client whose *unparsed* input
  passes it (one argument of 2 MB), and takes a worker's ``ZADD`` of 100,000
  members (about 3 MB of input) as one command: it bounds no command's
  arguments, so it is not what bounds a role's variadic writes;
- the variadic writes the chief and the worker hold cannot be withheld: a user
  with the role's rules but one of them is refused an operation of the role.
  Should the library stop needing one, its case here fails: then take it out
  of the role (``stepbarrier/_protocol/roles.py``), and add a case that the
  role's direct write of it is refused.

Nothing is timed: what Redis answers, and what its SLOWLOG recorded.
"""

from __future__ import annotations

import secrets
import uuid
from collections.abc import Iterator

import pytest
import redis

from stepbarrier import BarrierConfig, RedisRefused, StepWaiter
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.roles import WORKER_BOUNDED, acl_line, password_hash, role_rules
from tests.ops_redis import (
    HARNESS_LINE,
    HARNESS_PASSWORD,
    HARNESS_USER,
    PASSWORDS,
    OpsRedis,
    acl_with,
)
from tests.security.test_acl_roles import RUN, seed

MEMBERS = 100_000
"""Members of the worker's one ZADD: about 3 MB of input, three times the limit."""

NEEDED = [
    # (role, variadic write, an operation of the role that runs it in the library)
    ("worker", "hset", "wait"),  # waiter_register: the waiter's entry
    ("worker", "rpush", "wait"),  # waiter_register: the registrations list
    ("worker", "unlink", "wait-over-stale"),  # waiter_register: a stale entry
    ("worker", "zadd", "arrive"),  # barrier_arrive: the barrier index
    ("chief", "hset", "publish"),  # publish_step: the state
    ("chief", "unlink", "publish"),
    ("chief", "zadd", "arrive"),
]
"""Each variadic write a role holds, and what it is refused without it."""


def run_wait_over_stale(config: BarrierConfig) -> None:
    """A wait whose registry entry key holds a list (planted by a worker, or an older
    release's): its registration replaces it, with UNLINK."""
    waiter = StepWaiter(config)
    waiter._ids.append("stale")  # the id of its next wait
    client = redis.Redis.from_url(
        config.redis_url, username=config.redis_username, password=config.redis_password
    )
    try:
        client.rpush(config.keys.waiter("stale"), "x")
        waiter.wait(1, timeout=5)
    finally:
        waiter.close()
        client.close()


OPERATIONS = {**RUN, "wait-over-stale": run_wait_over_stale}

PASSWORD = secrets.token_hex(32)


def without(role: str, command: str) -> str:
    return f"{role}-without-{command}"


def stripped_line(role: str, command: str) -> str:
    """The role's users.acl line, for a user of its own, without ``+command``."""
    line = acl_line(without(role, command), role, "*", password_hash(PASSWORD))
    words = line.split(" ")
    assert f"+{command}" in words, (role, command)
    return " ".join(word for word in words if word != f"+{command}")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRedis]:
    lines = [HARNESS_LINE, *(stripped_line(role, command) for role, command, _ in NEEDED)]
    started = OpsRedis(acl_file=acl_with(tmp_path_factory.mktemp("acl"), *lines))
    started.start()
    try:
        yield started
    finally:
        started.cleanup()


def harness(server: OpsRedis) -> redis.Redis:
    return server.client(username=HARNESS_USER, password=HARNESS_PASSWORD)


def test_the_query_buffer_limit_closes_a_long_argument_but_not_many_arguments(
    server: OpsRedis,
) -> None:
    admin = harness(server)
    worker = server.as_user("worker")
    keys = JobKeys.for_job(f"variadic-{uuid.uuid4().hex[:8]}")
    try:
        assert admin.config_get("client-query-buffer-limit") == {
            "client-query-buffer-limit": str(1024 * 1024)
        }
        # one argument of 2 MB: unparsed input past the limit, the client is closed
        with pytest.raises(redis.ConnectionError):
            worker.hset(keys.waiter("w"), "field", "v" * (2 * 1024 * 1024))
        assert admin.exists(keys.waiter("w")) == 0

        # 100,000 members in one ZADD, as the worker may send it directly: accepted
        admin.config_set("slowlog-log-slower-than", 0)
        admin.slowlog_reset()
        members = {f"member-{i:08d}": i for i in range(MEMBERS)}
        assert sum(len(m) + len(str(s)) + 16 for m, s in members.items()) > 3 * 1024 * 1024
        assert worker.zadd(keys.targets, members) == MEMBERS
        assert admin.zcard(keys.targets) == MEMBERS
        # ... and run as one command (SLOWLOG keeps 32 arguments and counts the rest)
        entries = [
            entry["command"]
            for entry in admin.slowlog_get(128)
            if entry["command"].startswith(b"ZADD " + keys.targets.encode())
        ]
        assert len(entries) == 1, entries
        more = 2 * MEMBERS + 2 - 32 + 1  # the last of the 32 slots says how many more
        assert entries[0].endswith(f"... ({more} more arguments)".encode()), entries[0][-60:]
    finally:
        admin.config_set("slowlog-log-slower-than", 10_000)
        admin.unlink(keys.targets)
        admin.close()
        worker.close()


def test_the_worker_holds_variadic_writes() -> None:
    """What the docs say the worker holds, and cannot be denied: the rules grant
    these commands with no bound on their arguments."""
    granted = set(role_rules("worker", "*").split())
    for command in ("hset", "zadd", "rpush", "unlink", "zrem"):
        assert f"+{command}" in granted and command in WORKER_BOUNDED, command


@pytest.mark.parametrize(("role", "command", "operation"), NEEDED)
def test_a_role_without_a_variadic_write_is_refused_its_operations(
    server: OpsRedis, job: str, role: str, command: str, operation: str
) -> None:
    """The library's functions run the write as the caller: the role must hold it,
    and so may send it directly with any number of arguments."""
    seed(server, job)  # a step 3 pinned for run "acl-roles": a permitted wait returns at once

    def as_user(user: str, password: str) -> BarrierConfig:
        return BarrierConfig(
            job=job,
            redis_url=server.url,
            redis_username=user,
            redis_password=password,
            heartbeat=0.2,
            run_id="acl-roles",
        )

    OPERATIONS[operation](as_user(role, PASSWORDS[role]))  # the role as shipped does it
    with pytest.raises(RedisRefused) as info:
        OPERATIONS[operation](as_user(without(role, command), PASSWORD))
    assert info.value.kind == "permission", str(info.value)
