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
    client: fakeredis.FakeRedis,
    generation: int,
    step: int,
    done: bool = False,
    *,
    run_id: str = "",
    epoch: int | None = None,
    mode: str = "chief",
) -> list[int]:
    script = client.register_script(scripts.PUBLISH_STEP)
    args = [generation, step, int(done), 3600, KEYS.channel, "host:1", 10, KEYS.waiter_prefix]
    args += [run_id, 0, 1000, 5000, 300, generation if epoch is None else epoch, mode]
    reply = script(keys=[KEYS.state, KEYS.targets, KEYS.reset], args=args)
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


def test_released_waiters_leave_the_index_with_the_announcement_and_nothing_else(
    fake: fakeredis.FakeRedis,
) -> None:
    for waiter, target in (("a", 5), ("b", 20)):
        fake.hset(KEYS.waiter(waiter), mapping={"wait_until_step": str(target)})
        fake.zadd(KEYS.targets, {waiter: target})
    publish(fake, 1, 6)
    assert fake.zrange(KEYS.targets, 0, -1) == [b"b"]
    # the entries are keys the script does not declare: they expire by themselves
    assert fake.exists(KEYS.waiter("a")) and fake.exists(KEYS.waiter("b"))


def test_sharded_announcements_on_request(fake: fakeredis.FakeRedis) -> None:
    script = fake.register_script(scripts.PUBLISH_STEP)
    args = [1, 4, 0, 3600, KEYS.channel, "host:1", 10, KEYS.waiter_prefix]
    args += ["", 0, 1000, 5000, 300, 1, "chief", "SPUBLISH"]
    pubsub = fake.pubsub()
    pubsub.ssubscribe(KEYS.channel)
    script(keys=[KEYS.state, KEYS.targets, KEYS.reset], args=args)
    messages = [m for m in iter(lambda: pubsub.get_sharded_message(timeout=0.5), None)]
    assert any(m["type"] == "smessage" for m in messages)


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
    reset_ms = int(fake.get(KEYS.reset) or 0)
    assert reset_ms > 0
    # the marker stays: a chief that began before the reset is refused for good,
    # and creates nothing; one that began after it starts the job anew
    assert publish(fake, reset_ms * 1000 + 5, 8, epoch=1)[0] == scripts.WAS_RESET
    assert not fake.exists(KEYS.state)
    assert publish(fake, reset_ms * 1000 + 5, 0)[0] == scripts.ACCEPTED
    assert fake.exists(KEYS.reset)


def test_wrong_types_are_repaired_by_the_chief(fake: fakeredis.FakeRedis) -> None:
    fake.set(KEYS.state, "garbage")
    fake.set(KEYS.targets, "garbage")
    accepted, step, _generation, repaired = publish(fake, 1, 4)[:4]
    assert (accepted, step, repaired) == (1, 4, 1)


@pytest.mark.parametrize(
    "text", ["1e3", "0x10", " 5", "5 ", "+5", "-5", "5.0", "1_000", "99999999999999999"]
)
def test_a_stored_number_is_plain_digits_in_lua_as_in_python(
    fake: fakeredis.FakeRedis, text: str
) -> None:
    from stepbarrier.protocol import parse_int

    fake.hset(KEYS.state, mapping={"generation": "1", "step": text, "done": "0"})
    status, step, _generation, repaired = publish(fake, 1, 3)[:4]
    # Lua distrusts the stored step just as Python does: the chief's step replaces it
    assert parse_int(text) is None
    assert (status, step, repaired) == (scripts.ACCEPTED, 3, 1)


def test_a_non_finite_target_score_is_skipped(fake: fakeredis.FakeRedis) -> None:
    fake.zadd(KEYS.targets, {"evil": float("inf"), "half": 7.5, "ok": 9})
    assert publish(fake, 1, 1)[4:] == [9]


def test_the_run_id_is_stored_and_announced(fake: fakeredis.FakeRedis) -> None:
    pubsub = fake.pubsub()
    pubsub.subscribe(KEYS.channel)
    publish(fake, 1, 4, run_id="run-7")
    assert fake.hget(KEYS.state, "run_id") == b"run-7"
    messages = [m for m in iter(lambda: pubsub.get_message(timeout=0.5), None)]
    assert any(b'"run_id":"run-7"' in m["data"] for m in messages if m["type"] == "message")


def test_a_malformed_run_id_is_refused(fake: fakeredis.FakeRedis) -> None:
    with pytest.raises(Exception, match="malformed run id"):
        publish(fake, 1, 4, run_id='x"}')


def test_finishing_shortens_the_keys_life(fake: fakeredis.FakeRedis) -> None:
    fake.zadd(KEYS.targets, {"a": 50})
    publish(fake, 1, 4)
    assert fake.ttl(KEYS.state) > 3000
    publish(fake, 1, 5, done=True)
    assert 0 < fake.ttl(KEYS.state) <= 300 and 0 < fake.ttl(KEYS.targets) <= 300
    assert int(fake.hget(KEYS.state, "done_ms") or 0) > 0


def test_a_contributor_only_raises_the_step_of_the_generation_it_joined(
    fake: fakeredis.FakeRedis,
) -> None:
    assert publish(fake, 0, 9, mode="contributor", epoch=0)[0] == scripts.NOTHING_TO_JOIN
    assert not fake.exists(KEYS.state)  # no chief yet: nothing is created
    publish(fake, 5, 10, run_id="r")
    assert publish(fake, 0, 9, mode="contributor", run_id="r", epoch=0)[:3] == [
        scripts.REJOIN,
        10,
        5,
    ]
    assert publish(fake, 5, 12, mode="contributor", run_id="r", epoch=5)[:3] == [1, 12, 5]
    assert publish(fake, 5, 11, mode="contributor", run_id="r", epoch=5)[:2] == [1, 12]
    # another run's worker, or a finished job: nothing to join
    assert publish(fake, 5, 99, mode="contributor", run_id="other", epoch=5)[0] == 3
    publish(fake, 5, 12, done=True, run_id="r")
    assert publish(fake, 5, 99, mode="contributor", run_id="r", epoch=5)[0] == 3
    assert fake.hget(KEYS.state, "step") == b"12"
