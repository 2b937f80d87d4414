"""The library's long calls, built from named arguments in the order their Lua reads them.

``publish_step`` takes 15 arguments and ``barrier_arrive`` 9 and more: matched
by hand against a comment, a positional list is where a swapped pair hides.
Each builder here takes keyword arguments only and lays them out as the
function's ``ARGV`` (its header comment in ``lua/<name>.lua``); no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

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
    ``(task, arrival ms)`` of arrivals Redis lost, recorded again on their behalf."""
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
