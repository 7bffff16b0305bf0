"""Scaled dot-product attention, knowing no position scheme.

Every scheme of minipos plugs into attention at one or more of its places: the four common seams
(input, rotate, bias, content-position), the value seam (Shaw et al.), the mask (NoPE reads
position from a causal one; sliding windows and chunks restrict it) and the logit temperature
(``scale``; YaRN's attention factor, Llama 4's query temperature). This module is what they plug
into; it sees only

    logits[..., h, t, s] = scale * q[..., h, t, :] . k[..., h, s, :] + bias[..., h, t, s]
    weights = softmax(logits where mask else -inf, axis=-1)          (a -inf bias masks its key too)
    out[..., h, t, :] = sum_s weights[..., h, t, s] v[..., h, s, :]

(Vaswani et al. 2017, arXiv:1706.03762, Eq. 1). The default ``scale`` is ``1/sqrt(D)``: for q, k
with independent unit-variance entries Var(q . k) = D (proved in ``proofs``). A value seam
(``value_fn``, Shaw et al. 2018, arXiv:1803.02155, Eq. 3) adds ``sum_s weights[..., h, t, s]
a[t, s, :]`` to ``out``.

``blockwise_attention`` computes the same ``out`` without holding a ``(T, S)`` array: the online
softmax (Milakov & Gimelshein 2018, arXiv:1805.02867; FlashAttention-2, arXiv:2307.08691, Alg. 1)
folds one block of logits ``x`` at a time into a running row max ``m``, sum ``l`` and output ``o``:

    m_new = max(m, rowmax(x))
    l     = l e^{m - m_new} + rowsum(e^{x - m_new})
    o     = o e^{m - m_new} + e^{x - m_new} V
    out   = o / l                       (0 where l = 0: a row with no allowed key)

The merge holds for any reference ``m`` (``proofs.online_softmax``); the running max keeps every
exponent ``<= 0``. ``minipos.fast`` has the same functions, faster, equal up to rounding.

``sinks`` (gpt-oss's per-head learned logit, ``(H,)``): ``sinks[h]`` is one more column of every
row of head ``h`` before the softmax, dropped after, so the row's weights sum to
``1 - p_sink`` with ``p_sink = e^{sink} / (e^{sink} + sum_s e^{logit_s})``, so a query may attend
to nothing. The sink has no value (its output is 0) and is not scaled. Blockwise, the running max
and sum start from the sink, ``m = sink``, ``l = 1``. Sinks may also be one per query, ``(..., H, T)``
(Inkling 2's ``sink_proj`` of each token's hidden state): row ``t`` of head ``h`` then gets ``sinks[..., h, t]``.

Conventions: q ``(..., H, T, D)``, k ``(..., H, S, D)``, v ``(..., H, S, Dv)``; bias and mask
broadcast to ``(..., H, T, S)`` without enlarging it. Masks are boolean, ``True`` = may attend; a
fully masked row gives zero weights and a zero output, never NaN. Outputs keep the inputs' dtype.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (as_float_array, check_alloc, check_axis, check_bool, check_broadcast, check_callable,
                      check_float, check_int, check_positive_int, check_qkv, check_result, Overflow)

__all__ = ["softmax", "causal_mask", "attention", "blockwise_attention", "softmax_backward", "attention_backward",
           "blockwise_attention_backward"]


def softmax(x: ArrayLike, axis: int = -1) -> np.ndarray:
    """Numerically stable softmax along ``axis``.

    ``x`` may hold ``-inf`` (a masked entry); a slice that is ``-inf`` throughout gives zeros
    there, not NaN. NaN or ``+inf`` in ``x`` raise ``ValueError``.

    x: any shape, floating (ints become float64). Returns the same shape and dtype.
    """
    x = as_float_array(x, "x", finite=False)
    axis = check_axis(axis, x.ndim)
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
    if not (T and S):
        return np.zeros((T, S), bool)                                    # empty: no positions to build
    check_alloc((T + S, 9), np.int8, "causal_mask(q_len, k_len)")    # the positions (int64) and ...
    check_alloc((T, S), bool, "causal_mask(q_len, k_len)")           # ... the mask
    t = np.arange(T)[:, None]
    s = np.arange(S)[None, :]
    return s <= t + (S - T)  # (T, S)


def attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, bias: ArrayLike | None = None, mask: ArrayLike | None = None,
              scale: float | None = None, return_weights: bool = False, value_fn: Callable | None = None,
              sinks: ArrayLike | None = None):
    """Multi-head scaled dot-product attention with an additive bias and a boolean mask.

    q: ``(..., H, T, D)``; k: ``(..., H, S, D)``; v: ``(..., H, S, Dv)``.
    bias: additive logits broadcastable to ``(..., H, T, S)`` (e.g. ALiBi or T5 ``(H, T, S)``);
      ``-inf`` masks that key, as in ``softmax`` and ``blockwise_attention``; NaN or ``+inf``
      raise where the mask allows. Entries the mask forbids are not read.
    mask: boolean, broadcastable to ``(..., H, T, S)``; ``True`` = may attend.
    scale: multiplies ``q . k`` only (not the bias); default ``1/sqrt(D)``. T5 uses ``1.0``.
    value_fn: ``value_fn(q_slice, k_slice, p)`` -> ``(..., H, tq, Dv)``, a term added to the output
      that is linear in the weights ``p`` of those queries and keys (Shaw et al.'s
      ``sum_j p_ij a^V_ij``), or ``None``.
    sinks: ``(H,)`` per-head sink logits (gpt-oss), ``(..., H, T)`` per-query ones (Inkling 2), or ``None``:
      a column appended to the logits before the softmax and dropped after (not scaled, not masked).
    Returns ``out`` ``(..., H, T, Dv)``, and the weights ``(..., H, T, S)`` too when
    ``return_weights``. Rows with no allowed key give zero weights and a zero output.
    """
    q, k, v, bias, mask, scale, sinks = _check_attention_args(q, k, v, bias, mask, scale, return_weights,
                                                              value_fn, sinks)
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    with np.errstate(over="ignore", invalid="ignore"):                   # an overflow is checked below
        q_scaled = (q * dtype.type(scale)).astype(dtype, copy=False)
        logits = q_scaled @ np.swapaxes(k, -1, -2).astype(dtype, copy=False)   # scale q . k   (..., H, T, S)
        if bias is not None:
            bias = bias.astype(dtype, copy=False)                         # the logits' dtype: rounding to -inf masks
            logits = logits + bias                                        #   + bias
    allowed = _allowed(bias, mask)                                        # the mask, and bias > -inf
    _check_logits(logits, allowed)
    if allowed is not None:
        logits = np.where(allowed, logits, dtype.type(-np.inf))            # masked -> -inf
    weights = softmax(logits) if sinks is None else _softmax_with_sinks(logits, sinks)   # (..., H, T, S)
    out = weights @ v.astype(dtype, copy=False)                           # sum_s weights v_s   (..., H, T, Dv)
    if value_fn is not None:                                              #   + sum_s weights a_ts (value seam)
        with np.errstate(over="ignore", invalid="ignore"):                # checked just below
            out = out + _value_term(value_fn, slice(0, q.shape[-2]), slice(0, k.shape[-2]), weights, out.shape)
        _check_output(out, value_fn)
    return (out, weights) if return_weights else out


def _check_attention_args(q, k, v, bias, mask, scale, return_weights, value_fn, sinks):
    """The checks of ``attention``: returns ``(q, k, v, bias, mask, scale, sinks)``, the arrays as
    floating arrays (the mask boolean), ``scale`` a float."""
    q, k, v = check_qkv(q, k, v)
    check_callable(value_fn, "value_fn", "(q_slice, k_slice, weights) -> array")
    sinks = _check_sinks(sinks, q, np.result_type(q.dtype, k.dtype, v.dtype))
    scale = check_scale(scale, q.shape[-1])
    check_bool(return_weights, "return_weights")
    shape = (*q.shape[:-1], k.shape[-2])                                  # (..., H, T, S)
    check_alloc(shape, np.result_type(q.dtype, k.dtype, v.dtype), "attention's logits (..., H, T, S)")
    bias, mask = check_bias_and_mask(bias, mask, shape)
    check_bias_values(bias, mask)       # as given: a bias too large for the logits' dtype is an Overflow, not this
    return q, k, v, bias, mask, scale, sinks


def _check_sinks(sinks, q, dtype):
    """``sinks`` as a finite ``(H,)`` (one per head) or ``(..., H, T)`` (one per query, ``q.shape[:-1]``)
    array for queries ``q`` ``(..., H, T, D)``, or ``None``; each sink must fit the logits' ``dtype``
    (it is one more logit)."""
    if sinks is None:
        return None
    sinks = as_float_array(sinks, "sinks")
    if q.ndim < 3 or sinks.shape not in ((q.shape[-3],), q.shape[:-1]):
        raise ValueError(f"sinks must have shape (H,) with H = q.shape[-3] (one logit per head) or q.shape[:-1] "
                         f"(..., H, T) (one per query); got sinks {sinks.shape} for q {q.shape}")
    with np.errstate(over="ignore"):                                      # checked just below
        fits = np.isfinite(sinks.astype(dtype, copy=False)).all()
    if not fits:
        raise ValueError(f"sinks must fit the logits' dtype {np.dtype(dtype)} (|sink| <= {np.finfo(dtype).max:.5g}), "
                         f"got a sink of {np.abs(sinks).max():.5g}")
    return sinks


def _allowed(bias, mask):
    """Where a query may attend: the mask allows the key and its bias is not ``-inf`` (``None``: everywhere)."""
    if bias is None or not np.isneginf(bias).any():
        return mask
    open_ = ~np.isneginf(bias)
    return open_ if mask is None else mask & open_


def _check_logits(logits, allowed=None) -> None:
    """Raise ``Overflow`` unless ``logits`` are finite wherever a query may attend (``allowed``;
    ``None``: everywhere). NaN and ``+inf`` in a bias are refused before, so a logit that is not
    finite is ``scale * q . k + bias`` overflowing its dtype."""
    where = True if allowed is None else allowed
    if np.any(~np.isfinite(logits) & where):
        raise Overflow(f"the logits scale * q . k + bias overflow {logits.dtype}; rescale q, k or bias, or use float64")


def _softmax_with_sinks(logits, sinks):
    """``softmax`` of each row of ``logits`` ``(..., H, T, S)`` with its head's sink as one more
    column, dropped after: the weights of a row sum to ``1 - p_sink``."""
    column = _sink_column(sinks, logits.shape, logits.dtype)              # (..., H, T, 1)
    return softmax(np.concatenate([logits, column], axis=-1))[..., :-1]  # softmax([logits | sink]) -> (..., H, T, S)


def _sink_column(sinks, shape, dtype):
    """The sink logits as a column ``(..., H, T, 1)`` for logits of ``shape`` ``(..., H, T, S)``: a head's
    sink ``(H,)`` in each of its rows, or each row's own ``(..., H, T)``."""
    column = sinks[:, None, None] if sinks.ndim == 1 else sinks[..., None]
    return np.broadcast_to(column.astype(dtype, copy=False), (*shape[:-1], 1))


