"""Every job on a Redis at a glance: found by ``SCAN``, each read with ``read_status``.

There is no index of jobs: on a Redis Cluster a key of its own would live in
another slot than a job's keys, where the job's functions could not write it.
So the jobs are found by their state keys, ``SCAN`` for
``stepbarrier:{PATTERN}:state``, on every master of a Cluster. That walks the
whole keyspace, so it is for operators only (``stepbarrier jobs``, the
exporter), never on the path of a chief or a worker.

Bounded work: each ``SCAN`` looks at ``SCAN_COUNT`` keys (a short command, never
one that walks a large keyspace at once), a listing sends at most
``MAX_SCAN_CALLS`` of them per master and reads at most ``MAX_JOBS`` jobs, each
with at most ``LISTING_WAITERS`` waiter entries (the registry is self-reported:
a worker may add entries) and at most ``LISTING_WAITER_BUDGET`` in all; past a
bound, the listing says it is incomplete.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from redis.cluster import RedisCluster

from stepbarrier._config.checks import JOB_NAME
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.status import STATUS_RETRY_SECONDS, JobStatus, read_status
from stepbarrier._protocol.keys import PREFIX, JobKeys
from stepbarrier._protocol.roles import validate_jobs_pattern
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.retries import call_with_retries
from stepbarrier.errors import RedisRefused

log = logging.getLogger("stepbarrier.job_listing")

MAX_JOBS = 10_000
"""Most jobs one listing reads (each costs three round trips, the last of them one
command per waiting worker, as ``read_status``); more are left out."""
SCAN_COUNT = 1000
"""Keys each ``SCAN`` call looks at: fewer round trips over a large keyspace, and
each call still short (a large COUNT would walk the keyspace in one command)."""
MAX_SCAN_CALLS = 10_000
"""Most ``SCAN`` calls of one listing, per master (about 10 million keys looked at);
a larger keyspace leaves the listing incomplete."""
LISTING_WAITERS = 1_000
"""Most waiters read per job in a listing (the lowest targets)."""
LISTING_WAITER_BUDGET = 100_000
"""Most waiter entries one listing reads over all its jobs; the jobs read after it
is spent are listed without their waiters (and say so)."""

_STATE_HEAD = f"{PREFIX}:{{"
_STATE_TAIL = "}:state"


@dataclass(frozen=True)
class JobSummary:
    """One line of the listing: a job's progress, without the workers one by one.

    Attributes:
        job: The job name.
        run_id: The run id its chief stored, if any.
        step: The chief's stored step (``None`` before any chief wrote one).
        generation: The chief generation that wrote it.
        done: True once the chief closed the job.
        heartbeat_age: Seconds since the chief's last write, by Redis's clock.
        waiting_workers: Registered waiting workers, as they report themselves (at
            most ``LISTING_WAITERS``: a worker may add entries of its own).
        next_wait_until_step: The lowest step a worker waits for (``None``: none waits).
        oldest_wait: Seconds the longest-waiting worker has waited, by this
            host's clock against the worker's (``None``: none waits, or no
            waiter stored a plausible start).
        problems: Malformed content in the job's keys, or why it could not be read.
    """

    job: str
    run_id: str | None
    step: int | None
    generation: int | None
    done: bool
    heartbeat_age: float | None
    waiting_workers: int
    next_wait_until_step: int | None
    oldest_wait: float | None
    problems: tuple[str, ...] = ()

    @classmethod
    def of(cls, status: JobStatus, now: float) -> JobSummary:
        """The summary of ``status``; ``now`` is the Unix time the waits are measured to."""
        starts = [w.since for w in status.waiters if w.since is not None]
        return cls(
            job=status.job,
            run_id=status.run_id,
            step=status.step,
            generation=status.generation,
            done=status.done,
            heartbeat_age=status.heartbeat_age,
            waiting_workers=len(status.waiters),
            next_wait_until_step=min((w.wait_until_step for w in status.waiters), default=None),
            oldest_wait=round(max(0.0, now - min(starts)), 3) if starts else None,
            problems=status.problems,
        )

    @classmethod
    def unreadable(cls, job: str, reason: str) -> JobSummary:
        """A job found but not read (the user may not read its keys)."""
        return cls(job, None, None, None, False, None, 0, None, None, (reason,))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (``stepbarrier jobs --json``); every number is finite."""
        data = dataclasses.asdict(self)
        data["problems"] = list(self.problems)
        return data


@dataclass(frozen=True)
class JobListing:
    """The jobs found, by name.

    Attributes:
        jobs: One summary per job.
        complete: False when more than ``MAX_JOBS`` jobs matched and some were left out,
            or the scan stopped at ``MAX_SCAN_CALLS``.
    """

    jobs: tuple[JobSummary, ...]
    complete: bool = True


def job_of_state_key(key: bytes | str) -> str | None:
    """The job whose state key is ``key``, or ``None`` if ``key`` is no job's state key.

    A glob cannot tell a state key from a key that only looks like one (a
    worker's entry ``stepbarrier:{a}:waiter:x}:state`` matches
    ``stepbarrier:{*}:state``), so the name is taken out and checked strictly.
    """
    try:
        text = key.decode("ascii") if isinstance(key, bytes) else key
    except UnicodeDecodeError:
        return None
    if not (text.startswith(_STATE_HEAD) and text.endswith(_STATE_TAIL)):
        return None
    job = text[len(_STATE_HEAD) : -len(_STATE_TAIL)]
    if JOB_NAME.fullmatch(job) is None:
        return None
    return job if JobKeys.for_job(job).state == text else None


