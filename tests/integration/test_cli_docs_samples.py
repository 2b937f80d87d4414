"""The sample outputs of docs/cli.md and docs/operations.md are what the command
prints: each is rendered here from the values it shows, at 80 columns, piped, and
compared line by line (issue 37: a newcomer compares them with their terminal)."""

from __future__ import annotations

import calendar
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig
from stepbarrier._inspect.listing import JobListing, JobSummary
from stepbarrier._inspect.registry import WaiterInfo
from stepbarrier._inspect.status import JobStatus
from stepbarrier.cli._views.jobs import jobs_view
from stepbarrier.cli._views.output import plain_text
from stepbarrier.cli._views.status import status_view
from tests.conftest import ROOT

DOCS = Path(ROOT) / "docs"
SINCE = calendar.timegm((2026, 11, 30, 5, 41, 9, 0, 0, 0))
"""The sample's "waiting since", in UTC."""


@pytest.fixture
def utc(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC, as the samples show it."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def sample(page: str, command: str) -> str:
    """The lines a page's console block shows after ``$ command``, to the next prompt."""
    lines = (DOCS / page).read_text(encoding="utf-8").splitlines()
    start = lines.index(f"$ {command}") + 1
    end = next(i for i in range(start, len(lines)) if lines[i].startswith(("$ ", "```")))
    return "\n".join(lines[start:end])


def test_the_status_sample_is_what_status_prints(utc: None) -> None:
    status = JobStatus(
        job="mnist-42",
        step=57,
        generation=1796017268056208,
        heartbeat_age=0.4,
        done=False,
        chief="trainer-0:15705",
        run_id="slurm-81",
        beat=1796017268056931,
        vouch=True,
        heartbeat_period=1.0,
        waiters=(
            WaiterInfo(
                task_id=2, wait_until_step=54, since=SINCE + 0.266, host="trainer-2", pid=15717
            ),
            WaiterInfo(
                task_id=3, wait_until_step=69, since=SINCE + 0.277, host="trainer-3", pid=15718
            ),
        ),
    )
    here = BarrierConfig(job="mnist-42", run_id="slurm-81", run_id_source="SLURM_JOB_ID")
    shown = plain_text(status_view(status, here=here, now=SINCE + 1.77), 80)
    assert shown == sample("cli.md", "stepbarrier status")


def test_the_jobs_sample_is_what_jobs_prints() -> None:
    listing = JobListing(
        jobs=(
            JobSummary("mnist-42", "run-7", 57, 1, False, 0.4, 2, 69, 1.5),
            JobSummary("resnet-3", None, 9000, 1, True, 120.0, 0, None, None),
            JobSummary("vgg-7", "run-9", 310, 1, False, 42.0, 4, 400, 40.2, stale=True),
        )
    )
    shown = plain_text(jobs_view(listing, where="redis"), 80)
    command = (
        "stepbarrier jobs --redis-url redis://redis:6379/0 --username monitor "
        "--password-file monitor.password"
    )
    assert shown == sample("operations.md", command)
