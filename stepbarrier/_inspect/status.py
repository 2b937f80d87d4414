"""What an operator sees: the chief's state and who waits for what.

``read_status`` only reads (it works with the read-only ``monitor`` user) and
never fails on malformed content: it reports it in ``JobStatus.problems``.
Waiters are found through the job's own index (``stepbarrier._inspect.registry``),
never by scanning the keyspace.

Every key it reads may have been written by hand, with any size, by whoever
holds a worker's (or the chief's) password. So every read is bounded: the state
and the barriers through the library's ``waiter_read`` (which checks sizes
before it reads, and reads only known fields), the indexes with ``ZCARD`` and
``LIMIT``, the waiters' entries as ``waiter_registry.read_entries`` does. An
oversized key is reported in ``problems``, and not read.

The waiters are self-reported: each entry is what a process that holds a
worker's password wrote about itself, so a misbehaving one can add waiters that
do not exist (at most ``MAX_INDEXED`` are shown, the lowest targets first).
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from stepbarrier._barriers.index import STATUS_BARRIERS, BarrierInfo
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._inspect.registry import (
    MAX_INDEXED,
    SINCE_LIMIT,
    WaiterInfo,
    parse_index,
    printable,
    queue_index_read,
    read_entries,
)
from stepbarrier._protocol.barrier_library import MAX_BARRIER_INDEX
from stepbarrier._protocol.barrier_record import epoch_token, state_from_read
from stepbarrier._protocol.calls import Call
from stepbarrier._protocol.wire import parse_int, parse_state, preview
from stepbarrier._redis.client import RedisClient, with_client
from stepbarrier._redis.functions import RedisCode
from stepbarrier._worker.links import oversized_state_problem

STATUS_RETRY_SECONDS = 5.0
"""How long ``read_status`` retries an unreachable Redis before giving up."""
_NOT_LISTED = (
    "this user may not list them (ZRANGEBYSCORE: a worker's password holds no range "
    "read); read the status as the monitor user"
)
MAX_HEARTBEAT_PERIOD_MS = 3_600_000
"""Longest heartbeat period (ms) a chief may state: the config's own limit."""
MAX_BARRIER_INDEX_READ = 2 * MAX_BARRIER_INDEX
"""Largest barrier index ``status`` reads: an arrival keeps it below this (it
drops a larger one), so only a hand-made index is larger, and it is reported."""
_BARRIER_MEMBER = re.compile(rb"[A-Za-z0-9._-]{1,64}(:[A-Za-z0-9._-]{1,64})?")


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
        barriers: Open named barriers (``stepbarrier.Barrier``), latest arrival first.
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

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the CLI's ``status --json``); every number is finite."""
        data = asdict(self)
        data["waiters"] = [asdict(w) for w in self.waiters]
        data["barriers"] = [{**asdict(b), "missing": list(b.missing)} for b in self.barriers]
        data["problems"] = list(self.problems)
        return data


