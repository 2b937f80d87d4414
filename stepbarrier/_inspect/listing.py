"""Every job on a Redis at a glance, fairly per team: found by ``SCAN``, read in batches.

There is no index of jobs: on a Redis Cluster a key of its own would live in
another slot than a job's keys, where the job's functions could not write it.
So the jobs are found by their state keys, ``SCAN`` for
``stepbarrier:{PATTERN}:state``, on every master of a Cluster. That walks the
whole keyspace, so it is for operators only (``stepbarrier jobs``, the
exporter), never on the path of a chief or a worker.

Teams. A shared Redis holds several teams' jobs, and a team's chief may make
as many jobs as Redis's memory holds (100,000 tiny states are 15 MB). So a
listing covers one or more jobs patterns, one per team as ``stepbarrier acl
--jobs`` gives them (``team-a-*``; ``*``, every job, by default), and each job
counts for the first pattern its name matches. Every bound below is shared
fairly among the patterns (``status.fair_shares``: a pattern that needs less
than an even share leaves the rest to the others), so one team's jobs, however
many, never take another team's share. Within a pattern, the jobs read are
those with the lowest names: the same ones at every reading, not a sample that
changes with the hash order. A pattern with more jobs than its share is
truncated, and the listing says so (``PatternListing``). With the one pattern
``*``, the listing cannot tell teams apart: fairness between teams needs their
patterns.

Bounded work, whatever anyone planted:

- one ``SCAN`` walk for all the patterns, ``SCAN_COUNT`` keys per call, at most
  ``MAX_SCAN_CALLS`` calls per master (the exporter passes fewer); past it,
  every pattern is truncated: the scan saw part of the keyspace;
- at most ``MAX_JOBS`` jobs read (``limit``), ``READ_BATCH`` per round trip:
  ``waiter_read`` of each state, then ``ZCARD`` of each index, then the lowest
  targets of the jobs that have waiters, then their entries as
  ``registry.read_entries_of`` reads them (two round trips per batch);
- at most ``LISTING_WAITERS`` waiter entries per job (the registry is
  self-reported: a worker may add entries) and ``LISTING_WAITER_BUDGET`` per
  listing; a job whose waiters were not read says so, and counts them from its
  index (``ZCARD``).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import logging
import re
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from stepbarrier._config.checks import JOB_NAME
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.live_chief import is_stale
from stepbarrier._inspect.registry import (
    parse_index,
    queue_index_read,
    raise_transient,
    read_entries_of,
)
from stepbarrier._inspect.status import (
    NOT_LISTED,
    STATUS_RETRY_SECONDS,
    JobStatus,
    Snapshot,
    fair_shares,
    job_status,
    parse_snapshot,
)
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.roles import validate_jobs_pattern
from stepbarrier._protocol.wire import ChiefState
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.failures import translate
from stepbarrier._redis.functions import RedisCode
from stepbarrier._redis.retries import call_with_retries
from stepbarrier.errors import ConfigurationError

log = logging.getLogger("stepbarrier.job_listing")

MAX_JOBS = 10_000
"""Most jobs one listing reads, over all its patterns (each pattern's share:
``fair_shares``); more are left out, and the listing says so."""
MAX_PATTERNS = 32
"""Most jobs patterns (teams) one listing covers."""
SCAN_COUNT = 1000
"""Keys each ``SCAN`` call looks at: fewer round trips over a large keyspace, and
each call still short (a large COUNT would walk the keyspace in one command)."""
MAX_SCAN_CALLS = 10_000
"""Most ``SCAN`` calls of one listing, per master (about 10 million keys looked at);
a larger keyspace leaves the listing incomplete."""
READ_BATCH = 200
"""Jobs read per round trip."""
LISTING_WAITERS = 1_000
"""Most waiters read per job in a listing (the lowest targets)."""
LISTING_WAITER_BUDGET = 10_000
"""Most waiter entries one listing reads over all its jobs (each pattern's share:
``fair_shares``); a job read after its pattern's share is spent is listed with
its waiters counted from its index, not read (and says so)."""
REMEMBERED = 200_000
"""Most job names one listing remembers to count each job once (``SCAN`` may
return a key twice); past it, such a job may be counted twice."""

_STATE_HEAD, _STATE_TAIL = JobKeys.for_job("\0").state.split("\0")
"""What comes before and after the job's name in its state key."""


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
            most ``LISTING_WAITERS``: a worker may add entries of its own); the
            index's count (``ZCARD``) when the listing's waiter reads were spent
            before this job's (a problem says so).
        next_wait_until_step: The lowest step a worker waits for (``None``: none waits).
        oldest_wait: Seconds the longest-waiting worker has waited, by this
            host's clock against the worker's (``None``: none waits, or no
            waiter stored a plausible start).
        problems: Malformed content in the job's keys, or why it could not be read.
        stale: The chief may be gone: its heartbeat is older than three of its
            periods (at least 5 s), by the rule ``status`` marks STALE with
            (``stepbarrier._inspect.live_chief.is_stale``).
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
    stale: bool = False

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
            stale=is_stale(status),
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
class PatternListing:
    """How the jobs of one pattern (a team's) fared in a listing.

    Attributes:
        pattern: The jobs pattern, e.g. ``team-a-*``.
        found: Jobs the scan found that match it (and no pattern before it).
        read: Of them, how many were read: at most its share of ``MAX_JOBS``,
            those with the lowest names.
        truncated: Some of its jobs were left out: more than its share, or the
            scan stopped at its bound before it saw the whole keyspace.
    """

    pattern: str
    found: int
    read: int
    truncated: bool

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary."""
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class JobListing:
    """The jobs found, by name.

    Attributes:
        jobs: One summary per job, sorted by name.
        complete: False when some jobs were left out: a pattern had more than
            its share of ``MAX_JOBS``, or the scan stopped at ``MAX_SCAN_CALLS``.
        patterns: How each pattern fared (its jobs found and read, and whether
            some were left out).
        scan_complete: False when the scan stopped at its bound of calls.
    """

    jobs: tuple[JobSummary, ...]
    complete: bool = True
    patterns: tuple[PatternListing, ...] = ()
    scan_complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (``stepbarrier jobs --json``)."""
        return {
            "jobs": [job.to_dict() for job in self.jobs],
            "complete": self.complete,
            "scan_complete": self.scan_complete,
            "patterns": [pattern.to_dict() for pattern in self.patterns],
        }


