"""Fleet scale: thousands of waiters on one Redis.

Parts (``--only`` picks some):

- ``independent``: 1,024 ``StepWaiter`` threads (32 processes of 32), each
  with its own connections, released by one ``publish``; next to the raw
  floor in the same layout (``bench.floors.RawWaiter``: each thread reads the
  stored step with ``GET``, then waits on a subscription it keeps; the
  chief's floor writes with ``SET`` + ``PUBLISH``), in alternating phases of
  the same run. Time from just before ``publish``/``PUBLISH`` to the last
  (and the median) waiter's return. ``--profile`` splits each waiter's wake
  path at the arrival of the announcement.
- ``independent-16x64``: the same 1,024 waiters as 16 processes of 64 threads
  (more threads share one interpreter lock), against the floor in that layout.
- ``independent-4x16``: 64 waiters (4 processes of 16), for Redis's CPU per
  waiter per step at 64 waiters.
- ``async``: 10,000 concurrent ``AsyncStepWaiter.wait`` calls (4 processes of
  2,500, one waiter each) released by one ``publish``.
- ``async-floor``: its floor, 10,000 concurrent waits as 4 processes of 2,500
  on one shared raw subscription each (``bench.floors.SharedFloor``).
- ``floor10k``: 10,000 raw waiters each with its own connection (asyncio, 4
  processes of 2,500): what one announcement to 10,000 independent waiters
  costs Redis; not the floor of waits that share a process.
- ``distinct``: 10,000 async waits for 10,000 distinct steps; the chief runs
  through them at ``RATE`` steps/s; its writes are counted (one per
  heartbeat plus one per crossed threshold at most) and every release is
  checked against the moment the chief handed over its step. Before, the
  reads of ``status``, ``status --json`` and ``watch`` are timed, and their
  commands counted, over a job of 10,000 registered waiters (registered with
  the waiters' own call; none live, so that no waiter's traffic is counted).

Each part but ``distinct`` reports, per release, Redis's CPU (``INFO cpu``) and
the waiter processes' (every thread's ``/proc/PID/task/TID/schedstat``, in
nanoseconds), and Redis's memory and connections per waiting worker. A
release's CPU window runs from just before ``publish``/``PUBLISH`` until
every waiter is ready for the next trial (stepbarrier's: its next wait
registered in Redis's index; the floor's: its next ``GET`` answered), so the
next wait's registration is in every figure (the waiters rest ``QUIET``
seconds after each wake, their training step, before they wait again). From
Redis's CPU, what its own timers cost in as long is subtracted (measured
while the floor's waiters wait, which costs Redis nothing else); windows a
chief heartbeat fell into have what a heartbeat costs Redis subtracted
(``cycles``). What a second of waiting costs (every waiter waiting:
stepbarrier's read the state and take the heartbeats) is reported apart.

Usage: ``python -m bench.fleet [--quick] [--only PART ...] [--no-profile]``;
``--only`` replaces those parts in the saved results and keeps the others.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from bench.floors import FLOOR_CHANNEL, FLOOR_KEY, RawWaiter, SharedFloor, raw_write
from bench.harness import (
    RESULTS_DIR,
    ROOT,
    RedisServer,
    child_env,
    child_process,
    git,
    load_average,
    ms,
    run_threads,
    save,
    stop_process,
    summarize,
)

STEP_GAP = 10
"""Steps between two trials' targets."""
QUIET = 0.5
"""Seconds a waiter rests after it woke before it waits again (its training step:
the others may still be waking, and registering at once would take their CPU).
Under a second, so that a release's CPU window (until the next registrations)
mostly ends before the chief's next heartbeat (1 s after its write)."""
SETTLE = 3.0
"""Seconds between the first registrations of a phase and its idle measurement."""
IDLE = 2.0
"""Seconds of the waiting measurement at the start of each phase: what every
process costs while all its waiters wait (a floor's: Redis's timers alone)."""
SETTLE_AFTER = 0.05
"""Seconds a CPU window goes on after the last registration was seen (its reply
taken in)."""
RATE = 2000
"""Steps per second of the chief in the ``distinct`` part."""
PARTS = (
    "independent", "independent-16x64", "independent-4x16", "async", "async-floor", "floor10k",
    "distinct",
)  # fmt: skip
LAYOUTS = {"independent": (32, 32), "independent-16x64": (16, 64), "independent-4x16": (4, 16)}
"""Processes x threads of each ``independent`` part (``--quick``: a quarter of the
processes, half the threads)."""
LAYOUT_QUIET = {"independent-4x16": 0.3}
"""A shorter rest where the part is there for Redis's CPU (64 waiters wake in a few
ms): the shorter the window, the less of Redis's idle cost is subtracted from it."""


