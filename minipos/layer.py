"""Multi-head attention with a pluggable position scheme.

``MultiHeadAttention`` knows the projections, the heads and the KV cache; a *scheme* object knows
where position enters. There are four common seams and the value seam of Shaw et al. 2018, and a
scheme overrides only the ones it uses (a position-dependent temperature is another place):

=================  ==========================================  =================================
seam               what the scheme returns                     schemes
=================  ==========================================  =================================
input              ``embed(x, positions)``: x + p before the   ``Sinusoidal``, ``LearnedAbsolute``
                   projections
rotate             ``rotate_q / rotate_k(x, positions,         ``Rotary``, ``XPos``
                   seq_len=)``: q, k after a position-
                   dependent map
bias               ``bias(q_positions, k_positions)``: an       ``ALiBi``, ``T5Bias``
                   additive ``(H, T, S)`` term
content-position   ``content_position(q, k, q_pos, k_pos)``:   ``TransformerXL``, ``DeBERTa``
                   the query used against content, plus a
                   function giving the extra logits that
                   couple content with position, per block
value              ``value_position(q_pos, k_pos)``: a         ``Shaw``
                   function of a block's weights p giving
                   the extra output ``sum_j p_ij a^V_ij``
=================  ==========================================  =================================

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
    8) y       = merge_heads(out) @ wo + bo                               # (B, T, d_model)

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
``_project_backward``).

With a three-stream scheme (M-RoPE, ``MRotary``) ``positions`` are ``(3, T)`` and feed step 3
only; the mask and the cache then follow the sequence order.

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

import inspect
import math
import weakref
from dataclasses import dataclass

import numpy as np

from . import alibi, deberta, irope, local_global, mrope, rope, rope_scaling, shaw, sinusoidal, t5, transformer_xl, xpos
from ._checks import (Overflow, as_float_array, as_positions, check_alloc, check_bool, check_choice, check_even_int,
                      check_float, check_float_dtype, check_int, check_positive_int, check_result)
from .attention import attention, attention_backward, blockwise_attention, blockwise_attention_backward

__all__ = [
    "MultiHeadAttention",
    "KVCache",
    "Scheme",
    "NoPE",
    "Sinusoidal",
    "LearnedAbsolute",
    "Rotary",
    "XPos",
    "MRotary",
    "ALiBi",
    "T5Bias",
    "TransformerXL",
    "DeBERTa",
    "Shaw",
    "NoPETemperature",
    "SCHEMES",
]

TERMS = ("content-content", "content-position", "position-content", "position-position")


class Scheme:
    """Base class of the position schemes, and itself the no-position baseline's behaviour.

    A subclass overrides only the seams it uses. ``bind`` is called once by the layer, giving the
    scheme the sizes and a random generator for its learned parameters; a scheme belongs to one
    layer. A scheme keeps no per-call state, so one layer can serve several threads.
    """

    name = "none"
    seams: tuple = ()
    terms: tuple = ("content-content",)  # which of the four expansion terms the logits keep

    def bind(self, layer: "MultiHeadAttention", rng: np.random.Generator) -> None:
        if getattr(self, "layer", None) is not None:
            raise ValueError(f"this {type(self).__name__} instance already belongs to another layer (its "
                             "parameters would be shared and overwritten); pass a new scheme instance")
        self.layer = layer
        self.d_model, self.num_heads, self.head_dim = layer.d_model, layer.num_heads, layer.head_dim

    def parameters(self) -> dict:
        """The scheme's learned position parameters, by their reference names."""
        return {}

    position_streams = 1  # 3: positions (3, T) feed the rotate seam only; mask and cache follow sequence order
    rotates_cached_keys = False  # cache hook: True = the cache keeps raw keys, every call rotates all of them

    def cache_tag(self, seq_len: int):
        """Cache hook: what the cached keys depend on besides their positions; a change raises, never mixes."""
        return None

    def embed(self, x, positions):  # input seam: (B, T, d_model) -> (B, T, d_model)
        return x

    def rotate_q(self, q, positions, *, seq_len: int):  # rotate seam: (B, H, T, D) -> (B, H, T, D)
        return q

    def rotate_k(self, k, positions, *, seq_len: int):  # seq_len: max key position of the call + 1
        return k

    def bias(self, q_positions, k_positions):  # bias seam: -> (H, T, S) or None
        return None

    def content_position(self, q, k, q_positions, k_positions):
        """Content-position seam: ``(query against content, extra)``.

        ``extra`` is ``None`` or a function ``extra(q_slice, k_slice)`` giving the scaled extra
        logits ``(B, H, tq, tk)`` of the queries and keys in those index slices, so the layer can
        evaluate it for the whole ``(T, S)`` or block by block.
        """
        return q, None

    def value_position(self, q_positions, k_positions):
        """Value seam: ``None`` or a function ``value(q_slice, k_slice, p)`` giving the extra output
        ``(B, H, tq, Dv)`` of a block's attention weights ``p`` ``(B, H, tq, tk)``, linear in ``p``."""
        return None

    def scale(self, head_dim: int) -> float:
        """The logits' scale, a Python float: a NumPy float64 scalar would make float32 logits float64."""
        return 1.0 / math.sqrt(head_dim)

    # The seams' gradients, for ``MultiHeadAttention.backward``. ``add(name, grad)`` sums a
    # parameter's gradient ("scheme.<name>", or a layer weight such as "wk").

    def embed_backward(self, dx, positions, add):  # input seam: returns the gradient of x
        return dx

    def rotate_q_backward(self, dq, positions, *, seq_len: int):  # rotate seam: the map's transpose
        return dq

    def rotate_k_backward(self, dk, positions, *, seq_len: int):
        return dk

    def bias_backward(self, q_positions, k_positions, dbias) -> dict:  # bias seam: {"scheme.<name>": grad}
        return {}

    def content_position_backward(self, dq_c, add):  # the query used against content -> the query
        return dq_c

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add):
        """The extra logits of the block ``(qs, ks)``: ``(dq[..., qs, :], dk[..., ks, :])``."""
        raise NotImplementedError(f"{type(self).__name__} has extra logits but no extra_backward")

    def value_position_backward(self, q_positions, k_positions, qs, ks, p, dout, add):
        """The value term of the block ``(qs, ks)`` for ``dout`` ``(B, H, tq, Dv)``: its share of ``dp``."""
        raise NotImplementedError(f"{type(self).__name__} has a value term but no value_position_backward")

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"


class NoPE(Scheme):
    """No position information: attention is permutation-equivariant (the baseline)."""

    name = "nope"


class Sinusoidal(Scheme):
    """Fixed sinusoidal table added to the token embeddings (Vaswani et al. 2017, §3.5)."""

    name = "sinusoidal"
    seams = ("input",)
    terms = TERMS

    def __init__(self, *, base: float = 10000.0, layout: str = "interleaved"):
        self.base = check_float(base, "base", positive=True)
        self.layout = check_choice(layout, "layout", {"interleaved", "split", "tensor2tensor"})

    def embed(self, x, positions):
        pe = sinusoidal.sinusoidal_table(positions, x.shape[-1], base=self.base, layout=self.layout)
        return x + pe.astype(x.dtype, copy=False)  # (B, T, d_model) + (T, d_model)

    def __repr__(self) -> str:
        return f"Sinusoidal(layout={self.layout!r})"


