"""RoPE, fast: ``apply_rope`` a few positions at a time, in place, without ``rotate_half``'s copies.

The same rotation as ``minipos.rope.apply_rope`` (Eq. 34), equal up to rounding:

- the "interleaved" pairs are multiplied as complex numbers, ``(x_0 + i x_1) e^{i m θ}``, on a
  complex view of ``x`` (float32, float64 and longdouble; other dtypes take strided real pairs);
- the "half" pairs are rotated on a ``(..., t, 2, R/2)`` view whose halves are swapped by a
  negative stride, so ``rotate_half(x)`` is never materialised;
- ``x`` is processed in chunks of positions that fit in cache, read once and written once, the
  chunks of a large ``x`` shared among threads (``_threads.run``; NumPy releases the GIL in them);
- for float32 and long runs of positions, cos and sin come from the angle-addition formulas at
  ``m = 64 hi + lo``: float64 trigonometry on about ``T/64 + 64`` rows instead of ``T``.
"""

from __future__ import annotations

import threading

import numpy as np

from .. import rope as reference
from .._checks import as_float_array, as_positions, check_choice, check_float, check_ndim
from . import _threads

__all__ = ["apply_rope", "apply_rope_backward"]


def cos_sin(positions, T: int, R: int, base, inv_freq, attention_factor, dtype):
    """cos(mθ_i) and sin(mθ_i) times the attention factor, each ``(T, R/2)``, in ``dtype``."""
    if np.dtype(dtype).itemsize > 4 or T < 4 * _SPLIT:
        cos, sin = reference.cos_sin(positions, T, R, base, inv_freq, attention_factor)
        return _cast(cos, dtype), _cast(sin, dtype)
    pos = as_positions(positions, "positions", allow_negative=True, length=T)
    if inv_freq is None:
        inv_freq = reference.rope_inv_freq(R, base=base)
    elif base != 10000.0:
        raise ValueError("pass either base or inv_freq, not both (inv_freq already fixes the frequencies)")
    inv_freq = reference.check_inv_freq_len(inv_freq, R)
    factor = check_float(attention_factor, "attention_factor", positive=True)
    reference.check_angles(pos, inv_freq, factor)
    cos, sin = _cos_sin_split(pos, inv_freq)
    if factor != 1.0:
        cos *= factor
        sin *= factor
    return _cast(cos, dtype), _cast(sin, dtype)


def _cast(a, dtype):
    """``a`` in ``dtype``, refusing what overflows it (an attention factor beyond the dtype)."""
    with np.errstate(over="ignore"):
        out = a.astype(dtype, copy=False)
    if not np.isfinite(out).all():
        raise ValueError(f"attention_factor times cos and sin overflows {np.dtype(dtype)}")
    return out


_SPLIT = 64  # m = hi * 64 + lo: cos and sin are evaluated at the distinct hi and at lo < 64 only


def _cos_sin_split(pos: np.ndarray, inv_freq: np.ndarray):
    """cos(mθ), sin(mθ) in float64 ``(T, R/2)`` by the angle-addition formulas, for float32 output.

    With m = hi·64 + lo: cos(mθ) = cos(hi·64θ) cos(loθ) - sin(hi·64θ) sin(loθ), and
    sin(mθ) = sin(hi·64θ) cos(loθ) + cos(hi·64θ) sin(loθ). A run of T positions has about T/64
    distinct hi, so the float64 trigonometry (the slow part) runs on (T/64 + 64) rows instead of
    T; the result differs from the direct one by float64 rounding (~1e-13 at m ~ 10^4), far below
    a float32 ulp.
    """
    hi, lo = np.divmod(pos, _SPLIT)                                # (T,), (T,)
    his, where = np.unique(hi, return_inverse=True)                # distinct hi, (T,) into them
    a = np.outer((his * _SPLIT).astype(np.float64), inv_freq)      # (U, R/2): hi·64·θ
    b = np.outer(np.arange(_SPLIT, dtype=np.float64), inv_freq)    # (64, R/2): lo·θ
    ca, sa, cb, sb = np.cos(a)[where], np.sin(a)[where], np.cos(b)[lo], np.sin(b)[lo]  # (T, R/2)
    prod = np.multiply(sa, sb)                                     # in place below: fresh large
    cos = np.multiply(ca, cb)                                      # arrays cost page faults
    cos -= prod                                                    # cos(a + b)
    sin = np.multiply(sa, cb, out=sa)
    sin += np.multiply(ca, sb, out=prod)                           # sin(a + b)
    return cos, sin


_CHUNK = 1 << 18  # elements of x per step of apply_rope (1 MiB of float32): a step stays in cache


def _rotate_pairs(a, b, out_a, out_b, cos, sin, tmp) -> None:
    """Each pair (a, b) rotated by mθ: out_a = a cos - b sin, out_b = b cos + a sin (Eq. 34)."""
    tmp = tmp[: a.size].reshape(a.shape)
    np.multiply(a, cos, out=out_a)
    out_a -= np.multiply(b, sin, out=tmp)                  # x ⊙ cos(mΘ) + rotate(x) ⊙ sin(mΘ)
    np.multiply(b, cos, out=out_b)
    out_b += np.multiply(a, sin, out=tmp)


