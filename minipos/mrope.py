"""Multimodal RoPE (M-RoPE): three position streams share the frequencies of one rotation.

Source: Wang et al. 2024, "Qwen2-VL", arXiv:2409.12191, §2.1 ("Multimodal Rotary Position
Embedding"); Bai et al. 2025, "Qwen2.5-VL", arXiv:2502.13923, §2.1.3 (absolute time); the
interleaved assignment is Qwen3-VL's (HF ``Qwen3VLTextRotaryEmbedding``), the ``"hw"`` one ERNIE-4.5-VL's (HF
``Ernie4_5_VLMoeTextRotaryEmbedding``). Derivations and the
traps are on the docs page "Multimodal RoPE: Qwen2-VL and Qwen3-VL".

The rotation. Plain RoPE in the "half" layout (HF ``rotate_half``) rotates pair i = (i, i + D/2)
by the angle ``m θ_i``. M-RoPE gives each token three positions, temporal, height and width,
``positions`` ``(3, T)``, and lets stream ``s(i)`` own frequency i:

    angle[t, i] = positions[s(i), t] · θ_i,      θ_i = base^(-2i/D),  i = 0 … D/2 - 1
    y = x ⊙ [cos | cos] + rotate_half(x) ⊙ [sin | sin]                   (Eq. 34, half layout)

``mrope_section = [n_t, n_h, n_w]`` (``n_t + n_h + n_w = D/2``) says how many frequencies each
stream owns; ``mrope_streams`` gives the assignment s(i):

- split (Qwen2-VL, Qwen2.5-VL; HF ``recomposition_frequencies`` with ``split`` and ``i % 3``):
  the first n_t frequencies (the fastest) are temporal, the next n_h height, the last n_w width:
  ``[16, 24, 24]`` for D = 128.
- interleaved (Qwen3-VL): frequency i is height if ``i % 3 == 1`` and ``i < 3 n_h``, width if
  ``i % 3 == 2`` and ``i < 3 n_w``, temporal otherwise: T H W T H W … T T T T, so each stream spans
  fast and slow frequencies. ``[24, 20, 20]`` for D = 128.
- "hw" (ERNIE-4.5-VL): the first 2 n_h frequencies alternate height and width, H W H W …, the last n_t are
  temporal (n_h = n_w): HF ``inv_freq_3d`` takes the even then the odd frequencies of the first 2 n_h, and
  ``recomposition_frequencies`` stacks height's and width's back into one H W pattern, each at its own θ_i.
  ``[20, 22, 22]`` (t, h, w) for D = 128; ERNIE's config writes it ``[22, 22, 20]`` (h, w, t) and pairs
  features (2i, 2i + 1) (``layout="interleaved"``).

Partial rotary M-RoPE (``rotary_dim`` R < D, HF ``int(head_dim * partial_rotary_factor)``): the first
R features rotate with θ_i = base^(-2i/R), i < R/2, the section counts R/2 frequencies, and the last
D - R features pass through (Qwen3.5: interleaved, R = D/4, ``[11, 11, 10]``; GLM-4V: split, R = D/2,
``[8, 12, 12]``). GLM-4V also pairs features (2i, 2i + 1) (``layout="interleaved"``: HF
``cos.repeat_interleave(2)`` with ``rotate_half_llm``) where the Qwen models pair (i, i + R/2).

Each stream's share of the score is a plain RoPE score on its own pairs, so ⟨R(p_q) q, R(p_k) k⟩
depends on the three differences ``p_q - p_k`` only; with three equal streams (text tokens) it is
RoPE itself.

The positions (HF ``get_rope_index`` of Qwen2-VL, 2.5-VL, 3-VL in transformers 5.24):
``mrope_positions``. A text token at sequence index n after the last block has all three positions
equal to ``c + (n - start of its text run)``, where c (``current_pos``) starts at 0, grows by each
text run's length and, after a vision block of grid (t, h, w) merged by ``spatial_merge_size`` m,
by ``max(h, w) // m``. The block's tokens, in (t, h, w) row-major order, get
``(c + floor(τ · interval), c + row, c + column)``. Decoding continues at
``cache_length + delta`` in all three streams, ``delta = max(positions) + 1 - T`` (``rope_deltas``):
``mrope_decode_positions``.

The scheme class the layer runs, ``MRotary``, is at the bottom of this module.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (POSITION_LIMIT, as_float_array, as_positions, check_alloc, check_choice,
                      check_even_int, check_float, check_int, check_ndim)
from .rope import (LAYOUTS, as_inv_freq, check_angles, check_rotary_dim, overflow_raises, rope_inv_freq,
                   rotate_every_two, rotate_half)
from .seams import Scheme

__all__ = ["STREAMS", "INTERLEAVINGS", "check_interleaved", "mrope_streams", "mrope_angles", "apply_mrope",
           "apply_mrope_backward", "mrope_positions", "mrope_decode_positions", "MRotary"]

STREAMS = ("temporal", "height", "width")
TEXT, IMAGE, VIDEO = 0, 1, 2  # HF mm_token_type_ids


def check_section(mrope_section, name: str = "mrope_section") -> tuple:
    if isinstance(mrope_section, (str, bytes)) or not hasattr(mrope_section, "__len__") or len(mrope_section) != 3:
        raise ValueError(f"{name} must hold three counts [temporal, height, width], got {mrope_section!r}")
    return tuple(check_int(n, f"{name}[{s}]", minimum=0) for s, n in enumerate(mrope_section))


INTERLEAVINGS = (False, True, "hw")
"""``interleaved``: split (Qwen2-VL), Qwen3-VL's T H W pattern, or ERNIE-4.5-VL's H W pattern then T."""


def check_interleaved(interleaved, name: str = "interleaved"):
    """``interleaved`` as one of ``INTERLEAVINGS`` (a NumPy bool as a bool)."""
    if isinstance(interleaved, (bool, np.bool_)):
        return bool(interleaved)
    if isinstance(interleaved, str) and interleaved == "hw":
        return "hw"
    raise TypeError(f"{name} must be False (split), True (Qwen3-VL's T H W pattern) or 'hw' (ERNIE-4.5-VL's H W "
                    f"pattern, then T), got {interleaved!r}")


def mrope_streams(mrope_section: Sequence[int], *, interleaved: bool | str = False) -> np.ndarray:
    """Which stream owns each frequency: int64 ``(D/2,)`` of 0 (temporal), 1 (height), 2 (width).

    mrope_section: ``[n_t, n_h, n_w]``, the number of frequencies of each stream (D/2 in all).
    ``interleaved=False``: ``[0]*n_t + [1]*n_h + [2]*n_w`` (Qwen2-VL). ``True``: Qwen3-VL's
    T H W T H W … pattern, height at ``i % 3 == 1, i < 3 n_h``, width at ``i % 3 == 2, i < 3 n_w``,
    temporal elsewhere; a section for which that pattern does not give each stream its count
    (a temporal count below the others') raises ``ValueError``. ``"hw"``: ERNIE-4.5-VL's H W H W … on the
    first ``2 n_h`` frequencies, then ``n_t`` temporal; it needs ``n_h == n_w`` (HF stacks the two).
    """
    n_t, n_h, n_w = section = check_section(mrope_section)
    half = n_t + n_h + n_w
    if half < 1:
        raise ValueError(f"mrope_section must count D/2 >= 1 frequencies, got {list(section)}")
    check_alloc((half,), np.int64, f"mrope_section {list(section)} (D/2 = {half} frequencies)", copies=3)
    interleaved = check_interleaved(interleaved)
    if interleaved is False:
        return np.repeat(np.arange(3), section)                            # (D/2,): 0…0 1…1 2…2
    i = np.arange(half)
    if interleaved == "hw":
        if n_h != n_w:
            raise ValueError(f"mrope_section {list(section)}: the 'hw' interleaving alternates height and width, so "
                             f"their counts must be equal, got n_h = {n_h}, n_w = {n_w}")
        return np.where(i < 2 * n_h, 1 + i % 2, 0)                        # H W H W … T T T
    streams = np.zeros(half, dtype=np.int64)                               # temporal by default
    streams[(i % 3 == 1) & (i < 3 * n_h)] = 1                              # HF: slice(1, 3 n_h, 3)
    streams[(i % 3 == 2) & (i < 3 * n_w)] = 2                              # HF: slice(2, 3 n_w, 3)
    counts = np.bincount(streams, minlength=3)
    if tuple(counts) != section:
        raise ValueError(f"interleaved mrope_section {list(section)} gives the streams {list(counts)} frequencies: "
                         "the temporal count must be at least the height and width counts")
    return streams


def stream_positions(positions, T: int | None = None, *, allow_negative: bool = True, streams: int = 3) -> np.ndarray:
    """Integer positions ``(streams, T)``; a ``(T,)`` array means equal streams (text). ``streams``: 3 for
    M-RoPE (temporal, height, width), 2 for a vision tower's 2-D RoPE (rows, columns)."""
    pos = as_positions(positions, "positions", allow_negative=allow_negative, ndim=None)
    if pos.ndim == 1:
        pos = np.broadcast_to(pos, (streams, pos.shape[0]))                 # text: t = h = w
    if pos.ndim != 2 or pos.shape[0] != streams or (T is not None and pos.shape[1] != T):
        want = f"({streams}, T)" if T is None else f"({streams}, {T}) or ({T},)"
        rows = "temporal, height, width rows" if streams == 3 else "rows, then columns" if streams == 2 else "streams"
        raise ValueError(f"positions must have shape {want} ({rows}), got {pos.shape}")
    return pos


def mrope_angles(positions: ArrayLike, inv_freq: ArrayLike, mrope_section: Sequence[int], *,
                 interleaved: bool | str = False) -> np.ndarray:
    """The angles ``positions[s(i), t] · θ_i``, float64 ``(T, D/2)``.

    positions: integers ``(3, T)`` (temporal, height, width), or ``(T,)`` for three equal streams.
    inv_freq: ``(D/2,)``. mrope_section, interleaved: as ``mrope_streams``; the section must
    count ``len(inv_freq)`` frequencies.
    """
    pos = stream_positions(positions)                                       # (3, T)
    inv_freq = as_inv_freq(inv_freq)                                       # (D/2,)
    section = check_section(mrope_section)
    if sum(section) != len(inv_freq):                                      # before building (D/2,) streams
        raise ValueError(f"mrope_section {list(section)} counts {sum(section)} frequencies but inv_freq has "
                         f"{len(inv_freq)} (D/2)")
    streams = mrope_streams(section, interleaved=interleaved)              # (D/2,)
    check_angles(pos, inv_freq, 1.0)
    own = pos[streams].T.astype(np.float64)                                 # (T, D/2): position owning pair i
    return own * inv_freq                                                   # (T, D/2): p_{s(i)} θ_i


def cos_sin(x, positions, mrope_section, base, inv_freq, interleaved, attention_factor, name, rotary_dim=None,
            layout="half"):
    """``(x, cos, sin, R, rot)``: x checked ``(..., T, D)``; cos and sin ``(T, R)`` in ``layout`` (times the
    factor) for the first R = ``rotary_dim`` features (default D); ``rot`` the layout's 90° rotation."""
    x = as_float_array(x, name)
    check_ndim(x, name, 2, "(..., T, D)")
    *_, T, D = x.shape
    check_choice(layout, "layout", LAYOUTS)
    if rotary_dim is None and (D % 2 or D < 2):
        raise ValueError(f"{name} must have an even head dim D >= 2 (last axis) for M-RoPE, got D = {D}")
    R = check_rotary_dim(rotary_dim, D, name)
    if inv_freq is None:
        inv_freq = rope_inv_freq(R, base=base)                             # θ_i = base^(-2i/R)
    elif base != 10000.0:
        raise ValueError("pass either base or inv_freq, not both (inv_freq already fixes the frequencies)")
    inv_freq = as_inv_freq(inv_freq)
    if len(inv_freq) != R // 2:
        label = "D/2" if rotary_dim is None else "rotary_dim/2"
        raise ValueError(f"inv_freq must have length {label} = {R // 2}, got length {len(inv_freq)}")
    factor = check_float(attention_factor, "attention_factor", positive=True)
    angles = mrope_angles(stream_positions(positions, T), inv_freq, mrope_section, interleaved=interleaved)
    cos, sin = factor * np.cos(angles), factor * np.sin(angles)            # (T, R/2)
    if layout == "half":                                                   # θ_0 … θ_{R/2-1} twice
        cos, sin, rot = np.concatenate([cos, cos], -1), np.concatenate([sin, sin], -1), rotate_half
    else:                                                                  # θ_0 θ_0 θ_1 θ_1 … (GLM-4V)
        cos, sin, rot = np.repeat(cos, 2, axis=-1), np.repeat(sin, 2, axis=-1), rotate_every_two
    return x, cos.astype(x.dtype), sin.astype(x.dtype), R, rot


def apply_mrope(x: ArrayLike, positions: ArrayLike, mrope_section: Sequence[int], *, base: float = 10000.0,
                inv_freq: ArrayLike | None = None, interleaved: bool | str = False, attention_factor: float = 1.0,
                rotary_dim: int | None = None, layout: str = "half") -> np.ndarray:
    """Rotate ``x`` by M-RoPE: ``x ⊙ [cos | cos] + rotate_half(x) ⊙ [sin | sin]`` of ``mrope_angles``.

    x: ``(..., T, D)``, e.g. q or k ``(B, H, T, D)``. positions: ``(3, T)`` integers (temporal, height,
    width), or ``(T,)`` meaning three equal streams (plain RoPE). mrope_section: ``[n_t, n_h, n_w]``
    adding up to R/2. interleaved: True for Qwen3-VL's assignment, "hw" for ERNIE-4.5-VL's (see
    ``mrope_streams``). inv_freq: ``(R/2,)`` replacing ``base^(-2i/R)``. attention_factor multiplies cos and sin. rotary_dim: rotate only the
    first R features (even, <= D; default D), the rest pass through (partial rotary M-RoPE: GLM-4V,
    Qwen3.5, HF ``partial_rotary_factor``). layout: "half" (pairs (i, i + R/2), HF ``rotate_half``;
    the Qwen VL models) or "interleaved" (pairs (2i, 2i + 1), ``cos.repeat_interleave(2)`` and
    ``rotate_half_llm``: GLM-4V). Returns ``(..., T, D)`` in x's dtype.
    """
    x, cos, sin, R, rot = cos_sin(x, positions, mrope_section, base, inv_freq, interleaved, attention_factor, "x",
                                  rotary_dim, layout)
    x_rot = x[..., :R]                                                      # (..., T, R)
    with overflow_raises(x.dtype):
        rotated = x_rot * cos + rot(x_rot) * sin                            # (..., T, R): Eq. 34
    return np.concatenate([rotated, x[..., R:]], axis=-1)                   # (..., T, D)


def apply_mrope_backward(dy: ArrayLike, positions: ArrayLike, mrope_section: Sequence[int], *, base: float = 10000.0,
                         inv_freq: ArrayLike | None = None, interleaved: bool | str = False,
                         attention_factor: float = 1.0,
                         rotary_dim: int | None = None, layout: str = "half") -> np.ndarray:
    """The gradient of ``apply_mrope`` for ``dy`` ``(..., T, D)``: ``R^T dy``, each pair rotated back.

    ``apply_mrope`` is linear in x, pair i rotated by its own angle, so ``dx = f R^T dy`` with the
    adjoint of ``rot`` being ``-rot``: ``dx = dy ⊙ cos - rot(dy) ⊙ sin`` on the rotated features, ``dy``
    on the rest. Same arguments as ``apply_mrope``; returns ``(..., T, D)`` in dy's dtype.
    """
    dy, cos, sin, R, rot = cos_sin(dy, positions, mrope_section, base, inv_freq, interleaved, attention_factor,
                                   "dy", rotary_dim, layout)
    dy_rot = dy[..., :R]                                                    # (..., T, R)
    with overflow_raises(dy.dtype, "dy"):
        rotated = dy_rot * cos - rot(dy_rot) * sin                          # (..., T, R): R^T dy
    return np.concatenate([rotated, dy[..., R:]], axis=-1)                  # (..., T, D)


def _grids(grid_thw, name: str) -> list:
    if grid_thw is None:
        return []
    grid = as_positions(grid_thw, name, ndim=2)
    if grid.shape[1:] != (3,) or (grid.size and grid.min() < 1):
        raise ValueError(f"{name} must have shape (N, 3) of positive (t, h, w) patch counts, got {grid.tolist()}")
    return [tuple(int(n) for n in g) for g in grid]


def _runs(types: np.ndarray) -> list:
    """Runs of equal token types: ``[(type, start, end), …]`` (HF ``itertools.groupby``)."""
    cut = np.flatnonzero(np.diff(types)) + 1
    starts, ends = np.concatenate([[0], cut]), np.concatenate([cut, [len(types)]])
    return [(int(types[s]), int(s), int(e)) for s, e in zip(starts, ends) if e > s]


def _vision_positions(start: int, grid, merge: int, interval: float) -> np.ndarray:
    """Positions ``(3, t h w / m²)`` of one vision block starting at ``start`` (HF ``get_vision_position_ids``);
    the caller has checked the token count ``t h w / m²`` and that ``start`` plus the last frame's
    ``floor((t - 1) interval)`` and ``max(h, w) / m`` stay below ``2**62``."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    tt, hh, ww = np.meshgrid(np.floor(np.arange(t) * interval).astype(np.int64), np.arange(h), np.arange(w),
                             indexing="ij")                                 # (t, h, w) each
    return start + np.stack([tt, hh, ww]).reshape(3, -1)                    # (3, t h w)


def _check_block(label, index, grid, merge, step, start, run_start, run_length):
    """Raise unless the block's ``t h w / m²`` tokens fill its run and its positions fit below ``2**62``."""
    t, h, w = grid[0], grid[1] // merge, grid[2] // merge
    if t * h * w != run_length:                                             # before allocating the block
        raise ValueError(f"{label}[{index}] = {list(grid)} with spatial_merge_size {merge} needs "
                         f"{t * h * w} tokens, but its run in token_types (at {run_start}) has {run_length}")
    last = start + max(float(np.floor((t - 1) * step)), h - 1, w - 1)        # the block's largest position
    if last >= POSITION_LIMIT:
        what = (f"video_time_intervals[{index}] = {step:g} puts frame {t - 1} of video {index}"
                if float(np.floor((t - 1) * step)) + start >= POSITION_LIMIT else f"{label}[{index}] = {list(grid)} puts")
        raise ValueError(f"{what} at position {last:.4g}, beyond the 2**62 positions may reach")


def mrope_positions(token_types: ArrayLike, *, image_grid_thw: ArrayLike | None = None,
                    video_grid_thw: ArrayLike | None = None, spatial_merge_size: int = 2,
                    video_time_intervals: ArrayLike | None = None) -> tuple[np.ndarray, int]:
    """The M-RoPE positions of one sequence and its decoding offset: ``(positions (3, T), delta)``.

    token_types: ``(T,)`` ints, 0 text, 1 image, 2 video (HF ``mm_token_type_ids``); each run of
    image (video) tokens is the next grid of ``image_grid_thw`` (``video_grid_thw``) ``(N, 3)`` and
    must hold ``t h w / spatial_merge_size²`` tokens. ``video_time_intervals``: per video, the
    temporal step between frames' positions (``None``: 1; Qwen2.5-VL: ``tokens_per_second ·
    second_per_grid_ts``). Qwen3-VL gives each video frame its own grid ``(1, h, w)`` (HF repeats
    the rows of ``video_grid_thw`` t times). ``delta = max(positions) + 1 - T``.
    """
    types = as_positions(token_types, "token_types")
    if types.size and types.max() > VIDEO:
        raise ValueError(f"token_types must be 0 (text), 1 (image) or 2 (video), got {int(types.max())}")
    merge = check_int(spatial_merge_size, "spatial_merge_size", minimum=1)
    grids = {IMAGE: _grids(image_grid_thw, "image_grid_thw"), VIDEO: _grids(video_grid_thw, "video_grid_thw")}
    steps = {IMAGE: [1.0] * len(grids[IMAGE]), VIDEO: [1.0] * len(grids[VIDEO])}
    if video_time_intervals is not None:
        steps[VIDEO] = [float(s) for s in as_float_array(video_time_intervals, "video_time_intervals").reshape(-1)]
        if len(steps[VIDEO]) != len(grids[VIDEO]) or min(steps[VIDEO], default=0) < 0:
            raise ValueError(f"video_time_intervals must hold one non-negative step per video ({len(grids[VIDEO])}), "
                             f"got {steps[VIDEO]}")
    runs, used, parts, current = _runs(types), {IMAGE: 0, VIDEO: 0}, [], 0
    for kind, start, end in runs:
        if kind == TEXT:
            parts.append(np.broadcast_to(current + np.arange(end - start), (3, end - start)))   # t = h = w
            current += end - start
            continue
        label = "image_grid_thw" if kind == IMAGE else "video_grid_thw"
        if used[kind] == len(grids[kind]):
            raise ValueError(f"{label} has {len(grids[kind])} grids but token_types has more {label[:5]} runs")
        grid, step = grids[kind][used[kind]], steps[kind][used[kind]]
        _check_block(label, used[kind], grid, merge, step, current, start, end - start)
        parts.append(_vision_positions(current, grid, merge, step))         # (3, t h w / m²)
        used[kind] += 1
        current += max(grid[1], grid[2]) // merge                           # HF 5.24: not max(block) + 1
    for kind, label in ((IMAGE, "image_grid_thw"), (VIDEO, "video_grid_thw")):
        if used[kind] != len(grids[kind]):
            raise ValueError(f"{label} has {len(grids[kind])} grids but token_types has {used[kind]} such runs")
    positions = np.concatenate(parts, axis=1) if parts else np.zeros((3, 0), np.int64)    # (3, T)
    delta = int(positions.max()) + 1 - positions.shape[1] if positions.size else 0
    return positions.astype(np.int64), delta


def mrope_decode_positions(cache_length: int, length: int, delta: int) -> np.ndarray:
    """Positions ``(3, length)`` of tokens decoded after ``cache_length`` cached ones:
    ``cache_length + delta + arange(length)`` in all three streams (HF ``rope_deltas``).

    Every position must have magnitude below ``2**62``, as positions elsewhere (``ValueError``
    naming the three arguments otherwise, never a position wrapped around int64)."""
    cache_length = check_int(cache_length, "cache_length", minimum=0)
    length = check_int(length, "length", minimum=0)
    delta = check_int(delta, "delta")
    if length == 0:                                                       # no position to compute
        return np.zeros((3, 0), np.int64)
    first, last = cache_length + delta, cache_length + delta + length - 1  # Python ints: exact
    if max(abs(first), abs(last)) >= POSITION_LIMIT:
        raise ValueError(f"cache_length + delta + arange(length) reaches {last if abs(last) >= abs(first) else first} "
                         f"(cache_length {cache_length}, delta {delta}, length {length}); positions must stay "
                         "below 2**62 in magnitude")
    check_alloc((3, length), np.int64, "length (positions (3, length))", copies=2)
    return np.broadcast_to(first + np.arange(length, dtype=np.int64), (3, length)).copy()


# --------------------------------------------------------------------------- the scheme the layer runs

class MRotary(Scheme):
    """Multimodal RoPE (the functions above): RoPE whose frequencies are shared by three position
    streams, temporal, height and width (Qwen2-VL, Qwen2.5-VL; Qwen3-VL with ``interleaved``, ERNIE-4.5-VL with
    ``interleaved="hw"`` and ``layout="interleaved"``;
    partial rotary with ``rotary_dim``: Qwen3.5 interleaved, GLM-4V split in the interleaved ``layout``).

    The layer's ``positions`` are then ``(3, T)`` (``mrope_positions``; a ``(T,)``
    array means three equal streams, i.e. text) and serve the rotate seam only: the causal mask and
    the KV cache follow the sequence order (0, 1, ... continuing the cache), as HF's mask follows
    ``cache_position``. Decode after a cache with ``mrope_decode_positions(cache_length, T, delta)``.
    ``mrope_section`` ``[n_t, n_h, n_w]`` adds up to R/2 (HF ``rope_parameters["mrope_section"]``), R the
    rotated features: ``rotary_dim`` (HF ``int(head_dim * partial_rotary_factor)``), default head_dim;
    ``None`` scales the model's default to R: Qwen2-VL's [16, 24, 24] or, interleaved,
    Qwen3-VL's [24, 20, 20] or, "hw", ERNIE-4.5-VL's [20, 22, 22] at R = 128 (n_h = n_w = 3/16, 5/32 resp. 11/64
    of R, n_t the rest).
    ``layout``: "half" (the Qwen VL models) or "interleaved" (GLM-4V), as ``apply_mrope``.
    """

    name = "mrope"
    seams = ("rotate",)
    position_streams = 3

    def __init__(self, *, mrope_section=None, base: float = 10000.0, interleaved: bool | str = False,
                 rotary_dim: int | None = None, layout: str = "half"):
        self.mrope_section = None if mrope_section is None else list(check_section(mrope_section))
        self.base = check_float(base, "base", positive=True)
        self.interleaved = check_interleaved(interleaved)
        self.rotary_dim = None if rotary_dim is None else check_even_int(rotary_dim, "rotary_dim")
        self.layout = check_choice(layout, "layout", LAYOUTS)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        if self.rotary_dim is None and self.head_dim % 2:
            raise ValueError(f"M-RoPE needs an even head dim, got head_dim = {self.head_dim}")
        R = self.head_dim if self.rotary_dim is None else self.rotary_dim
        if R > self.head_dim:
            raise ValueError(f"rotary_dim must be <= head_dim ({self.head_dim}), got {R}")
        half = R // 2
        if self.mrope_section is None:                       # the model's proportions at this rotary dim
            n = {False: 3 * half // 8, True: 5 * half // 16, "hw": 11 * half // 32}[self.interleaved]
            self.mrope_section = [half - 2 * n, n, n]
        if sum(self.mrope_section) != half:
            what = "head_dim/2" if self.rotary_dim is None else "rotary_dim/2"
            raise ValueError(f"mrope_section {self.mrope_section} must add up to {what} = {half}")
        mrope_streams(self.mrope_section, interleaved=self.interleaved)   # refuses a bad interleaving
        self._R, self.inv_freq, self._made_from = R, rope_inv_freq(R, base=self.base), self.base

    def _current(self):  # inv_freq, computed again if base was set since
        if self.base != self._made_from:
            self.inv_freq, self._made_from = rope_inv_freq(self._R, base=self.base), self.base
        return self.inv_freq

    def cache_tag(self, seq_len):
        return self._current().tobytes(), tuple(self.mrope_section), self.interleaved, self.rotary_dim, self.layout

    def _apply(self, x, positions, *, seq_len):                       # (B, H, T, D), positions (3, T)
        return apply_mrope(x, positions, self.mrope_section, inv_freq=self._current(), interleaved=self.interleaved,
                           rotary_dim=self.rotary_dim, layout=self.layout)

    def _apply_backward(self, dx, positions, *, seq_len):             # R^T
        return apply_mrope_backward(dx, positions, self.mrope_section, inv_freq=self._current(),
                                    interleaved=self.interleaved, rotary_dim=self.rotary_dim, layout=self.layout)

    rotate_q = rotate_k = _apply
    rotate_q_backward = rotate_k_backward = _apply_backward

    def settings(self):
        section = None if self.mrope_section is None else tuple(self.mrope_section)
        return (("mrope_section", section), ("base", self.base), ("interleaved", self.interleaved),
                ("rotary_dim", self.rotary_dim), ("layout", self.layout))

    def __repr__(self) -> str:
        extra = "" if self.rotary_dim is None else f", rotary_dim={self.rotary_dim}"
        extra += "" if self.layout == "half" else f", layout={self.layout!r}"
        return f"MRotary(mrope_section={self.mrope_section}, interleaved={self.interleaved!r}{extra})"
