"""Issue 34, item 4: who can reach Redis (and TensorFlow's servers) in the compose files.

Redis counts a connection before it logs in (tests/security/test_network_exposure.py),
so the compose files keep Redis on the job's own network: each Redis listens
inside its container (``--bind * -::*``: the container's loopback and the
project's network), on no host network; the only ports published are
docker-compose.yml's Redis (on a port Docker picks) and exporter, on the host's
127.0.0.1, which the host's ``stepbarrier status``/``watch`` of
tests/compose_run use; no
TensorFlow port is published anywhere. Both files are read as Compose resolves
them (``docker-compose config``), and ``ops/redis/redis.conf`` itself binds
loopback, for whoever runs it without an explicit ``--bind``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.ops_redis import REDIS_CONF
from tests.repository.test_compose import compose_config

FILES = ("docker-compose.yml", "docker-compose.cluster.yml")
HARNESS = Path(ROOT) / "tests" / "compose_run" / "harness.py"
PUBLISHED = {
    "docker-compose.yml": {("redis", 6379): None, ("exporter", 9464): "9464"},
    "docker-compose.cluster.yml": {},
}
"""What each file publishes on the host: (service, container port) -> host port
(None: a free one Docker picks at `up`)."""


def resolved(name: str) -> dict[str, Any]:
    result = compose_config(Path(ROOT) / name)
    assert result.returncode == 0, result.stderr
    data: dict[str, Any] = json.loads(result.stdout)
    return data


@pytest.fixture(scope="module", params=FILES)
def project(request: pytest.FixtureRequest) -> tuple[str, dict[str, Any]]:
    return request.param, resolved(request.param)


def redis_services(config: dict[str, Any]) -> list[str]:
    """The services that run redis-server through start-redis.sh."""
    return [
        name
        for name, service in config["services"].items()
        if any(str(word).endswith("start-redis.sh") for word in service.get("command") or [])
    ]


def test_every_service_is_on_the_projects_own_network_only(
    project: tuple[str, dict[str, Any]],
) -> None:
    """No host network (which would put Redis on every interface of the host) and
    no network shared with other projects; or no network at all (docker-compose.yml's
    passwords service)."""
    _name, config = project
    assert set(config["networks"]) == {"default"}
    network = config["networks"]["default"]
    assert not network.get("external") and network.get("driver") in (None, "bridge"), network
    for service_name, service in config["services"].items():
        if service.get("network_mode") == "none":
            assert not service.get("networks") and not service.get("ports"), service_name
            continue
        assert service.get("network_mode") is None, service_name
        assert set(service.get("networks") or {"default": None}) == {"default"}, service_name


def test_redis_listens_inside_its_container_only(project: tuple[str, dict[str, Any]]) -> None:
    name, config = project
    servers = redis_services(config)
    assert servers, name
    for service_name in servers:
        command = [str(word) for word in config["services"][service_name]["command"]]
        # the last --bind is the one in force: the container's interfaces
        start = len(command) - 1 - command[::-1].index("--bind")
        assert command[start + 1 : start + 3] == ["*", "-::*"], (service_name, command)


def test_only_redis_and_the_exporter_are_published_and_on_loopback(
    project: tuple[str, dict[str, Any]],
) -> None:
    name, config = project
    published = {}
    for service_name, service in config["services"].items():
        for port in service.get("ports") or []:
            assert port.get("host_ip") == "127.0.0.1", (service_name, port)
            published[(service_name, port["target"])] = port.get("published")
    assert published == PUBLISHED[name]
    for service_name, target in published:
        assert target != 2222, service_name  # TensorFlow's servers run any graph sent


def test_the_hosts_commands_find_the_port_redis_is_published_on() -> None:
    """tests/compose_run runs `stepbarrier status` and `watch` on the host against
    the address `docker compose port redis 6379` prints, as the compose file's
    header says, never a fixed one: Docker picks the port at each `up`."""
    harness = HARNESS.read_text()
    assert re.findall(r"redis://127\.0\.0\.1:\d+", harness) == []
    assert '"port", service, str(port)' in harness and "REDIS_PORT = 6379" in harness
    assert re.findall(r'f"redis://\{[^}]+\}/0"', harness) == ['f"redis://{address}/0"']


def test_redis_conf_run_without_bind_listens_on_loopback() -> None:
    binds = [
        line.split(None, 1)[1].strip()
        for line in REDIS_CONF.read_text().splitlines()
        if line.startswith("bind ")
    ]
    assert binds == ["127.0.0.1 -::1"]
