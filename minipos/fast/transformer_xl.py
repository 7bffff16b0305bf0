"""Transformer-XL's position logits and their gradients, fast: BLAS products and flat gathers.

``minipos.transformer_xl.xl_position_logits`` scores each distinct distance with ``np.einsum``
and gathers each pair's score with ``np.take_along_axis``; here the scores are small BLAS
products in the inputs' dtype, the gather one ``np.take`` on flat rows, and the backward's
sum over the batch, ``dr = sum dP^T (q + v)``, small products summed (``head_gram``). The
scatter-add of the gather's adjoint is ``np.bincount`` (see ``minipos.fast.deberta``), the same
float64 additions as the reference's ``np.add.at``. BLAS sums in its own order: equal to the
reference up to rounding.

Contiguous positions without a clamp (every training pass) take a band instead: the pair (t, s)
has distance index ``t - s + S - 1`` among the ``U = T + S - 1`` distances, so the gather is a
strided view of the (T, U) scores (row stride U + 1, column stride -1, the relative shift of the
paper's code) and its adjoint a strided write into zeros: no index arrays, and the backward's
products run in the inputs' dtype instead of the scatter's float64.
"""

from __future__ import annotations

import numpy as np

from .. import transformer_xl as reference
from .._checks import cast_grads, check_alloc, check_dout, check_overflow, float_dtype
from .deberta import head_gram, take_along_last_backward, take_rows

_as_strided = np.lib.stride_tricks.as_strided

__all__ = ["xl_position_logits", "xl_position_logits_backward"]


def xl_position_logits(q, v, w_r, q_positions, k_positions, *, base: float = 10000.0,
                       clamp_len: int | None = None) -> np.ndarray:
    """``minipos.transformer_xl.xl_position_logits`` (same arguments, equal up to rounding):
    (q_i + v) . W_R R_{i-j}, unscaled, shape (..., H, T, S)."""
    q, v, w_r, table, index = reference.distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len)
    T, U = q.shape[-2], table.shape[0]
    dtype = float_dtype(q, v, w_r)
    r = reference.relative_heads(table, w_r, q.shape[-3]).astype(dtype, copy=False)   # (H, U, D)  W_R R_n
    with np.errstate(over="ignore", invalid="ignore"):                            # checked just below
        scores = (q + v[:, None, :]) @ np.swapaxes(r, -1, -2)                     # (..., H, T, U)
    check_overflow(scores, "(q + v) . W_R R", "q, v or w_r")
    if _is_band(index, U):
        return np.ascontiguousarray(_band(scores, index.shape[1]))                # (..., H, T, S)
    return take_rows(scores, index + U * np.arange(T)[:, None])                   # (..., H, T, S)


def _is_band(index: np.ndarray, U: int) -> bool:
    """True when pair (t, s) has distance index t - s + S - 1 among U = T + S - 1 distances
    (contiguous query and key positions, no clamp)."""
    T, S = index.shape
    return T > 0 and S > 0 and U == T + S - 1 and np.array_equal(
        index, np.arange(S - 1, T + S - 1)[:, None] - np.arange(S)[None, :])


def _band(scores: np.ndarray, S: int) -> np.ndarray:
    """The (..., T, S) view ``out[..., t, s] = scores[..., t, t - s + S - 1]`` of C-contiguous
    scores (..., T, U): row stride U + 1, column stride -1, starting at column S - 1."""
    *lead, T, U = scores.shape
    step = scores.itemsize
    start = scores.reshape(-1)[S - 1:]
    return _as_strided(start, (*lead, T, S), (*scores.strides[:-2], (U + 1) * step, -step))


def _band_backward(q, v, r, dout):
    """d(q + v) (..., H, T, D) and dr (H, U, D) of the band gather, in the inputs' dtype."""
    *lead, H, T, S = dout.shape
    dp = np.zeros((*lead, H, T, T + S - 1), np.result_type(q, v, r, dout))        # (..., H, T, U)
    _band(dp, S)[...] = dout                                                      # the adjoint of the view
    return dp @ r, head_gram(dp, q + v[:, None, :])                               # sum dP^T (q + v) over ...


def xl_position_logits_backward(q, v, w_r, q_positions, k_positions, dout, *, base: float = 10000.0,
                                clamp_len: int | None = None):
    """``minipos.transformer_xl.xl_position_logits_backward`` (same arguments, equal up to
    rounding): ``(dq, dv, dw_r)`` of shapes (..., H, T, D), (H, D), (d_model, H*D)."""
    q, v, w_r, table, index = reference.distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len)
    *lead, H, T, D = q.shape
    U = table.shape[0]
    dout = check_dout(dout, (*lead, H, T, index.shape[1]), f"q of shape {q.shape} and the positions")
    band = _is_band(index, U)
    check_alloc((*lead, H, T, U), float_dtype(q, v, w_r, dout) if band else np.float64,
                "q_positions and k_positions (dout by distance)")
    with np.errstate(over="ignore", invalid="ignore"):                            # checked in cast_grads
        r = reference.relative_heads(table, w_r, H)                               # (H, U, D)  W_R R_n
        if band:
            dqv, dr = _band_backward(q, v, r.astype(float_dtype(q, v, w_r, dout), copy=False), dout)
        else:
            dp = take_along_last_backward(dout, index, U)                         # (..., H, T, U)  scatter-add
            dqv = dp @ r                                                          # (..., H, T, D)
            dr = head_gram(dp, q + v[:, None, :])                                 # (H, U, D)  sum dP^T (q + v)
        dw_r = table.T @ dr.transpose(1, 0, 2).reshape(U, H * D)                  # (d_model, H*D)
        dv = reference.head_sum(dqv)                                             # (H, D)
    return cast_grads("q, v, w_r", q=(dqv, q), v=(dv, v), w_r=(dw_r, w_r))
