"""Multi-head attention with a pluggable position scheme.

``MultiHeadAttention`` knows the projections, the heads and the KV cache; a *scheme* object knows
where position enters. There are four seams, and a scheme overrides only the ones it uses:

=================  ==========================================  =================================
seam               what the scheme returns                     schemes
=================  ==========================================  =================================
input              ``embed(x, positions)``: x + p before the   ``Sinusoidal``, ``LearnedAbsolute``
                   projections
rotate             ``rotate_q / rotate_k(x, positions)``:       ``Rotary``, ``XPos``
                   q, k after a position-dependent map
bias               ``bias(q_positions, k_positions)``: an       ``ALiBi``, ``T5Bias``
                   additive ``(H, T, S)`` term
content-position   ``content_position(q, k, q_pos, k_pos)``:   ``TransformerXL``, ``DeBERTa``
                   the query used against content, plus a
                   function giving the extra logits that
                   couple content with position, per block
=================  ==========================================  =================================

One forward pass, with ``x`` ``(B, T, d_model)``::

    x_in    = scheme.embed(x, positions)                          # input seam
    q, k, v = split_heads(x_in @ wq + bq), ...                    # (B, H, T, D)
    q, k    = scheme.rotate_q(q, positions), scheme.rotate_k(k, positions)   # rotate seam
    k, v, key_positions = cache.append(k, v, positions)          # (B, H, S, D)
    # (a scheme with rotates_cached_keys, e.g. dynamic-NTK RoPE, caches k unrotated and
    #  rotates all S keys here instead, with this step's frequencies)
    q_c, extra = scheme.content_position(q, k, positions, key_positions)     # content-position
    logits_fn = lambda qs, ks: scheme.bias(positions[qs], key_positions[ks]) + extra(qs, ks)  # bias seam
    out     = attention(q_c, k, v, bias=logits_fn(all, all), mask=mask, scale=scheme.scale(D))
    y       = merge_heads(out) @ wo + bo                          # (B, T, d_model)

With ``block_size=N`` the same ``logits_fn`` is called per (query block, key block) by
``blockwise_attention`` (online softmax), so no ``(T, S)`` array is ever held, for every scheme.

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

The KV cache stores keys *after* the rotate seam, values, and the key positions. A decoding step's
queries start at the cache length unless ``positions`` says otherwise.
"""

from __future__ import annotations

import threading

import numpy as np

from . import alibi, deberta, rope, rope_scaling, sinusoidal, t5, transformer_xl, xpos
from ._checks import (as_float_array, as_positions, check_bool, check_choice, check_float, check_int,
                      check_positive_int)
from .attention import attention, blockwise_attention

__all__ = [
    "MultiHeadAttention",
    "KVCache",
    "Scheme",
    "NoPE",
    "Sinusoidal",
    "LearnedAbsolute",
    "Rotary",
    "XPos",
    "ALiBi",
    "T5Bias",
    "TransformerXL",
    "DeBERTa",
    "SCHEMES",
]

TERMS = ("content-content", "content-position", "position-content", "position-position")