def _value_term(value_fn, qs, ks, p, shape):
    """``value_fn(qs, ks, p)`` checked: a finite array of the output block's ``shape``, in ``p``'s dtype."""
    where = f"value_fn(slice({qs.start}, {qs.stop}), slice({ks.start}, {ks.stop}), p)"
    term = as_float_array(value_fn(qs, ks, p), where, finite=False)
    if term.shape != tuple(shape):
        raise ValueError(f"value_fn must return the output block's shape {tuple(shape)}, got {term.shape}")
    return _finite_in(term, p.dtype, where)


def _value_grad_term(value_grad_fn, qs, ks, p, dout):
    """``value_grad_fn(qs, ks, p, dout)`` checked: a finite array of the weights' block shape
    ``p.shape`` ``(..., H, tq, tk)`` (its share of ``dP``), in ``p``'s dtype."""
    where = f"value_grad_fn(slice({qs.start}, {qs.stop}), slice({ks.start}, {ks.stop}), p, dout)"
    term = as_float_array(value_grad_fn(qs, ks, p, dout), where, finite=False)
    if term.shape != p.shape:
        raise ValueError(f"{where} must return its share of dP, of the weights' block shape (..., H, tq, tk) = "
                         f"{p.shape}, got shape {term.shape}")
    return _finite_in(term, p.dtype, where)


