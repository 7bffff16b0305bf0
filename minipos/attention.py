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
product ``P [V | 1] = [P V | sum_s P]`` updates ``o`` and ``l`` together. Bias and mask come from
callables evaluated one block at a time, and blocks that are masked throughout (e.g. key blocks in
the future of a query block under ``causal``) are skipped without any work.

The merge holds for *any* reference ``m``, not only the running max (``proofs.online_softmax``).
So once a row has one allowed logit ``m_0`` (under ``causal``, its logit at the diagonal key; else
the max of the first block), the other blocks keep ``m = m_0`` fixed: ``l >= e^0 = 1``, and no row
max or rescaling is needed. ``-m_0`` rides in an extra column of the queries against a row of
ones under the keys, so one product gives ``scale q . k - m_0``. Only a logit more than ~88
(float32; ~709 in float64) above ``m_0`` could overflow; the query block's ``[o | l]`` is then not
finite and that block is redone with the running max. The query blocks are independent, so they
run on several threads where that pays (``_threads``).
"""

from __future__ import annotations

import math
import threading

import numpy as np

from . import _threads
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
    return buf[: math.prod(shape)].reshape(shape)


def _block_term(value, name: str, qs: slice, ks: slice, target: tuple, *, boolean: bool):
    """Check one block's bias (float) or mask (bool) from ``name``; ``None`` passes through.

    Only the dtype and shape are checked here, which costs nothing per element; a bias holding
    NaN or +inf is caught once per query block from the row sums (``_check_row_sums``).
    """
    if value is None:
        return None
    if (type(value) is np.ndarray and value.ndim <= len(target) and value.shape == target[len(target) - value.ndim:]
            and (value.dtype == bool if boolean else value.dtype.kind == "f")):
        return value                                                      # the common case, checked
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
                        block_size: int = 1024, q_offset: int | None = None, workers: int | None = None,
                        bias_max_fn=None) -> np.ndarray:
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
      block ``(..., H, block, block)`` per worker plus ``O(... H (S + block) (D + Dv))``,
      whatever T and S.
    workers: threads that share the query blocks (a positive int); by default the cores (capped
      by ``MINIPOS_NUM_THREADS``) where the BLAS is an OpenBLAS found on Linux, whose own threads
      are then paused at one for the duration of the call, process-wide; else 1. Small problems run on
      one thread. ``bias_fn`` and ``mask_fn`` must then be safe to call from several threads (pure
      functions of their slices are). ``workers`` changes which thread computes a block, and with
      few query blocks it groups heads into tasks: results agree to rounding, and bit for bit when
      every head takes the same path (a group that falls back to the running max, or a BLAS that
      rounds its products differently on one thread than on several, can move the last bit).
    bias_max_fn: optional ``bias_max_fn(q_slice, k_slice)`` -> an upper bound of ``bias_fn``'s
      block, per head: broadcastable to ``(..., H, 1, 1)``. With it, a head whose whole block lies
      so far below the row's running max that ``e^{x - m}`` underflows to 0 (bounding
      ``scale q . k`` by ``scale |q| |k|``) is not computed, which leaves the result unchanged bit
      for bit; a block with no such head is skipped before ``bias_fn`` is called. A bound below
      the true maximum gives wrong results. ``alibi.alibi_bias_bound`` is ALiBi's:
      ``-m_h min |i - j|`` over the block.
    Rows with no allowed key give zeros. Equal to ``attention`` up to rounding. A bias holding
    NaN or +inf raises ``ValueError`` naming ``bias_fn`` (found once per query block from the row
    sums, not by a pass over every block); a ``-inf`` bias entry acts as a masked one.
    """
    q, k, v = _check_qkv(q, k, v)
    if bias_max_fn is not None and not callable(bias_max_fn):
        raise TypeError(f"bias_max_fn must be a callable (q_slice, k_slice) -> array, or None; "
                        f"got {type(bias_max_fn).__name__}")
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    D = q.shape[-1]
    scale = 1.0 / np.sqrt(D) if scale is None else check_float(scale, "scale")
    block, offset = _check_blockwise_args(bias_fn, mask_fn, causal, block_size, q_offset,
                                          q.shape[-2], k.shape[-2])
    workers = _threads.check_workers(workers)
    if q.ndim == 2:                                                        # no head axis: lend one
        bias_fn, mask_fn, bias_max_fn = (None if f is None else _heads_added(f)
                                         for f in (bias_fn, mask_fn, bias_max_fn))
        return blockwise_attention(q[None], k[None], v[None], bias_fn=bias_fn, mask_fn=mask_fn, causal=causal,
                                   scale=scale, block_size=block, q_offset=q_offset, workers=workers,
                                   bias_max_fn=bias_max_fn)[0]
    job = _Blockwise(q, k, v, dtype, dtype.type(scale), block, offset, causal, bias_fn, mask_fn, bias_max_fn)
    tasks, workers = job.tasks(workers)
    _threads.run(job.attend, tasks, workers)
    return job.out


