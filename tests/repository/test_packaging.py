"""What a user gets from `pip install stepbarrier` and `import stepbarrier`."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import stepbarrier
from tests.conftest import ROOT, subprocess_env

FRONT_ENDS = ("tf_hooks.py", "keras_callbacks.py", "_integrations", "cli")
CORE = sorted(
    path
    for path in Path(ROOT, "stepbarrier").rglob("*.py")
    if path.relative_to(Path(ROOT, "stepbarrier")).parts[0] not in FRONT_ENDS
)
"""Every module but the TensorFlow and Keras front ends and the command line."""


def test_import_needs_neither_tensorflow_nor_a_server() -> None:
    code = (
        "import sys, stepbarrier; "
        "assert 'tensorflow' not in sys.modules and 'keras' not in sys.modules, 'TF imported'; "
        "print(stepbarrier.__version__)"
    )
    env = subprocess_env(STEPBARRIER_REDIS_URL="redis://127.0.0.1:1/0")
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr.decode()
    assert done.stdout.decode().strip() == stepbarrier.__version__


def test_core_modules_import_only_stdlib_redis_and_tenacity() -> None:
    allowed = set(sys.stdlib_module_names) | {"redis", "tenacity", "stepbarrier"}
    assert len(CORE) > 40
    for path in CORE:
        for line in path.read_text().splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from") and not line.startswith(" "):
                top = words[1].split(".")[0]
                assert top in allowed or top == "__future__", f"{path} imports {top}"


def test_public_api() -> None:
    for name in [
        "BarrierConfig",
        "StepPublisher",
        "StepWaiter",
        "read_status",
        "schedule_wait_until_step",
        "StepBarrierError",
        "ConfigurationError",
        "BarrierTimeout",
        "BarrierAborted",
        "RedisUnavailable",
        "JobStatus",
    ]:
        assert name in stepbarrier.__all__ and hasattr(stepbarrier, name)


def build(target: str, into: Path) -> Path:
    """Build the ``wheel`` or ``sdist`` with hatchling (no network) and return it."""
    done = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", target, "-d", str(into)],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    (artefact,) = into.iterdir()
    return artefact


def test_the_wheel_ships_py_typed_and_the_cli_package(tmp_path: Path) -> None:
    names = zipfile.ZipFile(build("wheel", tmp_path)).namelist()
    assert "stepbarrier/py.typed" in names
    assert "stepbarrier/_worker/waiter.py" in names
    assert "stepbarrier/cli/__init__.py" in names
    # the Functions library's Lua is package data, read at import
    assert "stepbarrier/_protocol/lua/publish_step.lua" in names
    assert "stepbarrier/_protocol/lua/helpers.lua" in names
    assert not [name for name in names if name.startswith(("tests/", "docs/", "bench/"))]


def test_the_sdist_holds_what_a_packager_expects(tmp_path: Path) -> None:
    """Sources, tests, docs, examples, deployment files, licence and changelog;
    no caches or local state."""
    sdist = build("sdist", tmp_path)
    assert sdist.name == f"stepbarrier-{stepbarrier.__version__}.tar.gz"
    top = f"stepbarrier-{stepbarrier.__version__}/"
    with tarfile.open(sdist) as archive:
        names = {name.removeprefix(top) for name in archive.getnames()}
    for expected in [
        "pyproject.toml",
        "PKG-INFO",
        "README.md",
        "CHANGELOG.md",
        "LICENSE",
        "Makefile",
        "mkdocs.yml",
        "docs/index.md",
        "stepbarrier/py.typed",
        "stepbarrier/__init__.py",
        "tests/conftest.py",
        "examples/plain_loop.py",
        "ops/redis/users.acl",
        "docker-compose.yml",
        "bench/__main__.py",
    ]:
        assert expected in names, f"{expected} missing from the sdist"
    unwanted = [n for n in names if "__pycache__" in n or n.startswith((".venv", "site/", "dist/"))]
    assert not unwanted, unwanted


def test_the_version_has_one_source() -> None:
    """pyproject.toml takes the version from stepbarrier/__init__.py; the
    installed metadata agrees with it."""
    # tomllib is 3.11+ and the package supports 3.10: read the lines we need
    pyproject = Path(ROOT, "pyproject.toml").read_text().splitlines()
    assert not [line for line in pyproject if line.startswith("version")]
    assert 'dynamic = ["version"]' in pyproject
    hatch_version = pyproject.index("[tool.hatch.version]")
    assert pyproject[hatch_version + 1] == 'path = "stepbarrier/__init__.py"'
    assert importlib.metadata.version("stepbarrier") == stepbarrier.__version__
    changelog = Path(ROOT, "CHANGELOG.md").read_text()
    assert f"## [{stepbarrier.__version__}]" in changelog


def test_make_demo_installs_only_what_the_demo_runs(tmp_path: Path) -> None:
    """`make demo` on a fresh machine: the demo extra, not every extra of `make test`."""
    venv = tmp_path / "venv"
    planned = subprocess.run(
        ["make", "-n", "demo", f"VENV={venv}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert planned.returncode == 0, planned.stderr
    installs = [line for line in planned.stdout.splitlines() if "pip install" in line]
    assert any('-e ".[demo]"' in line for line in installs), installs
    assert not any("jax" in line or "docs" in line for line in installs), installs
    extras = Path(ROOT, "pyproject.toml").read_text().split("[project.optional-dependencies]")[1]
    demo = next(line for line in extras.splitlines() if line.startswith("demo = "))
    assert "tensorflow" in demo and "fakeredis" in demo