class LearnedAbsolute(Scheme):
    """A learned ``(max_positions, d_model)`` table added to the embeddings (BERT, GPT-2).

    ``table`` is GPT-2's ``wpe.weight`` / BERT's ``position_embeddings.weight``. It has no row
    for a position >= ``max_positions``: such input raises ``ValueError``.
    """

    name = "learned"
    seams = ("input",)
    terms = TERMS

    def __init__(self, max_positions: int = 512, *, std: float = 0.02):
        self.max_positions = check_positive_int(max_positions, "max_positions")
        self.std = check_float(std, "std", minimum=0.0)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.table = sinusoidal.learned_table(self.max_positions, self.d_model, seed=int(rng.integers(2 ** 31)),
                                              std=self.std, dtype=layer.dtype)  # (max_positions, d_model)

    def parameters(self):
        return {"table": self.table}

    def embed(self, x, positions):
        return x + sinusoidal.absolute_embedding(self.table, positions).astype(x.dtype, copy=False)

    def embed_backward(self, dx, positions, add):
        add("scheme.table", sinusoidal.absolute_embedding_backward(self.table, positions, dx.sum(axis=0)))
        return dx

    def __repr__(self) -> str:
        return f"LearnedAbsolute(max_positions={self.max_positions})"


class Rotary(Scheme):
    """Rotary position embedding (Su et al. 2021) applied to q and k of every head.

    ``layout="half"`` for HF LLaMA / GPT-NeoX checkpoints, ``"interleaved"`` for Meta LLaMA,
    RoFormer and GPT-J. ``rotary_dim`` rotates only the first features of each head (GPT-NeoX).

    ``scaling`` is a checkpoint's ``rope_scaling`` / ``rope_parameters`` dict, e.g.
    ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}`` (``"type"``
    is accepted for ``"rope_type"``; keys as in ``minipos.rope_scaling``). Every key is honoured or
    refused by name: ``rope_theta`` is the base, ``partial_rotary_factor`` sets ``rotary_dim =
    int(head_dim * factor)`` (GPT-NeoX's ``rotary_pct``, Phi), the rest must be parameters of the
    ``rope_type`` (LongRoPE's ``max_position_embeddings`` lives at the top of an HF config: add it
    to the dict). Its ``attention_factor`` multiplies cos and sin, so the rotated features' share of
    the logits scales by its square, as in HF.

    Length-dependent kinds (``dynamic``, ``longrope``) recompute the frequencies at every call
    for ``seq_len = max(key positions) + 1``. Keys rotated with one set of frequencies must never
    meet queries rotated with another (a known bug of caches in production code, where cached
    keys keep their old rotation after the frequencies change). So for these kinds the KV cache
    stores keys *unrotated* and every step rotates all keys with the step's frequencies: a cached
    step equals the full forward pass over the same prefix. For fixed frequencies the cache
    stores rotated keys together with the frequencies used, and a later step with different
    frequencies raises ``ValueError`` instead of mixing them.
    """

    name = "rope"
    seams = ("rotate",)
    LENGTH_DEPENDENT = ("dynamic", "longrope")

    def __init__(self, *, base: float = 10000.0, layout: str = "interleaved", rotary_dim: int | None = None,
                 scaling: dict | None = None):
        self.layout = check_choice(layout, "layout", set(rope.LAYOUTS))
        self.rotary_dim = None if rotary_dim is None else check_even_int(rotary_dim, "rotary_dim")
        self.scaling_kind, self.scaling_args = self._parse_scaling(scaling)
        partial = self.scaling_args.pop("partial_rotary_factor", None)
        self.partial_rotary_factor = None if partial is None else check_float(
            partial, "scaling['partial_rotary_factor']", positive=True)
        if self.partial_rotary_factor is not None and self.partial_rotary_factor > 1:
            raise ValueError(f"scaling['partial_rotary_factor'] must be in (0, 1], got {partial}")
        theta = self.scaling_args.pop("rope_theta", None)  # transformers 5 keeps it in rope_parameters
        if theta is not None and base != 10000.0 and float(theta) != float(base):
            raise ValueError(f"scaling['rope_theta'] ({theta}) contradicts base ({base}); give one of them")
        self.base = (check_float(base, "base", positive=True) if theta is None else
                     check_float(theta, "scaling['rope_theta']", positive=True))
        self.rotates_cached_keys = self.scaling_kind in self.LENGTH_DEPENDENT

    @staticmethod
    def _parse_scaling(scaling):
        if scaling is None:
            return None, {}
        if not isinstance(scaling, dict):
            raise TypeError(f"scaling must be a dict like a checkpoint's rope_scaling, got {type(scaling).__name__}")
        args = dict(scaling)
        kind = args.pop("rope_type", None) or args.pop("type", None)
        args.pop("type", None)
        if kind != "default":
            check_choice(kind, "scaling['rope_type']", set(rope_scaling.REGISTRY))
        own = {"rope_theta", "partial_rotary_factor"}                    # read by Rotary itself
        params = {} if kind == "default" else inspect.signature(rope_scaling.REGISTRY[kind]).parameters
        accepted = {n for n in params if n not in ("dim", "base", "seq_len")}
        unknown = sorted(set(args) - accepted - own)
        if unknown:
            raise ValueError(f"scaling[{unknown[0]!r}] is not a parameter of rope_type {kind!r}; it accepts "
                             f"{sorted(accepted | own)}")
        missing = sorted(n for n in accepted if params[n].default is inspect.Parameter.empty and n not in args)
        if missing:
            raise ValueError(f"scaling[{missing[0]!r}] is required by rope_type {kind!r}")
        return (None if kind == "default" else kind), args

    def bind(self, layer, rng):
        super().bind(layer, rng)
        if self.partial_rotary_factor is not None:               # HF: int(head_dim * partial_rotary_factor)
            rd = int(self.head_dim * self.partial_rotary_factor)
            if self.rotary_dim is not None and self.rotary_dim != rd:
                raise ValueError(f"rotary_dim ({self.rotary_dim}) contradicts scaling['partial_rotary_factor'] "
                                 f"({self.partial_rotary_factor} of head_dim {self.head_dim} = {rd}); give one of them")
            self.rotary_dim = rd
        if self.rotary_dim is None and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got head_dim = {self.head_dim}")
        rd = self.head_dim if self.rotary_dim is None else self.rotary_dim
        if rd > self.head_dim or rd % 2 or rd < 2:
            raise ValueError(f"rotary_dim must be even, >= 2 and <= head_dim ({self.head_dim}), got {rd}")
        self._dim = rd
        self.inv_freq, self.attention_factor = self._frequencies(1)  # validates the scaling now

    def _frequencies(self, seq_len: int):
        if self.scaling_kind is None:
            return rope.rope_inv_freq(self._dim, base=self.base), 1.0
        extra = {"seq_len": seq_len} if self.rotates_cached_keys else {}
        return rope_scaling.REGISTRY[self.scaling_kind](self._dim, base=self.base, **self.scaling_args, **extra)

    def frequencies(self, seq_len: int):
        """``(inv_freq (rotary_dim/2,), attention_factor)`` at ``seq_len`` (max key position + 1).

        Fixed kinds return ``inv_freq`` and ``attention_factor`` (attributes, computed once);
        ``dynamic`` and ``longrope`` compute them for this length, without storing them.
        """
        if self.rotates_cached_keys:
            return self._frequencies(seq_len)
        return self.inv_freq, self.attention_factor

    def cache_tag(self, seq_len):
        if self.rotates_cached_keys:
            return None
        inv_freq, factor = self.frequencies(seq_len)
        return np.asarray(inv_freq).tobytes(), factor

    def _apply(self, x, positions, *, seq_len, ops=rope):
        """``ops``: the module with ``apply_rope`` and ``apply_rope_backward`` (``minipos.fast.rope``
        has the same names; the fast layer passes it)."""
        inv_freq, factor = self.frequencies(seq_len)
        return ops.apply_rope(x, positions, inv_freq=inv_freq, layout=self.layout, rotary_dim=self.rotary_dim,
                               attention_factor=factor)

    rotate_q = _apply
    rotate_k = _apply

    def _apply_backward(self, dx, positions, *, seq_len, ops=rope):  # R(m)^T
        inv_freq, factor = self.frequencies(seq_len)
        return ops.apply_rope_backward(dx, positions, inv_freq=inv_freq, layout=self.layout,
                                        rotary_dim=self.rotary_dim, attention_factor=factor)

    rotate_q_backward = _apply_backward
    rotate_k_backward = _apply_backward

    def __repr__(self) -> str:
        kind = f", scaling={self.scaling_kind!r}" if self.scaling_kind else ""
        return f"Rotary(layout={self.layout!r}, rotary_dim={self.rotary_dim}{kind})"


