"""Whatever a worker (or anyone with write access) puts in a job's keys, every
operator view shows it literally and exits 0: ``status``, ``status --json``,
``watch`` and the demo's live view."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from rich.console import Console

from stepbarrier import BarrierConfig, read_status
from stepbarrier.cli._views.status import status_view
from tests.conftest import subprocess_env
from tests.hostile_content import (
    CHIEF,
    HOSTILE_SCORES,
    HOSTILE_SINCE,
    assert_shown_literally,
    host,
    write_hostile,
)
from tests.redis_harness import RedisServer

CLI = [sys.executable, "-m", "stepbarrier"]


@pytest.fixture
def hostile(client: redis.Redis, make_config: Callable[..., BarrierConfig]) -> BarrierConfig:
    config = make_config()
    write_hostile(client, config, done=True)
    return config


def cli(config: BarrierConfig, *args: str) -> subprocess.CompletedProcess[str]:
    env = subprocess_env(
        STEPBARRIER_REDIS_URL=config.redis_url, STEPBARRIER_JOB=config.job, COLUMNS="250"
    )
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def test_read_status_keeps_hostile_times_out_and_reports_them(hostile: BarrierConfig) -> None:
    status = read_status(hostile)
    assert {w.host for w in status.waiters} == {
        *(host(i) for i in range(len(HOSTILE_SINCE))),
        "\\x1b[31mred",
    }
    assert all(w.since is None for w in status.waiters)
    for since in HOSTILE_SINCE:
        assert any(f"since={since!r}" in problem for problem in status.problems), since
    for waiter_id in HOSTILE_SCORES:
        assert any(waiter_id in problem for problem in status.problems), waiter_id
    assert status.chief == CHIEF


def test_status_shows_hostile_content_literally(hostile: BarrierConfig) -> None:
    result = cli(hostile, "status")
    assert result.returncode == 0, result.stderr
    assert_shown_literally(result.stdout)
    for index in range(len(HOSTILE_SINCE)):  # an implausible time is "?", twice per row
        [row] = [line for line in result.stdout.splitlines() if host(index) in line]
        assert row.split().count("?") == 2, row
    assert "malformed reset marker: '1e20'" in result.stdout


def test_status_json_stays_valid_json_without_nan(hostile: BarrierConfig) -> None:
    result = cli(hostile, "status", "--json")
    assert result.returncode == 0, result.stderr

    def reject(constant: str) -> None:
        raise AssertionError(f"{constant} is not JSON")

    data = json.loads(result.stdout, parse_constant=reject)
    assert data["chief"] == CHIEF
    assert len(data["waiters"]) == len(HOSTILE_SINCE) + 1
    assert all(waiter["since"] is None for waiter in data["waiters"])
    assert data["problems"]


def test_watch_shows_hostile_content_literally(hostile: BarrierConfig) -> None:
    result = cli(hostile, "watch", "--until-done", "--interval", "0.05")
    assert result.returncode == 0, result.stderr
    assert_shown_literally(result.stdout)


def test_a_view_of_a_status_with_markup_in_every_text_renders(
    client: redis.Redis, make_config: Callable[..., BarrierConfig]
) -> None:
    config = make_config()
    write_hostile(client, config, done=False)
    console = Console(width=250, record=True, color_system=None)
    console.print(status_view(read_status(config), progress=True))
    assert_shown_literally(console.export_text())


FAKE_TRAINING = textwrap.dedent(
    """
    # Stands in for the TensorFlow example: the "chief" writes hostile content
    # into the demo's Redis, then ends once the workers have.
    import json, os, pathlib, time
    import redis

    from stepbarrier import BarrierConfig
    from tests.hostile_content import write_hostile

    task = json.loads(os.environ["TF_CONFIG"])["task"]
    record = pathlib.Path(os.environ["RECORD_FILE"])
    if task["type"] == "ps":
        time.sleep(600)  # the demo stops it
    elif task["type"] == "chief":
        config = BarrierConfig(
            job=os.environ["STEPBARRIER_JOB"], redis_url=os.environ["STEPBARRIER_REDIS_URL"]
        )
        write_hostile(redis.Redis.from_url(config.redis_url), config, done=False)
        print("chief ready at global step 0", flush=True)
        deadline = time.monotonic() + 60
        while not record.with_name("worker-1.json").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
    else:
        record.write_text(json.dumps({"task_id": task["index"] + 1}))
    """
)


def test_the_demo_view_shows_hostile_content_literally(tmp_path: Path) -> None:
    script = tmp_path / "fake_training.py"
    script.write_text(FAKE_TRAINING)
    job = f"demo-hostile-{uuid.uuid4().hex[:8]}"
    options = ["--workers", "1", "--steps", "10", "--job", job, "--example", str(script)]
    result = subprocess.run(
        [sys.executable, "-m", "examples.demo", *options, "--redis-kind", "redis-server"],
        env=subprocess_env(COLUMNS="250"),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert_shown_literally(result.stdout)


entry_values = st.one_of(
    st.binary(max_size=30),
    st.text(max_size=30).map(str.encode),
    st.floats().map(repr).map(str.encode),
    st.sampled_from([b"[/x]", b"[bold red]", b"\x1b[2J", b"1e20", b"nan", b"-inf", b""]),
)
entries = st.dictionaries(
    st.sampled_from([b"wait_until_step", b"since", b"host", b"pid", b"task_id", b"\xff"]),
    entry_values,
    min_size=1,
)
scores = st.one_of(st.integers(-(2**60), 2**60).map(float), st.floats(allow_nan=False))


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(entry=entries, score=scores, chief=entry_values)
def test_any_indexed_entry_gives_a_status_json_and_a_view(
    redis_server: RedisServer, entry: dict[bytes, bytes], score: float, chief: bytes
) -> None:
    config = BarrierConfig(job=f"fuzz-{uuid.uuid4().hex[:10]}", redis_url=redis_server.url)
    client = redis_server.client()
    try:
        client.hset(config.keys.state, mapping={"step": "1", "generation": "1", "chief": chief})
        client.hset(config.keys.waiter("w"), mapping=entry)  # type: ignore[arg-type]
        client.zadd(config.keys.targets, {"w": score})
        status = read_status(config, client)
        json.dumps(status.to_dict(), allow_nan=False)
        for waiter in status.waiters:
            assert waiter.since is None or 0 <= waiter.since < 1e11
        Console(width=200, file=io.StringIO()).print(status_view(status, progress=True))
    finally:
        client.delete(*config.keys.all_fixed(), config.keys.waiter("w"))
        client.close()
