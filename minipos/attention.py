"""Scaled dot-product attention, knowing no position scheme.

Every scheme of minipos plugs into attention through one of four seams (design: input, rotate,
bias, content-position). This module is what they plug into; it sees only

    logits[..., h, t, s] = scale * q[..., h, t, :] . k[..., h, s, :] + bias[..., h, t, s]
    weights = softmax(logits where mask else -inf, axis=-1)
    out[..., h, t, :] = sum_s weights[..., h, t, s] v[..., h, s, :]

(Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, Eq. 1). The default
``scale`` is ``1/sqrt(D)``: for q, k with independent unit-variance entries Var(q . k) = D
(proved in ``proofs``), so the scale keeps the logits at unit variance.

Conventions
-----------
- Shapes: ``q`` ``(..., H, T, D)``, ``k`` ``(..., H, S, D)``, ``v`` ``(..., H, S, Dv)``; bias and
  mask broadcast to ``(..., H, T, S)`` *without enlarging it* (no silent broadcasting).
- Masks are boolean, ``True`` = may attend. A fully masked row gets all-zero weights (so a zero
  output), never NaN and never a warning.
- The result keeps the floating dtype of the inputs (float32 in, float32 out).

Blockwise form
--------------
``blockwise_attention`` computes the same ``out`` without ever holding a ``(T, S)`` array: it
walks query blocks and, inside each, key blocks, folding every block of logits ``x`` into a
running row max ``m``, a running sum ``l`` and an unnormalised output ``o`` (the online softmax
of Milakov & Gimelshein 2018, arXiv:1805.02867, Alg. 3; FlashAttention, Dao et al. 2022,
arXiv:2205.14135, Alg. 1 lines 9-12, with the division by ``l`` deferred to the end as in
FlashAttention-2, arXiv:2307.08691, Alg. 1):

    m_new = max(m, rowmax(x))
    l     = l e^{m - m_new} + sum_s e^{x_s - m_new}
    o     = o e^{m - m_new} + e^{x - m_new} V
    out   = o / l                       (0 where l = 0: a row with no allowed key)

Rescaling by ``e^{m - m_new}`` makes the result independent of the block order and size; every
exponent is ``<= 0``, so nothing overflows. The values carry a column of ones, ``[V | 1]``, so one
product ``P [V | 1] = [P V | sum_s P]`` updates ``o`` and ``l`` together. Bias and mask come from callables evaluated one block
at a time, and blocks that are masked throughout (e.g. key blocks in the future of a query block
under ``causal``) are skipped without any work.
"""

from __future__ import annotations

import math

import numpy as np

from ._checks import as_float_array, check_float, check_int, check_positive_int

__all__ = ["softmax", "causal_mask", "attention", "blockwise_attention"]


