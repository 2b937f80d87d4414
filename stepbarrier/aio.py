"""A worker's side for asyncio: many concurrent waits on one event loop, two connections.

``AsyncStepWaiter.wait`` has the semantics and the errors of
``StepWaiter.wait`` (the decisions are the same code, ``stepbarrier._worker.wait_state``):
a wait registers, reads the stored state and then waits for announcements,
reading the state again every ``fallback_interval``, after every reconnect
and at every deadline. What differs is the I/O. However many waits run at
once on one ``AsyncStepWaiter``, they share one subscription to the job's
channel (``stepbarrier._worker.aio_subscription``: an announcement is received and
parsed once, then handed to every wait) and one command connection, on which
their registrations, reads and unregistrations go in pipelines
(``stepbarrier._worker.aio_batch``).

A wait that asyncio cancels (``asyncio.wait_for``, ``Task.cancel``) removes
its registry entry before the cancellation completes (waiting ``LEAVE_WITHIN``
at most for it: an entry left behind expires by itself).

A wait ends within its limits against a Redis that hangs too (it accepts
connections and never answers): whatever its shared connections do, a wait
awaits each of its calls (its subscription, its reads) for the time left to
its nearest limit at most (``CALL_FLOOR`` at least), and its unregistration
for ``LEAVE_WITHIN`` at most.

The chief stays ``StepPublisher``: ``publish`` takes a fraction of a
microsecond and never blocks (its thread does the Redis work), so it is fit
to be called from a coroutine as it is.

Its client is made from the same settings as ``StepWaiter``'s
(``stepbarrier._redis.client.build_client``): a Redis named by URL, a Redis
Cluster (the job's calls and its sharded subscription go to its slot's owner)
or the master that Sentinels name.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from types import TracebackType
from typing import TypeVar

from redis.asyncio.cluster import RedisCluster as AsyncCluster

from stepbarrier._config.settings import BarrierConfig
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
from stepbarrier._worker.aio_batch import CallBatcher
from stepbarrier._worker.aio_subscription import (
    Announcement,
    Ended,
    Lost,
    Mailbox,
    SharedSubscription,
)
from stepbarrier._worker.follow import Crossed, FollowPlan
from stepbarrier._worker.links import (
    Snapshot,
    leave_call,
    new_waiter_id,
    register_call,
    registry_entry,
)
from stepbarrier._worker.timing import READ, RESUBSCRIBE, LastChance, Receive
from stepbarrier._worker.wait_state import ReadNow, WaitRules, wait_target
from stepbarrier.errors import BarrierAborted, BarrierTimeout, RedisUnavailable, StepBarrierError

log = logging.getLogger("stepbarrier.aio")

T = TypeVar("T")

LEAVE_TIMEOUT = 2.0
"""Seconds ``close`` waits for unregistrations still queued (an entry left behind
expires by itself)."""

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
        self._keys = config.keys  # (made anew at each access of config.keys)
        self._owns_client = client is None
        self._client = client
        self._owners: SlotOwners | None = None  # a cluster's: its masters' plain clients
        self._code: AsyncRedisCode | None = None
        self._clock = clock
        self._sleep = sleep
        self._subscription = SharedSubscription(
            self._subscriber,
            config.keys.channel,
            config.run_id,
            clock,
            self._read_once,
            keep=config.fallback_interval,
        )
        self._batcher = CallBatcher(self._code_runner, config.keys)

    @classmethod
    def from_env(cls) -> AsyncStepWaiter:
        """A waiter configured from ``STEPBARRIER_*`` variables and ``TF_CONFIG``."""
        return cls(BarrierConfig.from_env())

    @property
    def round_trips(self) -> int:
        """Pipelines of registrations, reads and unregistrations sent so far."""
        return self._batcher.round_trips

    async def wait(self, until_step: int, timeout: float | None = None) -> int:
        """Wait until the chief's published step is at least ``until_step``.

        Args:
            until_step: The step to wait for; ``<= 0`` returns 0 at once without
                touching Redis.
            timeout: Overall limit in seconds; ``None`` uses ``config.timeout``
                (itself ``None`` for no overall limit; the stall timeout still holds).

        Returns:
            The step seen (``>= until_step``). Under ``on_timeout="proceed"`` a
            timeout logs a warning and returns the last step seen (0 if none).

        Raises:
            BarrierTimeout: The overall or the stall timeout passed (also when
                Redis, once reached, stayed unreachable for that long).
            BarrierAborted: The job finished or was reset before the step came.
            RedisUnavailable: Redis could not be reached at all before a deadline.
            RedisRefused: Redis refused us (authentication, ACL, TLS).
        """
        return (await self._wait(until_step, timeout))[0]

    async def follow(
        self, every: int, start: int | None = None, timeout: float | None = None
    ) -> AsyncIterator[Crossed]:
        """``StepWaiter.follow`` on the event loop: ``async for crossed in waiter.follow(1000)``.

        Yields ``Crossed(multiple, step)`` for every multiple of ``every`` the
        chief's step reaches, in order, none skipped; ends when the job finishes;
        raises as ``wait`` does (see ``StepWaiter.follow``).
        """
        plan = FollowPlan(every, start)
        while not plan.exhausted:
            try:
                step, before, released = await self._wait(plan.target, timeout)
            except BarrierAborted as exc:
                if plan.ends(exc):
                    return
                raise
            if not released:
                return  # on_timeout="proceed": the wait said why; nothing was crossed
            for crossed in plan.released(step, before):
                yield crossed

    async def _wait(self, until_step: int, timeout: float | None) -> tuple[int, int | None, bool]:
        """``wait``, the step its first read found (``WaitRules.first_step``), and
        whether it was released (``False``: it ended under ``on_timeout="proceed"``)."""
        target = wait_target(until_step)
        if target <= 0:
            return 0, None, True
        limit = self.config.timeout if timeout is None else timeout
        wait = _AsyncWait(self, target, limit)
        try:
            return await wait.run(), wait.rules.first_step, True
        except (BarrierTimeout, RedisUnavailable) as exc:
            return wait.rules.proceed_after(exc), None, False
        finally:
            if wait.registered:
                await wait.leave()

    async def close(self) -> None:
        """Close the subscription and the connections (the client only if made here).

        Call it once the waits have ended: unregistrations still queued are sent
        first (for at most ``LEAVE_TIMEOUT`` seconds).
        """
        await self._batcher.idle(LEAVE_TIMEOUT)
        self._batcher.stop()
        await self._subscription.aclose()
        client, self._client, self._code = self._client, None, None
        owners, self._owners = self._owners, None
        if owners is not None:
            await owners.aclose()
        if self._owns_client and client is not None:
            await client.aclose()
        elif client is not None:
            self._client = client  # the caller's: it stays theirs, and ours to use

    async def _read_once(self) -> Snapshot:
        return await self._batcher.register_and_read(None)

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

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()


class _AsyncWait:
    """The I/O of one ``wait`` call, on the waiter's shared links; ``WaitRules`` decides."""

    def __init__(self, waiter: AsyncStepWaiter, target: int, timeout: float | None) -> None:
        self.waiter = waiter
        self.config = waiter.config
        self.clock = waiter._clock
        self.rules = WaitRules(self.config, target, timeout, self.clock, log)
        self.id = new_waiter_id(self.config)
        self.entry = registry_entry(self.config, target, since=time.time())
        self.registered = False
        self.registered_at: float | None = None
        self.answered = True  # False while its last call failed (Redis unreachable or hung)
        self.mailbox = Mailbox(target, self._judge)
        self.subscription = 0  # the number of the subscription it listens on
        self.messages = 0  # the subscription's messages this wait has taken in

    async def run(self) -> int:
        subscription = self.waiter._subscription
        subscription.add(self.mailbox)
        try:
            return await self._loop()
        except RedisUnavailable as exc:
            raise self.rules.unreachable(exc) from exc
        finally:
            subscription.remove(self.mailbox)

    async def _loop(self) -> int:
        rules = self.rules
        rules.begin()
        released = await self._reconnect()  # the step may have come before we did
        while released is None:
            self._catch_up()
            action = rules.next_action(self.clock())
            if isinstance(action, Receive):
                # (inline, not a method: this is the wake of every wait, paid
                # once per wait when one announcement releases thousands)
                item = await self.mailbox.get(action.timeout)
                if isinstance(item, Announcement):
                    outcome = rules.on_announcement(item.parsed, item.raw)
                    if isinstance(outcome, ReadNow):
                        released = await self._read(after=item.parsed)
                    elif outcome is not None:
                        # the chief's script that announced it removed our target
                        # from the index: nothing to unregister
                        self.registered = False
                        released = outcome
                elif item is not None:
                    released = await self._on_end(item)
            elif action is READ:
                released = await self._read(refresh=True)
            elif isinstance(action, LastChance):
                released = rules.after_last_chance(action.limit, await self._last_chance())
            else:
                assert action is RESUBSCRIBE, action  # an asyncio wait has no outside witness
                why = "the step moved, no announcement"
                self.waiter._subscription.restart(self.subscription, why)
        return released

    async def _on_end(self, item: Lost | Ended) -> int | None:
        """Act on the end of the subscription, or of every wait (a read for them all)."""
        if isinstance(item, Lost):
            if item.number < self.subscription:
                return None  # an earlier subscription's end: this wait has moved on
            return await self._reconnect()
        if isinstance(item, Ended):
            if item.error is not None:
                raise item.error
            return item.step

    async def _read(
        self, *, refresh: bool = False, after: StepAnnouncement | None = None
    ) -> int | None:
        """Register (``refresh``, or if the entry is not fresh) and judge the stored state."""
        call = None
        fresh = self.registered_at is not None and (
            self.clock() - self.registered_at < self.config.fallback_interval
        )
        if refresh or not self.registered or not fresh:
            call = register_call(
                self.config, self.id, self.rules.target, self.entry, self.waiter._keys
            )

        deadline = self.rules.retry_deadline()

        async def register_and_read() -> Snapshot:
            if call is not None:
                self.registered, self.registered_at = True, self.clock()
            # the shared round trip may take longer (other waits' calls ride on
            # it): this wait awaits it for the time left to its limit at most
            reply = self.waiter._batcher.register_and_read(call)
            return await expiring(reply, call_timeout(deadline, self.clock()))

        snapshot = await self._answered(
            call_with_retries(
                register_and_read,
                self.config,
                action="read the job's state",
                deadline=deadline,
                clock=self.clock,
                sleep=self.waiter._sleep,
            )
        )
        if call is not None:
            # the fallback read is due one interval after the last registering
            # one (a read made for every wait, _judge, refreshes no entry)
            self.rules.read_done()
        self._catch_up()
        try:
            return self.rules.on_snapshot(snapshot, after)
        finally:
            self.mailbox.generation = self.rules.generation

    def _judge(self, snapshot: Snapshot, after: StepAnnouncement | None) -> Ended | None:
        """A read made for every wait (a new chief generation, announced by ``after``):
        ended, or go on."""
        self._catch_up()
        try:
            step = self.rules.on_snapshot(snapshot, after)
        except StepBarrierError as exc:
            return Ended(None, exc)
        finally:
            self.mailbox.generation = self.rules.generation
        return None if step is None else Ended(step)

    def _catch_up(self) -> None:
        """Take in the announcements that were not this wait's to act on (steps below
        its target): the chief's liveness and step."""
        subscription = self.waiter._subscription
        if subscription.messages != self.messages:
            self.messages = subscription.messages
            latest = subscription.latest
            if latest is None:
                self.rules.on_passing_announcement(None, 0.0)
            else:
                self.rules.on_passing_announcement(*latest)

    async def _reconnect(self) -> int | None:
        """Subscribe (or join the subscription), then read the state (in that order)."""
        deadline = self.rules.retry_deadline()

        async def subscribe() -> int:  # (a coroutine function: tenacity awaits it)
            timeout = call_timeout(deadline, self.clock())
            return await self.waiter._subscription.ensure(timeout)

        self.subscription = await self._answered(
            call_with_retries(
                subscribe,
                self.config,
                action=f"subscribe to {self.waiter._keys.channel}",
                deadline=deadline,
                clock=self.clock,
                sleep=self.waiter._sleep,
            )
        )
        self.rules.subscribed()
        # what came before the read is older than it: the read is the truth
        self.mailbox.clear()
        self.messages = self.waiter._subscription.messages
        return await self._read(refresh=True)  # Redis may have restarted empty

    async def _answered(self, call: Awaitable[T]) -> T:
        """``await call`` (a call with its retries), noting whether it failed."""
        try:
            result = await call
        except Exception:
            self.answered = False
            raise
        self.answered = True
        return result

    async def _last_chance(self) -> int | None:
        """One last read at a passed limit (a release may have come; bounded by
        ``CALL_FLOOR``)."""
        try:
            return await self._read()
        except RedisUnavailable:
            return None

    async def leave(self) -> None:
        """Unregister, even while being cancelled (one try; an entry left behind expires)."""
        self.registered = False
        done = self.waiter._batcher.leave(leave_call(self.waiter._keys, self.id))
        # the batcher sends it whatever happens to this task or to the future (a
        # second cancellation, the bound below do not take it back). Waiting for
        # it here means that once wait() has ended, the entry is gone; but for
        # LEAVE_WITHIN at most, and not at all when the wait's last call found
        # Redis unreachable or hung (the entry expires by itself)
        if not self.answered:
            return
        try:
            await expiring(done, LEAVE_WITHIN)
        except Exception as exc:
            log.debug("job %s: could not unregister (%s); it expires", self.config.job, exc)