def validate_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """``patterns`` as a tuple, each a valid jobs pattern, duplicates dropped.

    Raises:
        ConfigurationError: None given, more than ``MAX_PATTERNS``, or an
            invalid pattern.
    """
    unique = tuple(dict.fromkeys(validate_jobs_pattern(pattern) for pattern in patterns))
    if not unique or len(unique) > MAX_PATTERNS:
        raise ConfigurationError(
            f"give 1 to {MAX_PATTERNS} jobs patterns (one per team, e.g. 'team-a-*'), "
            f"got {len(unique)}",
            variable="jobs",
        )
    return unique


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
    # a name of JOB_NAME holds no brace: the key is exactly this job's state key
    return job if JOB_NAME.fullmatch(job) is not None else None


def _scan(
    client: RedisClient, match: str, calls: list[int], most: int | None = None
) -> Iterator[bytes | str]:
    """The keys matching ``match``, by ``SCAN`` with ``SCAN_COUNT``; ``calls[0]`` counts
    the calls, and stops the scan of a master past ``most`` (``MAX_SCAN_CALLS``)
    calls (``calls[1]`` is then set to 1: the scan is incomplete)."""
    most = MAX_SCAN_CALLS if most is None else most
    nodes: list[Any] = [None]
    if isinstance(client, RedisCluster):
        # every master holds its own slots' keys (replicas only copies of them)
        nodes = list(client.get_primaries())  # type: ignore[no-untyped-call]
    for node in nodes:
        cursor: Any = "0"
        for _ in range(most):
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


