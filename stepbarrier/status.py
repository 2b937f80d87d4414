"""What an operator sees: the chief's state and who waits for what.

``read_status`` only reads (it works with the read-only ``monitor`` user) and
never fails on malformed content: it reports it in ``JobStatus.problems``.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

import redis

from stepbarrier.config import BarrierConfig
from stepbarrier.connection import call_with_retries, make_client
from stepbarrier.protocol import parse_int, parse_state, preview

STATUS_RETRY_SECONDS = 5.0
"""How long ``read_status`` retries an unreachable Redis before giving up."""


@dataclass(frozen=True)
class WaiterInfo:
    """One registered waiting worker.

    Attributes:
        task_id: Its task id (``None`` if it has none, e.g. a shell script).
        wait_until_step: The step it waits for.
        since: Unix time when it started waiting.
        host: Its host name.
        pid: Its process id.
    """

    task_id: int | None
    wait_until_step: int
    since: float
    host: str
    pid: int | None


@dataclass(frozen=True)
class JobStatus:
    """A snapshot of one job.

    Attributes:
        job: The job name.
        step: The chief's stored step (``None`` before any chief wrote one).
        generation: The chief generation that wrote it.
        heartbeat_age: Seconds since the chief's last write, by Redis's clock.
        done: True once the chief closed the job.
        chief: ``host:pid`` of the chief.
        reset_at: Unix time of the last reset, if the job was reset since.
        waiters: Registered waiters, lowest target first.
        problems: Malformed content found in the job's keys.
    """

    job: str
    step: int | None
    generation: int | None
    heartbeat_age: float | None
    done: bool
    chief: str | None = None
    reset_at: float | None = None
    waiters: tuple[WaiterInfo, ...] = ()
    problems: tuple[str, ...] = field(default=())

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dictionary (the CLI's ``status --json``)."""
        data = asdict(self)
        data["waiters"] = [asdict(w) for w in self.waiters]
        data["problems"] = list(self.problems)
        return data


def read_status(config: BarrierConfig, client: redis.Redis | None = None) -> JobStatus:
    """Read the job's state and registry.

    Args:
        config: The job's settings.
        client: A redis-py client; one is made (and closed) if omitted.

    Raises:
        RedisUnavailable: Redis was unreachable for ``STATUS_RETRY_SECONDS``.
        RedisRefused: Redis refused the read (authentication, ACL).
    """
    own = client is None
    active = client if client is not None else make_client(config)
    try:
        return call_with_retries(
            lambda: _read(config, active),
            config,
            action="read the job's status",
            deadline=time.monotonic() + STATUS_RETRY_SECONDS,
            clock=time.monotonic,
            sleep=time.sleep,
        )
    finally:
        if own:
            active.close()


def _read(config: BarrierConfig, client: redis.Redis) -> JobStatus:
    keys = config.keys
    pipe = client.pipeline(transaction=False)
    pipe.time()
    pipe.hgetall(keys.state)
    pipe.get(keys.reset)
    now_raw, state_raw, reset_raw = pipe.execute(raise_on_error=False)
    if isinstance(now_raw, Exception):
        raise now_raw
    for raw in (state_raw, reset_raw):  # permission problems are not "malformed"
        if isinstance(raw, redis.exceptions.NoPermissionError):
            raise raw
    now_ms = int(now_raw[0]) * 1000 + int(now_raw[1]) // 1000
    problems: list[str] = []
    state = parse_state(state_raw)
    if state.problem:
        problems.append(state.problem)
    age = None if state.heartbeat_ms is None else max(0.0, (now_ms - state.heartbeat_ms) / 1000)
    reset_ms = None if isinstance(reset_raw, Exception) else parse_int(reset_raw)
    waiters = _read_waiters(client, keys.waiter_pattern, problems)
    return JobStatus(
        job=config.job,
        step=state.step,
        generation=state.generation,
        heartbeat_age=age,
        done=state.done,
        chief=state.chief,
        reset_at=None if reset_ms is None else reset_ms / 1000,
        waiters=tuple(sorted(waiters, key=lambda w: (w.wait_until_step, w.task_id or 0))),
        problems=tuple(problems),
    )


def _read_waiters(client: redis.Redis, pattern: str, problems: list[str]) -> list[WaiterInfo]:
    names = sorted(set(client.scan_iter(match=pattern, count=500)))[:10_000]
    if not names:
        return []
    pipe = client.pipeline(transaction=False)
    for name in names:
        pipe.hgetall(name)
    waiters = []
    for name, raw in zip(names, pipe.execute(raise_on_error=False), strict=True):
        if isinstance(raw, redis.exceptions.NoPermissionError):
            raise raw
        entry = _waiter(raw)
        if entry is None:
            problems.append(f"malformed waiter entry {preview(name)}")
        else:
            waiters.append(entry)
    return waiters


def _waiter(raw: object) -> WaiterInfo | None:
    if not isinstance(raw, dict) or not raw:
        return None
    fields = {
        k.decode("utf-8", "replace") if isinstance(k, bytes) else str(k): v for k, v in raw.items()
    }
    target = parse_int(fields.get("wait_until_step"), low=1)
    since_raw = fields.get("since", b"")
    try:
        since = float(since_raw.decode() if isinstance(since_raw, bytes) else str(since_raw))
    except (ValueError, UnicodeDecodeError):
        return None
    host = fields.get("host", b"")
    if target is None:
        return None
    return WaiterInfo(
        task_id=parse_int(fields.get("task_id"), high=1_000_000),
        wait_until_step=target,
        since=since,
        host=host.decode("utf-8", "replace") if isinstance(host, bytes) else str(host),
        pid=parse_int(fields.get("pid"), high=2**31),
    )
