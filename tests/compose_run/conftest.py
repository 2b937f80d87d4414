"""The compose files run for real (`make test-compose` only).

The base images are LOCAL STAND-INS where no registry can be reached:
``python:3.11-slim`` and ``redis:7.2`` are built by ops/compose-standins/build.sh
from ``debootstrap --variant=minbase bookworm`` (Debian's Python 3.11 in a venv
first on PATH; Debian's redis-server 7.0 behind an entrypoint like the official
one), labelled ``org.stepbarrier.compose-standin``. They are not the official
images; the report header and summary say which ones a run used.

Collected only with STEPBARRIER_COMPOSE_RUN=1 (tests/compose_run/run.sh sets
it): `make test` and a bare `pytest` skip this directory, which needs a Docker
engine, root or the docker group, and several minutes.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.compose_run.harness import BASE_IMAGES, COMPOSE_FILE, STANDIN_LABEL, Project

ENABLED = os.environ.get("STEPBARRIER_COMPOSE_RUN") == "1"
collect_ignore_glob = [] if ENABLED else ["test_*.py"]


def base_images() -> list[str]:
    """One line per base image: a local stand-in (its recipe), or what else it is."""
    lines = []
    for image in BASE_IMAGES:
        result = subprocess.run(
            ["docker", "image", "inspect", "--format",
             f'{{{{ index .Config.Labels "{STANDIN_LABEL}" }}}}', image],
            capture_output=True, text=True, check=False, timeout=30,
        )  # fmt: skip
        label = result.stdout.strip().replace("<no value>", "")
        if result.returncode != 0:
            lines.append(f"{image}: missing")
        elif label:
            lines.append(
                f"{image}: a LOCAL STAND-IN built from debootstrap (Debian bookworm), "
                f"not the official image (recipe {label}, ops/compose-standins/)"
            )
        else:
            lines.append(f"{image}: not a stand-in (no {STANDIN_LABEL} label): used as it is")
    return lines


TIME_LIMIT = 600
"""Seconds per test here (the project's default is 300): a job in containers
takes 1-2 minutes, and a first `up --build` after a change under stepbarrier/
reinstalls TensorFlow in the image (tests/compose_run/run.sh builds the images
before the tests, but a test's own `--build` still rebuilds what changed since)."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # a conftest's hook sees every item of the session: only this directory's
    here = Path(__file__).parent
    for item in items:
        if item.path.is_relative_to(here) and item.get_closest_marker("timeout") is None:
            item.add_marker(pytest.mark.timeout(TIME_LIMIT))


def pytest_report_header(config: pytest.Config) -> list[str]:
    if not ENABLED:
        return []
    return ["compose runs: base images", *(f"  {line}" for line in base_images())]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if not ENABLED:
        return
    terminalreporter.section("base images of the compose runs")
    for line in base_images():
        terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def built() -> None:
    """The project's images, built once from ops/Dockerfile and ops/Dockerfile.exporter
    (the layer cache makes it quick when nothing changed)."""
    Project([COMPOSE_FILE]).compose("build", timeout=900)


@pytest.fixture
def cleanup() -> Iterator[list[Project]]:
    """Projects to take down (containers, networks, volumes) after the test."""
    projects: list[Project] = []
    yield projects
    for project in projects:
        project.down()
