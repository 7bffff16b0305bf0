"""Rotary position embedding (RoPE): rotate q and k by an angle proportional to position.

Source: Su et al. 2021, "RoFormer: Enhanced Transformer with Rotary Position Embedding",
arXiv:2104.09864, §3.2-3.4.

The definition (Eq. 14-15). For an even head dim D and position m, the query and key are
rotated by the block-diagonal orthogonal matrix

    R(m) = diag(B(m θ_0), B(m θ_1), …, B(m θ_{D/2-1})),   B(a) = [[cos a, -sin a],
                                                                   [sin a,  cos a]]
    θ_i = base^(-2i/D),  i = 0 … D/2 - 1,  base = 10000

(the paper counts i from 1 and writes θ_i = 10000^(-2(i-1)/d); same numbers). Eq. 13 is the
D = 2 case. B(a) is the counter-clockwise rotation: it multiplies the pair, read as the
complex number x_a + i x_b, by e^{i a}.

Why the scores are relative (Eq. 16). Each B is a rotation, so B(a)^T = B(-a) and
B(a) B(b) = B(a + b); blockwise,

    R(m)^T R(n) = R(n - m),   R(m) R(n)^T = R(m - n),
    <R(m) q, R(n) k> = q^T R(m)^T R(n) k = q^T R(n - m) k,

a function of the offset n - m only (both identities are proved in ``proofs``).

Two layouts: which features form a pair.

    "interleaved"  pairs (2i, 2i+1)     RoFormer, Meta LLaMA (``apply_rotary_emb`` via complex
                                        multiplication), GPT-J (``rotate_every_two``)
    "half"         pairs (i, i + D/2)   GPT-NeoX, HF LLaMA and most HF models
                                        (``rotate_half`` / ``apply_rotary_pos_emb``)

Both use the same θ_i for pair i. For the same vector the two give different numbers; they
agree after a fixed permutation of features, ``layout_permutation``:
``apply_rope(x[..., perm], layout="half") == apply_rope(x, layout="interleaved")[..., perm]``.
Applying that permutation to the q/k projection columns of every head converts a checkpoint
from one layout to the other (``interleaved_to_half_weights``); this is what the HF LLaMA
conversion script does to Meta's weights.

The efficient form (Eq. 34). R(m) is sparse, so nobody builds it:

    R(m) x = x ⊙ cos(m Θ) + rot(x) ⊙ sin(m Θ)

where for "interleaved" cos/sin repeat each θ_i twice, [θ_0, θ_0, θ_1, θ_1, …], and
rot = ``rotate_every_two``: (x_0, x_1, x_2, x_3, …) -> (-x_1, x_0, -x_3, x_2, …); for "half"
cos/sin repeat the whole list, [θ_0 … θ_{D/2-1}, θ_0 … θ_{D/2-1}], and rot = ``rotate_half``:
[x_1 | x_2] -> [-x_2 | x_1]. ``rotation_matrix`` is the definitional form, ``apply_rope`` the
efficient one; the tests check they agree.

What popular explanations get wrong.

- The sign in B: the upper-right entry is ``-sin``. [[cos, sin], [-sin, cos]] is the
  clockwise rotation B(-a), i.e. R(-m): self-consistent, but not the paper's nor any of the
  implementations above (every sin term flips sign), and explanations that mix the two
  conventions end up with R(m - n) where R(n - m) belongs.
- The transpose: the score is q^T R(m)^T R(n) k = q^T R(n - m) k. "R(m) R(n) = R(m - n)" or
  "R(m)^T R(n) = R(m - n)" are both false; with m the query and n the key position, the
  relative matrix is R(n - m) (equivalently R(m - n)^T).
- The index range: i runs over 0 … D/2 - 1 (one frequency per pair), not 0 … D - 1.
- The layouts are not interchangeable: loading Meta (interleaved) weights into a "half"
  implementation without permuting the q/k columns gives wrong scores, silently.
- Precision: angles m θ_i must be computed in float32 or better. In bfloat16 (8 significant
  bits) integers above 256 are not all representable: 4097 rounds to 4096, so neighbouring
  positions get the same rotation. minipos computes angles in float64 and casts only cos/sin.

Long-term decay (§3.4.3, Eq. 35-37): write the score as a sum over pairs,
Σ_i h_i e^{i (m-n) θ_i} with h_i = q_[2i:2i+1] k*_[2i:2i+1] (complex), and apply Abel summation
(proved in ``proofs``): with S_j = Σ_{k<j} e^{i (m-n) θ_k},

    |score| <= (max_i |h_{i+1} - h_i|) Σ_{j=1}^{D/2} |S_j|,

and the relative upper bound (1/(D/2)) Σ_j |S_j| decays, with oscillations, as |m - n| grows
(the paper's Fig. 2). ``long_term_decay`` evaluates it. It is a property of the frequencies;
no other code here depends on it.

Precision. ``to_bfloat16`` emulates bfloat16 in NumPy and ``angle_error`` measures the error of
angles m θ_i computed in float16 / bfloat16 / float32 the way frameworks do, against float64.

Partial rotary (GPT-NeoX ``rotary_pct``, GPT-J ``rotary_dim``, HF ``partial_rotary_factor``).
With ``rotary_dim = R < D`` only the first R features of each head are rotated and the last
D - R pass through unchanged. The frequencies are those of an R-dim RoPE, θ_i = base^(-2i/R),
and pairs are formed inside the first R features (for "half": (i, i + R/2)).

Attention factor. ``attention_factor`` multiplies cos and sin, as HF does for YaRN and LongRoPE:
the rotated features are scaled by it, so their contribution to the logits scales by its
square. The pass-through features of a partial rotary are *not* scaled.

Conventions
-----------
- Shapes: ``x`` ``(..., T, D)`` (attention tensors ``(..., H, T, D)``), positions ``(T,)``,
  frequencies ``(D/2,)`` (or ``(R/2,)``), angles ``(T, D/2)``.
- Positions are integers. Negative positions are allowed: R(m) is defined for every integer m
  and R(-m) = R(m)^T, which is what an offset n - m < 0 needs. Non-integer positions raise
  (position interpolation scales the frequencies instead: see ``rope_scaling``).
- Precision: frequencies and angles in float64; cos/sin are cast to x's floating dtype and the
  output keeps it (float32 in, float32 out; integer x becomes float64).
- Weights are ``(d_model, H*D)`` used as ``x @ W``; a torch ``nn.Linear.weight`` is ``W.T``.

The scheme class the layer runs, ``Rotary``, is at the bottom of ``minipos.rope_scaling``: it reads a
checkpoint's scaling config, and ``rope_scaling`` builds on this module.
"""

