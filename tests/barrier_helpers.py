"""Helpers of the named-barrier tests: a task of another id, an arrival waiting in a
thread, and waiting for a condition or for the arrival's subscription."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

from stepbarrier import Barrier, BarrierConfig


def as_task(config: BarrierConfig, task_id: int, **changes: Any) -> BarrierConfig:
    """``config`` for task ``task_id`` (and any other changes)."""
    return dataclasses.replace(config, task_id=task_id, **changes)


def eventually(predicate: Callable[[], bool], timeout: float = 30.0) -> None:
    """Wait until ``predicate()`` holds; fail after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.02)


class Waiting:
    """``Barrier.arrive`` in a thread of its own; keeps its result or its error."""

    def __init__(self, config: BarrierConfig, name: str, parties: int, timeout: float) -> None:
        self.barrier = Barrier(config, name, parties)
        self.result: bool | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(timeout,), daemon=True)
        self.thread.start()

    def _run(self, timeout: float) -> None:
        try:
            self.result = self.barrier.arrive(timeout=timeout)
        except BaseException as exc:
            self.error = exc
        finally:
            self.barrier.close()

    @property
    def waiting(self) -> bool:
        return self.thread.is_alive()

    def join(self, timeout: float = 60.0) -> Waiting:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the arrival did not end"
        return self


def subscribed(client: redis.Redis, channel: str, count: int = 1) -> Callable[[], bool]:
    """A predicate: ``count`` clients subscribe to ``channel``."""

    def check() -> bool:
        [(_name, subscribers)] = client.pubsub_numsub(channel)
        return int(subscribers) >= count

    return check
