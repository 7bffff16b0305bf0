"""ALiBi's bias, fast: computed in the attention's dtype directly, and its bound per block.

``alibi_bias(..., dtype=np.float32)`` makes one product in float32 instead of a float64 pass and a
cast; ``alibi_bias_bound`` bounds a block's bias in ``O(T + S)``, which lets the blockwise kernel
skip heads whose far blocks underflow (``bias_max_fn`` of ``minipos.fast.blockwise_attention``).
"""

from __future__ import annotations

import numpy as np

from .. import alibi as reference
from .._checks import as_positions, check_alloc, check_bool, check_float_dtype, check_result

__all__ = ["alibi_bias", "alibi_bias_bound"]


def alibi_bias(slopes, q_positions, k_positions, *, symmetric: bool = False, dtype=None) -> np.ndarray:
    """``minipos.alibi.alibi_bias`` (same arguments, ``(H, T, S)``), computed in ``dtype``.

    ``dtype=None`` is the reference's result. With a floating ``dtype`` the distances ``j - i`` are
    exact integers in it (float32 holds every integer below 2^24), the slopes are rounded to it
    once and the product rounds once: for a power-of-two ``H`` (slopes ``2^(-8h/H)``) it equals
    ``reference.alibi_bias(...).astype(dtype)`` bit for bit, otherwise within one unit in the last place.
    """
    if dtype is None:
        return reference.alibi_bias(slopes, q_positions, k_positions, symmetric=symmetric)
    dtype = check_float_dtype(dtype)
    slopes = reference.check_slopes(slopes)
    symmetric = check_bool(symmetric, "symmetric")
    i = as_positions(q_positions, "q_positions")
    j = as_positions(k_positions, "k_positions")
    check_alloc((slopes.size, i.size, j.size), dtype, "alibi_bias(slopes, q_positions, k_positions)")
    if dtype.itemsize >= 4 and max(i.max(initial=0), j.max(initial=0)) < 2 ** np.finfo(dtype).nmant:
        rel = j.astype(dtype)[None, :] - i.astype(dtype)[:, None]  # j - i, (T, S): exact integers
    else:
        rel = (j[None, :] - i[:, None]).astype(dtype)              # j - i, rounded once
    if symmetric:
        rel = -np.abs(rel, out=rel)                                # -|i - j|
    with np.errstate(over="ignore", invalid="ignore"):
        m = slopes.astype(dtype)[:, None, None]                    # (H, 1, 1)
        bias = np.multiply(m, rel[None, :, :])                     # -m_h (i - j), (H, T, S)
    return check_result(bias, "slopes times the distances")


def alibi_bias_bound(slopes, q_positions, k_positions, *, symmetric: bool = False) -> np.ndarray:
    """An upper bound ``(H, 1, 1)`` (float64) of ``alibi_bias(...)`` over a block, in ``O(T + S)``.

    ``-m_h (i - j)`` is largest at the least ``i - j``, ``min(i) - max(j)``; ``-m_h |i - j|`` at
    the least distance, at least ``max(min(i) - max(j), min(j) - max(i), 0)`` (0 where the two
    ranges overlap, a bound rather than the maximum when positions skip). This is the
    ``bias_max_fn`` of ``blockwise_attention``, which then skips heads whose far blocks underflow.
    """
    slopes = reference.check_slopes(slopes)
    symmetric = check_bool(symmetric, "symmetric")
    i = as_positions(q_positions, "q_positions")
    j = as_positions(k_positions, "k_positions")
    if i.size == 0 or j.size == 0:
        return np.full((slopes.size, 1, 1), -np.inf)                      # an empty block: no bias at all
    least = int(i.min()) - int(j.max())
    if symmetric:
        least = max(least, int(j.min()) - int(i.max()), 0)
    with np.errstate(over="ignore", invalid="ignore"):
        bound = -slopes[:, None, None] * float(least)                  # (H, 1, 1)
    return check_result(bound, "slopes times the least distance")                       # (H, 1, 1)
