"""Issue 34: a team's jobs are listed from its job index, which no other team can fill,
empty or slow down, whatever the keyspace holds.

The review's attack on the listing: another team's keys (about two million) exhaust
the listing's ``SCAN`` budget and hide a team's jobs, and megabyte key names cost
every listing. A chief given its team's pattern (``STEPBARRIER_JOBS_PATTERN``) keeps
its job in ``stepbarrier:{team-a-*}:jobs``, inside its team's ACL rules; the listing
of that pattern reads it with one bounded ``index_read`` and no ``SCAN``. Each test
attacks as a team's users would, with the rules ``stepbarrier acl`` prints, on the
shipped ``redis.conf`` (``start-redis.sh``), and judges by what Redis counted.
"""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import redis
from click.testing import CliRunner

from stepbarrier import ConfigurationError, StepPublisher
from stepbarrier._chief.publish_call import finished_ttl
from stepbarrier._chief.publisher import INDEX_REFRESH
from stepbarrier._inspect.listing import list_jobs
from stepbarrier._protocol.calls import job_index_call
from stepbarrier._protocol.keys import job_index
from stepbarrier._protocol.library import MAX_JOB_INDEX
from stepbarrier._protocol.roles import role_rules
from stepbarrier._redis.functions import RedisCode
from stepbarrier.cli import cli
from stepbarrier.cli._exporter import JobsCollector
from tests.barrier_helpers import eventually
from tests.ops_redis import PASSWORDS
from tests.security.test_bounded_work import acl_arguments
from tests.security.test_operator_reads import Teams as OperatorTeams
from tests.security.test_operator_reads import start_teams

TEAM_PATTERNS = ("team-a-*", "team-b-*")
FOREIGN_KEYS = 3_000_000
"""Small keys of another team (the review: about two million exhaust a listing's SCAN)."""
LONG_NAMES = 20
"""Keys with names of almost a megabyte (each cost every scanning listing 0.5 to 3.3 ms)."""
LIMIT_US = 500_000
"""Longest any command may run (SLOWLOG): a coarse guard, as in test_operator_reads.py."""


class Teams(OperatorTeams):
    """The server, its harness client and each team's users; Redis's clock."""

    def redis_ms(self) -> int:
        seconds, micros = self.admin.time()
        return seconds * 1000 + micros // 1000


@pytest.fixture(scope="module")
def teams(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Teams]:
    # DEBUG POPULATE: many keys at once
    started = start_teams(tmp_path_factory.mktemp("job-index"), "--enable-debug-command", "local")
    found = Teams(started.server, started.passwords)
    started.admin.close()
    yield found
    found.admin.close()
    found.server.cleanup()


def job_of(team: str) -> str:
    return f"{team}-{uuid.uuid4().hex[:8]}"


def indexed_chief(teams: Teams, team: str, job: str, step: int, **extra: Any) -> StepPublisher:
    """Team ``team``'s chief of ``job`` at ``step``, with its team's jobs pattern."""
    config = teams.config(team, "chief", job, jobs_pattern=f"{team}-*", **extra)
    chief = StepPublisher(config)
    chief.publish(step)
    assert chief.flush(10)
    # the entry follows the write, on the writer's thread
    eventually(lambda: entry(teams, f"{team}-*", job) is not None)
    return chief


def entry(teams: Teams, pattern: str, job: str) -> float | None:
    score: float | None = teams.admin.zscore(job_index(pattern), job)
    return score