from __future__ import annotations

import contextlib
import numbers
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (
    as_float_array,
    check_alloc,
    as_positions,
    check_choice,
    check_even_int,
    check_float,
    check_int,
    check_ndim,
    check_positive_int,
)

__all__ = [
    "LAYOUTS",
    "rope_inv_freq",
    "rope_angles",
    "rotation_matrix",
    "rotate_half",
    "rotate_every_two",
    "apply_rope",
    "apply_rope_backward",
    "layout_permutation",
    "inverse_layout_permutation",
    "interleaved_to_half_weights",
    "half_to_interleaved_weights",
    "PRECISIONS",
    "to_bfloat16",
    "AngleError",
    "angle_error",
    "long_term_decay",
]

LAYOUTS = ("interleaved", "half")


def rope_inv_freq(dim: int, *, base: float = 10000.0) -> np.ndarray:
    """The RoPE frequencies θ_i = base^(-2i/dim), i = 0 … dim/2 - 1, float64 ``(dim/2,)``.

    These equal the sinusoidal frequencies w_i of Vaswani et al. (proved in ``proofs``).
    ``dim`` must be even (one frequency per pair of features).
    """
    dim = check_even_int(dim, "dim")
    base = check_float(base, "base", positive=True)
    check_alloc((dim // 2,), np.float64, "rope_inv_freq(dim)")
    i = np.arange(dim // 2, dtype=np.float64)
    with np.errstate(over="ignore", under="ignore"):
        inv_freq = base ** (-2.0 * i / dim)  # Eq. 15: θ_i = base^(-2(i-1)/d), i counted from 1 there
    if not (np.isfinite(inv_freq).all() and (inv_freq > 0).all()):
        raise ValueError(f"base = {base:g} gives frequencies base^(-2i/dim) that over- or underflow float64; "
                         "use a base nearer 1")
    return inv_freq


def as_inv_freq(inv_freq, name: str = "inv_freq") -> np.ndarray:
    """``inv_freq`` as a finite 1-D float64 array."""
    inv_freq = as_float_array(inv_freq, name)
    if inv_freq.ndim != 1:
        raise ValueError(f"{name} must be 1-D with shape (D/2,), got shape {inv_freq.shape}")
    return inv_freq.astype(np.float64, copy=False)


def rope_angles(positions: ArrayLike, inv_freq: ArrayLike) -> np.ndarray:
    """The rotation angles m θ_i, float64 ``(T, D/2)`` = outer(positions, inv_freq).

    positions: an int n (meaning ``arange(n)``) or integer positions ``(T,)``; negative entries
    are allowed, non-integers raise. inv_freq: ``(D/2,)``. The product is taken in float64
    whatever the inputs.
    """
    pos = as_positions(positions, "positions", allow_negative=True)  # (T,)
    inv_freq = as_inv_freq(inv_freq)                                # (D/2,)
    check_angles(pos, inv_freq, 1.0)
    check_alloc((pos.size, inv_freq.size), np.float64, "rope_angles(positions, inv_freq)")
    return np.outer(pos.astype(np.float64), inv_freq)                # (T, D/2): m θ_i


def _pair_indices(dim: int, layout: str) -> tuple[np.ndarray, np.ndarray]:
    """Feature indices (a_i, b_i) of pair i = 0 … dim/2 - 1 in ``layout``."""
    i = np.arange(dim // 2)
    if layout == "interleaved":
        return 2 * i, 2 * i + 1  # (2i, 2i+1)
    return i, i + dim // 2       # (i, i + D/2)


def rotation_matrix(position: int, dim: int, *, base: float = 10000.0, layout: str = "interleaved",
                    inv_freq: ArrayLike | None = None) -> np.ndarray:
    """The definitional block-diagonal R(m) of Eq. 15, float64 ``(D, D)``, D = ``dim``.

    Pair i = (a, b) (``(2i, 2i+1)`` for "interleaved", ``(i, i + D/2)`` for "half") carries the
    block [[cos mθ_i, -sin mθ_i], [sin mθ_i, cos mθ_i]]: R[a, a] = R[b, b] = cos,
    R[a, b] = -sin, R[b, a] = sin. ``R(m) @ x`` rotates a single vector ``x`` ``(D,)``.
    ``inv_freq`` ``(D/2,)`` overrides ``base``.
    """
    m = check_int(position, "position")
    dim = check_even_int(dim, "dim")
    check_choice(layout, "layout", LAYOUTS)
    theta = rope_inv_freq(dim, base=base) if inv_freq is None else check_inv_freq_len(inv_freq, dim, "dim")
    check_angles(np.array([m]), theta, 1.0)
    check_alloc((dim, dim), np.float64, "rotation_matrix(position, dim)")
    angle = m * theta                             # (D/2,)
    a, b = _pair_indices(dim, layout)
    R = np.zeros((dim, dim), dtype=np.float64)
    R[a, a] = np.cos(angle)                       # Eq. 15 block [[cos, -sin],
    R[a, b] = -np.sin(angle)                      #               [sin,  cos]]
    R[b, a] = np.sin(angle)
    R[b, b] = np.cos(angle)
    return R


def check_inv_freq_len(inv_freq, rotary_dim: int, label: str = "rotary_dim") -> np.ndarray:
    """``inv_freq`` as float64, checked to hold one frequency per pair of ``rotary_dim``."""
    inv_freq = as_inv_freq(inv_freq)
    if inv_freq.shape[0] != rotary_dim // 2:
        raise ValueError(
            f"inv_freq must have length {label}/2 = {rotary_dim // 2}, got length {inv_freq.shape[0]}"
        )
    return inv_freq


def rotate_half(x: ArrayLike) -> np.ndarray:
    """[x_1 | x_2] -> [-x_2 | x_1] on the last axis (the "half" layout's rotation by 90°).

    x: ``(..., D)``, D even. Same shape and dtype. HF ``rotate_half``.
    """
    x = as_float_array(x, "x")
    D = x.shape[-1] if x.ndim else 0
    if x.ndim == 0 or D % 2:
        raise ValueError(f"x must have shape (..., D) with D even, got shape {x.shape}")
    x1, x2 = x[..., : D // 2], x[..., D // 2:]
    return np.concatenate([-x2, x1], axis=-1)


def rotate_every_two(x: ArrayLike) -> np.ndarray:
    """(x_0, x_1, x_2, x_3, …) -> (-x_1, x_0, -x_3, x_2, …): the "interleaved" rotation by 90°.

    x: ``(..., D)``, D even. Same shape and dtype. GPT-J ``rotate_every_two``.
    """
    x = as_float_array(x, "x")
    if x.ndim == 0 or x.shape[-1] % 2:
        raise ValueError(f"x must have shape (..., D) with D even, got shape {x.shape}")
    x1, x2 = x[..., 0::2], x[..., 1::2]
    return np.stack([-x2, x1], axis=-1).reshape(x.shape)


def check_rotary_dim(rotary_dim, D: int, name: str = "x") -> int:
    """The number R of rotated features: all of D by default, else an even R <= D."""
    if rotary_dim is None:
        if D % 2 or D < 2:
            raise ValueError(f"{name} must have an even head dim D >= 2 (last axis) for RoPE, got D = {D}")
        return D
    R = check_even_int(rotary_dim, "rotary_dim")
    if R > D:
        raise ValueError(f"rotary_dim must be <= the head dim D = {D} of {name}, got {R}")
    return R


def cos_sin(positions, T: int, R: int, base, inv_freq, attention_factor):
    """cos(mθ_i) and sin(mθ_i) times the attention factor, float64 ``(T, R/2)``, one column per pair."""
    pos = as_positions(positions, "positions", allow_negative=True, length=T)
    if inv_freq is None:
        inv_freq = rope_inv_freq(R, base=base)
    elif base != 10000.0:
        raise ValueError("pass either base or inv_freq, not both (inv_freq already fixes the frequencies)")
    inv_freq = check_inv_freq_len(inv_freq, R)
    factor = check_float(attention_factor, "attention_factor", positive=True)
    check_angles(pos, inv_freq, factor)
    angles = np.outer(pos.astype(np.float64), inv_freq)           # (T, R/2): m θ_i, float64
    return factor * np.cos(angles), factor * np.sin(angles)


def check_angles(pos: np.ndarray, inv_freq: np.ndarray, factor: float) -> None:
    """Raise unless every angle m θ_i and the attention factor times cos, sin are finite."""
    largest = float(np.abs(pos).max(initial=0)) * float(np.abs(inv_freq).max(initial=0))
    if not (np.isfinite(largest) and np.isfinite(factor)):
        raise ValueError(f"the angles positions * inv_freq must be finite, got up to {largest:g}: the "
                         "frequencies are too large for these positions")


def apply_rope(x: ArrayLike, positions: ArrayLike, *, base: float = 10000.0, inv_freq: ArrayLike | None = None,
               layout: str = "interleaved", rotary_dim: int | None = None, attention_factor: float = 1.0) -> np.ndarray:
    """Rotate ``x`` by R(m) at each position m: Eq. 34, ``x ⊙ cos(mΘ) + rot(x) ⊙ sin(mΘ)``.

    x: ``(..., T, D)``, e.g. q or k ``(B, H, T, D)``. positions: ``(T,)`` integers (negative
    allowed) or an int T meaning ``arange(T)``. layout: "interleaved" (pairs (2i, 2i+1), rot =
    ``rotate_every_two``; Meta LLaMA, GPT-J) or "half" (pairs (i, i + R/2), rot = ``rotate_half``;
    GPT-NeoX, HF LLaMA). rotary_dim: rotate only the first R features (even, <= D; default D);
    the rest pass through unchanged. inv_freq: ``(R/2,)`` frequencies from a scaling variant,
    replacing ``base^(-2i/R)``. attention_factor: multiplies cos and sin (not the pass-through
    part), so the rotated part's logits scale by its square. Returns ``(..., T, D)`` in x's
    floating dtype.
    """
    x = as_float_array(x, "x")
    check_ndim(x, "x", 2, "(..., T, D)")
    check_choice(layout, "layout", LAYOUTS)
    *_, T, D = x.shape
    R = check_rotary_dim(rotary_dim, D)
    cos, sin = cos_sin(positions, T, R, base, inv_freq, attention_factor)      # (T, R/2)
    if layout == "interleaved":
        cos, sin, rot = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1), rotate_every_two  # θ_0 θ_0 θ_1 θ_1 …
    else:
        cos, sin, rot = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1), rotate_half  # θ_0 … θ_0 …
    x_rot = x[..., :R]                                                          # (..., T, R)
    with overflow_raises(x.dtype):
        rotated = x_rot * cos.astype(x.dtype) + rot(x_rot) * sin.astype(x.dtype)  # Eq. 34
    return np.concatenate([rotated, x[..., R:]], axis=-1)                       # (..., T, D)


def apply_rope_backward(dy: ArrayLike, positions: ArrayLike, *, base: float = 10000.0,
                        inv_freq: ArrayLike | None = None, layout: str = "interleaved", rotary_dim: int | None = None,
                        attention_factor: float = 1.0) -> np.ndarray:
    """The gradient of ``apply_rope`` for the output gradient ``dy`` ``(..., T, D)``: ``R(m)^T dy``.

    ``apply_rope`` is linear in x, ``y = f R(m) x`` on the rotated part (f the attention factor)
    and ``y = x`` on the rest, so ``dx = f R(m)^T dy``: the rotation by minus the angle (proved in
    ``proofs.gradients``). In Eq. 34's terms the adjoint of ``rot`` is ``-rot``, so

        dx = dy ⊙ cos(mΘ) - rot(dy) ⊙ sin(mΘ)            (cos, sin times f)

    Same keywords as ``apply_rope``; returns ``(..., T, D)`` in dy's floating dtype.
    """
    dy = as_float_array(dy, "dy")
    check_ndim(dy, "dy", 2, "(..., T, D)")
    check_choice(layout, "layout", LAYOUTS)
    *_, T, D = dy.shape
    R = check_rotary_dim(rotary_dim, D, "dy")
    cos, sin = cos_sin(positions, T, R, base, inv_freq, attention_factor)       # (T, R/2)
    if layout == "interleaved":
        cos, sin, rot = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1), rotate_every_two
    else:
        cos, sin, rot = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1), rotate_half
    dy_rot = dy[..., :R]                                                         # (..., T, R)
    with overflow_raises(dy.dtype, "dy"):
        rotated = dy_rot * cos.astype(dy.dtype) - rot(dy_rot) * sin.astype(dy.dtype)   # R(m)^T dy
    return np.concatenate([rotated, dy[..., R:]], axis=-1)                       # (..., T, D)


@contextlib.contextmanager
def overflow_raises(dtype, name: str = "x"):
    """Turn an overflow of the rotated features (|x| near the dtype's largest value) into ValueError.

    Underflow is left alone whatever the caller's ``np.errstate``: a rotated feature that rounds to a
    subnormal or to zero is the right answer for a tiny input, not an overflow."""
    try:
        with np.errstate(over="raise", invalid="raise", under="ignore"):
            yield
    except FloatingPointError:
        raise ValueError(f"the rotated {name} overflows {np.dtype(dtype)}: |{name}| times the attention factor is "
                         f"too close to the largest {np.dtype(dtype)}") from None


def layout_permutation(dim: int, *, rotary_dim: int | None = None) -> np.ndarray:
    """Feature permutation from "interleaved" to "half": ``x_half = x_interleaved[..., perm]``.

    perm = [0, 2, 4, …, R-2, 1, 3, 5, …, R-1, R, R+1, …, dim-1] with R = ``rotary_dim``
    (default ``dim``): pair (2i, 2i+1) lands on (i, i + R/2); pass-through features stay put.
    So ``apply_rope(x[..., perm], layout="half") == apply_rope(x, layout="interleaved")[..., perm]``.
    The inverse (half -> interleaved) is ``inverse_layout_permutation`` = ``np.argsort(perm)``.
    Returns int64 ``(dim,)``.
    """
    dim = check_positive_int(dim, "dim")
    R = check_rotary_dim(rotary_dim, dim) if rotary_dim is not None else check_even_int(dim, "dim")
    check_alloc((dim,), np.int64, "layout_permutation(dim)", copies=3)
    rotated = np.concatenate([np.arange(0, R, 2), np.arange(1, R, 2)])  # evens, then odds
    return np.concatenate([rotated, np.arange(R, dim)]).astype(np.int64)


def inverse_layout_permutation(dim: int, *, rotary_dim: int | None = None) -> np.ndarray:
    """Feature permutation from "half" to "interleaved": ``x_interleaved = x_half[..., inv]``.

    ``inv = np.argsort(layout_permutation(dim))`` = [0, R/2, 1, R/2 + 1, …] then the
    pass-through features. Returns int64 ``(dim,)``.
    """
    return np.argsort(layout_permutation(dim, rotary_dim=rotary_dim)).astype(np.int64)


def _permute_heads(w, num_heads, head_dim, rotary_dim, inverse: bool) -> np.ndarray:
    """Apply the per-head layout permutation (or its inverse) to the last axis of ``w``."""
    w = as_float_array(w, "w")
    H = check_positive_int(num_heads, "num_heads")
    if w.ndim == 0 or w.shape[-1] % H or w.shape[-1] == 0:
        raise ValueError(f"w must have shape (..., num_heads*head_dim) with num_heads = {H}, got {w.shape}")
    D = w.shape[-1] // H if head_dim is None else check_positive_int(head_dim, "head_dim")
    if H * D != w.shape[-1]:
        raise ValueError(f"w must have last axis num_heads*head_dim = {H}*{D} = {H * D}, got shape {w.shape}")
    make = inverse_layout_permutation if inverse else layout_permutation
    perm = make(D, rotary_dim=rotary_dim)                          # (D,)
    heads = w.reshape(*w.shape[:-1], H, D)                         # (..., H, D)
    return heads[..., perm].reshape(w.shape)                       # (..., H*D)


def interleaved_to_half_weights(w: ArrayLike, num_heads: int, head_dim: int | None = None, *,
                                rotary_dim: int | None = None) -> np.ndarray:
    """Convert a q or k projection from the "interleaved" to the "half" RoPE layout.

    w: ``(d_model, H*D)`` used as ``x @ w`` (or its bias ``(H*D,)``; any ``(..., H*D)``), with
    H = ``num_heads`` heads *of this projection* (``num_key_value_heads`` for k under GQA/MQA)
    and D = ``head_dim`` (default ``w.shape[-1] // num_heads``). The columns of each head are
    reordered by ``layout_permutation(D)``, so ``apply_rope(x @ w_half, layout="half")`` equals
    ``apply_rope(x @ w, layout="interleaved")`` with each head's features permuted, and the
    scores q·k are unchanged. v and o projections are not touched.

    This is HF's ``permute`` in ``convert_llama_weights_to_hf.py`` (Meta -> HF LLaMA):
    ``permute(W_t, n_heads) = w.view(n_heads, D/2, 2, d_model).transpose(1, 2)`` on the torch
    ``(out, in)`` weight ``W_t = w.T`` equals ``interleaved_to_half_weights(w, n_heads).T``.
    """
    return _permute_heads(w, num_heads, head_dim, rotary_dim, inverse=False)


def half_to_interleaved_weights(w: ArrayLike, num_heads: int, head_dim: int | None = None, *,
                                rotary_dim: int | None = None) -> np.ndarray:
    """Convert a q or k projection from the "half" to the "interleaved" RoPE layout.

    The inverse of ``interleaved_to_half_weights`` (same arguments and shapes): each head's
    columns are reordered by ``inverse_layout_permutation(D)``. Use it to run an HF-layout
    checkpoint (GPT-NeoX, HF LLaMA) through an interleaved implementation (Meta, GPT-J style).
    """
    return _permute_heads(w, num_heads, head_dim, rotary_dim, inverse=True)


# --------------------------------------------------------------------------- precision

PRECISIONS = ("float16", "bfloat16", "float32", "float64")


def to_bfloat16(x: ArrayLike) -> np.ndarray:
    """Round ``x`` to the nearest bfloat16, ties to even; float32 array holding those values.

    bfloat16 is the top 16 bits of a float32: 1 sign, 8 exponent and 7 stored significand bits
    (8 significant). ``x`` (any shape, real) is first rounded to float32, as torch does for
    float64 -> bfloat16 (so a float64 value is rounded twice), then the low 16 bits are dropped
    with round-to-nearest-even: add 0x7FFF plus the lowest kept bit, truncate. Examples:
    4097 -> 4096 (the spacing in [4096, 8192) is 2^(12-7) = 32), 1 + 2^-8 -> 1 (a tie; 1 is
    even), 1 + 3·2^-8 -> 1 + 2^-6 (a tie between 1 + 2^-7, odd, and 1 + 2^-6, even).
    Finite values beyond the largest bfloat16 (~3.39e38) become ±inf; NaN and ±inf stay.
    Returns float32 of the shape of ``x``.
    """
    x = as_float_array(x, "x", finite=False)
    with np.errstate(over="ignore"):
        f32 = np.array(x, dtype=np.float32)                          # a C-contiguous copy
    bits = f32.view(np.uint32)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)                    # lowest kept bit: ties to even
    kept = (bits + np.uint32(0x7FFF) + lsb) & np.uint32(0xFFFF0000)  # round, drop the low 16 bits
    return np.where(np.isnan(f32), f32, kept.view(np.float32))      # NaN would round to inf


