"""The Keras callbacks on every Keras backend installed here, one process per backend.

TensorFlow and JAX train; the NumPy backend cannot ``fit`` at all (Keras 3
raises ``NotImplementedError``), so it is only checked that the callbacks
import there and that it still cannot train. PyTorch is not installed.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import subprocess_env
from tests.redis_harness import RedisServer

pytestmark = pytest.mark.tensorflow

SCRIPT = Path(__file__).with_name("keras_on_backend.py")


def run(backend: str, code: list[str], **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *code],
        env=subprocess_env(KERAS_BACKEND=backend, **env),
        capture_output=True,
        text=True,
        timeout=240,
    )


@pytest.mark.parametrize("backend", ["tensorflow", "jax"])
def test_the_callbacks_count_optimizer_updates_on_each_training_backend(
    backend: str, redis_server: RedisServer, job: str
) -> None:
    done = run(
        backend,
        [str(SCRIPT)],
        STEPBARRIER_JOB=job,
        STEPBARRIER_REDIS_URL=redis_server.url,
        STEPBARRIER_TIMEOUT="60",
        STEPBARRIER_RUN_ID=f"run-{backend}",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["backend"] == backend
    # 8 batches, 2 per execution: 4 calls; 2 batches per optimizer update: 4 steps
    assert result["batches"] == [1, 3, 5, 7]
    assert result["steps"] == [1, 2, 3, 4]
    assert result["status_step"] == 4
    assert result["released_at_step"] == 4  # it waited for 3.5, i.e. step 4


def test_the_numpy_backend_imports_the_callbacks_but_cannot_train() -> None:
    code = (
        "import keras, numpy as np\n"
        "from stepbarrier.keras_callbacks import StepWaiterCallback\n"
        "model = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])\n"
        "model.compile(optimizer='sgd', loss='mse')\n"
        "x = np.zeros((4, 2), dtype='float32')\n"
        "try:\n"
        "    model.fit(x, x[:, :1], verbose=0, callbacks=[StepWaiterCallback(0)])\n"
        "except NotImplementedError as exc:\n"
        "    print('cannot train:', keras.backend.backend(), exc)\n"
    )
    done = run("numpy", ["-c", code])
    assert done.returncode == 0, done.stderr[-3000:]
    # When Keras learns to fit on NumPy, this fails: then add "numpy" to the test above.
    assert "cannot train: numpy" in done.stdout
    print(done.stdout.strip())