def _sub_block(a, target, sel, heads, rows, keys):
    """Rows ``rows`` and keys ``keys`` of the heads ``heads`` of the task ``sel``, from a block
    term ``a`` broadcastable to ``target``; a view that the working block broadcasts against."""
    if a is None:
        return None
    if a.shape == target[-2:]:                                             # no head axis: (tq, tk)
        return a[rows, keys]
    if len(sel) == 1 and a.ndim >= 3 and a.shape[-3:] == target[-3:]:      # every head, all rows and keys
        return a[..., heads, rows, keys]
    return np.broadcast_to(a, target)[sel][..., heads, rows, keys]         # scalars, (tk,), (1, tk), ...


def _heads_added(fn):
    """``fn`` of a call without a head axis, its blocks given one (as ``q[None]``)."""
    def with_head(qs, ks):
        value = fn(qs, ks)
        return value if value is None else np.asarray(value)[None]
    return with_head


# Below this many multiply-adds (n T S (D + Dv)) one thread is faster than handing blocks out.
_THREADED_WORK = 1 << 24


class _Blockwise:
    """One call of ``blockwise_attention``: the inputs laid out for the block products, the output,
    and ``attend(qs, hs)``, which computes the rows ``qs`` of the heads ``hs`` (a task).

    A task fixes each row's reference ``m`` up front where it can: under ``causal`` without a
    ``mask_fn``, the row's logit at its diagonal key (``_diagonal_reference``). Otherwise its first
    key block (the one nearest the diagonal) runs as the online softmax, and its row maxima become
    the reference. From then on ``-m`` rides in a last column of the queries against a row of ones
    under the keys, so the product gives ``x - m`` directly and each block costs one product, the
    bias, one ``exp`` and one ``P [V | 1]``, with no row max and no rescaling (the merge identity
    holds for any reference; see ``proofs.online_softmax``). A later block rising more than ~88
    (float32) above ``m`` would overflow: the task's ``[o | l]`` is then not finite, and it is
    recomputed with the running max throughout. With ``bias_max_fn``, heads whose block cannot
    rise above the underflow of ``e^{x - m}`` are not computed (``_live_heads``).
    """

    def __init__(self, q, k, v, dtype, scale, block, offset, causal, bias_fn, mask_fn, bias_max_fn):
        *lead, T, D = q.shape
        S, Dv = v.shape[-2:]
        self.q, self.lead, self.T, self.S, self.D = q.astype(dtype, copy=False), tuple(lead), T, S, D
        self.kt1 = np.empty((*lead, D + 1, S), dtype)                       # [K^T ; 1]
        self.kt1[..., :D, :], self.kt1[..., D, :] = np.swapaxes(k, -1, -2), 1
        self.v1 = np.empty((*lead, S, Dv + 1), dtype)                       # [V | 1]: P [V | 1] = [P V | l]
        self.v1[..., :Dv], self.v1[..., Dv] = v, 1
        self.out = np.zeros((*lead, T, Dv), dtype)                          # (..., H, T, Dv)
        self.scale, self.block, self.offset, self.causal = scale, block, offset, causal
        self.bias_fn, self.mask_fn, self.bias_max_fn = bias_fn, mask_fn, bias_max_fn
        # max |k_s| over each aligned key block (key blocks start at multiples of block), for
        # bounding scale q . k by scale |q| |k|; only with bias_max_fn
        self.k_max = None
        if bias_max_fn is not None:
            norms = np.sqrt(np.einsum("...sd,...sd->...s", k, k)).astype(np.float64)      # (..., S)
            pad = -S % block
            norms = np.concatenate([norms, np.zeros((*lead, pad))], axis=-1) if pad else norms
            self.k_max = norms.reshape(*lead, -1, block).max(axis=-1)                  # (..., S / block)
        self.k = k.astype(dtype, copy=False)
        self.triangles, self.local, self.heads_per_task = {}, threading.local(), lead[-1]

    def tasks(self, workers: int) -> tuple[list, int]:
        """``([(qs, hs), ...], workers)``: a task per query block (and per group of heads when
        blocks are few), the costliest first, and the threads to run them on (1 for small work,
        the tasks then in order)."""
        blocks = [slice(i, min(i + self.block, self.T)) for i in range(0, self.T, self.block)]
        work = int(np.prod(self.lead)) * self.T * self.S * (self.D + self.v1.shape[-1])
        if workers == 1 or work < _THREADED_WORK or not blocks:
            return [(qs, None) for qs in blocks], 1
        H = self.lead[-1]
        groups = min(H, -(-2 * workers // len(blocks))) if len(blocks) < 2 * workers else 1
        size = -(-H // groups)
        self.heads_per_task = size
        heads = [None] if size == H else [slice(h, min(h + size, H)) for h in range(0, H, size)]

        def cost(task):
            qs, hs = task
            keys = min(self.S, qs.stop + self.offset) if self.causal else self.S
            return (qs.stop - qs.start) * max(keys, 0) * (1 if hs is None else hs.stop - hs.start)
        return sorted(((qs, hs) for qs in blocks for hs in heads), key=cost, reverse=True), workers

    def _scratch(self, lead, tq):
        """This thread's buffers, viewed for a task with leading dims ``lead`` and ``tq`` rows."""
        bufs = getattr(self.local, "bufs", None)
        if bufs is None:
            n = int(np.prod(self.lead[:-1])) * self.heads_per_task
            bq, bk, D, Dv1 = min(self.block, self.T), min(self.block, self.S), self.D, self.v1.shape[-1]
            dtype = self.out.dtype
            bufs = self.local.bufs = [np.empty(n * size, dtype) for size in
                                      (bq * bk, bq * (D + 1), bq * Dv1, bq * Dv1, bq, bq)]
        x, q1, o, pv, m, rowmax = bufs
        return (x, _buffer_view(q1, (*lead, tq, self.D + 1)), _buffer_view(o, (*lead, tq, self.v1.shape[-1])),
                pv, _buffer_view(m, (*lead, tq, 1)), rowmax)

    def attend(self, qs: slice, hs: slice | None) -> None:
        """Rows ``qs`` of the heads ``hs`` (``None``: all) into ``self.out``."""
        sel = (Ellipsis,) if hs is None else (Ellipsis, hs, slice(None), slice(None))
        q = self.q[sel]
        lead, tq, D = q.shape[:-2], qs.stop - qs.start, self.D
        x, q1, o, pv, m, rowmax = self._scratch(lead, tq)
        np.multiply(q[..., qs, :], self.scale, out=q1[..., :D])               # scale multiplies q . k only
        fixed = self._walk(qs, sel, q1, x, o, pv, m, rowmax, fixed_ok=True)
        if fixed and not np.isfinite(o).all():                                 # overflowed past the fixed m
            self._walk(qs, sel, q1, x, o, pv, m, rowmax, fixed_ok=False)
        l = o[..., -1:]                                                        # (..., H, tq, 1)
        _check_row_sums(l, qs)
        np.divide(o[..., :-1], l, out=self.out[sel][..., qs, :], where=l > 0)  # out = o / l (0 if l = 0)

    def _walk(self, qs, sel, q1, x, o, pv, m, rowmax, *, fixed_ok: bool) -> bool:
        """Fold every key block of the query block ``qs`` into ``m`` and ``[o | l]``; returns
        whether a fixed reference was used (see the class docstring)."""
        D, kt1, v1 = self.D, self.kt1[sel], self.v1[sel]
        m.fill(-np.inf)                                                        # m = -inf, l = 0, o = 0
        o.fill(0)
        fixed, bound, first = False, None, None
        key_slices = _key_slices(qs, self.S, self.block, self.causal, self.offset)
        if fixed_ok and self.causal and self.mask_fn is None and key_slices:
            first = self._bias(qs, key_slices[0])                             # (bias,): computed once
            reference = self._diagonal_reference(qs, key_slices[0], sel, q1, first[0])
            if reference is not None:
                m[...] = reference
                fixed, bound = True, self._bound_terms(q1, m)
                q1[..., D] = -m[..., 0]                                        # the product gives x - m
        for n, ks in enumerate(key_slices):
            target = (*self.lead, qs.stop - qs.start, ks.stop - ks.start)
            allowed = _block_allowed(self.mask_fn, self.causal, self.offset, qs, ks, target, self.triangles)
            if allowed is not None and not allowed.any():
                continue                                                       # masked throughout: skip
            heads = slice(None)
            if fixed and bound is not None:
                heads = self._live_heads(bound, qs, ks, sel)
                if heads is None:
                    continue                                                   # e^{x - m} = 0 throughout
            (bias,) = first if n == 0 and first is not None else self._bias(qs, ks)
            for rows, keys in _row_groups(qs, ks, self.causal, self.offset):
                sub = lambda a: _sub_block(a, target, sel, heads, rows, keys)  # noqa: E731
                qb = q1[..., heads, rows, :]
                *lead, nr, _ = qb.shape
                nk, width = keys.stop, D + 1 if fixed else D
                xb = np.matmul(qb[..., :width], kt1[..., heads, :width, ks][..., keys],
                               out=_buffer_view(x, (*lead, nr, nk)))           # scale q.k (- m)
                pvb, vb = _buffer_view(pv, (*lead, nr, v1.shape[-1])), v1[..., heads, ks, :][..., keys, :]
                if fixed:
                    _fold_fixed(xb, sub(bias), sub(allowed), vb, o[..., heads, rows, :], pvb)
                else:
                    _fold(xb, sub(bias), sub(allowed), vb, m[..., rows, :], o[..., rows, :], pvb,
                          _buffer_view(rowmax, (*lead, nr, 1)))
            if fixed_ok and not fixed and np.isfinite(m).all():
                fixed, bound = True, self._bound_terms(q1, m)
                q1[..., D] = -m[..., 0]                                        # from now on the product is x - m
        return fixed

    def _bias(self, qs, ks) -> tuple:
        """``(bias,)`` of the block, checked; ``(None,)`` without ``bias_fn``."""
        if self.bias_fn is None:
            return (None,)
        target = (*self.lead, qs.stop - qs.start, ks.stop - ks.start)
        return (_block_term(self.bias_fn(qs, ks), "bias_fn", qs, ks, target, boolean=False),)

    def _diagonal_reference(self, qs, ks, sel, q1, bias):
        """Under ``causal`` (no ``mask_fn``), each row's logit at its last allowed key
        ``s = min(t + offset, S - 1)``: ``(..., h, tq, 1)``, or ``None`` when a row has no such key
        in the first key block ``ks`` or that logit is not finite.

        Any allowed logit is a valid fixed reference: it is at most the row max, so the row's
        sum is at least ``e^0 = 1``, and the rows need no max over a block at all.
        """
        t = np.arange(qs.start, qs.stop)
        s = np.minimum(t + self.offset, self.S - 1)
        if s.min() < ks.start:                                                 # also t + offset < 0
            return None
        x = np.einsum("...td,...td->...t", q1[..., :self.D], self.k[sel][..., s, :])   # scale q_t . k_s
        if bias is not None:
            target = (*self.lead, qs.stop - qs.start, ks.stop - ks.start)
            x += np.broadcast_to(bias, target)[sel][..., np.arange(len(t)), s - ks.start]
        if not np.isfinite(x).all():
            return None
        return x[..., None]

    def _bound_terms(self, q1, m):
        """Per head of the task, over its rows: ``max scale |q_t|``, ``max -m_t`` and
        ``max |m_t|`` (float64), for ``_live_heads``; ``None`` without ``bias_max_fn``."""
        if self.bias_max_fn is None:
            return None
        q_norm = np.sqrt(np.einsum("...td,...td->...t", q1[..., :self.D], q1[..., :self.D]))
        minus_m = -m[..., 0].astype(np.float64)
        return (q_norm.max(axis=-1).astype(np.float64), minus_m.max(axis=-1), np.abs(minus_m).max(axis=-1))

    def _live_heads(self, bound, qs, ks, sel):
        """The range of heads (a slice of the task's heads) that may hold a logit with
        ``e^{x - m}`` above 0 in block ``(qs, ks)``, or ``None`` if there is none.

        For every row t of head h: ``x - m_t <= max_t scale |q_t| * max_s |k_s| + max_t -m_t + b_h``,
        where ``b_h`` is ``bias_max_fn``'s bound (Cauchy-Schwarz bounds ``q . k``); the terms are
        summed in float64 with a margin of ``1 + 1e-3 |terms|`` for the rounding of ``x`` in the
        working dtype. A logit below ``-ln(smallest subnormal)`` gives ``e^{x - m} = 0`` exactly.
        """
        target = (*self.lead, 1, 1)
        b = _block_term(self.bias_max_fn(qs, ks), "bias_max_fn", qs, ks, target, boolean=False)
        b = np.asarray(b, dtype=np.float64)
        b = (b if len(sel) == 1 and b.ndim >= 2 else np.broadcast_to(b, target)[sel])[..., 0, 0]   # (..., h)
        if np.isnan(b).any():
            raise ValueError(f"bias_max_fn(slice({qs.start}, {qs.stop}), slice({ks.start}, {ks.stop})) "
                             f"returned NaN; it must return an upper bound of the block's bias")
        q_max, minus_m_max, m_abs = bound
        b = np.maximum(b, -1e300)                                              # -inf (masked): far below
        qk = q_max * self.k_max[sel[:-1]][..., ks.start // self.block]        # (..., h): sel without tq
        live = qk + minus_m_max + b + 1.0 + 1e-3 * (qk + m_abs + np.abs(b)) >= _UNDERFLOW[self.out.dtype]
        if live.ndim > 1:
            live = np.broadcast_to(live, qk.shape).reshape(-1, qk.shape[-1]).any(axis=0)   # per head
        if not live.any():
            return None
        idx = np.flatnonzero(live)
        return slice(int(idx[0]), int(idx[-1]) + 1)


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


def _fold_fixed(x, bias, allowed, v_blk, o, pv) -> None:
    """``x`` is already ``scale q.k - m`` for a fixed ``m``: add the bias, mask, and add
    ``e^x [V | 1]`` to ``[o | l]``. An overflow (a logit far above ``m``) leaves ``o`` not finite,
    which the caller checks; the warnings it would raise are silenced here."""
    with np.errstate(over="ignore", invalid="ignore"):
        if bias is not None:
            np.add(x, bias, out=x)
        if allowed is not None:
            np.copyto(x, -np.inf, where=~allowed)
        np.exp(x, out=x)
        o += np.matmul(x, v_blk, out=pv)


def _fold(x, bias, allowed, v_blk, m, o, pv, rowmax) -> None:
    """Add the bias to the block's ``scale q.k``, mask it, and fold it into ``m`` and ``[o | l]``."""
    if bias is not None:
        np.add(x, bias, out=x)                                             # x = scale q.k + b
    if allowed is not None:
        np.copyto(x, -np.inf, where=~allowed)                              # masked logits -> -inf
    _online_update(x, v_blk, m, o, pv, rowmax)
