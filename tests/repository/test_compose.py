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
from stepbarrier._config.settings import ENVIRONMENT_VARIABLES
from stepbarrier._protocol.roles import password_hash
from stepbarrier._redis.functions import LIBRARY_VERSION, function_name
from tests.conftest import ROOT
from tests.ops_redis import ACL_FILE, OPS, PASSWORDS, SHIPPED_USERS
from tests.redis_harness import RedisServer

COMPOSE_FILE = Path(ROOT) / "docker-compose.yml"
SCRIPT_VARIABLES = {"STEPBARRIER_EXAMPLE_PASSWORDS"}
"""Variables of ops/redis/start-redis.sh, not of stepbarrier's configuration."""
# The binary itself: the package's console-script wrapper always exits 0.
COMPOSE = Path(compose.__file__).parent / "docker-compose"
MOUNT = "/run/stepbarrier"
"""Where each container finds its own files, made by the passwords service."""
OWN_FILES = {
    "redis": ["emergency.password", "installer.password", "users.acl"],
    "chief": ["chief.password"],
    "worker-1": ["worker.password"],
    "worker-2": ["worker.password"],
    "worker-3": ["worker.password"],
    "exporter": ["monitor.password"],
    "ps": [],
}
"""What each service finds under ``MOUNT``: its own role's password alone (Redis:
the ACL file and the administrators' passwords); the ps gets nothing."""


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
        "passwords", "redis", "ps", "chief", "worker-1", "worker-2", "worker-3", "exporter"
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


def test_no_service_uses_or_opts_in_to_the_example_passwords(resolved: dict[str, Any]) -> None:
    """The passwords are made at every `up` (the passwords service): no service
    mounts ops/redis/example-secrets or opts in to them, and nothing is published
    beyond the host's loopback all the same."""
    assert "secrets" not in resolved
    for name, service in resolved["services"].items():
        assert "STEPBARRIER_EXAMPLE_PASSWORDS" not in (service.get("environment") or {}), name
        assert "secrets" not in service, name
        for volume in service.get("volumes", []):
            assert "example-secrets" not in volume.get("source", ""), (name, volume)
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


def test_workers_do_not_report_the_step_their_acl_forbids(
    resolved: dict[str, Any], volumes: Path
) -> None:
    """The worker user may not write the job's step (ops/redis/users.acl), so the
    workers are not asked to report it: no refusal in their logs."""
    for name in ("worker-1", "worker-2", "worker-3"):
        environment = resolved["services"][name]["environment"]
        assert environment["STEPBARRIER_REDIS_USERNAME"] == "worker", name
        assert environment["STEPBARRIER_REPORT_EVERY"] == "0", name
        assert _barrier_config(resolved, name, volumes).report_every == 0, name


def test_training_tasks_are_built_from_ops_dockerfile(resolved: dict[str, Any]) -> None:
    for name in ("ps", "chief", "worker-1", "worker-2", "worker-3"):
        assert resolved["services"][name]["build"]["dockerfile"] == "ops/Dockerfile"


def mounted_paths(resolved: dict[str, Any], name: str, volumes: Path) -> dict[str, str]:
    """Container path -> host path of a service's mounts: a bind mount's source, a
    named volume's directory under ``volumes`` (as the passwords service fills it)."""
    service = resolved["services"][name]
    paths = {}
    for volume in service.get("volumes", []):
        host = volume["source"] if volume["type"] == "bind" else str(volumes / volume["source"])
        paths[volume["target"]] = host
    return paths


def _on_host(mounted: dict[str, str], path: str) -> str:
    """A container path as the host sees it, through the mount that holds it."""
    for target in sorted(mounted, key=len, reverse=True):
        if path == target or path.startswith(f"{target}/"):
            return mounted[target] + path[len(target) :]
    return path


