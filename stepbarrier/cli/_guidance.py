"""What the command says when a job is not there, or its chief seems gone.

``status``, ``wait`` and ``reset`` name a job that has no keys on this Redis
(most often a typo in ``--job``) and a few jobs that are there, found by a
short bounded ``SCAN`` (``stepbarrier._inspect.missing``); a user that may not
``SCAN`` is told how to list them.
"""

from __future__ import annotations

import click

from stepbarrier._config.defaults import DEFAULT_HEARTBEAT
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.live_chief import HAND_PUBLISHED
from stepbarrier._inspect.missing import OtherJobs, other_jobs
from stepbarrier._inspect.status import JobStatus
from stepbarrier._protocol.freshness import stale_after
from stepbarrier.cli._context import EXIT_NO_JOB
from stepbarrier.errors import StepBarrierError

LIST_THEM = "list them with `stepbarrier jobs` as a user that may SCAN (e.g. the monitor user)"


class NoSuchJob(click.ClickException):
    """The job has no keys on this Redis (exit ``EXIT_NO_JOB``)."""

    exit_code = EXIT_NO_JOB


def missing_job_message(config: BarrierConfig, *, yet: bool = False) -> str:
    """``no job 'x' on this Redis; jobs here: a, b`` (or how to list them)."""
    head = f"no job {config.job!r} on this Redis"
    if yet:
        head += " yet (no chief has written its step)"
    try:
        others = other_jobs(config)
    except StepBarrierError as exc:
        return f"{head} (could not list the jobs here: {' '.join(str(exc).split())[:200]})"
    return f"{head}; {describe_others(others)}"


def describe_others(others: OtherJobs) -> str:
    if not others.may_scan:
        return f"this user may not list the jobs here: {LIST_THEM}"
    if not others.names:
        return (
            "no other job either" if not others.more else f"none found in a short scan: {LIST_THEM}"
        )
    names = ", ".join(others.names)
    if others.more:
        return f"jobs here include: {names} (`stepbarrier jobs` lists them all)"
    return f"jobs here: {names}"


def stale_limit(status: JobStatus) -> float | None:
    """The heartbeat age past which ``status``'s chief counts as stale, or ``None`` if
    the question does not arise (job done, no chief yet, a step published by hand)."""
    if status.done or status.heartbeat_age is None:
        return None
    if status.chief is not None and status.chief.startswith(HAND_PUBLISHED):
        return None
    period = status.heartbeat_period if status.heartbeat_period is not None else DEFAULT_HEARTBEAT
    return stale_after(period)


def is_stale(status: JobStatus) -> bool:
    limit = stale_limit(status)
    return limit is not None and status.heartbeat_age is not None and status.heartbeat_age > limit
