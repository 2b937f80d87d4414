"""Each task's progress under the roles' ACL rules (issue 38): a team-a worker reports
its own job's progress through the library, never another team's, and cannot write
the chief's state with it; the team's monitor reads every task of its own jobs.

The users are ``stepbarrier acl``'s output (team a) next to the shipped users, as
in ``test_acl_isolation``; the library is loaded by the installer, as ops does.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import redis

from stepbarrier import ProgressReporter, StepPublisher, read_status
from stepbarrier._redis.functions import function_name
from tests.ops_redis import HARNESS_LINE, OpsRedis, acl_with
from tests.security.test_acl_isolation import TEAM_A, config, generated_line, team_job


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OpsRedis]:
    lines = [generated_line(role, user, "team-a-*", pw) for user, (role, pw) in TEAM_A.items()]
    server = OpsRedis(acl_file=acl_with(tmp_path_factory.mktemp("acl"), *lines, HARNESS_LINE))
    server.start()
    yield server
    server.cleanup()


def test_a_team_a_worker_reports_its_jobs_progress_and_the_monitor_reads_it(
    team_server: OpsRedis, job: str
) -> None:
    name = team_job("a", job)
    with StepPublisher(config(team_server, name, "a-chief")) as publisher:
        publisher.publish(12)
        assert publisher.flush(10)
        with ProgressReporter(config(team_server, name, "a-worker", task_id=3)) as progress:
            progress.report(7)
            assert progress.flush(10), progress.last_error
        with ProgressReporter(config(team_server, name, "a-chief", task_id=0)) as chief:
            chief.report(12)
            assert chief.flush(10), chief.last_error
        status = read_status(config(team_server, name, "a-monitor"))
    assert [(t.task_id, t.step, t.behind) for t in status.tasks] == [(0, 12, 0), (3, 7, 5)]
    assert not status.problems


def test_a_team_a_worker_cannot_report_into_a_team_b_job(team_server: OpsRedis, job: str) -> None:
    reporter = ProgressReporter(config(team_server, team_job("b", job), "a-worker", task_id=1))
    reporter.report(5)
    assert not reporter.flush(5.0)
    assert not reporter.active  # refused for good, said once
    assert reporter.last_failure is not None and reporter.last_failure.kind == "permission"
    reporter.close()
    worker = team_server.as_user("a-worker", TEAM_A["a-worker"][1])
    keys = config(team_server, team_job("b", job), "a-worker").keys
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.fcall(function_name("report_progress"), 1, keys.progress, "1", "5", "60")
        # nor, on its own job, the chief's state through the function
        own = config(team_server, team_job("a", job), "a-worker").keys
        with pytest.raises(redis.exceptions.NoPermissionError):
            worker.fcall(function_name("report_progress"), 1, own.state, "1", "5", "60")
    finally:
        worker.close()


def test_a_team_a_monitor_cannot_report_progress(team_server: OpsRedis, job: str) -> None:
    monitor = team_server.as_user("a-monitor", TEAM_A["a-monitor"][1])
    keys = config(team_server, team_job("a", job), "a-monitor").keys
    try:
        with pytest.raises(redis.exceptions.NoPermissionError):
            monitor.fcall(function_name("report_progress"), 1, keys.progress, "1", "5", "60")
    finally:
        monitor.close()
