"""How the TensorFlow hooks find the global step, and which tensor fetches it.

``stepbarrier.tf_hooks`` imports this module after checking that TensorFlow
can be imported (and says what is missing if not).
"""

from __future__ import annotations

import logging
from typing import Any

import tensorflow as tf

log = logging.getLogger("stepbarrier.tf_hooks")


def global_step_or_raise(hook_name: str) -> Any:
    """The graph's global step; ``RuntimeError`` (TensorFlow's words) if it has none."""
    global_step = tf.compat.v1.train.get_global_step()
    if global_step is None:
        raise RuntimeError(f"Global step should be created to use {hook_name}.")
    return global_step


def step_tensor(global_step: Any) -> Any:
    """What to fetch for the global step: the tensor TensorFlow's own hooks fetch, if any.

    ``StepCounterHook``, ``SummarySaverHook`` and ``CheckpointSaverHook`` (the
    hooks ``MonitoredTrainingSession`` adds) create, in their ``begin()``, a
    cached read of the step (``training_util._get_or_create_global_step_read``)
    and fetch it with every run. Fetching the same tensor, a run reads the step
    once for all. Without those hooks that tensor does not exist, and the
    variable is fetched: alone, it is the cheaper read (the cached one checks
    that the variable is initialised on the parameter server first). Looked up
    once every hook's ``begin()`` has run, so the order of the hooks does not
    matter; a TensorFlow without that cache gets the variable.
    """
    try:
        from tensorflow.python.training import training_util

        cached = global_step.graph.get_collection(training_util.GLOBAL_STEP_READ_KEY)
    except Exception as exc:  # not in this TensorFlow: the variable does the same job
        log.debug("no cached global-step read (%s); fetching the variable", exc)
        return global_step
    return cached[0] if cached else global_step
