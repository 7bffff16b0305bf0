"""xPos: RoPE whose rotation also shrinks, so attention decays with distance.

Source: Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv:2212.10554 (the
LeX Transformer), and its reference implementation, ``XPOS`` in microsoft/torchscale
``torchscale/component/xpos_relative_position.py``, whose numbers this module reproduces.

The definition. Take RoPE in the interleaved layout (pairs (2i, 2i+1), frequencies
``w_i = base^(-2i/D)``, see ``minipos.rope``) and give pair ``i`` a per-pair ratio

    zeta_i = (2i/D + 0.4) / (1 + 0.4) = (2i + 0.4 D) / (1.4 D),    i = 0 ... D/2 - 1,

so ``0 < zeta_i < 1`` (from 2/7 at i = 0 up to almost 1). With the scale base ``g``
(torchscale's ``scale_base``, default 512; ``g`` because ``B`` is the batch letter), a query at
position ``n`` and a key at position ``m`` become

    q_n = zeta^(+n/g) * R(n) q,      k_m = zeta^(-m/g) * R(m) k        (zeta^(.) per pair),

hence, pair by pair, ``q_n . k_m = sum_i zeta_i^((n-m)/g) [R(n) q]_i . [R(m) k]_i``: still a
function of ``n - m`` only (RoPE's property, times a factor that depends on ``n - m``), and for
``n > m`` the factor ``zeta_i^((n-m)/g) < 1`` decays with distance, fastest for the
high-frequency pairs (small ``i``). Queries are upscaled, keys downscaled: ``downscale=True``
is for keys, as in torchscale's ``MultiheadAttention`` (``xpos(k, offset=0, downscale=True)``).

Matching torchscale exactly
---------------------------
- Rotation: ``x * cos + rotate_every_two(x) * sin`` with ``rotate_every_two`` =
  ``(x0, x1, ...) -> (-x1, x0, ...)`` and cos/sin repeated per pair (``duplicate_interleave``):
  the counter-clockwise block ``[[cos, -sin], [sin, cos]]`` of ``minipos.rope`` "interleaved".
  The scale multiplies cos and sin alike, i.e. the whole rotated pair. torchscale's frequencies
  are ``10000^(-j/(D/2))`` = ``w_j`` with base 10000 fixed; ``base`` here may differ.
- Positions: torchscale rotates row ``t`` of a call with ``offset`` by angle ``(offset + t) w``,
  but raises zeta to ``(offset + t - c) / g`` with ``c = ceil((offset + T) / 2)`` (its
  ``min_pos = -(length + offset) // 2``): the exponents are centred on the current total length
  ``S = offset + T`` to keep them small. The same ``c`` is used for q and k (q is called with
  ``offset = S - 1`` when decoding one token, k with ``offset = 0`` over all ``S`` keys), so it
  cancels in every score ``q . k``, but not in the individual vectors. ``scale_offset = c``
  reproduces torchscale's vectors exactly; the default 0 uses the plain exponent ``n/g``.
- Precision: torchscale works in the model dtype (float32); zeta, angles and powers here are
  float64 and the result is cast to ``x``'s dtype. ``zeta_0^(n/g)`` leaves the normal float32
  range near ``|n|/g ~ 70`` (float64: ~ 566), upwards for keys and downwards (into subnormals,
  then 0) for queries; such positions raise here, for queries and keys alike, instead of giving
  inf, 0 or subnormal vectors (and NaN or inaccurate scores). Centring with ``scale_offset``
  halves the exponents.
- Gradient: ``apply_xpos_backward(dy, positions, ...)`` (the same keywords) returns
  ``R(n)^T (zeta^(+-(n - c)/g) dy)``: the scale is equal on both features of a pair, so it
  commutes with the rotation, whose adjoint is the rotation by minus the angle.
- The paper also uses blockwise causal attention at inference; that belongs to the attention
  mask, not to this module.

The scheme class the layer runs, ``XPos``, is at the bottom of this module.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (
    as_float_array,
    as_positions,
    check_alloc,
    check_bool,
    check_even_int,
    check_float,
    check_int,
    check_ndim,
)
from .rope import apply_rope, apply_rope_backward
from .seams import Scheme

__all__ = ["xpos_zeta", "xpos_scale", "apply_xpos", "apply_xpos_backward", "XPos"]

MAX_EXPONENT = 2 ** 53
"""Largest ``|n|`` of a scale exponent: float64 holds every integer up to here, and no further."""


def xpos_zeta(dim: int) -> np.ndarray:
    """The per-pair ratios ``zeta_i = (2i + 0.4 D) / (1.4 D)``, float64 ``(D/2,)``, all in (0, 1)."""
    dim = check_even_int(dim, "dim")
    check_alloc((dim // 2,), np.float64, "dim")
    zeta = np.arange(0, dim, 2, dtype=np.float64)                            # 2i, in place below
    return np.divide(np.add(zeta, 0.4 * dim, out=zeta), 1.4 * dim, out=zeta)  # (2i/D + 0.4) / 1.4


def xpos_scale(positions: ArrayLike, dim: int, *, scale_base: float = 512) -> np.ndarray:
    """The query scales ``zeta_i^(n/g)``, float64 ``(T, D/2)``, g = ``scale_base``; keys use 1 / it.

    positions: an int T (meaning ``arange(T)``) or integer exponents ``n`` ``(T,)``, negative
    allowed (torchscale's centred exponents are negative for the first half), ``|n| <= 2**53``.
    dim: even head dim D. scale_base: g > 0. Raises ``ValueError`` where a scale leaves float64's
    normal range (overflow, or underflow to a subnormal or 0).
    """
    dim = check_even_int(dim, "dim")
    g = check_float(scale_base, "scale_base", positive=True)
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool) and positions > 0:
        check_alloc((positions, dim // 2), np.float64, "positions and dim")  # before arange(n) is built
    pos = as_positions(positions, "positions", allow_negative=True)                   # (T,)
    check_alloc((pos.shape[0], dim // 2), np.float64, "positions and dim")
    _check_exponents(int(pos.min()) if pos.size else 0, int(pos.max()) if pos.size else 0, "positions")
    zeta = xpos_zeta(dim)                                                              # (D/2,)
    with np.errstate(over="ignore", under="ignore"):                                  # checked just below
        scale = zeta[None, :] ** (pos[:, None].astype(np.float64) / g)  # (T, D/2): zeta_i^(n/g)
    _check_scale(scale, np.float64, "from 0")
    return scale


def _check_exponents(lo: int, hi: int, names: str) -> None:
    """Raise unless every exponent n in [lo, hi] (Python ints) is exact in float64."""
    if max(-lo, hi) > MAX_EXPONENT:
        raise ValueError(f"{names} must give exponents n within +-2**53 (float64 holds every integer only "
                         f"up to there), got {lo} ... {hi}")


def _check_scale(scale: np.ndarray, dtype, away: str) -> None:
    """Raise unless every scale is a finite, normal (not subnormal, not 0) number of ``dtype``."""
    if scale.size and not (np.all(np.isfinite(scale)) and scale.min() >= np.finfo(dtype).tiny):
        raise ValueError(f"positions are too far {away} for the xPos scale in {np.dtype(dtype)}: "
                         f"zeta^(n/scale_base) reaches {scale.min():.3g} ... {scale.max():.3g}, outside "
                         f"its normal range; centre the positions with scale_offset or raise scale_base")


def _pair_scales(x: np.ndarray, name: str, positions, scale_base, downscale, scale_offset):
    """Positions (T,) and the scales ``zeta_i^(+-(n - scale_offset)/g)`` duplicated per pair, (T, D)
    in the dtype of ``x`` ``(..., T, D)`` (x or dy, called ``name``), every argument checked."""
    check_ndim(x, name, 2, "(..., T, D)")
    downscale = check_bool(downscale, "downscale")
    *_, T, D = x.shape
    if D < 2 or D % 2:
        raise ValueError(f"{name} must have an even head dim D >= 2 ({name}.shape[-1]), got shape {x.shape}")
    pos = as_positions(positions, "positions", allow_negative=True, length=T)    # (T,), length first
    offset = check_int(scale_offset, "scale_offset")
    _check_exponents(int(pos.min()) if T else 0, int(pos.max()) if T else 0, "positions")  # angles n w_i
    lo, hi = (int(pos.min()) - offset, int(pos.max()) - offset) if T else (0, 0)  # n - scale_offset
    _check_exponents(lo, hi, "positions - scale_offset")
    exponent = (pos - pos.min()) + lo if T else pos                              # (T,), n - scale_offset, exact
    with np.errstate(over="ignore", under="ignore"):                             # checked just below
        scale = xpos_scale(-exponent if downscale else exponent, D, scale_base=scale_base)  # (T, D/2)
        scale = np.repeat(scale, 2, axis=-1).astype(x.dtype)                     # (T, D), duplicated
    _check_scale(scale, x.dtype, "from scale_offset")
    return pos, scale


def apply_xpos(x: ArrayLike, positions: ArrayLike, *, base: float = 10000.0, scale_base: float = 512,
               downscale: bool = False, scale_offset: int = 0) -> np.ndarray:
    """Rotate ``x`` as interleaved RoPE and scale pair i by ``zeta_i^(+-(n - scale_offset)/g)``.

    x: ``(..., T, D)``, D even, e.g. q or k ``(B, H, T, D)``. positions: ``(T,)`` integers or an
    int T meaning ``arange(T)``. downscale: False for queries (``zeta^(+n/g)``), True for keys
    (``zeta^(-n/g)``). scale_offset: subtracted from the positions in the scale exponent only;
    ``(S + 1) // 2`` with S = cache length + T reproduces torchscale (module docstring).
    Returns ``(..., T, D)`` in x's floating dtype. Raises ``ValueError`` where a scale leaves the
    normal range of x's dtype, for queries (underflow) and keys (overflow) alike.
    """
    return apply_xpos_with(apply_rope, x, positions, base, scale_base, downscale, scale_offset)


def apply_xpos_with(rope, x, positions, base, scale_base, downscale, scale_offset):
    """``apply_xpos`` with ``rope`` (``apply_rope``'s signature) as the rotation; ``minipos.fast.xpos``
    passes ``minipos.fast.rope.apply_rope``."""
    x = as_float_array(x, "x")
    pos, scale = _pair_scales(x, "x", positions, scale_base, downscale, scale_offset)  # (T,), (T, D)
    with np.errstate(over="ignore", invalid="ignore"):                           # checked just below
        rotated = rope(x, pos, base=base, layout="interleaved")                 # (..., T, D): R(n) x
        out = rotated * scale                                                    # zeta^(+-n/g) R(n) x
    if not np.all(np.isfinite(out)):
        raise ValueError(f"x rotated and scaled by xPos overflows {x.dtype} (scale up to {scale.max():.3g}); "
                         f"rescale x or centre the positions with scale_offset")
    return out


def apply_xpos_backward(dy: ArrayLike, positions: ArrayLike, *, base: float = 10000.0, scale_base: float = 512,
                        downscale: bool = False, scale_offset: int = 0) -> np.ndarray:
    """The gradient of ``apply_xpos`` (same positions and keywords) for the output gradient dy.

    dy: ``(..., T, D)``, D even, the shape of the forward's output (and of x); positions:
    ``(T,)`` integers or an int T. Returns dx ``(..., T, D)`` in dy's floating dtype. The forward
    is linear in x, ``y = s * R(n) x`` with s = ``zeta_i^(+-(n - scale_offset)/g)`` the same on
    both features of pair i, so s commutes with the block-diagonal R(n), and R(n) is orthogonal:

        dx = R(n)^T (s * dy) = (s * dy) cos(n w) - rot(s * dy) sin(n w)     (``apply_rope_backward``)

    Raises ``ValueError`` naming dy where T differs from the number of positions, and where the
    scaled gradient overflows dy's dtype (keys, whose scale grows with n).
    """
    return apply_xpos_backward_with(apply_rope_backward, dy, positions, base, scale_base, downscale, scale_offset)


def apply_xpos_backward_with(rope_backward, dy, positions, base, scale_base, downscale, scale_offset):
    """``apply_xpos_backward`` with ``rope_backward`` (``apply_rope_backward``'s signature) as R(n)^T."""
    dy = as_float_array(dy, "dy")
    count = _count(positions)
    if count is not None and dy.ndim >= 2 and dy.shape[-2] != count:
        raise ValueError(f"dy must have the shape of the forward's output (..., T, D) with T = {count} "
                         f"positions, got shape {dy.shape}")
    pos, scale = _pair_scales(dy, "dy", positions, scale_base, downscale, scale_offset)  # (T,), (T, D)
    with np.errstate(over="ignore", invalid="ignore"):                           # checked just below
        scaled = dy * scale                                                       # s * dy, (..., T, D)
    if not np.all(np.isfinite(scaled)):
        raise ValueError(f"dy scaled by xPos overflows {dy.dtype} (scale up to {scale.max():.3g}); rescale dy "
                         f"or centre the positions with scale_offset")
    return rope_backward(scaled, pos, base=base, layout="interleaved")         # R(n)^T (s * dy)


def _count(positions) -> int | None:
    """The number of positions without building them (None where ``as_positions`` raises anyway)."""
    if isinstance(positions, numbers.Integral) and not isinstance(positions, bool):
        return int(positions)
    return np.shape(positions)[0] if np.ndim(positions) == 1 else None


# --------------------------------------------------------------------------- the scheme the layer runs

class XPos(Scheme):
    """xPos (Sun et al. 2022): interleaved RoPE with the query at position i scaled by zeta^(i/g), the key
    at position j by zeta^(-j/g).

    The scales multiply to zeta^((i - j)/g) in every score, so attention depends on i - j only and
    decays with distance for keys before the query (it grows for keys after it: xPos is causal).
    ``scale_base`` is g (512 in torchscale).
    """

    name = "xpos"
    seams = ("rotate",)
    sign_convention = (r"queries scaled by $\zeta^{+i/\gamma}$, keys by $\zeta^{-j/\gamma}$ ($\gamma$ = "
                       r"`scale_base`): the score carries $\zeta^{(i - j)/\gamma}$, a decay only for $j "
                       r"\le i$ (the proofs write $n$ for the query, $m$ for the key)",
                       r"Sun et al. 2022; torchscale `XPOS`")

    def __init__(self, *, base: float = 10000.0, scale_base: float = 512):
        self.base = check_float(base, "base", positive=True)
        self.scale_base = check_float(scale_base, "scale_base", positive=True)

    def rotate_q(self, q, positions, *, seq_len, ops=None):
        """``ops``: ``None`` runs this module's ``apply_xpos`` and ``apply_xpos_backward``; the fast
        layer passes ``minipos.fast.xpos``, which has the same names (as for the other three)."""
        apply = apply_xpos if ops is None else ops.apply_xpos
        return apply(q, positions, base=self.base, scale_base=self.scale_base)

    def rotate_k(self, k, positions, *, seq_len, ops=None):
        apply = apply_xpos if ops is None else ops.apply_xpos
        return apply(k, positions, base=self.base, scale_base=self.scale_base, downscale=True)

    def rotate_q_backward(self, dq, positions, *, seq_len, ops=None):
        backward = apply_xpos_backward if ops is None else ops.apply_xpos_backward
        return backward(dq, positions, base=self.base, scale_base=self.scale_base)

    def rotate_k_backward(self, dk, positions, *, seq_len, ops=None):
        backward = apply_xpos_backward if ops is None else ops.apply_xpos_backward
        return backward(dk, positions, base=self.base, scale_base=self.scale_base, downscale=True)

    def settings(self):
        return (("base", self.base), ("scale_base", self.scale_base))

    def __repr__(self) -> str:
        return f"XPos(scale_base={self.scale_base})"
