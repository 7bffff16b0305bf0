"""DeBERTa disentangled attention: content-to-content, content-to-position, position-to-content.

Source: He, Liu, Gao, Chen 2021, "DeBERTa: Decoding-enhanced BERT with Disentangled Attention",
arXiv:2006.03654, section 3.1, Eq. 2-4; v2/v3 log buckets and shared projections from the
reference code (microsoft/DeBERTa ``deberta/da_utils.py``, ``disentangled_attention.py``) and
HF transformers ``models/deberta_v2/modeling_deberta_v2.py`` (``make_log_bucket_position``,
``build_relative_position``, ``DisentangledSelfAttention.disentangled_attention_bias``).

The paper writes each token as a content vector H_i and a relative position, and keeps three of
the four terms of ``{H_i, P_i|j} . {H_j, P_j|i}`` (Eq. 2):

    Q^c = H W_q,c   K^c = H W_k,c   Q^r = P W_q,r   K^r = P W_k,r             (Eq. 4)
    A~_ij = Q^c_i . K^c_j  +  Q^c_i . K^r_delta(i,j)  +  K^c_j . Q^r_delta(j,i)   (Eq. 4)
    H_o = softmax(A~ / sqrt(3 D)) V                                              (Eq. 4)
    delta(i, j) = 0 if i - j <= -k;  2k - 1 if i - j >= k;  i - j + k otherwise  (Eq. 3)

so ``delta(i, j) = clip(i - j + k, 0, 2k - 1)`` indexes a table P of ``2k`` relative embeddings,
``k = att_span``. The scale is ``sqrt(D * (1 + number of position terms))``: sqrt(3D) with
c2p and p2c, sqrt(2D) with one of them (the code counts ``pos_att_type``).

All encoder layers are relative: nothing absolute is added to the token embeddings of v2/v3
(``position_biased_input=False``). Absolute positions enter only the enhanced mask decoder used
in pre-training (a weight-shared extra pass whose query adds absolute position embeddings).

Sign convention
---------------
``build_relative_position`` gives ``relative_pos[i, j] = query_i - key_j`` (``q_ids[:, None] -
k_ids[None, :]``), log-bucketed in v2/v3. c2p reads row ``clip(relative_pos[i, j] + k, 0,
2k - 1)`` of the key-projected table, as in the paper.

The p2c index: code versus paper
--------------------------------
The reference code (identical in microsoft/DeBERTa and HF ``disentangled_attention_bias``) is::

    p2c_pos = torch.clamp(-r_pos + att_span, 0, att_span * 2 - 1)
    p2c_att = torch.bmm(key_layer, pos_query_layer.transpose(-1, -2))
    p2c_att = torch.gather(p2c_att, dim=-1, index=p2c_pos...).transpose(-1, -2)

Before the transpose, entry (j, i) uses ``-r_pos[j, i] = -(j - i) = i - j``; buckets are odd
(``sign`` is kept), so this is ``relative_pos[i, j]`` in bucketed form too. Hence the code's p2c is
``K^c_j . Q^r[clip(relative_pos[i, j] + k)]`` = ``K^c_j . Q^r_delta(i,j)``: the same index as c2p,
whereas Eq. 4 writes ``delta(j, i) = clip(j - i + k)``. The two differ whenever ``i != j``.
minipos follows the code (trained checkpoints were trained with it); the definitional form offers
the paper's index as ``p2c_convention="paper"``.

v2/v3 configuration mapping (HF ``DebertaV2Config`` / microsoft ``config.json``)
--------------------------------------------------------------------------------
- ``bucket_size = position_buckets`` (256 in v3; -1 means no buckets).
- ``max_position = max_relative_positions``, and ``-1`` (or any value < 1) means
  ``max_position_embeddings`` (512).
- ``att_span = position_buckets if position_buckets > 0 else max_relative_positions``
  (HF ``pos_ebd_size``); see :func:`spans_from_config`.
- ``rel_embeddings``: a learned ``(2 * att_span, d_model)`` table, passed through the encoder's
  LayerNorm when ``norm_rel_ebd`` contains ``"layer_norm"`` (v3: ``"layer_norm"``), shared by
  all layers.
- ``share_att_key=True`` (v2/v3): ``pos_key = rel_embeddings @ W_k + b_k`` and ``pos_query =
  rel_embeddings @ W_q + b_q`` with the layer's own key / query projections (biases included),
  split into heads ``(H, 2 * att_span, D)``. Without it, separate ``pos_key_proj`` /
  ``pos_query_proj`` (v1: ``pos_proj`` without bias, ``pos_q_proj`` with bias).
- v1 takes ``att_span = min(max(T, S), max_relative_positions)`` and the central rows
  ``[max_rel - att_span, max_rel + att_span)`` of its table; for unbucketed ``|i - j| < max(T, S)``
  this selects the same rows as ``att_span = max_relative_positions`` on the full table.

Queries of a cached step start at the cache length: :func:`relative_positions` takes explicit
positions, and every function here applies the same per-pair formula for any ``T`` and ``S``.
The references are exercised with ``T == S`` only: HF's ``T != S`` branch (``build_rpos``) passes
its bucket arguments swapped and yields an ``(S, S)`` p2c term; microsoft's selects p2c rows by
``relative_pos[:, 0]``, which is the query position only without buckets.

Gradients: ``c2p_term_backward``, ``p2c_term_backward`` and ``disentangled_scores_backward`` take
their forward's arguments plus the output gradient ``dout`` and return the input gradients, each
in its input's dtype. The adjoint of each gather is a scatter-add: every pair (i, j) that reads
row ``delta`` of a relative table adds its gradient to that row, so clipped and bucketed
distances that share a row sum there.

Errors name the argument the caller passed: :func:`spans_from_config` checks a configuration
under its config keys (``position_buckets``, ``max_relative_positions``,
``max_position_embeddings``), so a bad config is reported there and not as the ``bucket_size``
or ``max_position`` it turns into. ``att_span`` is at most ``2**62`` (the index ``2 att_span - 1``
must fit int64); relative positions are int64 and never wrap; shapes that do not match name
both arrays; scores that overflow the floating dtype raise instead of returning inf.

The scheme class the layer runs, ``DeBERTa``, is at the bottom of this module.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (
    cast_grad,
    check_dout,
    check_overflow,
    as_float_array,
    as_positions,
    check_alloc,
    check_choice,
    check_int,
    check_positive_int,
    float_dtype,
)
from .seams import Scheme

__all__ = [
    "make_log_bucket_position",
    "relative_positions",
    "build_relative_position",
    "spans_from_config",
    "relative_index",
    "c2p_term",
    "p2c_term",
    "disentangled_scores",
    "disentangled_scores_definitional",
    "c2p_term_backward",
    "p2c_term_backward",
    "disentangled_scores_backward",
    "DeBERTa",
]

_POS_ATT_TYPES = ("c2p", "p2c")
MAX_SPAN = 2 ** 62
"""Largest ``att_span``: the index ``2 att_span - 1`` (and ``relative_pos + att_span``) fit int64."""


def _as_int_array(relative_pos) -> np.ndarray:
    """``relative_pos`` (any shape, a scalar included) as int64, or raise naming it."""
    return as_positions(np.asarray(relative_pos), "relative_pos", allow_negative=True, ndim=None)


def _check_buckets(bucket_size, max_position, names=("bucket_size", "max_position"),
                   note: str = "") -> tuple[int, int]:
    """``(bucket_size, max_position)`` of a log-bucket config; ``names`` are the caller's names."""
    b_name, m_name = names
    bucket_size = check_int(bucket_size, b_name, minimum=2)
    mid = bucket_size // 2
    max_position = check_int(max_position, m_name)
    if max_position - 1 <= mid:
        raise ValueError(
            f"{m_name} must be > {b_name} // 2 + 1 = {mid + 1} (else the log scale "
            f"log(({m_name} - 1) / ({b_name} // 2)) is not positive), got {max_position}{note}"
        )
    if max_position >= 2 ** 63:
        raise ValueError(f"{m_name} must be < 2**63 (no int64 distance reaches it), got {max_position}")
    return bucket_size, max_position


