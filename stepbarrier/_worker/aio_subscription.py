"""The links every wait of an ``AsyncStepWaiter`` shares: one subscription, one connection.

A chief crossing 10,000 targets must cost each announcement a lookup, not 10,000
wake-ups: ``SharedSubscription`` wakes only the waits it concerns, their listening
timeouts share one timer (``Alarms``: the event loop orders its timers in Python),
and ``CallBatcher`` sends their calls in pipelines, so 2,000 waits reading at once
(a new chief generation) cost one read.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import heapq
import itertools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.asyncio.client import PubSub

from stepbarrier._config.settings import BarrierConfig
from stepbarrier._protocol.calls import Call
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.wire import StepAnnouncement, parse_announcement, preview
from stepbarrier._redis.aio_client import AsyncRedisCode, within
from stepbarrier._redis.client import CONNECT_TIMEOUT
from stepbarrier._redis.subscription import SubscriptionLost
from stepbarrier._worker.links import registered_read, wait_read_call
from stepbarrier._worker.snapshot import Snapshot, parse_snapshot

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


Item = Announcement | Lost | int | BaseException
"""What a wait is delivered: an announcement, the subscription's end, or what a read
made for every wait ended it with (its releasing step, or its error)."""


@dataclass(eq=False)
class Mailbox:
    """What the subscription delivers to one wait (``items``, oldest first); ``judge``
    judges a read made for every wait: what ends the wait, or ``None`` to go on."""

    target: int
    judge: Callable[[Snapshot, StepAnnouncement | None], int | BaseException | None]
    generation: int = 0  # the chief generation the wait has read
    items: deque[Item] = field(default_factory=deque)
    arrived: asyncio.Future[None] | None = None  # done when an item comes, or at a timeout


def deliver(mailboxes: Iterable[Mailbox], item: Item) -> None:
    """Put ``item`` in each of ``mailboxes``, and wake the waits that listen."""
    for mailbox in mailboxes:
        mailbox.items.append(item)
        arrived = mailbox.arrived
        if arrived is not None and not arrived.done():
            arrived.set_result(None)


class Alarms:
    """The waits' listening timeouts: a heap of deadlines and one ``call_at`` for the
    earliest (a wait woken before its deadline leaves it behind: its future is done)."""

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, asyncio.Future[None]]] = []
        self._order = itertools.count()  # (futures do not compare)
        self._timer: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def set(self, future: asyncio.Future[None], delay: float) -> None:
        loop = future.get_loop()
        when = loop.time() + delay
        heapq.heappush(self._heap, (when, next(self._order), future))
        if self._timer is None or when < self._timer.when() or loop is not self._loop:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._loop = loop.call_at(when, self._ring), loop

    def _ring(self) -> None:
        assert self._loop is not None
        self._timer, heap, now = None, self._heap, self._loop.time()
        while heap and heap[0][0] <= now:
            future = heapq.heappop(heap)[2]
            if not future.done():
                future.set_result(None)
        if heap:
            self._timer = self._loop.call_at(heap[0][0], self._ring)


class SharedSubscription:
    """The job's subscription and the mailboxes it feeds. ``connect(lost_before)``
    returns the client to subscribe on and whether the channel is sharded; ``read``
    reads the state once, for every wait.

    Each announcement is parsed once and wakes the waits whose target its step
    reached (bisecting their sorted targets), or all of them for a reset or a
    finished job; a new chief generation is read once for all, each wait judging
    that read. The others take in a step below their target from ``latest`` when
    they next act. A broken subscription hands every wait ``Lost``: it subscribes
    again and reads, as a ``StepWaiter`` does. The subscription outlives the last
    wait by ``fallback_interval``: a disconnection on every release's path would
    cost each release."""

    def __init__(
        self,
        config: BarrierConfig,
        clock: Callable[[], float],
        connect: Callable[[bool], Awaitable[tuple[Any, bool]]],
        read: Callable[[], Awaitable[Snapshot]],
    ) -> None:
        self._keep = config.fallback_interval
        self._channel = config.keys.channel
        self._run_id = config.run_id
        self._clock = clock
        self._connect = connect
        self._read_state = read
        self._idle: asyncio.TimerHandle | None = None  # closes it once no wait came back
        self._rereads: set[asyncio.Future[None]] = set()
        self._closing: set[asyncio.Future[None]] = set()
        self._targets: list[int] = []  # the listeners' targets, sorted, each once
        self._by_target: dict[int, set[Mailbox]] = {}
        self._generation: int | None = None  # of the last announcement every wait got
        self._pubsub: PubSub | None = None
        self._reader: asyncio.Task[None] | None = None
        self._opening: asyncio.Task[int] | None = None
        self._alarms = Alarms()
        self.number = 0  # subscriptions opened so far: the current one's number
        self.messages = 0  # received so far (a wait that has seen fewer missed some)
        self.latest: tuple[StepAnnouncement, float] | None = None  # and when it came

    def _listeners(self) -> list[Mailbox]:
        return [mailbox for waiting in self._by_target.values() for mailbox in waiting]

    def add(self, mailbox: Mailbox) -> None:
        self._cancel_idle()
        waiting = self._by_target.get(mailbox.target)
        if waiting is None:
            waiting = self._by_target[mailbox.target] = set()
            bisect.insort(self._targets, mailbox.target)
        waiting.add(mailbox)

    def remove(self, mailbox: Mailbox) -> None:
        """Stop delivering to ``mailbox``; the last one to leave closes the subscription
        (``fallback_interval`` later, unless a wait came back)."""
        waiting = self._by_target[mailbox.target]
        waiting.discard(mailbox)
        if not waiting:
            del self._by_target[mailbox.target]
            del self._targets[bisect.bisect_left(self._targets, mailbox.target)]
            if not self._targets:
                if self._keep <= 0 or self._pubsub is None:
                    self._shut()
                elif self._idle is None:
                    self._idle = asyncio.get_running_loop().call_later(self._keep, self._unused)

    def arrival(self, mailbox: Mailbox, timeout: float) -> asyncio.Future[None]:
        """Done when the next item comes, or ``timeout`` seconds from now."""
        arrived = mailbox.arrived = asyncio.get_running_loop().create_future()
        self._alarms.set(arrived, timeout)
        return arrived

    def _unused(self) -> None:
        self._idle = None
        if not self._by_target:
            self._shut()

    async def ensure(self, timeout: float | None = None) -> int:
        """The number of a confirmed subscription, opened now if there is none (one try,
        shared by concurrent callers: one cancelled, or whose ``timeout`` passes, does
        not cancel it for the others); ``redis.RedisError`` if it failed or was not
        confirmed in time."""
        if self._pubsub is not None:
            return self.number
        if self._opening is None:
            self._opening = asyncio.create_task(self._open())
            self._opening.add_done_callback(consume)
        opening = asyncio.shield(self._opening)
        return await (opening if timeout is None else within(opening, timeout))

    def restart(self, number: int, why: str) -> None:
        """End subscription ``number`` (if it is still the current one): it seems dead."""
        if number == self.number and self._pubsub is not None:
            self._drop(SubscriptionLost(why))

    async def aclose(self) -> None:
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
                await (pubsub.ssubscribe if sharded else pubsub.subscribe)(self._channel)
                await _confirmed(pubsub, "ssubscribe" if sharded else "subscribe")
            except BaseException:
                await _close(pubsub)
                raise
            self.number += 1
            self._pubsub = pubsub
            self._reader = asyncio.create_task(self._read(pubsub))
            if not self._by_target:
                self._shut()  # every wait left while it opened
            return self.number
        finally:
            self._opening = None

    async def _read(self, pubsub: PubSub) -> None:
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
            deliver(self._listeners(), item)
            return
        if parsed.generation != self._generation:
            self._generation = parsed.generation
            # (rare: a new chief, or the first announcement heard) has every wait
            # read this generation already? if not, one read for them all
            listeners = self._listeners()
            if any(m.generation != parsed.generation for m in listeners):
                _spawn(self._rereads, self._reread(item, listeners))
                return
        assert parsed.step is not None
        self.latest = (parsed, self._clock())
        for target in self._targets[: bisect.bisect_right(self._targets, parsed.step)]:
            deliver(self._by_target[target], item)

    async def _reread(self, item: Announcement, listeners: list[Mailbox]) -> None:
        """Read the state once for ``listeners`` (all subscribed before this read) and let
        each judge it; if the read fails, each reads on its own."""
        try:
            snapshot = await self._read_state()
        except Exception:
            deliver(listeners, item)
            return
        for mailbox in listeners:
            if mailbox in self._by_target.get(mailbox.target, ()):
                ended = mailbox.judge(snapshot, item.parsed)
                if ended is not None:
                    deliver((mailbox,), ended)

    def _drop(self, exc: BaseException) -> None:
        number = self.number
        self._shut()
        deliver(self._listeners(), Lost(number, exc))

    def _cancel_idle(self) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = None

    def _shut(self) -> None:
        self._cancel_idle()
        for task in list(self._rereads):
            task.cancel()
        pubsub, self._pubsub = self._pubsub, None
        reader, self._reader = self._reader, None
        if reader is not None and reader is not asyncio.current_task():
            reader.cancel()
        if pubsub is not None:
            _spawn(self._closing, _close(pubsub))


async def _confirmed(pubsub: PubSub, expected: str) -> None:
    until = time.monotonic() + CONNECT_TIMEOUT
    while (remaining := until - time.monotonic()) > 0:
        message = await pubsub.get_message(timeout=max(0.001, remaining))
        if message is not None and _text(message.get("type")) == expected:
            return
    raise redis.TimeoutError("no subscription confirmation from Redis")


async def _close(pubsub: PubSub) -> None:
    with contextlib.suppress(Exception):
        await pubsub.aclose()


def _spawn(tasks: set[asyncio.Future[None]], work: Awaitable[None]) -> None:
    task = asyncio.ensure_future(work)
    tasks.add(task)
    task.add_done_callback(tasks.discard)


def consume(future: asyncio.Future[Any]) -> None:
    """Retrieve a done future's exception (else asyncio logs it)."""
    if not future.cancelled():
        with contextlib.suppress(Exception):
            future.exception()


