"""The exporter's deployment files: the Grafana dashboard's structure and queries,
the docker-compose service and the Kubernetes Deployment and Service (they run
``stepbarrier exporter`` as the monitor user, where Prometheus looks for it)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepbarrier import BarrierConfig
from stepbarrier._protocol.roles import password_hash
from stepbarrier.cli._commands.jobs import exporter
from stepbarrier.cli._exporter import DEFAULT_PORT, JOB_GAUGES, METRIC_NAMES
from tests.conftest import ROOT
from tests.repository.test_compose import make_passwords, mounted_paths, resolve
from tests.repository.test_ops_k8s import acl_hash, find, role_password

OPS = Path(ROOT) / "ops"
DASHBOARD = json.loads((OPS / "grafana" / "dashboard.json").read_text())
METRIC = re.compile(r"\b(stepbarrier_[a-z_]+|up)\b(?!\s*\()")
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}


def panels() -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = DASHBOARD["panels"]
    return found


def expressions() -> list[str]:
    return [target["expr"] for panel in panels() for target in panel["targets"]]


def test_the_dashboard_is_one_grafana_dashboard_with_a_stable_uid() -> None:
    assert DASHBOARD["uid"] == "stepbarrier" and DASHBOARD["title"]
    assert isinstance(DASHBOARD["schemaVersion"], int) and DASHBOARD["schemaVersion"] >= 36
    assert "id" not in DASHBOARD  # Grafana gives one on import


def test_the_dashboard_asks_for_a_prometheus_and_the_jobs_to_show() -> None:
    variables = {v["name"]: v for v in DASHBOARD["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    jobs = variables["job_name"]
    assert jobs["query"]["query"] == "label_values(stepbarrier_step, job_name)"
    assert jobs["multi"] and jobs["includeAll"] and jobs["allValue"] == ".*"


def test_every_panel_has_an_id_a_place_and_the_chosen_prometheus() -> None:
    ids = [panel["id"] for panel in panels()]
    assert len(ids) == len(set(ids))
    for panel in panels():
        grid = panel["gridPos"]
        assert grid["x"] + grid["w"] <= 24 and grid["h"] > 0, panel["title"]
        assert panel["datasource"] == DATASOURCE, panel["title"]
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs)), panel["title"]
        assert all(target["datasource"] == DATASOURCE for target in panel["targets"])


def test_the_dashboard_queries_only_what_the_exporter_serves() -> None:
    used = {name for expr in expressions() for name in METRIC.findall(expr)}
    assert used <= METRIC_NAMES | {"up"}, used - METRIC_NAMES
    for expr in expressions():
        for metric in set(METRIC.findall(expr)) & set(JOB_GAUGES):
            assert f'{metric}{{job_name=~"$job_name"}}' in expr, expr  # the chosen jobs only


def test_the_dashboard_shows_step_waiting_workers_heartbeat_and_the_ramp() -> None:
    shown = {panel["title"]: {t["expr"] for t in panel["targets"]} for panel in panels()}

    def panel_of(*metrics: str) -> bool:
        return any(
            all(any(metric in expr for expr in exprs) for metric in metrics)
            for exprs in shown.values()
        )

    assert panel_of("stepbarrier_step")
    assert panel_of("stepbarrier_waiting_workers")
    assert panel_of("stepbarrier_heartbeat_age_seconds")
    assert panel_of("stepbarrier_step", "stepbarrier_next_wait_until_step")  # the ramp
    assert any("Ramp" in title for title in shown)


def test_every_dashboard_query_is_valid_promql(tmp_path: Path) -> None:
    """promtool parses each query (as a recording rule; Grafana's variable set to all)."""
    rules = [
        {"record": f"dashboard:query_{number}", "expr": expr.replace("$job_name", ".*")}
        for number, expr in enumerate(expressions())
    ]
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    promtool = shutil.which("promtool")
    assert promtool, "promtool is missing: `make test` installs it (apt-get install prometheus)"
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.fixture(scope="module")
def compose_exporter(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    resolved = resolve()
    volumes = tmp_path_factory.mktemp("volumes")
    make_passwords(resolved, volumes)  # as the passwords service does at each `up`
    service: dict[str, Any] = resolved["services"]["exporter"]
    mounted = {  # container path -> host file
        f"{target}/{file.name}": str(file)
        for target, host in mounted_paths(resolved, "exporter", volumes).items()
        for file in Path(host).iterdir()
    }
    service["mounted"] = mounted
    service["acl"] = (volumes / "redis-secrets" / "users.acl").read_text()  # what Redis loads
    return service


def test_compose_runs_the_exporter_image_on_every_interface_of_its_container(
    compose_exporter: dict[str, Any],
) -> None:
    assert compose_exporter["build"]["dockerfile"] == "ops/Dockerfile.exporter"
    dockerfile = (OPS / "Dockerfile.exporter").read_text()
    assert 'pip install ".[exporter,fast]"' in dockerfile
    assert 'ENTRYPOINT ["stepbarrier", "exporter"]' in dockerfile
    context = exporter.make_context("exporter", list(compose_exporter["command"]))
    assert (context.params["bind"], context.params["port"]) == ("0.0.0.0", DEFAULT_PORT)
    [port] = compose_exporter["ports"]
    assert (port["host_ip"], port["target"]) == ("127.0.0.1", DEFAULT_PORT)


def test_compose_reads_redis_as_the_monitor_user_with_its_secret_only(
    compose_exporter: dict[str, Any],
) -> None:
    env = dict(compose_exporter["environment"])
    assert "STEPBARRIER_JOB" not in env  # every job
    mounted = compose_exporter["mounted"]
    assert {Path(host).name for host in mounted.values()} == {"monitor.password"}
    env["STEPBARRIER_REDIS_PASSWORD_FILE"] = mounted[env["STEPBARRIER_REDIS_PASSWORD_FILE"]]
    config = BarrierConfig.from_env({**env, "STEPBARRIER_JOB": "any"})
    assert config.redis_username == "monitor" and config.redis_password is not None
    assert password_hash(config.redis_password) == acl_hash("monitor", compose_exporter["acl"])


def test_the_shipped_scrape_config_targets_the_compose_exporter() -> None:
    scrape = yaml.safe_load((OPS / "prometheus" / "prometheus.yml").read_text())
    [job] = scrape["scrape_configs"]
    assert job["static_configs"] == [{"targets": [f"exporter:{DEFAULT_PORT}"]}]
    assert "exporter" in resolve()["services"]


def k8s_pod() -> dict[str, Any]:
    spec: dict[str, Any] = find("Deployment", "stepbarrier-exporter")["spec"]["template"]
    return spec


def test_k8s_runs_the_exporter_as_the_monitor_user_with_its_password_file() -> None:
    [container] = k8s_pod()["spec"]["containers"]
    context = exporter.make_context("exporter", list(container["args"]))
    assert context.params["bind"] == "0.0.0.0"
    session = context.obj
    assert session.overrides["STEPBARRIER_REDIS_USERNAME"] == "monitor"
    path = session.overrides["STEPBARRIER_REDIS_PASSWORD_FILE"]
    [mount] = [m for m in container["volumeMounts"] if path.startswith(m["mountPath"] + "/")]
    [volume] = [v for v in k8s_pod()["spec"]["volumes"] if v["name"] == mount["name"]]
    [item] = volume["secret"]["items"]
    assert volume["secret"]["secretName"] == "stepbarrier-monitor-password"
    assert path == f"{mount['mountPath']}/{item['path']}" and item["key"] == "password"
    assert password_hash(role_password("monitor")) == acl_hash("monitor")
    settings = find("ConfigMap", "stepbarrier-settings")["data"]
    assert session.overrides["STEPBARRIER_REDIS_URL"] == settings["STEPBARRIER_REDIS_URL"]


def test_k8s_service_has_the_scrape_annotations_of_the_exporters_port() -> None:
    service = find("Service", "stepbarrier-exporter")
    [container] = k8s_pod()["spec"]["containers"]
    context = exporter.make_context("exporter", list(container["args"]))
    [port] = container["ports"]
    annotations = service["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert int(annotations["prometheus.io/port"]) == port["containerPort"]
    assert port["containerPort"] == context.params["port"]
    assert service["spec"]["selector"].items() <= k8s_pod()["metadata"]["labels"].items()
    [service_port] = service["spec"]["ports"]
    assert service_port["targetPort"] == port["name"]
    for probe in ("readinessProbe", "livenessProbe"):
        assert container[probe]["httpGet"] == {"path": "/metrics", "port": port["name"]}
