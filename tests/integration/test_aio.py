"""AsyncStepWaiter against a real redis-server: StepWaiter's semantics on an event loop."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterable
from typing import Any, TypeVar

import pytest
import redis

from examples.demo.local import free_port
from stepbarrier import (
    BarrierAborted,
    BarrierConfig,
    BarrierTimeout,
    RedisRefused,
    RedisUnavailable,
    StepPublisher,
    read_status,
)
from stepbarrier._inspect.reset import reset_job
from stepbarrier._redis.functions import LIBRARY_NAME
from stepbarrier._worker import aio_subscription
from stepbarrier._worker.aio_subscription import Mailbox, SharedSubscription
from stepbarrier.aio import AsyncStepWaiter

T = TypeVar("T")


def run(coroutine: Coroutine[Any, Any, T]) -> T:
    return asyncio.run(asyncio.wait_for(coroutine, 60))


async def registered(config: BarrierConfig, count: int, timeout: float = 10.0) -> None:
    """Until ``count`` waits are in the job's registry (read as ``status`` reads it)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while len(await asyncio.to_thread(lambda: read_status(config).waiters)) < count:
        if loop.time() > deadline:
            raise AssertionError(f"{count} waits did not register")
        await asyncio.sleep(0.02)


async def published(config: BarrierConfig, *steps: int, done: bool | None = None) -> StepPublisher:
    """A chief that published ``steps`` (and is closed if ``done`` is given)."""
    publisher = StepPublisher(config)
    for step in steps:
        publisher.publish(step)
    assert await asyncio.to_thread(publisher.flush, 5.0)
    if done is not None:
        await asyncio.to_thread(publisher.close, done)
    return publisher


class FakeClock:
    """A monotonic clock that jumps ahead on every reading."""

    def __init__(self, step: float) -> None:
        self.now = 1000.0
        self.step = step

    def __call__(self) -> float:
        self.now += self.step
        return self.now


def test_until_step_zero_or_less_returns_at_once_without_redis(job: str) -> None:
    nowhere = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{free_port()}/0")

    async def scenario() -> tuple[int, int]:
        async with AsyncStepWaiter(nowhere) as waiter:
            return await waiter.wait(0), await waiter.wait(-3)

    assert run(scenario()) == (0, 0)


def test_a_wait_arriving_after_its_step_returns_at_once(config: BarrierConfig) -> None:
    async def scenario() -> int:
        chief = await published(config, 40)
        try:
            async with AsyncStepWaiter(config) as waiter:
                return await waiter.wait(25, timeout=10)
        finally:
            chief.close()

    assert run(scenario()) == 40


def connections_named(client: redis.Redis, name: str) -> int:
    """Connections to Redis whose client name is ``name`` (set through the URL)."""
    return sum(1 for entry in client.client_list() if entry.get("name") == name)


def test_concurrent_waits_share_two_connections_and_none_is_released_early(
    config: BarrierConfig, client: redis.Redis
) -> None:
    named = dataclasses.replace(config, redis_url=f"{config.redis_url}?client_name={config.job}")
    targets = list(range(5, 65, 5)) * 4

    async def scenario() -> tuple[list[tuple[int, int, int]], int, int]:
        async with AsyncStepWaiter(named) as waiter:
            chief_at = {"step": 0}

            async def one(target: int) -> tuple[int, int, int]:
                step = await waiter.wait(target, timeout=30)
                return target, step, chief_at["step"]

            tasks = [asyncio.create_task(one(t)) for t in targets]
            await registered(config, len(targets))
            connections = connections_named(client, config.job)
            with StepPublisher(config) as chief:
                for step in range(1, 71):
                    chief_at["step"] = step
                    chief.publish(step)
                    await asyncio.sleep(0.003)
                results = await asyncio.gather(*tasks)
            return results, connections, waiter.round_trips

    results, connections, round_trips = run(scenario())
    assert connections == 2  # one subscription, one command connection
    assert round_trips < len(targets)  # registrations went in pipelines
    for target, step, chief_step in results:
        assert target <= step <= chief_step


def test_a_cancelled_wait_leaves_no_registry_entry(config: BarrierConfig) -> None:
    async def scenario() -> tuple[int, int]:
        async with AsyncStepWaiter(config) as waiter:
            cancelled = asyncio.create_task(waiter.wait(500))
            timed_out = asyncio.create_task(asyncio.wait_for(waiter.wait(600), 0.5))
            await registered(config, 2)
            cancelled.cancel()
            with pytest.raises(asyncio.CancelledError):
                await cancelled
            with pytest.raises(asyncio.TimeoutError):
                await timed_out
            entries = len(read_status(config).waiters)
            keys = len(redis.Redis.from_url(config.redis_url).keys(config.keys.waiter_pattern))
            return entries, keys

    assert run(scenario()) == (0, 0)


