"""Issue 34, its last part: what Redis does not bound by size, bounded by the library.

Each test attacks as the review did, on the session's real redis-server, and
measures the defence by what Redis itself counted (``INFO commandstats`` calls,
``INFO stats`` output bytes), never by wall-clock time:

- a barrier of ``MAX_PARTIES`` with all but one arrived: a waiting party's read
  costs a constant handful of commands, not one per party; a forged field count
  costs the full read, and never completes the barrier;
- fifty 1 MB members planted in a job's targets index, five in its barrier index
  (a worker's password may ZADD them): ``status``, ``status --json``, the listing and the exporter's
  collection make Redis send kilobytes, not the 50 MB, and say what was skipped;
- a hundred 1 MB job names of team B: team A's listing (``teamA-*``) gets none
  of them (its MATCH fails at the first byte that differs), where the all-jobs
  MATCH sends them all (what docs/reliability-security.md states).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest
import redis
from click.testing import CliRunner

from stepbarrier import Barrier, BarrierConfig, StepPublisher
from stepbarrier._inspect.listing import SCAN_COUNT, list_jobs
from stepbarrier._inspect.status import read_status
from stepbarrier._protocol.barrier_record import MAX_PARTIES, state_from_read
from stepbarrier._protocol.calls import read_call
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.functions import RedisCode
from stepbarrier.cli import cli
from stepbarrier.cli._exporter import JobsCollector
from stepbarrier.errors import BarrierTimeout
from tests.redis_harness import RedisServer

PARTIES = MAX_PARTIES
READ_COMMANDS = 24
"""Most commands one O(1) read of a barrier runs (TYPE, HLEN, HSTRLEN and HMGET of
its own fields, the caller's task field, the marker and the clock)."""


def calls(admin: redis.Redis) -> dict[str, int]:
    """Calls per command since the last CONFIG RESETSTAT."""
    stats = admin.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


def hash_commands(admin: redis.Redis) -> int:
    counted = calls(admin)
    return sum(counted.get(name, 0) for name in ("hstrlen", "hmget", "hlen", "type"))


def all_but_one(config: BarrierConfig, client: redis.Redis) -> str:
    """A barrier of ``PARTIES`` where every task but the last has arrived."""
    Barrier(config, "wide", PARTIES).arrive(wait=False)
    key = config.keys.barrier("wide")
    for first in range(1, PARTIES - 1, 2000):
        client.hset(
            key, mapping={f"t{t}": "1" for t in range(first, min(first + 2000, PARTIES - 1))}
        )
    return key


def test_a_partys_read_costs_a_constant_until_the_arrivals_may_be_complete(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(task_id=0)
    key = all_but_one(config, client)
    code = RedisCode(client, config)
    client.config_resetstat()
    full = code.call(*read_call(key, config.keys.reset))
    whole = hash_commands(client)
    assert whole >= PARTIES  # a read of every arrival: one HSTRLEN per party
    client.config_resetstat()
    for _ in range(10):
        reply = list(code.call(*read_call(key, config.keys.reset, party=(PARTIES, 0))))
    assert hash_commands(client) <= 10 * READ_COMMANDS  # constant per read
    assert reply[2] == b"counted" and len(reply) < 40 < len(full)
    state = state_from_read("wide", reply, parties=PARTIES)
    assert state is not None and state.counted == PARTIES - 1 and not state.complete

    # a forged field count: the full read, bounded by MAX_PARTIES, and never early
    client.hset(key, mapping={"forged-1": "1", "forged-2": "1"})
    client.config_resetstat()
    reply = list(code.call(*read_call(key, config.keys.reset, party=(PARTIES, 0))))
    assert reply[2] == b"hash" and PARTIES <= hash_commands(client) <= PARTIES + READ_COMMANDS
    state = state_from_read("wide", reply, parties=PARTIES)
    assert state is not None and not state.complete and state.missing == (PARTIES - 1,)
    client.hset(key, "arrived", str(PARTIES))  # a forged counter: nothing either
    reply = list(code.call(*read_call(key, config.keys.reset, party=(PARTIES, 0))))
    state = state_from_read("wide", reply, parties=PARTIES)
    assert state is not None and not state.complete


def test_a_waiting_party_reads_every_arrival_only_when_it_learns_something(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(task_id=0, fallback_interval=0.05, stall_timeout=30.0)
    all_but_one(config, client)
    client.config_resetstat()
    with pytest.raises(BarrierTimeout) as info:
        Barrier(dataclasses.replace(config, task_id=1), "wide", PARTIES).arrive(timeout=1.5)
    assert info.value.missing == (PARTIES - 1,)  # the last chance reads every arrival
    reads = calls(client).get("fcall_ro", 0)
    assert reads >= 10
    # the read that learns the arrivals and the last chance's: two whole reads, not one
    # per read (the review's O(parties) per read, O(parties^2) in all)
    assert hash_commands(client) <= 2 * PARTIES + reads * READ_COMMANDS + 200


MEGABYTE_MEMBERS = 50
SENT_LIMIT = 200_000
"""Most bytes Redis may send for one operator's read of the planted job (the planted
members alone are 50 MB)."""


def sent(admin: redis.Redis) -> int:
    return int(admin.info("stats")["total_net_output_bytes"])


def test_megabyte_index_members_are_counted_never_sent(
    make_config: Callable[..., BarrierConfig], client: redis.Redis, redis_server: RedisServer
) -> None:
    config = make_config(heartbeat=0.2)
    with StepPublisher(config) as chief:
        chief.publish(5)
        chief.flush()
        for i in range(MEGABYTE_MEMBERS):  # as a worker's password may: ZADD
            client.zadd(config.keys.targets, {f"{i:02d}".encode() + b"x" * 1_000_000: 10})
        client.zadd(config.keys.targets, {"honest": 9})
        for i in range(5):  # and the barrier index, which a worker writes too
            client.zadd(config.keys.barrier_index, {f"{i}".encode() + b"y" * 1_000_000: 1})
        reads = {
            "status": lambda: read_status(config),
            "listing": lambda: list_jobs(config, pattern=config.job),
            "exporter": lambda: list(
                JobsCollector(config, patterns=(config.job,), min_interval=0.0).collect()
            ),
            "status --json": lambda: CliRunner().invoke(
                cli, ["status", "--json", "--redis-url", redis_server.url, "--job", config.job]
            ),
        }
        for what, read in reads.items():
            before = sent(client)
            outcome = read()
            assert sent(client) - before < SENT_LIMIT, what
            if what == "status":
                problems = " ".join(outcome.problems)
                assert f"waiter index: {MEGABYTE_MEMBERS} oversized member(s)" in problems
                assert "the barrier index: 5 oversized member(s)" in problems
            if what == "status --json":
                assert "oversized member(s)" in outcome.output, outcome.output[-2000:]


def scan_walk(admin: redis.Redis, match: str) -> tuple[int, int]:
    """(keys returned, bytes Redis sent) of one walk with the listing's COUNT."""
    before, cursor, returned = sent(admin), 0, 0
    while True:
        cursor, keys = admin.scan(cursor, match=match, count=SCAN_COUNT)
        returned += len(keys)
        if cursor == 0:
            return returned, sent(admin) - before


def test_another_teams_megabyte_job_names_never_reach_a_teams_listing(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config()
    huge = [JobKeys.for_job(f"{config.job}-b-{i:03d}" + "b" * 1_000_000).state for i in range(100)]
    try:
        for key in huge:  # as team B's chief may (its keys' pattern allows any length)
            client.hset(key, "step", "1")
        team_found, team_sent = scan_walk(client, JobKeys.for_job(f"{config.job}-a-*").state)
        all_found, all_sent = scan_walk(client, JobKeys.for_job("*").state)
        # the team's MATCH fails at the first byte that differs: none of them is sent
        assert team_found == 0 and team_sent < SENT_LIMIT
        assert all_found >= 100 and all_sent > 100_000_000  # the all-jobs MATCH: every one
        before = sent(client)
        assert list_jobs(config, pattern=f"{config.job}-a-*").jobs == ()
        assert sent(client) - before < SENT_LIMIT
    finally:
        client.delete(*huge)
