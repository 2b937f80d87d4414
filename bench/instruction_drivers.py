"""The processes ``bench.instructions`` runs under Callgrind, and what they measure.

Each driver marks its regions with ``bench.callgrind.Marks`` and talks to its
parent (``bench.instructions``, not under Valgrind, which plays the chief or
the raw publisher) over its stdin and stdout, one line at a time, always
outside the regions:

* ``sync``: ``StepWaiter.wait`` and its floor, in alternating blocks of one
  process. The floor is a raw waiter that is correct without stepbarrier's
  protocol: it reads the stored step (``GET``) and, below its target, waits
  on a subscription it keeps from one wait to the next (redis-py's
  ``get_message``, the announcement parsed as ``json`` and its step compared).
  Per wait it prints ``<side> <target>`` and the parent publishes the step
  once the waiter waits for it. Regions: the whole call, and the wake (from
  the subscription's socket turning readable to the return).
* ``async``: ``AsyncStepWaiter`` with 1, 64 or 1,024 concurrent waits, and
  its floor: one shared raw ``redis.asyncio`` subscription whose reader task
  parses each message once and resolves the futures of the waits it reached.
  Region: one release, from the first readiness of a socket after the
  announcement was sent to the return of the last wait.
* ``chief``: ``StepPublisher.publish`` with its writer thread's write (the
  region ends when ``flush`` returns: the write stored), and its floor, a raw
  ``SET`` + ``PUBLISH`` pipeline.
* ``follow``: as ``sync``, with ``StepWaiter.follow(every=1)`` beside
  ``StepWaiter.wait`` (issue 38): each yielded step is one region, from the
  subscription's socket turning readable to the yield.
* ``progress``: ``ProgressReporter.report(step)`` beside ``StepPublisher.publish``
  (no waiter: no threshold crossed, so neither writes) and an empty function,
  ``PROGRESS_CALLS`` calls a region; every thread counts, so a region a
  background write fell into is an outlier the median leaves out.

Where a socket turns readable: every wait here blocks in redis-py's hiredis
parser, in ``redis._parsers.hiredis._socket_can_read`` (a ``poll``), on both
sides (``StepWaiter``'s subscription reads through redis-py's connection as
the raw floor's ``get_message`` does). ``WakeProbe`` wraps that function:
when it returns True for a wait with a timeout, it dumps (``wake``), so the
next region starts with the readable socket. The asyncio drivers wrap their
event loop's selector instead (``MarkedSelector``).

Usage: internal (``python -m bench.instruction_drivers ROLE ...``).
"""

from __future__ import annotations

import asyncio
import os
import selectors
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import redis
import redis.asyncio
from redis._parsers import hiredis as hiredis_parser

from bench.callgrind import Marks
from bench.floors import RawWaiter, SharedFloor, raw_write

PROGRESS_CALLS = 1_000
"""Calls per region of the ``progress`` driver."""
CALIBRATIONS = 40
"""Empty regions (two dumps back to back) measured by each driver."""
QUIET = 0.3
"""Seconds without a readable socket before an asyncio round's step is sent."""


def say(line: str) -> None:
    """One line to the parent (outside every region)."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def hear() -> str:
    """One line from the parent."""
    return sys.stdin.readline().strip()


def calibrate(marks: Marks) -> None:
    """Empty regions: what a dump costs the region it ends (``calibration`` dumps)."""
    for _ in range(CALIBRATIONS):
        marks.dump("gap")
        marks.dump("calibration")


def require_hiredis() -> None:
    from redis.utils import HIREDIS_AVAILABLE

    if not HIREDIS_AVAILABLE:
        raise SystemExit(
            "hiredis is not installed: both sides are measured with it (pip install hiredis)"
        )


# -- threads: StepWaiter and its floor -----------------------------------------------


class WakeProbe:
    """Dumps (``wake``) when a waiting read's socket turns readable, while armed."""

    def __init__(self, marks: Marks) -> None:
        self.marks = marks
        self.armed = False
        self._original: Callable[[Any, float], bool] = hiredis_parser._socket_can_read
        block = marks.block("wake")
        request = marks.request
        original = self._original

        def can_read(sock: Any, timeout: float) -> bool:
            readable = original(sock, timeout)
            if readable and self.armed and timeout:
                request(block, 0)
            return readable

        hiredis_parser._socket_can_read = can_read


