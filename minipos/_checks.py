"""Argument checks shared by every module.

Each helper raises ``ValueError`` or ``TypeError`` with a message that names the argument and
says what was expected, so that bad input never turns into silent broadcasting or NaN.
"""

from __future__ import annotations

import numbers
import os

import numpy as np

__all__ = [
    "check_int",
    "check_positive_int",
    "check_even_int",
    "check_float",
    "as_float_array",
    "as_positions",
    "check_finite",
    "check_ndim",
    "check_choice",
    "check_bool",
    "check_span",
    "float_dtype",
    "check_alloc",
    "check_broadcast",
    "check_qkv",
    "check_callable",
    "check_axis",
    "check_float_dtype",
    "check_dout",
    "check_result",
    "check_overflow",
    "check_weighted",
    "check_context",
    "cast_grad",
    "cast_grads",
    "Overflow",
]


def check_int(value, name: str, *, minimum: int | None = None) -> int:
    """Return ``value`` as a Python int, or raise if it is not an integer >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer, got {type(value).__name__} {value!r}")
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def check_bool(value, name: str) -> bool:
    """Return ``value`` if it is a bool (or NumPy bool); a truthy string is not a bool."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False, got {type(value).__name__} {value!r}")
    return bool(value)


POSITION_LIMIT = 2 ** 62
"""Positions, and the windows, chunks and distances read against them, stay at most this (int64 keeps
room for their differences)."""


def check_span(value, name: str) -> int:
    """A window or chunk length: an int in ``[1, 2**62]`` (positions are below ``2**62``, so a longer
    one would change nothing, and ``i - W`` or ``i // C`` must stay in int64)."""
    value = check_positive_int(value, name)
    if value > POSITION_LIMIT:
        raise ValueError(f"{name} must be at most 2**62 (positions are below 2**62), got {value}")
    return value


def check_positive_int(value, name: str) -> int:
    """Return ``value`` as an int >= 1, or raise naming ``name``."""
    return check_int(value, name, minimum=1)


def check_even_int(value, name: str) -> int:
    """Return ``value`` as an even int >= 2, or raise naming ``name``."""
    value = check_int(value, name, minimum=2)
    if value % 2:
        raise ValueError(f"{name} must be even, got {value}")
    return value


def check_float(value, name: str, *, positive: bool = False, minimum: float | None = None) -> float:
    """Return ``value`` as a finite Python float, optionally > 0 or >= ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__} {value!r}")
    try:
        value = float(value)
    except OverflowError:
        raise ValueError(f"{name} must be finite, got an integer of {value.bit_length()} bits, too large "
                         "for a float") from None
    if not np.isfinite(value):
        raise ValueError(f"{name} must be finite, got {value}")
    if value != 0 and abs(value) < np.finfo(np.float64).tiny:
        raise ValueError(f"{name} must be 0 or a normal float64 (|{name}| >= 2.2e-308), got the subnormal {value}")
    if positive and value <= 0:
        raise ValueError(f"{name} must be > 0, got {value}")
    if minimum is not None and value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return value


def float_dtype(*arrays) -> np.dtype:
    """The floating dtype of a result: the promoted dtype of float inputs, float64 otherwise."""
    dtypes = [a.dtype for a in arrays if np.issubdtype(a.dtype, np.floating)]
    return np.result_type(*dtypes) if dtypes else np.dtype(np.float64)


def as_float_array(x, name: str, *, finite: bool = True) -> np.ndarray:
    """``x`` as a floating array (float inputs keep their dtype; ints become float64).

    Raises ``TypeError`` for bool, complex or non-numeric input, ``ValueError`` for NaN/inf when
    ``finite`` (they would poison every output they touch).
    """
    arr = _asarray(x, name)
    if arr.dtype == object or not (np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)):
        raise TypeError(f"{name} must be a real numeric array, got dtype {arr.dtype}")
    if not np.issubdtype(arr.dtype, np.floating):
        arr = arr.astype(np.float64)
    if finite:
        check_finite(arr, name)
    return arr


def _asarray(x, name: str) -> np.ndarray:
    """``np.asarray(x)``, or ``ValueError`` naming ``name`` for a ragged sequence (rows of unequal length)."""
    try:
        return np.asarray(x)
    except ValueError as err:
        raise ValueError(f"{name} must be a rectangular array, got a ragged sequence ({err})") from None


def check_finite(arr: np.ndarray, name: str) -> None:
    """Raise ``ValueError`` if ``arr`` holds NaN or +-inf."""
    if not np.all(np.isfinite(arr)):
        bad = int(np.size(arr) - np.count_nonzero(np.isfinite(arr)))
        raise ValueError(f"{name} must be finite, but it holds {bad} NaN or inf value(s)")


def as_positions(positions, name: str = "positions", *, allow_negative: bool = False,
                 ndim: int | None = 1, length: int | None = None) -> np.ndarray:
    """Integer positions as an int64 array.

    ``positions`` may be an int n (meaning ``arange(n)``) or an integer array. Float arrays are
    accepted only when every entry is an exact integer. Negative entries raise unless
    ``allow_negative``; ``ndim`` (if given) is the required number of dimensions; ``length`` (if
    given) the required number of positions, checked before ``arange(n)`` is built.
    """
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        n = check_int(positions, name, minimum=0)
        if length is not None and n != length:
            raise ValueError(f"{name} must have length {length}, got the int {n} (meaning arange({n}))")
        check_alloc((n,), np.int64, name)
        return np.arange(n, dtype=np.int64)
    arr = _asarray(positions, name)
    if arr.dtype == bool or not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
        raise TypeError(f"{name} must be an integer array or an int, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating):
        if not np.all(np.isfinite(arr)) or np.any(arr != np.round(arr)):
            raise ValueError(f"{name} must hold integers, got non-integer values")
    if arr.size and (np.issubdtype(arr.dtype, np.floating) or arr.dtype == np.uint64):
        if np.any(np.abs(arr.astype(np.float64)) >= 2.0 ** 62):  # beyond int64 (with room for differences)
            raise ValueError(f"{name} must hold integers of magnitude below 2**62, got {arr.max()}")
    arr = arr.astype(np.int64, copy=False)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if not allow_negative and arr.size and arr.min() < 0:
        raise ValueError(f"{name} must be >= 0, got minimum {int(arr.min())}")
    if length is not None and (arr.ndim != 1 or arr.shape[0] != length):
        raise ValueError(f"{name} must have length {length}, got shape {arr.shape}")
    return arr


def check_ndim(arr: np.ndarray, name: str, minimum: int, letters: str) -> None:
    """Raise unless ``arr`` has at least ``minimum`` dims; ``letters`` is the documented shape."""
    if arr.ndim < minimum:
        raise ValueError(f"{name} must have shape {letters}, got shape {arr.shape}")


def check_choice(value, name: str, choices) -> str:
    """Raise unless ``value`` is one of ``choices`` (strings)."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be one of {sorted(choices)!r}, got {type(value).__name__} {value!r}")
    if value not in choices:
        raise ValueError(f"{name} must be one of {sorted(choices)!r}, got {value!r}")
    return value