class XPos(Scheme):
    """xPos (Sun et al. 2022): interleaved RoPE with the query at position i scaled by zeta^(i/g), the key
    at position j by zeta^(-j/g).

    The scales multiply to zeta^((i - j)/g) in every score, so attention depends on i - j only and
    decays with distance for keys before the query (it grows for keys after it: xPos is causal).
    ``scale_base`` is g (512 in torchscale).
    """

    name = "xpos"
    seams = ("rotate",)

    def __init__(self, *, base: float = 10000.0, scale_base: float = 512):
        self.base = check_float(base, "base", positive=True)
        self.scale_base = check_float(scale_base, "scale_base", positive=True)

    def rotate_q(self, q, positions, *, seq_len, ops=xpos):
        """``ops``: the module with ``apply_xpos`` and its backward (``minipos.fast.xpos`` has the
        same names; the fast layer passes it), as for the other three."""
        return ops.apply_xpos(q, positions, base=self.base, scale_base=self.scale_base)

    def rotate_k(self, k, positions, *, seq_len, ops=xpos):
        return ops.apply_xpos(k, positions, base=self.base, scale_base=self.scale_base, downscale=True)

    def rotate_q_backward(self, dq, positions, *, seq_len, ops=xpos):
        return ops.apply_xpos_backward(dq, positions, base=self.base, scale_base=self.scale_base)

    def rotate_k_backward(self, dk, positions, *, seq_len, ops=xpos):
        return ops.apply_xpos_backward(dk, positions, base=self.base, scale_base=self.scale_base, downscale=True)

    def __repr__(self) -> str:
        return f"XPos(scale_base={self.scale_base})"


class MRotary(Scheme):
    """Multimodal RoPE (``minipos.mrope``): half-layout RoPE whose frequencies are shared by three
    position streams, temporal, height and width (Qwen2-VL, Qwen2.5-VL; Qwen3-VL with ``interleaved``).

    The layer's ``positions`` are then ``(3, T)`` (``minipos.mrope.mrope_positions``; a ``(T,)``
    array means three equal streams, i.e. text) and serve the rotate seam only: the causal mask and
    the KV cache follow the sequence order (0, 1, ... continuing the cache), as HF's mask follows
    ``cache_position``. Decode after a cache with ``mrope_decode_positions(cache_length, T, delta)``.
    ``mrope_section`` ``[n_t, n_h, n_w]`` adds up to head_dim/2 (HF ``rope_parameters["mrope_section"]``);
    ``None`` scales the model's default to the head dim: Qwen2-VL's [16, 24, 24] or, interleaved,
    Qwen3-VL's [24, 20, 20] at head_dim 128 (n_h = n_w = 3/16 resp. 5/32 of head_dim, n_t the rest).
    """

    name = "mrope"
    seams = ("rotate",)
    position_streams = 3

    def __init__(self, *, mrope_section=None, base: float = 10000.0, interleaved: bool = False):
        self.mrope_section = None if mrope_section is None else list(mrope.check_section(mrope_section))
        self.base = check_float(base, "base", positive=True)
        self.interleaved = check_bool(interleaved, "interleaved")

    def bind(self, layer, rng):
        super().bind(layer, rng)
        half = self.head_dim // 2
        if self.head_dim % 2:
            raise ValueError(f"M-RoPE needs an even head dim, got head_dim = {self.head_dim}")
        if self.mrope_section is None:                       # the model's proportions at this head dim
            n = 3 * half // 8 if not self.interleaved else 5 * half // 16
            self.mrope_section = [half - 2 * n, n, n]
        if sum(self.mrope_section) != half:
            raise ValueError(f"mrope_section {self.mrope_section} must add up to head_dim/2 = {half}")
        mrope.mrope_streams(self.mrope_section, interleaved=self.interleaved)   # refuses a bad interleaving
        self.inv_freq = rope.rope_inv_freq(self.head_dim, base=self.base)

    def cache_tag(self, seq_len):
        return self.inv_freq.tobytes(), tuple(self.mrope_section), self.interleaved

    def _apply(self, x, positions, *, seq_len):                       # (B, H, T, D), positions (3, T)
        return mrope.apply_mrope(x, positions, self.mrope_section, inv_freq=self.inv_freq,
                                 interleaved=self.interleaved)

    def _apply_backward(self, dx, positions, *, seq_len):             # R^T
        return mrope.apply_mrope_backward(dx, positions, self.mrope_section, inv_freq=self.inv_freq,
                                          interleaved=self.interleaved)

    rotate_q = rotate_k = _apply
    rotate_q_backward = rotate_k_backward = _apply_backward

    def __repr__(self) -> str:
        return f"MRotary(mrope_section={self.mrope_section}, interleaved={self.interleaved})"


