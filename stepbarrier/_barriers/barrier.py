"""Named barriers of a job: every task waits until tasks ``0..parties-1`` have arrived.

The start and end of training are the usual ones: no worker trains before all
are up, and the chief does not exit before every worker has finished. The wait
is push-based and race-free, like the step barrier's: arrive (one function
call records this task and, if it is the last one, marks the barrier complete
and announces it), subscribe, then read the barrier. The last arrival releases
everyone within milliseconds; nobody polls (a read every ``fallback_interval``
covers a lost message). A reset of the job (``stepbarrier reset``) aborts a
waiting arrival.

Limits: A barrier has no idea whether a task that has not arrived is still alive:
the stall timeout ends a wait after ``stall_timeout`` seconds without a new
arrival, the overall timeout after ``timeout``. Both raise ``BarrierTimeout``
naming the missing tasks. A task that arrived and then died still counts.
A barrier's keys live ``key_ttl`` after its latest arrival: a task that
arrives again after that (a worker restarted a week into training, with
the default TTL) finds no barrier and waits at a new one.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from types import TracebackType

from stepbarrier._barriers.wait import BarrierWait, Party
from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.barrier_record import (
    BarrierState,
    barrier_member,
    state_from_read,
    validate_barrier_name,
    validate_parties,
)
from stepbarrier._redis.client import RedisClient, make_client
from stepbarrier._redis.functions import RedisCode
from stepbarrier._redis.retries import call_with_retries
from stepbarrier.errors import ConfigurationError

READ_RETRY_SECONDS = 5.0
"""How long ``Barrier.read`` retries an unreachable Redis."""


class Barrier:
    """A named barrier of the job in ``config``, for ``parties`` tasks.

    Task ids are ``config.task_id`` (the chief is 0, worker *i* of ``TF_CONFIG``
    is *i* + 1). Each name is one barrier per run: use "epoch-3", not "epoch"
    again. Barriers of another run id (``config.run_id``) are other barriers.

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
        self.config = config
        self.name = validate_barrier_name(name)
        self.parties = validate_parties(parties)
        if config.task_id is None:
            raise ConfigurationError(
                f"barrier {name!r} needs this task's id: set STEPBARRIER_TASK_ID or TF_CONFIG "
                "(the chief is task 0)",
                variable="STEPBARRIER_TASK_ID",
                job=config.job,
            )
        if config.task_id >= self.parties:
            raise ConfigurationError(
                f"barrier {name!r} of job {config.job} has {self.parties} parties (task ids "
                f"0..{self.parties - 1}), but this is task {config.task_id}",
                variable="STEPBARRIER_TASK_ID",
                job=config.job,
            )
        self.task_id: int = config.task_id
        self.member = barrier_member(self.name, config.run_id)
        self.key = config.keys.barrier(self.member)
        self._owns_client = client is None
        self._client: RedisClient | None = client
        self._code_of: RedisCode | None = None
        self._lock = threading.Lock()
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
        return BarrierWait(self._party(), limit).run(wait=wait)

    def _party(self) -> Party:
        """What an arrival needs of this barrier."""
        return Party(
            config=self.config,
            name=self.name,
            member=self.member,
            key=self.key,
            parties=self.parties,
            task_id=self.task_id,
            code=self._code,
            connected=self._connected,
            clock=self._clock,
            sleep=self._sleep,
        )

    def read(self) -> BarrierState | None:
        """The barrier as stored (``None`` before the first arrival).

        As stored means it may be stale: begun under an earlier barrier epoch
        (``.epoch``) than the job's current one, before a reset or the job's
        finish, in which case the next arrival begins it anew.

        Raises:
            RedisUnavailable: Redis was unreachable for ``READ_RETRY_SECONDS``.
            RedisRefused: Redis refused the read (authentication, ACL).
        """
        reply = call_with_retries(
            lambda: self._code().call("waiter_read", [self.key, self.config.keys.reset], []),
            self.config,
            action=f"read barrier {self.name!r}",
            deadline=self._clock() + READ_RETRY_SECONDS,
            clock=self._clock,
            sleep=self._sleep,
        )
        return state_from_read(self.member, list(reply), parties=self.parties)

    def close(self) -> None:
        """Release the connection (only if the barrier made its own client)."""
        with self._lock:
            client, self._client, self._code_of = self._client, None, None
        if self._owns_client and client is not None:
            client.close()

    def _connected(self) -> RedisClient:
        with self._lock:
            if self._client is None:
                self._client = make_client(self.config)
            return self._client

    def _code(self) -> RedisCode:
        client = self._connected()
        with self._lock:
            if self._code_of is None:
                self._code_of = RedisCode(client, self.config)
            return self._code_of

    def __enter__(self) -> Barrier:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
