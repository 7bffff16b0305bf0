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
  float64 and the result is cast to ``x``'s dtype. ``zeta_0^(n/g)`` leaves the float32 range
  near ``|n|/g ~ 70`` (float64: ~ 566); such positions raise here instead of giving inf/0
  (and NaN scores). Centring with ``scale_offset`` halves the exponents.
- The paper also uses blockwise causal attention at inference; that belongs to the attention
  mask, not to this module.
"""

from __future__ import annotations

import numpy as np

from ._checks import as_float_array, as_positions, check_even_int, check_float, check_int, check_ndim
from .rope import apply_rope

__all__ = ["xpos_zeta", "xpos_scale", "apply_xpos"]


def xpos_zeta(dim: int) -> np.ndarray:
    """The per-pair ratios ``zeta_i = (2i + 0.4 D) / (1.4 D)``, float64 ``(D/2,)``, all in (0, 1)."""
    dim = check_even_int(dim, "dim")
    return (np.arange(0, dim, 2, dtype=np.float64) + 0.4 * dim) / (1.4 * dim)  # (2i/D + 0.4) / 1.4


def xpos_scale(positions, dim: int, *, scale_base: float = 512) -> np.ndarray:
    """The query scales ``zeta_i^(n/g)``, float64 ``(T, D/2)``, g = ``scale_base``; keys use 1 / it.

    positions: an int T (meaning ``arange(T)``) or integer exponents ``n`` ``(T,)``, negative
    allowed (torchscale's centred exponents are negative for the first half). dim: even head
    dim D. scale_base: g > 0.
    """
    pos = as_positions(positions, "positions", allow_negative=True)                   # (T,)
    zeta = xpos_zeta(dim)                                                              # (D/2,)
    g = check_float(scale_base, "scale_base", positive=True)
    with np.errstate(over="ignore", under="ignore"):                                  # checked just below
        scale = zeta[None, :] ** (pos[:, None].astype(np.float64) / g)  # (T, D/2): zeta_i^(n/g)
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise ValueError("positions are too far from 0 for the xPos scale in float64 (zeta^(n/g) over- or "
                         "underflows); centre them (apply_xpos's scale_offset)")
    return scale


def apply_xpos(x, positions, *, base: float = 10000.0, scale_base: float = 512, downscale: bool = False,
               scale_offset: int = 0) -> np.ndarray:
    """Rotate ``x`` as interleaved RoPE and scale pair i by ``zeta_i^(+-(n - scale_offset)/g)``.

    x: ``(..., T, D)``, D even, e.g. q or k ``(B, H, T, D)``. positions: ``(T,)`` integers or an
    int T meaning ``arange(T)``. downscale: False for queries (``zeta^(+n/g)``), True for keys
    (``zeta^(-n/g)``). scale_offset: subtracted from the positions in the scale exponent only;
    ``(S + 1) // 2`` with S = cache length + T reproduces torchscale (module docstring).
    Returns ``(..., T, D)`` in x's floating dtype.
    """
    x = as_float_array(x, "x")
    check_ndim(x, "x", 2, "(..., T, D)")
    if not isinstance(downscale, bool):
        raise TypeError(f"downscale must be a bool, got {type(downscale).__name__} {downscale!r}")
    D = x.shape[-1]
    rotated = apply_rope(x, positions, base=base, layout="interleaved")         # (..., T, D): R(n) x
    pos = as_positions(positions, "positions", allow_negative=True)             # (T,)
    exponent = pos - check_int(scale_offset, "scale_offset")
    with np.errstate(over="ignore", under="ignore"):                             # checked just below
        scale = xpos_scale(-exponent if downscale else exponent, D, scale_base=scale_base)  # (T, D/2)
        scale = np.repeat(scale, 2, axis=-1).astype(x.dtype)                     # (T, D), duplicated
    if not np.all(np.isfinite(scale) & (scale > 0)):
        raise ValueError(f"positions are too far from scale_offset for the xPos scale in {x.dtype} "
                         f"(zeta^(n/g) over- or underflows); centre them with scale_offset")
    return rotated * scale                                                      # zeta^(+-n/g) R(n) x