def _finite_in(term, dtype, where: str):
    """``term`` in ``dtype``, or ``ValueError`` naming ``where`` if it holds NaN or inf there."""
    with np.errstate(over="ignore", invalid="ignore"):                   # checked just below
        term = term.astype(dtype, copy=False)
    if not np.isfinite(term).all():
        raise ValueError(f"{where} must return finite values that fit {dtype}, got NaN or inf")
    return term


def _check_output(out, value_fn) -> None:
    """Raise ``Overflow`` unless ``out`` (computed with overflow warnings silenced) is finite: the
    logits overflowed, or the output with ``value_fn``'s (finite) term did."""
    if value_fn is not None and not np.isfinite(out).all():
        raise Overflow(f"the output P V + value_fn's term, or the logits scale * q . k + bias, overflow {out.dtype}; "
                       "rescale v, value_fn's term, q, k or bias, or use float64")
    _check_logits(out)


def _block_term(fn, name: str, qs: slice, ks: slice, target: tuple, *, boolean: bool):
    """``fn(qs, ks)`` checked: a float (bias) or boolean (mask) block broadcastable to ``target``."""
    if fn is None:
        return None
    value = fn(qs, ks)
    if value is None:
        return None
    where = f"{name}(slice({qs.start}, {qs.stop}), slice({ks.start}, {ks.stop}))"
    if boolean:
        value = np.asarray(value)
        if value.dtype != bool:
            raise TypeError(f"{where} must return a boolean mask (True = may attend) or None, got dtype {value.dtype}")
    else:
        value = as_float_array(value, where, finite=False)
        if np.isnan(value).any() or np.isposinf(value).any():
            raise ValueError(f"{where} must return finite values (or -inf for a masked entry), got NaN or +inf")
    try:
        ok = np.broadcast_shapes(value.shape, target) == tuple(target)
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{where} returned shape {value.shape}, which does not broadcast to the block shape "
                         f"(..., H, tq, tk) = {tuple(target)}")
    return value