def _rotate_half_layout(x, out, cos, sin, tmp) -> None:
    """Pairs (i, i + R/2), on ``(..., t, 2, R/2)`` views: halves swapped by a negative stride."""
    *lead, t, R = x.shape
    halves = (*lead, t, 2, R // 2)
    x2, out2 = x.reshape(halves), out.reshape(halves)       # (..., t, 2, R/2): [x_1; x_2]
    cos2, sin2 = tmp[: 2 * t * R].reshape(2, t, 2, R // 2)  # [cos; cos], [-sin; sin], contiguous
    cos2[:, 0], cos2[:, 1] = cos, cos
    np.negative(sin, out=sin2[:, 0])
    sin2[:, 1] = sin
    prod = tmp[2 * t * R: 2 * t * R + x.size].reshape(halves)
    np.multiply(x2, cos2, out=out2)                         # x ⊙ cos(mΘ)
    out2 += np.multiply(x2[..., ::-1, :], sin2, out=prod)   #   + [x_2; x_1] ⊙ [-sin; sin] = rotate_half(x) ⊙ sin


def _rotate_interleaved(x, out, cos, sin, tmp) -> None:
    """Pairs (2i, 2i+1) as one complex number each: (x_0 + i x_1) e^{i m θ} (Eq. 34)."""
    if x.dtype.type not in _COMPLEX:                       # e.g. float16: strided real pairs
        return _rotate_pairs(x[..., 0::2], x[..., 1::2], out[..., 0::2], out[..., 1::2], cos, sin, tmp)
    z = x.view(_COMPLEX[x.dtype.type])                     # (..., t, R/2): x_0 + i x_1
    w = tmp[: 2 * cos.size].view(z.dtype).reshape(cos.shape)
    w.real, w.imag = cos, sin                              # e^{i m θ}
    np.multiply(z, w, out=out.view(z.dtype))               # (x_0 cos - x_1 sin) + i (x_0 sin + x_1 cos)


_COMPLEX = {np.float32: np.complex64, np.float64: np.complex128, np.longdouble: np.clongdouble}


def apply_rope(x, positions, *, base: float = 10000.0, inv_freq=None, layout: str = "interleaved",
               rotary_dim: int | None = None, attention_factor: float = 1.0) -> np.ndarray:
    """``minipos.rope.apply_rope``, computed in cache-sized chunks (same arguments and result)."""
    x = as_float_array(x, "x")
    check_ndim(x, "x", 2, "(..., T, D)")
    check_choice(layout, "layout", reference.LAYOUTS)
    *_, T, D = x.shape
    R = reference.check_rotary_dim(rotary_dim, D)
    cos, sin = cos_sin(positions, T, R, base, inv_freq, attention_factor, x.dtype)  # (T, R/2)
    return _rotated(x, cos, sin, layout, R)


def apply_rope_backward(dy, positions, *, base: float = 10000.0, inv_freq=None, layout: str = "interleaved",
                        rotary_dim: int | None = None, attention_factor: float = 1.0) -> np.ndarray:
    """``minipos.rope.apply_rope_backward``, ``R(m)^T dy``: the same chunks as ``apply_rope`` with
    the sines negated (the rotation by minus the angle). Same arguments and result."""
    dy = as_float_array(dy, "dy")
    check_ndim(dy, "dy", 2, "(..., T, D)")
    check_choice(layout, "layout", reference.LAYOUTS)
    *_, T, D = dy.shape
    R = reference.check_rotary_dim(rotary_dim, D, "dy")
    cos, sin = cos_sin(positions, T, R, base, inv_freq, attention_factor, dy.dtype)  # (T, R/2)
    return _rotated(dy, cos, -sin, layout, R, "dy")


def _rotated(x, cos, sin, layout: str, R: int, name: str = "x") -> np.ndarray:
    """The first R features of ``x`` (..., T, D) rotated by the angles of ``cos``, ``sin`` (T, R/2),
    the rest copied, a chunk of positions at a time."""
    *_, T, D = x.shape
    if layout == "interleaved" and x.dtype.type in _COMPLEX and x.strides[-1] != x.itemsize:
        x = np.ascontiguousarray(x)                                        # the complex view needs it
    out = np.empty(x.shape, x.dtype)                                       # (..., T, D)
    rotate = _rotate_interleaved if layout == "interleaved" else _rotate_half_layout
    per_position = x.size // max(T, 1)
    step = max(1, _CHUNK // max(1, per_position))                          # positions per chunk
    local = threading.local()                                              # a scratch buffer per thread

    def chunk(ts):
        tmp = getattr(local, "tmp", None)
        if tmp is None:
            tmp = local.tmp = np.empty(min(T, step) * (per_position + 4 * R), x.dtype)
        out[..., ts, R:] = x[..., ts, R:]                                  # the pass-through part
        with reference.overflow_raises(x.dtype, name):                    # errstate is per thread
            rotate(x[..., ts, :R], out[..., ts, :R], cos[ts], sin[ts], tmp)
    workers = _threads.copy_workers() if x.size >= _THREADED_ROPE else 1
    _threads.run(chunk, [(slice(t, t + step),) for t in range(0, T, step)], workers, pause_blas=False)
    return out                                                             # (..., T, D)


# Below this many elements of x one thread rotates faster than several.
_THREADED_ROPE = 1 << 20
