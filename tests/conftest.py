"""Shared fixtures: one real redis-server for the session, one job name per test."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from hypothesis import settings

from stepbarrier import BarrierConfig
from stepbarrier._config.defaults import LAUNCHER_VARIABLES
from tests.redis_harness import RedisServer

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# CI runs the same examples every time (a red build is a real, reproducible
# failure: rerun it and see it again); a developer's run keeps exploring new ones.
# Per-test @settings keep their own example counts and inherit the rest. Both
# start from Hypothesis's defaults: it loads a "ci" profile of its own whenever a
# CI variable exists at all, even CI=false.
_DEFAULTS = settings.get_profile("default")
settings.register_profile("ci", parent=_DEFAULTS, derandomize=True, database=None, print_blob=True)
settings.register_profile("dev", parent=_DEFAULTS)
HYPOTHESIS_PROFILE = (
    "ci" if os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no") else "dev"
)
settings.load_profile(HYPOTHESIS_PROFILE)


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A real redis-server started for this test session on a free port."""
    server = RedisServer()
    server.start()
    try:
        yield server
    finally:
        server.cleanup()


@pytest.fixture
def job(request: pytest.FixtureRequest) -> str:
    """A job name unique to this test."""
    name = re.sub(r"[^A-Za-z0-9._-]", "-", request.node.name)[:40]
    return f"{name}-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def make_config(redis_server: RedisServer, job: str) -> Callable[..., BarrierConfig]:
    """Build a config for this test's job on the session's server."""

    def build(**overrides: Any) -> BarrierConfig:
        settings: dict[str, Any] = {"job": job, "redis_url": redis_server.url}
        settings.update(overrides)
        return BarrierConfig(**settings)

    return build


@pytest.fixture
def config(make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    """This test's config with a fast heartbeat."""
    return make_config(heartbeat=0.2, stall_timeout=30.0)


@pytest.fixture
def long_heartbeats(monkeypatch: pytest.MonkeyPatch) -> None:
    """Let this test's configs have a heartbeat above the protocol's 1 s limit.

    For tests of when the chief writes (a crossed threshold, a new session's
    first step): with a minute-long heartbeat, a write that comes at once cannot
    be a heartbeat's. Such a chief breaks the job-wide fence, so only these
    tests, which run no zombie, may have one.
    """
    monkeypatch.setattr("stepbarrier._config.settings.MAX_HEARTBEAT", 3600.0)


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A plain redis-py client on the session's server."""
    c = redis_server.client()
    yield c
    c.close()


def subprocess_env(**extra: str) -> dict[str, str]:
    """Environment for child processes: this checkout importable, TF quiet."""
    env = {
        k: v
        for k, v in os.environ.items()
        # nor a launcher's run id: a suite run under torchrun or Slurm names no run
        if not k.startswith("STEPBARRIER_") and k not in ("TF_CONFIG", *LAUNCHER_VARIABLES)
    }
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    env["TF_CPP_MIN_LOG_LEVEL"] = "2"
    env.update(extra)
    return env
