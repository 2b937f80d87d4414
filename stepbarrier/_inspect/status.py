"""What an operator sees: the chief's state, who waits for what, the open barriers.

``read_status`` only reads (the ``monitor`` user is enough), in bounded work
(the package's rule), and reports malformed content in ``JobStatus.problems``.

The barriers. Reading an open barrier whole, as a waiting task reads its own,
cost Redis about half a second per 100,000 parties in one command: ten planted
barriers stalled Redis for every team at each ``status`` refresh (issue 34). So
``read_open_barriers`` uses only commands of constant cost, and the read-only
``index_read`` (which sends no megabyte member a worker planted in the index).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, TypeVar

import redis

from stepbarrier._barriers.barrier import STATUS_BARRIERS, BarrierInfo
from stepbarrier._config.defaults import DEFAULT_HEARTBEAT
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.progress import (
    TaskProgress,
    judge_tasks,
    read_progress,
    straggler_threshold,
)
from stepbarrier._inspect.registry import (
    MAX_INDEXED,
    SINCE_LIMIT,
    WaiterInfo,
    one_line,
    parse_index,
    printable,
    read_entries_of,
    read_index,
    replies_of,
    to_bytes,
)
from stepbarrier._protocol import freshness
from stepbarrier._protocol.barrier_record import MAX_PARTIES, epoch_token, split_member
from stepbarrier._protocol.calls import may_write_call, read_call
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.library import (
    BARRIER_FIELDS,
    EPOCH_FIELDS,
    MAX_BARRIER_INDEX,
    MAX_FIELDS,
    MAX_TASK_VALUE,
    MAX_VALUE,
)
from stepbarrier._protocol.wire import ChiefState, as_text, parse_int, preview
from stepbarrier._redis.client import RedisClient, with_client
from stepbarrier._redis.functions import RedisCode
from stepbarrier._worker.snapshot import parse_snapshot as parse_waiter_read

T = TypeVar("T")

STATUS_RETRY_SECONDS = 5.0
"""How long ``read_status`` retries an unreachable Redis before giving up."""
MAX_HEARTBEAT_PERIOD_MS = 3_600_000
"""Longest heartbeat period (ms) ``status`` takes from a state (an hour; a chief's own
limit is ``freshness.MAX_HEARTBEAT``): a longer one is implausible and ignored."""
MAX_BARRIER_INDEX_READ = 2 * MAX_BARRIER_INDEX
"""Largest barrier index ``status`` reads: an arrival keeps it below this (it
drops a larger one), so only a hand-made index is larger, and it is reported."""
TASKS_CHECKED = 5_000
"""Most task fields one read checks (``HSTRLEN`` each), over all the open barriers."""
NOT_LISTED = (
    "this user may not list them (ZRANGEBYSCORE: a worker's password holds no range "
    "read); read the status as the monitor user"
)
"""Why a user that may read a job's keys one by one sees no list of them."""
BARRIER_MEMBER = re.compile(rb"[A-Za-z0-9._-]{1,64}(:[A-Za-z0-9._-]{1,64})?")
"""A barrier index member the library writes: ``<name>`` or ``<name>:<run id>``."""


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of one job.

    The chief's fields are its state's (``wire.ChiefState``, docs/protocol.md),
    the ages by Redis's clock; ``None``: not stored, or not plausible.

    Attributes:
        beat: The state's write counter (``status --json`` only): it starts from
            the Redis clock in microseconds, so only its moving means something
            (docs/protocol.md#observed-writes).
        waiters: Registered waiters, lowest target first. Self-reported, as are
            ``tasks``: what a process holding a worker's password wrote about itself.
        tasks: Each task's progress, judged against the chief (docs/who-is-slow.md).
        tasks_more: Tasks in the job's progress hash that were not read.
    """

    job: str
    step: int | None
    generation: int | None
    heartbeat_age: float | None
    done: bool
    chief: str | None = None
    reset_at: float | None = None
    run_id: str | None = None
    beat: int = 0
    vouch: bool = False
    pinned: bool = False
    heartbeat_period: float | None = None
    waiters: tuple[WaiterInfo, ...] = ()
    probation: bool = False
    problems: tuple[str, ...] = ()
    barriers: tuple[BarrierInfo, ...] = ()
    tasks: tuple[TaskProgress, ...] = ()
    tasks_more: int = 0
    straggler_threshold: int | None = None

    @property
    def stuck_tasks(self) -> tuple[TaskProgress, ...]:
        """The tasks behind, without progress for the stall timeout, while the chief advanced."""
        return tuple(task for task in self.tasks if task.stuck)

    @property
    def tasks_by_concern(self) -> tuple[TaskProgress, ...]:
        """The tasks, the stuck first, then the stragglers, then the most behind."""
        return tuple(
            sorted(
                self.tasks,
                key=lambda t: (not t.stuck, not t.straggler, -(t.behind or 0), t.task_id),
            )
        )

    @property
    def holds_nothing(self) -> bool:
        """No chief state, no waiter, no task's progress and nothing malformed was read."""
        return (
            self.step is None
            and self.generation is None
            and self.heartbeat_age is None
            and not (self.done or self.waiters or self.tasks or self.tasks_more or self.problems)
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the CLI's ``status --json``); every number is finite."""
        return json_ready(self)


def json_ready(record: Any) -> dict[str, Any]:
    """A dataclass as a dictionary, its tuples as lists (what ``--json`` prints)."""
    data: dict[str, Any] = json.loads(json.dumps(asdict(record)))
    return data


def stale_limit(status: JobStatus, default_heartbeat: float = DEFAULT_HEARTBEAT) -> float | None:
    """``freshness.stale_limit`` of ``status``'s chief, whose period is the one it
    stored, else ``default_heartbeat``."""
    return freshness.stale_limit(**_liveness(status, default_heartbeat))


def is_stale(status: JobStatus, default_heartbeat: float = DEFAULT_HEARTBEAT) -> bool:
    """``freshness.is_stale`` of ``status``'s chief: it may be gone."""
    return freshness.is_stale(**_liveness(status, default_heartbeat))


def _liveness(status: JobStatus, default_heartbeat: float) -> dict[str, Any]:
    period = status.heartbeat_period
    return {
        "done": status.done,
        "heartbeat_age": status.heartbeat_age,
        "chief": status.chief,
        "period": default_heartbeat if period is None else period,
    }


def chief_heard(status: JobStatus, stall_timeout: float) -> bool:
    """True if a chief heartbeat is no older than ``stall_timeout`` (else the job is dead)."""
    return status.heartbeat_age is not None and status.heartbeat_age <= stall_timeout


def find_live_chief(
    config: BarrierConfig, client: RedisClient | None = None
) -> tuple[JobStatus, float] | None:
    """The job's status and its stale limit while a chief heartbeats (not stale), else ``None``.

    Asked before a hand-run ``publish``, which starts a new chief generation that
    wins for good: the running chief would stop publishing and its workers would
    follow the hand-set step. A user that may not publish at all learns that
    first: ``RedisRefused`` unless the job's state is writable.
    """

    def check(active: RedisClient) -> JobStatus:
        RedisCode(active, config).call(*may_write_call(config.keys.state))
        return read_status(config, active)

    status = operator_read(config, client, check, action="publish the step")
    limit = stale_limit(status, config.heartbeat)
    if limit is None or is_stale(status, config.heartbeat):
        return None
    return status, limit


def read_status(
    config: BarrierConfig,
    client: RedisClient | None = None,
    *,
    waiters: bool = True,
    max_waiters: int = MAX_INDEXED,
    barriers: bool = True,
    straggler_steps: int | None = None,
) -> JobStatus:
    """Read the job's state, its waiters (at most ``max_waiters``, the lowest
    targets; ``summary`` counts a large job's) and open barriers, each unless turned
    off, and its tasks' progress (judged by ``config.stall_timeout``); raises as
    ``operator_read``."""
    max_waiters = max(0, max_waiters)

    def read(active: RedisClient) -> JobStatus:
        keys = config.keys
        # the state with the clock of the node that holds it (in a cluster, the
        # slot's owner: another node's clock would skew the heartbeat's age)
        code = RedisCode(active, config)
        snapshot = parse_snapshot(code.call(*read_call(keys.state, keys.reset)))
        problems = snapshot.problems
        index_raw: object = []
        if waiters and max_waiters:
            index_raw = read_index(code, keys.targets, count=max_waiters)
        if isinstance(index_raw, redis.exceptions.NoPermissionError):
            # a user that may read the state but not the index still sees the step;
            # ZCARD (which it may run) tells whether there was anything to show
            try:
                listed = int(active.zcard(keys.targets)) != 0
            except redis.RedisError:
                listed = True
            if listed:
                problems.append(f"waiters not shown: {NOT_LISTED}")
            index_raw = []
        index = parse_index(index_raw, problems, limit=max_waiters or MAX_INDEXED)
        (found,) = read_entries_of(active, [(keys, index, problems)])
        if isinstance(found, Exception):
            raise found  # this user may not read the entries
        open_barriers: tuple[BarrierInfo, ...] = ()
        if barriers:
            open_barriers = read_open_barriers(active, keys, snapshot.now_ms, problems, code)
        status = job_status(config.job, snapshot, found, problems, open_barriers)
        entries, more = read_progress(active, keys, problems)
        return replace(
            status,
            problems=tuple(problems),
            tasks=judge_tasks(
                entries,
                chief_step=status.step,
                chief_live=not status.done and chief_heard(status, config.stall_timeout),
                now_ms=snapshot.now_ms,
                stall_timeout=config.stall_timeout,
                straggler_steps=straggler_steps,
                chief_idle_s=(snapshot.state.idle_ms or 0) / 1000,
            ),
            tasks_more=more,
            straggler_threshold=straggler_threshold(status.step, straggler_steps),
        )

    return operator_read(config, client, read)


def operator_read(
    config: BarrierConfig,
    client: RedisClient | None,
    operation: Callable[[RedisClient], T],
    action: str = "read the job's status",
) -> T:
    """``with_client`` as an operator's reads run it: retried for ``STATUS_RETRY_SECONDS``.

    Raises:
        RedisUnavailable: Redis stayed unreachable (``RedisBusy``: it answered BUSY).
        RedisRefused: Redis refused (authentication, ACL, no Functions library).
    """
    return with_client(config, client, operation, action=action, retry_seconds=STATUS_RETRY_SECONDS)


@dataclass(frozen=True)
class Snapshot:
    """What ``waiter_read`` returned for a job's state, parsed: Redis's time (ms) of the
    node that holds the job, the state, the reset's time and what was malformed."""

    now_ms: int
    state: ChiefState
    reset_ms: int | None
    problems: list[str]


def parse_snapshot(reply: Any) -> Snapshot:
    """A ``waiter_read`` reply (the waiters' own parse), with a plausible reset time."""
    read = parse_waiter_read(reply)
    problems = [] if read.state.problem is None else [read.state.problem]
    marker = read.reset_marker or None
    reset_ms = parse_int(marker, high=int(SINCE_LIMIT * 1000))  # a plausible time, like a since
    if marker is not None and reset_ms is None:
        problems.append(f"malformed reset marker: {preview(marker)}")
    return Snapshot(read.now_ms, read.state, reset_ms, problems)


def job_status(
    job: str,
    snapshot: Snapshot,
    waiters: list[WaiterInfo],
    problems: list[str],
    barriers: tuple[BarrierInfo, ...] = (),
) -> JobStatus:
    """The ``JobStatus`` of what was read of ``job`` (``problems``: all of them)."""
    state = snapshot.state
    period_ms = state.heartbeat_period_ms
    return JobStatus(
        job=job,
        step=state.step,
        generation=state.generation,
        heartbeat_age=_age(snapshot.now_ms, state.heartbeat_ms),
        done=state.done,
        chief=None if state.chief is None else printable(state.chief),
        reset_at=None if snapshot.reset_ms is None else snapshot.reset_ms / 1000,
        run_id=state.run_id,
        beat=state.beat,
        vouch=state.vouch,
        pinned=state.pinned,
        probation=state.probation != 0,
        heartbeat_period=(
            None if period_ms is None or period_ms > MAX_HEARTBEAT_PERIOD_MS else period_ms / 1000
        ),
        waiters=tuple(sorted(waiters, key=lambda w: (w.wait_until_step, w.task_id or 0))),
        problems=tuple(problems),
        barriers=barriers,
    )


def _age(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)


def fair_shares(wants: Sequence[int], total: int) -> list[int]:
    """How much of ``total`` each claimant gets, in the order of ``wants``: max-min
    fairness, so a claimant a role inflated (a job's barriers, a listing's teams)
    takes what the others leave, never another's share.

    Example:
        >>> fair_shares([3, 1_000_000, 50], 100)
        [3, 48, 49]
        >>> fair_shares([1_000_000, 1_000_000], 5)
        [3, 2]
    """
    shares = [0] * len(wants)
    left = max(0, total)
    order = sorted(range(len(wants)), key=lambda i: (max(0, wants[i]), i))
    for position, index in enumerate(order):
        share = -(-left // (len(order) - position))  # an even split of the rest, rounded up
        shares[index] = min(max(0, wants[index]), share)
        left -= shares[index]
    return shares


@dataclass(frozen=True)
class OpenBarrier(BarrierInfo):
    """An open barrier, as read in bounded work: ``missing`` holds the missing among
    the first ``tasks_checked`` task ids (checked one by one), ``missing_more``
    counts the others; past those checked, ``arrived`` is counted from its size."""

    missing_more: int = 0
    tasks_checked: int = 0


def read_open_barriers(
    client: RedisClient, keys: JobKeys, now_ms: int, problems: list[str], code: RedisCode
) -> tuple[OpenBarrier, ...]:
    """The job's open barriers, latest arrival first (at most ``STATUS_BARRIERS``), their
    ages measured to ``now_ms`` (Redis's time); who arrived is told by ``HSTRLEN`` of
    the task fields (never their values), ``TASKS_CHECKED`` in all, by ``fair_shares``.
    """
    members = _newest_members(client, code, keys, problems)
    if members is None:
        return ()
    first = client.pipeline(transaction=False)
    _queue_sizes(first, keys.barrier_epoch, EPOCH_FIELDS)
    for member in members:
        _queue_sizes(first, keys.barrier(member), BARRIER_FIELDS)
    sizes = replies_of(first)
    epoch_width, width = 2 + len(EPOCH_FIELDS), 2 + len(BARRIER_FIELDS)
    epoch_readable = _epoch_readable(sizes[:epoch_width], problems)
    if epoch_readable is None:
        return ()
    readable: list[tuple[str, int]] = []  # (member, HLEN)
    for position, member in enumerate(members):
        replies = sizes[epoch_width + position * width : epoch_width + (position + 1) * width]
        if any(isinstance(r, Exception) for r in replies) or as_text(replies[0]) != "hash":
            continue  # not readable by this user, expired, or not a hash: nothing to show
        if replies[1] > MAX_FIELDS + MAX_PARTIES or max(replies[2:]) > MAX_VALUE:
            problems.append(f"barrier {member!r} is oversized: not read")
            continue
        readable.append((member, int(replies[1])))
    second = client.pipeline(transaction=False)
    if epoch_readable:
        second.hmget(keys.barrier_epoch, [EPOCH_FIELDS[0]])
    for member, _length in readable:
        second.hmget(keys.barrier(member), list(BARRIER_FIELDS))
    values = replies_of(second) if (readable or epoch_readable) else []
    epoch: str | None = None
    if epoch_readable:
        token = values.pop(0)
        epoch = None if isinstance(token, Exception) else epoch_token(token[0])
    current = []  # (member, HLEN, parties, known fields)
    for (member, length), raw in zip(readable, values, strict=True):
        if isinstance(raw, Exception):
            continue
        fields = dict(zip(BARRIER_FIELDS, raw, strict=True))
        parties = parse_int(fields["parties"], low=1, high=MAX_PARTIES)
        if parties is None:
            problems.append(f"barrier {member!r} is malformed (no valid number of parties)")
        elif length > MAX_FIELDS + parties:
            problems.append(f"barrier {member!r} is oversized: not read")
        elif epoch is not None and epoch_token(fields["epoch"]) == epoch:
            current.append((member, length, parties, fields))
        # else stale (no epoch, or another one): the next arrival begins it anew
    shares = fair_shares([parties for _, _, parties, _ in current], TASKS_CHECKED)
    third = client.pipeline(transaction=False)
    for (member, _length, _parties, _fields), share in zip(current, shares, strict=True):
        for task in range(share):
            third.hstrlen(keys.barrier(member), f"t{task}")
    lengths = replies_of(third) if any(shares) else []
    found = []
    start = 0
    for (member, length, parties, fields), share in zip(current, shares, strict=True):
        checked = lengths[start : start + share]
        start += share
        if any(isinstance(n, Exception) for n in checked):
            continue  # gone or replaced meanwhile: nothing to show
        if any(n > MAX_TASK_VALUE for n in checked):
            problems.append(f"barrier {member!r} is oversized: not read")
            continue
        barrier = _open(member, length, parties, fields, checked, now_ms)
        if barrier is not None:
            found.append(barrier)
    return tuple(found)


def _newest_members(
    client: RedisClient, code: RedisCode, keys: JobKeys, problems: list[str]
) -> list[str] | None:
    """The ``STATUS_BARRIERS`` members of the index with the latest arrivals, well-formed;
    ``None`` if the index cannot be read (said in ``problems``)."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.barrier_index)
    (size,) = replies_of(pipe)
    if isinstance(size, Exception):
        problems.append(f"barriers not shown: {one_line(size, 160)}")
        return None
    if size > MAX_BARRIER_INDEX_READ:
        problems.append(
            f"the barrier index is oversized ({size} members; arrivals keep at most "
            f"{MAX_BARRIER_INDEX}): barriers not shown (the next arrival drops it)"
        )
        return None
    raw = read_index(code, keys.barrier_index, count=size) if size else [0]
    if isinstance(raw, redis.exceptions.NoPermissionError):
        problems.append(f"barriers not shown: {NOT_LISTED}")
        return None
    if isinstance(raw, Exception):
        raise raw
    assert isinstance(raw, list)
    if raw[0]:
        problems.append(f"the barrier index: {raw[0]} oversized member(s): not read")
    index = zip(raw[1::2], raw[2::2], strict=False)
    newest = sorted(index, key=lambda pair: -float(pair[1]))[:STATUS_BARRIERS]
    members = []
    for member, _score in newest:
        raw = to_bytes(member)
        if BARRIER_MEMBER.fullmatch(raw) is None:
            problems.append(f"malformed barrier name in the index: {printable(raw, 40)!r}")
        else:
            members.append(raw.decode())
    return members


def _queue_sizes(pipe: Any, key: str, names: tuple[str, ...]) -> None:
    """``TYPE``, ``HLEN`` and ``HSTRLEN`` of each of ``names``: what a hash costs to read."""
    pipe.type(key)
    pipe.hlen(key)
    for name in names:
        pipe.hstrlen(key, name)


def _epoch_readable(sizes: list[Any], problems: list[str]) -> bool | None:
    """Whether the epoch hash may be read (its ``_queue_sizes`` replies): ``None`` if
    it cannot be (this user may not), ``False`` if there is none or it is malformed
    (a problem: every barrier is then stale)."""
    failed = next((r for r in sizes if isinstance(r, Exception)), None)
    kind = as_text(sizes[0])
    if isinstance(sizes[0], Exception) or (failed is not None and kind == "hash"):
        problems.append(f"barriers not shown: {one_line(failed, 160)}")
        return None
    if kind == "none":
        return False
    if kind != "hash" or sizes[1] > MAX_FIELDS or max(sizes[2:]) > MAX_VALUE:
        what = "not a hash" if kind != "hash" else "oversized"
        problems.append(f"the barrier epoch is malformed ({what}): every barrier is stale")
        return False
    return True


def _open(
    member: str,
    length: int,
    parties: int,
    fields: dict[str, Any],
    checked: list[int],
    now_ms: int,
) -> OpenBarrier | None:
    """The barrier, if still open: ``checked`` holds the lengths of ``t0``, ``t1``, ...

    A task arrived if its field holds something. Past the checked tasks, the
    fields beyond the barrier's own count the arrivals (an upper bound: a hand
    written field counts too), never more than the unchecked tasks.
    """
    missing = [task for task, size in enumerate(checked) if size == 0]
    arrived = len(checked) - len(missing)
    if len(checked) < parties:
        others = length - sum(1 for value in fields.values() if value is not None)
        arrived = max(arrived, min(others, parties - len(missing)))
    if arrived >= parties:
        return None  # complete: not open
    name, run_id = split_member(member)
    return OpenBarrier(
        name=name,
        run_id=run_id,
        parties=parties,
        arrived=arrived,
        missing=tuple(missing),
        open_for=_age(now_ms, parse_int(fields["created_ms"])),
        last_arrival_age=_age(now_ms, parse_int(fields["last_ms"])),
        missing_more=max(0, parties - arrived - len(missing)),
        tasks_checked=len(checked),
    )