def _check_span(att_span, name: str = "att_span") -> int:
    """``att_span`` as an int in [1, 2**62] (the rows of a ``(2 att_span, ...)`` table)."""
    att_span = check_positive_int(att_span, name)
    if att_span > MAX_SPAN:
        raise ValueError(f"{name} must be <= 2**62 (the index 2 * att_span - 1 must fit int64), got {att_span}")
    return att_span


def make_log_bucket_position(relative_pos: ArrayLike, bucket_size: int, max_position: int, *,
                             precision: str = "float32") -> np.ndarray:
    """Log buckets of DeBERTa v2/v3: exact for ``|r| <= bucket_size // 2``, logarithmic beyond.

    With ``mid = bucket_size // 2``, ``r`` is kept where ``|r| <= mid`` (the code's
    ``abs_pos <= mid``), and beyond it becomes

        sign(r) * (ceil(log(|r| / mid) / log((max_position - 1) / mid) * (mid - 1)) + mid)

    which is ``+-mid`` at ``|r| = mid`` and ``+-(2 mid - 1)`` at ``|r| = max_position - 1``; it is
    not clipped, so larger ``|r|`` give larger buckets (the attention index clips them).
    For 256 / 512 the map is the identity up to |r| = 131 and first merges 131 and 132.

    ``precision="float32"`` (default) reproduces HF transformers, whose torch code runs in float32:
    the log is taken in float64 and rounded to float32, then divided, scaled and ceiled in
    float32. This equals transformers 5.24.0 for every ``|r| <= 10^5`` (checked over ``|r| <= 10^6``
    for 256 / 512 and nine other configs); far beyond (first at |r| = 403269 for 256 / 512) torch's
    float32 log, which is not correctly rounded, can move a bucket by one. NumPy's own float32
    log differs from torch's more often, so it is not used.

    ``precision="float64"`` reproduces microsoft/DeBERTa ``da_utils.py`` (NumPy, float64). For
    256 / 512 it differs from float32 within 10^5 only at |r| = 65317, 83928, 92579 (700 vs 701,
    723 vs 724, 732 vs 733), all far beyond |bucket| = att_span where the attention index clips.

    relative_pos: integer array, any shape. Returns int64, same shape.
    """
    r = _as_int_array(relative_pos)
    if r.size and int(r.min()) == np.iinfo(np.int64).min:
        raise ValueError("relative_pos must lie within +-(2**63 - 1), got -2**63, whose magnitude int64 cannot hold")
    bucket_size, max_position = _check_buckets(bucket_size, max_position)
    check_choice(precision, "precision", ("float32", "float64"))
    f = np.float32 if precision == "float32" else np.float64
    mid = bucket_size // 2
    abs_pos = np.maximum(np.abs(r), mid)                      # the code puts mid - 1 where unused
    ratio = abs_pos.astype(f) / f(mid)
    log_ratio = np.log(ratio.astype(np.float64)).astype(f)   # log(|r| / mid), rounded to f
    log_scale = f(np.log(np.float64(f((max_position - 1) / mid))))
    log_pos = np.ceil(log_ratio / log_scale * f(mid - 1)) + f(mid)
    return np.where(np.abs(r) <= mid, r, np.sign(r) * log_pos.astype(np.int64))


