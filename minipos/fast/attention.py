"""Attention, fast: the blockwise kernel with a fixed softmax reference, threads and skipped blocks.

The same results as ``minipos.attention`` up to rounding. ``blockwise_attention`` here differs
from the reference's running-max loop in how, not what:

- **A fixed reference.** The online-softmax merge holds for any reference ``m`` (proved in
  ``proofs.online_softmax``), so once a row has one allowed logit ``m_0`` (under ``causal``, its
  logit at the diagonal key; else the max of its first block) every later block keeps ``m = m_0``:
  ``l >= 1`` and no row max or rescaling is needed. ``-m_0`` rides in an extra column of the
  queries against a row of ones under the keys, so one product gives ``scale q . k - m_0``, and
  ``P [V | 1] = [P V | l]`` updates output and sum together. A logit more than ~88 (float32) above
  ``m_0`` would overflow: that query block's ``[o | l]`` is then not finite, and it is redone with
  the running max.
- **Less work.** Key blocks are walked from the diagonal outwards; a block crossing the causal
  diagonal is cut into bands of rows so the masked triangle is not scored; terms ``e^{x - m}``
  below ``sqrt(tiny)`` are flushed to 0 (``_exp``: subnormal results cost x86 a microcode assist
  each); with ``bias_max_fn`` (an upper bound of the bias per head and block) heads whose block
  is flushed throughout are not computed, which changes no bit.
- **Threads.** Query blocks (and groups of heads, when blocks are few) are independent tasks,
  run on several threads where the BLAS is an OpenBLAS whose own threads can be paused (``_threads``).

``attention`` routes large problems through that kernel with the dense bias and mask sliced per
block (a mask equal to ``causal_mask`` is recognised and skipped natively; q, k and v are checked
finite from row sums by BLAS, ``_all_finite``; the bias is not read beforehand: a NaN or ``+inf``
where a query attends makes that row's sum non-finite, and the reference then decides); small
ones and ``return_weights`` go to the reference.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from .. import attention as reference
from .._checks import Overflow, as_float_array, check_bool, check_callable, check_finite, check_qkv, check_result
from . import _threads

__all__ = ["attention", "blockwise_attention", "blockwise_attention_backward"]

# Below this many logits (prod(...) H T S) the reference's dense attention is as fast.
DENSE_LOGITS = 1 << 18


def attention(q, k, v, *, bias=None, mask=None, scale=None, return_weights: bool = False, value_fn=None,
              sinks=None):
    """``minipos.attention.attention`` (same arguments and results, up to rounding), through the
    blockwise kernel for large problems: no ``(..., H, T, S)`` logits or weights are formed.
    With ``value_fn`` or ``sinks`` it is the reference (the kernel has no value term and no sink column)."""
    if check_bool(return_weights, "return_weights") or value_fn is not None or sinks is not None:
        return reference.attention(q, k, v, bias=bias, mask=mask, scale=scale, return_weights=return_weights,
                                   value_fn=value_fn, sinks=sinks)
    q, k, v = check_qkv(q, k, v, finite=False)
    shape = (*q.shape[:-1], k.shape[-2])                                   # (..., H, T, S)
    if math.prod(shape) < DENSE_LOGITS or q.ndim < 3:
        return reference.attention(q, k, v, bias=bias, mask=mask, scale=scale)
    workers = _threads.default_workers()
    for name, a in (("q", q), ("k", k), ("v", v)):
        if not _all_finite(a, workers):
            check_finite(a, name)                                         # the reference's error
    scale = reference.check_scale(scale, q.shape[-1])
    bias, given = reference.check_bias_and_mask(bias, mask, shape)        # NaN or +inf in bias: the kernel's catch
    causal = given is not None and _is_causal(given, shape[-2], shape[-1])
    mask = None if causal else given                                      # causal: skipped natively, block by block
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    if dtype not in _FLUSH:                                                # longdouble: the reference
        return reference.attention(q, k, v, bias=bias, mask=given, scale=scale)
    try:
        return _run(q, k, v, dtype, scale, _BLOCK, shape[-1] - shape[-2], causal, _slicer(bias), _slicer(mask),
                    None, workers, source="bias")
    except Overflow:
        # A row sum that is not finite: NaN or +inf in the bias where a query attends (named here,
        # without the reference's dense logits), or e^x v summed before the division overflowing
        # where the reference's normalised weights do not (v near the dtype's largest value): the
        # reference decides.
        reference.check_bias_values(bias, given)
        return reference.attention(q, k, v, bias=bias, mask=given, scale=scale)


def _all_finite(a: np.ndarray, workers: int) -> bool:
    """Whether a float array holds no NaN or inf, read at the speed of matrix-vector products.

    Any NaN or inf entry makes its row's sum non-finite (``inf + x = inf``, ``inf - inf = NaN``,
    NaN stays NaN), and a sum of finite entries is finite unless it overflows; so finite row sums
    settle it, and a non-finite one is settled by the exact test. ``A @ 1`` is a BLAS product,
    here about ten times faster than ``np.isfinite(A).all()``; its rows are shared among the
    kernel's workers, so it leaves no BLAS thread spinning beside them (see ``_threads``).
    """
    if (a.dtype not in (np.float32, np.float64) or a.ndim == 0 or not a.flags.c_contiguous
            or a.size < _THREADED_CHECK):
        return bool(np.isfinite(a).all())
    rows = a.reshape(-1, a.shape[-1])
    ones, step = np.ones(a.shape[-1], a.dtype), -(-rows.shape[0] // (2 * workers))
    parts = [(slice(r, r + step),) for r in range(0, rows.shape[0], step)]
    finite = [True] * len(parts)

    def check(part, index):
        with np.errstate(over="ignore", invalid="ignore"):                # an overflowing sum is settled below
            finite[index] = bool(np.isfinite(rows[part] @ ones).all())
    _threads.run(check, [(part, i) for i, (part,) in enumerate(parts)], workers)
    return all(finite) or bool(np.isfinite(a).all())


# Below this many entries one thread checks an array faster than several.
_THREADED_CHECK = 1 << 18


def _is_causal(mask: np.ndarray, T: int, S: int) -> bool:
    """Whether ``mask`` is ``causal_mask(T, S)`` (with leading dims of size 1): compared with
    ``np.tri(T, S, S - T)``, eight entries at a time as 64-bit words where the size allows (a
    2048-square mask in about 1.2 ms, building the pattern included)."""
    if mask.shape[-2:] != (T, S) or any(n != 1 for n in mask.shape[:-2]):
        return False
    rows = mask.reshape(-1)                                               # (T*S,), contiguous (a copy if strided)
    causal = np.tri(T, S, S - T, dtype=bool).reshape(-1)                  # s <= t + S - T
    if rows.size % 8 == 0:
        rows, causal = rows.view(np.uint64), causal.view(np.uint64)
    return bool(np.array_equal(rows, causal))


def _slicer(a):
    """``fn(q_slice, k_slice)``: the block of ``a`` (broadcastable to ``(..., H, T, S)``), or ``None``."""
    if a is None:
        return None
    a = a.reshape((1,) * (2 - a.ndim) + a.shape) if a.ndim < 2 else a
    rows, cols = a.shape[-2] > 1, a.shape[-1] > 1
    return lambda qs, ks: a[..., qs if rows else slice(None), ks if cols else slice(None)]


_BLOCK = 256


def blockwise_attention(q, k, v, *, bias_fn=None, mask_fn=None, causal: bool = False, scale=None,
                        block_size: int = 256, q_offset: int | None = None, return_lse: bool = False,
                        value_fn=None, sinks=None, workers: int | None = None, bias_max_fn=None):
    """``minipos.attention.blockwise_attention`` (same arguments and result, up to rounding), faster.
    With ``value_fn`` or ``sinks`` it is the reference (the kernel has no value term and no sink column).

    Two more keywords steer speed only:

    workers: threads that share the query blocks (a positive int); by default the cores (capped
      by ``MINIPOS_NUM_THREADS``) where the BLAS is an OpenBLAS found on Linux, whose own threads
      are then paused at one for the duration of the call, process-wide; else 1. Small problems
      run on one thread. ``bias_fn`` and ``mask_fn`` must then be safe to call from several
      threads (pure functions of their slices are).
    bias_max_fn: ``bias_max_fn(q_slice, k_slice)`` -> an upper bound of ``bias_fn``'s block per
      head, broadcastable to ``(..., H, 1, 1)``; heads whose whole block is flushed to 0
      (``e^{x - m}`` below ``sqrt(tiny)``) are then not computed, and a block with none left is
      skipped before ``bias_fn`` is called. A bound below the true maximum gives wrong results.
      ``alibi_bias_bound`` is ALiBi's.

    Results agree to rounding for any ``workers``, and bit for bit when every head takes the same
    path (a group that falls back to the running max, or a BLAS that rounds differently on one
    thread than on several, can move the last bit).
    """
    q, k, v, scale, block, offset = reference.check_blockwise_args(q, k, v, bias_fn, mask_fn, causal, scale,
                                                                   block_size, q_offset)
    check_callable(bias_max_fn, "bias_max_fn")
    return_lse = check_bool(return_lse, "return_lse")
    workers = _threads.check_workers(workers)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    if dtype not in _FLUSH or value_fn is not None or sinks is not None:   # longdouble, value_fn, sinks: the reference
        return reference.blockwise_attention(q, k, v, bias_fn=bias_fn, mask_fn=mask_fn, causal=causal, scale=scale,
                                             block_size=block, q_offset=q_offset, return_lse=return_lse,
                                             value_fn=value_fn, sinks=sinks)
    if q.ndim == 2:                                                        # no head axis: lend one
        bias_fn, mask_fn, bias_max_fn = (None if f is None else _heads_added(f)
                                         for f in (bias_fn, mask_fn, bias_max_fn))
        got = _run(q[None], k[None], v[None], dtype, scale, block, offset, causal, bias_fn, mask_fn, bias_max_fn,
                   workers, lse=return_lse)
        return (got[0][0], got[1][0]) if return_lse else got[0]
    return _run(q, k, v, dtype, scale, block, offset, causal, bias_fn, mask_fn, bias_max_fn, workers, lse=return_lse)


def _run(q, k, v, dtype, scale, block, offset, causal, bias_fn, mask_fn, bias_max_fn, workers, *,
         source: str = "bias_fn", lse: bool = False):
    """The kernel on checked arguments: ``(..., H, T, Dv)``, and ``lse`` ``(..., H, T)`` if asked."""
    job = _Blockwise(q, k, v, dtype, dtype.type(scale), block, offset, causal, bias_fn, mask_fn, bias_max_fn,
                     source)
    if lse:
        job.lse = np.full(q.shape[:-1], -np.inf, dtype)
    tasks, threads = job.tasks(workers)
    job.layout(threads)
    _threads.run(job.attend, tasks, threads)
    if not _all_finite(job.out, workers):
        check_result(job.out, "the output P V")
    return (job.out, job.lse) if lse else job.out


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


def _check_row_sums(l: np.ndarray, qs: slice, source: str = "bias_fn") -> None:
    """Raise if a row sum ``l`` of the query block ``qs`` is NaN or +inf.

    Every exponent is ``<= 0`` for finite logits, so ``0 <= l <= S``: a NaN or an infinite ``l``
    can only come from a NaN or +inf logit, i.e. from ``bias_fn`` (q, k and v are checked).
    """
    if not np.isfinite(l).all():
        raise Overflow(f"{source} must return finite values (or -inf for a masked entry), and scale * q . k "
                         f"+ {source} must not overflow {l.dtype}: the logits of queries "
                         f"slice({qs.start}, {qs.stop}) hold NaN or +inf")


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
    heads = _heads_that_count(gap, x.dtype)                              # the rest are flushed: P = 0 exactly
    if heads is None:
        _exp(np.subtract(x, shift, out=x))                               # P = e^{x - m_new}
        o += np.matmul(x, v_blk, out=pv)                                 #   + P [V | 1]
        return
    xs, ss, vs, os_, ps = (a.reshape(-1, *a.shape[-2:]) for a in
                           (x, shift, np.broadcast_to(v_blk, (*x.shape[:-2], *v_blk.shape[-2:])), o, pv))
    for h in heads:                                                      # a loop over heads, not positions
        _exp(np.subtract(xs[h], ss[h], out=xs[h]))
        os_[h] += np.matmul(xs[h], vs[h], out=ps[h])


def _heads_that_count(gap, dtype):
    """Indices (over the flattened leading dims) of heads with a row whose block can add to it.

    A row whose block maximum lies more than ``-ln(tiny)`` below the running max gets
    ``e^{x - m} = 0`` exactly (``_exp`` flushes it), so its exponentials and its ``P V`` product
    can be skipped without changing a bit. Returns ``None``
    when every head counts (the common case: one batched pass).
    """
    dead = gap < _FLUSH[np.dtype(dtype)]                                 # (..., H, tq, 1)
    if not dead.any():
        return None
    per_head = dead.reshape(-1, dead.shape[-2]).all(axis=-1)             # every row of the head is dead
    if not per_head.any():
        return None
    return np.flatnonzero(~per_head)


def _exp(x: np.ndarray) -> np.ndarray:
    """``e^x`` in place, with every ``x`` below ``_FLUSH`` giving exactly 0.

    Each ``e^x`` here is a term of a row sum that is at least 1 (``x`` is measured from an
    allowed logit at or below the row max, so that logit's own term is ``e^0 = 1``; in the
    backward the rows of ``P`` sum to 1), so terms below ``sqrt(tiny)`` (1e-19 in float32, 1e-154 in float64)
    are far below its rounding. Keeping them is costly on x86: an ``exp`` with a subnormal result,
    and a product of a tiny weight with a value in ``P V``, take a microcode assist, about 14
    times the cost of a normal one (measured here: a block of logits 90 below the reference took
    3.3 ms against 0.24 ms), and a decaying bias such as ALiBi's puts a band of such logits in
    most blocks. Masked logits (``-inf``) stay exactly 0.
    """
    np.copyto(x, -np.inf, where=x < _FLUSH[x.dtype])
    return np.exp(x, out=x)


def _flush_threshold(t) -> float:
    """``ln sqrt(tiny)``: -43.67 in float32, -354.20 in float64. In float16 ``sqrt(tiny)`` is not
    below rounding, so there it is the exact underflow of ``e^x`` (past the smallest subnormal)."""
    info = np.finfo(t)
    if t == np.float16:
        return math.log(float(info.smallest_subnormal)) - math.log(2.0) - 1.0
    return math.log(float(info.smallest_normal)) / 2


# e^x is flushed to 0 below these (``_exp``), and a head whose block lies wholly below is skipped
_FLUSH = {np.dtype(t): _flush_threshold(t) for t in (np.float16, np.float32, np.float64)}


def _key_slices(qs: slice, S: int, block: int, causal: bool, offset: int):
    """Key blocks a query block may see (with ``causal``, none past key ``qs.stop - 1 + offset``),
    last first: the blocks nearest the diagonal come first, so under a bias that decays with
    distance the running max is set early and the far blocks are flushed to 0 and skipped."""
    stop = min(S, qs.stop + offset) if causal else S
    return [slice(j, min(j + block, stop)) for j in range(0, stop, block)][::-1]


def blockwise_attention_backward(q, k, v, out, lse, dout, *, bias_fn=None, mask_fn=None, causal: bool = False,
                                 scale=None, block_size: int = 256, q_offset: int | None = None, bias_grad_fn=None,
                                 value_grad_fn=None, sinks=None, workers: int | None = None, bias_max_fn=None):
    """``minipos.attention.blockwise_attention_backward`` (same arguments and results up to
    rounding), faster: ``-lse`` rides in an extra column of the queries so one product gives
    ``S - lse`` and ``P = exp`` of it; future key blocks are skipped under ``causal``, heads whose
    block is flushed to 0 under ``bias_max_fn``; query blocks run on ``workers`` threads, each
    summing dK and dV into its own buffers. ``bias_grad_fn`` is called one block at a time (under a lock),
    with ``dS`` zero for the heads skipped there. With ``value_grad_fn`` or ``sinks`` it is the reference.
    """
    q, k, v, scale, block, offset = reference.check_blockwise_args(q, k, v, bias_fn, mask_fn, causal, scale,
                                                                   block_size, q_offset)
    check_callable(bias_grad_fn, "bias_grad_fn", "(q_slice, k_slice, dS_block) -> None")
    check_callable(bias_max_fn, "bias_max_fn")
    workers = _threads.check_workers(workers)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    if dtype not in _FLUSH or q.ndim == 2 or value_grad_fn is not None or sinks is not None:
        # longdouble, no head axis, a value term, sinks: the reference
        return reference.blockwise_attention_backward(q, k, v, out, lse, dout, bias_fn=bias_fn, mask_fn=mask_fn,
                                                      causal=causal, scale=scale, block_size=block,
                                                      q_offset=q_offset, bias_grad_fn=bias_grad_fn,
                                                      value_grad_fn=value_grad_fn, sinks=sinks)
    out, lse, dout = reference.check_backward_inputs(q, v, out, lse, dout, dtype)
    job = _BlockwiseGrad(q, k, v, dtype, dtype.type(scale), block, offset, causal, bias_fn, mask_fn, bias_max_fn,
                         out, lse, dout, bias_grad_fn)
    tasks, workers = job.tasks(workers)
    job.layout(workers)
    with np.errstate(over="ignore", invalid="ignore"):                     # checked just below
        _threads.run(job.grad, tasks, workers)
        grads = job.result()
    reference.check_grads(grads)
    return grads


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


# Below this many multiply-adds (n T S (D + Dv)) one thread is faster than handing blocks out
# (measured on 2 cores, causal float32: two workers took 1.8 times one at 2^24, the lab's
# attention, 1.2 times at 2^25 and 2^26, the same at 2^27 and 0.78 times at 2^28).
_THREADED_WORK = 1 << 27


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
    rise above the flush of ``e^{x - m}`` (``_exp``) are not computed (``_live_heads``).
    """

    def __init__(self, q, k, v, dtype, scale, block, offset, causal, bias_fn, mask_fn, bias_max_fn, source):
        *lead, T, D = q.shape
        S, Dv = v.shape[-2:]
        self.q, self.lead, self.T, self.S, self.D = q.astype(dtype, copy=False), tuple(lead), T, S, D
        self.kt1 = np.empty((*lead, D + 1, S), dtype)                       # [K^T ; 1]
        self.v1 = np.empty((*lead, S, Dv + 1), dtype)                       # [V | 1]: P [V | 1] = [P V | l]
        self._kv = (k, v)                                                   # laid out by layout()
        self.out = np.zeros((*lead, T, Dv), dtype)                          # (..., H, T, Dv)
        self.lse = None                                                     # (..., H, T) when asked for
        self.scale, self.block, self.offset, self.causal = scale, block, offset, causal
        self.bias_fn, self.mask_fn, self.bias_max_fn, self.source = bias_fn, mask_fn, bias_max_fn, source
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

    def layout(self, workers: int) -> None:
        """Fill ``[K^T ; 1]`` and ``[V | 1]``, a range of the (flattened) heads per thread."""
        k, v = self._kv
        D, Dv, n = self.D, v.shape[-1], int(np.prod(self.lead))
        kt1, v1 = self.kt1.reshape(n, D + 1, -1), self.v1.reshape(n, -1, Dv + 1)
        k, v = np.broadcast_to(k, (*self.lead, *k.shape[-2:])), np.broadcast_to(v, (*self.lead, *v.shape[-2:]))
        k, v = k.reshape(n, *k.shape[-2:]), v.reshape(n, *v.shape[-2:])

        def fill(hs):
            kt1[hs, :D, :], kt1[hs, D, :] = np.swapaxes(k[hs], -1, -2), 1
            v1[hs, :, :Dv], v1[hs, :, Dv] = v[hs], 1
        step = n if kt1.size + v1.size < _THREADED_CHECK else -(-n // workers)
        _threads.run(fill, [(slice(h, h + step),) for h in range(0, n, step)], workers, pause_blas=False)
        del self._kv

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
        with np.errstate(over="ignore", invalid="ignore"):                   # checked by the row sums and
            self._attend(qs, hs)                                               # the caller

    def _attend(self, qs: slice, hs: slice | None) -> None:
        sel = (Ellipsis,) if hs is None else (Ellipsis, hs, slice(None), slice(None))
        q = self.q[sel]
        lead, tq, D = q.shape[:-2], qs.stop - qs.start, self.D
        x, q1, o, pv, m, rowmax = self._scratch(lead, tq)
        np.multiply(q[..., qs, :], self.scale, out=q1[..., :D])               # scale multiplies q . k only
        fixed = self._walk(qs, sel, q1, x, o, pv, m, rowmax, fixed_ok=True)
        if fixed and not np.isfinite(o).all():                                 # overflowed past the fixed m
            self._walk(qs, sel, q1, x, o, pv, m, rowmax, fixed_ok=False)
        l = o[..., -1:]                                                        # (..., H, tq, 1)
        _check_row_sums(l, qs, self.source)
        np.divide(o[..., :-1], l, out=self.out[sel][..., qs, :], where=l > 0)  # out = o / l (0 if l = 0)
        if self.lse is not None:
            with np.errstate(divide="ignore"):
                self.lse[sel[:-1]][..., qs] = (m + np.log(l))[..., 0]          # lse = m + ln l (-inf if l = 0)

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
        live = qk + minus_m_max + b + 1.0 + 1e-3 * (qk + m_abs + np.abs(b)) >= _FLUSH[self.out.dtype]
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
        _exp(x)
        o += np.matmul(x, v_blk, out=pv)


def _fold(x, bias, allowed, v_blk, m, o, pv, rowmax) -> None:
    """Add the bias to the block's ``scale q.k``, mask it, and fold it into ``m`` and ``[o | l]``."""
    if bias is not None:
        np.add(x, bias, out=x)                                             # x = scale q.k + b
    if allowed is not None:
        np.copyto(x, -np.inf, where=~allowed)                              # masked logits -> -inf
    _online_update(x, v_blk, m, o, pv, rowmax)


class _BlockwiseGrad(_Blockwise):
    """One call of ``blockwise_attention_backward``: ``grad(qs, None)`` adds the query block ``qs``'s
    share to dQ (its own rows) and to this thread's dK and dV (summed by ``result``)."""

    def __init__(self, q, k, v, dtype, scale, block, offset, causal, bias_fn, mask_fn, bias_max_fn, out, lse, dout,
                 bias_grad_fn):
        super().__init__(q, k, v, dtype, scale, block, offset, causal, bias_fn, mask_fn, bias_max_fn, "bias_fn")
        self.heads_per_task = self.lead[-1]
        self.dout = dout
        self.row_d = np.einsum("...td,...td->...t", dout, out)[..., None]   # D_i = rowsum(dO * O)  (..., T, 1)
        huge = np.finfo(dtype).max / 8
        self.minus_lse = np.where(np.isfinite(lse), -lse, -huge).astype(dtype)   # no key: P = e^{-huge} = 0
        self.vt = np.ascontiguousarray(np.swapaxes(v, -1, -2), dtype=dtype)     # (..., Dv, S)
        self.dq = np.zeros(q.shape, dtype)
        self.partial, self.lock, self.bias_grad_fn = {}, threading.Lock(), bias_grad_fn

    def tasks(self, workers: int):
        """``([(qs, None), ...], workers)``: a task per query block (all heads), the costliest first."""
        blocks = [slice(i, min(i + self.block, self.T)) for i in range(0, self.T, self.block)]
        work = int(np.prod(self.lead)) * self.T * self.S * (self.D + self.v1.shape[-1])
        if workers == 1 or work < _THREADED_WORK or len(blocks) < 2:
            return [(qs, None) for qs in blocks], 1
        keys = lambda qs: min(self.S, qs.stop + self.offset) if self.causal else self.S  # noqa: E731
        return [(qs, None) for qs in sorted(blocks, key=lambda qs: -(qs.stop - qs.start) * max(keys(qs), 0))], workers

    def _accumulators(self):
        key = threading.get_ident()
        if key not in self.partial:
            with self.lock:
                self.partial[key] = (np.zeros(self.k.shape, self.out.dtype), np.zeros(self.v1[..., :-1].shape,
                                                                                       self.out.dtype))
        return self.partial[key]

    def grad(self, qs: slice, hs=None) -> None:
        with np.errstate(over="ignore", invalid="ignore"):                   # the caller checks the results
            self._grad(qs)

    def _grad(self, qs: slice) -> None:
        dk, dv = self._accumulators()
        D, tq, dtype = self.D, qs.stop - qs.start, self.out.dtype
        q1 = np.empty((*self.lead, tq, D + 1), dtype)
        np.multiply(self.q[..., qs, :], self.scale, out=q1[..., :D])
        q1[..., D] = self.minus_lse[..., qs]                                   # the product gives S - lse
        bound = self._bound_terms(q1, -q1[..., D:])
        do, row_d, q_blk = self.dout[..., qs, :], self.row_d[..., qs, :], self.q[..., qs, :]
        dq = np.zeros((*self.lead, tq, D), dtype)
        for ks in _key_slices(qs, self.S, self.block, self.causal, self.offset):
            target = (*self.lead, tq, ks.stop - ks.start)
            allowed = _block_allowed(self.mask_fn, self.causal, self.offset, qs, ks, target, self.triangles)
            if allowed is not None and not allowed.any():
                continue                                                       # masked throughout
            heads = slice(None)
            if bound is not None:
                heads = self._live_heads(bound, qs, ks, (Ellipsis,))
                if heads is None:
                    continue                                                   # P = 0 throughout
            (bias,) = self._bias(qs, ks)
            sel = (Ellipsis, heads, slice(None), slice(None))
            sub = lambda a: _sub_block(a, target, (Ellipsis,), heads, slice(None), slice(None))  # noqa: E731
            with np.errstate(over="ignore", invalid="ignore"):
                p = np.matmul(q1[sel], self.kt1[sel][..., ks])                 # S - lse
                if bias is not None:
                    p += sub(bias)
                if allowed is not None:
                    np.copyto(p, -np.inf, where=~sub(allowed))
                _exp(p)                                                        # P = exp(S - lse)
            dv[sel][..., ks, :] += np.matmul(np.swapaxes(p, -1, -2), do[sel])  # dV_j += P^T dO_i
            ds = np.matmul(do[sel], self.vt[sel][..., ks])                    # dP = dO V^T
            ds -= row_d[sel]
            ds *= p                                                            # dS = P (dP - D_i)
            if self.bias_grad_fn is not None:
                full = ds if heads == slice(None) else _zeros_but(ds, target, heads)
                with self.lock:
                    self.bias_grad_fn(qs, ks, full)
            dq[sel] += np.matmul(ds, self.k[sel][..., ks, :])                  # dQ_i += dS K_j (scale later)
            dk[sel][..., ks, :] += np.matmul(np.swapaxes(ds, -1, -2), q_blk[sel])   # dK_j += dS^T Q_i
        self.dq[..., qs, :] = dq * self.scale

    def result(self):
        dks, dvs = zip(*self.partial.values()) if self.partial else ((np.zeros(self.k.shape, self.out.dtype),),
                                                                    (np.zeros(self.v1[..., :-1].shape, self.out.dtype),))
        return self.dq, sum(dks) * self.scale, sum(dvs)


def _zeros_but(ds, target, heads):
    """``ds`` of the heads ``heads`` placed in zeros of the full block shape ``target``."""
    full = np.zeros(target, ds.dtype)
    full[..., heads, :, :] = ds
    return full
