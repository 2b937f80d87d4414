"""Issue 32, case 7: stored numbers the Lua orders stay where ``n + 1`` is exact.

Lua's numbers are doubles: at 2**53, ``n + 1 == n``. A stored generation (or
fence, or ``begun``) of 2**53 was read as valid, so every later begin numbered
its generation ``2**53 + 1``, that is 2**53 again: two chiefs of one
generation, and no later chief superseded an older one. Every stored number is
now at most ``MAX_STEP = 2**53 - 2``; a larger one reads as malformed, in the
Lua as in Python. Against a real redis-server, with the state written by hand
as a hostile (or corrupted) writer would leave it.
"""

from __future__ import annotations

import pytest
import redis

from stepbarrier import BarrierConfig, StepPublisher, read_status
from stepbarrier._chief.publish_call import StepWrite, StepWriter
from stepbarrier._protocol import library as scripts
from stepbarrier._protocol.wire import MAX_STEP, parse_int

HOSTILE = [2**53, 2**53 - 1, 2**53 - 2]
"""Above ``MAX_STEP`` (2**53 + 1 rounds to 2**53 in a double, and 2**53 - 1 + 1 is
2**53, whose successor is itself), and ``MAX_STEP`` itself: no generation can be
numbered above it, so a begin treats the state holding it as malformed."""


def test_max_step_leaves_room_for_one_more_exact_number() -> None:
    assert MAX_STEP == 2**53 - 2
    assert float(MAX_STEP + 1) != float(MAX_STEP)  # n + 1 is exact in a double
    assert parse_int(str(MAX_STEP)) == MAX_STEP
    assert parse_int(str(MAX_STEP + 1)) is None


@pytest.mark.parametrize("hostile", HOSTILE)
@pytest.mark.parametrize("field", ["generation", "fence", "begun"])
def test_a_stored_number_no_generation_can_follow_is_malformed_and_newer_chiefs_supersede(
    config: BarrierConfig, client: redis.Redis, field: str, hostile: int
) -> None:
    """A chief begins and writes over the hostile state; a newer one then takes the
    job over from it, and the older one's next write is superseded."""
    client.hset(
        config.keys.state,
        mapping={"generation": "5", "step": "7", "beat": "1", "done": "0", field: str(hostile)},
    )
    older = StepPublisher(config)
    newer: StepPublisher | None = None
    try:
        older.publish(10)
        assert older.flush(10.0), older.last_error
        assert older.generation is not None and older.generation <= MAX_STEP
        status = read_status(config)
        assert (status.step, status.generation) == (10, older.generation)
        newer = StepPublisher(config)
        newer.publish(3)  # lower: stored only because its generation is newer
        assert newer.flush(10.0), newer.last_error
        assert newer.generation is not None and older.generation < newer.generation <= MAX_STEP
        status = read_status(config)
        assert (status.step, status.generation) == (3, newer.generation)
        older.publish(20)
        assert not older.flush(10.0)  # superseded, not stored
        assert not older.active
        status = read_status(config)
        assert (status.step, status.generation) == (3, newer.generation)
    finally:
        older.close(done=False)
        if newer is not None:
            newer.close(done=False)


def test_a_stored_beat_at_max_step_counts_from_nothing(
    config: BarrierConfig, client: redis.Redis
) -> None:
    """The next beat of a beat at ``MAX_STEP`` would be above it, and read as malformed."""
    writer = StepWriter(redis.Redis.from_url(config.redis_url), config, "t:1")
    try:
        generation = writer.begin_generation().generation
        assert writer.write(StepWrite(generation, 1, False, True, "")).status == scripts.ACCEPTED
        client.hset(config.keys.state, "beat", str(MAX_STEP))
        assert writer.write(StepWrite(generation, 2, False, True, "")).status == scripts.ACCEPTED
        assert client.hget(config.keys.state, "beat") == b"1"  # counted from nothing
        assert read_status(config).step == 2
    finally:
        writer.close()