def relative_positions(q_positions: ArrayLike, k_positions: ArrayLike, *, bucket_size: int = -1, max_position: int = -1,
                       precision: str = "float32") -> np.ndarray:
    """``relative_pos[i, j] = q_positions[i] - k_positions[j]``, log-bucketed when both
    ``bucket_size > 0`` and ``max_position > 0`` (as in the reference).

    q_positions: ``(T,)`` ints or an int T; k_positions: ``(S,)`` ints or an int S.
    Returns int64 ``(T, S)``. A cached step passes ``q_positions = arange(P, P + T)``.
    """
    bucket_size = check_int(bucket_size, "bucket_size")
    max_position = check_int(max_position, "max_position")
    T, S = _count(q_positions), _count(k_positions)
    if T is not None and S is not None:  # the output fits, before an int n builds arange(n)
        check_alloc((T, S), np.int64, "q_positions and k_positions")
    q = as_positions(q_positions, "q_positions")
    k = as_positions(k_positions, "k_positions")
    check_alloc((q.shape[0], k.shape[0]), np.int64, "q_positions and k_positions")
    rel = q[:, None] - k[None, :]  # (T, S), both >= 0: no int64 overflow
    if bucket_size > 0 and max_position > 0:
        rel = make_log_bucket_position(rel, bucket_size, max_position, precision=precision)
    return rel


def build_relative_position(q_len: int, k_len: int, *, bucket_size: int = -1,
                            max_position: int = -1, precision: str = "float32") -> np.ndarray:
    """The reference's ``build_relative_position``: queries ``0..T-1``, keys ``0..S-1``.

    Returns int64 ``(T, S)`` with entry ``i - j`` (bucketed when both sizes are > 0).
    The reference returns ``(1, T, S)``; the leading 1 is dropped here.
    """
    T = check_int(q_len, "q_len", minimum=0)
    S = check_int(k_len, "k_len", minimum=0)
    check_alloc((T, S), np.int64, "q_len and k_len")
    return relative_positions(T, S, bucket_size=bucket_size, max_position=max_position,
                              precision=precision)


def _count(positions) -> int | None:
    """The number of positions without building them: n for an int n, the length of a 1-D list or
    array, None where ``as_positions`` will raise anyway."""
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        return int(positions) if positions >= 0 else None
    return np.shape(positions)[0] if np.ndim(positions) == 1 else None


def spans_from_config(*, position_buckets: int = -1, max_relative_positions: int = -1,
                      max_position_embeddings: int = 512) -> tuple[int, int, int]:
    """``(bucket_size, max_position, att_span)`` from DeBERTa v2/v3 config fields.

    ``max_relative_positions < 1`` means ``max_position_embeddings``; ``att_span`` is
    ``position_buckets`` when it is > 0, else ``max_relative_positions``. The relative table
    ``rel_embeddings`` has ``2 * att_span`` rows. v3: ``(256, 512, 256)``.

    ``position_buckets < 1`` means no buckets; otherwise it must be >= 2 with ``max_relative_positions``
    (or the ``max_position_embeddings`` it falls back to) > ``position_buckets // 2 + 1``, and
    ``att_span <= 2**62``. Errors name these config keys, not the arguments they become.
    """
    buckets = check_int(position_buckets, "position_buckets")
    max_rel = check_int(max_relative_positions, "max_relative_positions")
    max_emb = check_positive_int(max_position_embeddings, "max_position_embeddings")
    max_key = "max_relative_positions"
    if max_rel < 1:
        max_rel, max_key = max_emb, "max_position_embeddings"  # HF: max_relative_positions < 1 falls back
    if buckets > 0:
        if buckets < 2:
            raise ValueError(f"position_buckets must be >= 2, or < 1 for no buckets, got {buckets}")
        _check_buckets(buckets, max_rel, ("position_buckets", max_key),
                       "" if max_key == "max_relative_positions" else " (used since max_relative_positions < 1)")
        return buckets, max_rel, _check_span(buckets, "position_buckets")
    return buckets, max_rel, _check_span(max_rel, max_key)


def relative_index(relative_pos: ArrayLike, att_span: int) -> np.ndarray:
    """The paper's delta (Eq. 3): ``clip(relative_pos + att_span, 0, 2 * att_span - 1)``.

    relative_pos: integer array, any shape (``i - j``, possibly bucketed). Returns int64.
    Computed as ``clip(relative_pos, -k, k - 1) + k``, equal and free of int64 overflow.
    """
    k = _check_span(att_span)
    r = _as_int_array(relative_pos)
    return np.clip(r, -k, k - 1) + k  # delta(i, j) = clip(r + k, 0, 2k - 1), Eq. 3


