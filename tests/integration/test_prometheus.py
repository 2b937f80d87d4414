"""ops/prometheus with Debian's Prometheus (``make test`` installs it): promtool
checks the scrape config and the alert rules and runs their unit tests, and a
real Prometheus on loopback, configured from ops/prometheus/prometheus.yml,
scrapes the exporter of a live job and answers for it on its HTTP API."""

from __future__ import annotations

import json
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from examples.demo.local import free_port
from stepbarrier import BarrierConfig
from stepbarrier.cli._exporter import serve
from tests.conftest import ROOT
from tests.observability import eventually, live_job, prefix
from tests.redis_harness import RedisServer

PROMETHEUS_DIR = Path(ROOT) / "ops" / "prometheus"
SCRAPE_CONFIG = PROMETHEUS_DIR / "prometheus.yml"
RULES = PROMETHEUS_DIR / "stepbarrier-alerts.yml"
RULE_TESTS = PROMETHEUS_DIR / "stepbarrier-alerts.test.yml"
ALERTS = {
    "StepbarrierChiefStalled",
    "StepbarrierChiefMissing",
    "StepbarrierWorkerWaitingTooLong",
    "StepbarrierRedisUnreadable",
    "StepbarrierJobsTruncated",
    "StepbarrierTaskStuck",
    "StepbarrierExporterDown",
}


def binary(name: str) -> str:
    found = shutil.which(name)
    assert found, f"{name} is missing: `make test` installs it (apt-get install prometheus)"
    return found


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [binary("promtool"), *args], capture_output=True, text=True, timeout=120, check=False
    )


def test_the_alert_rules_pass_promtool_check() -> None:
    checked = promtool("check", "rules", str(RULES))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in checked.stdout


def test_the_alert_rules_pass_their_unit_tests() -> None:
    tested = promtool("test", "rules", str(RULE_TESTS))
    assert tested.returncode == 0, tested.stdout + tested.stderr


def test_every_alert_has_a_unit_test_that_fires_it() -> None:
    tests = yaml.safe_load(RULE_TESTS.read_text())["tests"]
    firing = {
        case["alertname"]
        for test in tests
        for case in test["alert_rule_test"]
        if case["exp_alerts"]
    }
    rules = yaml.safe_load(RULES.read_text())["groups"][0]["rules"]
    assert {rule["alert"] for rule in rules} == ALERTS == firing


def test_the_scrape_config_passes_promtool_check() -> None:
    checked = promtool("check", "config", str(SCRAPE_CONFIG))
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_exporter_down_alert_names_the_scrape_jobs_job_label() -> None:
    [scrape] = yaml.safe_load(SCRAPE_CONFIG.read_text())["scrape_configs"]
    rules = {r["alert"]: r for r in yaml.safe_load(RULES.read_text())["groups"][0]["rules"]}
    assert f'up{{job="{scrape["job_name"]}"}}' in rules["StepbarrierExporterDown"]["expr"]


class Prometheus:
    """Debian's Prometheus on a free loopback port, with its data in ``directory``."""

    def __init__(self, config: dict[str, Any], directory: Path) -> None:
        self.port = free_port()
        config_file = directory / "prometheus.yml"
        config_file.write_text(yaml.safe_dump(config))
        self.log = directory / "prometheus.log"
        self.process = subprocess.Popen(
            [
                binary("prometheus"),
                f"--config.file={config_file}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address=127.0.0.1:{self.port}",
            ],
            stdout=subprocess.DEVNULL,
            stderr=self.log.open("w"),
        )
        eventually(self.ready, timeout=60, what=f"Prometheus ready\n{self.tail()}")

    def tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-10:]) if self.log.exists() else ""

    def get(self, path: str, **query: str) -> Any:
        url = f"http://127.0.0.1:{self.port}{path}"
        if query:
            url += "?" + urllib.parse.urlencode(query)
        with urllib.request.urlopen(url, timeout=10) as response:
            return json.loads(response.read().decode())

    def ready(self) -> bool:
        assert self.process.poll() is None, f"Prometheus exited:\n{self.tail()}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2) as r:
                return bool(r.status == 200)
        except OSError:
            return False

    def query(self, expression: str) -> list[dict[str, Any]]:
        """An instant query's vector: each item's ``metric`` (labels) and ``value``."""
        answer = self.get("/api/v1/query", query=expression)
        assert answer["status"] == "success", answer
        result: list[dict[str, Any]] = answer["data"]["result"]
        return result

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def prometheus(tmp_path: Path) -> Iterator[Callable[[str], Prometheus]]:
    """Starts Prometheus with ops/prometheus/prometheus.yml, scraping ``target``
    every 200 ms (the shipped 15 s would make a slow test) and loading the rules."""
    started: list[Prometheus] = []

    def start(target: str) -> Prometheus:
        config = yaml.safe_load(SCRAPE_CONFIG.read_text())
        config["global"].update(scrape_interval="200ms", evaluation_interval="200ms")
        config["rule_files"] = [str(RULES)]
        [job] = config["scrape_configs"]
        job.update(scrape_interval="200ms", scrape_timeout="200ms")
        job["static_configs"] = [{"targets": [target]}]
        started.append(Prometheus(config, tmp_path))
        return started[-1]

    yield start
    for server in started:
        server.stop()


def only_value(vector: list[dict[str, Any]]) -> float | None:
    return float(vector[0]["value"][1]) if len(vector) == 1 else None


def test_prometheus_scrapes_the_exporter_of_a_live_job(
    redis_server: RedisServer, prometheus: Callable[[str], Prometheus]
) -> None:
    job = prefix("scraped")
    config = BarrierConfig(job=job, redis_url=redis_server.url, heartbeat=0.2, stall_timeout=30)
    with (
        live_job(config, 7, waits=(9, 12)) as chief,
        serve(config, port=0, pattern=job, min_interval=0.1) as exporter,
    ):
        server = prometheus(f"127.0.0.1:{exporter.port}")
        step = f'stepbarrier_step{{job_name="{job}"}}'
        waiting = f'stepbarrier_waiting_workers{{job_name="{job}"}}'
        eventually(lambda: only_value(server.query(step)) == 7, what=f"step 7\n{server.tail()}")
        eventually(lambda: only_value(server.query(waiting)) == 2, what="2 waiting workers")
        [series] = server.query(step)
        labels = series["metric"]
        assert labels["job"] == "stepbarrier" and labels["job_name"] == job
        assert "exported_job" not in labels
        chief.publish(9)  # the first worker goes: Prometheus follows
        eventually(lambda: only_value(server.query(waiting)) == 1, what="1 waiting worker")
        next_step = f'stepbarrier_next_wait_until_step{{job_name="{job}"}}'
        assert only_value(server.query(next_step)) == 12
        assert only_value(server.query("stepbarrier_up")) == 1

        def group() -> dict[str, Any]:
            groups = server.get("/api/v1/rules")["data"]["groups"]
            [found] = [g for g in groups if g["name"] == "stepbarrier"]
            return dict(found)

        # the shipped rules are loaded, and evaluate on the exporter's series without error
        assert {rule["name"] for rule in group()["rules"]} == ALERTS
        eventually(lambda: all(rule["health"] == "ok" for rule in group()["rules"]), what="ok")
