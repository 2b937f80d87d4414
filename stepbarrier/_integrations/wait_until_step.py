"""The integer step a ``wait_until_step`` stands for, as TensorFlow's hook reads it.

TensorFlow's ``GlobalStepWaiterHook`` takes any number and releases a worker
once ``global_step >= wait_until_step``; global steps are integers, so a float
*t* such as ``20 * math.log(2)`` (13.86) means step ``math.ceil(t)`` (14).
``target_step`` gives that step, so that the hook and the Keras callback can
take what TensorFlow's hook takes and still wait for an exact integer.
"""

from __future__ import annotations

import math
import numbers

from stepbarrier._protocol.wire import MAX_STEP, MAX_STEP_TEXT
from stepbarrier.errors import ConfigurationError


def target_step(wait_until_step: object, *, name: str = "wait_until_step") -> int:
    """The first global step at which TensorFlow's hook would release a worker.

    Args:
        wait_until_step: An integer (returned as it is), or any real number
            *t*: the first integer step ``s`` with ``s >= t``, i.e.
            ``math.ceil(t)``; ``t <= 0`` (``-inf`` too) gives 0, no wait.
        name: The argument's name, for error messages.

    Returns:
        The step to wait for; ``<= 0`` means "do not wait".

    Raises:
        TypeError: It is not a real number, or it is a ``bool``.
        ConfigurationError: It is NaN, ``+inf`` or above ``MAX_STEP`` (TensorFlow's
            hook would wait forever).

    Example:
        >>> target_step(20 * math.log(2))
        14
    """
    if isinstance(wait_until_step, bool):
        raise TypeError(f"{name} must be a number of steps, got the bool {wait_until_step}")
    if isinstance(wait_until_step, numbers.Integral):
        step = int(wait_until_step)
    else:
        step = _ceil(wait_until_step, name)
    if step > MAX_STEP:
        raise ConfigurationError(
            f"{name} must be at most {MAX_STEP} ({MAX_STEP_TEXT}), got a larger number",
            variable=name,
        )
    return step


def _ceil(value: object, name: str) -> int:
    if not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number of steps, got {type(value).__name__}")
    if math.isnan(value):
        raise ConfigurationError(
            f"{name} must be a number of steps, got NaN (no step is >= NaN: TensorFlow's "
            "hook would wait forever)",
            variable=name,
        )
    if value <= 0:  # TensorFlow's hook starts at once, -inf included
        return 0
    if math.isinf(value):
        raise ConfigurationError(
            f"{name} must be finite, got {value!r} (TensorFlow's hook would wait forever)",
            variable=name,
        )
    return int(math.ceil(value))  # noqa: RUF046 - a __ceil__ may return any Integral
