"""Issue 34, items 3 and 5: the operators' reads on a Redis that several teams share.

The server is ``ops/redis/start-redis.sh`` with ``ops/redis/redis.conf`` and the
shipped ``users.acl`` (its all-jobs ``monitor``), plus team A's and team B's
chief, worker and monitor made by the ``stepbarrier acl`` command, and an
all-powerful harness user that reads ``SLOWLOG`` and ``INFO``. Each test
attacks as the review did, with the attacker's own credentials where a role
did it, and checks the defence by what Redis itself measured (``SLOWLOG``
durations, ``INFO commandstats`` counts), never by wall-clock time:

- team A's worker plants ten 100,000-party barriers (within the library's
  limits): ``status``, ``watch``'s reads and ``status --json`` stay short, every
  command of them (and of team B's chief meanwhile) under ``LIMIT_US``;
- Redis busy with a script answers BUSY: ``status``, ``watch``, ``jobs`` say so
  (exit 8), never "unreachable" (exit 5), and the exporter serves
  ``stepbarrier_redis_busy 1``;
- team B's chief plants 100,000 tiny job states: team A's live job is in every
  listing and every scrape of the exporter given the teams' patterns, the
  truncation of team B's shows (a metric, a line, a JSON field), and a scrape's
  work is bounded.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from stepbarrier import Barrier, BarrierConfig, StepPublisher
from stepbarrier._inspect import status as status_module
from stepbarrier._inspect.listing import MAX_JOBS, SCAN_COUNT, list_jobs
from stepbarrier._inspect.status import TASKS_CHECKED, OpenBarrier, fair_shares, read_status
from stepbarrier._inspect.summary import read_overview
from stepbarrier._protocol.barrier_record import MAX_PARTIES
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.failures import RedisBusy, translate
from stepbarrier.cli import cli
from stepbarrier.cli._commands.status import _outage_note
from stepbarrier.cli._context import EXIT_BUSY, EXIT_UNAVAILABLE, exit_code_for
from stepbarrier.cli._exporter import EXPORTED_JOBS, SCRAPE_SCAN_CALLS, JobsCollector, serve
from stepbarrier.cli._views.status import missing_tasks
from stepbarrier.errors import RedisUnavailable
from tests.observability import eventually, job_value, live_job, scrape
from tests.ops_redis import (
    HARNESS_LINE,
    HARNESS_PASSWORD,
    HARNESS_USER,
    PASSWORDS,
    OpsRedis,
    acl_with,
)

LIMIT_US = 500_000
"""Longest any command may run while the operators read, as SLOWLOG measures it: a
coarse guard, ten times under the review's stalls (4.5 to 5.5 s), because SLOWLOG
counts the time Redis was descheduled on a loaded machine too (a 2-field FCALL took
265 ms in a fresh clone's CI beside another suite). What bounds the work are the
commands themselves, asserted apart: their kinds and counts, no whole-barrier read."""
PLANTED_BARRIERS = 10
"""Barriers team A's worker plants (the review: eight stalled Redis for 5 s, ten made
other teams' commands fail with BUSY)."""
NOT_ARRIVED = (3, MAX_PARTIES - 1)
"""The tasks missing at each planted barrier: one among those checked, one past them."""
PLANTED_JOBS = 100_000
"""Tiny job states team B's chief plants (15 MB)."""
TEAMS = ("team-a", "team-b")
ROLES = ("chief", "worker", "monitor")


class Teams:
    """The server, its harness client and each team's users."""

    def __init__(self, server: OpsRedis, passwords: dict[str, str]) -> None:
        self.server = server
        self.passwords = passwords
        self.admin = self.harness()

    def harness(self, **extra: Any) -> redis.Redis:
        return self.server.client(username=HARNESS_USER, password=HARNESS_PASSWORD, **extra)

    def client(self, team: str, role: str) -> redis.Redis:
        user = f"{team}-{role}"
        return self.server.client(username=user, password=self.passwords[user])

    def config(self, team: str, role: str, job: str, **extra: Any) -> BarrierConfig:
        user = f"{team}-{role}"
        return self.as_user(user, self.passwords[user], job, **extra)

    def monitor(self, job: str = "any") -> BarrierConfig:
        """The shipped all-jobs monitor (ops/redis/users.acl), as the shared exporter runs."""
        return self.as_user("monitor", PASSWORDS["monitor"], job)

    def as_user(self, user: str, password: str, job: str, **extra: Any) -> BarrierConfig:
        settings: dict[str, Any] = {"heartbeat": 0.2, "stall_timeout": 30.0, **extra}
        return BarrierConfig(
            job=job,
            redis_url=self.server.url,
            redis_username=user,
            redis_password=password,
            **settings,
        )

    def env(self, user: str, password: str) -> dict[str, str]:
        return {"STEPBARRIER_REDIS_USERNAME": user, "STEPBARRIER_REDIS_PASSWORD": password}

    def slow(self) -> list[tuple[int, str]]:
        """Every logged command but SLOWLOG's own: (us, its first words)."""
        found = []
        for entry in self.admin.slowlog_get(200_000):
            raw = entry["command"]
            words = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
            if not words.upper().startswith("SLOWLOG"):
                found.append((int(entry["duration"]), words[:120]))
        return found

    def calls(self) -> dict[str, int]:
        """Calls per command since the last CONFIG RESETSTAT (INFO commandstats)."""
        stats = self.admin.info("commandstats")
        return {name.removeprefix("cmdstat_"): int(row["calls"]) for name, row in stats.items()}


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Teams]:
    found = start_teams(tmp_path_factory.mktemp("operator-reads"))
    found.admin.config_set("slowlog-max-len", 200_000)
    yield found
    found.admin.close()
    found.server.cleanup()


