"""DeBERTa's c2p / p2c terms and their gradients, fast: BLAS products, flat gathers, one-hot products.

The adjoint of the c2p / p2c gather scatters ``dout`` into one row per relative-position bucket
and adds where pairs share a bucket. ``np.add.at`` does that one element at a time. Where one
(T, S) index serves every batch row and head (always, in the layer) and its one-hot matrices are no
larger than ``dout``, the scatter is T matrix products ``dout[..., t, :] @ onehot_t`` in dout's
dtype (``one_hot_scatter``); otherwise ``np.bincount`` with weights does the reference's float64
additions in the same order (element by element in C order of ``dout``, each bin starting from 0).
The sums over the batch of the table gradients, ``dK^r = sum dQP^T q``, are small products per
batch row and head, summed (``head_gram``), and the forward's products run per head over the whole batch
(``heads_matmul``): BLAS sums in its own order, so ``c2p_term``, ``p2c_term`` and their backwards
equal ``minipos.deberta``'s up to rounding.
"""

from __future__ import annotations

import math

import numpy as np

from .. import deberta as reference
from .._checks import cast_grad, check_alloc, check_dout, check_overflow

__all__ = ["c2p_term", "p2c_term", "c2p_term_backward", "p2c_term_backward", "take_along_last_backward",
           "one_hot_scatter", "take_rows", "heads_matmul", "head_gram"]


def _heads_first(a: np.ndarray) -> np.ndarray:
    """(..., H, X, Y) as (H, N*X, Y), N the product of ...: one matrix per head over the batch."""
    *lead, H, X, Y = a.shape
    N = math.prod(lead)
    return np.moveaxis(a.reshape(N, H, X, Y), 1, 0).reshape(H, N * X, Y)


def heads_matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a @ b`` for a (..., H, X, Y) and b (H, Y, Z): one BLAS product per head -> (..., H, X, Z)."""
    *lead, H, X, _ = a.shape
    out = (_heads_first(a) @ b).reshape(H, math.prod(lead), X, b.shape[-1])     # (H, N, X, Z)
    return np.moveaxis(out, 0, 1).reshape(*lead, H, X, b.shape[-1])


def head_gram(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``sum over ... and X of a^T b`` for a (..., H, X, C), b (..., H, X, D) -> (H, C, D), as
    ``np.einsum("nhxc,nhxd->hcd", a, b)``: one small BLAS product per leading index and head, summed
    (no copy of a or b into head-major order)."""
    g = np.swapaxes(a, -1, -2) @ b                                               # (..., H, C, D)
    return g.reshape(-1, *g.shape[-3:]).sum(axis=0)