def test_waits_cancelled_while_they_register_leave_no_entry(config: BarrierConfig) -> None:
    def entries() -> int:
        return len(redis.Redis.from_url(config.redis_url).keys(config.keys.waiter_pattern))

    async def scenario() -> tuple[int, int]:
        async with AsyncStepWaiter(config) as waiter:
            anchor = asyncio.create_task(waiter.wait(10_000))  # keeps the subscription open
            await registered(config, 1)
            tasks = [asyncio.create_task(waiter.wait(700 + i)) for i in range(50)]
            for _ in range(3):  # into the registration pipeline, not yet answered
                await asyncio.sleep(0)
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            left_while_anchored = entries()
            anchor.cancel()
            await asyncio.gather(anchor, return_exceptions=True)
        return left_while_anchored, entries()

    assert run(scenario()) == (1, 0)


def test_overall_timeout_with_an_injected_clock(make_config: Callable[..., BarrierConfig]) -> None:
    config = make_config(stall_timeout=1000.0)

    async def scenario() -> BarrierTimeout:
        async with AsyncStepWaiter(config, clock=FakeClock(step=7.0)) as waiter:
            with pytest.raises(BarrierTimeout) as info:
                await waiter.wait(10, timeout=100.0)
            return info.value

    error = run(scenario())
    assert not error.stalled and error.target == 10 and error.job == config.job
    assert "overall timeout" in str(error)


def test_stall_timeout_with_an_injected_clock_and_no_chief(
    make_config: Callable[..., BarrierConfig],
) -> None:
    config = make_config(heartbeat=1.0, stall_timeout=60.0)

    async def scenario() -> BarrierTimeout:
        async with AsyncStepWaiter(config, clock=FakeClock(step=5.0)) as waiter:
            with pytest.raises(BarrierTimeout) as info:
                await waiter.wait(10)
            return info.value

    error = run(scenario())
    assert error.stalled and error.last_step is None


def test_proceed_returns_the_last_step_with_a_warning(
    make_config: Callable[..., BarrierConfig], caplog: pytest.LogCaptureFixture
) -> None:
    config = make_config(on_timeout="proceed")

    async def scenario() -> int:
        chief = await published(config, 4)
        try:
            async with AsyncStepWaiter(config, clock=FakeClock(step=3.0)) as waiter:
                return await waiter.wait(10, timeout=20.0)
        finally:
            chief.close()

    with caplog.at_level(logging.WARNING, logger="stepbarrier"):
        assert run(scenario()) == 4
    assert any("proceeding" in r.getMessage() for r in caplog.records)


def test_the_chief_finishing_short_of_the_step_aborts_every_wait(config: BarrierConfig) -> None:
    async def scenario() -> list[BaseException | int]:
        async with AsyncStepWaiter(config) as waiter:
            tasks = [asyncio.create_task(waiter.wait(t, timeout=20)) for t in (5, 1000, 2000)]
            await registered(config, 3)
            await published(config, 10, done=True)
            return await asyncio.gather(*tasks, return_exceptions=True)

    first, *aborted = run(scenario())
    assert first == 10
    for error in aborted:
        assert isinstance(error, BarrierAborted) and error.reason == "done"
        assert error.last_step == 10


def test_reset_aborts_every_wait(config: BarrierConfig) -> None:
    async def scenario() -> list[BaseException | int]:
        async with AsyncStepWaiter(config) as waiter:
            tasks = [asyncio.create_task(waiter.wait(t, timeout=20)) for t in (50, 60)]
            await registered(config, 2)
            await asyncio.to_thread(reset_job, config)
            return await asyncio.gather(*tasks, return_exceptions=True)

    for error in run(scenario()):
        assert isinstance(error, BarrierAborted) and error.reason == "reset"


def test_another_runs_chief_neither_releases_nor_aborts(
    make_config: Callable[..., BarrierConfig],
) -> None:
    ours = make_config(heartbeat=0.2, run_id="ours")
    theirs = dataclasses.replace(ours, run_id="theirs")

    async def scenario() -> int:
        async with AsyncStepWaiter(ours) as waiter:
            task = asyncio.create_task(waiter.wait(5, timeout=20))
            await registered(ours, 1)
            other = await published(theirs, 50, done=True)
            await asyncio.sleep(0.2)
            assert not task.done()
            other.close()
            chief = await published(ours, 5)
            try:
                return await task
            finally:
                chief.close()

    assert run(scenario()) == 5


