"""Issue 32, case 9: a wait ends within its limits against a paused (hung) Redis.

A Redis stopped with SIGSTOP accepts connections (the kernel completes the
handshake) and never answers. Before the fix every Redis call of a wait was
bounded only by the client's socket timeout (10 s), the wait's limits were
looked at only between tries, and leaving (``waiter_leave``) made one more
such call: ``wait(timeout=6)`` ended after about 25 s (threaded) and 35 s
(asyncio). Now every blocking call of a wait is bounded by the time left to
its nearest limit, and leaving is best effort with a short bound.

Each test uses a socket timeout of 10 s (``SOCKET_TIMEOUT``, the default, or
given explicitly) and asserts which limit ended the wait; it prints how long
the wait took (the old code overran by 10 to 30 s) but asserts no duration, so
a loaded machine cannot fail it. Two tests check the structure behind it,
whatever the machine's load: every blocking call of a wait
that Redis fails in the middle was given a bound that ends by the wait's limit
(``CALL_FLOOR`` at a passed one). A test pauses its own redis-server and always
lets it go on (SIGCONT) in a ``finally``.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from stepbarrier import (
    Barrier,
    BarrierConfig,
    BarrierTimeout,
    RedisUnavailable,
    StepSource,
    StepWaiter,
    aio,
    read_status,
)
from stepbarrier._redis.client import SOCKET_TIMEOUT
from stepbarrier._worker import aio_subscription
from stepbarrier.aio import AsyncStepWaiter
from tests.redis_harness import RedisServer
from tests.reliability.processes import wait_until

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

MARGIN = 5.0
"""Seconds a wait may end after its limit: the read at the limit, leaving, and
scheduling noise. Half the socket timeout: the old code took 10 s or more."""
LIMIT = 6.0
"""The limit of the waits that Redis fails in the middle (the issue's case)."""
EARLY_LIMIT = 3.0
"""The limit of the waits whose Redis is paused before they begin: the old code
ended them after one socket timeout (10 s), so this limit plus ``MARGIN`` must
stay below that."""


def test_the_margin_is_far_below_the_socket_timeout() -> None:
    # what makes these tests fail without the fix: one blocking call of the old
    # code took the whole socket timeout, longer than any margin allowed here
    assert SOCKET_TIMEOUT >= 10.0
    assert EARLY_LIMIT + MARGIN < SOCKET_TIMEOUT
    assert MARGIN <= SOCKET_TIMEOUT / 2


@contextlib.contextmanager
def paused(server: RedisServer) -> Iterator[None]:
    """Redis stopped (SIGSTOP): it accepts connections and never answers."""
    process = server.process
    assert process is not None
    process.send_signal(signal.SIGSTOP)
    try:
        yield
    finally:
        process.send_signal(signal.SIGCONT)


def config_for(server: RedisServer, job: str, **overrides: Any) -> BarrierConfig:
    settings: dict[str, Any] = {
        "job": job,
        "redis_url": server.url,
        "fallback_interval": 1.0,  # reads during the pause: each one a blocking call
        "stall_timeout": 60.0,
    }
    settings.update(overrides)
    return BarrierConfig(**settings)


class Timed:
    """Runs ``call`` in a thread; keeps its outcome and how long it took."""

    def __init__(self, call: Any) -> None:
        self.outcome: object = None
        self.seconds: float | None = None
        self._call = call
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        started = time.monotonic()
        try:
            self.outcome = self._call()
        except BaseException as exc:
            self.outcome = exc
        self.seconds = time.monotonic() - started

    def join(self, limit: float) -> Timed:
        """Wait for the end, at most long enough to tell the old code from the new."""
        self.thread.join(limit + 4 * SOCKET_TIMEOUT)
        assert not self.thread.is_alive(), "the wait did not end"
        return self


def registered(config: BarrierConfig, count: int = 1) -> None:
    wait_until(lambda: len(read_status(config).waiters) >= count, 20, "the wait registered", 0.02)


class Clock:
    """``time.monotonic`` for one wait, remembering its first reading (when the wait
    began) and its last one (a wait reads its clock right before it bounds a call)."""

    def __init__(self) -> None:
        self.first: float | None = None
        self.last = 0.0

    def __call__(self) -> float:
        now = time.monotonic()
        if self.first is None:
            self.first = now
        self.last = now
        return now


class Bounds:
    """The bound each blocking call of a wait was given, with the wait's clock then."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.given: list[tuple[float | None, float]] = []

    def record(self, seconds: float | None) -> None:
        self.given.append((seconds, self.clock.last))

    def check(self, limit: float) -> None:
        """Every bound ends by the wait's limit (or ``CALL_FLOOR`` after the reading
        it was computed from, at a limit that passed), or is the leaving's own."""
        from stepbarrier._redis.bounded import CALL_FLOOR, LEAVE_WITHIN

        assert self.clock.first is not None
        ends = self.clock.first + limit
        for seconds, at in self.given:
            assert seconds is not None, "a call without a bound of its own"
            allowed = max(CALL_FLOOR, ends - at)
            assert seconds <= allowed + 1e-6 or seconds == LEAVE_WITHIN, (seconds, ends - at)


