"""docker-compose.yml, validated by a real Compose v2 (`config` needs no engine)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from pathlib import Path
from typing import Any

import compose
import pytest

from stepbarrier import BarrierConfig
from stepbarrier._config.defaults import ENVIRONMENT_VARIABLES
from stepbarrier._protocol.roles import password_hash
from stepbarrier._redis.functions import LIBRARY_VERSION, function_name
from tests.conftest import ROOT
from tests.ops_redis import OPS, PASSWORDS
from tests.redis_harness import RedisServer

COMPOSE_FILE = Path(ROOT) / "docker-compose.yml"
SCRIPT_VARIABLES = {"STEPBARRIER_EXAMPLE_PASSWORDS"}
"""Variables of ops/redis/start-redis.sh, not of stepbarrier's configuration."""
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


def test_the_file_has_redis_ps_chief_three_workers_and_the_exporter(
    resolved: dict[str, Any],
) -> None:
    assert set(resolved["services"]) == {
        "redis", "ps", "chief", "worker-1", "worker-2", "worker-3", "exporter"
    }  # fmt: skip


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
    known = set(ENVIRONMENT_VARIABLES) | SCRIPT_VARIABLES
    assert used <= known, used - known
    script = (OPS / "start-redis.sh").read_text()
    assert all(f"${{{name}" in script for name in SCRIPT_VARIABLES)


def test_only_redis_opts_in_to_the_example_passwords_on_the_hosts_loopback(
    resolved: dict[str, Any],
) -> None:
    """The passwords are the public examples: start-redis.sh takes them only with
    the opt-in, and nothing is published beyond the host's loopback."""
    opted_in = {
        name
        for name, service in resolved["services"].items()
        if "STEPBARRIER_EXAMPLE_PASSWORDS" in (service.get("environment") or {})
    }
    assert opted_in == {"redis"}
    environment = resolved["services"]["redis"]["environment"]
    assert environment["STEPBARRIER_EXAMPLE_PASSWORDS"] == "loopback-only"
    for name, service in resolved["services"].items():
        for port in service.get("ports", []):
            assert port.get("host_ip") == "127.0.0.1", (name, port)
    assert "ports" in resolved["services"]["redis"]


def test_every_service_has_a_healthcheck(resolved: dict[str, Any]) -> None:
    for name, service in resolved["services"].items():
        assert service.get("healthcheck", {}).get("test"), name


def test_redis_is_published_on_a_free_port_of_the_host_loopback(resolved: dict[str, Any]) -> None:
    """Docker picks the host's port (`docker compose port redis 6379` prints it):
    a fixed 6379 would fail `up` beside a developer's own Redis."""
    [port] = resolved["services"]["redis"]["ports"]
    assert (port["host_ip"], port["target"], port.get("published")) == ("127.0.0.1", 6379, None)
    header = COMPOSE_FILE.read_text().split("\nx-", 1)[0]
    assert '--redis-url "redis://$(docker compose port redis 6379)/0"' in header


def test_workers_do_not_report_the_step_their_acl_forbids(resolved: dict[str, Any]) -> None:
    """The worker user may not write the job's step (ops/redis/users.acl), so the
    workers are not asked to report it: no refusal in their logs."""
    for name in ("worker-1", "worker-2", "worker-3"):
        environment = resolved["services"][name]["environment"]
        assert environment["STEPBARRIER_REDIS_USERNAME"] == "worker", name
        assert environment["STEPBARRIER_REPORT_EVERY"] == "0", name
        assert _barrier_config(resolved, name).report_every == 0, name


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
    digest = re.search(rf"^user {role} on #([0-9a-f]{{64}}) ", ACL, re.MULTILINE)
    assert config.redis_password is not None and digest is not None
    assert password_hash(config.redis_password) == digest.group(1)
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


def _mounted(resolved: dict[str, Any], name: str) -> dict[str, str]:
    """Container path -> host path of a service's bind mounts and secrets."""
    service = resolved["services"][name]
    paths = {v["target"]: v["source"] for v in service.get("volumes", []) if v["type"] == "bind"}
    for secret in service.get("secrets", []):
        paths[secret["target"]] = resolved["secrets"][secret["source"]]["file"]
    return paths


