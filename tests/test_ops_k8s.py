"""ops/k8s: the manifests parse, use only known settings and give each worker the
right task id (the chief is task 0, completion index i is task i + 1)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepbarrier import BarrierConfig
from stepbarrier.config import ENVIRONMENT_VARIABLES
from tests.conftest import ROOT

K8S = Path(ROOT) / "ops" / "k8s"


def manifests() -> list[dict[str, Any]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def find(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def test_every_manifest_has_a_kind_a_name_and_an_api_version() -> None:
    docs = manifests()
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Secret", "Deployment", "Service", "Job"}
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc


def test_the_settings_use_only_known_variables() -> None:
    settings = find("ConfigMap", "stepbarrier-settings")["data"]
    used = {name for name in settings if name.startswith("STEPBARRIER_")}
    assert used and used <= set(ENVIRONMENT_VARIABLES)


def test_the_redis_acl_secret_is_ops_redis_users_acl() -> None:
    acl = find("Secret", "stepbarrier-redis-acl")["stringData"]["users.acl"]
    assert acl.strip() == (Path(ROOT) / "ops" / "redis" / "users.acl").read_text().strip()


def test_workers_are_an_indexed_job() -> None:
    spec = find("Job", "workers")["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3


@pytest.mark.parametrize("index", [0, 1, 2])
def test_completion_index_i_is_worker_i_and_task_id_i_plus_1(index: int) -> None:
    container = find("Job", "workers")["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    script = container["args"][0].replace(
        "exec python examples/tf1_parameter_server.py",
        'exec "$PYTHON" -c "import json, os; print(json.dumps(dict(os.environ)))"',
    )
    result = subprocess.run(
        [*container["command"], script],
        env={**env, "JOB_COMPLETION_INDEX": str(index), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    seen = json.loads(result.stdout)
    tf_config = json.loads(seen["TF_CONFIG"])
    assert tf_config["task"] == {"type": "worker", "index": index}
    settings = find("ConfigMap", "stepbarrier-settings")["data"]
    config = BarrierConfig.from_env({**settings, **seen})
    assert (config.role, config.task_id) == ("worker", index + 1)
