"""Run the Keras callbacks on the backend that ``KERAS_BACKEND`` names; print JSON.

A backend is fixed per process, so test_keras_backends.py runs this script once
per backend. The chief's ``fit`` accumulates gradients over 2 batches and runs
2 batches per execution; then a worker's ``fit`` waits for a float step.
Reads ``STEPBARRIER_JOB`` and ``STEPBARRIER_REDIS_URL``.
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

from stepbarrier import BarrierConfig, read_status
from stepbarrier.keras_callbacks import StepPublisherCallback, StepWaiterCallback, _iterations

BATCHES = 8
ACCUMULATE = 2


class Published(keras.callbacks.Callback):  # type: ignore[misc]
    """Notes the step the chief's publisher was last handed after each call."""

    def __init__(self, chief: StepPublisherCallback) -> None:
        super().__init__()
        self.chief = chief
        self.batches: list[int] = []
        self.steps: list[int] = []

    def on_train_batch_end(self, batch: int, logs: object = None) -> None:
        self.batches.append(batch)
        self.steps.append(_iterations(self.chief.model))


def model(accumulate: int | None = None) -> keras.Model:
    net = keras.Sequential([keras.Input(shape=(2,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.01, gradient_accumulation_steps=accumulate)
    net.compile(optimizer=optimizer, loss="mse", steps_per_execution=2)
    return net


def main() -> int:
    config = BarrierConfig.from_env()
    x = np.zeros((BATCHES * 4, 2), dtype="float32")
    # the chief finishes the job at its last step: the worker below starts after
    # the chief's fit has ended, and a finished state of its own run releases it
    # (without a run id or a finish, a stored step with no live chief releases nobody)
    chief = StepPublisherCallback(config, last_step=4)
    published = Published(chief)
    model(ACCUMULATE).fit(
        x, x[:, :1], batch_size=4, epochs=1, verbose=0, callbacks=[chief, published]
    )
    status = read_status(config)
    waiter = StepWaiterCallback(3.5, config)  # step 4: the chief's last
    model().fit(x[:4], x[:4, :1], batch_size=4, epochs=1, verbose=0, callbacks=[waiter])
    result = {
        "backend": keras.backend.backend(),
        "batches": published.batches,
        "steps": published.steps,
        "status_step": status.step,
        "released_at_step": waiter.released_at_step,
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