class _Found:
    """What one walk of the keyspace found: per pattern, its lowest ``keep`` job
    names and how many jobs match it."""

    def __init__(self, patterns: tuple[str, ...], keep: int) -> None:
        self.patterns = patterns
        # Redis's glob and fnmatch's agree on these patterns ('*', '?', no brackets)
        self.matchers = [re.compile(fnmatch.translate(pattern)).match for pattern in patterns]
        self.keep = max(0, keep)
        self.names: list[set[str]] = [set() for _ in patterns]
        self.counts = [0] * len(patterns)
        self.seen: set[str] = set()
        self.complete = True

    def add(self, job: str) -> None:
        number = 0  # one pattern: the scan's MATCH matched it already
        if len(self.matchers) > 1:
            number = next((n for n, match in enumerate(self.matchers) if match(job)), -1)
        if number < 0 or job in self.seen:
            return  # another team's job (a scan for several patterns), or seen already
        if len(self.seen) < REMEMBERED:
            self.seen.add(job)
        self.counts[number] += 1
        kept = self.names[number]
        kept.add(job)
        if len(kept) > 2 * self.keep:  # now and then: bounded memory, amortised sorting
            self.names[number] = set(sorted(kept)[: self.keep])

    def lowest(self, number: int) -> list[str]:
        """The pattern's lowest ``keep`` job names, sorted."""
        return sorted(self.names[number])[: self.keep]


def _find(
    client: RedisClient, patterns: tuple[str, ...], keep: int, scan_calls: int | None
) -> _Found:
    """One bounded walk of the keyspace for the jobs of ``patterns``."""
    # a glob cannot tell a state key from a key that only looks like one: every
    # name is checked (job_of_state_key), and given to the first pattern it matches
    match = JobKeys.for_job(patterns[0] if len(patterns) == 1 else "*").state
    found = _Found(patterns, keep)
    calls = [0, 0]
    for key in _scan(client, match, calls, scan_calls):
        job = job_of_state_key(key)
        if job is not None:
            found.add(job)
    if calls[1]:
        found.complete = False
        log.warning(
            "the scan for jobs stopped after %d SCAN calls of %d keys (per master): some "
            "jobs may be missing",
            MAX_SCAN_CALLS if scan_calls is None else scan_calls,
            SCAN_COUNT,
        )
    return found


def find_jobs(
    client: RedisClient,
    pattern: str = "*",
    *,
    limit: int = MAX_JOBS,
    incomplete: list[bool] | None = None,
) -> list[str]:
    """The names of the jobs whose names match ``pattern``: the lowest ``limit + 1``, sorted.

    The scan is bounded (``MAX_SCAN_CALLS`` of ``SCAN_COUNT`` keys per master):
    past it, the jobs found so far.

    Args:
        client: A client of the Redis (every master of a Cluster is scanned).
        pattern: A job name, or a glob such as ``team-a-*`` (as ``stepbarrier acl``'s).
        limit: Return at most one more than this many (more: there were more).
        incomplete: If given, ``True`` is appended when the scan stopped at its bound.

    Raises:
        ConfigurationError: ``pattern`` is not a valid jobs pattern.
    """
    found = _find(client, (validate_jobs_pattern(pattern),), limit + 1, None)
    if not found.complete and incomplete is not None:
        incomplete.append(True)
    return found.lowest(0)


