"""docker-compose.cluster.yml's Redis Cluster, run here on local redis-server processes.

There is no Docker engine here, so the containers cannot run; what they would
run can. Everything comes from the file as Compose resolves it: the
``cluster-acl`` script writes the nodes' ACL files, six nodes start with the
very command of ``redis-node-N`` (``start-redis.sh`` with the file's cluster
options), each passes the file's healthcheck, the ``cluster-create`` script
creates the cluster and loads the library on every primary, and then the
chief's and a worker's environment (their seed URL pointed at one local node)
run a ``StepPublisher``/``StepWaiter`` round trip in cluster mode. Container
paths become the host files and directories they mount; the harness only adds
loopback, a free port and a directory of each node's own.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import redis

from stepbarrier import BarrierConfig, StepPublisher, StepWaiter
from stepbarrier._redis.functions import LIBRARY_NAME
from tests.cluster_harness import cluster_port
from tests.conftest import ROOT
from tests.ops_redis import EXAMPLE_OPT_IN, PASSWORDS
from tests.repository.test_compose import compose_config

pytestmark = pytest.mark.cluster

CLUSTER_FILE = Path(ROOT) / "docker-compose.cluster.yml"
NODE = re.compile(r"^redis-node-\d+$")


@pytest.fixture(scope="module")
def resolved() -> dict[str, Any]:
    result = compose_config(CLUSTER_FILE)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


def node_services(resolved: dict[str, Any]) -> list[str]:
    return sorted((name for name in resolved["services"] if NODE.match(name)), key=_number)


def _number(name: str) -> int:
    return int(name.rsplit("-", 1)[1])


def unescaped(text: str) -> str:
    """A value as the container sees it (Compose keeps ``$$`` in ``config``'s output)."""
    return text.replace("$$", "$")


@dataclass
class Paths:
    """Container paths of the cluster's services -> the host files and directories
    they mount (the named volume: a temporary directory)."""

    table: dict[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, resolved: dict[str, Any], volumes: Path) -> Paths:
        table: dict[str, str] = {}
        for name in ("cluster-acl", "cluster-create", *node_services(resolved)):
            service = resolved["services"][name]
            for volume in service.get("volumes", []):
                if volume["type"] == "bind":
                    host = volume["source"]
                else:
                    host = str(volumes / volume["source"])
                    Path(host).mkdir(parents=True, exist_ok=True)
                assert table.setdefault(volume["target"], host) == host, volume["target"]
            for secret in service.get("secrets", []):
                table[secret["target"]] = resolved["secrets"][secret["source"]]["file"]
        return cls(table)

    def __call__(self, text: str) -> str:
        for container in sorted(self.table, key=len, reverse=True):
            text = text.replace(container, self.table[container])
        return text


def run_script(service: dict[str, Any], paths: Paths, **extra: str) -> str:
    """A one-shot service's ``sh -c`` script, with its environment, paths mapped."""
    shell, flag, script = service["command"]
    assert (shell, flag) == ("sh", "-c")
    env = {name: paths(unescaped(value)) for name, value in service["environment"].items()}
    done = subprocess.run(
        [shell, flag, unescaped(script)],
        env={**os.environ, **env, **extra},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def node_environment(service: dict[str, Any]) -> dict[str, str]:
    """What a node's start-redis.sh sees: this machine's environment but the opt-in
    to the example passwords, and the service's. The nodes use the public example
    passwords, which start-redis.sh refuses without the opt-in: until the file
    sets it (test_the_nodes_opt_in_to_the_example_passwords fails meanwhile), it
    is added here so that the cluster itself is still tested."""
    inherited = {k: v for k, v in os.environ.items() if k not in EXAMPLE_OPT_IN}
    return {**inherited, **EXAMPLE_OPT_IN, **(service.get("environment") or {})}


class Node:
    """One ``redis-node-N`` service's command, run on a free loopback port."""

    def __init__(
        self, command: list[str], directory: Path, taken: set[int], env: dict[str, str]
    ) -> None:
        self.port = cluster_port(taken)
        directory.mkdir()
        # both loopbacks ("-": if there is one), whichever `localhost` resolves to
        local = ["--port", str(self.port), "--bind", "127.0.0.1", "-::1",
                 "--dir", str(directory), "--logfile", str(directory / "redis.log")]  # fmt: skip
        self.process = subprocess.Popen(
            [*command, *local],
            env={**env, "REDIS_PORT": str(self.port)},  # start-redis.sh's port
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,  # stop() ends the script and its server together
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(15)
        if self.process.stderr is not None:
            self.process.stderr.close()

    def client(self, user: str = "installer") -> redis.Redis:
        return redis.Redis(port=self.port, username=user, password=PASSWORDS[user])


@dataclass
class ComposedCluster:
    nodes: dict[str, Node]
    paths: Paths
    create_output: str


@pytest.fixture(scope="module")
def composed(
    resolved: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ComposedCluster]:
    root = tmp_path_factory.mktemp("compose-cluster")
    paths = Paths.of(resolved, root / "volumes")
    run_script(resolved["services"]["cluster-acl"], paths)
    nodes: dict[str, Node] = {}
    taken: set[int] = set()
    try:
        for name in node_services(resolved):
            command = [paths(unescaped(word)) for word in resolved["services"][name]["command"]]
            env = node_environment(resolved["services"][name])
            nodes[name] = Node(command, root / name, taken, env)
        for name, node in nodes.items():
            wait_healthy(resolved["services"][name], node, paths)
        create = resolved["services"]["cluster-create"]
        # the services' names become names of this machine (localhost), so the
        # create line resolves host names as it does in the compose network
        node_list = " ".join(
            f"localhost:{nodes[name].port}" for name in _nodes_of(create["environment"]["NODES"])
        )
        output = run_script(create, paths, NODES=node_list)
        yield ComposedCluster(nodes, paths, output)
    finally:
        for node in nodes.values():
            node.stop()


def _nodes_of(listed: str) -> list[str]:
    names = []
    for address in listed.split():
        host, port = address.rsplit(":", 1)
        assert port == "6379", address  # each node on the port its clients use
        names.append(host)
    return names


def wait_healthy(service: dict[str, Any], node: Node, paths: Paths, timeout: float = 30) -> None:
    """The service's own healthcheck, pointed at the node's port."""
    kind, check = service["healthcheck"]["test"]
    assert kind == "CMD-SHELL"
    check = paths(unescaped(check)).replace("redis-cli ", f"redis-cli -p {node.port} ")
    deadline = time.monotonic() + timeout
    while subprocess.run(["sh", "-c", check], check=False).returncode != 0:
        if node.process.poll() is not None:
            assert node.process.stderr is not None
            raise AssertionError(f"the node exited: {node.process.stderr.read().decode()}")
        assert time.monotonic() < deadline, "the healthcheck never passed"
        time.sleep(0.1)


def task_config(resolved: dict[str, Any], name: str, seed: Node, job: str) -> BarrierConfig:
    """The task's configuration as its container builds it, its seed URL pointed at
    ``seed`` (in the file: a name every node answers to) and its job renamed."""
    service = resolved["services"][name]
    env = dict(service["environment"])
    url = urlsplit(env["STEPBARRIER_REDIS_URL"])
    env["STEPBARRIER_REDIS_URL"] = url._replace(netloc=f"127.0.0.1:{seed.port}").geturl()
    mounted = {s["target"]: s["source"] for s in service.get("secrets", [])}
    secret = mounted[env["STEPBARRIER_REDIS_PASSWORD_FILE"]]
    env["STEPBARRIER_REDIS_PASSWORD_FILE"] = resolved["secrets"][secret]["file"]
    env["STEPBARRIER_JOB"] = job
    return BarrierConfig.from_env(env)


def test_the_nodes_opt_in_to_the_example_passwords(resolved: dict[str, Any]) -> None:
    """The nodes' users have the public example passwords (ops/redis/users.acl), which
    start-redis.sh refuses unless STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only: the
    file must set it on every node (x-node: `environment:`), and publish nothing."""
    for name in node_services(resolved):
        service = resolved["services"][name]
        environment = service.get("environment") or {}
        assert environment.get("STEPBARRIER_EXAMPLE_PASSWORDS") == "loopback-only", (
            f"{name}: docker-compose.cluster.yml must set STEPBARRIER_EXAMPLE_PASSWORDS: "
            "loopback-only in x-node's environment, or start-redis.sh refuses the example "
            "passwords (and the node binds its container's loopback only without --bind)"
        )
        assert not service.get("ports"), name
        # without --bind the opt-in keeps Redis on the container's loopback,
        # where the other nodes and the tasks cannot reach it
        command = service["command"]
        assert "--bind" in command and "*" in command[command.index("--bind") + 1 :], name


def test_every_node_service_runs_the_same_cluster_command(resolved: dict[str, Any]) -> None:
    commands = {tuple(resolved["services"][n]["command"]) for n in node_services(resolved)}
    assert len(node_services(resolved)) == 6
    [command] = commands
    assert command[command.index("--cluster-enabled") + 1] == "yes"


def test_cluster_create_creates_a_cluster_of_three_primaries_with_a_replica_each(
    composed: ComposedCluster,
) -> None:
    assert "[OK] All 16384 slots covered." in composed.create_output
    roles = {}
    for name, node in composed.nodes.items():
        admin_password = Path(composed.paths("/cluster/admin.password")).read_text()
        admin = redis.Redis(port=node.port, username="cluster-admin", password=admin_password)
        try:
            roles[name] = admin.info("replication")["role"]
            assert "cluster_state:ok" in admin.execute_command("CLUSTER", "INFO").decode()
        finally:
            admin.close()
    assert sorted(roles.values()) == ["master"] * 3 + ["slave"] * 3


def test_cluster_create_loads_the_library_on_every_primary(composed: ComposedCluster) -> None:
    assert f"{LIBRARY_NAME} loaded on all 3 primaries" in composed.create_output
    for node in composed.nodes.values():
        installer = node.client("installer")
        try:
            assert installer.function_list(library=LIBRARY_NAME), node.port
        finally:
            installer.close()


def test_the_chief_releases_a_worker_through_the_cluster_from_the_files_environment(
    resolved: dict[str, Any], composed: ComposedCluster, job: str
) -> None:
    # any node is a good seed: the last one (a replica, as created) will do
    seed = composed.nodes[node_services(resolved)[-1]]
    chief = task_config(resolved, "chief", seed, job)
    worker = task_config(resolved, "worker-1", seed, job)
    assert chief.redis_cluster and worker.redis_cluster
    assert (chief.redis_username, worker.redis_username) == ("chief", "worker")
    released: list[int] = []
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            with StepWaiter(worker) as waiter:
                released.append(waiter.wait(5, timeout=60))
        except BaseException as exc:
            errors.append(exc)

    with StepPublisher(chief) as publisher:
        publisher.publish(0)
        assert publisher.flush(30)
        thread = threading.Thread(target=wait, daemon=True)
        thread.start()
        deadline = time.monotonic() + 30
        while publisher.next_threshold != 5:  # the worker has registered
            assert not errors, errors
            assert time.monotonic() < deadline, "the worker never registered"
            time.sleep(0.01)
        for step in range(1, 6):
            publisher.publish(step)
        thread.join(60)
    assert not errors, errors
    assert released and released[0] >= 5