def _check_pos_table(table, name: str, att_span: int, heads: int, dim: int, content) -> np.ndarray:
    """A relative table ``(H, 2 * att_span, D)``, H and D read off ``content`` (q or k)."""
    table = as_float_array(table, name)
    want = (heads, 2 * att_span, dim)
    if table.shape != want:
        raise ValueError(f"{name} must have shape (H, 2 * att_span, D) = {want} (H and D from "
                         f"{'q' if name == 'pos_key' else 'k'} of shape {content.shape}), got {table.shape}")
    return table


def _index_for(relative_pos, att_span: int, out_shape: tuple, source: str) -> np.ndarray:
    """The Eq. 3 index broadcast to ``out_shape`` ``(..., H, T, S)``, or raise naming it.

    ``source`` says which arrays fixed ``out_shape`` (e.g. "T from q of shape (...)").
    """
    idx = relative_index(relative_pos, att_span)
    if idx.ndim < 2 or idx.shape[-2:] != tuple(out_shape[-2:]):
        raise ValueError(f"relative_pos must have shape (T, S) = {tuple(out_shape[-2:])} ({source}), "
                         f"got {idx.shape}")
    try:
        return np.broadcast_to(idx, out_shape)
    except ValueError:
        raise ValueError(f"relative_pos of shape {idx.shape} does not broadcast to (..., H, T, S) "
                         f"= {out_shape} ({source})") from None


def _check_content(x, name: str, letters: str) -> np.ndarray:
    x = as_float_array(x, name)
    if x.ndim < 3:
        raise ValueError(f"{name} must have shape {letters} with at least 3 dims, got {x.shape}")
    return x


def c2p_args(q, pos_key, relative_pos, att_span):
    """Checked q (..., H, T, D), pos_key (H, 2K, D) and the Eq. 3 index broadcast to (..., H, T, S)."""
    q = _check_content(q, "q", "(..., H, T, D)")
    *lead, H, T, D = q.shape
    att_span = _check_span(att_span)
    pos_key = _check_pos_table(pos_key, "pos_key", att_span, H, D, q)
    S = np.shape(relative_pos)[-1] if np.ndim(relative_pos) else 0
    return q, pos_key, _index_for(relative_pos, att_span, (*lead, H, T, S), f"T from q of shape {q.shape}")


def c2p_term(q: ArrayLike, pos_key: ArrayLike, relative_pos: ArrayLike, att_span: int) -> np.ndarray:
    """Unscaled content-to-position term ``q_i . pos_key[delta(i, j)]`` (Eq. 4, second term).

    q: ``(..., H, T, D)``; pos_key: ``(H, 2 * att_span, D)`` (relative embeddings through the key
    projection); relative_pos: ``(T, S)`` ints ``i - j``. Returns ``(..., H, T, S)``.
    Efficient form: one ``(T, D) x (D, 2K)`` product per head, then a gather along the last axis.
    """
    q, pos_key, idx = c2p_args(q, pos_key, relative_pos, att_span)
    T = q.shape[-2]
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        qp = np.matmul(q, np.swapaxes(pos_key, -1, -2))  # (..., H, T, 2K)
    check_overflow(qp, "q . pos_key", "q or pos_key")
    if idx.size == 0:
        return np.zeros(idx.shape, qp.dtype)  # (..., H, T, S) with a zero dim
    if idx.ndim == 2 or idx.strides[:-2] == (0,) * (idx.ndim - 2):  # one (T, S) index for all heads
        flat = idx[(0,) * (idx.ndim - 2)] + pos_key.shape[1] * np.arange(T)[:, None]  # t * 2K + delta
        return _take_rows(qp, flat)                                           # (..., H, T, S)
    return np.take_along_axis(qp, idx, axis=-1)  # (..., H, T, S)


def p2c_args(k, pos_query, relative_pos, att_span):
    """Checked k (..., H, S, D), pos_query (H, 2K, D) and the Eq. 3 index broadcast to (..., H, T, S)."""
    k = _check_content(k, "k", "(..., H, S, D)")
    *lead, H, S, D = k.shape
    att_span = _check_span(att_span)
    pos_query = _check_pos_table(pos_query, "pos_query", att_span, H, D, k)
    T = np.shape(relative_pos)[-2] if np.ndim(relative_pos) >= 2 else 0
    return k, pos_query, _index_for(relative_pos, att_span, (*lead, H, T, S), f"S from k of shape {k.shape}")


def p2c_term(k: ArrayLike, pos_query: ArrayLike, relative_pos: ArrayLike, att_span: int) -> np.ndarray:
    """Unscaled position-to-content term as the code computes it: ``k_j . pos_query[delta(i, j)]``.

    The paper's Eq. 4 writes ``delta(j, i)`` here; the code's gather-and-transpose gives
    ``delta(i, j)`` (module docstring). k: ``(..., H, S, D)``; pos_query: ``(H, 2 * att_span, D)``
    (relative embeddings through the query projection); relative_pos: ``(T, S)`` ints ``i - j``.
    Returns ``(..., H, T, S)``. Efficient form: ``(S, D) x (D, 2K)`` per head, then a gather.
    """
    k, pos_query, idx = p2c_args(k, pos_query, relative_pos, att_span)
    S = k.shape[-2]
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        kp = np.matmul(pos_query, np.swapaxes(k, -1, -2))  # (..., H, 2K, S)
    check_overflow(kp, "pos_query . k", "k or pos_query")
    if idx.size == 0:
        return np.zeros(idx.shape, kp.dtype)  # (..., H, T, S) with a zero dim
    if idx.ndim == 2 or idx.strides[:-2] == (0,) * (idx.ndim - 2):  # one (T, S) index for all heads
        flat = idx[(0,) * (idx.ndim - 2)] * S + np.arange(S)[None, :]           # delta * S + s
        return _take_rows(kp, flat)                                           # (..., H, T, S)
    return np.take_along_axis(kp, idx, axis=-2)  # out[i, j] = kp[idx[i, j], j]: (..., H, T, S)


