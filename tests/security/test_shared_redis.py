"""Issue 23 on the shipped configuration: two teams share one Redis.

The server is ``ops/redis/start-redis.sh`` with ``ops/redis/redis.conf`` and the
shipped ``users.acl``, plus per-team users made by the ``stepbarrier acl``
command (team A's and team B's chief, worker and monitor, confined to
``team-a-*`` and ``team-b-*``), and an all-powerful harness user that reads
``SLOWLOG``. Team A's worker attacks with what its own password allows; the
defences are checked by what Redis itself measured, never by wall-clock time:

- every command a worker may run costs O(1), O(log N) or O(its arguments)
  whatever it wrote before: the costly ones (range reads and removals,
  ``HGETALL``, ``DEL``, ``SORT``, scans, ...) are refused, and what it may run
  on the keys it flooded (``UNLINK``, ``LTRIM``, ``EXPIRE``, the library's
  functions) is short under the shipped ``redis.conf`` (lazy freeing);
- team B's chief keeps publishing meanwhile, every command of it short;
- every key the library writes for a worker has a TTL and a bounded size.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from stepbarrier import Barrier, BarrierConfig, StepPublisher, StepWaiter, read_status
from stepbarrier._protocol.roles import WORKER_BOUNDED, role_rules
from stepbarrier._redis.functions import function_name
from stepbarrier.errors import BarrierTimeout
from tests.ops_redis import HARNESS_LINE, HARNESS_PASSWORD, HARNESS_USER, OpsRedis, acl_with

LIMIT_US = 50_000
"""Longest any command may run while the attack goes on, as SLOWLOG measures it."""
BIG = 200_000
"""Members, fields or entries of each key the attacker floods."""
CHUNK = 2_000
"""Entries per command the attacker writes with (each command O(its arguments))."""
TEAMS = ("team-a", "team-b")
ROLES = ("chief", "worker", "monitor")

COSTLY = [
    ("HGETALL", "waiter"),
    ("HKEYS", "waiter"),
    ("HVALS", "waiter"),
    ("HSCAN", "waiter", "0", "COUNT", "1000000"),
    ("HRANDFIELD", "waiter", "-1000000"),
    ("ZRANGEBYSCORE", "targets", "-inf", "+inf"),
    ("ZRANGE", "targets", "0", "-1"),
    ("ZREVRANGE", "targets", "0", "-1"),
    ("ZREMRANGEBYRANK", "targets", "0", "-1"),
    ("ZREMRANGEBYSCORE", "barrier-index", "-inf", "+inf"),
    ("ZPOPMIN", "targets", "1000000"),
    ("ZSCAN", "targets", "0", "COUNT", "1000000"),
    ("ZRANGESTORE", "targets", "targets", "0", "-1"),
    ("ZUNIONSTORE", "targets", "1", "targets"),
    ("SORT", "registrations"),
    ("LRANGE", "registrations", "0", "-1"),
    ("LPOS", "registrations", "nothing", "MAXLEN", "0"),
    ("DEL", "waiter"),
    ("DUMP", "waiter"),
    ("COPY", "waiter", "waiter-copy"),
    ("SCAN", "0", "COUNT", "1000000"),
    ("KEYS", "*"),
    ("EVAL", "return 1", "0"),
    ("FUNCTION", "LOAD", "#!lua name=x\nredis.register_function('x', function() end)"),
]
"""Commands whose cost grows with the data (or that run code), each with the
attacker's flooded key it would run on: a worker may run none of them."""