def blockwise_attention(q: ArrayLike, k: ArrayLike, v: ArrayLike, *, bias_fn: Callable | None = None,
                        mask_fn: Callable | None = None, causal: bool = False, scale: float | None = None,
                        block_size: int = 256, q_offset: int | None = None, return_lse: bool = False,
                        value_fn: Callable | None = None, sinks: ArrayLike | None = None):
    """``attention`` by the online softmax over query and key blocks, never holding ``(T, S)``.

    q: ``(..., H, T, D)``; k: ``(..., H, S, D)``; v: ``(..., H, S, Dv)``. Returns ``(..., H, T, Dv)``.
    bias_fn: ``bias_fn(q_slice, k_slice)`` -> additive logits for queries ``q_slice`` and keys
      ``k_slice`` (``slice`` objects of indices into the T and S axes), broadcastable to
      ``(..., H, tq, tk)``, or ``None``; e.g. ``lambda qs, ks: alibi_bias(slopes, i[qs], j[ks])``.
      Not scaled by ``scale``; ``-inf`` acts as a masked entry, NaN or ``+inf`` raise.
    mask_fn: ``mask_fn(q_slice, k_slice)`` -> boolean block mask (``True`` = may attend),
      broadcastable to ``(..., H, tq, tk)``, or ``None``. A block it masks throughout is skipped
      and ``bias_fn`` is not called there.
    causal: query ``t`` sees key ``s`` iff ``s <= t + q_offset``; ``q_offset`` (an int, only with
      ``causal``) defaults to ``S - T`` as in ``causal_mask``. Key blocks in a query block's future
      are never computed.
    block_size: queries and keys per block; memory is ``O(... H block^2)`` beside the inputs.
    return_lse: also return each row's log-sum-exp ``lse = m + ln l`` ``(..., H, T)`` (``-inf`` for
      a row with no allowed key), which ``blockwise_attention_backward`` recomputes P from.
    value_fn: as in ``attention``, called per block with the block's unnormalised weights
      ``e^{x - m_new}``; linear in them, its term is rescaled and summed with ``P V`` by the same
      online softmax.
    sinks: ``(H,)`` per-head or ``(..., H, T)`` per-query sink logits, or ``None``, as in ``attention``:
      the running max and sum of every row start from its sink (``lse`` then counts the sink).
    Rows with no allowed key give zeros. Equal to ``attention`` up to rounding.
    """
    q, k, v, scale, block, offset = check_blockwise_args(q, k, v, bias_fn, mask_fn, causal, scale,
                                                         block_size, q_offset)
    return_lse = check_bool(return_lse, "return_lse")
    check_callable(value_fn, "value_fn", "(q_slice, k_slice, weights) -> array")
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    sinks = _check_sinks(sinks, q, dtype)
    *lead, T, _ = q.shape
    out = np.zeros((*lead, T, v.shape[-1]), dtype)                       # (..., H, T, Dv)
    lse = np.full((*lead, T), -np.inf, dtype)                            # (..., H, T)
    blocks = _Blocks(q, k, bias_fn, mask_fn, causal, scale, block, offset, dtype)
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):  # an overflow is checked below
        for qs in blocks.query_slices():                                 # a loop over query blocks
            _attend_rows(qs, blocks, v, out, lse, value_fn, sinks)
    _check_output(out, value_fn)                                         # an overflowing logit leaves out not finite
    return (out, lse) if return_lse else out


