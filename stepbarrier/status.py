"""What an operator sees: the chief's state and who waits for what.

``read_status`` only reads (it works with the read-only ``monitor`` user) and
never fails on malformed content: it reports it in ``JobStatus.problems``.
Waiters are found through the job's own index (``stepbarrier.waiter_registry``),
never by scanning the keyspace.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from stepbarrier.barrier_status import BarrierInfo, read_open_barriers
from stepbarrier.config import BarrierConfig
from stepbarrier.connection import RedisClient, with_client
from stepbarrier.protocol import parse_int, parse_state, preview
from stepbarrier.redis_code import RedisCode
from stepbarrier.waiter_registry import (
    SINCE_LIMIT,
    WaiterInfo,
    parse_index,
    printable,
    queue_index_read,
    read_entries,
)

__all__ = ["STATUS_RETRY_SECONDS", "BarrierInfo", "JobStatus", "WaiterInfo", "read_status"]

STATUS_RETRY_SECONDS = 5.0
"""How long ``read_status`` retries an unreachable Redis before giving up."""
MAX_HEARTBEAT_PERIOD_MS = 3_600_000
"""Longest heartbeat period (ms) a chief may state: the config's own limit."""


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of one job.

    Attributes:
        job: The job name.
        step: The chief's stored step (``None`` before any chief wrote one).
        generation: The chief generation that wrote it.
        heartbeat_age: Seconds since the chief's last write, by Redis's clock.
        done: True once the chief closed the job.
        chief: ``host:pid`` of the chief, with control characters escaped.
        reset_at: Unix time of the last reset, if the job was reset since.
        run_id: The run id the chief stored (``None``: none, or malformed).
        beat: The chief generation's write counter (waiters judge liveness by
            it moving; docs/protocol.md#observed-writes).
        vouch: The last writer vouches for the step (out of probation, its loop
            handed a step over lately).
        pinned: The step was published by an operator (``stepbarrier publish``).
        heartbeat_period: The chief's own heartbeat period in seconds, if it
            stored a plausible one.
        waiters: Registered waiters, lowest target first.
        problems: Malformed content found in the job's keys.
        barriers: Open named barriers (``stepbarrier.Barrier``), latest arrival first.
    """

    job: str
    step: int | None
    generation: int | None
    heartbeat_age: float | None
    done: bool
    chief: str | None = None
    reset_at: float | None = None
    run_id: str | None = None
    beat: int = 0
    vouch: bool = False
    pinned: bool = False
    heartbeat_period: float | None = None
    waiters: tuple[WaiterInfo, ...] = ()
    problems: tuple[str, ...] = field(default=())
    barriers: tuple[BarrierInfo, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the CLI's ``status --json``); every number is finite."""
        data = asdict(self)
        data["waiters"] = [asdict(w) for w in self.waiters]
        data["barriers"] = [{**asdict(b), "missing": list(b.missing)} for b in self.barriers]
        data["problems"] = list(self.problems)
        return data


def read_status(
    config: BarrierConfig, client: RedisClient | None = None, *, waiters: bool = True
) -> JobStatus:
    """Read the job's state and registry.

    Args:
        config: The job's settings.
        client: A redis-py client; one is made (and closed) if omitted.
        waiters: Read the registered waiters (one command per waiter); without
            them ``JobStatus.waiters`` is empty (``stepbarrier.waiter_summary``
            counts a large job's waiters from the index instead).

    Raises:
        RedisUnavailable: Redis was unreachable for ``STATUS_RETRY_SECONDS``.
        RedisRefused: Redis refused the read (authentication, ACL).
    """
    return with_client(
        config,
        client,
        lambda active: _read(config, active, waiters),
        action="read the job's status",
        retry_seconds=STATUS_RETRY_SECONDS,
    )


def _read(config: BarrierConfig, client: RedisClient, with_waiters: bool = True) -> JobStatus:
    keys = config.keys
    # the state with the clock of the node that holds it (in a cluster, the
    # slot's owner: another node's clock would skew the heartbeat's age)
    snapshot = RedisCode(client, config).call("waiter_read", [keys.state, keys.reset], [])
    index_raw: object = []
    if with_waiters:
        pipe = client.pipeline(transaction=False)
        queue_index_read(pipe, keys)
        (index_raw,) = pipe.execute(raise_on_error=False)
    now_raw, reset_raw, kind_raw, *flat = list(snapshot)
    now_ms = parse_int(now_raw) or 0
    kind = kind_raw.decode() if isinstance(kind_raw, bytes) else str(kind_raw)
    state_raw: object = dict(zip(flat[0::2], flat[1::2], strict=False)) if kind == "hash" else {}
    if kind not in ("hash", "none"):
        state_raw = redis.ResponseError(f"the state key holds a {kind}, not a hash")
    reset_raw = reset_raw or None
    problems: list[str] = []
    state = parse_state(state_raw)
    if state.problem:
        problems.append(state.problem)
    reset_ms = _reset_ms(reset_raw, problems)
    if isinstance(index_raw, redis.exceptions.NoPermissionError):
        # a user that may read the state but not the index still sees the step
        problems.append(f"waiters not shown: {' '.join(str(index_raw).split())[:160]}")
        index_raw = []
    waiters = read_entries(client, keys, parse_index(index_raw, problems), problems)
    barriers = read_open_barriers(client, keys, now_ms, problems)
    return JobStatus(
        job=config.job,
        step=state.step,
        generation=state.generation,
        heartbeat_age=_age(now_ms, state.heartbeat_ms),
        done=state.done,
        chief=None if state.chief is None else printable(state.chief),
        reset_at=None if reset_ms is None else reset_ms / 1000,
        run_id=state.run_id,
        beat=state.beat,
        vouch=state.vouch,
        pinned=state.pinned,
        heartbeat_period=_period(state.heartbeat_period_ms),
        waiters=tuple(sorted(waiters, key=lambda w: (w.wait_until_step, w.task_id or 0))),
        problems=tuple(problems),
        barriers=barriers,
    )


def _reset_ms(raw: object, problems: list[str]) -> int | None:
    if isinstance(raw, Exception):
        problems.append(f"reset marker unreadable: {' '.join(str(raw).split())[:120]}")
        return None
    reset_ms = parse_int(raw, high=int(SINCE_LIMIT * 1000))  # a plausible time, like a since
    if raw is not None and reset_ms is None:
        problems.append(f"malformed reset marker: {preview(raw)}")
    return reset_ms


def _age(now_ms: int, then_ms: int | None) -> float | None:
    return None if then_ms is None else max(0.0, (now_ms - then_ms) / 1000)


def _period(period_ms: int | None) -> float | None:
    if period_ms is None or period_ms > MAX_HEARTBEAT_PERIOD_MS:
        return None
    return period_ms / 1000
