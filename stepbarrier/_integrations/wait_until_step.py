"""The integer step a ``wait_until_step`` stands for, as TensorFlow's hook reads it
(it takes any number and releases a worker once ``global_step >= wait_until_step``)."""

from __future__ import annotations

import math
import numbers

from stepbarrier._protocol.wire import MAX_STEP, MAX_STEP_TEXT
from stepbarrier.errors import ConfigurationError


def target_step(wait_until_step: object, *, name: str = "wait_until_step") -> int:
    """The first global step at which TensorFlow's hook would release a worker: a real
    number *t* gives ``math.ceil(t)`` (``20 * math.log(2)``: 14), ``t <= 0`` (``-inf``
    too) 0, "do not wait". ``name`` is the argument's, for error messages.

    Raises:
        TypeError: It is not a real number, or it is a ``bool``.
        ConfigurationError: It is NaN, ``+inf`` or above ``MAX_STEP``.
    """
    if isinstance(wait_until_step, bool):
        raise TypeError(f"{name} must be a number of steps, got the bool {wait_until_step}")
    if isinstance(wait_until_step, numbers.Integral):
        step = int(wait_until_step)
    elif not isinstance(wait_until_step, numbers.Real):
        raise TypeError(f"{name} must be a number of steps, got {type(wait_until_step).__name__}")
    elif math.isnan(wait_until_step):
        raise ConfigurationError(
            f"{name} must be a number of steps, got NaN (no step is >= NaN: TensorFlow's "
            "hook would wait forever)",
            variable=name,
        )
    elif wait_until_step <= 0:  # TensorFlow's hook starts at once, -inf included
        step = 0
    elif math.isinf(wait_until_step):
        raise ConfigurationError(
            f"{name} must be finite, got {wait_until_step!r} (TensorFlow's hook would wait "
            "forever)",
            variable=name,
        )
    else:
        step = int(math.ceil(wait_until_step))  # noqa: RUF046 - a __ceil__ may return any Integral
    if step > MAX_STEP:
        raise ConfigurationError(
            f"{name} must be at most {MAX_STEP} ({MAX_STEP_TEXT}), got a larger number",
            variable=name,
        )
    return step
