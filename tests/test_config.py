"""BarrierConfig.from_env: every variable, valid and invalid, and TF_CONFIG."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig, ConfigurationError
from stepbarrier.config import ENVIRONMENT_VARIABLES, mask_url

BASE = {"STEPBARRIER_JOB": "mnist-42"}


def env(**values: str) -> dict[str, str]:
    result = dict(BASE)
    result.update(
        {f"STEPBARRIER_{k.upper()}" if k != "TF_CONFIG" else k: v for k, v in values.items()}
    )
    return result


def test_defaults_from_a_minimal_environment() -> None:
    cfg = BarrierConfig.from_env(BASE)
    assert cfg.job == "mnist-42"
    assert cfg.redis_url == "redis://localhost:6379/0"
    assert cfg.stall_timeout == 600.0
    assert cfg.heartbeat == 1.0
    assert cfg.key_ttl == 7 * 24 * 3600
    assert cfg.timeout is None
    assert cfg.on_timeout == "raise"
    assert cfg.role is None and cfg.task_id is None


def test_job_is_required() -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({})
    assert info.value.variable == "STEPBARRIER_JOB"
    assert "STEPBARRIER_JOB" in str(info.value)


@pytest.mark.parametrize("name", ["a b", "x{y}", "j*", "", "x" * 65, "naïve", "a/b", "a:b"])
def test_job_names_that_cannot_be_key_names_are_refused(name: str) -> None:
    values = {"STEPBARRIER_JOB": name}
    if name == "":
        values = {"STEPBARRIER_JOB": " "}
    with pytest.raises(ConfigurationError, match="STEPBARRIER_JOB"):
        BarrierConfig.from_env(values)


@pytest.mark.parametrize("name", ["a", "mnist_42.v-1", "X" * 64])
def test_valid_job_names(name: str) -> None:
    assert BarrierConfig.from_env({"STEPBARRIER_JOB": name}).job == name


@pytest.mark.parametrize(
    "url",
    [
        "redis://r:6379/0",
        "rediss://r.example:6380/2",
        "unix:///run/redis.sock",
        "redis://u:pw@h:1/0",
    ],
)
def test_redis_urls_accepted(url: str) -> None:
    assert BarrierConfig.from_env(env(redis_url=url)).redis_url == url


@pytest.mark.parametrize(
    "url",
    ["http://h:6379", "redis://", "redis://h:99999/0", "redis://h:6379/abc", "unix://", "h:6379"],
)
def test_bad_redis_urls_name_the_variable(url: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(redis_url=url))
    assert info.value.variable == "STEPBARRIER_REDIS_URL"


def test_a_password_in_a_bad_url_never_appears_in_the_message() -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(redis_url="http://user:s3cr3t-pw@h:6379/0"))
    assert "s3cr3t-pw" not in str(info.value)
    assert "***" in str(info.value)


def test_mask_url_hides_only_the_password() -> None:
    assert mask_url("redis://alice:hunter2@r:6379/0") == "redis://alice:***@r:6379/0"
    assert mask_url("redis://r:6379/0") == "redis://r:6379/0"
    assert "hunter2" not in repr(BarrierConfig(job="j", redis_password="hunter2"))


def test_username_and_password(tmp_path: Path) -> None:
    cfg = BarrierConfig.from_env(env(redis_username="worker", redis_password="pw"))
    assert (cfg.redis_username, cfg.redis_password) == ("worker", "pw")
    secret = tmp_path / "pw"
    secret.write_text("from-file\n")
    cfg = BarrierConfig.from_env(env(redis_password_file=str(secret)))
    assert cfg.redis_password == "from-file"


def test_password_and_password_file_together_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "pw"
    secret.write_text("x")
    with pytest.raises(ConfigurationError, match="not both"):
        BarrierConfig.from_env(env(redis_password="pw", redis_password_file=str(secret)))


def test_missing_or_empty_password_file(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(redis_password_file=str(tmp_path / "nope")))
    assert info.value.variable == "STEPBARRIER_REDIS_PASSWORD_FILE"
    empty = tmp_path / "empty"
    empty.write_text("")
    with pytest.raises(ConfigurationError, match="empty"):
        BarrierConfig.from_env(env(redis_password_file=str(empty)))


def test_tls_files(tmp_path: Path) -> None:
    for name in ("ca", "cert", "key"):
        (tmp_path / name).write_text("-----BEGIN-----")
    cfg = BarrierConfig.from_env(
        env(
            redis_url="rediss://r:6380/0",
            tls_ca_file=str(tmp_path / "ca"),
            tls_cert_file=str(tmp_path / "cert"),
            tls_key_file=str(tmp_path / "key"),
        )
    )
    assert cfg.tls_ca_file == str(tmp_path / "ca")
    assert cfg.tls_cert_file == str(tmp_path / "cert")
    assert cfg.tls_key_file == str(tmp_path / "key")


def test_tls_certificate_without_key_is_refused(tmp_path: Path) -> None:
    (tmp_path / "cert").write_text("x")
    with pytest.raises(ConfigurationError, match="go together"):
        BarrierConfig.from_env(
            env(redis_url="rediss://r:1/0", tls_cert_file=str(tmp_path / "cert"))
        )


def test_tls_settings_with_a_plain_redis_url_are_refused(tmp_path: Path) -> None:
    (tmp_path / "ca").write_text("x")
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(redis_url="redis://r:1/0", tls_ca_file=str(tmp_path / "ca")))
    assert "rediss://" in str(info.value)


def test_tls_file_that_does_not_exist(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(
            env(redis_url="rediss://r:1/0", tls_ca_file=str(tmp_path / "missing"))
        )
    assert info.value.variable == "STEPBARRIER_TLS_CA_FILE"


def test_sentinels() -> None:
    cfg = BarrierConfig.from_env(
        env(sentinels="10.0.0.1:26379, s2:26380", sentinel_service="barrier")
    )
    assert cfg.sentinels == (("10.0.0.1", 26379), ("s2", 26380))
    assert cfg.sentinel_service == "barrier"
    assert BarrierConfig.from_env(env(sentinels="s:26379")).sentinel_service == "mymaster"


@pytest.mark.parametrize("value", ["s", "s:", ":26379", "s:0", "s:70000", "s:x", "s 1:2"])
def test_bad_sentinels(value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(sentinels=value))
    assert info.value.variable == "STEPBARRIER_SENTINELS"


def test_role_and_task_id() -> None:
    cfg = BarrierConfig.from_env(env(role="worker", task_id="3"))
    assert (cfg.role, cfg.task_id) == ("worker", 3)
    chief = BarrierConfig.from_env(env(role="CHIEF"))
    assert (chief.role, chief.task_id) == ("chief", 0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("role", "ps"),
        ("task_id", "-1"),
        ("task_id", "1.5"),
        ("task_id", "x"),
        ("task_id", "9" * 30),
        ("wait_until_step", "-5"),
        ("wait_until_step", "ten"),
        ("wait_until_step", str(2**60)),
        ("schedule", "exp:3"),
        ("schedule", "log:"),
        ("schedule", "log:-1"),
        ("timeout", "0"),
        ("timeout", "-3"),
        ("timeout", "nan"),
        ("timeout", "inf"),
        ("timeout", "soon"),
        ("stall_timeout", "0"),
        ("stall_timeout", "0.5"),
        ("on_timeout", "ignore"),
        ("heartbeat", "0"),
        ("heartbeat", "7200"),
        ("key_ttl", "10"),
        ("key_ttl", "1e9"),
        ("key_ttl", "forever"),
    ],
)
def test_each_bad_value_names_its_variable(name: str, value: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(**{name: value}))
    variable = f"STEPBARRIER_{name.upper()}"
    assert info.value.variable == variable
    assert variable in str(info.value)


def test_numeric_settings() -> None:
    cfg = BarrierConfig.from_env(
        env(
            wait_until_step="40",
            timeout="12.5",
            stall_timeout="30",
            on_timeout="proceed",
            heartbeat="0.5",
            key_ttl="3600",
        )
    )
    assert cfg.wait_until_step == 40
    assert cfg.timeout == 12.5
    assert cfg.stall_timeout == 30.0
    assert cfg.on_timeout == "proceed"
    assert cfg.heartbeat == 0.5
    assert cfg.key_ttl == 3600


def test_stall_timeout_must_exceed_heartbeat() -> None:
    with pytest.raises(ConfigurationError, match="STEPBARRIER_STALL_TIMEOUT"):
        BarrierConfig.from_env(env(heartbeat="10", stall_timeout="5"))


def test_wait_until_step_from_schedule_or_explicit() -> None:
    assert BarrierConfig.from_env(env(wait_until_step="7")).resolved_wait_until_step() == 7
    cfg = BarrierConfig.from_env(env(schedule="log:10", task_id="3"))
    assert cfg.resolved_wait_until_step() == 13
    with pytest.raises(ConfigurationError, match="task id"):
        BarrierConfig.from_env(env(schedule="log:10")).resolved_wait_until_step()
    with pytest.raises(ConfigurationError, match="STEPBARRIER_WAIT_UNTIL_STEP"):
        BarrierConfig.from_env(BASE).resolved_wait_until_step()


def tf_config(kind: str, index: int, chief: bool = True) -> str:
    cluster: dict[str, list[str]] = {"ps": ["h:1"], "worker": ["h:2", "h:3", "h:4"]}
    if chief:
        cluster["chief"] = ["h:0"]
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@pytest.mark.parametrize(
    ("kind", "index", "chief", "role", "task_id"),
    [
        ("chief", 0, True, "chief", 0),
        ("master", 0, True, "chief", 0),
        ("worker", 0, True, "worker", 1),
        ("worker", 2, True, "worker", 3),
        ("worker", 0, False, "chief", 0),
        ("worker", 2, False, "worker", 2),
        ("ps", 0, True, None, None),
        ("evaluator", 0, True, None, None),
    ],
)
def test_role_and_task_id_fall_back_to_tf_config(
    kind: str, index: int, chief: bool, role: str | None, task_id: int | None
) -> None:
    cfg = BarrierConfig.from_env({**BASE, "TF_CONFIG": tf_config(kind, index, chief)})
    assert (cfg.role, cfg.task_id) == (role, task_id)


def test_stepbarrier_variables_override_tf_config() -> None:
    cfg = BarrierConfig.from_env(
        {
            **BASE,
            "TF_CONFIG": tf_config("worker", 0),
            "STEPBARRIER_ROLE": "worker",
            "STEPBARRIER_TASK_ID": "9",
        }
    )
    assert (cfg.role, cfg.task_id) == ("worker", 9)


@pytest.mark.parametrize(
    "text",
    [
        "{",
        "[]",
        '{"task": {"type": "worker"}}x',
        '{"cluster": {}, "task": {"type": "gpu", "index": 0}}',
        '{"cluster": {}, "task": {"type": "worker", "index": "one"}}',
        '{"cluster": {}, "task": {"type": "worker", "index": -2}}',
        '{"cluster": [], "task": {"type": "worker", "index": 0}}',
        '{"cluster": {}}',
    ],
)
def test_malformed_tf_config(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({**BASE, "TF_CONFIG": text})
    assert info.value.variable == "TF_CONFIG"


def test_every_documented_variable_is_read() -> None:
    """The README table and ENVIRONMENT_VARIABLES list the same variables."""
    readme = (Path(__file__).parent.parent / "README.md").read_text()
    for name in ENVIRONMENT_VARIABLES:
        assert f"`{name}`" in readme, f"{name} missing from README's table"


def test_config_is_frozen() -> None:
    cfg = BarrierConfig(job="j")
    with pytest.raises(AttributeError):
        cfg.job = "other"  # type: ignore[misc]


def test_direct_construction_validates() -> None:
    with pytest.raises(ConfigurationError):
        BarrierConfig(job="bad name")
    with pytest.raises(ConfigurationError):
        BarrierConfig(job="j", heartbeat=-1)
    with pytest.raises(ConfigurationError):
        BarrierConfig(job="j", on_timeout="maybe")  # type: ignore[arg-type]