class Scheme:
    """Base class of the position schemes, and itself the no-position baseline's behaviour.

    A subclass overrides only the seams it uses. ``bind`` is called once by the layer, giving the
    scheme the sizes and a random generator for its learned parameters.
    """

    name = "none"
    seams: tuple = ()
    terms: tuple = ("content-content",)  # which of the four expansion terms the logits keep

    def bind(self, layer: "MultiHeadAttention", rng: np.random.Generator) -> None:
        self.layer = layer
        self.d_model, self.num_heads, self.head_dim = layer.d_model, layer.num_heads, layer.head_dim

    def parameters(self) -> dict:
        """The scheme's learned position parameters, by their reference names."""
        return {}

    rotates_cached_keys = False  # True: the cache keeps raw keys and every step rotates all of them
    bias_by_distance = False     # True: bias(i, j) depends on j - i only (blocks on a diagonal share it)

    def begin(self, q_positions, k_positions, causal: bool) -> None:
        """Called once per forward pass with all query and key positions (length-dependent state)."""

    def cache_tag(self):
        """What the cached keys depend on besides their positions; a change raises, never mixes."""
        return None

    def embed(self, x, positions):  # input seam: (B, T, d_model) -> (B, T, d_model)
        return x

    def rotate_q(self, q, positions):  # rotate seam: (B, H, T, D) -> (B, H, T, D)
        return q

    def rotate_k(self, k, positions):
        return k

    def bias(self, q_positions, k_positions):  # bias seam: -> (H, T, S) or None
        return None

    def bias_state(self):
        """Everything ``bias`` depends on besides the positions, as a hashable value, or ``None``.

        With a value, bias blocks computed in one forward pass are reused by the next while the
        value is unchanged (e.g. T5's table bytes): a checkpoint copied in invalidates them.
        """
        return None

    def bias_bound(self, q_positions, k_positions):
        """An upper bound ``(H, 1, 1)`` of ``bias`` over these positions, or ``None`` (unknown).

        Lets the blockwise path skip heads whose whole block underflows (``bias_max_fn`` of
        ``blockwise_attention``). Cheap: ``O(T + S)``, not a pass over the block.
        """
        return None

    def content_position(self, q, k, q_positions, k_positions):
        """Content-position seam: ``(query against content, extra)``.

        ``extra`` is ``None`` or a function ``extra(q_slice, k_slice)`` giving the scaled extra
        logits ``(B, H, tq, tk)`` of the queries and keys in those index slices, so the layer can
        evaluate it for the whole ``(T, S)`` or block by block.
        """
        return q, None

    def scale(self, head_dim: int) -> float:
        return 1.0 / np.sqrt(head_dim)

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
        self.base = base
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

    def __repr__(self) -> str:
        return f"LearnedAbsolute(max_positions={self.max_positions})"


