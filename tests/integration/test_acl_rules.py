"""The ACL rules of each role, and ``stepbarrier acl`` that prints them as a users.acl
line. What the rules allow on a real server is in tests/security/test_acl_*.py."""

from __future__ import annotations

import fnmatch
import hashlib
import os
import pty
import re
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from stepbarrier import ConfigurationError
from stepbarrier._protocol.keys import JobKeys
from stepbarrier._protocol.roles import (
    ADMIN_ROLES,
    JOB_ROLES,
    ROLES,
    acl_line,
    emergency_rules,
    installer_rules,
    password_hash,
    role_rules,
    rules_for,
)
from stepbarrier.cli._context import EXIT_USAGE
from tests.conftest import subprocess_env

CLI = [sys.executable, "-m", "stepbarrier", "acl"]
SECRET = "correct-horse-battery-staple-31f0"
TEAM_A = {
    "state": "stepbarrier:{team-a-*}:state",
    "reset": "stepbarrier:{team-a-*}:reset",
    "targets": "stepbarrier:{team-a-*}:targets",
    "registrations": "stepbarrier:{team-a-*}:registrations",
    "waiters": "stepbarrier:{team-a-*}:waiter:*",
    "barrier_index": "stepbarrier:{team-a-*}:barrier-index",
    "barriers": "stepbarrier:{team-a-*}:barrier:*",
    "progress": "stepbarrier:{team-a-*}:progress",
    "job_index": "stepbarrier:{team-a-*}:jobs",
}
TEAM_A_CHANNELS = {"&stepbarrier:{team-a-*}:steps", "&stepbarrier:{team-a-*}:barriers"}
CODE_OF_ITS_OWN = {"+eval", "+evalsha", "+eval_ro", "+evalsha_ro", "+script|load", "+script"}
CODE_OF_ITS_OWN |= {"+function|load", "+function", "+@scripting", "+@all", "allcommands"}
ANYWHERE = {"+scan", "+keys", "allkeys", "~*", "allchannels", "&*", "+acl", "+config"}


def words(rules: str) -> set[str]:
    return set(rules.split())


def root_and_selectors(rules: str) -> tuple[str, list[str]]:
    """The rules outside ACL selectors, and the rules inside each ``(...)``."""
    return re.sub(r"\s*\([^)]*\)", "", rules), re.findall(r"\(([^)]*)\)", rules)


def key_patterns(rules: str) -> set[str]:
    return {word for word in rules.split() if "~" in word}


@pytest.mark.parametrize("role", ROLES)
def test_every_role_starts_from_nothing(role: str) -> None:
    digest = password_hash(SECRET)
    _head, rules = acl_line("someone", role, "*", digest).split(f" #{digest} ")
    assert rules.startswith("resetkeys resetchannels -@all ")


@pytest.mark.parametrize("role", ROLES)
def test_no_role_may_run_code_of_its_own_except_the_installers_function_load(role: str) -> None:
    granted = words(acl_line("someone", role, "*", password_hash(SECRET)))
    forbidden = CODE_OF_ITS_OWN - ({"+function|load"} if role == "installer" else set())
    assert not granted & forbidden
    assert not granted & (ANYWHERE - ({"+scan"} if role == "monitor" else set()))


@pytest.mark.parametrize("role", ROLES)
def test_only_the_monitor_scans_to_find_the_jobs(role: str) -> None:
    # `stepbarrier jobs` and the exporter: there is no index of jobs to read instead
    granted = words(rules_for(role, "team-a-*"))
    assert ("+scan" in granted) == (role == "monitor")
    assert "+keys" not in granted  # SCAN only: KEYS would block Redis on a large keyspace


def test_the_worker_writes_only_the_registry_and_the_barriers() -> None:
    assert key_patterns(role_rules("worker", "team-a-*")) == {
        f"%R~{TEAM_A['state']}",
        f"%R~{TEAM_A['reset']}",
        f"%RW~{TEAM_A['waiters']}",
        f"%RW~{TEAM_A['targets']}",
        f"%RW~{TEAM_A['registrations']}",
        f"%RW~{TEAM_A['barrier_index']}",
        f"%RW~{TEAM_A['barriers']}",
        f"%RW~{TEAM_A['progress']}",  # its own progress (report_progress)
    }


