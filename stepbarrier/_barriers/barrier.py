"""Named barriers of a job: every task waits until tasks ``0..parties-1`` have arrived.

What a barrier cannot know (whether a task that has not arrived is alive): see
docs/python-api.md#named-barriers. A task that arrived and then died still counts;
one that arrives again ``key_ttl`` after the latest arrival waits at a new barrier.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from stepbarrier._barriers.wait import MAX_INDEXED_BARRIERS, ArriveAgain, BarrierRules
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.barrier_record import (
    BarrierState,
    barrier_member,
    parse_barrier_notice,
    state_from_read,
    validate_barrier_name,
    validate_parties,
)
from stepbarrier._protocol.calls import Call, barrier_arrive_call, read_call
from stepbarrier._redis.client import RedisClient
from stepbarrier._redis.functions import RedisCode, publish_command
from stepbarrier._redis.retries import call_with_retries
from stepbarrier._worker.links import ChannelWait, LazyClient
from stepbarrier.errors import ConfigurationError, RedisUnavailable

READ_RETRY_SECONDS = 5.0
"""How long ``Barrier.read`` retries an unreachable Redis."""
STATUS_BARRIERS = 50
"""Most barriers ``status`` reads: those with the latest arrivals."""


@dataclass(frozen=True)
class BarrierInfo:
    """An open barrier, as an operator sees it: not every party has arrived yet.

    Attributes:
        name: The barrier's name.
        run_id: The run it belongs to (``None``: no run id).
        parties: How many tasks it waits for.
        arrived: How many have arrived.
        missing: The ids of the tasks that have not, sorted.
        open_for: Seconds since the first arrival, by Redis's clock.
        last_arrival_age: Seconds since the latest arrival, by Redis's clock.
    """

    name: str
    run_id: str | None
    parties: int
    arrived: int
    missing: tuple[int, ...]
    open_for: float | None
    last_arrival_age: float | None


class Barrier(LazyClient):
    """A named barrier of the job in ``config``, for ``parties`` tasks.

    Task ids are ``config.task_id`` (the chief is 0, worker *i* of ``TF_CONFIG``
    is *i* + 1). Each name is one barrier per run (``config.run_id``).

    Args:
        config: The job's settings (``task_id``, ``timeout``, ``stall_timeout``,
            ``run_id``, ``key_ttl``).
        name: 1 to 64 letters, digits, ``.``, ``_`` and ``-``.
        parties: How many tasks arrive: ids ``0..parties-1``.
        client: A redis-py client; one is made from ``config`` if omitted.
        clock: Monotonic clock, injectable for tests.
        sleep: Sleep between retries, injectable for tests.

    Raises:
        ConfigurationError: A bad name or number of parties, or a task id that is
            missing or outside ``0..parties-1``.

    Example:
        ```python
        config = BarrierConfig(job="mnist-42", task_id=1)
        with Barrier(config, "start", parties=3) as start:
            start.arrive(timeout=600)  # True once tasks 0, 1 and 2 have arrived
        ```
    """

    def __init__(
        self,
        config: BarrierConfig,
        name: str,
        parties: int,
        client: RedisClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        super().__init__(config, client)
        self.name = validate_barrier_name(name)
        self.parties = validate_parties(parties)
        if config.task_id is None or config.task_id >= self.parties:
            raise ConfigurationError(
                f"barrier {name!r} needs this task's id: set STEPBARRIER_TASK_ID or TF_CONFIG "
                "(the chief is task 0)"
                if config.task_id is None
                else f"barrier {name!r} of job {config.job} has {self.parties} parties (task "
                f"ids 0..{self.parties - 1}), but this is task {config.task_id}",
                variable="STEPBARRIER_TASK_ID",
                job=config.job,
            )
        self.task_id: int = config.task_id
        self.member = barrier_member(self.name, config.run_id)
        self.key = config.keys.barrier(self.member)
        self._clock = clock
        self._sleep = sleep

    def arrive(self, timeout: float | None = None, *, wait: bool = True) -> bool:
        """Arrive, and return once every party has arrived.

        Arriving again (after a restart, say) is harmless, and at a completed
        barrier returns at once. A timeout always raises: the hooks and
        callbacks, not this call, honour ``STEPBARRIER_ON_TIMEOUT=proceed``.

        Args:
            timeout: Overall limit in seconds; ``None`` uses ``config.timeout``
                (itself ``None`` for no overall limit; the stall timeout holds).
            wait: ``False`` records the arrival and returns at once (a worker
                at the end of training tells the chief, which waits).

        Returns:
            True when the barrier is complete (always, when waiting).

        Raises:
            BarrierTimeout: The overall or the stall timeout passed; ``.missing``
                names the tasks that had not arrived.
            BarrierAborted: The job was reset while this task waited.
            ConfigurationError: The barrier was begun with another number of parties.
            RedisUnavailable: Redis could not be reached at all before a deadline.
            RedisRefused: Redis refused us (authentication, ACL, TLS).
        """
        limit = self.config.timeout if timeout is None else timeout
        return BarrierWait(self, limit).run(wait=wait)

    def read(self) -> BarrierState | None:
        """The barrier as stored (``None`` before the first arrival): it may be stale,
        begun under an earlier epoch (``.epoch``) than the job's current one, in which
        case the next arrival begins it anew.

        Raises:
            RedisUnavailable: Redis was unreachable for ``READ_RETRY_SECONDS``.
            RedisRefused: Redis refused the read (authentication, ACL).
        """
        reply = call_with_retries(
            lambda: self._code().call(*read_call(self.key, self.config.keys.reset)),
            self.config,
            action=f"read barrier {self.name!r}",
            deadline=self._clock() + READ_RETRY_SECONDS,
            clock=self._clock,
            sleep=self._sleep,
        )
        return state_from_read(self.member, list(reply), parties=self.parties)


class BarrierWait(ChannelWait[bool]):
    """The I/O of one ``Barrier.arrive`` call; ``BarrierRules`` decides."""

    def __init__(self, barrier: Barrier, timeout: float | None) -> None:
        config = barrier.config
        self.barrier = barrier
        self.rules = BarrierRules(
            config,
            barrier.name,
            barrier.member,
            barrier.parties,
            barrier.task_id,
            barrier._clock,
            timeout,
        )
        super().__init__(
            config, self.rules, config.keys.barrier_channel, barrier._connected, barrier._sleep
        )
        self._code_of: RedisCode | None = None

    def run(self, *, wait: bool) -> bool:
        try:
            if self._arrive(read_marker=wait):
                return True
            return self._listen(self._reconnect) if wait else False
        except RedisUnavailable as exc:
            error = self.rules.unreachable(exc)
            if error is exc:
                raise
            raise error from exc
        finally:
            self._close_pubsub()
            code, self._code_of = self._code_of, None
            if code is not None:
                code.close()

    def _code(self) -> RedisCode:
        """This wait's code runner (on a connection of its own, closed at the end)."""
        if self._code_of is None:
            self._code_of = RedisCode(self.barrier._connected(), self.config)
        return self._code_of

    def _arrive(self, *, read_marker: bool = False, restore: Sequence[int] = ()) -> bool | None:
        """Record this task (again), and the arrivals of ``restore`` on their behalf;
        True if the barrier is complete (``read_marker``: read the reset marker first,
        in the same round trip)."""
        b, rules, keys = self.barrier, self.rules, self.config.keys
        party = (b.parties, b.task_id)
        calls: list[Call] = [read_call(b.key, keys.reset, party=party)] if read_marker else []
        arrive = barrier_arrive_call(
            barrier=b.key,
            index=keys.barrier_index,
            epoch=keys.barrier_epoch,
            member=b.member,
            task_id=b.task_id,
            parties=b.parties,
            key_ttl=self.config.key_ttl,
            channel=keys.barrier_channel,
            publish_command=publish_command(self.config),
            run_id=self.config.run_id or "",
            max_indexed=MAX_INDEXED_BARRIERS,
            arrived_under=rules.epoch,
            restore=[(task, rules.seen[task]) for task in restore],
        )
        calls.append(arrive)
        replies = self._retry(
            lambda: self._code().pipeline(calls, timeout=self._call_timeout()),
            f"arrive at barrier {b.name!r}",
        )
        if read_marker:
            rules.check_reset(replies[0][1])
        return rules.on_arrival(replies[-1])

    def _read(self, *, every: bool = False) -> bool | None:
        """Read the barrier: in O(1) while it cannot be complete, unless ``every``
        arrival is to be read (lost arrivals to find, a last chance's missing tasks)."""
        b = self.barrier
        party = None if every else (b.parties, b.task_id)
        reply = self._retry(
            lambda: list(
                self._code().call(
                    *read_call(b.key, self.config.keys.reset, party=party),
                    timeout=self._call_timeout(),
                )
            ),
            f"read barrier {b.name!r}",
        )
        self.rules.read_done()
        outcome = self.rules.on_read(reply)
        if isinstance(outcome, str):  # READ_ALL
            return self._read(every=True)
        if isinstance(outcome, ArriveAgain):
            return self._arrive(restore=outcome.restore)
        return outcome

    def _last_chance(self) -> bool | None:
        try:  # every arrival: the timeout names the missing tasks
            return self._read(every=True)
        except self.survivable:
            return None

    def _on_message(self, message: Any) -> bool | None:
        return self._read() if self.rules.concerns(parse_barrier_notice(message)) else None
