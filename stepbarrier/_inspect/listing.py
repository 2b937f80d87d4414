"""Every job on a Redis at a glance, fairly per team: found in the teams' job indexes
and by ``SCAN``, read in batches.

A pattern's jobs are the members of its job index (``keys.job_index``), if it
has one: the chiefs given that pattern (``STEPBARRIER_JOBS_PATTERN``, their
team's) keep it, and one bounded read (``index_read``) lists them, whatever
else the keyspace holds; and the jobs found by their state keys: ``scan_keys``
walks every master, the whole keyspace (a job kept in no index is found so
only), so operators only (``stepbarrier jobs``, the exporter), never a chief or
a worker.

Teams: docs/operations.md#jobs-metrics-and-alerts (every bound below is shared
among the patterns by ``status.fair_shares``); ``truncation_lines`` says what
was cut short.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import functools
import logging
import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from stepbarrier._config.checks import JOB_NAME
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.registry import (
    as_refused,
    index_length,
    one_line,
    parse_index,
    raise_transient,
    read_entries_of,
    replies_of,
)
from stepbarrier._inspect.status import (
    NOT_LISTED,
    STATUS_RETRY_SECONDS,
    JobStatus,
    Snapshot,
    fair_shares,
    is_stale,
    job_status,
    json_ready,
    parse_snapshot,
)
from stepbarrier._protocol.calls import Call, index_call, read_call
from stepbarrier._protocol.keys import JobKeys, job_index
from stepbarrier._protocol.library import MAX_INDEX_READ
from stepbarrier._protocol.roles import validate_jobs_pattern
from stepbarrier._protocol.wire import ChiefState
from stepbarrier._redis.client import RedisClient, ScanTally, make_client, scan_keys
from stepbarrier._redis.failures import translate
from stepbarrier._redis.functions import RedisCode
from stepbarrier._redis.retries import call_with_retries
from stepbarrier.errors import ConfigurationError

log = logging.getLogger("stepbarrier.job_listing")

MAX_JOBS = 10_000
"""Most jobs one listing reads, over all its patterns."""
MAX_PATTERNS = 32
"""Most jobs patterns (teams) one listing covers."""
SCAN_COUNT = 1000
"""Keys each ``SCAN`` call looks at: fewer round trips over a large keyspace, and
each call still short (a large COUNT would walk the keyspace in one command)."""
MAX_SCAN_CALLS = 10_000
"""Most ``SCAN`` calls of one listing, per master (about 10 million keys looked at)."""
READ_BATCH = 200
"""Jobs read per round trip."""
LISTING_WAITERS = 1_000
"""Most waiters read per job in a listing (the lowest targets)."""
LISTING_WAITER_BUDGET = 10_000
"""Most waiter entries one listing reads over all its jobs."""
REMEMBERED = 200_000
"""Most job names one listing remembers to count each job once (``SCAN`` may
return a key twice); past it, such a job may be counted twice."""

_STATE_HEAD, _STATE_TAIL = JobKeys.for_job("\0").state.split("\0")
"""What comes before and after the job's name in its state key."""