def test_a_chief_keeps_its_job_in_its_teams_index_for_as_long_as_its_keys(teams: Teams) -> None:
    job = job_of("team-a")
    chief = indexed_chief(teams, "team-a", job, 3, key_ttl=3600, done_ttl=120)
    try:
        kept = entry(teams, "team-a-*", job)
        assert kept is not None
        # scored with the Redis time until which it is kept: the job's key TTL, and
        # the time until its next entry (the keys live key_ttl after the last write)
        assert abs(kept - (teams.redis_ms() + (3600 + INDEX_REFRESH) * 1000)) < 30_000
        assert teams.admin.ttl(job_index("team-a-*")) > 3500  # (another test's may be longer)
        assert teams.admin.zscore(job_index("team-b-*"), job) is None
    finally:
        assert chief.close(done=True)
    # finished: kept as long as its finished keys (and the index no shorter than before)
    done = entry(teams, "team-a-*", job)
    assert done is not None and kept is not None and done < kept
    ttl = finished_ttl(teams.config("team-a", "chief", job, key_ttl=3600, done_ttl=120))
    assert abs(done - (teams.redis_ms() + ttl * 1000)) < 30_000
    assert teams.admin.ttl(job_index("team-a-*")) > 3500


def test_another_team_can_neither_write_nor_empty_a_teams_index(teams: Teams) -> None:
    job = job_of("team-a")
    chief = indexed_chief(teams, "team-a", job, 1)
    index = job_index("team-a-*")
    try:
        for team, role in (("team-b", "chief"), ("team-a", "worker"), ("team-b", "monitor")):
            client = teams.client(team, role)
            try:
                for command in (
                    ("ZADD", index, "1", "team-a-forged"),
                    ("ZREM", index, job),
                    ("UNLINK", index),
                    ("SET", index, "x"),
                ):
                    with pytest.raises(redis.exceptions.NoPermissionError):
                        client.execute_command(*command)
                code = RedisCode(client, teams.config(team, role, job_of(team)))
                with pytest.raises(redis.exceptions.ResponseError, match=r"(?i)permission|no perm"):
                    code.call(*job_index_call(index, "team-a-forged", lifetime=60))
            finally:
                client.close()
        assert job.encode() in teams.admin.zrange(index, 0, -1)
        assert entry(teams, "team-a-*", "team-a-forged") is None
        # a chief may not claim another team's pattern: its job must match it
        with pytest.raises(ConfigurationError, match="does not match jobs_pattern 'team-a-\\*'"):
            teams.config("team-b", "chief", job_of("team-b"), jobs_pattern="team-a-*")
    finally:
        chief.close(done=False, timeout=2.0)


def test_another_teams_keys_never_hide_an_indexed_teams_jobs(teams: Teams) -> None:
    """Three million keys and megabyte names of team B cut every scan short: team A's
    listing (its team's monitor's, the shared monitor's, the shared exporter's) still
    lists all of team A's jobs, from its index, and says that the scan was cut."""
    job = job_of("team-a")
    chief = indexed_chief(teams, "team-a", job, 7)
    admin = teams.admin
    admin.config_set("maxmemory", "2gb")  # the shipped 256 MB holds about a million
    try:
        admin.execute_command("DEBUG", "POPULATE", FOREIGN_KEYS, "stepbarrier:{team-b-x}:waiter:")
        for number in range(LONG_NAMES):
            admin.set(f"stepbarrier:{{team-b-{number}{'x' * 900_000}}}:state", 1)
        assert admin.dbsize() >= FOREIGN_KEYS
        admin.config_set("slowlog-log-slower-than", LIMIT_US)
        admin.slowlog_reset()
        for config in (teams.monitor(), teams.config("team-a", "monitor", "any")):
            admin.config_resetstat()
            listing = list_jobs(config, patterns=("team-a-*",), scan_calls=10)
            calls = teams.calls()
            assert job in {summary.job for summary in listing.jobs}
            [part] = listing.patterns
            # the scan was cut (team B's keys: more than 10 SCAN calls), which the
            # listing says (a job kept in no index could be missing); the index's
            # job is listed all the same
            assert (part.indexed, part.index_truncated) == (True, False)
            assert part.truncated and not listing.complete and not listing.scan_complete
            assert calls["scan"] == 10, calls
            assert [s.problems for s in listing.jobs if s.job == job] == [()]
        # both teams at once, a scan budget that team B's keys exhaust: team A whole
        listing = list_jobs(teams.monitor(), patterns=TEAM_PATTERNS, scan_calls=10)
        mine, theirs = listing.patterns
        assert (mine.indexed, theirs.indexed) == (True, False)
        assert mine.truncated and theirs.truncated
        assert job in {summary.job for summary in listing.jobs}
        # the shared exporter: team A's job, its pattern indexed and whole
        collector = JobsCollector(teams.monitor(), patterns=TEAM_PATTERNS, min_interval=0.0)
        families = {family.name: family for family in collector.collect()}
        by_pattern = {
            family: {s.labels["pattern"]: s.value for s in families[family].samples}
            for family in ("stepbarrier_jobs_indexed", "stepbarrier_jobs_truncated")
        }
        assert by_pattern["stepbarrier_jobs_indexed"] == {"team-a-*": 1.0, "team-b-*": 0.0}
        # 3,000 SCAN calls needed, 2,000 made: every pattern may miss a job kept in no index
        assert by_pattern["stepbarrier_jobs_truncated"] == {"team-a-*": 1.0, "team-b-*": 1.0}
        steps = {s.labels["job_name"]: s.value for s in families["stepbarrier_step"].samples}
        assert steps[job] == 7
        assert admin.slowlog_get(10) == []
    finally:
        chief.close(done=False, timeout=2.0)
        admin.config_set("slowlog-log-slower-than", 10_000)
        admin.flushall()  # the library stays: FLUSHALL leaves functions
        admin.config_set("maxmemory", "256mb")


