"""The ImportError of ``tf_hooks`` and ``keras_callbacks`` names what is really missing.

Each case runs in its own process: a missing module is simulated with
``sys.modules[name] = None``, and a Keras backend is fixed per process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.conftest import subprocess_env

pytestmark = pytest.mark.tensorflow

PIP_HINT = "pip install 'stepbarrier[tensorflow]'"


def import_error(module: str, missing: str, **env: str) -> str:
    """The message of the ImportError that importing ``module`` raises without ``missing``."""
    code = (
        f"import sys; sys.modules[{missing!r}] = None\n"
        "import stepbarrier\n"
        "try:\n"
        f"    import {module}\n"
        "except ImportError as exc:\n"
        "    print('ImportError:', exc)\n"
        "else:\n"
        "    print('imported')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        env=subprocess_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ImportError:"), done.stdout
    return done.stdout


@pytest.mark.parametrize(
    ("module", "missing"),
    [("stepbarrier.tf_hooks", "tensorflow"), ("stepbarrier.keras_callbacks", "keras")],
)
def test_a_missing_framework_names_the_extra_and_the_original_error(
    module: str, missing: str
) -> None:
    message = import_error(module, missing)
    assert PIP_HINT in message
    assert f"import of {missing} halted" in message


def test_a_missing_keras_backend_is_named_not_keras() -> None:
    message = import_error("stepbarrier.keras_callbacks", "jax", KERAS_BACKEND="jax")
    assert "import of jax halted" in message
    assert "KERAS_BACKEND" in message
    assert PIP_HINT not in message


def test_a_missing_tensorflow_dependency_is_named_not_tensorflow() -> None:
    message = import_error("stepbarrier.tf_hooks", "numpy")
    assert "import of numpy halted" in message
    assert PIP_HINT not in message
