"""``stepbarrier jobs``: every job of a Redis, found by SCAN and read like ``status``,
on the session's real redis-server (which holds every test's jobs: each test
lists only its own prefix, as an operator would list a team's)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from stepbarrier import BarrierConfig
from stepbarrier._inspect import listing as job_listing
from stepbarrier._inspect.listing import job_of_state_key, list_jobs, scan_jobs
from stepbarrier._protocol.keys import JobKeys
from stepbarrier.cli import cli
from tests.conftest import ROOT, subprocess_env
from tests.observability import live_job, prefix
from tests.redis_harness import RedisServer


def run_jobs(server: RedisServer, *args: str, **env: str) -> Result:
    return CliRunner().invoke(
        cli, ["jobs", "--redis-url", server.url, *args], env=env, catch_exceptions=False
    )


def listed(result: Result) -> dict[str, dict[str, Any]]:
    assert result.exit_code == 0, result.output
    rows: list[dict[str, Any]] = json.loads(result.stdout)["jobs"]
    return {row["job"]: row for row in rows}


@pytest.fixture
def jobs_of(redis_server: RedisServer) -> Callable[..., BarrierConfig]:
    def build(job: str, **extra: Any) -> BarrierConfig:
        return BarrierConfig(
            job=job, redis_url=redis_server.url, heartbeat=0.2, stall_timeout=30.0, **extra
        )

    return build


def test_jobs_shows_each_jobs_run_step_heartbeat_and_waiting_workers(
    redis_server: RedisServer, jobs_of: Callable[..., BarrierConfig]
) -> None:
    name = prefix("several")
    training = jobs_of(f"{name}-training", run_id="run-7")
    finished, fresh = jobs_of(f"{name}-finished"), jobs_of(f"{name}-fresh")
    before = time.time()  # the clock of Redis and of the waiters, on this machine
    with (
        live_job(training, 5, waits=(12, 9)),
        live_job(finished, 40, done=True),
        live_job(fresh, 1),
    ):
        rows = listed(run_jobs(redis_server, "--job", f"{name}-*", "--json"))
    lasted = time.time() - before + 0.01  # (the ages are rounded to the millisecond)
    assert set(rows) == {f"{name}-training", f"{name}-finished", f"{name}-fresh"}
    row = rows[f"{name}-training"]
    assert (row["run_id"], row["step"], row["done"]) == ("run-7", 5, False)
    assert (row["waiting_workers"], row["next_wait_until_step"]) == (2, 9)
    # both began within the test: no older than it (however long it took)
    assert 0 <= row["heartbeat_age"] <= lasted and 0 <= row["oldest_wait"] <= lasted
    assert row["problems"] == [] and row["generation"] >= 1
    done = rows[f"{name}-finished"]
    assert (done["step"], done["done"], done["waiting_workers"]) == (40, True, 0)
    assert done["next_wait_until_step"] is None and done["oldest_wait"] is None
    assert rows[f"{name}-fresh"]["run_id"] is None


def test_jobs_needs_no_job_name_and_ignores_stepbarrier_job(
    redis_server: RedisServer, jobs_of: Callable[..., BarrierConfig]
) -> None:
    name = prefix("nameless")
    with live_job(jobs_of(f"{name}-a"), 3), live_job(jobs_of(f"{name}-b"), 4):
        everything = listed(run_jobs(redis_server, "--json"))
        despite = listed(run_jobs(redis_server, "--json", STEPBARRIER_JOB=f"{name}-a"))
    assert {f"{name}-a", f"{name}-b"} <= set(everything)
    assert {f"{name}-a", f"{name}-b"} <= set(despite)


def test_the_table_has_a_row_per_job(
    redis_server: RedisServer, jobs_of: Callable[..., BarrierConfig]
) -> None:
    name = prefix("table")
    with live_job(jobs_of(f"{name}-x"), 21, waits=(30,)):
        result = run_jobs(redis_server, "--job", f"{name}-*")
    assert result.exit_code == 0, result.output
    [header, row] = result.stdout.splitlines()
    assert header.split()[:3] == ["job", "run", "step"]
    assert row.split()[:4] == [f"{name}-x", "-", "21", "no"]
    assert "30" in row.split()


def test_no_matching_job_is_an_empty_listing_not_an_error(redis_server: RedisServer) -> None:
    nothing = prefix("nothing")
    assert listed(run_jobs(redis_server, "--job", f"{nothing}-*", "--json")) == {}
    shown = run_jobs(redis_server, "--job", f"{nothing}-*")
    assert shown.exit_code == 0 and shown.stdout.startswith("no jobs on Redis at redis://")


@pytest.mark.parametrize("pattern", ["team a", "x{y}", "a:b", "[ab]*", ""])
def test_an_invalid_pattern_is_a_usage_error(redis_server: RedisServer, pattern: str) -> None:
    result = run_jobs(redis_server, "--job", pattern)
    assert result.exit_code == 2 and "jobs pattern" in result.output


@pytest.mark.parametrize(
    ("key", "job"),
    [
        ("stepbarrier:{mnist-42}:state", "mnist-42"),
        (b"stepbarrier:{a.b_c-9}:state", "a.b_c-9"),
        ("stepbarrier:{a}:waiter:x}:state", None),  # a worker's entry with a crafted id
        ("stepbarrier:{a}:barrier:x}:state", None),
        ("stepbarrier:{two words}:state", None),
        ("stepbarrier:{job\n}:state", None),
        ("stepbarrier:{}:state", None),
        ("stepbarrier:{job}:targets", None),
        ("other:{job}:state", None),
        (b"stepbarrier:{caf\xc3\xa9}:state", None),
        ("stepbarrier:{" + "x" * 65 + "}:state", None),
    ],
)
def test_only_a_real_state_key_names_a_job(key: str | bytes, job: str | None) -> None:
    assert job_of_state_key(key) == job


def test_keys_that_only_look_like_state_keys_are_not_listed(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    name = prefix("lookalike")
    client.hset(f"stepbarrier:{{{name}-real}}:state", mapping={"step": 1, "generation": 1})
    client.set(f"stepbarrier:{{{name}-real}}:waiter:x}}:state", "a worker's crafted id")
    client.set(f"stepbarrier:{{{name} spaced}}:state", "not a job name")
    assert scan_jobs(client, (f"{name}*",), keep=10).lowest(0) == [f"{name}-real"]


def test_a_job_with_malformed_keys_is_listed_with_its_problems(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    name = prefix("malformed")
    client.set(JobKeys.for_job(name).state, "a string, not a hash")
    rows = listed(run_jobs(redis_server, "--job", name, "--json"))
    assert rows[name]["step"] is None and rows[name]["problems"]
    table = run_jobs(redis_server, "--job", name)
    assert table.exit_code == 0 and f"{name}: " in table.stdout  # the problem, under the table


def test_a_job_gone_between_the_scan_and_its_read_is_left_out(
    redis_server: RedisServer,
    jobs_of: Callable[..., BarrierConfig],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name = prefix("gone")
    scan = job_listing.scan_jobs

    def found_with_a_job_gone_since(*args: Any) -> Any:
        found = scan(*args)
        found.add(f"{name}-reset-meanwhile")  # found by the scan, gone before its read
        return found

    monkeypatch.setattr(job_listing, "scan_jobs", found_with_a_job_gone_since)
    with live_job(jobs_of(f"{name}-here"), 2):
        listing = list_jobs(jobs_of("any"), pattern=f"{name}-*")
    assert [job.job for job in listing.jobs] == [f"{name}-here"]


def test_past_the_limit_the_listing_says_it_is_incomplete(
    redis_server: RedisServer, client: redis.Redis, jobs_of: Callable[..., BarrierConfig]
) -> None:
    name = prefix("many")
    for number in range(3):
        client.hset(JobKeys.for_job(f"{name}-{number}").state, mapping={"step": number})
    listing = list_jobs(jobs_of("any"), pattern=f"{name}-*", limit=2)
    assert len(listing.jobs) == 2 and not listing.complete
    assert list_jobs(jobs_of("any"), pattern=f"{name}-*", limit=3).complete


def test_the_listing_needs_only_the_core_and_no_command_imports_prometheus_client() -> None:
    allowed = set(sys.stdlib_module_names) | {"redis", "tenacity", "stepbarrier", "__future__"}
    for line in Path(ROOT, "stepbarrier", "_inspect", "listing.py").read_text().splitlines():
        words = line.split()
        if len(words) >= 2 and words[0] in ("import", "from"):
            assert words[1].split(".")[0] in allowed, line
    code = (
        "import sys, stepbarrier.cli, stepbarrier._inspect.listing; "
        "assert 'prometheus_client' not in sys.modules, 'prometheus_client imported'"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=subprocess_env(), capture_output=True, timeout=60
    )
    assert done.returncode == 0, done.stderr.decode()
