"""A worker's side: hold until the chief's published step reaches a target.

The wait is docs/protocol.md#waiters', driven by ``ChannelWait`` and decided by
``WaitRules``. A released wait leaves its subscription open (off the release's path)
for the waiter's next wait, which takes it over if it is younger than
``fallback_interval``. A ``StepSource`` is a second witness (docs/protocol.md#source).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.wire import StepAnnouncement, parse_announcement
from stepbarrier._redis.bounded import LEAVE_WITHIN
from stepbarrier._redis.client import SOCKET_TIMEOUT, RedisClient
from stepbarrier._redis.subscription import KeptSubscription, Subscription
from stepbarrier._worker.follow import Crossed, FollowPlan
from stepbarrier._worker.links import ChannelWait, LazyClient, WaiterLink
from stepbarrier._worker.wait_state import ReadNow, WaitRules, wait_target
from stepbarrier.errors import BarrierAborted, BarrierTimeout, RedisRefused, RedisUnavailable

log = logging.getLogger("stepbarrier._worker.waiter")


SOURCE_SOCKET_TIMEOUT = 1.0
"""Seconds a Redis reply may take for a waiter whose waits read a ``StepSource``."""
SOURCE_RETRY_WITHIN = 1.0
"""Seconds a wait with a ``StepSource`` retries a failing Redis call (reading the
source meanwhile) before it waits on the source alone."""


@dataclass(frozen=True)
class StepSource:
    """A second witness of the job's step that a wait trusts as it stands.

    Attributes:
        read: Returns the step now (TensorFlow: ``int(session.run(global_step))``,
            a read of the parameter server). What it raises ends the wait.
        name: What it is, for log lines: ``"the session's global step"``.
        interval: Seconds between reads while no write of the chief was seen
            (TensorFlow's own hook reads every 0.5 s).
        interval_with_chief: Seconds between reads once a write of the chief
            was seen and while Redis answers: Redis then wakes the wait, and the
            source is only the safety net.
        hint: Said once, in a WARNING, when the source released a wait that
            never saw a write of its chief (how to add a publisher).
    """

    read: Callable[[], int]
    name: str
    interval: float = 0.5
    interval_with_chief: float = 5.0
    hint: str = ""

    def __post_init__(self) -> None:
        for name in ("interval", "interval_with_chief"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise ValueError(
                    f"StepSource.{name} must be a positive number of seconds, got {value!r}"
                )
        if not callable(self.read):
            raise TypeError(f"StepSource.read must be callable, got {self.read!r}")

    @property
    def intervals(self) -> tuple[float, float]:
        return self.interval, self.interval_with_chief


class _SourceReleased(Exception):
    """The source reached the target (``args[0]``) while the wait was inside a Redis retry."""


class StepWaiter(LazyClient):
    """Waits for a job's chief to reach a global step.

    Args:
        config: The job's settings (``timeout``, ``stall_timeout``, ``on_timeout``
            and ``task_id`` shape each wait).
        client: A redis-py client; one is made from ``config`` if omitted.
        clock: Monotonic clock, injectable for tests.
        sleep: Sleep between retries, injectable for tests.
        socket_timeout: Seconds a Redis reply (or connect) of a client the waiter
            makes may take before the connection counts as dead (a waiter whose
            waits read a ``StepSource`` takes ``SOURCE_SOCKET_TIMEOUT``). Each call
            of a wait is also bounded by the time left to its nearest limit.

    Example:
        ```python
        with StepWaiter(BarrierConfig(job="demo", task_id=2)) as waiter:
            step = waiter.wait(until_step=13, timeout=600)  # the step seen, >= 13
        ```
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: RedisClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        socket_timeout: float = SOCKET_TIMEOUT,
    ) -> None:
        super().__init__(config, client, socket_timeout)
        self._clock = clock
        self._sleep = sleep
        self._kept = KeptSubscription(clock, config.fallback_interval)  # for the next wait
        # ids the last waits left: a waiter that waits again writes over its entry
        self._ids: list[str] = []
        self.last_generation: int | None = None
        """The chief generation of the last wait's release (``None`` before one); a
        worker that reports the step passes it to its contributor
        (``StepPublisher(contributor=True, join_generation=...)``)."""
        self.last_released_by: str | None = None
        """What released the last wait: ``"an announcement"``, ``"a read of the
        state"`` (Redis), or the ``StepSource``'s name; ``None`` before a release."""

    @classmethod
    def from_env(cls) -> StepWaiter:
        """A waiter configured from ``STEPBARRIER_*`` variables and ``TF_CONFIG``."""
        return cls(BarrierConfig.from_env())

    def wait(
        self, until_step: int, timeout: float | None = None, *, source: StepSource | None = None
    ) -> int:
        """Block until the chief's published step is at least ``until_step``.

        Args:
            until_step: The step to wait for (an integer up to 2**53 - 2, the
                largest a chief can publish); ``<= 0`` returns 0 at once without
                touching Redis.
            timeout: Overall limit in seconds; ``None`` uses ``config.timeout``
                (itself ``None`` for no overall limit; the stall timeout still holds).
            source: A second witness of the step (see ``StepSource``), read
                before Redis and then on its interval; a step of it at or above
                ``until_step`` releases the wait. With one, Redis being
                unreachable or refusing never ends the wait (it is said once,
                and Redis is tried again every ``REDIS_RETRY_EVERY`` seconds),
                and the stall timeout holds only once a write of the chief was
                seen and while Redis answers.

        Returns:
            The step seen (``>= until_step``). Under ``on_timeout="proceed"`` a
            timeout logs a warning and returns the last step seen (0 if none).

        Raises:
            BarrierTimeout: The overall or the stall timeout passed (also when
                Redis, once reached, stayed unreachable for that long).
            BarrierAborted: The job finished or was reset before the step came.
            RedisUnavailable: Redis could not be reached at all before a deadline.
            RedisRefused: Redis refused us (authentication, ACL, TLS).
            TypeError: ``until_step`` is not an integer (``True`` is not step 1).
            ValueError: ``until_step`` is above 2**53 - 2 (``MAX_STEP``).
        """
        return self._wait(until_step, timeout, source)[0]

    def follow(
        self, every: int, start: int | None = None, timeout: float | None = None
    ) -> Iterator[Crossed]:
        """Yield, in order, every multiple of ``every`` that the chief's step reaches, none
        skipped, as ``Crossed(multiple, step)``; ``start`` and ``timeout`` as
        docs/following.md#in-python says. Each is awaited as ``wait`` awaits a step, and
        raises as it does (``TypeError``, ``ValueError``: ``every`` or ``start`` is not a
        step); the following ends when the job finishes short of the next multiple, or a
        wait ends under ``on_timeout="proceed"``.

        Example:
            ```python
            with StepWaiter(BarrierConfig(job="demo", role="worker", task_id=9)) as waiter:
                for crossed in waiter.follow(every=1000):
                    evaluate(checkpoint_at=crossed.multiple)
            ```
        """
        plan = FollowPlan(every, start)
        while not plan.exhausted:
            try:
                step, before, released = self._wait(plan.target, timeout, None)
            except BarrierAborted as exc:
                if plan.ends(exc):
                    return
                raise
            if not released:
                return  # on_timeout="proceed": the wait said why; nothing was crossed
            crossed = plan.released(step, before)
            if len(crossed) == 1:  # (a list iterator less per step)
                yield crossed[0]
            else:
                yield from crossed

    def _wait(
        self, until_step: int, timeout: float | None, source: StepSource | None
    ) -> tuple[int, int | None, bool]:
        """``wait``, ``WaitRules.first_step``, and whether it was released (``False``:
        it ended under ``on_timeout="proceed"``)."""
        target = wait_target(until_step)
        if target <= 0:
            return 0, None, True
        limit = self.config.timeout if timeout is None else timeout
        wait = _Wait(self, target, limit, source)
        try:
            released = wait.run()
            self.last_generation = wait.rules.generation or None
            self.last_released_by = wait.rules.released_by
            return released, wait.rules.first_step, True
        except (BarrierTimeout, RedisUnavailable) as exc:
            return wait.rules.proceed_after(exc), None, False
        finally:
            wait.leave()

    def close(self) -> None:
        self._kept.close()
        super().close()


