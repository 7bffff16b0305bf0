"""T5 relative position buckets and the per-head scalar bias they index.

Source: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified
Text-to-Text Transformer", arXiv:1910.10683, Section 2.1; the bucket function is mesh-tensorflow's
``_relative_position_bucket`` (``mesh_tensorflow/transformer/transformer_layers.py``), copied by
transformers as ``T5Attention._relative_position_bucket``.

The scheme (bias seam)
----------------------
Each head h owns a learned scalar per bucket, ``table[bucket, h]`` (transformers:
``relative_attention_bias.weight``, shape ``(K, H)``). The logit of query i and key j is

    s_ij = q_i . k_j + table[bucket(j - i), h]          (no 1/sqrt(D): T5 uses scale 1.0)

T5 does not divide by sqrt(D); the factor is folded into the initialisation of ``W_q`` instead.
Only the first layer of a stack owns a table; it computes the ``(H, T, S)`` bias once and every
later layer of the stack reuses it (the paper: the position parameters are shared across layers,
each head has its own). Encoder and decoder stacks have separate tables; cross-attention has none.

Buckets
-------
Sign convention: ``n = key - query`` (``memory_position - context_position``), so ``n > 0`` means
the key comes after the query. With ``K = num_buckets`` and ``M = max_distance``:

- bidirectional (encoder): ``P = K // 2`` buckets per direction; keys after the query
  (``n > 0``) get the offset ``P``, so ``bucket = P * [n > 0] + b(|n|)``. Bucket ``P`` (``n = +0``)
  is never used, and with an odd ``K`` neither is bucket ``K - 1``.
- causal (decoder): ``P = K`` and ``bucket = b(max(-n, 0))``; every future key lands in bucket 0,
  together with ``n = 0``.

With ``E = P // 2`` (``max_exact``), for a distance ``m >= 0``:

    b(m) = m                                                    if m < E
    b(m) = min(P - 1, E + floor(ln(m / E) / ln(M / E) * (P - E)))    otherwise

Half the buckets of a direction hold one distance each; the other half cover ``[E, M)`` in
geometrically growing ranges, and everything at or beyond the first distance of the last bucket
shares it. For the T5 default (K = 32, M = 128, bidirectional: P = 16, E = 8) bucket ``8 + k``
starts at ``ceil(8 * 16^(k / 8))``: 8, 12, 16, 23, 32, 46, 64, 91. The last bucket starts at
``|n| = 91``, not 128 (see ``first_distance_of_bucket``).

Float32 and the ``exact`` keyword
---------------------------------
The reference computes the log branch in float32 (``torch.log(n.float() / E) / math.log(M / E)
* (P - E)``, then truncation), so near a bucket boundary its bucket can differ by one from the
real-number formula above. minipos never evaluates a log per distance. Since ``b`` is
non-decreasing, it is fixed by the first distance of each bucket; this table of ``P`` integers is
computed once per configuration and every distance is bucketed by ``np.searchsorted``:

- ``exact=True``: the real-number thresholds, found in integer arithmetic:
  ``b(m) >= E + k  <=>  m**(P - E) * E**k >= M**k * E**(P - E)``.
- ``exact=False`` (default, the reference): the thresholds of the float32 formula, found by
  bisection on ``[E, M]`` with IEEE float32 ``/`` and ``*`` and a correctly rounded float32 log.

At the standard configurations the two tables are identical and equal to the reference; the
configurations where they differ, and why, are on the docs page (T5 relative buckets, porting notes).

The scheme class the layer runs, ``T5Bias``, is at the bottom of this module.
"""

from __future__ import annotations

import functools
import math

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_float_array, as_positions, check_alloc, check_bool, check_int, check_result
from .seams import Scheme

__all__ = [
    "relative_position_bucket",
    "first_distance_of_bucket",
    "t5_bias",
    "t5_bias_backward",
    "T5Bias",
]