def _round_to(x: np.ndarray, precision: str) -> np.ndarray:
    """float64 ``x`` rounded to ``precision`` (one of ``PRECISIONS``), returned as float64."""
    if precision == "bfloat16":
        return to_bfloat16(x).astype(np.float64)
    with np.errstate(over="ignore"):
        return x.astype(precision).astype(np.float64)


@dataclass(frozen=True, eq=False)
class AngleError:
    """The error of RoPE angles m θ_i computed in one precision, against float64.

    dtype: the precision's name. max_angle: max over positions and frequencies of
    |m θ_i (dtype) - m θ_i (float64)|, radians. max_cos_sin: the same for cos and sin at those
    angles (the larger of the two). angle, cos_sin: ``(T,)``, the max over frequencies at each
    position. angle_per_freq: ``(D/2,)``, the max over positions for each frequency. A position
    or angle that overflows the precision (float16 above 65504) gives inf.
    """

    dtype: str
    max_angle: float
    max_cos_sin: float
    angle: np.ndarray = field(repr=False)
    cos_sin: np.ndarray = field(repr=False)
    angle_per_freq: np.ndarray = field(repr=False)


def _check_precisions(dtypes) -> tuple:
    """``dtypes`` as a non-empty tuple of names from ``PRECISIONS`` (a single name is allowed)."""
    if isinstance(dtypes, str):
        dtypes = (dtypes,)
    try:
        names = tuple(dtypes)
    except TypeError:
        raise TypeError(f"dtypes must be a sequence of names from {PRECISIONS}, "
                        f"got {type(dtypes).__name__} {dtypes!r}") from None
    if not names:
        raise ValueError(f"dtypes must name at least one of {PRECISIONS}, got none")
    return tuple(check_choice(n, "dtypes", PRECISIONS) for n in names)


