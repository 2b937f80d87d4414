"""ops/k8s: the manifests parse, use only known settings, and run the chief and the
workers as two Indexed Jobs (each pod with its own role's password file, from a
Secret the user creates), which share the run id that ``kubectl set env --local``
writes into both, each task with the right TF_CONFIG, task id and Redis user
(the chief is task 0, worker index i is TensorFlow worker i and task id i + 1).

No manifest holds a password: the Secrets are what ops/k8s/README.md has the user
create. The tests stand for them with ``USER_SECRETS`` (fresh passwords and the
users.acl that ``stepbarrier acl`` prints for them), and run the README's own
commands with a ``kubectl`` that records what they would create."""

from __future__ import annotations

import base64
import copy
import json
import math
import os
import re
import secrets
import shutil
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from stepbarrier import BarrierConfig
from stepbarrier._config.settings import ENVIRONMENT_VARIABLES
from stepbarrier._protocol.roles import acl_line, password_hash
from stepbarrier._redis.functions import LIBRARY_VERSION, function_name, library_source
from tests.conftest import ROOT
from tests.ops_redis import ACL_FILE, OPS, PASSWORDS, SHIPPED_USERS
from tests.redis_harness import RedisServer

K8S = Path(ROOT) / "ops" / "k8s"
README = K8S / "README.md"
OPERATIONS = Path(ROOT) / "docs" / "operations.md"
PROGRAM = "exec python examples/tf1_parameter_server.py"
KUBECTL = shutil.which("kubectl")
CHIEF_JOB, WORKERS_JOB = "training-chief", "training-workers"
GATED_JOB = "gated-workers"
"""ops/k8s/init-container-wait.yaml: workers held by `stepbarrier wait` in an init
container (tests/repository/test_ops_k8s_init_wait.py)."""
DEFAULT_OFF = "user default off resetpass resetkeys resetchannels -@all"

USER_PASSWORDS = {user: secrets.token_hex(32) for user in SHIPPED_USERS}
"""The passwords the user makes (``openssl rand -hex 32``), one per role."""
USER_ACL = "".join(
    f"{line}\n"
    for line in [
        DEFAULT_OFF,
        *(acl_line(user, user, "*", password_hash(USER_PASSWORDS[user])) for user in SHIPPED_USERS),
    ]
)
"""The users.acl that the README's ``stepbarrier acl`` loop prints for them."""
USER_SECRETS: dict[str, dict[str, str]] = {
    "stepbarrier-redis-acl": {"users.acl": USER_ACL},
    **{
        f"stepbarrier-{role}-password": {"password": USER_PASSWORDS[role]}
        for role in ("chief", "worker", "monitor", "installer")
    },
}
"""The Secrets the README has the user create, by name: key -> content."""


