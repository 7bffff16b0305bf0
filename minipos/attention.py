"""Scaled dot-product attention, knowing no position scheme.

Every scheme of minipos plugs into attention through one of four seams (design: input, rotate,
bias, content-position). This module is what they plug into; it sees only

    logits[..., h, t, s] = scale * q[..., h, t, :] . k[..., h, s, :] + bias[..., h, t, s]
    weights = softmax(logits where mask else -inf, axis=-1)
    out[..., h, t, :] = sum_s weights[..., h, t, s] v[..., h, s, :]

(Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Eq. 1). The default
``scale`` is ``1/sqrt(D)``: for q, k with independent unit-variance entries Var(q . k) = D
(proved in ``proofs``), so the scale keeps the logits at unit variance.

Conventions
-----------
- Shapes: ``q`` ``(..., H, T, D)``, ``k`` ``(..., H, S, D)``, ``v`` ``(..., H, S, Dv)``; bias and
  mask broadcast to ``(..., H, T, S)`` *without enlarging it* (no silent broadcasting).
- Masks are boolean, ``True`` = may attend. A fully masked row gets all-zero weights (so a zero
  output), never NaN and never a warning.
- The result keeps the floating dtype of the inputs (float32 in, float32 out).
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_float, check_int

__all__ = ["softmax", "causal_mask", "attention"]


def softmax(x, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    ``x`` may hold ``-inf`` (a masked entry); a slice that is ``-inf`` throughout gives zeros
    there, not NaN. NaN or ``+inf`` in ``x`` raise ``ValueError``.

    x: any shape, floating (ints become float64). Returns the same shape and dtype.
    """
    x = as_float_array(x, "x", finite=False)
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("x must not hold NaN or +inf (use -inf for masked entries)")
    m = np.max(x, axis=axis, keepdims=True) if x.size else x
    m = np.where(np.isfinite(m), m, 0.0).astype(x.dtype, copy=False)  # all -inf row -> shift by 0
    e = np.exp(x - m)                                                   # softmax(x) = softmax(x - c)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def causal_mask(q_len: int, k_len: int) -> np.ndarray:
    """Boolean ``(T, S)`` mask where query ``t`` may attend key ``s`` iff ``s <= t + (S - T)``.

    The queries are taken to be the last ``T`` of the ``S`` positions (a cached decoding step),
    so with ``S == T`` this is the lower triangle including the diagonal.
    """
    T = check_int(q_len, "q_len", minimum=0)
    S = check_int(k_len, "k_len", minimum=0)
    t = np.arange(T)[:, None]
    s = np.arange(S)[None, :]
    return s <= t + (S - T)  # (T, S)


def _check_broadcast(arr: np.ndarray, name: str, target: tuple) -> None:
    """Raise unless ``arr`` broadcasts to ``target`` without changing it."""
    try:
        shape = np.broadcast_shapes(arr.shape, target)
    except ValueError:
        shape = None
    if shape != tuple(target):
        raise ValueError(
            f"{name} of shape {arr.shape} does not broadcast to the logits shape "
            f"(..., H, T, S) = {tuple(target)}"
        )


def _check_qkv(q, k, v):
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., H, T|S, D) with at least 2 dims, got {a.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"q, k, v must share their leading dims (..., H); got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim D; got q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys S; got k {k.shape}, v {v.shape}")
    return q, k, v


def attention(q, k, v, *, bias=None, mask=None, scale=None, return_weights: bool = False):
    """Multi-head scaled dot-product attention with an additive bias and a boolean mask.

    q: ``(..., H, T, D)``; k: ``(..., H, S, D)``; v: ``(..., H, S, Dv)``.
    bias: additive logits broadcastable to ``(..., H, T, S)`` (e.g. ALiBi or T5 ``(H, T, S)``).
    mask: boolean, broadcastable to ``(..., H, T, S)``; ``True`` = may attend.
    scale: multiplies ``q . k`` only (not the bias); default ``1/sqrt(D)``. T5 uses ``1.0``.
    Returns ``out`` ``(..., H, T, Dv)``, and the weights ``(..., H, T, S)`` too when
    ``return_weights``. Rows with no allowed key give zero weights and a zero output.
    """
    q, k, v = _check_qkv(q, k, v)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    D = q.shape[-1]
    scale = 1.0 / np.sqrt(D) if scale is None else check_float(scale, "scale")
    logits = np.matmul(q, np.swapaxes(k, -1, -2)).astype(dtype, copy=False)  # (..., H, T, S)
    logits *= dtype.type(scale)
    if bias is not None:
        bias = as_float_array(bias, "bias")
        _check_broadcast(bias, "bias", logits.shape)
        logits += bias.astype(dtype, copy=False)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        _check_broadcast(mask, "mask", logits.shape)
        logits = np.where(mask, logits, -np.inf).astype(dtype, copy=False)
    weights = softmax(logits, axis=-1)
    out = np.matmul(weights, v.astype(dtype, copy=False))  # (..., H, T, Dv)
    return (out, weights) if return_weights else out
