"""The Lua code that keeps a job's state consistent: its pieces, limits and replies.

Each piece runs atomically in Redis, so a store and its announcement can never
be seen apart. All keys share the job's hash tag and are passed in ``KEYS``.
Numbers are formatted with ``%.0f`` because Lua numbers are doubles: every stored
number is at most ``MAX_STEP`` (2**53 - 2), so that it and one more are exact.

``BODIES`` holds each piece once, read from its ``.lua`` file
(``stepbarrier/_protocol/lua/``); ``HELPERS`` is what every piece shares, with
the limits below prepended as Lua constants (one definition for Python and
Lua). ``stepbarrier._redis.functions`` registers the pieces as the functions of
a versioned Redis Functions library (the default: no role needs to run code of
its own), or runs them as ``EVAL`` scripts when a server has no Functions.

Bounded work (issue 23). Redis checks what a function runs against the caller's
ACL, so whoever may write a job's keys through the library may write them
directly too, with any size, and may call any function on any key it may
touch. So no function does work proportional to what a role can write: it
checks a key's type and size first (``TYPE``, ``HLEN``, ``HSTRLEN``,
``STRLEN``, ``LLEN``, ``ZCARD``, ``ZCOUNT``: O(1) or O(log n)), reads only the
fields it needs (``HMGET`` of known names, never ``HGETALL``), reads and
removes sorted set members by at most a fixed number per call, deletes with
``UNLINK`` (the memory of a large key is freed off the main thread), and
refuses, or treats as malformed, what is larger than the limits below.

Bounded calls (issue 34). Whatever a role may send, each function first checks
how many keys and arguments it was given (a variadic part at most a small
constant: ``MAX_FIELDS`` entry fields, ``MAX_RESTORED`` arrivals,
``MAX_RESET_KEYS`` keys, ``MAX_WRITE_KEYS`` keys), that none of its arguments is
longer than ``MAX_ARGUMENT``, and each argument's shape, before it reads, writes
or loops over anything: a refused call has written nothing, and its loops over
arguments are bounded by these constants. After its first write a function runs
only work bounded by them and by the sizes it checked. The one loop over stored
data that no such constant bounds, over a barrier's task fields (at most
``MAX_PARTIES``), only reads, and runs before any write, so ``FUNCTION KILL``
can end it. The callers here stay within the limits (``RedisCode`` sends a
longer restore of arrivals as several calls): docs/protocol.md#bounds.
"""

from __future__ import annotations

from stepbarrier._protocol.barrier_library import MAX_BARRIER_INDEX, MAX_RESTORED
from stepbarrier._protocol.barrier_record import MAX_PARTIES
from stepbarrier._protocol.lua import lua_source
from stepbarrier._protocol.progress import MAX_PROGRESS_TASKS, MAX_PROGRESS_VALUE, MAX_TASK_ID
from stepbarrier._protocol.wire import MAX_STEP

