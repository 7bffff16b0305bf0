"""ALiBi: attention with linear biases (the bias seam).

Press, Smith & Lewis 2022, "Train Short, Test Long: Attention with Linear Biases Enables Input
Length Extrapolation", arXiv:2108.12409, §3. No position is added to the embeddings; each head
h adds a fixed, head-specific linear penalty to its causal attention logits:

    softmax(q_i K^T + m_h · [-(i - 1), …, -2, -1, 0])     (§3, keys j = 1 … i)

i.e. ``b_h(i, j) = -m_h (i - j)``. The slopes ``m_h`` are not learned. For H a power of two
they are the geometric sequence with first term and ratio ``2^(-8/H)``:
``m_h = 2^(-8h/H)``, ``h = 1 … H`` (8 heads: 1/2, 1/4, …, 1/256). Otherwise (the reference
``get_slopes`` in github.com/ofirpress/attention_with_linear_biases, also BLOOM's
``_get_alibi_slopes`` in HF transformers): take the slopes of the closest lower power of two
``P = 2^floor(log2 H)``, then every other slope (``[0::2]``) of the ``2P``-head sequence,
i.e. ``2^(-4k/P)`` for odd ``k``, keeping the first ``H - P``.

Conventions and pitfalls
------------------------
- Sign: ``alibi_bias`` returns ``-m_h (i - j)`` with ``i`` the query and ``j`` the key
  position; it penalises keys in the past and is *positive* for future keys ``j > i``, so it
  expects a causal mask. ``symmetric=True`` gives ``-m_h |i - j|``, a common bidirectional
  extension (not in the paper).
- The reference fairseq code and BLOOM add ``+m_h · j`` instead (``alibi_bias_key_only``): one
  ``(H, 1, S)`` row shared by every query. It differs from ``-m_h (i - j)`` by ``m_h i``, a
  constant along each row, so the attention weights agree (softmax is shift-invariant per
  row); they agree with the distance penalty ``-m_h |i - j|`` only under a causal mask.
- Slopes are computed as ``2^(-e)`` directly, in float64. The reference multiplies repeatedly
  (``start * ratio**i``) and differs in the last ulp (16 heads: 0.5000000000000001 there,
  0.5 here); BLOOM computes in float32.

Shapes: slopes ``(H,)``; positions ``(T,)`` / ``(S,)``; biases ``(H, T, S)``.

The scheme class the layer runs, ``ALiBi``, is at the bottom of this module.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_float_array, as_positions, check_alloc, check_bool, check_positive_int, check_result
from .seams import Scheme

__all__ = ["alibi_slopes", "alibi_bias", "alibi_bias_backward", "alibi_bias_key_only", "ALiBi"]


def alibi_slopes(num_heads: int) -> np.ndarray:
    """The per-head slopes ``m_h``, float64 ``(H,)``, by the paper's rule (any ``H >= 1``)."""
    H = check_positive_int(num_heads, "num_heads")
    check_alloc((H,), np.float64, "alibi_slopes(num_heads)", copies=4)
    P = 1 << (H.bit_length() - 1)                                # 2^floor(log2 H)
    exponents = np.concatenate([
        8.0 * np.arange(1, P + 1) / P,                           # m_h = 2^(-8h/P), h = 1 … P
        4.0 * np.arange(1, 2 * (H - P), 2) / P,                  # (2^(-8k/(2P)))[0::2], k odd
    ])
    return np.exp2(-exponents)                                   # (H,)


def check_slopes(slopes) -> np.ndarray:
    slopes = as_float_array(slopes, "slopes")
    if slopes.ndim != 1:
        raise ValueError(f"slopes must have shape (H,), got shape {slopes.shape}")
    return slopes


def alibi_bias(slopes: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *,
               symmetric: bool = False) -> np.ndarray:
    """The ALiBi bias ``b[h, t, s] = -m_h (i_t - j_s)`` (or ``-m_h |i_t - j_s|``), ``(H, T, S)``.

    slopes: ``(H,)``, finite (e.g. ``alibi_slopes(H)``). q_positions, k_positions: an int T / S
    (meaning ``arange``) or integer arrays ``(T,)`` / ``(S,)``; a cached step passes
    ``q_positions = arange(S - T, S)``. Without ``symmetric`` the bias is positive for future
    keys, so pair it with ``causal_mask``. Computed in float64; returned in the slopes' floating
    dtype (float32 slopes give float32, int slopes give float64).
    """
    slopes = check_slopes(slopes)
    symmetric = check_bool(symmetric, "symmetric")
    i = as_positions(q_positions, "q_positions")
    j = as_positions(k_positions, "k_positions")
    check_alloc((slopes.size, i.size, j.size), np.float64, "alibi_bias(slopes, q_positions, k_positions)")
    rel = j[None, :] - i[:, None]                                  # j - i, (T, S), exact ints
    if symmetric:
        rel = -np.abs(rel)                                         # -|i - j|
    m = slopes.astype(np.float64)[:, None, None]                   # (H, 1, 1)
    with np.errstate(over="ignore"):
        bias = (m * rel[None, :, :]).astype(slopes.dtype, copy=False)  # -m_h (i - j), (H, T, S)
    return check_result(bias, "slopes times the distances")