def _memory_bytes() -> int:
    """The memory available to a new array now, in bytes: Linux's ``MemAvailable``, else the
    machine's physical memory (2**63 where neither can be read)."""
    try:
        with open("/proc/meminfo") as info:
            for line in info:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, OSError, ValueError):
        return 1 << 63


MAX_BYTES = None
"""A fixed limit in bytes for ``check_alloc`` instead of the memory available now (for tests)."""


def check_alloc(shape, dtype, name: str, *, copies: int = 1) -> None:
    """Raise ``ValueError`` naming ``name`` if ``copies`` arrays of ``shape`` and ``dtype`` would
    not fit in the memory available now.

    Called before a function allocates an output whose size the caller chose, so that a request
    too large fails at once with the argument named, not in a ``MemoryError`` deep in NumPy (or
    by the kernel ending the process). ``copies`` counts the arrays of that size the function
    holds at once.
    """
    count = 1
    for n in shape:
        count *= int(n)
    nbytes = count * np.dtype(dtype).itemsize
    if MAX_BYTES is not None or nbytes * copies > (1 << 28):    # below 256 MiB: never worth a look
        available = _memory_bytes() if MAX_BYTES is None else MAX_BYTES
        if nbytes * copies > available:
            raise ValueError(f"{name} asks for an array of shape {tuple(int(n) for n in shape)} "
                             f"({nbytes / 2**30:.3g} GiB of {np.dtype(dtype)}"
                             f"{f', {copies} at once' if copies > 1 else ''}), more than the memory "
                             f"available ({available / 2**30:.3g} GiB)")


def check_broadcast(arr: np.ndarray, name: str, target: tuple) -> None:
    """Raise unless ``arr`` broadcasts to ``target`` without enlarging it (no silent broadcasting)."""
    try:
        shape = np.broadcast_shapes(arr.shape, tuple(target))
    except ValueError:
        shape = None
    if shape != tuple(target):
        raise ValueError(f"{name} of shape {arr.shape} does not broadcast to the logits shape "
                         f"(..., H, T, S) = {tuple(target)}")