def sync_driver(
    url: str, job: str, count: int, blocks: int, warmup: int, follow: bool = False
) -> None:
    """``blocks`` x (floor, stepbarrier) of ``warmup + count`` waits each; dumps:
    ``gap`` (before a wait), ``wake`` (its socket readable), ``<side>`` or ``warmup``
    (its return). ``follow``: the sides are (stepbarrier, follow), a ``follow(every=1)``
    begun afresh each block (its first multiple the block's first target)."""
    from stepbarrier import BarrierConfig, Crossed, StepWaiter

    require_hiredis()
    marks = Marks()
    probe = WakeProbe(marks)
    config = BarrierConfig(job=job, redis_url=url, task_id=1, stall_timeout=600)
    waiter = StepWaiter(config)
    floor = RawWaiter(url)
    calibrate(marks)
    target = 0
    following: list[Iterator[Crossed]] = []

    def follow_next(step: int) -> int:
        if not following:
            following.append(waiter.follow(every=1, start=step, timeout=600))
        return next(following[0]).step

    sides: tuple[tuple[str, Callable[[int], int]], ...] = (
        ("floor", floor.wait),
        ("stepbarrier", lambda t: waiter.wait(t, timeout=600)),
    )
    if follow:
        sides = (sides[1], ("follow", follow_next))
    for _ in range(blocks):
        following.clear()  # (a follower left behind by the other side's steps)
        for side, wait in sides:
            for i in range(warmup + count):
                target += 1
                say(f"{side} {target}")
                marks.dump("gap")
                probe.armed = True
                step = wait(target)
                probe.armed = False
                marks.dump(side if i >= warmup else "warmup")
                if step < target:
                    raise RuntimeError(f"{side}: released at {step} < {target}")
    waiter.close()
    say("done")


# -- asyncio: AsyncStepWaiter and its floor ------------------------------------------


class MarkedSelector(selectors.DefaultSelector):
    """The event loop's selector: dumps (``wake``) whenever a select returns events, while
    armed, and records when (``time.monotonic()``, the same clock in every process)."""

    marks: Marks
    armed = False
    wakes: list[float]
    last_events = 0.0
    """When a select last returned events (armed or not)."""

    def select(self, timeout: float | None = None) -> list[Any]:
        events: list[Any] = super().select(timeout)
        if events:
            if self.armed:  # (a select that does not block, too: the loop was busy)
                self.marks.dump("wake")
                self.wakes.append(time.monotonic())
            else:
                self.last_events = time.monotonic()
        return events


def async_driver(url: str, job: str, waits: int, rounds: int, blocks: int, warmup: int) -> None:
    """``blocks`` x (floor, stepbarrier) of ``warmup + rounds`` releases of ``waits``
    concurrent waits. Per round: ``<side> <target>`` once every wait is registered
    (the parent sends the step and answers with when it did); dumps ``gap``, then
    ``wake`` at every readiness, then ``<side>`` or ``warmup`` once all returned."""
    from stepbarrier import BarrierConfig
    from stepbarrier.aio import AsyncStepWaiter

    require_hiredis()
    marks = Marks()
    selector = MarkedSelector()
    selector.marks, selector.wakes = marks, []
    loop = asyncio.SelectorEventLoop(selector)
    asyncio.set_event_loop(loop)
    config = BarrierConfig(job=job, redis_url=url, task_id=1, stall_timeout=600)
    admin = redis.asyncio.Redis.from_url(url)

    async def registered(side: str, target: int, tasks: list[asyncio.Task[int]]) -> None:
        """Until every wait of the round waits (Redis's index, or the floor's futures)
        and no socket was readable for ``QUIET`` seconds (every reply taken in)."""
        while True:
            await asyncio.sleep(0.05)
            if any(task.done() for task in tasks):
                raise RuntimeError(f"{side}: a wait ended before its step was sent")
            if side == "floor":
                ready = floor.all_waiting.is_set()
            else:
                ready = await admin.zcount(config.keys.targets, target, target) >= waits
            if ready:
                break
        while time.monotonic() - selector.last_events < QUIET:
            await asyncio.sleep(0.05)

    async def main() -> None:
        await floor.start()
        calibrate(marks)
        target = 0
        async with AsyncStepWaiter(config) as waiter:
            sides: tuple[tuple[str, Callable[[int], Any]], ...] = (
                ("floor", floor.wait),
                ("stepbarrier", lambda t: waiter.wait(t, timeout=600)),
            )
            for _ in range(blocks):
                for side, wait in sides:
                    for i in range(warmup + rounds):
                        target += 1
                        floor.reset()
                        tasks = [asyncio.create_task(wait(target)) for _ in range(waits)]
                        await registered(side, target, tasks)
                        selector.wakes = []
                        say(f"{side} {target}")
                        marks.dump("gap")
                        selector.armed = True
                        steps = await asyncio.gather(*tasks)
                        selector.armed = False
                        marks.dump(side if i >= warmup else "warmup")
                        sent = float(hear())
                        say("wakes " + " ".join(f"{w - sent:.6f}" for w in selector.wakes))
                        if min(steps) < target:
                            raise RuntimeError(f"{side}: released at {min(steps)} < {target}")
        await floor.aclose()
        await admin.aclose()

    floor = SharedFloor(url, expected=waits)
    loop.run_until_complete(main())
    say("done")


