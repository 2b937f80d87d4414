"""What a command says when its job is not there, naming a few that are
(``stepbarrier._inspect.missing``; docs/cli.md#a-job-that-is-not-there)."""

from __future__ import annotations

import click

from stepbarrier._config.environment import job_in_env
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.missing import OtherJobs, is_missing, other_jobs
from stepbarrier._inspect.status import JobStatus
from stepbarrier._inspect.summary import WaiterSummary
from stepbarrier.cli._context import EXIT_NO_JOB, current_session
from stepbarrier.errors import StepBarrierError

CUT = " ..."
LIST_THEM = "list them with `stepbarrier jobs` as a user that may SCAN (e.g. the monitor user)"


class NoSuchJob(click.ClickException):
    exit_code = EXIT_NO_JOB


def missing_job_message(config: BarrierConfig, *, yet: bool = False) -> str:
    """``no job 'x' on this Redis; jobs here: a, b`` (or how to list them)."""
    head = f"no job {config.job!r} on this Redis"
    if yet:
        head += " yet (no chief has written its step)"
    try:
        others = other_jobs(config)
    except StepBarrierError as exc:
        return f"{head} (could not list the jobs here: {one_line(str(exc))})"
    return f"{head}; {describe_others(others)}"


def config_for_any_job(placeholder: str) -> tuple[BarrierConfig, bool]:
    """The command's settings, and whether they name a job: a command about the whole
    Redis (``doctor``, ``functions``) takes ``placeholder`` for the key names and the
    messages when none is given."""
    session = current_session()
    named = "STEPBARRIER_JOB" in session.overrides or job_in_env()
    return session.config(None if named else placeholder), named


def one_line(text: str, width: int = 200) -> str:
    """``text`` on one line, shortened to ``width`` characters at a word's end (never
    cut mid-word: it goes into progress lines and notes)."""
    text = " ".join(text.split())
    if len(text) <= width:
        return text
    cut = text.rfind(" ", 0, width - len(CUT) + 1)
    return (text[:cut] if cut > 0 else text[: width - len(CUT)]) + CUT


def note_if_missing(
    config: BarrierConfig, status: JobStatus, summary: WaiterSummary | None = None
) -> None:
    """Say on stderr that the job is not there (``status``, ``watch``), naming the jobs
    that are; a ``summary`` counts the waiters ``status`` then does not list."""
    if is_missing(status, waiting=summary.waiting if summary else 0):
        click.echo(f"Note: {missing_job_message(config)}", err=True)


def describe_others(others: OtherJobs) -> str:
    if not others.may_scan:
        return f"this user may not list the jobs here: {LIST_THEM}"
    if not others.names:
        return f"none found in a short scan: {LIST_THEM}" if others.more else "no other job either"
    names, guesses = ", ".join(others.names), " or ".join(map(repr, others.close))
    close = f"did you mean {guesses}? " if guesses else ""
    if others.more:
        return f"{close}jobs here include: {names} (`stepbarrier jobs` lists them all)"
    return f"{close}jobs here: {names}"
