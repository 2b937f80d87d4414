"""What travels through Redis, and how untrusted content is read back.

Everything stored or announced is an integer or JSON; nothing is ever
unpickled or evaluated. Whatever someone else wrote into a job's keys or onto
its channel is parsed defensively: malformed content becomes ``None`` plus a
description of the problem, never an exception.
"""

from __future__ import annotations

import json
import operator
import re
from dataclasses import dataclass
from typing import Any

MAX_STEP = 2**53 - 2
"""Largest stored number (a step, generation, beat, fence, ``begun`` or
``probation``): the one number range of the protocol, which the Lua library
takes from this constant. Lua's numbers are doubles, exact up to 2**53; at most ``2**53 - 2``,
every stored ``n`` has an exact ``n + 1`` (at 2**53, ``n + 1 == n``: a newer
generation would equal the older one). A larger stored number reads as
malformed, here and in the Lua's ``whole()``."""
MAX_STEP_TEXT = "2**53 - 2"
"""``MAX_STEP`` as messages name it."""

NAME = re.compile(r"[A-Za-z0-9._-]{1,64}")
"""The one name pattern: of a job, a run id and a barrier (each becomes part of
a key or a message, and holds no ``{``, ``}``, ``:`` or space)."""
RUN_ID = NAME
"""What a run id may be (``STEPBARRIER_RUN_ID``)."""
MAX_TASK_ID = 1_000_000
"""Highest task id a progress report, and the settings, may carry."""
MAX_PROGRESS_VALUE = 33
"""Longest value of a task's field in the ``progress`` hash: ``<step>:<changed_ms>``,
two numbers of at most 16 digits; a longer one is malformed (never read whole)."""

_STORED_NUMBER = re.compile(r"-?[0-9]{1,16}")


@dataclass(frozen=True)
class StepAnnouncement:
    """A valid message from the job's channel: a hint that a write happened (the
    state's fields as the write left them, docs/protocol.md#keys; ``step`` ``None``
    and ``reset`` for a reset notice, a hint only: the reset marker decides)."""

    step: int | None
    generation: int | None
    done: bool
    reset: bool
    run_id: str | None = None
    beat: int = 0
    vouch: bool = False
    pinned: bool = False
    idle_ms: int | None = None


STATE_SCHEMA: tuple[tuple[str, str, bool], ...] = (
    ("generation", "decides", True),
    ("step", "decides", True),
    ("beat", "decides", True),
    ("run_id", "decides", True),
    ("vouch", "decides", True),
    ("fence", "decides", True),
    ("begun", "decides", False),
    ("probation", "decides", False),
    ("done", "decides", True),
    ("pinned", "decides", True),
    ("reset_seen", "display", False),
    ("chief", "display", False),
    ("heartbeat_ms", "display", False),
    ("done_ms", "display", False),
    ("heartbeat_period_ms", "display", False),
    ("idle_ms", "decides", True),
)
"""The state hash, the one statement of its fields: ``(field, role, read by a wait)``.

``role`` is docs/protocol.md#keys's: a safety decision reads only the fields
that ``decides``, the others serve operators; a wait's read (``waiter_read``
with ``wait``) reads only the fields marked for it. The Lua library's field
lists (``library.STATE_FIELDS``, ``WAIT_FIELDS``), ``ChiefState`` and
``parse_state`` follow it, and a test holds the docs' table to it."""
STATE_FIELDS = tuple(name for name, _role, _waited in STATE_SCHEMA)
WAIT_FIELDS = tuple(name for name, _role, waited in STATE_SCHEMA if waited)


@dataclass(frozen=True)
class ChiefState:
    """The chief's stored state, read from the job's ``state`` hash (``STATE_SCHEMA``;
    docs/protocol.md#keys says what each field means). A field absent or malformed
    reads as 0 (``beat``, ``fence``, ``probation``) or ``None``; a malformed
    ``step``, ``generation`` or ``run_id`` makes the whole state none, with its
    ``problem`` said.
    """

    step: int | None
    generation: int | None
    done: bool
    heartbeat_ms: int | None
    chief: str | None
    problem: str | None = None
    run_id: str | None = None
    beat: int = 0
    vouch: bool = False
    pinned: bool = False
    heartbeat_period_ms: int | None = None
    done_ms: int | None = None
    fence: int = 0
    probation: int = 0
    idle_ms: int | None = None

    @classmethod
    def empty(cls, problem: str | None = None) -> ChiefState:
        """The state of a job no chief has written to (yet)."""
        return cls(None, None, False, None, None, problem)

    @property
    def mark(self) -> tuple[int, int] | None:
        """``(generation, beat)``: which write this state is, in order (``None``: no state)."""
        if self.generation is None or self.step is None:
            return None
        return (self.generation, self.beat)