# -- threaded ---------------------------------------------------------------------------


def limited(server: RedisServer, job: str, limit: str) -> tuple[BarrierConfig, float | None]:
    """A config and a wait's timeout for which ``limit`` is the nearest limit, ``LIMIT``
    seconds after the wait begins."""
    if limit == "deadline":
        return config_for(server, job), LIMIT
    return config_for(server, job, stall_timeout=LIMIT), None  # no overall limit


@pytest.mark.parametrize("limit", ["deadline", "stall"])
def test_a_threaded_wait_ends_within_its_limit_when_redis_pauses_mid_wait(
    server: RedisServer, job: str, limit: str
) -> None:
    config, timeout = limited(server, job, limit)
    with StepWaiter(config, socket_timeout=SOCKET_TIMEOUT) as waiter:
        wait = Timed(lambda: waiter.wait(10, timeout=timeout))
        registered(config)
        with paused(server):
            wait.join(LIMIT)
    assert isinstance(wait.outcome, BarrierTimeout), wait.outcome
    assert wait.outcome.limit == limit
    assert wait.seconds is not None
    print(f"the wait took {wait.seconds:.1f} s")  # measured, not asserted


def test_every_call_of_a_threaded_wait_is_bounded_by_its_limit(
    server: RedisServer, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The structure behind the bound above, whatever the machine's load: each
    blocking call (and its connect) was given at most the time left to the limit."""
    from stepbarrier._redis.bounded import HeldConnection

    config, timeout = limited(server, job, "deadline")
    clock = Clock()
    bounds = Bounds(clock)
    bounded = HeldConnection._ready  # where each call (and its connect) gets its bound

    def recorded(held: HeldConnection, seconds: float | None) -> float | None:
        bounds.record(seconds)
        return bounded(held, seconds)

    monkeypatch.setattr(HeldConnection, "_ready", recorded)
    with StepWaiter(config, socket_timeout=SOCKET_TIMEOUT, clock=clock) as waiter:
        wait = Timed(lambda: waiter.wait(10, timeout=timeout))
        registered(config)
        with paused(server):
            before = len(bounds.given)
            wait.join(LIMIT)
    assert isinstance(wait.outcome, BarrierTimeout), wait.outcome
    assert len(bounds.given) > before, "no call was made while Redis was paused"
    bounds.check(LIMIT)


@pytest.mark.parametrize("waiter_state", ["new", "used"])
def test_a_threaded_wait_begun_against_a_paused_redis_ends_within_its_limit(
    server: RedisServer, job: str, waiter_state: str
) -> None:
    """A new waiter connects to a paused Redis (the connection's handshake hangs);
    a used one has a pooled connection and a kept subscription: both end."""
    config = config_for(server, job)
    with StepWaiter(config) as waiter:
        if waiter_state == "used":
            with pytest.raises(BarrierTimeout):
                waiter.wait(10, timeout=0.5)
        with paused(server):
            wait = Timed(lambda: waiter.wait(10, timeout=EARLY_LIMIT)).join(EARLY_LIMIT)
    # it never read Redis: unreachable, not a chief that went silent
    assert isinstance(wait.outcome, RedisUnavailable), wait.outcome
    assert wait.seconds is not None
    print(f"the wait took {wait.seconds:.1f} s")  # measured, not asserted


def test_a_wait_with_a_source_reads_it_on_time_while_redis_hangs(
    server: RedisServer, job: str
) -> None:
    """TensorFlow's hook waits with a ``StepSource``: a hung Redis's calls are cut
    short, so the source (here it reaches the step after 2 s) releases the wait
    on time, whatever the client's socket timeout."""
    config = config_for(server, job)
    reached_at = time.monotonic() + 2.0

    def read() -> int:
        return 5 if time.monotonic() >= reached_at else 0

    source = StepSource(read=read, name="the counter", interval=0.1)
    with StepWaiter(config, socket_timeout=SOCKET_TIMEOUT) as waiter, paused(server):
        wait = Timed(lambda: waiter.wait(5, timeout=60, source=source)).join(LIMIT)
    assert wait.outcome == 5, wait.outcome
    assert wait.seconds is not None
    print(f"the wait took {wait.seconds:.1f} s")  # measured, not asserted


def test_a_barrier_wait_ends_within_its_limit_when_redis_pauses_mid_wait(
    server: RedisServer, job: str
) -> None:
    """(A short limit: a barrier wait does not unregister, so the old code ended it
    one socket timeout after its first read during the pause, 11 s in.)"""
    config = config_for(server, job, task_id=1)
    admin = server.client()
    try:
        with Barrier(config, "start", parties=3) as barrier:
            wait = Timed(lambda: barrier.arrive(timeout=EARLY_LIMIT))
            key = config.keys.barrier(barrier.member)
            wait_until(lambda: admin.exists(key) == 1, 20, "the arrival", 0.02)
            with paused(server):
                wait.join(EARLY_LIMIT)
    finally:
        admin.close()
    # it arrived before the pause: a timeout naming the missing tasks
    assert isinstance(wait.outcome, BarrierTimeout), wait.outcome
    assert wait.outcome.limit == "deadline"
    assert wait.seconds is not None
    print(f"the wait took {wait.seconds:.1f} s")  # measured, not asserted


def test_a_barrier_arrival_at_a_paused_redis_ends_within_its_limit(
    server: RedisServer, job: str
) -> None:
    config = config_for(server, job, task_id=1)
    with Barrier(config, "start", parties=3) as barrier, paused(server):
        wait = Timed(lambda: barrier.arrive(timeout=EARLY_LIMIT)).join(EARLY_LIMIT)
    assert isinstance(wait.outcome, RedisUnavailable), wait.outcome
    assert wait.seconds is not None
    print(f"the wait took {wait.seconds:.1f} s")  # measured, not asserted


# -- asyncio ----------------------------------------------------------------------------


async def timed(call: Any) -> tuple[object, float]:
    """``await call``: its outcome (the error it raised) and how long it took."""
    loop = asyncio.get_running_loop()
    started = loop.time()
    try:
        outcome: object = await call
    except Exception as exc:
        outcome = exc
    return outcome, loop.time() - started


def run_bounded(limit: float, coroutine: Any) -> Any:
    """Run ``coroutine``, stopped long enough after ``limit`` to tell the old code
    from the new (the old one is then reported by the assertions, not hung)."""
    return asyncio.run(asyncio.wait_for(coroutine, limit + 6 * SOCKET_TIMEOUT))


@pytest.mark.parametrize("limit", ["deadline", "stall"])
def test_an_async_wait_ends_within_its_limit_when_redis_pauses_mid_wait(
    server: RedisServer, job: str, limit: str
) -> None:
    config, timeout = limited(server, job, limit)

    async def scenario() -> tuple[object, float]:
        async with AsyncStepWaiter(config) as waiter:
            wait = asyncio.create_task(timed(waiter.wait(10, timeout=timeout)))
            await asyncio.to_thread(registered, config)
            with paused(server):
                return await wait

    outcome, seconds = run_bounded(LIMIT, scenario())
    assert isinstance(outcome, BarrierTimeout), outcome
    assert outcome.limit == limit
    print(f"the wait took {seconds:.1f} s")  # measured, not asserted


def test_every_call_of_an_async_wait_is_bounded_by_its_limit(
    server: RedisServer, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each await of a wait on Redis (its reads, its subscription, its leaving) was
    given at most the time left to its limit (``LEAVE_WITHIN`` for leaving)."""
    config, timeout = limited(server, job, "deadline")
    clock = Clock()
    bounds = Bounds(clock)
    # where a wait bounds its awaits: its reads (and leaving), its subscription
    for module, name in ((aio, "expiring"), (aio_subscription, "within")):
        bounded = getattr(module, name)

        def recorded(awaited: Any, seconds: float, bounded: Any = bounded) -> Any:
            bounds.record(seconds)
            return bounded(awaited, seconds)

        monkeypatch.setattr(module, name, recorded)

    async def scenario() -> tuple[object, int]:
        async with AsyncStepWaiter(config, clock=clock) as waiter:
            wait = asyncio.create_task(waiter.wait(10, timeout=timeout))
            await asyncio.to_thread(registered, config)
            with paused(server):
                before = len(bounds.given)
                outcome, _seconds = await timed(wait)
                return outcome, before

    outcome, before = run_bounded(LIMIT, scenario())
    assert isinstance(outcome, BarrierTimeout), outcome
    assert len(bounds.given) > before, "no call was made while Redis was paused"
    bounds.check(LIMIT)


@pytest.mark.parametrize("waiter_state", ["new", "used"])
def test_an_async_wait_begun_against_a_paused_redis_ends_within_its_limit(
    server: RedisServer, job: str, waiter_state: str
) -> None:
    config = config_for(server, job)

    async def scenario() -> tuple[object, float]:
        async with AsyncStepWaiter(config) as waiter:
            if waiter_state == "used":
                with pytest.raises(BarrierTimeout):
                    await waiter.wait(10, timeout=0.5)
            with paused(server):
                return await timed(waiter.wait(10, timeout=EARLY_LIMIT))

    outcome, seconds = run_bounded(EARLY_LIMIT, scenario())
    assert isinstance(outcome, RedisUnavailable), outcome
    print(f"the wait took {seconds:.1f} s")  # measured, not asserted


def test_many_async_waits_end_within_their_limits_when_redis_pauses(
    server: RedisServer, job: str
) -> None:
    """Waits with different limits share one command connection and one
    subscription: each ends at its own limit, not at the shared call's."""
    config = config_for(server, job)
    limits = [LIMIT, LIMIT + 2.0, LIMIT + 4.0]

    async def scenario() -> list[tuple[object, float]]:
        async with AsyncStepWaiter(config) as waiter:
            waits = [
                asyncio.create_task(timed(waiter.wait(10 + i, timeout=limit)))
                for i, limit in enumerate(limits)
            ]
            await asyncio.to_thread(registered, config, len(limits))
            with paused(server):
                return list(await asyncio.gather(*waits))

    ended = run_bounded(max(limits), scenario())
    for limit, (outcome, seconds) in zip(limits, ended, strict=True):
        assert isinstance(outcome, BarrierTimeout), outcome
        print(f"limit {limit} s: ended after {seconds:.1f} s")  # measured, not asserted