def make_passwords(resolved: dict[str, Any], volumes: Path) -> str:
    """The passwords service's script run here, its paths mapped to the host and
    its volumes to directories under ``volumes``; files owned by this user."""
    service = resolved["services"]["passwords"]
    mounted = mounted_paths(resolved, "passwords", volumes)
    # the script's OUT_DIR holds the volumes' mount points: a directory of links here
    out = volumes.parent / f"{volumes.name}-mounts"
    for volume in service["volumes"]:
        if volume["type"] == "volume":
            (volumes / volume["source"]).mkdir(parents=True, exist_ok=True)
            parent, name = volume["target"].rsplit("/", 1)
            (out / name).parent.mkdir(exist_ok=True)
            (out / name).symlink_to(volumes / volume["source"])
            mounted.setdefault(parent, str(out))
    [line] = [line for line in service["entrypoint"][2].splitlines() if "compose-passwords" in line]
    command = [_on_host(mounted, word) for word in line.replace("|| exit", "").split()]
    me = str(os.getuid())
    done = subprocess.run(
        command, env={**os.environ, "TASK_UID": me, "REDIS_USER": me},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@pytest.fixture(scope="module")
def volumes(resolved: dict[str, Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The named volumes, filled as the passwords service fills them at an `up`."""
    path = tmp_path_factory.mktemp("volumes")
    make_passwords(resolved, path)
    return path


def _barrier_config(resolved: dict[str, Any], name: str, volumes: Path) -> BarrierConfig:
    """The configuration the container would build, its password file read from the
    host: in a volume, or a Compose secret (docker-compose.cluster.yml's)."""
    service = resolved["services"][name]
    env = dict(service["environment"])
    mounted = mounted_paths(resolved, name, volumes)
    for secret in service.get("secrets", []):
        mounted[secret["target"]] = resolved["secrets"][secret["source"]]["file"]
    path = env["STEPBARRIER_REDIS_PASSWORD_FILE"]
    env["STEPBARRIER_REDIS_PASSWORD_FILE"] = _on_host(mounted, path)
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
    resolved: dict[str, Any],
    volumes: Path,
    name: str,
    role: str,
    task_id: int,
    step: int | None,
) -> None:
    config = _barrier_config(resolved, name, volumes)
    assert (config.role, config.task_id) == (role, task_id)
    assert config.redis_username == role
    acl = (volumes / "redis-secrets" / "users.acl").read_text()  # what Redis loads
    digest = re.search(rf"^user {role} on #([0-9a-f]{{64}}) ", acl, re.MULTILINE)
    assert config.redis_password is not None and digest is not None
    assert password_hash(config.redis_password) == digest.group(1)
    assert config.redis_password != PASSWORDS[role]  # not the public example
    if step is not None:
        assert config.resolved_wait_until_step() == step


BARRIER_TASKS = ("chief", "worker-1", "worker-2", "worker-3")


def test_the_run_id_reaches_the_chief_and_every_worker(volumes: Path) -> None:
    run_id = "1767225600"  # what `STEPBARRIER_RUN_ID=$(date +%s)` gives
    resolved = resolve(run_id)
    for name in BARRIER_TASKS:
        assert _barrier_config(resolved, name, volumes).run_id == run_id, name
    tasks_with_a_run_id = {
        name
        for name, service in resolved["services"].items()
        if "STEPBARRIER_RUN_ID" in (service.get("environment") or {})
    }
    assert tasks_with_a_run_id == set(BARRIER_TASKS)


def test_without_a_run_id_the_file_is_valid_and_no_task_has_one(
    resolved: dict[str, Any], volumes: Path
) -> None:
    for name in BARRIER_TASKS:
        assert _barrier_config(resolved, name, volumes).run_id is None, name


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


def test_redis_mounts_the_ops_files_and_its_own_volume(resolved: dict[str, Any]) -> None:
    volumes = resolved["services"]["redis"]["volumes"]
    binds = {v["target"]: Path(v["source"]) for v in volumes if v["type"] == "bind"}
    assert {target: host.relative_to(OPS) for target, host in binds.items()} == {
        f"/usr/local/etc/redis/{name}": Path(name)
        for name in ("redis.conf", "start-redis.sh", "stepbarrier-functions.lua")
    }  # its users.acl is the passwords service's, with this `up`'s hashes
    named = {v["target"]: v["source"] for v in volumes if v["type"] == "volume"}
    assert named == {MOUNT: "redis-secrets"}
    assert all(volume["read_only"] for volume in volumes)
    command = resolved["services"]["redis"]["command"]
    assert command[command.index("--aclfile") + 1] == f"{MOUNT}/users.acl"
    assert f"{MOUNT}/installer.password" in command


def test_the_passwords_service_makes_every_file_once_per_up_without_a_network(
    resolved: dict[str, Any], volumes: Path
) -> None:
    """A one-shot that stays (so that `up --exit-code-from chief` is not stopped by
    its exit), healthy once its script is done; no network; the volumes it writes."""
    service = resolved["services"]["passwords"]
    assert service["network_mode"] == "none" and service["init"] is True
    script = service["entrypoint"][2]
    assert script.index("rm -f /tmp/passwords.done") < script.index("compose-passwords.sh")
    assert script.index("touch /tmp/passwords.done") < script.index("exec sleep infinity")
    assert service["healthcheck"]["test"] == ["CMD", "test", "-e", "/tmp/passwords.done"]
    for name in ("redis", "chief", "exporter"):
        depends = resolved["services"][name]["depends_on"]
        assert depends["passwords"]["condition"] == "service_healthy", name
    # the workers start after the chief, so after the passwords too
    assert resolved["services"]["chief"]["depends_on"]["passwords"]
    written = {path.name: sorted(f.name for f in path.iterdir()) for path in volumes.iterdir()}
    assert written == {
        "redis-secrets": OWN_FILES["redis"],
        "chief-password": ["chief.password"],
        "worker-password": ["worker.password"],
        "monitor-password": ["monitor.password"],
    }
    for path in volumes.rglob("*.*"):
        assert path.stat().st_mode & 0o777 == 0o400, path


@pytest.mark.parametrize("name", sorted(OWN_FILES))
def test_each_service_mounts_its_own_roles_files_alone_read_only(
    resolved: dict[str, Any], volumes: Path, name: str
) -> None:
    service = resolved["services"][name]
    named = [v for v in service.get("volumes", []) if v["type"] == "volume"]
    assert all(v["read_only"] and v["target"] == MOUNT for v in named), named
    found = sorted(f.name for v in named for f in (volumes / v["source"]).iterdir())
    assert found == OWN_FILES[name]


def test_fresh_passwords_at_every_run_and_the_acl_rules_of_ops_unchanged(
    resolved: dict[str, Any], volumes: Path, tmp_path: Path
) -> None:
    make_passwords(resolved, tmp_path)
    shipped = ACL_FILE.read_text()
    hash_ = re.compile(r" on #[0-9a-f]{64} ")
    for made in (volumes, tmp_path):
        acl = (made / "redis-secrets" / "users.acl").read_text()
        assert hash_.sub(" on # ", acl) == hash_.sub(" on # ", shipped)  # only the hashes
        for user in SHIPPED_USERS:
            [file] = made.glob(f"*/{user}.password")
            password = file.read_text().rstrip("\n")
            assert re.fullmatch(r"[0-9a-f]{64}", password), user
            assert f"user {user} on #{password_hash(password)} " in acl, user
            assert password != PASSWORDS[user]
    for user in SHIPPED_USERS:
        [first] = volumes.glob(f"*/{user}.password")
        [second] = tmp_path.glob(f"*/{user}.password")
        assert first.read_text() != second.read_text(), user  # a new one at each run


@pytest.mark.parametrize(
    ("line", "told"),
    [
        ("user extra on >clear-text-password +ping", "cannot replace"),
        ("user extra on #" + "ab" * 32 + " #" + "cd" * 32 + " +ping", "cannot replace"),
        ("user Bad.Name on #" + "ab" * 32 + " +ping", "unexpected user name 'Bad.Name'"),
    ],
)
def test_the_passwords_script_refuses_an_acl_whose_passwords_it_cannot_all_replace(
    tmp_path: Path, line: str, told: str
) -> None:
    """Rather than leave a password it did not make (an example's hash, a clear one)."""
    source = tmp_path / "users.acl"
    source.write_text(ACL_FILE.read_text() + line + "\n")
    (tmp_path / "out" / "redis").mkdir(parents=True)
    done = subprocess.run(
        ["sh", str(OPS / "compose-passwords.sh"), str(source), str(tmp_path / "out")],
        env={**os.environ, "TASK_UID": str(os.getuid()), "REDIS_USER": str(os.getuid())},
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0 and told in done.stderr, done.stderr
    assert not (tmp_path / "out" / "redis" / "users.acl").exists()
    assert not re.search(r"[0-9a-f]{64}", done.stdout + done.stderr)  # no password shown


def test_redis_runs_as_the_images_unprivileged_user(resolved: dict[str, Any]) -> None:
    assert resolved["services"]["redis"]["user"] == "redis"


def test_redis_starts_through_start_redis_sh_and_is_healthy_once_the_library_is_loaded(
    resolved: dict[str, Any], volumes: Path
) -> None:
    """The service's own command and healthcheck, run here, with the passwords
    service's files and no opt-in to the example passwords: container paths become
    the host paths they mount; the harness's options (loopback, a free port, a
    temporary directory) come after the service's. start-redis.sh has nothing to
    warn of: no example password is in use."""
    service = resolved["services"]["redis"]
    mounted = mounted_paths(resolved, "redis", volumes)
    server = RedisServer()
    options = server.command()[1:]  # --port N --bind 127.0.0.1 ... of the harness
    command = [_on_host(mounted, word) for word in service["command"]] + options
    health = service["healthcheck"]["test"][1].replace("$$", "$")
    for container_path, host_path in sorted(mounted.items(), key=lambda m: -len(m[0])):
        health = health.replace(container_path, host_path)
    health = health.replace("redis-cli ", f"redis-cli -p {server.port} ")
    inherited = {k: v for k, v in os.environ.items() if k != "STEPBARRIER_EXAMPLE_PASSWORDS"}
    assert "environment" not in service  # no opt-in
    env = {**inherited, "REDIS_PORT": str(server.port)}
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["sh", "-c", health], check=False).returncode != 0:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the healthcheck never passed"
            time.sleep(0.1)
        password = (volumes / "chief-password" / "chief.password").read_text().strip()
        chief = server.client(username="chief", password=password)
        try:
            assert chief.fcall(function_name("version"), 0) == LIBRARY_VERSION
        finally:
            chief.close()
    finally:
        process.terminate()  # the script passes it on to redis-server
        assert process.wait(30) == 0
        _, err = process.communicate()
        server.cleanup()
    assert "EXAMPLE" not in err.decode() and "WARNING" not in err.decode(), err.decode()


CLUSTER_FILE = Path(ROOT) / "docker-compose.cluster.yml"
"""The same job on a 6-node Redis Cluster (tests/repository/test_compose_cluster.py runs its
nodes, its cluster creation and a round trip on local redis-server processes)."""


def test_the_cluster_file_is_valid_and_points_every_barrier_task_at_the_cluster(
    tmp_path: Path,
) -> None:
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
        config = _barrier_config(resolved, name, tmp_path)
        seed = re.fullmatch(r"redis://([a-z0-9-]+):6379/0", config.redis_url)
        assert config.redis_cluster and seed is not None, name
        assert seed.group(1) in node_names, name
