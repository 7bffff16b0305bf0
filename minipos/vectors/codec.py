"""Arrays in JSON: ``encode`` and ``decode``.

An array is ``{"dtype": "float64" | "int64" | "bool", "shape": [...], "data": [row-major]}``; a
scalar output is an array of shape ``[]``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

from ._text import _short

ENCODED_DTYPES = ("float64", "int64", "bool")  # the only dtypes an encoded array may name
MAX_NDIM = 32                # dimensions of an encoded array
MAX_ARRAY_VALUES = 1 << 22   # values of one encoded array (32 MiB as float64)
_INT64 = np.iinfo(np.int64)


def encode(a, name: str = "array") -> dict:
    """An array (or scalar) as ``{"dtype", "shape", "data"}`` with row-major ``data``.

    Booleans are written as ``bool``, integers as ``int64``, real floats as ``float64``. Raises
    ``TypeError`` for complex, string or object input and ``ValueError`` for ragged lists, NaN/inf,
    integers outside int64 and arrays of more than ``MAX_ARRAY_VALUES`` values or ``MAX_NDIM`` dims:
    everything ``encode`` writes, ``decode`` reads back unchanged.
    """
    try:
        a = np.asarray(a)
    except (ValueError, TypeError) as err:   # ragged lists, say
        raise ValueError(f"{name} cannot be made an array ({_short(str(err), 120)})") from None
    if a.ndim > MAX_NDIM or a.size > MAX_ARRAY_VALUES:
        raise ValueError(f"{name} must have at most {MAX_NDIM} dims and {MAX_ARRAY_VALUES} values, "
                         f"got shape {a.shape}")
    if a.dtype == bool:
        return {"dtype": "bool", "shape": list(a.shape), "data": [bool(v) for v in a.ravel()]}
    if np.issubdtype(a.dtype, np.integer):
        if a.size and (int(a.max()) > _INT64.max or int(a.min()) < _INT64.min):
            raise ValueError(f"{name} holds integers outside int64 (min {int(a.min())}, max {int(a.max())})")
        return {"dtype": "int64", "shape": list(a.shape), "data": [int(v) for v in a.ravel()]}
    if not np.issubdtype(a.dtype, np.floating):
        raise TypeError(f"{name} must be a bool, integer or real float array, got dtype {a.dtype}"
                        + (" (the imaginary part would be lost)" if np.issubdtype(a.dtype, np.complexfloating)
                           else ""))
    data = np.asarray(a, dtype=np.float64).ravel()
    if not np.all(np.isfinite(data)):
        raise ValueError(f"{name}: golden vectors must be finite (no NaN or inf after conversion to float64)")
    return {"dtype": "float64", "shape": list(a.shape), "data": [float(v) for v in data]}


_DATA_TYPES = {"float64": (numbers.Real, "real numbers"), "int64": (numbers.Integral, "integers"),
               "bool": ((bool, np.bool_), "true/false")}


def _decode_shape(shape, name: str) -> list:
    """``shape`` as a list of non-negative ints with a bounded product, or raise naming ``name``."""
    if not isinstance(shape, (list, tuple)):
        raise TypeError(f"{name}.shape must be a list of integers, got {type(shape).__name__} {_short(shape)}")
    if len(shape) > MAX_NDIM:
        raise ValueError(f"{name}.shape has {len(shape)} dims, more than the {MAX_NDIM} allowed")
    count = 1
    for n in shape:
        if isinstance(n, (bool, np.bool_)) or not isinstance(n, numbers.Integral):
            raise TypeError(f"{name}.shape must hold integers, got {type(n).__name__} {_short(n)}")
        if n < 0:
            raise ValueError(f"{name}.shape must hold non-negative integers, got {_short(shape)}")
        count *= int(n)
    if count > MAX_ARRAY_VALUES:
        raise ValueError(f"{name}.shape {_short(shape)} asks for {count} values, more than the "
                         f"{MAX_ARRAY_VALUES} allowed")
    return [int(n) for n in shape]


def decode(d: dict, name: str = "array") -> np.ndarray:
    """The array of an encoded ``{"dtype", "shape", "data"}`` (``name`` labels errors).

    Only what ``encode`` writes is read: dtype ``float64`` (finite real numbers), ``int64``
    (integers in range) or ``bool`` (true/false), a shape of at most ``MAX_NDIM`` non-negative
    ints whose product, at most ``MAX_ARRAY_VALUES``, is the length of ``data``. Anything else
    raises ``ValueError`` or ``TypeError`` naming the field, before anything is allocated.
    """
    if not isinstance(d, dict):
        raise TypeError(f"{name} must be an object with dtype, shape and data, got {type(d).__name__}")
    if set(d) != {"dtype", "shape", "data"}:
        missing, extra = {"dtype", "shape", "data"} - set(d), set(d) - {"dtype", "shape", "data"}
        raise ValueError(f"{name} must have exactly the keys dtype, shape and data"
                         + (f"; missing {sorted(missing)}" if missing else "")
                         + (f"; extra {_short(sorted(map(str, extra)))}" if extra else ""))
    dtype, data = d["dtype"], d["data"]
    if not isinstance(dtype, str) or dtype not in ENCODED_DTYPES:
        raise ValueError(f"{name}.dtype must be one of {list(ENCODED_DTYPES)}, got {_short(dtype)}")
    shape = _decode_shape(d["shape"], name)
    if not isinstance(data, list):
        raise TypeError(f"{name}.data must be a list, got {type(data).__name__}")
    if len(data) != math.prod(shape):
        raise ValueError(f"{name}.shape {shape} holds {math.prod(shape)} values but data has {len(data)}")
    allowed, words = _DATA_TYPES[dtype]
    for kind in set(map(type, data)):  # a handful of types, however long the data
        if not issubclass(kind, allowed) or (dtype != "bool" and issubclass(kind, (bool, np.bool_))):
            raise TypeError(f"{name}.data must hold only {words} for dtype {dtype}, got {kind.__name__}")
    try:
        arr = np.array([int(v) for v in data] if dtype == "int64" else data, dtype=dtype)
    except OverflowError:
        raise ValueError(f"{name}.data holds a number out of range for {dtype}") from None
    if dtype == "float64" and not np.all(np.isfinite(arr)):
        raise ValueError(f"{name}.data must be finite, got NaN or inf")
    return arr.reshape(shape)