def _take_rows(a: np.ndarray, flat: np.ndarray) -> np.ndarray:
    """``out[..., t, s] = a[..., :, :].ravel()[flat[t, s]]`` for every leading index: one gather."""
    *lead, _, _ = a.shape
    rows = np.ascontiguousarray(a).reshape(-1, a.shape[-2] * a.shape[-1])   # (N, T*2K) or (N, 2K*S)
    return np.take(rows, flat, axis=1).reshape(*lead, *flat.shape)         # (..., H, T, S)


def parse_pos_att_type(pos_att_type) -> tuple[str, ...]:
    """``pos_att_type`` as a tuple; a config string ``"p2c|c2p"`` is split on ``|``."""
    if isinstance(pos_att_type, str):
        pos_att_type = [t.strip() for t in pos_att_type.lower().split("|") if t.strip()]
    if isinstance(pos_att_type, (bytes, Mapping)) or not isinstance(pos_att_type, Iterable):
        raise TypeError(f"pos_att_type must be a sequence of 'c2p' / 'p2c' or a config string like "
                        f"'p2c|c2p', got {type(pos_att_type).__name__} {pos_att_type!r}")
    types = tuple(pos_att_type)
    for t in types:
        check_choice(t, "pos_att_type", _POS_ATT_TYPES)
    if len(set(types)) != len(types):
        raise ValueError(f"pos_att_type must not repeat a term, got {types!r}")
    return types


def _check_qk(q, k):
    q = _check_content(q, "q", "(..., H, T, D)")
    k = _check_content(k, "k", "(..., H, S, D)")
    if q.shape[:-2] != k.shape[:-2] or q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q (..., H, T, D) and k (..., H, S, D) must share ..., H and D; "
                         f"got q {q.shape}, k {k.shape}")
    return q, k


def disentangled_scores(q: ArrayLike, k: ArrayLike, pos_key: ArrayLike, pos_query: ArrayLike, relative_pos: ArrayLike,
                        *, att_span: int, pos_att_type: str | Sequence[str] = ("c2p", "p2c")) -> np.ndarray:
    """Scaled DeBERTa logits ``(c2c + c2p + p2c) / sqrt(D * (1 + len(pos_att_type)))``.

    q: ``(..., H, T, D)``; k: ``(..., H, S, D)``; pos_key, pos_query: ``(H, 2 * att_span, D)``
    (either may be None when its term is not in ``pos_att_type``); relative_pos: ``(T, S)`` ints
    ``i - j`` (from :func:`build_relative_position` / :func:`relative_positions`).
    pos_att_type: any of ``"c2p"``, ``"p2c"`` (a sequence, or a config string ``"p2c|c2p"``).
    Returns ``(..., H, T, S)`` in the promoted floating dtype of the inputs; add a mask and
    softmax (``minipos.attention.softmax``) to get the weights.
    """
    q, k = _check_qk(q, k)
    types = parse_pos_att_type(pos_att_type)
    att_span = _check_span(att_span)
    dtype = float_dtype(q, k, *_tables(pos_key, pos_query))
    out_shape = (*q.shape[:-1], k.shape[-2])  # (..., H, T, S)
    _index_for(relative_pos, att_span, out_shape, _qk_source(q, k))  # raise early, naming relative_pos
    with np.errstate(over="ignore", invalid="ignore"):  # checked below
        scores = np.matmul(q, np.swapaxes(k, -1, -2)).astype(dtype)  # c2c: (..., H, T, S)
        if "c2p" in types:
            scores += c2p_term(q, pos_key, relative_pos, att_span)
        if "p2c" in types:
            scores += p2c_term(k, pos_query, relative_pos, att_span)
    check_overflow(scores, "the logits c2c + c2p + p2c", "q, k, pos_key or pos_query")
    scale = np.sqrt(q.shape[-1] * (1 + len(types)))  # sqrt(3D) with c2p and p2c (Eq. 4)
    return scores / dtype.type(scale)


def _tables(pos_key, pos_query) -> list:
    """The relative tables that were given, as float arrays (for the result's dtype)."""
    return [as_float_array(t, name, finite=False) for name, t in (("pos_key", pos_key), ("pos_query", pos_query))
            if t is not None]


def _qk_source(q: np.ndarray, k: np.ndarray) -> str:
    return f"T from q of shape {q.shape}, S from k of shape {k.shape}"


