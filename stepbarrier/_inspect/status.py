"""What an operator sees: the chief's state, who waits for what, the open barriers.

``read_status`` only reads (it works with the read-only ``monitor`` user) and
never fails on malformed content: it reports it in ``JobStatus.problems``.
Waiters are found through the job's own index (``stepbarrier._inspect.registry``),
never by scanning the keyspace.

Every key it reads may have been written by hand, with any size, by whoever
holds a worker's (or the chief's) password. So every read is bounded: the state
through the library's ``waiter_read`` (which checks sizes before it reads, and
reads only the state's known fields), the indexes with ``ZCARD`` and ``LIMIT``,
the waiters' entries as ``registry.read_entries`` does. An oversized key is
reported in ``problems``, and not read. A Redis busy with a script (BUSY) fails
the read (retried, then reported as such), never becomes a problem line.

The barriers. A barrier is a hash that every worker of its job may write
(``%RW~`` on the barrier keys), with up to ``MAX_PARTIES`` task fields by the
library's own limits. A waiting task reads its own barrier whole
(``waiter_read``: its known fields, then ``t0`` .. ``t<parties - 1>``), but an
operator's read of every open barrier that way cost Redis about half a second
per 100,000-party barrier, in one command: ten such barriers planted by a
worker stalled Redis for every team at each ``status`` and each ``watch``
refresh (issue 34). So ``read_open_barriers`` reads them with commands of
constant cost, and no Lua:

- ``ZCARD`` of the index, then at most ``MAX_BARRIER_INDEX_READ`` of its
  members (``ZRANGEBYSCORE`` with ``LIMIT``), of which the ``STATUS_BARRIERS``
  with the latest arrivals are read;
- the epoch and each barrier: ``TYPE``, ``HLEN`` and ``HSTRLEN`` of its own
  fields, then ``HMGET`` of those fields when none is longer than ``MAX_VALUE``;
- who arrived: ``HSTRLEN`` of task fields (never their values, which a worker
  may have made of any size), ``TASKS_CHECKED`` in all per read, shared fairly
  among the open barriers (``fair_shares``). A barrier of more parties than its
  share is counted from its size (``HLEN`` less its own fields); its missing
  tasks are listed among those checked, and the others counted
  (``OpenBarrier.missing_more``).

So a read costs Redis a few hundred short commands and at most
``TASKS_CHECKED`` ``HSTRLEN``, whatever the keys hold, with only the commands
every role that reads a status holds.

The waiters are self-reported: each entry is what a process that holds a
worker's password wrote about itself, so a misbehaving one can add waiters that
do not exist (at most ``MAX_INDEXED`` are shown, the lowest targets first).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import redis

from stepbarrier._barriers.index import STATUS_BARRIERS, BarrierInfo
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
    parse_index,
    printable,
    queue_index_read,
    raise_transient,
    read_entries,
)
from stepbarrier._protocol.barrier_library import MAX_BARRIER_INDEX
from stepbarrier._protocol.barrier_record import MAX_PARTIES, epoch_token, split_member
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.library import (
    BARRIER_FIELDS,
    EPOCH_FIELDS,
    MAX_FIELDS,
    MAX_TASK_VALUE,
    MAX_VALUE,
)
from stepbarrier._protocol.wire import ChiefState, parse_int, parse_state, preview
from stepbarrier._redis.client import RedisClient, with_client
from stepbarrier._redis.functions import RedisCode
from stepbarrier._worker.links import oversized_state_problem

STATUS_RETRY_SECONDS = 5.0
"""How long ``read_status`` retries an unreachable Redis before giving up."""
MAX_HEARTBEAT_PERIOD_MS = 3_600_000
"""Longest heartbeat period (ms) a chief may state: the config's own limit."""
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
_BARRIER_MEMBER = re.compile(rb"[A-Za-z0-9._-]{1,64}(:[A-Za-z0-9._-]{1,64})?")
_TOKEN = EPOCH_FIELDS[0]


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of one job.

    Attributes:
        job: The job name.
        step: The chief's stored step (``None`` before any chief wrote one).
        generation: The chief generation that wrote it.
        heartbeat_age: Seconds since the chief's last write, by Redis's clock.
        done: True once the chief closed the job.
        chief: ``host:pid`` of the chief, with control characters escaped.
        reset_at: Unix time of the last reset, if the job was reset since.
        run_id: The run id the chief stored (``None``: none, or malformed).
        beat: The state's write counter, as stored (``status --json`` only).
            No count of writes: it starts from the Redis clock in microseconds
            when the state is made or replaced, and each write adds one, so
            only its moving means something (waiters judge liveness by it;
            docs/protocol.md#observed-writes).
        vouch: The last writer vouches for the step (out of probation, its loop
            handed a step over lately).
        pinned: The step was published by an operator (``stepbarrier publish``).
        probation: The state is on probation: a chief made it anew without its own
            begin on record (Redis forgot the state), and it vouches for nothing
            until that chief has waited the fence (docs/protocol.md#probation).
        heartbeat_period: The chief's own heartbeat period in seconds, if it
            stored a plausible one.
        waiters: Registered waiters, lowest target first (at most ``MAX_INDEXED``,
            or what ``read_status`` was asked for). Self-reported: each is what
            a process holding a worker's password wrote about itself.
        problems: Malformed content found in the job's keys.
        barriers: Open named barriers (``stepbarrier.Barrier``), latest arrival first
            (at most ``STATUS_BARRIERS``; each an ``OpenBarrier``: of a barrier of
            many parties, the missing tasks are named among those checked).
        tasks: Each task's reported progress, by task id (``ProgressReporter``;
            at most ``MAX_TASKS_READ``): its step, how far behind the chief,
            whether it is stuck or a straggler (docs/who-is-slow.md).
            Self-reported, like the waiters.
        tasks_more: Tasks in the job's progress hash that were not read.
        straggler_threshold: Steps behind the chief beyond which a task is a
            straggler, as applied to ``tasks``.
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
    problems: tuple[str, ...] = field(default=())
    barriers: tuple[BarrierInfo, ...] = ()
    tasks: tuple[TaskProgress, ...] = ()
    tasks_more: int = 0
    straggler_threshold: int | None = None

    @property
    def stuck_tasks(self) -> tuple[TaskProgress, ...]:
        """The tasks that are stuck: behind, no progress for the stall timeout, while
        the chief advanced."""
        return tuple(task for task in self.tasks if task.stuck)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the CLI's ``status --json``); every number is finite."""
        data = asdict(self)
        data["waiters"] = [asdict(w) for w in self.waiters]
        data["barriers"] = [{**asdict(b), "missing": list(b.missing)} for b in self.barriers]
        data["problems"] = list(self.problems)
        data["tasks"] = [asdict(t) for t in self.tasks]
        return data


def read_status(
    config: BarrierConfig,
    client: RedisClient | None = None,
    *,
    waiters: bool = True,
    max_waiters: int = MAX_INDEXED,
    barriers: bool = True,
    tasks: bool = True,
    straggler_steps: int | None = None,
) -> JobStatus:
    """Read the job's state and registry, in bounded work whatever the keys hold.

    Args:
        config: The job's settings.
        client: A redis-py client; one is made (and closed) if omitted.
        waiters: Read the registered waiters (a few commands per waiter); without
            them ``JobStatus.waiters`` is empty (``stepbarrier._inspect.summary``
            counts a large job's waiters from the index instead).
        max_waiters: Most waiters read (the lowest targets): the registry is
            self-reported, so this bounds what a misbehaving worker can add.
        barriers: Read the open barriers (at most ``STATUS_BARRIERS``).
        tasks: Read each task's reported progress (at most ``MAX_TASKS_READ``)
            and judge it against the chief (``config.stall_timeout``).
        straggler_steps: Steps behind the chief beyond which a task is a
            straggler (``None``: ``max(100, 5%`` of the chief's step``)``).

    Raises:
        RedisUnavailable: Redis was unreachable for ``STATUS_RETRY_SECONDS``.
        RedisRefused: Redis refused the read (authentication, ACL).
    """
    return with_client(
        config,
        client,
        lambda active: _read(
            config, active, waiters, max(0, max_waiters), barriers, tasks, straggler_steps
        ),
        action="read the job's status",
        retry_seconds=STATUS_RETRY_SECONDS,
    )


@dataclass(frozen=True)
class Snapshot:
    """What ``waiter_read`` returned for a job's state, parsed.

    Attributes:
        now_ms: Redis's time (ms) of the node that holds the job.
        state: The chief's state (empty if none, or malformed).
        reset_ms: Redis time (ms) of the last reset, if any (plausible).
        problems: Malformed content found in the state and the reset marker.
    """

    now_ms: int
    state: ChiefState
    reset_ms: int | None
    problems: list[str]


def parse_snapshot(reply: Any) -> Snapshot:
    """A ``waiter_read`` reply on the job's state and reset marker, parsed strictly."""
    now_raw, reset_raw, kind_raw, *flat = list(reply)
    now_ms = parse_int(now_raw) or 0
    kind = kind_raw.decode() if isinstance(kind_raw, bytes) else str(kind_raw)
    state_raw: object = dict(zip(flat[0::2], flat[1::2], strict=False)) if kind == "hash" else {}
    problems: list[str] = []
    if kind == "oversized":
        problems.append(oversized_state_problem())
    elif kind not in ("hash", "none"):
        state_raw = redis.ResponseError(f"the state key holds a {kind}, not a hash")
    state = parse_state(state_raw)
    if state.problem:
        problems.append(state.problem)
    reset_ms = _reset_ms(reset_raw or None, problems)
    return Snapshot(now_ms, state, reset_ms, problems)


def job_status(
    job: str,
    snapshot: Snapshot,
    waiters: list[WaiterInfo],
    problems: list[str],
    barriers: tuple[BarrierInfo, ...] = (),
) -> JobStatus:
    """The ``JobStatus`` of what was read of ``job`` (``problems``: all of them)."""
    state = snapshot.state
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
        heartbeat_period=_period(state.heartbeat_period_ms),
        waiters=tuple(sorted(waiters, key=lambda w: (w.wait_until_step, w.task_id or 0))),
        problems=tuple(problems),
        barriers=barriers,
    )


