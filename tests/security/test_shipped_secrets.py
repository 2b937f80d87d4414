"""Nothing a user deploys comes with working passwords (issue 23, High 5 and Low 12).

- No Kubernetes manifest carries a password or a password hash: the pods mount
  Secrets the user creates, each pod only its own role's, as files.
- ``ops/redis/start-redis.sh``, run for real, refuses the public example
  passwords unless ``STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only``, and then
  keeps Redis on loopback.
- The shipped ``redis.conf`` closes idle connections (Medium 8) without
  dropping a subscribed or a blocked one.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml

from stepbarrier._protocol.roles import acl_line, password_hash
from stepbarrier._redis.functions import LIBRARY_NAME, function_name
from tests.conftest import ROOT
from tests.ops_redis import (
    ACL_FILE,
    HARNESS_LINE,
    HARNESS_PASSWORD,
    HARNESS_USER,
    LIBRARY_FILE,
    PASSWORDS,
    REDIS_CONF,
    SECRETS,
    SHIPPED_USERS,
    START_SCRIPT,
)
from tests.redis_harness import RedisServer

K8S = Path(ROOT) / "ops" / "k8s"
OPT_IN = "STEPBARRIER_EXAMPLE_PASSWORDS"
HASH = re.compile(r"#[0-9a-fA-F]{64}\b")

# Each workload's pods, by name, and the only Secrets they may mount.
ALLOWED_SECRETS = {
    ("Deployment", "redis"): {"stepbarrier-redis-acl", "stepbarrier-installer-password"},
    ("Job", "training-chief"): {"stepbarrier-chief-password"},
    ("Job", "training-workers"): {"stepbarrier-worker-password"},
    ("Job", "gated-workers"): {"stepbarrier-worker-password"},  # init-container-wait.yaml
    ("Deployment", "stepbarrier-exporter"): {"stepbarrier-monitor-password"},
    ("StatefulSet", "ps"): set(),
}


def manifest_texts() -> dict[str, str]:
    return {path.name: path.read_text() for path in sorted(K8S.glob("*.yaml"))}


def manifests() -> list[dict[str, Any]]:
    return [doc for text in manifest_texts().values() for doc in yaml.safe_load_all(text) if doc]


def workloads() -> dict[tuple[str, str], dict[str, Any]]:
    return {
        (doc["kind"], doc["metadata"]["name"]): doc
        for doc in manifests()
        if "template" in doc.get("spec", {})
    }


# -- the manifests, as text and as objects ---------------------------------------


@pytest.mark.parametrize("name", sorted(manifest_texts()))
def test_no_manifest_holds_a_password_or_a_password_hash(name: str) -> None:
    text = manifest_texts()[name]
    assert not HASH.search(text), "a password hash (#<64 hex>)"
    assert not re.search(r"^\s*user \S+ on\b", text, re.MULTILINE), "a users.acl line"
    assert "stringData" not in text and "kind: Secret" not in text
    for password in PASSWORDS.values():
        assert password not in text


def test_the_only_hashes_in_the_manifests_are_the_start_scripts_refusals() -> None:
    """start-redis.sh (in the Redis ConfigMap) lists the example passwords' SHA-256 to
    refuse them: no `#` before them, so no ACL rule; and no other 64-hex string."""
    refused = set(re.findall(r"^([0-9a-f]{64}) \w+$", START_SCRIPT.read_text(), re.MULTILINE))
    assert len(refused) == len(SHIPPED_USERS)
    for name, text in manifest_texts().items():
        found = set(re.findall(r"[0-9a-fA-F]{64}", text))
        assert found <= refused, name


def test_no_manifest_is_a_secret_and_no_configmap_holds_a_password() -> None:
    assert [doc for doc in manifests() if doc["kind"] == "Secret"] == []
    for doc in manifests():
        if doc["kind"] != "ConfigMap":
            continue
        for key, value in doc["data"].items():
            assert "password" not in key.lower() or key.endswith(".sh"), key
            assert not HASH.search(str(value)), key
            assert not any(password in str(value) for password in PASSWORDS.values()), key


def test_every_workload_is_known_here() -> None:
    assert set(workloads()) == set(ALLOWED_SECRETS)


@pytest.mark.parametrize(("kind", "name"), sorted(ALLOWED_SECRETS))
def test_a_pod_mounts_only_its_own_roles_secret(kind: str, name: str) -> None:
    spec = workloads()[(kind, name)]["spec"]["template"]["spec"]
    mounted = set()
    for volume in spec.get("volumes", []):
        assert "projected" not in volume and "csi" not in volume, volume
        if "secret" in volume:
            mounted.add(volume["secret"]["secretName"])
            # only the key it needs, never the whole Secret
            assert [item["key"] for item in volume["secret"]["items"]] in (
                ["password"],
                ["users.acl"],
            ), volume
    assert mounted == ALLOWED_SECRETS[(kind, name)]
    assert "imagePullSecrets" not in spec


@pytest.mark.parametrize(("kind", "name"), sorted(ALLOWED_SECRETS))
def test_a_pod_takes_its_password_from_a_file_never_from_its_environment(
    kind: str, name: str
) -> None:
    spec = workloads()[(kind, name)]["spec"]["template"]["spec"]
    every_file = []  # a container may have none (gated-workers' training container)
    for each in [*spec["containers"], *spec.get("initContainers", [])]:
        for source in each.get("envFrom", []):
            assert "secretRef" not in source, source
        for entry in each.get("env", []):
            assert "secretKeyRef" not in entry.get("valueFrom", {}), entry
            assert entry["name"] != "STEPBARRIER_REDIS_PASSWORD", entry
            assert not ("PASSWORD" in entry["name"] and not entry["name"].endswith("_FILE"))
        env = {e["name"]: e.get("value") for e in each.get("env", [])}
        words = [*each.get("command", []), *each.get("args", [])]
        files = [env[n] for n in env if n.endswith("PASSWORD_FILE")]
        files += [w.split("=", 1)[1] for w in words if w.startswith("--password-file=")]
        files += [w for w in words if w.startswith("/etc/redis/installer/")]
        secret_mounts = {
            mount["mountPath"]
            for mount in each.get("volumeMounts", [])
            for volume in spec["volumes"]
            if volume["name"] == mount["name"] and "secret" in volume
        }
        every_file += files
        for path in files:
            assert any(path.startswith(f"{mount}/") for mount in secret_mounts), path
    if ALLOWED_SECRETS[(kind, name)] - {"stepbarrier-redis-acl"}:
        assert every_file, f"{name}: no password file"


def test_a_worker_pod_never_names_the_chiefs_secret() -> None:
    text = yaml.safe_dump(workloads()[("Job", "training-workers")])
    assert "stepbarrier-chief-password" not in text and "chief-password" not in text
    for kind, name in ALLOWED_SECRETS:
        if name != "training-chief":
            assert "stepbarrier-chief-password" not in yaml.safe_dump(workloads()[(kind, name)])


def test_only_the_redis_pod_gets_the_installers_password() -> None:
    for key, workload in workloads().items():
        named = "stepbarrier-installer-password" in yaml.safe_dump(workload)
        assert named == (key == ("Deployment", "redis")), key


def test_no_kubernetes_pod_opts_in_to_the_example_passwords() -> None:
    for text in manifest_texts().values():
        for doc in yaml.safe_load_all(text):
            if doc and doc["kind"] != "ConfigMap":
                assert OPT_IN not in yaml.safe_dump(doc)


# -- start-redis.sh, run for real --------------------------------------------------


def test_the_scripts_example_hashes_are_the_example_passwords() -> None:
    script = START_SCRIPT.read_text()
    listed = dict(
        (user, digest)
        for digest, user in re.findall(r"^([0-9a-f]{64}) (\w+)$", script, re.MULTILINE)
    )
    assert listed == {
        user: hashlib.sha256(PASSWORDS[user].encode()).hexdigest() for user in SHIPPED_USERS
    }
    acl = ACL_FILE.read_text()
    for user, digest in listed.items():
        assert f"user {user} on #{digest} " in acl, user


def fresh_users(directory: Path) -> tuple[Path, Path, dict[str, str]]:
    """A users.acl of new passwords (and the harness user), and the installer's file."""
    passwords = {user: secrets.token_hex(32) for user in SHIPPED_USERS}
    lines = ["user default off resetpass resetkeys resetchannels -@all", HARNESS_LINE]
    lines += [acl_line(user, user, "*", password_hash(passwords[user])) for user in SHIPPED_USERS]
    acl = directory / "fresh.acl"
    acl.write_text("".join(f"{line}\n" for line in lines))
    installer = directory / "installer.password"
    installer.write_text(passwords["installer"] + "\n")
    return acl, installer, passwords


