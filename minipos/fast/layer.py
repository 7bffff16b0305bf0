"""The layer, fast: ``minipos.layer.MultiHeadAttention`` with its attend step, the products of
its projections (and, for RoPE and xPos, step 3; for the content-position schemes, step 5) replaced.

Everything but the products of steps 2 and 8, the RoPE rotations and steps 5-7 of the forward pass
(content-position seam, bias seam and attention) is the reference's. Here:

- runs the projections' products on the kernel's threads with the BLAS paused
  (``_threads.matmul``), so no idle BLAS thread spins beside the kernel started right after;
- rotates RoPE's and xPos's q and k (and their gradients) by ``minipos.fast.rope`` (step 3,
  ``ROTATE``: the scheme's own method, given the fast module of the same names as ``ops``);
- runs ``minipos.fast.blockwise_attention`` (threads, fixed softmax reference, skipped blocks),
  with ``block_size`` or, for the dense default, 256 once the problem is large (small problems and
  ``return_weights`` take the reference's dense step);
- for a causal call over runs of consecutive positions, lets the kernel skip future blocks by
  index instead of masking them;
- builds the content-position seam's extra logits (Transformer-XL, DeBERTa) by BLAS products and
  flat gathers, and their gradients by the fast scatter-adds and products (step 5 and its
  ``extra_backward``, ``CONTENT_POSITION``: the scheme's own methods, given the fast module of the
  same names as ``ops``);
- keeps the content-position seam's extra logits of a forward pass for its backward, which would
  compute them again (only while they are small, and only as long as the pass's context lives);
- computes the bias of the schemes listed in ``HINTS`` in the layer's dtype by their fast
  functions, keeps bias blocks that depend on ``j - i`` only (every block on one diagonal is the
  same) from one call to the next while the scheme's parameters are unchanged, and hands the
  kernel a bound of the bias per block where one is known (ALiBi), so heads whose block is
  flushed to 0 throughout are skipped;
- applies ``sliding_window`` as a block mask, so key blocks wholly outside every query's window
  are skipped before they are scored. A layer with ``sinks`` takes the reference's attend step
  (dense or blockwise) and its backward: the kernel has no sink column.

A scheme whose value seam gives a term (``Shaw``) takes the reference's attend step, dense or
blockwise: the fast kernel has no value term.

The speed hints are a table keyed by the exact scheme class, not methods of the schemes: a
subclass that changes ``bias`` gets no hint and runs its own ``bias``.
"""

from __future__ import annotations

import threading
import weakref
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import layer as reference
from .._seam_checks import check_content_position
from ..alibi import ALiBi
from ..deberta import DeBERTa
from ..rope_scaling import Rotary
from ..t5 import T5Bias
from ..transformer_xl import TransformerXL
from ..xpos import XPos
from . import _threads
from . import alibi as fast_alibi
from . import deberta as fast_deberta
from . import rope as fast_rope
from . import t5 as fast_t5
from . import transformer_xl as fast_xl
from . import xpos as fast_xpos
from ._runs import is_run
from .attention import DENSE_LOGITS, blockwise_attention, blockwise_attention_backward

__all__ = ["MultiHeadAttention", "HINTS", "Hints", "CONTENT_POSITION", "ROTATE"]


@dataclass(frozen=True)
class Hints:
    """What the fast layer knows of a scheme's bias, for speed only.

    bias: ``bias(scheme, dtype, q_positions, k_positions)`` -> the scheme's ``bias(q, k)`` in
      ``dtype`` (equal up to rounding).
    state: ``state(scheme)`` -> a hashable value of everything the bias depends on besides the
      positions (the memo of bias blocks is kept while it is unchanged).
    bound: ``bound(scheme, q_positions, k_positions)`` -> an upper bound ``(H, 1, 1)`` of the
      block's bias, or ``None`` when none is known.
    """

    bias: Callable
    state: Callable
    bound: Callable | None = None


