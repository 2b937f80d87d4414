"""target_step: the integer step a TensorFlow-style ``wait_until_step`` stands for.

Its agreement with TensorFlow's own hook is checked against the real hook in
tests/tf/test_float_wait_until_step.py.
"""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from stepbarrier import ConfigurationError
from stepbarrier._config.schedule import target_step
from stepbarrier._protocol.wire import MAX_STEP


@pytest.mark.parametrize("value", [0, 1, 13, -3, MAX_STEP])
def test_an_integer_is_its_own_step(value: int) -> None:
    assert target_step(value) == value


@pytest.mark.parametrize(
    ("value", "step"),
    [
        (20 * math.log(2), 14),  # TensorFlow's documented ramp without the int()
        (20 * math.log(3), 22),
        (13.0, 13),
        (0.5, 1),
        (1e-300, 1),
        (2.0**51 + 0.5, 2**51 + 1),
        (float(MAX_STEP), MAX_STEP),
        (Fraction(7, 2), 4),
    ],
)
def test_a_real_number_means_the_first_integer_step_at_or_above_it(value: float, step: int) -> None:
    assert target_step(value) == step


@pytest.mark.parametrize("value", [0.0, -0.0, -0.5, -7.25, -math.inf])
def test_zero_or_less_means_no_wait(value: float) -> None:
    assert target_step(value) == 0


@pytest.mark.parametrize("value", [math.nan, math.inf, 1e300, MAX_STEP + 1])
def test_a_step_that_never_comes_is_refused_with_a_clear_error(value: float) -> None:
    with pytest.raises(ConfigurationError) as info:
        target_step(value, name="wait_until_step")
    assert info.value.variable == "wait_until_step"
    assert "wait_until_step" in str(info.value)


@pytest.mark.parametrize("value", [True, False, "13", None, [13]])
def test_anything_but_a_number_is_a_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="wait_until_step must be a number of steps"):
        target_step(value)