def test_what_a_team_plants_in_its_own_index_lists_no_foreign_or_malformed_job(
    teams: Teams,
) -> None:
    ours, victim = job_of("team-a"), job_of("team-b")
    chief = indexed_chief(teams, "team-a", ours, 2)
    other = StepPublisher(teams.config("team-b", "chief", victim))  # team B: no index
    other.publish(4)
    assert other.flush(10)
    planter = teams.client("team-a", "chief")
    index = job_index("team-a-*")
    try:
        far = teams.redis_ms() + 3_600_000
        planter.zadd(
            index,
            {
                victim: far,  # another team's job
                "team-a-ghost": far,  # no such job
                "x}:state": far,  # no job's name
                "team-a-" + "y" * 1_000_000: far,  # a megabyte member
            },
        )
        listing = list_jobs(teams.monitor(), patterns=TEAM_PATTERNS)
        mine, theirs = listing.patterns
        assert mine.indexed and not theirs.indexed
        listed = {summary.job for summary in listing.jobs}
        assert {ours, victim} <= listed
        assert "team-a-ghost" not in listed and not any("y" * 100 in name for name in listed)
        # team A's index counts its job and the ghost (read, then left out: no keys);
        # the victim only for its own team's pattern (by the scan); the brace name is
        # no job's, and the megabyte member is never sent (index_read counts it): the
        # index is then more than one read lists, and the listing says so
        assert (mine.found, theirs.found) == (2, 1)
        assert mine.index_truncated and mine.truncated and not theirs.truncated
        assert not listing.complete
    finally:
        planter.close()
        chief.close(done=False, timeout=2.0)
        other.close(done=False, timeout=2.0)
        teams.admin.unlink(index)