@dataclass(frozen=True)
class JobSummary:
    """One line of the listing: a job's progress, without the workers one by one.

    The chief's fields are ``JobStatus``'s. ``waiting_workers`` is the index's
    count when the listing's waiter reads were spent before this job's (a
    problem says so); ``oldest_wait`` is by this host's clock against the worker's.
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


@dataclass(frozen=True)
class PatternListing:
    """How the jobs of one pattern (a team's) fared: ``found`` in its job index
    (``indexed``: it has one) and by the scan (matching no pattern before it),
    ``read`` of them, ``truncated`` if some were or may have been left out (more than
    its share, an index longer than one read, or the scan stopped at its bound)."""

    pattern: str
    found: int
    read: int
    truncated: bool
    indexed: bool = False
    index_truncated: bool = False  # its index held more than one read lists


@dataclass(frozen=True)
class JobListing:
    """The jobs found, sorted by name; ``complete`` is False when a pattern is
    truncated, ``scan_complete`` when the scan stopped at its bound of calls."""

    jobs: tuple[JobSummary, ...]
    complete: bool = True
    patterns: tuple[PatternListing, ...] = ()
    scan_complete: bool = True

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (``stepbarrier jobs --json``); every number is finite."""
        return json_ready(self)


def validate_patterns(patterns: Sequence[str]) -> tuple[str, ...]:
    """``patterns`` as a tuple, each a valid jobs pattern, duplicates dropped; a
    ``ConfigurationError`` if none, more than ``MAX_PATTERNS``, or an invalid one."""
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


class Found:
    """What the job indexes and one walk of the keyspace found: per pattern, its
    lowest ``keep`` job names and how many jobs match it."""

    def __init__(self, patterns: tuple[str, ...], keep: int) -> None:
        # Redis's glob and fnmatch's agree on these patterns ('*', '?', no brackets)
        self.matchers = [re.compile(fnmatch.translate(pattern)).match for pattern in patterns]
        self.keep = max(0, keep)
        self.names: list[set[str]] = [set() for _ in patterns]
        self.counts = [0] * len(patterns)
        self.seen: set[str] = set()
        self.complete = True  # the scan walked the whole keyspace
        self.indexed: set[int] = set()  # the patterns that have a job index
        self.cut: set[int] = set()  # the indexed patterns whose index one read did not list
        self.in_index: set[str] = set()  # the jobs an index named

    def add(self, job: str, index: int | None = None) -> bool:
        """Count ``job`` for the first pattern it matches: found by the scan, or named by
        the job index of the pattern ``index``; False if it matches no pattern (or not
        ``index``'s: planted in that index)."""
        if index is not None:
            if not self.matchers[index](job):
                return False
            self.in_index.add(job)
        number = 0  # one pattern: the scan's MATCH (or the index's check) matched it
        if len(self.matchers) > 1:
            number = next((n for n, match in enumerate(self.matchers) if match(job)), -1)
        if number < 0:
            return False  # another team's job (a scan for several patterns)
        if job in self.seen:
            return True
        if len(self.seen) < REMEMBERED:
            self.seen.add(job)
        self.counts[number] += 1
        kept = self.names[number]
        kept.add(job)
        if len(kept) > 2 * self.keep:  # now and then: bounded memory, amortised sorting
            self.names[number] = set(sorted(kept)[: self.keep])
        return True

    def lowest(self, number: int) -> list[str]:
        """The pattern's lowest ``keep`` job names, sorted."""
        return sorted(self.names[number])[: self.keep]


def indexed_jobs(
    code: RedisCode, client: RedisClient, patterns: tuple[str, ...], keep: int
) -> Found:
    """The jobs named by the job index of each pattern that has one, one bounded read of
    each (an index it may not read, or a key that is no index there, counts as none),
    but for the entries expired by Redis's clock (their chief no longer keeps them)."""
    found = Found(patterns, keep)
    now_ms: int | None = None
    for number, pattern in enumerate(patterns):
        # one call per index: on a Cluster each lies in a slot of its own
        raw = as_refused(code.replies([index_call(job_index(pattern), count=MAX_INDEX_READ)])[0])
        raise_transient([raw])
        if isinstance(raw, Exception) or not isinstance(raw, list) or index_length(raw) == 0:
            continue  # no index
        if now_ms is None:
            seconds, micros = client.time()
            now_ms = int(seconds) * 1000 + int(micros) // 1000
        for member, score in zip(raw[1::2], raw[2::2], strict=False):
            name = member.decode("ascii", "replace") if isinstance(member, bytes) else str(member)
            kept_until = parse_score(score)
            if JOB_NAME.fullmatch(name) is None or kept_until is None or kept_until < now_ms:
                continue  # planted (no job's name, no time), or expired
            if found.add(name, number):
                found.indexed.add(number)  # an index: one live entry of its pattern at least
        if number in found.indexed and (
            index_length(raw) >= MAX_INDEX_READ or (isinstance(raw[0], int) and raw[0] > 0)
        ):
            found.cut.add(number)  # longer than one read, or members too long to be sent
    return found


def parse_score(score: object) -> float | None:
    """A sorted set member's score as a number (``None``: not one)."""
    try:
        value = float(score.decode() if isinstance(score, bytes) else score)  # type: ignore[arg-type]
    except (TypeError, ValueError, UnicodeDecodeError):
        return None
    return value if math.isfinite(value) else None


def scan_jobs(
    client: RedisClient,
    patterns: tuple[str, ...],
    keep: int,
    scan_calls: int = MAX_SCAN_CALLS,
    found: Found | None = None,
) -> Found:
    """One bounded walk of the keyspace for the jobs of ``patterns`` (valid ones), added
    to ``found`` (``indexed_jobs``'s: a job its chief keeps in no index is found too)."""
    # every name is checked (job_of_state_key), and given to the first pattern it matches
    found = Found(patterns, keep) if found is None else found
    match = JobKeys.for_job(patterns[0] if len(patterns) == 1 else "*").state
    tally = ScanTally()
    for key in scan_keys(client, match, count=SCAN_COUNT, most=scan_calls, tally=tally):
        job = job_of_state_key(key)
        if job is not None:
            found.add(job)
    found.complete = not tally.cut
    return found


def list_jobs(
    config: BarrierConfig,
    client: RedisClient | None = None,
    *,
    pattern: str = "*",
    patterns: Sequence[str] | None = None,
    limit: int = MAX_JOBS,
    scan_calls: int | None = None,
    retry_seconds: float = STATUS_RETRY_SECONDS,
) -> JobListing:
    """Find the jobs of each pattern (each team) and read each one, in bounded work.

    A job the user may not read is listed with the refusal as its problem; a
    job whose keys vanished between the scan and its read is left out. The
    ``patterns`` (else ``pattern``) each get a fair share of ``limit`` and of
    ``LISTING_WAITER_BUDGET``; ``config``'s job is ignored; the scan, and each
    batch of reads, retries for ``retry_seconds``. Raises ``ConfigurationError``
    for an invalid pattern or too many, else as ``status.operator_read``.
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
        most = MAX_SCAN_CALLS if scan_calls is None else scan_calls

        def find() -> Found:
            found = indexed_jobs(RedisCode(active(), config), active(), chosen, limit)
            return scan_jobs(active(), chosen, limit, most, found)

        found: Found = retried(find, "list the jobs")
        shares = fair_shares([len(names) for names in found.names], limit)
        selected = [found.lowest(n)[:share] for n, share in enumerate(shares)]
        waiter_shares = fair_shares(
            [len(jobs) * LISTING_WAITERS for jobs in selected], LISTING_WAITER_BUDGET
        )
        code = RedisCode(active(), config)
        summaries: list[JobSummary] = []
        for number, (jobs, budget) in enumerate(zip(selected, waiter_shares, strict=True)):
            for first in range(0, len(jobs), READ_BATCH):
                batch = jobs[first : first + READ_BATCH]
                read = functools.partial(_read_batch, config, code, active(), batch, budget)
                got, spent = retried(read, "read the jobs")
                if number in found.indexed:
                    got = [_unindexed(s, chosen[number], found) for s in got]
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
            # a cut scan may miss the jobs kept in no index, even of an indexed pattern
            # (whose indexed jobs are all listed, whatever the scan missed)
            truncated=found.counts[n] > len(selected[n]) or n in found.cut or not found.complete,
            indexed=n in found.indexed,
            index_truncated=n in found.cut,
        )
        for n in range(len(chosen))
    )
    listing = JobListing(
        tuple(sorted(summaries, key=lambda summary: summary.job)),
        complete=not any(part.truncated for part in listed),
        patterns=listed,
        scan_complete=found.complete,
    )
    for line in truncation_lines(listing):
        log.warning("%s", line)
    return listing


def truncation_lines(listing: JobListing) -> list[str]:
    """What a truncated listing left out, one line per pattern (none: nothing): the
    one wording of the log, ``stepbarrier jobs``'s table and its stderr."""
    lines = []
    if not listing.scan_complete:
        lines.append(
            "the scan for jobs stopped at its bound of SCAN calls: jobs past it are not listed"
        )
    for part in listing.patterns:
        if part.index_truncated:
            lines.append(
                f"the job index of {part.pattern!r} holds more than one read lists (over "
                f"{MAX_INDEX_READ - 1:,} entries, or names over 256 bytes): the rest are "
                "listed only if the scan finds them"
            )
        if part.found > part.read:
            lines.append(
                f"{part.found:,} jobs match {part.pattern!r}: only {part.read:,} are listed "
                "(the lowest names; its share of the jobs one listing reads)"
            )
    if any(part.pattern == "*" for part in listing.patterns) and lines:
        lines.append(
            "give each team's pattern (--job 'team-a-*' --job 'team-b-*'): each then gets "
            "its own share, and one team's jobs never hide another's"
        )
    return lines


def _per_node(
    code: RedisCode, client: RedisClient, keys: list[JobKeys], calls: list[Call]
) -> list[Any]:
    """The replies of ``calls`` (one per job of ``keys``), a round trip per node
    (``RedisCode`` sends one to one node); errors in place, but one that a retry
    may cure raised."""
    groups: dict[str, list[int]] = {}
    for position, job_keys in enumerate(keys if calls else []):
        node = ""  # off a Cluster: one group
        if isinstance(client, RedisCluster):
            node = client.get_node_from_key(job_keys.state).name  # type: ignore[no-untyped-call]
        groups.setdefault(node, []).append(position)
    replies: list[Any] = [None] * len(calls)
    for group in groups.values():
        got = code.replies([calls[n] for n in group])
        raise_transient(got)
        for position, reply in zip(group, got, strict=True):
            replies[position] = reply
    return replies


def _read_batch(
    config: BarrierConfig,
    code: RedisCode,
    client: RedisClient,
    jobs: list[str],
    budget: int,
) -> tuple[list[JobSummary], int]:
    """The summaries of ``jobs`` (those that vanished left out), and how many waiter
    entries were read of the ``budget`` left: four round trips at most."""
    keys = [JobKeys.for_job(job) for job in jobs]
    replies = _per_node(code, client, keys, [read_call(k.state, k.reset) for k in keys])
    done: dict[int, JobSummary] = {}
    snapshots: dict[int, Snapshot] = {}
    for position, reply in enumerate(replies):
        if isinstance(reply, redis.exceptions.NoPermissionError):
            done[position] = _unreadable(config, jobs[position], reply)
        elif isinstance(reply, Exception):
            problem = f"state unreadable: {one_line(reply)}"
            snapshots[position] = Snapshot(0, ChiefState.empty(), None, [problem])
        else:
            snapshots[position] = parse_snapshot(reply)
    readable = sorted(snapshots)
    pipe = client.pipeline(transaction=False)
    for position in readable:
        pipe.zcard(keys[position].targets)
    cards = dict(zip(readable, replies_of(pipe), strict=True))
    allotted: dict[int, int] = {}
    for position in readable:
        card = cards[position]
        if isinstance(card, Exception):
            parse_index(card, snapshots[position].problems)  # says the index is unreadable
            cards[position] = 0
        elif card:
            allotted[position] = min(card, LISTING_WAITERS, max(0, budget - sum(allotted.values())))
    asked = [position for position, most in allotted.items() if most]
    calls = [index_call(keys[p].targets, count=allotted[p]) for p in asked]
    raws = [as_refused(r) for r in _per_node(code, client, [keys[p] for p in asked], calls)]
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
        if status.holds_nothing:
            continue  # vanished since the scan (reset, expired)
        summary = JobSummary.of(status, time.time())
        if unread:  # counted from the index, each entry unread
            summary = dataclasses.replace(summary, waiting_workers=min(card, LISTING_WAITERS))
        done[position] = summary
    spent = sum(len(index) for index in indexes.values())
    return [done[position] for position in sorted(done)], spent


def _unindexed(summary: JobSummary, pattern: str, found: Found) -> JobSummary:
    """``summary``, with a problem if its job is missing from its pattern's job index:
    only a scan found it, which another team's keys could cut short."""
    if summary.job in found.in_index:
        return summary
    problem = (
        f"not in the job index of {pattern!r}: its chief does not keep it there "
        f"(STEPBARRIER_JOBS_PATTERN={pattern!r}), so only a scan finds it"
    )
    return dataclasses.replace(summary, problems=(*summary.problems, problem))


def _unreadable(config: BarrierConfig, job: str, refusal: BaseException) -> JobSummary:
    """A job found but not read: the user may not read its keys."""
    explained = translate(
        refusal, dataclasses.replace(config, job=job), action="read the job's status"
    )
    reason = f"not readable by this user: {' '.join(str(explained).split())}"
    return JobSummary(job, None, None, None, False, None, 0, None, None, (reason,))
