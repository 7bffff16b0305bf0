"""Per-head RMSNorm of the queries and keys before the rotate seam (Qwen3, Gemma 3, Llama 4, OLMo-2-style).

Not position machinery: a norm of each head's q and k over the head dim, applied after the
projections (step 2 of ``MultiHeadAttention``) and before RoPE (step 3)::

    q_h = w_q ⊙ q_h / sqrt(mean(q_h^2) + eps),   k_h = w_k ⊙ k_h / sqrt(mean(k_h^2) + eps)   # (B, H, T, D)

It changes the logits' size, so a layer read from a checkpoint that has it must have it too for
its outputs to match the model's. ``QKNormAttention`` replaces step 2 only, as
``minipos.mla.MultiHeadLatentAttention`` does; ``q_norm`` and ``k_norm`` (``(D,)``, or ``None`` to
switch the norm off) are its weights. Where each model keeps them (HF transformers 5.24):

=======================  =======================  =====================================================
model                    HF module                 minipos
=======================  =======================  =====================================================
Qwen3, Qwen3-MoE         ``q_norm``, ``k_norm``    ``q_norm = q_norm.weight`` (``norm_offset=0``)
Gemma 3                  ``q_norm``, ``k_norm``    ``q_norm = q_norm.weight``, ``norm_offset=1``:
                                                   Gemma's RMSNorm multiplies by ``1 + weight``
Llama 4 (RoPE layers)    ``qk_norm`` (L2 norm,     ``q_norm = k_norm = ones(D)``: no weight. HF applies
                         no weight), after RoPE    it after RoPE; a rotation keeps each head's RMS, so
                                                   before and after are the same map
Gemma 4                  ``q_norm``, ``k_norm``,   ``q_norm = q_norm.weight`` (``norm_offset=0``) and
                         ``v_norm`` (no weight)    ``v_norm=True``: the values too, without a weight
=======================  =======================  =====================================================

HF computes these norms in float32 (``x.float()``) and casts back; here they are float64.
"""

from __future__ import annotations

import numpy as np

from ._checks import check_bool, check_float
from .layer import MultiHeadAttention
from .mla import rms_norm, rms_norm_backward

__all__ = ["QKNormAttention"]


class QKNormAttention(MultiHeadAttention):
    """``MultiHeadAttention`` with a per-head RMSNorm of q and k between the projections and the
    rotate seam (module docstring).

    Takes ``MultiHeadAttention``'s arguments, ``norm_eps`` (HF ``rms_norm_eps``),
    ``norm_offset`` (0: the norm multiplies by ``q_norm``; 1: by ``1 + q_norm``, Gemma 3's) and
    ``v_norm`` (True: each head's values get the RMSNorm too, without a weight: Gemma 4's). The
    weights ``q_norm``, ``k_norm`` ``(head_dim,)`` start at ``1 - norm_offset`` (so the norm
    multiplies by one); either may be set to ``None`` to switch that norm off. ``backward``
    returns their gradients as ``"q_norm"``, ``"k_norm"``.
    """

    def __init__(self, d_model: int, num_heads: int, *, norm_eps: float = 1e-6, norm_offset: float = 0.0,
                 v_norm: bool = False, **kwargs):
        self.norm_eps = check_float(norm_eps, "norm_eps", positive=True)
        self.norm_offset = check_float(norm_offset, "norm_offset")
        self.v_norm = check_bool(v_norm, "v_norm")
        super().__init__(d_model, num_heads, **kwargs)

    def _init_weights(self, rng, bias):
        super()._init_weights(rng, bias)
        self.q_norm = np.full(self.head_dim, 1.0 - self.norm_offset, self.dtype)     # (D,)
        self.k_norm = np.full(self.head_dim, 1.0 - self.norm_offset, self.dtype)     # (D,)

    def _weight_shapes(self) -> dict:
        D = self.head_dim
        return {**super()._weight_shapes(), "q_norm": ((D,), "(head_dim,)", True),
                "k_norm": ((D,), "(head_dim,)", True)}

    def configuration(self) -> tuple:
        """``MultiHeadAttention.configuration()`` with the norms' settings (on or off, eps, offset)."""
        return (*super().configuration(), ("q_norm", self.q_norm is not None), ("k_norm", self.k_norm is not None),
                ("norm_eps", self.norm_eps), ("norm_offset", self.norm_offset), ("v_norm", self.v_norm))

    def _norm(self, a, w):  # (B, H, T, D) -> (B, H, T, D); w None: unchanged
        return a if w is None else rms_norm(a, w + self.norm_offset, eps=self.norm_eps)

    def _v_norm(self, v):  # (B, KV, T, Dv): no weight (HF with_scale=False)
        return rms_norm(v, np.ones(v.shape[-1], v.dtype), eps=self.norm_eps) if self.v_norm else v

    def _project(self, x_in):
        q, k, v = super()._project(x_in)                                        # step 2
        return self._norm(q, self.q_norm), self._norm(k, self.k_norm), self._v_norm(v)   # the per-head norms

    def _project_backward(self, x_in, dq, dk, dv, add):
        q, k, v = super()._project(x_in)                                        # before the norms
        if self.v_norm:
            dv, _ = rms_norm_backward(v, np.ones(v.shape[-1], v.dtype), dv, eps=self.norm_eps)
        for name, a, d, w in (("q_norm", q, dq, self.q_norm), ("k_norm", k, dk, self.k_norm)):
            if w is not None:
                da, dw = rms_norm_backward(a, w + self.norm_offset, d, eps=self.norm_eps)
                add(name, dw)
                dq, dk = (da, dk) if name == "q_norm" else (dq, da)
        return super()._project_backward(x_in, dq, dk, dv, add)

    def __repr__(self) -> str:
        return (f"QKNormAttention(d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, q_norm={'on' if self.q_norm is not None else 'off'}, "
                f"k_norm={'on' if self.k_norm is not None else 'off'}{', v_norm=on' if self.v_norm else ''}, "
                f"scheme={self.scheme!r})")
