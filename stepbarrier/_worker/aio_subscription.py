"""One subscription to a job's channel, shared by every wait of an ``AsyncStepWaiter``.

A reader task receives each announcement once and parses it once. It wakes
only the waits it concerns: those whose target the announced step reached
(found through an index by target), or every wait for what concerns them all
(a reset, a finished job, a new chief generation). The others are not woken
for a step below their target: they take in what it says (the chief is alive,
at that step) from ``latest`` when they next act, so a chief crossing 10,000
distinct targets costs each announcement a lookup, not 10,000 wake-ups. A new
chief generation concerns every wait (each must read the state again): the
subscription reads it once, for all, and each wait judges that read at once,
without waking unless it is released or aborted.

When the subscription breaks (or a wait finds it dead: the step moves and no
announcement comes) every listener gets a ``Lost`` item: each subscribes
again (the first one opens the new subscription, the others share it) and
then reads the state, as a ``StepWaiter`` does after a reconnect. The
subscription lives while some wait listens, and ``keep`` seconds after the last
one left (the next wait joins it, as a ``StepWaiter`` takes over the last wait's
subscription): closing it on the release's path, and opening it again for the
next wait, would cost every release of the last waits a disconnection.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import redis
from redis.asyncio.client import PubSub

from stepbarrier._protocol.wire import StepAnnouncement, parse_announcement, preview
from stepbarrier._redis.aio_client import within
from stepbarrier._redis.client import CONNECT_TIMEOUT
from stepbarrier._redis.subscription import SubscriptionLost
from stepbarrier._worker.snapshot import Snapshot

log = logging.getLogger("stepbarrier.aio")


@dataclass(frozen=True)
class Announcement:
    """A message from the channel: parsed (``None`` if malformed) and as it came."""

    parsed: StepAnnouncement | None
    raw: Any


@dataclass(frozen=True)
class Lost:
    """Subscription ``number`` ended; subscribe again, then read the state."""

    number: int
    error: BaseException


@dataclass(frozen=True)
class Ended:
    """A read made for every wait ended this one: released at ``step``, or ``error``."""

    step: int | None
    error: BaseException | None = None


Item = Announcement | Lost | Ended


class Mailbox:
    """What the subscription delivers to one wait, in order.

    Args:
        target: The step the wait waits for.
        judge: Judges a read of the state made for every wait (``on_snapshot``
            of the wait's rules): its ``Ended``, or ``None`` to go on waiting.
    """

    def __init__(
        self, target: int, judge: Callable[[Snapshot, StepAnnouncement | None], Ended | None]
    ) -> None:
        self.target = target
        self.judge = judge
        self.generation = 0
        """The chief generation the wait has read (kept up to date by the wait)."""
        self._items: deque[Item] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: Item) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def clear(self) -> None:
        self._items.clear()

    async def get(self, timeout: float) -> Item | None:
        """The next item, or ``None`` if none came within ``timeout`` seconds."""
        if not self._items:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[None] = loop.create_future()
            self._waiter = waiter
            timer = loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self._items.popleft() if self._items else None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class SharedSubscription:
    """The job's subscription and the mailboxes it feeds.

    Args:
        connect: Returns the client to subscribe on and whether the channel is
            sharded (a cluster: ``SSUBSCRIBE`` on its slot's owner). Its
            argument is True when a subscription was lost before (a cluster's
            slot map is then read again first).
        channel: The job's channel.
        run_id: The waits' run id (another run's announcements concern none).
        clock: The waits' monotonic clock.
        read: Reads the state once (one try), for every wait.
        keep: Seconds the subscription stays open once no wait listens (0:
            closed at once).
    """

    def __init__(
        self,
        connect: Callable[[bool], Awaitable[tuple[Any, bool]]],
        channel: str,
        run_id: str | None,
        clock: Callable[[], float],
        read: Callable[[], Awaitable[Snapshot]],
        keep: float = 0.0,
    ) -> None:
        self._connect = connect
        self._keep = keep
        self._idle: asyncio.TimerHandle | None = None  # closes it once no wait came back
        self._channel = channel
        self._run_id = run_id
        self._clock = clock
        self._read_state = read
        self._rereads: set[asyncio.Task[None]] = set()
        self._listeners: set[Mailbox] = set()
        self._targets: list[int] = []  # the listeners' targets, sorted, each once
        self._by_target: dict[int, set[Mailbox]] = {}
        self._generation: int | None = None  # of the last announcement every wait got
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[int] | None = None
        self._closing: set[asyncio.Task[None]] = set()
        self.number = 0
        """Number of subscriptions opened so far; the current one's number."""
        self.messages = 0
        """Messages received so far (a wait that has seen fewer missed some)."""
        self.latest: tuple[StepAnnouncement, float] | None = None
        """This run's latest step announcement and its ``clock()`` time of arrival."""

    @property
    def listeners(self) -> int:
        """How many waits listen."""
        return len(self._listeners)

    def add(self, mailbox: Mailbox) -> None:
        """Deliver the announcements that concern ``mailbox`` from now on."""
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.cancel()
        self._listeners.add(mailbox)
        waiting = self._by_target.get(mailbox.target)
        if waiting is None:
            waiting = self._by_target[mailbox.target] = set()
            bisect.insort(self._targets, mailbox.target)
        waiting.add(mailbox)

    def remove(self, mailbox: Mailbox) -> None:
        """Stop delivering to ``mailbox``; the last one to leave closes the subscription."""
        self._listeners.discard(mailbox)
        waiting = self._by_target.get(mailbox.target)
        if waiting is not None:
            waiting.discard(mailbox)
            if not waiting:
                del self._by_target[mailbox.target]
                del self._targets[bisect.bisect_left(self._targets, mailbox.target)]
        if not self._listeners:
            if self._keep > 0 and self._pubsub is not None:
                if self._idle is None:
                    self._idle = asyncio.get_running_loop().call_later(self._keep, self._unused)
            else:
                self._shut()

    def _unused(self) -> None:
        """Close the subscription if no wait came back to it in time."""
        self._idle = None
        if not self._listeners:
            self._shut()

    async def ensure(self, timeout: float | None = None) -> int:
        """The number of a confirmed subscription, opened now if there is none (one try).

        Concurrent callers share one attempt; a caller that is cancelled, or
        whose ``timeout`` passes, does not cancel it for the others.

        Args:
            timeout: Seconds the caller waits for it at most (``None``: until the
                attempt ends, within the connection's timeouts).

        Raises:
            redis.TimeoutError: No confirmation within ``CONNECT_TIMEOUT``, or
                none within ``timeout``.
            redis.RedisError: The subscription failed.
        """
        if self._pubsub is not None:
            return self.number
        if self._opening is None:
            self._opening = asyncio.create_task(self._open())
            self._opening.add_done_callback(_consume)
        opening = asyncio.shield(self._opening)
        if timeout is None:
            return await opening
        return await within(opening, timeout)

    def restart(self, number: int, why: str) -> None:
        """End subscription ``number`` (if it is still the current one): it seems dead."""
        if number == self.number and self._pubsub is not None:
            self._drop(SubscriptionLost(why))

    async def aclose(self) -> None:
        """Close the subscription and wait until its connection is closed."""
        opening, self._opening = self._opening, None
        if opening is not None:
            opening.cancel()
        self._shut()
        if self._closing:
            await asyncio.wait(set(self._closing), timeout=CONNECT_TIMEOUT)

    async def _open(self) -> int:
        try:
            client, sharded = await self._connect(self.number > 0)
            pubsub: PubSub = client.pubsub(ignore_subscribe_messages=False)
            try:
                if sharded:
                    await pubsub.ssubscribe(self._channel)
                else:
                    await pubsub.subscribe(self._channel)
                await _confirmed(pubsub, "ssubscribe" if sharded else "subscribe")
            except BaseException:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                raise
            self.number += 1
            self._pubsub = pubsub
            self._reader = asyncio.create_task(self._read(pubsub, self.number))
            if not self._listeners:
                self._shut()  # every wait left while it opened
            return self.number
        finally:
            self._opening = None

    async def _read(self, pubsub: PubSub, number: int) -> None:
        try:
            while True:
                message = await pubsub.get_message(timeout=None)
                if message is None:
                    continue
                kind = _text(message.get("type"))
                if kind == "message" or kind == "smessage":
                    self._dispatch(message.get("data"))
                elif kind == "unsubscribe" or kind == "sunsubscribe":
                    raise SubscriptionLost(f"the server ended the subscription to {self._channel}")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if self._pubsub is pubsub:
                log.info("subscription to %s lost (%s); subscribing again", self._channel, exc)
                self._drop(exc)

    def _dispatch(self, raw: Any) -> None:
        self.messages += 1
        parsed = parse_announcement(raw)
        if parsed is None:
            log.warning("ignored a malformed message on %s: %s", self._channel, preview(raw))
            return
        if not parsed.reset and parsed.run_id != self._run_id:
            return  # another run's chief: it neither releases nor aborts these waits
        item = Announcement(parsed, raw)
        if parsed.reset or parsed.done:  # an abort concerns every wait
            self._generation = parsed.generation
            for mailbox in list(self._listeners):
                mailbox.put(item)
            return
        if parsed.generation != self._generation:
            self._generation = parsed.generation
            # (rare: a new chief, or the first announcement heard) has every wait
            # read this generation already? if not, one read for them all
            if any(m.generation != parsed.generation for m in self._listeners):
                task = asyncio.create_task(self._reread(item, list(self._listeners)))
                self._rereads.add(task)
                task.add_done_callback(self._rereads.discard)
                return
        assert parsed.step is not None
        self.latest = (parsed, self._clock())
        reached = bisect.bisect_right(self._targets, parsed.step)
        for target in self._targets[:reached]:
            for mailbox in self._by_target[target]:
                mailbox.put(item)

    async def _reread(self, item: Announcement, listeners: list[Mailbox]) -> None:
        """Read the state once for ``listeners`` (all subscribed before this read) and let
        each judge it; if the read fails, each reads on its own."""
        try:
            snapshot = await self._read_state()
        except Exception:
            for mailbox in listeners:
                mailbox.put(item)
            return
        for mailbox in listeners:
            if mailbox in self._listeners:
                ended = mailbox.judge(snapshot, item.parsed)
                if ended is not None:
                    mailbox.put(ended)

    def _drop(self, exc: BaseException) -> None:
        """Close the current subscription and tell every listener."""
        number = self.number
        self._shut()
        for mailbox in list(self._listeners):
            mailbox.put(Lost(number, exc))

    def _shut(self) -> None:
        idle, self._idle = self._idle, None
        if idle is not None:
            idle.cancel()
        for task in list(self._rereads):
            task.cancel()
        pubsub, self._pubsub = self._pubsub, None
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        if pubsub is not None:
            task = asyncio.create_task(_close(pubsub))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)


async def _confirmed(pubsub: PubSub, expected: str) -> None:
    until = time.monotonic() + CONNECT_TIMEOUT
    while (remaining := until - time.monotonic()) > 0:
        message = await pubsub.get_message(timeout=max(0.001, remaining))
        if message is not None and _text(message.get("type")) == expected:
            return
    raise redis.TimeoutError("no subscription confirmation from Redis")


async def _close(pubsub: PubSub) -> None:
    with contextlib.suppress(Exception):
        await pubsub.aclose()  # type: ignore[no-untyped-call]


def _consume(task: asyncio.Task[Any]) -> None:
    if not task.cancelled():
        with contextlib.suppress(Exception):
            task.exception()


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)
