"""``stepbarrier jobs`` and the exporter under ops/redis/users.acl: the shipped
``monitor`` user is enough for both, a user of another role may not scan, and a
monitor confined to team a's jobs reads only those (team b's are listed by name,
as not readable)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from click.testing import CliRunner, Result

from stepbarrier import BarrierConfig
from stepbarrier._protocol.roles import acl_line, password_hash
from stepbarrier.cli import cli
from stepbarrier.cli._exporter import serve
from tests.observability import job_value, live_job, prefix, scrape
from tests.ops_redis import PASSWORDS, SECRETS, OpsRedis, acl_with

TEAM_MONITOR = ("a-monitor", "team-a-monitor-observability-secret")


@pytest.fixture(scope="module")
def acl_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRedis]:
    user, password = TEAM_MONITOR
    line = acl_line(user, "monitor", "team-a-*", password_hash(password))
    server = OpsRedis(acl_file=acl_with(tmp_path_factory.mktemp("acl"), line))
    server.start()
    yield server
    server.cleanup()


def as_user(server: OpsRedis, job: str, user: str, password: str | None = None) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=server.url,
        redis_username=user,
        redis_password=password or PASSWORDS[user],
        heartbeat=0.2,
        stall_timeout=30,
    )


def jobs_as(server: OpsRedis, user: str, *args: str, password: str | None = None) -> Result:
    env = {"STEPBARRIER_REDIS_USERNAME": user}
    env["STEPBARRIER_REDIS_PASSWORD"] = password or PASSWORDS[user]
    return CliRunner().invoke(cli, ["jobs", "--redis-url", server.url, "--json", *args], env=env)


def rows(result: Result) -> dict[str, dict[str, Any]]:
    assert result.exit_code == 0, result.output
    return {row["job"]: row for row in json.loads(result.stdout)["jobs"]}


def test_the_monitor_user_lists_every_job_with_its_waiting_workers(acl_server: OpsRedis) -> None:
    job = prefix("listed")
    chief, worker = as_user(acl_server, job, "chief"), as_user(acl_server, job, "worker")
    login = ["--username", "monitor", "--password-file", str(SECRETS / "monitor.password")]
    with live_job(chief, 5, waits=(7,), worker=worker):
        result = CliRunner().invoke(
            cli, ["jobs", "--redis-url", acl_server.url, *login, "--json", "--job", job]
        )
    row = rows(result)[job]
    assert (row["step"], row["waiting_workers"], row["next_wait_until_step"]) == (5, 1, 7)
    assert row["problems"] == []


def test_the_monitor_user_is_enough_for_the_exporter(acl_server: OpsRedis) -> None:
    job = prefix("exported")
    chief, worker = as_user(acl_server, job, "chief"), as_user(acl_server, job, "worker")
    monitor = as_user(acl_server, "any", "monitor")
    with live_job(chief, 8, waits=(10,), worker=worker), serve(monitor, port=0) as exporter:
        samples = scrape(exporter.url)
    assert samples["stepbarrier_up"] == [({}, 1.0)]
    assert job_value(samples, "stepbarrier_step", job) == 8
    assert job_value(samples, "stepbarrier_next_wait_until_step", job) == 10
    assert job_value(samples, "stepbarrier_problems", job) == 0


@pytest.mark.parametrize("user", ["chief", "worker"])
def test_the_other_roles_may_not_scan_for_the_jobs(acl_server: OpsRedis, user: str) -> None:
    result = jobs_as(acl_server, user)
    assert result.exit_code == 2
    assert f"user '{user}' may not list the jobs" in result.output
    assert "Traceback" not in result.output


def test_a_team_monitor_reads_its_teams_jobs_and_only_names_the_others(
    acl_server: OpsRedis,
) -> None:
    user, password = TEAM_MONITOR
    ours, theirs = prefix("team-a-ours"), prefix("team-b-theirs")
    with (
        live_job(as_user(acl_server, ours, "chief"), 3),
        live_job(as_user(acl_server, theirs, "chief"), 4),
    ):
        own = rows(jobs_as(acl_server, user, "--job", "team-a-*", password=password))
        every = rows(jobs_as(acl_server, user, password=password))
        team = as_user(acl_server, "any", user, password)
        with serve(team, port=0) as exporter:
            samples = scrape(exporter.url)
    assert own[ours]["step"] == 3 and theirs not in own
    assert every[ours]["step"] == 3
    assert every[theirs]["step"] is None  # found by SCAN, but its keys stay closed
    [problem] = every[theirs]["problems"]
    assert problem.startswith(f"not readable by this user: user '{user}' may not")
    assert job_value(samples, "stepbarrier_step", ours) == 3
    assert job_value(samples, "stepbarrier_step", theirs) is None
    assert job_value(samples, "stepbarrier_problems", theirs) == 1
