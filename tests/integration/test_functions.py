"""The Redis Functions library: versioned, loaded by an administrator (or by a
client that may), and a clear error for everyone else; EVAL only by opt-in."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator

import pytest
import redis

from stepbarrier import BarrierConfig, RedisRefused, StepPublisher, StepWaiter
from stepbarrier._redis.functions import (
    LIBRARY_NAME,
    LIBRARY_VERSION,
    install_functions,
    library_sha256,
    library_source,
    loaded_versions,
)
from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer

LIBRARY_SHA256 = {
    1: "659e3f3e9ccdb8f353f670e94593fc9c296b6abb5f3d13b2ff7cdccab66f1a59",
    2: "b571c3f276660dcca736e151afd268cfb81f0c5d293005a12675cf8f295dae18",
    3: "45c383e598ac0599b6e1c078b09e9af094a8583fb4288f8df75157c227a97497",
    4: "f3383d810373ccbe5ca0518117d11bae34b5415693e2abbe100fd9243bef1a71",
}
"""The library's fingerprint per version: changing the code means a new version."""

CLI = [sys.executable, "-m", "stepbarrier"]


@pytest.fixture
def bare_server() -> Iterator[RedisServer]:
    """A server of this test's own, with no library loaded."""
    server = RedisServer().start()
    try:
        yield server
    finally:
        server.cleanup()


def limited_user(server: RedisServer, name: str = "limited") -> str:
    """A user that may run everything but load code; returns its URL."""
    with server.client() as admin:
        admin.acl_setuser(
            name,
            enabled=True,
            passwords=["+pw"],
            keys=["*"],
            channels=["*"],
            commands=["+@all", "-function|load", "-function|delete", "-function|flush"],
        )
    return server.url.replace("redis://", f"redis://{name}:pw@")


def test_the_library_version_changes_whenever_the_code_does() -> None:
    assert library_sha256() == LIBRARY_SHA256[LIBRARY_VERSION], (
        "the Lua code changed: raise redis_code.LIBRARY_VERSION and record the new "
        f"fingerprint {library_sha256()}"
    )


def test_a_client_that_may_load_the_library_loads_it_itself(bare_server: RedisServer) -> None:
    config = BarrierConfig(job="j", redis_url=bare_server.url, heartbeat=0.2, stall_timeout=30.0)
    with StepPublisher(config) as chief:
        chief.publish(3)
        assert chief.flush(5.0)
    with bare_server.client() as client:
        assert loaded_versions(client) == [LIBRARY_VERSION]


def test_a_missing_library_is_a_clear_refusal_naming_the_install_command(
    bare_server: RedisServer,
) -> None:
    config = BarrierConfig(job="j", redis_url=limited_user(bare_server), stall_timeout=30.0)
    with StepWaiter(config) as waiter, pytest.raises(RedisRefused) as info:
        waiter.wait(5, timeout=10)
    assert info.value.kind == "functions"
    message = str(info.value)
    assert "stepbarrier functions install" in message and LIBRARY_NAME in message
    assert "has no stepbarrier Functions library" in message and "pw" not in message
    chief = StepPublisher(config)
    chief.publish(1)
    assert not chief.flush(5.0)  # a refusal, not a retry for ever
    assert chief.last_failure is not None and chief.last_failure.kind == "functions"
    chief.close(done=False, timeout=0.5)


def test_a_version_mismatch_names_the_versions_found(bare_server: RedisServer) -> None:
    with bare_server.client() as admin:
        admin.function_load(
            "#!lua name=stepbarrier_v0\n"
            "redis.register_function('stepbarrier_v0_version', function() return 0 end)"
        )
    config = BarrierConfig(job="j", redis_url=limited_user(bare_server), stall_timeout=30.0)
    with StepWaiter(config) as waiter, pytest.raises(RedisRefused) as info:
        waiter.wait(5, timeout=10)
    assert "version(s) 0" in str(info.value)
    assert f"needs version {LIBRARY_VERSION}" in str(info.value)


def test_installing_is_idempotent_and_leaves_other_versions(bare_server: RedisServer) -> None:
    with bare_server.client() as admin:
        admin.function_load(
            "#!lua name=stepbarrier_v0\n"
            "redis.register_function('stepbarrier_v0_version', function() return 0 end)"
        )
        assert install_functions(admin) == LIBRARY_NAME
        assert install_functions(admin) == LIBRARY_NAME
        assert loaded_versions(admin) == [0, LIBRARY_VERSION]


def test_the_cli_installs_reports_and_prints_the_library(bare_server: RedisServer) -> None:
    env = subprocess_env(STEPBARRIER_REDIS_URL=bare_server.url)
    before = subprocess.run([*CLI, "functions", "status"], env=env, capture_output=True, text=True)
    assert before.returncode == 2 and "loaded: none" in before.stdout
    done = subprocess.run([*CLI, "functions", "install"], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert f"loaded {LIBRARY_NAME}" in done.stdout
    after = subprocess.run([*CLI, "functions", "status"], env=env, capture_output=True, text=True)
    assert after.returncode == 0 and f"loaded: {LIBRARY_VERSION}" in after.stdout
    shown = subprocess.run([*CLI, "functions", "source"], env=env, capture_output=True, text=True)
    assert shown.stdout == library_source()


def test_a_server_without_functions_is_told_about_the_eval_fallback() -> None:
    server = RedisServer(args=["--rename-command", "FCALL", "", "--rename-command", "FCALL_RO", ""])
    server.start()
    try:
        config = BarrierConfig(job="j", redis_url=server.url, heartbeat=0.2, stall_timeout=30.0)
        with StepWaiter(config) as waiter, pytest.raises(RedisRefused) as info:
            waiter.wait(5, timeout=10)
        assert "STEPBARRIER_USE_EVAL=1" in str(info.value)
        # opted in, the same job runs on scripts
        scripted = BarrierConfig(
            job="j", redis_url=server.url, heartbeat=0.2, stall_timeout=30.0, use_eval=True
        )
        with StepPublisher(scripted) as chief:
            chief.publish(7)
            assert chief.flush(5.0)
            with StepWaiter(scripted) as waiter:
                assert waiter.wait(5, timeout=10) == 7
    finally:
        server.cleanup()


def test_use_eval_comes_from_the_environment() -> None:
    assert BarrierConfig.from_env({"STEPBARRIER_JOB": "j", "STEPBARRIER_USE_EVAL": "1"}).use_eval
    assert not BarrierConfig.from_env({"STEPBARRIER_JOB": "j"}).use_eval
    with pytest.raises(ValueError, match="STEPBARRIER_USE_EVAL must be 1 or 0"):
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", "STEPBARRIER_USE_EVAL": "maybe"})


def test_every_function_is_declared_in_the_library(client: redis.Redis) -> None:
    install_functions(client)
    listed = client.function_list(library=LIBRARY_NAME)
    text = repr(listed)
    for name in (
        "begin_generation",
        "publish_step",
        "reset_job",
        "waiter_register",
        "waiter_read",
        "waiter_leave",
        "may_write",
        "barrier_arrive",
        "report_progress",
        "version",
    ):
        assert f"{LIBRARY_NAME}_{name}" in text
    assert int(client.fcall_ro(f"{LIBRARY_NAME}_version", 0)) == LIBRARY_VERSION