class _Blocks:
    """The logits of one (query block, key block) of a blockwise call: ``scale q . k + bias``,
    masked entries ``-inf``, or ``None`` for a block masked throughout."""

    def __init__(self, q, k, bias_fn, mask_fn, causal, scale, block, offset, dtype):
        self.q, self.k, self.bias_fn, self.mask_fn = q, k, bias_fn, mask_fn
        self.causal, self.scale, self.block, self.offset, self.dtype = causal, dtype.type(scale), block, offset, dtype

    def query_slices(self):
        T = self.q.shape[-2]
        return [slice(i, min(i + self.block, T)) for i in range(0, T, self.block)]

    def key_slices(self, qs):
        """The key blocks queries ``qs`` may see (causal: none after key ``qs.stop - 1 + offset``)."""
        S = self.k.shape[-2]
        last = min(S, qs.stop + self.offset) if self.causal else S
        return [slice(j, min(j + self.block, last)) for j in range(0, max(last, 0), self.block)]

    def logits(self, qs, ks):
        target = (*self.q.shape[:-2], qs.stop - qs.start, ks.stop - ks.start)
        allowed = _block_term(self.mask_fn, "mask_fn", qs, ks, target, boolean=True)
        if self.causal:
            t, s = np.arange(qs.start, qs.stop)[:, None], np.arange(ks.start, ks.stop)[None, :]
            allowed = (s <= t + self.offset) if allowed is None else allowed & (s <= t + self.offset)
        if allowed is not None and not allowed.any():
            return None                                                 # masked throughout: skip
        q = (self.q[..., qs, :] * self.scale).astype(self.dtype, copy=False)
        x = q @ np.swapaxes(self.k[..., ks, :], -1, -2).astype(self.dtype, copy=False)   # scale q.k
        bias = _block_term(self.bias_fn, "bias_fn", qs, ks, target, boolean=False)
        if bias is not None:
            x = x + bias.astype(self.dtype, copy=False)                 # + b
        if allowed is not None:
            x = np.where(allowed, x, self.dtype.type(-np.inf))          # masked -> -inf
        return x                                                        # (..., H, tq, tk)


def _attend_rows(qs, blocks, v, out, lse, value_fn=None, sinks=None) -> None:
    """The rows ``qs`` of ``out`` and ``lse``: the online softmax over the key blocks they may see."""
    dtype, lead, tq = out.dtype, out.shape[:-2], qs.stop - qs.start
    m = np.full((*lead, tq, 1), -np.inf, dtype)                         # running row max
    l = np.zeros((*lead, tq, 1), dtype)                                 # running row sum
    if sinks is not None:                                               # the sink column folded in first:
        rows = sinks if sinks.ndim == 1 else sinks[..., qs]             # a head's, or these rows' own
        m = _sink_column(rows, (*lead, tq, 1), dtype).copy()            # m = sink
        l = np.ones((*lead, tq, 1), dtype)                              # l = e^{sink - m} = 1
    o = np.zeros((*lead, tq, out.shape[-1]), dtype)                     # running output
    for ks in blocks.key_slices(qs):                                    # a loop over key blocks
        x = blocks.logits(qs, ks)
        if x is not None:
            value = None if value_fn is None else (
                lambda p, ks=ks: _value_term(value_fn, qs, ks, p, (*p.shape[:-1], o.shape[-1])))
            m, l, o = _online_update(m, l, o, x, v[..., ks, :].astype(dtype, copy=False), value)
    out[..., qs, :] = np.divide(o, l, out=np.zeros_like(o), where=l > 0)   # out = o / l (0 if l = 0)
    lse[..., qs] = (m + np.log(l))[..., 0]                                 # -inf where l = 0


def _online_update(m, l, o, x, v_blk, value=None):
    """One step of the online softmax: fold the logits block ``x`` ``(..., tq, tk)`` into the
    running max ``m``, sum ``l`` ``(..., tq, 1)`` and output ``o`` ``(..., tq, Dv)``; ``value(p)``
    (or ``None``) is a term linear in the block's weights added to ``p V``."""
    m_new = np.maximum(m, x.max(axis=-1, keepdims=True))                 # m_new = max(m, rowmax(x))
    shift = np.where(np.isfinite(m_new), m_new, 0)                       # no allowed key yet: shift by 0
    alpha = np.exp(m - shift)                                            # e^{m - m_new} (0 for m = -inf)
    p = np.exp(x - shift)                                                # e^{x - m_new}
    o_blk = p @ v_blk if value is None else p @ v_blk + value(p)        # e^{x - m_new} (V + a)
    return m_new, l * alpha + p.sum(axis=-1, keepdims=True), o * alpha + o_blk


# --------------------------------------------------------------------------- gradients

def softmax_backward(p: ArrayLike, dp: ArrayLike, axis: int = -1) -> np.ndarray:
    """The gradient of ``softmax`` at output ``p``: ``dx = p * (dp - sum(p * dp))`` along ``axis``.

    The Jacobian of softmax is ``diag(p) - p p^T`` (proved in ``proofs.gradients``), symmetric, so
    the vector-Jacobian product is ``diag(p) dp - p (p . dp)``. p, dp: the same shape. A row
    with ``p = 0`` throughout (fully masked) gets ``dx = 0``.
    """
    p, dp = as_float_array(p, "p"), as_float_array(dp, "dp")
    if p.shape != dp.shape:
        raise ValueError(f"dp must have the shape of p {p.shape}, got {dp.shape}")
    axis = check_axis(axis, p.ndim)
    with np.errstate(over="ignore", invalid="ignore"):
        dx = p * (dp - np.sum(p * dp, axis=axis, keepdims=True))        # (diag(p) - p p^T) dp
    return check_result(dx, "p * dp")


