"""A worker's side for asyncio: many concurrent waits on one event loop, two connections.

``AsyncStepWaiter.wait`` is ``StepWaiter.wait`` (the same rules,
``stepbarrier._worker.wait_state``) with other I/O: however many waits run at once,
they share one subscription and one command connection
(``stepbarrier._worker.aio_subscription``). A wait that asyncio cancels removes its
registry entry before the cancellation completes; against a Redis that hangs it
awaits each call for the time left to its nearest limit at most (``CALL_FLOOR`` at
least), and its unregistration for ``LEAVE_WITHIN`` (an entry left expires).
The chief stays ``StepPublisher`` (docs/python-api.md#asyncio-asyncstepwaiter).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TypeVar

from redis.asyncio.cluster import RedisCluster as AsyncCluster

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import leave_call
from stepbarrier._protocol.wire import StepAnnouncement
from stepbarrier._redis.aio_client import (
    AsyncClient,
    AsyncRedisCode,
    SlotOwners,
    call_with_retries,
    expiring,
    make_async_client,
)
from stepbarrier._redis.bounded import LEAVE_WITHIN, call_timeout
from stepbarrier._worker.aio_subscription import (
    Announcement,
    CallBatcher,
    Lost,
    Mailbox,
    SharedSubscription,
)
from stepbarrier._worker.follow import Crossed, FollowPlan
from stepbarrier._worker.links import new_waiter_id, register_call
from stepbarrier._worker.snapshot import Snapshot
from stepbarrier._worker.timing import READ, RESUBSCRIBE, LastChance, Receive
from stepbarrier._worker.wait_state import ReadNow, WaitRules, wait_target
from stepbarrier.errors import BarrierAborted, BarrierTimeout, RedisUnavailable, StepBarrierError

log = logging.getLogger("stepbarrier.aio")

T = TypeVar("T")

LEAVE_TIMEOUT = 2.0
"""Seconds ``close`` waits for unregistrations still queued (an entry left expires)."""

__all__ = ["AsyncStepWaiter"]


class AsyncStepWaiter:
    """Waits, on an asyncio event loop, for a job's chief to reach global steps.

    Args:
        config: The job's settings (``timeout``, ``stall_timeout``, ``on_timeout``
            and ``task_id`` shape each wait).
        client: A ``redis.asyncio.Redis`` (or ``redis.asyncio.RedisCluster``)
            client; one is made from ``config`` if omitted (and closed by ``close``).
        clock: Monotonic clock, injectable for tests.
        sleep: Coroutine that sleeps between retries, injectable for tests.

    Raises:
        ConfigurationError: ``config`` names Sentinels with a ``unix://`` URL.

    Example:
        ```python
        async def main() -> None:
            async with AsyncStepWaiter(BarrierConfig(job="demo", task_id=2)) as waiter:
                steps = await asyncio.gather(*(waiter.wait(t) for t in (10, 20, 30)))
        ```
    """

    def __init__(
        self,
        config: BarrierConfig,
        client: AsyncClient | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.config = config
        self._keys = config.keys  # (config.keys is made anew at each access)
        self._owns_client = client is None
        self._client = client
        self._owners: SlotOwners | None = None  # a cluster's: its masters' plain clients
        self._code: AsyncRedisCode | None = None
        self._clock = clock
        self._sleep = sleep
        self._batcher = CallBatcher(self._code_runner, config.keys)
        read_once = functools.partial(self._batcher.register_and_read, None)
        self._subscription = SharedSubscription(config, clock, self._subscriber, read_once)

    @classmethod
    def from_env(cls) -> AsyncStepWaiter:
        """A waiter configured from ``STEPBARRIER_*`` variables and ``TF_CONFIG``."""
        return cls(BarrierConfig.from_env())

    @property
    def round_trips(self) -> int:
        """Pipelines of registrations, reads and unregistrations sent so far."""
        return self._batcher.round_trips

    async def wait(self, until_step: int, timeout: float | None = None) -> int:
        """Wait until the chief's published step is at least ``until_step``: ``StepWaiter.wait``
        (without a ``source``) on the event loop, with its arguments, result and errors."""
        target = wait_target(until_step)
        return 0 if target <= 0 else await _AsyncWait(self, target, timeout).run()

    async def follow(
        self, every: int, start: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[Crossed]:
        """``StepWaiter.follow`` on the event loop: ``async for crossed in waiter.follow(1000)``."""
        plan = FollowPlan(every, start)
        while not plan.exhausted:
            wait = _AsyncWait(self, plan.target, timeout)
            try:
                step = await wait.run()
            except BarrierAborted as exc:
                if plan.ends(exc):
                    return
                raise
            if not wait.released:
                return  # on_timeout="proceed": the wait said why; nothing was crossed
            for crossed in plan.released(step, wait.rules.first_step):
                yield crossed

    async def close(self) -> None:
        """Close the subscription and the connections (the client only if made here),
        once the waits have ended: unregistrations still queued go first."""
        await self._batcher.close(LEAVE_TIMEOUT)
        await self._subscription.aclose()
        owners, self._owners, self._code = self._owners, None, None
        if owners is not None:
            await owners.aclose()
        if self._owns_client and self._client is not None:  # a caller's stays theirs
            client, self._client = self._client, None
            await client.aclose()

    def _connected(self) -> AsyncClient:
        if self._client is None:
            self._client = make_async_client(self.config)
        if self._owners is None and isinstance(self._client, AsyncCluster):
            self._owners = SlotOwners(self._client)
        return self._client

    async def _subscriber(self, lost_before: bool) -> tuple[AsyncClient, bool]:
        """The client to subscribe on, and whether the channel is sharded (a cluster)."""
        client = self._connected()
        if self._owners is None:
            return client, False
        if lost_before:  # the job's slot may have moved, or its master failed over
            await self._owners.refresh()
        return await self._owners.owner(self.config.keys.channel), True

    def _code_runner(self) -> AsyncRedisCode:
        if self._code is None:
            client = self._connected()
            self._code = AsyncRedisCode(client, self.config, self._owners)
        return self._code

    async def __aenter__(self) -> AsyncStepWaiter:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class _AsyncWait:
    """The I/O of one ``wait`` call, on the waiter's shared links; ``WaitRules`` decides."""

    def __init__(self, waiter: AsyncStepWaiter, target: int, timeout: float | None) -> None:
        self.waiter = waiter
        self.config = waiter.config
        self.clock = waiter._clock
        limit = self.config.timeout if timeout is None else timeout
        self.rules = WaitRules(self.config, target, limit, self.clock, log)
        self.id = new_waiter_id(self.config)
        self.register = register_call(self.config, waiter._keys, self.id, target, time.time())
        self.registered = False
        self.registered_at: float | None = None
        self.answered = True  # False while its last call failed (Redis unreachable or hung)
        self.released = True  # False: it ended under on_timeout="proceed"
        self.mailbox = Mailbox(target, self._judge)
        self.subscription = 0  # the number of the subscription it listens on
        self.messages = 0  # the subscription's messages this wait has taken in

    async def run(self) -> int:
        """The wait, from its registration to its unregistration: it awaits its mailbox
        inline (no coroutine nor timer of its own: the wake of thousands of waits that
        one announcement releases pays for each)."""
        rules, mailbox, subscription = self.rules, self.mailbox, self.waiter._subscription
        subscription.add(mailbox)
        try:
            try:
                released = await self._reconnect()  # the step may have come before we did
                while released is None:
                    self._catch_up()
                    action = rules.next_action(self.clock())
                    if isinstance(action, Receive):
                        if not mailbox.items:
                            await subscription.arrival(mailbox, action.timeout)
                        item = mailbox.items.popleft() if mailbox.items else None
                        if isinstance(item, Announcement):
                            outcome = rules.on_announcement(item.parsed, item.raw)
                            if isinstance(outcome, ReadNow):
                                released = await self._read(after=item.parsed)
                            elif outcome is not None:
                                self.registered = False  # the chief's write removed it
                                released = outcome
                        elif item is not None:
                            released = await self._on_end(item)
                    elif action is READ:
                        released = await self._read(refresh=True)
                    elif isinstance(action, LastChance):
                        released = rules.after_last_chance(action.limit, await self._last_chance())
                    else:  # (an asyncio wait has no outside witness to read)
                        assert action is RESUBSCRIBE, action
                        subscription.restart(self.subscription, "the step moved, no announcement")
                return released
            except RedisUnavailable as exc:
                raise rules.unreachable(exc) from exc
            finally:
                subscription.remove(mailbox)
        except (BarrierTimeout, RedisUnavailable) as exc:
            self.released = False
            return rules.proceed_after(exc)
        finally:
            if self.registered:
                await self._leave()

    async def _on_end(self, item: Lost | int | BaseException) -> int | None:
        """Act on the end of the subscription, or of the wait (by a read for them all)."""
        if isinstance(item, Lost):
            if item.number < self.subscription:
                return None  # an earlier subscription's end: this wait has moved on
            return await self._reconnect()
        if isinstance(item, BaseException):
            raise item
        return item

    async def _read(
        self, *, refresh: bool = False, after: StepAnnouncement | None = None
    ) -> int | None:
        """Register (``refresh``, or if the entry is not fresh) and judge the stored state."""
        fresh = self.registered_at is not None and (
            self.clock() - self.registered_at < self.config.fallback_interval
        )
        call = None if fresh and self.registered and not refresh else self.register

        def register_and_read(deadline: float) -> Awaitable[Snapshot]:
            if call is not None:
                self.registered, self.registered_at = True, self.clock()
            # the shared round trip may take longer (other waits' calls ride on
            # it): this wait awaits it for the time left to its limit at most
            reply = self.waiter._batcher.register_and_read(call)
            return expiring(reply, call_timeout(deadline, self.clock()))

        snapshot = await self._retried(register_and_read, "read the job's state")
        if call is not None:
            self.rules.read_done()
        return self._on_snapshot(snapshot, after)

    def _judge(
        self, snapshot: Snapshot, after: StepAnnouncement | None
    ) -> int | StepBarrierError | None:
        """Judge a read made for every wait (a new chief generation): what ends it, or ``None``."""
        try:
            return self._on_snapshot(snapshot, after)
        except StepBarrierError as exc:
            return exc

    def _on_snapshot(self, snapshot: Snapshot, after: StepAnnouncement | None) -> int | None:
        self._catch_up()
        try:
            return self.rules.on_snapshot(snapshot, after)
        finally:
            self.mailbox.generation = self.rules.generation

    def _catch_up(self) -> None:
        """Take in the latest announcement that was not this wait's to act on."""
        subscription = self.waiter._subscription
        if subscription.messages != self.messages:
            self.messages = subscription.messages
            self.rules.take_in(*(subscription.latest or (None, 0.0)))

    async def _reconnect(self) -> int | None:
        """Subscribe (or join the subscription), then read the state (in that order)."""
        subscription = self.waiter._subscription
        action = f"subscribe to {self.waiter._keys.channel}"
        self.subscription = await self._retried(
            lambda deadline: subscription.ensure(call_timeout(deadline, self.clock())), action
        )
        self.rules.subscribed()
        # what came before the read is older than it: the read is the truth
        self.mailbox.items.clear()
        self.messages = subscription.messages
        return await self._read(refresh=True)  # Redis may have restarted empty

    async def _retried(self, attempt: Callable[[float], Awaitable[T]], action: str) -> T:
        """``attempt(deadline)``, retried as ``ChannelWait._retry`` retries."""
        deadline = self.rules.retry_deadline()

        async def bounded() -> T:  # (a coroutine function: tenacity awaits it)
            return await attempt(deadline)

        try:
            result = await call_with_retries(
                bounded,
                self.config,
                action=action,
                deadline=deadline,
                clock=self.clock,
                sleep=self.waiter._sleep,
            )
        except Exception:
            self.answered = False
            raise
        self.answered = True
        return result

    async def _last_chance(self) -> int | None:
        try:
            return await self._read()
        except RedisUnavailable:
            return None

    async def _leave(self) -> None:
        """Unregister, even while being cancelled: sent whatever happens to this task, and
        awaited (the entry is gone once ``wait`` ended) unless the wait's last call went
        unanswered (``_Wait.leave``)."""
        self.registered = False
        done = self.waiter._batcher.leave(leave_call(self.waiter._keys, self.id))
        if not self.answered:
            return
        try:
            await expiring(done, LEAVE_WITHIN)
        except Exception as exc:
            log.debug("job %s: could not unregister (%s); it expires", self.config.job, exc)