def _t5_bias(sc, dtype, q, k):
    out = fast_t5.t5_bias(sc.table, q, k, bidirectional=sc.bidirectional, num_buckets=sc.num_buckets,
                          max_distance=sc.max_distance)
    return out.astype(dtype, copy=False)


def _t5_state(sc):
    table = np.asarray(sc.table)
    return ("t5", sc.bidirectional, sc.num_buckets, sc.max_distance, table.dtype.str, table.shape, table.tobytes())


HINTS = {
    ALiBi: Hints(
        bias=lambda sc, dtype, q, k: fast_alibi.alibi_bias(sc.slopes, q, k, symmetric=sc.symmetric, dtype=dtype),
        state=lambda sc: ("alibi", sc.symmetric, np.asarray(sc.slopes).tobytes()),
        bound=lambda sc, q, k: fast_alibi.alibi_bias_bound(sc.slopes, q, k, symmetric=sc.symmetric)),
    T5Bias: Hints(bias=_t5_bias, state=_t5_state),
}


CONTENT_POSITION = {TransformerXL: fast_xl, DeBERTa: fast_deberta}
"""The module of position terms a scheme's content-position seam takes as ``ops`` (by exact class),
in step 5 and in its ``extra_backward``: BLAS products, flat gathers and fast scatter-adds (equal to
the reference's up to rounding). A subclass runs its own."""

ROTATE = {Rotary: fast_rope, XPos: fast_xpos}
"""The module of rotations a scheme's rotate seam takes as ``ops`` (by exact class), in step 3 and
its backward: RoPE's ``apply_rope`` and xPos's ``apply_xpos``, rotating in cache-sized chunks
(equal to the reference's up to rounding). A subclass runs its own."""

_KEPT_EXTRA = 32 << 20
"""Bytes of a forward pass's extra logits kept for its backward, at most (per pass)."""


