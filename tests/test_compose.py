"""docker-compose.yml, validated by a real Compose v2 (`config` needs no engine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path
from typing import Any

import compose
import pytest

from stepbarrier import BarrierConfig
from stepbarrier.config import ENVIRONMENT_VARIABLES
from tests.conftest import ROOT

COMPOSE_FILE = Path(ROOT) / "docker-compose.yml"
# The binary itself: the package's console-script wrapper always exits 0.
COMPOSE = Path(compose.__file__).parent / "docker-compose"
ACL = (Path(ROOT) / "ops" / "redis" / "users.acl").read_text()


def compose_config(path: Path, run_id: str | None = None) -> subprocess.CompletedProcess[str]:
    """`docker-compose config` of ``path`` with ``STEPBARRIER_RUN_ID`` set only if given.

    Neither the caller's environment nor a developer's ``.env`` file can set it.
    """
    env = {k: v for k, v in os.environ.items() if k != "STEPBARRIER_RUN_ID"}
    if run_id is not None:
        env["STEPBARRIER_RUN_ID"] = run_id
    return subprocess.run(
        [str(COMPOSE), "--file", str(path), "--project-directory", str(path.parent),
         "--env-file", os.devnull, "config", "--format", "json"],
        capture_output=True, text=True, timeout=60, check=False, env=env,
    )  # fmt: skip


def resolve(run_id: str | None = None) -> dict[str, Any]:
    result = compose_config(COMPOSE_FILE, run_id)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    return resolve()


def test_compose_binary_is_the_real_one() -> None:
    version = subprocess.run([str(COMPOSE), "version"], capture_output=True, text=True, check=True)
    assert "Docker Compose version v2" in version.stdout


def test_the_file_has_redis_ps_chief_and_three_workers(resolved: dict[str, Any]) -> None:
    assert set(resolved["services"]) == {"redis", "ps", "chief", "worker-1", "worker-2", "worker-3"}


def test_every_stepbarrier_variable_is_one_the_configuration_knows(
    resolved: dict[str, Any],
) -> None:
    used = {
        name
        for service in resolved["services"].values()
        for name in service.get("environment") or {}
        if name.startswith("STEPBARRIER_")
    }
    assert used  # the file does configure the barrier
    assert used <= set(ENVIRONMENT_VARIABLES), used - set(ENVIRONMENT_VARIABLES)


def test_every_service_has_a_healthcheck(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        assert service.get("healthcheck", {}).get("test"), name


def test_redis_port_is_published_on_the_host_loopback(resolved: dict[str, Any]) -> None:
    [port] = resolved["services"]["redis"]["ports"]
    assert (port["host_ip"], port["target"], port["published"]) == ("127.0.0.1", 6379, "6379")


def test_training_tasks_are_built_from_ops_dockerfile(resolved: dict[str, Any]) -> None:
    for name in ("ps", "chief", "worker-1", "worker-2", "worker-3"):
        assert resolved["services"][name]["build"]["dockerfile"] == "ops/Dockerfile"


def _barrier_config(resolved: dict[str, Any], name: str) -> BarrierConfig:
    """The configuration the container would build, its secret read from the host."""
    service = resolved["services"][name]
    env = dict(service["environment"])
    mounted = {s["target"]: s["source"] for s in service.get("secrets", [])}
    secret = mounted[env["STEPBARRIER_REDIS_PASSWORD_FILE"]]
    env["STEPBARRIER_REDIS_PASSWORD_FILE"] = resolved["secrets"][secret]["file"]
    return BarrierConfig.from_env(env)


@pytest.mark.parametrize(
    ("name", "role", "task_id", "step"),
    [
        ("chief", "chief", 0, None),
        ("worker-1", "worker", 1, 207),
        ("worker-2", "worker", 2, 329),
        ("worker-3", "worker", 3, 415),
    ],
)
def test_each_task_gets_a_valid_configuration_and_the_right_user(
    resolved: dict[str, Any], name: str, role: str, task_id: int, step: int | None
) -> None:
    config = _barrier_config(resolved, name)
    assert (config.role, config.task_id) == (role, task_id)
    assert config.redis_username == role
    password = re.search(rf"^user {role} on .*?>(\S+)", ACL, re.MULTILINE)
    assert password is not None and config.redis_password == password.group(1)
    if step is not None:
        assert config.resolved_wait_until_step() == step


BARRIER_TASKS = ("chief", "worker-1", "worker-2", "worker-3")


def test_the_run_id_reaches_the_chief_and_every_worker() -> None:
    run_id = "1767225600"  # what `STEPBARRIER_RUN_ID=$(date +%s)` gives
    resolved = resolve(run_id)
    for name in BARRIER_TASKS:
        assert _barrier_config(resolved, name).run_id == run_id, name
    tasks_with_a_run_id = {
        name
        for name, service in resolved["services"].items()
        if "STEPBARRIER_RUN_ID" in (service.get("environment") or {})
    }
    assert tasks_with_a_run_id == set(BARRIER_TASKS)


def test_without_a_run_id_the_file_is_valid_and_no_task_has_one(
    resolved: dict[str, Any],
) -> None:
    for name in BARRIER_TASKS:
        assert _barrier_config(resolved, name).run_id is None, name


def test_the_header_says_how_to_give_each_run_its_own_id() -> None:
    header = COMPOSE_FILE.read_text().split("\n\n", 1)[0]
    assert "STEPBARRIER_RUN_ID=$(date +%s) docker compose up" in header
    assert "STEPBARRIER_DONE_TTL" in header  # what happens without one


def _copy_project(tmp_path: Path, text: str) -> Path:
    """The compose file (possibly edited) in a directory with the real ops/."""
    (tmp_path / "ops").symlink_to(Path(ROOT) / "ops")
    path = tmp_path / "docker-compose.yml"
    path.write_text(text)
    return path


def test_an_unchanged_copy_is_valid(tmp_path: Path) -> None:
    result = compose_config(_copy_project(tmp_path, COMPOSE_FILE.read_text()))
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("original", "broken"),
    [
        ("condition: service_healthy", "condition: service_happy"),
        ("      chief:\n        condition", "      chef:\n        condition"),
        ("    retries: 30", "    retries: [30]"),
        ("services:\n", "services:\n  bad indentation\n"),
    ],
)
def test_a_broken_copy_fails(tmp_path: Path, original: str, broken: str) -> None:
    text = COMPOSE_FILE.read_text()
    assert original in text
    result = compose_config(_copy_project(tmp_path, text.replace(original, broken, 1)))
    assert result.returncode != 0
    assert result.stderr.strip()