# -- helper processes ---------------------------------------------------------------
#
# Every helper waits for ``trials + 1`` steps (the last one's registration closes
# the last measured window), rests ``QUIET`` seconds after each wake, and prints
# its wake times as one JSON line at the end. The floors' helpers also print
# ``ready <trial>`` once each of their waits read the stored step for that trial
# (stepbarrier's registrations are seen in Redis's index instead).


def _target(trial: int) -> int:
    return (trial + 1) * STEP_GAP


class _Ready:
    """Prints ``ready <trial>`` once ``count`` waits of this process are past their read."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._seen: dict[int, int] = {}
        self._lock = threading.Lock()

    def note(self, trial: int) -> None:
        with self._lock:
            seen = self._seen[trial] = self._seen.get(trial, 0) + 1
            if seen == self._count:
                sys.stdout.write(f"ready {trial}\n")
                sys.stdout.flush()


def sync_role(url: str, job: str, threads: int, trials: int, quiet: float, profile: bool) -> None:
    from stepbarrier import BarrierConfig, StepWaiter
    from stepbarrier._redis.subscription import Subscription

    arrived = threading.local()
    if profile:  # when the announcement reached the waiter's thread
        original = Subscription.get_message

        def timed(self: Subscription, timeout: float) -> Any:
            message = original(self, timeout)
            if message is not None:
                arrived.t = time.time()
            return message

        Subscription.get_message = timed  # type: ignore[method-assign]
    config = BarrierConfig(job=job, redis_url=url, task_id=1, stall_timeout=300)
    woke = [[0.0] * trials for _ in range(threads)]
    came = [[0.0] * trials for _ in range(threads)]
    by_read = [0]
    errors: list[str] = []

    def run(index: int) -> None:
        try:
            with StepWaiter(config) as waiter:
                for trial in range(trials + 1):
                    waiter.wait(_target(trial), timeout=300)
                    if trial == trials:
                        break
                    woke[index][trial] = time.time()
                    came[index][trial] = getattr(arrived, "t", 0.0)
                    if waiter.last_released_by != "an announcement":
                        by_read[0] += 1
                    time.sleep(quiet)
        except Exception as exc:
            errors.append(repr(exc))

    run_threads(threads, run)
    print(
        json.dumps(
            {
                "woke": woke,
                "arrived": came if profile else None,
                "released_by_read": by_read[0],
                "errors": errors,
            }
        )
    )


def floor_role(url: str, threads: int, trials: int, quiet: float) -> None:
    """The floor of ``sync_role``: ``threads`` ``bench.floors.RawWaiter`` s."""
    received = [[0.0] * trials for _ in range(threads)]
    by_read = [0]
    errors: list[str] = []
    ready = _Ready(threads)

    def run(index: int) -> None:
        try:
            trial = 0
            waiter = RawWaiter(url, after_read=lambda: ready.note(trial))
            for trial in range(trials + 1):
                waiter.wait(_target(trial))
                if trial == trials:
                    break
                received[index][trial] = time.time()
                time.sleep(quiet)
            by_read[0] += waiter.released_by_read
            waiter.close()
        except Exception as exc:
            errors.append(repr(exc))

    run_threads(threads, run)
    print(json.dumps({"woke": received, "released_by_read": by_read[0], "errors": errors}))


def floor_connections_role(url: str, connections: int, trials: int, quiet: float) -> None:
    """``connections`` asyncio waits in one process, each with its own connection and
    subscription (each reads the stored step, then waits on its subscription):
    what independent waiters cost, not the floor of waits that share a process."""
    import redis.asyncio

    ready = _Ready(connections)

    async def one(
        index: int, out: list[list[float]], connecting: asyncio.Semaphore, reads: Any
    ) -> None:
        client = redis.asyncio.Redis.from_url(url, socket_connect_timeout=60)
        pubsub = client.pubsub(ignore_subscribe_messages=True)
        async with connecting:  # thousands of connects at once overflow the listen backlog
            await pubsub.subscribe(FLOOR_CHANNEL)
        for trial in range(trials + 1):
            target = _target(trial)
            stored = await reads.get(FLOOR_KEY)
            ready.note(trial)
            step = 0 if stored is None else int(stored)
            while step < target:
                message = await pubsub.get_message(timeout=600)
                if message is not None and message["type"] == "message":
                    step = json.loads(message["data"])["step"]
            if trial == trials:
                break
            out[index][trial] = time.time()
            await asyncio.sleep(quiet)
        await pubsub.aclose()
        await client.aclose()

    async def main() -> list[list[float]]:
        out = [[0.0] * trials for _ in range(connections)]
        connecting = asyncio.Semaphore(100)
        # the reads share a few connections (a connection each would pass maxclients)
        pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=32, timeout=600)
        reads = redis.asyncio.Redis(connection_pool=pool)
        await asyncio.gather(*(one(i, out, connecting, reads) for i in range(connections)))
        await reads.aclose()
        return out

    print(json.dumps({"woke": asyncio.run(main()), "errors": []}))


def floor_shared_role(url: str, waits: int, trials: int, quiet: float) -> None:
    """The floor of ``aio_role``: ``waits`` concurrent waits on one ``bench.floors.SharedFloor``."""

    async def main() -> dict[str, Any]:
        floor = SharedFloor(url, expected=waits)
        await floor.start()
        by_trial: list[list[float]] = []

        async def one(target: int) -> float:
            await floor.wait(target)
            return time.time()

        for trial in range(trials + 1):
            floor.reset()
            round_ = asyncio.gather(*(one(_target(trial)) for _ in range(waits)))
            await floor.all_waiting.wait()
            sys.stdout.write(f"ready {trial}\n")
            sys.stdout.flush()
            woke = await round_
            if trial == trials:
                break
            by_trial.append(woke)
            await asyncio.sleep(quiet)
        await floor.aclose()
        return {"woke": [list(w) for w in zip(*by_trial, strict=True)], "errors": []}

    print(json.dumps(asyncio.run(main())))


def aio_role(
    url: str, job: str, waits: int, trials: int, first: int, stride: int, quiet: float
) -> None:
    """``trials`` rounds (and one more) of ``waits`` concurrent waits for one step each;
    or, with ``trials`` 0, one round of ``waits`` waits for the steps first,
    first+stride, ..."""
    from stepbarrier import BarrierConfig
    from stepbarrier.aio import AsyncStepWaiter

    config = BarrierConfig(job=job, redis_url=url, task_id=1, stall_timeout=300)

    async def main() -> dict[str, Any]:
        errors: list[str] = []

        async def one(target: int) -> tuple[int, int, float]:
            try:
                step = await waiter.wait(target, timeout=300)
            except Exception as exc:
                errors.append(repr(exc))
                return target, -1, time.time()
            return target, step, time.time()

        async with AsyncStepWaiter(config) as waiter:
            if trials == 0:
                targets = [first + i * stride for i in range(waits)]
                return {"released": await asyncio.gather(*map(one, targets)), "errors": errors}
            by_trial: list[list[float]] = []
            for trial in range(trials + 1):
                results = await asyncio.gather(*(one(_target(trial)) for _ in range(waits)))
                if trial == trials:
                    break
                by_trial.append([when for _, _, when in results])
                await asyncio.sleep(quiet)
            woke = [list(per_wait) for per_wait in zip(*by_trial, strict=True)]
            return {"woke": woke, "errors": errors, "round_trips": waiter.round_trips}

    print(json.dumps(asyncio.run(main())))


# -- measurements -------------------------------------------------------------------


def process_cpu(pids: list[int]) -> float:
    """CPU seconds of every thread of ``pids`` (``/proc/PID/task/TID/schedstat``: the
    scheduler's nanoseconds, not the 10 ms ticks of ``/proc/PID/stat``)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, IndexError, ValueError):
                total += int(task.read_text().split()[0])
    return total / 1e9


def redis_cpu(client: redis.Redis) -> float:
    info = client.info("cpu")
    return float(info["used_cpu_sys"] + info["used_cpu_user"])


def redis_footprint(client: redis.Redis) -> dict[str, int]:
    memory, clients = client.info("memory"), client.info("clients")
    return {"used_memory": memory["used_memory"], "clients": clients["connected_clients"]}


def fresh(client: redis.Redis) -> None:
    """Empty the server before a phase: keys an earlier phase left (registry entries
    with a TTL) would expire during this one, on Redis's CPU."""
    client.flushall()
    time.sleep(0.5)


def wait_until(
    check: Callable[..., object],
    timeout: float,
    what: str,
    explain: Callable[[], str] | None = None,
) -> None:
    """Wait for ``check``; a timeout says ``what``, and ``explain()`` if given (why)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            state = f" ({explain()})" if explain is not None else ""
            raise RuntimeError(f"timed out: {what}{state}")
        time.sleep(0.01)


class Helpers:
    """The helper processes of one phase: their ``ready <trial>`` lines as they come,
    then the JSON line each prints at its end."""

    def __init__(self, roles: list[list[str]]) -> None:
        self.processes = [child_process("bench.fleet", "--role", *role) for role in roles]
        self._lock = threading.Lock()
        self._ready: dict[int, int] = {}
        self._outputs: list[dict[str, Any] | None] = [None] * len(self.processes)
        self._readers = [
            threading.Thread(target=self._read, args=(i,), daemon=True)
            for i in range(len(self.processes))
        ]
        for reader in self._readers:
            reader.start()

    @property
    def pids(self) -> list[int]:
        return [process.pid for process in self.processes]

    def _read(self, index: int) -> None:
        stdout = self.processes[index].stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith("ready "):
                with self._lock:
                    trial = int(line.split()[1])
                    self._ready[trial] = self._ready.get(trial, 0) + 1
            elif line.strip():
                self._outputs[index] = json.loads(line)

    def ready(self, trial: int) -> bool:
        """Every helper said ``ready <trial>``."""
        with self._lock:
            return self._ready.get(trial, 0) >= len(self.processes)

    def outputs(self, timeout: float) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout
        for reader in self._readers:
            reader.join(max(0.0, deadline - time.monotonic()))
        missing = [i for i, output in enumerate(self._outputs) if output is None]
        if missing:
            raise RuntimeError(f"helpers {missing} ended without their results")
        return [output for output in self._outputs if output is not None]

    def stop(self) -> None:
        for process in self.processes:
            stop_process(process)


def collect(helpers: list[subprocess.Popen[str]], timeout: float) -> list[dict[str, Any]]:
    outputs = []
    for helper in helpers:
        out, _ = helper.communicate(timeout=timeout)
        outputs.append(json.loads(out))
    return outputs


def per_trial(outputs: list[dict[str, Any]], key: str, trials: int) -> list[list[float]]:
    by_trial: list[list[float]] = [[] for _ in range(trials)]
    for output in outputs:
        for per_waiter in output[key]:
            for trial, when in enumerate(per_waiter):
                by_trial[trial].append(when)
    return by_trial


def wake_stats(by_trial: list[list[float]], sent: list[float]) -> dict[str, Any]:
    last = [max(w) - sent[t] for t, w in enumerate(by_trial)]
    middle = [sorted(w)[len(w) // 2] - sent[t] for t, w in enumerate(by_trial)]
    return {
        "last_wake_ms": summarize(ms(last)),
        "median_wake_ms": summarize(ms(middle)),
        "last_wake_samples_ms": ms(last),
    }


HEARTBEATS = 2
"""Chief heartbeats whose cost to Redis each stepbarrier phase measures (``heartbeat_cost``)."""


def heartbeat_cost(client: redis.Redis, writes: Callable[[], int], timers: float) -> float:
    """Redis's CPU seconds per chief heartbeat, every waiter waiting: from one
    heartbeat write to the next (the chief's ``writes`` count moves), less Redis's
    timers (``timers``: CPU seconds per second). Measured just after every waiter
    registered, before any of them reads the state again (5 s after its registration)."""

    def after_next(count: int) -> tuple[float, float]:
        deadline = time.monotonic() + 3.0
        while writes() <= count:
            if time.monotonic() > deadline:
                raise RuntimeError("no chief heartbeat in 3 s")
            time.sleep(0.002)
        return redis_cpu(client), time.monotonic()

    start = after_next(writes())
    costs = []
    for _ in range(HEARTBEATS):
        end = after_next(writes())
        costs.append(end[0] - start[0] - timers * (end[1] - start[1]))
        start = end
    return statistics.fmean(costs)


def cycles(
    client: redis.Redis,
    helpers: Helpers,
    trials: int,
    ready: Callable[[int], bool],
    release: Callable[[int], None],
    quiet: float,
    *,
    timers: float | None = None,
    writes: Callable[[], int] | None = None,
    footprints: list[dict[str, int]] | None = None,
    explain: Callable[[], str] | None = None,
) -> dict[str, Any]:
    """Release ``trials`` times, and measure each release's CPU (``explain``: what a
    wait for readiness that times out says of it).

    A release's window runs from just before it until every waiter is ready again
    (its next wait registered, or its stored step read), so the next wait's
    registration is in it (the waiters rest ``quiet`` seconds between). What Redis's
    own timers cost in that long is subtracted: ``timers`` (ms/s), or else what
    Redis costs while every waiter of this phase waits (measured first, for
    ``IDLE`` seconds: right for a floor, whose waiting waiters cost Redis nothing;
    a stepbarrier phase passes its floor's, since its waiting waiters read and
    take heartbeats). A chief heartbeat is a cost per second of waiting, not per
    step: where the chief's ``writes`` count shows one in a window (a window of
    1,024 waiters lasts more than the heartbeat's second), what one heartbeat costs
    Redis (``heartbeat_cost``, measured after the last release) is subtracted from
    its Redis CPU too. A last release, not measured, ends the helpers' last wait.
    """

    def sample() -> tuple[float, float, float]:
        return redis_cpu(client), process_cpu(helpers.pids), time.monotonic()

    wait_until(lambda: ready(0), 600, "the first registrations", explain)
    time.sleep(SETTLE)  # the helpers' start-up is over
    start = sample()
    time.sleep(IDLE)
    end = sample()
    idle = [(end[i] - start[i]) / (end[2] - start[2]) for i in (0, 1)]
    subtract = idle[0] if timers is None else timers / 1000
    sent: list[float] = []
    cpu: list[list[float]] = []
    windows: list[float] = []
    heartbeats: list[int] = []
    for trial in range(trials):
        wait_until(lambda t=trial: ready(t), 600, f"ready for trial {trial}", explain)
        if footprints is not None:
            footprints.append(redis_footprint(client))
        wrote = writes() if writes is not None else 0
        before = sample()
        sent.append(time.time())
        release(trial)
        time.sleep(quiet)  # no waiter registers again before its rest is over
        wait_until(lambda t=trial: ready(t + 1), 600, f"ready again after trial {trial}", explain)
        time.sleep(SETTLE_AFTER)
        after = sample()
        window = after[2] - before[2]
        windows.append(window)
        heartbeats.append(max(0, writes() - wrote - 1) if writes is not None else 0)
        cpu.append([after[0] - before[0] - subtract * window, after[1] - before[1]])
    wait_until(lambda: ready(trials), 600, "the last registrations", explain)
    beat = heartbeat_cost(client, writes, subtract) if writes is not None else 0.0
    release(trials)
    redis_net = [c[0] - beat * beats for c, beats in zip(cpu, heartbeats, strict=True)]
    return {
        "sent": sent,
        "release_cpu_ms": {
            "redis": 1000 * statistics.fmean(redis_net),
            "waiters": 1000 * statistics.fmean(c[1] for c in cpu),
        },
        "release_cpu_samples_ms": {
            "redis": [1000 * c for c in redis_net],
            "waiters": [1000 * c[1] for c in cpu],
        },
        "release_redis_with_heartbeats_ms": 1000 * statistics.fmean(c[0] for c in cpu),
        "heartbeats_in_windows": sum(heartbeats),
        "heartbeat_redis_ms": 1000 * beat,
        "timers_ms_per_s": 1000 * subtract,
        "idle_cpu_ms_per_s": {"redis": 1000 * idle[0], "waiters": 1000 * idle[1]},
        "window_s": summarize(windows),
    }


def floor_phase(
    server: RedisServer,
    processes: int,
    threads: int,
    trials: int,
    *,
    role: str = "floor",
    quiet: float = QUIET,
) -> dict[str, Any]:
    """``role``: ``floor`` (threads, each a ``RawWaiter``), ``floor-shared`` (asyncio,
    one ``SharedFloor`` per process) or ``floor-connections`` (asyncio, a connection
    per wait)."""
    client = server.client()
    fresh(client)
    client.set(FLOOR_KEY, 0)
    total = processes * threads
    helpers = Helpers(
        [[role, server.url, str(threads), str(trials), str(quiet)] for _ in range(processes)]
    )
    try:
        measured = cycles(
            client,
            helpers,
            trials,
            helpers.ready,
            lambda trial: raw_write(client, _target(trial)),
            quiet,
        )
        before_footprint = redis_footprint(client)
        outputs = helpers.outputs(300)
    finally:
        helpers.stop()
        client.close()
    result = wake_stats(per_trial(outputs, "woke", trials), measured.pop("sent"))
    result.update(
        measured,
        subscribers=total,
        processes=processes,
        trials=trials,
        errors=[e for o in outputs for e in o["errors"]][:5],
        released_by_read=sum(o.get("released_by_read", 0) for o in outputs),
        redis_with_subscribers=before_footprint,
    )
    return result


def waiters_phase(
    server: RedisServer,
    processes: int,
    per_process: int,
    trials: int,
    *,
    kind: str,
    profile: bool,
    quiet: float = QUIET,
    timers: float | None = None,
) -> dict[str, Any]:
    """``kind``: ``"sync"`` (threads, each its own StepWaiter) or ``"aio"``."""
    from stepbarrier import BarrierConfig, StepPublisher

    job = f"fleet-{kind}-{uuid.uuid4().hex[:6]}"
    config = BarrierConfig(job=job, redis_url=server.url, role="chief", task_id=0)
    client = server.client()
    if timers is None:
        fresh(client)
    total = processes * per_process
    baseline = redis_footprint(client)
    footprints: list[dict[str, int]] = []
    helpers: Helpers | None = None
    try:
        with StepPublisher(config) as publisher:
            publisher.publish(0)
            publisher.flush(10)
            roles = []
            for _ in range(processes):
                if kind == "sync":
                    role = ["sync", server.url, job, str(per_process), str(trials), str(quiet)]
                    role += ["profile"] if profile else []
                else:
                    role = ["aio", server.url, job, str(per_process), str(trials), "0", "0"]
                    role.append(str(quiet))
                roles.append(role)
            helpers = Helpers(roles)

            def ready(trial: int) -> bool:
                step = _target(trial)
                return bool(
                    publisher.next_threshold == step
                    and client.zcount(config.keys.targets, step, step) >= total
                )

            def state_of_ready() -> str:
                # a failed wait says why: the chief's threshold, the index, the list
                counts = client.zrange(config.keys.targets, 0, 4, withscores=True)
                return (
                    f"chief next_threshold {publisher.next_threshold}, step written "
                    f"{publisher.writes} times; targets: {client.zcard(config.keys.targets)} "
                    f"indexed, lowest {counts}; registrations list "
                    f"{client.llen(config.keys.registrations)}"
                )

            writes = publisher.writes
            measured = cycles(
                client,
                helpers,
                trials,
                ready,
                lambda trial: publisher.publish(_target(trial)),
                quiet,
                timers=timers,
                writes=lambda: publisher.writes,
                footprints=footprints,
                explain=state_of_ready,
            )
            outputs = helpers.outputs(300)
            writes = publisher.writes - writes
    finally:
        if helpers is not None:
            helpers.stop()
        client.close()
    sent = measured.pop("sent")
    result = wake_stats(per_trial(outputs, "woke", trials), sent)
    waiting = footprints[-1]
    result.update(
        measured,
        waiters=total,
        processes=processes,
        trials=trials,
        chief_writes=writes,
        errors=[e for o in outputs for e in o["errors"]][:5],
        released_by_read=sum(o.get("released_by_read", 0) for o in outputs),
        redis_per_waiter={
            "bytes": (waiting["used_memory"] - baseline["used_memory"]) / total,
            "connections": (waiting["clients"] - baseline["clients"] - 2)
            / total,  # less the chief's
        },
        redis_while_waiting=waiting,
        redis_baseline=baseline,
    )
    if kind == "aio":
        result["round_trips_per_process"] = [o.get("round_trips") for o in outputs]
    if profile and kind == "sync":
        arrived = per_trial(outputs, "arrived", trials)
        woke = per_trial(outputs, "woke", trials)
        result["profile"] = {
            "arrival_last_ms": summarize(ms(max(a) - sent[t] for t, a in enumerate(arrived))),
            "arrival_median_ms": summarize(
                ms(sorted(a)[len(a) // 2] - sent[t] for t, a in enumerate(arrived))
            ),
            "after_arrival_ms": summarize(
                ms(
                    w - a
                    for wt, at in zip(woke, arrived, strict=True)
                    for w, a in zip(wt, at, strict=True)
                )
            ),
        }
    return result


def independent(server: RedisServer, part: str, quick: bool, profile: bool) -> dict[str, Any]:
    processes, threads = LAYOUTS[part]
    if quick:
        processes, threads = max(1, processes // 4), threads // 2
    trials, blocks = (3, 1) if quick else (16, 2)
    if part == "independent-4x16" and not quick:
        trials, blocks = 24, 3
    quiet = LAYOUT_QUIET.get(part, QUIET)
    floor: list[dict[str, Any]] = []
    core: list[dict[str, Any]] = []
    for _ in range(blocks):
        floor.append(floor_phase(server, processes, threads, trials, quiet=quiet))
        timers = floor[-1]["idle_cpu_ms_per_s"]["redis"]  # its waiters cost Redis nothing
        core.append(
            waiters_phase(
                server,
                processes,
                threads,
                trials,
                kind="sync",
                profile=profile,
                quiet=quiet,
                timers=timers,
            )
        )
    return {"floor": floor, "stepbarrier": core}


def async_fleet(server: RedisServer, quick: bool) -> dict[str, Any]:
    """10,000 async waits; Redis's timers measured before, with no waiter connected (the
    waits hold 8 connections in all)."""
    processes, waits = (2, 1000) if quick else (4, 2500)
    client = server.client()
    fresh(client)
    before = redis_cpu(client), time.monotonic()
    time.sleep(IDLE)
    timers = 1000 * (redis_cpu(client) - before[0]) / (time.monotonic() - before[1])
    client.close()
    trials = 3 if quick else 10
    return waiters_phase(server, processes, waits, trials, kind="aio", profile=False, timers=timers)


def async_floor(server: RedisServer, quick: bool) -> dict[str, Any]:
    processes, waits = (2, 1000) if quick else (4, 2500)
    return floor_phase(server, processes, waits, 3 if quick else 10, role="floor-shared")


def floor10k(server: RedisServer, quick: bool) -> dict[str, Any]:
    processes, connections = (2, 1000) if quick else (4, 2500)
    return floor_phase(server, processes, connections, 3 if quick else 8, role="floor-connections")


def status_costs(url: str, job: str, client: redis.Redis) -> dict[str, Any]:
    from stepbarrier import BarrierConfig, read_status
    from stepbarrier._inspect.summary import read_overview

    config = BarrierConfig(job=job, redis_url=url)
    out: dict[str, Any] = {}

    def counted(label: str, action: Callable[..., object], repeat: int = 5) -> None:
        seconds = []
        before = client.info("commandstats")
        for _ in range(repeat):
            started = time.perf_counter()
            action()
            seconds.append(time.perf_counter() - started)
        after = client.info("commandstats")
        sent = {
            name.removeprefix("cmdstat_"): (stats["calls"] - before.get(name, {}).get("calls", 0))
            / repeat
            for name, stats in after.items()
            if stats["calls"] != before.get(name, {}).get("calls", 0)
        }
        out[label] = {"seconds": summarize(seconds), "commands_per_call": sent}

    counted("read_status", lambda: read_status(config))
    counted("read_overview", lambda: read_overview(config))
    env = child_env(STEPBARRIER_REDIS_URL=url, STEPBARRIER_JOB=job)
    command = [sys.executable, "-m", "stepbarrier"]
    for label, args in (("cli_status", ["status"]), ("cli_status_json", ["status", "--json"])):
        counted(
            label,
            lambda a=args: subprocess.run(
                [*command, *a], env=env, cwd=ROOT, capture_output=True, check=True
            ),
            repeat=3,
        )
    counted(
        "cli_startup",
        lambda: subprocess.run([*command, "--version"], env=env, cwd=ROOT, capture_output=True),
        repeat=3,
    )
    return out


def static_fleet(url: str, total: int) -> str:
    """A job with ``total`` registered waiters (their own registration calls, pipelined)
    and none of them live: ``status`` measured without the waiters' own traffic."""
    from stepbarrier import BarrierConfig
    from stepbarrier._protocol.calls import register_call
    from stepbarrier._redis.functions import RedisCode
    from stepbarrier._worker.links import REGISTRY_TTL, registry_entry

    job = f"fleet-status-{uuid.uuid4().hex[:6]}"
    config = BarrierConfig(job=job, redis_url=url, task_id=1)
    code = RedisCode(redis.Redis.from_url(url), config)
    since = time.time()
    calls = [
        register_call(
            config.keys,
            f"{i}-{i:08x}",
            1 + i,
            registry_entry(config, 1 + i, since),
            registry_ttl=REGISTRY_TTL,
            key_ttl=config.key_ttl,
        )
        for i in range(total)
    ]
    for start in range(0, total, 1000):
        code.pipeline(calls[start : start + 1000])
    return job


