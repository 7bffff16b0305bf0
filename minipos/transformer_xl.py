"""Transformer-XL relative attention: four terms, a fixed sinusoidal R, and the relative shift.

Source: Dai et al. 2019, "Transformer-XL: Attentive Language Models Beyond a Fixed-Length
Context", arXiv:1901.02860, Section 3.3. For a query at position i and a key at position j the
paper replaces the absolute-position score by

    A^rel_{i,j} = E_{x_i}^T W_q^T W_{k,E} E_{x_j}      (a) content - content      q_i . k_j
                + E_{x_i}^T W_q^T W_{k,R} R_{i-j}      (b) content - position     q_i . W_R R_{i-j}
                + u^T W_{k,E} E_{x_j}                  (c) global content bias    u . k_j
                + v^T W_{k,R} R_{i-j}                  (d) global position bias   v . W_R R_{i-j}

with q_i = W_q E_{x_i} and k_j = W_{k,E} E_{x_j} split into heads (each head scores with its own
D columns). Grouped: (a) + (c) = (q_i + u) . k_j and (b) + (d) = (q_i + v) . W_R R_{i-j}.

- R is the FIXED sinusoidal table in the "split" layout [sin | cos] with w_c = base^(-2c/d_model),
  c = 0 ... d_model/2 - 1 (``minipos.sinusoidal.sinusoidal_table(..., layout="split")``). R is not
  learned; only its projection W_R is. A popular article calls this scheme "XLENT": that name is
  a misnomer, the scheme is Transformer-XL, and its R is not a learned embedding.
- u and v are learned (H, D) vectors, the same for every query position.

Paper vs reference code (kimiyoung/transformer-xl ``pytorch/mem_transformer.py``,
``RelPartialLearnableMultiHeadAttn``; HF's former ``modeling_transfo_xl.py`` is a copy):

    paper     code                       minipos
    u         r_w_bias  (H, D)           u
    v         r_r_bias  (H, D)           v
    W_{k,R}   r_net (Linear, no bias)    w_r (d_model, H*D), used as R @ w_r
    (a)+(c)   AC                         (q + u) . k
    (b)+(d)   BD = _rel_shift(...)       position_scores(q, r, v)

The code multiplies ``AC + BD`` by ``1/sqrt(D)`` before masking and softmax. Every score
function here returns UNSCALED logits; the caller applies that scale to both parts.

Sign and order conventions. Queries are the last T of the S = M + T positions of a segment with
a memory of length M: query row i sits at absolute position M + i, key column j at position j.
The distance is (M + i) - j, positive for keys in the past. R is built at the DESCENDING
distances S-1, S-2, ..., 0 (the code's ``pos_seq = arange(klen-1, -1, -1)``), so row s of R is
distance S-1-s, and the relative shift moves R_{(M+i)-j} under key column j.

Three forms, equal where they overlap (tests check it):

    xl_terms / xl_scores_definitional   gather R_{i-j} for every (i, j) pair, the paper's way;
                                        any positions, any sign of i - j; O(T S d_model)
    xl_position_logits                  project R once per distinct distance, then gather
                                        (b) + (d) per pair; any positions
    rel_shift / xl_scores               the code's way: project R at S descending distances,
                                        score every query against every row, then shift

To use them with ``minipos.attention.attention``, pass ``q + u`` as the query (terms (a) + (c),
scaled by ``1/sqrt(D)`` there) and ``position_logits / sqrt(D)`` as ``bias``: the sum is the
reference's ``(AC + BD) * scale``.

Causality. The shifted scores are exact for j <= i + M, i.e. where ``causal_mask(T, S)`` is True;
the other entries hold the pad zero and the next row's values (garbage) that the causal mask
removes. For any sign of i - j (a bidirectional use) take the definitional ``xl_terms``, which
gathers R_{i-j} for every pair.

Gradients. ``rel_shift_backward``, ``position_scores_backward``, ``xl_scores_backward`` and
``xl_position_logits_backward`` take their forward's arguments plus the output gradient ``dout``
(``dy`` for ``rel_shift``) and return the input gradients, each in its input's dtype. The
shift's backward is its transpose (pad T zeros in front of the flat gradient, view as (T, S+1),
drop the pad column); a gather's is a scatter-add, so pairs at one distance sum.

Errors. Shapes that do not match raise ``ValueError`` naming the argument and the array it must
match; distances i - j must fit int64 and, after ``clamp_len``, lie within +-2**53 (where float64
stops holding every integer); scores that overflow the floating dtype raise instead of returning
inf; an output (or the definitional form's per-pair table) too large for memory raises first.

The scheme class the layer runs, ``TransformerXL``, is at the bottom of this module.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (as_float_array, as_positions, cast_grads, check_alloc, check_dout, check_float, check_int,
                      check_overflow, float_dtype)
from .seams import TERMS, Scheme
from .sinusoidal import MAX_POSITION, sinusoidal_table

__all__ = [
    "relative_embeddings",
    "relative_heads",
    "rel_shift",
    "position_scores",
    "xl_scores",
    "xl_position_logits",
    "XLTerms",
    "xl_terms",
    "xl_scores_definitional",
    "rel_shift_backward",
    "position_scores_backward",
    "xl_scores_backward",
    "xl_position_logits_backward",
    "TransformerXL",
]


def relative_embeddings(k_len: int, d_model: int, *, base: float = 10000.0,
                        clamp_len: int | None = None) -> np.ndarray:
    """The fixed table R at the descending distances S-1, S-2, ..., 0: shape (S, d_model).

    Row s is R_{S-1-s} = [sin((S-1-s) w) | cos((S-1-s) w)], w_c = base^(-2c/d_model), as the
    reference's ``PositionalEmbedding(pos_seq)`` with ``pos_seq = arange(klen-1, -1, -1)``.
    ``clamp_len`` (the reference's ``clamp_len > 0``) caps every distance at that value.
    Returns float64.
    """
    S = check_int(k_len, "k_len", minimum=0)
    d_model = check_int(d_model, "d_model", minimum=2)
    if d_model % 2:
        raise ValueError(f"d_model must be even for the [sin | cos] table, got {d_model}")
    base = check_float(base, "base", positive=True)
    check_alloc((S, d_model), np.float64, "k_len and d_model")
    if clamp_len is not None:
        clamp_len = min(check_int(clamp_len, "clamp_len", minimum=1), max(S - 1, 1))  # above S-1: no-op
    distances = np.arange(S - 1, -1, -1, dtype=np.int64)  # (S,)  pos_seq, descending
    if clamp_len is not None:
        distances = np.minimum(distances, clamp_len)
    return sinusoidal_table(distances, d_model, base=base, layout="split")  # (S, d_model)  R


def relative_heads(table: ArrayLike, w_r: ArrayLike, num_heads: int) -> np.ndarray:
    """Project R by W_R and split it into heads: r[h, s] = (table @ w_r)[s, h*D:(h+1)*D].

    table: (S, d_model), e.g. ``relative_embeddings``; w_r: (d_model, H*D), the reference's
    ``r_net.weight.T``. Returns r (H, S, D) in the promoted dtype of the two. The head split is
    the reference's ``r_head_k.view(rlen, n_head, d_head)``.
    """
    H = check_int(num_heads, "num_heads", minimum=1)
    table = as_float_array(table, "table")
    w_r = as_float_array(w_r, "w_r")
    if table.ndim != 2 or w_r.ndim != 2 or table.shape[1] != w_r.shape[0]:
        raise ValueError(f"table (S, d_model) and w_r (d_model, H*D) do not match: got table "
                         f"{table.shape}, w_r {w_r.shape}")
    if w_r.shape[1] % H:
        raise ValueError(f"w_r must have H*D columns with H = num_heads = {H}, got shape {w_r.shape}")
    S, D = table.shape[0], w_r.shape[1] // H
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        projected = table @ w_r  # (S, H*D)  W_{k,R} R
    check_overflow(projected, "table @ w_r", "table or w_r")
    return projected.reshape(S, H, D).transpose(1, 0, 2)  # (H, S, D)


def rel_shift(x: ArrayLike) -> np.ndarray:
    """The pad-reshape-slice relative shift of the Transformer-XL code, on (..., T, S).

    Pad one zero column on the left (..., T, S+1), view the buffer as (..., S+1, T), drop the
    first row, view back as (..., T, S) (the reference ``_rel_shift``, here on the last two
    axes). With M = S - T:

        out[..., i, j] = x[..., i, j + T - 1 - i]     for j <= i + M,

    and garbage elsewhere (the pad zero at j = i + M + 1, then the next row's leading values):
    exactly the entries ``causal_mask(T, S)`` removes. Requires S >= T.
    """
    x = as_float_array(x, "x")
    if x.ndim < 2:
        raise ValueError(f"x must have shape (..., T, S), got shape {x.shape}")
    *lead, T, S = x.shape
    if S < T:
        raise ValueError(f"x must have S >= T (keys = memory + queries), got T={T}, S={S}")
    padded = np.empty((*lead, T, S + 1), dtype=x.dtype)  # (..., T, S+1)
    padded[..., 0], padded[..., 1:] = 0, x  # [0 | x]
    padded = padded.reshape(*lead, (S + 1) * T)[..., T:]  # the same buffer without its first T
    return padded.reshape(*lead, T, S)  # (..., T, S): a view, no second copy


def _as_q(q) -> np.ndarray:
    """q as a finite float array (..., H, T, D)."""
    q = as_float_array(q, "q")
    if q.ndim < 3:
        raise ValueError(f"q must have shape (..., H, T, D), got shape {q.shape}")
    return q


def _as_qk(q, k, *, causal: bool = True):
    """q as (..., H, T, D) and k as (..., H, S, D) with the same leading dims and D."""
    q = _as_q(q)
    k = as_float_array(k, "k")
    if k.ndim != q.ndim or k.shape[:-2] != q.shape[:-2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"k must have shape (..., H, S, D) matching q {q.shape}, got shape {k.shape}")
    if causal and k.shape[-2] < q.shape[-2]:
        raise ValueError(f"k must have S >= T keys (memory + queries), got T={q.shape[-2]}, "
                         f"S={k.shape[-2]}")
    return q, k


def _as_shaped(a, name: str, shape: tuple, letters: str, q: np.ndarray) -> np.ndarray:
    """``a`` as a float array of exactly ``shape`` (read off q), or a ValueError naming both."""
    a = as_float_array(a, name)
    if a.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {letters} = {tuple(shape)} to match q of shape {q.shape}, "
                         f"got shape {a.shape}")
    return a


def _as_w_r(w_r, H: int, D: int) -> np.ndarray:
    """W_R as (d_model, H*D) with an even d_model >= 2 (the [sin | cos] table's width)."""
    w_r = as_float_array(w_r, "w_r")
    if w_r.ndim != 2 or w_r.shape[1] != H * D or w_r.shape[0] % 2 or w_r.shape[0] < 2:
        raise ValueError(f"w_r must have shape (d_model, H*D) = (even d_model >= 2, {H * D}) to match q's "
                         f"H = {H} and D = {D}, got shape {w_r.shape}")
    return w_r


def _as_position_args(q, r, v):
    """q (..., H, T, D), r (H, S >= T, D) and v (H, D) as finite float arrays, H and D agreeing."""
    q = _as_q(q)
    *_, H, T, D = q.shape
    r = as_float_array(r, "r")
    if r.ndim != 3 or r.shape[0] != H or r.shape[2] != D or r.shape[1] < T:
        raise ValueError(f"r must have shape (H, S, D) = ({H}, S >= {T}, {D}) for q {q.shape}, "
                         f"got shape {r.shape}")
    return q, r, _as_shaped(v, "v", (H, D), "(H, D)", q)


def position_scores(q: ArrayLike, r: ArrayLike, v: ArrayLike) -> np.ndarray:
    """Terms (b) + (d), unscaled: out[..., h, i, j] = (q_i + v_h) . W_R R_{(M+i)-j}.

    q: (..., H, T, D); r: (H, S, D), the projected R at descending distances (r[h, s] is distance
    S-1-s: ``relative_heads(relative_embeddings(S, d_model), w_r, H)``); v: (H, D), the code's
    ``r_r_bias``. Returns (..., H, T, S), exact for j <= i + M (the causal entries).
    """
    q, r, v = _as_position_args(q, r, v)
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        bd = np.matmul(q + v[:, None, :], np.swapaxes(r, -1, -2)).astype(float_dtype(q, r, v), copy=False)
    check_overflow(bd, "(q + v) . r", "q, r or v")  # (..., H, T, S)  BD, unshifted
    return rel_shift(bd)  # BD[i, j] <- BD[i, j+T-1-i]


def _as_xl_args(q, k, r, u, v):
    """q (..., H, T, D), k (..., H, S, D), r (H, S, D), u and v (H, D), checked to agree."""
    q, k = _as_qk(q, k)
    *_, H, T, D = q.shape
    r = _as_shaped(r, "r", (H, k.shape[-2], D), "(H, S, D) with S = k.shape[-2]", q)
    u = _as_shaped(u, "u", (H, D), "(H, D)", q)
    return q, k, r, u, _as_shaped(v, "v", (H, D), "(H, D)", q)


def xl_scores(q: ArrayLike, k: ArrayLike, r: ArrayLike, u: ArrayLike, v: ArrayLike) -> np.ndarray:
    """Unscaled Transformer-XL logits (a)+(b)+(c)+(d) = (q_i + u) . k_j + (q_i + v) . r_{(M+i)-j}.

    q: (..., H, T, D), the last T of S positions; k: (..., H, S, D); r: (H, S, D), the projected
    R at descending distances (r[h, s] is distance S-1-s); u, v: (H, D) (the code's ``r_w_bias``,
    ``r_r_bias``). Returns (..., H, T, S) in the promoted dtype. Valid for j <= i + M: apply
    ``causal_mask(T, S)``. The reference then multiplies by 1/sqrt(D).
    """
    q, k, r, u, v = _as_xl_args(q, k, r, u, v)
    bd = position_scores(q, r, v)  # (..., H, T, S)  (b) + (d)
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        ac = np.matmul(q + u[:, None, :], np.swapaxes(k, -1, -2))  # (..., H, T, S)  (a) + (c)
        scores = (ac + bd).astype(float_dtype(q, k, r, u, v), copy=False)
    check_overflow(scores, "the logits (q + u) . k + (q + v) . r", "q, k, r, u or v")
    return scores


def xl_position_logits(q: ArrayLike, v: ArrayLike, w_r: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *,
                       base: float = 10000.0, clamp_len: int | None = None) -> np.ndarray:
    """Terms (b) + (d), unscaled, exact for EVERY pair: (q_i + v) . W_R R_{i-j}, shape (..., H, T, S).

    q: (..., H, T, D); v: (H, D); w_r: (d_model, H*D); q_positions (T,), k_positions (S,) integer
    positions of any order and sign (no causal restriction). Projects R once per distinct
    distance, then gathers: the general form of ``rel_shift``. ``clamp_len`` as in ``xl_terms``.
    """
    q, v, w_r, table, index = distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len)
    r = relative_heads(table, w_r, q.shape[-3])  # (H, U, D)  W_R R_n
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        scores = np.einsum("...htd,hud->...htu", q + v[:, None, :], r).astype(float_dtype(q, v, w_r),
                                                                              copy=False)  # (..., H, T, U)
    check_overflow(scores, "(q + v) . W_R R", "q, v or w_r")
    index = np.broadcast_to(index, (*q.shape[:-1], index.shape[1]))  # (..., H, T, S)
    return np.take_along_axis(scores, index, axis=-1)


def distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len):
    """The checked q, v, w_r, the table R_n (U, d_model) at the U distinct distances i - j, and
    the index (T, S) of each pair's distance among them (the sizes checked before any is built)."""
    q = _as_q(q)
    *_, H, T, D = q.shape
    v = _as_shaped(v, "v", (H, D), "(H, D)", q)
    w_r = _as_w_r(w_r, H, D)
    dtype = float_dtype(q, v, w_r)
    if _is_count(k_positions) and k_positions > 0:  # the output, before arange(S) is built
        check_alloc((*q.shape[:-1], k_positions), dtype, "k_positions")
    kp = as_positions(k_positions, "k_positions", allow_negative=True)
    check_alloc((*q.shape[:-1], kp.shape[0]), dtype, "k_positions")
    check_alloc((3, T, kp.shape[0]), np.int64, "q_positions and k_positions (i - j, sorted, indexed)")
    n = _pair_distances(q_positions, kp, T, kp.shape[0], clamp_len)  # (T, S)  i - j
    dist, index = np.unique(n.ravel(), return_inverse=True)  # (U,) distinct distances, (T*S,)
    check_alloc((*q.shape[:-1], dist.size), np.result_type(q, v, w_r), "q_positions and k_positions")
    table = sinusoidal_table(dist, w_r.shape[0], base=base, layout="split")  # (U, d_model)  R_n
    return q, v, w_r, table, index.reshape(n.shape)


class XLTerms(NamedTuple):
    """The four terms of A^rel_{i,j} (arXiv:1901.02860 Sec. 3.3), each (..., H, T, S)."""

    a: np.ndarray  # q_i . k_j
    b: np.ndarray  # q_i . W_R R_{i-j}
    c: np.ndarray  # u . k_j
    d: np.ndarray  # v . W_R R_{i-j}


def _is_count(positions) -> bool:
    """True for an int n that stands for ``arange(n)`` (not a bool, not an array)."""
    return isinstance(positions, numbers.Integral) and not isinstance(positions, bool)


def _pair_distances(q_positions, k_positions, T: int, S: int, clamp_len) -> np.ndarray:
    """i - j for every pair, (T, S); default positions put the queries last in arange(S).

    The lengths are checked before an int position count builds ``arange``, and the extreme
    distances in Python ints before NumPy subtracts, so that nothing wraps around int64.
    """
    if q_positions is None:
        if S < T:
            raise ValueError(f"q_positions is required when k has fewer keys than q has queries "
                             f"(S = {S} < T = {T}); the default puts the queries last among the keys")
        q_positions = np.arange(S - T, S)
    qp = as_positions(q_positions, "q_positions", allow_negative=True, length=T)  # (T,), q's queries
    kp = as_positions(np.arange(S) if k_positions is None else k_positions, "k_positions",
                      allow_negative=True, length=S)                                # (S,), k's keys
    c = None if clamp_len is None else check_int(clamp_len, "clamp_len", minimum=1)
    if T == 0 or S == 0:
        return np.zeros((T, S), dtype=np.int64)
    lo, hi = int(qp.min()) - int(kp.max()), int(qp.max()) - int(kp.min())  # extreme i - j, exact
    if lo < -2 ** 63 or hi >= 2 ** 63:
        raise ValueError(f"q_positions and k_positions give distances i - j beyond int64, {lo} ... {hi}")
    far = max(-lo, hi) if c is None else min(c, max(-lo, hi))  # largest |i - j| after clamp_len
    if far > MAX_POSITION:
        raise ValueError(f"q_positions and k_positions must give distances i - j within +-2**53 (float64 holds "
                         f"every integer only up to there; clamp_len caps them), got {lo} ... {hi}")
    n = qp[:, None] - kp[None, :]  # (T, S)  i - j
    if c is not None:
        n = np.clip(n, -max(far, 1), max(far, 1))  # a cap beyond every distance changes nothing
    return n


def xl_terms(q: ArrayLike, k: ArrayLike, w_r: ArrayLike, u: ArrayLike, v: ArrayLike, *,
             q_positions: ArrayLike | None = None, k_positions: ArrayLike | None = None, base: float = 10000.0,
             clamp_len: int | None = None) -> XLTerms:
    """The four terms of A^rel_{i,j}, gathering R_{i-j} for every (query, key) pair.

    q: (..., H, T, D); k: (..., H, S, D); w_r: (d_model, H*D), W_R (``r_net.weight.T``);
    u, v: (H, D). q_positions (T,), k_positions (S,): integer positions, default: the queries are
    the last T of arange(S). i - j may have any sign; ``clamp_len`` clips it to
    [-clamp_len, clamp_len]. Returns ``XLTerms(a, b, c, d)``, each (..., H, T, S), unscaled.
    """
    q, k = _as_qk(q, k, causal=False)
    *_, H, T, D = q.shape
    S = k.shape[-2]
    u = _as_shaped(u, "u", (H, D), "(H, D)", q)
    v = _as_shaped(v, "v", (H, D), "(H, D)", q)
    w_r = _as_w_r(w_r, H, D)
    dtype = float_dtype(q, k, w_r, u, v)
    check_alloc((T * S, max(w_r.shape)), np.float64, "q and k (R_{i-j} for all T * S pairs)")
    check_alloc((*q.shape[:-1], S), dtype, "q and k")
    n = _pair_distances(q_positions, k_positions, T, S, clamp_len)  # (T, S)
    R = sinusoidal_table(n.ravel(), w_r.shape[0], base=base, layout="split")  # (T*S, d_model) R_{i-j}
    full = (*q.shape[:-2], T, S)  # (..., H, T, S)
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        r_ij = (R @ w_r).reshape(T, S, H, D)  # (T, S, H, D)  W_{k,R} R_{i-j}, head by head
        a = np.einsum("...htd,...hsd->...hts", q, k)  # (a) q_i . k_j
        b = np.einsum("...htd,tshd->...hts", q, r_ij)  # (b) q_i . W_R R_{i-j}
        c = np.broadcast_to(np.einsum("hd,...hsd->...hs", u, k)[..., None, :], full)  # (c) u . k_j
        d = np.broadcast_to(np.einsum("hd,tshd->hts", v, r_ij), full)  # (d) v . W_R R_{i-j}
        terms = XLTerms(*(t.astype(dtype) for t in (a, b, c, d)))
    for name, term, inputs in zip(("(a) q . k", "(b) q . W_R R", "(c) u . k", "(d) v . W_R R"), terms,
                                  ("q or k", "q or w_r", "u or k", "v or w_r")):
        check_overflow(term, f"the term {name}", inputs)
    return terms


def xl_scores_definitional(q: ArrayLike, k: ArrayLike, w_r: ArrayLike, u: ArrayLike, v: ArrayLike, *,
                           q_positions: ArrayLike | None = None, k_positions: ArrayLike | None = None,
                           base: float = 10000.0, clamp_len: int | None = None) -> np.ndarray:
    """A^rel = (a) + (b) + (c) + (d) from ``xl_terms``, unscaled, shape (..., H, T, S).

    With the default positions this equals
    ``xl_scores(q, k, relative_heads(relative_embeddings(S, d_model), w_r, H), u, v)`` wherever
    the shift is valid (j <= i + M).
    """
    a, b, c, d = xl_terms(q, k, w_r, u, v, q_positions=q_positions, k_positions=k_positions,
                          base=base, clamp_len=clamp_len)
    with np.errstate(over="ignore", invalid="ignore"):  # checked just below
        scores = a + b + c + d  # A^rel_{i,j}, arXiv:1901.02860 Sec. 3.3
    check_overflow(scores, "the logits (a) + (b) + (c) + (d)", "q, k, w_r, u or v")
    return scores


# --------------------------------------------------------------------------- gradients
#
# Each backward takes its forward's arguments plus the output gradient and returns the input
# gradients, each in its input's floating dtype; no state is kept between the two passes.


def rel_shift_backward(dy: ArrayLike) -> np.ndarray:
    """The adjoint of ``rel_shift``: dx (..., T, S) with ``sum(rel_shift(x) * dy) == sum(x * dx)`` for all x, dy.

    ``rel_shift`` is linear, and its output has its input's shape (..., T, S), so dy alone fixes
    dx's shape. Flat, the forward reads out[n] = [0 | x].flat[n + T] (the padded buffer, viewed as
    (..., T, S+1), without its first T entries); the adjoint runs its three steps backwards:

        buf = [T zeros, dy.flat]          adjoint of dropping the first T entries
        buf viewed as (..., T, S+1)       adjoint of the views (the same buffer)
        dx = buf[..., 1:]                 adjoint of padding the zero column: drop it

    So dx[..., i, j + T - 1 - i] = dy[..., i, j] for j <= i + M (the causal entries); dx[..., 0, :T-1]
    is 0 (the forward never reads it); dy at the pad zero (j = i + M + 1) reaches nothing, and dy
    on the garbage beyond it flows to the next row of x, as the forward copied it from there. In
    attention the causal mask zeroes dy there. Requires S >= T. Returns dy's floating dtype.
    """
    dy = as_float_array(dy, "dy")
    if dy.ndim < 2:
        raise ValueError(f"dy must have shape (..., T, S), got shape {dy.shape}")
    *lead, T, S = dy.shape
    if S < T:
        raise ValueError(f"dy must have S >= T (the shape of rel_shift's output), got T={T}, S={S}")
    return _rel_shift_adjoint(dy)


def _rel_shift_adjoint(dy: np.ndarray) -> np.ndarray:
    """``rel_shift_backward`` on a checked dy (..., T, S), S >= T."""
    *lead, T, S = dy.shape
    buf = np.zeros((*lead, T + T * S), dtype=dy.dtype)  # (..., T(S+1))
    buf[..., T:] = dy.reshape(*lead, T * S)  # [0 ... 0 | dy]: the dropped first T get no gradient
    return buf.reshape(*lead, T, S + 1)[..., 1:]  # (..., T, S): the pad column dropped


def _batch(a: np.ndarray) -> np.ndarray:
    """(..., H, X, Y) as (N, H, X, Y), N the product of ... (1 without leading dims), for sums over ...."""
    return a.reshape(math.prod(a.shape[:-3]), *a.shape[-3:])


def head_sum(g: np.ndarray) -> np.ndarray:
    """(..., H, T, D) summed over ... and T to (H, D): the adjoint of broadcasting a per-head vector."""
    return g.sum(axis=(*range(g.ndim - 3), g.ndim - 2))


def _position_adjoint(q, r, v, dout):
    """d(q + v) (..., H, T, D), dr (H, S, D), dv (H, D) of BD = rel_shift((q + v) r^T)."""
    qv = q + v[:, None, :]  # (..., H, T, D)  q_i + v
    dbd = _rel_shift_adjoint(dout)  # (..., H, T, S)  dBD, unshifted
    dqv = dbd @ r  # d(q + v) = dBD r
    dr = np.einsum("nhts,nhtd->hsd", _batch(dbd), _batch(qv))  # dr = sum over ... of dBD^T (q + v)
    return dqv, dr, head_sum(dqv)  # dv = sum over ... and T of d(q + v)


def position_scores_backward(q: ArrayLike, r: ArrayLike, v: ArrayLike, dout: ArrayLike):
    """Gradients of ``position_scores(q, r, v)`` for the output gradient dout (..., H, T, S).

    Returns (dq, dr, dv) of shapes (..., H, T, D), (H, S, D), (H, D). With BD = (q + v) r^T and
    out = rel_shift(BD):

        dBD = rel_shift_backward(dout)
        dq = dBD r,    dv = sum over ... and T of dBD r,    dr = sum over ... of dBD^T (q + v)

    Gradient at the garbage entries j > i + M of dout flows where the shift copied them from;
    attention's causal mask makes it 0.
    """
    q, r, v = _as_position_args(q, r, v)
    dout = check_dout(dout, (*q.shape[:-1], r.shape[1]), f"q of shape {q.shape}, r of shape {r.shape}")
    with np.errstate(over="ignore", invalid="ignore"):  # checked in cast_grads
        dq, dr, dv = _position_adjoint(q, r, v, dout)
    return cast_grads("q, r, v", q=(dq, q), r=(dr, r), v=(dv, v))


def xl_scores_backward(q: ArrayLike, k: ArrayLike, r: ArrayLike, u: ArrayLike, v: ArrayLike, dout: ArrayLike):
    """Gradients of ``xl_scores(q, k, r, u, v)`` for the output gradient dout (..., H, T, S).

    Returns (dq, dk, dr, du, dv) of the shapes of q (..., H, T, D), k (..., H, S, D),
    r (H, S, D), u (H, D), v (H, D). The logits are AC + BD with AC = (q + u) k^T:

        d(q + u) = dout k,    dk = dout^T (q + u),    du = sum over ... and T of d(q + u)
        d(q + v), dr, dv      from position_scores_backward (BD)
        dq = d(q + u) + d(q + v)
    """
    q, k, r, u, v = _as_xl_args(q, k, r, u, v)
    dout = check_dout(dout, (*q.shape[:-1], k.shape[-2]), f"q of shape {q.shape}, k of shape {k.shape}")
    with np.errstate(over="ignore", invalid="ignore"):  # checked in cast_grads
        dqu = dout @ k  # (..., H, T, D)  d(q + u) = dAC k
        dk = np.swapaxes(dout, -1, -2) @ (q + u[:, None, :])  # (..., H, S, D)  dk = dAC^T (q + u)
        dqv, dr, dv = _position_adjoint(q, r, v, dout)  # (b) + (d)
        dq = dqu + dqv
        du = head_sum(dqu)
    return cast_grads("q, k, r, u, v", q=(dq, q), k=(dk, k), r=(dr, r), u=(du, u), v=(dv, v))


def xl_position_logits_backward(q: ArrayLike, v: ArrayLike, w_r: ArrayLike, q_positions: ArrayLike,
                                k_positions: ArrayLike, dout: ArrayLike, *, base: float = 10000.0,
                                clamp_len: int | None = None):
    """Gradients of ``xl_position_logits`` (same arguments) for the output gradient dout (..., H, T, S).

    Returns (dq, dv, dw_r) of shapes (..., H, T, D), (H, D), (d_model, H*D). The forward projects
    the U distinct distances, r = split_heads(R_n W_R) (H, U, D), scores them, P = (q + v) r^T
    (..., H, T, U), and gathers out[..., t, s] = P[..., t, index[t, s]]. Backwards:

        dP[..., t, c] = sum over s with index[t, s] = c of dout[..., t, s]   (a gather's adjoint: scatter-add)
        d(q + v) = dP r  -> dq, and dv = its sum over ... and T
        dr = sum over ... of dP^T (q + v)                                    (H, U, D)
        dW_R = R_n^T merge_heads(dr)                                         (d_model, H*D)

    Pairs at the same distance (clamped ones included) sum into one row of dP's last axis. The
    scatter-add runs in float64.
    """
    q, v, w_r, table, index = distinct_distances(q, v, w_r, q_positions, k_positions, base, clamp_len)
    *lead, H, T, D = q.shape
    U = table.shape[0]
    dout = check_dout(dout, (*lead, H, T, index.shape[1]), f"q of shape {q.shape} and the positions")
    check_alloc((*lead, H, T, U), np.float64, "q_positions and k_positions (dout by distance)")
    dp = np.zeros((*lead, H, T, U))  # (..., H, T, U)
    np.add.at(dp, (..., np.arange(T)[:, None], index), dout)  # dP[.., t, index[t, s]] += dout[.., t, s]
    with np.errstate(over="ignore", invalid="ignore"):  # checked in cast_grads
        r = relative_heads(table, w_r, H)  # (H, U, D)  W_R R_n
        dqv = dp @ r  # (..., H, T, D)  d(q + v) = dP r
        dr = np.einsum("nhtu,nhtd->hud", _batch(dp), _batch(q + v[:, None, :]))  # (H, U, D)
        dw_r = table.T @ dr.transpose(1, 0, 2).reshape(U, H * D)  # (d_model, H*D)  R_n^T dr
        dv = head_sum(dqv)  # (H, D)
    return cast_grads("q, v, w_r", q=(dqv, q), v=(dv, v), w_r=(dw_r, w_r))


# --------------------------------------------------------------------------- the scheme the layer runs

class TransformerXL(Scheme):
    """Transformer-XL relative attention (Dai et al. 2019, §3.3).

    logits = [(q_i + u) . k_j + (q_i + v) . (R_{i-j} W_R)_h] / sqrt(D), with R the fixed sinusoidal
    table (split layout). Learned: ``u`` and ``v`` ``(H, D)`` (``r_w_bias``, ``r_r_bias``) and
    ``w_r`` ``(d_model, H*D)`` (``r_net.weight.T``).
    """

    name = "transformer-xl"
    seams = ("content-position",)
    sign_convention = (r"distance $i - j$, and $R$ is built at descending distances $S-1, \dots, 0$ "
                       r"(`pos_seq = arange(klen-1, -1, -1)`)",
                       r"Dai et al. 2019, §3.3; `rel_shift`, `xl_scores`")
    terms = TERMS

    def __init__(self, *, base: float = 10000.0):
        self.base = check_float(base, "base", positive=True)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        H, D, d = self.num_heads, self.head_dim, self.d_model
        self.u = (rng.standard_normal((H, D)) * 0.02).astype(layer.dtype)
        self.v = (rng.standard_normal((H, D)) * 0.02).astype(layer.dtype)
        self.w_r = (rng.standard_normal((d, H * D)) / np.sqrt(d)).astype(layer.dtype)

    def parameters(self):
        return {"u": self.u, "v": self.v, "w_r": self.w_r}

    def content_position(self, q, k, q_positions, k_positions, *, ops=None):
        """``ops``: ``None`` runs this module's ``xl_position_logits`` (and, in ``extra_backward``, its
        backward); the fast layer passes ``minipos.fast.transformer_xl``, which has the same names."""
        scale = self.scale(self.head_dim)
        position_logits = xl_position_logits if ops is None else ops.xl_position_logits

        def extra(qs, ks):  # terms (b) + (d) for one block: (q_i + v) . W_R R_{i-j}
            return scale * position_logits(q[..., qs, :], self.v, self.w_r, q_positions[qs], k_positions[ks],
                                           base=self.base)
        return q + self.u[:, None, :], extra  # terms (a) + (c): (q_i + u) . k_j

    def content_position_backward(self, dq_c, add):
        add("scheme.u", dq_c.sum(axis=(0, 2)))                               # q_c = q + u: du = sum dq_c
        return dq_c

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add, *, ops=None):
        scale = self.scale(self.head_dim)
        backward = xl_position_logits_backward if ops is None else ops.xl_position_logits_backward
        dq, dv, dw_r = backward(
            q[..., qs, :], self.v, self.w_r, q_positions[qs], k_positions[ks], scale * dlogits, base=self.base)
        add("scheme.v", dv)
        add("scheme.w_r", dw_r)
        return dq, 0.0

    def settings(self):  # the base of the fixed sinusoidal table R
        return (("base", self.base),)

    def __repr__(self) -> str:
        return "TransformerXL()"