def softmax(x, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    ``x`` may hold ``-inf`` (a masked entry); a slice that is ``-inf`` throughout gives zeros
    there, not NaN. NaN or ``+inf`` in ``x`` raise ``ValueError``.

    x: any shape, floating (ints become float64). Returns the same shape and dtype.
    """
    x = as_float_array(x, "x", finite=False)
    if np.isnan(x).any() or np.isposinf(x).any():
        raise ValueError("x must not hold NaN or +inf (use -inf for masked entries)")
    m = np.max(x, axis=axis, keepdims=True) if x.size else x
    m = np.where(np.isfinite(m), m, 0.0).astype(x.dtype, copy=False)  # all -inf row -> shift by 0
    e = np.exp(x - m)                                                   # softmax(x) = softmax(x - c)
    total = np.sum(e, axis=axis, keepdims=True)
    return np.divide(e, total, out=np.zeros_like(e), where=total > 0)


def causal_mask(q_len: int, k_len: int) -> np.ndarray:
    """Boolean ``(T, S)`` mask where query ``t`` may attend key ``s`` iff ``s <= t + (S - T)``.

    The queries are taken to be the last ``T`` of the ``S`` positions (a cached decoding step),
    so with ``S == T`` this is the lower triangle including the diagonal.
    """
    T = check_int(q_len, "q_len", minimum=0)
    S = check_int(k_len, "k_len", minimum=0)
    t = np.arange(T)[:, None]
    s = np.arange(S)[None, :]
    return s <= t + (S - T)  # (T, S)


def _check_broadcast(arr: np.ndarray, name: str, target: tuple) -> None:
    """Raise unless ``arr`` broadcasts to ``target`` without changing it."""
    try:
        shape = np.broadcast_shapes(arr.shape, target)
    except ValueError:
        shape = None
    if shape != tuple(target):
        raise ValueError(
            f"{name} of shape {arr.shape} does not broadcast to the logits shape "
            f"(..., H, T, S) = {tuple(target)}"
        )


def _check_qkv(q, k, v):
    q = as_float_array(q, "q")
    k = as_float_array(k, "k")
    v = as_float_array(v, "v")
    for name, a in (("q", q), ("k", k), ("v", v)):
        if a.ndim < 2:
            raise ValueError(f"{name} must have shape (..., H, T|S, D) with at least 2 dims, got {a.shape}")
    if q.shape[:-2] != k.shape[:-2] or k.shape[:-2] != v.shape[:-2]:
        raise ValueError(
            f"q, k, v must share their leading dims (..., H); got q {q.shape}, k {k.shape}, v {v.shape}"
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(f"q and k must have the same head dim D; got q {q.shape}, k {k.shape}")
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(f"k and v must have the same number of keys S; got k {k.shape}, v {v.shape}")
    return q, k, v


def attention(q, k, v, *, bias=None, mask=None, scale=None, return_weights: bool = False):
    """Multi-head scaled dot-product attention with an additive bias and a boolean mask.

    q: ``(..., H, T, D)``; k: ``(..., H, S, D)``; v: ``(..., H, S, Dv)``.
    bias: additive logits broadcastable to ``(..., H, T, S)`` (e.g. ALiBi or T5 ``(H, T, S)``).
    mask: boolean, broadcastable to ``(..., H, T, S)``; ``True`` = may attend.
    scale: multiplies ``q . k`` only (not the bias); default ``1/sqrt(D)``. T5 uses ``1.0``.
    Returns ``out`` ``(..., H, T, Dv)``, and the weights ``(..., H, T, S)`` too when
    ``return_weights``. Rows with no allowed key give zero weights and a zero output.
    """
    q, k, v = _check_qkv(q, k, v)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    D = q.shape[-1]
    scale = 1.0 / np.sqrt(D) if scale is None else check_float(scale, "scale")
    with np.errstate(over="ignore", invalid="ignore"):                     # checked just below
        logits = np.matmul(q, np.swapaxes(k, -1, -2)).astype(dtype, copy=False)  # (..., H, T, S)
        logits *= dtype.type(scale)
    if not np.all(np.isfinite(logits)):
        raise ValueError(f"scale * q . k overflows {dtype} (|logit| too large); rescale q and k or use float64")
    if bias is not None:
        bias = as_float_array(bias, "bias")
        _check_broadcast(bias, "bias", logits.shape)
        logits += bias.astype(dtype, copy=False)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        _check_broadcast(mask, "mask", logits.shape)
        logits = np.where(mask, logits, -np.inf).astype(dtype, copy=False)
    weights = softmax(logits, axis=-1)
    out = np.matmul(weights, v.astype(dtype, copy=False))  # (..., H, T, Dv)
    return (out, weights) if return_weights else out


def _buffer_view(buf: np.ndarray, shape: tuple) -> np.ndarray:
    """A C-contiguous view of shape ``shape`` on the first elements of the flat ``buf``."""
    return buf[: int(np.prod(shape))].reshape(shape)


def _block_term(value, name: str, qs: slice, ks: slice, target: tuple, *, boolean: bool):
    """Check one block's bias (float) or mask (bool) from ``name``; ``None`` passes through.

    Only the dtype and shape are checked here, which costs nothing per element; a bias holding
    NaN or +inf is caught once per query block from the row sums (``_check_row_sums``).
    """
    if value is None:
        return None
    where = f"{name}(slice({qs.start}, {qs.stop}), slice({ks.start}, {ks.stop}))"
    if boolean:
        value = np.asarray(value)
        if value.dtype != bool:
            raise TypeError(f"{where} must return a boolean mask (True = may attend) or None, "
                            f"got dtype {value.dtype}")
    else:
        value = as_float_array(value, where, finite=False)
    if value.shape != tuple(target):
        try:
            ok = np.broadcast_shapes(value.shape, target) == tuple(target)
        except ValueError:
            ok = False
        if not ok:
            raise ValueError(f"{where} returned shape {value.shape}, which does not broadcast to the "
                             f"block shape (..., H, tq, tk) = {tuple(target)}")
    return value


def _check_row_sums(l: np.ndarray, qs: slice) -> None:
    """Raise if a row sum ``l`` of the query block ``qs`` is NaN or +inf.

    Every exponent is ``<= 0`` for finite logits, so ``0 <= l <= S``: a NaN or an infinite ``l``
    can only come from a NaN or +inf logit, i.e. from ``bias_fn`` (q, k and v are checked).
    """
    if not np.isfinite(l).all():
        raise ValueError(f"bias_fn must return finite values: the logits of queries "
                         f"slice({qs.start}, {qs.stop}) hold NaN or +inf (bias_fn returned NaN or "
                         f"inf, or scale q.k overflowed)")


def _causal_triangle(qs: slice, ks: slice, offset: int, cache: dict) -> np.ndarray:
    """``s <= t + offset`` for the block ``(qs, ks)``, ``(tq, tk)``; blocks on the same diagonal
    share one array (it depends on the sizes and on ``ks.start - qs.start`` only)."""
    key = (qs.stop - qs.start, ks.stop - ks.start, ks.start - qs.start - offset)
    if key not in cache:
        t = np.arange(qs.start, qs.stop)[:, None]
        s = np.arange(ks.start, ks.stop)[None, :]
        cache[key] = s <= t + offset                              # causal_mask: s <= t + (S - T)
    return cache[key]


def _block_allowed(mask_fn, causal: bool, offset: int, qs: slice, ks: slice, target: tuple, cache: dict):
    """The block's mask ``(..., H, tq, tk)``-broadcastable, or ``None`` when all keys are allowed."""
    allowed = None
    if mask_fn is not None:
        allowed = _block_term(mask_fn(qs, ks), "mask_fn", qs, ks, target, boolean=True)
    if causal and ks.stop - 1 > qs.start + offset:           # the block crosses the diagonal
        tri = _causal_triangle(qs, ks, offset, cache)
        allowed = tri if allowed is None else allowed & tri
    return allowed


def _online_update(x, v_blk, m, o, pv, rowmax) -> None:
    """Fold one block of logits ``x`` ``(..., H, tq, tk)`` into the running ``m`` and ``o``.

    ``v_blk`` is ``[V | 1]`` ``(..., H, tk, Dv + 1)``, so ``o`` ``(..., H, tq, Dv + 1)`` carries
    the row sum ``l`` in its last column and one product updates both. ``x`` is overwritten by
    ``P = e^{x - m_new}``; ``pv`` (``o``'s shape) and ``rowmax`` (``m``'s) are scratch.
    """
    np.max(x, axis=-1, keepdims=True, out=rowmax)
    with np.errstate(invalid="ignore"):                                  # -inf - -inf: no key yet, NaN
        gap = rowmax - m                                                 # how far the block's rows lie above m
    m_new = np.maximum(m, rowmax, out=rowmax)                           # m_new = max(m, rowmax(x))
    shift = np.where(np.isfinite(m_new), m_new, x.dtype.type(0))        # no key yet: shift by 0
    alpha = np.exp(m - shift)                                            # e^{m - m_new}
    o *= alpha                                                           # [o | l] e^{m - m_new}
    m[...] = m_new
    heads = _heads_that_count(gap, x.dtype)                              # the rest underflow: P = 0 exactly
    if heads is None:
        np.exp(np.subtract(x, shift, out=x), out=x)                     # P = e^{x - m_new}
        o += np.matmul(x, v_blk, out=pv)                                 #   + P [V | 1]
        return
    xs, ss, vs, os_, ps = (a.reshape(-1, *a.shape[-2:]) for a in
                           (x, shift, np.broadcast_to(v_blk, (*x.shape[:-2], *v_blk.shape[-2:])), o, pv))
    for h in heads:                                                      # a loop over heads, not positions
        np.exp(np.subtract(xs[h], ss[h], out=xs[h]), out=xs[h])
        os_[h] += np.matmul(xs[h], vs[h], out=ps[h])


def _heads_that_count(gap, dtype):
    """Indices (over the flattened leading dims) of heads with a row whose block can add to it.

    A row whose block maximum lies more than ``-ln(tiny)`` below the running max gets
    ``e^{x - m} = 0`` exactly (the exponential underflows past the smallest subnormal), so its
    exponentials and its ``P V`` product can be skipped without changing a bit. Returns ``None``
    when every head counts (the common case: one batched pass).
    """
    dead = gap < _UNDERFLOW[np.dtype(dtype)]                             # (..., H, tq, 1)
    if not dead.any():
        return None
    per_head = dead.reshape(-1, dead.shape[-2]).all(axis=-1)             # every row of the head is dead
    if not per_head.any():
        return None
    return np.flatnonzero(~per_head)


# e^x is exactly 0 below these (past the smallest subnormal): -103.97 in float32, -745.13 in float64
_UNDERFLOW = {np.dtype(t): math.log(float(np.finfo(t).smallest_subnormal)) - math.log(2.0) - 1.0
              for t in (np.float16, np.float32, np.float64)}


def _key_slices(qs: slice, S: int, block: int, causal: bool, offset: int):
    """Key blocks a query block may see (with ``causal``, none past key ``qs.stop - 1 + offset``),
    last first: the blocks nearest the diagonal come first, so under a bias that decays with
    distance the running max is set early and the far blocks underflow and are skipped."""
    stop = min(S, qs.stop + offset) if causal else S
    return [slice(j, min(j + block, stop)) for j in range(0, stop, block)][::-1]


def _check_blockwise_args(bias_fn, mask_fn, causal, block_size, q_offset, T, S):
    """Validate the blockwise options; return ``(block, offset)``."""
    for name, fn in (("bias_fn", bias_fn), ("mask_fn", mask_fn)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be a callable (q_slice, k_slice) -> array, or None; "
                            f"got {type(fn).__name__}")
    if not isinstance(causal, (bool, np.bool_)):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__} {causal!r}")
    block = check_positive_int(block_size, "block_size")
    if q_offset is not None and not causal:
        raise ValueError("q_offset only applies with causal=True; pass a mask_fn for other masks")
    offset = S - T if q_offset is None else check_int(q_offset, "q_offset")
    return block, offset


