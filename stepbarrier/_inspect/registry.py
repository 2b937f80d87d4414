"""The job's registry of waiting workers, read through its index, never a keyspace SCAN.

The targets sorted set (member: waiter id, score: the step it waits for) is the
job's index of live waiters: every waiter puts itself back in it on each
refresh. Each member's registry hash is ``JobKeys.waiter(id)``. Workers write
both, so everything here is untrusted: a malformed score or entry becomes a
line in ``problems``, never an exception and never a crash of a view.

The registry is self-reported: any holder of a worker's password may add
entries, or make them of any size. So it is read in bounded work only: at most
``MAX_INDEXED`` members (the lowest targets), with ``LIMIT``; of each entry only
its known fields (``HMGET``, never ``HGETALL``), once ``HLEN`` and ``HSTRLEN``
showed that it is no larger than an entry the library writes. An oversized
entry is reported in ``problems``, not read.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import redis

from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.library import MAX_FIELDS, MAX_VALUE
from stepbarrier._protocol.wire import parse_int, preview
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.failures import is_transient

MAX_INDEXED = 10_000
"""Most waiters one status read shows (the first ones by target)."""
ENTRY_FIELDS = ("task_id", "wait_until_step", "since", "host", "pid")
"""The fields of a registry entry (``stepbarrier._worker.links.registry_entry``): all
that is read of one."""
TEXT_LIMIT = 200
"""Characters of an untrusted text field (a host name) kept for display."""
SINCE_LIMIT = 1e11
"""A ``since`` (Unix time) at or above this, about year 5138, is malformed."""

# A waiter stores ``since`` as "%.3f": plain decimal digits, nothing Python's
# float() would also take ("nan", "inf", "1e20", " 5", "5_0").
_SINCE = re.compile(r"[0-9]{1,11}(?:\.[0-9]{1,9})?")


@dataclass(frozen=True)
class WaiterInfo:
    """One registered waiting worker.

    Attributes:
        task_id: Its task id (``None`` if it has none, e.g. a shell script).
        wait_until_step: The step it waits for.
        since: Unix time when it started waiting (``None`` if its entry holds
            no plausible time).
        host: Its host name, with control characters escaped.
        pid: Its process id.
    """

    task_id: int | None
    wait_until_step: int
    since: float | None
    host: str
    pid: int | None


def printable(raw: object, limit: int = TEXT_LIMIT) -> str:
    """Untrusted text, cut to ``limit`` characters, with control characters escaped.

    A terminal would otherwise obey escape sequences a worker wrote into Redis.
    """
    if isinstance(raw, bytes):
        text = raw.decode("utf-8", "replace")
    elif isinstance(raw, str):
        text = raw
    else:
        text = "" if raw is None else str(raw)
    shown = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text[:limit])
    return shown + ("..." if len(text) > limit else "")


def _identity(raw: Any) -> Any:
    return raw


def raise_transient(replies: list[Any]) -> None:
    """Raise the first reply that a retry may cure (BUSY, LOADING, a slot on the move).

    A pipeline returns each command's error in its reply's place: a Redis busy
    with a script must end the read (the caller retries, then reports BUSY),
    not become a line of malformed content.
    """
    for reply in replies:
        if isinstance(reply, Exception) and is_transient(reply):
            raise reply


def queue_index_read(
    pipe: redis.client.Pipeline, keys: JobKeys, *, start: int = 0, count: int = MAX_INDEXED
) -> None:
    """Queue the read of ``count`` index members (lowest target first), with raw scores.

    ZRANGEBYSCORE rather than ZRANGE: the ACL's chief user (``reset``) may run it.
    """
    pipe.zrangebyscore(
        keys.targets,
        "-inf",
        "+inf",
        start=start,
        num=count,
        withscores=True,
        score_cast_func=_identity,  # parsed strictly below, not by float()
    )


def parse_index(
    raw: object, problems: list[str], *, limit: int = MAX_INDEXED
) -> list[tuple[bytes, int]]:
    """``(waiter id, target)`` of each well-formed index member; the rest become problems.

    ``limit``: how many members were asked for (``queue_index_read``'s count):
    as many read means that there may be more, which is said in ``problems``.
    """
    if isinstance(raw, Exception):
        problems.append(f"waiter index unreadable: {' '.join(str(raw).split())[:120]}")
        return []
    if not isinstance(raw, list):
        return []
    members = []
    for item in raw:
        member, score = item
        target = _index_target(score)
        if target is None:
            problems.append(f"waiter index: {preview(member)} has target {preview(score)}")
        else:
            members.append((_to_bytes(member), target))
    if len(raw) >= limit:
        problems.append(f"more than {limit} indexed waiters: only the first are shown")
    return members


def _index_target(score: object) -> int | None:
    if isinstance(score, float):  # RESP3 replies carry doubles
        if not (math.isfinite(score) and score.is_integer()):
            return None
        return parse_int(int(score), low=1)
    return parse_int(score, low=1)


def _to_bytes(member: object) -> bytes:
    return member if isinstance(member, bytes) else str(member).encode("utf-8", "replace")


def entry_key(keys: JobKeys, waiter_id: bytes) -> bytes:
    """The registry key of the waiter ``waiter_id`` (bytes: ids are untrusted)."""
    return keys.waiter_prefix.encode() + waiter_id


def read_entries(
    client: RedisClient, keys: JobKeys, index: list[tuple[bytes, int]], problems: list[str]
) -> list[WaiterInfo]:
    """The registry entries of the indexed waiters, in two round trips of O(1) commands.

    First the size of each entry (``HLEN``, and ``HSTRLEN`` of each known field),
    then the known fields of those that are no larger than ``MAX_FIELDS`` fields
    of at most ``MAX_VALUE`` bytes (``HMGET``): an oversized entry is a problem,
    and is not read. An entry that is gone has expired (its waiter died or left):
    it is skipped.

    Raises:
        redis.exceptions.NoPermissionError: The user may not read the entries.
    """
    (found,) = read_entries_of(client, [(keys, index, problems)])
    if isinstance(found, Exception):
        raise found
    return found


EntriesRead = list[WaiterInfo] | redis.exceptions.NoPermissionError
"""One job's waiters read by ``read_entries_of``, or the refusal of its entries."""


def read_entries_of(
    client: RedisClient, jobs: list[tuple[JobKeys, list[tuple[bytes, int]], list[str]]]
) -> list[EntriesRead]:
    """``read_entries`` of several jobs at once: ``(keys, index, problems)`` each.

    The same two round trips for all of them (a listing reads a batch of jobs so);
    a job whose entries this user may not read gets the refusal in its place.
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
    sizes = pipe.execute(raise_on_error=False)
    raise_transient(sizes)
    refused: dict[int, redis.exceptions.NoPermissionError] = {}
    readable: list[tuple[int, bytes, int]] = []  # (job number, waiter id, target)
    position = 0
    for number, (_keys, index, problems) in enumerate(jobs):
        for waiter_id, target in index:
            replies = sizes[position * width : (position + 1) * width]
            position += 1
            failed = next((r for r in replies if isinstance(r, Exception)), None)
            if isinstance(failed, redis.exceptions.NoPermissionError):
                refused[number] = failed
            elif failed is not None:
                problems.append(
                    f"waiter entry {preview(waiter_id)} unreadable: {type(failed).__name__}"
                )
            elif replies[0] > MAX_FIELDS or max(replies[1:]) > MAX_VALUE:
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
        replies = pipe.execute(raise_on_error=False)
        raise_transient(replies)
        for (number, waiter_id, target), raw in zip(readable, replies, strict=True):
            problems = jobs[number][2]
            if isinstance(raw, redis.exceptions.NoPermissionError):
                refused[number] = raw
                continue
            if isinstance(raw, Exception):
                problems.append(
                    f"waiter entry {preview(waiter_id)} unreadable: {type(raw).__name__}"
                )
                continue
            pairs = zip(ENTRY_FIELDS, raw, strict=True)
            fields = {name: value for name, value in pairs if value is not None}
            if not fields:  # fields, but none of an entry's
                problems.append(f"waiter {preview(waiter_id)}: wait_until_step=missing")
                continue
            entry = parse_entry(fields, waiter_id, target, problems)
            if entry is not None:
                waiters[number].append(entry)
    return [refused.get(number, found) for number, found in enumerate(waiters)]


def parse_entry(
    raw: object, waiter_id: bytes, target: int, problems: list[str]
) -> WaiterInfo | None:
    """One waiter's registry hash, or ``None`` if it is gone or has no valid target."""
    if not isinstance(raw, dict) or not raw:
        return None
    fields = {printable(k, 40): v for k, v in raw.items()}
    name = preview(waiter_id)
    wait_until_step = parse_int(fields.get("wait_until_step"), low=1)
    if wait_until_step is None:
        problems.append(f"waiter {name}: wait_until_step={preview(fields.get('wait_until_step'))}")
        return None
    if wait_until_step != target:
        problems.append(f"waiter {name}: waits for {wait_until_step}, indexed at {target}")
    task_id = _optional_int(fields, "task_id", 1_000_000, name, problems)
    pid = _optional_int(fields, "pid", 2**31, name, problems)
    since = parse_since(fields.get("since"))
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


def parse_since(raw: object) -> float | None:
    """A stored Unix time: plain decimal, finite, in ``[0, SINCE_LIMIT)``; else ``None``."""
    text = raw.decode("ascii", "replace") if isinstance(raw, bytes) else raw
    if not isinstance(text, str) or _SINCE.fullmatch(text) is None:
        return None
    value = float(text)
    return value if value < SINCE_LIMIT else None


def indexed_keys(client: RedisClient, keys: JobKeys, *, page: int, limit: int) -> Iterator[bytes]:
    """Registry keys of every indexed waiter (at most ``limit``), read ``page`` at a time.

    Scores are not checked: whatever is indexed belongs to the job.
    """
    for start in range(0, limit, page):
        members = client.zrangebyscore(keys.targets, "-inf", "+inf", start=start, num=page)
        for member in members:
            yield entry_key(keys, _to_bytes(member))
        if len(members) < page:
            return