def check_bucket_config(bidirectional, num_buckets, max_distance) -> tuple[int, int]:
    """Validate a bucket configuration; return ``(P, M)``: buckets per direction, max distance."""
    if not isinstance(bidirectional, (bool, np.bool_)):
        raise TypeError(f"bidirectional must be a bool, got {type(bidirectional).__name__}")
    num_buckets = check_int(num_buckets, "num_buckets", minimum=2)
    max_distance = check_int(max_distance, "max_distance", minimum=1)
    if max_distance > 2 ** 62 or num_buckets > 2 ** 31:
        raise ValueError(f"max_distance must be <= 2**62 and num_buckets <= 2**31, got max_distance={max_distance}, "
                         f"num_buckets={num_buckets}")
    if bidirectional and num_buckets < 4:
        raise ValueError(f"num_buckets must be >= 4 when bidirectional (2 per direction), got {num_buckets}")
    per_dir = num_buckets // 2 if bidirectional else num_buckets
    check_alloc((per_dir,), np.int64, "num_buckets (the first distance of each bucket)", copies=8)
    max_exact = per_dir // 2
    if max_distance <= max_exact:
        rule = "num_buckets // 4" if bidirectional else "num_buckets // 2"
        raise ValueError(
            f"max_distance must be > max_exact = {rule} = {max_exact} (else the log buckets are "
            f"empty or reversed), got max_distance={max_distance}"
        )
    return per_dir, max_distance


def _float32_x(n: np.ndarray, per_dir: int, max_distance: int) -> np.ndarray:
    """The reference's log branch before truncation, in IEEE float32.  n: int64 ``(N,)``, n >= E."""
    E = per_dir // 2
    ratio = n.astype(np.float32) / np.float32(E)                       # n.float() / max_exact
    log_ratio = np.log(ratio.astype(np.float64)).astype(np.float32)   # float32 log, correctly rounded
    return log_ratio / np.float32(math.log(max_distance / E)) * np.float32(per_dir - E)


def _float32_thresholds(per_dir: int, max_distance: int) -> list[int]:
    """First n of each log bucket E+1 … P-1 under the float32 formula, by bisection on [E, M]."""
    E = per_dir // 2
    bucket = np.arange(E + 1, per_dir)                    # (P - E - 1,)
    lo = np.full(bucket.shape, E, dtype=np.int64)         # invariant: b(lo) < bucket <= b(hi)
    hi = np.full(bucket.shape, max_distance, dtype=np.int64)
    while np.any(hi - lo > 1):                            # ~log2(M) steps, all buckets at once
        mid = (lo + hi) // 2
        reached = E + _float32_x(mid, per_dir, max_distance).astype(np.int64) >= bucket
        hi, lo = np.where(reached, mid, hi), np.where(reached, lo, mid)
    return hi.tolist()


def _exact_thresholds(per_dir: int, max_distance: int) -> list[int]:
    """First n of each log bucket E+1 … P-1 under real arithmetic.

    ``b(n) >= E + k`` iff ``n**W >= M**k * E**(W - k)`` (W = P - E). The logarithm of the
    real-number boundary, ``E (M/E)^(k/W)``, puts each search within a step or two of its answer;
    each step compares the two sides by their logarithms, and in exact integers only where the
    logarithms are too close to tell (so the cost is linear in the number of buckets).
    """
    E, width = per_dir // 2, per_dir - per_dir // 2
    ln_M, ln_E = math.log(max_distance), math.log(E)

    def reached(n: int, k: int) -> bool:                   # n**W >= M**k * E**(W - k)
        gap = width * math.log(n) - (k * ln_M + (width - k) * ln_E)
        if abs(gap) > 1e-12 * (width * math.log(max_distance) + 1.0):    # far beyond the rounding of the logs
            return gap > 0
        return n ** width >= max_distance ** k * E ** (width - k)

    first = []
    for k in range(1, width):                              # a loop over buckets, not distances
        n = min(max_distance, max(E + 1, math.ceil(E * math.exp(k / width * (ln_M - ln_E)))))
        while n > E + 1 and reached(n - 1, k):
            n -= 1
        while not reached(n, k):
            n += 1
        first.append(n)
    return first


