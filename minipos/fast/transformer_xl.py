"""Transformer-XL's gradients, fast: the gather's scatter-add by ``np.bincount`` instead of ``np.add.at``.

``xl_position_logits`` gathers each pair's score from the scores of the distinct distances; its
adjoint scatters ``dout`` back by distance and adds where pairs share one (clamped distances).
``np.bincount`` with weights does the float64 additions of ``np.add.at`` in the same order (see
``minipos.fast.deberta``), so ``xl_position_logits_backward`` here equals the reference's bit for bit.
"""

from __future__ import annotations

import numpy as np

from .. import transformer_xl as reference
from .._checks import check_alloc, check_dout
from .deberta import take_along_last_backward

__all__ = ["xl_position_logits_backward"]


def xl_position_logits_backward(q, v, w_r, q_positions, k_positions, dout, *, base: float = 10000.0,
                                clamp_len: int | None = None):
    """``minipos.transformer_xl.xl_position_logits_backward`` (same arguments and results, bit for
    bit): ``(dq, dv, dw_r)`` of shapes (..., H, T, D), (H, D), (d_model, H*D)."""
    q, v, w_r, table, index = reference._distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len)
    *lead, H, T, D = q.shape
    U = table.shape[0]
    dout = check_dout(dout, (*lead, H, T, index.shape[1]), f"q of shape {q.shape} and the positions")
    check_alloc((*lead, H, T, U), np.float64, "q_positions and k_positions (dout by distance)")
    dp = take_along_last_backward(dout, index, U)                                 # (..., H, T, U)  scatter-add
    with np.errstate(over="ignore", invalid="ignore"):                            # checked in _grads
        r = reference.relative_heads(table, w_r, H)                               # (H, U, D)  W_R R_n
        dqv = dp @ r                                                              # (..., H, T, D)
        dr = np.einsum("nhtu,nhtd->hud", reference._batch(dp), reference._batch(q + v[:, None, :]))  # (H, U, D)
        dw_r = table.T @ dr.transpose(1, 0, 2).reshape(U, H * D)                  # (d_model, H*D)
        dv = reference._head_sum(dqv)                                             # (H, D)
    return reference._grads("q, v, w_r", q=(dqv, q), v=(dv, v), w_r=(dw_r, w_r))
