"""Fleet scale: 2,000 concurrent async waits in one process, and a job of 10,000 waiters.

Counts, not timings: the number of connections held, the commands each read
sends (from Redis's ``INFO commandstats``), the chief's writes. How fast these
are is measured by ``python -m bench.fleet``.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner

from stepbarrier import BarrierConfig, StepPublisher, read_status
from stepbarrier._chief.publish_call import MAX_TARGETS
from stepbarrier._inspect.registry import MAX_INDEXED
from stepbarrier._inspect.summary import NEAREST, WaiterSummary, read_overview
from stepbarrier._protocol.calls import register_call
from stepbarrier._redis.functions import RedisCode
from stepbarrier._worker.links import REGISTRY_TTL, registry_entry
from stepbarrier.aio import AsyncStepWaiter
from stepbarrier.cli import cli
from tests.redis_harness import RedisServer
from tests.reliability.processes import Fleet, wait_until

pytestmark = pytest.mark.timeout(120)

WAITS = 2_000
FLEET = 10_000
MAX_CONNECTIONS = 8


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    """A redis-server of this module alone: its command counts are ours."""
    with RedisServer(args=["--maxclients", "1000"]) as own:
        yield own


@pytest.fixture
def admin(server: RedisServer) -> Iterator[redis.Redis]:
    client = server.client()
    yield client
    client.close()


def register_fleet(config: BarrierConfig, targets: list[int]) -> None:
    """Register one waiter per target, as waiting workers do (their own registration call)."""
    code = RedisCode(redis.Redis.from_url(config.redis_url), config)
    since = time.time()
    calls = [
        register_call(
            config.keys,
            f"{i}-{i:08x}",
            target,
            registry_entry(config, target, since),
            registry_ttl=REGISTRY_TTL,
            key_ttl=config.key_ttl,
        )
        for i, target in enumerate(targets)
    ]
    for start in range(0, len(calls), 1000):
        code.pipeline(calls[start : start + 1000])


def command_counts(admin: redis.Redis) -> dict[str, int]:
    return {
        name.removeprefix("cmdstat_"): int(stats["calls"])
        for name, stats in admin.info("commandstats").items()
    }


def sent_between(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)}


def test_2000_async_waits_released_by_a_chief_in_another_process_none_early_on_8_connections(
    server: RedisServer, admin: redis.Redis, job: str, tmp_path: Path
) -> None:
    name = f"aio-{job}"[:60]
    config = BarrierConfig(job=job, redis_url=f"{server.url}?client_name={name}", task_id=1)
    targets = [1 + i % 100 for i in range(WAITS)]
    fleet = Fleet(
        tmp_path,
        {
            "STEPBARRIER_JOB": job,
            "STEPBARRIER_REDIS_URL": server.url,
            "STEPBARRIER_HEARTBEAT": "0.2",
        },
    )

    def held() -> int:
        return sum(1 for entry in admin.client_list() if entry.get("name") == name)

    async def scenario() -> tuple[list[tuple[int, int, float]], list[int], dict[int, float]]:
        peaks: list[int] = []
        async with AsyncStepWaiter(config) as waiter:

            async def one(target: int) -> tuple[int, int, float]:
                step = await waiter.wait(target, timeout=60)
                return target, step, time.time()

            tasks = [asyncio.create_task(one(t)) for t in targets]
            await asyncio.to_thread(
                wait_until,
                lambda: admin.zcard(config.keys.targets) >= WAITS,
                30.0,
                f"{WAITS} waits registered",
            )
            peaks.append(held())
            chief = fleet.chief()
            await asyncio.to_thread(chief.wait_ready)
            chief.start_training(100, step_seconds=0.005)
            while not all(task.done() for task in tasks):
                peaks.append(await asyncio.to_thread(held))
                await asyncio.sleep(0.05)
            results = await asyncio.gather(*tasks)
        return results, peaks, {t: chief.reached(t) for t in set(targets)}

    try:
        results, peaks, reached = asyncio.run(asyncio.wait_for(scenario(), 90))
    finally:
        fleet.stop_all()
    assert len(results) == WAITS
    for target, step, released_at in results:
        assert step >= target
        assert released_at >= reached[target], f"released before the chief reached {target}"
    assert 0 < max(peaks) <= MAX_CONNECTIONS, peaks
    assert admin.zcard(config.keys.targets) == 0


def test_status_of_10000_waiters_reads_the_index_without_scan_in_bounded_commands(
    server: RedisServer, admin: redis.Redis, job: str
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url)
    register_fleet(config, [100 + i for i in range(FLEET)])
    before = command_counts(admin)
    status = read_status(config)
    full = sent_between(before, command_counts(admin))
    before = command_counts(admin)
    overview, summary = read_overview(config)
    summarised = sent_between(before, command_counts(admin))

    assert len(status.waiters) == FLEET
    assert summary is not None and summary.waiting == FLEET and overview.waiters == ()
    for sent in (full, summarised):
        assert "scan" not in sent and "keys" not in sent, sent
    # per listed waiter: HLEN and the HSTRLEN of its five fields (an entry a worker
    # inflated is reported, never read), then one HMGET; all pipelined
    assert sum(full.values()) <= 7 * MAX_INDEXED + 50, full
    assert "hgetall" not in full, full
    assert summarised.get("hgetall", 0) <= 5, summarised  # the state's, not one per waiter
    assert sum(summarised.values()) <= 40, summarised  # the same few, whatever the count


def test_watch_summarises_10000_waiters_in_a_few_commands(
    server: RedisServer, admin: redis.Redis, job: str
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url)
    targets = [1000 + (i * 37) % 5000 for i in range(FLEET)]
    register_fleet(config, targets)
    with StepPublisher(config) as chief:  # a finished job: watch --until-done reads it once
        chief.publish(900)
    before = command_counts(admin)
    env = {"STEPBARRIER_REDIS_URL": server.url, "STEPBARRIER_JOB": job}
    result = CliRunner().invoke(cli, ["watch", "--until-done", "--interval", "0.05"], env=env)
    sent = sent_between(before, command_counts(admin))

    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert len(lines) < 60, result.output
    assert "10,000 worker(s)" in result.output
    assert "nearest targets" in result.output and "1000/1000" not in result.output
    assert sum(1 for line in lines if "900/100" in line) == NEAREST  # the lowest, with progress
    assert "scan" not in sent and "keys" not in sent, sent
    assert sent.get("hgetall", 0) <= 5, sent  # the state's (in-script), not one per waiter
    assert sum(sent.values()) <= 40, sent


def test_a_summary_counts_every_waiter_once() -> None:
    targets = [5, 5, 7, 9, 100, 250, 250, 999, 1000, 1000, 1000, 40_000]
    summary = WaiterSummary.of(targets, step=7)
    assert summary.waiting == len(targets) and summary.reached == 3
    assert summary.nearest[:3] == ((5, 2), (7, 1), (9, 1))
    assert sum(n for _, _, n in summary.histogram) == len(targets)
    assert summary.histogram[0][0] == 5 and summary.histogram[-1][1] == 40_000
    assert WaiterSummary.of([], step=None).histogram == ()


def test_the_chiefs_writes_stay_bounded_with_10000_distinct_targets(
    server: RedisServer, job: str
) -> None:
    config = BarrierConfig(job=job, redis_url=server.url, heartbeat=0.2)
    register_fleet(config, [1001 + i for i in range(FLEET)])  # 10,000 distinct targets
    crossed = 50
    publisher = StepPublisher(config)
    started = time.monotonic()
    try:
        for step in range(0, 1001, 10):  # below every target: heartbeats only
            publisher.publish(step)
            time.sleep(0.005)
        assert publisher.flush(5.0)
        below = publisher.writes
        for step in range(1001, 1001 + crossed):  # each step crosses one threshold
            publisher.publish(step)
            time.sleep(0.002)
        assert publisher.flush(5.0)
        pending = len(publisher._state.pending)
    finally:
        publisher.close(done=False)
    elapsed = time.monotonic() - started
    beats = math.ceil(elapsed / config.heartbeat) + 1
    assert below <= 1 + beats, below  # 10,000 registrations heard: no write of their own
    assert publisher.writes <= 1 + beats + crossed + 1, (publisher.writes, beats)
    assert pending <= MAX_TARGETS  # each write's reply stays bounded too
    remaining = redis.Redis.from_url(config.redis_url).zcard(config.keys.targets)
    assert remaining == FLEET - crossed