def test_a_planted_index_of_any_type_or_size_is_mended_by_the_next_entry(teams: Teams) -> None:
    job = job_of("team-a")
    planter = teams.client("team-a", "chief")
    config = teams.config("team-a", "chief", job)
    code = RedisCode(planter, config)
    index = job_index("team-a-*")

    def enter() -> None:
        code.call(*job_index_call(index, job, lifetime=600))

    chief = StepPublisher(config)  # a job without an index entry: the scan finds it
    chief.publish(1)
    assert chief.flush(10)
    try:
        planter.set(index, "not an index")
        listing = list_jobs(teams.monitor(), patterns=("team-a-*",))
        assert not listing.patterns[0].indexed and job in {s.job for s in listing.jobs}
        enter()
        assert teams.admin.type(index) == b"zset" and teams.admin.zrange(index, 0, -1) == [
            job.encode()
        ]
        # an index of more than twice the bound is dropped whole, then the job put back
        now = teams.redis_ms()
        for first in range(0, 2 * MAX_JOB_INDEX + 1, 5000):
            planter.zadd(index, {f"team-a-p{n}": now + 600_000 for n in range(first, first + 5000)})
        enter()
        assert teams.admin.zcard(index) == 1
        # beyond the bound: the expired go, then the first to expire; the job stays
        planter.zadd(index, {f"team-a-old{n}": now - 1000 for n in range(300)})
        planter.zadd(index, {f"team-a-q{n}": now + 60_000 + n for n in range(MAX_JOB_INDEX + 50)})
        enter()
        assert teams.admin.zcard(index) == MAX_JOB_INDEX
        assert teams.admin.zscore(index, job) is not None
        assert teams.admin.zscore(index, "team-a-old0") is None
        assert teams.admin.zscore(index, "team-a-q0") is None  # expires first
        # the listing says an index it cannot read at once is truncated
        planter.zadd(index, {f"team-a-r{n}": now + 600_000 for n in range(100)})
        listing = list_jobs(teams.monitor(), patterns=("team-a-*",))
        assert listing.patterns[0].indexed and listing.patterns[0].truncated
        assert not listing.complete
        # a bad call is refused before anything is written
        for job_name, lifetime in (("a}b", 60), ("", 60), (job, 0), ("x" * 65, 60)):
            with pytest.raises(redis.exceptions.ResponseError, match="stepbarrier: a job index"):
                code.call(*job_index_call(index, job_name, lifetime=lifetime))
    finally:
        planter.close()
        chief.close(done=False, timeout=2.0)
        teams.admin.unlink(index)


def test_a_chief_that_may_not_write_the_index_says_so_once_and_runs_on(
    teams: Teams, caplog: pytest.LogCaptureFixture
) -> None:
    job = job_of("team-a")
    # '*' is a valid pattern the job matches, but not team A's user's
    config = teams.config("team-a", "chief", job, jobs_pattern="*", done_ttl=60)
    with caplog.at_level(logging.WARNING, logger="stepbarrier"):
        chief = StepPublisher(config)
        for step in (1, 2, 3):
            chief.publish(step)
            assert chief.flush(10)
        assert chief.close(done=True)
    told = [r.getMessage() for r in caplog.records if "job index" in r.getMessage()]
    assert len(told) == 1, told
    assert f"job {job}: not kept in the job index of STEPBARRIER_JOBS_PATTERN '*'" in told[0]
    assert PASSWORDS["chief"] not in told[0] and teams.passwords["team-a-chief"] not in told[0]
    assert teams.admin.exists(job_index("*")) == 0
    state = teams.admin.hmget(config.keys.state, "step", "done")
    assert state == [b"3", b"1"]


def test_the_jobs_command_says_which_patterns_came_from_an_index(teams: Teams) -> None:
    job = job_of("team-a")
    chief = indexed_chief(teams, "team-a", job, 5)
    try:
        env = {
            "STEPBARRIER_REDIS_USERNAME": "monitor",
            "STEPBARRIER_REDIS_PASSWORD": PASSWORDS["monitor"],
        }
        command = [
            "jobs",
            "--redis-url",
            teams.server.url,
            "--job",
            "team-a-*",
            "--job",
            "team-b-*",
        ]
        result = CliRunner().invoke(cli, [*command, "--json"], env=env)
        assert result.exit_code == 0, result.output
        data = json.loads(result.stdout)
        assert job in {row["job"] for row in data["jobs"]}
        assert [(p["pattern"], p["indexed"]) for p in data["patterns"]] == [
            ("team-a-*", True),
            ("team-b-*", False),
        ]
    finally:
        chief.close(done=False, timeout=2.0)


