"""The operator's views as a newcomer meets them (issue 37): ``status``, ``watch`` and
``jobs`` at 80 columns and piped, one stale-chief rule for all of them and for
``status --check``, ``wait``'s piped progress in whole lines, a misspelled job's
close match, ``watch`` of a missing job, and ``--debug`` before the command.

Each test runs the command as a user does (a process, or click's runner), piped,
against the session's real redis-server, and reads what it printed.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner

from stepbarrier import BarrierConfig
from stepbarrier.cli import cli
from stepbarrier.cli._guidance import one_line
from tests.conftest import subprocess_env
from tests.integration.test_cli_guidance import watch_one_frame
from tests.integration.test_cli_publish import write_chief
from tests.observability import prefix
from tests.redis_harness import RedisServer

CLI = [sys.executable, "-m", "stepbarrier"]
WIDTH = 80
HOSTS = (
    "trainer-1:101",
    "trainer-2.us-east1-b.c.ml-prod.internal:15717",
    "worker-" + "x" * 60 + ".example.org:4242",
)
"""Host names of hand-written waiters: one short, one long, one longer than a line."""
LONG_PERIOD_MS = "600000"
"""A chief heartbeat period of 10 min: such a chief is live for 30 min, however slow
the machine running the test."""


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], env=env, capture_output=True, text=True, timeout=60, check=False
    )


def piped_env(server: RedisServer, job: str, **extra: str) -> dict[str, str]:
    """A piped command's environment on an 80-column terminal."""
    return subprocess_env(
        STEPBARRIER_REDIS_URL=server.url, STEPBARRIER_JOB=job, COLUMNS=str(WIDTH), **extra
    )


def write_waiters(client: redis.Redis, config: BarrierConfig, hosts: tuple[str, ...]) -> None:
    """Waiters as a worker registers them, one per host (``host:pid``)."""
    for task, host_pid in enumerate(hosts, start=1):
        host, _, pid = host_pid.rpartition(":")
        waiter_id = f"w{task}"
        client.hset(
            config.keys.waiter(waiter_id),
            mapping={
                "task_id": str(task),
                "wait_until_step": str(100 * task),
                "since": f"{time.time():.3f}",
                "host": host,
                "pid": pid,
            },
        )
        client.zadd(config.keys.targets, {waiter_id: 100 * task})


def column(lines: list[str], header: str, until: str | None = None, sep: str = "") -> str:
    """The text of the table column ``header`` (to ``until``'s column, or the line's
    end) over ``lines`` (the header line first), joined by ``sep``: a folded cell's
    pieces with "", a wrapped one's with " "."""
    start = lines[0].index(header)
    end = None if until is None else lines[0].index(until)
    return sep.join(line[start:end].strip() for line in lines[1:])


def table_lines(output: str, header: str) -> list[str]:
    """The lines of the table whose header line starts with ``header``, to a blank line."""
    lines = output.splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith(header))
    rest = lines[first:]
    return rest[: rest.index("")] if "" in rest else rest


def assert_readable_at_80_columns(output: str) -> None:
    assert output.strip()
    too_wide = [line for line in output.splitlines() if len(line) > WIDTH]
    assert too_wide == []
    assert "…" not in output  # no cell cut short with an ellipsis
    assert "\x1b[" not in output  # piped: no colours nor cursor moves


# -- tables at 80 columns, piped -------------------------------------------------------


@pytest.mark.parametrize("command", [["status"], ["watch", "--until-done"]])
def test_status_and_watch_at_80_columns_piped_show_every_host_whole(
    redis_server: RedisServer,
    client: redis.Redis,
    job: str,
    command: list[str],
) -> None:
    config = BarrierConfig(job=job, redis_url=redis_server.url)
    # done: `watch --until-done` prints its frame and ends
    write_chief(client, config, 0, step="5", done="1", heartbeat_period_ms=LONG_PERIOD_MS)
    write_waiters(client, config, HOSTS)
    result = run(piped_env(redis_server, job), *command)
    assert result.returncode == 0, result.stderr
    assert_readable_at_80_columns(result.stdout)
    table = table_lines(result.stdout, "task")
    assert re.search(r"\bhost\b", table[0]), table[0]  # the header whole, not "ho"
    assert re.search(r"\bwait until step\b", table[0]), table[0]
    hosts = column(table, "host")
    for host in HOSTS:
        assert host in hosts
    assert HOSTS[0] in result.stdout  # a host that fits stays on one line
    for task in (1, 2, 3):  # the numbers never wrap
        assert re.search(rf"^\s*{task}\s+{100 * task}\s", result.stdout, re.MULTILINE)


