"""The step a worker waits for: ramps that spread workers' start, and a ``wait_until_step``.

TensorFlow documents ``wait_until_step = int(K * log(task_id + 1))`` for its
``GlobalStepWaiterHook`` (task 0 being the chief); a schedule spec names such
a ramp so that every host can compute its own step from its task id.
"""

from __future__ import annotations

import math
import numbers
import re

from stepbarrier._config.checks import TASK_ID, refused
from stepbarrier._protocol.wire import MAX_STEP, MAX_STEP_TEXT
from stepbarrier.errors import ConfigurationError

_SPEC = re.compile(r"^\s*(log|linear)\s*:\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*$")


def validate_schedule(spec: str, *, variable: str = "schedule") -> str:
    """``spec`` (``"log:K"``, ``"linear:K"`` or ``"none"``, K a non-negative number),
    normalised, or ``ConfigurationError`` naming ``variable``."""
    text = spec.strip().lower()
    if text == "none":
        return "none"
    match = _SPEC.match(text)
    if match is None:
        raise ConfigurationError(
            f"{variable} must be 'log:K', 'linear:K' or 'none' with K a "
            f"non-negative number, got {spec!r}",
            variable=variable,
        )
    factor = float(match.group(2))
    if not math.isfinite(factor) or factor > 1e12:
        raise refused(variable, f"K must be a finite number at most 1e12, got {spec!r}")
    return f"{match.group(1)}:{match.group(2)}"


def schedule_wait_until_step(task_id: int, spec: str) -> int:
    """The step task ``task_id`` (the chief being 0) waits for under schedule ``spec``,
    by docs/configuration.md#schedules' table (0: "do not wait").

    Raises:
        ConfigurationError: The spec or the task id is invalid.

    Examples:
        >>> schedule_wait_until_step(3, "log:10")
        13
    """
    normalised = validate_schedule(spec)
    TASK_ID.check(task_id, "task_id")
    if normalised == "none":
        return 0
    kind, _, factor_text = normalised.partition(":")
    factor = float(factor_text)
    value = factor * math.log(task_id + 1) if kind == "log" else factor * task_id
    if value >= MAX_STEP:
        raise ConfigurationError(
            f"schedule {spec!r} gives step {value:.0f} for task {task_id}, "
            f"more than the largest supported step {MAX_STEP}",
            variable="schedule",
        )
    return int(value)


def target_step(wait_until_step: object, *, name: str = "wait_until_step") -> int:
    """The first global step at which TensorFlow's hook would release a worker: a real
    number *t* gives ``math.ceil(t)`` (``20 * math.log(2)``: 14), ``t <= 0`` (``-inf``
    too) 0, "do not wait". ``name`` is the argument's, for error messages.

    Raises:
        TypeError: It is not a real number, or it is a ``bool``.
        ConfigurationError: It is NaN, ``+inf`` or above ``MAX_STEP``.
    """

    def refuse(why: str) -> ConfigurationError:
        return ConfigurationError(f"{name} must be {why}", variable=name)

    if isinstance(wait_until_step, bool):
        raise TypeError(f"{name} must be a number of steps, got the bool {wait_until_step}")
    if isinstance(wait_until_step, numbers.Integral):
        step = int(wait_until_step)
    elif not isinstance(wait_until_step, numbers.Real):
        raise TypeError(f"{name} must be a number of steps, got {type(wait_until_step).__name__}")
    elif math.isnan(wait_until_step):
        raise refuse(
            "a number of steps, got NaN (no step is >= NaN: TensorFlow's hook would wait forever)"
        )
    elif wait_until_step <= 0:  # TensorFlow's hook starts at once, -inf included
        step = 0
    elif math.isinf(wait_until_step):
        raise refuse(f"finite, got {wait_until_step!r} (TensorFlow's hook would wait forever)")
    else:
        step = int(math.ceil(wait_until_step))  # noqa: RUF046 - a __ceil__ may return any Integral
    if step > MAX_STEP:
        raise refuse(f"at most {MAX_STEP} ({MAX_STEP_TEXT}), got a larger number")
    return step