class MultiHeadAttention(reference.MultiHeadAttention):
    """``minipos.layer.MultiHeadAttention``, faster; same arguments, weights, schemes and caches,
    outputs equal up to rounding. Bias blocks are kept between calls, up to 64 MiB."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._memo = None                                   # bias blocks kept across calls
        self._kept = weakref.WeakKeyDictionary()           # a pass's extra logits, while its context lives
        self._kept_lock = threading.Lock()

    def _heads(self, x, w, b, heads):
        """Step 2's products, their rows shared among the kernel's workers (``_threads.matmul``)."""
        with np.errstate(over="ignore", invalid="ignore"):               # checked by the caller
            y = _threads.matmul(x, w, _threads.default_workers())
            y = y if b is None else y + b
        B, T, _ = x.shape
        return y.reshape(B, T, heads, self.head_dim).transpose(0, 2, 1, 3)

    def _output(self, merged):
        """Step 8's product, its rows shared among the kernel's workers (``_threads.matmul``)."""
        with np.errstate(over="ignore", invalid="ignore"):               # checked by the caller
            y = _threads.matmul(merged, self.wo, _threads.default_workers())
            return y if self.bo is None else y + self.bo

    def _rotate(self, rotate, x, positions, seq_len):
        """Step 3 (and its backward), with the fast rotation of the schemes in ``ROTATE``."""
        ops = ROTATE.get(type(self.scheme))
        if ops is None:
            return super()._rotate(rotate, x, positions, seq_len)
        return self._checked_rotate(rotate, x, rotate(x, positions, seq_len=seq_len, ops=ops))

    def _content_position(self, q, k, q_pos, k_pos):
        """Step 5, with the fast position terms of the schemes in ``CONTENT_POSITION``."""
        ops = CONTENT_POSITION.get(type(self.scheme))
        if ops is None:
            return super()._content_position(q, k, q_pos, k_pos)
        return check_content_position(self.scheme.content_position(q, k, q_pos, k_pos, ops=ops), self.scheme, q)

    def _extra_backward(self, ctx, qs, ks, ds, add):
        """Step 5 reversed for a block, with the fast position terms of the schemes in ``CONTENT_POSITION``."""
        ops = CONTENT_POSITION.get(type(self.scheme))
        if ops is None:
            return super()._extra_backward(ctx, qs, ks, ds, add)
        return self.scheme.extra_backward(ctx.q, ctx.k, ctx.positions, ctx.k_positions, qs, ks, ds, add, ops=ops)

    def _attend(self, q, k, v, extra, q_pos, k_pos, mask, causal, return_weights, return_lse=False):
        T, S = len(q_pos), len(k_pos)
        block = self.block_size
        small = block is None and q.shape[0] * q.shape[1] * T * S < DENSE_LOGITS
        if return_weights or small or self.sinks is not None or self._value(q_pos, k_pos, v) is not None:
            # the kernel has no sink column and no value term
            return super()._attend(q, k, v, extra, q_pos, k_pos, mask, causal, return_weights, return_lse)
        hints = HINTS.get(type(self.scheme))
        if return_lse:                                                        # a context: a backward may follow
            extra = self._kept_extra(extra, q.shape[0] * q.shape[1] * T * S * np.dtype(self.dtype).itemsize)
        logits = self._fast_logits_fn(hints, extra, q_pos, k_pos)
        bound = None
        if hints is not None and hints.bound is not None and extra is None:
            bound = lambda qs, ks: hints.bound(self.scheme, q_pos[qs], k_pos[ks])  # noqa: E731
        out, lse = blockwise_attention(q, k, v, bias_fn=logits, scale=self.attention_scale(), block_size=block or 256,
                                       bias_max_fn=bound, return_lse=True,
                                       **self._kernel_mask(mask, causal, q_pos, k_pos))
        return out, None, lse if return_lse else None

    def _attend_backward(self, ctx, dout, add):
        """Steps 7 and 6 reversed with the fast blockwise backward wherever the forward ran the kernel."""
        T, S = len(ctx.positions), len(ctx.k_positions)
        if (ctx.lse is None or not (T and S) or self.sinks is not None
                or self._value(ctx.positions, ctx.k_positions, ctx.v) is not None):
            return super()._attend_backward(ctx, dout, add)
        sc = self.scheme
        hints = HINTS.get(type(sc))
        extra = self._kept_extra(ctx.extra, ctx.q_c.shape[0] * ctx.q_c.shape[1] * T * S * np.dtype(self.dtype).itemsize)
        logits = self._fast_logits_fn(hints, extra, ctx.positions, ctx.k_positions)
        logits_grad, dq_extra, dk_extra = self._logits_grad_fn(ctx, add)      # called one block at a time
        bound = None
        if hints is not None and hints.bound is not None and ctx.extra is None:
            bound = lambda qs, ks: hints.bound(sc, ctx.positions[qs], ctx.k_positions[ks])  # noqa: E731
        grads = blockwise_attention_backward(
            ctx.q_c, ctx.k, ctx.v, ctx.out, ctx.lse, dout, bias_fn=logits, scale=self.attention_scale(),
            block_size=self.block_size or 256, bias_grad_fn=logits_grad, bias_max_fn=bound,
            **self._kernel_mask(ctx.mask, ctx.causal, ctx.positions, ctx.k_positions))
        return (*grads, dq_extra, dk_extra)

    def _kernel_mask(self, mask, causal, q_pos, k_pos) -> dict:
        """The kernel's mask arguments. A causal call over runs of consecutive positions passes
        ``causal`` and ``q_offset`` (query t sees s <= t + offset: future blocks are skipped by index)
        and the other rules (window, chunks, padding) as a block mask; any other call the whole
        block mask (``minipos.masks.block_mask_fn``)."""
        if causal and len(q_pos) and len(k_pos) and is_run(q_pos) and is_run(k_pos):
            plain = mask is None and self.attention_chunk is None and self.sliding_window is None
            return dict(mask_fn=None if plain else self._allowed_fn(mask, False, q_pos, k_pos), causal=True,
                        q_offset=int(q_pos[0] - k_pos[0]))
        return dict(mask_fn=self._allowed_fn(mask, causal, q_pos, k_pos))

    def _kept_extra(self, extra, size: int):
        """``extra(qs, ks)``, each block kept for the pass's backward (which calls the same ``extra``,
        ``ctx.extra``) while the blocks of the pass take at most ``_KEPT_EXTRA`` bytes; the blocks go
        when ``extra`` (the pass's context) does."""
        if extra is None or size > _KEPT_EXTRA:
            return extra
        with self._kept_lock:
            blocks = self._kept.setdefault(extra, {})
        locks = {}

        def kept(qs, ks):
            key = (qs.start, qs.stop, ks.start, ks.stop)
            found = blocks.get(key)
            if found is not None:
                return found
            with self._kept_lock:
                lock = locks.setdefault(key, threading.Lock())
            with lock:                                        # computed once, though the kernel's tasks
                found = blocks.get(key)                       # for groups of heads ask for it together
                if found is None:
                    found = extra(qs, ks)
                    if isinstance(found, np.ndarray):
                        found.setflags(write=False)                            # shared with the backward
                    blocks[key] = found
            return found
        return kept

    def _fast_logits_fn(self, hints, extra, q_pos, k_pos):
        """``fn(q_slice, k_slice)``: the additive logits of a block (bias seam + content-position)."""
        sc, dtype = self.scheme, self.dtype
        if hints is None:
            def seam(q, k):
                bias = self._bias(q, k)                                        # the scheme's own, checked
                return None if bias is None else np.asarray(bias).astype(dtype, copy=False)
            memo = None
        else:
            seam = lambda q, k: hints.bias(sc, dtype, q, k)                    # noqa: E731
            stamp = (hints.state(sc), np.dtype(dtype).str)
            if self._memo is None or self._memo.stamp != stamp or self._memo.full():
                self._memo = _DistanceMemo(stamp)                              # kept for the next call
            memo = self._memo
        runs = memo is not None and is_run(q_pos) and is_run(k_pos)            # so is every slice

        def fn(qs, ks):
            q, k = q_pos[qs], k_pos[ks]
            bias = seam(q, k) if not runs else memo.get(q, k, lambda: seam(q, k))
            if extra is None:
                return bias
            more = extra(qs, ks)                                               # (B, H, tq, tk)
            return more if bias is None else more + bias
        return fn


class _DistanceMemo:
    """Bias blocks by ``(k_0 - q_0, tq, tk)`` for runs of consecutive positions.

    Under a bias that depends on ``j - i`` only, every block on one diagonal of the blockwise walk
    has the same bias; the blocks met first (nearest the diagonal) are kept, up to ``limit`` bytes.
    ``stamp`` names what the bias depends on (the scheme's parameters, the dtype): the layer keeps
    the memo across calls while it is unchanged and not ``full()``. Safe to share between threads.
    """

    def __init__(self, stamp, limit: int = 64 << 20):
        self.stamp, self.blocks, self.room, self.limit, self.lock = stamp, {}, limit, limit, threading.Lock()

    def full(self) -> bool:
        """Three quarters or more of ``limit`` used: a new call starts a fresh memo (decoding, each
        step a new block, would otherwise fill it with blocks never met again)."""
        return self.room <= self.limit // 4

    def get(self, q, k, compute):
        """The block for the (non-empty) runs of positions ``q``, ``k``, from the memo or ``compute()``."""
        key = (int(k[0] - q[0]), len(q), len(k))
        found = self.blocks.get(key)
        if found is not None:
            return found
        bias = compute()
        with self.lock:
            if key in self.blocks or bias.nbytes > self.room:
                return self.blocks.get(key, bias)
            self.room -= bias.nbytes
            bias.setflags(write=False)
            self.blocks[key] = bias
        return bias
