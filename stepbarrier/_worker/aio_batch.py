"""The calls of many concurrent waits, sent in few round trips on one connection.

Each wait of an ``AsyncStepWaiter`` registers (or refreshes its entry) and
reads the job's state, and leaves the registry when it ends. Rather than one
round trip per wait, ``CallBatcher`` queues the calls and sends them, in the
order they came, in pipelines of at most ``MAX_BATCH`` calls, one pipeline at
a time: a burst of 2,000 new waits costs a few round trips on one connection.
The state is read once per pipeline, after its registrations, so every wait of
the pipeline registered before its read (the race-free order of a wait); a
wait whose entry is fresh reads without registering again, so 2,000 waits
re-reading at once (a new chief generation) cost one read.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from stepbarrier._protocol.calls import Call
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.aio_client import AsyncRedisCode
from stepbarrier._redis.functions import is_out_of_memory
from stepbarrier._worker.links import Snapshot, parse_snapshot, read_call, warn_unregistered

MAX_BATCH = 500
"""Most registrations in one pipeline (Redis serves other clients between two)."""


@dataclass
class _Request:
    call: Call | None
    future: asyncio.Future[Any]
    reads: bool


class CallBatcher:
    """Queues the waits' calls and sends them in pipelines, one at a time.

    Args:
        code: Returns the code runner (made on first use).
        keys: The job's keys.
    """

    def __init__(self, code: Callable[[], AsyncRedisCode], keys: JobKeys) -> None:
        self._code = code
        self._keys = keys
        self._queue: deque[_Request] = deque()
        self._task: asyncio.Task[None] | None = None
        self.round_trips = 0
        """Pipelines sent so far (for tests and benchmarks)."""

    def register_and_read(self, register: Call | None) -> asyncio.Future[Snapshot]:
        """Queue a read of the state, after ``register`` (a wait's registration) if
        given; the future gives the state."""
        return self._submit(register, reads=True)

    def leave(self, call: Call) -> asyncio.Future[None]:
        """Queue a wait's unregistration; the future ends when Redis has run it. It is
        sent whatever happens to the future (a wait that gave up on it, cancelled)."""
        future = self._submit(call, reads=False)
        future.add_done_callback(_consume)  # a wait that gave up on it must not log
        return future

    async def idle(self, timeout: float) -> None:
        """Wait (at most ``timeout`` s) until every queued call has been sent."""
        task = self._task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=timeout)

    def stop(self) -> None:
        """Cancel the sending task; queued calls fail with ``ConnectionError``."""
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
            calls.append(read_call(self._keys, wait=True))
        try:
            self.round_trips += 1
            replies = await self._code().replies(calls)
        except asyncio.CancelledError:
            self._fail(batch, ConnectionError("the waiter was closed"))
            raise
        except Exception as exc:  # the round trip failed: every wait retries on its own
            self._fail(batch, exc)
            return
        read = replies[-1] if reads else None
        snapshot: Snapshot | BaseException | None = None
        if reads:
            snapshot = read if isinstance(read, Exception) else _parsed(read)
        own = iter(replies)
        for request in batch:
            reply = None if request.call is None else next(own)
            if request.future.done():
                continue  # its wait was cancelled
            if isinstance(reply, Exception) and not (
                # a full Redis refuses the registration, not the read: go on reading
                request.reads and is_out_of_memory(reply) and isinstance(snapshot, Snapshot)
            ):
                request.future.set_exception(reply)
            elif isinstance(snapshot, BaseException) and request.reads:
                request.future.set_exception(snapshot)
            else:
                mine = snapshot
                if isinstance(reply, Exception):
                    # Redis refused this wait's registration: it is full
                    warn_unregistered(self._keys.job, reply)
                    if isinstance(snapshot, Snapshot):
                        mine = replace(snapshot, full=True)
                request.future.set_result(mine if request.reads else None)

    @staticmethod
    def _fail(batch: list[_Request], exc: BaseException) -> None:
        for request in batch:
            if not request.future.done():
                request.future.set_exception(exc)


def _parsed(reply: Any) -> Snapshot | BaseException:
    try:
        return parse_snapshot(reply)
    except Exception as exc:  # a reply of the wrong shape: an error for each reader
        return exc


def _consume(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        with contextlib.suppress(Exception):
            future.exception()