class Rotary(Scheme):
    """Rotary position embedding (Su et al. 2021) applied to q and k of every head.

    ``layout="half"`` for HF LLaMA / GPT-NeoX checkpoints, ``"interleaved"`` for Meta LLaMA,
    RoFormer and GPT-J. ``rotary_dim`` rotates only the first features of each head (GPT-NeoX).

    ``scaling`` is a checkpoint's ``rope_scaling`` / ``rope_parameters`` dict, e.g.
    ``{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}`` (``"type"``
    is accepted for ``"rope_type"``; keys as in ``minipos.rope_scaling``). Its ``attention_factor``
    multiplies cos and sin, so the logits scale by its square, as in HF.

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
        self.rotary_dim = rotary_dim
        self.scaling_kind, self.scaling_args = self._parse_scaling(scaling)
        theta = self.scaling_args.pop("rope_theta", None)  # transformers 5 keeps it in rope_parameters
        if theta is not None and base != 10000.0 and float(theta) != float(base):
            raise ValueError(f"scaling['rope_theta'] ({theta}) contradicts base ({base}); give one of them")
        self.base = check_float(base if theta is None else theta, "base", positive=True)
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
        if kind == "default":
            return None, {k: v for k, v in args.items() if k == "rope_theta"}
        check_choice(kind, "scaling['rope_type']", set(rope_scaling.REGISTRY))
        return kind, args

    def bind(self, layer, rng):
        super().bind(layer, rng)
        if self.rotary_dim is None and self.head_dim % 2:
            raise ValueError(f"RoPE needs an even head dim, got head_dim = {self.head_dim}")
        rd = self.head_dim if self.rotary_dim is None else check_int(self.rotary_dim, "rotary_dim", minimum=2)
        if rd > self.head_dim or rd % 2:
            raise ValueError(f"rotary_dim must be even and <= head_dim ({self.head_dim}), got {rd}")
        self._dim = rd
        seq_len = {"seq_len": 1} if self.rotates_cached_keys else {}
        self.inv_freq, self.attention_factor = self.frequencies(**seq_len)  # validates the scaling now

    def frequencies(self, seq_len: int | None = None):
        """``(inv_freq (rotary_dim/2,), attention_factor)`` for this scheme at ``seq_len``."""
        if self.scaling_kind is None:
            return rope.rope_inv_freq(self._dim, base=self.base), 1.0
        extra = {"seq_len": seq_len} if self.scaling_kind in self.LENGTH_DEPENDENT else {}
        inv_freq, factor = rope_scaling.REGISTRY[self.scaling_kind](self._dim, base=self.base,
                                                                    **self.scaling_args, **extra)
        return inv_freq, factor

    def begin(self, q_positions, k_positions, causal):
        if self.rotates_cached_keys:  # frequencies for the current length: max position + 1
            self.inv_freq, self.attention_factor = self.frequencies(int(k_positions.max()) + 1)

    def cache_tag(self):
        return None if self.rotates_cached_keys else (self.inv_freq.tobytes(), self.attention_factor)

    def _apply(self, x, positions):
        return rope.apply_rope(x, positions, inv_freq=self.inv_freq, layout=self.layout,
                               rotary_dim=self.rotary_dim, attention_factor=self.attention_factor)

    rotate_q = _apply
    rotate_k = _apply

    def __repr__(self) -> str:
        kind = f", scaling={self.scaling_kind!r}" if self.scaling_kind else ""
        return f"Rotary(layout={self.layout!r}, rotary_dim={self.rotary_dim}{kind})"


class XPos(Scheme):
    """xPos (Sun et al. 2022): interleaved RoPE with queries scaled by zeta^(n/g), keys by zeta^(-n/g).

    The scales multiply to zeta^((n - m)/g) in every score, so attention depends on n - m only and
    decays with distance. ``scale_base`` is g (512 in torchscale).
    """

    name = "xpos"
    seams = ("rotate",)

    def __init__(self, *, base: float = 10000.0, scale_base: float = 512):
        self.base = check_float(base, "base", positive=True)
        self.scale_base = check_float(scale_base, "scale_base", positive=True)

    def rotate_q(self, q, positions):
        return xpos.apply_xpos(q, positions, base=self.base, scale_base=self.scale_base)

    def rotate_k(self, k, positions):
        return xpos.apply_xpos(k, positions, base=self.base, scale_base=self.scale_base, downscale=True)

    def __repr__(self) -> str:
        return f"XPos(scale_base={self.scale_base})"


class ALiBi(Scheme):
    """Linear biases (Press et al. 2022): ``-m_h |i - j|`` by default, ``-m_h (i - j)`` with ``symmetric=False``.

    The two agree on every entry a causal mask keeps, so the default is the paper's bias under
    ``causal=True`` and the usual bidirectional variant without it. ``symmetric=False`` gives the
    raw ``-m_h (i - j)``, which rewards future keys unless they are masked. ``slopes`` ``(H,)`` are
    fixed (``alibi_slopes``), not learned.
    """

    name = "alibi"
    seams = ("bias",)
    bias_by_distance = True
    terms = ("content-content", "position-position")

    def __init__(self, *, symmetric: bool = True):
        self.symmetric = check_bool(symmetric, "symmetric")

    def bind(self, layer, rng):
        super().bind(layer, rng)
        self.slopes = alibi.alibi_slopes(self.num_heads)  # (H,), fixed, not learned

    def bias(self, q_positions, k_positions):  # in the layer's dtype directly (one pass per block)
        return alibi.alibi_bias_as(self.layer.dtype, self.slopes, q_positions, k_positions,
                                   symmetric=self.symmetric)

    def bias_state(self):
        return ("alibi", self.symmetric, np.asarray(self.slopes).tobytes())

    def bias_bound(self, q_positions, k_positions):
        """``alibi.alibi_bias_bound``: ``-m_h`` times the least ``|i - j|`` (or ``i - j``) over the block."""
        return alibi.alibi_bias_bound(self.slopes, q_positions, k_positions, symmetric=self.symmetric)

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
    bias_by_distance = True
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

    def bias_state(self):
        table = np.asarray(self.table)
        return ("t5", self.bidirectional, self.num_buckets, self.max_distance, table.dtype.str, table.shape,
                table.tobytes())

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
        self.base = base

    def bind(self, layer, rng):
        super().bind(layer, rng)
        H, D, d = self.num_heads, self.head_dim, self.d_model
        self.u = (rng.standard_normal((H, D)) * 0.02).astype(layer.dtype)
        self.v = (rng.standard_normal((H, D)) * 0.02).astype(layer.dtype)
        self.w_r = (rng.standard_normal((d, H * D)) / np.sqrt(d)).astype(layer.dtype)

    def parameters(self):
        return {"u": self.u, "v": self.v, "w_r": self.w_r}

    def content_position(self, q, k, q_positions, k_positions):
        scale = 1.0 / np.sqrt(self.head_dim)

        def extra(qs, ks):  # terms (b) + (d) for one block: (q_i + v) . W_R R_{i-j}
            return scale * transformer_xl.xl_position_logits(q[..., qs, :], self.v, self.w_r, q_positions[qs],
                                                             k_positions[ks], base=self.base)
        return q + self.u[:, None, :], extra  # terms (a) + (c): (q_i + u) . k_j

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
        super().bind(layer, rng)
        self.rel_embeddings = rng.standard_normal((2 * self.att_span, self.d_model)).astype(layer.dtype)

    def parameters(self):
        return {"rel_embeddings": self.rel_embeddings}

    def _project(self, w, b):  # (2k, d_model) -> (H, 2k, D)
        p = self.rel_embeddings @ w + (0 if b is None else b)
        return p.reshape(2 * self.att_span, self.num_heads, self.head_dim).transpose(1, 0, 2)

    def content_position(self, q, k, q_positions, k_positions):
        L, scale = self.layer, self.scale(self.head_dim)
        pos_key, pos_query = self._project(L.wk, L.bk), self._project(L.wq, L.bq)  # (H, 2k, D)

        def extra(qs, ks):  # c2p + p2c for one block, scaled like c2c
            rel = deberta.relative_positions(q_positions[qs], k_positions[ks], bucket_size=self.position_buckets,
                                             max_position=self.max_relative_positions)  # (tq, tk), q - k
            total = 0.0
            if "c2p" in self.pos_att_type:
                total = total + deberta.c2p_term(q[..., qs, :], pos_key, rel, self.att_span)
            if "p2c" in self.pos_att_type:
                total = total + deberta.p2c_term(k[..., ks, :], pos_query, rel, self.att_span)
            return scale * total
        return q, extra

    def scale(self, head_dim):
        return 1.0 / np.sqrt(head_dim * (1 + len(self.pos_att_type)))

    def __repr__(self) -> str:
        return f"DeBERTa(position_buckets={self.position_buckets}, pos_att_type={self.pos_att_type})"


SCHEMES = {cls.name: cls for cls in (NoPE, Sinusoidal, LearnedAbsolute, Rotary, XPos, ALiBi, T5Bias,
                                     TransformerXL, DeBERTa)}


class KVCache:
    """Keys (after the rotate seam), values and key positions of the tokens seen so far.

    ``k``, ``v`` are ``(B, H, S, D)`` views of preallocated buffers that double when full, so a
    decoding step appends in O(1) amortised and costs O(S) only in attention itself.
    ``mem_len`` (Transformer-XL's memory length) keeps at most that many keys from earlier calls:
    a call attends to the last ``mem_len`` cached keys plus its own, then becomes the memory of
    the next (``new_mems = cat(mems, hids)[-mem_len:]`` in the reference). ``None`` keeps all.
    """

    def __init__(self, mem_len: int | None = None):
        self.mem_len = None if mem_len is None else check_int(mem_len, "mem_len", minimum=0)
        self._k = self._v = None
        self._pos = np.zeros(0, dtype=np.int64)
        self.length = 0  # keys held now
        self.seen = 0    # tokens appended in all (default positions continue from here)
        self.tag = None

    @property
    def k(self):
        return None if self._k is None else self._k[:, :, : self.length]

    @property
    def v(self):
        return None if self._v is None else self._v[:, :, : self.length]

    @property
    def positions(self):
        return self._pos[: self.length]


    def append(self, k, v, positions, *, tag=None):
        """Add ``k``, ``v`` ``(B, H, T, D)`` at ``positions`` ``(T,)``; return all ``(k, v, positions)``.

        ``tag`` is what the keys were computed with besides their positions (e.g. RoPE
        frequencies); appending with a tag different from the cached keys' raises ``ValueError``.
        """
        B, H, T, D = k.shape
        if self.length and tag != self.tag:
            raise ValueError("cache holds keys computed with other scheme parameters (e.g. RoPE "
                             "frequencies) than this step's; start a new cache instead of mixing them")
        self.tag = tag
        if self._k is not None and (self._k.shape[:2] != (B, H) or self._k.shape[3] != D):
            raise ValueError(f"cache holds keys of shape (B, H, S, D) = {self._k.shape[:2]} + (S, "
                             f"{self._k.shape[3]}), cannot append keys of shape {k.shape}")
        need = self.length + T
        if self._k is None or need > self._k.shape[2]:
            self._grow(max(need, 2 * (0 if self._k is None else self._k.shape[2]), 16), k, v)
        self._k[:, :, self.length:need] = k
        self._v[:, :, self.length:need] = v
        self._pos[self.length:need] = positions
        self.length = need
        self.seen += T
        return self.k, self.v, self.positions

    def trim(self):
        """Keep only the last ``mem_len`` entries: the memory carried into the next call."""
        if self.mem_len is None or self.length <= self.mem_len:
            return
        drop, keep = self.length - self.mem_len, self.mem_len
        self._k[:, :, :keep] = self._k[:, :, drop:self.length].copy()
        self._v[:, :, :keep] = self._v[:, :, drop:self.length].copy()
        self._pos[:keep] = self._pos[drop:self.length].copy()
        self.length = keep

    def _grow(self, capacity, k, v):
        B, H, _, D = k.shape
        dtype = np.result_type(k.dtype, v.dtype)
        new_k = np.zeros((B, H, capacity, D), dtype)
        new_v = np.zeros((B, H, capacity, v.shape[-1]), dtype)
        new_pos = np.zeros(capacity, np.int64)
        if self._k is not None:
            new_k[:, :, : self.length], new_v[:, :, : self.length] = self.k, self.v
            new_pos[: self.length] = self.positions
        self._k, self._v, self._pos = new_k, new_v, new_pos


def _is_run(positions) -> bool:
    """Whether ``positions`` are consecutive integers ``p, p + 1, ...`` (empty counts)."""
    return len(positions) == 0 or bool(np.array_equal(positions, positions[0] + np.arange(len(positions))))


class _DistanceMemo:
    """The bias blocks of one forward pass by ``(k_0 - q_0, tq, tk)`` for runs of positions.

    Under a bias that depends on ``j - i`` only, every block on one diagonal of the blockwise
    walk has the same bias; the blocks nearest the diagonal (met first) are kept, up to ``limit``
    bytes. ``stamp`` names what the bias depends on (``Scheme.bias_state``, the dtype): the layer
    keeps the memo across passes while it is unchanged and not ``full()``, else it dies with the
    pass. Safe to share
    between the threads of ``blockwise_attention``.
    """

    def __init__(self, stamp=None, limit: int = 64 << 20):
        self.stamp, self.blocks, self.room, self.limit, self.lock = stamp, {}, limit, limit, threading.Lock()

    def full(self) -> bool:
        """Three quarters or more of ``limit`` used: a new pass starts a fresh memo (decoding, each
        step a new block, would otherwise fill it with blocks never met again)."""
        return self.room <= self.limit // 4

    def get(self, q, k, compute, runs: bool = False):
        """The block for positions ``q``, ``k`` (``runs``: known to be runs of consecutive
        positions, so not checked), from the memo or ``compute()``."""
        if not (runs or (len(q) and len(k) and np.all(np.diff(q) == 1) and np.all(np.diff(k) == 1))):
            return compute()                                   # not runs of consecutive positions
        key = (int(k[0] - q[0]), len(q), len(k))
        found = self.blocks.get(key)
        if found is not None:
            return found
        bias = compute()
        if bias is None:
            return bias
        with self.lock:
            if key in self.blocks or bias.nbytes > self.room:
                return self.blocks.get(key, bias)
            self.room -= bias.nbytes
            bias.setflags(write=False)
            self.blocks[key] = bias
        return bias


class MultiHeadAttention:
    """Multi-head self-attention with a position ``scheme`` (default ``NoPE()``).

    Weights ``wq``, ``wk``, ``wv`` ``(d_model, H*D)``, ``wo`` ``(H*D, d_model)``; with
    ``bias=True`` also ``bq``, ``bk``, ``bv`` ``(H*D,)`` and ``bo`` ``(d_model,)`` (else ``None``).
    ``head_dim`` defaults to ``d_model // num_heads``. Weights are drawn from N(0, 1/d_in) with
    ``seed``; copy a checkpoint's into the attributes (see the module docstring for the mapping).
    ``block_size=N`` computes attention blockwise (online softmax over N x N blocks of queries
    and keys): the same outputs without ever holding a ``(T, S)`` array; ``None`` is dense. The
    bias blocks of a scheme whose bias depends on ``j - i`` only (ALiBi, T5) are kept from one
    call to the next, up to 64 MiB, while ``scheme.bias_state()`` is unchanged.
    """

    def __init__(self, d_model: int, num_heads: int, *, scheme: Scheme | None = None,
                 head_dim: int | None = None, bias: bool = False, seed: int = 0, dtype=np.float64,
                 block_size: int | None = None):
        self.d_model = check_positive_int(d_model, "d_model")
        self.num_heads = check_positive_int(num_heads, "num_heads")
        if head_dim is None:
            if d_model % num_heads:
                raise ValueError(f"d_model ({d_model}) must be divisible by num_heads ({num_heads}), "
                                 "or pass head_dim")
            head_dim = d_model // num_heads
        self.head_dim = check_positive_int(head_dim, "head_dim")
        self.dtype = np.dtype(dtype)
        if not np.issubdtype(self.dtype, np.floating):
            raise TypeError(f"dtype must be a floating dtype, got {self.dtype}")
        self.block_size = None if block_size is None else check_positive_int(block_size, "block_size")
        self._memo = None                         # bias blocks kept across passes (_DistanceMemo)
        if scheme is None:
            scheme = NoPE()
        if not isinstance(scheme, Scheme):
            raise TypeError(f"scheme must be a minipos.layer.Scheme instance, got {type(scheme).__name__}")
        rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
        d, hd = self.d_model, self.num_heads * self.head_dim
        self.wq, self.wk, self.wv = (self._init(rng, d, hd) for _ in range(3))
        self.wo = self._init(rng, hd, d)
        zeros = (lambda n: np.zeros(n, self.dtype)) if bias else (lambda n: None)
        self.bq, self.bk, self.bv, self.bo = zeros(hd), zeros(hd), zeros(hd), zeros(d)
        self.scheme = scheme
        scheme.bind(self, rng)

    def _init(self, rng, d_in, d_out):
        return (rng.standard_normal((d_in, d_out)) / np.sqrt(d_in)).astype(self.dtype)

    def new_cache(self, mem_len: int | None = None) -> KVCache:
        """An empty KV cache for incremental decoding (``mem_len``: see ``KVCache``)."""
        return KVCache(mem_len)

    def _project(self, x, w, b):  # (B, T, d_model) -> (B, H, T, D)
        y = x @ w if b is None else x @ w + b
        B, T, _ = x.shape
        return y.reshape(B, T, self.num_heads, -1).transpose(0, 2, 1, 3)

    def __call__(self, x, *, positions=None, mask=None, causal: bool = False, cache: KVCache | None = None,
                 return_weights: bool = False):
        """Attend ``x`` ``(B, T, d_model)`` to itself (and to the cache); return ``(B, T, d_model)``.

        positions: ``(T,)`` integer positions of the queries; default ``cache.seen + arange(T)``
          (the cache length, unless ``mem_len`` made it forget keys).
        mask: boolean, ``True`` = may attend: ``(B, S)`` key padding or ``(B, T, S)``, where
          ``S`` counts the cached keys too. causal: queries see keys at positions ``<=`` their own.
        cache: a ``KVCache`` (``new_cache()``), updated in place.
        return_weights: also return the attention weights ``(B, H, T, S)`` (dense path only).
        """
        x = as_float_array(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(f"x must have shape (B, T, d_model={self.d_model}), got {x.shape}")
        B, T, _ = x.shape
        if cache is not None and not isinstance(cache, KVCache):
            raise TypeError(f"cache must be a KVCache (layer.new_cache()), got {type(cache).__name__}")
        causal = check_bool(causal, "causal")
        if check_bool(return_weights, "return_weights") and self.block_size is not None:
            raise ValueError("return_weights needs the dense path: the blockwise path (block_size) "
                             "never forms the (T, S) weights")
        seen = 0 if cache is None else cache.seen
        positions = np.arange(seen, seen + T) if positions is None else as_positions(positions, "positions")
        if positions.shape != (T,):
            raise ValueError(f"positions must have shape (T,) = ({T},), got {positions.shape}")
        memory = np.zeros(0, np.int64) if cache is None else cache.positions
        mask = self._check_mask(mask, B, T, len(memory))
        q, k, v, k_pos = self._qkv(x, positions, memory, cache, causal)                               # (B, H, T|S, D)
        q, extra = self.scheme.content_position(q, k, positions, k_pos)              # content-position
        logits = self._logits_fn(extra, positions, k_pos)
        scale = self.scheme.scale(self.head_dim)
        if self.block_size is None:
            every = (slice(0, T), slice(0, len(k_pos)))
            out = attention(q, k, v, bias=logits(*every), mask=self._mask_fn(mask, causal, positions, k_pos)(*every),
                            scale=scale, return_weights=return_weights)
        else:
            out = self._blockwise(q, k, v, logits, mask, causal, positions, k_pos, scale,
                                  self._bias_max_fn(extra, positions, k_pos))
        if cache is not None:
            cache.trim()                                                             # Transformer-XL memory
        out, weights = out if return_weights else (out, None)
        y = out.transpose(0, 2, 1, 3).reshape(B, T, -1) @ self.wo                   # (B, T, d_model)
        if self.bo is not None:
            y = y + self.bo
        return (y, weights) if return_weights else y

    def _qkv(self, x, positions, memory, cache, causal):
        """Embed, project, rotate and cache: q ``(B, H, T, D)``, k, v ``(B, H, S, D)``, key positions."""
        sc = self.scheme
        k_pos = np.concatenate([memory, positions])                                  # (S,)
        sc.begin(positions, k_pos, causal)
        x_in = sc.embed(x, positions)                                                # input seam
        q = sc.rotate_q(self._project(x_in, self.wq, self.bq), positions)            # rotate seam
        k = self._project(x_in, self.wk, self.bk)
        if not sc.rotates_cached_keys:
            k = sc.rotate_k(k, positions)
        v = self._project(x_in, self.wv, self.bv)
        if cache is not None:
            k, v, k_pos = cache.append(k, v, positions, tag=sc.cache_tag())          # (B, H, S, D)
        if sc.rotates_cached_keys:
            k = sc.rotate_k(k, k_pos)                                                # all keys, this step's map
        return q, k, v, k_pos

    def _logits_fn(self, extra, q_pos, k_pos):
        """``fn(q_slice, k_slice)``: the additive logits of a block (bias seam + content-position)."""
        sc = self.scheme
        memo = None
        if sc.bias_by_distance:
            state = sc.bias_state()
            stamp = None if state is None else (state, np.dtype(self.dtype).str)
            if stamp is None:
                memo = _DistanceMemo()                                               # this pass only
            else:
                if self._memo is None or self._memo.stamp != stamp or self._memo.full():
                    self._memo = _DistanceMemo(stamp)                                # kept for the next pass
                memo = self._memo

        def seam(q, k):
            bias = sc.bias(q, k)                                                     # (H, tq, tk)
            return None if bias is None else bias.astype(self.dtype, copy=False)

        runs = memo is not None and _is_run(q_pos) and _is_run(k_pos)                  # so is every slice

        def fn(qs, ks):
            q, k = q_pos[qs], k_pos[ks]
            bias = seam(q, k) if memo is None else memo.get(q, k, lambda: seam(q, k), runs and len(q) and len(k))
            if extra is None:
                return bias
            more = extra(qs, ks)                                                     # (B, H, tq, tk)
            return more if bias is None else more + bias
        return fn

    @staticmethod
    def _check_mask(mask, B, T, past):
        """The padding mask as ``(B, 1, 1, S)`` or ``(B, 1, T, S)``, or ``None``."""
        if mask is None:
            return None
        S = past + T
        mask = np.asarray(mask)
        if mask.dtype != bool:
            raise TypeError(f"mask must be boolean (True = may attend), got dtype {mask.dtype}")
        if mask.shape == (B, S):
            return mask[:, None, None, :]
        if mask.shape == (B, T, S):
            return mask[:, None]
        raise ValueError(f"mask must have shape (B, S) = {(B, S)} or (B, T, S) = {(B, T, S)}, got {mask.shape}")

    @staticmethod
    def _mask_fn(mask, causal, q_pos, k_pos):
        """``fn(q_slice, k_slice)``: the boolean mask of a block (causal by positions, and padding)."""
        def fn(qs, ks):
            allowed = (k_pos[ks][None, :] <= q_pos[qs][:, None])[None, None] if causal else None  # (1, 1, tq, tk)
            if mask is None:
                return allowed
            pad = mask[..., qs if mask.shape[2] > 1 else slice(None), ks]
            return pad if allowed is None else pad & allowed
        return fn

    def _bias_max_fn(self, extra, q_pos, k_pos):
        """``fn(q_slice, k_slice)``: the scheme's ``bias_bound`` of a block, or ``None`` when it
        has none or a content-position term is added (that term is not bounded)."""
        sc = self.scheme
        if extra is not None or type(sc).bias_bound is Scheme.bias_bound:
            return None
        return lambda qs, ks: sc.bias_bound(q_pos[qs], k_pos[ks])

    def _blockwise(self, q, k, v, logits, mask, causal, q_pos, k_pos, scale, bound=None):
        """Online-softmax attention; native causal block skipping when positions are contiguous."""
        if causal and len(q_pos) and len(k_pos) and _is_run(q_pos) and _is_run(k_pos):
            # query t sees key s iff s <= t + (q_pos[0] - k_pos[0])
            pad = None if mask is None else self._mask_fn(mask, False, q_pos, k_pos)
            return blockwise_attention(q, k, v, bias_fn=logits, mask_fn=pad, causal=True,
                                       q_offset=int(q_pos[0] - k_pos[0]), scale=scale,
                                       block_size=self.block_size, bias_max_fn=bound)
        return blockwise_attention(q, k, v, bias_fn=logits, mask_fn=self._mask_fn(mask, causal, q_pos, k_pos),
                                   scale=scale, block_size=self.block_size, bias_max_fn=bound)