# -- reporting progress ----------------------------------------------------------------


def progress_driver(url: str, job: str, blocks: int) -> None:
    """``blocks`` x (empty, publish, report) regions of ``PROGRESS_CALLS`` calls each,
    rising steps; dumps ``<side>`` at each region's end (``gap`` before it)."""
    from stepbarrier import BarrierConfig, ProgressReporter, StepPublisher

    marks = Marks()
    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0, stall_timeout=600)
    calibrate(marks)

    def nothing(step: int) -> None:
        pass

    with StepPublisher(config) as publisher, ProgressReporter(config) as progress:
        sides = (("empty", nothing), ("publish", publisher.publish), ("report", progress.report))
        first = 1
        for _ in range(blocks):
            for side, call in sides:
                marks.dump("gap")
                for step in range(first, first + PROGRESS_CALLS):
                    call(step)
                marks.dump(side)
                first += PROGRESS_CALLS
        say("done")


# -- the chief -------------------------------------------------------------------------


def chief_driver(url: str, job: str, count: int, blocks: int, warmup: int) -> None:
    """``blocks`` x (floor, stepbarrier) of ``warmup + count`` writes; dumps ``gap``,
    then ``<side>`` or ``warmup`` once the write is stored. A stepbarrier step goes
    out once the parent's waiter registered for it (``want <step>``); after each
    write, ``wrote <side> <writes of the chief in the region>``: a heartbeat that
    fell into the region shows as one more."""
    from stepbarrier import BarrierConfig, StepPublisher

    require_hiredis()
    marks = Marks()
    client = redis.Redis.from_url(url)
    config = BarrierConfig(job=job, redis_url=url, role="chief", task_id=0, stall_timeout=600)
    calibrate(marks)
    step = 0
    with StepPublisher(config) as publisher:
        publisher.publish(0)
        publisher.flush(60)
        for _ in range(blocks):
            for i in range(warmup + count):  # the floor: the caller's thread writes
                step += 1
                writes = publisher.writes
                marks.dump("gap")
                raw_write(client, step)
                marks.dump("floor" if i >= warmup else "warmup")
                say(f"wrote floor {publisher.writes - writes}")
            for i in range(warmup + count):
                step += 1
                say(f"want {step}")
                deadline = time.monotonic() + 120
                while publisher.next_threshold != step:  # the parent's waiter registered
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"no waiter registered for step {step}")
                    time.sleep(0.005)
                time.sleep(0.1)  # the registration's notice taken in
                writes = publisher.writes
                marks.dump("gap")
                publisher.publish(step)
                stored = publisher.flush(60)
                marks.dump("stepbarrier" if i >= warmup else "warmup")
                say(f"wrote stepbarrier {publisher.writes - writes}")
                if not stored:
                    raise RuntimeError(f"step {step} was not stored")
    say("done")


def main() -> None:
    role, url, job, *rest = sys.argv[1:]
    numbers = [int(value) for value in rest]
    if role in ("sync", "follow"):
        count, blocks, warmup = numbers
        sync_driver(url, job, count, blocks, warmup, follow=role == "follow")
    elif role == "progress":
        progress_driver(url, job, *numbers)
    elif role == "async":
        async_driver(url, job, *numbers)
    elif role == "chief":
        chief_driver(url, job, *numbers)
    else:
        raise SystemExit(f"unknown role {role}")
    sys.stdout.flush()
    os._exit(0)  # no teardown to count (the exit's dump is not read)


if __name__ == "__main__":
    main()