def check_qkv(q, k, v, *, finite: bool = True):
    """``q`` ``(..., H, T, D)``, ``k`` ``(..., H, S, D)``, ``v`` ``(..., H, S, Dv)`` as floating
    arrays (finite ones unless ``finite=False``, for a caller that checks that itself), with the
    leading dims, ``D`` and ``S`` checked to agree."""
    q, k, v = (as_float_array(a, name, finite=finite) for a, name in ((q, "q"), (k, "k"), (v, "v")))
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., H, T|S, D) with at least 2 dims, got {a.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(f"q, k, v must share their leading dims (..., H); got q {q.shape}, k {k.shape}, "
                         f"v {v.shape}")
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim D; got q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys S; got k {k.shape}, v {v.shape}")
    return q, k, v


def check_callable(fn, name: str, what: str = "(q_slice, k_slice) -> array"):
    """Raise ``TypeError`` unless ``fn`` is ``None`` or callable."""
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a callable {what}, or None; got {type(fn).__name__}")
    return fn


def check_axis(axis, ndim: int, name: str = "axis") -> int:
    """``axis`` as an int in ``[-ndim, ndim)`` (``ndim`` of at least 1)."""
    axis = check_int(axis, name)
    if not -max(ndim, 1) <= axis < max(ndim, 1):
        raise ValueError(f"{name} must be in [-{max(ndim, 1)}, {max(ndim, 1)}) for an array of {ndim} dims, got {axis}")
    return axis


class Overflow(ValueError):
    """A result that does not fit its dtype (a ``ValueError``): the inputs are too large, or the
    weights it was computed with hold NaN or inf (``check_weighted``)."""


def check_result(arr: np.ndarray, what: str) -> np.ndarray:
    """Raise ``Overflow`` if ``arr`` (computed with overflow warnings silenced) is not finite."""
    if not np.isfinite(arr).all():
        raise Overflow(f"{what} overflow {arr.dtype}; rescale the inputs or use float64")
    return arr


def check_weighted(arr: np.ndarray | None, what: str, weights, rescale: str) -> np.ndarray | None:
    """``arr`` (``None`` passes), computed from finite inputs and weights with overflow warnings
    silenced, if finite; else ``Overflow`` naming the weights that hold NaN or inf, or, when none does,
    the overflow and ``rescale``, what to rescale. ``weights()`` returns the weights, name -> array or
    ``None``; it is called only on an error."""
    if arr is None or np.isfinite(arr).all():
        return arr
    bad = [name for name, w in weights().items() if w is not None and not np.isfinite(w).all()]
    if bad:
        raise Overflow(f"{what} is not finite ({arr.dtype}): {', '.join(bad)} hold{'s' if len(bad) == 1 else ''} "
                       "NaN or inf; a weight must be finite")
    raise Overflow(f"{what} overflows {arr.dtype}; rescale {rescale}, or use float64")


def check_context(ours: tuple, theirs: tuple) -> None:
    """Raise ``ValueError`` naming ``ctx`` and what differs unless ``theirs``, the configuration a
    ``Context`` recorded (``(name, value)`` pairs), is ``ours``, the layer's ``configuration()``."""
    ours, theirs = dict(ours), dict(theirs)
    if ours == theirs:
        return
    shown = lambda c, name: repr(c[name]) if name in c else "absent"  # noqa: E731
    differ = [f"{name}={shown(theirs, name)} (this layer: {shown(ours, name)})"
              for name in dict.fromkeys([*ours, *theirs]) if ours.get(name) != theirs.get(name)]
    raise ValueError(f"ctx comes from the forward pass of a layer of another configuration: {', '.join(differ)}; "
                     "pass the Context this layer's forward returned")


def check_float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """``dtype`` as a floating NumPy dtype, or ``TypeError`` naming ``name``."""
    try:
        dtype = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"{name} must be a floating dtype such as numpy.float32, got {dtype!r}") from None
    if not np.issubdtype(dtype, np.floating):
        raise TypeError(f"{name} must be a floating dtype, got {dtype}")
    return dtype


def check_dout(dout, shape: tuple, source: str) -> np.ndarray:
    """``dout`` as a finite float array of the forward's output shape, or raise naming it."""
    dout = as_float_array(dout, "dout")
    if dout.shape != tuple(shape):
        raise ValueError(f"dout must have the shape of the forward's output (..., H, T, S) = {tuple(shape)} "
                         f"({source}), got shape {dout.shape}")
    return dout


def check_overflow(out: np.ndarray, what: str, names: str) -> np.ndarray:
    """``out`` if finite; raise ``ValueError`` if it (computed from finite inputs) overflowed its
    dtype, naming ``what`` and the inputs ``names`` to rescale."""
    if not np.all(np.isfinite(out)):
        raise ValueError(f"{what} overflows {out.dtype}; rescale {names}, or compute in float64")
    return out


def cast_grad(grad: np.ndarray, like: np.ndarray, name: str, inputs: str) -> np.ndarray:
    """``grad`` in ``like``'s floating dtype, or raise naming ``name`` where it overflowed it
    (``inputs``: the forward's inputs it was computed from, besides ``dout``)."""
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        grad = grad.astype(like.dtype, copy=False)
    return check_overflow(grad, f"the gradient of {name}", f"{inputs} or dout")


def cast_grads(inputs: str, **grads) -> tuple:
    """``cast_grad`` of each gradient ``name=(grad, input)``, in order."""
    return tuple(cast_grad(grad, like, name, inputs) for name, (grad, like) in grads.items())
