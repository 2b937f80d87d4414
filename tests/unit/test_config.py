"""BarrierConfig.from_env: every variable, valid and invalid, and TF_CONFIG."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from stepbarrier import BarrierConfig, ConfigurationError
from stepbarrier._chief.publish_call import finished_ttl
from stepbarrier._config.checks import mask_url
from stepbarrier._config.environment import barrier_role_from_env
from stepbarrier._config.settings import ENVIRONMENT_VARIABLES
from tests.conftest import ROOT

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
    assert mask_url("redis://hunter2@r:6379/0") == "redis://***@r:6379/0"  # as redis-cli reads it
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
        ("jobs_pattern", "team-[ab]-*"),
        ("jobs_pattern", "team a"),
        ("jobs_pattern", "x" * 65),
        ("jobs_pattern", "other-*"),  # the job (mnist-42) does not match it
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
        BarrierConfig.from_env(env(heartbeat="1", stall_timeout="0.5"))


def test_the_heartbeat_is_at_most_a_third_of_the_job_wide_fence() -> None:
    # issue 32, case 8: one FENCE for every process of a job
    with pytest.raises(ConfigurationError, match=r"STEPBARRIER_HEARTBEAT.*at most 1 s"):
        BarrierConfig.from_env(env(heartbeat="4"))
    with pytest.raises(ConfigurationError, match="heartbeat must be at most 1 s"):
        BarrierConfig(job="j", heartbeat=4.0)
    assert BarrierConfig(job="j", heartbeat=1.0).heartbeat == 1.0


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


UNUSABLE_TF_CONFIGS = [
    "{",
    "[]",
    '"worker"',
    '{"task": {"type": "worker"}}x',
    '{"cluster": {}, "task": {"type": "worker", "index": "one"}}',
    '{"cluster": {}, "task": {"type": "worker", "index": "1.5"}}',
    '{"cluster": {}, "task": {"type": "worker", "index": null}}',
    '{"cluster": {}, "task": {"type": "worker", "index": -2}}',
    '{"cluster": [], "task": {"type": "worker", "index": 0}}',
    '{"cluster": {"chief": "h:0"}, "task": {"type": "worker", "index": 0}}',
]
"""Texts that give no usable role: not a JSON object, an index that is not a whole
number from 0 up (TensorFlow's resolver calls ``int()`` on it), or a cluster whose
chief job TensorFlow's ``ClusterSpec`` refuses."""


@pytest.mark.parametrize("text", UNUSABLE_TF_CONFIGS)
def test_an_unusable_tf_config_is_an_error_when_the_role_comes_from_it(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({**BASE, "TF_CONFIG": text})
    assert info.value.variable == "TF_CONFIG"


@pytest.mark.parametrize("text", UNUSABLE_TF_CONFIGS)
def test_a_worker_without_a_task_id_needs_a_usable_tf_config(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({**BASE, "TF_CONFIG": text, "STEPBARRIER_ROLE": "worker"})
    assert info.value.variable == "TF_CONFIG"


@pytest.mark.parametrize(
    "text",
    [
        *UNUSABLE_TF_CONFIGS,
        '{"cluster": {"worker": ["h:1"]}, "task": {"type": "client", "index": 0}}',
        '{"cluster": {"worker": ["h:1"]}}',
    ],
)
def test_explicit_role_and_task_id_win_over_any_tf_config(text: str) -> None:
    worker = BarrierConfig.from_env(
        {**BASE, "TF_CONFIG": text, "STEPBARRIER_ROLE": "worker", "STEPBARRIER_TASK_ID": "3"}
    )
    assert (worker.role, worker.task_id) == ("worker", 3)
    chief = BarrierConfig.from_env({**BASE, "TF_CONFIG": text, "STEPBARRIER_ROLE": "chief"})
    assert (chief.role, chief.task_id) == ("chief", 0)


@pytest.mark.parametrize(
    ("task", "role", "task_id"),
    [
        ({"type": "worker", "index": "1"}, "worker", 2),  # TensorFlow: int(index)
        ({"type": "worker", "index": " 2 "}, "worker", 3),
        ({"type": "worker"}, "worker", 1),  # no index: 0
        ({"type": "chief", "index": "not used"}, "chief", 0),
        ({"type": "client", "index": 0}, None, None),  # a type TensorFlow does not train with
        ({"type": "ps", "index": "x"}, None, None),  # a ps's index is never needed
        ({"index": 0}, None, None),
        (None, None, None),  # no task at all
    ],
)
def test_tf_config_is_read_as_tensorflows_resolver_reads_it(
    task: dict[str, object] | None, role: str | None, task_id: int | None
) -> None:
    spec: dict[str, object] = {"cluster": {"chief": ["h:0"], "worker": ["h:1", "h:2", "h:3"]}}
    if task is not None:
        spec["task"] = task
    cfg = BarrierConfig.from_env({**BASE, "TF_CONFIG": json.dumps(spec)})
    assert (cfg.role, cfg.task_id) == (role, task_id)


@pytest.mark.parametrize("chief_job", ["chief", "master"])
def test_an_empty_chief_job_still_keeps_worker_0_from_being_the_chief(chief_job: str) -> None:
    """As ``multi_worker_util.is_chief``: only a cluster without a chief job has worker 0 lead."""
    spec = {"cluster": {chief_job: [], "worker": ["h:1", "h:2"]}, "task": {"type": "worker"}}
    cfg = BarrierConfig.from_env({**BASE, "TF_CONFIG": json.dumps(spec)})
    assert (cfg.role, cfg.task_id) == ("worker", 0)


def test_a_host_with_no_role_anywhere_is_told_which_variables_to_set() -> None:
    env = {**BASE, "STEPBARRIER_WAIT_UNTIL_STEP": "5"}
    with pytest.raises(ConfigurationError) as info:
        barrier_role_from_env(env)
    assert info.value.variable == "STEPBARRIER_ROLE"
    for name in ("STEPBARRIER_ROLE", "STEPBARRIER_TASK_ID", "TF_CONFIG", "--job_name"):
        assert name in str(info.value)


def test_an_unknown_tf_config_task_type_has_no_role_unless_one_is_set() -> None:
    text = '{"cluster": {"client": ["h:1"]}, "task": {"type": "client", "index": 0}}'
    with pytest.raises(ConfigurationError) as info:
        barrier_role_from_env({"TF_CONFIG": text})
    assert info.value.variable == "TF_CONFIG"
    assert "'client'" in str(info.value) and "STEPBARRIER_ROLE" in str(info.value)
    assert barrier_role_from_env({"TF_CONFIG": text, "STEPBARRIER_ROLE": "worker"}) == "worker"


@pytest.mark.parametrize("kind", ["ps", "evaluator"])
def test_ps_and_evaluator_tasks_have_no_role_and_need_no_other_variable(kind: str) -> None:
    text = json.dumps({"cluster": {"ps": ["h:1"], "worker": ["h:2"]}, "task": {"type": kind}})
    assert barrier_role_from_env({"TF_CONFIG": text}) is None
    assert barrier_role_from_env({"TF_CONFIG": text, "STEPBARRIER_ROLE": "worker"}) == "worker"


@pytest.mark.parametrize(
    ("env", "role"),
    [
        ({"STEPBARRIER_ROLE": "Chief"}, "chief"),
        ({"STEPBARRIER_ROLE": "worker"}, "worker"),
        ({"TF_CONFIG": tf_config("master", 0)}, "chief"),
        ({"TF_CONFIG": tf_config("worker", 1)}, "worker"),
    ],
)
def test_barrier_role_from_env_needs_only_the_role(env: dict[str, str], role: str) -> None:
    assert barrier_role_from_env(env) == role  # no STEPBARRIER_JOB


def test_barrier_role_from_env_refuses_a_bad_role() -> None:
    with pytest.raises(ConfigurationError) as info:
        barrier_role_from_env({"STEPBARRIER_ROLE": "ps"})
    assert info.value.variable == "STEPBARRIER_ROLE"


def test_every_variable_read_is_documented() -> None:
    """docs/configuration.md's table lists every name in ENVIRONMENT_VARIABLES."""
    page = (Path(ROOT) / "docs" / "configuration.md").read_text()
    for name in ENVIRONMENT_VARIABLES:
        assert f"| `{name}` |" in page, f"{name} missing from docs/configuration.md's table"
    documented = re.findall(r"^\| `(STEPBARRIER_\w+)` \|", page, flags=re.MULTILINE)
    assert sorted(documented) == sorted(ENVIRONMENT_VARIABLES)


def test_the_readme_links_to_the_configuration_page() -> None:
    readme = (Path(ROOT) / "README.md").read_text()
    assert "](docs/configuration.md)" in readme


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


def test_run_id_done_ttl_and_progress_timeout_come_from_the_environment() -> None:
    config = BarrierConfig.from_env(
        {
            "STEPBARRIER_JOB": "j",
            "STEPBARRIER_RUN_ID": "run-2026.11_30",
            "STEPBARRIER_DONE_TTL": "60",
            "STEPBARRIER_PROGRESS_TIMEOUT": "900",
        }
    )
    assert (config.run_id, config.done_ttl, config.progress_timeout) == (
        "run-2026.11_30",
        60,
        900.0,
    )
    defaults = BarrierConfig.from_env({"STEPBARRIER_JOB": "j"})
    assert (defaults.run_id, defaults.done_ttl, defaults.progress_timeout) == (None, 3600, None)


def test_a_finished_job_outlives_the_stall_timeout_whatever_the_done_ttl() -> None:
    assert finished_ttl(BarrierConfig(job="j")) == 3600
    assert finished_ttl(BarrierConfig(job="j", done_ttl=60, stall_timeout=7200.5)) == 7261


@pytest.mark.parametrize("run_id", ["a b", "x" * 65, "{tag}", "r*", "ü"])
def test_a_bad_run_id_names_the_variable(run_id: str) -> None:
    with pytest.raises(ConfigurationError, match="STEPBARRIER_RUN_ID must be 1 to 64"):
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", "STEPBARRIER_RUN_ID": run_id})


@pytest.mark.parametrize("value", ["0", "-5", "1e3", "soon"])
def test_a_bad_done_ttl_names_the_variable(value: str) -> None:
    with pytest.raises(ConfigurationError, match="STEPBARRIER_DONE_TTL"):
        BarrierConfig.from_env({"STEPBARRIER_JOB": "j", "STEPBARRIER_DONE_TTL": value})


def test_repr_never_shows_a_password() -> None:
    config = BarrierConfig(
        job="j", redis_url="redis://chief:s3cret@redis:6379/0", redis_password="other-secret"
    )
    shown = repr(config)
    assert "s3cret" not in shown and "other-secret" not in shown
    assert "redis://chief:***@redis:6379/0" in shown and "redis_password='***'" in shown


def test_a_password_with_question_mark_and_at_is_not_read_as_a_query() -> None:
    with pytest.raises(ConfigurationError, match="percent-encode"):
        BarrierConfig(job="j", redis_url="redis://u:@0?@h:99999/0")


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("600", 600.0),
        ("1.5", 1.5),
        ("90s", 90.0),
        ("10m", 600.0),
        ("1h", 3600.0),
        ("2500ms", 2.5),
        ("1e3", 1000.0),
        ("+5", 5.0),  # what float() read before
    ],
)
def test_duration_variables_take_what_the_options_take(text: str, seconds: float) -> None:
    cfg = BarrierConfig.from_env({**BASE, "STEPBARRIER_STALL_TIMEOUT": text})
    assert cfg.stall_timeout == seconds


@pytest.mark.parametrize("text", ["nan", "inf", "-1", "0", "10 parsecs", "m", "1e999"])
def test_a_duration_variable_that_is_none_names_what_is_expected(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env({**BASE, "STEPBARRIER_STALL_TIMEOUT": text})
    assert info.value.variable == "STEPBARRIER_STALL_TIMEOUT"
    assert "e.g. 600" in str(info.value) and "10m" in str(info.value)


@pytest.mark.parametrize(("text", "every"), [("0", 0), ("25", 25), (" 1 ", 1)])
def test_report_every_comes_from_the_environment(text: str, every: int) -> None:
    assert BarrierConfig.from_env(env(report_every=text)).report_every == every


def test_report_every_unset_leaves_the_hooks_default() -> None:
    assert BarrierConfig.from_env(BASE).report_every is None
    assert BarrierConfig(job="j").report_every is None


@pytest.mark.parametrize("text", ["-1", "ten", "1.5", "1000001"])
def test_a_bad_report_every_is_refused_naming_the_variable(text: str) -> None:
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(report_every=text))
    assert info.value.variable == "STEPBARRIER_REPORT_EVERY"
    assert "STEPBARRIER_REPORT_EVERY must be an integer from 0 to 1000000" in str(info.value)


@pytest.mark.parametrize("value", [-1, True, 2.0, "3"])
def test_a_bad_report_every_in_code_is_refused(value: object) -> None:
    with pytest.raises(ConfigurationError, match="report_every must be an integer"):
        BarrierConfig(job="j", report_every=value)  # type: ignore[arg-type]


@pytest.mark.parametrize("name", ["{x}", "{0.__class__}", "}{"])
def test_a_url_with_braces_is_refused_by_name_not_by_a_format_error(
    name: str, tmp_path: Path
) -> None:
    """The relations' messages are formatted with the fields' names; a URL's own text
    (a ``client_name`` may hold braces) is quoted as itself."""
    ca = tmp_path / "ca.pem"
    ca.write_text("x")
    url = f"redis://localhost:6379/3?client_name={name}"
    for kwargs in ({"redis_cluster": True}, {"tls_ca_file": str(ca)}):
        with pytest.raises(ConfigurationError) as caught:
            BarrierConfig(job="j", redis_url=url, **kwargs)  # type: ignore[arg-type]
        assert f"client_name={name}" in str(caught.value)
    environ = {
        "STEPBARRIER_JOB": "j",
        "STEPBARRIER_REDIS_URL": url,
        "STEPBARRIER_TLS_CA_FILE": str(ca),
    }
    with pytest.raises(ConfigurationError, match="STEPBARRIER_TLS_CA_FILE is set"):
        BarrierConfig.from_env(environ)


def test_a_jobs_pattern_is_the_one_its_job_matches() -> None:
    cfg = BarrierConfig.from_env(env(jobs_pattern="mnist-*"))
    assert cfg.jobs_pattern == "mnist-*"
    assert BarrierConfig.from_env(BASE).jobs_pattern is None
    with pytest.raises(ConfigurationError) as info:
        BarrierConfig.from_env(env(jobs_pattern="team-a-*"))
    assert str(info.value).startswith(
        "the job 'mnist-42' does not match STEPBARRIER_JOBS_PATTERN 'team-a-*': give the jobs "
        "pattern of the chief's Redis user"
    )
    with pytest.raises(ConfigurationError, match=r"^jobs_pattern must be 1 to 64 characters"):
        BarrierConfig(job="mnist-42", jobs_pattern="mnist-{42}")
