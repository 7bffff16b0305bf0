"""Relative position representations on keys and values (Shaw, Uszkoreit & Vaswani 2018).

Source: "Self-Attention with Relative Position Representations", arXiv:1803.02155, §3; the
reference code is tensor2tensor's ``dot_product_attention_relative``
(``tensor2tensor/layers/common_attention.py``).

The scheme (content-position seam and value seam)
-------------------------------------------------
Each pair (query i, key j) gets two learned vectors of the head size ``D`` (the paper's d_z),
read from two tables of ``2k + 1`` rows indexed by the clipped distance (§3.1-3.2):

    a^K_ij = w^K[clip(j - i, k) + k],   a^V_ij = w^V[clip(j - i, k) + k],   clip(x, k) = max(-k, min(k, x))

    e_ij  = x_i W^Q (x_j W^K + a^K_ij)^T / sqrt(D)              (Eq. 4)
    z_i   = sum_j alpha_ij (x_j W^V + a^V_ij),  alpha = softmax_j(e)   (Eq. 3)

Sign convention: the distance is ``key - query`` (``j - i``), as T5's; row ``k + d`` of a table
is distance ``d``, so row 0 is every key ``k`` or more positions before the query and row
``2k`` every key ``k`` or more after it. Both tables are shared by all heads (tensor2tensor's
``[2k + 1, depth]`` tables, which the efficient form of §3.3 relies on) and each layer has its own
(tensor2tensor makes them inside each attention layer, named ``relative_positions_keys/embeddings``
and ``relative_positions_values/embeddings``).

Two forms
---------
The *pairwise* form is the paper's equations as written: gather ``a_ij`` into a ``(T, S, D)``
array, then contract. The *efficient* form (§3.3, tensor2tensor's ``_relative_attention_inner``
computes the pairwise form; the bucket form here needs no ``(T, S, D)`` array at all) uses that
only ``2k + 1`` distinct vectors exist:

    q_i . a^K_ij               = (q @ w^K^T)[i, bucket(i, j)]              gather a (T, 2k+1) array
    sum_j alpha_ij a^V_ij      = (sum_{j in bucket r} alpha_ij)_r @ w^V    sum per bucket, then a matmul

``tests/test_shaw.py`` proves the two forms equal. The backward of each is the other's shape:
the gradient of a gather is a sum per bucket, and the other way round.

Conventions: q ``(..., H, T, D)``, weights ``(..., H, T, S)``, tables ``(2k + 1, D)``; the logits
returned are *unscaled* (the layer multiplies them by ``1/sqrt(D)`` with ``q . k``). A term or
gradient that overflows its dtype raises ``ValueError`` naming the inputs to rescale, never inf.

The scheme class the layer runs, ``Shaw``, is at the bottom of this module.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._checks import POSITION_LIMIT, as_float_array, as_positions, check_alloc, check_int, check_overflow
from .seams import Scheme

__all__ = ["relative_buckets", "relative_logits", "relative_logits_pairwise", "relative_values",
           "relative_values_pairwise", "relative_logits_backward", "relative_values_backward", "Shaw"]


def relative_buckets(q_positions: ArrayLike, k_positions: ArrayLike, max_relative_position: int) -> np.ndarray:
    """The table row of every pair: ``clip(j - i, k) + k`` ``(T, S)``, in ``0 ... 2k``.

    q_positions ``(T,)``, k_positions ``(S,)``: integer positions (negative allowed, any int64:
    ``j - i`` is clipped without overflowing); max_relative_position: k in ``[0, 2**62)`` (k = 0
    gives one row: no position at all; the row ``2k`` must fit int64).
    """
    k = check_max_relative_position(max_relative_position)
    i = as_positions(q_positions, "q_positions", allow_negative=True)
    j = as_positions(k_positions, "k_positions", allow_negative=True)
    ahead = j[None, :] >= i[:, None]                                      # (T, S): j - i >= 0
    iu, ju = i.astype(np.uint64), j.astype(np.uint64)                     # two's complement: the
    up = np.minimum(ju[None, :] - iu[:, None], np.uint64(k))              # differences mod 2**64 are
    down = np.minimum(iu[:, None] - ju[None, :], np.uint64(k))            # exact where they are >= 0
    return np.where(ahead, up.astype(np.int64), -down.astype(np.int64)) + k   # (T, S): clip(j - i, k) + k


def check_max_relative_position(k) -> int:
    """``k`` as an int in ``[0, 2**62)``, or raise naming ``max_relative_position``."""
    k = check_int(k, "max_relative_position", minimum=0)
    if k >= POSITION_LIMIT:
        raise ValueError(f"max_relative_position must be below 2**62 (the table's last row 2k must fit int64; "
                         f"positions are below 2**62), got {k}")
    return k


def _check(table, name, k, D=None):
    """``table`` as a float ``(2k + 1, D)`` array (``D`` given: that width)."""
    table = as_float_array(table, name)
    rows = 2 * check_max_relative_position(k) + 1
    if table.ndim != 2 or table.shape[0] != rows or (D is not None and table.shape[1] != D):
        want = f"(2k + 1, D) = ({rows}, {'D' if D is None else D})"
        raise ValueError(f"{name} must have shape {want} for max_relative_position = {k}, got {table.shape}")
    return table


def _check_pairs(a, name, buckets, width=None):
    """``a`` as a float array ``(..., T, S)`` for the buckets' ``(T, S)``, or ``(..., T, width)``
    with ``width`` an int, or ``(..., T, D)`` of any D with ``width="D"``."""
    a = as_float_array(a, name)
    T, S = buckets.shape
    last = {None: S, "D": a.shape[-1] if a.ndim else None}.get(width, width)
    if a.ndim < 2 or a.shape[-2] != T or a.shape[-1] != last:
        want = f"(..., T, S) = (..., {T}, {S})" if width is None else (
            f"(..., T, D) = (..., {T}, {'D' if width == 'D' else width})")
        raise ValueError(f"{name} must have shape {want} for {T} query and {S} key positions, got {a.shape}")
    return a


def _gather(x, buckets):
    """``x[..., t, buckets[t, s]]``: ``(..., T, 2k+1)`` -> ``(..., T, S)``."""
    index = np.broadcast_to(buckets, (*x.shape[:-2], *buckets.shape))
    return np.take_along_axis(x, index, axis=-1)                         # (..., T, S)


def _bucket_sum(x, buckets, rows):
    """``out[..., t, r] = sum of x[..., t, s] over the s with buckets[t, s] = r``: ``(..., T, S)`` -> ``(..., T, 2k+1)``."""
    return np.stack([np.sum(x * (buckets == r), axis=-1) for r in range(rows)], axis=-1)   # (..., T, 2k+1)


def _sum_outer(g, a):
    """``sum over ... and t of g[..., t, :]^T a[..., t, :]``: ``(..., T, R)``, ``(..., T, D)`` -> ``(R, D)``."""
    return g.reshape(-1, g.shape[-1]).T @ a.reshape(-1, a.shape[-1])


def relative_logits(q: ArrayLike, w_k: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *,
                    max_relative_position: int) -> np.ndarray:
    """The key term of Eq. 4, unscaled: ``q_i . a^K_ij`` ``(..., H, T, S)``, by the efficient form.

    q: ``(..., H, T, D)``; w_k: ``(2k + 1, D)``; positions ``(T,)``, ``(S,)``.
    """
    buckets = relative_buckets(q_positions, k_positions, max_relative_position)
    q = _check_pairs(q, "q", buckets, "D")
    w_k = _check(w_k, "w_k", max_relative_position, q.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        per_bucket = q @ w_k.T                                            # (..., H, T, 2k+1)
    return _gather(check_overflow(per_bucket, "q . a^K", "q or w_k"), buckets)   # (..., H, T, S)


def relative_logits_pairwise(q: ArrayLike, w_k: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *,
                             max_relative_position: int) -> np.ndarray:
    """``relative_logits`` as Eq. 4 writes it: ``a^K`` gathered to ``(T, S, D)``, then ``q_i . a^K_ij``."""
    buckets = relative_buckets(q_positions, k_positions, max_relative_position)
    q = _check_pairs(q, "q", buckets, "D")
    a_k = _check(w_k, "w_k", max_relative_position, q.shape[-1])[buckets]   # (T, S, D)
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        out = np.einsum("...td,tsd->...ts", q, a_k)                       # (..., H, T, S)
    return check_overflow(out, "q . a^K", "q or w_k")


def relative_values(weights: ArrayLike, w_v: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *,
                    max_relative_position: int) -> np.ndarray:
    """The value term of Eq. 3: ``sum_j weights_ij a^V_ij`` ``(..., H, T, D)``, by the efficient form.

    weights: ``(..., H, T, S)`` (the attention weights, or any block of them: the term is linear
    in them); w_v: ``(2k + 1, D)``.
    """
    buckets = relative_buckets(q_positions, k_positions, max_relative_position)
    weights = _check_pairs(weights, "weights", buckets)
    w_v = _check(w_v, "w_v", max_relative_position)
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        out = _bucket_sum(weights, buckets, len(w_v)) @ w_v              # (..., H, T, 2k+1) @ (2k+1, D)
    return check_overflow(out, "sum_j weights_ij a^V_ij", "weights or w_v")


def relative_values_pairwise(weights: ArrayLike, w_v: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *,
                             max_relative_position: int) -> np.ndarray:
    """``relative_values`` as Eq. 3 writes it: ``a^V`` gathered to ``(T, S, D)``, then summed over j."""
    buckets = relative_buckets(q_positions, k_positions, max_relative_position)
    weights = _check_pairs(weights, "weights", buckets)
    a_v = _check(w_v, "w_v", max_relative_position)[buckets]               # (T, S, D)
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        out = np.einsum("...ts,tsd->...td", weights, a_v)                 # (..., H, T, D)
    return check_overflow(out, "sum_j weights_ij a^V_ij", "weights or w_v")


def relative_logits_backward(q: ArrayLike, w_k: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike,
                             dlogits: ArrayLike, *, max_relative_position: int):
    """The gradients of ``relative_logits`` for ``dlogits`` ``(..., H, T, S)``: ``(dq, dw_k)``.

    The adjoint of the gather is the sum per bucket: ``g = bucket_sum(dlogits)`` ``(..., T, 2k+1)``,
    then ``dq = g @ w^K`` and ``dw^K = sum over ... and t of g^T q``.
    """
    buckets = relative_buckets(q_positions, k_positions, max_relative_position)
    q = _check_pairs(q, "q", buckets, "D")
    w_k = _check(w_k, "w_k", max_relative_position, q.shape[-1])
    dlogits = _check_pairs(dlogits, "dlogits", buckets)
    if dlogits.shape[:-2] != q.shape[:-2]:
        raise ValueError(f"dlogits must have the leading shape of q {q.shape[:-2]}, got {dlogits.shape[:-2]}")
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        g = _bucket_sum(dlogits, buckets, len(w_k))                      # (..., H, T, 2k+1)
        dq, dw_k = g @ w_k, _sum_outer(g, q)                             # (..., H, T, D), (2k+1, D)
    return (check_overflow(dq, "the gradient of q", "dlogits or w_k"),
            check_overflow(dw_k, "the gradient of w_k", "dlogits or q"))


def relative_values_backward(weights: ArrayLike, w_v: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike,
                             dout: ArrayLike, *, max_relative_position: int):
    """The gradients of ``relative_values`` for ``dout`` ``(..., H, T, D)``: ``(dweights, dw_v)``.

    ``dweights_ij = dout_i . a^V_ij`` is a gather of ``dout @ w^V^T``; ``dw^V[r]`` sums
    ``weights_ij dout_i`` over the pairs in bucket r.
    """
    buckets = relative_buckets(q_positions, k_positions, max_relative_position)
    weights = _check_pairs(weights, "weights", buckets)
    w_v = _check(w_v, "w_v", max_relative_position)
    dout = _check_pairs(dout, "dout", buckets, w_v.shape[1])
    if dout.shape[:-2] != weights.shape[:-2]:
        raise ValueError(f"dout must have the leading shape of weights {weights.shape[:-2]}, got {dout.shape[:-2]}")
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        g = _bucket_sum(weights, buckets, len(w_v))                     # (..., H, T, 2k+1)
        dweights, dw_v = _gather(dout @ w_v.T, buckets), _sum_outer(g, dout)   # (..., H, T, S), (2k+1, D)
    return (check_overflow(dweights, "the gradient of weights", "dout or w_v"),
            check_overflow(dw_v, "the gradient of w_v", "dout or weights"))


# --------------------------------------------------------------------------- the scheme the layer runs

class Shaw(Scheme):
    """Relative position representations on keys and values (Shaw et al. 2018, the functions above).

    logits = q_i . (k_j + a^K_ij) / sqrt(D) and out_i = sum_j alpha_ij (v_j + a^V_ij), with
    ``a_ij = w[clip(j - i, k) + k]``. Learned: ``w_k`` and ``w_v`` ``(2k + 1, D)``, shared by the
    heads (tensor2tensor's ``relative_positions_keys/embeddings`` and
    ``relative_positions_values/embeddings``). ``max_relative_position`` is k.
    """

    name = "shaw"
    seams = ("content-position", "value")
    sign_convention = (r"row $\operatorname{clip}(j - i, k) + k$ of `w_k` and `w_v` (key minus query); HF "
                       r"SpeechT5's keys-only copy uses $i - j$, clipped to $[-L, L - 1]$",
                       r"Shaw et al. 2018, §3.2; tensor2tensor `_generate_relative_positions_matrix`; "
                       r"`relative_buckets`")
    terms = ("content-content", "content-position")

    def __init__(self, max_relative_position: int = 16):
        self.max_relative_position = check_max_relative_position(max_relative_position)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        rows = 2 * self.max_relative_position + 1
        check_alloc((2, rows, self.head_dim), layer.dtype,
                    f"max_relative_position = {self.max_relative_position} (Shaw's tables w_k, w_v (2k + 1, D))")
        self.w_k = (rng.standard_normal((rows, self.head_dim)) / np.sqrt(self.head_dim)).astype(layer.dtype)
        self.w_v = (rng.standard_normal((rows, self.head_dim)) / np.sqrt(self.head_dim)).astype(layer.dtype)

    def parameters(self):
        return {"w_k": self.w_k, "w_v": self.w_v}

    def content_position(self, q, k, q_positions, k_positions):
        scale, kmax = self.scale(self.head_dim), self.max_relative_position

        def extra(qs, ks):  # q_i . a^K_ij / sqrt(D) for one block (Eq. 4's second term)
            return scale * relative_logits(q[..., qs, :], self.w_k, q_positions[qs], k_positions[ks],
                                                max_relative_position=kmax)
        return q, extra

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add):
        dq, dw_k = relative_logits_backward(q[..., qs, :], self.w_k, q_positions[qs], k_positions[ks],
                                                 self.scale(self.head_dim) * dlogits,
                                                 max_relative_position=self.max_relative_position)
        add("scheme.w_k", dw_k)
        return dq, 0.0

    def value_position(self, q_positions, k_positions):
        def value(qs, ks, p):  # sum_j p_ij a^V_ij for one block (Eq. 3's second term)
            return relative_values(p, self.w_v.astype(p.dtype, copy=False), q_positions[qs], k_positions[ks],
                                        max_relative_position=self.max_relative_position)
        return value

    def value_position_backward(self, q_positions, k_positions, qs, ks, p, dout, add):
        dp, dw_v = relative_values_backward(p, self.w_v, q_positions[qs], k_positions[ks], dout,
                                                 max_relative_position=self.max_relative_position)
        add("scheme.w_v", dw_v)
        return dp

    def settings(self):
        return (("max_relative_position", self.max_relative_position),)

    def __repr__(self) -> str:
        return f"Shaw(max_relative_position={self.max_relative_position})"
