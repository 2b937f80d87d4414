"""Every call of the library, built here from named arguments; no I/O.

A function's ``ARGV`` is positional (``publish_step`` takes 16 arguments): matched
by hand against a comment, a positional list is where a swapped pair hides. Each
builder lays its keyword arguments out as the function's header comment in
``lua/<name>.lua`` reads them, so this module is the one place that knows the layouts.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.library import BARRIER_RECORDED, MAX_RESTORED
from stepbarrier._protocol.wire import parse_int

Call = tuple[str, Sequence[Any], Sequence[Any]]
"""One call: the code's name in ``library.BODIES``, its keys and its arguments."""

WriterMode = Literal["chief", "contributor", "operator"]
"""Who writes a step: the chief, a training worker raising its generation's step,
or an operator pinning a step (``stepbarrier publish``)."""


def publish_step_call(
    *,
    state: str,
    targets: str,
    reset: str,
    generation: int,
    step: int,
    done: bool,
    key_ttl: int,
    channel: str,
    writer: str,
    max_targets: int,
    run_id: str,
    vouch: bool,
    heartbeat_ms: int,
    finished_ttl: int,
    reset_marker: str,
    mode: WriterMode,
    publish_command: str,
    served: int,
    idle_ms: int,
) -> Call:
    """One write of the job's step (``lua/publish_step.lua``)."""
    return (
        "publish_step",
        [state, targets, reset],
        [
            generation,
            step,
            int(done),
            key_ttl,
            channel,
            writer,
            max_targets,
            run_id,
            int(vouch),
            heartbeat_ms,
            finished_ttl,
            reset_marker,
            mode,
            publish_command,
            served,
            idle_ms,
        ],
    )


def barrier_arrive_call(
    *,
    barrier: str,
    index: str,
    epoch: str,
    member: str,
    task_id: int,
    parties: int,
    key_ttl: int,
    channel: str,
    publish_command: str,
    run_id: str,
    max_indexed: int,
    arrived_under: str,
    restore: Sequence[tuple[int, int]] = (),
) -> Call:
    """One arrival at a named barrier (``lua/barrier_arrive.lua``); ``restore``: the
    ``(task, arrival ms)`` of arrivals Redis lost, recorded again on their behalf
    (``ARRIVAL_ARGUMENTS`` fixed arguments, then those pairs)."""
    args: list[object] = [
        member,
        task_id,
        parties,
        key_ttl,
        channel,
        publish_command,
        run_id,
        max_indexed,
        arrived_under,
    ]
    for task, at_ms in restore:
        args += [task, at_ms]
    return ("barrier_arrive", [barrier, index, epoch], args)


ARRIVAL_ARGUMENTS = 9


def split_arrival(call: Call) -> list[Call]:
    """A ``barrier_arrive`` call as calls of at most ``MAX_RESTORED`` restored arrivals each.

    Each part is the same arrival of the caller (recorded once: a re-arrival keeps
    its first time) with the next ``MAX_RESTORED`` of the restored arrivals, in
    order; a call within the limit is itself. Sent in order, the parts record
    what the one call would have (only not atomically: each part is an arrival
    of its own, which the protocol allows at any moment).
    """
    name, keys, args = call
    fixed, pairs = list(args[:ARRIVAL_ARGUMENTS]), list(args[ARRIVAL_ARGUMENTS:])
    size = 2 * MAX_RESTORED
    if len(pairs) <= size:
        return [call]
    return [(name, keys, fixed + pairs[at : at + size]) for at in range(0, len(pairs), size)]


def arrival_reply(replies: Sequence[Any]) -> Any:
    """The reply of an arrival sent as the parts of ``split_arrival``: the first part's
    error, or reply that recorded nothing (another number of parties, an ended
    epoch: the parts after it were refused alike), else the last part's (the
    barrier as all of them left it)."""
    for reply in replies:
        if isinstance(reply, Exception) or not isinstance(reply, (list, tuple)) or not reply:
            return reply
        if parse_int(reply[0]) != BARRIER_RECORDED:
            return reply
    return replies[-1]


def begin_generation_call(keys: JobKeys, *, run_id: str, floor: int) -> Call:
    """A chief's begin (``lua/begin_generation.lua``): a generation above ``floor``."""
    return ("begin_generation", [keys.state, keys.reset], [run_id, floor])


def read_call(
    key: str, reset: str, *, wait: bool = False, party: tuple[int, int] | None = None
) -> Call:
    """The read-only call that returns Redis's clock, the reset marker and ``key``'s hash
    (the state, or a barrier's); ``wait``: a wait's read of the state, of the fields a
    wait decides by only, without the clock; ``party``: ``(parties, task id)`` of a
    waiting party, whose read costs O(1) while the arrivals cannot be complete."""
    args: list[object] = ["wait"] if wait else []
    return ("waiter_read", [key, reset], ["party", *party] if party else args)


def index_call(key: str, *, start: int = 0, count: int) -> Call:
    """The read-only call that returns ``count`` members of the sorted set ``key`` from
    rank ``start`` with their scores, those over ``MAX_ARGUMENT`` bytes counted only."""
    return ("index_read", [key], [start, count])


def job_index_call(index: str, job: str, *, lifetime: int) -> Call:
    """A chief's entry of ``job`` in the job index ``index`` (``keys.job_index``), kept
    ``lifetime`` seconds unless said again (``lua/job_index.lua``)."""
    return ("job_index", [index], [job, lifetime])


def register_call(
    keys: JobKeys,
    waiter_id: str,
    target: int,
    entry: dict[str, str],
    *,
    registry_ttl: int,
    key_ttl: int,
) -> Call:
    """The call that registers a waiter (again, if its entry expired) or refreshes it."""
    args: list[Any] = [registry_ttl, key_ttl, waiter_id, target]
    for name, value in entry.items():
        args += [name, value]
    return ("waiter_register", [keys.waiter(waiter_id), keys.targets, keys.registrations], args)


def leave_call(keys: JobKeys, waiter_id: str) -> Call:
    """The call that removes a waiter's registry entry and its target."""
    return ("waiter_leave", [keys.waiter(waiter_id), keys.targets], [waiter_id])


def may_write_call(*keys: str) -> Call:
    """The call that writes nothing: Redis's ACL check of ``keys`` tells whether the
    user may write them."""
    return ("may_write", list(keys), [])


def report_progress_call(keys: JobKeys, *, task_id: int, step: int, key_ttl: int) -> Call:
    """A task's report of its own step into the job's progress hash."""
    return ("report_progress", [keys.progress], [task_id, step, key_ttl])


def reset_job_call(
    keys: JobKeys, *, marker_ttl: int, publish_command: str, extra: Sequence[str | bytes]
) -> Call:
    """``stepbarrier reset``'s call; ``extra``: the waiter entries, barriers and
    progress hash it deletes besides the job's fixed keys."""
    fixed = [*keys.all_fixed(), keys.barrier_index, keys.barrier_epoch]
    args = [keys.channel, marker_ttl, publish_command, keys.barrier_channel]
    return ("reset_job", [*fixed, *extra], args)