def disentangled_scores_definitional(q: ArrayLike, k: ArrayLike, pos_key: ArrayLike, pos_query: ArrayLike,
                                     relative_pos: ArrayLike, *, att_span: int,
                                     pos_att_type: str | Sequence[str] = ("c2p", "p2c"),
                                     p2c_convention: str = "code") -> np.ndarray:
    """Eq. 4 as the paper writes it: gather the vectors ``K^r_delta`` / ``Q^r_delta`` per pair.

    ``A~_ij = q_i . k_j + q_i . pos_key[delta(i, j)] + k_j . pos_query[delta']``, scaled like
    :func:`disentangled_scores`, with ``delta' = delta(i, j)`` for ``p2c_convention="code"``
    (the reference implementation; equals :func:`disentangled_scores`) or the paper's
    ``delta(j, i) = clip(-relative_pos[i, j] + att_span, ...)`` for ``"paper"``.
    Shapes as in :func:`disentangled_scores`; memory is ``O(H T S D)``, for reading, not speed.
    """
    q, k = _check_qk(q, k)
    types = parse_pos_att_type(pos_att_type)
    check_choice(p2c_convention, "p2c_convention", ("code", "paper"))
    att_span = _check_span(att_span)
    H, T, S, D = q.shape[-3], q.shape[-2], k.shape[-2], q.shape[-1]
    idx = _index_for(relative_pos, att_span, (T, S), _qk_source(q, k))        # delta(i, j)
    check_alloc((H, T, S, D), np.result_type(q, k), "q and k (a vector per (i, j) pair)")
    with np.errstate(over="ignore", invalid="ignore"):                         # checked below
        scores = np.einsum("...htd,...hsd->...hts", q, k)                      # Q^c_i . K^c_j
        if "c2p" in types:
            kr = _check_pos_table(pos_key, "pos_key", att_span, H, D, q)[:, idx]   # (H, T, S, D)
            scores = scores + np.einsum("...htd,htsd->...hts", q, kr)          # Q^c_i . K^r_delta(i,j)
        if "p2c" in types:
            ji = idx if p2c_convention == "code" else _paper_p2c_index(relative_pos, att_span)
            qr = _check_pos_table(pos_query, "pos_query", att_span, H, D, k)[:, ji]  # (H, T, S, D)
            scores = scores + np.einsum("...hsd,htsd->...hts", k, qr)          # K^c_j . Q^r_delta'
    dtype = float_dtype(q, k, *_tables(pos_key, pos_query))
    with np.errstate(over="ignore", invalid="ignore"):                         # checked below
        scores = (scores / np.sqrt(D * (1 + len(types)))).astype(dtype, copy=False)  # / sqrt(3D)
    return check_overflow(scores, "the logits (c2c + c2p + p2c) / sqrt(3D)", "q, k, pos_key or pos_query")


def _paper_p2c_index(relative_pos, att_span: int) -> np.ndarray:
    """The paper's ``delta(j, i) = clip(-relative_pos + k, 0, 2k - 1)``, as ``k - clip(r, 1 - k, k)``
    (equal, and free of the int64 overflow of negating ``-2**63``)."""
    r = _as_int_array(relative_pos)
    return att_span - np.clip(r, 1 - att_span, att_span)  # delta(j, i), Eq. 3


# --------------------------------------------------------------------------- gradients
#
# Each backward takes its forward's arguments plus the output gradient dout (..., H, T, S) and
# returns the input gradients, each in its input's floating dtype; no state is kept between them.


def _batch(a: np.ndarray) -> np.ndarray:
    """(..., H, X, Y) as (N, H, X, Y), N the product of ... (1 without leading dims), for sums over ...."""
    return a.reshape(math.prod(a.shape[:-3]), *a.shape[-3:])


def _take_along_last_backward(dout: np.ndarray, idx: np.ndarray, size: int) -> np.ndarray:
    """The adjoint of ``np.take_along_axis(a, idx, axis=-1)`` for ``a`` of shape (..., size).

    The gather reads ``out[..., s] = a[..., idx[..., s]]``; its transpose scatters and adds,
    ``da[..., c] = sum of dout[..., s] over the s with idx[..., s] = c``, in float64.
    """
    check_alloc((*dout.shape[:-1], size), np.float64, "dout (by relative position)")
    da = np.zeros((*dout.shape[:-1], size))                         # (..., size)
    grid = np.indices(dout.shape, sparse=True)[:-1]                 # the other axes, as take_along_axis
    np.add.at(da, (*grid, idx), dout)                               # da[..., idx[..., s]] += dout[..., s]
    return da


def _c2p_adjoint(q, pos_key, idx, dout):
    """dq (..., H, T, D) and dpos_key (H, 2K, D) of c2p = gather(q pos_key^T, idx), unscaled."""
    dqp = _take_along_last_backward(dout, idx, pos_key.shape[1])  # (..., H, T, 2K)  scatter-add
    dq = dqp @ pos_key                                             # dq = dQP K^r
    dpos_key = np.einsum("nhtc,nhtd->hcd", _batch(dqp), _batch(q))  # dK^r = sum over ... of dQP^T q
    return dq, dpos_key


def _p2c_adjoint(k, pos_query, idx, dout):
    """dk (..., H, S, D) and dpos_query (H, 2K, D) of p2c: out[.., t, s] = (pos_query k^T)[.., idx[t, s], s]."""
    t = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731  (..., T, S) <-> (..., S, T)
    dkp = _take_along_last_backward(t(dout), t(idx), pos_query.shape[1])  # (..., H, S, 2K)  = dKP^T
    dk = dkp @ pos_query                                                  # dk = dKP^T Q^r
    dpos_query = np.einsum("nhsc,nhsd->hcd", _batch(dkp), _batch(k))     # dQ^r = sum over ... of dKP k
    return dk, dpos_query