def _angle_error_in(precision: str, pos: np.ndarray, inv_freq: np.ndarray, exact: np.ndarray) -> AngleError:
    """``AngleError`` of the angles computed in ``precision``; ``exact`` is the float64 ``(T, D/2)``."""
    p, w = _round_to(pos, precision), _round_to(inv_freq, precision)   # cast both factors
    low = _round_to(np.outer(p, w), precision)    # (T, D/2): the product is exact in float64, round once
    with np.errstate(invalid="ignore"):
        err = np.abs(low - exact)                                       # (T, D/2), radians
        trig = np.maximum(np.abs(np.cos(low) - np.cos(exact)), np.abs(np.sin(low) - np.sin(exact)))
    trig = np.where(np.isfinite(low), trig, np.inf)                     # cos(inf) is NaN: count it as inf
    return AngleError(precision, float(err.max()), float(trig.max()), err.max(axis=1),
                      trig.max(axis=1), err.max(axis=0))


def angle_error(positions: ArrayLike, inv_freq: ArrayLike, *,
                dtypes: Sequence[str] = ("float16", "bfloat16", "float32")) -> dict:
    """How far angles m θ_i computed in low precision are from float64, per precision.

    Computed the way a framework does it in that dtype: positions and ``inv_freq`` are each cast
    to the precision, multiplied, and the product rounded to it (bfloat16 emulated by
    ``to_bfloat16``). positions: an int T (meaning ``arange(T)``) or integer positions ``(T,)``,
    negative allowed. inv_freq: ``(D/2,)``. dtypes: names from ``PRECISIONS``.
    Returns ``{name: AngleError}`` in the order of ``dtypes``; the cos/sin errors are those of
    the angle error alone (cos and sin evaluated in float64 at the rounded angle).
    """
    pos = as_positions(positions, "positions", allow_negative=True).astype(np.float64)  # (T,)
    inv_freq = as_inv_freq(inv_freq)                                                   # (D/2,)
    if pos.size == 0 or inv_freq.size == 0:
        raise ValueError("positions and inv_freq must be non-empty, "
                         f"got lengths {pos.size} and {inv_freq.size}")
    names = _check_precisions(dtypes)
    with np.errstate(over="ignore", invalid="ignore"):                # an overflowing angle is reported as inf
        exact = np.outer(pos, inv_freq)                                     # (T, D/2): m θ_i in float64
        return {name: _angle_error_in(name, pos, inv_freq, exact) for name in names}