def _reduce_to(grad: np.ndarray, shape: tuple) -> np.ndarray:
    """``grad`` summed over the axes that broadcasting added or stretched to reach its shape."""
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead else grad
    stretched = tuple(i for i, n in enumerate(shape) if n == 1 and grad.shape[i] != 1)
    return grad.sum(axis=stretched, keepdims=True) if stretched else grad


def attention_backward(q: ArrayLike, k: ArrayLike, v: ArrayLike, dout: ArrayLike, *, bias: ArrayLike | None = None,
                       mask: ArrayLike | None = None, scale: float | None = None, value_fn: Callable | None = None,
                       value_grad_fn: Callable | None = None, sinks: ArrayLike | None = None):
    """The gradients of ``attention(q, k, v, bias=bias, mask=mask, scale=scale, value_fn=value_fn,
    sinks=sinks)`` for ``dout``.

    dout: ``(..., H, T, Dv)``, the gradient of the output. Returns ``(dq, dk, dv, dbias)``, with
    ``dbias`` summed to the shape of the ``bias`` passed (``None`` without one). With
    ``S = scale q k^T + bias`` (masked: ``-inf``), ``P = softmax(S)`` and ``O = P V``:

        dV = P^T dO
        dP = dO V^T
        dS = P * (dP - rowsum(dP * P))        (softmax_backward; rowsum(dP * P) = rowsum(dO * O))
        dq = scale dS K,   dk = scale dS^T Q,   dbias = dS

    A fully masked row has ``P = 0``, so its gradients are zero. With a ``value_fn`` (see
    ``attention``), ``value_grad_fn(q_slice, k_slice, P, dO)`` returns its share of ``dP``
    ``(..., H, tq, tk)`` (and sums its parameters' gradients), added to ``dO V^T``.

    With ``sinks`` a fifth value ``dsinks`` of their shape: the sink column has no value, so its
    ``dP`` is 0 and ``dS_sink = -p_sink rowsum(dO * O)``, with ``p_sink = 1 - rowsum(P)``, one per row
    ``(..., H, T)``, summed over every row of the head for ``(H,)`` sinks. The formulas above hold
    unchanged with P the sink softmax's.
    """
    check_callable(value_grad_fn, "value_grad_fn", "(q_slice, k_slice, weights, dout) -> array")
    if (value_fn is None) != (value_grad_fn is None):
        raise ValueError("value_fn and value_grad_fn go together: pass both or neither")
    out, p = attention(q, k, v, bias=bias, mask=mask, scale=scale, return_weights=True,
                       value_fn=value_fn, sinks=sinks)                                # (..., H, T, S)
    q, k, v = check_qkv(q, k, v)
    dout = _check_grad(dout, out, "dout")
    scale = check_scale(scale, q.shape[-1])
    with np.errstate(over="ignore", invalid="ignore"):                   # checked just below
        dv = np.swapaxes(p, -1, -2) @ dout                               # P^T dO      (..., H, S, Dv)
        dp = dout @ np.swapaxes(v, -1, -2)                               # dO V^T      (..., H, T, S)
        if value_grad_fn is not None:                                    # + dO . a_ij
            dp = dp + _value_grad_term(value_grad_fn, slice(0, q.shape[-2]), slice(0, k.shape[-2]), p, dout)
        ds = p * (dp - np.sum(p * dp, axis=-1, keepdims=True))           # P * (dP - rowsum(dP * P))
        dq = scale * (ds @ k)                                            # (..., H, T, D)
        dk = scale * (np.swapaxes(ds, -1, -2) @ q)                       # (..., H, S, D)
    check_grads((dv, ds, dq, dk))
    dbias = None if bias is None else _reduce_to(ds, np.shape(bias)).astype(out.dtype, copy=False)
    grads = dq.astype(out.dtype, copy=False), dk.astype(out.dtype, copy=False), dv.astype(out.dtype, copy=False), dbias
    if sinks is None:
        return grads
    p_sink = 1 - p.sum(axis=-1)                                           # (..., H, T)
    return (*grads, _sink_grad(p_sink, np.sum(dout * out, axis=-1), sinks))


def _sink_grad(p_sink, rowsum, sinks):
    """``dsinks`` of the shape of ``sinks``: ``-p_sink * rowsum(dO * O)``, both ``(..., H, T)``, per query;
    summed over the rows of each head for ``(H,)`` sinks."""
    d = -(p_sink * rowsum)                                                # dS of the sink column, (..., H, T)
    return d.reshape(-1, *d.shape[-2:]).sum(axis=(0, 2)) if np.ndim(sinks) == 1 else d   # (H,) or (..., H, T)