@functools.lru_cache(maxsize=128)
def _first_distances(per_dir: int, max_distance: int, exact: bool) -> np.ndarray:
    """``first[b]`` = the smallest m >= 0 with ``b(m) >= b``, for b = 0 … P-1 (non-decreasing)."""
    E = per_dir // 2
    log_part = (_exact_thresholds if exact else _float32_thresholds)(per_dir, max_distance)
    first = np.array(list(range(E + 1)) + log_part, dtype=np.int64)   # b(m) = m below E
    first.setflags(write=False)
    return first


def relative_position_bucket(relative_position: ArrayLike, *, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128, exact: bool = False) -> np.ndarray:
    """T5's bucket of each relative position ``n = key - query``.

    relative_position: int or integer array of any shape (float arrays must hold integers).
    Returns int64 buckets in ``[0, num_buckets)``, same shape (an int gives a 0-d array).
    ``exact=False`` reproduces the float32 reference; ``exact=True`` gives the real-number
    buckets (module docstring). Every distance is bucketed with one ``searchsorted``.
    """
    per_dir, max_distance = check_bucket_config(bidirectional, num_buckets, max_distance)
    exact = check_bool(exact, "exact")
    n = as_positions(np.asarray(relative_position), "relative_position", allow_negative=True, ndim=None)
    n = np.clip(n, -max_distance, max_distance)           # |n| >= M is in the last bucket anyway
    if bidirectional:
        offset, m = np.where(n > 0, per_dir, 0), np.abs(n)  # keys after the query: + P
    else:
        offset, m = 0, np.maximum(-n, 0)                    # future keys -> distance 0
    first = _first_distances(per_dir, max_distance, bool(exact))
    return np.asarray(offset + np.searchsorted(first, m, side="right") - 1, dtype=np.int64)


def first_distance_of_bucket(*, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128, exact: bool = False) -> np.ndarray:
    """The smallest ``|n|`` (``n = key - query``) landing in each bucket; -1 for an unused bucket.

    Returns int64 ``(K,)``. Bidirectional buckets ``0 … K//2 - 1`` hold ``n <= 0`` (key at or
    before the query) and ``K//2 …`` hold ``n > 0``; causal buckets hold ``n <= 0`` only.
    """
    per_dir, max_distance = check_bucket_config(bidirectional, num_buckets, max_distance)
    first = _first_distances(per_dir, max_distance, bool(exact))          # (P,)
    used = np.append(first[:-1] < first[1:], True)                        # skipped log buckets
    out = np.full(num_buckets, -1, dtype=np.int64)
    out[:per_dir] = np.where(used, first, -1)
    if bidirectional:
        out[per_dir:2 * per_dir] = np.where(used & (first > 0), first, -1)  # no n = +0
    return out


def check_table(table, num_buckets) -> np.ndarray:
    table = as_float_array(table, "table")
    if table.ndim != 2 or table.shape[0] != num_buckets:
        raise ValueError(
            f"table must have shape (num_buckets, H) = ({num_buckets}, H), got shape {table.shape}"
        )
    return table


def t5_bias(table: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *, bidirectional: bool = True,
            num_buckets: int = 32, max_distance: int = 128, exact: bool = False) -> np.ndarray:
    """The T5 bias ``(H, T, S)``: ``out[h, t, s] = table[bucket(k_s - q_t), h]``.

    table: ``(K, H)`` float (T5's ``relative_attention_bias.weight``); the result keeps its dtype.
    q_positions: ``(T,)`` or an int T; k_positions: ``(S,)`` or an int S (non-negative integers).
    As the reference computes it: bucket every (t, s) pair, look the buckets up, heads first.
    """
    check_bucket_config(bidirectional, num_buckets, max_distance)
    table = check_table(table, num_buckets)
    q = as_positions(q_positions, "q_positions")
    k = as_positions(k_positions, "k_positions")
    check_alloc((table.shape[1], q.size, k.size), table.dtype, "t5_bias(table, q_positions, k_positions)")
    relative = k[None, :] - q[:, None]                                  # (T, S): memory - context
    buckets = relative_position_bucket(relative, bidirectional=bidirectional, num_buckets=num_buckets,
                                       max_distance=max_distance, exact=exact)   # (T, S)
    return np.ascontiguousarray(np.moveaxis(table[buckets], -1, 0))     # (T, S, H) -> (H, T, S)


