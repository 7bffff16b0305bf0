"""The golden-vector tooling refuses what would make it lie or hang.

``encode``/``decode`` refuse values that do not round-trip; the vectors API names a bad
argument; ``export`` is atomic; ``check`` cannot be fooled into "ok" by an edited spec, and
reports a malformed, hostile or missing file as a failed check naming it instead of crashing,
hanging or allocating gigabytes.
"""

import json
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from minipos import vectors

# --- encode / decode --------------------------------------------------------------------------


def test_encode_refuses_complex_instead_of_dropping_the_imaginary_part():
    with pytest.raises(TypeError, match="complex"):
        vectors.encode(np.array([1 + 2j]))
    with pytest.raises(TypeError, match="complex"):
        vectors.encode(1j)


def test_encode_refuses_integers_that_int64_cannot_hold():
    with pytest.raises(ValueError, match="int64"):
        vectors.encode(np.array([2**63], dtype=np.uint64))
    big = vectors.encode(np.array([2**63 - 1], dtype=np.uint64))  # the largest that fits is kept exactly
    assert vectors.decode(big)[0] == 2**63 - 1


@pytest.mark.parametrize("value", [np.array(["a"]), np.array([None], dtype=object), np.array([b"x"])])
def test_encode_refuses_non_numeric_arrays(value):
    with pytest.raises(TypeError):
        vectors.encode(value)


def test_encode_refuses_nan():
    with pytest.raises(ValueError, match="finite"):
        vectors.encode(np.array([1.0, np.nan]))


GOOD = {"dtype": "float64", "shape": [2], "data": [1.0, 2.0]}


@pytest.mark.parametrize("bad, error, words", [
    ({**GOOD, "dtype": "object"}, ValueError, "dtype"),
    ({**GOOD, "dtype": "S2000000000"}, ValueError, "dtype"),
    ({**GOOD, "dtype": "complex128"}, ValueError, "dtype"),
    ({**GOOD, "dtype": ["float64"]}, ValueError, "dtype"),
    ({**GOOD, "shape": [-1]}, ValueError, "shape"),
    ({**GOOD, "shape": [2.0]}, TypeError, "shape"),
    ({**GOOD, "shape": [True, 2]}, TypeError, "shape"),
    ({**GOOD, "shape": "2"}, TypeError, "shape"),
    ({**GOOD, "shape": [3]}, ValueError, "shape"),
    ({**GOOD, "shape": [2**40, 2**40], "data": []}, ValueError, "shape"),
    ({**GOOD, "shape": [1] * 100, "data": [1.0]}, ValueError, "shape"),
    ({**GOOD, "data": ["1", "2"]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, [2.0]]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, None]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, True]}, TypeError, "data"),
    ({**GOOD, "data": [1.0, math.nan]}, ValueError, "finite"),
    ({**GOOD, "data": [1.0, math.inf]}, ValueError, "finite"),
    ({**GOOD, "data": [1.0, 10**400]}, ValueError, "data"),
    ({"dtype": "int64", "shape": [1], "data": [1.5]}, TypeError, "data"),
    ({"dtype": "int64", "shape": [1], "data": [2**63]}, ValueError, "int64"),
    ({"dtype": "bool", "shape": [1], "data": [1]}, TypeError, "data"),
    ({**GOOD, "extra": 1}, ValueError, "extra"),
    ({"dtype": "float64", "shape": [2]}, ValueError, "data"),
    ([1.0, 2.0], TypeError, "object"),
])
def test_decode_refuses_what_the_exporter_never_writes(bad, error, words):
    with pytest.raises(error, match=words) as info:
        vectors.decode(bad, "inputs.x")
    assert "inputs.x" in str(info.value)


def test_decode_reads_what_encode_writes_including_empty_and_scalar_arrays():
    for a in (np.float64(2.5), np.zeros((0, 3)), np.arange(6, dtype=np.int64).reshape(2, 3),
              np.array([True, False])):
        got = vectors.decode(json.loads(json.dumps(vectors.encode(a))))
        assert got.dtype == a.dtype and got.shape == a.shape
        np.testing.assert_array_equal(got, a)


_DTYPES = st.sampled_from([np.float64, np.float32, np.float16, np.int64, np.int32, np.int8, np.uint8,
                           np.uint32, np.bool_])


@settings(max_examples=200, deadline=None)
@given(hnp.arrays(_DTYPES, hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=5),
                  elements={"allow_nan": False, "allow_infinity": False}))
def test_encode_then_decode_round_trips_through_json(a):
    doc = json.loads(json.dumps(vectors.encode(a), allow_nan=False))
    got = vectors.decode(doc)
    assert got.shape == a.shape
    kind = "bool" if a.dtype == bool else "int64" if np.issubdtype(a.dtype, np.integer) else "float64"
    assert got.dtype == np.dtype(kind)
    np.testing.assert_array_equal(got, a.astype(kind))
