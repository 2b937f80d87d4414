"""What a user gets from `pip install stepbarrier` and `import stepbarrier`."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import stepbarrier
from tests.conftest import ROOT, subprocess_env

CORE = [
    "config",
    "environment",
    "tf_config",
    "connection",
    "errors",
    "keys",
    "protocol",
    "publisher",
    "registrations",
    "waiter_link",
    "reset",
    "schedule",
    "scripts",
    "status",
    "waiter",
    "wait_rules",
    "aio",
    "aio_batch",
    "aio_connection",
    "aio_subscription",
    "waiter_summary",
]


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
    for name in CORE:
        source = Path(ROOT, "stepbarrier", f"{name}.py").read_text()
        for line in source.splitlines():
            words = line.split()
            if len(words) >= 2 and words[0] in ("import", "from") and not line.startswith(" "):
                top = words[1].split(".")[0]
                assert top in allowed or top == "__future__", f"{name}.py imports {top}"


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


def test_the_wheel_ships_py_typed(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "hatchling", "build", "-t", "wheel", "-d", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr.decode()
    (wheel,) = tmp_path.glob("*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert "stepbarrier/py.typed" in names
    assert "stepbarrier/waiter.py" in names
