"""Scenario 3: the server kills the waiters' subscriptions, then pauses every client.

Guarantee: a worker whose announcement was lost (its subscription was killed
as the chief crossed its step) or delayed (Redis paused for longer than the
fallback interval) is still released, and none early; the chief's ``publish``
never blocks while Redis is paused.
"""

from __future__ import annotations

import time

import pytest

from stepbarrier import BarrierConfig
from tests.redis_harness import RedisServer
from tests.reliability.conftest import FALLBACK, Timings, wait_for_waiters
from tests.reliability.processes import (
    Fleet,
    assert_chief_never_blocked,
    assert_not_early,
    wait_until,
)

pytestmark = [pytest.mark.reliability, pytest.mark.timeout(120)]

PAUSE = 3.0
"""Seconds Redis is paused: longer than the workers' fallback interval."""


def test_killed_subscriptions_and_a_paused_server_lose_no_release(
    server: RedisServer, fleet: Fleet, job: str, timings: Timings
) -> None:
    assert PAUSE > FALLBACK
    config = BarrierConfig(job=job, redis_url=server.url)
    admin = server.client()
    chief = fleet.chief()
    chief.wait_ready()
    chief.train_to(10)
    first, second, third = (
        fleet.worker(f"worker{i}", target, task_id=i, overrides={"fallback_interval": FALLBACK})
        for i, target in ((1, 20), (2, 40), (3, 60))
    )
    wait_for_waiters(config, 3, [first, second, third])

    def subscribers() -> int:
        return int(dict(admin.pubsub_numsub(config.keys.channel))[config.keys.channel.encode()])

    wait_until(lambda: subscribers() == 3, 10.0, "three subscriptions")

    # 1. the subscriptions die just as the chief crosses the first worker's step
    assert admin.client_kill_filter(_type="pubsub") == 3
    chief.train_to(25, step_seconds=0.001)
    record = first.released(timeout=15.0)
    assert_not_early(record, chief)
    timings.record("released after its subscription was killed", record["t"] - chief.reached(20))
    wait_until(lambda: subscribers() == 2, 10.0, "the other two waiters resubscribed")

    # 2. every client paused for longer than the fallback interval, the chief crossing a step
    # (in the pause, unless this machine stalls the chief for seconds: then the step is
    # crossed after it, and the same assertions hold)
    pausing = time.time()  # the pause begins later, so it ends after pausing + PAUSE
    admin.client_pause(int(PAUSE * 1000))
    paused_until = pausing + PAUSE
    assert_chief_never_blocked(chief.train_to(45, step_seconds=0.002))
    timings.record("step 40 handed over, after the pause began", chief.reached(40) - pausing)
    record = second.released(timeout=PAUSE + 15.0)
    # (all processes share this host's clock; 0.1 s for Redis's rounding to the ms)
    assert record["t"] >= paused_until - 0.1, "released while Redis was paused"
    assert_not_early(record, chief)
    timings.record("released after the pause ended", record["t"] - paused_until)
    assert third.still_waiting(), "released before its step"

    # 3. both at once, atomically: the subscription killed and every client paused; the
    # chief crosses the last step during the pause, so its announcement competes with the
    # waiter's resubscription when the pause ends (and may well go out first)
    pausing = time.time()
    with admin.pipeline(transaction=True) as both:
        both.execute_command("CLIENT", "KILL", "TYPE", "pubsub")
        both.execute_command("CLIENT", "PAUSE", int(PAUSE * 1000))
        killed, _ = both.execute()
    paused_until = pausing + PAUSE
    assert killed == 1
    assert_chief_never_blocked(chief.train_to(65, step_seconds=0.002))
    record = third.released(timeout=PAUSE + 15.0)
    assert_not_early(record, chief)
    timings.record("released after kill + pause", record["t"] - paused_until)

    assert_chief_never_blocked(chief.close(done=True))
    admin.close()
