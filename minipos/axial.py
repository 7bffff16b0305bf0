r"""2-D (axial) RoPE for vision towers: each patch turns some pairs by its row, the others by its column (MiniMax M3's
tower: a third axis, the frame).

Sources: Heo, Park, Han, Yun 2024, "Rotary Position Embedding for Vision Transformer", arXiv:2403.13298
(§3.2, "axial frequency"); the code of the vision towers minipos matches, transformers 5.24's
``PixtralVisionRotaryEmbedding`` (``compute_axial_rope_parameters``, ``recomposition_frequencies``) with
``apply_rotary_pos_emb``, ``Gemma4VisionRotaryEmbedding`` with ``apply_multidimensional_rope``, and
``Llama4VisionRotaryEmbedding._compute_freqs_ci`` with ``vision_apply_rotary_emb``, and
``Qwen2VLVisionRotaryEmbedding`` (``compute_axial_rope_parameters``, ``recomposition_frequencies``; Qwen2.5-VL's and
Qwen3-VL's are the same) with ``apply_rotary_pos_emb_vision``, ``Kimi_K25VisionRotaryEmbedding`` likewise,
``MiniMaxM3VLVisionRotaryEmbedding`` with its ``apply_rotary_pos_emb_vision`` (3-D), their
positions from ``get_vision_position_ids``
(``transformers/vision_utils.py``). The SAM family's ``Sam3ViTRotaryEmbedding`` (with ``rotate_pairwise``; SAM 2's,
EdgeTAM's and SAM 3 tracker's ``*VideoVisionRotaryEmbedding`` in their memory attention, Inkling 2's vision rotary) is
the ``llama4`` layout: ``cat([freq_x, freq_y]).repeat_interleave(2)``, columns first, the same f_i for both axes.

The rotation. A patch at row r and column c (``positions`` ``(2, T)``: rows, then columns) rotates
pair i, the features ``(a_i, b_i)``, by the angle ``p_{s(i)} ω_i``, where ``s(i)`` is 0 (row) or
1 (column): Eq. 15 of RoFormer, one 2x2 block per pair,

    y_a = x_a cos(p_{s(i)} ω_i) - x_b sin(p_{s(i)} ω_i),   y_b = x_b cos(…) + x_a sin(…)

The layouts differ in which features pair, which axis owns a pair and which frequency it has
(D the head dim, a multiple of 4, or for Pixtral any even D, the rows then taking ceil(D/4) pairs;
q = D/4 pairs per axis; θ_j = base^(-2j/D); f_j = base^(-4j/D),
the frequencies of a D/2-dim RoPE):

    layout    pairs (a_i, b_i), i < q, then i >= q           axis      ω_i, i < q, then i >= q
    pixtral   (i, i + D/2)           (rotate_half over D)      row, col  θ_{2i}, then θ_{2(i-q)+1}
    gemma4    (i, i + q), then       (rotate_half on           col, row  f_i, then f_{i-q}
              (D/2 + i - q, D/2 + i)  each half of the head)
    llama4    (2i, 2i + 1)           (complex pairs)           col, row  f_i, then f_{i-q}
    qwen      (i, i + D/2)           (rotate_half over D)      row, col  f_i, then f_{i-q}
    kimi      (i, i + D/2)           (rotate_half over D)      col for even i, row for odd i: f_{i//2}
    minimax_m3  (i, i + 3F), i < 3F  (rotate_half over 6F)     frame, row, col by thirds: φ_{i mod F}

MiniMax M3's tower (HF ``MiniMaxM3VLVisionRotaryEmbedding``) is 3-D: ``positions`` ``(3, T)`` (frames, rows, then
columns, HF's THW order), F = (D // 3) // 2 frequencies per axis, φ_j = base^(-j/F) (a 2F-dim RoPE's), the same for
each axis. Pair i, features (i, i + 3F), turns by the frame for i < F, the row for F <= i < 2F, the column for
2F <= i < 3F, all at φ_{i mod F} (HF ``cat([freq, freq])`` of the flattened (T, 3, F) angles); the last D - 6F
features pass through unrotated (HF ``q[..., rot_dim:]``: 2 of the default head dim 80). D is any integer >= 6.

Pixtral splits RoPE's D/2 frequencies between the axes alternately (rows the even ones, columns the
odd ones, HF ``cat([inv_freq[0::2], inv_freq[1::2]])``), in the half layout over the whole head.
Gemma 4 cuts the head into two halves and runs a D/2-dim half-layout RoPE on each, the first half
by the column (its processor's ``position_ids[..., 0]``, the x of ``meshgrid(..., indexing="xy")``),
the second by the row. Llama 4 uses the same frequencies as Gemma 4 in the interleaved (complex)
layout, columns first, and counts positions from 1: its class token, last, gets angle 0
(``axial_positions(h, w, start=1, class_token=True)``). The Qwen towers (Qwen2-VL, Qwen2.5-VL, Qwen3-VL) give
both axes the same f_i in the half layout over the whole head, rows first (HF ``cat([freq_h, freq_w])``, then
``cat([freq_hw, freq_hw])``); their patches come in ``merge_size`` x ``merge_size`` blocks, not row by row
(``merge_positions``), and Qwen2.5-VL's window layers attend within squares of patches (``axial_window_mask``).
Kimi K2.5's tower (HF ``Kimi_K25VisionRotaryEmbedding``) takes the same f_i and the same pairs (i, i + D/2) but
hands the pairs to the axes by turns, the column first: pair 2j by the column at f_j, pair 2j + 1 by the row at f_j
(HF ``freq.transpose(1, 2).flip(-1).flatten(1)``: for each frequency the column's angle, then the row's).

Scaled coordinates. ``position_scale`` s turns pair i by ``s p_{s(i)} ω_i`` instead: SAM 3's global ViT layers
hold the grid's coordinates times ``window_size / grid_width`` (HF ``Sam3ViTLayer.precompute_positions``), so that
the whole image spans the coordinates a window spans; those positions are not integers (1/3, 2/3, ...). minipos
keeps positions integers (the grid's) and takes the fraction as s; the angle is the same real number. A per-axis
rotation by s p ω is still B(s a ω)^T B(s b ω) = B(s (b - a) ω): relative in each axis, the offsets scaled by s.

A class token turned by learned angles (MLCD's ``MLCDVisionModel``). MLCD puts a class token first in the sequence and
turns it by no position: pair i of the class token turns by a learned angle θ_i (HF ``class_pos_emb``, ``(1, D/2)``,
whose ``cat([class_pos_emb, class_pos_emb])`` has its cos and sin prepended to the patches'), in the ``"qwen"`` layout
the features (i, i + D/2). ``class_angles`` θ, one per pair of ``axial_pairs`` (``(D/2,)``; ``"minimax_m3"``:
``(3F,)``), turns token 0 of the call instead of its position; its column of ``positions`` must be 0 (0, 0), a
placeholder (``axial_positions(h, w, class_token="first")``), and any other column is refused. θ is not scaled by
``position_scale``. d/dθ of the 2x2 rotation R(θ) is R(θ + π/2), so dL/dθ_i = Σ dy_0 · R(θ_i + π/2) x_0 over the
class token's pair i (``class_angles_backward``). The class token's scores with a patch are not relative in anything:
q^T R(θ)^T R(r, c) k.

Why it is relative in each axis: every block is a rotation, B(a)^T B(b) = B(b - a), so

    <R(r, c) q, R(r', c') k> = q^T R(r' - r, c' - c) k,

a function of the row offset and the column offset separately (``proofs.axial``), not of the
distance between the patches in the flattened sequence.

Conventions: positions ``(2, T)`` integers (negative allowed), a ``(T,)`` array meaning row =
column (``"minimax_m3"``: ``(3, T)``, frames, rows, then columns, a ``(T,)`` array meaning all three equal); x
``(..., T, D)``; frequencies and angles in float64 (HF: float32), outputs in x's dtype.
The scheme class the layer runs, ``AxialRotary``, is at the bottom; the layer takes its positions
``(2, T)`` (``(3, T)`` for ``"minimax_m3"``; ``causal=False`` for a vision tower); ``AxialRotary(class_angles=True)`` learns MLCD's
class angles (``class_pos_emb``) for token 0. Docs page: "2-D (axial) RoPE".
"""

