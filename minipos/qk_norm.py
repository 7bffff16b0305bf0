"""Per-head RMSNorm of the queries and keys before the rotate seam (Qwen3, Gemma 3, Llama 4, OLMo-2-style),
and the sigmoid output gate of the heads (Qwen3.5, LFM3), with the heads' outputs RMS-normed before it (Muse Spark).

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
Muse Spark               ``qk_norm`` (no weight),  ``q_norm = k_norm = ones(D)``, ``o_norm=True``: each
                         ``o_norm`` (no weight)    head's attention output too, before the output gate
=======================  =======================  =====================================================

HF computes these norms in float32 (``x.float()``) and casts back; here they are float64.

The output gate is not position machinery either (``minipos.gate``): it scales the heads' output ``o``
(merged, ``(B, T, H*D)``) by a sigmoid of the layer input before the output projection (step 8). With
``o_norm=True`` (Muse Spark) each head's output is first RMS-normed over its D features without a
weight, ``o_h / sqrt(mean(o_h^2) + eps)``, and the gate then scales that. ``wg`` is ``(d_model, H*D)`` or
``(d_model, H)``; ``bg`` (``(H*D,)`` or ``(H,)``) exists with
``bias=True``; setting ``wg`` (and ``bg``) to ``None`` switches the gate off. Where each model keeps it:

=======================  ======================================  ================================================
model                    HF                                      minipos
=======================  ======================================  ================================================
Qwen3.5, Qwen3.5-MoE     ``Qwen3_5Attention``: ``q_proj`` is     ``gate="feature"``; with ``W = q_proj.weight.T``
                         ``2 H D`` wide, each head's D query     ``.reshape(d_model, H, 2, D)``:
                         features, then its D gate features;     ``wq = W[:, :, 0].reshape(d_model, H*D)``,
                         ``o * sigmoid(gate)``                   ``wg = W[:, :, 1].reshape(d_model, H*D)``;
                                                                 the bias likewise (``reshape(H, 2, D)``)
LFM3                     ``Lfm3Attention``, under                ``gate="head"``, ``wg = g_proj.weight.T``,
                         ``use_attention_gate``: ``g_proj``      ``bg = None``
                         (H outputs, no bias):
                         ``o_h * sigmoid(g)_h``
=======================  ======================================  ================================================
"""

from __future__ import annotations

import numpy as np

from ._checks import check_bool, check_float
from .gate import GATES, OutputGate, check_gate, sigmoid
from .layer import MultiHeadAttention
from .mla import rms_norm, rms_norm_backward

__all__ = ["QKNormAttention", "sigmoid", "GATES"]