def test_the_chief_reads_and_writes_every_key_of_the_teams_jobs() -> None:
    own = {f"~{key}" for name, key in TEAM_A.items() if name != "job_index"}
    # and its own pattern's job index alone: the pattern's '*' escaped (a glob of
    # 'team-?' would match the index of 'team-*')
    own.add("~stepbarrier:{team-a-\\*}:jobs")
    assert key_patterns(role_rules("chief", "team-a-*")) == own


def test_the_monitor_only_reads_what_status_reads() -> None:
    assert key_patterns(role_rules("monitor", "team-a-*")) == {
        f"%R~{TEAM_A[name]}"
        for name in (
            "state",
            "reset",
            "targets",
            "waiters",
            "barrier_index",
            "barriers",
            "progress",
            "job_index",
        )
    }


@pytest.mark.parametrize(
    ("role", "channels"),
    [("chief", TEAM_A_CHANNELS), ("worker", TEAM_A_CHANNELS)]
    + [(role, set()) for role in ("monitor", *ADMIN_ROLES)],
)
def test_only_the_chief_and_the_worker_get_the_teams_channels(
    role: str, channels: set[str]
) -> None:
    root, _ = root_and_selectors(acl_line("someone", role, "team-a-*", password_hash(SECRET)))
    assert {word for word in root.split() if word.startswith("&")} == channels


@pytest.mark.parametrize(
    ("role", "calls"),
    [
        ("chief", {"+fcall", "+fcall_ro"}),
        ("worker", {"+fcall", "+fcall_ro"}),
        ("monitor", {"+fcall_ro"}),
    ],
)
def test_each_role_calls_the_library_only_as_it_needs(role: str, calls: set[str]) -> None:
    assert words(role_rules(role, "*")) & {"+fcall", "+fcall_ro"} == calls


def test_the_chief_and_the_worker_subscribe_and_only_the_chief_publishes_and_pops() -> None:
    for role in JOB_ROLES:
        granted = words(root_and_selectors(role_rules(role, "*"))[0])
        assert ("+subscribe" in granted) == ("+ssubscribe" in granted) == (role != "monitor")
        assert ("+publish" in granted) == ("+spublish" in granted) == (role == "chief")
        assert ("+blpop" in granted) == (role == "chief")


@pytest.mark.parametrize("role", ROLES)
def test_only_the_worker_has_a_selector_publishing_barrier_news_alone(role: str) -> None:
    # the last arrival at a barrier announces it; a worker that could publish on
    # the step channel could forge a release
    _, selectors = root_and_selectors(rules_for(role, "team-a-*"))
    expected = ["+publish +spublish &stepbarrier:{team-a-*}:barriers"] if role == "worker" else []
    assert selectors == expected


@pytest.mark.parametrize("role", JOB_ROLES)
def test_every_job_role_can_start_a_cluster_client(role: str) -> None:
    assert {"+cluster|slots", "+command"} <= words(role_rules(role, "*"))


def test_the_emergency_role_ends_code_and_touches_nothing() -> None:
    assert emergency_rules() == (
        "resetkeys resetchannels -@all +function|kill +script|kill +function|stats +ping"
    )


def test_the_installer_manages_libraries_and_touches_nothing() -> None:
    granted = words(installer_rules())
    assert {"+function|load", "+function|list", "+function|delete"} <= granted
    assert not key_patterns(installer_rules())
    assert not granted & {"+fcall", "+fcall_ro", "+function|flush"}


def test_the_admin_roles_ignore_the_jobs_pattern() -> None:
    for role in ADMIN_ROLES:
        assert acl_line("x", role, None, "0" * 64) == acl_line("x", role, "team-a-*", "0" * 64)


def patterns(rules: str, access: str) -> list[str]:
    """The key patterns of ``rules`` that grant ``access`` (``R`` or ``RW``)."""
    found = []
    for word in rules.split():
        kind, tilde, pattern = word.partition("~")
        if tilde and (kind.lstrip("%") or "RW") == access:
            found.append(pattern)
    return found


def matches(key: str, globs: list[str]) -> bool:
    # Redis's glob and fnmatch agree on '*' and '?', the only ones a pattern holds
    return any(fnmatch.fnmatchcase(key, glob) for glob in globs)