def start_teams(directory: Path, *server_args: str) -> Teams:
    """A shipped Redis (``server_args`` added) with each team's users, as ``stepbarrier
    acl`` prints them for ``team-a-*`` and ``team-b-*``, and the harness user."""
    lines, passwords = [], {}
    for team in TEAMS:
        for role in ROLES:
            user, password = f"{team}-{role}", uuid.uuid4().hex
            secret = directory / f"{user}.password"
            secret.write_text(password + "\n")
            secret.chmod(0o600)
            acl = ["acl", role, "--user", user, "--jobs", f"{team}-*"]
            made = subprocess.run(
                [sys.executable, "-m", "stepbarrier", *acl, "--password-file", str(secret)],
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert made.returncode == 0, made.stderr
            lines.append(made.stdout.strip())
            passwords[user] = password
    server = OpsRedis(acl_file=acl_with(directory, *lines, HARNESS_LINE))
    server.args += server_args
    server.start()
    return Teams(server, passwords)


def job_of(team: str) -> str:
    return f"{team}-{uuid.uuid4().hex[:8]}"


# Item 3: planted barriers turn status into a staller


def plant_barriers(teams: Teams, job: str) -> list[str]:
    """Team A's worker begins ``PLANTED_BARRIERS`` barriers of ``MAX_PARTIES`` parties
    (through the library, as task 0) and arrives for every task but ``NOT_ARRIVED``
    (directly: it may write the barrier keys)."""
    config = teams.config("team-a", "worker", job, task_id=0)
    worker = teams.client("team-a", "worker")
    names = [f"planted-{number}" for number in range(PLANTED_BARRIERS)]
    for name in names:
        assert not Barrier(config, name, MAX_PARTIES).arrive(wait=False)
        key = config.keys.barrier(name)
        for first in range(1, MAX_PARTIES, 10_000):
            tasks = range(first, min(first + 10_000, MAX_PARTIES))
            worker.hset(key, mapping={f"t{t}": "1" for t in tasks if t not in NOT_ARRIVED})
    worker.close()
    return names


def status_cli(teams: Teams, job: str, *args: str) -> Result:
    return CliRunner().invoke(
        cli,
        [*args, "--redis-url", teams.server.url, "--job", job],
        env={
            **teams.env("team-a-monitor", teams.passwords["team-a-monitor"]),
            "COLUMNS": "250",  # rich's width: a row on one line
        },
    )


def test_planted_barriers_cost_status_and_watch_a_bounded_few_short_commands(
    teams: Teams,
) -> None:
    job = job_of("team-a")
    keys = JobKeys.for_job(job)
    names = plant_barriers(teams, job)
    monitor = teams.config("team-a", "monitor", job)
    teams.admin.config_set("slowlog-log-slower-than", 0)  # every command, to count them
    teams.admin.slowlog_reset()
    status = read_status(monitor)
    commands = teams.slow()
    assert {barrier.name for barrier in status.barriers} == set(names)
    for barrier in status.barriers:
        assert isinstance(barrier, OpenBarrier)
        assert (barrier.parties, barrier.arrived) == (MAX_PARTIES, MAX_PARTIES - 2)
        assert barrier.missing == (3,) and barrier.missing_more == 1
        assert barrier.tasks_checked == TASKS_CHECKED // PLANTED_BARRIERS
        assert missing_tasks(barrier).endswith(
            f"and 1 more among tasks {barrier.tasks_checked}-{MAX_PARTIES - 1}"
        )
    # never a barrier read whole (waiter_read), and a bounded number of commands
    on_barriers = [words for _, words in commands if f"{keys.barrier_prefix}" in words]
    assert not [words for words in on_barriers if words.upper().startswith("FCALL")]
    assert len(commands) <= TASKS_CHECKED + 1_000, len(commands)
    assert not [entry for entry in commands if entry[0] >= LIMIT_US]
    # status, watch's reads (each refresh is read_overview) and status --json, as the
    # review ran them: no command of them, nor of team B's chief meanwhile, is slow
    teams.admin.config_set("slowlog-log-slower-than", LIMIT_US)
    teams.admin.slowlog_reset()
    other = job_of("team-b")
    with StepPublisher(teams.config("team-b", "chief", other)) as chief:
        for step in range(1, 6):
            read_overview(monitor)
            chief.publish(step)
            assert chief.flush(10.0), chief.last_failure
        shown = status_cli(teams, job, "status")
        as_json = status_cli(teams, job, "status", "--json")
    assert teams.slow() == []
    assert shown.exit_code == 0, shown.output
    row = next(line for line in shown.stdout.splitlines() if line.startswith("planted-0"))
    assert f"{MAX_PARTIES - 2:,}/{MAX_PARTIES:,}" in row and "3, and 1 more among tasks" in row
    assert as_json.exit_code == 0, as_json.output
    planted = json.loads(as_json.stdout)["barriers"]
    assert {b["name"] for b in planted} == set(names)
    assert all((b["missing"], b["missing_more"]) == ([3], 1) for b in planted)
    teams.admin.unlink(*(keys.barrier(name) for name in names), keys.barrier_index)


def test_the_task_checks_are_shared_fairly_among_the_open_barriers() -> None:
    # a small barrier is checked whole beside planted large ones; the rest is shared
    assert fair_shares([4, MAX_PARTIES, MAX_PARTIES], TASKS_CHECKED) == [
        4,
        (TASKS_CHECKED - 4) // 2,
        (TASKS_CHECKED - 4) // 2,
    ]
    assert sum(fair_shares([MAX_PARTIES] * 50, TASKS_CHECKED)) == TASKS_CHECKED


# BUSY: a script that runs past busy-reply-threshold


@pytest.fixture
def busy(teams: Teams, monkeypatch: pytest.MonkeyPatch) -> Iterator[Teams]:
    """Redis held by a Lua loop (as an administrator's runaway script would) until the
    test ends, ``busy-reply-threshold`` at 100 ms; status retries for 1 s."""
    monkeypatch.setattr(status_module, "STATUS_RETRY_SECONDS", 1.0)
    teams.admin.config_set("busy-reply-threshold", 100)
    # no reply until the script ends: no socket timeout (redis-py's default of 5 s
    # would send the EVAL again, and get BUSY, while the first one runs on)
    looping = teams.harness(socket_timeout=None, retry=None)
    ended: list[BaseException] = []

    def loop() -> None:
        try:
            looping.eval("while true do end", 0)
        except redis.RedisError as exc:
            ended.append(exc)

    thread = threading.Thread(target=loop, daemon=True)
    probe = teams.harness()
    thread.start()

    def answers_busy() -> bool:
        try:
            probe.get("probe")
        except redis.ResponseError as exc:
            return str(exc).startswith("BUSY")
        return False

    try:
        eventually(answers_busy, what="Redis answers BUSY")
        yield teams
    finally:
        probe.script_kill()  # what an administrator does (the script wrote nothing)
        thread.join(30)
        assert ended and "killed" in str(ended[0]).lower(), ended
        teams.admin.config_set("busy-reply-threshold", 1000)
        probe.close()
        looping.close()


def test_a_busy_redis_is_reported_as_busy_not_as_unreachable(busy: Teams) -> None:
    job = job_of("team-a")
    for command in (["status"], ["status", "--json"], ["status", "--check"], ["watch"]):
        result = status_cli(busy, job, *command)
        assert result.exit_code == EXIT_BUSY != EXIT_UNAVAILABLE, (command, result.output)
        assert "is busy running a script" in result.output, result.output
        assert "FUNCTION KILL" in result.output and "SCRIPT KILL" in result.output
        assert "unreachable" not in result.output
    listed = CliRunner().invoke(
        cli,
        ["jobs", "--redis-url", busy.server.url, "--job", "team-a-*"],
        env=busy.env("monitor", PASSWORDS["monitor"]),
    )
    assert listed.exit_code == EXIT_BUSY, listed.output
    assert "is busy running a script" in listed.output
    collector = JobsCollector(busy.monitor(), patterns=("team-a-*",), min_interval=0.0)
    families = {family.name: family for family in collector.collect()}
    assert families["stepbarrier_up"].samples[0].value == 0
    assert families["stepbarrier_redis_busy"].samples[0].value == 1


def test_busy_is_told_apart_from_unreachable_and_from_busykey() -> None:
    config = BarrierConfig(job="j", redis_url="redis://127.0.0.1:1/0")
    busy = translate(
        redis.ResponseError("BUSY Redis is busy running a script. You can only call "
                            "FUNCTION KILL or SHUTDOWN NOSAVE."),
        config,
        action="read the job's status",
    )  # fmt: skip
    assert isinstance(busy, RedisBusy) and isinstance(busy, RedisUnavailable)
    assert exit_code_for(busy) == EXIT_BUSY
    down = translate(redis.ConnectionError("refused"), config, action="read", probe=False)
    assert isinstance(down, RedisUnavailable) and not isinstance(down, RedisBusy)
    assert exit_code_for(down) == EXIT_UNAVAILABLE
    other = translate(redis.ResponseError("BUSYKEY Target key name already exists."), config,
                      action="copy")  # fmt: skip
    assert not isinstance(other, RedisBusy)
    # watch rides either out, and says which
    assert _outage_note(busy).startswith("Redis busy running a script, retrying: ")
    assert _outage_note(down).startswith("Redis unreachable, retrying: ")


# Item 5: another team blinds the shared exporter


def plant_jobs(teams: Teams, prefix: str) -> None:
    """``PLANTED_JOBS`` tiny job states of team B (its chief's keys: as an admin's Lua,
    to be quick), named so that they come first in a listing by name too."""
    plant = (
        "for i = tonumber(ARGV[1]), tonumber(ARGV[2]) do "
        "redis.call('HSET', 'stepbarrier:{' .. ARGV[3] .. string.format('%06d', i) .. "
        "'}:state', 'step', '1', 'generation', '1') end"
    )
    for first in range(0, PLANTED_JOBS, 10_000):
        teams.admin.eval(plant, 0, first, first + 9_999, prefix)


def unplant_jobs(teams: Teams, prefix: str) -> None:
    for first in range(0, PLANTED_JOBS, 10_000):
        names = (f"{prefix}{i:06d}" for i in range(first, first + 10_000))
        teams.admin.unlink(*(JobKeys.for_job(name).state for name in names))


@pytest.fixture
def flooded(teams: Teams) -> Iterator[tuple[Teams, str]]:
    """Team B's 100,000 planted jobs, and team A's live job (a chief at step 7, a
    worker waiting for 9)."""
    prefix = "team-b-"  # team-b-000000 .. : before team A's names in no order
    plant_jobs(teams, prefix)
    ours = job_of("team-a")
    chief = teams.config("team-a", "chief", ours)
    worker = teams.config("team-a", "worker", ours)
    try:
        with live_job(chief, 7, waits=(9,), worker=worker):
            yield teams, ours
    finally:
        unplant_jobs(teams, prefix)


TEAM_PATTERNS = ("team-a-*", "team-b-*")


def test_another_teams_planted_jobs_never_hide_a_live_job_from_the_exporter(
    flooded: tuple[Teams, str],
) -> None:
    teams, ours = flooded
    teams.admin.config_set("slowlog-log-slower-than", LIMIT_US)
    teams.admin.slowlog_reset()
    with serve(teams.monitor(), port=0, patterns=TEAM_PATTERNS, min_interval=0.0) as exporter:
        for _ in range(3):  # each scrape reads Redis anew (min_interval 0)
            teams.admin.config_resetstat()
            samples = scrape(exporter.url)
            calls = teams.calls()
            assert samples["stepbarrier_up"] == [({}, 1.0)]
            assert job_value(samples, "stepbarrier_step", ours) == 7
            assert job_value(samples, "stepbarrier_waiting_workers", ours) == 1
            assert job_value(samples, "stepbarrier_next_wait_until_step", ours) == 9
            truncated = dict(
                (labels["pattern"], value)
                for labels, value in samples["stepbarrier_jobs_truncated"]
            )
            assert truncated == {"team-a-*": 0.0, "team-b-*": 1.0}
            found = {labels["pattern"]: v for labels, v in samples["stepbarrier_jobs_found"]}
            assert found["team-b-*"] >= PLANTED_JOBS
            assert samples["stepbarrier_jobs"] == [({}, float(EXPORTED_JOBS))]
            # a scrape's work is bounded whatever was planted (team A's chief and
            # worker run beside it: a few calls of theirs)
            assert calls.get("scan", 0) <= SCRAPE_SCAN_CALLS
            assert calls.get("fcall_ro", 0) <= EXPORTED_JOBS + 100
            assert calls.get("zcard", 0) <= EXPORTED_JOBS + 100
    assert teams.slow() == []


def test_the_listing_is_per_team_and_says_when_it_is_truncated(
    flooded: tuple[Teams, str],
) -> None:
    teams, ours = flooded
    monitor = teams.monitor()
    for _ in range(2):
        listing = list_jobs(monitor, patterns=TEAM_PATTERNS)
        assert ours in {job.job for job in listing.jobs}
        [mine, theirs] = listing.patterns
        # (the jobs of the tests before are there too)
        assert (mine.found, mine.truncated) == (mine.read, False) and mine.read >= 1
        assert theirs.found >= PLANTED_JOBS
        assert (theirs.read, theirs.truncated) == (MAX_JOBS - mine.read, True)
        assert not listing.complete and listing.scan_complete
    env = teams.env("monitor", PASSWORDS["monitor"])
    command = ["jobs", "--redis-url", teams.server.url, "--job", "team-a-*", "--job", "team-b-*"]
    as_json = CliRunner().invoke(cli, [*command, "--json"], env=env)
    assert as_json.exit_code == 0, as_json.output
    data = json.loads(as_json.stdout)
    assert ours in {row["job"] for row in data["jobs"]} and data["complete"] is False
    assert [(p["pattern"], p["truncated"]) for p in data["patterns"]] == [
        ("team-a-*", False),
        ("team-b-*", True),
    ]
    assert "jobs match 'team-b-*': only 9,99" in as_json.stderr
    # without the teams' patterns: one share for every job, and the output says so
    table = CliRunner().invoke(cli, ["jobs", "--redis-url", teams.server.url], env=env)
    assert table.exit_code == 0, table.output
    shown = " ".join(table.stdout.split())  # (rich wraps long lines)
    assert f"jobs match '*': only {MAX_JOBS:,} are listed" in shown
    assert "--job 'team-a-*' --job 'team-b-*'" in shown
    assert "Warning: " in table.stderr


def test_a_scan_past_its_bound_truncates_every_pattern(teams: Teams) -> None:
    filler = teams.admin.pipeline(transaction=False)
    for i in range(3 * SCAN_COUNT):
        filler.set(f"operator-reads-filler:{i}", 1, ex=120)
    filler.execute()
    listing = list_jobs(teams.monitor(), patterns=TEAM_PATTERNS, scan_calls=1)
    assert not listing.scan_complete and not listing.complete
    assert all(part.truncated for part in listing.patterns)