def take_rows(a: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """``out[..., t, s] = a[..., :, :].ravel()[flat[t, s]]`` for a (..., X, Y), flat (T, S) ints
    in ``[0, X*Y)``: the same gather for every leading index, one ``np.take`` -> (..., T, S)."""
    *lead, X, Y = a.shape
    rows = np.ascontiguousarray(a).reshape(math.prod(lead), X * Y)              # (N, X*Y)
    return np.take(rows, flat, axis=1).reshape(*lead, *flat.shape)


def _shared_index(idx: np.ndarray) -> np.ndarray | None:
    """The (T, S) index of an index broadcast to (..., H, T, S), or None when it varies or is empty."""
    if idx.size and (idx.ndim == 2 or idx.strides[:-2] == (0,) * (idx.ndim - 2)):
        return idx[(0,) * (idx.ndim - 2)]
    return None


def c2p_term(q, pos_key, relative_pos, att_span: int) -> np.ndarray:
    """``minipos.deberta.c2p_term`` (same arguments, equal up to rounding): ``(..., H, T, S)``."""
    q, pos_key, idx = reference.c2p_args(q, pos_key, relative_pos, att_span)
    shared = _shared_index(idx)
    if idx.size == 0 or shared is None or q.ndim < 4:
        return reference.c2p_term(q, pos_key, relative_pos, att_span)
    with np.errstate(over="ignore", invalid="ignore"):                           # checked below
        qp = heads_matmul(q, np.swapaxes(pos_key, -1, -2))                        # (..., H, T, 2K)
    check_overflow(qp, "q . pos_key", "q or pos_key")
    K2 = pos_key.shape[1]
    return take_rows(qp, shared + K2 * np.arange(q.shape[-2])[:, None])           # t * 2K + delta


def p2c_term(k, pos_query, relative_pos, att_span: int) -> np.ndarray:
    """``minipos.deberta.p2c_term`` (same arguments, equal up to rounding): ``(..., H, T, S)``."""
    k, pos_query, idx = reference.p2c_args(k, pos_query, relative_pos, att_span)
    shared = _shared_index(idx)
    if idx.size == 0 or shared is None or k.ndim < 4:
        return reference.p2c_term(k, pos_query, relative_pos, att_span)
    S = k.shape[-2]
    with np.errstate(over="ignore", invalid="ignore"):                           # checked below
        kp = heads_matmul(k, np.swapaxes(pos_query, -1, -2))                      # (..., H, S, 2K)
    check_overflow(kp, "pos_query . k", "k or pos_query")
    return take_rows(kp, shared + pos_query.shape[1] * np.arange(S)[None, :])     # s * 2K + delta


def take_along_last_backward(dout: np.ndarray, idx: np.ndarray, size: int) -> np.ndarray:
    """The adjoint of ``np.take_along_axis(a, idx, axis=-1)`` for ``a`` of shape ``(..., size)``, in
    float64: ``da[..., c] = sum of dout[..., s] over the s with idx[..., s] = c`` (s ascending).

    dout ``(..., n)``; idx ints in ``[0, size)`` broadcastable to ``dout``'s shape. Where idx is one
    ``(T, n)`` index whose rows hold distinct values (Transformer-XL's distances without a clamp),
    no two elements share a bin: the scatter is an assignment, the same values as the additions.
    """
    *lead, _ = dout.shape
    rows = math.prod(lead)
    check_alloc((rows, size), np.float64, "dout (by relative position)")
    if idx.size and idx.ndim == 2 and dout.ndim >= 2 and idx.shape == dout.shape[-2:] and _distinct_rows(idx):
        T, n = idx.shape
        da = np.zeros((rows // T, T * size))                                      # (N, T*size)
        da[:, (idx + size * np.arange(T)[:, None]).ravel()] = dout.reshape(-1, T * n)   # t * size + c
        return da.reshape(*lead, size)
    flat = np.broadcast_to(idx, dout.shape) + (np.arange(rows) * size).reshape(*lead, 1)   # row * size + c
    da = np.bincount(flat.ravel(), weights=dout.ravel(), minlength=rows * size)           # float64, in order
    return da.reshape(*lead, size)


def _distinct_rows(idx: np.ndarray) -> bool:
    """True when no row of the (T, n) index holds a value twice."""
    ordered = np.sort(idx, axis=1)
    return bool(np.all(ordered[:, 1:] != ordered[:, :-1]))


def one_hot_scatter(dout: np.ndarray, idx: np.ndarray, size: int) -> np.ndarray:
    """``take_along_last_backward`` for one ``(T, n)`` index shared by every leading index, as T
    matrix products ``dout[..., t, :] @ onehot_t`` with the one-hot ``(n, size)`` matrix of row t's
    index, in dout's dtype (BLAS adds the pairs that share a bucket in its own order): (..., T, size).
    ``dout`` must be finite (the term functions check it): ``0 * inf`` would spread an infinite
    entry as NaN over its row's buckets."""
    *lead, T, n = dout.shape
    onehot = np.zeros((T, n, size), dout.dtype)
    onehot[np.arange(T)[:, None], np.arange(n)[None, :], idx] = 1
    rows = np.moveaxis(np.ascontiguousarray(dout).reshape(-1, T, n), 1, 0)       # (T, N, n), rows BLAS can read
    out = np.empty((math.prod(lead), T, size), dout.dtype)
    np.matmul(rows, onehot, out=np.moveaxis(out, 1, 0))                         # (T, N, size)
    return out.reshape(*lead, T, size)


def _scatter(dout, idx, size):
    """dout gathered back by bucket: ``one_hot_scatter`` where the index is one (T, n) for every
    leading index and its one-hot matrices are no larger than dout, else ``take_along_last_backward``."""
    shared = _shared_index(idx)
    if shared is not None and dout.ndim >= 3 and 0 < shared.size * size <= dout.size:
        return one_hot_scatter(dout, shared, size)
    return take_along_last_backward(dout, idx, size)


def _c2p_adjoint(q, pos_key, idx, dout):
    dqp = _scatter(dout, idx, pos_key.shape[1])                                  # (..., H, T, 2K)
    dq = dqp @ pos_key                                                           # (..., H, T, D)
    dpos_key = head_gram(dqp, q)                                                 # (H, 2K, D)
    return dq, dpos_key


def _p2c_adjoint(k, pos_query, idx, dout):
    t = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    dkp = _scatter(t(dout), t(idx), pos_query.shape[1])                          # (..., H, S, 2K)
    dk = dkp @ pos_query                                                         # (..., H, S, D)
    dpos_query = head_gram(dkp, k)                                               # (H, 2K, D)
    return dk, dpos_query


def c2p_term_backward(q, pos_key, relative_pos, att_span: int, dout):
    """``minipos.deberta.c2p_term_backward`` (same arguments, equal up to rounding): ``(dq, dpos_key)``."""
    q, pos_key, idx = reference.c2p_args(q, pos_key, relative_pos, att_span)
    dout = check_dout(dout, idx.shape, f"T from q of shape {q.shape}, S from relative_pos")
    with np.errstate(over="ignore", invalid="ignore"):                           # checked in _grad
        dq, dpos_key = _c2p_adjoint(q, pos_key, idx, dout)
    return cast_grad(dq, q, "q", "q, pos_key"), cast_grad(dpos_key, pos_key, "pos_key", "q, pos_key")


def p2c_term_backward(k, pos_query, relative_pos, att_span: int, dout):
    """``minipos.deberta.p2c_term_backward`` (same arguments, equal up to rounding): ``(dk, dpos_query)``."""
    k, pos_query, idx = reference.p2c_args(k, pos_query, relative_pos, att_span)
    dout = check_dout(dout, idx.shape, f"T from relative_pos, S from k of shape {k.shape}")
    with np.errstate(over="ignore", invalid="ignore"):                           # checked in _grad
        dk, dpos_query = _p2c_adjoint(k, pos_query, idx, dout)
    return (cast_grad(dk, k, "k", "k, pos_query"),
            cast_grad(dpos_query, pos_query, "pos_query", "k, pos_query"))
