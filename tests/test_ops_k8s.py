"""ops/k8s: the manifests parse, use only known settings, and run the chief and the
workers as one Indexed Job whose pods share one run id (the Job's controller uid),
each with the right TF_CONFIG, task id and Redis user (index 0 is the chief,
index i is worker i - 1 and task id i)."""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepbarrier import BarrierConfig
from stepbarrier.cli.acl_rules import password_hash
from stepbarrier.config import ENVIRONMENT_VARIABLES
from stepbarrier.redis_code import LIBRARY_VERSION, function_name, library_source
from tests.conftest import ROOT
from tests.ops_redis import OPS, SHIPPED_USERS
from tests.redis_harness import RedisServer

K8S = Path(ROOT) / "ops" / "k8s"
ACL = (Path(ROOT) / "ops" / "redis" / "users.acl").read_text()
RUN_ID_FIELD = "metadata.labels['batch.kubernetes.io/controller-uid']"
PROGRAM = "exec python examples/tf1_parameter_server.py"
# A made-up controller uid: the API server gives each Job one like it.
UID = "6f1c2a4e-8d3b-4f7a-9e21-0c5d7b9a3e18"


def manifests() -> list[dict[str, Any]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def find(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def takes_part_in_the_barrier(container: dict[str, Any]) -> bool:
    """Reads the stepbarrier settings or sets a STEPBARRIER_* variable of its own."""
    return any(
        source.get("configMapRef", {}).get("name") == "stepbarrier-settings"
        for source in container.get("envFrom", [])
    ) or any(entry["name"].startswith("STEPBARRIER_") for entry in container.get("env", []))


def barrier_workloads() -> list[dict[str, Any]]:
    """Every workload with a pod that takes part in the barrier."""
    return [
        doc
        for doc in manifests()
        if "template" in doc.get("spec", {})
        and any(map(takes_part_in_the_barrier, doc["spec"]["template"]["spec"]["containers"]))
    ]


def training_job() -> dict[str, Any]:
    [job] = barrier_workloads()
    return job


def container() -> dict[str, Any]:
    only: dict[str, Any]
    [only] = training_job()["spec"]["template"]["spec"]["containers"]
    return only


def pod_environment(index: int, uid: str = UID) -> dict[str, str]:
    """The container's environment as the kubelet builds it for completion ``index``."""
    job = training_job()
    labels = {
        **job["spec"]["template"]["metadata"]["labels"],
        "batch.kubernetes.io/controller-uid": uid,
        "controller-uid": uid,
        "batch.kubernetes.io/job-name": job["metadata"]["name"],
        "batch.kubernetes.io/job-completion-index": str(index),
    }
    env: dict[str, str] = {}
    for source in container().get("envFrom", []):
        env.update(find("ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container()["env"]:
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        elif "secretKeyRef" in entry["valueFrom"]:
            ref = entry["valueFrom"]["secretKeyRef"]
            env[entry["name"]] = find("Secret", ref["name"])["stringData"][ref["key"]]
        else:
            path = entry["valueFrom"]["fieldRef"]["fieldPath"]
            label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
            assert label is not None, path
            env[entry["name"]] = labels[label.group(1)]
    env["JOB_COMPLETION_INDEX"] = str(index)
    return env


def task_environment(index: int, uid: str = UID) -> dict[str, str]:
    """The environment the training program starts with: the container's script run by
    a real ``sh``, with the program replaced by a dump of its environment."""
    [script] = container()["args"]
    assert script.count(PROGRAM) == 1
    script = script.replace(
        PROGRAM, 'exec "$PYTHON" -c "import json, os; print(json.dumps(dict(os.environ)))"'
    )
    result = subprocess.run(
        [*container()["command"], script],
        env={**pod_environment(index, uid), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    seen: dict[str, str] = json.loads(result.stdout)
    seen.pop("PYTHON")
    return seen


def cluster() -> dict[str, list[str]]:
    env = {e["name"]: e["value"] for e in container()["env"] if "value" in e}
    spec: dict[str, list[str]] = json.loads(env["CLUSTER"])
    return spec


def workers() -> int:
    return len(cluster()["worker"])


def acl_hash(user: str) -> str:
    """The SHA-256 of ``user``'s password in users.acl."""
    found = re.search(rf"^user {user} on #([0-9a-f]{{64}}) ", ACL, re.MULTILINE)
    assert found is not None, user
    return found.group(1)


def role_password(role: str) -> str:
    """A training role's password, as the settings' Secret holds it."""
    password: str = find("Secret", "stepbarrier-passwords")["stringData"][role]
    return password


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
    assert acl.strip() == ACL.strip()


def test_the_chief_and_the_workers_are_one_indexed_job() -> None:
    job = training_job()
    assert job["kind"] == "Job"
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 1 + workers() == 4
    assert len(container()["args"]) == 1


def test_a_failing_worker_uses_up_only_its_own_retries() -> None:
    spec = training_job()["spec"]
    assert spec["backoffLimitPerIndex"] >= 1
    assert "backoffLimit" not in spec  # a total limit would end the chief's pod with it
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # required per index


def test_the_ps_takes_no_part_in_the_barrier_and_knows_the_same_cluster() -> None:
    [ps] = find("StatefulSet", "ps")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in ps["env"]}
    assert not any(name.startswith("STEPBARRIER_") for name in env)
    tf_config = json.loads(env["TF_CONFIG"])
    assert tf_config == {"cluster": cluster(), "task": {"type": "ps", "index": 0}}


def test_every_barrier_task_takes_its_run_id_from_the_jobs_controller_uid() -> None:
    [entry] = [e for e in container()["env"] if e["name"] == "STEPBARRIER_RUN_ID"]
    assert entry["valueFrom"] == {"fieldRef": {"fieldPath": RUN_ID_FIELD}}
    settings = find("ConfigMap", "stepbarrier-settings")["data"]
    assert "STEPBARRIER_RUN_ID" not in settings  # the same for every run: no run id at all
    for index in range(1 + workers()):
        seen = task_environment(index)
        assert seen["STEPBARRIER_RUN_ID"] == UID, index  # the script leaves it alone
        assert BarrierConfig.from_env(seen).run_id == UID, index


def test_another_job_is_another_run() -> None:
    other = str(uuid.uuid4())
    assert BarrierConfig.from_env(task_environment(0, other)).run_id == other
    assert BarrierConfig.from_env(task_environment(1, other)).run_id == other


def test_the_manifest_names_the_label_of_clusters_before_1_27() -> None:
    text = (K8S / "training.yaml").read_text()
    assert "< 1.27" in text and "metadata.labels['controller-uid']" in text


def test_tf_config_addresses_are_the_pod_hostnames_of_the_indexed_job() -> None:
    job = training_job()
    name, subdomain = job["metadata"]["name"], job["spec"]["template"]["spec"]["subdomain"]
    service = find("Service", subdomain)
    assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
    pod_labels = job["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    indexes = range(job["spec"]["completions"])
    assert cluster()["chief"] == [f"{name}-0.{subdomain}:2222"]
    assert cluster()["worker"] == [f"{name}-{i}.{subdomain}:2222" for i in indexes[1:]]
    ps = find("StatefulSet", "ps")["spec"]
    assert cluster()["ps"] == [f"ps-0.{ps['serviceName']}:2222"]


def test_completion_index_0_is_the_chief_with_the_chief_user() -> None:
    seen = task_environment(0)
    assert json.loads(seen["TF_CONFIG"]) == {
        "cluster": cluster(),
        "task": {"type": "chief", "index": 0},
    }
    config = BarrierConfig.from_env(seen)
    assert (config.role, config.task_id) == ("chief", 0)
    assert (config.redis_username, config.redis_password) == ("chief", role_password("chief"))
    assert int(seen["WAIT_FOR_WAITERS"]) == workers()  # trains once every worker waits


@pytest.mark.parametrize("index", [1, 2, 3])
def test_completion_index_i_is_worker_i_minus_1_and_task_id_i(index: int) -> None:
    seen = task_environment(index)
    assert json.loads(seen["TF_CONFIG"]) == {
        "cluster": cluster(),
        "task": {"type": "worker", "index": index - 1},
    }
    config = BarrierConfig.from_env(seen)
    assert (config.role, config.task_id) == ("worker", index)
    assert (config.redis_username, config.redis_password) == ("worker", role_password("worker"))
    # STEPBARRIER_SCHEDULE=log:300 of the settings
    assert config.resolved_wait_until_step() == int(300 * math.log(index + 1))


@pytest.mark.parametrize(("index", "other"), [(0, "worker"), (1, "chief"), (3, "chief")])
def test_a_task_keeps_no_other_roles_password(index: int, other: str) -> None:
    seen = task_environment(index)
    assert role_password(other) not in seen.values()
    assert not {"CHIEF_REDIS_PASSWORD", "WORKER_REDIS_PASSWORD"} & set(seen)


def redis_pod() -> dict[str, Any]:
    spec: dict[str, Any] = find("Deployment", "redis")["spec"]["template"]["spec"]
    return spec


def redis_files() -> dict[str, str]:
    """Path in the Redis container -> the content the kubelet puts there."""
    [redis_container] = redis_pod()["containers"]
    volumes = {volume["name"]: volume for volume in redis_pod()["volumes"]}
    files: dict[str, str] = {}
    for mount in redis_container["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            data = find("ConfigMap", volume["configMap"]["name"])["data"]
        else:
            data = find("Secret", volume["secret"]["secretName"])["stringData"]
            if "items" in volume["secret"]:
                data = {i["path"]: data[i["key"]] for i in volume["secret"]["items"]}
        for key, content in data.items():
            files[f"{mount['mountPath']}/{key}"] = content
    return files


def test_every_password_in_the_manifests_matches_its_users_acl_hash() -> None:
    admin = find("Secret", "stepbarrier-redis-admin")["stringData"]
    for user in SHIPPED_USERS:
        password = admin[user] if user in admin else role_password(user)
        assert password_hash(password) == acl_hash(user), user


def test_the_library_in_the_configmap_is_the_librarys_source() -> None:
    data = find("ConfigMap", "stepbarrier-redis-config")["data"]
    assert data["stepbarrier-functions.lua"] == library_source(), (
        "ops/k8s/redis.yaml holds a stale library: paste `stepbarrier functions source` "
        "under stepbarrier-functions.lua"
    )


def test_the_configmap_runs_ops_redis_start_script() -> None:
    data = find("ConfigMap", "stepbarrier-redis-config")["data"]
    assert data["start-redis.sh"] == (OPS / "start-redis.sh").read_text()


def directives(text: str) -> dict[str, str]:
    pairs = (line.split(None, 1) for line in text.splitlines() if line and line[0] != "#")
    return {name: value for name, value in pairs}


def test_the_configmaps_redis_conf_is_ops_redis_conf_but_for_the_acl_path() -> None:
    k8s = directives(find("ConfigMap", "stepbarrier-redis-config")["data"]["redis.conf"])
    ops = directives((OPS / "redis.conf").read_text())
    assert k8s.pop("aclfile") == "/etc/redis/acl/users.acl"
    ops.pop("aclfile")
    assert k8s == ops
    assert k8s["busy-reply-threshold"] == "1000"


def test_redis_runs_start_redis_sh_with_files_its_volumes_provide() -> None:
    [redis_container] = redis_pod()["containers"]
    files = redis_files()
    arguments: list[str] = [*redis_container["command"], *redis_container["args"]]
    shell, script, conf, library, password = arguments
    assert shell == "sh"
    assert files[script] == (OPS / "start-redis.sh").read_text()
    assert directives(files[conf])["aclfile"] in files
    assert files[library] == library_source()
    assert password_hash(files[password]) == acl_hash("installer")


def test_redis_runs_as_the_images_unprivileged_user() -> None:
    context = redis_pod()["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 999


def test_no_training_pod_gets_an_administrators_password() -> None:
    text = (K8S / "training.yaml").read_text() + (K8S / "settings.yaml").read_text()
    assert "stepbarrier-redis-admin" not in text
    admin = find("Secret", "stepbarrier-redis-admin")["stringData"]
    for index in range(1 + workers()):
        assert not set(admin.values()) & set(pod_environment(index).values())


def test_the_redis_container_and_its_readiness_probe_work_for_real(tmp_path: Path) -> None:
    """The container's command and probe, run here on the files its volumes hold
    (written under tmp_path); the harness's options come after redis.conf."""
    [redis_container] = redis_pod()["containers"]
    host = {path: tmp_path / path.lstrip("/") for path in redis_files()}
    for path, content in redis_files().items():
        host[path].parent.mkdir(parents=True, exist_ok=True)
        host[path].write_text(content)
    server = RedisServer()
    command = [str(host.get(word, word)) for word in [*redis_container["command"]]]
    command += [str(host.get(word, word)) for word in redis_container["args"]]
    command += [*server.command()[1:], "--aclfile", str(host["/etc/redis/acl/users.acl"])]
    probe = redis_container["readinessProbe"]["exec"]["command"][2]
    for path, local in host.items():
        probe = probe.replace(path, str(local))
    probe = probe.replace("redis-cli ", f"redis-cli -p {server.port} ")
    process = subprocess.Popen(
        command,
        env={**os.environ, "REDIS_PORT": str(server.port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 30
        while subprocess.run(["sh", "-c", probe], check=False).returncode != 0:
            assert process.poll() is None, process.communicate()
            assert time.monotonic() < deadline, "the readiness probe never passed"
            time.sleep(0.1)
        chief = server.client(username="chief", password=role_password("chief"))
        try:
            assert chief.fcall(function_name("version"), 0) == LIBRARY_VERSION
        finally:
            chief.close()
    finally:
        process.terminate()  # the script passes it on to redis-server
        assert process.wait(30) == 0
        server.cleanup()