def _check_grad(grad, like: np.ndarray, name: str) -> np.ndarray:
    """``grad`` as a finite array of ``like``'s shape, in its dtype."""
    grad = as_float_array(grad, name)
    if grad.shape != like.shape:
        raise ValueError(f"{name} must have the shape of the forward's output {like.shape}, got {grad.shape}")
    return grad.astype(like.dtype, copy=False)


def blockwise_attention_backward(q: ArrayLike, k: ArrayLike, v: ArrayLike, out: ArrayLike, lse: ArrayLike,
                                 dout: ArrayLike, *, bias_fn: Callable | None = None, mask_fn: Callable | None = None,
                                 causal: bool = False, scale: float | None = None, block_size: int = 256,
                                 q_offset: int | None = None, bias_grad_fn: Callable | None = None,
                                 value_grad_fn: Callable | None = None, sinks: ArrayLike | None = None):
    """The gradients of ``blockwise_attention`` (FlashAttention-2, Dao 2023, arXiv:2307.08691, Alg. 2).

    Takes the forward's arguments, its output ``out`` and ``lse`` (``return_lse=True``) and the
    output gradient ``dout`` ``(..., H, T, Dv)``; returns ``(dq, dk, dv)``. Each block of P is
    recomputed from the logits and ``lse`` instead of being stored, so no ``(T, S)`` array is held:

        D_i  = rowsum(dO_i * O_i)                     (= rowsum(dP_i * P_i), one value per row)
        P_ij = exp(S_ij - lse_i)
        dV_j += P_ij^T dO_i,    dP_ij = dO_i V_j^T,    dS_ij = P_ij * (dP_ij - D_i)
        dQ_i += scale dS_ij K_j,    dK_j += scale dS_ij^T Q_i

    bias_grad_fn: ``bias_grad_fn(q_slice, k_slice, dS_block)`` is called for every block that
    ``bias_fn`` was, with ``dS_block`` ``(..., H, tq, tk)``, the gradient of that block's logits
    (so of its bias): a scheme sums it into its parameters' gradients block by block.
    value_grad_fn: for a forward with a ``value_fn``: as in ``attention_backward``, called per block
    with ``P_ij`` and ``dO_i``; ``dP_ij`` gains the value term's share (``D_i`` holds it already,
    as ``out`` includes the term).
    sinks: the forward's ``(H,)`` or ``(..., H, T)`` sink logits, or ``None``; with them the result has a
      fourth value, ``dsinks`` of their shape: ``-p_sink_i D_i`` per row, ``p_sink_i = exp(sink_i - lse_i)``
      (summed over each head's rows for ``(H,)``).
    """
    q, k, v, scale, block, offset = check_blockwise_args(q, k, v, bias_fn, mask_fn, causal, scale,
                                                         block_size, q_offset)
    check_callable(bias_grad_fn, "bias_grad_fn", "(q_slice, k_slice, dS_block) -> None")
    check_callable(value_grad_fn, "value_grad_fn", "(q_slice, k_slice, weights, dout) -> array")
    dtype = np.result_type(q.dtype, k.dtype, v.dtype)
    out, lse, dout = check_backward_inputs(q, v, out, lse, dout, dtype)
    sinks = _check_sinks(sinks, q, dtype)
    dq, dk, dv = np.zeros(q.shape, dtype), np.zeros(k.shape, dtype), np.zeros(v.shape, dtype)
    blocks = _Blocks(q, k, bias_fn, mask_fn, causal, scale, block, offset, dtype)
    with np.errstate(over="ignore", invalid="ignore"):                   # checked at the end
        _blockwise_grads(blocks, v, lse, dout, out, dq, dk, dv, bias_grad_fn, scale, value_grad_fn)
    check_grads((dq, dk, dv))
    if sinks is None:
        return dq, dk, dv
    column = sinks[:, None] if sinks.ndim == 1 else sinks                 # a head's sink in each row, or the row's
    p_sink = np.exp(column.astype(dtype, copy=False) - lse)              # (..., H, T): e^{sink - lse}
    return dq, dk, dv, _sink_grad(p_sink, np.sum(dout * out, axis=-1), sinks)


