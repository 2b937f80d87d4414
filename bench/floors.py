"""The raw floors stepbarrier's figures are measured against, in one place.

A floor is the least a correct waiter (or chief) must do with redis-py alone,
without stepbarrier's protocol (no registry, no generations, no heartbeat):

* ``RawWaiter`` (beside ``StepWaiter``): a waiter that never misses a step
  must read the stored step after it subscribed, so it reads it (``GET``)
  and, below its target, waits on its subscription, which it keeps from one
  wait to the next (as ``StepWaiter`` keeps its own). Each message is parsed
  as stepbarrier's announcement is (``json.loads``) and its step compared.
* ``SharedFloor`` (beside ``AsyncStepWaiter``): many concurrent waits in one
  process share one subscription; its reader task parses each message once
  and resolves the futures of the waits it reached; the waits that begin
  together share one ``GET``. Not one connection per wait: that is what
  independent waiters cost (``bench.fleet``'s ``floor10k``), not the floor
  of waits that share a process.
* ``raw_write`` (beside ``StepPublisher``): the chief stores its step and
  announces it, ``SET`` + ``PUBLISH`` in one pipeline (one round trip), with
  the same payload as stepbarrier's announcement (``payload``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import redis
import redis.asyncio
from redis.client import PubSub

FLOOR_KEY = "bench:floor:step"
FLOOR_CHANNEL = "bench:floor:steps"


def payload(step: int) -> str:
    """The raw floor's announcement: the JSON stepbarrier's chief sends."""
    return (
        f'{{"step":{step},"generation":1,"beat":{step},"vouch":true,"done":false,'
        f'"pinned":false,"run_id":"","idle":0}}'
    )


def raw_write(client: redis.Redis, step: int) -> None:
    """The floor of the chief's write: ``SET`` + ``PUBLISH`` in one pipeline."""
    pipe = client.pipeline(transaction=False)
    pipe.set(FLOOR_KEY, step)
    pipe.publish(FLOOR_CHANNEL, payload(step))
    pipe.execute()


class RawWaiter:
    """The floor of ``StepWaiter.wait``: ``GET`` the stored step, then wait on a kept
    subscription (``get_message``, ``json.loads``, the step compared).

    Args:
        url: The Redis.
        after_read: Called after each wait's ``GET`` (a benchmark's readiness).
    """

    def __init__(self, url: str, after_read: Callable[[], None] | None = None) -> None:
        self.client = redis.Redis.from_url(url)
        self.pubsub: PubSub = self.client.pubsub(ignore_subscribe_messages=True)
        self.pubsub.subscribe(FLOOR_CHANNEL)
        while not self.pubsub.subscribed:
            self.pubsub.get_message(timeout=1.0)
        self.pubsub.get_message(timeout=0.1)  # the confirmation
        self.after_read = after_read
        self.released_by_read = 0

    def wait(self, target: int) -> int:
        stored = self.client.get(FLOOR_KEY)
        if self.after_read is not None:
            self.after_read()
        if stored is not None and int(stored) >= target:
            self.released_by_read += 1
            return int(stored)
        while True:
            message = self.pubsub.get_message(timeout=60.0)  # no poll while it waits
            if message is not None and message["type"] == "message":
                step = json.loads(message["data"])["step"]
                if step >= target:
                    return int(step)

    def close(self) -> None:
        self.pubsub.close()
        self.client.close()


class SharedFloor:
    """The floor of ``AsyncStepWaiter``: one raw subscription whose reader task parses
    each message once and resolves the futures of the waits it reached; a wait reads
    the stored step through one ``GET`` shared by the waits that begin together.

    Args:
        url: The Redis.
        expected: ``all_waiting`` is set once this many waits are past their read.
    """

    def __init__(self, url: str, expected: int = 0) -> None:
        self.client = redis.asyncio.Redis.from_url(url)
        self.pubsub = self.client.pubsub(ignore_subscribe_messages=True)
        self.waits: dict[int, list[asyncio.Future[int]]] = {}
        self.reading: asyncio.Future[Any] | None = None
        self.reader: asyncio.Task[None] | None = None
        self.expected = expected
        self.waiting = 0
        """Waits past their read of the stored step (reset by the benchmark)."""
        self.all_waiting = asyncio.Event()

    async def start(self) -> None:
        await self.pubsub.subscribe(FLOOR_CHANNEL)
        while not self.pubsub.subscribed:
            await self.pubsub.get_message(timeout=1.0)
        self.reader = asyncio.create_task(self._read())

    def reset(self) -> None:
        """A new round of ``expected`` waits."""
        self.waiting = 0
        self.all_waiting.clear()

    async def _read(self) -> None:
        while True:
            message = await self.pubsub.get_message(timeout=None)
            if message is None or message["type"] != "message":
                continue
            step = json.loads(message["data"])["step"]
            for target in [t for t in self.waits if t <= step]:
                for future in self.waits.pop(target):
                    if not future.done():
                        future.set_result(step)

    async def _stored(self) -> int:
        if self.reading is None:
            self.reading = asyncio.ensure_future(self.client.get(FLOOR_KEY))
        reading = self.reading
        try:
            stored = await asyncio.shield(reading)
        finally:
            if self.reading is reading:
                self.reading = None
        return 0 if stored is None else int(stored)

    async def wait(self, target: int) -> int:
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.waits.setdefault(target, []).append(future)
        stored = await self._stored()
        if stored >= target:
            self.waits[target].remove(future)
            return stored
        self.waiting += 1
        if self.waiting == self.expected:
            self.all_waiting.set()
        return await future

    async def aclose(self) -> None:
        if self.reader is not None:
            self.reader.cancel()
        await self.pubsub.aclose()
        await self.client.aclose()