def _to_text(raw: object) -> str | None:
    if isinstance(raw, bytes):
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            return None
    return raw if isinstance(raw, str) else None


def as_text(raw: object) -> str:
    """A Redis reply as text (undecodable bytes replaced, ``None`` empty)."""
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return "" if raw is None else str(raw)


def _is_one(raw: object) -> bool:  # a stored flag that is set
    return raw == b"1" or raw == "1"


def parse_int(raw: object, *, low: int = 0, high: int = MAX_STEP) -> int | None:
    """``raw`` (bytes, str or int) as an integer in ``[low, high]``, else ``None``.

    A stored number is 1 to 16 ASCII digits (a ``-`` only where ``low`` is
    negative): no space, ``+``, exponent, hex or underscore. The Lua scripts'
    ``whole()`` reads stored numbers by the same rule.
    """
    if type(raw) is bytes and 0 < len(raw) <= 16 and raw.isdigit():
        # what Redis replies (bytes.isdigit: ASCII digits only): no text to make
        value = int(raw)
        return value if low <= value <= high else None
    if isinstance(raw, bool):
        return None
    if isinstance(raw, int):
        value = raw
    else:
        text = _to_text(raw)
        if text is None or _STORED_NUMBER.fullmatch(text) is None:
            return None
        if text.startswith("-") and low >= 0:
            return None
        value = int(text)
    return value if low <= value <= high else None


def checked_step(value: object, *, what: str, low: int = 1) -> int:
    """``value`` as a step from ``low`` to ``MAX_STEP``, for an argument a caller passed.

    Raises:
        TypeError: ``value`` is not an integer (a ``bool`` is not one: ``True`` is
            no step 1; a float is not one either).
        ValueError: ``value`` is out of range (no chief can publish it).
    """
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"{what} must be an integer, got {type(value).__name__} {value!r}")
    number = operator.index(value)
    if not low <= number <= MAX_STEP:
        raise ValueError(f"{what} must be from {low} to {MAX_STEP_TEXT} ({MAX_STEP}), got {number}")
    return number


def parse_run_id(raw: object) -> str | None:
    """A stored run id, or ``None`` for none (empty) or a malformed one."""
    text = _to_text(raw)
    if text is None or RUN_ID.fullmatch(text) is None:
        return None
    return text


def parse_state(raw: object) -> ChiefState:
    """Interpret the result of ``HGETALL state`` (or an error in its place)."""
    if isinstance(raw, Exception):
        return ChiefState.empty(f"state key unreadable: {' '.join(str(raw).split())[:120]}")
    if not isinstance(raw, dict) or not raw:
        return ChiefState.empty()
    try:  # (Redis's field names: bytes of ASCII)
        fields = {(k.decode() if type(k) is bytes else _to_text(k)): v for k, v in raw.items()}
    except UnicodeDecodeError:
        fields = {_to_text(k): v for k, v in raw.items()}
    if fields.keys() <= {"fence", "begun"}:
        return ChiefState.empty()  # a chief has begun, and not written yet
    step = parse_int(fields.get("step"), low=0)
    generation = parse_int(fields.get("generation"), low=0)
    heartbeat_ms = parse_int(fields.get("heartbeat_ms"), low=0)
    chief = _to_text(fields.get("chief"))
    checked = (("step", step), ("generation", generation))
    problems = [f"{name}={preview(fields.get(name))}" for name, value in checked if value is None]
    if heartbeat_ms is None and "heartbeat_ms" in fields:
        problems.append(f"heartbeat_ms={preview(fields.get('heartbeat_ms'))}")
    # a step without its generation cannot be trusted, nor the other way round
    trusted = step is not None and generation is not None
    run_raw = fields.get("run_id")
    run_id = parse_run_id(run_raw)
    if trusted and run_raw not in (None, b"", "") and run_id is None:
        problems.append(f"run_id={preview(run_raw)}")  # trusted by no run
        trusted = False
    problem = "malformed state: " + ", ".join(problems) if problems else None
    if not trusted:
        return ChiefState(None, None, False, heartbeat_ms, chief, problem)
    return ChiefState(
        step,
        generation,
        _is_one(fields.get("done")),
        heartbeat_ms,
        chief,
        problem,
        run_id=run_id,
        vouch=_is_one(fields.get("vouch")),
        pinned=_is_one(fields.get("pinned")),
        heartbeat_period_ms=parse_int(fields.get("heartbeat_period_ms"), low=1),
        beat=parse_int(fields.get("beat")) or 0,
        fence=parse_int(fields.get("fence")) or 0,
        probation=parse_int(fields.get("probation")) or 0,
        done_ms=parse_int(fields.get("done_ms")),
        idle_ms=parse_int(fields.get("idle_ms")),
    )


