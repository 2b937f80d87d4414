"""Fuzzed configuration: any environment gives a valid config or a ConfigurationError
naming a variable, nothing else, and never echoes a password."""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from stepbarrier import BarrierConfig, ConfigurationError
from stepbarrier._config.settings import ENVIRONMENT_VARIABLES

NAMES = [*ENVIRONMENT_VARIABLES, "TF_CONFIG"]

nasty_text = st.one_of(
    st.text(max_size=40),
    st.sampled_from(
        [
            "",
            " ",
            "-1",
            "0",
            "1e308",
            "nan",
            "inf",
            "-inf",
            "1" * 40,
            "chief",
            "worker",
            "ps",
            "proceed",
            "raise",
            "log:10",
            "linear:3",
            "none",
            "redis://h:1/0",
            "rediss://h:1/0",
            "unix:///tmp/r.sock",
            "a b",
            "{job}",
            "job*",
            "h:1,h:2",
            "\x00",
            "\udcff",
            "x" * 300,
            "/etc/passwd",
            "/nonexistent/file",
        ]
    ),
    st.integers(-(10**30), 10**30).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)

tf_configs = st.one_of(
    nasty_text,
    st.recursive(
        st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=8),
        lambda inner: (
            st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
        ),
        max_leaves=10,
    ).map(json.dumps),
    st.builds(
        lambda kind, index, cluster: json.dumps(
            {"cluster": cluster, "task": {"type": kind, "index": index}}
        ),
        st.sampled_from(["chief", "master", "worker", "ps", "evaluator", "gpu", ""]),
        st.one_of(st.integers(-3, 10**7), st.text(max_size=3), st.none()),
        st.dictionaries(
            st.sampled_from(["chief", "worker", "ps"]), st.lists(st.text(max_size=5), max_size=3)
        ),
    ),
)


DISTINCTIVE_PASSWORD = re.compile(r"PW-[0-9a-f]{32}")
"""The passwords ``environments`` draws to detect leaks: unlikely in any message."""


@st.composite
def environments(draw: st.DrawFn) -> dict[str, str]:
    env: dict[str, str] = {}
    if draw(st.booleans()):
        env["STEPBARRIER_JOB"] = draw(
            st.one_of(nasty_text, st.from_regex(r"[A-Za-z0-9._-]{1,64}", fullmatch=True))
        )
    for name in draw(st.lists(st.sampled_from(NAMES), max_size=6, unique=True)):
        env[name] = draw(tf_configs if name == "TF_CONFIG" else nasty_text)
    if draw(st.booleans()):  # a distinctive secret, so that finding it in a message means a leak
        env["STEPBARRIER_REDIS_PASSWORD"] = f"PW-{draw(st.uuids()).hex}"
    return env


def check(env: dict[str, str]) -> None:
    safe_env = {k: v.encode("utf-8", "replace").decode("utf-8") for k, v in env.items()}
    try:
        config = BarrierConfig.from_env(safe_env)
    except ConfigurationError as error:
        assert error.variable in NAMES, error.variable
        assert error.variable in str(error)
        assert "\n" not in str(error)
        password = safe_env.get("STEPBARRIER_REDIS_PASSWORD", "")
        if DISTINCTIVE_PASSWORD.fullmatch(password):  # a short one may be there by chance
            assert password not in str(error)
        return
    assert isinstance(config, BarrierConfig)
    assert config.job == safe_env["STEPBARRIER_JOB"].strip()


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(environments())
def test_any_environment_is_a_config_or_a_clear_error(env: dict[str, str]) -> None:
    check(env)


@settings(max_examples=200, deadline=None)
@given(tf_configs)
def test_any_tf_config(text: str) -> None:
    check({"STEPBARRIER_JOB": "j", "TF_CONFIG": text})


def message(env: dict[str, str]) -> str:
    try:
        BarrierConfig.from_env(env)
    except ConfigurationError as error:
        return str(error)
    return ""


def _rotate(group: str) -> dict[int, str]:
    return {ord(c): group[(i + 1) % len(group)] for i, c in enumerate(group)}


# A password's twin: each ASCII letter and digit swapped for another of the same
# kind (hex digits stay hex digits, case stays case); every other character kept.
# A twin looks the same to any URL parser, so a message that differs between a
# password and its twin shows some of the password's characters.
TWIN = str.maketrans(
    {
        **_rotate("abcdef"),
        **_rotate("ghijklmnopqrstuvwxyz"),
        **_rotate("ABCDEF"),
        **_rotate("GHIJKLMNOPQRSTUVWXYZ"),
        **_rotate("0123456789"),
    }
)

passwords = st.text(
    alphabet=st.one_of(
        st.characters(),
        st.sampled_from("abcdefxyzABCXYZ0123456789"),
        st.sampled_from("#?/@:%[]!$&'()*+,;= \t"),
    ),
    min_size=1,
    max_size=30,
).filter(lambda s: s.strip() != "" and "\x00" not in s)

PASSWORD_SETTINGS: list[Callable[[str], dict[str, str]]] = [
    lambda pw: {
        "STEPBARRIER_JOB": "j",
        "STEPBARRIER_REDIS_PASSWORD": pw,
        "STEPBARRIER_TIMEOUT": "x",
    },
    lambda pw: {"STEPBARRIER_JOB": "j", "STEPBARRIER_REDIS_URL": f"http://u:{pw}@h:1/0"},
    lambda pw: {"STEPBARRIER_JOB": "j", "STEPBARRIER_REDIS_URL": f"redis://u:{pw}@h:99999/0"},
]


def test_the_twin_of_a_password_differs_in_every_letter_and_digit() -> None:
    assert "aF9-zZ?".translate(TWIN) == "bA0-gG?"


@settings(max_examples=150, deadline=None)
@given(passwords)
def test_a_password_never_changes_a_message(password: str) -> None:
    """A message is the same for a password and its twin: no letter or digit of it shows.

    Which error a URL gets may depend on its syntax ('?', '#', '/' or '@' in the
    password make it unparsable, and the message rightly names those characters):
    only the password's own letters and digits must never matter.
    """
    for make in PASSWORD_SETTINGS:
        assert message(make(password)) == message(make(password.translate(TWIN)))


@pytest.mark.parametrize("make", PASSWORD_SETTINGS)
def test_a_distinctive_password_is_in_no_message(make: Callable[[str], dict[str, str]]) -> None:
    marker = "MARKER4PASSWORD"
    for password in (marker, f"{marker}?", f"#{marker}", f"{marker}/@"):
        shown = message(make(password))
        assert shown, "expected a configuration error"
        assert marker not in shown


FILE_VARIABLES = [
    "STEPBARRIER_REDIS_PASSWORD_FILE",
    "STEPBARRIER_TLS_CA_FILE",
    "STEPBARRIER_TLS_CERT_FILE",
    "STEPBARRIER_TLS_KEY_FILE",
]


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(FILE_VARIABLES),
    st.one_of(
        st.sampled_from(["a\x00b", "/", "/etc", "/nonexistent", "~", "."]), st.text(max_size=20)
    ),
)
def test_file_variables_with_unusable_paths(name: str, path: str) -> None:
    check({"STEPBARRIER_JOB": "j", "STEPBARRIER_REDIS_URL": "rediss://h:1/0", name: path})