def distinct(server: RedisServer, quick: bool) -> dict[str, Any]:
    from stepbarrier import BarrierConfig, StepPublisher

    processes, total = (2, 2000) if quick else (4, 10_000)
    per_process = total // processes
    job = f"fleet-distinct-{uuid.uuid4().hex[:6]}"
    config = BarrierConfig(job=job, redis_url=server.url, role="chief", task_id=0)
    client = server.client()
    # first, alone on the server: the commands counted are the reads' own
    costs = status_costs(server.url, static_fleet(server.url, total), client)
    helpers = [
        child_process(
            "bench.fleet", "--role", "aio", server.url, job, str(per_process), "0", str(1 + i),
            str(processes), "0",
        )
        for i in range(processes)
    ]  # fmt: skip
    handed: dict[int, float] = {}
    try:
        wait_until(lambda: client.zcard(config.keys.targets) >= total, 300, "registered")
        before = client.info("commandstats")
        started = time.monotonic()
        with StepPublisher(config) as publisher:
            for step in range(total + 1):
                handed[step] = time.time()
                publisher.publish(step)
                pause = started + (step + 1) / RATE - time.monotonic()
                if pause > 0:
                    time.sleep(pause)
            publisher.flush(30)
            outputs = collect(helpers, 300)
            writes = publisher.writes
        elapsed = time.monotonic() - started
        after = client.info("commandstats")
    finally:
        for helper in helpers:
            stop_process(helper)
        client.close()
    released = [r for o in outputs for r in o["released"]]
    early = [r for r in released if r[1] < r[0] or r[2] < handed.get(r[0], 0)]
    lateness = [when - handed[target] for target, step, when in released if step >= target]
    fcall = after.get("cmdstat_fcall", {}).get("calls", 0) - before.get("cmdstat_fcall", {}).get(
        "calls", 0
    )
    heartbeats = int(elapsed / config.heartbeat) + 1
    return {
        "waiters": total,
        "distinct_targets": total,
        "rate_steps_per_s": RATE,
        "seconds": elapsed,
        "writes": writes,
        "fcall_sent": fcall,
        "heartbeats": heartbeats,
        "crossed_thresholds": total,
        "writes_allowed": 1 + heartbeats + total + 1,
        "released": len(released),
        "released_early": len(early),
        "errors": [e for o in outputs for e in o["errors"]][:5],
        "lateness_ms": summarize(ms(lateness)),
        "lateness_by_target_samples_ms": [
            round(1000 * (when - handed[target]), 3) for target, _, when in sorted(released)
        ],
        "status": costs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="+", choices=PARTS)
    parser.add_argument(
        "--no-profile", dest="profile", action="store_false", help="do not split the wake path"
    )
    parser.add_argument("--role", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role:
        role, url, *rest = args.role
        if role == "sync":
            job, threads, trials, quiet, *profile = rest
            sync_role(url, job, int(threads), int(trials), float(quiet), profile == ["profile"])
        elif role == "aio":
            job, waits, trials, first, stride, quiet = rest
            aio_role(url, job, int(waits), int(trials), int(first), int(stride), float(quiet))
        else:
            floors = {
                "floor": floor_role,
                "floor-shared": floor_shared_role,
                "floor-connections": floor_connections_role,
            }
            floors[role](url, int(rest[0]), int(rest[1]), float(rest[2]))
        return
    load_before = load_average()
    started = time.monotonic()
    result: dict[str, Any] = {"benchmark": "fleet", "quick": args.quick}
    saved = RESULTS_DIR / "fleet.json"
    if args.only and saved.exists():
        # --only replaces those parts of the saved run; the others keep theirs,
        # each part with the commit it ran at
        result = json.loads(saved.read_text())
        commits = result.setdefault("part_commits", {})
        for part in PARTS:
            if part in result:
                commits.setdefault(part, result.get("commit"))
    with RedisServer() as server:
        admin = server.client()
        admin.config_set("maxclients", 19_000)  # 10,000 subscribers and more
        maxclients = admin.config_get("maxclients")["maxclients"]
        if maxclients is None:
            raise RuntimeError("redis-server reported no maxclients")
        result["maxclients"] = int(maxclients)
        for part in args.only or PARTS:
            print(f"-- {part}", file=sys.stderr, flush=True)
            if part in LAYOUTS:
                result[part] = independent(server, part, args.quick, args.profile)
            elif part == "async":
                result[part] = async_fleet(server, args.quick)
            elif part == "async-floor":
                result[part] = async_floor(server, args.quick)
            elif part == "floor10k":
                result[part] = floor10k(server, args.quick)
            else:
                result[part] = distinct(server, args.quick)
            result.setdefault("part_commits", {})[part] = git("rev-parse", "--short", "HEAD")
            print(json.dumps(brief(result[part]), indent=1), file=sys.stderr, flush=True)
            save("fleet", result)  # each part as soon as it is measured
    result.update(
        seconds=time.monotonic() - started,
        load_before=load_before,
        load_after=load_average(),
        commit=git("rev-parse", "--short", "HEAD"),
        dirty=bool(git("status", "--porcelain", "--untracked-files=no", "stepbarrier")),
    )
    save("fleet", result)


def brief(data: Any) -> Any:
    """``data`` without its long sample lists (for the console)."""
    if isinstance(data, dict):
        return {k: brief(v) for k, v in data.items() if not k.endswith("samples_ms")}
    if isinstance(data, list):
        return [brief(v) for v in data]
    return data


if __name__ == "__main__":
    main()