def test_redis_mounts_the_ops_files_and_only_the_installers_secret(
    resolved: dict[str, Any],
) -> None:
    mounted = _mounted(resolved, "redis")
    files = {Path(host).name: Path(host) for host in mounted.values()}
    assert set(files) == {
        "redis.conf",
        "users.acl",
        "start-redis.sh",
        "stepbarrier-functions.lua",
        "installer.password",
    }
    for name, host in files.items():
        expected = OPS / "example-secrets" / name if name.endswith(".password") else OPS / name
        assert host == expected, name
    assert all(volume["read_only"] for volume in resolved["services"]["redis"]["volumes"])


def test_no_training_task_gets_an_administrators_password(resolved: dict[str, Any]) -> None:
    for name in ("ps", *BARRIER_TASKS):
        files = {Path(host).name for host in _mounted(resolved, name).values()}
        assert not files & {"installer.password", "emergency.password"}, name


def test_redis_runs_as_the_images_unprivileged_user(resolved: dict[str, Any]) -> None:
    assert resolved["services"]["redis"]["user"] == "redis"


def test_redis_starts_through_start_redis_sh_and_is_healthy_once_the_library_is_loaded(
    resolved: dict[str, Any], tmp_path: Path
) -> None:
    """The service's own command and healthcheck, run here: container paths become
    the host files they mount; the harness's options (loopback, a free port, a
    temporary directory, the ACL file's host path) come after redis.conf."""
    service = resolved["services"]["redis"]
    mounted = _mounted(resolved, "redis")
    server = RedisServer()
    options = server.command()[1:]  # --port N --bind 127.0.0.1 ... of the harness
    command = [mounted.get(word, word) for word in service["command"]]
    command += [*options, "--aclfile", mounted["/usr/local/etc/redis/users.acl"]]
    health = service["healthcheck"]["test"][1].replace("$$", "$")
    for container_path, host_path in mounted.items():
        health = health.replace(container_path, host_path)
    health = health.replace("redis-cli ", f"redis-cli -p {server.port} ")
    inherited = {k: v for k, v in os.environ.items() if k != "STEPBARRIER_EXAMPLE_PASSWORDS"}
    env = {**inherited, **service["environment"], "REDIS_PORT": str(server.port)}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["sh", "-c", health], check=False).returncode != 0:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the healthcheck never passed"
            time.sleep(0.1)
        chief = server.client(username="chief", password=PASSWORDS["chief"])
        try:
            assert chief.fcall(function_name("version"), 0) == LIBRARY_VERSION
        finally:
            chief.close()
    finally:
        process.terminate()  # the script passes it on to redis-server
        assert process.wait(30) == 0
        server.cleanup()


CLUSTER_FILE = Path(ROOT) / "docker-compose.cluster.yml"
"""The same job on a 6-node Redis Cluster (tests/repository/test_compose_cluster.py runs its
nodes, its cluster creation and a round trip on local redis-server processes)."""


def test_the_cluster_file_is_valid_and_points_every_barrier_task_at_the_cluster() -> None:
    result = compose_config(CLUSTER_FILE)
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    services = resolved["services"]
    nodes = {n for n, s in services.items() if "--cluster-enabled" in (s.get("command") or [])}
    assert len(nodes) == 6
    # every node answers to the seed's name, and nothing else does
    names = {
        name: {name, *((s.get("networks") or {}).get("default") or {}).get("aliases", [])}
        for name, s in services.items()
    }
    node_names = set.intersection(*(names[node] for node in nodes))
    assert not node_names & set().union(*(names[n] for n in services if n not in nodes))
    for name in BARRIER_TASKS:
        assert services[name]["environment"]["STEPBARRIER_REDIS_CLUSTER"] == "1", name
        config = _barrier_config(resolved, name)
        seed = re.fullmatch(r"redis://([a-z0-9-]+):6379/0", config.redis_url)
        assert config.redis_cluster and seed is not None, name
        assert seed.group(1) in node_names, name
