"""The sigmoid output gate of the heads (step 8 of ``MultiHeadAttention``): Qwen3.5, LFM3, Muse Spark, Dots 3 Note.

Not position machinery: it scales the heads' merged output ``o`` ``(B, T, H*Dv)`` by a sigmoid of the
layer input before the output projection::

    g = x @ wg + bg;   y = (o * sigmoid(g)) @ wo + bo     # gate="feature": g (B, T, H*Dv), one per feature
    g = x @ wg;        y = (o * sigmoid(g)_h) @ wo + bo   # gate="head": g (B, T, H), head h's Dv features share g_h

It changes the output, so a layer read from a checkpoint that has it must have it too for its outputs to
match the model's. ``OutputGate`` is the mixin that gives a layer the gate: ``minipos.qk_norm.QKNormAttention``
(Qwen3.5's ``"feature"`` gate, LFM3's and Muse Spark's ``"head"`` gate) and
``minipos.mla.MultiHeadLatentAttention`` (Dots 3 Note's ``"head"`` gate, ``g_proj``) take it. Its weights are
``wg`` ``(d_model, H*Dv)`` or ``(d_model, H)`` and ``bg`` (or ``None``); setting ``wg`` (and ``bg``) to
``None`` switches the gate off. The derivative of ``sigmoid`` is ``s (1 - s)``; a ``"head"`` gate's gradient
sums its head's ``Dv`` features.
"""

from __future__ import annotations

import numpy as np

from ._checks import Overflow

__all__ = ["OutputGate", "GATES", "sigmoid"]

GATES = (None, "feature", "head")
"""The output gates: none, one per feature of each head, one per head."""


def sigmoid(x: np.ndarray) -> np.ndarray:
    """``1 / (1 + exp(-x))`` elementwise, ``(...)`` -> ``(...)``, written ``exp(-log(1 + exp(-x)))`` so that no
    ``exp`` overflows."""
    return np.exp(-np.logaddexp(0.0, -x))


def check_gate(gate):
    """``gate`` if it is one of ``GATES``, else ``ValueError``/``TypeError`` naming it."""
    if not (gate is None or isinstance(gate, str)) or gate not in GATES:
        raise (ValueError if isinstance(gate, str) else TypeError)(
            f"gate must be None, 'feature' (one gate per feature of each head, Qwen3.5) or 'head' (one per "
            f"head, LFM3, Dots 3 Note), got {gate!r}")
    return gate


class OutputGate:
    """Mixin of a ``MultiHeadAttention`` subclass: step 8's gate (module docstring), of kind ``self.gate``.

    The class sets ``gate`` before the layer's ``__init__`` draws the weights and calls
    ``_init_gate(rng, bias)`` from its ``_init_weights``; ``_gate_shapes()`` goes into its ``_weight_shapes``.
    ``_value_dim()`` is each head's output width ``Dv`` (``head_dim`` unless the layer says otherwise);
    ``_o_normed(merged)`` is what the layer does to the heads' output before the gate (nothing here;
    Muse Spark's norm in ``QKNormAttention``), ``_o_normed(merged, d)`` its backward.
    """

    gate = None
    wg = bg = None

    def _value_dim(self) -> int:
        return self.head_dim

    def _gate_width(self):
        """The gate's number of outputs: ``H*Dv`` (``"feature"``), ``H`` (``"head"``) or ``None``."""
        return {None: None, "feature": self.num_heads * self._value_dim(), "head": self.num_heads}[self.gate]

    def _init_gate(self, rng, bias):
        width = self._gate_width()
        self.wg = None if width is None else self._init(rng, self.d_model, width)    # (d_model, H*Dv) or (d_model, H)
        self.bg = np.zeros(width, self.dtype) if width is not None and bias else None

    def _gate_shapes(self) -> dict:
        if self.gate is None:
            return {}
        dv = "head_dim" if self._value_dim() == self.head_dim else "v_head_dim"    # MLA: D_V
        n, letters = self._gate_width(), f"num_heads * {dv}" if self.gate == "feature" else "num_heads"
        return {"wg": ((self.d_model, n), f"(d_model, {letters})", True), "bg": ((n,), f"({letters},)", True)}

    def _check_gate_weights(self) -> None:
        if self.gate is not None and self.wg is None and self.bg is not None:
            raise ValueError("bg is set but wg is None: set both to None to switch the output gate off")

    def _gate_logits(self, x_in):  # (B, T, d_model) -> (B, T, H*Dv) or (B, T, H): g = x wg + bg
        with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
            g = x_in @ self.wg if self.bg is None else x_in @ self.wg + self.bg
        if not np.isfinite(g).all():
            raise Overflow(f"the output gate's logits x @ wg + bg are not finite ({g.dtype}): wg or bg hold NaN or "
                           "inf, or the product overflows; rescale x or them")
        return g

    def _spread(self, s):  # (B, T, H) -> (B, T, H*Dv): head h's value on its Dv features; "feature": s itself
        return np.repeat(s, self._value_dim(), axis=-1) if self.gate == "head" else s

    def _gated(self) -> bool:
        return self.gate is not None and self.wg is not None                    # wg = None: switched off

    def _o_normed(self, merged, dmerged=None):  # (B, T, H*Dv): the heads' output before the gate; or d merged
        return merged if dmerged is None else dmerged

    def _gate(self, x_in, merged):
        merged = self._o_normed(merged)
        if not self._gated():
            return merged
        return merged * self._spread(sigmoid(self._gate_logits(x_in)))         # o * sigmoid(g), (B, T, H*Dv)

    def _gate_backward(self, ctx, dmerged, add):
        B, H, T, Dv = ctx.out.shape
        o = ctx.out.transpose(0, 2, 1, 3).reshape(B, T, H * Dv)                 # before the norm and the gate
        dx = 0.0
        if self._gated():
            s = sigmoid(self._gate_logits(ctx.x_in))                            # (B, T, H*Dv) or (B, T, H)
            with np.errstate(over="ignore", invalid="ignore"):                 # the layer checks every gradient
                ds = dmerged * self._o_normed(o)                                # d s, per feature
                if self.gate == "head":
                    ds = ds.reshape(B, T, H, Dv).sum(axis=-1)                   # head h's features share s_h
                dg = ds * s * (1.0 - s)                                         # sigmoid' = s (1 - s)
                add("wg", ctx.x_in.reshape(B * T, -1).T @ dg.reshape(B * T, -1))    # x^T dg
                if self.bg is not None:
                    add("bg", dg.sum(axis=(0, 1)))
                dmerged, dx = dmerged * self._spread(s), dg @ self.wg.T         # d (normed) o, d x
        return self._o_normed(o, dmerged), dx
