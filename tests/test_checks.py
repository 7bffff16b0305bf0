"""The shared argument checks: what they let through and how their errors read."""

import numpy as np
import pytest

from minipos import sinusoidal, t5
from minipos._checks import as_float_array, as_positions, check_bool


def test_positions_beyond_int64_are_refused_not_wrapped():
    # 1e19 does not fit in int64: a silent cast would wrap it to a negative number.
    with pytest.raises(ValueError, match="relative_position"):
        t5.relative_position_bucket(np.array([1e19]))
    with pytest.raises(ValueError, match="positions"):
        sinusoidal.sinusoidal_table(np.array([1e20]), 2)
    with pytest.raises(ValueError, match="positions"):
        as_positions(np.array([2 ** 63], dtype=np.uint64))


def test_positions_accept_exact_integer_floats():
    np.testing.assert_array_equal(as_positions(np.array([0.0, 3.0])), [0, 3])
    with pytest.raises(ValueError, match="integers"):
        as_positions(np.array([0.5]))


def test_bool_arrays_are_not_numbers_and_strings_are_not_bools():
    with pytest.raises(TypeError, match="x must be a real numeric array"):
        as_float_array(np.array([True, False]), "x")
    with pytest.raises(TypeError, match="causal must be True or False"):
        check_bool("no", "causal")
    assert check_bool(np.bool_(True), "causal") is True
