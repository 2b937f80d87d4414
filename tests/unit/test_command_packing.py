"""How the blocking client packs its commands (``stepbarrier._redis.client``).

redis-py 8.2 sends every argument through its Python ``Encoder`` before hiredis
packs it; stepbarrier's clients let hiredis pack str, bytes and int itself (C), as
redis-py 8.1 did. These tests check that the bytes on the wire are redis-py's own,
and that no argument takes the Python path. No connection is made.
"""

from __future__ import annotations

import pytest
import redis
from redis._parsers.encoders import Encoder
from redis.utils import HIREDIS_AVAILABLE

from stepbarrier import BarrierConfig
from stepbarrier._redis.client import make_client

URL = "redis://127.0.0.1:1/0"

COMMANDS = [
    ("FCALL", "stepbarrier_publish_step", 2, "stepbarrier:{j}:state", "k2", 17, -3, "run"),
    ("SET", "ключ", "värde ✓", "EX", 30),
    ("HSET", b"\xff\x00raw", b"", 2**63 - 1, -(2**63)),
    ("CLIENT SETNAME", "stepbarrier-waiter"),
    ("PUBLISH", "stepbarrier:{j}:steps", '{"step": 9007199254740993}'),
]


def _wire(client: redis.Redis, args: tuple[object, ...]) -> bytes:
    connection = client.connection_pool.make_connection()
    return b"".join(connection.pack_command(*args))


@pytest.mark.parametrize("args", COMMANDS, ids=[c[0] for c in COMMANDS])
def test_the_bytes_sent_are_redis_pys_own(args: tuple[object, ...]) -> None:
    ours = make_client(BarrierConfig(job="j", redis_url=URL))
    theirs = redis.Redis.from_url(URL)
    assert isinstance(ours, redis.Redis)
    assert _wire(ours, args) == _wire(theirs, args)


def test_no_argument_goes_through_redis_pys_python_encoder(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ours = make_client(BarrierConfig(job="j", redis_url=URL))
    assert isinstance(ours, redis.Redis)
    connection = ours.connection_pool.make_connection()
    encoded: list[object] = []
    original = Encoder.encode

    def counting(self: Encoder, value: object) -> bytes:
        encoded.append(value)
        return original(self, value)

    monkeypatch.setattr(Encoder, "encode", counting)
    for args in COMMANDS:
        connection.pack_command(*args)
    connection.pack_commands(COMMANDS)
    # without hiredis, redis-py's Python packer is the only one there is
    assert (encoded == []) is bool(HIREDIS_AVAILABLE), encoded[:3]