def c2p_term_backward(q: ArrayLike, pos_key: ArrayLike, relative_pos: ArrayLike, att_span: int, dout: ArrayLike):
    """Gradients of ``c2p_term`` (same arguments) for the output gradient dout ``(..., H, T, S)``.

    Returns ``(dq, dpos_key)`` of shapes ``(..., H, T, D)`` and ``(H, 2 * att_span, D)``. The
    forward scores every row, ``QP = q pos_key^T`` ``(..., H, T, 2K)``, then gathers
    ``out[..., t, s] = QP[..., t, delta(t, s)]``. Backwards:

        dQP[..., t, c] = sum over s with delta(t, s) = c of dout[..., t, s]   (scatter-add)
        dq = dQP pos_key,    dpos_key = sum over ... of dQP^T q
    """
    q, pos_key, idx = c2p_args(q, pos_key, relative_pos, att_span)
    dout = check_dout(dout, idx.shape, f"T from q of shape {q.shape}, S from relative_pos")
    with np.errstate(over="ignore", invalid="ignore"):  # checked in _grad
        dq, dpos_key = _c2p_adjoint(q, pos_key, idx, dout)
    return cast_grad(dq, q, "q", "q, pos_key"), cast_grad(dpos_key, pos_key, "pos_key", "q, pos_key")


def p2c_term_backward(k: ArrayLike, pos_query: ArrayLike, relative_pos: ArrayLike, att_span: int, dout: ArrayLike):
    """Gradients of ``p2c_term`` (same arguments) for the output gradient dout ``(..., H, T, S)``.

    Returns ``(dk, dpos_query)`` of shapes ``(..., H, S, D)`` and ``(H, 2 * att_span, D)``. The
    forward scores every row, ``KP = pos_query k^T`` ``(..., H, 2K, S)``, then gathers
    ``out[..., t, s] = KP[..., delta(t, s), s]`` (the code's index, module docstring). Backwards:

        dKP[..., c, s] = sum over t with delta(t, s) = c of dout[..., t, s]   (scatter-add)
        dk = dKP^T pos_query,    dpos_query = sum over ... of dKP k
    """
    k, pos_query, idx = p2c_args(k, pos_query, relative_pos, att_span)
    dout = check_dout(dout, idx.shape, f"T from relative_pos, S from k of shape {k.shape}")
    with np.errstate(over="ignore", invalid="ignore"):  # checked in _grad
        dk, dpos_query = _p2c_adjoint(k, pos_query, idx, dout)
    return cast_grad(dk, k, "k", "k, pos_query"), cast_grad(dpos_query, pos_query, "pos_query", "k, pos_query")


def disentangled_scores_backward(q: ArrayLike, k: ArrayLike, pos_key: ArrayLike, pos_query: ArrayLike,
                                 relative_pos: ArrayLike, dout: ArrayLike, *, att_span: int,
                                 pos_att_type: str | Sequence[str] = ("c2p", "p2c")):
    """Gradients of ``disentangled_scores`` (same arguments) for the output gradient dout ``(..., H, T, S)``.

    Returns ``(dq, dk, dpos_key, dpos_query)`` of the shapes of q ``(..., H, T, D)``, k
    ``(..., H, S, D)`` and the tables ``(H, 2 * att_span, D)``; a table whose term is not in
    ``pos_att_type`` gets ``None`` (it may be None). With ``g = dout / sqrt(D (1 + len(pos_att_type)))``
    (the forward's scale):

        c2c = q k^T:   dq = g k,   dk = g^T q
        c2p:           dq += c2p_term_backward(q, pos_key, ..., g)[0],   dpos_key = its [1]
        p2c:           dk += p2c_term_backward(k, pos_query, ..., g)[0], dpos_query = its [1]
    """
    q, k = _check_qk(q, k)
    types = parse_pos_att_type(pos_att_type)
    att_span = _check_span(att_span)
    out_shape = (*q.shape[:-1], k.shape[-2])  # (..., H, T, S)
    _index_for(relative_pos, att_span, out_shape, _qk_source(q, k))  # raise early, naming relative_pos
    dout = check_dout(dout, out_shape, _qk_source(q, k))
    g = dout / np.sqrt(q.shape[-1] * (1 + len(types)))  # d(c2c + c2p + p2c), the scale sqrt(3D) undone
    dpos_key = dpos_query = None
    with np.errstate(over="ignore", invalid="ignore"):  # checked in _grad
        dq = g @ k  # c2c: dq = g k
        dk = np.swapaxes(g, -1, -2) @ q  # c2c: dk = g^T q
        if "c2p" in types:
            _, pos_key, idx = c2p_args(q, pos_key, relative_pos, att_span)
            dq_c2p, dpos_key = _c2p_adjoint(q, pos_key, idx, g)
            dq = dq + dq_c2p
            dpos_key = cast_grad(dpos_key, pos_key, "pos_key", "q, pos_key")
        if "p2c" in types:
            _, pos_query, idx = p2c_args(k, pos_query, relative_pos, att_span)
            dk_p2c, dpos_query = _p2c_adjoint(k, pos_query, idx, g)
            dk = dk + dk_p2c
            dpos_query = cast_grad(dpos_query, pos_query, "pos_query", "k, pos_query")
    return cast_grad(dq, q, "q", "q, k, pos_key"), cast_grad(dk, k, "k", "q, k, pos_query"), dpos_key, dpos_query


# --------------------------------------------------------------------------- the scheme the layer runs