def long_term_decay(dim: int, distances: ArrayLike, *, base: float = 10000.0) -> tuple[np.ndarray, np.ndarray]:
    """RoFormer's relative upper bound (§3.4.3, Fig. 2) and the all-ones score, per distance.

    dim: even head dim D. distances: relative distances m = n - m' (real, any shape ``(...)``),
    or an int K meaning ``arange(K)``. Returns ``(bound, measured)``, float64, each of the shape
    of ``distances``:

        bound    = (1/(D/2)) Σ_{j=1}^{D/2} |S_j|,  S_j = Σ_{k=0}^{j-1} e^{i m θ_k}   (Eq. 37, Fig. 2)
        measured = q^T R(m) k for q = k = (1, …, 1) = Σ_i [1 1] B(m θ_i) [1 1]^T = 2 Σ_i cos(m θ_i)

    At m = 0: bound = (D/2 + 1)/2, measured = D. For the all-ones vectors h_i = 2 for every pair,
    so Abel summation gives |measured| <= 2 |S_{D/2}| <= D · bound. The bound decays, with
    oscillations, as |m| grows (for D = 128, from 32.5 at m = 0 to about 6.6 on average over
    m in [400, 500]).
    """
    dim = check_even_int(dim, "dim")
    theta = rope_inv_freq(dim, base=base)                                     # (D/2,)
    if isinstance(distances, numbers.Integral) and not isinstance(distances, bool):
        count = check_int(distances, "distances", minimum=0)
        check_alloc((count, dim), np.complex128, "long_term_decay(dim, distances)", copies=2)
        distances = np.arange(count, dtype=np.float64)
    m = as_float_array(distances, "distances").astype(np.float64)             # (...)
    angles = m[..., None] * theta                                             # (..., D/2): m θ_k
    S = np.cumsum(np.exp(1j * angles), axis=-1)                               # (..., D/2): S_1 … S_{D/2}
    bound = np.abs(S).mean(axis=-1)                                           # Eq. 37: (1/(D/2)) Σ_j |S_j|
    measured = 2.0 * np.cos(angles).sum(axis=-1)                              # q = k = 1: 2 Σ_i cos(m θ_i)
    return bound, measured