def blockwise_attention(q, k, v, *, bias_fn=None, mask_fn=None, causal: bool = False, scale=None,
                        block_size: int = 1024, q_offset: int | None = None) -> np.ndarray:
    """``attention`` by the online softmax over query and key blocks, never holding ``(T, S)``.

    q: ``(..., H, T, D)``; k: ``(..., H, S, D)``; v: ``(..., H, S, Dv)``. Returns ``(..., H, T, Dv)``.
    bias_fn: ``bias_fn(q_slice, k_slice)`` -> additive logits for queries ``q_slice`` and keys
      ``k_slice`` (Python ``slice`` objects of indices into the T and S axes, step 1), broadcastable
      to ``(..., H, tq, tk)``, or ``None``. The callee maps indices to positions, e.g.
      ``lambda qs, ks: alibi_bias(slopes, q_pos[qs], k_pos[ks])``. Not scaled by ``scale``.
    mask_fn: ``mask_fn(q_slice, k_slice)`` -> boolean block mask (``True`` = may attend),
      broadcastable to ``(..., H, tq, tk)``, or ``None`` (all allowed). It is called before
      ``bias_fn``; a block it masks throughout is skipped and ``bias_fn`` is not called there.
    causal: query ``t`` sees key ``s`` iff ``s <= t + q_offset``; ``q_offset`` defaults to
      ``S - T`` (as ``causal_mask``: the queries are the last T of S positions). Key blocks wholly
      in a query block's future are never computed.
    scale: multiplies ``q . k`` only; default ``1/sqrt(D)``.
    q_offset: only with ``causal``; an int, which may be negative (rows then see fewer keys).
    block_size: queries and keys per block (a positive int); the extra memory is one logits
      block ``(..., H, block, block)`` plus ``O(... H block (D + Dv))``, whatever T and S.
    Rows with no allowed key give zeros. Equal to ``attention`` up to rounding. A bias holding
    NaN or +inf raises ``ValueError`` naming ``bias_fn`` (found once per query block from the row
    sums, not by a pass over every block); a ``-inf`` bias entry acts as a masked one.
    """
    q, k, v = _check_qkv(q, k, v)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    q, k = (a.astype(dtype, copy=False) for a in (q, k))
    *lead, T, D = q.shape
    S, Dv = v.shape[-2:]
    scale = 1.0 / np.sqrt(D) if scale is None else check_float(scale, "scale")
    block, offset = _check_blockwise_args(bias_fn, mask_fn, causal, block_size, q_offset, T, S)
    v1 = np.empty((*lead, S, Dv + 1), dtype)                               # [V | 1]: P [V | 1] = [P V | l]
    v1[..., :Dv], v1[..., Dv] = v, 1
    out = np.zeros((*lead, T, Dv), dtype)                                  # (..., H, T, Dv)
    bq, bk, n = min(block, T), min(block, S), int(np.prod(lead))
    bufs = [np.empty(size, dtype) for size in (n * bq * D, n * bq * bk, n * bq * (Dv + 1), n * bq * (Dv + 1))]
    stats = np.empty((2, n * bq), dtype)                                   # m and a row max of one query block
    scale, triangles = dtype.type(scale), {}
    for i in range(0, T, block):
        qs = slice(i, min(i + block, T))
        q_blk = np.multiply(q[..., qs, :], scale,                          # scale multiplies q . k only
                            out=_buffer_view(bufs[0], (*lead, qs.stop - i, D)))
        _attend_query_block(q_blk, k, v1, out, qs, bufs[1:], stats, bias_fn=bias_fn, mask_fn=mask_fn,
                            causal=causal, offset=offset, block=block, triangles=triangles)
    return out


