"""The Lua scripts' rules, checked quickly on fakeredis (with lupa for Lua)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import fakeredis
import pytest

from stepbarrier import BarrierConfig
from stepbarrier._chief.publish_call import StepWrite, StepWriter
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.keys import JobKeys

KEYS = JobKeys.for_job("unit")
KEY_TTL = 3600
DONE_TTL = 300


def eval_source(name: str) -> str:
    """The code ``name`` as an EVAL script (``STEPBARRIER_USE_EVAL``): helpers, then body."""
    body, _read_only = scripts.BODIES[name]
    return scripts.HELPERS + body


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
    vouch: bool = True,
    marker: str = "",
    mode: str = "chief",
    begun: bool = True,
    served: int = 0,
    idle_ms: int = 0,
    command: str = "PUBLISH",
) -> list[int]:
    """One ``publish_step`` call, in the script's ARGV layout; the reply as numbers,
    its probation id as 1 (on probation) or 0.

    ``begun``: the writer's begin is on record (``begun`` = its generation, as
    ``begin_generation`` leaves it), unless the hash shows another begin already:
    the normal case. ``False``: a writer whose begin Redis forgot (a zombie).
    """
    on_record = client.type(KEYS.state) in (b"hash", b"none") and client.hget(KEYS.state, "begun")
    if begun and mode == "chief" and on_record is None:
        client.hset(KEYS.state, "begun", generation)
    script = client.register_script(eval_source("publish_step"))
    args: list[Any] = [generation, step, int(done), KEY_TTL, KEYS.channel, "host:1", 10]
    args += [run_id, int(vouch), 1000, DONE_TTL, marker, mode, command, served, idle_ms]
    reply = script(keys=[KEYS.state, KEYS.targets, KEYS.reset], args=args)
    numbers = [int(float(x)) for x in reply]
    numbers[4] = int(numbers[4] != 0)
    return numbers


def text(raw: object) -> str:
    return raw.decode() if isinstance(raw, bytes) else str(raw)


def begin(client: fakeredis.FakeRedis, run_id: str = "") -> list[str]:
    """One ``begin_generation`` call; its reply as text."""
    script = client.register_script(eval_source("begin_generation"))
    reply = script(keys=[KEYS.state, KEYS.reset], args=[run_id])
    return [text(x) for x in reply]


def reset(client: fakeredis.FakeRedis, *waiters: str) -> str:
    """One ``reset_job`` call, as ``stepbarrier reset`` makes it; the new marker."""
    script = client.register_script(eval_source("reset_job"))
    fixed = [KEYS.state, KEYS.targets, KEYS.registrations, KEYS.reset]
    fixed += [KEYS.barrier_index, KEYS.barrier_epoch]
    args: list[Any] = [KEYS.channel, 60, "PUBLISH", KEYS.barrier_channel]
    return text(script(keys=[*fixed, *waiters], args=args))


def state(client: fakeredis.FakeRedis) -> dict[str, str]:
    return {text(k): text(v) for k, v in client.hgetall(KEYS.state).items()}


def announcements(pubsub: Any) -> list[dict[str, Any]]:
    messages = [m for m in iter(lambda: pubsub.get_message(timeout=0.2), None)]
    return [json.loads(m["data"]) for m in messages if m["type"] == "message"]


def test_keys_share_one_hash_tag() -> None:
    names = [*KEYS.all_fixed(), KEYS.channel, KEYS.waiter("1-abc"), KEYS.barrier_epoch]
    assert all(name.startswith("stepbarrier:{unit}:") for name in names)


def test_store_if_greater_within_a_generation(fake: fakeredis.FakeRedis) -> None:
    assert publish(fake, 5, 10)[:3] == [scripts.ACCEPTED, 10, 5]
    assert publish(fake, 5, 3)[:3] == [scripts.ACCEPTED, 10, 5]
    assert fake.hget(KEYS.state, "step") == b"10"


def test_a_newer_generation_replaces_the_state_and_an_older_one_is_superseded(
    fake: fakeredis.FakeRedis,
) -> None:
    publish(fake, 5, 100)
    assert publish(fake, 6, 30)[:5] == [scripts.ACCEPTED, 30, 6, 0, 0]
    beat = fake.hget(KEYS.state, "beat")
    # the superseded chief learns the newer generation and changes nothing
    assert publish(fake, 5, 200)[:3] == [scripts.SUPERSEDED, 30, 6]
    assert fake.hget(KEYS.state, "step") == b"30"
    assert fake.hget(KEYS.state, "beat") == beat


def beat(client: fakeredis.FakeRedis) -> int:
    return int(client.hget(KEYS.state, "beat") or 0)


def test_the_beat_counts_the_accepted_writes_of_a_generation(fake: fakeredis.FakeRedis) -> None:
    publish(fake, 5, 10)
    first = beat(fake)
    seconds, micros = fake.time()
    assert first <= seconds * 1_000_000 + micros  # it starts from the Redis clock (us)
    publish(fake, 5, 10)  # a heartbeat of the same step is a write too
    publish(fake, 5, 3)  # a lower step is not stored, but the write counts
    assert beat(fake) == first + 2
    publish(fake, 4, 99)  # refused: no write happened
    assert beat(fake) == first + 2
    publish(fake, 6, 1)  # a new generation starts from the clock again
    assert beat(fake) > first + 2


def test_a_state_made_again_after_redis_forgot_it_beats_above_what_was_seen(
    fake: fakeredis.FakeRedis,
) -> None:
    # a waiter that saw beat B must see the remade state's next write as news
    for _ in range(50):
        publish(fake, 5, 10)
    seen = beat(fake)
    fake.delete(KEYS.state)
    publish(fake, 5, 10)
    assert beat(fake) > seen


def test_the_vouch_is_stored_and_announced_as_the_writer_says(fake: fakeredis.FakeRedis) -> None:
    pubsub = fake.pubsub()
    pubsub.subscribe(KEYS.channel)
    publish(fake, 5, 10, vouch=True, begun=True)
    assert fake.hget(KEYS.state, "vouch") == b"1"
    publish(fake, 5, 11, vouch=False)
    assert fake.hget(KEYS.state, "vouch") == b"0"
    said = [(a["step"], a["beat"], a["vouch"]) for a in announcements(pubsub)]
    first = said[0][1]
    assert said == [(10, first, True), (11, first + 1, False)]


def test_an_announcement_carries_the_write_it_tells_of(fake: fakeredis.FakeRedis) -> None:
    pubsub = fake.pubsub()
    pubsub.subscribe(KEYS.channel)
    publish(fake, 9, 4, run_id="run-7", begun=True, idle_ms=1250)
    (said,) = announcements(pubsub)
    assert said["beat"] == beat(fake)
    assert said == {
        "step": 4,
        "generation": 9,
        "beat": beat(fake),
        "vouch": True,
        "done": False,
        "pinned": False,
        "run_id": "run-7",
        "idle": 1250,
    }
    assert fake.hget(KEYS.state, "run_id") == b"run-7"
    assert fake.hget(KEYS.state, "idle_ms") == b"1250"


def test_targets_above_the_step_come_back_and_vouched_crossed_ones_go(
    fake: fakeredis.FakeRedis,
) -> None:
    fake.zadd(KEYS.targets, {"a": 5, "b": 20, "c": 50})
    assert publish(fake, 1, 1)[5:] == [5, 20, 50]
    assert publish(fake, 1, 20)[5:] == [50]
    assert fake.zrange(KEYS.targets, 0, -1) == [b"c"]


def test_a_write_that_does_not_vouch_leaves_the_crossed_targets(
    fake: fakeredis.FakeRedis,
) -> None:
    fake.zadd(KEYS.targets, {"a": 5, "b": 20, "c": 50})
    # its waiters are not released by it: the chief must keep hearing of them
    assert publish(fake, 1, 20, vouch=False)[5:] == [50]
    assert fake.zrange(KEYS.targets, 0, -1) == [b"a", b"b", b"c"]


def test_released_waiters_leave_the_index_with_the_announcement_and_nothing_else(
    fake: fakeredis.FakeRedis,
) -> None:
    for waiter, target in (("a", 5), ("b", 20)):
        fake.hset(KEYS.waiter(waiter), mapping={"wait_until_step": str(target)})
        fake.zadd(KEYS.targets, {waiter: target})
    publish(fake, 1, 6, begun=True)
    assert fake.zrange(KEYS.targets, 0, -1) == [b"b"]
    # the entries are keys the script does not declare: they expire by themselves
    assert fake.exists(KEYS.waiter("a")) and fake.exists(KEYS.waiter("b"))


def test_sharded_announcements_on_request(fake: fakeredis.FakeRedis) -> None:
    pubsub = fake.pubsub()
    pubsub.ssubscribe(KEYS.channel)
    publish(fake, 1, 4, command="SPUBLISH")
    messages = [m for m in iter(lambda: pubsub.get_sharded_message(timeout=0.5), None)]
    sharded = [json.loads(m["data"]) for m in messages if m["type"] == "smessage"]
    assert [m["step"] for m in sharded] == [4]


def test_done_is_recorded_and_a_newer_generation_runs_the_job_again(
    fake: fakeredis.FakeRedis,
) -> None:
    publish(fake, 1, 7, done=True)
    assert fake.hget(KEYS.state, "done") == b"1"
    assert int(fake.hget(KEYS.state, "done_ms") or 0) > 0
    publish(fake, 1, 8)  # the finished generation's later write keeps it finished
    assert fake.hget(KEYS.state, "done") == b"1"
    publish(fake, 2, 1)  # a rerun's chief replaces the finished state
    assert (fake.hget(KEYS.state, "done"), fake.hget(KEYS.state, "done_ms")) == (b"0", None)


def test_finishing_shortens_the_keys_life(fake: fakeredis.FakeRedis) -> None:
    fake.zadd(KEYS.targets, {"a": 50})
    publish(fake, 1, 4)
    assert fake.ttl(KEYS.state) > DONE_TTL
    publish(fake, 1, 5, done=True)
    assert 0 < fake.ttl(KEYS.state) <= DONE_TTL and 0 < fake.ttl(KEYS.targets) <= DONE_TTL


# -- probation: a write that created the state -----------------------------------------


def test_a_chief_write_that_finds_no_state_creates_it_without_vouching(
    fake: fakeredis.FakeRedis,
) -> None:
    fake.zadd(KEYS.targets, {"a": 5})
    # its begin is not on record: its writer may be a zombie whose successor's
    # state Redis forgot, so the state it makes vouches for nothing yet
    reply = publish(fake, 3, 10, vouch=True, begun=False)
    status, step, generation, repaired, on_probation, *targets = reply
    assert (status, step, generation, repaired, on_probation) == (scripts.ACCEPTED, 10, 3, 0, 1)
    assert fake.hget(KEYS.state, "vouch") == b"0"
    assert targets == [] and fake.zrange(KEYS.targets, 0, -1) == [b"a"]  # nobody released
    probation = fake.hget(KEYS.state, "probation")
    assert probation == fake.hget(KEYS.state, "beat")  # the id: the making write's beat
    # the probation is Redis's: later writes stay on it, whatever they say...
    assert publish(fake, 3, 11, vouch=True)[4] == 1
    assert fake.hget(KEYS.state, "vouch") == b"0"
    # ...one that names another probation as served too...
    assert publish(fake, 3, 11, vouch=True, served=int(probation or 0) + 1)[4] == 1
    assert fake.hget(KEYS.state, "vouch") == b"0"
    # ...until the writer says it served this very one
    assert publish(fake, 3, 12, vouch=True, served=int(probation or 0))[4] == 0
    assert fake.hget(KEYS.state, "vouch") == b"1"
    assert fake.hget(KEYS.state, "probation") == b"0"  # served (no role may HDEL)


def test_a_lost_reply_does_not_skip_probation(fake: fakeredis.FakeRedis) -> None:
    # issue 32, case 5: the write that made the state on probation applied, its
    # reply was lost; the retry finds its own generation and must still not vouch
    publish(fake, 3, 1000, vouch=True, begun=False)  # the reply is lost
    retry = publish(fake, 3, 1000, vouch=True, begun=False)
    assert retry[:2] == [scripts.ACCEPTED, 1000] and retry[4] == 1  # it says so
    assert fake.hget(KEYS.state, "vouch") == b"0"


def test_a_second_zombie_replacing_the_first_ones_state_is_on_probation(
    fake: fakeredis.FakeRedis,
) -> None:
    # issue 32, case 4: Redis forgot; zombie 1 (generation 1) made the state on
    # probation; zombie 2 (generation 2) finds it, a lower generation without
    # zombie 2's begin on record: it may be a zombie too, so probation again
    publish(fake, 1, 1007, vouch=True, begun=False)
    reply = publish(fake, 2, 2004, vouch=True, begun=False)
    assert reply[:3] == [scripts.ACCEPTED, 2004, 2] and reply[4] == 1
    assert fake.hget(KEYS.state, "vouch") == b"0"
    # the newest chief (generation 3, whose begin Redis forgot as well) replaces
    # it, on probation too: none of them can tell it is the newest; the zombies'
    # next writes are superseded
    assert publish(fake, 3, 30, vouch=True, begun=False)[4] == 1
    assert publish(fake, 2, 2005, vouch=True)[0] == scripts.SUPERSEDED
    assert publish(fake, 1, 1008, vouch=True)[0] == scripts.SUPERSEDED


def test_the_first_write_of_a_generation_just_begun_needs_no_probation(
    fake: fakeredis.FakeRedis,
) -> None:
    assert publish(fake, 3, 10, vouch=True, begun=True)[:5] == [scripts.ACCEPTED, 10, 3, 0, 0]
    assert fake.hget(KEYS.state, "vouch") == b"1"


def test_a_chief_replacing_a_lower_generation_is_not_on_probation(
    fake: fakeredis.FakeRedis,
) -> None:
    publish(fake, 3, 100, vouch=True)
    assert publish(fake, 4, 10, vouch=True)[:5] == [scripts.ACCEPTED, 10, 4, 0, 0]
    assert fake.hget(KEYS.state, "vouch") == b"1"


def test_a_write_that_replaces_malformed_state_creates_it(fake: fakeredis.FakeRedis) -> None:
    fake.hset(KEYS.state, mapping={"generation": "9", "step": "x", "vouch": "1"})
    status, step, _generation, repaired, created = publish(fake, 3, 4, vouch=True, begun=False)[:5]
    assert (status, step, repaired, created) == (scripts.ACCEPTED, 4, 1, 1)
    assert fake.hget(KEYS.state, "vouch") == b"0"


# -- reset markers ---------------------------------------------------------------------


def test_begin_generation_is_above_the_callers_floor(fake: fakeredis.FakeRedis) -> None:
    # issue 32, case 6: a Redis restarted empty with its clock behind must not
    # number this writer's next generation below one it already knows of
    script = fake.register_script(eval_source("begin_generation"))
    floor = 2**52
    assert int(text(script(keys=[KEYS.state, KEYS.reset], args=["", floor])[0])) == floor + 1


def test_a_begin_records_itself_on_another_runs_state_without_fencing_it(
    fake: fakeredis.FakeRedis,
) -> None:
    publish(fake, 5, 10, run_id="other")
    newer = int(begin(fake, run_id="mine")[0])
    assert state(fake)["begun"] == str(newer) and "fence" not in state(fake)
    assert publish(fake, 5, 11, run_id="other")[0] == scripts.ACCEPTED  # not fenced
    # the taker's first write finds its begin on record: no probation
    assert publish(fake, newer, 1, run_id="mine", begun=False)[4] == 0


def test_begin_generation_is_above_the_stored_one(fake: fakeredis.FakeRedis) -> None:
    fake.hset(KEYS.state, mapping={"generation": str(2**52), "step": "1"})
    assert int(begin(fake)[0]) == 2**52 + 1


def test_begin_generation_follows_the_redis_clock_and_reports_what_it_found(
    fake: fakeredis.FakeRedis,
) -> None:
    seconds, micros = fake.time()
    generation, marker, run, beat0, done, chief, stored = begin(fake)
    assert int(generation) >= seconds * 1_000_000 + micros
    assert (marker, run, beat0, done, chief, stored) == ("", "", "0", "0", "", "0")
    # the begin left its fence: a write of an older generation is refused
    assert publish(fake, 5, 10, run_id="run-1")[0] == scripts.SUPERSEDED
    publish(fake, int(generation), 10, run_id="run-1", begun=True)
    publish(fake, int(generation), 11, run_id="run-1", done=True)
    fake.set(KEYS.reset, "12345")
    _next, marker, run, beat_, done, chief, stored = begin(fake, run_id="run-1")
    assert (marker, run, done, chief, stored) == ("12345", "run-1", "1", "host:1", generation)
    assert int(beat_) == beat(fake)
    assert int(_next) > int(generation)


def test_begin_generation_ignores_malformed_state(fake: fakeredis.FakeRedis) -> None:
    fake.hset(KEYS.state, mapping={"generation": str(2**52), "step": "1e3", "run_id": "x"})
    generation, _marker, run, _beat, _done, _chief, stored = begin(fake)
    assert int(generation) < 2**52 and (run, stored) == ("", "0")


def test_reset_deletes_and_leaves_a_new_token(fake: fakeredis.FakeRedis) -> None:
    publish(fake, 1, 7)
    fake.hset(KEYS.waiter("1-x"), mapping={"wait_until_step": "9"})
    pubsub = fake.pubsub()
    pubsub.subscribe(KEYS.channel)
    first = reset(fake, KEYS.waiter("1-x"))
    assert not fake.exists(KEYS.state) and not fake.exists(KEYS.waiter("1-x"))
    assert fake.get(KEYS.reset) == first.encode()
    assert [a.get("reset") for a in announcements(pubsub)] == [True]
    # two resets in a row leave two different tokens
    second = reset(fake)
    assert second != first and fake.get(KEYS.reset) == second.encode()


def test_a_reset_token_is_new_even_within_one_millisecond(
    fake: fakeredis.FakeRedis, monkeypatch: pytest.MonkeyPatch
) -> None:
    frozen = time.time()
    monkeypatch.setattr(time, "time", lambda: frozen)  # fakeredis's TIME stands still
    tokens = [reset(fake) for _ in range(3)]
    assert len(set(tokens)) == 3
    # a chief that began under any earlier token is refused
    assert publish(fake, 2, 1, marker=tokens[1], begun=True)[0] == scripts.WAS_RESET
    assert publish(fake, 2, 1, marker=tokens[2], begun=True)[0] == scripts.ACCEPTED


def test_a_reset_after_a_chief_began_refuses_it_and_creates_nothing(
    fake: fakeredis.FakeRedis,
) -> None:
    publish(fake, 1, 7)  # began with no marker
    token = reset(fake)
    assert publish(fake, 1, 8, marker="", begun=False)[0] == scripts.WAS_RESET
    assert not fake.exists(KEYS.state)
    # a chief that began after the reset carries its token and starts the job anew
    assert publish(fake, 2, 1, marker=token, begun=True)[0] == scripts.ACCEPTED
    assert fake.hget(KEYS.state, "reset_seen") == token.encode()
    assert fake.get(KEYS.reset) == token.encode()


def test_a_reset_marker_is_compared_for_equality_only(fake: fakeredis.FakeRedis) -> None:
    token = reset(fake)
    # a chief that began under an earlier token is refused, and so is one that
    # began under a later-looking one: no order is read into the token
    for other in (str(int(token) - 1), str(int(token) + 1), ""):
        assert publish(fake, 2, 1, marker=other, begun=False)[0] == scripts.WAS_RESET
    assert not fake.exists(KEYS.state)


def test_a_contributor_is_not_refused_by_the_marker_but_finds_nothing_after_a_reset(
    fake: fakeredis.FakeRedis,
) -> None:
    publish(fake, 5, 10, run_id="r", begun=True)
    reset(fake)
    reply = publish(fake, 5, 12, mode="contributor", run_id="r")
    assert reply[0] == scripts.NOTHING_TO_JOIN
    assert not fake.exists(KEYS.state)


# -- malformed content -----------------------------------------------------------------


def test_wrong_types_are_repaired_by_the_chief(fake: fakeredis.FakeRedis) -> None:
    fake.set(KEYS.state, "garbage")
    fake.set(KEYS.targets, "garbage")
    status, step, _generation, repaired, created = publish(fake, 1, 4)[:5]
    assert (status, step, repaired, created) == (scripts.ACCEPTED, 4, 1, 1)
    assert fake.type(KEYS.state) == b"hash"


@pytest.mark.parametrize(
    "text", ["1e3", "0x10", " 5", "5 ", "+5", "-5", "5.0", "1_000", "99999999999999999"]
)
def test_a_stored_number_is_plain_digits_in_lua_as_in_python(
    fake: fakeredis.FakeRedis, text: str
) -> None:
    from stepbarrier._protocol.wire import parse_int

    fake.hset(KEYS.state, mapping={"generation": "1", "step": text, "done": "0"})
    status, step, _generation, repaired = publish(fake, 1, 3)[:4]
    # Lua distrusts the stored step just as Python does: the chief's step replaces it
    assert parse_int(text) is None
    assert (status, step, repaired) == (scripts.ACCEPTED, 3, 1)


def test_a_malformed_beat_counts_from_nothing(fake: fakeredis.FakeRedis) -> None:
    publish(fake, 1, 3)
    fake.hset(KEYS.state, "beat", "lots")
    publish(fake, 1, 4)
    assert beat(fake) == 1  # counted from nothing: a malformed count is no count


def test_a_non_finite_target_score_is_skipped(fake: fakeredis.FakeRedis) -> None:
    fake.zadd(KEYS.targets, {"evil": float("inf"), "half": 7.5, "ok": 9})
    assert publish(fake, 1, 1)[5:] == [9]


def test_a_malformed_run_id_is_refused(fake: fakeredis.FakeRedis) -> None:
    with pytest.raises(Exception, match="malformed run id"):
        publish(fake, 1, 4, run_id='x"}', begun=False)
    assert not fake.exists(KEYS.state)


# -- contributors and operators --------------------------------------------------------


def test_a_contributor_only_raises_the_step_of_the_generation_it_joined(
    fake: fakeredis.FakeRedis,
) -> None:
    assert publish(fake, 0, 9, mode="contributor")[0] == scripts.NOTHING_TO_JOIN
    assert not fake.exists(KEYS.state)  # no chief yet: nothing is created
    publish(fake, 5, 10, run_id="r", begun=True)
    # another generation: it learns the stored one, and nothing changes
    assert publish(fake, 0, 9, mode="contributor", run_id="r")[:3] == [
        scripts.OTHER_GENERATION,
        10,
        5,
    ]
    assert publish(fake, 4, 99, mode="contributor", run_id="r")[0] == scripts.OTHER_GENERATION
    assert fake.hget(KEYS.state, "step") == b"10"
    assert publish(fake, 5, 12, mode="contributor", run_id="r")[:3] == [scripts.ACCEPTED, 12, 5]
    before = beat(fake)
    assert publish(fake, 5, 11, mode="contributor", run_id="r")[:2] == [scripts.ACCEPTED, 12]
    assert beat(fake) == before + 1  # its writes are the generation's too


def test_a_contributor_leaves_the_vouch_to_its_chief(fake: fakeredis.FakeRedis) -> None:
    publish(fake, 5, 10, run_id="r", vouch=False)  # a chief on probation
    publish(fake, 5, 12, mode="contributor", run_id="r", vouch=True)
    assert fake.hget(KEYS.state, "vouch") == b"0"
    publish(fake, 5, 12, run_id="r", vouch=True)
    publish(fake, 5, 13, mode="contributor", run_id="r", vouch=False)
    assert fake.hget(KEYS.state, "vouch") == b"1"


@pytest.mark.parametrize("why", ["another run", "finished", "pinned"])
def test_a_contributor_has_nothing_to_join_in_a_state_not_its_chiefs(
    fake: fakeredis.FakeRedis, why: str
) -> None:
    if why == "another run":
        publish(fake, 5, 12, run_id="other")
    elif why == "finished":
        publish(fake, 5, 12, run_id="r", done=True)
    else:
        publish(fake, 5, 12, run_id="r", mode="operator")
    before = state(fake)
    assert publish(fake, 5, 99, mode="contributor", run_id="r")[0] == scripts.NOTHING_TO_JOIN
    assert state(fake) == before


def test_an_operator_pins_its_step_until_a_newer_chief_replaces_it(
    fake: fakeredis.FakeRedis,
) -> None:
    fake.zadd(KEYS.targets, {"a": 5, "b": 50})
    pubsub = fake.pubsub()
    pubsub.subscribe(KEYS.channel)
    # pinned releases without a vouch: its waiters leave the index at once
    reply = publish(fake, 7, 20, mode="operator", vouch=False)
    assert reply[:5] == [scripts.ACCEPTED, 20, 7, 0, 0] and reply[5:] == [50]
    assert fake.hget(KEYS.state, "pinned") == b"1"
    assert fake.zrange(KEYS.targets, 0, -1) == [b"b"]
    publish(fake, 8, 3, begun=True)
    assert fake.hget(KEYS.state, "pinned") == b"0"
    said = [(a["generation"], a["pinned"]) for a in announcements(pubsub)]
    assert said == [(7, True), (8, False)]


# -- the Python side's layout ----------------------------------------------------------


def test_the_writer_sends_what_the_script_reads(fake: fakeredis.FakeRedis) -> None:
    config = BarrierConfig(job="unit", use_eval=True, run_id="run-3", heartbeat=0.5)
    writer = StepWriter(fake, config, "trainer:9")
    fake.zadd(KEYS.targets, {"a": 5, "b": 40})
    beginning = writer.begin_generation()
    assert beginning.stored is None and beginning.reset_marker == ""
    result = writer.write(
        StepWrite(beginning.generation, 10, done=False, vouch=True, reset_marker="")
    )
    assert result.status == scripts.ACCEPTED
    assert (result.stored_step, result.stored_generation) == (10, beginning.generation)
    assert (result.repaired, result.probation, result.targets) == (False, 0, (40,))
    stored = state(fake)
    assert (stored["run_id"], stored["chief"], stored["vouch"]) == ("run-3", "trainer:9", "1")
    assert stored["heartbeat_period_ms"] == "500" and stored["pinned"] == "0"
    again = writer.begin_generation()
    assert again.generation > beginning.generation
    assert again.stored is not None
    assert (again.stored.run_id, again.stored.beat, again.stored.done) == (
        "run-3",
        int(stored["beat"]),
        False,
    )
    assert (again.stored.chief, again.stored.generation) == ("trainer:9", beginning.generation)


def test_the_writer_reads_probation_and_refusals_back(fake: fakeredis.FakeRedis) -> None:
    config = BarrierConfig(job="unit", use_eval=True)
    writer = StepWriter(fake, config, "trainer:9")
    created = writer.write(StepWrite(5, 1, done=False, vouch=True, reset_marker=""))
    assert created.status == scripts.ACCEPTED
    assert created.probation == int(fake.hget(KEYS.state, "probation") or 0) > 0
    served = writer.write(
        StepWrite(5, 2, done=False, vouch=True, reset_marker="", served=created.probation)
    )
    assert served.probation == 0 and fake.hget(KEYS.state, "vouch") == b"1"
    reset(fake)
    refused = writer.write(StepWrite(5, 3, done=False, vouch=True, reset_marker=""))
    assert refused.status == scripts.WAS_RESET and refused.stored_step is None


# -- the fence a begin sets --------------------------------------------------------


def test_a_begun_generation_fences_older_ones_before_its_first_write(
    fake: fakeredis.FakeRedis,
) -> None:
    assert publish(fake, 5, 100, begun=True)[0] == scripts.ACCEPTED
    newer = int(begin(fake)[0])  # a new chief began, its first write not yet made
    # the older generation (a zombie, or the chief it replaces) may write no more
    assert publish(fake, 5, 120)[0] == scripts.SUPERSEDED
    assert state(fake)["step"] == "100"
    assert publish(fake, newer, 10, begun=True)[0] == scripts.ACCEPTED
    assert state(fake)["generation"] == str(newer) and "fence" not in state(fake)


def test_a_contributor_of_an_older_generation_stops_at_the_fence_and_a_new_one_waits(
    fake: fakeredis.FakeRedis,
) -> None:
    assert publish(fake, 5, 100, begun=True)[0] == scripts.ACCEPTED
    newer = int(begin(fake)[0])
    assert publish(fake, 5, 101, mode="contributor")[0] == scripts.OTHER_GENERATION
    assert publish(fake, 0, 101, mode="contributor")[0] == scripts.NOTHING_TO_JOIN
    assert state(fake)["step"] == "100"
    assert publish(fake, newer, 10, begun=True)[0] == scripts.ACCEPTED
    joined = publish(fake, 0, 11, mode="contributor")
    assert joined[0] == scripts.OTHER_GENERATION and joined[2] == newer  # join this one


def test_a_begin_does_not_fence_another_runs_state(fake: fakeredis.FakeRedis) -> None:
    # another run's chief is watched for liveness, not cut off by a begin
    assert publish(fake, 5, 100, run_id="run-a", begun=True)[0] == scripts.ACCEPTED
    begin(fake, run_id="run-b")
    assert "fence" not in state(fake)
    assert publish(fake, 5, 101, run_id="run-a")[0] == scripts.ACCEPTED


def test_a_begin_on_an_empty_job_leaves_its_fence_for_older_first_writes(
    fake: fakeredis.FakeRedis,
) -> None:
    older = int(begin(fake)[0])  # a chief begins, then pauses before its first write
    newer = int(begin(fake)[0])  # another begins meanwhile
    assert newer > older
    # the paused one's first write (no state: it would need no probation) is refused
    assert publish(fake, older, 99, begun=True)[0] == scripts.SUPERSEDED
    assert publish(fake, newer, 5, begun=True)[0] == scripts.ACCEPTED
    assert state(fake)["step"] == "5" and "fence" not in state(fake)


def test_a_fence_alone_reads_as_no_state_and_no_problem(fake: fakeredis.FakeRedis) -> None:
    from stepbarrier._protocol.wire import parse_state

    begin(fake)
    parsed = parse_state(fake.hgetall(KEYS.state))
    assert parsed.step is None and parsed.problem is None