class _Wait(ChannelWait[int]):
    """The I/O of one ``wait`` call; ``WaitRules`` decides."""

    def __init__(
        self, waiter: StepWaiter, target: int, timeout: float | None, source: StepSource | None
    ) -> None:
        config = waiter.config
        self.rules = WaitRules(
            config,
            target,
            timeout,
            waiter._clock,
            log,
            outside=None if source is None else source.name,
            outside_every=(0.5, 5.0) if source is None else source.intervals,
        )
        super().__init__(config, self.rules, config.keys.channel, waiter._connected, waiter._sleep)
        self.waiter = waiter
        self.source = source
        if source is not None:  # Redis is one of two witnesses: see wait()
            self.quiet = True
            self.survivable = (RedisUnavailable, RedisRefused)
        with waiter._client_lock:
            waiter_id = waiter._ids.pop() if waiter._ids else None
        self.link = WaiterLink(
            waiter._code, config, target, time.time(), self._call_timeout, waiter_id
        )

    def run(self) -> int:
        try:
            return self._listen(self._start)
        except _SourceReleased as outcome:
            return int(outcome.args[0])

    def _start(self) -> int | None:
        released = self._read_source()  # before Redis is touched
        return self._reconnect() if released is None else released

    # -- the outside witness -----------------------------------------------------

    def _read_source(self) -> int | None:
        source = self.source
        if source is None or self.clock() < self.rules.source_at:
            return None
        return self.rules.on_outside_step(source.read(), source.hint)

    def _retry_sleep(self, seconds: float) -> None:
        if self.source is None:
            self.sleep(seconds)
            return
        end = self.clock() + seconds
        while True:
            released = self._read_source()
            if released is not None:
                raise _SourceReleased(released)
            left = end - self.clock()
            if left <= 0:
                return
            self.sleep(max(0.001, min(left, self.rules.source_at - self.clock())))

    def _retry_deadline(self) -> float:
        deadline = self.rules.retry_deadline()
        if self.source is not None:
            deadline = min(deadline, self.clock() + SOURCE_RETRY_WITHIN)
        return deadline

    # -- Redis ---------------------------------------------------------------------

    def _on_message(self, data: Any) -> int | None:
        announcement = parse_announcement(data)
        outcome = self.rules.on_announcement(announcement, data)
        if isinstance(outcome, ReadNow):
            return self._read(after=announcement)
        if outcome is not None:
            # the chief's script that announced it removed our registry entry
            self.link.registered = False
        return outcome

    def _read(self, after: StepAnnouncement | None = None) -> int | None:
        """Register (or refresh) and judge the stored state, read for ``after``."""
        snapshot = self._retry(self.link.register_and_read, "read the job's state")
        self.rules.read_done()  # (every read of this wait registers too)
        return self.rules.on_snapshot(snapshot, after)

    def _subscribe(self) -> Subscription:
        """The last wait's subscription if it is fresh (first), else a new one."""
        kept = self.waiter._kept.take() if self.subscriptions == 0 else None
        if kept is not None:
            if kept.drain():  # what came before the read is older than it
                return kept
            kept.close()
        return super()._subscribe()

    def leave(self) -> None:
        """Unregister (one try, none if Redis is lost or its last call went unanswered:
        the entry expires), and keep the subscription for the next wait: closing it
        would cost every release a socket shutdown."""
        if self.rules.redis_lost:
            self._close_pubsub()
            return
        left = False
        try:
            if self.answered:
                self.link.leave(LEAVE_WITHIN)
                left = True
        except Exception as exc:
            log.debug("job %s: could not unregister (%s); it expires", self.config.job, exc)
        finally:
            if left:
                # the id is for the waiter's next wait only once Redis answered the
                # leave: a command of this wait still on its way (unanswered, or a
                # leave that timed out) could else land on the next wait's entry
                with self.waiter._client_lock:
                    self.waiter._ids.append(self.link.id)
            pubsub, self.pubsub = self.pubsub, None
            if pubsub is not None:
                self.waiter._kept.keep(pubsub)