def read_status(
    config: BarrierConfig,
    client: RedisClient | None = None,
    *,
    waiters: bool = True,
    max_waiters: int = MAX_INDEXED,
    barriers: bool = True,
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

    Raises:
        RedisUnavailable: Redis was unreachable for ``STATUS_RETRY_SECONDS``.
        RedisRefused: Redis refused the read (authentication, ACL).
    """
    return with_client(
        config,
        client,
        lambda active: _read(config, active, waiters, max(0, max_waiters), barriers),
        action="read the job's status",
        retry_seconds=STATUS_RETRY_SECONDS,
    )


def _read(
    config: BarrierConfig,
    client: RedisClient,
    with_waiters: bool = True,
    max_waiters: int = MAX_INDEXED,
    with_barriers: bool = True,
) -> JobStatus:
    keys = config.keys
    # the state with the clock of the node that holds it (in a cluster, the
    # slot's owner: another node's clock would skew the heartbeat's age)
    snapshot = RedisCode(client, config).call("waiter_read", [keys.state, keys.reset], [])
    index_raw: object = []
    if with_waiters and max_waiters:
        pipe = client.pipeline(transaction=False)
        queue_index_read(pipe, keys, count=max_waiters)
        (index_raw,) = pipe.execute(raise_on_error=False)
    now_raw, reset_raw, kind_raw, *flat = list(snapshot)
    now_ms = parse_int(now_raw) or 0
    kind = kind_raw.decode() if isinstance(kind_raw, bytes) else str(kind_raw)
    state_raw: object = dict(zip(flat[0::2], flat[1::2], strict=False)) if kind == "hash" else {}
    problems: list[str] = []
    if kind == "oversized":
        problems.append(oversized_state_problem())
    elif kind not in ("hash", "none"):
        state_raw = redis.ResponseError(f"the state key holds a {kind}, not a hash")
    reset_raw = reset_raw or None
    state = parse_state(state_raw)
    if state.problem:
        problems.append(state.problem)
    reset_ms = _reset_ms(reset_raw, problems)
    if isinstance(index_raw, redis.exceptions.NoPermissionError):
        # a user that may read the state but not the index still sees the step;
        # ZCARD (which it may run) tells whether there was anything to show
        if _index_size(client, keys.targets) != 0:
            problems.append(f"waiters not shown: {_NOT_LISTED}")
        index_raw = []
    index = parse_index(index_raw, problems, limit=max_waiters or MAX_INDEXED)
    waiters = read_entries(client, keys, index, problems)
    barriers = _open_barriers(client, config, now_ms, problems) if with_barriers else ()
    return JobStatus(
        job=config.job,
        step=state.step,
        generation=state.generation,
        heartbeat_age=_age(now_ms, state.heartbeat_ms),
        done=state.done,
        chief=None if state.chief is None else printable(state.chief),
        reset_at=None if reset_ms is None else reset_ms / 1000,
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


def _index_size(client: RedisClient, key: str) -> int | None:
    """How many members an index has (``None``: it could not be told)."""
    try:
        return int(client.zcard(key))
    except redis.RedisError:
        return None


def _open_barriers(
    client: RedisClient, config: BarrierConfig, now_ms: int, problems: list[str]
) -> tuple[BarrierInfo, ...]:
    """The job's open barriers, latest arrival first (at most ``STATUS_BARRIERS``).

    Bounded whatever a worker wrote: the index is read only if ``ZCARD`` shows
    at most ``MAX_BARRIER_INDEX_READ`` members, and the epoch and each barrier
    through ``waiter_read``, which refuses an oversized hash (reported here).
    """
    keys = config.keys
    pipe = client.pipeline(transaction=False)
    pipe.zcard(keys.barrier_index)
    (size,) = pipe.execute(raise_on_error=False)
    if isinstance(size, Exception):
        problems.append(f"barriers not shown: {' '.join(str(size).split())[:160]}")
        return ()
    if size > MAX_BARRIER_INDEX_READ:
        problems.append(
            f"the barrier index is oversized ({size} members; arrivals keep at most "
            f"{MAX_BARRIER_INDEX}): barriers not shown (the next arrival drops it)"
        )
        return ()
    index: list[Any] = []
    if size:
        try:
            index = client.zrangebyscore(
                keys.barrier_index, "-inf", "+inf", start=0, num=size, withscores=True
            )
        except redis.exceptions.NoPermissionError:
            problems.append(f"barriers not shown: {_NOT_LISTED}")
            return ()
    newest = sorted(index, key=lambda pair: -float(pair[1]))[:STATUS_BARRIERS]
    members = []
    for member, _score in newest:
        raw = _to_bytes(member)
        if _BARRIER_MEMBER.fullmatch(raw) is None:
            problems.append(f"malformed barrier name in the index: {printable(raw, 40)!r}")
        else:
            members.append(raw.decode())
    calls: list[Call] = [("waiter_read", [keys.barrier_epoch, keys.reset], [])]
    calls += [("waiter_read", [keys.barrier(m), keys.reset], []) for m in members]
    epoch_reply, *replies = RedisCode(client, config).replies(calls)
    if isinstance(epoch_reply, Exception):
        problems.append(f"barriers not shown: {' '.join(str(epoch_reply).split())[:160]}")
        return ()
    epoch = _epoch(list(epoch_reply), problems)
    found = []
    for member, reply in zip(members, replies, strict=True):
        if isinstance(reply, Exception):
            continue  # not readable by this user, or gone: nothing to show
        kind = _text(reply[2])
        if kind == "oversized":
            problems.append(f"barrier {member!r} is oversized: not read")
            continue
        if kind != "hash":
            continue  # expired since the index was read, or not a hash: nothing to show
        barrier = state_from_read(member, list(reply))
        if barrier is None:
            problems.append(f"barrier {member!r} is malformed (no valid number of parties)")
        elif epoch is not None and barrier.epoch == epoch and not barrier.complete:
            found.append(
                BarrierInfo(
                    name=barrier.name,
                    run_id=barrier.run_id,
                    parties=barrier.parties,
                    arrived=len(barrier.arrivals),
                    missing=barrier.missing,
                    open_for=_age(now_ms, barrier.created_ms),
                    last_arrival_age=_age(now_ms, barrier.last_ms),
                )
            )
    return tuple(found)


def _epoch(reply: list[Any], problems: list[str]) -> str | None:
    kind = _text(reply[2])
    if kind == "none":
        return None
    if kind != "hash":
        what = "oversized" if kind == "oversized" else "not a hash"
        problems.append(f"the barrier epoch is malformed ({what}): every barrier is stale")
        return None
    flat = reply[3:]
    fields = dict(zip(flat[0::2], flat[1::2], strict=False))
    return epoch_token(fields.get(b"token", fields.get("token")))


def _text(raw: object) -> str:
    return raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)


def _to_bytes(member: object) -> bytes:
    return member if isinstance(member, bytes) else str(member).encode()


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