def _attend_query_block(q_blk, k, v1, out, qs, bufs, stats, *, bias_fn, mask_fn, causal, offset,
                        block, triangles) -> None:
    """Online softmax of the scaled query block ``q_blk`` ``(..., H, tq, D)`` over its key blocks.

    ``v1`` is ``[V | 1]`` ``(..., H, S, Dv + 1)``. Writes ``out[..., qs, :]``; ``bufs`` is scratch
    for the logits, ``[o | l]`` and ``P [V | 1]``; ``triangles`` caches causal block masks.
    """
    *lead, tq, _ = q_blk.shape
    o = _buffer_view(bufs[1], (*lead, tq, v1.shape[-1]))
    m = _buffer_view(stats[0], (*lead, tq, 1))
    m.fill(-np.inf)                                                        # m = -inf, l = 0, o = 0
    o.fill(0)
    for ks in _key_slices(qs, k.shape[-2], block, causal, offset):
        target = (*lead, tq, ks.stop - ks.start)
        allowed = _block_allowed(mask_fn, causal, offset, qs, ks, target, triangles)
        if allowed is not None and not allowed.any():
            continue                                                       # masked throughout: skip
        bias = None if bias_fn is None else _block_term(bias_fn(qs, ks), "bias_fn", qs, ks, target,
                                                        boolean=False)
        for rows, keys in _row_groups(qs, ks, causal, offset):
            sub = lambda a: None if a is None else np.broadcast_to(a, target)[..., rows, keys]  # noqa: E731
            nr, nk = rows.stop - rows.start, keys.stop
            x = np.matmul(q_blk[..., rows, :], np.swapaxes(k[..., ks, :][..., keys, :], -1, -2),
                          out=_buffer_view(bufs[0], (*lead, nr, nk)))      # scale q.k
            _fold(x, sub(bias), sub(allowed), v1[..., ks, :][..., keys, :], m[..., rows, :], o[..., rows, :],
                  _buffer_view(bufs[2], (*lead, nr, v1.shape[-1])), _buffer_view(stats[1], (*lead, nr, 1)))
    l = o[..., -1:]                                                        # (..., H, tq, 1)
    _check_row_sums(l, qs)
    np.divide(o[..., :-1], l, out=out[..., qs, :], where=l > 0)            # out = o / l (0 if l = 0)