def _scan(client: RedisClient, match: str, calls: list[int]) -> Iterator[bytes | str]:
    """The keys matching ``match``, by ``SCAN`` with ``SCAN_COUNT``; ``calls[0]`` counts
    the calls, and stops the scan of a master past ``MAX_SCAN_CALLS`` (``calls[1]``
    is then set to 1: the scan is incomplete)."""
    nodes: list[Any] = [None]
    if isinstance(client, RedisCluster):
        # every master holds its own slots' keys (replicas only copies of them)
        nodes = list(client.get_primaries())  # type: ignore[no-untyped-call]
    for node in nodes:
        cursor: Any = "0"
        for _ in range(MAX_SCAN_CALLS):
            if node is None:
                cursor, keys = client.scan(cursor=cursor, match=match, count=SCAN_COUNT)
            else:
                cursor, keys = client.scan(
                    cursor=cursor, match=match, count=SCAN_COUNT, target_nodes=node
                )
            if isinstance(cursor, dict):
                # a cluster client answers {node name: cursor} for the node it asked
                cursor = next(iter(cursor.values()), 0)
            calls[0] += 1
            yield from keys
            if int(cursor) == 0:
                break
        else:
            calls[1] = 1


def find_jobs(
    client: RedisClient,
    pattern: str = "*",
    *,
    limit: int = MAX_JOBS,
    incomplete: list[bool] | None = None,
) -> list[str]:
    """The names of the jobs whose names match ``pattern``, sorted; at most ``limit + 1``.

    The scan is bounded (``MAX_SCAN_CALLS`` of ``SCAN_COUNT`` keys per master):
    past it, the jobs found so far.

    Args:
        client: A client of the Redis (every master of a Cluster is scanned).
        pattern: A job name, or a glob such as ``team-a-*`` (as ``stepbarrier acl``'s).
        limit: Stop once more than this many jobs were found.
        incomplete: If given, ``True`` is appended when the scan stopped at its bound.

    Raises:
        ConfigurationError: ``pattern`` is not a valid jobs pattern.
    """
    match = JobKeys.for_job(validate_jobs_pattern(pattern)).state
    found: set[str] = set()  # SCAN may return a key twice
    calls = [0, 0]
    for key in _scan(client, match, calls):
        job = job_of_state_key(key)
        if job is not None:
            found.add(job)
            if len(found) > limit:
                break
    if calls[1]:
        log.warning(
            "the scan for jobs matching %r stopped after %d SCAN calls of %d keys: "
            "some jobs may be missing",
            pattern,
            MAX_SCAN_CALLS,
            SCAN_COUNT,
        )
        if incomplete is not None:
            incomplete.append(True)
    return sorted(found)


def list_jobs(
    config: BarrierConfig,
    client: RedisClient | None = None,
    *,
    pattern: str = "*",
    limit: int = MAX_JOBS,
    retry_seconds: float = STATUS_RETRY_SECONDS,
    now: Callable[[], float] = time.time,
) -> JobListing:
    """Find the jobs whose names match ``pattern`` and read each one.

    A job the user may not read is listed with the refusal as its problem; a
    job whose keys vanished between the scan and its read (reset, expired) is
    left out.

    Args:
        config: Where Redis is and who to be; its job is ignored.
        client: A redis-py client; one is made (and closed) if omitted.
        pattern: A job name, or a glob such as ``team-a-*``.
        limit: Most jobs read.
        retry_seconds: How long the scan retries an unreachable Redis (each
            job's read retries as ``read_status`` does).
        now: The clock that waits are measured to (Unix time).

    Raises:
        ConfigurationError: ``pattern`` is not a valid jobs pattern.
        RedisUnavailable: Redis stayed unreachable.
        RedisRefused: Redis refused the scan or the reads (authentication, ACL,
            no Functions library).
    """
    validate_jobs_pattern(pattern)
    made: list[RedisClient] = []

    incomplete: list[bool] = []

    def scan() -> list[str]:
        incomplete.clear()
        if client is not None:
            return find_jobs(client, pattern, limit=limit, incomplete=incomplete)
        if not made:  # a Cluster client reads the slot map at once: within the retries
            made.append(make_client(config))
        return find_jobs(made[0], pattern, limit=limit, incomplete=incomplete)

    try:
        names = call_with_retries(
            scan,
            config,
            action="list the jobs",
            deadline=time.monotonic() + retry_seconds,
            clock=time.monotonic,
            sleep=time.sleep,
        )
        active = client if client is not None else made[0]
        budget = [LISTING_WAITER_BUDGET]
        summaries = [_summary(config, active, job, now, budget) for job in names[:limit]]
    finally:
        for own in made:
            own.close()
    if len(names) > limit:
        log.warning("more than %d jobs match %r: only the first %d are read", limit, pattern, limit)
    found = tuple(summary for summary in summaries if summary is not None)
    return JobListing(found, complete=len(names) <= limit and not incomplete)


def _summary(
    config: BarrierConfig,
    client: RedisClient,
    job: str,
    now: Callable[[], float],
    budget: list[int],
) -> JobSummary | None:
    most = min(LISTING_WAITERS, budget[0])
    try:
        status = read_status(
            dataclasses.replace(config, job=job), client, max_waiters=most, barriers=False
        )
    except RedisRefused as exc:
        if exc.kind != "permission":  # authentication, no library: the same for every job
            raise
        reason = " ".join(str(exc).split())
        return JobSummary.unreadable(job, f"not readable by this user: {reason}")
    budget[0] -= len(status.waiters)
    if _vanished(status):
        return None
    if not most:
        spent = f"waiters not read: this listing's {LISTING_WAITER_BUDGET} waiter reads are spent"
        status = dataclasses.replace(status, problems=(*status.problems, spent))
    return JobSummary.of(status, now())


def _vanished(status: JobStatus) -> bool:
    return (
        status.step is None
        and status.generation is None
        and status.heartbeat_age is None
        and not (status.done or status.waiters or status.problems)
    )