MAX_FIELDS = 32
"""Most fields of a state hash, a waiter's entry or the barrier epoch (a barrier:
this plus its parties); a larger hash is ``oversized``: refused, never read."""
MAX_VALUE = 256
"""Longest value of a known field that the code reads (a chief's ``host:pid`` is
at most 200 characters); a longer one makes its hash ``oversized``."""
MAX_ARGUMENT = 256
"""Longest argument any function takes (a channel, a chief's ``host:pid``, a
waiter entry's value); a longer one is refused before anything is done."""
MAX_TASK_VALUE = 16
"""Longest arrival time of a barrier's task field (a whole number)."""
MAX_MARKER = 64
"""Longest reset marker read; a longer one reads as ``oversized`` (a token that
equals no writer's)."""
MAX_TARGETS_READ = 1000
"""Most pending targets one ``publish_step`` returns, whatever the caller asks."""
MAX_REMOVED = 1000
"""Most released targets one ``publish_step`` removes from the index (the rest go
at the next writes)."""
MAX_REGISTRATIONS = 1000
"""Most entries the registrations list keeps; one of twice that or more is dropped
whole before the next push (it only hurries the chief)."""
MAX_RESET_KEYS = 2000
"""Most waiter entries and barrier hashes one ``reset_job`` call deletes (besides
its six fixed keys): ``stepbarrier reset`` passes at most 1000 of each."""
MAX_WRITE_KEYS = 8
"""Most keys one ``may_write`` call checks (the library checks one)."""
STATE_FIELDS = (
    "generation",
    "step",
    "beat",
    "run_id",
    "vouch",
    "fence",
    "begun",
    "probation",
    "done",
    "pinned",
    "reset_seen",
    "chief",
    "heartbeat_ms",
    "done_ms",
    "heartbeat_period_ms",
    "idle_ms",
)
"""The fields of the state hash (docs/protocol.md#keys): all that is ever read of it."""
WAIT_FIELDS = tuple(
    name
    for name in STATE_FIELDS
    if name
    not in (
        "begun",
        "probation",
        "reset_seen",
        "chief",
        "heartbeat_ms",
        "done_ms",
        "heartbeat_period_ms",
    )
)
"""The fields of the state hash a wait decides by: all that a waiter's read
(``waiter_read`` with ``wait``) reads of it; the others serve operators."""
BARRIER_FIELDS = ("parties", "arrived", "created_ms", "run_id", "epoch", "last_ms", "completed_ms")
"""A barrier hash's own fields; the others are ``t<task id>``, one per arrival."""
EPOCH_FIELDS = ("token", "by")
"""The fields of the job's barrier epoch hash."""


def _lua_names(names: tuple[str, ...]) -> str:
    return "{" + ", ".join(f"'{name}'" for name in names) + "}"


HELPERS = f"""
local MAX_STEP = {MAX_STEP}
local MAX_FIELDS, MAX_VALUE, MAX_TASK_VALUE = {MAX_FIELDS}, {MAX_VALUE}, {MAX_TASK_VALUE}
local MAX_MARKER, MAX_PARTIES, MAX_BARRIER_INDEX = {MAX_MARKER}, {MAX_PARTIES}, {MAX_BARRIER_INDEX}
local MAX_TARGETS_READ, MAX_REMOVED = {MAX_TARGETS_READ}, {MAX_REMOVED}
local MAX_REGISTRATIONS, MAX_RESET_KEYS = {MAX_REGISTRATIONS}, {MAX_RESET_KEYS}
local MAX_ARGUMENT, MAX_RESTORED, MAX_WRITE_KEYS = {MAX_ARGUMENT}, {MAX_RESTORED}, {MAX_WRITE_KEYS}
local MAX_TASK_ID, MAX_PROGRESS_TASKS = {MAX_TASK_ID}, {MAX_PROGRESS_TASKS}
local MAX_PROGRESS_VALUE = {MAX_PROGRESS_VALUE}
local STATE_FIELDS = {_lua_names(STATE_FIELDS)}
local WAIT_FIELDS = {_lua_names(WAIT_FIELDS)}
local BARRIER_FIELDS = {_lua_names(BARRIER_FIELDS)}
local EPOCH_FIELDS = {_lua_names(EPOCH_FIELDS)}
""" + lua_source("helpers")

ACCEPTED = 1
"""PUBLISH_STEP reply status: the write was applied."""
SUPERSEDED = 0
"""PUBLISH_STEP reply status: a newer chief generation owns the job."""
WAS_RESET = 2
"""PUBLISH_STEP reply status: the job was reset after this chief began."""
NOTHING_TO_JOIN = 3
"""PUBLISH_STEP reply status (contributor): no live state of this run to add to."""
OTHER_GENERATION = 4
"""PUBLISH_STEP reply status (contributor): the state belongs to another generation now;
a contributor never joins another one (docs/protocol.md#contributors)."""

BODIES: dict[str, tuple[str, bool]] = {
    name: (lua_source(name), read_only)
    for name, read_only in [
        ("begin_generation", False),
        ("publish_step", False),
        ("reset_job", False),
        ("waiter_register", False),
        ("waiter_read", True),
        ("waiter_leave", False),
        ("may_write", False),
        ("barrier_arrive", False),
        ("report_progress", False),
    ]
}
"""Each piece of code by name: its Lua body and whether it only reads."""
