"""One write of a step to Redis: the publishing script's call and its reply.

``StepPublisher`` decides when to write; this module knows what a write sends
(the step, the run, how fresh the step is) and how to read the reply back,
without trusting it: targets that are not whole steps in range are dropped.
"""

from __future__ import annotations

from dataclasses import dataclass

from stepbarrier.config import BarrierConfig
from stepbarrier.connection import RedisClient
from stepbarrier.protocol import parse_int
from stepbarrier.redis_code import RedisCode, publish_command

MAX_TARGETS = 256
"""How many pending targets (lowest first) each write brings back to the writer."""


@dataclass(frozen=True)
class WriteResult:
    """What Redis answered to one write.

    Attributes:
        status: ``scripts.ACCEPTED``, ``SUPERSEDED``, ``WAS_RESET``,
            ``NOTHING_TO_JOIN`` or ``REJOIN``.
        stored_step: The step stored after the write (``None`` if none).
        stored_generation: The generation stored after the write.
        repaired: True if malformed content in the job's keys was replaced.
        targets: Steps that registered waiters still wait for, lowest first.
    """

    status: int
    stored_step: int | None
    stored_generation: int | None
    repaired: bool
    targets: tuple[int, ...]


@dataclass(frozen=True)
class StepWrite:
    """The values of one write.

    Attributes:
        generation: The writer's generation (a contributor: the one it joined, or 0).
        step: The step to store.
        done: Mark the job finished (a chief only).
        publish_age: Seconds since the training loop last handed over ``step``.
        confirm_window: Seconds a handed-over step vouches for itself.
        epoch: The writer's first generation; a reset after it refuses the writer
            (0: not yet known, for a contributor that has not joined).
    """

    generation: int
    step: int
    done: bool
    publish_age: float
    confirm_window: float
    epoch: int


class StepWriter:
    """Sends a job's step writes through the ``publish_step`` code.

    Args:
        client: The writer's redis-py client.
        config: The job's settings.
        chief: ``host:pid`` of the writer, stored for operators.
        contributor: Write as a training worker that only raises the step of
            the generation it joined, never as the chief.
    """

    def __init__(
        self, client: RedisClient, config: BarrierConfig, chief: str, *, contributor: bool
    ) -> None:
        self._config = config
        self._chief = chief
        self._mode = "contributor" if contributor else "chief"
        self._code = RedisCode(client, config)

    def begin_generation(self) -> int:
        """A new generation number above every one the job has used."""
        return int(self._code.call("begin_generation", [self._config.keys.state], []))

    def write(self, values: StepWrite) -> WriteResult:
        """Run the publishing code once (one try; the caller retries)."""
        keys, config = self._config.keys, self._config
        reply = self._code.call(
            "publish_step",
            [keys.state, keys.targets, keys.reset],
            [
                values.generation,
                values.step,
                1 if values.done else 0,
                config.key_ttl,
                keys.channel,
                self._chief,
                MAX_TARGETS,
                keys.waiter_prefix,
                config.run_id or "",
                max(0, round(values.publish_age * 1000)),
                max(1, round(config.heartbeat * 1000)),
                max(1, round(values.confirm_window * 1000)),
                config.done_ttl,
                values.epoch,
                self._mode,
                publish_command(config),
            ],
        )
        status, stored_step, stored_generation, repaired, *targets = reply
        return WriteResult(
            status=int(status),
            stored_step=parse_int(stored_step),
            stored_generation=parse_int(stored_generation),
            repaired=bool(int(repaired)),
            targets=tuple(sorted({t for t in map(parse_int, targets) if t is not None})),
        )