def list_jobs(
    config: BarrierConfig,
    client: RedisClient | None = None,
    *,
    pattern: str = "*",
    patterns: Sequence[str] | None = None,
    limit: int = MAX_JOBS,
    scan_calls: int | None = None,
    retry_seconds: float = STATUS_RETRY_SECONDS,
    now: Callable[[], float] = time.time,
) -> JobListing:
    """Find the jobs of each pattern (each team) and read each one, in bounded work.

    A job the user may not read is listed with the refusal as its problem; a
    job whose keys vanished between the scan and its read (reset, expired) is
    left out.

    Args:
        config: Where Redis is and who to be; its job is ignored.
        client: A redis-py client; one is made (and closed) if omitted.
        pattern: A job name, or a glob such as ``team-a-*`` (if ``patterns`` is not given).
        patterns: The teams' patterns (at most ``MAX_PATTERNS``): each job counts
            for the first it matches, and each gets its fair share of ``limit``
            and of ``LISTING_WAITER_BUDGET``.
        limit: Most jobs read, over all the patterns.
        scan_calls: Most ``SCAN`` calls per master (``MAX_SCAN_CALLS`` if ``None``).
        retry_seconds: How long the scan, and each batch of reads, retries an
            unreachable Redis.
        now: The clock that waits are measured to (Unix time).

    Raises:
        ConfigurationError: An invalid pattern, or more than ``MAX_PATTERNS``.
        RedisUnavailable: Redis stayed unreachable (``RedisBusy``: it answered
            BUSY, a script running).
        RedisRefused: Redis refused the scan or the reads (authentication, ACL,
            no Functions library).
    """
    chosen = validate_patterns((pattern,) if patterns is None else patterns)
    made: list[RedisClient] = []

    def active() -> RedisClient:
        if client is not None:
            return client
        if not made:  # a Cluster client reads the slot map at once: within the retries
            made.append(make_client(config))
        return made[0]

    def retried(operation: Callable[[], Any], action: str) -> Any:
        return call_with_retries(
            operation,
            config,
            action=action,
            deadline=time.monotonic() + retry_seconds,
            clock=time.monotonic,
            sleep=time.sleep,
        )

    try:
        found: _Found = retried(lambda: _find(active(), chosen, limit, scan_calls), "list the jobs")
        shares = fair_shares([len(names) for names in found.names], limit)
        selected = [found.lowest(n)[:share] for n, share in enumerate(shares)]
        waiter_shares = fair_shares(
            [len(jobs) * LISTING_WAITERS for jobs in selected], LISTING_WAITER_BUDGET
        )
        code = RedisCode(active(), config)
        summaries: list[JobSummary] = []
        for jobs, waiter_share in zip(selected, waiter_shares, strict=True):
            budget = waiter_share
            for first in range(0, len(jobs), READ_BATCH):
                batch = jobs[first : first + READ_BATCH]
                read = functools.partial(_read_batch, config, code, active(), batch, budget, now)
                got, spent = retried(read, "read the jobs")
                summaries += got
                budget -= spent
    finally:
        for own in made:
            own.close()
    listed = tuple(
        PatternListing(
            pattern=chosen[n],
            found=found.counts[n],
            read=len(selected[n]),
            truncated=found.counts[n] > len(selected[n]) or not found.complete,
        )
        for n in range(len(chosen))
    )
    for part in listed:
        if part.found > part.read:
            log.warning(
                "%d jobs match %r: only %d are read (its share of %d jobs per listing)",
                part.found,
                part.pattern,
                part.read,
                limit,
            )
    return JobListing(
        tuple(sorted(summaries, key=lambda summary: summary.job)),
        complete=not any(part.truncated for part in listed),
        patterns=listed,
        scan_complete=found.complete,
    )


def _by_node(client: RedisClient, keys: list[JobKeys]) -> list[list[int]]:
    """The positions of ``keys`` grouped by the node that holds them (one group
    off a Cluster): ``RedisCode`` sends a round trip to one node."""
    if not isinstance(client, RedisCluster):
        return [list(range(len(keys)))]
    groups: dict[str, list[int]] = {}
    for position, job_keys in enumerate(keys):
        node = client.get_node_from_key(job_keys.state)  # type: ignore[no-untyped-call]
        groups.setdefault(node.name, []).append(position)
    return list(groups.values())


