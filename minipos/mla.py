"""Multi-head latent attention (MLA) with decoupled RoPE: DeepSeek-V2 (arXiv:2405.04434, §2.1) and V3.

Keys and values come from one low-rank latent per token, and position enters through a separate,
narrow slice of each head that RoPE rotates::

    c_kv, k_R = split(x W_kv_a + b_kv_a)           # (B, T, r_kv), (B, T, D_R)   §2.1.2, §2.1.3
    c_kv      = RMSNorm(c_kv)                       # (B, T, r_kv)
    k_C, v    = split(heads(c_kv W_kv_b))           # (B, H, T, D_N), (B, H, T, D_V)   §2.1.2
    c_q       = RMSNorm(x W_q_a + b_q_a)            # (B, T, r_q)   (or q = heads(x W_q) without q_lora_rank)
    q_C, q_R  = split(heads(c_q W_q_b))             # (B, H, T, D_N), (B, H, T, D_R)   §2.1.2-2.1.3
    q = [q_C | RoPE(q_R)],  k = [k_C | RoPE(k_R)]   # one rotated key per token, shared by every head
    scores = q . k * (D_N + D_R) ** -0.5 * mscale(s, mscale_all_dim) ** 2

Why the slice is separate: without RoPE, ``q_i . k_j = c_q,i W_UQ W_UK^T c_kv,j^T`` and the middle
product ``W_UQ W_UK^T`` can be absorbed into one matrix, so a cache of the latents ``c_kv`` is all
decoding needs. RoPE puts ``R(j - i)`` between ``W_UQ`` and ``W_UK^T``; it depends on the positions,
so no fixed matrix absorbs it. DeepSeek keeps the latent path position-free and adds ``D_R``
rotated features per head, whose key part ``k_R`` is computed from x directly and shared by every
head (it is cached beside ``c_kv``). The derivation and the traps are on the docs page ``mla.md``.

How it runs through ``MultiHeadAttention``: ``MultiHeadLatentAttention`` replaces step 2 (the
projections) and nothing else; ``DecoupledRotary`` is the rotate seam (RoPE on the last ``D_R``
features of each head) and gives the softmax scale; the cache, attention, merge and output steps,
dense or ``block_size=`` blockwise, are the layer's. The cache holds the expanded per-head keys
``(B, H, S, D_N + D_R)`` and values ``(B, H, S, D_V)``, not the latents: a real MLA cache holds
``c_kv`` and the rotated ``k_R`` (``r_kv + D_R`` numbers a token instead of ``H (D_N + D_R + D_V)``)
and expands them (or absorbs ``W_kv_b`` into the query and output) at every step. The expansion is
a fixed linear map of cached values, so both give the same attention; the layer keeps its one
cache so that every step after 2 stays its own. The production form is here too, for decoding:
``latent_kv`` gives the latent cache entries and ``absorbed_attention`` attends to them with
``W_UK`` folded into the query and ``W_UV`` into the output (tested equal to the layer).

Weights are ``(d_in, d_out)`` and used as ``x @ W``; from HF ``DeepseekV3Attention`` /
``DeepseekV2Attention`` copy ``W = linear.weight.T``:

====================  ==========================================  ============================================
minipos               HF                                          shape
====================  ==========================================  ============================================
``wq``                ``q_proj.weight.T`` (no ``q_lora_rank``)    ``(d_model, H (D_N + D_R))``
``wq_a``, ``bq_a``    ``q_a_proj.weight.T``, ``.bias``            ``(d_model, r_q)``, ``(r_q,)``
``q_a_norm``          ``q_a_layernorm.weight``                    ``(r_q,)``
``wq_b``              ``q_b_proj.weight.T``                       ``(r_q, H (D_N + D_R))``
``wkv_a``, ``bkv_a``  ``kv_a_proj_with_mqa.weight.T``, ``.bias``  ``(d_model, r_kv + D_R)``, ``(r_kv + D_R,)``
``kv_a_norm``         ``kv_a_layernorm.weight``                   ``(r_kv,)``
``wkv_b``             ``kv_b_proj.weight.T``                      ``(r_kv, H (D_N + D_V))``
``wo``, ``bo``        ``o_proj.weight.T``, ``.bias``              ``(H D_V, d_model)``, ``(d_model,)``
``k_rope_norm``       ``k_rope_only_layernorm.weight`` (Dots)     ``(D_R,)``
``wg``                ``g_proj.weight.T`` (Dots)                  ``(d_model, H)``
====================  ==========================================  ============================================

Column layouts follow HF's ``view``: ``wq``/``wq_b`` head by head, each ``[nope D_N | rope D_R]``;
``wkv_b`` head by head, each ``[k_nope D_N | v D_V]``; ``wkv_a`` is ``[latent r_kv | rope key D_R]``.
Biases (``bias=True``, HF ``attention_bias``) exist on ``q_a_proj``, ``kv_a_proj_with_mqa`` and
``o_proj`` only. The RMSNorms use ``eps = 1e-6`` (HF builds them with the default, not
``rms_norm_eps``).

Variants: ``qk_rope_head_dim=0`` is latent attention without RoPE (GLM-5.3-Flash's, HF ``Glm5NextTextAttention``):
no rope slice, no rope key, ``scheme`` ``NoPE`` (the default then), the softmax scale ``D_N ** -0.5``. Dots 3 Note
(HF ``Dots3NoteTextAttention``) norms the rope key before its rotation,
``k_R = RMSNorm(k_R)`` (``k_rope_norm=True``), multiplies the normed latents by ``sqrt(d_model / r)``
(``q_lora_scale``, ``kv_lora_scale``), gates each head's output, ``o_h * sigmoid(x W_g)_h``
(``gate="head"``, ``minipos.gate``), and builds its norms with ``rms_norm_eps`` (pass it as ``eps``).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from . import rope, rope_scaling
from ._checks import (as_float_array, as_positions, check_alloc, check_bool, check_even_int, check_float,
                      check_int, check_overflow, check_positive_int)
from .attention import attention
from .gate import OutputGate, check_gate
from .layer import MultiHeadAttention
from .seams import NoPE
from .query_scale import QueryScaleMixin
from .rope_scaling import Rotary

__all__ = ["MultiHeadLatentAttention", "DecoupledRotary", "ScaledDecoupledRotary", "rms_norm", "rms_norm_backward",
           "yarn_get_mscale",
           "latent_kv", "absorbed_attention"]


# --------------------------------------------------------------------------- RMSNorm

def _check_norm(x, weight, name: str):
    x = as_float_array(x, name)
    weight = as_float_array(weight, "weight")
    if weight.ndim != 1 or x.ndim < 1 or x.shape[-1] != weight.shape[0]:
        raise ValueError(f"weight must have shape (D,) with D = {name}.shape[-1]; got {name} {x.shape}, "
                         f"weight {weight.shape}")
    return x, weight


def _normalised(x, eps: float):
    """``(r, n)``: ``r = (mean(x^2) + eps)^(-1/2)`` ``(..., 1)`` and ``n = x r`` ``(..., D)``.

    Rows whose ``x * x`` overflows x's dtype (|x| above the square root of its largest value:
    1e154 in float64, 1.8e19 in float32, 256 in float16) are computed again in float64 (or wider),
    scaled by their largest ``|x|`` first, ``s``: ``n = (x/s) / sqrt(mean((x/s)^2) + eps/s^2)``, and
    ``r = n / x``'s factor ``1 / (s sqrt(...))``; the other rows are computed as written above.
    """
    with np.errstate(over="ignore", invalid="ignore"):                  # an overflow is redone below
        ms = np.mean(x * x, axis=-1, keepdims=True) if x.shape[-1] else np.zeros((*x.shape[:-1], 1), x.dtype)
    r = 1.0 / np.sqrt(ms + eps)                                           # (..., 1)
    n = x * r                                                             # (..., D)
    big = ~np.isfinite(ms)                                                # (..., 1)
    if big.any():
        wide = x.astype(np.promote_types(x.dtype, np.float64))
        s = np.max(np.abs(wide), axis=-1, keepdims=True)                  # (..., 1), > 0 where x*x overflowed
        s = np.where(big, s, 1.0)
        root = np.sqrt(np.mean((wide / s) ** 2, axis=-1, keepdims=True) + eps / s / s)   # sqrt(mean((x/s)^2) + eps/s^2)
        r = np.where(big, (1.0 / (s * root)).astype(r.dtype), r)
        n = np.where(big, (wide / s / root).astype(n.dtype), n)
    return r, n


def rms_norm(x: ArrayLike, weight: ArrayLike, *, eps: float = 1e-6) -> np.ndarray:
    """``weight * x / sqrt(mean(x^2) + eps)`` over the last axis (Zhang & Sennrich 2019; HF ``*RMSNorm``).

    x: ``(..., D)``; weight: ``(D,)``. Returns ``(..., D)`` in x's dtype, for any finite x (a row
    whose ``x * x`` would overflow is scaled by its largest entry first).
    """
    x, weight = _check_norm(x, weight, "x")
    eps = check_float(eps, "eps", positive=True)
    _, n = _normalised(x, eps)                                            # x r, r = (mean(x^2) + eps)^(-1/2)
    with np.errstate(over="ignore", invalid="ignore"):                   # checked just below
        out = (weight * n).astype(x.dtype, copy=False)                    # (..., D)
    return check_overflow(out, "rms_norm's output weight * x / rms(x)", "weight")


def rms_norm_backward(x: ArrayLike, weight: ArrayLike, dy: ArrayLike, *,
                      eps: float = 1e-6) -> tuple[np.ndarray, np.ndarray]:
    """``(dx, dweight)`` of ``rms_norm(x, weight)`` for the output gradient ``dy`` ``(..., D)``, in
    the dtypes of ``x`` and ``weight``.

    With ``r = (mean(x^2) + eps)^(-1/2)`` and ``n = x r``: ``dweight = sum(dy * n)`` over the leading
    axes, and ``dx = r (g - n mean(g * n))`` with ``g = dy * weight`` (the mean over the last axis).
    """
    x, weight = _check_norm(x, weight, "x")
    dy = as_float_array(dy, "dy")
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    eps = check_float(eps, "eps", positive=True)
    r, n = _normalised(x, eps)                                            # (..., 1), (..., D)
    with np.errstate(over="ignore", invalid="ignore"):                   # checked just below
        g = dy * weight                                                   # (..., D)
        dx = (r * (g - n * np.mean(g * n, axis=-1, keepdims=True))).astype(x.dtype, copy=False)   # (..., D)
        dn = (dy * n).astype(np.result_type(dy, n, weight), copy=False)
        dweight = dn.reshape(-1, x.shape[-1]).sum(axis=0).astype(weight.dtype, copy=False)
    return (check_overflow(dx, "the gradient of x", "dy or weight"),
            check_overflow(dweight, "the gradient of weight", "dy"))


# --------------------------------------------------------------------------- the softmax scale

def yarn_get_mscale(scale: float, mscale: float = 1.0) -> float:
    """YaRN's ``0.1 * mscale * ln(scale) + 1`` for ``scale > 1``, else 1 (DeepSeek's ``yarn_get_mscale``)."""
    scale = check_float(scale, "scale", positive=True)
    return rope_scaling.yarn_mscale(scale, check_float(mscale, "mscale", minimum=0.0))


class DecoupledRotary(Rotary):
    """The rotate seam of MLA: RoPE on the last ``qk_rope_head_dim`` features of each head's q and k.

    ``layout="interleaved"`` is HF's ``rope_interleave=True`` (the DeepSeek checkpoints' default),
    ``"half"`` is ``rope_interleave=False``. ``scaling`` is the config's ``rope_parameters`` /
    ``rope_scaling`` dict, as for ``Rotary``. With YaRN two factors enter, as in HF's DeepSeek:
    ``mscale(s, mscale) / mscale(s, mscale_all_dim)`` multiplies cos and sin (``rope_scaling.yarn``'s
    attention factor), and ``mscale(s, mscale_all_dim) ** 2`` multiplies the softmax scale of the
    whole score (``scale``). Belongs to a ``MultiHeadLatentAttention``.
    """

    name = "mla-rope"

    def __init__(self, *, base: float = 10000.0, layout: str = "interleaved", scaling: dict | None = None):
        super().__init__(base=base, layout=layout, scaling=scaling)
        if self.partial_rotary_factor is not None:
            raise ValueError("scaling['partial_rotary_factor'] does not apply to MLA: the rotated slice is "
                             "qk_rope_head_dim")

    def bind(self, layer, rng):
        if not isinstance(layer, MultiHeadLatentAttention):
            raise TypeError(f"DecoupledRotary belongs to a MultiHeadLatentAttention, got {type(layer).__name__}")
        if getattr(self, "layer", None) is None:                          # else super().bind refuses
            self.rotary_dim, self.nope_dim = layer.qk_rope_head_dim, layer.qk_nope_head_dim
        super().bind(layer, rng)

    def _apply(self, x, positions, *, seq_len):  # (B, H, T, D_N + D_R): RoPE on the last D_R features
        inv_freq, factor = self.frequencies(seq_len)
        rotated = rope.apply_rope(x[..., self.nope_dim:], positions, inv_freq=inv_freq, layout=self.layout,
                                  attention_factor=factor)                # (B, H, T, D_R)
        return np.concatenate([x[..., :self.nope_dim], rotated], axis=-1)

    def _apply_backward(self, dx, positions, *, seq_len):  # R(m)^T on the rope slice
        inv_freq, factor = self.frequencies(seq_len)
        rotated = rope.apply_rope_backward(dx[..., self.nope_dim:], positions, inv_freq=inv_freq,
                                           layout=self.layout, attention_factor=factor)
        return np.concatenate([dx[..., :self.nope_dim], rotated], axis=-1)

    rotate_q = rotate_k = _apply
    rotate_q_backward = rotate_k_backward = _apply_backward

    def mscale_all_dim(self) -> float:
        """The softmax scale's extra factor's root: ``mscale(factor, mscale_all_dim)``, or 1 (HF
        ``yarn_apply_mscale``: any scaled ``rope_type`` with a nonzero ``mscale_all_dim``)."""
        m_all = self.scaling_args.get("mscale_all_dim")
        if self.scaling_kind is None or not m_all:
            return 1.0
        return yarn_get_mscale(self.scaling_args["factor"], m_all)

    def scale(self, head_dim: int) -> float:
        """``(D_N + D_R) ** -0.5 * mscale(s, mscale_all_dim) ** 2`` (HF: ``qk_head_dim ** -0.5``, then
        ``yarn_apply_mscale``)."""
        m = self.mscale_all_dim()
        return head_dim ** -0.5 * m * m

    def __repr__(self) -> str:
        kind = f", scaling={self.scaling_kind!r}" if self.scaling_kind else ""
        return f"DecoupledRotary(layout={self.layout!r}{kind})"


class ScaledDecoupledRotary(QueryScaleMixin, DecoupledRotary):
    """MLA's decoupled RoPE whose whole query at position p is then multiplied by ``1 + beta ln(1 + floor(p / L))``.

    Mistral 4 (transformers ``Mistral4Attention``): after the rotation, the query ``[q_C | R(p) q_R]`` --
    both slices -- is multiplied by ``llama_4_scaling_beta``'s scale ``s(p)`` (``minipos.query_scale``), so
    every logit of row p is scaled by ``s(p)``; keys are not. beta: ``rope_parameters['llama_4_scaling_beta']``;
    original_max_position_embeddings: L (HF reads ``rope_parameters['original_max_position_embeddings']``,
    the same L as its YaRN's). base, layout, scaling: as ``DecoupledRotary``'s. The query scale is
    ``minipos.query_scale.QueryScaleMixin``'s, the same as ``ScaledQueryRotary``'s.
    """

    name = "mla-rope+query-scale"

    def __init__(self, *, beta: float, original_max_position_embeddings: int, base: float = 10000.0,
                 layout: str = "interleaved", scaling: dict | None = None):
        super().__init__(beta=beta, original_max_position_embeddings=original_max_position_embeddings,
                         base=base, layout=layout, scaling=scaling)


# --------------------------------------------------------------------------- the layer

def _merge(a):  # (B, H, T, X) -> (B, T, H*X)
    B, H, T, X = a.shape
    return a.transpose(0, 2, 1, 3).reshape(B, T, H * X)


def _split(y, heads):  # (B, T, H*X) -> (B, H, T, X); X explicit: B or T may be 0
    B, T, HX = y.shape
    return y.reshape(B, T, heads, HX // heads).transpose(0, 2, 1, 3)


def _linear(x, w, b):  # (B, T, d_in) -> (B, T, d_out)
    with np.errstate(over="ignore", invalid="ignore"):                   # checked by the layer
        return x @ w if b is None else x @ w + b


def _outer(x, d):  # the weight gradient x^T d of y = x W, over every (B, T)
    return x.reshape(-1, x.shape[-1]).T @ d.reshape(-1, d.shape[-1])


class MultiHeadLatentAttention(OutputGate, MultiHeadAttention):
    """DeepSeek-V2/V3 multi-head latent attention with decoupled RoPE (HF ``DeepseekV3Attention``).

    d_model, num_heads: HF ``hidden_size``, ``num_attention_heads``. kv_lora_rank (r_kv),
    qk_nope_head_dim (D_N), qk_rope_head_dim (D_R, even, or 0: no RoPE), v_head_dim (D_V), q_lora_rank (r_q, or
    ``None`` for a full-rank ``wq`` as in DeepSeek-V2-Lite): the config keys of the same names.
    scheme: a ``DecoupledRotary`` (default ``DecoupledRotary()``: interleaved, base 10000); ``NoPE`` when D_R is 0.
    bias: HF ``attention_bias``. eps: the latents' RMSNorm epsilon. Weights (see the module
    docstring for the mapping) are drawn from N(0, 1/d_in) with ``seed``; the norms start at 1.
    ``head_dim`` is ``D_N + D_R``. Called, cached and differentiated like ``MultiHeadAttention``;
    ``backward`` returns ``"x"`` and every weight above by its attribute name. ``sliding_window`` and
    ``scale`` are ``MultiHeadAttention``'s (HF's window rule; a softmax scale in place of the scheme's).

    Dots 3 Note's options (module docstring, "Variants"), each off by default: ``k_rope_norm=True``
    RMS-norms the shared rope key before its rotation (weight ``k_rope_norm`` ``(D_R,)``, ``None``
    switches it off); ``q_lora_scale`` and ``kv_lora_scale`` multiply the normed latents ``c_q`` and
    ``c_kv`` (numbers > 0, 1 = none); ``gate="head"`` (or ``"feature"``) is the sigmoid output gate of
    ``minipos.gate`` on each head's ``D_V`` outputs (``wg``, no bias; ``None`` switches it off).
    """

    def __init__(self, d_model: int, num_heads: int, *, kv_lora_rank: int, qk_nope_head_dim: int, qk_rope_head_dim: int,
                 v_head_dim: int, q_lora_rank: int | None = None, scheme: DecoupledRotary | None = None,
                 bias: bool = False, eps: float = 1e-6, seed: int = 0, dtype: DTypeLike = np.float64,
                 block_size: int | None = None, sliding_window: int | None = None, scale: float | None = None,
                 k_rope_norm: bool = False, q_lora_scale: float = 1.0, kv_lora_scale: float = 1.0,
                 gate: str | None = None):
        self.kv_lora_rank = check_positive_int(kv_lora_rank, "kv_lora_rank")
        self.q_lora_rank = None if q_lora_rank is None else check_positive_int(q_lora_rank, "q_lora_rank")
        self.qk_nope_head_dim = check_positive_int(qk_nope_head_dim, "qk_nope_head_dim")
        self.qk_rope_head_dim = check_int(qk_rope_head_dim, "qk_rope_head_dim", minimum=0)
        if self.qk_rope_head_dim:                                          # 0: no rope slice (GLM-5.3-Flash)
            check_even_int(self.qk_rope_head_dim, "qk_rope_head_dim")
        self.v_head_dim = check_positive_int(v_head_dim, "v_head_dim")
        self.eps = check_float(eps, "eps", positive=True)
        self._k_rope_normed = check_bool(k_rope_norm, "k_rope_norm")
        self.q_lora_scale = check_float(q_lora_scale, "q_lora_scale", positive=True)
        self.kv_lora_scale = check_float(kv_lora_scale, "kv_lora_scale", positive=True)
        if self.q_lora_rank is None and self.q_lora_scale != 1.0:
            raise ValueError(f"q_lora_scale ({q_lora_scale!r}) scales the query latent, but q_lora_rank is None: "
                             "there is none")
        self.gate = check_gate(gate)
        if self.qk_rope_head_dim == 0:                                     # MLA without RoPE: no position at all
            scheme = NoPE() if scheme is None else scheme
            if type(scheme) is not NoPE:
                raise TypeError(f"qk_rope_head_dim = 0 leaves nothing to rotate: scheme must be None or "
                                f"minipos.seams.NoPE, got {type(scheme).__name__}")
            if self._k_rope_normed:
                raise ValueError("k_rope_norm norms the rope key, but qk_rope_head_dim = 0: there is none")
        scheme = DecoupledRotary() if scheme is None else scheme
        if not isinstance(scheme, (DecoupledRotary, NoPE)) or (isinstance(scheme, NoPE) and self.qk_rope_head_dim):
            raise TypeError(f"scheme must be a minipos.mla.DecoupledRotary, got {type(scheme).__name__}")
        super().__init__(d_model, num_heads, scheme=scheme, head_dim=qk_nope_head_dim + qk_rope_head_dim,
                         bias=bias, seed=seed, dtype=dtype, block_size=block_size, sliding_window=sliding_window,
                         scale=scale)

    def _init_weights(self, rng, bias):
        """The latent projections' weights (the module docstring's table) drawn from ``rng``, in
        place of the layer's ``wq``, ``wk``, ``wv``; sizes checked against memory first, each
        naming its arguments."""
        d, H = self.d_model, self.num_heads
        r_q, r_kv, D_R = self.q_lora_rank, self.kv_lora_rank, self.qk_rope_head_dim
        self._check_sizes()
        zeros = (lambda n: np.zeros(n, self.dtype)) if bias else (lambda n: None)
        self.wk = self.wv = self.bq = self.bk = self.bv = None         # keys and values come from the latent
        if r_q is None:
            self.wq, self.wq_a, self.bq_a, self.q_a_norm, self.wq_b = self._init(rng, d, H * self.head_dim), None, \
                None, None, None
        else:
            self.wq = None
            self.wq_a, self.bq_a = self._init(rng, d, r_q), zeros(r_q)                 # (d_model, r_q)
            self.q_a_norm = np.ones(r_q, self.dtype)                                   # (r_q,)
            self.wq_b = self._init(rng, r_q, H * self.head_dim)                        # (r_q, H (D_N + D_R))
        self.wkv_a, self.bkv_a = self._init(rng, d, r_kv + D_R), zeros(r_kv + D_R)     # (d_model, r_kv + D_R)
        self.kv_a_norm = np.ones(r_kv, self.dtype)                                     # (r_kv,)
        self.wkv_b = self._init(rng, r_kv, H * (self.qk_nope_head_dim + self.v_head_dim))
        self.wo, self.bo = self._init(rng, H * self.v_head_dim, d), zeros(d)           # (H D_V, d_model), (d_model,)
        self.k_rope_norm = np.ones(D_R, self.dtype) if self._k_rope_normed else None   # (D_R,): Dots 3 Note's
        self._init_gate(rng, False)                                                    # wg (d_model, H): no bias

    def _weight_shapes(self) -> dict:
        d, H, D, r_q, r_kv = self.d_model, self.num_heads, self.head_dim, self.q_lora_rank, self.kv_lora_rank
        D_R, D_N, D_V = self.qk_rope_head_dim, self.qk_nope_head_dim, self.v_head_dim
        shapes = {"wkv_a": ((d, r_kv + D_R), "(d_model, kv_lora_rank + qk_rope_head_dim)", False),
                  "bkv_a": ((r_kv + D_R,), "(kv_lora_rank + qk_rope_head_dim,)", True),
                  "kv_a_norm": ((r_kv,), "(kv_lora_rank,)", False),
                  "wkv_b": ((r_kv, H * (D_N + D_V)), "(kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim))",
                            False),
                  "wo": ((H * D_V, d), "(num_heads * v_head_dim, d_model)", False), "bo": ((d,), "(d_model,)", True),
                  "k_rope_norm": ((D_R,), "(qk_rope_head_dim,)", True), **self._gate_shapes()}
        if r_q is None:
            shapes["wq"] = ((d, H * D), "(d_model, num_heads * (qk_nope_head_dim + qk_rope_head_dim))", False)
        else:
            shapes.update(wq_a=((d, r_q), "(d_model, q_lora_rank)", False), bq_a=((r_q,), "(q_lora_rank,)", True),
                          q_a_norm=((r_q,), "(q_lora_rank,)", False),
                          wq_b=((r_q, H * D), "(q_lora_rank, num_heads * (qk_nope_head_dim + qk_rope_head_dim))", False))
        return shapes

    def _check_sizes(self) -> None:
        d, H, D, r_q, r_kv = self.d_model, self.num_heads, self.head_dim, self.q_lora_rank, self.kv_lora_rank
        shapes = [((d, r_kv + self.qk_rope_head_dim), "wkv_a (d_model, kv_lora_rank + qk_rope_head_dim)"),
                  ((r_kv, H * (self.qk_nope_head_dim + self.v_head_dim)),
                   "wkv_b (kv_lora_rank, num_heads * (qk_nope_head_dim + v_head_dim))"),
                  ((H * self.v_head_dim, d), "wo (num_heads * v_head_dim, d_model)")]
        if r_q is None:
            shapes.append(((d, H * D), "wq (d_model, num_heads * (qk_nope_head_dim + qk_rope_head_dim))"))
        else:
            shapes += [((d, r_q), "wq_a (d_model, q_lora_rank)"),
                       ((r_q, H * D), "wq_b (q_lora_rank, num_heads * (qk_nope_head_dim + qk_rope_head_dim))")]
        for shape, what in shapes:
            check_alloc(shape, self.dtype, f"MultiHeadLatentAttention's {what}")
        total = sum(a * b for (a, b), _ in shapes)
        check_alloc((total,), self.dtype, "MultiHeadLatentAttention's weights together (kv_lora_rank, q_lora_rank, "
                    "the head dims, num_heads and d_model)")

    def configuration(self) -> tuple:
        """``MultiHeadAttention.configuration()`` (with the scheme's settings: a ``ScaledDecoupledRotary``'s beta
        and L among them) with the latent ranks, the head dims and Dots 3 Note's options (the rope key's norm on or
        off, the latent scales, the gate's kind or None)."""
        return (*super().configuration(), ("kv_lora_rank", self.kv_lora_rank), ("q_lora_rank", self.q_lora_rank),
                ("qk_nope_head_dim", self.qk_nope_head_dim), ("qk_rope_head_dim", self.qk_rope_head_dim),
                ("v_head_dim", self.v_head_dim), ("eps", self.eps),
                ("k_rope_norm", self.k_rope_norm is not None), ("q_lora_scale", self.q_lora_scale),
                ("kv_lora_scale", self.kv_lora_scale), ("gate", self.gate if self._gated() else None))

    def _value_dim(self) -> int:                                          # the gate's width per head: D_V
        return self.v_head_dim

    def _check_weights(self) -> None:
        super()._check_weights()
        for name in ("q_lora_scale", "kv_lora_scale"):                     # plain attributes: checked at each call
            check_float(getattr(self, name), name, positive=True)
        self._check_gate_weights()

    def weights(self) -> dict:
        """Every weight the layer has, by attribute name (the names ``backward`` returns)."""
        names = ("wq", "wq_a", "bq_a", "q_a_norm", "wq_b", "wkv_a", "bkv_a", "kv_a_norm", "k_rope_norm", "wkv_b",
                 "wo", "bo", "wg")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}

    # step 2, the projections: (q, k, v), k's rope slice one shared key broadcast to every head

    def _query(self, x_in):  # (B, T, d_model) -> (B, H, T, D_N + D_R)
        if self.q_lora_rank is None:
            return _split(_linear(x_in, self.wq, None), self.num_heads)
        c_q = self._q_latent(_linear(x_in, self.wq_a, self.bq_a))              # (B, T, r_q)
        return _split(_linear(c_q, self.wq_b, None), self.num_heads)

    def _q_latent(self, a):  # (B, T, r_q): the normed query latent, times q_lora_scale (Dots 3 Note's; else 1)
        return rms_norm(a, self.q_a_norm, eps=self.eps) * self.q_lora_scale

    def _kv_latent(self, kv_a):  # (B, T, r_kv + D_R) -> c_kv (B, T, r_kv), k_rope (B, T, D_R), before RoPE
        r_kv = self.kv_lora_rank
        c_kv = rms_norm(kv_a[..., :r_kv], self.kv_a_norm, eps=self.eps) * self.kv_lora_scale
        k_rope = kv_a[..., r_kv:]
        if self.k_rope_norm is not None:                                      # Dots 3 Note: normed, then rotated
            k_rope = rms_norm(k_rope, self.k_rope_norm, eps=self.eps)
        return c_kv, k_rope

    def _project(self, x_in):
        B, T, _ = x_in.shape
        D_N, D_R = self.qk_nope_head_dim, self.qk_rope_head_dim
        kv_a = _linear(x_in, self.wkv_a, self.bkv_a)                          # (B, T, r_kv + D_R)
        c_kv, k_rope = self._kv_latent(kv_a)                                  # (B, T, r_kv), (B, T, D_R): one key a token
        kv = _split(_linear(c_kv, self.wkv_b, None), self.num_heads)          # (B, H, T, D_N + D_V)
        k_rope = np.broadcast_to(k_rope[:, None], (B, self.num_heads, T, D_R))   # (B, H, T, D_R), shared
        k = np.concatenate([kv[..., :D_N], k_rope], axis=-1)                  # (B, H, T, D_N + D_R)
        return self._query(x_in), k, kv[..., D_N:]                            # v: (B, H, T, D_V)

    def _project_backward(self, x_in, dq, dk, dv, add):
        r_kv, D_N = self.kv_lora_rank, self.qk_nope_head_dim
        # keys and values: k = [heads(c_kv wkv_b)[:D_N] | k_rope], v = heads(c_kv wkv_b)[D_N:]
        kv_a = _linear(x_in, self.wkv_a, self.bkv_a)                          # (B, T, r_kv + D_R)
        c_kv, _ = self._kv_latent(kv_a)                                       # (B, T, r_kv), scaled
        dkv = _merge(np.concatenate([dk[..., :D_N], dv], axis=-1))            # (B, T, H (D_N + D_V))
        add("wkv_b", _outer(c_kv, dkv))
        dc_kv, dnorm = rms_norm_backward(kv_a[..., :r_kv], self.kv_a_norm, (dkv @ self.wkv_b.T) * self.kv_lora_scale,
                                         eps=self.eps)
        add("kv_a_norm", dnorm)
        dk_rope = dk[..., D_N:].sum(axis=1)                                   # (B, T, D_R): every head's share
        if self.k_rope_norm is not None:                                      # through the rope key's norm
            dk_rope, dnorm = rms_norm_backward(kv_a[..., r_kv:], self.k_rope_norm, dk_rope, eps=self.eps)
            add("k_rope_norm", dnorm)
        dkv_a = np.concatenate([dc_kv, dk_rope], axis=-1)                     # (B, T, r_kv + D_R)
        add("wkv_a", _outer(x_in, dkv_a))
        if self.bkv_a is not None:
            add("bkv_a", dkv_a.sum(axis=(0, 1)))
        dx_in = dkv_a @ self.wkv_a.T                                          # (B, T, d_model)
        # queries: q = heads(x_in wq), or heads(RMSNorm(x_in wq_a + bq_a) wq_b)
        dq = _merge(dq)                                                       # (B, T, H (D_N + D_R))
        if self.q_lora_rank is None:
            add("wq", _outer(x_in, dq))
            return dx_in + dq @ self.wq.T
        a = _linear(x_in, self.wq_a, self.bq_a)                               # (B, T, r_q)
        add("wq_b", _outer(self._q_latent(a), dq))
        da, dnorm = rms_norm_backward(a, self.q_a_norm, (dq @ self.wq_b.T) * self.q_lora_scale, eps=self.eps)
        add("q_a_norm", dnorm)
        add("wq_a", _outer(x_in, da))
        if self.bq_a is not None:
            add("bq_a", da.sum(axis=(0, 1)))
        return dx_in + da @ self.wq_a.T

    def __repr__(self) -> str:
        return (f"MultiHeadLatentAttention(d_model={self.d_model}, num_heads={self.num_heads}, "
                f"q_lora_rank={self.q_lora_rank}, kv_lora_rank={self.kv_lora_rank}, "
                f"qk_nope_head_dim={self.qk_nope_head_dim}, qk_rope_head_dim={self.qk_rope_head_dim}, "
                f"v_head_dim={self.v_head_dim}{', k_rope_norm=on' if self.k_rope_norm is not None else ''}"
                f"{f', q_lora_scale={self.q_lora_scale:g}' if self.q_lora_scale != 1.0 else ''}"
                f"{f', kv_lora_scale={self.kv_lora_scale:g}' if self.kv_lora_scale != 1.0 else ''}"
                f"{f', gate={self.gate!r}' if self._gated() else ''}, scheme={self.scheme!r})")