def _blockwise_grads(blocks, v, lse, dout, out, dq, dk, dv, bias_grad_fn, scale, value_grad_fn=None) -> None:
    """The loops of ``blockwise_attention_backward``, summing into ``dq``, ``dk``, ``dv``."""
    q, k = blocks.q, blocks.k
    D = np.sum(dout * out, axis=-1, keepdims=True)                       # (..., H, T, 1): rowsum(dO * O)
    for qs in blocks.query_slices():                                     # a loop over query blocks
        for ks in blocks.key_slices(qs):                                 # a loop over key blocks
            x = blocks.logits(qs, ks)
            if x is None:
                continue
            p = np.exp(x - np.where(np.isfinite(lse[..., qs, None]), lse[..., qs, None], np.inf))  # P_ij
            dv[..., ks, :] += np.swapaxes(p, -1, -2) @ dout[..., qs, :]                  # dV_j += P^T dO_i
            dp = dout[..., qs, :] @ np.swapaxes(v[..., ks, :], -1, -2)                   # dP = dO_i V_j^T
            if value_grad_fn is not None:
                dp = dp + _value_grad_term(value_grad_fn, qs, ks, p, dout[..., qs, :])   # + dO_i . a_ij
            ds = p * (dp - D[..., qs, :])                                                # dS = P (dP - D_i)
            if bias_grad_fn is not None:
                bias_grad_fn(qs, ks, ds)
            dq[..., qs, :] += scale * (ds @ k[..., ks, :])                               # dQ_i += scale dS K_j
            dk[..., ks, :] += scale * (np.swapaxes(ds, -1, -2) @ q[..., qs, :])          # dK_j += scale dS^T Q_i


# --------------------------------------------------------------------------- checks shared with minipos.fast
# Public by name, as minipos.fast calls them too; not in __all__.

def check_scale(scale, D: int) -> float:
    """``scale`` as a finite float, or the default ``1/sqrt(D)`` for ``None`` (1 for ``D = 0``, where
    every ``q . k`` is 0 whatever the scale)."""
    if scale is None:
        return 1.0 / np.sqrt(D) if D else 1.0
    return check_float(scale, "scale")


def check_bias_and_mask(bias, mask, shape: tuple):
    """``(bias, mask)`` as a float array (``-inf`` allowed: a masked entry) and a boolean one, each
    broadcastable to the logits' ``shape`` ``(..., H, T, S)`` without enlarging it (``None`` stays)."""
    if bias is not None:
        bias = as_float_array(bias, "bias", finite=False)
        check_broadcast(bias, "bias", shape)
    if mask is not None:
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask must be a boolean array (True = may attend), got dtype {mask.dtype}")
        check_broadcast(mask, "mask", shape)
    return bias, mask


def check_bias_values(bias, mask) -> None:
    """Raise if ``bias`` holds NaN or ``+inf`` where ``mask`` lets a query attend (``None``: everywhere)."""
    where = True if mask is None else mask
    if bias is not None and np.any((np.isnan(bias) | np.isposinf(bias)) & where):
        raise ValueError("bias must not hold NaN or +inf where the mask lets a query attend (-inf is a masked entry)")


def check_blockwise_args(q, k, v, bias_fn, mask_fn, causal, scale, block_size, q_offset):
    """The checks of ``blockwise_attention`` and its backward: returns ``(q, k, v, scale, block,
    offset)``, the block clamped to the problem's size."""
    q, k, v = check_qkv(q, k, v)
    check_callable(bias_fn, "bias_fn")
    check_callable(mask_fn, "mask_fn")
    causal = check_bool(causal, "causal")
    scale = check_scale(scale, q.shape[-1])
    block = check_positive_int(block_size, "block_size")
    block = max(1, min(block, max(q.shape[-2], k.shape[-2])))            # memory follows the problem
    if q_offset is not None and not causal:
        raise ValueError("q_offset only applies with causal=True; pass a mask_fn for other masks")
    T, S = q.shape[-2], k.shape[-2]
    offset = S - T if q_offset is None else check_int(q_offset, "q_offset")
    if abs(offset) > 2 ** 62:
        raise ValueError(f"q_offset must have magnitude below 2**62, got {offset}")
    return q, k, v, scale, block, offset


def check_backward_inputs(q, v, out, lse, dout, dtype):
    """The forward's ``out`` ``(..., H, T, Dv)`` and ``lse`` ``(..., H, T)`` and the output gradient
    ``dout`` checked for ``blockwise_attention_backward``: returns ``(out, lse, dout)``, ``out`` and
    ``dout`` in ``dtype``."""
    *lead, T, _ = q.shape
    out = _check_grad(out, np.empty((*lead, T, v.shape[-1]), dtype), "out")
    dout = _check_grad(dout, out, "dout")
    lse = as_float_array(lse, "lse", finite=False)
    if lse.shape != (*lead, T) or np.isnan(lse).any() or np.isposinf(lse).any():
        raise ValueError(f"lse must be the forward's log-sum-exp of shape {(*lead, T)}, finite or -inf")
    return out, lse, dout


def check_grads(grads) -> None:
    """Raise ``Overflow`` unless every array of ``grads`` (computed with overflow warnings silenced) is finite."""
    for g in grads:
        check_result(g, "the gradients of attention for these q, k, v, out and dout")
