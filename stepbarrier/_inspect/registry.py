"""The job's registry of waiting workers, read through its index, never a keyspace SCAN.

The targets sorted set (member: waiter id, score: its target step) indexes the
live waiters; each has its entry, the hash ``JobKeys.waiter(id)``.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, fields
from typing import Any

import redis

from stepbarrier._protocol.calls import index_call
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.library import MAX_ARGUMENT, MAX_FIELDS, MAX_VALUE
from stepbarrier._protocol.wire import as_text, parse_int, preview
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.failures import is_transient
from stepbarrier._redis.functions import RedisCode

MAX_INDEXED = 10_000
"""Most waiters one status read shows (the first ones by target)."""
TEXT_LIMIT = 200
"""Characters of an untrusted text field (a host name) kept for display."""
SINCE_LIMIT = 1e11
"""A ``since`` (Unix time) at or above this, about year 5138, is malformed."""

# A waiter stores ``since`` as "%.3f": plain decimal digits, nothing Python's
# float() would also take ("nan", "inf", "1e20", " 5", "5_0").
_SINCE = re.compile(r"[0-9]{1,11}(?:\.[0-9]{1,9})?")


@dataclass(frozen=True)
class WaiterInfo:
    """One registered waiting worker, as its entry says (``None``: not held, or not
    plausible; a shell script has no task id); ``since`` is Unix time, ``host``
    has its control characters escaped."""

    task_id: int | None
    wait_until_step: int
    since: float | None
    host: str
    pid: int | None


ENTRY_FIELDS = tuple(field.name for field in fields(WaiterInfo))
"""The fields of a registry entry (``stepbarrier._worker.links.registry_entry``),
named as ``WaiterInfo``'s: all that is read of one."""


def printable(raw: object, limit: int = TEXT_LIMIT) -> str:
    """Untrusted text, cut to ``limit`` characters, with control characters escaped.

    A terminal would otherwise obey escape sequences a worker wrote into Redis.
    """
    text = as_text(raw)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def one_line(raw: object, limit: int = 120) -> str:
    """An error (or any text) on one line, cut to ``limit`` characters."""
    return " ".join(str(raw).split())[:limit]


def raise_transient(replies: list[Any]) -> None:
    """Raise the first reply that a retry may cure (BUSY, LOADING, a slot on the move).

    A pipeline returns each command's error in its reply's place: a Redis busy
    with a script must end the read (the caller retries, then reports BUSY),
    not become a line of malformed content.
    """
    for reply in replies:
        if isinstance(reply, Exception) and is_transient(reply):
            raise reply


def replies_of(pipe: Any) -> list[Any]:
    """The replies of a pipeline, each error in its place (``raise_transient``'s aside)."""
    replies = list(pipe.execute(raise_on_error=False))
    raise_transient(replies)
    return replies


def read_index(code: RedisCode, key: str, *, start: int = 0, count: int) -> object:
    """``count`` members of the sorted set ``key`` from rank ``start`` with raw scores
    (``index_read``: none over ``MAX_ARGUMENT`` bytes sent, they are counted), for
    ``parse_index``; errors as ``replies_of``."""
    replies = code.replies([index_call(key, start=start, count=count)])
    raise_transient(replies)
    return as_refused(replies[0])


def as_refused(reply: object) -> object:
    """A script's ACL refusal as the ``NoPermissionError`` its command would raise."""
    if isinstance(reply, redis.ResponseError) and "user executing the script can't" in str(reply):
        return redis.exceptions.NoPermissionError(str(reply))
    return reply


def index_length(raw: object) -> int:
    """How many members an ``index_read`` reply went over (sent or counted)."""
    if not isinstance(raw, list) or not raw:
        return 0
    return (len(raw) - 1) // 2 + (raw[0] if isinstance(raw[0], int) else 0)


def parse_index(
    raw: object, problems: list[str], *, limit: int = MAX_INDEXED
) -> list[tuple[bytes, int]]:
    """``(waiter id, target)`` of each well-formed member of an ``index_read`` reply;
    the rest (and the oversized it counted) become problems. ``limit``: the count
    asked for: as many read means that there may be more (a problem too)."""
    if isinstance(raw, Exception):
        problems.append(f"waiter index unreadable: {one_line(raw)}")
        return []
    if not isinstance(raw, list) or not raw:
        return []
    members = []
    for member, score in zip(raw[1::2], raw[2::2], strict=False):
        if isinstance(score, float):  # RESP3 replies carry doubles
            score = int(score) if math.isfinite(score) and score.is_integer() else None
        target = parse_int(score, low=1)
        if target is None:
            problems.append(f"waiter index: {preview(member)} has target {preview(score)}")
        else:
            members.append((to_bytes(member), target))
    if isinstance(raw[0], int) and raw[0]:
        problems.append(
            f"waiter index: {raw[0]} oversized member(s) (over {MAX_ARGUMENT} bytes): not read"
        )
    if index_length(raw) >= limit:
        problems.append(f"more than {limit} indexed waiters: only the first are shown")
    return members