from __future__ import annotations

import numpy as np

from ._checks import (as_float_array, as_positions, check_bool, check_choice, check_float, check_int, check_ndim,
                      check_positive_int)
from .rope import check_angles, overflow_raises, rope_inv_freq
from .seams import Scheme

__all__ = ["AXIAL_LAYOUTS", "axial_pairs", "axial_angles", "apply_axial_rope", "apply_axial_rope_backward",
           "class_angles_backward", "axial_positions", "merge_positions", "axial_window_mask", "AxialRotary"]

AXIAL_LAYOUTS = ("pixtral", "gemma4", "llama4", "qwen", "kimi", "minimax_m3")
ROW, COLUMN = 0, 1                                                     # of positions (2, T); minimax_m3's (3, T): 1, 2


def _streams(layout: str) -> int:
    """How many rows ``positions`` has in ``layout``: 3 (frames, rows, columns) for ``"minimax_m3"``, else 2."""
    return 3 if layout == "minimax_m3" else 2


def _check_dim(head_dim, layout: str, name: str = "head_dim") -> int:
    """D: a multiple of 4 (D/4 pairs per axis); Pixtral's layout also takes D = 2 mod 4, as HF's code does
    (``chunk(2)`` of the D/2 frequencies gives the rows the one more: ceil(D/4) pairs, the columns floor(D/4))."""
    D = check_positive_int(head_dim, name)
    if layout == "minimax_m3":
        if D < 6:
            raise ValueError(f"{name} must be at least 6 for 3-D RoPE in the 'minimax_m3' layout (F = (D // 3) // 2 "
                             f">= 1 frequency per axis), got {D}")
        return D
    if layout == "pixtral" and D % 2 == 0:
        return D
    if D % 4:
        raise ValueError(f"{name} must be a multiple of 4 for 2-D RoPE in the {layout!r} layout (D/4 pairs per axis; "
                         f"'pixtral' also takes an even D), got {D}")
    return D