def example_acl(directory: Path) -> Path:
    """ops/redis/users.acl and the harness user (for CONFIG GET)."""
    path = directory / "example.acl"
    path.write_text(ACL_FILE.read_text() + HARNESS_LINE + "\n")
    return path


class Started:
    """start-redis.sh on a free port: ``--port``, ``--dir``, ``--logfile``, and the
    given options (no ``--bind`` unless given: the script's own choice is tested)."""

    def __init__(
        self,
        tmp_path: Path,
        installer: Path,
        options: list[str],
        opt_in: str | None,
        conf: Path = REDIS_CONF,
    ) -> None:
        self.harness = RedisServer()  # a free port and a directory
        self.port = self.harness.port
        env = {k: v for k, v in os.environ.items() if k != OPT_IN}
        if opt_in is not None:
            env[OPT_IN] = opt_in
        env["REDIS_PORT"] = str(self.port)
        command = ["sh", str(START_SCRIPT), str(conf), str(LIBRARY_FILE), str(installer)]
        command += ["--port", str(self.port), "--dir", str(self.harness.dir)]
        command += ["--logfile", str(self.harness.log), "--save", "", *options]
        self.process = subprocess.Popen(
            command,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def finish(self, timeout: float = 30) -> tuple[int, str]:
        """Wait for the script to exit: its status and its standard error."""
        _out, err = self.process.communicate(timeout=timeout)
        return self.process.returncode, err.decode()

    def listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                return True
        except OSError:
            return False

    def wait_loaded(self, password: str) -> None:
        deadline = time.monotonic() + 30
        while True:
            assert self.process.poll() is None, self.process.communicate()
            client = redis.Redis(port=self.port, username="installer", password=password)
            try:
                if client.function_list(library=LIBRARY_NAME):
                    return
            except redis.RedisError:
                pass
            finally:
                client.close()
            assert time.monotonic() < deadline, "the library was never loaded"
            time.sleep(0.05)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()  # the script passes it on to redis-server
            assert self.process.wait(30) == 0
        self.harness.cleanup()


@pytest.fixture
def started(tmp_path: Path) -> Iterator[list[Started]]:
    runs: list[Started] = []
    try:
        yield runs
    finally:
        for run in runs:
            if run.process.poll() is None:
                os.killpg(run.process.pid, 9)
                run.process.wait(10)
            run.harness.cleanup()


def refused(run: Started) -> str:
    """The script's message, once it has exited 2 with no server left running."""
    status, err = run.finish()
    assert status == 2, err
    assert not run.listening()  # no server was left behind
    for password in PASSWORDS.values():
        assert password not in err  # named by file, never shown
    return err


def test_it_refuses_the_example_installer_password_without_the_opt_in(
    tmp_path: Path, started: list[Started]
) -> None:
    acl, _installer, _passwords = fresh_users(tmp_path)
    run = Started(tmp_path, SECRETS / "installer.password", ["--aclfile", str(acl)], None)
    started.append(run)
    err = refused(run)
    assert "refusing to start Redis with the EXAMPLE passwords" in err
    assert f"{SECRETS / 'installer.password'} (the installer's password)" in err
    assert "STEPBARRIER_EXAMPLE_PASSWORDS=loopback-only" in err
    assert "docs/operations.md#passwords" in err


def test_it_refuses_an_acl_file_with_an_example_hash_without_the_opt_in(
    tmp_path: Path, started: list[Started]
) -> None:
    """Even with the installer's own password: the other roles' are in users.acl."""
    acl, installer, passwords = fresh_users(tmp_path)
    mixed = tmp_path / "mixed.acl"
    example_worker = acl_line("worker", "worker", "*", password_hash(PASSWORDS["worker"]))
    mixed.write_text(
        "".join(line + "\n" for line in acl.read_text().splitlines() if " worker " not in line)
        + example_worker
        + "\n"
    )
    run = Started(tmp_path, installer, ["--aclfile", str(mixed)], None)
    started.append(run)
    err = refused(run)
    assert f"{mixed} (users worker)" in err
    assert passwords["installer"] not in err


def test_it_refuses_the_example_users_named_by_the_configuration_file(
    tmp_path: Path, started: list[Started]
) -> None:
    """The ACL file the configuration names (aclfile, here in an included file), as
    in the Kubernetes pod and the cluster nodes, not only an --aclfile option."""
    _acl, installer, _passwords = fresh_users(tmp_path)
    included = tmp_path / "admin.conf"
    included.write_text(f"aclfile {ACL_FILE}\n")
    conf = tmp_path / "redis.conf"
    conf.write_text(REDIS_CONF.read_text().replace("aclfile ", "# aclfile ") + "\n")
    run = Started(tmp_path, installer, ["--include", str(included)], None, conf=conf)
    started.append(run)
    assert f"{ACL_FILE} (users chief worker monitor emergency installer)" in refused(run)


@pytest.mark.parametrize("value", ["1", "yes", "LOOPBACK-ONLY", "loopback"])
def test_any_other_opt_in_value_is_refused(
    tmp_path: Path, started: list[Started], value: str
) -> None:
    run = Started(tmp_path, SECRETS / "installer.password", ["--aclfile", str(ACL_FILE)], value)
    started.append(run)
    err = refused(run)
    assert f"STEPBARRIER_EXAMPLE_PASSWORDS must be 'loopback-only' or unset, got '{value}'" in err


def harness_config(port: int, name: str) -> list[bytes | str]:
    client = redis.Redis(
        port=port, username=HARNESS_USER, password=HARNESS_PASSWORD, decode_responses=True
    )
    try:
        return list(client.config_get(name).values())
    finally:
        client.close()


def test_with_the_opt_in_it_runs_on_loopback_only(tmp_path: Path, started: list[Started]) -> None:
    """No --bind among the options: a configuration's `bind * -::*` (the Kubernetes
    one's; ops/redis/redis.conf binds loopback itself) is overridden."""
    conf = tmp_path / "redis.conf"
    conf.write_text(REDIS_CONF.read_text().replace("\nbind 127.0.0.1 -::1\n", "\nbind * -::*\n"))
    assert "\nbind * -::*\n" in conf.read_text()
    run = Started(
        tmp_path,
        SECRETS / "installer.password",
        ["--aclfile", str(example_acl(tmp_path))],
        "loopback-only",
        conf=conf,
    )
    started.append(run)
    run.wait_loaded(PASSWORDS["installer"])
    assert harness_config(run.port, "bind") == ["127.0.0.1 -::1"]
    chief = redis.Redis(port=run.port, username="chief", password=PASSWORDS["chief"])
    try:
        assert chief.fcall_ro(function_name("version"), 0) is not None
    finally:
        chief.close()
    run.stop()
    err = run.process.stderr.read().decode() if run.process.stderr else ""
    assert "Redis listens on 127.0.0.1 and ::1 only" in err


def test_with_the_opt_in_an_explicit_loopback_bind_is_kept(
    tmp_path: Path, started: list[Started]
) -> None:
    run = Started(
        tmp_path,
        SECRETS / "installer.password",
        ["--aclfile", str(example_acl(tmp_path)), "--bind", "127.0.0.1"],
        "loopback-only",
    )
    started.append(run)
    run.wait_loaded(PASSWORDS["installer"])
    assert harness_config(run.port, "bind") == ["127.0.0.1"]
    run.stop()


def test_its_own_passwords_need_no_opt_in_and_keep_the_bind(
    tmp_path: Path, started: list[Started]
) -> None:
    acl, installer, passwords = fresh_users(tmp_path)
    run = Started(tmp_path, installer, ["--aclfile", str(acl), "--bind", "127.0.0.1"], None)
    started.append(run)
    run.wait_loaded(passwords["installer"])
    worker = redis.Redis(port=run.port, username="worker", password=passwords["worker"])
    try:
        assert worker.fcall_ro(function_name("version"), 0) is not None
    finally:
        worker.close()
    run.stop()
    assert run.process.stderr is not None
    assert "EXAMPLE" not in run.process.stderr.read().decode()


# -- redis.conf: idle connections --------------------------------------------------


def conf_directives(text: str) -> dict[str, str]:
    pairs = (line.split(None, 1) for line in text.splitlines() if line.strip() and line[0] != "#")
    return {name: value.strip() for name, value in pairs}


def k8s_redis_conf() -> str:
    [config] = [
        doc
        for doc in manifests()
        if doc["kind"] == "ConfigMap" and doc["metadata"]["name"] == "stepbarrier-redis-config"
    ]
    text: str = config["data"]["redis.conf"]
    return text


@pytest.mark.parametrize("where", ["ops/redis/redis.conf", "ops/k8s/redis.yaml"])
def test_redis_conf_closes_idle_connections_but_not_before_any_client_acts(where: str) -> None:
    text = REDIS_CONF.read_text() if where.startswith("ops/redis") else k8s_redis_conf()
    directives = conf_directives(text)
    timeout = int(directives["timeout"])
    # above a waiter's fallback read (5 s) and a chief's heartbeat (1 s) by far
    assert 60 <= timeout <= 3600
    assert int(directives["maxclients"]) > 0
    assert directives["client-query-buffer-limit"] == "1mb"
    assert directives["lazyfree-lazy-user-del"] == "yes"


def blocked_client_ids(admin: redis.Redis) -> set[int]:
    """Ids of the connections blocked in a command (flag ``b``)."""
    return {int(c["id"]) for c in admin.client_list() if "b" in str(c["flags"])}


def wait_for_blocked_client(admin: redis.Redis, within: float = 30.0) -> set[int]:
    """The blocked connections once there is one (a bounded wait, no timing assert)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        ids = blocked_client_ids(admin)
        if ids:
            return ids
        time.sleep(0.05)
    raise AssertionError(f"no connection was blocked in BLPOP within {within} s")


def test_the_idle_timeout_drops_an_idle_login_but_no_subscriber_or_blocked_reader(
    tmp_path: Path,
) -> None:
    """The shipped directives with `timeout` cut to 1 s: an unauthenticated idle
    connection is closed, a subscribed one and one blocked in BLPOP (the chief's
    registration listener) are not: what the comment in redis.conf says."""
    acl = example_acl(tmp_path)
    server = RedisServer(args=["--aclfile", str(acl), "--timeout", "1"])
    binary, *options = server.command()
    # the configuration file first, as redis-server wants it; the options win over it
    server.process = subprocess.Popen(
        [binary, str(REDIS_CONF), *options], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        server.wait_ready()
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
        subscriber = server.client(username="worker", password=PASSWORDS["worker"])
        pubsub = subscriber.pubsub()
        pubsub.subscribe("stepbarrier:{j}:steps")
        assert pubsub.get_message(timeout=5)["type"] == "subscribe"
        blocked = server.client(username="chief", password=PASSWORDS["chief"], socket_timeout=30)
        pusher = server.client(username="worker", password=PASSWORDS["worker"])
        popped: list[object] = []
        reader = threading.Thread(
            target=lambda: popped.append(blocked.blpop(["stepbarrier:{j}:registrations"], 20))
        )
        reader.start()
        admin = server.client(username=HARNESS_USER, password=HARNESS_PASSWORD)
        # the reader is blocked in BLPOP before the timeout can judge it: a thread
        # starved on a loaded machine would otherwise be idle between AUTH and BLPOP
        blocked_ids = wait_for_blocked_client(admin)
        time.sleep(3.5)  # well past the 1 s timeout (Redis checks it about every second)
        idle.settimeout(5)
        assert idle.recv(1) == b""  # closed by the server
        # the same connection is still blocked: not dropped and reconnected by a retry
        assert blocked_ids == blocked_client_ids(admin)
        pusher.rpush("stepbarrier:{j}:registrations", "x")
        reader.join(20)
        assert popped and popped[0] is not None  # the blocked connection lived on
        admin.publish("stepbarrier:{j}:steps", "hello")
        message = pubsub.get_message(timeout=5)
        assert message is not None and message["data"] == b"hello"  # still subscribed
        for client in (pubsub, subscriber, blocked, pusher, admin):
            client.close()
        idle.close()
    finally:
        server.cleanup()