def to_bytes(member: object) -> bytes:
    """A member of a sorted set as bytes (a client may decode replies)."""
    return member if isinstance(member, bytes) else str(member).encode("utf-8", "replace")


def entry_key(keys: JobKeys, waiter_id: bytes) -> bytes:
    """The registry key of the waiter ``waiter_id`` (bytes: ids are untrusted)."""
    return keys.waiter_prefix.encode() + waiter_id


def read_entries_of(
    client: RedisClient, jobs: list[tuple[JobKeys, list[tuple[bytes, int]], list[str]]]
) -> list[list[WaiterInfo] | redis.exceptions.NoPermissionError]:
    """The entries of the indexed waiters of several jobs (``(keys, index, problems)``
    each), in two round trips: the sizes, then the known fields of those not
    oversized. An entry that is gone has expired (its waiter died or left): it is
    skipped. A job whose entries this user may not read gets the refusal in its place.
    """
    width = 1 + len(ENTRY_FIELDS)
    indexed = [(keys, waiter_id, target) for keys, index, _ in jobs for waiter_id, target in index]
    if not indexed:
        return [[] for _ in jobs]
    pipe = client.pipeline(transaction=False)
    for keys, waiter_id, _ in indexed:
        key = entry_key(keys, waiter_id)
        pipe.hlen(key)
        for name in ENTRY_FIELDS:
            pipe.hstrlen(key, name)
    sizes = replies_of(pipe)
    refused: dict[int, redis.exceptions.NoPermissionError] = {}

    def failed(number: int, waiter_id: bytes, reply: object) -> bool:
        """Whether ``reply`` is an error: the job's refusal, or a problem of the entry."""
        if isinstance(reply, redis.exceptions.NoPermissionError):
            refused[number] = reply
        elif isinstance(reply, Exception):
            name = type(reply).__name__
            jobs[number][2].append(f"waiter entry {preview(waiter_id)} unreadable: {name}")
        return isinstance(reply, Exception)

    readable: list[tuple[int, bytes, int]] = []  # (job number, waiter id, target)
    position = 0
    for number, (_keys, index, problems) in enumerate(jobs):
        for waiter_id, target in index:
            replies = sizes[position * width : (position + 1) * width]
            position += 1
            if failed(number, waiter_id, next((r for r in replies if isinstance(r, Exception)), 0)):
                continue
            if replies[0] > MAX_FIELDS or max(replies[1:]) > MAX_VALUE:
                problems.append(
                    f"waiter entry {preview(waiter_id)} is oversized ({replies[0]} fields, the "
                    f"longest known one {max(replies[1:])} bytes; an entry has at most "
                    f"{MAX_FIELDS} fields of {MAX_VALUE} bytes): not read"
                )
            elif replies[0]:
                readable.append((number, waiter_id, target))
    readable = [entry for entry in readable if entry[0] not in refused]
    waiters: list[list[WaiterInfo]] = [[] for _ in jobs]
    if readable:
        pipe = client.pipeline(transaction=False)
        for number, waiter_id, _ in readable:
            pipe.hmget(entry_key(jobs[number][0], waiter_id), ENTRY_FIELDS)
        replies = replies_of(pipe)
        for (number, waiter_id, target), raw in zip(readable, replies, strict=True):
            if failed(number, waiter_id, raw):
                continue
            fields = dict(zip(ENTRY_FIELDS, raw, strict=True))
            if entry := parse_entry(fields, waiter_id, target, jobs[number][2]):
                waiters[number].append(entry)
    return [refused.get(number, found) for number, found in enumerate(waiters)]


def parse_entry(
    fields: dict[str, Any], waiter_id: bytes, target: int, problems: list[str]
) -> WaiterInfo | None:
    """One waiter's entry (its known fields, ``None`` if absent), or ``None`` if it has
    no valid target."""
    name = preview(waiter_id)
    wait_until_step = parse_int(fields.get("wait_until_step"), low=1)
    if wait_until_step is None:
        problems.append(f"waiter {name}: wait_until_step={preview(fields.get('wait_until_step'))}")
        return None
    if wait_until_step != target:
        problems.append(f"waiter {name}: waits for {wait_until_step}, indexed at {target}")
    task_id = _optional_int(fields, "task_id", 1_000_000, name, problems)
    pid = _optional_int(fields, "pid", 2**31, name, problems)
    # a stored Unix time: plain decimal, finite, in [0, SINCE_LIMIT) (_SINCE's 11 digits)
    since_text = as_text(fields.get("since"))
    since = float(since_text) if _SINCE.fullmatch(since_text) else None
    if since is None:
        problems.append(f"waiter {name}: since={preview(fields.get('since'))}")
    return WaiterInfo(
        task_id=task_id,
        wait_until_step=wait_until_step,
        since=since,
        host=printable(fields.get("host")),
        pid=pid,
    )


def _optional_int(
    fields: dict[str, Any], field: str, high: int, name: str, problems: list[str]
) -> int | None:
    raw = fields.get(field)
    value = parse_int(raw, high=high)
    if raw not in (None, b"", "") and value is None:  # empty: the waiter has none
        problems.append(f"waiter {name}: {field}={preview(raw)}")
    return value
