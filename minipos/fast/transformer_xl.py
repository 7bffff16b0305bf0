"""Transformer-XL's position logits and their gradients, fast: BLAS products and flat gathers.

``minipos.transformer_xl.xl_position_logits`` scores each distinct distance with ``np.einsum``
and gathers each pair's score with ``np.take_along_axis``; here the scores are one matrix
product per head (``heads_matmul``), the gather one ``np.take`` on flat rows, and the backward's
sum over the batch, ``dr = sum dP^T (q + v)``, one product per head (``head_gram``). The
scatter-add of the gather's adjoint is ``np.bincount`` (see ``minipos.fast.deberta``), the same
float64 additions as the reference's ``np.add.at``. BLAS sums in its own order: equal to the
reference up to rounding.
"""

from __future__ import annotations

import numpy as np

from .. import transformer_xl as reference
from .._checks import check_alloc, check_dout, float_dtype
from .deberta import head_gram, heads_matmul, take_along_last_backward, take_rows

__all__ = ["xl_position_logits", "xl_position_logits_backward"]


def xl_position_logits(q, v, w_r, q_positions, k_positions, *, base: float = 10000.0,
                       clamp_len: int | None = None) -> np.ndarray:
    """``minipos.transformer_xl.xl_position_logits`` (same arguments, equal up to rounding):
    (q_i + v) . W_R R_{i-j}, unscaled, shape (..., H, T, S)."""
    q, v, w_r, table, index = reference._distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len)
    T, U = q.shape[-2], table.shape[0]
    r = reference.relative_heads(table, w_r, q.shape[-3])                         # (H, U, D)  W_R R_n
    with np.errstate(over="ignore", invalid="ignore"):                            # checked just below
        scores = heads_matmul(q + v[:, None, :], np.swapaxes(r, -1, -2))          # (..., H, T, U)
    scores = scores.astype(float_dtype(q, v, w_r), copy=False)
    reference._check_finite(scores, "(q + v) . W_R R", "q, v or w_r")
    return take_rows(scores, index + U * np.arange(T)[:, None])                   # (..., H, T, S)


def xl_position_logits_backward(q, v, w_r, q_positions, k_positions, dout, *, base: float = 10000.0,
                                clamp_len: int | None = None):
    """``minipos.transformer_xl.xl_position_logits_backward`` (same arguments, equal up to
    rounding): ``(dq, dv, dw_r)`` of shapes (..., H, T, D), (H, D), (d_model, H*D)."""
    q, v, w_r, table, index = reference._distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len)
    *lead, H, T, D = q.shape
    U = table.shape[0]
    dout = check_dout(dout, (*lead, H, T, index.shape[1]), f"q of shape {q.shape} and the positions")
    check_alloc((*lead, H, T, U), np.float64, "q_positions and k_positions (dout by distance)")
    dp = take_along_last_backward(dout, index, U)                                 # (..., H, T, U)  scatter-add
    with np.errstate(over="ignore", invalid="ignore"):                            # checked in _grads
        r = reference.relative_heads(table, w_r, H)                               # (H, U, D)  W_R R_n
        dqv = dp @ r                                                              # (..., H, T, D)
        dr = head_gram(dp, q + v[:, None, :])                                     # (H, U, D)  sum dP^T (q + v)
        dw_r = table.T @ dr.transpose(1, 0, 2).reshape(U, H * D)                  # (d_model, H*D)
        dv = reference._head_sum(dqv)                                             # (H, D)
    return reference._grads("q, v, w_r", q=(dqv, q), v=(dv, v), w_r=(dw_r, w_r))
