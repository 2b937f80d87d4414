"""One call of a step's writer to Redis (``begin_generation``, ``publish_step``) and its
reply, read back without trusting it (targets that are not whole steps in range are dropped).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import (
    WriterMode,
    begin_generation_call,
    job_index_call,
    publish_step_call,
)
from stepbarrier._protocol.keys import job_index
from stepbarrier._protocol.wire import as_text, parse_int, parse_run_id
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode, publish_command

MAX_TARGETS = 256
"""How many pending targets (lowest first) each write brings back to the writer."""


@dataclass(frozen=True)
class WriteResult:
    """What Redis answered to one write (docs/protocol.md#write)."""

    status: int  # library.ACCEPTED, SUPERSEDED, WAS_RESET, NOTHING_TO_JOIN or OTHER_GENERATION
    stored_step: int | None  # after the write (None: none)
    stored_generation: int | None
    repaired: bool  # malformed content in the job's keys was replaced
    targets: tuple[int, ...]  # the steps registered waiters still wait for, lowest first
    probation: int = 0  # the stored state's probation (0: none; docs/protocol.md#probation)


@dataclass(frozen=True)
class StoredSummary:
    """The state a new generation found: whose it is and how far its writes went."""

    run_id: str | None
    beat: int
    done: bool
    chief: str
    generation: int


@dataclass(frozen=True)
class Beginning:
    """What a new generation learns from Redis before its first write."""

    generation: int
    reset_marker: str  # the job's now ("": none): its writes carry it, a reset replaces it
    stored: StoredSummary | None  # the state found (None: no valid one)


@dataclass(frozen=True)
class StepWrite:
    """The values of one write (docs/protocol.md#write): ``publish_step_call``'s own."""

    generation: int  # the writer's (a contributor's: the one it joined, or 0)
    step: int
    done: bool
    vouch: bool
    reset_marker: str  # the one the writer began under ("": none)
    served: int = 0  # the probation this writer has waited out (its id; 0: none)
    idle_ms: int = 0  # ms the loop has been quiet beyond its confirmation window (0: paused)


class StepWriter:
    """Sends a job's step writes (``chief``: who writes, stored for operators)."""

    def __init__(
        self, client: RedisClient, config: BarrierConfig, chief: str, mode: WriterMode = "chief"
    ) -> None:
        self._config = config
        self._chief = chief
        self._mode = mode
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
        call = begin_generation_call(
            self._config.keys, run_id=self._config.run_id or "", floor=self.floor
        )
        reply = list(self._code.call(*call))
        generation, marker, run, beat, done, chief, stored = (as_text(x) for x in reply[:7])
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
        """One try (the caller retries)."""
        keys, config = self._config.keys, self._config
        name, call_keys, args = publish_step_call(
            # vars(), not dataclasses.asdict: that deep-copies, some 75k instructions a
            # write (bench.instructions, the chief's part)
            **vars(values),
            state=keys.state,
            targets=keys.targets,
            reset=keys.reset,
            key_ttl=config.key_ttl,
            channel=keys.channel,
            writer=self._chief,
            max_targets=MAX_TARGETS,
            run_id=config.run_id or "",
            heartbeat_ms=max(1, round(config.heartbeat * 1000)),
            finished_ttl=finished_ttl(config),
            mode=self._mode,
            publish_command=publish_command(config),
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

    def index_job(self, pattern: str, lifetime: int, timeout: float) -> None:
        """Keep the job in the job index of ``pattern`` for ``lifetime`` seconds (one try,
        within ``timeout``)."""
        call = job_index_call(job_index(pattern), self._config.job, lifetime=lifetime)
        self._code.call(*call, timeout=timeout)


def finished_ttl(config: BarrierConfig) -> int:
    """Seconds a finished job's keys live: ``done_ttl``, but at least the stall timeout
    plus a minute, so that a waiter cut off while the job finished can still read
    it when its link is back (before its own stall timeout ends the wait)."""
    return max(config.done_ttl, math.ceil(config.stall_timeout) + 60)