def _read(
    config: BarrierConfig,
    client: RedisClient,
    with_waiters: bool = True,
    max_waiters: int = MAX_INDEXED,
    with_barriers: bool = True,
    with_tasks: bool = True,
    straggler_steps: int | None = None,
) -> JobStatus:
    keys = config.keys
    # the state with the clock of the node that holds it (in a cluster, the
    # slot's owner: another node's clock would skew the heartbeat's age)
    snapshot = parse_snapshot(
        RedisCode(client, config).call("waiter_read", [keys.state, keys.reset], [])
    )
    problems = snapshot.problems
    index_raw: object = []
    if with_waiters and max_waiters:
        pipe = client.pipeline(transaction=False)
        queue_index_read(pipe, keys, count=max_waiters)
        (index_raw,) = pipe.execute(raise_on_error=False)
        raise_transient([index_raw])
    if isinstance(index_raw, redis.exceptions.NoPermissionError):
        # a user that may read the state but not the index still sees the step;
        # ZCARD (which it may run) tells whether there was anything to show
        if _index_size(client, keys.targets) != 0:
            problems.append(f"waiters not shown: {NOT_LISTED}")
        index_raw = []
    index = parse_index(index_raw, problems, limit=max_waiters or MAX_INDEXED)
    waiters = read_entries(client, keys, index, problems)
    barriers: tuple[BarrierInfo, ...] = ()
    if with_barriers:
        barriers = read_open_barriers(client, keys, snapshot.now_ms, problems)
    status = job_status(config.job, snapshot, waiters, problems, barriers)
    if not with_tasks:
        return status
    progress = read_progress(client, keys, problems)
    age = status.heartbeat_age
    return replace(
        status,
        problems=tuple(problems),
        tasks=judge_tasks(
            progress.entries,
            chief_step=status.step,
            chief_live=not status.done and age is not None and age <= config.stall_timeout,
            now_ms=snapshot.now_ms,
            stall_timeout=config.stall_timeout,
            straggler_steps=straggler_steps,
            chief_idle_s=(snapshot.state.idle_ms or 0) / 1000,
        ),
        tasks_more=progress.more,
        straggler_threshold=straggler_threshold(status.step, straggler_steps),
    )