def _read_batch(
    config: BarrierConfig,
    code: RedisCode,
    client: RedisClient,
    jobs: list[str],
    budget: int,
    now: Callable[[], float],
) -> tuple[list[JobSummary], int]:
    """The summaries of ``jobs`` (those that vanished left out), and how many waiter
    entries were read of the ``budget`` left: four round trips at most."""
    keys = [JobKeys.for_job(job) for job in jobs]
    replies: list[Any] = [None] * len(jobs)
    for group in _by_node(client, keys):
        got = code.replies([("waiter_read", [keys[n].state, keys[n].reset], []) for n in group])
        raise_transient(got)
        for position, reply in zip(group, got, strict=True):
            replies[position] = reply
    done: dict[int, JobSummary] = {}
    snapshots: dict[int, Snapshot] = {}
    for position, reply in enumerate(replies):
        if isinstance(reply, redis.exceptions.NoPermissionError):
            done[position] = _unreadable(config, jobs[position], reply)
        elif isinstance(reply, Exception):
            problem = f"state unreadable: {' '.join(str(reply).split())[:120]}"
            snapshots[position] = Snapshot(0, ChiefState.empty(), None, [problem])
        else:
            snapshots[position] = parse_snapshot(reply)
    readable = sorted(snapshots)
    pipe = client.pipeline(transaction=False)
    for position in readable:
        pipe.zcard(keys[position].targets)
    cards = dict(zip(readable, pipe.execute(raise_on_error=False), strict=True))
    raise_transient(list(cards.values()))
    allotted: dict[int, int] = {}
    for position in readable:
        card = cards[position]
        if isinstance(card, Exception):
            parse_index(card, snapshots[position].problems)  # says the index is unreadable
            cards[position] = 0
        elif card:
            allotted[position] = min(card, LISTING_WAITERS, max(0, budget - sum(allotted.values())))
    asked = [position for position, most in allotted.items() if most]
    pipe = client.pipeline(transaction=False)
    for position in asked:
        queue_index_read(pipe, keys[position], count=allotted[position])
    raws = pipe.execute(raise_on_error=False) if asked else []
    raise_transient(raws)
    indexes: dict[int, list[tuple[bytes, int]]] = {}
    for position, raw in zip(asked, raws, strict=True):
        problems = snapshots[position].problems
        if isinstance(raw, redis.exceptions.NoPermissionError):
            problems.append(f"waiters not shown: {NOT_LISTED}")
            continue
        most = allotted[position]
        # as many as the index holds: no "more than" problem
        indexes[position] = parse_index(
            raw, problems, limit=most if most < cards[position] else most + 1
        )
    entries = read_entries_of(
        client, [(keys[p], indexes[p], snapshots[p].problems) for p in sorted(indexes)]
    )
    waiters = dict(zip(sorted(indexes), entries, strict=True))
    for position in readable:
        found = waiters.get(position, [])
        if isinstance(found, redis.exceptions.NoPermissionError):
            done[position] = _unreadable(config, jobs[position], found)
            continue
        snapshot = snapshots[position]
        card = cards[position]
        unread = card and not allotted.get(position)
        if unread or (card and allotted.get(position, 0) < min(card, LISTING_WAITERS)):
            snapshot.problems.append(
                f"waiters {'not' if unread else 'not all'} read: this listing's "
                f"{LISTING_WAITER_BUDGET:,} waiter reads (its pattern's share) are spent"
            )
        status = job_status(jobs[position], snapshot, found, snapshot.problems)
        if _vanished(status):
            continue
        summary = JobSummary.of(status, now())
        if unread:  # counted from the index, each entry unread
            summary = dataclasses.replace(summary, waiting_workers=min(card, LISTING_WAITERS))
        done[position] = summary
    spent = sum(len(index) for index in indexes.values())
    return [done[position] for position in sorted(done)], spent


def _unreadable(config: BarrierConfig, job: str, refusal: BaseException) -> JobSummary:
    """A job found but not read: the user may not read its keys."""
    explained = translate(
        refusal, dataclasses.replace(config, job=job), action="read the job's status"
    )
    reason = " ".join(str(explained).split())
    return JobSummary.unreadable(job, f"not readable by this user: {reason}")


def _vanished(status: JobStatus) -> bool:
    return (
        status.step is None
        and status.generation is None
        and status.heartbeat_age is None
        and not (status.done or status.waiters or status.problems)
    )