def _row_groups(qs: slice, ks: slice, causal: bool, offset: int, groups: int = 4):
    """``(rows, keys)`` slices (relative to the block) that hold every allowed key of the block.

    A block crossing the causal diagonal is cut into ``groups`` bands of rows, each taking only
    the keys up to its last row's diagonal: the triangle above it (all masked) is never scored.
    """
    tq, tk = qs.stop - qs.start, ks.stop - ks.start
    if not causal or ks.stop - 1 <= qs.start + offset or tq < 2 * groups:
        return [(slice(0, tq), slice(0, tk))]
    step = -(-tq // groups)
    bands = []
    for r in range(0, tq, step):                                           # a loop over bands of rows
        rows = slice(r, min(r + step, tq))
        last_key = qs.start + rows.stop - 1 + offset - ks.start            # s <= t + offset
        if last_key >= 0:
            bands.append((rows, slice(0, min(tk, last_key + 1))))
    return bands


def _fold(x, bias, allowed, v_blk, m, o, pv, rowmax) -> None:
    """Add the bias to the block's ``scale q.k``, mask it, and fold it into ``m`` and ``[o | l]``."""
    if bias is not None:
        np.add(x, bias, out=x)                                             # x = scale q.k + b
    if allowed is not None:
        np.copyto(x, -np.inf, where=~allowed)                              # masked logits -> -inf
    _online_update(x, v_blk, m, o, pv, rowmax)
