"""``stepbarrier jobs`` and the exporter on a real local Redis Cluster with
ops/redis/users.acl: the jobs are found on every master, and the ``monitor``
user is enough there too."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
from click.testing import CliRunner

from stepbarrier import BarrierConfig
from stepbarrier._protocol.keys import JobKeys, job_index
from stepbarrier._redis.functions import library_source
from stepbarrier.cli import cli
from stepbarrier.cli._exporter import serve
from tests.barrier_helpers import eventually
from tests.cluster.conftest import Timings
from tests.cluster_harness import LocalCluster
from tests.observability import job_value, live_job, prefix, scrape
from tests.ops_redis import ACL_FILE, PASSWORDS, SECRETS

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def cluster(request: pytest.FixtureRequest) -> Iterator[LocalCluster]:
    """The shipped users on every node, the library loaded as an administrator would."""
    started = time.monotonic()
    with LocalCluster(aclfile=ACL_FILE) as local:
        local.load_functions(library_source())
        Timings(request.module.__name__).record("ACL cluster start", time.monotonic() - started)
        yield local


def as_user(cluster: LocalCluster, job: str, user: str) -> BarrierConfig:
    return BarrierConfig(
        job=job,
        redis_url=cluster.seed_url,
        redis_cluster=True,
        redis_username=user,
        redis_password=PASSWORDS[user],
        heartbeat=0.2,
        stall_timeout=60.0,
    )


def jobs_on_every_master(cluster: LocalCluster, name: str, per_master: int = 1) -> list[str]:
    """Job names whose slots are spread over every master, ``per_master`` on each."""
    by_master: dict[int, list[str]] = {port: [] for port in cluster.masters}
    number = 0
    while any(len(jobs) < per_master for jobs in by_master.values()):
        job = f"{name}-{number}"
        owner = cluster.owner_of(JobKeys.for_job(job).state)
        if len(by_master[owner]) < per_master:
            by_master[owner].append(job)
        number += 1
    return sorted(job for jobs in by_master.values() for job in jobs)


def test_jobs_and_the_exporter_cover_every_master_as_the_monitor(cluster: LocalCluster) -> None:
    name = prefix("spread")
    jobs = jobs_on_every_master(cluster, name)
    waited = jobs[0]
    with ExitStack() as running:
        for step, job in enumerate(jobs, start=1):
            chief, worker = as_user(cluster, job, "chief"), as_user(cluster, job, "worker")
            waits = (50,) if job == waited else ()
            running.enter_context(live_job(chief, step, waits, worker=worker))
        login = ["--username", "monitor", "--password-file", str(SECRETS / "monitor.password")]
        command = ["jobs", "--cluster", "--redis-url", cluster.seed_url, *login]
        listed = CliRunner().invoke(cli, [*command, "--job", f"{name}-*", "--json"])
        monitor = as_user(cluster, "any", "monitor")
        with serve(monitor, port=0, pattern=f"{name}-*") as exporter:
            samples = scrape(exporter.url)
    assert listed.exit_code == 0, listed.output
    rows = {row["job"]: row for row in json.loads(listed.stdout)["jobs"]}
    assert sorted(rows) == jobs
    assert {cluster.owner_of(JobKeys.for_job(job).state) for job in rows} == set(cluster.masters)
    assert all(row["problems"] == [] for row in rows.values())
    assert (rows[waited]["waiting_workers"], rows[waited]["next_wait_until_step"]) == (1, 50)
    assert samples["stepbarrier_up"] == [({}, 1.0)]
    assert samples["stepbarrier_jobs"] == [({}, float(len(jobs)))]
    assert job_value(samples, "stepbarrier_step", jobs[-1]) == len(jobs)
    assert job_value(samples, "stepbarrier_waiting_workers", waited) == 1


def test_a_job_index_lists_its_jobs_on_every_master(cluster: LocalCluster) -> None:
    """Issue 34: chiefs with ``jobs_pattern`` keep their jobs in the pattern's index,
    which lies in a slot of its own (its hash tag is the pattern); the listing reads it
    there, and finds the jobs wherever their keys live (the shipped chief's pattern is
    '*': its user may write that index alone)."""
    name = prefix("indexed")
    jobs = jobs_on_every_master(cluster, name)
    with ExitStack() as running:
        for step, job in enumerate(jobs, start=1):
            chief = dataclasses.replace(as_user(cluster, job, "chief"), jobs_pattern="*")
            running.enter_context(live_job(chief, step))
        admin = cluster.client()
        eventually(lambda: all(admin.zscore(job_index("*"), job) for job in jobs))
        login = ["--username", "monitor", "--password-file", str(SECRETS / "monitor.password")]
        command = ["jobs", "--cluster", "--redis-url", cluster.seed_url, *login]
        listed = CliRunner().invoke(cli, [*command, "--job", "*", "--json"])
    assert listed.exit_code == 0, listed.output
    data = json.loads(listed.stdout)
    rows = {row["job"]: row for row in data["jobs"]}
    assert set(jobs) <= set(rows)
    assert all(rows[job]["problems"] == [] for job in jobs)  # each in the index
    assert [(p["pattern"], p["indexed"]) for p in data["patterns"]] == [("*", True)]
    index_owner = cluster.owner_of(job_index("*"))
    assert {cluster.owner_of(JobKeys.for_job(job).state) for job in jobs} - {index_owner}
