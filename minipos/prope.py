r"""Proportional RoPE (p-RoPE): only the fastest fraction p of RoPE's frequencies rotate.

Source: Barbero, Vitvitskyi, Perivolaropoulos, Pascanu, Veličković 2025, "Round and Round We Go!
What makes Rotary Positional Encodings useful?", arXiv:2410.06205 (ICLR 2025), §6: the lowest
frequencies of RoPE carry little position and act as "semantic channels" that drift with
distance; p-RoPE removes them, keeping the fraction p of the highest ones (p = 1 is RoPE, p = 0
is NoPE). The code minipos matches is transformers' ``_compute_proportional_rope_parameters``
(``rope_type: "proportional"`` in ``modeling_rope_utils.ROPE_INIT_FUNCTIONS``, 5.24), used by the
full-attention layers of Gemma 4 (``partial_rotary_factor`` 0.25, ``rope_theta`` 1e6) and LFM3
(0.5), with the rotation of ``apply_rotary_pos_emb`` (the "half" layout, ``rotate_half``).

The frequencies. For head dim D, ``partial_rotary_factor`` p and ``factor`` s,

    k    = int(p · D // 2)                      (Python's float floor division, as HF writes it)
    θ_i  = base^(-2i/D) / s    for i = 0 … k - 1    (the k fastest: the exponent's denominator is D)
    θ_i  = 0                   for i = k … D/2 - 1  (the slowest D/2 - k pairs do not rotate)

and x is rotated over its whole head dim by Eq. 34 in the half layout, pair i = (i, i + D/2):
``y = x ⊙ [cos | cos] + rotate_half(x) ⊙ [sin | sin]``, cos = 1 and sin = 0 on the unrotated
pairs. Each pair's share of the score is ``q_[i]^T B((n - m) θ_i) k_[i]``; on an unrotated pair it
is ``q_[i] · k_[i]`` whatever the positions (the proofs: ``proofs.prope``).

Not partial rotary. HF's ``partial_rotary_factor`` means two different things:

- under every other ``rope_type`` (GPT-NeoX's ``rotary_pct``, ``minipos.rope.apply_rope``'s
  ``rotary_dim``) the first R = p·D features rotate with frequencies ``base^(-2i/R)`` (denominator
  R) and the last D - R features pass through: all of the frequency range, over fewer features;
- under ``"proportional"`` the frequencies keep the denominator D (the first k are RoPE's own
  k fastest), and the unrotated features are ``[k, D/2)`` and ``[D/2 + k, D)``, the upper end of
  each half, not the last D - pD features.

Same p, different numbers: a port that reads ``partial_rotary_factor`` the usual way gets p-RoPE
wrong silently (the tests show the difference).

Conventions: positions ``(T,)`` integers, negative allowed; x ``(..., T, D)``; frequencies and
angles in float64 (HF computes them in float32), outputs in x's floating dtype. The scheme class
the layer runs, ``ProportionalRotary``, is at the bottom. Docs page: "Proportional RoPE".
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, check_choice, check_even_int, check_float, check_ndim
from .rope import LAYOUTS, apply_rope, apply_rope_backward
from .seams import Scheme

__all__ = ["rotated_pairs", "proportional_inv_freq", "apply_prope", "apply_prope_backward", "ProportionalRotary"]


def _check_proportion(partial_rotary_factor) -> float:
    p = check_float(partial_rotary_factor, "partial_rotary_factor", minimum=0.0)
    if p > 1:
        raise ValueError(f"partial_rotary_factor must be in [0, 1] (the fraction of frequencies that rotate), got {p}")
    return p


def rotated_pairs(head_dim: int, partial_rotary_factor: float) -> int:
    """k = ``int(p · D // 2)``: how many pairs rotate (pairs 0 … k - 1, the fastest).

    head_dim: even D >= 2. partial_rotary_factor: p in [0, 1]. HF's expression, float floor division
    included: p = 0.3, D = 10 gives ``int(3.0000000000000004 // 2)`` = 1.
    """
    D = check_even_int(head_dim, "head_dim")
    p = _check_proportion(partial_rotary_factor)
    return int(p * D // 2)                                             # HF: int(rope_proportion * head_dim // 2)


def proportional_inv_freq(head_dim: int, *, base: float = 10000.0, partial_rotary_factor: float = 1.0,
                          factor: float = 1.0) -> tuple[np.ndarray, float]:
    """``(inv_freq (D/2,), attention_factor)`` of p-RoPE, as HF's ``_compute_proportional_rope_parameters``.

    ``inv_freq[i] = base^(-2i/D) / factor`` for ``i < k = rotated_pairs(D, p)`` and 0 after;
    ``attention_factor`` is 1.0 (HF: "unused in this type of RoPE"). float64 ``(D/2,)``.
    """
    D = check_even_int(head_dim, "head_dim")
    k = rotated_pairs(D, partial_rotary_factor)
    base = check_float(base, "base", positive=True)
    factor = check_float(factor, "factor", positive=True)
    i = np.arange(D // 2, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        theta = base ** (-2.0 * i / D)                                 # θ_i = base^(-2i/D): denominator D, not pD
    theta[k:] = 0.0                                                    # the D/2 - k slowest pairs: no rotation
    if not np.isfinite(theta).all():
        raise ValueError(f"base = {base:g} gives frequencies base^(-2i/D) that overflow float64")
    return theta / factor, 1.0                                         # HF: inv_freq /= factor


def _with_frequencies(x, name, base, partial_rotary_factor, factor):
    """``(x, inv_freq)``: x checked ``(..., T, D)`` with an even D, and p-RoPE's frequencies for that D."""
    x = as_float_array(x, name)
    check_ndim(x, name, 2, "(..., T, D)")
    D = x.shape[-1]
    if D % 2 or D < 2:
        raise ValueError(f"{name} must have an even head dim D >= 2 (last axis) for p-RoPE, got D = {D}")
    inv_freq, _ = proportional_inv_freq(D, base=base, partial_rotary_factor=partial_rotary_factor, factor=factor)
    return x, inv_freq


def apply_prope(x, positions, *, base: float = 10000.0, partial_rotary_factor: float = 1.0, factor: float = 1.0,
                layout: str = "half") -> np.ndarray:
    """Rotate ``x`` ``(..., T, D)`` by p-RoPE at integer ``positions`` ``(T,)``; ``(..., T, D)`` in x's dtype.

    Eq. 34 over the whole head dim with ``proportional_inv_freq``'s frequencies; layout "half" (HF,
    pairs (i, i + D/2)) or "interleaved" (pairs (2i, 2i + 1)).
    """
    x, inv_freq = _with_frequencies(x, "x", base, partial_rotary_factor, factor)
    return apply_rope(x, positions, inv_freq=inv_freq, layout=check_choice(layout, "layout", LAYOUTS))


def apply_prope_backward(dy, positions, *, base: float = 10000.0, partial_rotary_factor: float = 1.0,
                         factor: float = 1.0, layout: str = "half") -> np.ndarray:
    """The gradient of ``apply_prope`` for ``dy`` ``(..., T, D)``: ``R(m)^T dy`` (identity on unrotated pairs)."""
    dy, inv_freq = _with_frequencies(dy, "dy", base, partial_rotary_factor, factor)
    return apply_rope_backward(dy, positions, inv_freq=inv_freq, layout=check_choice(layout, "layout", LAYOUTS))


class ProportionalRotary(Scheme):
    """Proportional RoPE (Barbero et al. 2025): only the fastest fraction p of RoPE's frequencies rotate.

    The rotate seam: q and k rotated by ``apply_prope`` at their positions.

    base (``rope_parameters['rope_theta']``), partial_rotary_factor p (the fraction of frequencies that
    rotate), factor (HF divides every frequency by it), layout ("half", HF's). No learned parameters.
    """

    name = "p-rope"
    seams = ("rotate",)
    sign_convention = (r"rotated pairs as RoPE, $q^\top R(j - i)\, k$; pairs $i \ge k$ do not rotate",
                       r"Barbero et al. 2025; HF `_compute_proportional_rope_parameters`")

    def __init__(self, *, base: float = 10000.0, partial_rotary_factor: float = 0.25, factor: float = 1.0,
                 layout: str = "half"):
        self.base = check_float(base, "base", positive=True)
        self.partial_rotary_factor = _check_proportion(partial_rotary_factor)
        self.factor = check_float(factor, "factor", positive=True)
        self.layout = check_choice(layout, "layout", LAYOUTS)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        if self.head_dim % 2:
            raise ValueError(f"p-RoPE needs an even head dim, got head_dim = {self.head_dim}")
        self._made_from = None
        self._current()

    def _current(self):  # inv_freq (D/2,), computed again if base, factor or the proportion was set since
        made_from = (self.base, self.factor, self.partial_rotary_factor)
        if made_from != self._made_from:
            self.inv_freq, _ = proportional_inv_freq(self.head_dim, base=self.base, factor=self.factor,
                                                     partial_rotary_factor=self.partial_rotary_factor)
            self._made_from = made_from
        return self.inv_freq

    def cache_tag(self, seq_len):
        return self._current().tobytes(), self.layout

    def _apply(self, x, positions, *, seq_len):                        # (B, H, T, D)
        return apply_rope(x, positions, inv_freq=self._current(), layout=self.layout)

    def _apply_backward(self, dx, positions, *, seq_len):              # R(m)^T
        return apply_rope_backward(dx, positions, inv_freq=self._current(), layout=self.layout)

    rotate_q = rotate_k = _apply
    rotate_q_backward = rotate_k_backward = _apply_backward

    def settings(self):
        return (("base", self.base), ("partial_rotary_factor", self.partial_rotary_factor), ("factor", self.factor),
                ("layout", self.layout))

    def __repr__(self) -> str:
        return f"ProportionalRotary(partial_rotary_factor={self.partial_rotary_factor}, layout={self.layout!r})"