def test_jobs_at_80_columns_piped_folds_a_long_name_and_marks_the_stale_chief(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    name = prefix("wide")
    stale = BarrierConfig(job=f"{name}-resnet50-imagenet-baseline-0042", redis_url=redis_server.url)
    write_chief(client, stale, 60_000, heartbeat_period_ms="200", run_id="slurm-81")
    write_waiters(client, stale, HOSTS[:1])
    result = CliRunner().invoke(
        cli,
        ["jobs", "--redis-url", redis_server.url, "--job", f"{name}-*"],
        env={"COLUMNS": str(WIDTH)},
    )
    assert result.exit_code == 0, result.output
    assert_readable_at_80_columns(result.stdout)
    table = table_lines(result.stdout, "job")
    assert re.search(r"\bheartbeat\b", table[0]) and re.search(r"\boldest wait$", table[0])
    assert stale.job in column(table, "job", until="run")
    assert re.search(r"\d+\.\d s ago STALE", column(table, "heartbeat", until="waiting", sep=" "))


# -- one stale-chief rule ------------------------------------------------------------------


def test_jobs_status_and_check_call_the_same_chiefs_stale(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    name = prefix("stale-rule")
    # (heartbeat age ms, the chief's period ms) -> stale by three periods, at least 5 s
    chiefs = {
        f"{name}-gone": (60_000, "200"),  # 60 s > 5 s
        f"{name}-slow": (60_000, "30000"),  # 60 s < 90 s: a slow chief, not a gone one
        f"{name}-live": (0, LONG_PERIOD_MS),
    }
    for job, (age, period) in chiefs.items():
        config = BarrierConfig(job=job, redis_url=redis_server.url)
        write_chief(client, config, age, heartbeat_period_ms=period)
    runner = CliRunner()
    listed = runner.invoke(
        cli, ["jobs", "--redis-url", redis_server.url, "--job", f"{name}-*"], env={"COLUMNS": "200"}
    )
    assert listed.exit_code == 0, listed.output
    as_json = runner.invoke(
        cli, ["jobs", "--redis-url", redis_server.url, "--job", f"{name}-*", "--json"]
    )
    flags = {row["job"]: row["stale"] for row in json.loads(as_json.stdout)["jobs"]}
    assert flags == {f"{name}-gone": True, f"{name}-slow": False, f"{name}-live": False}
    for job, stale in flags.items():
        row = next(line for line in listed.stdout.splitlines() if line.startswith(job))
        assert ("STALE" in row) is stale, row
        env = {"STEPBARRIER_REDIS_URL": redis_server.url, "STEPBARRIER_JOB": job}
        shown = runner.invoke(cli, ["status"], env={**env, "COLUMNS": "200"})
        assert shown.exit_code == 0, shown.output
        assert ("STALE" in shown.stdout) is stale, shown.stdout
        check = runner.invoke(cli, ["status", "--check"], env=env)
        # a stale chief is no "live" one: its own documented exit code
        assert check.exit_code == (9 if stale else 0), check.output
        assert (": stale:" in check.stdout) is stale, check.stdout


# -- the vouched row and the beat ------------------------------------------------------------


def test_status_explains_vouched_and_shows_no_raw_beat(
    redis_server: RedisServer, client: redis.Redis, job: str
) -> None:
    config = BarrierConfig(job=job, redis_url=redis_server.url)
    beat = "1796283865620470"  # a beat as stored: the Redis clock (us) + writes
    write_chief(client, config, 0, vouch="1", beat=beat, heartbeat_period_ms=LONG_PERIOD_MS)
    for command in (["status"], ["watch", "--until-done"]):
        if command[0] == "watch":
            client.hset(config.keys.state, "done", "1")
        result = run(piped_env(redis_server, job), *command)
        assert result.returncode == 0, result.stderr
        rows = " ".join(result.stdout.split())
        assert "vouched yes: the step may release the workers waiting for it" in rows
        assert beat not in result.stdout and f"{int(beat):,}" not in result.stdout
        assert "in this generation" not in result.stdout
        assert re.search(r"heartbeat\s+\d+\.\d s ago \(chief trainer-7:4242\)", result.stdout)


# -- wait's piped progress -------------------------------------------------------------------


def test_piped_output_is_plain_whole_lines_even_under_force_color(
    redis_server: RedisServer, client: redis.Redis
) -> None:
    # CI systems set these for colours; rich then calls a pipe a terminal
    job = f"{prefix('force-color')}-a-job-name-long-enough-for-a-wide-line"
    config = BarrierConfig(job=job, redis_url=redis_server.url)
    write_chief(client, config, 0, step="5", heartbeat_period_ms=LONG_PERIOD_MS)
    env = piped_env(redis_server, job, FORCE_COLOR="1", TTY_COMPATIBLE="1")
    waited = run(env, "wait", "--until", "10", "--timeout", "2")
    assert waited.returncode == 3, waited.stderr
    first = next(line for line in waited.stderr.splitlines() if line.startswith("waiting for"))
    assert "\x1b" not in waited.stderr
    # one whole line, wider than the terminal: not cut at 80 columns, nor mid-word
    assert first.startswith(f"waiting for job {job} to reach step 10: chief at step 5")
    assert first.endswith(" left") and len(first) > WIDTH
    shown = run(env, "status")
    assert shown.returncode == 0, shown.stderr
    assert_readable_at_80_columns(shown.stdout)
    assert [line for line in shown.stdout.splitlines() if line != line.rstrip()] == []


def test_a_long_note_is_shortened_at_a_word_end() -> None:
    text = " ".join(f"word{n}" for n in range(100))
    short = one_line(text, 60)
    assert len(short) <= 60 and short.endswith(" ...")
    words = short.removesuffix(" ...").split()
    assert words == [f"word{n}" for n in range(len(words))]  # whole words, none cut
    assert len(" ".join([*words, f"word{len(words)}", "..."])) > 60  # as many as fit
    assert one_line("x" * 300, 50) == "x" * 46 + " ..."
    assert one_line("a\n b  c", 50) == "a b c"


# -- a job that is not there ------------------------------------------------------------------


@pytest.fixture(scope="module")
def typo_server() -> Iterator[RedisServer]:
    """A Redis of this module's own, with more jobs than a message names: the close
    match sorts after the five it lists."""
    server = RedisServer().start()
    client = server.client()
    try:
        for job in [f"a-job-{n}" for n in range(6)] + ["mnist-42"]:
            write_chief(client, BarrierConfig(job=job, redis_url=server.url), 0)
        yield server
    finally:
        client.close()
        server.cleanup()


def test_reset_of_a_misspelled_job_names_the_close_match(typo_server: RedisServer) -> None:
    result = run(piped_env(typo_server, "mnsit-42"), "reset", "--yes")
    assert result.returncode == 6, result.stderr
    assert "no job 'mnsit-42' on this Redis; did you mean 'mnist-42'? jobs here" in result.stderr
    assert "nothing reset" in result.stderr


def test_watch_of_a_missing_job_says_so(typo_server: RedisServer) -> None:
    code, seen, _, err = watch_one_frame(piped_env(typo_server, "mnsit-42"))
    assert code == 0, err
    # said on stderr before the first frame, as status says it
    assert err.startswith("Note: no job 'mnsit-42' on this Redis; did you mean 'mnist-42'?")
    assert "step        none yet" in seen


# -- --debug before the command ---------------------------------------------------------------


def test_debug_and_verbose_work_before_the_command_too() -> None:
    job = f"debug-{uuid.uuid4().hex[:6]}"
    args = ["status", "--redis-url", "ftp://nowhere", "--job", job]
    for flags in (["--debug"], ["--debug", "-v"]):
        result = CliRunner().invoke(cli, [*flags, *args])
        assert result.exit_code == 2, result.output
        assert "Traceback" in result.stderr  # --debug's traceback
        assert "No such option" not in result.stderr
    plain = CliRunner().invoke(cli, args)
    assert plain.exit_code == 2 and "Traceback" not in plain.stderr
    assert "--debug" in CliRunner().invoke(cli, ["--help"]).output