class Teams:
    """The server, its harness client and each team's users."""

    def __init__(self, server: OpsRedis, passwords: dict[str, str]) -> None:
        self.server = server
        self.passwords = passwords
        self.admin = server.client(username=HARNESS_USER, password=HARNESS_PASSWORD)

    def user(self, team: str, role: str) -> str:
        return f"{team}-{role}"

    def client(self, team: str, role: str) -> redis.Redis:
        user = self.user(team, role)
        return self.server.client(username=user, password=self.passwords[user])

    def config(self, team: str, role: str, job: str, **extra: Any) -> BarrierConfig:
        user = self.user(team, role)
        settings: dict[str, Any] = {"heartbeat": 0.2, "stall_timeout": 30.0, **extra}
        return BarrierConfig(
            job=job,
            redis_url=self.server.url,
            redis_username=user,
            redis_password=self.passwords[user],
            **settings,
        )

    def slowest(self, since_reset: bool = True) -> list[tuple[int, str]]:
        """Every logged command of LIMIT_US or more: (us, the command's start)."""
        slow = []
        for entry in self.admin.slowlog_get(200_000):
            raw = entry["command"]
            words = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            if entry["duration"] >= LIMIT_US and not words.upper().startswith("SLOWLOG"):
                slow.append((int(entry["duration"]), words[:100]))
        return slow


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Teams]:
    directory = tmp_path_factory.mktemp("teams")
    lines, passwords = [], {}
    for team in TEAMS:
        for role in ROLES:
            user = f"{team}-{role}"
            password = uuid.uuid4().hex
            secret = directory / f"{user}.password"
            secret.write_text(password + "\n")
            secret.chmod(0o600)
            # the line as a user makes it: the stepbarrier command
            made = subprocess.run(
                [
                    sys.executable,
                    "-m",
                    "stepbarrier",
                    "acl",
                    role,
                    "--user",
                    user,
                    "--jobs",
                    f"{team}-*",
                    "--password-file",
                    str(secret),
                ],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert made.returncode == 0, made.stderr
            assert password not in made.stdout
            lines.append(made.stdout.strip())
            passwords[user] = password
    server = OpsRedis(acl_file=acl_with(directory, *lines, HARNESS_LINE))
    server.start()
    found = Teams(server, passwords)
    found.admin.config_set("slowlog-max-len", 200_000)
    found.admin.config_set("slowlog-log-slower-than", 0)
    yield found
    found.admin.close()
    server.cleanup()


def job_of(team: str) -> str:
    return f"{team}-{uuid.uuid4().hex[:8]}"


def flood(teams: Teams, job: str) -> dict[str, str]:
    """Team A's worker fills every key of its job it may write, directly."""
    keys = teams.config("team-a", "worker", job).keys
    worker = teams.client("team-a", "worker")
    named = {
        "waiter": keys.waiter("flood"),
        "targets": keys.targets,
        "barrier-index": keys.barrier_index,
        "registrations": keys.registrations,
        "barrier": keys.barrier("flood"),
        "waiter-copy": keys.waiter("copy"),
    }
    for first in range(0, BIG, CHUNK):
        chunk = range(first, first + CHUNK)
        worker.hset(named["waiter"], mapping={f"f{i}": "x" for i in chunk})
        worker.hset(named["barrier"], mapping={f"t{i}": "1" for i in chunk})
        worker.zadd(named["targets"], {f"m{i}": i for i in chunk})
        worker.zadd(named["barrier-index"], {f"b{i}": 1 for i in chunk})
        worker.rpush(named["registrations"], *chunk)
    worker.close()
    return named


def test_a_worker_may_run_only_commands_of_bounded_cost() -> None:
    rules = role_rules("worker", "team-a-*").replace("(", " ").replace(")", " ").split()
    granted = {word[1:] for word in rules if word.startswith("+")}
    assert "-@all" in rules
    assert granted == WORKER_BOUNDED
    costly = {command.lower() for command, *_ in COSTLY}
    assert not granted & costly
    for role in ROLES:  # no role reads a whole hash, deletes eagerly or runs code
        words = set(role_rules(role, "*").split())
        assert not words & {"+hgetall", "+del", "+eval", "+evalsha", "+keys", "+@all"}


def test_a_worker_is_refused_every_costly_command_on_the_keys_it_flooded(teams: Teams) -> None:
    job = job_of("team-a")
    named = flood(teams, job)
    worker = teams.client("team-a", "worker")
    allowed = []
    for command, *arguments in COSTLY:
        resolved = [named.get(word, word) for word in arguments]
        try:
            worker.execute_command(command, *resolved)
        except redis.exceptions.NoPermissionError:
            continue
        allowed.append(command)
    assert not allowed, f"a worker may run costly commands: {allowed}"
    assert teams.admin.hlen(named["waiter"]) == BIG  # nothing was read or removed
    worker.close()
    teams.admin.unlink(*named.values())


def test_what_a_worker_may_run_on_its_flooded_keys_stays_short(teams: Teams) -> None:
    job = job_of("team-a")
    keys = teams.config("team-a", "worker", job).keys
    worker = teams.client("team-a", "worker")
    named = flood(teams, job)
    teams.admin.slowlog_reset()
    # the library's own functions on the flooded keys
    reply = worker.fcall_ro(function_name("waiter_read"), 2, named["barrier"], keys.reset)
    assert reply[2] == b"oversized"
    assert not Barrier(teams.config("team-a", "worker", job, task_id=1), "flood", 2).arrive(
        wait=False
    )
    assert teams.admin.zcard(keys.barrier_index) == 1  # dropped whole, then this arrival
    # what it may run directly: freeing is lazy (shipped redis.conf)
    assert teams.slowest() == []
    named = flood(teams, job)
    teams.admin.slowlog_reset()
    worker.ltrim(named["registrations"], 1, 0)
    worker.unlink(named["waiter"])
    worker.expire(named["targets"], 0)
    worker.zrem(named["barrier-index"], *(f"b{i}" for i in range(1000)))
    worker.hset(named["barrier"], mapping={f"t{i}": "2" for i in range(CHUNK)})
    assert teams.slowest() == []
    worker.close()
    teams.admin.unlink(*named.values())


def test_team_bs_chief_keeps_publishing_while_team_as_worker_attacks(teams: Teams) -> None:
    attacked, other = job_of("team-a"), job_of("team-b")
    keys = teams.config("team-a", "worker", attacked).keys
    named = flood(teams, attacked)
    stop = threading.Event()
    rounds: list[int] = []
    errors: list[BaseException] = []

    def attack() -> None:
        worker = teams.client("team-a", "worker")
        try:
            while not stop.is_set():
                worker.fcall_ro(function_name("waiter_read"), 2, named["waiter"], keys.reset)
                worker.fcall(
                    function_name("waiter_register"),
                    3,
                    keys.waiter("w"),
                    keys.targets,
                    keys.registrations,
                    30,
                    60,
                    "w",
                    9,
                    "wait_until_step",
                    "9",
                )
                worker.zadd(keys.targets, {f"n{i}": i for i in range(CHUNK)})
                worker.rpush(keys.registrations, *range(CHUNK))
                rounds.append(1)
        except BaseException as error:
            errors.append(error)
        finally:
            worker.close()

    teams.admin.slowlog_reset()
    thread = threading.Thread(target=attack)
    thread.start()
    try:
        with StepPublisher(teams.config("team-b", "chief", other)) as chief:
            for step in range(1, 11):
                chief.publish(step)
                assert chief.flush(10.0), chief.last_failure
    finally:
        stop.set()
        thread.join(30)
    assert not errors, errors
    assert rounds, "the attack did not run"
    assert read_status(teams.config("team-b", "monitor", other)).step == 10
    assert teams.slowest() == []
    teams.admin.unlink(*named.values(), keys.waiter("w"))


def test_a_workers_keys_all_expire_and_stay_small(teams: Teams) -> None:
    job = job_of("team-a")
    config = teams.config("team-a", "worker", job, task_id=1)
    with pytest.raises(BarrierTimeout):
        StepWaiter(config).wait(5, timeout=1.0)  # registers, then gives up
    assert not Barrier(config, "start", 3).arrive(wait=False)
    keys = sorted(teams.admin.scan_iter(match=f"stepbarrier:{{{job}}}:*", count=1000))
    assert len(keys) >= 3, keys  # the barrier, its index and its epoch at least
    for key in keys:
        ttl = teams.admin.ttl(key)
        assert 0 < ttl <= config.key_ttl, (key, ttl)
        usage = teams.admin.memory_usage(key)
        assert usage is not None and usage < 16_384, (key, usage)
    teams.admin.unlink(*keys)


def test_cross_team_keys_and_channels_stay_closed(teams: Teams) -> None:
    other = job_of("team-b")
    keys = teams.config("team-b", "chief", other).keys
    worker = teams.client("team-a", "worker")
    for command in (
        ("HSET", keys.waiter("x"), "step", "1"),
        ("ZADD", keys.targets, "1", "x"),
        ("FCALL_RO", function_name("waiter_read"), "2", keys.state, keys.reset),
        ("PUBLISH", keys.barrier_channel, "{}"),
    ):
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.execute_command(*command)
    worker.close()
