"""What a named barrier holds in Redis, read back: who arrived, who is missing
(docs/protocol.md#barriers). Only parsing and naming: reading is
``stepbarrier._barriers.barrier`` (a waiting task) and ``stepbarrier._inspect.status``
(``stepbarrier status``).
"""

from __future__ import annotations

import operator
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from stepbarrier._protocol.wire import NAME, as_text, json_object, parse_int
from stepbarrier.errors import ConfigurationError

MAX_PARTIES = 10_000
"""Most tasks one barrier can wait for (why, and what a large barrier costs Redis:
docs/protocol.md#bounds)."""
_TASK_FIELD = re.compile(rb"t(0|[1-9][0-9]{0,8})")


def validate_barrier_name(name: object) -> str:
    """Return ``name`` if it is a valid barrier name, else raise ``ConfigurationError``."""
    if not isinstance(name, str) or NAME.fullmatch(name) is None:
        raise ConfigurationError(
            "a barrier name must be 1 to 64 characters from letters, digits, '.', '_' and "
            f"'-' (one name per barrier and run, e.g. 'epoch-3'), got {str(name)[:80]!r}",
            variable="name",
        )
    return name


def validate_parties(parties: object) -> int:
    """Return ``parties`` as an int from 1 to ``MAX_PARTIES``, else raise ``ConfigurationError``."""
    try:
        count = operator.index(parties)  # type: ignore[arg-type]
    except TypeError:
        count = 0
    if isinstance(parties, bool) or not 1 <= count <= MAX_PARTIES:
        raise ConfigurationError(
            f"parties must be an integer from 1 to {MAX_PARTIES} (the chief and the "
            f"workers that arrive), got {parties!r}",
            variable="parties",
        )
    return count


def barrier_member(name: str, run_id: str | None) -> str:
    """How the barrier ``name`` of run ``run_id`` is named in the job's keys."""
    return name if run_id is None else f"{name}:{run_id}"


def split_member(member: str) -> tuple[str, str | None]:
    """The name and run id of a barrier from its member name."""
    name, colon, run_id = member.partition(":")
    return name, (run_id if colon else None)


@dataclass(frozen=True)
class BarrierState:
    """One barrier as stored (docs/protocol.md#barriers); its times are Redis's (ms).

    Attributes:
        parties: How many tasks it waits for (ids ``0..parties-1``).
        arrivals: ``(task id, Redis time in ms)`` of each arrival, by task id.
        completed_ms: When the arrivals completed it, as stored (a record only:
            ``complete`` counts the arrivals themselves).
        epoch: The job's barrier epoch token it was begun under (``None``: none
            stored); under another epoch than the current one it is stale.
        counted: A party's O(1) read (``read_call(party=...)``): at most this many
            task fields are stored, fewer than its parties, and ``arrivals`` hold
            only its own; ``None``: every arrival was read.
    """

    name: str
    run_id: str | None
    parties: int
    arrivals: tuple[tuple[int, int], ...]
    created_ms: int | None = None
    last_ms: int | None = None
    completed_ms: int | None = None
    epoch: str | None = None
    counted: int | None = None

    @property
    def complete(self) -> bool:
        """True once every party arrived: each task's own field, counted against
        ``parties`` (a party's own number, if it read the barrier with it:
        ``state_from_read(parties=...)``), never the stored ``arrived`` counter or
        ``completed_ms``, which anyone who may write the barrier could set, nor an
        announcement."""
        return len(self.arrivals) >= self.parties

    @property
    def arrived(self) -> tuple[int, ...]:
        """The ids of the tasks that arrived, sorted."""
        return tuple(task for task, _ in self.arrivals)

    @property
    def missing(self) -> tuple[int, ...]:
        """The ids of the tasks that have not arrived, sorted."""
        arrived = set(self.arrived)
        return tuple(task for task in range(self.parties) if task not in arrived)


def epoch_token(raw: object) -> str | None:
    """An epoch token as stored (compared for equality only), ``None`` if malformed."""
    token = parse_int(raw)
    return None if token is None else str(token)


def describe_tasks(tasks: Iterable[int], *, limit: int = 12, spans: bool = True) -> str:
    """Task ids as short ranges: ``"1, 3-5, 9"`` (one by one without ``spans``: ``"1, 3,
    4, 5, 9"``); past ``limit`` ranges, how many more tasks."""
    ranges: list[tuple[int, int]] = []
    for task in sorted(set(tasks)):
        if spans and ranges and task == ranges[-1][1] + 1:
            ranges[-1] = (ranges[-1][0], task)
        else:
            ranges.append((task, task))
    shown = [str(a) if a == b else f"{a}-{b}" for a, b in ranges[:limit]]
    rest = sum(b - a + 1 for a, b in ranges[limit:])
    if rest:
        shown.append(f"and {rest} more")
    return ", ".join(shown) if shown else "none"


def parse_barrier_notice(raw: object) -> str | None:
    """A message of the barrier channel: ``"reset"``, the member name of a barrier
    that just completed, or ``None`` for anything else."""
    data = json_object(as_text(raw), most=1024)
    if data is None:
        return None
    if data.get("reset") is True:
        return "reset"
    member = data.get("barrier")
    if data.get("complete") is True and isinstance(member, str):
        return member
    return None


def state_from_read(
    member: str, reply: list[Any], *, parties: int | None = None
) -> BarrierState | None:
    """The barrier stored under ``member`` from a ``waiter_read`` reply on its hash
    (``None``: none, or malformed). Task fields outside ``0..parties-1`` and malformed
    times are ignored.

    Args:
        parties: A party's own number of parties: the barrier is read as one of
            that many tasks, whatever ``parties`` is stored, which whoever may write
            the barrier could have set. ``None``: the stored number (``status``).
    """
    kind = reply[2].decode() if isinstance(reply[2], bytes) else str(reply[2])
    if kind not in ("hash", "counted"):
        return None
    flat = reply[3:]
    fields: dict[bytes, object] = dict(zip(flat[0::2], flat[1::2], strict=False))
    stored = parse_int(fields.get(b"parties"), low=1, high=MAX_PARTIES)
    if stored is None:
        return None
    if parties is None:
        parties = stored
    arrivals = []
    for field, value in fields.items():
        match = _TASK_FIELD.fullmatch(field) if isinstance(field, bytes) else None
        at = parse_int(value)
        if match is not None and at is not None and int(match.group(1)) < parties:
            arrivals.append((int(match.group(1)), at))
    name, run_id = split_member(member)
    return BarrierState(
        name=name,
        run_id=run_id,
        parties=parties,
        arrivals=tuple(sorted(arrivals)),
        created_ms=parse_int(fields.get(b"created_ms")),
        last_ms=parse_int(fields.get(b"last_ms")),
        completed_ms=parse_int(fields.get(b"completed_ms")),
        epoch=epoch_token(fields.get(b"epoch")),
        counted=parse_int(fields.get(b"tasks")) if kind == "counted" else None,
    )