def test_a_job_its_chief_keeps_in_no_index_is_listed_and_named(teams: Teams) -> None:
    """The index is not the whole list: a chief without STEPBARRIER_JOBS_PATTERN (an older
    release, a forgotten variable), or whose entry expired, is found by the scan, and
    its job says that it is not in the team's index."""
    indexed, plain, expired = job_of("team-a"), job_of("team-a"), job_of("team-a")
    chiefs = [indexed_chief(teams, "team-a", indexed, 1)]
    for job in (plain, expired):
        chief = StepPublisher(teams.config("team-a", "chief", job))
        chief.publish(2)
        assert chief.flush(10)
        chiefs.append(chief)
    index = job_index("team-a-*")
    teams.admin.zadd(index, {expired: teams.redis_ms() - 1000})  # its chief stopped saying it
    try:
        listing = list_jobs(teams.monitor(), patterns=("team-a-*",))
        [part] = listing.patterns
        assert part.indexed and not part.truncated and listing.complete
        problems = {s.job: s.problems for s in listing.jobs}
        assert problems[indexed] == ()
        for job in (plain, expired):
            assert problems[job] == (
                "not in the job index of 'team-a-*': its chief does not keep it there "
                "(STEPBARRIER_JOBS_PATTERN='team-a-*'), so only a scan finds it",
            )
    finally:
        for chief in chiefs:
            chief.close(done=False, timeout=2.0)
        teams.admin.unlink(index)


def test_overlapping_patterns_count_each_job_once_for_the_first_it_matches(
    teams: Teams,
) -> None:
    """An umbrella pattern's index ('team-*', listed first) and team B's scanned pattern:
    team B's job is listed once, for the first pattern it matches, never lost."""
    ours, theirs = job_of("team-a"), job_of("team-b")
    chiefs = [indexed_chief(teams, "team-a", ours, 1)]
    chief = StepPublisher(teams.config("team-b", "chief", theirs))
    chief.publish(3)
    assert chief.flush(10)
    chiefs.append(chief)
    umbrella = job_index("team-*")
    teams.admin.zadd(umbrella, {ours: teams.redis_ms() + 600_000})  # an umbrella team's chief
    try:
        for patterns in (("team-*", "team-b-*"), ("team-b-*", "team-*")):
            listing = list_jobs(teams.monitor(), patterns=patterns)
            listed = [s.job for s in listing.jobs]
            assert listed.count(ours) == 1 and listed.count(theirs) == 1
            by_pattern = {part.pattern: part for part in listing.patterns}
            assert by_pattern["team-*"].indexed and not by_pattern["team-b-*"].indexed
            # each job counts for the first pattern it matches
            found = [part.found for part in listing.patterns]
            if patterns[0] == "team-*":
                assert found[0] >= 2 and found[1] == 0
            else:
                assert found[0] >= 1 and found[1] >= 1
    finally:
        for chief in chiefs:
            chief.close(done=False, timeout=2.0)
        teams.admin.unlink(umbrella)


def test_a_pattern_that_globs_another_cannot_write_its_index(teams: Teams) -> None:
    """A chief of 'team-?' (whose glob matches the name 'team-*' too) writes the index
    of 'team-?' alone: the index rule escapes the pattern's '*' and '?'."""
    user, password = f"globber-{uuid.uuid4().hex[:6]}", uuid.uuid4().hex
    rules = role_rules("chief", "team-?")
    teams.admin.execute_command(  # type: ignore[no-untyped-call]
        "ACL", "SETUSER", user, "on", f">{password}", *acl_arguments(rules)
    )
    client = teams.server.client(username=user, password=password)
    try:
        for pattern in ("team-*", "team-a-*", "*"):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.zadd(job_index(pattern), {"team-x": 1})
        assert client.zadd(job_index("team-?"), {"team-x": 1}) == 1
    finally:
        client.close()
        teams.admin.unlink(job_index("team-?"))
        teams.admin.acl_deluser(user)