def axial_pairs(head_dim: int, *, base: float = 10000.0, layout: str = "pixtral"):
    """``(a, b, axis, omega)``, each ``(D/2,)``: pair i is features ``(a[i], b[i])``, turned by
    ``positions[axis[i]] * omega[i]`` (axis 0 the row, 1 the column). Int64, int64, int64, float64.
    ``"minimax_m3"``: each ``(3F,)``, F = (D // 3) // 2, axis 0 the frame, 1 the row, 2 the column; the features
    6F .. D - 1 are in no pair (they pass through)."""
    check_choice(layout, "layout", AXIAL_LAYOUTS)
    D = _check_dim(head_dim, layout)
    base = check_float(base, "base", positive=True)
    if layout == "minimax_m3":                                         # half layout over 6F, frame, row, column
        F = (D // 3) // 2
        phi = rope_inv_freq(2 * F, base=base)                          # φ_j = base^(-2j/(2F)) = base^(-j/F), (F,)
        a = np.arange(3 * F)
        return a, a + 3 * F, np.repeat([0, 1, 2], F), np.tile(phi, 3)
    q, i = D // 4, np.arange(D // 4)
    if layout == "pixtral":                                            # half layout over D, θ alternating
        theta = rope_inv_freq(D, base=base)                            # θ_j = base^(-2j/D), (D/2,)
        a, rows = np.arange(D // 2), len(theta[0::2])                  # rows: ceil(D/4) pairs
        return (a, a + D // 2, np.repeat([ROW, COLUMN], [rows, D // 2 - rows]),
                np.concatenate([theta[0::2], theta[1::2]]))
    f = rope_inv_freq(D // 2, base=base)                               # f_j = base^(-2j/(D/2)), (D/4,)
    if layout == "qwen":                                               # half layout over D, rows first, f for both
        a = np.arange(D // 2)
        return a, a + D // 2, np.repeat([ROW, COLUMN], q), np.concatenate([f, f])
    if layout == "kimi":                                               # half layout over D, column and row by turns
        a = np.arange(D // 2)
        return a, a + D // 2, np.tile([COLUMN, ROW], q), np.repeat(f, 2)
    omega, axis = np.concatenate([f, f]), np.repeat([COLUMN, ROW], q)  # columns first
    if layout == "gemma4":                                             # each half a D/2-dim half-layout RoPE
        a = np.concatenate([i, D // 2 + i])
        return a, a + q, axis, omega
    a = 2 * np.arange(D // 2)                                          # llama4: complex pairs (2i, 2i + 1)
    return a, a + 1, axis, omega


def _stream_positions(positions, T=None, streams=2) -> np.ndarray:
    pos = as_positions(positions, "positions", allow_negative=True, ndim=None)
    if pos.ndim == 1:
        pos = np.broadcast_to(pos, (streams, pos.shape[0]))             # row = column (= frame)
    if pos.ndim != 2 or pos.shape[0] != streams or (T is not None and pos.shape[1] != T):
        want = f"({streams}, T)" if T is None else f"({streams}, {T}) or ({T},)"
        what = "rows, then columns" if streams == 2 else "frames, rows, then columns"
        raise ValueError(f"positions must have shape {want} ({what}), got {pos.shape}")
    return pos


def _class_angles(class_angles, pairs: int) -> np.ndarray:
    """θ ``(pairs,)`` float64, finite: one angle per pair of ``axial_pairs``."""
    theta = as_float_array(class_angles, "class_angles").astype(np.float64)
    if theta.shape != (pairs,):
        raise ValueError(f"class_angles must have shape ({pairs},), one angle per rotated pair of the head, got "
                         f"{theta.shape}")
    return theta


def axial_angles(positions, head_dim: int, *, base: float = 10000.0, layout: str = "pixtral",
                 position_scale: float = 1.0, class_angles=None) -> np.ndarray:
    """The angles ``position_scale * positions[axis[i], t] * omega[i]`` of ``axial_pairs``, float64 ``(T, D/2)``
    (``"minimax_m3"``: ``(T, 3F)``).

    positions: integers ``(2, T)`` (rows, then columns), or ``(T,)`` meaning row = column (floats raise: scaled
    coordinates are integer positions and a ``position_scale`` > 0, SAM 3's ``window_size / grid_width``);
    ``"minimax_m3"``: ``(3, T)``, frames, rows, then columns. class_angles: ``None``, or θ ``(D/2,)`` (``(3F,)``), the
    angles of token 0 (MLCD's class token) instead of its position, whose column must then be all 0 (a
    placeholder; any other is refused).
    """
    pos = _stream_positions(positions, streams=_streams(layout))     # (2, T) or (3, T)
    s = check_float(position_scale, "position_scale", positive=True)
    _, _, axis, omega = axial_pairs(head_dim, base=base, layout=layout)
    check_angles(pos * s, omega, 1.0)
    angles = (s * pos[axis].T.astype(np.float64)) * omega              # (T, D/2): (s p_{s(i)}) ω_i, HF's order
    if class_angles is None:
        return angles
    theta = _class_angles(class_angles, len(omega))                    # (D/2,)
    if pos.shape[1] and np.any(pos[:, 0]):
        raise ValueError(f"positions[:, 0] must be all 0 with class_angles: token 0 is the class token, turned by "
                         f"its learned angles, not by a position (axial_positions(h, w, class_token='first')), got "
                         f"{pos[:, 0].tolist()}")
    angles[:1] = theta                                                 # token 0: θ_i (none if T = 0)
    return angles


def _check_head(D: int, layout: str, name: str) -> None:
    if D < 6 if layout == "minimax_m3" else D % (2 if layout == "pixtral" else 4) or D < 2:
        raise ValueError(f"{name} must have a head dim D (last axis) that is a multiple of 4 for 2-D RoPE in the "
                         f"{layout!r} layout ('pixtral': even; 'minimax_m3': at least 6), got {D}")


def _rotate_pairs(x, a, b, cos, sin):
    """``x`` with each pair ``(x_a, x_b)`` turned by the angle whose cos and sin are given (broadcast over the
    pairs' axis); features in no pair pass through."""
    y = x.copy()
    y[..., a] = x[..., a] * cos - x[..., b] * sin                     # [[cos, -sin],
    y[..., b] = x[..., b] * cos + x[..., a] * sin                     #  [sin,  cos]] on (x_a, x_b)
    return y


def _turn(x, positions, base, layout, name, sign, scale=1.0, class_angles=None):
    """Each pair of ``x`` turned by ``sign`` times its angle (``sign = -1``: the transpose)."""
    x = as_float_array(x, name)
    check_ndim(x, name, 2, "(..., T, D)")
    *_, T, D = x.shape
    _check_head(D, layout, name)
    a, b, _, _ = axial_pairs(D, base=base, layout=layout)
    angles = axial_angles(_stream_positions(positions, T, _streams(layout)), D, base=base, layout=layout,
                          position_scale=scale, class_angles=class_angles)          # (T, D/2)
    cos, sin = np.cos(angles).astype(x.dtype), sign * np.sin(angles).astype(x.dtype)
    with overflow_raises(x.dtype, name):
        return _rotate_pairs(x, a, b, cos, sin)


def apply_axial_rope(x, positions, *, base: float = 10000.0, layout: str = "pixtral",
                     position_scale: float = 1.0, class_angles=None) -> np.ndarray:
    """Rotate ``x`` ``(..., T, D)`` by 2-D RoPE at ``positions`` ``(2, T)`` (rows, then columns), integers.

    layout: "pixtral", "gemma4", "llama4", "qwen", "kimi" or "minimax_m3" (the table of the module docstring); D a
    multiple of 4 (even for "pixtral"; "minimax_m3": any D >= 6, positions ``(3, T)``, frames, rows, then columns, the
    features past 6F unrotated). position_scale: s > 0, each angle ``s p ω`` (SAM 3's global layers; module docstring).
    class_angles: ``None``, or θ ``(D/2,)`` (one per pair of ``axial_pairs``; ``"minimax_m3"``: ``(3F,)``) turning
    token 0, MLCD's class token, whose positions column must be all 0 (module docstring). Returns ``(..., T, D)`` in
    x's floating dtype.
    """
    return _turn(x, positions, base, check_choice(layout, "layout", AXIAL_LAYOUTS), "x", 1.0, position_scale,
                 class_angles)


def apply_axial_rope_backward(dy, positions, *, base: float = 10000.0, layout: str = "pixtral",
                              position_scale: float = 1.0, class_angles=None) -> np.ndarray:
    """The gradient of ``apply_axial_rope`` for ``dy`` ``(..., T, D)``: ``R^T dy``, each pair turned back (token 0 by
    ``-class_angles`` when they are given). The class angles' own gradient: ``class_angles_backward``."""
    return _turn(dy, positions, base, check_choice(layout, "layout", AXIAL_LAYOUTS), "dy", -1.0, position_scale,
                 class_angles)


def class_angles_backward(x, dy, class_angles, *, layout: str = "pixtral") -> np.ndarray:
    """The gradient of ``class_angles`` θ for ``y = apply_axial_rope(x, positions, class_angles=θ, layout=layout)``
    and ``dy``, both ``(..., T, D)``: ``(D/2,)`` (``"minimax_m3"``: ``(3F,)``) in their dtype, summed over the
    leading dims. Only token 0 turns by θ; d/dθ of a 2x2 rotation R(θ) is R(θ + π/2), so pair i gives

        dθ_i = Σ (dy_a, dy_b)_0 · R(θ_i + π/2) (x_a, x_b)_0.
    """
    layout = check_choice(layout, "layout", AXIAL_LAYOUTS)
    x, dy = as_float_array(x, "x"), as_float_array(dy, "dy")
    check_ndim(x, "x", 2, "(..., T, D)")
    if dy.shape != x.shape:
        raise ValueError(f"dy must have the shape of x {x.shape}, got {dy.shape}")
    _check_head(x.shape[-1], layout, "x")
    a, b, _, _ = axial_pairs(x.shape[-1], layout=layout)
    theta = _class_angles(class_angles, len(a))                        # (D/2,)
    dtype = np.result_type(x, dy)
    if not x.shape[-2]:                                                # no token 0: y does not depend on θ
        return np.zeros(len(a), dtype)
    with overflow_raises(dtype, "x"):
        turned = _rotate_pairs(x[..., 0, :], a, b, np.cos(theta + np.pi / 2), np.sin(theta + np.pi / 2))
        d = dy[..., 0, a] * turned[..., a] + dy[..., 0, b] * turned[..., b]   # (..., D/2)
        return d.reshape(-1, len(a)).sum(axis=0).astype(dtype)                 # (D/2,)


def axial_positions(height: int, width: int, *, start: int = 0, class_token: bool | str = False) -> np.ndarray:
    """The positions ``(2, T)`` of a ``height`` x ``width`` grid of patches, row-major (rows, then columns).

    ``start``: the first row and column (0: Pixtral's ``meshgrid(arange(h), arange(w), indexing="ij")``
    and Gemma 4's; 1: Llama 4's ``img_idx // idx + 1``, ``img_idx % idx + 1``). ``class_token``: one
    more token at (0, 0): ``True`` or ``"last"``, last, i.e. unrotated when ``start = 1`` (Llama 4's
    ``ID_CLS_TOKEN``); ``"first"``, first, the placeholder column of a class token turned by learned angles
    (MLCD: ``AxialRotary(class_angles=True)``). T = height * width (+ 1). Int64.
    """
    h = check_positive_int(height, "height")
    w = check_positive_int(width, "width")
    start = check_int(start, "start")
    if isinstance(class_token, str):                                              # else a bool (TypeError)
        check_choice(class_token, "class_token", ("first", "last"))
    else:
        check_bool(class_token, "class_token")
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")          # (h, w) each
    pos = start + np.stack([rows.reshape(-1), cols.reshape(-1)])                  # (2, h w)
    cls = np.zeros((2, 1), np.int64)                                              # the class token's (0, 0)
    if class_token == "first":
        pos = np.concatenate([cls, pos], axis=1)                                  # (2, 1 + h w)
    elif class_token:
        pos = np.concatenate([pos, cls], axis=1)                                  # (2, h w + 1)
    return pos.astype(np.int64)


def merge_positions(height: int, width: int, merge_size: int, *, window: int | None = None) -> np.ndarray:
    """The positions ``(2, T)`` of a ``height`` x ``width`` grid of patches in the order the Qwen vision towers
    hold them (rows, then columns; T = height * width; int64).

    The patches come in ``merge_size`` x ``merge_size`` blocks (the patch merger's), the blocks row-major, the
    patches of a block row-major: HF ``get_vision_position_ids`` (``meshgrid(..., indexing="ij")``, reshaped to
    ``(h / m, m, w / m, m)`` and ``transpose(1, 2)``). With ``merge_size`` 2 and a 2 x 4 grid the rows are
    ``[0 0 1 1 0 0 1 1]`` and the columns ``[0 1 0 1 2 3 2 3]``. ``window``: Qwen2.5-VL's order (HF
    ``get_vision_window_index``), the blocks gathered into squares of ``window`` x ``window`` patches (a multiple
    of ``merge_size``: ``window_size // spatial_merge_size // patch_size * spatial_merge_size``), the squares
    row-major, the last row and column of squares cut by the grid's edge, and within a square the blocks in the
    order above. height and width must be multiples of ``merge_size``, as HF's reshape asks. One image, or one
    frame of a video (each frame repeats the positions of the first).
    """
    h, w = check_positive_int(height, "height"), check_positive_int(width, "width")
    m = check_positive_int(merge_size, "merge_size")
    if h % m or w % m:
        raise ValueError(f"height and width must be multiples of merge_size ({m}): the patches merge in {m} x {m} "
                         f"blocks, got a {h} x {w} grid")
    rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")             # (h, w) each
    blocks = lambda a: a.reshape(h // m, m, w // m, m).transpose(0, 2, 1, 3).reshape(-1)   # noqa: E731
    pos = np.stack([blocks(rows), blocks(cols)]).astype(np.int64)                  # (2, h w), block-major
    if window is None:
        return pos
    W = check_positive_int(window, "window")
    if W % m:
        raise ValueError(f"window must be a multiple of merge_size ({m}): a window holds whole {m} x {m} blocks, "
                         f"got {W}")
    order = np.lexsort((pos[1] // W, pos[0] // W))                                 # stable: blocks keep their order
    return pos[:, order]


def axial_window_mask(positions, window: int) -> np.ndarray:
    """Qwen2.5-VL's window attention as a mask ``(T, T)``, ``True`` = may attend: patch i sees patch j when they
    lie in the same ``window`` x ``window`` square of the grid (``r_i // W = r_j // W`` and ``c_i // W = c_j //
    W``; the squares start at row 0 and column 0). Any order of the patches; pass it to a layer as ``mask[None]``.

    positions: integers ``(2, T)`` (rows, then columns), or ``(T,)`` meaning row = column.
    """
    W = check_positive_int(window, "window")
    pos = _stream_positions(positions)                                              # (2, T)
    square = pos // W                                                               # (2, T)
    return np.all(square[:, :, None] == square[:, None, :], axis=0)                 # (T, T)


class AxialRotary(Scheme):
    """2-D (axial) RoPE: each patch's q and k turned by its row and its column (``apply_axial_rope``).

    The layer's positions are ``(2, T)``, rows then columns (``axial_positions``; a ``(T,)`` array
    means row = column) and serve the rotate seam only; a vision tower is called with
    ``causal=False``. In the ``"minimax_m3"`` layout they are ``(3, T)``, frames, rows, then columns
    (``position_streams`` 3). base: ``rope_parameters['rope_theta']``; layout: "pixtral", "gemma4", "llama4", "qwen",
    "kimi" or "minimax_m3";
    position_scale: each angle's factor s (SAM 3's global layers: ``window_size / grid_width``).

    class_angles: ``True`` for MLCD's class token, token 0 of every call, turned by the learned ``class_pos_emb``
    ``(D/2,)`` (``"minimax_m3"``: ``(3F,)``; HF ``MLCDVisionModel.class_pos_emb[0]``, one angle per pair of
    ``axial_pairs``, drawn N(0, 1 / (D/2)) as HF does) instead of a position: its positions column must be all 0
    (``axial_positions(h, w, class_token="first")``), and a call that continues a KV cache (whose token 0 is no
    class token) is refused. ``backward`` returns its gradient as ``"scheme.class_pos_emb"``. Otherwise no learned
    parameters.
    """

    name = "axial-rope"
    seams = ("rotate",)
    position_streams = 2
    sign_convention = (r"per axis as RoPE, $q^\top R(r_j - r_i, c_j - c_i)\, k$; positions rows, then columns",
                       r"HF `PixtralVisionRotaryEmbedding`, `Gemma4VisionRotaryEmbedding`, "
                       r"`Llama4VisionRotaryEmbedding`, `Qwen2VLVisionRotaryEmbedding`, `Sam3ViTRotaryEmbedding`")

    def __init__(self, *, base: float = 10000.0, layout: str = "pixtral", position_scale: float = 1.0,
                 class_angles: bool = False):
        self.base = check_float(base, "base", positive=True)
        self.layout = check_choice(layout, "layout", AXIAL_LAYOUTS)
        self.position_streams = _streams(self.layout)                # the layer's positions (2, T) or (3, T)
        self.position_scale = check_float(position_scale, "position_scale", positive=True)
        self.class_angles = check_bool(class_angles, "class_angles")

    def bind(self, layer, rng):
        super().bind(layer, rng)
        _check_dim(self.head_dim, self.layout)
        pairs = len(axial_pairs(self.head_dim, base=self.base, layout=self.layout)[0])   # the frequencies are finite
        if self.class_angles:                                         # HF: normal(0, std=(D/2)^-1/2)
            self.class_pos_emb = (rng.standard_normal(pairs) / np.sqrt(pairs)).astype(layer.dtype)   # (D/2,)

    def parameters(self):
        return {"class_pos_emb": self.class_pos_emb} if self.class_angles else {}

    def cache_tag(self, seq_len):
        return self.base, self.layout, self.position_scale

    def _theta(self, x, seq_len):
        """The class angles of a call of ``x`` ``(B, H, T, D)``, or None; a call after cached keys is refused."""
        if not self.class_angles:
            return None
        if seq_len != x.shape[-2]:                                    # the first key is at sequence position > 0
            raise ValueError("class_angles: token 0 of a call is the class token, so the call must hold the whole "
                             f"sequence; this one continues a KV cache ({seq_len - x.shape[-2]} keys before it)")
        return self.class_pos_emb

    def _apply(self, x, positions, *, seq_len):                       # (B, H, T, D), positions (2, T)
        return apply_axial_rope(x, positions, base=self.base, layout=self.layout, position_scale=self.position_scale,
                                class_angles=self._theta(x, seq_len))

    def _apply_backward(self, dx, positions, *, seq_len):             # R^T
        return apply_axial_rope_backward(dx, positions, base=self.base, layout=self.layout,
                                         position_scale=self.position_scale, class_angles=self._theta(dx, seq_len))

    rotate_q = rotate_k = _apply
    rotate_q_backward = rotate_k_backward = _apply_backward

    def rotate_parameters_backward(self, q, dq, k, dk, positions, add):
        """``scheme.class_pos_emb``: q's and k's class token turned back by θ (R(θ)^T y, its input), then
        ``class_angles_backward``; both q and k turn by θ, so both gradients flow into it."""
        if not self.class_angles:
            return
        zero = np.zeros((self.position_streams, 1), np.int64)         # the class token's column
        for y, dy in ((q, dq), (k, dk)):
            if y is None or not y.shape[-2]:                          # shared keys, or T = 0
                continue
            x0 = apply_axial_rope_backward(y[..., :1, :], zero, base=self.base, layout=self.layout,
                                           class_angles=self.class_pos_emb)          # (B, H, 1, D)
            add("scheme.class_pos_emb", class_angles_backward(x0, dy[..., :1, :], self.class_pos_emb,
                                                              layout=self.layout))

    def settings(self):
        return (("base", self.base), ("layout", self.layout), ("position_scale", self.position_scale),
                ("class_angles", self.class_angles))

    def __repr__(self) -> str:
        scale = f", position_scale={self.position_scale:g}" if self.position_scale != 1.0 else ""
        cls = ", class_angles=True" if self.class_angles else ""
        return f"AxialRotary(layout={self.layout!r}, base={self.base:g}{scale}{cls})"