def alibi_bias_backward(dbias: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *,
                        symmetric: bool = False) -> np.ndarray:
    """The gradient of the slopes for the bias gradient ``dbias`` ``(..., H, T, S)``: ``(H,)``.

    ALiBi's slopes are fixed in the paper; a variant that learns them (per head) gets this
    gradient: the bias is ``m_h r_ts`` with ``r = j - i`` (or ``-|i - j|``), so
    ``dm_h = sum_{t, s} dbias[..., h, t, s] r_ts``, leading dims summed too.
    """
    dbias = as_float_array(dbias, "dbias")
    symmetric = check_bool(symmetric, "symmetric")
    i = as_positions(q_positions, "q_positions")
    j = as_positions(k_positions, "k_positions")
    if dbias.ndim < 3 or dbias.shape[-2:] != (i.size, j.size):
        raise ValueError(f"dbias must have shape (..., H, T, S) with T = len(q_positions) = {i.size} and "
                         f"S = len(k_positions) = {j.size}, got {dbias.shape}")
    rel = (j[None, :] - i[:, None]).astype(np.float64)            # j - i, (T, S)
    if symmetric:
        rel = -np.abs(rel)                                         # -|i - j|
    with np.errstate(over="ignore", invalid="ignore"):
        per_head = dbias.sum(axis=tuple(range(dbias.ndim - 3)))   # (H, T, S): leading dims summed
        dslopes = np.einsum("hts,ts->h", per_head, rel)            # sum_ts dbias r
    return check_result(dslopes, "the slopes' gradient for this dbias").astype(dbias.dtype, copy=False)


def alibi_bias_key_only(slopes: ArrayLike, k_positions: ArrayLike) -> np.ndarray:
    """The ``+m_h · j`` form of fairseq's ALiBi and BLOOM's ``build_alibi_tensor``: ``(H, 1, S)``.

    Not equal to ``alibi_bias`` as logits: it lacks the per-row constant ``-m_h i``. After a
    softmax over keys the two agree row by row (``softmax(x + c) = softmax(x)``), with or
    without a mask; and both equal the distance penalty ``-m_h |i - j|``
    (``alibi_bias(..., symmetric=True)``) only under a causal mask, because for ``j > i`` they
    reward distance instead of penalising it. So: use it only in causal attention. BLOOM passes
    ``k_positions = cumsum(attention_mask) - 1`` (positions counting real tokens only). In
    low precision the shift is no longer exact: ``m_h j`` grows with ``S``.
    """
    slopes = check_slopes(slopes)
    j = as_positions(k_positions, "k_positions")
    m = slopes.astype(np.float64)[:, None, None]                        # (H, 1, 1)
    with np.errstate(over="ignore"):
        bias = (m * j[None, None, :]).astype(slopes.dtype, copy=False)  # +m_h j, (H, 1, S)
    return check_result(bias, "slopes times the key positions")


# --------------------------------------------------------------------------- the scheme the layer runs

class ALiBi(Scheme):
    """Linear biases (Press et al. 2022): ``-m_h |i - j|`` by default, ``-m_h (i - j)`` with ``symmetric=False``.

    The two agree on every entry a causal mask keeps, so the default is the paper's bias under
    ``causal=True`` and the usual bidirectional variant without it. ``symmetric=False`` gives the
    raw ``-m_h (i - j)``, which rewards future keys unless they are masked. ``slopes`` ``(H,)`` are
    fixed (``alibi_slopes``), not learned.
    """

    name = "alibi"
    seams = ("bias",)
    sign_convention = (r"bias $-m_h (i - j)$: penalises keys in the past; `symmetric=True` gives $-m_h "
                       r"\lvert i - j \rvert$ (the layer's `ALiBi()` default: equal on every entry a "
                       r"causal mask keeps); BLOOM / fairseq's key-only form adds $+m_h j$",
                       r"Press et al. 2022, §3; `alibi_bias`, `alibi_bias_key_only`")
    terms = ("content-content", "position-position")

    def __init__(self, *, symmetric: bool = True):
        self.symmetric = check_bool(symmetric, "symmetric")

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.slopes = alibi_slopes(self.num_heads)  # (H,), fixed, not learned

    def bias(self, q_positions, k_positions):
        return alibi_bias(self.slopes, q_positions, k_positions, symmetric=self.symmetric)  # (H, T, S)

    def settings(self):  # the slopes are fixed arrays (of num_heads, by the paper's rule), like weights
        return (("symmetric", self.symmetric),)

    def __repr__(self) -> str:
        return f"ALiBi(symmetric={self.symmetric})"