class ALiBi(Scheme):
    """Linear biases (Press et al. 2022): ``-m_h |i - j|`` by default, ``-m_h (i - j)`` with ``symmetric=False``.

    The two agree on every entry a causal mask keeps, so the default is the paper's bias under
    ``causal=True`` and the usual bidirectional variant without it. ``symmetric=False`` gives the
    raw ``-m_h (i - j)``, which rewards future keys unless they are masked. ``slopes`` ``(H,)`` are
    fixed (``alibi_slopes``), not learned.
    """

    name = "alibi"
    seams = ("bias",)
    terms = ("content-content", "position-position")

    def __init__(self, *, symmetric: bool = True):
        self.symmetric = check_bool(symmetric, "symmetric")

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.slopes = alibi.alibi_slopes(self.num_heads)  # (H,), fixed, not learned

    def bias(self, q_positions, k_positions):
        return alibi.alibi_bias(self.slopes, q_positions, k_positions, symmetric=self.symmetric)  # (H, T, S)

    def __repr__(self) -> str:
        return f"ALiBi(symmetric={self.symmetric})"


class T5Bias(Scheme):
    """T5's learned per-head bias over log-spaced relative-distance buckets (Raffel et al. 2020).

    ``table`` ``(num_buckets, H)`` is layer 0's ``relative_attention_bias.weight`` (T5 shares it
    across layers). T5 does not scale ``q . k`` by ``1/sqrt(D)``: ``scale`` is 1. Use
    ``bidirectional=True`` for the encoder, ``False`` for the decoder's self-attention.
    """

    name = "t5"
    seams = ("bias",)
    terms = ("content-content", "position-position")

    def __init__(self, *, num_buckets: int = 32, max_distance: int = 128, bidirectional: bool = True):
        self.num_buckets, self.max_distance = num_buckets, max_distance
        self.bidirectional = check_bool(bidirectional, "bidirectional")
        t5.relative_position_bucket(0, bidirectional=self.bidirectional, num_buckets=num_buckets,
                                    max_distance=max_distance)  # validates the configuration now

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.table = rng.standard_normal((self.num_buckets, self.num_heads)).astype(layer.dtype)

    def parameters(self):
        return {"table": self.table}

    def bias(self, q_positions, k_positions):
        return t5.t5_bias(self.table, q_positions, k_positions, bidirectional=self.bidirectional,
                          num_buckets=self.num_buckets, max_distance=self.max_distance)

    def bias_backward(self, q_positions, k_positions, dbias):
        return {"scheme.table": t5.t5_bias_backward(dbias, q_positions, k_positions, bidirectional=self.bidirectional,
                                                    num_buckets=self.num_buckets, max_distance=self.max_distance)}

    def scale(self, head_dim):
        return 1.0

    def __repr__(self) -> str:
        return (f"T5Bias(num_buckets={self.num_buckets}, max_distance={self.max_distance}, "
                f"bidirectional={self.bidirectional})")


class TransformerXL(Scheme):
    """Transformer-XL relative attention (Dai et al. 2019, §3.3).

    logits = [(q_i + u) . k_j + (q_i + v) . (R_{i-j} W_R)_h] / sqrt(D), with R the fixed sinusoidal
    table (split layout). Learned: ``u`` and ``v`` ``(H, D)`` (``r_w_bias``, ``r_r_bias``) and
    ``w_r`` ``(d_model, H*D)`` (``r_net.weight.T``).
    """

    name = "transformer-xl"
    seams = ("content-position",)
    terms = TERMS

    def __init__(self, *, base: float = 10000.0):
        self.base = check_float(base, "base", positive=True)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        H, D, d = self.num_heads, self.head_dim, self.d_model
        self.u = (rng.standard_normal((H, D)) * 0.02).astype(layer.dtype)
        self.v = (rng.standard_normal((H, D)) * 0.02).astype(layer.dtype)
        self.w_r = (rng.standard_normal((d, H * D)) / np.sqrt(d)).astype(layer.dtype)

    def parameters(self):
        return {"u": self.u, "v": self.v, "w_r": self.w_r}

    def content_position(self, q, k, q_positions, k_positions, *, ops=transformer_xl):
        """``ops``: the module computing the position terms (``minipos.fast.transformer_xl`` has the
        same names and passes itself)."""
        scale = self.scale(self.head_dim)

        def extra(qs, ks):  # terms (b) + (d) for one block: (q_i + v) . W_R R_{i-j}
            return scale * ops.xl_position_logits(q[..., qs, :], self.v, self.w_r, q_positions[qs],
                                                  k_positions[ks], base=self.base)
        return q + self.u[:, None, :], extra  # terms (a) + (c): (q_i + u) . k_j

    def content_position_backward(self, dq_c, add):
        add("scheme.u", dq_c.sum(axis=(0, 2)))                               # q_c = q + u: du = sum dq_c
        return dq_c

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add, *, ops=transformer_xl):
        scale = self.scale(self.head_dim)
        dq, dv, dw_r = ops.xl_position_logits_backward(
            q[..., qs, :], self.v, self.w_r, q_positions[qs], k_positions[ks], scale * dlogits, base=self.base)
        add("scheme.v", dv)
        add("scheme.w_r", dw_r)
        return dq, 0.0

    def __repr__(self) -> str:
        return "TransformerXL()"


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
    terms = ("content-content", "content-position", "position-content")

    def __init__(self, *, position_buckets: int = 256, max_relative_positions: int = 512,
                 pos_att_type=("c2p", "p2c"), max_position_embeddings: int = 512):
        self.position_buckets, self.max_relative_positions, self.att_span = deberta.spans_from_config(
            position_buckets=position_buckets, max_relative_positions=max_relative_positions,
            max_position_embeddings=max_position_embeddings)
        self.pos_att_type = deberta.parse_pos_att_type(pos_att_type)
        deberta.relative_positions([0], [0], bucket_size=self.position_buckets,
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

    def content_position(self, q, k, q_positions, k_positions, *, ops=deberta):
        """``ops``: the module computing the c2p / p2c terms (``minipos.fast.deberta`` has the same
        names and passes itself)."""
        L, scale = self.layer, self.scale(self.head_dim)
        pos_key, pos_query = self._project(L.wk, L.bk), self._project(L.wq, L.bq)  # (H, 2k, D)

        def extra(qs, ks):  # c2p + p2c for one block, scaled like c2c
            rel = deberta.relative_positions(q_positions[qs], k_positions[ks], bucket_size=self.position_buckets,
                                             max_position=self.max_relative_positions)  # (tq, tk), q - k
            total = 0.0
            if "c2p" in self.pos_att_type:
                total = total + ops.c2p_term(q[..., qs, :], pos_key, rel, self.att_span)
            if "p2c" in self.pos_att_type:
                total = total + ops.p2c_term(k[..., ks, :], pos_query, rel, self.att_span)
            return scale * total
        return q, extra

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add, *, ops=deberta):
        L, D2 = self.layer, 2 * self.att_span
        rel = deberta.relative_positions(q_positions[qs], k_positions[ks], bucket_size=self.position_buckets,
                                         max_position=self.max_relative_positions)
        d = self.scale(self.head_dim) * dlogits                              # (B, H, tq, tk)
        dq, dk = 0.0, 0.0
        for term, w, b, name in (("c2p", L.wk, L.bk, "k"), ("p2c", L.wq, L.bq, "q")):
            if term not in self.pos_att_type:
                continue
            table = self._project(w, b)                                      # (H, 2k, D)
            if term == "c2p":
                dq, dtable = ops.c2p_term_backward(q[..., qs, :], table, rel, self.att_span, d)
            else:
                dk, dtable = ops.p2c_term_backward(k[..., ks, :], table, rel, self.att_span, d)
            dproj = dtable.transpose(1, 0, 2).reshape(D2, -1)                # (2k, H*D): table = rel_emb w + b
            add("w" + name, self.rel_embeddings.T @ dproj)
            if b is not None:
                add("b" + name, dproj.sum(axis=0))
            add("scheme.rel_embeddings", dproj @ w.T)
        return dq, dk

    def scale(self, head_dim):
        return 1.0 / math.sqrt(head_dim * (1 + len(self.pos_att_type)))

    def __repr__(self) -> str:
        return f"DeBERTa(position_buckets={self.position_buckets}, pos_att_type={self.pos_att_type})"


