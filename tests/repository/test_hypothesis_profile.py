"""Property tests are reproducible in CI and keep exploring on a developer's machine."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import subprocess_env

SHOW_PROFILE = (
    "import tests.conftest as c; from hypothesis import settings; "
    "print(c.HYPOTHESIS_PROFILE, settings.default.derandomize, settings.default.database is None)"
)


def profile_under(ci: str | None) -> list[str]:
    env = subprocess_env()
    env.pop("CI", None)
    if ci is not None:
        env["CI"] = ci
    done = subprocess.run(
        [sys.executable, "-c", SHOW_PROFILE], env=env, capture_output=True, text=True, check=True
    )
    return done.stdout.split()


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_ci_draws_the_same_examples_on_every_run(ci: str) -> None:
    assert profile_under(ci) == ["ci", "True", "True"]


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_developer_run_keeps_exploring(ci: str | None) -> None:
    assert profile_under(ci) == ["dev", "False", "False"]