def barrier_names(keys: JobKeys) -> tuple[str, ...]:
    return (keys.barrier_index, keys.barrier("start"), keys.barrier("end:run-1"))


JOBS = ["a", "team-a-1", "team-a-", "team-b-1", "x.y_z-9", "team-ab", "*", "9" * 64]


@pytest.mark.parametrize("pattern", ["*", "team-a-*", "team-a-1", "team-?-1"])
def test_no_worker_pattern_lets_it_write_a_state_or_a_reset_marker(pattern: str) -> None:
    writable = patterns(role_rules("worker", pattern), "RW")
    for job in JOBS:
        keys = JobKeys.for_job(job)
        assert not matches(keys.state, writable) and not matches(keys.reset, writable), job
        assert matches(keys.targets, writable) == fnmatch.fnmatchcase(job, pattern), job


def test_team_a_patterns_match_no_key_of_another_teams_job() -> None:
    for role in JOB_ROLES:
        rules = role_rules(role, "team-a-*")
        granted = patterns(rules, "R") + patterns(rules, "RW")
        for job in ["team-b-1", "team-ab", "x-team-a-1", "team-b-team-a-1"]:
            keys = JobKeys.for_job(job)
            for key in (*keys.all_fixed(), keys.waiter("x"), keys.channel, *barrier_names(keys)):
                assert not matches(key, granted), (role, key)
        assert matches(JobKeys.for_job("team-a-1").state, granted)


@pytest.mark.parametrize("pattern", ["*", "team-a-*", "mnist-42", "run-?", "a.b_c-*"])
def test_a_valid_pattern_lands_in_every_key_and_channel(pattern: str) -> None:
    rules = role_rules("worker", pattern)
    for word in rules.split():
        if "stepbarrier:" in word:
            assert f"stepbarrier:{{{pattern}}}:" in word


@pytest.mark.parametrize(
    "pattern", ["", "team a", "team-[ab]", "x}:*", "{x}", "a\\*", "a\n", "ü", "x" * 65, "a b"]
)
def test_an_invalid_pattern_is_refused_naming_what_is_allowed(pattern: str) -> None:
    with pytest.raises(ConfigurationError, match=r"letters, digits.*'\*'.*'\?'"):
        role_rules("worker", pattern)


@pytest.mark.parametrize("user", ["", "a b", "-x", "x#y", "user\n", "x" * 65, "é"])
def test_an_invalid_user_name_is_refused(user: str) -> None:
    with pytest.raises(ConfigurationError, match="user name"):
        acl_line(user, "worker", "*", password_hash(SECRET))


def test_the_default_user_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="default"):
        acl_line("default", "monitor", "*", password_hash(SECRET))


@pytest.mark.parametrize("digest", ["", "0" * 63, "G" * 64, "A" * 64, SECRET])
def test_only_a_sha256_is_taken_as_the_password_hash(digest: str) -> None:
    with pytest.raises(ConfigurationError, match="SHA-256"):
        acl_line("x", "worker", "*", digest)


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="chief, worker, monitor, emergency, installer"):
        acl_line("x", "admin", "*", password_hash(SECRET))


def test_a_job_role_needs_a_pattern() -> None:
    with pytest.raises(ConfigurationError, match="jobs pattern"):
        acl_line("x", "chief", None, password_hash(SECRET))


def test_the_line_is_user_name_on_and_the_passwords_sha256() -> None:
    line = acl_line("team-a-worker", "worker", "team-a-*", password_hash(SECRET))
    digest = hashlib.sha256(SECRET.encode()).hexdigest()
    assert line == f"user team-a-worker on #{digest} {role_rules('worker', 'team-a-*')}"


# --- the command line ---


def run_acl(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args],
        input=stdin,
        env=subprocess_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_cli_prints_the_line_for_a_password_file(tmp_path: Path) -> None:
    secret = tmp_path / "worker.password"
    secret.write_text(SECRET + "\n")  # one trailing newline, as `echo` writes it
    result = run_acl("worker", "--user", "w", "--jobs", "team-a-*", "--password-file", str(secret))
    assert result.returncode == 0, result.stderr
    assert result.stdout == acl_line("w", "worker", "team-a-*", password_hash(SECRET)) + "\n"
    assert SECRET not in result.stdout + result.stderr


