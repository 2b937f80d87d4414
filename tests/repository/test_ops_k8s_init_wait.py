"""ops/k8s/init-container-wait.yaml: `stepbarrier wait` as an init container holds each
pod of an Indexed Job until the chief's step reaches the pod's own (completion index
i is task i + 1, under the settings' schedule), as the worker user with its password
file; the training container gets no setting and no password.

The init container's own script runs here for real, by ``sh``, with the pod's
environment as the kubelet builds it: once with ``stepbarrier wait`` replaced by a dump
of the environment (the configuration it would read), once with the real command
against the session's redis-server while a chief publishes."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepbarrier import BarrierConfig, StepPublisher, read_status
from tests.conftest import ROOT, subprocess_env
from tests.redis_harness import RedisServer
from tests.repository.test_ops_k8s import (
    CHIEF_JOB,
    GATED_JOB,
    K8S,
    USER_SECRETS,
    find,
    materialize,
    user_password,
)

MANIFEST = K8S / "init-container-wait.yaml"
COMMAND = "exec stepbarrier wait"
KUBECTL = shutil.which("kubectl")


def gated() -> dict[str, Any]:
    [doc] = [d for d in yaml.safe_load_all(MANIFEST.read_text()) if d]
    assert (doc["kind"], doc["metadata"]["name"]) == ("Job", GATED_JOB)
    return doc


def pod_spec() -> dict[str, Any]:
    spec: dict[str, Any] = gated()["spec"]["template"]["spec"]
    return spec


def init_container() -> dict[str, Any]:
    only: dict[str, Any]
    [only] = pod_spec()["initContainers"]
    return only


def init_environment(index: int) -> dict[str, str]:
    """The init container's environment as the kubelet builds it for completion ``index``."""
    env: dict[str, str] = {}
    for source in init_container()["envFrom"]:
        assert set(source) == {"configMapRef"}, source  # never a Secret
        env.update(find("ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in init_container()["env"]:
        assert set(entry) == {"name", "value"}, entry  # no secretKeyRef, no fieldRef
        env[entry["name"]] = entry["value"]
    env["JOB_COMPLETION_INDEX"] = str(index)
    return env


def password_files(root: Path) -> dict[str, Path]:
    """The init container's mounted files, written under ``root``: container path -> host."""
    volumes = {volume["name"]: volume for volume in pod_spec()["volumes"]}
    files = {}
    for mount in init_container()["volumeMounts"]:
        source = volumes[mount["name"]]["secret"]
        data = USER_SECRETS[source["secretName"]]
        for item in source["items"]:
            files[f"{mount['mountPath']}/{item['path']}"] = data[item["key"]]
    return materialize(files, root)


def script(replacement: str) -> list[str]:
    [text] = init_container()["args"]
    assert text.count(COMMAND) == 1
    return [*init_container()["command"], text.replace(COMMAND, replacement)]


def init_config(index: int, root: Path) -> BarrierConfig:
    dump = 'exec "$PYTHON" -c "import json, os; print(json.dumps(dict(os.environ)))"'
    result = subprocess.run(
        script(dump),
        env={**init_environment(index), "PYTHON": sys.executable},
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    seen: dict[str, str] = json.loads(result.stdout)
    seen["STEPBARRIER_REDIS_PASSWORD_FILE"] = str(
        password_files(root)[seen["STEPBARRIER_REDIS_PASSWORD_FILE"]]
    )
    return BarrierConfig.from_env(seen)


def test_the_job_is_indexed_and_only_its_init_container_takes_part() -> None:
    spec = gated()["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == 3
    assert spec["backoffLimitPerIndex"] >= 1 and "backoffLimit" not in spec
    assert pod_spec()["restartPolicy"] == "Never"
    assert (
        init_container()["image"]
        == find("Job", CHIEF_JOB)["spec"]["template"]["spec"]["containers"][0]["image"]
    )  # the image of ops/Dockerfile, which has the stepbarrier command
    [training] = pod_spec()["containers"]
    assert set(training) == {"name", "image", "command"}  # no setting, password or mount
    labels = gated()["spec"]["template"]["metadata"]["labels"]
    assert labels == {"app": "stepbarrier-train", "role": "worker"}  # admitted to Redis


@pytest.mark.parametrize("index", [0, 1, 2])
def test_pod_index_i_waits_as_task_i_plus_1_with_the_workers_password(
    index: int, tmp_path: Path
) -> None:
    config = init_config(index, tmp_path)
    assert (config.task_id, config.task_id_source) == (index + 1, "STEPBARRIER_TASK_ID")
    assert (config.redis_username, config.redis_password) == ("worker", user_password("worker"))
    schedule = find("ConfigMap", "stepbarrier-settings")["data"]["STEPBARRIER_SCHEDULE"]
    k = float(schedule.removeprefix("log:"))
    assert config.resolved_wait_until_step() == int(k * math.log(index + 2))
    assert config.run_id is None  # as shipped: none, until `kubectl set env` writes one


def test_the_init_containers_hold_each_pod_until_the_chiefs_step_reaches_its_own(
    redis_server: RedisServer, job: str, tmp_path: Path
) -> None:
    """The real `stepbarrier wait` of each pod: pod 0 (task 1, step 207 under
    log:300) leaves once the chief publishes 300; pods 1 and 2 (329, 415) only at 500."""
    stepbarrier = Path(sys.executable).parent / "stepbarrier"
    processes = []
    for index in range(3):
        env = init_environment(index)
        # the session's server has no ACL users: the workers' password is tested above
        del env["STEPBARRIER_REDIS_USERNAME"], env["STEPBARRIER_REDIS_PASSWORD_FILE"]
        env.update(STEPBARRIER_REDIS_URL=redis_server.url, STEPBARRIER_JOB=job)
        env["PATH"] = f"{stepbarrier.parent}:{subprocess_env()['PATH']}"
        processes.append(
            subprocess.Popen(
                script(COMMAND),
                env={**subprocess_env(), **env},
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    chief = BarrierConfig(job=job, redis_url=redis_server.url, heartbeat=0.2)
    try:
        with StepPublisher(chief) as publisher:
            publisher.publish(0)
            waiting_for(chief, {207, 329, 415}, processes)
            publisher.publish(300)
            out, err = processes[0].communicate(timeout=60)
            assert processes[0].returncode == 0, err
            assert int(out) == 300
            assert [p.poll() for p in processes[1:]] == [None, None]  # still held
            assert {w.wait_until_step for w in read_status(chief).waiters} == {329, 415}
            publisher.publish(500)
            for process in processes[1:]:
                out, err = process.communicate(timeout=60)
                assert process.returncode == 0, err
                assert int(out) == 500
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()


def waiting_for(config: BarrierConfig, steps: set[int], processes: list[Any]) -> None:
    """Until the registry lists a wait for each of ``steps``, or a process ended (no
    clock: pytest-timeout bounds the test)."""
    while {w.wait_until_step for w in read_status(config).waiters} != steps:
        assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
        time.sleep(0.05)


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_the_headers_kubectl_set_env_writes_the_run_id_into_the_init_container_only() -> None:
    result = subprocess.run(
        [str(KUBECTL), "set", "env", "--local", "-f", str(MANIFEST), "-c", "wait-for-step",
         "-o", "yaml", "STEPBARRIER_RUN_ID=run-42"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    spec = yaml.safe_load(result.stdout)["spec"]["template"]["spec"]
    [init] = spec["initContainers"]
    assert {"name": "STEPBARRIER_RUN_ID", "value": "run-42"} in init["env"]
    assert "env" not in spec["containers"][0]
    header = MANIFEST.read_text().split("\napiVersion:", 1)[0]
    assert "kubectl set env --local -f ops/k8s/init-container-wait.yaml -c wait-for-step" in header
    assert "metadata.labels['batch.kubernetes.io/controller-uid']" in header


def test_the_readme_lists_the_manifest() -> None:
    readme = (K8S / "README.md").read_text()
    assert "| `init-container-wait.yaml` |" in readme
    coming_from = Path(ROOT, "docs", "coming-from.md").read_text()
    assert "ops/k8s/init-container-wait.yaml" in coming_from