class Shaw(Scheme):
    """Relative position representations on keys and values (Shaw et al. 2018, ``minipos.shaw``).

    logits = q_i . (k_j + a^K_ij) / sqrt(D) and out_i = sum_j alpha_ij (v_j + a^V_ij), with
    ``a_ij = w[clip(j - i, k) + k]``. Learned: ``w_k`` and ``w_v`` ``(2k + 1, D)``, shared by the
    heads (tensor2tensor's ``relative_positions_keys/embeddings`` and
    ``relative_positions_values/embeddings``). ``max_relative_position`` is k.
    """

    name = "shaw"
    seams = ("content-position", "value")
    terms = ("content-content", "content-position")

    def __init__(self, max_relative_position: int = 16):
        self.max_relative_position = check_int(max_relative_position, "max_relative_position", minimum=0)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        rows = 2 * self.max_relative_position + 1
        check_alloc((2, rows, self.head_dim), layer.dtype, "Shaw's tables w_k, w_v (2k + 1, D)")
        self.w_k = (rng.standard_normal((rows, self.head_dim)) / np.sqrt(self.head_dim)).astype(layer.dtype)
        self.w_v = (rng.standard_normal((rows, self.head_dim)) / np.sqrt(self.head_dim)).astype(layer.dtype)

    def parameters(self):
        return {"w_k": self.w_k, "w_v": self.w_v}

    def content_position(self, q, k, q_positions, k_positions):
        scale, kmax = self.scale(self.head_dim), self.max_relative_position

        def extra(qs, ks):  # q_i . a^K_ij / sqrt(D) for one block (Eq. 4's second term)
            return scale * shaw.relative_logits(q[..., qs, :], self.w_k, q_positions[qs], k_positions[ks],
                                                max_relative_position=kmax)
        return q, extra

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add):
        dq, dw_k = shaw.relative_logits_backward(q[..., qs, :], self.w_k, q_positions[qs], k_positions[ks],
                                                 self.scale(self.head_dim) * dlogits,
                                                 max_relative_position=self.max_relative_position)
        add("scheme.w_k", dw_k)
        return dq, 0.0

    def value_position(self, q_positions, k_positions):
        def value(qs, ks, p):  # sum_j p_ij a^V_ij for one block (Eq. 3's second term)
            return shaw.relative_values(p, self.w_v.astype(p.dtype, copy=False), q_positions[qs], k_positions[ks],
                                        max_relative_position=self.max_relative_position)
        return value

    def value_position_backward(self, q_positions, k_positions, qs, ks, p, dout, add):
        dp, dw_v = shaw.relative_values_backward(p, self.w_v, q_positions[qs], k_positions[ks], dout,
                                                 max_relative_position=self.max_relative_position)
        add("scheme.w_v", dw_v)
        return dp

    def __repr__(self) -> str:
        return f"Shaw(max_relative_position={self.max_relative_position})"


class NoPETemperature(NoPE):
    """NoPE with Llama 4's attention temperature: query i scaled by ``tau(i)`` (``minipos.irope``).

    ``tau(i) = log1p(floor((i + 1) / floor_scale)) * attn_scale + 1`` multiplies the queries only, so
    every logit of row i is scaled by ``tau(i)``; it is 1 until ``i + 1 = floor_scale``. ``attn_scale``,
    ``floor_scale`` are the config keys of the same names (Llama 4: 0.1, 8192); ``float32=True`` rounds
    ``tau`` as HF does. Fixed, not learned.
    """

    name = "nope-temperature"
    seams = ("rotate",)

    def __init__(self, *, attn_scale: float = 0.1, floor_scale: float = 8192, float32: bool = False):
        self.attn_scale = check_float(attn_scale, "attn_scale", minimum=0.0)
        self.floor_scale = check_float(floor_scale, "floor_scale", positive=True)
        self.float32 = check_bool(float32, "float32")

    def _kw(self):
        return dict(attn_scale=self.attn_scale, floor_scale=self.floor_scale, float32=self.float32)

    def rotate_q(self, q, positions, *, seq_len):  # q_i * tau(i); keys unchanged
        return irope.apply_attn_temperature(q, positions, **self._kw())

    def rotate_q_backward(self, dq, positions, *, seq_len):
        return irope.apply_attn_temperature_backward(dq, positions, **self._kw())

    def __repr__(self) -> str:
        f32 = ", float32=True" if self.float32 else ""
        return f"NoPETemperature(attn_scale={self.attn_scale}, floor_scale={self.floor_scale:g}{f32})"


SCHEMES = {cls.name: cls for cls in (NoPE, Sinusoidal, LearnedAbsolute, Rotary, XPos, ALiBi, T5Bias,
                                     TransformerXL, DeBERTa, MRotary, Shaw, NoPETemperature)}