def test_the_cli_reads_the_password_from_stdin() -> None:
    result = run_acl("chief", "--user", "c", "--jobs", "team-a-*", stdin=SECRET + "\nignored\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == acl_line("c", "chief", "team-a-*", password_hash(SECRET)) + "\n"
    assert SECRET not in result.stdout + result.stderr
    # a team's chief is told how its jobs get into the team's job index (on stderr)
    assert "Give this user's chiefs STEPBARRIER_JOBS_PATTERN='team-a-*'" in result.stderr


@pytest.mark.parametrize("role", ADMIN_ROLES)
def test_the_cli_prints_an_admin_line_without_a_pattern(role: str) -> None:
    result = run_acl(role, "--user", f"the-{role}", stdin=SECRET + "\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == acl_line(f"the-{role}", role, None, password_hash(SECRET)) + "\n"


@pytest.mark.parametrize(
    ("args", "stdin", "message"),
    [
        (["worker", "--user", "w", "--jobs", "team-a-*"], "\n", "empty"),
        (["worker", "--user", "w", "--jobs", "team-a-*"], "", "empty"),
        (["worker", "--user", "w", "--jobs", "team [a]"], SECRET, "letters, digits"),
        (["worker", "--user", "w"], SECRET, "jobs pattern"),
        (["worker", "--user", "a b", "--jobs", "*"], SECRET, "user name"),
        (["worker", "--user", "default", "--jobs", "*"], SECRET, "default"),
        (["admin", "--user", "w", "--jobs", "*"], SECRET, "'admin' is not one of"),
        (["worker", "--jobs", "*"], SECRET, "Missing option '--user'"),
        (["worker", "--user", "w", "--jobs", "*", "--password-file", "/nonexistent"], "", "cannot"),
    ],
)
def test_bad_usage_exits_2_with_a_clear_message_and_no_password(
    args: list[str], stdin: str, message: str
) -> None:
    result = run_acl(*args, stdin=stdin)
    assert result.returncode == EXIT_USAGE, result.stderr
    assert message in result.stderr
    assert result.stdout == ""
    assert "Traceback" not in result.stderr
    assert SECRET not in result.stderr


def test_an_empty_password_file_exits_2(tmp_path: Path) -> None:
    secret = tmp_path / "empty.password"
    secret.write_text("\n")
    result = run_acl("monitor", "--user", "m", "--jobs", "*", "--password-file", str(secret))
    assert result.returncode == EXIT_USAGE
    assert "empty" in result.stderr and result.stdout == ""


def test_the_help_says_where_the_line_goes() -> None:
    result = run_acl("--help")
    assert result.returncode == 0
    text = " ".join(result.stdout.split())
    assert "users.acl" in text and "ACL SETUSER" in text and "ACL LOAD" in text
    assert all(role in text for role in ROLES)


def read_until(fd: int, wanted: bytes, deadline: float) -> bytes:
    seen = b""
    while wanted not in seen:
        assert time.monotonic() < deadline, seen
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            try:
                chunk = os.read(fd, 1024)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            seen += chunk
    return seen


def test_on_a_terminal_the_password_is_asked_twice_and_never_echoed(tmp_path: Path) -> None:
    out = tmp_path / "line"
    main, terminal = pty.openpty()
    with out.open("w") as stdout:
        child = subprocess.Popen(
            [*CLI, "worker", "--user", "w", "--jobs", "team-a-*"],
            stdin=terminal,
            stdout=stdout,
            stderr=terminal,
            env=subprocess_env(),
            start_new_session=True,
        )
    os.close(terminal)
    deadline = time.monotonic() + 60
    try:
        shown = read_until(main, b"Password", deadline)
        os.write(main, SECRET.encode() + b"\n")
        shown += read_until(main, b"Repeat", deadline)
        os.write(main, SECRET.encode() + b"\n")
        assert child.wait(60) == 0
        shown += read_until(main, b"<end of output>", deadline)  # the rest, up to EOF
    finally:
        os.close(main)
        if child.poll() is None:
            child.kill()
    assert SECRET.encode() not in shown
    assert out.read_text() == acl_line("w", "worker", "team-a-*", password_hash(SECRET)) + "\n"