def _text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


MAX_BATCH = 500
"""Most registrations in one pipeline (Redis serves other clients between two)."""


@dataclass
class _Request:
    call: Call | None
    future: asyncio.Future[Any]
    reads: bool


class CallBatcher:
    """Queues the waits' calls and sends them in the order they came, in pipelines of
    at most ``MAX_BATCH`` calls, one at a time, reading the state once per pipeline
    after its registrations (the race-free order); ``code`` returns the code runner."""

    def __init__(self, code: Callable[[], AsyncRedisCode], keys: JobKeys) -> None:
        self._code = code
        self._job = keys.job
        self._read = wait_read_call(keys)
        self._queue: deque[_Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self.round_trips = 0  # pipelines sent so far

    def register_and_read(self, register: Call | None) -> asyncio.Future[Snapshot]:
        """Queue a read of the state, after ``register`` if given."""
        return self._submit(register, reads=True)

    def leave(self, call: Call) -> asyncio.Future[None]:
        """Queue a wait's unregistration, sent whatever happens to the future."""
        future = self._submit(call, reads=False)
        future.add_done_callback(consume)  # a wait that gave up on it must not log
        return future

    async def close(self, timeout: float) -> None:
        """Send the calls queued (for ``timeout`` s at most), then stop: calls still
        queued fail with ``ConnectionError``."""
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=timeout)
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
        self._fail(list(self._queue), ConnectionError("the waiter was closed"))
        self._queue.clear()

    def _submit(self, call: Call | None, *, reads: bool) -> asyncio.Future[Any]:
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(call, future, reads))
        if self._task is None or self._task.done():
            self._task = asyncio.create_task(self._send_all())
        return future

    async def _send_all(self) -> None:
        while self._queue:
            batch: list[_Request] = []
            calls = 0
            while self._queue and calls < MAX_BATCH:
                request = self._queue.popleft()
                if request.reads and request.future.done():
                    # its wait gave up on it (its bound passed while a round trip
                    # hung, or it was cancelled): not sent, a hung Redis is not
                    # sent the retries of every wait
                    continue
                batch.append(request)
                calls += request.call is not None
            if batch:
                await self._send(batch)

    async def _send(self, batch: list[_Request]) -> None:
        calls = [request.call for request in batch if request.call is not None]
        reads = any(request.reads for request in batch)
        if reads:
            calls.append(self._read)
        try:
            self.round_trips += 1
            replies = await self._code().replies(calls)
        except asyncio.CancelledError:
            self._fail(batch, ConnectionError("the waiter was closed"))
            raise
        except Exception as exc:  # the round trip failed: every wait retries on its own
            self._fail(batch, exc)
            return
        snapshot = _parsed(replies[-1]) if reads else None
        own = iter(replies)
        for request in batch:
            reply = None if request.call is None else next(own)
            future = request.future
            if future.done():
                continue  # its wait was cancelled
            if not request.reads:
                if isinstance(reply, Exception):
                    future.set_exception(reply)
                else:
                    future.set_result(None)
                continue
            try:
                future.set_result(registered_read(self._job, reply, snapshot))
            except Exception as exc:
                future.set_exception(exc)

    @staticmethod
    def _fail(batch: list[_Request], exc: BaseException) -> None:
        for request in batch:
            if not request.future.done():
                request.future.set_exception(exc)


def _parsed(reply: Any) -> Snapshot | BaseException:
    """The state read, or the error each reader gets (a refusal, a reply of the wrong shape)."""
    if isinstance(reply, Exception):
        return reply
    try:
        return parse_snapshot(reply)
    except Exception as exc:
        return exc