class QKNormAttention(OutputGate, MultiHeadAttention):
    """``MultiHeadAttention`` with a per-head RMSNorm of q and k between the projections and the
    rotate seam (module docstring).

    Takes ``MultiHeadAttention``'s arguments, ``norm_eps`` (HF ``rms_norm_eps``),
    ``norm_offset`` (0: the norm multiplies by ``q_norm``; 1: by ``1 + q_norm``, Gemma 3's),
    ``v_norm`` (True: each head's values get the RMSNorm too, without a weight: Gemma 4's), ``o_norm``
    (True: each head's attention output gets it, without a weight, before the gate: Muse Spark's) and
    ``gate`` (``"feature"``: Qwen3.5's output gate, ``"head"``: LFM3's, ``None``: no gate; module
    docstring). The weights ``q_norm``, ``k_norm`` ``(head_dim,)`` start at ``1 - norm_offset``
    (so the norm multiplies by one); either may be set to ``None`` to switch that norm off. The
    gate's ``wg`` ``(d_model, H*D)`` (``"feature"``) or ``(d_model, H)`` (``"head"``) is drawn as
    ``wq`` is, its ``bg`` zeros with ``bias=True`` (else ``None``); setting ``wg`` and ``bg`` to
    ``None`` switches the gate off. ``backward`` returns their gradients as ``"q_norm"``,
    ``"k_norm"``, ``"wg"``, ``"bg"``.
    """

    def __init__(self, d_model: int, num_heads: int, *, norm_eps: float = 1e-6, norm_offset: float = 0.0,
                 v_norm: bool = False, o_norm: bool = False, gate: str | None = None, **kwargs):
        self.norm_eps = check_float(norm_eps, "norm_eps", positive=True)
        self.norm_offset = check_float(norm_offset, "norm_offset")
        self.v_norm = check_bool(v_norm, "v_norm")
        self.o_norm = check_bool(o_norm, "o_norm")
        self.gate = check_gate(gate)
        super().__init__(d_model, num_heads, **kwargs)

    def _init_weights(self, rng, bias):
        super()._init_weights(rng, bias)
        self.q_norm = np.full(self.head_dim, 1.0 - self.norm_offset, self.dtype)     # (D,)
        self.k_norm = np.full(self.head_dim, 1.0 - self.norm_offset, self.dtype)     # (D,)
        self._init_gate(rng, bias)

    def _weight_shapes(self) -> dict:
        D = self.head_dim
        return {**super()._weight_shapes(), "q_norm": ((D,), "(head_dim,)", True),
                "k_norm": ((D,), "(head_dim,)", True), **self._gate_shapes()}

    def _check_weights(self) -> None:
        super()._check_weights()
        for name in ("v_norm", "o_norm"):                                       # switchable between calls
            check_bool(getattr(self, name), name)
        check_float(self.norm_eps, "norm_eps", positive=True)
        self._check_gate_weights()

    def configuration(self) -> tuple:
        """``MultiHeadAttention.configuration()`` with the norms' settings (on or off, eps, offset) and the
        gate's (its kind, or None when off)."""
        return (*super().configuration(), ("q_norm", self.q_norm is not None), ("k_norm", self.k_norm is not None),
                ("norm_eps", self.norm_eps), ("norm_offset", self.norm_offset), ("v_norm", self.v_norm),
                ("o_norm", self.o_norm), ("gate", self.gate if self._gated() else None))

    def _norm(self, a, w):  # (B, H, T, D) -> (B, H, T, D); w None: unchanged
        return a if w is None else rms_norm(a, w + self.norm_offset, eps=self.norm_eps)

    def _weightless(self, a, da=None):  # RMSNorm over the last axis, no weight (HF with_scale=False); with da: d a
        ones = np.ones(a.shape[-1], a.dtype)
        if da is None:
            return rms_norm(a, ones, eps=self.norm_eps)
        return rms_norm_backward(a, ones, da, eps=self.norm_eps)[0]

    def _v_norm(self, v):  # (B, KV, T, Dv): the values' norm (v_norm)
        return self._weightless(v) if self.v_norm else v

    def _project(self, x_in):
        q, k, v = super()._project(x_in)                                        # step 2
        return self._norm(q, self.q_norm), self._norm(k, self.k_norm), self._v_norm(v)   # the per-head norms

    def _project_backward(self, x_in, dq, dk, dv, add):
        q, k, v = super()._project(x_in)                                        # before the norms
        if self.v_norm:
            dv = self._weightless(v, dv)
        for name, a, d, w in (("q_norm", q, dq, self.q_norm), ("k_norm", k, dk, self.k_norm)):
            if w is not None:
                da, dw = rms_norm_backward(a, w + self.norm_offset, d, eps=self.norm_eps)
                add(name, dw)
                dq, dk = (da, dk) if name == "q_norm" else (dq, da)
        return super()._project_backward(x_in, dq, dk, dv, add)

    def _o_normed(self, merged, dmerged=None):  # (B, T, H*Dv): each head RMS-normed, no weight (o_norm); or d it
        if not self.o_norm:
            return merged if dmerged is None else dmerged
        B, T, HD = merged.shape
        heads = merged.reshape(B, T, self.num_heads, HD // self.num_heads)   # B or T may be 0
        return self._weightless(heads, None if dmerged is None else dmerged.reshape(heads.shape)).reshape(B, T, HD)

    def __repr__(self) -> str:
        return (f"QKNormAttention(d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, q_norm={'on' if self.q_norm is not None else 'off'}, "
                f"k_norm={'on' if self.k_norm is not None else 'off'}{', v_norm=on' if self.v_norm else ''}"
                f"{', o_norm=on' if self.o_norm else ''}"
                f"{f', gate={self.gate!r}' if self._gated() else ''}, "
                f"scheme={self.scheme!r})")