# --------------------------------------------------------------------------- the latent cache (decoding form)
#
# What production decoders run: the cache holds c_kv and the rotated rope key, W_UK is folded into
# the query and W_UV into the output, and attention is multi-query attention over the latents
# (one key/value head of width r_kv + D_R and r_kv). An inference form: it has no backward;
# training runs through the layer, whose result it equals (tests/test_mla.py).

def latent_kv(layer: MultiHeadLatentAttention, x: ArrayLike, positions: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """The latent cache entries of the tokens ``x`` ``(B, T, d_model)`` at ``positions`` ``(T,)``:
    ``(c_kv (B, T, r_kv), k_rope (B, T, D_R))``, the normed latent and the rope key rotated by its
    position (HF 5.x caches the same two arrays; its ``k_rope`` is in its output order, see the
    docs page on the interleave permutation)."""
    x, positions = _check_decode_call(layer, x, positions)
    c_kv, k_rope = layer._kv_latent(_linear(x, layer.wkv_a, layer.bkv_a))   # (B, T, r_kv), (B, T, D_R)
    if not layer.qk_rope_head_dim:                                        # MLA without RoPE: no rope key
        return c_kv, k_rope
    inv_freq, factor = layer.scheme.frequencies(1)                        # fixed: the same at every length
    k_rope = rope.apply_rope(k_rope, positions, inv_freq=inv_freq, layout=layer.scheme.layout,
                             attention_factor=factor)                     # (B, T, D_R): rotated once
    return c_kv, k_rope                                                   # (B, T, r_kv), (B, T, D_R)


def absorbed_attention(layer: MultiHeadLatentAttention, x: ArrayLike, positions: ArrayLike, c_kv: ArrayLike,
                       k_rope: ArrayLike, k_positions: ArrayLike, *, causal: bool = True) -> np.ndarray:
    """The layer's output ``(B, T, d_model)`` for the queries ``x`` at ``positions`` against a latent
    cache ``c_kv`` ``(B, S, r_kv)``, ``k_rope`` ``(B, S, D_R)`` at ``k_positions`` ``(S,)`` (the
    queries' own entries included), with ``W_UK`` absorbed into the query and ``W_UV`` into the output.

    Per head: ``q_lat = q_C W_UK^T`` ``(T, r_kv)``; logits ``[q_lat | q_R] . [c_kv | k_rope]`` scaled by
    the layer's softmax scale, whose D is still ``D_N + D_R`` (not the latent width); the output
    ``(P c_kv) W_UV``. Needs fixed RoPE frequencies (cached rope keys stay rotated).
    """
    x, positions = _check_decode_call(layer, x, positions)
    c_kv, k_rope = as_float_array(c_kv, "c_kv"), as_float_array(k_rope, "k_rope")
    B, T, _ = x.shape
    S = c_kv.shape[1] if c_kv.ndim == 3 else -1
    if c_kv.shape != (B, S, layer.kv_lora_rank) or k_rope.shape != (B, S, layer.qk_rope_head_dim):
        raise ValueError(f"c_kv and k_rope must have shapes (B, S, kv_lora_rank={layer.kv_lora_rank}) and "
                         f"(B, S, qk_rope_head_dim={layer.qk_rope_head_dim}) with B = {B}; got c_kv {c_kv.shape}, "
                         f"k_rope {k_rope.shape}")
    k_positions = as_positions(k_positions, "k_positions", length=S)
    causal = check_bool(causal, "causal")
    H, D_N, D_V, r_kv = layer.num_heads, layer.qk_nope_head_dim, layer.v_head_dim, layer.kv_lora_rank
    q = layer.scheme.rotate_q(layer._query(x), positions, seq_len=1)      # (B, H, T, D_N + D_R); fixed frequencies
    w_kv_b = layer.wkv_b.reshape(r_kv, H, D_N + D_V)                      # (r_kv, H, D_N + D_V)
    w_uk, w_uv = w_kv_b[..., :D_N], w_kv_b[..., D_N:]                     # (r_kv, H, D_N), (r_kv, H, D_V)
    q_lat = np.einsum("bhtn,rhn->bhtr", q[..., :D_N], w_uk)               # (B, H, T, r_kv): W_UK absorbed
    q_abs = np.concatenate([q_lat, q[..., D_N:]], axis=-1)                # (B, H, T, r_kv + D_R)
    k_lat = np.concatenate([c_kv, k_rope], axis=-1)[:, None]              # (B, 1, S, r_kv + D_R): one head
    v_lat = c_kv[:, None]                                                 # (B, 1, S, r_kv): one head
    mask = (k_positions[None, :] <= positions[:, None]) if causal else None   # (T, S)
    if layer.sliding_window is not None:                                  # HF's rule: i - W < j <= i
        if not causal:
            raise ValueError(f"sliding_window ({layer.sliding_window}) is a causal window (keys i - W < j <= i); "
                             "call with causal=True")
        mask = mask & (k_positions[None, :] > positions[:, None] - layer.sliding_window)
    out = attention(q_abs, np.broadcast_to(k_lat, (B, H, *k_lat.shape[2:])), np.broadcast_to(v_lat, (B, H, S, r_kv)),
                    mask=mask, scale=layer.attention_scale())            # (B, H, T, r_kv)
    out = np.einsum("bhtr,rhv->bthv", out, w_uv)                          # (B, T, H, D_V): W_UV absorbed
    y = layer._gate(x, out.reshape(B, T, H * D_V)) @ layer.wo             # (B, T, d_model); a gate, if any
    return y if layer.bo is None else y + layer.bo


def _check_decode_call(layer, x, positions):
    if not isinstance(layer, MultiHeadLatentAttention):
        raise TypeError(f"layer must be a MultiHeadLatentAttention, got {type(layer).__name__}")
    if layer.scheme.rotates_cached_keys:
        raise ValueError("a latent cache keeps rotated rope keys, so it needs fixed RoPE frequencies; "
                         f"rope_type {layer.scheme.scaling_kind!r} changes them with the length")
    x = as_float_array(x, "x")
    if x.ndim != 3 or x.shape[-1] != layer.d_model:
        raise ValueError(f"x must have shape (B, T, d_model={layer.d_model}), got {x.shape}")
    layer._check_weights()
    return x, as_positions(positions, "positions", length=x.shape[1])
