"""The Lua library's pieces, limits and replies (docs/protocol.md#bounds).

``BODIES`` holds each piece (``lua/<name>.lua``), ``HELPERS`` what they share, after
the limits below as Lua constants; ``stepbarrier._redis.functions`` loads them.

Whoever may write a job's keys through the library may write them directly too,
with any size: no function does work proportional to what a role can write, and
each refuses a call outside its bounds before it reads, writes or loops over
anything (docs/protocol.md#bounds).
"""

from __future__ import annotations

from stepbarrier._protocol.barrier_record import MAX_PARTIES
from stepbarrier._protocol.lua import lua_source
from stepbarrier._protocol.wire import (
    MAX_PROGRESS_VALUE,
    MAX_STEP,
    MAX_TASK_ID,
    STATE_FIELDS,
    WAIT_FIELDS,
)

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
"""Most pending targets one ``publish_step`` returns, whatever the caller asks, and
(``MAX_REMOVED``) released ones it removes from the index (the rest go at the next writes)."""
MAX_REMOVED = 1000
MAX_REGISTRATIONS = 1000
"""Most entries the registrations list keeps; one of twice that or more is dropped
whole before the next push (it only hurries the chief)."""
MAX_RESET_KEYS = 2000
"""Most waiter entries and barrier hashes one ``reset_job`` call deletes (besides
its six fixed keys): ``stepbarrier reset`` passes at most 1000 of each."""
MAX_WRITE_KEYS = 8
MAX_BARRIER_INDEX = 1000
"""Most barriers the job's barrier index keeps, whatever a caller asks; an index of
twice that or more (written by hand) is dropped whole at the next arrival."""
MAX_RESTORED = 1000
"""Most arrivals one ``barrier_arrive`` call records again on other tasks' behalf;
a call with more is refused before anything is read or written
(``calls.split_arrival`` sends more as several calls)."""
MAX_PROGRESS_TASKS = MAX_PARTIES
"""Most tasks (fields) a job's progress hash holds: a report of a new task into a
full hash is refused (``HLEN``, O(1))."""
MAX_INDEX_READ = 10_000
"""Most members one ``index_read`` returns (``calls.index_call``)."""
MAX_JOB_INDEX = MAX_INDEX_READ - 1
"""Most jobs a team's job index keeps (``job_index``): the ones that expire first go;
one read by ``index_read`` reads them all, and one more entry tells it is longer."""
MAX_LIFETIME = 10 * 365 * 24 * 3600
"""Longest lifetime of a job index entry (s): a key TTL's own limit."""
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
local MAX_INDEX_READ, MAX_JOB_INDEX = {MAX_INDEX_READ}, {MAX_JOB_INDEX}
local MAX_LIFETIME = {MAX_LIFETIME}
local MAX_TASK_ID, MAX_PROGRESS_TASKS = {MAX_TASK_ID}, {MAX_PROGRESS_TASKS}
local MAX_PROGRESS_VALUE = {MAX_PROGRESS_VALUE}
local STATE_FIELDS = {_lua_names(STATE_FIELDS)}
local WAIT_FIELDS = {_lua_names(WAIT_FIELDS)}
local BARRIER_FIELDS = {_lua_names(BARRIER_FIELDS)}
local EPOCH_FIELDS = {_lua_names(EPOCH_FIELDS)}
""" + lua_source("helpers")

# publish_step's reply statuses (docs/protocol.md#keys says what each means; the last
# two answer a contributor only)
ACCEPTED = 1
SUPERSEDED = 0
WAS_RESET = 2
NOTHING_TO_JOIN = 3
OTHER_GENERATION = 4
# barrier_arrive's reply statuses (docs/protocol.md#barriers): the arrival is recorded
# (now or before), the barrier was begun with another number of parties, or a reset
# or the job's finish ended the caller's epoch (the reply's last field says which)
BARRIER_OTHER_PARTIES, BARRIER_RECORDED, BARRIER_EPOCH_ENDED = 0, 1, 2
BARRIER_RESTORABLE = 1
"""Reply field: the caller's arrivals of an earlier epoch may be recorded."""

BODIES: dict[str, tuple[str, bool]] = {
    name: (lua_source(name), read_only)
    for name, read_only in [
        ("begin_generation", False),
        ("publish_step", False),
        ("reset_job", False),
        ("waiter_register", False),
        ("waiter_read", True),
        ("index_read", True),
        ("waiter_leave", False),
        ("may_write", False),
        ("barrier_arrive", False),
        ("report_progress", False),
        ("job_index", False),
    ]
}
"""Each piece of code by name: its Lua body and whether it only reads."""
