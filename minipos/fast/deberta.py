"""DeBERTa's gradients, fast: the gathers' scatter-adds by ``np.bincount`` instead of ``np.add.at``.

The adjoint of the c2p / p2c gather scatters ``dout`` into one row per relative-position bucket
and adds where pairs share a bucket. ``np.add.at`` does that one element at a time;
``np.bincount`` with weights does the same float64 additions in the same order (element by element
in C order of ``dout``, each bin starting from 0), a vectorised loop about ten times faster at the
lab's sizes. Equal to ``minipos.deberta``'s ``c2p_term_backward`` and ``p2c_term_backward`` bit
for bit.
"""

from __future__ import annotations

import math

import numpy as np

from .. import deberta as reference
from .._checks import check_alloc, check_dout

__all__ = ["c2p_term_backward", "p2c_term_backward", "take_along_last_backward"]


def take_along_last_backward(dout: np.ndarray, idx: np.ndarray, size: int) -> np.ndarray:
    """The adjoint of ``np.take_along_axis(a, idx, axis=-1)`` for ``a`` of shape ``(..., size)``, in
    float64: ``da[..., c] = sum of dout[..., s] over the s with idx[..., s] = c`` (s ascending).

    dout ``(..., n)``; idx ints in ``[0, size)`` broadcastable to ``dout``'s shape.
    """
    *lead, _ = dout.shape
    rows = math.prod(lead)
    check_alloc((rows, size), np.float64, "dout (by relative position)")
    flat = np.broadcast_to(idx, dout.shape) + (np.arange(rows) * size).reshape(*lead, 1)   # row * size + c
    da = np.bincount(flat.ravel(), weights=dout.ravel(), minlength=rows * size)           # float64, in order
    return da.reshape(*lead, size)


def _c2p_adjoint(q, pos_key, idx, dout):
    dqp = take_along_last_backward(dout, idx, pos_key.shape[1])                  # (..., H, T, 2K)
    dq = dqp @ pos_key
    dpos_key = np.einsum("nhtc,nhtd->hcd", reference._batch(dqp), reference._batch(q))
    return dq, dpos_key


def _p2c_adjoint(k, pos_query, idx, dout):
    t = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    dkp = take_along_last_backward(t(dout), t(idx), pos_query.shape[1])          # (..., H, S, 2K)
    dk = dkp @ pos_query
    dpos_query = np.einsum("nhsc,nhsd->hcd", reference._batch(dkp), reference._batch(k))
    return dk, dpos_query


def c2p_term_backward(q, pos_key, relative_pos, att_span: int, dout):
    """``minipos.deberta.c2p_term_backward`` (same arguments and results, bit for bit): ``(dq, dpos_key)``."""
    q, pos_key, idx = reference._c2p_args(q, pos_key, relative_pos, att_span)
    dout = check_dout(dout, idx.shape, f"T from q of shape {q.shape}, S from relative_pos")
    with np.errstate(over="ignore", invalid="ignore"):                           # checked in _grad
        dq, dpos_key = _c2p_adjoint(q, pos_key, idx, dout)
    return reference._grad(dq, q, "q", "q, pos_key"), reference._grad(dpos_key, pos_key, "pos_key", "q, pos_key")


def p2c_term_backward(k, pos_query, relative_pos, att_span: int, dout):
    """``minipos.deberta.p2c_term_backward`` (same arguments and results, bit for bit): ``(dk, dpos_query)``."""
    k, pos_query, idx = reference._p2c_args(k, pos_query, relative_pos, att_span)
    dout = check_dout(dout, idx.shape, f"T from relative_pos, S from k of shape {k.shape}")
    with np.errstate(over="ignore", invalid="ignore"):                           # checked in _grad
        dk, dpos_query = _p2c_adjoint(k, pos_query, idx, dout)
    return (reference._grad(dk, k, "k", "k, pos_query"),
            reference._grad(dpos_query, pos_query, "pos_query", "k, pos_query"))