def _index_size(client: RedisClient, key: str) -> int | None:
    """How many members an index has (``None``: it could not be told)."""
    try:
        return int(client.zcard(key))
    except redis.RedisError:
        return None


def _reset_ms(raw: object, problems: list[str]) -> int | None:
    if isinstance(raw, Exception):
        problems.append(f"reset marker unreadable: {' '.join(str(raw).split())[:120]}")
        return None
    reset_ms = parse_int(raw, high=int(SINCE_LIMIT * 1000))  # a plausible time, like a since
    if raw is not None and reset_ms is None:
        problems.append(f"malformed reset marker: {preview(raw)}")
    return reset_ms


def _age(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)


def _period(period_ms: int | None) -> float | None:
    if period_ms is None or period_ms > MAX_HEARTBEAT_PERIOD_MS:
        return None
    return period_ms / 1000


def fair_shares(wants: Sequence[int], total: int) -> list[int]:
    """How much of ``total`` each claimant gets, in the order of ``wants``.

    An operator's read has a fixed budget (the task fields a status checks, the
    jobs and waiter entries a listing reads) and several claimants for it (a
    job's barriers, a listing's teams), any of which a role may have inflated.
    Each gets ``min(want, its fair share)``: the claimants that want least are
    served first, and what they leave is split evenly among the rest (max-min
    fairness), so one that wants a million takes the rest, never another's share.

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
    """An open barrier, as read in bounded work (``BarrierInfo`` and two more fields).

    ``missing`` holds the ids of the missing tasks among the first
    ``tasks_checked`` (``0 .. tasks_checked - 1``); when that is fewer than the
    parties, ``arrived`` is counted from the barrier's size, and ``missing_more``
    is how many tasks beyond those are missing (their ids are not listed).

    Attributes:
        missing_more: Missing tasks not listed in ``missing`` (0: all are listed).
        tasks_checked: How many task ids, from 0, were checked one by one.
    """

    missing_more: int = 0
    tasks_checked: int = 0


def read_open_barriers(
    client: RedisClient, keys: JobKeys, now_ms: int, problems: list[str]
) -> tuple[OpenBarrier, ...]:
    """The job's open barriers, latest arrival first (at most ``STATUS_BARRIERS``).

    Args:
        client: A client of the job's Redis.
        keys: The job's keys.
        now_ms: Redis's time (ms), which the ages are measured to.
        problems: Malformed content found is appended here.

    Raises:
        redis.RedisError: A transient failure (the caller retries it).
    """
    members = _newest_members(client, keys, problems)
    if members is None:
        return ()
    first = client.pipeline(transaction=False)
    _queue_sizes(first, keys.barrier_epoch, EPOCH_FIELDS)
    for member in members:
        _queue_sizes(first, keys.barrier(member), BARRIER_FIELDS)
    sizes = first.execute(raise_on_error=False)
    raise_transient(sizes)
    epoch_width, width = 2 + len(EPOCH_FIELDS), 2 + len(BARRIER_FIELDS)
    epoch_readable = _epoch_readable(sizes[:epoch_width], problems)
    if epoch_readable is None:
        return ()
    readable: list[tuple[str, int]] = []  # (member, HLEN)
    for position, member in enumerate(members):
        replies = sizes[epoch_width + position * width : epoch_width + (position + 1) * width]
        if any(isinstance(r, Exception) for r in replies):
            continue  # not readable by this user, or not a hash: nothing to show
        if _text(replies[0]) != "hash":
            continue  # expired since the index was read, or not a hash: nothing to show
        if replies[1] > MAX_FIELDS + MAX_PARTIES or max(replies[2:]) > MAX_VALUE:
            problems.append(f"barrier {member!r} is oversized: not read")
            continue
        readable.append((member, int(replies[1])))
    second = client.pipeline(transaction=False)
    if epoch_readable:
        second.hmget(keys.barrier_epoch, [_TOKEN])
    for member, _length in readable:
        second.hmget(keys.barrier(member), list(BARRIER_FIELDS))
    values = second.execute(raise_on_error=False) if (readable or epoch_readable) else []
    raise_transient(values)
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
    lengths = third.execute(raise_on_error=False) if any(shares) else []
    raise_transient(lengths)
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


def _newest_members(client: RedisClient, keys: JobKeys, problems: list[str]) -> list[str] | None:
    """The ``STATUS_BARRIERS`` members of the index with the latest arrivals, well-formed;
    ``None`` if the index cannot be read (said in ``problems``)."""
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.barrier_index)
    (size,) = pipe.execute(raise_on_error=False)
    raise_transient([size])
    if isinstance(size, Exception):
        problems.append(f"barriers not shown: {' '.join(str(size).split())[:160]}")
        return None
    if size > MAX_BARRIER_INDEX_READ:
        problems.append(
            f"the barrier index is oversized ({size} members; arrivals keep at most "
            f"{MAX_BARRIER_INDEX}): barriers not shown (the next arrival drops it)"
        )
        return None
    index: list[Any] = []
    if size:
        try:
            index = client.zrangebyscore(
                keys.barrier_index, "-inf", "+inf", start=0, num=size, withscores=True
            )
        except redis.exceptions.NoPermissionError:
            problems.append(f"barriers not shown: {NOT_LISTED}")
            return None
    newest = sorted(index, key=lambda pair: -float(pair[1]))[:STATUS_BARRIERS]
    members = []
    for member, _score in newest:
        raw = member if isinstance(member, bytes) else str(member).encode()
        if _BARRIER_MEMBER.fullmatch(raw) is None:
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
    if isinstance(sizes[0], Exception) or (failed is not None and _text(sizes[0]) == "hash"):
        problems.append(f"barriers not shown: {' '.join(str(failed).split())[:160]}")
        return None
    kind = _text(sizes[0])
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


def _text(raw: object) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
