"""Fixtures of the protocol's regression tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.redis_harness import RedisServer


@pytest.fixture
def own_server() -> Iterator[RedisServer]:
    """A redis-server of this test alone (it restarts it, or fills it)."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()
