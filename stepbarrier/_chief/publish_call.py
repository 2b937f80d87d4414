"""One write of a step to Redis: the publishing script's call and its reply.

``StepPublisher`` decides when to write; this module knows what a write sends
(the step, the run, how fresh the step is) and how to read the reply back,
without trusting it: targets that are not whole steps in range are dropped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import WriterMode, publish_step_call
from stepbarrier._protocol.wire import parse_int, parse_run_id
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode, publish_command

MAX_TARGETS = 256
"""How many pending targets (lowest first) each write brings back to the writer."""


@dataclass(frozen=True)
class WriteResult:
    """What Redis answered to one write.

    Attributes:
        status: ``library.ACCEPTED``, ``SUPERSEDED``, ``WAS_RESET``,
            ``NOTHING_TO_JOIN`` or ``OTHER_GENERATION``.
        stored_step: The step stored after the write (``None`` if none).
        stored_generation: The generation stored after the write.
        repaired: True if malformed content in the job's keys was replaced.
        probation: The id of the probation the stored state is on (0: none): it
            vouches for nothing until its writer, having learned this id, waited
            out ``FENCE`` and says so (docs/protocol.md#probation). Every reply
            carries it, so a lost reply costs nothing.
        targets: Steps that registered waiters still wait for, lowest first.
    """

    status: int
    stored_step: int | None
    stored_generation: int | None
    repaired: bool
    targets: tuple[int, ...]
    probation: int = 0


@dataclass(frozen=True)
class Beginning:
    """What a new generation learns from Redis before its first write.

    Attributes:
        generation: The new generation number.
        reset_marker: The job's reset marker now (``""``: none); the
            generation's writes carry it, and a reset replaces it.
        stored: The state found: its run id, beat, done flag, chief and generation
            (``None`` if there was no valid state).
    """

    generation: int
    reset_marker: str
    stored: StoredSummary | None


@dataclass(frozen=True)
class StoredSummary:
    """The state a new generation found: whose it is and how far its writes went."""

    run_id: str | None
    beat: int
    done: bool
    chief: str
    generation: int


@dataclass(frozen=True)
class StepWrite:
    """The values of one write.

    Attributes:
        generation: The writer's generation (a contributor: the one it joined, or 0).
        step: The step to store.
        done: Mark the job finished (a chief only).
        vouch: The writer vouches for ``step`` (out of probation, and its loop
            handed the step over lately, by the writer's own clock).
        reset_marker: The reset marker the writer began under (``""``: none).
        served: The probation this writer has waited out (its id; 0: none).
        idle_ms: How long ago the writer's loop handed its last step over (ms,
            its own clock; 0 in a pause between sessions).
    """

    generation: int
    step: int
    done: bool
    vouch: bool
    reset_marker: str
    served: int = 0
    idle_ms: int = 0


class StepWriter:
    """Sends a job's step writes through the ``publish_step`` code.

    Args:
        client: The writer's redis-py client.
        config: The job's settings.
        chief: ``host:pid`` of the writer, stored for operators.
        contributor: Write as a training worker that only raises the step of
            the generation it joined, never as the chief.
        operator: Write as an operator (``stepbarrier publish``): a pinned step.
    """

    def __init__(
        self,
        client: RedisClient,
        config: BarrierConfig,
        chief: str,
        *,
        contributor: bool,
        operator: bool = False,
    ) -> None:
        self._config = config
        self._chief = chief
        self._mode: WriterMode = (
            "contributor" if contributor else "operator" if operator else "chief"
        )
        self._code = RedisCode(client, config, own_connection=True)  # the writer thread's alone
        # the highest generation this writer knows of: a begin numbers its
        # generation above it, whatever the clock of a Redis that forgot the
        # state says (docs/protocol.md#generations)
        self.floor = 0

    def close(self) -> None:
        """Give the writer's connection back to its client's pool."""
        self._code.close()

    def begin_generation(self) -> Beginning:
        """A new generation number above every one the job has used, and what it found."""
        keys = self._config.keys
        reply = list(
            self._code.call(
                "begin_generation",
                [keys.state, keys.reset],
                [self._config.run_id or "", self.floor],
            )
        )
        generation, marker, run, beat, done, chief, stored = (_text(x) for x in reply[:7])
        stored_generation = parse_int(stored) or 0
        self.floor = max(self.floor, int(generation), stored_generation)
        summary = None
        if stored_generation:
            summary = StoredSummary(
                run_id=parse_run_id(run),
                beat=parse_int(beat) or 0,
                done=done == "1",
                chief=chief,
                generation=stored_generation,
            )
        return Beginning(int(generation), marker, summary)

    def write(self, values: StepWrite) -> WriteResult:
        """Run the publishing code once (one try; the caller retries)."""
        keys, config = self._config.keys, self._config
        name, call_keys, args = publish_step_call(
            state=keys.state,
            targets=keys.targets,
            reset=keys.reset,
            generation=values.generation,
            step=values.step,
            done=values.done,
            key_ttl=config.key_ttl,
            channel=keys.channel,
            writer=self._chief,
            max_targets=MAX_TARGETS,
            run_id=config.run_id or "",
            vouch=values.vouch,
            heartbeat_ms=max(1, round(config.heartbeat * 1000)),
            finished_ttl=finished_ttl(config),
            reset_marker=values.reset_marker,
            mode=self._mode,
            publish_command=publish_command(config),
            served=values.served,
            idle_ms=values.idle_ms,
        )
        reply = self._code.call(name, call_keys, args)
        status, stored_step, stored_generation, repaired, probation, *targets = reply
        stored = parse_int(stored_generation)
        if stored is not None:
            self.floor = max(self.floor, stored)
        return WriteResult(
            status=int(status),
            stored_step=parse_int(stored_step),
            stored_generation=stored,
            repaired=bool(int(repaired)),
            probation=parse_int(probation) or 0,
            targets=tuple(sorted({t for t in map(parse_int, targets) if t is not None})),
        )


def finished_ttl(config: BarrierConfig) -> int:
    """Seconds a finished job's keys live: ``done_ttl``, but at least the stall timeout
    plus a minute, so that a waiter cut off while the job finished can still read
    it when its link is back (before its own stall timeout ends the wait)."""
    return max(config.done_ttl, math.ceil(config.stall_timeout) + 60)


def _text(raw: object) -> str:
    if isinstance(raw, bytes):
        return raw.decode("utf-8", "replace")
    return "" if raw is None else str(raw)