def test_a_killed_subscription_is_opened_again_and_loses_no_release(
    config: BarrierConfig, client: redis.Redis
) -> None:
    async def scenario() -> list[int]:
        async with AsyncStepWaiter(config) as waiter:
            tasks = [asyncio.create_task(waiter.wait(t, timeout=20)) for t in (3, 6)]
            await registered(config, 2)
            assert client.client_kill_filter(_type="pubsub", skipme=True) >= 1
            chief = await published(config, 6)
            try:
                return await asyncio.gather(*tasks)
            finally:
                chief.close()

    assert run(scenario()) == [6, 6]


def test_the_eval_scripts_work_as_the_functions_do(
    make_config: Callable[..., BarrierConfig], client: redis.Redis
) -> None:
    config = make_config(heartbeat=0.2, use_eval=True)
    client.script_flush()

    async def scenario() -> int:
        async with AsyncStepWaiter(config) as waiter:
            task = asyncio.create_task(waiter.wait(7, timeout=20))
            await registered(config, 1)
            chief = await published(config, 7)
            try:
                return await task
            finally:
                chief.close()

    assert run(scenario()) == 7


def test_a_missing_functions_library_is_loaded_by_a_user_that_may(
    config: BarrierConfig, client: redis.Redis
) -> None:
    client.function_delete(LIBRARY_NAME)

    async def scenario() -> int:
        chief = await published(config, 9)
        try:
            async with AsyncStepWaiter(config) as waiter:
                return await waiter.wait(9, timeout=10)
        finally:
            chief.close()

    assert run(scenario()) == 9


def test_unreachable_redis_ends_with_redis_unavailable(job: str) -> None:
    config = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{free_port()}/0")

    async def scenario() -> RedisUnavailable:
        async with AsyncStepWaiter(config) as waiter:
            with pytest.raises(RedisUnavailable) as info:
                await waiter.wait(5, timeout=1.0)
            return info.value

    error = run(scenario())
    assert isinstance(error, ConnectionError) and error.job == job


def test_a_wrong_password_is_refused_at_once(make_config: Callable[..., BarrierConfig]) -> None:
    config = make_config(redis_username="nobody", redis_password="wrong")

    async def scenario() -> RedisRefused:
        async with AsyncStepWaiter(config) as waiter:
            with pytest.raises(RedisRefused) as info:
                await waiter.wait(5, timeout=30.0)
            return info.value

    assert run(scenario()).kind == "authentication"


@pytest.mark.parametrize(
    "settings",
    [{"redis_cluster": True}, {"sentinels": (("127.0.0.1", 26379),)}],
    ids=["cluster", "sentinel"],
)
def test_cluster_and_sentinel_clients_are_made_without_io(
    make_config: Callable[..., BarrierConfig], settings: dict[str, Any]
) -> None:
    # the real ones: tests/cluster/test_cluster_aio.py, tests/reliability/test_sentinel_aio.py
    from redis.asyncio.cluster import RedisCluster
    from redis.asyncio.sentinel import SentinelConnectionPool

    from stepbarrier._redis.aio_client import make_async_client

    config = make_config(**settings)
    client = make_async_client(config)  # no server on 26379: nothing is reached yet
    if config.redis_cluster:
        assert isinstance(client, RedisCluster)
    else:
        assert isinstance(client.connection_pool, SentinelConnectionPool)
    AsyncStepWaiter(config)  # no refusal


def test_retries_sleep_through_the_injected_sleep(job: str) -> None:
    config = BarrierConfig(job=job, redis_url=f"redis://127.0.0.1:{free_port()}/0")
    slept: list[float] = []

    async def record(seconds: float) -> None:
        slept.append(seconds)

    sleep: Callable[[float], Awaitable[None]] = record

    async def scenario() -> None:
        async with AsyncStepWaiter(config, clock=FakeClock(step=0.5), sleep=sleep) as waiter:
            with pytest.raises(RedisUnavailable):
                await waiter.wait(5, timeout=5.0)

    run(scenario())
    assert slept and all(s >= 0 for s in slept)


