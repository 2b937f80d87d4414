"""The one home of each shared rule: the library's calls, the chief-liveness rule, the
walk of a keyspace."""

from __future__ import annotations

import fakeredis

from stepbarrier._protocol.calls import read_call, register_call, reset_job_call
from stepbarrier._protocol.freshness import HAND_PUBLISHED, is_stale, stale_limit
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._redis.client import ScanTally, scan_keys

KEYS = JobKeys.for_job("j")


def test_a_chief_is_stale_after_three_of_its_periods_and_five_seconds_at_least() -> None:
    def limit(period: float) -> float | None:
        return stale_limit(done=False, heartbeat_age=1.0, chief="host:1", period=period)

    def stale(age: float) -> bool:
        return is_stale(done=False, heartbeat_age=age, chief="host:1", period=10.0)

    assert (limit(10.0), limit(0.1)) == (30.0, 5.0)
    assert stale(30.0) and not stale(29.9)


def test_no_chief_is_in_question_when_done_unheard_or_published_by_hand() -> None:
    assert stale_limit(done=True, heartbeat_age=99.0, chief="h:1", period=1.0) is None
    assert stale_limit(done=False, heartbeat_age=None, chief="h:1", period=1.0) is None
    hand = f"{HAND_PUBLISHED}h:1"
    assert not is_stale(done=False, heartbeat_age=99.0, chief=hand, period=1.0)


def test_the_calls_lay_their_arguments_out_as_their_lua_reads_them() -> None:
    name, keys, args = register_call(KEYS, "w1", 7, {"task_id": "3"}, registry_ttl=30, key_ttl=60)
    assert (name, keys, args) == (
        "waiter_register",
        [KEYS.waiter("w1"), KEYS.targets, KEYS.registrations],
        [30, 60, "w1", 7, "task_id", "3"],
    )
    assert read_call(KEYS.state, KEYS.reset, wait=True) == (
        "waiter_read",
        [KEYS.state, KEYS.reset],
        ["wait"],
    )
    name, keys, args = reset_job_call(KEYS, marker_ttl=9, publish_command="PUBLISH", extra=["x"])
    fixed = [KEYS.state, KEYS.targets, KEYS.registrations, KEYS.reset]
    assert keys[:6] == [*fixed, KEYS.barrier_index, KEYS.barrier_epoch]
    assert (name, keys[6:], args) == (
        "reset_job",
        ["x"],
        [KEYS.channel, 9, "PUBLISH", KEYS.barrier_channel],
    )


def test_a_scan_walks_every_matching_key_and_says_when_it_stopped_short() -> None:
    client = fakeredis.FakeRedis()
    for job in range(30):
        client.set(JobKeys.for_job(f"j{job}").state, 1)
    client.set("other", 1)
    tally = ScanTally()
    found = set(scan_keys(client, JobKeys.for_job("*").state, count=5, most=1000, tally=tally))
    assert len(found) == 30 and not tally.cut and tally.calls >= 1
    short = ScanTally()
    list(scan_keys(client, "*", count=1, most=2, tally=short))
    assert short.cut and short.calls == 2
