"""Multi-head attention with a pluggable position scheme.

``MultiHeadAttention`` knows the projections, the heads and the KV cache; a *scheme* object knows
where position enters, through the seams of ``minipos.seams`` (input, rotate, bias,
content-position, value). Each scheme class sits with its math (``minipos.alibi.ALiBi``, ...) and
``minipos.schemes.SCHEMES`` lists them; this module re-exports every registered class, so
``from minipos.layer import ALiBi, Rotary`` works.

One forward pass, with ``x`` ``(B, T, d_model)`` (``MultiHeadAttention.__call__``, step by step)::

    1) x       = scheme.embed(x, positions)                               # input seam
    2) q, k, v = heads(x @ wq + bq), heads(x @ wk + bk), heads(x @ wv + bv)   # (B, H, T, D)
    3) q, k    = scheme.rotate_q(q, positions), scheme.rotate_k(k, positions)   # rotate seam
    4) k, v    = cache.extend(k, v, positions)                            # (B, KV, S, D), past keys first
               k, v = repeat_kv(k), repeat_kv(v)                          # GQA: (B, H, S, D)
    5) q, extra = scheme.content_position(q, k, positions, key_positions)   # content-position seam
    6) logits_bias(qs, ks) = scheme.bias(positions[qs], key_positions[ks]) + extra(qs, ks)   # bias seam
    7) out     = attention(q, k, v, bias=logits_bias(all, all), mask=..., scale=scheme.scale(D),
                           value_fn=scheme.value_position(positions, key_positions))   # value seam
               (mask: padding, causal, sliding window, chunks; scale: the layer's ``scale`` if set; sinks)
    8) y       = gate(x, merge_heads(out)) @ wo + bo    # (B, T, d_model); gate: none, or minipos.qk_norm's

A scheme whose frequencies depend on the length (dynamic-NTK or LongRoPE RoPE,
``rotates_cached_keys``) caches keys unrotated and rotates all S keys in step 4 instead, with this
call's frequencies. With ``block_size=N`` step 7 is ``blockwise_attention``, which calls the same
``logits_bias`` per (query block, key block), so no ``(T, S)`` array is ever held, for every
scheme. ``attention_chunk=C`` (Llama 4) adds the rule ``i // C == j // C`` to the mask of step 7.
``minipos.fast.MultiHeadAttention`` replaces steps 6-7, the products of steps 2 and 8 (``_heads``,
``_output``), step 3 for RoPE and xPos (``_rotate``) and step 5 for Transformer-XL and DeBERTa
(``_content_position``, ``_extra_backward``): there the scheme's own method runs with the fast
module of the same names as ``ops``. A layer whose projections are not one matrix each
(``minipos.mla.MultiHeadLatentAttention``) replaces step 2 only (``_project`` and
``_project_backward``); one with an output gate, step 8's ``_gate`` and ``_gate_backward``.

With a three-stream scheme (M-RoPE, ``MRotary``) ``positions`` are ``(3, T)``, with a two-stream one
(2-D RoPE, ``AxialRotary``: rows, then columns) ``(2, T)``; they feed step 3 only, and the mask and
the cache then follow the sequence order.

Weights are ``(d_in, d_out)`` and used as ``x @ W``; the projection columns are laid out head by
head (column ``h * D + d``), exactly as the ``view(B, T, H, D)`` of HF/fairseq/Meta code. To load a
checkpoint, copy ``W = linear.weight.T`` and ``b = linear.bias``:

==========  =======================  =========================  ===========================
minipos     HF T5 (``T5Attention``)  HF LLaMA (``LlamaAttn.``)  HF DeBERTa-v2 (``Disentangled
                                                                SelfAttention``)
==========  =======================  =========================  ===========================
``wq``      ``q.weight.T``           ``q_proj.weight.T``        ``query_proj.weight.T``
``wk``      ``k.weight.T``           ``k_proj.weight.T``        ``key_proj.weight.T``
``wv``      ``v.weight.T``           ``v_proj.weight.T``        ``value_proj.weight.T``
``wo``      ``o.weight.T``           ``o_proj.weight.T``        ``output.dense.weight.T`` [1]_
biases      none (``bias=False``)    none (``bias=False``)      ``query_proj.bias`` -> ``bq``, ...
scheme      ``T5Bias``: ``table`` =  ``Rotary(layout="half",    ``DeBERTa``: ``rel_embeddings``
            layer 0's ``relative_    base=rope_theta)``         = the encoder's LayerNorm'd
            attention_bias.weight``                             ``rel_embeddings.weight``
==========  =======================  =========================  ===========================

.. [1] In DeBERTa the output projection lives in ``DebertaV2SelfOutput``, followed by dropout,
   a residual and LayerNorm, which are outside attention.

The KV cache stores keys *after* the rotate seam, values, and the key positions; it changes only
once a call has succeeded. A decoding step's queries start at the cache length unless
``positions`` says otherwise.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ._checks import (Overflow, as_float_array, as_positions, check_alloc, check_bool, check_context, check_float,
                      check_float_dtype, check_int, check_positive_int, check_span, check_weighted)
from ._seam_checks import (check_bias, check_content_position, check_grads, check_like, check_pair, check_scale,
                           check_settings, checked_add, checked_value)
from .attention import attention, attention_backward, blockwise_attention, blockwise_attention_backward
from .cache import KVCache
from .masks import block_mask_fn, check_mask
from .mrope import stream_positions
from .schemes import ENTRIES, SCHEMES, class_named
from .seams import NoPE, Scheme

__all__ = ["MultiHeadAttention", "Context", "KVCache", "Scheme", "SCHEMES",
           *(entry.cls.__name__ for entry in ENTRIES.values())]


def __getattr__(name):
    """The scheme classes of the registry, by class name (``minipos.layer.ALiBi``), including any
    registered after this module was imported."""
    cls = class_named(name)
    if cls is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return cls


class MultiHeadAttention:
    """Multi-head self-attention with a position ``scheme`` (default ``NoPE()``).

    Weights ``wq``, ``wk``, ``wv`` ``(d_model, H*D)``, ``wo`` ``(H*D, d_model)``; with
    ``bias=True`` also ``bq``, ``bk``, ``bv`` ``(H*D,)`` and ``bo`` ``(d_model,)`` (else ``None``).
    ``head_dim`` defaults to ``d_model // num_heads``. Weights are drawn from N(0, 1/d_in) with
    ``seed``; copy a checkpoint's into the attributes (see the module docstring for the mapping).
    ``block_size=N`` computes attention blockwise (online softmax over N x N blocks of queries
    and keys): the same outputs without ever holding a ``(T, S)`` array; ``None`` is dense.
    ``num_kv_heads`` (HF ``num_key_value_heads``; default ``num_heads``) makes it grouped-query
    attention: ``wk``, ``wv`` are ``(d_model, num_kv_heads*D)``, the cache and every scheme's key-side
    work hold the key/value heads only, and key/value head ``j`` serves query heads
    ``j G … j G + G - 1`` (``G = num_heads // num_kv_heads``; ``num_kv_heads=1`` is MQA).
    ``attention_chunk=C`` (Llama 4's ``attention_chunk_size``) lets query i see key j only when
    ``i // C == j // C`` (by position), on top of ``causal`` and the mask: chunked attention.
    ``minipos.fast.MultiHeadAttention`` takes the same arguments and runs faster.

    ``sliding_window=W`` (Mistral, Gemma's local layers, gpt-oss's sliding layers) lets the query at
    position ``i`` see keys at ``i - W < j <= i`` only (HF's rule; calls must be ``causal``); a
    ``new_cache(mem_len=W - 1)`` is then the rolling cache. ``scale`` replaces the scheme's
    ``q . k`` scale (Gemma's ``query_pre_attn_scalar ** -0.5``). ``sinks=True`` adds gpt-oss's
    learned per-head sink logit ``sinks`` ``(H,)`` (zeros; HF ``GptOssAttention.sinks``). See
    ``minipos.local_global``, ``minipos.masks`` and ``docs/local-global.md``.
    """

    def __init__(self, d_model: int, num_heads: int, *, scheme: Scheme | None = None, head_dim: int | None = None,
                 bias: bool = False, seed: int = 0, dtype: DTypeLike = np.float64, block_size: int | None = None,
                 num_kv_heads: int | None = None, attention_chunk: int | None = None, sliding_window: int | None = None,
                 scale: float | None = None, sinks: bool = False):
        self.d_model = check_positive_int(d_model, "d_model")
        self.num_heads = check_positive_int(num_heads, "num_heads")
        self.num_kv_heads = self.num_heads if num_kv_heads is None else check_positive_int(num_kv_heads,
                                                                                           "num_kv_heads")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads ({num_kv_heads}) must divide num_heads ({num_heads}): each key/value "
                             "head serves num_heads // num_kv_heads query heads")
        if head_dim is None:
            if self.d_model % self.num_heads:
                raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads}), "
                                 "or pass head_dim")
            head_dim = self.d_model // self.num_heads
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.dtype = check_float_dtype(dtype)
        self.block_size = None if block_size is None else check_positive_int(block_size, "block_size")
        self.attention_chunk = None if attention_chunk is None else check_span(attention_chunk, "attention_chunk")
        if scheme is None:
            scheme = NoPE()
        if not isinstance(scheme, Scheme):
            raise TypeError(f"scheme must be a minipos.layer.Scheme instance, got {type(scheme).__name__}")
        bias = check_bool(bias, "bias")
        rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
        self._init_weights(rng, bias)
        self.sliding_window = None if sliding_window is None else check_span(sliding_window, "sliding_window")
        self.scale = None if scale is None else check_float(scale, "scale", positive=True)
        if self.scale is not None and "content-position" in scheme.seams:
            raise ValueError(f"scale overrides the q . k scale, but {type(scheme).__name__} scales its position "
                             "terms by its own rule; leave scale=None for it")
        self.sinks = np.zeros(self.num_heads, self.dtype) if check_bool(sinks, "sinks") else None   # (H,)
        scheme.bind(self, rng)
        self.scheme = scheme

    def configuration(self) -> tuple:
        """What a ``Context`` records of the layer that made it, so that ``backward`` knows its own:
        ``(name, value)`` pairs of the class name (the fast twin's is the same), the sizes, the
        dtype, the flags, the scheme's class and its settings (``Scheme.settings()``, read now, as
        ``"scheme.<name>"``). Two layers of one configuration take each other's contexts (and give
        the gradients of their own weights)."""
        sc = self.scheme
        return (("layer", type(self).__name__), ("d_model", self.d_model), ("num_heads", self.num_heads),
                ("num_kv_heads", self.num_kv_heads), ("head_dim", self.head_dim), ("dtype", self.dtype.name),
                ("bias", self.bo is not None), ("block_size", self.block_size),
                ("attention_chunk", self.attention_chunk), ("sliding_window", self.sliding_window),
                ("scale", self.scale), ("sinks", self.sinks is not None), ("scheme", type(sc).__name__),
                ("position_streams", sc.position_streams), ("rotates_cached_keys", sc.rotates_cached_keys),
                *check_settings(sc.settings(), sc))

    def attention_scale(self) -> float:
        """The factor of ``q . k`` in the logits: ``scale`` if given, else the scheme's (a finite
        number > 0, or ``ValueError`` naming the scheme)."""
        if self.scale is not None:
            return self.scale
        return check_scale(self.scheme.scale(self.head_dim), self.scheme, self.head_dim)

    def _init_weights(self, rng, bias: bool) -> None:
        """The projections' weights ``wq``, ``wk``, ``wv``, ``wo`` drawn from ``rng``, and the biases
        (zeros with ``bias``, else ``None``); sizes checked against memory first."""
        d, hd, kvd = self.d_model, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        check_alloc((4, d, hd), self.dtype, "MultiHeadAttention's weights (d_model, num_heads * head_dim)")
        self.wq = self._init(rng, d, hd)
        self.wk, self.wv = self._init(rng, d, kvd), self._init(rng, d, kvd)
        self.wo = self._init(rng, hd, d)
        zeros = (lambda n: np.zeros(n, self.dtype)) if bias else (lambda n: None)
        self.bq, self.bk, self.bv, self.bo = zeros(hd), zeros(kvd), zeros(kvd), zeros(d)

    def _weight_shapes(self) -> dict:
        """``name -> (shape, letters, optional)``: the shape each weight attribute must have (in the
        shape letters of the docs) and whether it may be ``None`` (a bias)."""
        d, hd, kvd = self.d_model, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        return {"wq": ((d, hd), "(d_model, num_heads * head_dim)", False),
                "wk": ((d, kvd), "(d_model, num_kv_heads * head_dim)", False),
                "wv": ((d, kvd), "(d_model, num_kv_heads * head_dim)", False),
                "wo": ((hd, d), "(num_heads * head_dim, d_model)", False),
                "bq": ((hd,), "(num_heads * head_dim,)", True), "bk": ((kvd,), "(num_kv_heads * head_dim,)", True),
                "bv": ((kvd,), "(num_kv_heads * head_dim,)", True), "bo": ((d,), "(d_model,)", True)}

    def _check_weights(self) -> None:
        """Raise naming the attribute unless every weight (as copied from a checkpoint, say) is a
        floating array of its shape; a bias may be ``None``. Shapes only: no pass over the values."""
        for name, (shape, letters, optional) in self._weight_shapes().items():
            w = getattr(self, name)
            if w is None and optional:
                continue
            if not isinstance(w, np.ndarray) or w.dtype.kind != "f":
                got = f"dtype {w.dtype}" if isinstance(w, np.ndarray) else type(w).__name__
                raise TypeError(f"{name} must be a floating NumPy array of shape {letters} = {shape}"
                                f"{' or None' if optional else ''}, got {got}")
            if w.shape != shape:
                raise ValueError(f"{name} must have shape {letters} = {shape}, got {w.shape}")

    def _weights(self) -> dict:  # name -> array or None, every weight of _weight_shapes(), for an error to name
        return {name: getattr(self, name) for name in self._weight_shapes()}

    def _init(self, rng, d_in, d_out):
        return (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(self.dtype)

    def new_cache(self, mem_len: int | None = None) -> KVCache:
        """An empty KV cache of this layer for incremental decoding (``mem_len``: see ``KVCache``)."""
        cache = KVCache(mem_len)
        cache._owner = weakref.ref(self)
        return cache

    def __call__(self, x: ArrayLike, *, positions: ArrayLike | None = None, mask: ArrayLike | None = None,
                 causal: bool = False, cache: KVCache | None = None, return_weights: bool = False,
                 return_context: bool = False):
        """Attend ``x`` ``(B, T, d_model)`` to itself (and to the cache); return ``(B, T, d_model)``.

        positions: ``(T,)`` integer positions of the queries; default ``cache.seen + arange(T)``
          (the cache length, unless ``mem_len`` made it forget keys).
        mask: boolean, ``True`` = may attend: ``(B, S)`` key padding, ``(B, T, S)`` or ``(B, H, T, S)`` (per
          head), ``S`` counting the cached keys too. causal: queries see keys at positions ``<=`` their own.
        cache: a ``KVCache`` of this layer (``new_cache()``), updated once the call has succeeded.
        return_weights: also return the attention weights ``(B, H, T, S)`` (dense path only).
        return_context: also return a ``Context`` of the pass, for ``backward(ctx, dy)``:
          ``y, ctx = layer(x, return_context=True)`` (after the weights, if both are asked for).
        """
        x, positions, mask, causal = self._check_call(x, positions, mask, causal, cache, return_weights)
        return_context = check_bool(return_context, "return_context")
        self.attention_scale()                                                  # the scheme's scale, checked first
        sc = self.scheme
        rot_pos = positions                                                     # (T,), or (3, T), (2, T)
        if rot_pos.ndim == 2:                                                   # streams: mask, cache by sequence order
            positions = (0 if cache is None else cache.seen) + np.arange(x.shape[1])
        past, k_pos = self._key_positions(positions, cache)                     # (S - T,), (S,) key positions
        seq_len = int(k_pos.max()) + 1 if len(k_pos) else 1                     # for length-dependent RoPE

        # 1) input seam: absolute position vectors added to the embeddings
        x_in = check_like(sc.embed(x, positions), sc, "embed(x, positions)", x, "(B, T, d_model)")
        # 2) projections, split into heads
        q_p, k_p, v = self._project(x_in)                                      # (B, H, T, D), (B, KV, T, D)
        for name, a in (("q", q_p), ("k", k_p), ("v", v)):      # x is finite: a weight or an overflow (None: shared)
            check_weighted(a, f"the projection {name} of x (step 2)", self._weights, "x or the weights of step 2")
        # 3) rotate seam: q and k rotated by their positions (RoPE, xPos, M-RoPE)
        q = self._rotate(sc.rotate_q, q_p, rot_pos, seq_len)                    # (B, H, T, D)
        k = k_p if sc.rotates_cached_keys or k_p is None else self._rotate(sc.rotate_k, k_p, rot_pos, seq_len)
        # 4) cache: the keys and values of earlier calls in front of this call's
        tag = sc.cache_tag(seq_len)
        if cache is not None:
            k, v = self._cached(k, v, positions, cache, tag)                    # (B, H, S, D)
        k_raw = k
        if sc.rotates_cached_keys:
            k = self._rotate(sc.rotate_k, k, k_pos, seq_len)                    # every key, this call's map
        k, v = self._repeat_kv(k), self._repeat_kv(v)                          # GQA: (B, H, S, D)
        # 5) content-position seam: the query used against content, and the extra logits
        q_c, extra = self._content_position(q, k, positions, k_pos)
        # 6) bias seam and 7) attention, dense or blockwise, with the value seam's term
        try:
            out, weights, lse = self._attend(q_c, k, v, extra, positions, k_pos, mask, causal, return_weights,
                                             return_context)
        except Overflow as err:
            raise Overflow(f"x, the weights or the scheme's parameters are too large: {err}") from None
        # 8) merge the heads, gate them (a layer with an output gate), output projection
        B, H, T, D = out.shape
        merged = self._gate(x_in, out.transpose(0, 2, 1, 3).reshape(B, T, H * D))   # (B, T, H*D)
        y = check_weighted(self._output(merged), "the output projection merged @ wo + bo (step 8)", self._weights,
                           "x, wo or bo")                                       # (B, T, d_model)
        if cache is not None:                                                   # the call succeeded
            self._commit(cache, T, tag)
        result = (y, weights) if return_weights else (y,)
        if return_context:
            result += (Context(x, positions, k_pos, seq_len, mask, causal, len(past), x_in, q, k_raw, k, v, q_c,
                               extra, out, lse, merged, rot_positions=rot_pos, configuration=self.configuration()),)
        return result if len(result) > 1 else y

    def _key_positions(self, positions, cache):  # (S - T,), (S,): the cached keys' positions, then every key's
        past = np.zeros(0, np.int64) if cache is None else cache.positions
        return past, np.concatenate([past, positions])

    def _cached(self, k, v, positions, cache, tag):  # step 4: this call's keys behind the cache's, (B, KV, S, D)
        return cache.extend(k, v, positions, tag=tag)[:2]

    def _commit(self, cache, T, tag):  # after a call that succeeded: the cache keeps this call's T keys, values
        cache._owner = cache._owner or weakref.ref(self)
        cache.commit(T, tag)

    def _rotate(self, rotate, x, positions, seq_len):
        """Step 3 (and its backward): ``rotate``, one of the scheme's ``rotate_q``, ``rotate_k`` or
        their backwards, on ``x`` at ``positions``; its result checked (``_checked_rotate``)."""
        return self._checked_rotate(rotate, x, rotate(x, positions, seq_len=seq_len))

    def _checked_rotate(self, rotate, x, got):
        """``got``, what the seam ``rotate`` returned for ``x``, if it is a finite array of ``x``'s shape
        and dtype; else ``ValueError``/``TypeError`` naming the seam and the scheme. The seam is named by
        the scheme's attribute that ``rotate`` is (a scheme may assign any function to ``rotate_q``)."""
        seam = next((n for n in ("rotate_q", "rotate_k", "rotate_q_backward", "rotate_k_backward")
                     if getattr(self.scheme, n, None) == rotate), getattr(rotate, "__name__", "rotate"))
        return check_like(got, self.scheme, f"{seam}(x, positions, seq_len=)", x, "(B, H, T, D)")

    def _content_position(self, q, k, q_pos, k_pos):
        """Step 5: the scheme's ``content_position``, ``(q_c, extra)`` (the query used against content,
        and ``extra(qs, ks)`` giving the extra logits of a block, or ``None``), checked."""
        return check_content_position(self.scheme.content_position(q, k, q_pos, k_pos), self.scheme, q)

    def _project(self, x_in):
        """Step 2: ``(q, k, v)``, ``(B, H, T, D)``, ``(B, KV, T, D)``, ``(B, KV, T, Dv)``, of the input."""
        q = self._heads(x_in, self.wq, self.bq, self.num_heads)                 # (B, H, T, D)
        k, v = (self._heads(x_in, w, b, self.num_kv_heads) for w, b in ((self.wk, self.bk), (self.wv, self.bv)))
        return q, k, v

    def _heads(self, x, w, b, heads):  # (B, T, d_model) -> (B, heads, T, D)
        with np.errstate(over="ignore", invalid="ignore"):               # checked by the caller
            y = x @ w if b is None else x @ w + b
        B, T, _ = x.shape
        return y.reshape(B, T, heads, self.head_dim).transpose(0, 2, 1, 3)

    def _gate(self, x_in, merged):  # step 8's output gate of (B, T, H*Dv) by x_in: none here (minipos.qk_norm)
        return merged

    def _gate_backward(self, ctx, dmerged, add):  # its backward: (d merged before it, d x_in); weights' to add
        return dmerged, 0.0

    def _output(self, merged):
        """Step 8's product: ``merged @ wo + bo``, ``(B, T, H*Dv) -> (B, T, d_model)`` (checked by the caller)."""
        with np.errstate(over="ignore", invalid="ignore"):
            return merged @ self.wo if self.bo is None else merged @ self.wo + self.bo

    def _repeat_kv(self, a):
        """Grouped-query attention: key/value head ``j`` serves query heads ``j G … j G + G - 1``
        (``G = num_heads // num_kv_heads``), as HF's ``repeat_kv``. ``(B, KV, S, D) -> (B, H, S, D)``."""
        group = self.num_heads // self.num_kv_heads
        return a if group == 1 else np.repeat(a, group, axis=1)

    def _repeat_kv_backward(self, d):
        """The adjoint of ``_repeat_kv``: key/value head ``j``'s gradient is the sum over its query heads
        ``j G … j G + G - 1``. ``(B, H, S, D) -> (B, KV, S, D)``."""
        group = self.num_heads // self.num_kv_heads
        return d.reshape(d.shape[0], self.num_kv_heads, group, *d.shape[2:]).sum(axis=2)

    def _logits_fn(self, extra, q_pos, k_pos):
        """``logits(qs, ks)``: the bias seam plus the content-position seam's extra logits of the
        queries ``qs`` and keys ``ks`` (index slices), ``(H, tq, tk)`` or ``(B, H, tq, tk)``, or ``None``."""
        def logits(qs, ks):
            bias = self._bias(q_pos[qs], k_pos[ks])                             # (H, tq, tk) or None
            more = None if extra is None else extra(qs, ks)                     # (B, H, tq, tk) or None
            return more if bias is None else bias if more is None else bias + more
        return logits

    def _bias(self, q_pos, k_pos):
        """The bias seam for a block of positions, checked: ``None`` or ``(H, tq, tk)``."""
        return check_bias(self.scheme.bias(q_pos, k_pos), self.scheme, (self.num_heads, len(q_pos), len(k_pos)))

    def _value(self, q_pos, k_pos, v):
        """The value seam's ``value(qs, ks, p)`` for values ``v`` ``(B, H, S, Dv)``, each term checked, or ``None``."""
        return checked_value(self.scheme.value_position(q_pos, k_pos), self.scheme, v.shape[:2], v.shape[-1])

    def _allowed_fn(self, mask, causal, q_pos, k_pos):
        """``allowed(qs, ks)``: causal (by positions), the sliding window, the chunks and the padding
        mask of a block, or ``None`` (``minipos.masks.block_mask_fn``)."""
        return block_mask_fn(mask, causal, q_pos, k_pos, window=self.sliding_window, chunk=self.attention_chunk)

    def _attend(self, q, k, v, extra, q_pos, k_pos, mask, causal, return_weights, return_lse=False):
        """Steps 6 and 7: ``(out, weights or None, lse or None)`` of attention over all blocks or one."""
        logits, allowed = self._logits_fn(extra, q_pos, k_pos), self._allowed_fn(mask, causal, q_pos, k_pos)
        scale = self.attention_scale()
        value = self._value(q_pos, k_pos, v)                                  # value seam, or None
        if self.block_size is None:
            every = (slice(0, len(q_pos)), slice(0, len(k_pos)))
            got = attention(q, k, v, bias=logits(*every), mask=allowed(*every), scale=scale,
                            return_weights=return_weights, value_fn=value, sinks=self.sinks)
            return (*got, None) if return_weights else (got, None, None)
        got = blockwise_attention(q, k, v, bias_fn=logits, mask_fn=allowed, scale=scale, block_size=self.block_size,
                                  return_lse=return_lse, value_fn=value, sinks=self.sinks)
        return (got[0], None, got[1]) if return_lse else (got, None, None)

    # ----------------------------------------------------------------------- backward

    def backward(self, ctx: "Context", dy: ArrayLike) -> dict:
        """The gradients of a pass for the output gradient ``dy`` ``(B, T, d_model)``.

        ctx: the ``Context`` returned by ``layer(x, ..., return_context=True)``. Returns a dict keyed
        by parameter name as the golden vectors name them: ``"x"``, ``"wq"``, ``"wk"``, ``"wv"``,
        ``"wo"``, ``"bq"``, ``"bk"``, ``"bv"``, ``"bo"`` (with ``bias=True``), ``"sinks"`` (with
        ``sinks=True``) and the scheme's learned parameters as ``"scheme.<name>"`` (``"scheme.table"``,
        ``"scheme.u"``, ...). Keys and values from earlier calls (a cache) are constants here. The
        forward's steps, reversed; a weight holding NaN or inf raises ``Overflow`` naming it. A pass
        with ``B`` or ``T`` 0 gives every gradient as zeros (an empty output depends on nothing).
        """
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx must be the Context of a forward pass (return_context=True), got {type(ctx).__name__}")
        check_context(self.configuration(), ctx.configuration)                # made by a layer of this configuration
        self._check_weights()
        dy = as_float_array(dy, "dy")
        if dy.shape != ctx.x.shape:
            raise ValueError(f"dy must have the shape of the output {ctx.x.shape}, got {dy.shape}")
        if not dy.size:                                                # B or T is 0: an empty y depends on nothing
            return {n: np.zeros(shape, np.result_type(ctx.merged, dy)) for n, shape in self._grad_shapes(ctx).items()}
        sc, grads = self.scheme, {}
        add = lambda name, g: grads.__setitem__(name, g if name not in grads else grads[name] + g)  # noqa: E731
        shapes = self._grad_shapes(ctx)
        sc_add = checked_add(add, sc, shapes)                                  # what the scheme's seams hand back
        B, T, _ = dy.shape
        # 8) output projection: y = gate(x_in, merged) wo + bo
        with np.errstate(over="ignore", invalid="ignore"):                     # every gradient is checked at the end
            add("wo", ctx.merged.reshape(B * T, -1).T @ dy.reshape(B * T, -1))  # merged^T dy
            if self.bo is not None:
                add("bo", dy.sum(axis=(0, 1)))
            dmerged, dx_gate = self._gate_backward(ctx, dy @ self.wo.T, add)    # (B, T, H*Dv), before the gate
        dout = check_weighted(dmerged, "dy @ wo^T", self._weights, "dy or wo")
        dout = dout.reshape(B, T, self.num_heads, -1).transpose(0, 2, 1, 3)    # (B, H, T, Dv)
        # 7) attention, and 6) the logits' bias: dS goes to the bias seam and the content-position seam
        dq_c, dk, dv, dq_extra, dk_extra = self._attend_backward(ctx, dout, add)
        # 5) content-position seam: the query used against content
        dq = check_like(sc.content_position_backward(dq_c, sc_add), sc, "content_position_backward(dq_c, add)",
                        dq_c, "(B, H, T, D)") + dq_extra                       # (B, H, T, D)
        dk = dk + dk_extra                                                      # (B, H, S, D)
        dk, dv = self._repeat_kv_backward(dk), self._repeat_kv_backward(dv)     # GQA: (B, KV, S, D)
        # 4) cache: the gradients of this call's keys and values (earlier ones are constants)
        if sc.rotates_cached_keys:
            dk = self._rotate(sc.rotate_k_backward, dk, ctx.k_positions, ctx.seq_len)
        dk, dv = dk[..., ctx.past:, :], dv[..., ctx.past:, :]                  # none if the keys are shared
        # 3) rotate seam: its parameters' gradients (of the rotated q and k), then the maps' transposes
        rot_pos = ctx.positions if ctx.rot_positions is None else ctx.rot_positions   # (T,) or (3, T)
        k_rot = None if sc.rotates_cached_keys else ctx.k_raw[..., ctx.past:, :]      # this call's, (B, KV, T, D)
        sc.rotate_parameters_backward(ctx.q, dq, k_rot, None if k_rot is None else dk, rot_pos, sc_add)
        dq = self._rotate(sc.rotate_q_backward, dq, rot_pos, ctx.seq_len)
        if not sc.rotates_cached_keys and dk.shape[-2]:
            dk = self._rotate(sc.rotate_k_backward, dk, rot_pos, ctx.seq_len)
        # 2) projections: q = heads(x_in wq + bq), ...; 8)'s gate reads x_in too
        dx_in = self._project_backward(ctx.x_in, dq, dk, dv, add) + dx_gate
        check_weighted(dx_in, "the gradient of x (steps 2 and 8 reversed)", self._weights, "dy (or x and the weights)")
        # 1) input seam
        add("x", check_like(sc.embed_backward(dx_in, ctx.positions, sc_add), sc, "embed_backward(dx, positions, add)",
                            dx_in, "(B, T, d_model)"))
        for name, g in grads.items():                                          # a sum over B T may overflow
            check_weighted(np.asarray(g), f"the gradient of {name}", self._weights, "dy (or x and the weights)")
        return grads

    def _grad_shapes(self, ctx) -> dict:
        """``name -> shape`` of every gradient ``backward`` returns: ``x``, the weights, ``sinks`` and the
        scheme's learned parameters (``scheme.<name>``), which a scheme's backward seams may hand back."""
        shapes = {"x": ctx.x.shape, **{name: getattr(self, name).shape for name in self._weight_shapes()
                                       if getattr(self, name) is not None}}
        if self.sinks is not None:
            shapes["sinks"] = self.sinks.shape
        params = self.scheme.parameters()
        if not isinstance(params, dict) or not all(isinstance(p, np.ndarray) for p in params.values()):
            raise TypeError(f"{type(self.scheme).__name__}.parameters() (scheme {self.scheme.name!r}) must return a "
                            f"dict of name -> NumPy array, got {params!r:.200}")
        shapes.update({f"scheme.{name}": p.shape for name, p in params.items()})
        return shapes

    def _project_backward(self, x_in, dq, dk, dv, add):
        """Step 2 reversed: the weights' gradients to ``add``; returns the gradient of ``x_in``."""
        B, T, _ = x_in.shape
        dx_in = np.zeros_like(x_in)
        for name, d in (("q", dq), ("k", dk), ("v", dv)):
            d2 = d.transpose(0, 2, 1, 3).reshape(B, T, -1)                      # (B, T, H*D)
            add("w" + name, x_in.reshape(B * T, -1).T @ d2.reshape(B * T, -1))  # x_in^T d
            if getattr(self, "b" + name) is not None:
                add("b" + name, d2.sum(axis=(0, 1)))
            dx_in += d2 @ getattr(self, "w" + name).T
        return dx_in

    def _attend_backward(self, ctx, dout, add):
        """Steps 7 and 6 reversed: ``(dq_c, dk, dv, dq, dk)``: the gradients of the content query,
        keys and values, and those the extra logits give q and k (the scheme's go to ``add``)."""
        logits = self._logits_fn(ctx.extra, ctx.positions, ctx.k_positions)
        allowed = self._allowed_fn(ctx.mask, ctx.causal, ctx.positions, ctx.k_positions)
        logits_grad, dq_extra, dk_extra = self._logits_grad_fn(ctx, add)
        scale = self.attention_scale()
        value, value_grad = self._value_fns(ctx, add)
        if self.block_size is None:
            every = (slice(0, len(ctx.positions)), slice(0, len(ctx.k_positions)))
            bias = logits(*every)
            dq_c, dk, dv, ds, *dsinks = attention_backward(
                ctx.q_c, ctx.k, ctx.v, dout, bias=bias, mask=allowed(*every), scale=scale, value_fn=value,
                value_grad_fn=value_grad, sinks=self.sinks)
            if ds is not None:
                logits_grad(*every, ds)
        else:
            dq_c, dk, dv, *dsinks = blockwise_attention_backward(
                ctx.q_c, ctx.k, ctx.v, ctx.out, ctx.lse, dout, bias_fn=logits, mask_fn=allowed, scale=scale,
                block_size=self.block_size, bias_grad_fn=logits_grad, value_grad_fn=value_grad, sinks=self.sinks)
        if dsinks:
            add("sinks", dsinks[0])                                             # (H,)
        return dq_c, dk, dv, dq_extra, dk_extra

    def _value_fns(self, ctx, add):
        """``(value, value_grad)``: the value seam's term of a block and its backward (which hands
        the scheme's parameter gradients to ``add``), or ``(None, None)``; both checked."""
        sc, q_pos, k_pos = self.scheme, ctx.positions, ctx.k_positions
        sc_add = checked_add(add, sc, self._grad_shapes(ctx))
        return checked_value(sc.value_position(q_pos, k_pos), sc, ctx.v.shape[:2], ctx.v.shape[-1],
                             grad=lambda qs, ks, p, dout: sc.value_position_backward(q_pos, k_pos, qs, ks, p, dout,
                                                                                     sc_add))

    def _logits_grad_fn(self, ctx, add):
        """``(logits_grad(qs, ks, dS), dq, dk)``: the function that hands a block's dS (the gradient of
        its bias and extra logits) to the bias seam and the content-position seam, and the q and k
        gradients it sums the extra logits' share into (in the layer's dtype)."""
        sc, shapes = self.scheme, self._grad_shapes(ctx)
        params = {name: shape for name, shape in shapes.items() if name.startswith("scheme.")}
        sc_add = checked_add(add, sc, shapes)
        dq_extra, dk_extra = np.zeros_like(ctx.q), np.zeros_like(ctx.k)

        def logits_grad(qs, ks, ds):
            got = sc.bias_backward(ctx.positions[qs], ctx.k_positions[ks], ds)
            for name, g in check_grads(got, sc, "bias_backward(q_positions, k_positions, dbias)", params).items():
                add(name, g)
            if ctx.extra is not None:
                B, H = ctx.q.shape[:2]
                dq_blk, dk_blk = check_pair(self._extra_backward(ctx, qs, ks, ds, sc_add), sc,
                                            "extra_backward(q, k, q_positions, k_positions, qs, ks, dlogits, add)",
                                            (B, H, qs.stop - qs.start, ctx.q.shape[-1]),
                                            (B, H, ks.stop - ks.start, ctx.k.shape[-1]))
                dq_extra[..., qs, :] += dq_blk
                dk_extra[..., ks, :] += dk_blk
        return logits_grad, dq_extra, dk_extra

    def _extra_backward(self, ctx, qs, ks, ds, add):
        """Step 5 reversed for the block ``(qs, ks)``: the scheme's ``extra_backward``, ``(dq, dk)``."""
        return self.scheme.extra_backward(ctx.q, ctx.k, ctx.positions, ctx.k_positions, qs, ks, ds, add)

    def _check_call(self, x, positions, mask, causal, cache, return_weights):
        """Every argument of a call checked once: ``(x, positions (T,), (3, T) or (2, T), mask, causal)``, the mask
        as ``(B, 1, 1, S)`` or ``(B, 1, T, S)`` (or ``None``)."""
        x = as_float_array(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}), got {x.shape}")
        self._check_weights()
        B, T, _ = x.shape
        causal = check_bool(causal, "causal")
        if self.sliding_window is not None and not causal:
            raise ValueError(f"sliding_window ({self.sliding_window}) is a causal window (keys i - W < j <= i); "
                             "call the layer with causal=True")
        if check_bool(return_weights, "return_weights") and self.block_size is not None:
            raise ValueError("return_weights needs the dense path: the blockwise path (block_size) "
                             "never forms the (T, S) weights")
        if cache is not None:
            if not isinstance(cache, KVCache):
                raise TypeError(f"cache must be a KVCache (layer.new_cache()), got {type(cache).__name__}")
            if cache._owner is not None and cache._owner() is not self:
                raise ValueError("cache belongs to another layer; use this layer's new_cache()")
        seen = 0 if cache is None else cache.seen
        if positions is None:
            positions = np.arange(seen, seen + T)
        elif self.scheme.position_streams > 1:                                  # M-RoPE (3, T), 2-D RoPE (2, T), or (T,)
            positions = stream_positions(positions, T, allow_negative=False, streams=self.scheme.position_streams)
        else:
            positions = as_positions(positions, "positions", length=T)
        S = T + (0 if cache is None else cache.length)
        return x, positions, check_mask(mask, B, T, S, self.num_heads), causal


@dataclass(frozen=True, eq=False)
class Context:
    """What ``MultiHeadAttention.backward`` needs of a forward pass (returned with
    ``return_context=True``): the input, positions and mask, each step's result, and the
    configuration of the layer that made it (``MultiHeadAttention.configuration()``), which
    ``backward`` checks. It holds no reference to the layer; the layer and its scheme keep no
    state for the backward."""

    x: np.ndarray              # (B, T, d_model)
    positions: np.ndarray      # (T,)
    k_positions: np.ndarray    # (S,)
    seq_len: int
    mask: np.ndarray | None    # (B, 1|H, 1|T, S)
    causal: bool
    past: int                  # keys from the cache in front of this call's
    x_in: np.ndarray           # after the input seam (B, T, d_model)
    q: np.ndarray              # after the rotate seam (B, H, T, D)
    k_raw: np.ndarray          # the keys as cached (B, H, S, D)
    k: np.ndarray              # the keys attended (B, H, S, D)
    v: np.ndarray              # (B, H, S, Dv)
    q_c: np.ndarray            # the query used against content (B, H, T, D)
    extra: object              # the content-position seam's extra logits, or None
    out: np.ndarray            # attention's output (B, H, T, Dv)
    lse: np.ndarray | None     # the blockwise path's row log-sum-exp (B, H, T)
    merged: np.ndarray         # after the output gate, if any (B, T, H*Dv)
    rot_positions: np.ndarray | None = None   # the rotate seam's: (T,), (3, T) or (2, T); None = positions
    configuration: tuple = ()  # the layer's configuration() (sizes, flags, scheme, its settings): no reference to it