_ANNOUNCED = re.compile(
    rb'\{"step":(0|[1-9][0-9]{0,15}),"generation":(0|[1-9][0-9]{0,15}),'
    rb'"beat":(0|[1-9][0-9]{0,15}),"vouch":(true|false),"done":(true|false),'
    rb'"pinned":(true|false),"run_id":"([A-Za-z0-9._-]{0,64})","idle":(0|[1-9][0-9]{0,15})\}'
)


def _announced(raw: bytes) -> StepAnnouncement | None:
    """``raw`` read without ``json`` as ``publish_step``'s own format, or ``None`` if it
    is not in it (or a number is out of range): the general parse, which decides the
    same for it, then says what it is."""
    found = _ANNOUNCED.fullmatch(raw)
    if found is None:
        return None
    step, generation, beat, vouch, done, pinned, run_id, idle = found.groups()
    # int() and one comparison each, not parse_int: this is the wake's path (its
    # instruction count, docs/performance.md); the pattern allowed only digits
    step_value, generation_value, beat_value = int(step), int(generation), int(beat)
    if step_value > MAX_STEP or generation_value > MAX_STEP or beat_value > MAX_STEP:
        return None
    idle_value = int(idle)
    return StepAnnouncement(
        step_value,
        generation_value,
        done == b"true",
        False,
        run_id.decode() or None,
        beat_value,
        vouch == b"true",
        pinned == b"true",
        idle_value if idle_value <= MAX_STEP else None,
    )


def parse_announcement(raw: object) -> StepAnnouncement | None:
    """A message from the channel, or ``None`` if it is not one of ours."""
    if type(raw) is bytes:  # (what Redis sends): its own format first, without json
        announced = _announced(raw)
        if announced is not None:
            return announced
    data = json_object(_to_text(raw), most=4096)
    if data is None:
        return None
    if data.get("reset") is True:
        return StepAnnouncement(None, None, False, True)

    def number(name: str, default: int | None = None) -> int | None:
        # JSON numbers only: "12" as a string is not our format
        value = data.get(name, default)
        return parse_int(value) if isinstance(value, int) else None

    step, generation, beat = number("step"), number("generation"), number("beat", 0)
    done, vouch, pinned = (data.get(flag, False) for flag in ("done", "vouch", "pinned"))
    run_raw = data.get("run_id", "")
    run_id = parse_run_id(run_raw)
    if step is None or generation is None or beat is None or not isinstance(run_raw, str):
        return None
    if (run_raw and run_id is None) or not all(isinstance(f, bool) for f in (done, vouch, pinned)):
        return None
    return StepAnnouncement(
        step, generation, done, False, run_id, beat, vouch, pinned, number("idle")
    )


def parse_progress(raw: object) -> tuple[int, int] | None:
    """A task's ``step:changed_ms`` in the ``progress`` hash (docs/protocol.md#progress)
    as two whole numbers, or ``None`` if malformed: every worker may write the hash
    (directly too: it holds ``HSET``), so its size is checked before it is read.

    Example:
        >>> parse_progress(b"120:1796017269266")
        (120, 1796017269266)
        >>> parse_progress(b"12x:1") is None
        True
    """
    if isinstance(raw, bytes):
        if len(raw) > MAX_PROGRESS_VALUE:
            return None
        try:
            raw = raw.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(raw, str) or len(raw) > MAX_PROGRESS_VALUE:
        return None
    step_text, colon, changed_text = raw.partition(":")
    if not colon:
        return None
    step, changed = parse_int(step_text), parse_int(changed_text)
    if step is None or changed is None:
        return None
    return step, changed


def json_object(text: str | None, *, most: int) -> dict[str, Any] | None:
    """``text`` as a JSON object; ``None`` for none, more than ``most`` characters, or
    anything else."""
    if text is None or len(text) > most:
        return None
    try:
        data = json.loads(text)
    except (ValueError, RecursionError):
        return None
    return data if isinstance(data, dict) else None


def preview(raw: object) -> str:
    """A short, printable description of untrusted content, for logs."""
    if raw is None:
        return "missing"
    text = _to_text(raw)
    if text is None:
        return "<non-UTF-8 bytes>"
    return repr(text[:40])