def test_a_silent_subscription_is_replaced_when_reads_see_the_step_move(
    make_config: Callable[..., BarrierConfig], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = make_config(heartbeat=0.2, fallback_interval=0.1)

    def deaf(self: SharedSubscription, raw: Any) -> None:  # a half-open subscription
        return None

    monkeypatch.setattr(SharedSubscription, "_dispatch", deaf)

    async def scenario() -> tuple[int, int]:
        async with AsyncStepWaiter(config) as waiter:
            task = asyncio.create_task(waiter.wait(60, timeout=20))
            await registered(config, 1)
            with StepPublisher(config) as chief:
                for step in range(1, 61):
                    chief.publish(step)
                    await asyncio.sleep(0.02)
                step = await task
            return step, waiter._subscription.number

    step, subscriptions = run(scenario())
    assert step >= 60  # released by a read
    assert subscriptions >= 2  # the reads saw the step move without a message: resubscribed


def test_an_announcement_wakes_only_the_waits_whose_step_it_reached(
    config: BarrierConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    delivered: list[int] = []
    deliver = aio_subscription.deliver

    def counted(mailboxes: Iterable[Mailbox], item: Any) -> None:
        listed = list(mailboxes)
        delivered.extend(mailbox.target for mailbox in listed)
        deliver(listed, item)

    monkeypatch.setattr(aio_subscription, "deliver", counted)

    async def scenario() -> tuple[list[int], list[int]]:
        async with AsyncStepWaiter(config) as waiter:
            tasks = [asyncio.create_task(waiter.wait(t, timeout=20)) for t in range(1, 101)]
            await registered(config, 100)
            with StepPublisher(config) as chief:
                chief.publish(0)  # a new generation: every wait reads it
                assert await asyncio.to_thread(chief.flush, 5.0)
                await asyncio.sleep(0.3)
                delivered.clear()
                chief.publish(10)
                assert await asyncio.to_thread(chief.flush, 5.0)
                released = await asyncio.gather(*tasks[:10])
                await asyncio.sleep(0.3)
                woken = list(delivered)
                chief.publish(100)
                await asyncio.gather(*tasks)
            return released, woken

    released, woken = run(scenario())
    assert released == [10] * 10
    assert sorted(woken) == list(range(1, 11))  # not the 90 waits still below their step


def test_a_new_chief_generation_is_read_once_for_every_wait(config: BarrierConfig) -> None:
    async def scenario() -> tuple[list[int], int]:
        async with AsyncStepWaiter(config) as waiter:
            tasks = [asyncio.create_task(waiter.wait(t, timeout=20)) for t in range(1, 201)]
            await registered(config, 200)
            before = waiter.round_trips
            with StepPublisher(config) as chief:
                chief.publish(100)  # a chief's first write: a generation no wait has read
                released = await asyncio.gather(*tasks[:100])
                round_trips = waiter.round_trips - before
                chief.publish(200)
                await asyncio.gather(*tasks)
            return released, round_trips

    released, round_trips = run(scenario())
    assert released == [100] * 100  # released by that one read (the step came first)
    # one read for the 200 waits, and the released waits' unregistrations (pipelined)
    assert round_trips <= 4, round_trips


def test_reads_made_for_every_wait_do_not_postpone_a_waits_own_registering_read(
    make_config: Callable[..., BarrierConfig],
) -> None:
    """Announcements of alternating generations make the shared subscription read the
    state for every wait; each wait still refreshes its registry entry on its own
    fallback schedule (else the entry expires and ``status`` stops showing it)."""
    import json

    config = make_config(fallback_interval=0.5, stall_timeout=600.0, no_chief_warning=600.0)
    client = redis.Redis.from_url(config.redis_url)

    async def scenario() -> int:
        registering = 0
        async with AsyncStepWaiter(config) as waiter:
            original = waiter._batcher.register_and_read

            def counted(call: Any) -> Any:
                nonlocal registering
                registering += call is not None
                return original(call)

            waiter._batcher.register_and_read = counted  # type: ignore[method-assign]
            task = asyncio.create_task(waiter.wait(100, timeout=30))
            for beat in range(1, 21):  # 4 s of announcements, the generation 1, 2, 1, ...
                announcement = {"step": 1, "generation": 1 + beat % 2, "beat": beat}
                announcement |= {"vouch": True, "done": False, "pinned": False, "run_id": ""}
                client.publish(config.keys.channel, json.dumps(announcement))
                await asyncio.sleep(0.2)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return registering

    registering = run(scenario())
    client.close()
    # one at the start, then one per fallback interval (0.5 s) of the 4 s
    assert registering >= 5, registering