def t5_bias_backward(dbias: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike, *, bidirectional: bool = True,
                     num_buckets: int = 32, max_distance: int = 128, exact: bool = False) -> np.ndarray:
    """The gradient of the table for the bias gradient ``dbias`` ``(..., H, T, S)``: ``dtable (K, H)``.

    ``t5_bias`` copies ``table[bucket(k_s - q_t), h]`` to every pair, so the table's gradient is the
    sum of ``dbias`` over the pairs in each bucket (proved in ``proofs.gradients``):

        dtable[b, h] = sum_{(t, s): bucket(k_s - q_t) = b} dbias[..., h, t, s]

    Leading dims (a batch) are summed too. Same keywords as ``t5_bias``.
    """
    dbias = as_float_array(dbias, "dbias")
    q = as_positions(q_positions, "q_positions")
    k = as_positions(k_positions, "k_positions")
    if dbias.ndim < 3 or dbias.shape[-2:] != (q.size, k.size):
        raise ValueError(f"dbias must have shape (..., H, T, S) with T = len(q_positions) = {q.size} and "
                         f"S = len(k_positions) = {k.size}, got {dbias.shape}")
    with np.errstate(over="ignore", invalid="ignore"):
        per_pair = dbias.sum(axis=tuple(range(dbias.ndim - 3))).astype(np.float64)   # (H, T, S): the batch summed
    buckets = relative_position_bucket(k[None, :] - q[:, None], bidirectional=bidirectional,
                                       num_buckets=num_buckets, max_distance=max_distance, exact=exact)  # (T, S)
    dtable = np.stack([np.bincount(buckets.ravel(), weights=g.ravel(), minlength=num_buckets)
                       for g in per_pair] or [np.zeros(num_buckets)], axis=-1)[:, :per_pair.shape[0]]  # (K, H)
    return check_result(dtable, "the table's gradient for this dbias").astype(dbias.dtype, copy=False)


# --------------------------------------------------------------------------- the scheme the layer runs

class T5Bias(Scheme):
    """T5's learned per-head bias over log-spaced relative-distance buckets (Raffel et al. 2020).

    ``table`` ``(num_buckets, H)`` is layer 0's ``relative_attention_bias.weight`` (T5 shares it
    across layers). T5 does not scale ``q . k`` by ``1/sqrt(D)``: ``scale`` is 1. Use
    ``bidirectional=True`` for the encoder, ``False`` for the decoder's self-attention.
    """

    name = "t5"
    seams = ("bias",)
    sign_convention = (r"`relative_position = key - query` ($j - i$), positive for keys after the query",
                       r"mesh-tensorflow / HF `_relative_position_bucket` (`memory_position - "
                       r"context_position`)")
    terms = ("content-content", "position-position")

    def __init__(self, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        relative_position_bucket(0, bidirectional=self.bidirectional, num_buckets=num_buckets,
                                    max_distance=max_distance)  # validates the configuration now

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.table = rng.standard_normal((self.num_buckets, self.num_heads)).astype(layer.dtype)

    def parameters(self):
        return {"table": self.table}

    def bias(self, q_positions, k_positions):
        return t5_bias(self.table, q_positions, k_positions, bidirectional=self.bidirectional,
                          num_buckets=self.num_buckets, max_distance=self.max_distance)

    def bias_backward(self, q_positions, k_positions, dbias):
        return {"scheme.table": t5_bias_backward(dbias, q_positions, k_positions, bidirectional=self.bidirectional,
                                                    num_buckets=self.num_buckets, max_distance=self.max_distance)}

    def scale(self, head_dim):
        return 1.0

    def settings(self):
        return (("num_buckets", self.num_buckets), ("max_distance", self.max_distance),
                ("bidirectional", self.bidirectional))

    def __repr__(self) -> str:
        return (f"T5Bias(num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional})")