class DeBERTa(Scheme):
    """DeBERTa-v2/v3 disentangled attention: c2c + c2p + p2c over relative positions q - k.

    ``rel_embeddings`` ``(2 * att_span, d_model)`` is the encoder's (LayerNorm'd) relative
    embedding table; it is projected by the layer's own ``wk``/``wq`` (``share_att_key=True``).
    ``position_buckets``, ``max_relative_positions`` (``< 1`` means ``max_position_embeddings``)
    and ``pos_att_type`` (a tuple or a config string like ``"p2c|c2p"``) are the config keys of the
    same names (v3: 256, 512, ``"p2c|c2p"``). Logits are scaled by
    ``1/sqrt(D * (1 + len(pos_att_type)))``.
    """

    name = "deberta"
    seams = ("content-position",)
    sign_convention = (r"`build_relative_position` gives `query - key` ($i - j$); c2p reads row "
                       r"$\operatorname{clip}(i - j + k, 0, 2k-1)$, and so does the code's p2c",
                       r"He et al. 2021, Eq. 3–4, and the reference code")
    terms = ("content-content", "content-position", "position-content")

    def __init__(self, *, position_buckets: int = 256, max_relative_positions: int = 512,
                 pos_att_type=("c2p", "p2c"), max_position_embeddings: int = 512):
        self.position_buckets, self.max_relative_positions, self.att_span = spans_from_config(
            position_buckets=position_buckets, max_relative_positions=max_relative_positions,
            max_position_embeddings=max_position_embeddings)
        self.pos_att_type = parse_pos_att_type(pos_att_type)
        relative_positions([0], [0], bucket_size=self.position_buckets,
                                   max_position=self.max_relative_positions)  # validates the buckets now

    def bind(self, layer, rng):
        if layer.num_kv_heads != layer.num_heads:
            raise ValueError("DeBERTa projects its relative embeddings with the layer's wk and wq, so it needs "
                             f"num_kv_heads == num_heads, got {layer.num_kv_heads} and {layer.num_heads}")
        super().bind(layer, rng)
        check_alloc((2 * self.att_span, self.d_model), layer.dtype, "DeBERTa's rel_embeddings (2 * att_span, d_model)")
        self.rel_embeddings = rng.standard_normal((2 * self.att_span, self.d_model)).astype(layer.dtype)

    def parameters(self):
        return {"rel_embeddings": self.rel_embeddings}

    def _project(self, w, b):  # (2k, d_model) -> (H, 2k, D)
        p = self.rel_embeddings @ w + (0 if b is None else b)
        return p.reshape(2 * self.att_span, self.num_heads, self.head_dim).transpose(1, 0, 2)

    def content_position(self, q, k, q_positions, k_positions, *, ops=None):
        """``ops``: ``None`` runs this module's ``c2p_term`` and ``p2c_term`` (and, in
        ``extra_backward``, their backwards); the fast layer passes ``minipos.fast.deberta``, which
        has the same names."""
        L, scale = self.layer, self.scale(self.head_dim)
        pos_key, pos_query = self._project(L.wk, L.bk), self._project(L.wq, L.bq)  # (H, 2k, D)
        c2p, p2c = (c2p_term, p2c_term) if ops is None else (ops.c2p_term, ops.p2c_term)

        def extra(qs, ks):  # c2p + p2c for one block, scaled like c2c
            rel = relative_positions(q_positions[qs], k_positions[ks], bucket_size=self.position_buckets,
                                     max_position=self.max_relative_positions)  # (tq, tk), q - k
            total = 0.0
            if "c2p" in self.pos_att_type:
                total = total + c2p(q[..., qs, :], pos_key, rel, self.att_span)
            if "p2c" in self.pos_att_type:
                total = total + p2c(k[..., ks, :], pos_query, rel, self.att_span)
            return scale * total
        return q, extra

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add, *, ops=None):
        L, D2 = self.layer, 2 * self.att_span
        c2p_back, p2c_back = ((c2p_term_backward, p2c_term_backward) if ops is None else
                              (ops.c2p_term_backward, ops.p2c_term_backward))
        rel = relative_positions(q_positions[qs], k_positions[ks], bucket_size=self.position_buckets,
                                 max_position=self.max_relative_positions)
        d = self.scale(self.head_dim) * dlogits                              # (B, H, tq, tk)
        dq, dk = 0.0, 0.0
        for term, w, b, name in (("c2p", L.wk, L.bk, "k"), ("p2c", L.wq, L.bq, "q")):
            if term not in self.pos_att_type:
                continue
            table = self._project(w, b)                                      # (H, 2k, D)
            if term == "c2p":
                dq, dtable = c2p_back(q[..., qs, :], table, rel, self.att_span, d)
            else:
                dk, dtable = p2c_back(k[..., ks, :], table, rel, self.att_span, d)
            dproj = dtable.transpose(1, 0, 2).reshape(D2, -1)                # (2k, H*D): table = rel_emb w + b
            add("w" + name, self.rel_embeddings.T @ dproj)
            if b is not None:
                add("b" + name, dproj.sum(axis=0))
            add("scheme.rel_embeddings", dproj @ w.T)
        return dq, dk

    def scale(self, head_dim):
        return 1.0 / math.sqrt(head_dim * (1 + len(self.pos_att_type)))

    def settings(self):
        return (("position_buckets", self.position_buckets), ("max_relative_positions", self.max_relative_positions),
                ("att_span", self.att_span), ("pos_att_type", tuple(self.pos_att_type)))

    def __repr__(self) -> str:
        return f"DeBERTa(position_buckets={self.position_buckets}, pos_att_type={self.pos_att_type})"