class KVCache:
    """Keys (after the rotate seam), values and key positions of the tokens seen so far.

    ``k``, ``v`` are ``(B, H, S, D)`` views of preallocated buffers that double when full, so a
    decoding step appends in O(1) amortised and costs O(S) only in attention itself.
    ``mem_len`` (Transformer-XL's memory length) keeps at most that many keys from earlier calls:
    a call attends to the last ``mem_len`` cached keys plus its own, then becomes the memory of
    the next (``new_mems = cat(mems, hids)[-mem_len:]`` in the reference). ``None`` keeps all.

    A cache belongs to the layer that made it (``layer.new_cache()``; a bare ``KVCache()`` is
    claimed by the first layer that fills it), and a layer call changes it only once it has
    succeeded: ``extend`` lays the new keys beside the cached ones without changing the cache,
    ``commit`` then makes them part of it.
    """

    def __init__(self, mem_len: int | None = None):
        self.mem_len = None if mem_len is None else check_int(mem_len, "mem_len", minimum=0)
        self._k = self._v = None
        self._pos = np.zeros(0, dtype=np.int64)
        self.length = 0  # keys held now
        self.seen = 0    # tokens appended in all (default positions continue from here)
        self.tag = None
        self._owner = None

    @property
    def k(self):
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self):
        return None if self._v is None else self._v[:, :, : self.length]

    @property
    def positions(self):
        return self._pos[: self.length]

    def extend(self, k, v, positions, *, tag=None):
        """All ``(k, v, positions)`` with ``k``, ``v`` ``(B, H, T, D)`` at ``positions`` ``(T,)``
        appended, as ``(B, H, S, D)`` views; the cache itself is unchanged until ``commit(T, tag)``.

        ``tag`` is what the keys were computed with besides their positions (e.g. RoPE
        frequencies); keys with a tag different from the cached keys' raise ``ValueError``.
        """
        k, v = as_float_array(k, "k"), as_float_array(v, "v")
        if k.ndim != 4 or v.ndim != 4 or k.shape[:3] != v.shape[:3]:
            raise ValueError(f"k and v must have shapes (B, H, T, D) and (B, H, T, Dv) with the same B, H, T; "
                             f"got k {k.shape}, v {v.shape}")
        B, H, T, D = k.shape
        positions = as_positions(positions, "positions", length=T)
        if self.length and tag != self.tag:
            raise ValueError("cache holds keys computed with other scheme parameters (e.g. RoPE "
                             "frequencies) than this step's; start a new cache instead of mixing them")
        if self._k is not None and (self._k.shape[:2] != (B, H) or self._k.shape[3] != D
                                    or self._v.shape[3] != v.shape[3]):
            raise ValueError(f"cache holds keys (B, H, S, D) = {self._k.shape[:2]} + (S, {self._k.shape[3]}) and "
                             f"values with Dv = {self._v.shape[3]}; cannot append k {k.shape}, v {v.shape}")
        need = self.length + T
        if self._k is None or need > self._k.shape[2]:
            self._grow(max(need, 2 * (0 if self._k is None else self._k.shape[2]), 16), k, v)
        self._k[:, :, self.length:need] = k            # beyond the held length: not yet in the cache
        self._v[:, :, self.length:need] = v
        self._pos[self.length:need] = positions
        return self._k[:, :, :need], self._v[:, :, :need], self._pos[:need]

    def commit(self, count: int, tag=None) -> None:
        """Make the ``count`` entries laid by the last ``extend`` part of the cache, then keep only
        the last ``mem_len`` (the memory carried into the next call)."""
        self.length += count
        self.seen += count
        self.tag = tag
        if self.mem_len is not None and self.length > self.mem_len:
            drop, keep = self.length - self.mem_len, self.mem_len
            new_k, new_v = np.zeros_like(self._k), np.zeros_like(self._v)   # new buffers: the call's context
            new_k[:, :, :keep] = self._k[:, :, drop:self.length]            # still views the old ones
            new_v[:, :, :keep] = self._v[:, :, drop:self.length]
            self._k, self._v = new_k, new_v
            self._pos[:keep] = self._pos[drop:self.length].copy()
            self.length = keep

    def append(self, k, v, positions, *, tag=None):
        """``extend`` then ``commit``: add the keys and values; return all ``(k, v, positions)``."""
        k_all, v_all, pos_all = self.extend(k, v, positions, tag=tag)
        held = len(pos_all)
        self.commit(len(pos_all) - self.length, tag)
        return (k_all, v_all, pos_all) if self.length == held else (self.k, self.v, self.positions)

    def _grow(self, capacity, k, v):
        B, H, _, D = k.shape
        check_alloc((B, H, capacity, max(D, v.shape[-1])), np.result_type(k.dtype, v.dtype), "the KV cache")
        dtype = np.result_type(k.dtype, v.dtype)
        new_k = np.zeros((B, H, capacity, D), dtype)
        new_v = np.zeros((B, H, capacity, v.shape[-1]), dtype)
        new_pos = np.zeros(capacity, np.int64)
        if self._k is not None:
            new_k[:, :, : self.length], new_v[:, :, : self.length] = self.k, self.v
            new_pos[: self.length] = self.positions
        self._k, self._v, self._pos = new_k, new_v, new_pos


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
    ``minipos.local_global`` and ``docs/local-global.md``.
    """

    def __init__(self, d_model: int, num_heads: int, *, scheme: Scheme | None = None,
                 head_dim: int | None = None, bias: bool = False, seed: int = 0, dtype=np.float64,
                 block_size: int | None = None, num_kv_heads: int | None = None,
                 attention_chunk: int | None = None, sliding_window: int | None = None,
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
        self.attention_chunk = None if attention_chunk is None else check_positive_int(attention_chunk,
                                                                                       "attention_chunk")
        if scheme is None:
            scheme = NoPE()
        if not isinstance(scheme, Scheme):
            raise TypeError(f"scheme must be a minipos.layer.Scheme instance, got {type(scheme).__name__}")
        bias = check_bool(bias, "bias")
        rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
        d, hd, kvd = self.d_model, self.num_heads * self.head_dim, self.num_kv_heads * self.head_dim
        check_alloc((4, d, hd), self.dtype, "MultiHeadAttention's weights (d_model, num_heads * head_dim)")
        self.wq = self._init(rng, d, hd)
        self.wk, self.wv = self._init(rng, d, kvd), self._init(rng, d, kvd)
        self.wo = self._init(rng, hd, d)
        zeros = (lambda n: np.zeros(n, self.dtype)) if bias else (lambda n: None)
        self.bq, self.bk, self.bv, self.bo = zeros(hd), zeros(kvd), zeros(kvd), zeros(d)
        self.sliding_window = None if sliding_window is None else check_positive_int(sliding_window, "sliding_window")
        self.scale = None if scale is None else check_float(scale, "scale", positive=True)
        if self.scale is not None and "content-position" in scheme.seams:
            raise ValueError(f"scale overrides the q . k scale, but {type(scheme).__name__} scales its position "
                             "terms by its own rule; leave scale=None for it")
        self.sinks = np.zeros(self.num_heads, self.dtype) if check_bool(sinks, "sinks") else None   # (H,)
        scheme.bind(self, rng)
        self.scheme = scheme

    def attention_scale(self) -> float:
        """The factor of ``q . k`` in the logits: ``scale`` if given, else the scheme's."""
        return self.scheme.scale(self.head_dim) if self.scale is None else self.scale

    def _init(self, rng, d_in, d_out):
        return (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(self.dtype)

    def new_cache(self, mem_len: int | None = None) -> KVCache:
        """An empty KV cache of this layer for incremental decoding (``mem_len``: see ``KVCache``)."""
        cache = KVCache(mem_len)
        cache._owner = weakref.ref(self)
        return cache

    def __call__(self, x, *, positions=None, mask=None, causal: bool = False, cache: KVCache | None = None,
                 return_weights: bool = False, return_context: bool = False):
        """Attend ``x`` ``(B, T, d_model)`` to itself (and to the cache); return ``(B, T, d_model)``.

        positions: ``(T,)`` integer positions of the queries; default ``cache.seen + arange(T)``
          (the cache length, unless ``mem_len`` made it forget keys).
        mask: boolean, ``True`` = may attend: ``(B, S)`` key padding or ``(B, T, S)``, where
          ``S`` counts the cached keys too. causal: queries see keys at positions ``<=`` their own.
        cache: a ``KVCache`` of this layer (``new_cache()``), updated once the call has succeeded.
        return_weights: also return the attention weights ``(B, H, T, S)`` (dense path only).
        return_context: also return a ``Context`` of the pass, for ``backward(ctx, dy)``:
          ``y, ctx = layer(x, return_context=True)`` (after the weights, if both are asked for).
        """
        x, positions, mask, causal = self._check_call(x, positions, mask, causal, cache, return_weights)
        return_context = check_bool(return_context, "return_context")
        sc = self.scheme
        rot_pos = positions                                                     # (T,), or (3, T) for M-RoPE
        if rot_pos.ndim == 2:                                                   # M-RoPE: mask, cache by sequence order
            positions = (0 if cache is None else cache.seen) + np.arange(x.shape[1])
        past = np.zeros(0, np.int64) if cache is None else cache.positions
        k_pos = np.concatenate([past, positions])                               # (S,) key positions
        seq_len = int(k_pos.max()) + 1 if len(k_pos) else 1                     # for length-dependent RoPE

        # 1) input seam: absolute position vectors added to the embeddings
        x_in = sc.embed(x, positions)                                           # (B, T, d_model)
        # 2) projections, split into heads
        q_p, k_p, v = self._project(x_in)                                      # (B, H, T, D), (B, KV, T, D)
        for name, a in (("q", q_p), ("k", k_p), ("v", v)):
            check_result(a, f"x @ w{name}")
        # 3) rotate seam: q and k rotated by their positions (RoPE, xPos, M-RoPE)
        q = self._rotate(sc.rotate_q, q_p, rot_pos, seq_len)                    # (B, H, T, D)
        k = k_p if sc.rotates_cached_keys else self._rotate(sc.rotate_k, k_p, rot_pos, seq_len)
        # 4) cache: the keys and values of earlier calls in front of this call's
        tag = sc.cache_tag(seq_len)
        if cache is not None:
            k, v, _ = cache.extend(k, v, positions, tag=tag)                    # (B, H, S, D)
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
        # 8) merge the heads, output projection
        B, H, T, D = out.shape
        merged = out.transpose(0, 2, 1, 3).reshape(B, T, H * D)                 # (B, T, H*D)
        y = self._output(merged)                                                # (B, T, d_model)
        if cache is not None:                                                   # the call succeeded
            cache._owner = cache._owner or weakref.ref(self)
            cache.commit(T, tag)
        result = (y, weights) if return_weights else (y,)
        if return_context:
            result += (Context(x, positions, k_pos, seq_len, mask, causal, len(past), x_in, q, k_raw, k, v, q_c,
                               extra, out, lse, merged, rot_positions=rot_pos),)
        return result if len(result) > 1 else y

    def _rotate(self, rotate, x, positions, seq_len):
        """Step 3 (and its backward): ``rotate``, one of the scheme's ``rotate_q``, ``rotate_k`` or
        their backwards, on ``x`` at ``positions``."""
        return rotate(x, positions, seq_len=seq_len)

    def _content_position(self, q, k, q_pos, k_pos):
        """Step 5: the scheme's ``content_position``, ``(q_c, extra)`` (the query used against content,
        and ``extra(qs, ks)`` giving the extra logits of a block, or ``None``)."""
        return self.scheme.content_position(q, k, q_pos, k_pos)

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

    def _output(self, merged):
        """Step 8's product: ``merged @ wo + bo``, ``(B, T, H*Dv) -> (B, T, d_model)``."""
        y = merged @ self.wo
        return y if self.bo is None else y + self.bo

    def _repeat_kv(self, a):
        """Grouped-query attention: key/value head ``j`` serves query heads ``j G … j G + G - 1``
        (``G = num_heads // num_kv_heads``), as HF's ``repeat_kv``. ``(B, KV, S, D) -> (B, H, S, D)``."""
        group = self.num_heads // self.num_kv_heads
        return a if group == 1 else np.repeat(a, group, axis=1)

    def _logits_fn(self, extra, q_pos, k_pos):
        """``logits(qs, ks)``: the bias seam plus the content-position seam's extra logits of the
        queries ``qs`` and keys ``ks`` (index slices), ``(H, tq, tk)`` or ``(B, H, tq, tk)``, or ``None``."""
        sc = self.scheme

        def logits(qs, ks):
            bias = sc.bias(q_pos[qs], k_pos[ks])                                # (H, tq, tk) or None
            more = None if extra is None else extra(qs, ks)                     # (B, H, tq, tk) or None
            return more if bias is None else bias if more is None else bias + more
        return logits

    def _allowed_fn(self, mask, causal, q_pos, k_pos):
        """``allowed(qs, ks)``: causal (by positions), the sliding window, the chunks and the padding
        mask of a block, or ``None``."""
        chunk, window = self.attention_chunk, self.sliding_window

        def allowed(qs, ks):
            tri = (k_pos[ks][None, :] <= q_pos[qs][:, None])[None, None] if causal else None  # (1, 1, tq, tk)
            if window is not None:                                              # i - W < j <= i
                tri = local_global._window(q_pos[qs], k_pos[ks], window)[None, None]
            if chunk is not None:                                               # i // C == j // C
                same = irope._chunks(q_pos[qs], k_pos[ks], chunk)[None, None]   # (1, 1, tq, tk)
                tri = same if tri is None else tri & same
            pad = None if mask is None else mask[..., qs if mask.shape[2] > 1 else slice(None), ks]
            return pad if tri is None else tri if pad is None else tri & pad
        return allowed

    def _attend(self, q, k, v, extra, q_pos, k_pos, mask, causal, return_weights, return_lse=False):
        """Steps 6 and 7: ``(out, weights or None, lse or None)`` of attention over all blocks or one."""
        logits, allowed = self._logits_fn(extra, q_pos, k_pos), self._allowed_fn(mask, causal, q_pos, k_pos)
        scale = self.attention_scale()
        value = self.scheme.value_position(q_pos, k_pos)                      # value seam, or None
        if self.block_size is None:
            every = (slice(0, len(q_pos)), slice(0, len(k_pos)))
            got = attention(q, k, v, bias=logits(*every), mask=allowed(*every), scale=scale,
                            return_weights=return_weights, value_fn=value, sinks=self.sinks)
            return (*got, None) if return_weights else (got, None, None)
        got = blockwise_attention(q, k, v, bias_fn=logits, mask_fn=allowed, scale=scale, block_size=self.block_size,
                                  return_lse=return_lse, value_fn=value, sinks=self.sinks)
        return (got[0], None, got[1]) if return_lse else (got, None, None)

    # ----------------------------------------------------------------------- backward

    def backward(self, ctx: "Context", dy) -> dict:
        """The gradients of a pass for the output gradient ``dy`` ``(B, T, d_model)``.

        ctx: the ``Context`` returned by ``layer(x, ..., return_context=True)``. Returns a dict keyed
        by parameter name as the golden vectors name them: ``"x"``, ``"wq"``, ``"wk"``, ``"wv"``,
        ``"wo"``, ``"bq"``, ``"bk"``, ``"bv"``, ``"bo"`` (with ``bias=True``), ``"sinks"`` (with
        ``sinks=True``) and the scheme's
        learned parameters as ``"scheme.<name>"`` (``"scheme.table"``, ``"scheme.u"``, ...). Keys
        and values from earlier calls (a cache) are constants here. The forward's steps, reversed.
        """
        if not isinstance(ctx, Context):
            raise TypeError(f"ctx must be the Context of a forward pass (return_context=True), got {type(ctx).__name__}")
        dy = as_float_array(dy, "dy")
        if dy.shape != ctx.x.shape:
            raise ValueError(f"dy must have the shape of the output {ctx.x.shape}, got {dy.shape}")
        sc, grads = self.scheme, {}
        add = lambda name, g: grads.__setitem__(name, g if name not in grads else grads[name] + g)  # noqa: E731
        B, T, _ = dy.shape
        # 8) output projection: y = merged wo + bo
        add("wo", ctx.merged.reshape(B * T, -1).T @ dy.reshape(B * T, -1))      # merged^T dy
        if self.bo is not None:
            add("bo", dy.sum(axis=(0, 1)))
        with np.errstate(over="ignore", invalid="ignore"):
            dout = (dy @ self.wo.T).reshape(B, T, self.num_heads, -1).transpose(0, 2, 1, 3)   # (B, H, T, Dv)
        check_result(dout, "dy @ wo^T")
        # 7) attention, and 6) the logits' bias: dS goes to the bias seam and the content-position seam
        dq_c, dk, dv, dq_extra, dk_extra = self._attend_backward(ctx, dout, add)
        # 5) content-position seam: the query used against content
        dq = sc.content_position_backward(dq_c, add) + dq_extra                  # (B, H, T, D)
        dk = dk + dk_extra                                                      # (B, H, S, D)
        group = self.num_heads // self.num_kv_heads                             # GQA: sum each group's
        dk, dv = (d.reshape(B, self.num_kv_heads, group, *d.shape[2:]).sum(axis=2) for d in (dk, dv))
        # 4) cache: the gradients of this call's keys and values (earlier ones are constants)
        if sc.rotates_cached_keys:
            dk = self._rotate(sc.rotate_k_backward, dk, ctx.k_positions, ctx.seq_len)
        dk, dv = dk[..., ctx.past:, :], dv[..., ctx.past:, :]
        # 3) rotate seam
        rot_pos = ctx.positions if ctx.rot_positions is None else ctx.rot_positions   # (T,) or (3, T)
        dq = self._rotate(sc.rotate_q_backward, dq, rot_pos, ctx.seq_len)
        if not sc.rotates_cached_keys:
            dk = self._rotate(sc.rotate_k_backward, dk, rot_pos, ctx.seq_len)
        # 2) projections: q = heads(x_in wq + bq), ...
        dx_in = self._project_backward(ctx.x_in, dq, dk, dv, add)
        # 1) input seam
        add("x", sc.embed_backward(dx_in, ctx.positions, add))
        return grads

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
        the scheme's parameter gradients to ``add``), or ``(None, None)``."""
        sc, q_pos, k_pos = self.scheme, ctx.positions, ctx.k_positions
        value = sc.value_position(q_pos, k_pos)
        if value is None:
            return None, None
        return value, lambda qs, ks, p, dout: sc.value_position_backward(q_pos, k_pos, qs, ks, p, dout, add)

    def _logits_grad_fn(self, ctx, add):
        """``(logits_grad(qs, ks, dS), dq, dk)``: the function that hands a block's dS (the gradient of
        its bias and extra logits) to the bias seam and the content-position seam, and the q and k
        gradients it sums the extra logits' share into (in the layer's dtype)."""
        sc = self.scheme
        dq_extra, dk_extra = np.zeros_like(ctx.q), np.zeros_like(ctx.k)

        def logits_grad(qs, ks, ds):
            for name, g in sc.bias_backward(ctx.positions[qs], ctx.k_positions[ks], ds).items():
                add(name, g)
            if ctx.extra is not None:
                dq_blk, dk_blk = self._extra_backward(ctx, qs, ks, ds, add)
                dq_extra[..., qs, :] += dq_blk
                dk_extra[..., ks, :] += dk_blk
        return logits_grad, dq_extra, dk_extra

    def _extra_backward(self, ctx, qs, ks, ds, add):
        """Step 5 reversed for the block ``(qs, ks)``: the scheme's ``extra_backward``, ``(dq, dk)``."""
        return self.scheme.extra_backward(ctx.q, ctx.k, ctx.positions, ctx.k_positions, qs, ks, ds, add)

    def _check_call(self, x, positions, mask, causal, cache, return_weights):
        """Every argument of a call checked once: ``(x, positions (T,) or (3, T), mask, causal)``, the mask
        as ``(B, 1, 1, S)`` or ``(B, 1, T, S)`` (or ``None``)."""
        x = as_float_array(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}), got {x.shape}")
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
        elif self.scheme.position_streams > 1:                                  # M-RoPE: (3, T), or (T,) for t = h = w
            positions = mrope.stream_positions(positions, T, allow_negative=False)
        else:
            positions = as_positions(positions, "positions", length=T)
        if mask is not None:
            S = T + (0 if cache is None else cache.length)
            mask = np.asarray(mask)
            if mask.dtype != bool:
                raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
            if mask.shape == (B, S):
                mask = mask[:, None, None, :]
            elif mask.shape == (B, T, S):
                mask = mask[:, None]
            else:
                raise ValueError(f"mask must have shape (B, S) = {(B, S)} or (B, T, S) = {(B, T, S)}, "
                                 f"got {mask.shape}")
        return x, positions, mask, causal


@dataclass(frozen=True, eq=False)
class Context:
    """What ``MultiHeadAttention.backward`` needs of a forward pass (returned with
    ``return_context=True``): the input, positions and mask, and each step's result. It holds
    no reference to the layer; the layer and its scheme keep no state for the backward."""

    x: np.ndarray              # (B, T, d_model)
    positions: np.ndarray      # (T,)
    k_positions: np.ndarray    # (S,)
    seq_len: int
    mask: np.ndarray | None    # (B, 1, 1|T, S)
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
    merged: np.ndarray         # (B, T, H*Dv)
    rot_positions: np.ndarray | None = None   # the rotate seam's: (T,), or (3, T) for M-RoPE; None = positions