def manifests() -> list[dict[str, Any]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        found += [doc for doc in yaml.safe_load_all(path.read_text()) if doc]
    return found


def find(kind: str, name: str) -> dict[str, Any]:
    [doc] = [d for d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def acl_hash(user: str, acl: str | None = None) -> str:
    """The SHA-256 of ``user``'s password in ``acl`` (ops/redis/users.acl by default)."""
    text = ACL_FILE.read_text() if acl is None else acl
    found = re.search(rf"^user {user} on #([0-9a-f]{{64}}) ", text, re.MULTILINE)
    assert found is not None, user
    return found.group(1)


def role_password(role: str) -> str:
    """A role's EXAMPLE password (ops/redis/example-secrets), whose hash ops/redis/users.acl
    holds: docker-compose's. On Kubernetes each role has the user's own: ``user_password``."""
    return PASSWORDS[role]


def user_password(role: str) -> str:
    """A role's password, as the Secret the user created for it holds it."""
    return USER_SECRETS[f"stepbarrier-{role}-password"]["password"]


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


def job(name: str) -> dict[str, Any]:
    return find("Job", name)


def container(workload: dict[str, Any]) -> dict[str, Any]:
    only: dict[str, Any]
    [only] = workload["spec"]["template"]["spec"]["containers"]
    return only


def with_run_id(workload: dict[str, Any], run_id: str) -> dict[str, Any]:
    """``workload`` as ``kubectl set env --local ... STEPBARRIER_RUN_ID=<run_id>``
    writes it: the variable set (or added) in every container."""
    changed = copy.deepcopy(workload)
    for each in changed["spec"]["template"]["spec"]["containers"]:
        env = each.setdefault("env", [])
        entries = [entry for entry in env if entry["name"] == "STEPBARRIER_RUN_ID"]
        if entries:
            entries[0].clear()
            entries[0].update(name="STEPBARRIER_RUN_ID", value=run_id)
        else:
            env.append({"name": "STEPBARRIER_RUN_ID", "value": run_id})
    return changed


def pod_files(
    workload: dict[str, Any], created: dict[str, dict[str, str]] | None = None
) -> dict[str, str]:
    """Path in the pod's container -> the content the kubelet puts there, from the
    manifests' ConfigMaps and the Secrets the user created (``USER_SECRETS``)."""
    created = USER_SECRETS if created is None else created
    spec = workload["spec"]["template"]["spec"]
    volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
    files: dict[str, str] = {}
    for mount in container(workload).get("volumeMounts", []):
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            source = volume["configMap"]
            data = find("ConfigMap", source["name"])["data"]
        else:
            source = volume["secret"]
            data = created[source["secretName"]]
        if "items" in source:
            data = {item["path"]: data[item["key"]] for item in source["items"]}
        for key, content in data.items():
            files[f"{mount['mountPath']}/{key}"] = content
    return files


def materialize(files: dict[str, str], root: Path) -> dict[str, Path]:
    """Write a pod's files under ``root``: container path -> host path."""
    host = {path: root / path.lstrip("/") for path in files}
    for path, content in files.items():
        host[path].parent.mkdir(parents=True, exist_ok=True)
        host[path].write_text(content)
    return host


def pod_environment(workload: dict[str, Any], index: int) -> dict[str, str]:
    """The container's environment as the kubelet builds it for completion ``index``."""
    env: dict[str, str] = {}
    for source in container(workload).get("envFrom", []):
        assert set(source) == {"configMapRef"}, source  # never a Secret
        env.update(find("ConfigMap", source["configMapRef"]["name"])["data"])
    for entry in container(workload).get("env", []):
        assert "secretKeyRef" not in entry.get("valueFrom", {}), entry
        if "value" in entry:
            env[entry["name"]] = entry["value"]
        else:
            ref = entry["valueFrom"]["configMapKeyRef"]
            env[entry["name"]] = find("ConfigMap", ref["name"])["data"][ref["key"]]
    env["JOB_COMPLETION_INDEX"] = str(index)
    return env


def task_environment(workload: dict[str, Any], index: int) -> dict[str, str]:
    """The environment the training program starts with: the container's script run by
    a real ``sh``, with the program replaced by a dump of its environment."""
    [script] = container(workload)["args"]
    assert script.count(PROGRAM) == 1
    script = script.replace(
        PROGRAM, 'exec "$PYTHON" -c "import json, os; print(json.dumps(dict(os.environ)))"'
    )
    result = subprocess.run(
        [*container(workload)["command"], script],
        env={**pod_environment(workload, index), "PYTHON": sys.executable},
        capture_output=True,
        text=True,
        check=True,
    )
    seen: dict[str, str] = json.loads(result.stdout)
    seen.pop("PYTHON")
    return seen


def task_config(workload: dict[str, Any], index: int, root: Path) -> BarrierConfig:
    """The task's configuration, its password file read where the pod mounts it."""
    seen = task_environment(workload, index)
    host = materialize(pod_files(workload), root)
    seen["STEPBARRIER_REDIS_PASSWORD_FILE"] = str(host[seen["STEPBARRIER_REDIS_PASSWORD_FILE"]])
    return BarrierConfig.from_env(seen)


def cluster() -> dict[str, list[str]]:
    env = {e["name"]: e["value"] for e in container(job(CHIEF_JOB))["env"] if "value" in e}
    spec: dict[str, list[str]] = json.loads(env["CLUSTER"])
    return spec


def workers() -> int:
    return len(cluster()["worker"])


def test_every_manifest_has_a_kind_a_name_and_an_api_version() -> None:
    docs = manifests()
    assert {d["kind"] for d in docs} >= {"ConfigMap", "Deployment", "Service", "Job", "StatefulSet"}
    assert "Secret" not in {d["kind"] for d in docs}  # the user creates them
    for doc in docs:
        assert doc["apiVersion"] and doc["metadata"]["name"], doc


def test_the_settings_use_only_known_variables() -> None:
    settings = find("ConfigMap", "stepbarrier-settings")["data"]
    used = {name for name in settings if name.startswith("STEPBARRIER_")}
    assert used and used <= set(ENVIRONMENT_VARIABLES)


def test_every_secret_a_pod_mounts_is_one_the_readme_has_the_user_create() -> None:
    mounted = {
        (volume["secret"]["secretName"], item["key"])
        for doc in manifests()
        if "template" in doc.get("spec", {})
        for volume in doc["spec"]["template"]["spec"].get("volumes", [])
        if "secret" in volume
        for item in volume["secret"]["items"]
    }
    # the README's commands create exactly these (test_the_readmes_commands_...)
    assert mounted == {(name, key) for name, data in USER_SECRETS.items() for key in data}


def test_the_chief_and_the_workers_are_two_indexed_jobs() -> None:
    assert {doc["metadata"]["name"] for doc in barrier_workloads()} == {CHIEF_JOB, WORKERS_JOB}
    chief, worker = job(CHIEF_JOB)["spec"], job(WORKERS_JOB)["spec"]
    assert chief["completionMode"] == worker["completionMode"] == "Indexed"
    assert chief["completions"] == chief["parallelism"] == 1
    assert worker["completions"] == worker["parallelism"] == workers() == 3
    for name in (CHIEF_JOB, WORKERS_JOB):
        assert len(container(job(name))["args"]) == 1
        assert container(job(name))["env"] == container(with_run_id(job(name), ""))["env"]


def test_a_failing_worker_uses_up_only_its_own_retries() -> None:
    spec = job(WORKERS_JOB)["spec"]
    assert spec["backoffLimitPerIndex"] >= 1
    assert "backoffLimit" not in spec  # a total limit would end the other workers' pods
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # required per index


def test_the_ps_takes_no_part_in_the_barrier_and_knows_the_same_cluster() -> None:
    [ps] = find("StatefulSet", "ps")["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e["value"] for e in ps["env"]}
    assert not any(name.startswith("STEPBARRIER_") for name in env)
    tf_config = json.loads(env["TF_CONFIG"])
    assert tf_config == {"cluster": cluster(), "task": {"type": "ps", "index": 0}}
    assert "volumes" not in find("StatefulSet", "ps")["spec"]["template"]["spec"]


def test_both_jobs_know_the_same_cluster() -> None:
    def spec(name: str) -> str:
        return next(e["value"] for e in container(job(name))["env"] if e["name"] == "CLUSTER")

    assert spec(CHIEF_JOB) == spec(WORKERS_JOB)


def test_as_shipped_a_run_has_no_run_id(tmp_path: Path) -> None:
    settings = find("ConfigMap", "stepbarrier-settings")["data"]
    assert "STEPBARRIER_RUN_ID" not in settings  # the same for every run: no run id at all
    assert task_config(job(CHIEF_JOB), 0, tmp_path).run_id is None
    assert task_config(job(WORKERS_JOB), 1, tmp_path).run_id is None


def test_every_task_of_a_run_gets_the_run_id_written_into_both_jobs(tmp_path: Path) -> None:
    run_id = "run-20261201-101500"  # what `run-$(date +%Y%m%d-%H%M%S)` gives
    chief = with_run_id(job(CHIEF_JOB), run_id)
    assert task_config(chief, 0, tmp_path).run_id == run_id
    for index in range(workers()):
        worker = with_run_id(job(WORKERS_JOB), run_id)
        assert task_config(worker, index, tmp_path).run_id == run_id, index


def test_another_run_is_another_run_id(tmp_path: Path) -> None:
    other = f"run-{uuid.uuid4().hex[:12]}"
    assert task_config(with_run_id(job(CHIEF_JOB), other), 0, tmp_path).run_id == other
    assert task_config(with_run_id(job(WORKERS_JOB), other), 2, tmp_path).run_id == other


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kubectl_set_env_writes_the_run_id_into_both_jobs_and_nothing_else() -> None:
    """The README's command, offline (`--local`): what the other tests assume."""
    result = subprocess.run(
        [str(KUBECTL), "set", "env", "--local", "-f", str(K8S / "training.yaml"), "-o", "yaml",
         "STEPBARRIER_RUN_ID=run-42"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    written = {doc["metadata"]["name"]: doc for doc in yaml.safe_load_all(result.stdout) if doc}
    assert set(written) == {CHIEF_JOB, WORKERS_JOB}
    for name, doc in written.items():
        expected = with_run_id(job(name), "run-42")
        assert container(doc)["env"] == container(expected)["env"], name
        assert container(doc)["args"] == container(expected)["args"], name
        assert (
            doc["spec"]["template"]["spec"]["volumes"]
            == (expected["spec"]["template"]["spec"]["volumes"])
        )


def test_the_manifest_and_the_docs_say_how_to_give_each_run_its_own_id() -> None:
    command = "kubectl set env --local -f ops/k8s/training.yaml -o yaml"
    assert command in (K8S / "training.yaml").read_text()
    assert command in README.read_text() and command in OPERATIONS.read_text()


def test_tf_config_addresses_are_the_pod_hostnames_of_the_indexed_jobs() -> None:
    for name in (CHIEF_JOB, WORKERS_JOB):
        subdomain = job(name)["spec"]["template"]["spec"]["subdomain"]
        service = find("Service", subdomain)
        assert service["spec"]["clusterIP"] == "None"  # headless: one DNS name per pod
        pod_labels = job(name)["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
    assert cluster()["chief"] == [f"{CHIEF_JOB}-0.train:2222"]
    indexes = range(job(WORKERS_JOB)["spec"]["completions"])
    assert cluster()["worker"] == [f"{WORKERS_JOB}-{i}.train:2222" for i in indexes]
    ps = find("StatefulSet", "ps")["spec"]
    assert cluster()["ps"] == [f"ps-0.{ps['serviceName']}:2222"]


def test_the_chief_job_is_the_chief_with_the_chief_user(tmp_path: Path) -> None:
    seen = task_environment(job(CHIEF_JOB), 0)
    assert json.loads(seen["TF_CONFIG"]) == {
        "cluster": cluster(),
        "task": {"type": "chief", "index": 0},
    }
    config = task_config(job(CHIEF_JOB), 0, tmp_path)
    assert (config.role, config.task_id) == ("chief", 0)
    assert (config.redis_username, config.redis_password) == ("chief", user_password("chief"))
    assert int(seen["WAIT_FOR_WAITERS"]) == workers()  # trains once every worker waits


@pytest.mark.parametrize("index", [0, 1, 2])
def test_worker_index_i_is_tensorflow_worker_i_and_task_id_i_plus_1(
    index: int, tmp_path: Path
) -> None:
    seen = task_environment(job(WORKERS_JOB), index)
    assert json.loads(seen["TF_CONFIG"]) == {
        "cluster": cluster(),
        "task": {"type": "worker", "index": index},
    }
    config = task_config(job(WORKERS_JOB), index, tmp_path)
    assert (config.role, config.task_id) == ("worker", index + 1)
    assert (config.redis_username, config.redis_password) == ("worker", user_password("worker"))
    # STEPBARRIER_SCHEDULE=log:300 of the settings
    assert config.resolved_wait_until_step() == int(300 * math.log(index + 2))


@pytest.mark.parametrize(("name", "own"), [(CHIEF_JOB, "chief"), (WORKERS_JOB, "worker")])
def test_a_task_gets_no_other_roles_password(name: str, own: str) -> None:
    files = pod_files(job(name))
    assert list(files.values()) == [user_password(own)]
    seen = task_environment(job(name), 0)
    for password in USER_PASSWORDS.values():
        assert not any(password in value for value in seen.values())
    assert "STEPBARRIER_REDIS_PASSWORD" not in seen


def redis_deployment() -> dict[str, Any]:
    return find("Deployment", "redis")


def redis_pod() -> dict[str, Any]:
    spec: dict[str, Any] = redis_deployment()["spec"]["template"]["spec"]
    return spec


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


def test_the_configmaps_redis_conf_is_ops_redis_conf_but_for_the_acl_path_and_bind() -> None:
    """The pod listens on its own addresses (its Service's clients come there, and
    networkpolicy.yaml admits only the job's); ops/redis/redis.conf on loopback."""
    k8s = directives(find("ConfigMap", "stepbarrier-redis-config")["data"]["redis.conf"])
    ops = directives((OPS / "redis.conf").read_text())
    assert k8s.pop("aclfile") == "/etc/redis/acl/users.acl"
    ops.pop("aclfile")
    assert k8s.pop("bind") == "* -::*"
    assert ops.pop("bind") == "127.0.0.1 -::1"
    assert k8s == ops
    assert k8s["busy-reply-threshold"] == "1000"


def test_redis_runs_start_redis_sh_with_files_its_volumes_provide() -> None:
    [redis_container] = redis_pod()["containers"]
    files = pod_files(redis_deployment())
    arguments: list[str] = [*redis_container["command"], *redis_container["args"]]
    shell, script, conf, library, password = arguments
    assert shell == "sh"
    assert files[script] == (OPS / "start-redis.sh").read_text()
    assert files[directives(files[conf])["aclfile"]] == USER_ACL
    assert files[library] == library_source()
    assert files[password] == USER_PASSWORDS["installer"]


def test_redis_runs_as_the_images_unprivileged_user() -> None:
    context = redis_pod()["securityContext"]
    assert context["runAsNonRoot"] is True and context["runAsUser"] == 999


def test_no_training_pod_gets_an_administrators_password() -> None:
    admin = {USER_PASSWORDS["installer"], USER_PASSWORDS["emergency"], USER_ACL}
    for name in (CHIEF_JOB, WORKERS_JOB):
        assert not admin & set(pod_files(job(name)).values()), name
        for index in range(job(name)["spec"]["completions"]):
            assert not admin & set(pod_environment(job(name), index).values())


def run_redis_pod(
    created: dict[str, dict[str, str]], root: Path
) -> tuple[subprocess.Popen[bytes], RedisServer, str]:
    """The Redis container's command, run here on the files its volumes hold
    (written under ``root``); the harness's options come after redis.conf.
    Returns the process, the harness (for its port) and the readiness probe."""
    [redis_container] = redis_pod()["containers"]
    host = materialize(pod_files(redis_deployment(), created), root)
    server = RedisServer()
    command = [str(host.get(word, word)) for word in redis_container["command"]]
    command += [str(host.get(word, word)) for word in redis_container["args"]]
    command += [*server.command()[1:], "--aclfile", str(host["/etc/redis/acl/users.acl"])]
    probe = redis_container["readinessProbe"]["exec"]["command"][2]
    for path, local in host.items():
        probe = probe.replace(path, str(local))
    probe = probe.replace("redis-cli ", f"redis-cli -p {server.port} ")
    environment = {k: v for k, v in os.environ.items() if k != "STEPBARRIER_EXAMPLE_PASSWORDS"}
    assert "env" not in redis_container  # no opt-in to the example passwords on Kubernetes
    process = subprocess.Popen(
        command,
        env={**environment, "REDIS_PORT": str(server.port)},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    return process, server, probe


def wait_ready(process: subprocess.Popen[bytes], probe: str) -> None:
    deadline = time.monotonic() + 30
    while subprocess.run(["sh", "-c", probe], check=False).returncode != 0:
        assert process.poll() is None, process.communicate()
        assert time.monotonic() < deadline, "the readiness probe never passed"
        time.sleep(0.1)


def test_the_redis_container_and_its_readiness_probe_work_for_real(tmp_path: Path) -> None:
    process, server, probe = run_redis_pod(USER_SECRETS, tmp_path)
    try:
        wait_ready(process, probe)
        for role in ("chief", "worker", "monitor"):
            client = server.client(username=role, password=user_password(role))
            try:
                assert client.fcall_ro(function_name("version"), 0) == LIBRARY_VERSION, role
            finally:
                client.close()
    finally:
        process.terminate()  # the script passes it on to redis-server
        assert process.wait(30) == 0
        server.cleanup()


def shell_blocks(path: Path) -> list[str]:
    """The ```sh blocks of a Markdown file, in order."""
    return re.findall(r"^```sh\n(.*?)^```$", path.read_text(), re.MULTILINE | re.DOTALL)


FAKE_KUBECTL = '''#!{python}
"""kubectl for the README's commands: `create secret generic` and `set env --local`
run the real kubectl offline (--dry-run=client) and keep what it prints; every
other command (apply, rollout, delete) is recorded with its standard input."""
import json, os, subprocess, sys
out = os.environ["KUBECTL_OUT"]
args = sys.argv[1:]
stdin = sys.stdin.read() if args[-2:] == ["-f", "-"] else ""
if args[:3] == ["create", "secret", "generic"]:
    done = subprocess.run([{kubectl!r}, *args, "--dry-run=client", "-o", "json"],
                          capture_output=True, text=True)
    sys.stderr.write(done.stderr)
    if done.returncode:
        sys.exit(done.returncode)
    with open(os.path.join(out, "secret-" + args[3] + ".json"), "w") as handle:
        handle.write(done.stdout)
    sys.exit(0)
if args[:3] == ["set", "env", "--local"]:
    sys.exit(subprocess.run([{kubectl!r}, *args]).returncode)
with open(os.path.join(out, "calls.jsonl"), "a") as handle:
    handle.write(json.dumps({{"args": args, "stdin": stdin}}) + "\\n")
'''


@pytest.mark.skipif(
    KUBECTL is None or shutil.which("openssl") is None, reason="needs kubectl and openssl"
)
def test_the_readmes_commands_make_secrets_that_run_the_job(tmp_path: Path) -> None:
    """ops/k8s/README.md's first two blocks, run for real from a copy of the
    repository's root: the passwords, users.acl and the Secrets it creates, then
    the manifests it applies. The Secrets start the Redis pod and let each role in."""
    bin_dir, out, work = tmp_path / "bin", tmp_path / "out", tmp_path / "work"
    for directory in (bin_dir, out, work):
        directory.mkdir()
    (work / "ops").symlink_to(Path(ROOT) / "ops")
    kubectl = bin_dir / "kubectl"
    kubectl.write_text(FAKE_KUBECTL.format(python=sys.executable, kubectl=KUBECTL))
    kubectl.chmod(0o755)
    stepbarrier = Path(sys.executable).parent / "stepbarrier"
    assert stepbarrier.exists()
    secrets_block, deploy_block, *_ = shell_blocks(README)
    env = {
        **os.environ,
        "PATH": os.pathsep.join([str(bin_dir), str(stepbarrier.parent), os.environ["PATH"]]),
        "KUBECTL_OUT": str(out),
    }
    for block in (secrets_block, deploy_block):
        done = subprocess.run(
            ["sh", "-eu", "-c", block], cwd=work, env=env, stdin=subprocess.DEVNULL,
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
    made = work / "stepbarrier-secrets"
    assert oct(made.stat().st_mode & 0o777) == "0o700"  # umask 077
    created: dict[str, dict[str, str]] = {}
    for path in out.glob("secret-*.json"):
        secret = json.loads(path.read_text())
        created[secret["metadata"]["name"]] = {
            key: base64.b64decode(value).decode() for key, value in secret["data"].items()
        }
    assert {name: set(data) for name, data in created.items()} == {
        name: set(data) for name, data in USER_SECRETS.items()
    }
    passwords = {role: (made / f"{role}.password").read_text() for role in SHIPPED_USERS}
    assert all(re.fullmatch(r"[0-9a-f]{64}", p) for p in passwords.values())  # no newline
    assert created["stepbarrier-redis-acl"]["users.acl"] == "".join(
        f"{line}\n"
        for line in [
            DEFAULT_OFF,
            *(acl_line(user, user, "*", password_hash(passwords[user])) for user in SHIPPED_USERS),
        ]
    )
    for secret in created.values():  # only hashes in users.acl, no emergency password at all
        assert passwords["emergency"] not in secret.values()
    calls = [json.loads(line) for line in (out / "calls.jsonl").read_text().splitlines()]
    applied = [yaml.safe_load_all(c["stdin"]) for c in calls if c["args"] == ["apply", "-f", "-"]]
    [jobs] = [[doc for doc in docs if doc] for docs in applied]
    run_ids = {task_environment(doc, 0)["STEPBARRIER_RUN_ID"] for doc in jobs}
    [run_id] = run_ids
    assert re.fullmatch(r"run-\d{8}-\d{6}", run_id)

    process, server, probe = run_redis_pod(created, tmp_path / "pod")
    try:
        wait_ready(process, probe)
        for role in ("chief", "worker", "monitor"):
            password = created[f"stepbarrier-{role}-password"]["password"]
            client = server.client(username=role, password=password)
            try:
                assert client.fcall_ro(function_name("version"), 0) == LIBRARY_VERSION, role
            finally:
                client.close()
    finally:
        process.terminate()
        assert process.wait(30) == 0
        server.cleanup()


def test_the_docs_give_the_readmes_commands() -> None:
    readme = shell_blocks(README)
    operations = shell_blocks(OPERATIONS)
    for block in readme[:3]:  # the Secrets, the first run, the next run
        assert block in operations, block


# -- the run id: not the Jobs' uids ----------------------------------------------------

CONFIGURATION = Path(ROOT) / "docs" / "configuration.md"
UID_LABEL = "batch.kubernetes.io/controller-uid"
"""The label the Job controller gives each pod of a Job: the Job's uid (Kubernetes 1.27+)."""


def field_ref_env(env: list[dict[str, Any]], labels: dict[str, str]) -> dict[str, str]:
    """What the kubelet makes of ``env`` entries that are downward-API label references."""
    resolved = {}
    for entry in env:
        path = entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        label = re.fullmatch(r"metadata\.labels\['([^']+)'\]", path)
        if label is not None:
            resolved[entry["name"]] = labels.get(label.group(1), "")  # a missing label: ""
    return resolved


def test_neither_training_job_passes_its_own_uid_as_the_run_id(tmp_path: Path) -> None:
    """Two Jobs have two uids: a worker given its Job's uid would never trust the
    chief, given the other Job's. The shipped run id is "set empty" instead: none,
    on purpose, which keeps any launcher's id out too (docs/configuration.md#run-id)."""
    for name in (CHIEF_JOB, WORKERS_JOB):
        env = container(job(name))["env"]
        assert field_ref_env(env, {UID_LABEL: f"uid-of-{name}"}) == {}, name
        assert "valueFrom" not in next(e for e in env if e["name"] == "STEPBARRIER_RUN_ID")
    chief = task_config(job(CHIEF_JOB), 0, tmp_path)
    worker = task_config(job(WORKERS_JOB), 1, tmp_path)
    assert (chief.run_id, chief.run_id_source) == (None, "STEPBARRIER_RUN_ID")
    assert (worker.run_id, worker.run_id_source) == (None, "STEPBARRIER_RUN_ID")
    header = (K8S / "training.yaml").read_text().split("\napiVersion:", 1)[0]
    assert f"metadata.labels['{UID_LABEL}']" in header  # says why not


def one_job_recipe() -> list[dict[str, Any]]:
    """The ``env`` of docs/configuration.md#run-id for a run whose pods are one Job."""
    section = CONFIGURATION.read_text().split("## Run id", 1)[1].split("\n## ", 1)[0]
    [block] = re.findall(r"^ *```yaml\n(.*?)^ *```$", section, re.MULTILINE | re.DOTALL)
    env: list[dict[str, Any]] = yaml.safe_load(textwrap.dedent(block))["env"]
    return env


def test_the_one_job_recipe_gives_every_pod_of_the_job_its_uid_as_the_run_id() -> None:
    recipe = one_job_recipe()
    uid, other = str(uuid.uuid4()), str(uuid.uuid4())
    pods = [field_ref_env(recipe, {UID_LABEL: uid, "job-name": "train"}) for _ in range(3)]
    configs = [BarrierConfig.from_env({"STEPBARRIER_JOB": "k8s-demo", **pod}) for pod in pods]
    assert {(c.run_id, c.run_id_source) for c in configs} == {(uid, "STEPBARRIER_RUN_ID")}
    rerun = BarrierConfig.from_env(
        {"STEPBARRIER_JOB": "k8s-demo", **field_ref_env(recipe, {UID_LABEL: other})}
    )
    assert rerun.run_id == other  # the next Job is the next run
    # a cluster older than 1.27 has no such label: the variable is empty, no run id
    older = field_ref_env(recipe, {"controller-uid": uid})
    assert BarrierConfig.from_env({"STEPBARRIER_JOB": "k8s-demo", **older}).run_id is None


# -- networkpolicy.yaml: who may connect ------------------------------------------------


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Whether a Kubernetes label selector (matchLabels, matchExpressions) selects
    a pod of ``labels``; the empty selector selects every pod."""
    if not set(selector) <= {"matchLabels", "matchExpressions"}:
        raise AssertionError(f"unknown selector fields: {selector}")
    if any(labels.get(key) != value for key, value in selector.get("matchLabels", {}).items()):
        return False
    for expression in selector.get("matchExpressions", []):
        key, operator = expression["key"], expression["operator"]
        values = expression.get("values", [])
        present = key in labels
        matched = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }[operator]
        if not matched:
            return False
    return True


def network_policy(name: str) -> dict[str, Any]:
    doc = find("NetworkPolicy", name)
    assert doc["apiVersion"] == "networking.k8s.io/v1"
    return doc


def pod_labels() -> dict[str, dict[str, str]]:
    """Every workload's name -> its pods' labels."""
    return {
        doc["metadata"]["name"]: doc["spec"]["template"]["metadata"]["labels"]
        for doc in manifests()
        if "template" in doc.get("spec", {})
    }


def admitted(policy: dict[str, Any], labels: dict[str, str], port: int) -> bool:
    """Whether the policy lets a pod of this namespace with ``labels`` connect to ``port``
    of the pods it selects."""
    for rule in policy["spec"]["ingress"]:
        ports = {(p.get("protocol", "TCP"), p["port"]) for p in rule["ports"]}
        if ("TCP", port) in ports and any(
            selects(peer["podSelector"], labels) for peer in rule["from"]
        ):
            return True
    return False


def test_every_ingress_rule_names_its_peers_and_ports() -> None:
    """A rule without `from` admits every source, and one without `ports` every
    port: each rule here has both, and its peers are pods of the namespace only
    (no namespaceSelector, no ipBlock)."""
    policies = [doc for doc in manifests() if doc["kind"] == "NetworkPolicy"]
    assert {doc["metadata"]["name"] for doc in policies} == {
        "stepbarrier-redis",
        "stepbarrier-train",
    }
    for doc in policies:
        assert doc["spec"]["policyTypes"] == ["Ingress"], doc
        assert doc["spec"]["podSelector"], doc  # never every pod of the namespace
        for rule in doc["spec"]["ingress"]:
            assert rule["from"] and rule["ports"], rule
            for peer in rule["from"]:
                assert set(peer) == {"podSelector"} and peer["podSelector"], peer


def test_the_redis_policy_selects_the_redis_pod_on_its_port() -> None:
    policy = network_policy("stepbarrier-redis")
    labels = pod_labels()
    selected = {name for name, own in labels.items() if selects(policy["spec"]["podSelector"], own)}
    assert selected == {"redis"}
    [redis_container] = redis_pod()["containers"]
    [port] = redis_container["ports"]
    assert port["containerPort"] == 6379
    assert find("Service", "redis")["spec"]["selector"].items() <= labels["redis"].items()


def test_redis_admits_only_the_chief_the_workers_and_the_exporter() -> None:
    """By the labels the manifests give their pods: the ps never uses Redis, and a
    pod of the namespace without the job's labels is not admitted."""
    policy = network_policy("stepbarrier-redis")
    admitted_workloads = {
        name for name, labels in pod_labels().items() if admitted(policy, labels, 6379)
    }
    assert admitted_workloads == {CHIEF_JOB, WORKERS_JOB, GATED_JOB, "stepbarrier-exporter"}
    for stranger in (
        {},
        {"app": "attacker"},
        {"app": "stepbarrier-train"},  # no role
        {"app": "stepbarrier-train", "role": "ps"},
        {"app": "stepbarrier-redis"},
        {"role": "chief"},
    ):
        assert not admitted(policy, stranger, 6379), stranger
    assert not admitted(policy, pod_labels()[CHIEF_JOB], 2222)  # Redis's port only


def test_the_tensorflow_servers_admit_only_the_jobs_pods() -> None:
    """TensorFlow's gRPC servers run whatever graph they are sent: only the ps, the
    chief and the workers reach them, on the port TF_CONFIG and the Service name."""
    policy = network_policy("stepbarrier-train")
    labels = pod_labels()
    selected = {name for name, own in labels.items() if selects(policy["spec"]["podSelector"], own)}
    # the gated workers carry the workers' labels (for Redis): selected, serving nothing
    assert selected == {"ps", CHIEF_JOB, WORKERS_JOB, GATED_JOB}
    assert {name for name, own in labels.items() if admitted(policy, own, 2222)} == selected
    selected.remove(GATED_JOB)
    assert not admitted(policy, labels["stepbarrier-exporter"], 2222)
    assert not admitted(policy, {"app": "attacker"}, 2222)
    for name in selected:
        workload = find("StatefulSet", name) if name == "ps" else job(name)
        assert [p["containerPort"] for p in container(workload)["ports"]] == [2222]
    assert all(address.endswith(":2222") for tasks in cluster().values() for address in tasks)
    [service_port] = find("Service", "train")["spec"]["ports"]
    assert service_port["port"] == 2222


def test_the_deploy_commands_apply_the_network_policy_before_redis() -> None:
    for path in (README, OPERATIONS):
        [deploy] = [block for block in shell_blocks(path) if "ops/k8s/redis.yaml" in block]
        assert deploy.index("ops/k8s/networkpolicy.yaml") < deploy.index("ops/k8s/redis.yaml")
