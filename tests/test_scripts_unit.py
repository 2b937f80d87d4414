"""The Lua scripts' rules, checked quickly on fakeredis (with lupa for Lua)."""

from __future__ import annotations

from collections.abc import Iterator

import fakeredis
import pytest

from stepbarrier import scripts
from stepbarrier.keys import JobKeys

KEYS = JobKeys.for_job("unit")


@pytest.fixture
def fake() -> Iterator[fakeredis.FakeRedis]:
    client = fakeredis.FakeRedis()
    yield client
    client.close()


def publish(
    client: fakeredis.FakeRedis, generation: int, step: int, done: bool = False
) -> list[int]:
    script = client.register_script(scripts.PUBLISH_STEP)
    reply = script(
        keys=[KEYS.state, KEYS.targets, KEYS.reset],
        args=[generation, step, int(done), 3600, KEYS.channel, "host:1", 10, KEYS.waiter_prefix],
    )
    return [int(float(x)) for x in reply]


def test_keys_share_one_hash_tag() -> None:
    names = [*KEYS.all_fixed(), KEYS.channel, KEYS.waiter("1-abc")]
    assert all(name.startswith("stepbarrier:{unit}:") for name in names)


def test_store_if_greater_within_a_generation(fake: fakeredis.FakeRedis) -> None:
    assert publish(fake, 5, 10)[:3] == [1, 10, 5]
    assert publish(fake, 5, 3)[:3] == [1, 10, 5]
    assert fake.hget(KEYS.state, "step") == b"10"


def test_newer_generation_replaces_older_is_refused(fake: fakeredis.FakeRedis) -> None:
    publish(fake, 5, 100)
    assert publish(fake, 6, 30)[:3] == [1, 30, 6]
    accepted, step, generation = publish(fake, 5, 200)[:3]
    assert (accepted, step, generation) == (0, 30, 6)
    assert fake.hget(KEYS.state, "step") == b"30"


def test_pending_targets_come_back_and_crossed_ones_go(fake: fakeredis.FakeRedis) -> None:
    fake.zadd(KEYS.targets, {"a": 5, "b": 20, "c": 50})
    reply = publish(fake, 1, 1)
    assert reply[4:] == [5, 20, 50]
    reply = publish(fake, 1, 20)
    assert reply[4:] == [50]
    assert fake.zrange(KEYS.targets, 0, -1) == [b"c"]


def test_released_waiters_registry_entries_go_with_the_announcement(
    fake: fakeredis.FakeRedis,
) -> None:
    for waiter, target in (("a", 5), ("b", 20)):
        fake.hset(KEYS.waiter(waiter), mapping={"wait_until_step": str(target)})
        fake.zadd(KEYS.targets, {waiter: target})
    publish(fake, 1, 6)
    assert not fake.exists(KEYS.waiter("a"))
    assert fake.exists(KEYS.waiter("b"))


def test_done_is_recorded(fake: fakeredis.FakeRedis) -> None:
    publish(fake, 1, 7, done=True)
    assert fake.hget(KEYS.state, "done") == b"1"


def test_begin_generation_is_above_the_stored_one(fake: fakeredis.FakeRedis) -> None:
    begin = fake.register_script(scripts.BEGIN_GENERATION)
    fake.hset(KEYS.state, mapping={"generation": str(2**52), "step": "1"})
    assert int(begin(keys=[KEYS.state])) == 2**52 + 1


def test_reset_deletes_and_leaves_a_marker(fake: fakeredis.FakeRedis) -> None:
    publish(fake, 1, 7)
    fake.hset(KEYS.waiter("1-x"), mapping={"wait_until_step": "9"})
    reset = fake.register_script(scripts.RESET_JOB)
    reset(
        keys=[KEYS.state, KEYS.targets, KEYS.registrations, KEYS.reset, KEYS.waiter("1-x")],
        args=[KEYS.channel, 60],
    )
    assert not fake.exists(KEYS.state) and not fake.exists(KEYS.waiter("1-x"))
    assert int(fake.get(KEYS.reset) or 0) > 0
    publish(fake, 2, 0)  # a new chief removes the marker
    assert not fake.exists(KEYS.reset)


def test_wrong_types_are_repaired_by_the_chief(fake: fakeredis.FakeRedis) -> None:
    fake.set(KEYS.state, "garbage")
    fake.set(KEYS.targets, "garbage")
    accepted, step, _generation, repaired = publish(fake, 1, 4)[:4]
    assert (accepted, step, repaired) == (1, 4, 1)
