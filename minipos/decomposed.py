r"""Decomposed relative position bias of the SAM / ViTDet vision towers (content-position seam).

Sources: Li, Mao, Girshick, He 2022, "Exploring Plain Vision Transformer Backbones for Object Detection" (ViTDet),
arXiv:2203.16527, §4 / Appendix ("relative position biases"), which takes the decomposed form of MViTv2 (Li et al.
2022, arXiv:2112.01526, §4.1, Eq. 4); the reference code minipos matches is transformers 5.24's
``SamVisionAttention.get_rel_pos`` and ``get_decomposed_rel_pos`` (``transformers/models/sam/modeling_sam.py``),
copied into DeepSeek-OCR-2's SAM ViT-B (``DeepseekOcr2SamVisionAttention``) and GOT-OCR2's tower; ViTDet's
``add_decomposed_relative_positions`` is the same sum.

The bias. A patch at row r and column c of a grid (``positions`` ``(2, T)``: rows, then columns) attends to the patch
at (r', c') with the logit

    s = q · k / sqrt(D)  +  q · R_h[r - r' + (h - 1)]  +  q · R_w[c - c' + (w - 1)]

where R_h ``(2h - 1, D)`` and R_w ``(2w - 1, D)`` are learned tables (HF ``rel_pos_h``, ``rel_pos_w``), one per layer,
shared by the heads, and h, w the grid's height and width (HF ``input_size``: the window, 14 x 14, in the window
layers; ``image_size // patch_size`` in the global ones). Three details a port gets wrong:

- the scale multiplies ``q · k`` only: HF adds the bias to ``(query * self.scale) @ key^T``, computed from the
  *unscaled* query (``get_decomposed_rel_pos(query, ...)``);
- the sign is query minus key: row ``(r - r') + (h - 1)``, so row 0 is a key h - 1 rows *below* the query;
- the tables are shared by all heads and read by the raw query of each head.

Interpolation and unequal sizes. HF resizes the table on every call to ``2 max(q_size, k_size) - 1`` rows with
``F.interpolate(..., mode="linear")`` (``align_corners=False``; an identity when the length already matches), then
indexes ``(q_i max(k/q, 1) - k_j max(q/k, 1)) + (k - 1) max(q/k, 1)``, truncated by ``.long()`` (the coordinates are
float32 in HF: ``arange(q) * python_float``); ``resize_table`` and ``rel_pos_table`` are those two steps, and
``decomposed_bias`` HF's whole grid form. In SAM's self-attention q_size = k_size always (the same grid), and the
bias reduces to the formula above.

Two forms. The *grid* form (``decomposed_bias``) is HF's: the grid sizes give the coordinates. The *positions* form
(``decomposed_logits``) takes any rows and columns, the relative offset clipped to the table (``|r - r'| <= h - 1``,
always true inside the grid; beyond it, the last row, as Shaw et al. clip), and gathers from ``q @ R^T``
``(..., T, 2h - 1)`` as Shaw's efficient form does; ``decomposed_logits_pairwise`` gathers ``(T, S, D)`` first, as the
equation reads. ``tests/test_decomposed.py`` proves the forms equal on a grid and checks the grid form against HF.

Why it is relative per axis: the index depends on ``r - r'`` and ``c - c'`` only, so a shift of every row (or every
column) of the queries and keys changes no logit (``proofs.decomposed``); it is not relative in the flattened
sequence, whose one step is a column step within a row and a row step at a row's end.

The layer. The layer's seams after the rotate seam take sequence positions ``(T,)``; a SAM tower holds its patches
row-major (HF ``reshape(B, H * W, C)``), so ``DecomposedRelPos`` reads the patch at flat position p as row
``p // width``, column ``p % width`` (``grid_of``), where ``width`` is the grid's. Conventions: q ``(..., T, D)``,
tables ``(2h - 1, D)``, ``(2w - 1, D)``; the logits returned are unscaled and, like HF's, never multiplied by
``1/sqrt(D)``. Docs page: "Decomposed relative position bias (SAM)".
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_float_array, as_positions, check_alloc, check_ndim, check_overflow, check_positive_int
from .seams import Scheme

__all__ = ["resize_table", "rel_pos_table", "decomposed_bias", "relative_index", "grid_of", "decomposed_logits",
           "decomposed_logits_pairwise", "decomposed_logits_backward", "DecomposedRelPos"]


def _table(table, name, D=None):
    """``table`` as a float ``(L, D)`` array of an odd length L = 2 size - 1 (``D`` given: that width)."""
    table = as_float_array(table, name)
    if table.ndim != 2 or table.shape[0] % 2 == 0 or (D is not None and table.shape[1] != D):
        raise ValueError(f"{name} must have shape (2 size - 1, D) = (odd, {'D' if D is None else D}), got "
                         f"{table.shape}")
    return table


def resize_table(table: ArrayLike, length: int) -> np.ndarray:
    """``table`` ``(L, D)`` resized to ``(length, D)`` by linear interpolation along its rows, as HF's
    ``F.interpolate(t.reshape(1, L, -1).transpose(1, 2), size=length, mode="linear")`` (``align_corners=False``):
    row i reads the source ``max((i + 1/2) L / length - 1/2, 0)``. ``length == L`` returns the table unchanged."""
    table = as_float_array(table, "table")
    check_ndim(table, "table", 2, "(L, D)")
    L, n = table.shape[0], check_positive_int(length, "length")
    if n == L:
        return table
    src = np.maximum((np.arange(n) + 0.5) * (L / n) - 0.5, 0.0)          # (length,): the source coordinate
    i0 = src.astype(np.int64)                                             # floor: src >= 0
    i1 = np.minimum(i0 + 1, L - 1)
    lam = (src - i0)[:, None]                                             # (length, 1)
    return ((1 - lam) * table[i0] + lam * table[i1]).astype(table.dtype, copy=False)   # (length, D)


def rel_pos_table(q_size: int, k_size: int, table: ArrayLike) -> np.ndarray:
    """HF's ``get_rel_pos``: the embedding of every (query, key) pair of one axis, ``(q_size, k_size, D)``.

    The table is resized to ``2 max(q_size, k_size) - 1`` rows (``resize_table``), then indexed by
    ``(q_i max(k/q, 1) - k_j max(q/k, 1)) + (k - 1) max(q/k, 1)``, truncated to an integer; the coordinates in
    float32, as HF's ``torch.arange(q) * max(k / q, 1.0)``. With ``q_size == k_size = n``: row ``i - j + n - 1``.
    """
    q, k = check_positive_int(q_size, "q_size"), check_positive_int(k_size, "k_size")
    resized = resize_table(_table(table, "table"), 2 * max(q, k) - 1)     # (2 max - 1, D)
    f32 = np.float32
    q_coords = np.arange(q, dtype=f32)[:, None] * f32(max(k / q, 1.0))    # (q, 1)
    k_coords = np.arange(k, dtype=f32)[None, :] * f32(max(q / k, 1.0))    # (1, k)
    relative = (q_coords - k_coords) + f32((k - 1) * max(q / k, 1.0))     # (q, k), >= 0
    return resized[relative.astype(np.int64)]                             # (q, k, D): .long() truncates


def decomposed_bias(q: ArrayLike, table_h: ArrayLike, table_w: ArrayLike, q_size, k_size) -> np.ndarray:
    """HF's ``get_decomposed_rel_pos``, the grid form: ``(..., T, S)`` with T = qh qw, S = kh kw, row-major.

    q: ``(..., T, D)``, the query grid flattened row by row (HF's ``reshape(B, qh, qw, D)``), unscaled;
    table_h ``(Lh, D)``, table_w ``(Lw, D)``; q_size ``(qh, qw)``, k_size ``(kh, kw)``. Entry ``(t, s)`` for query
    (i, j) and key (k, l) is ``q · Rh[i, k] + q · Rw[j, l]`` with ``Rh = rel_pos_table(qh, kh, table_h)``.
    """
    q = as_float_array(q, "q")
    check_ndim(q, "q", 2, "(..., T, D)")
    (qh, qw), (kh, kw) = (tuple(check_positive_int(n, name) for n in size)
                          for size, name in ((q_size, "q_size"), (k_size, "k_size")))
    D = q.shape[-1]
    if q.shape[-2] != qh * qw:
        raise ValueError(f"q must have shape (..., T, D) with T = qh * qw = {qh * qw}, got {q.shape}")
    Rh = rel_pos_table(qh, kh, _table(table_h, "table_h", D))             # (qh, kh, D)
    Rw = rel_pos_table(qw, kw, _table(table_w, "table_w", D))             # (qw, kw, D)
    grid = q.reshape(*q.shape[:-2], qh, qw, D)                            # (..., qh, qw, D)
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        rel_h = np.einsum("...hwc,hkc->...hwk", grid, Rh)                 # (..., qh, qw, kh)
        rel_w = np.einsum("...hwc,wkc->...hwk", grid, Rw)                 # (..., qh, qw, kw)
        out = rel_h[..., :, None] + rel_w[..., None, :]                   # (..., qh, qw, kh, kw)
    return check_overflow(out.reshape(*q.shape[:-2], qh * qw, kh * kw), "q . R", "q or the tables")


def relative_index(q_positions: ArrayLike, k_positions: ArrayLike, size: int) -> np.ndarray:
    """The table row of every pair of one axis: ``clip(i - j, size - 1) + size - 1`` ``(T, S)``, in
    ``0 ... 2 size - 2`` (query minus key, HF's ``q_coords - k_coords + (k_size - 1)``)."""
    n = check_positive_int(size, "size")
    i = as_positions(q_positions, "q_positions", allow_negative=True)
    j = as_positions(k_positions, "k_positions", allow_negative=True)
    return np.clip(i[:, None] - j[None, :], -(n - 1), n - 1) + (n - 1)   # (T, S)


def grid_of(positions: ArrayLike, width: int) -> np.ndarray:
    """Flat row-major positions ``(T,)`` of a grid ``width`` wide as ``(2, T)``: rows ``p // width``, then
    columns ``p % width`` (HF's ``reshape(B, H, W, C)`` of the sequence)."""
    w = check_positive_int(width, "width")
    p = as_positions(positions, "positions", allow_negative=True)
    return np.stack([p // w, p % w])                                       # (2, T)


def _streams(positions, name):
    pos = as_positions(positions, name, allow_negative=True, ndim=None)
    if pos.ndim != 2 or pos.shape[0] != 2:
        raise ValueError(f"{name} must have shape (2, T) (rows, then columns), got {pos.shape}")
    return pos


def _indices(q, table_h, table_w, q_positions, k_positions):
    """Checked ``(q, table_h, table_w, index_h, index_w)`` of the positions form."""
    q = as_float_array(q, "q")
    check_ndim(q, "q", 2, "(..., T, D)")
    table_h, table_w = _table(table_h, "table_h", q.shape[-1]), _table(table_w, "table_w", q.shape[-1])
    qp, kp = _streams(q_positions, "q_positions"), _streams(k_positions, "k_positions")
    if qp.shape[1] != q.shape[-2]:
        raise ValueError(f"q_positions must have shape (2, T) = (2, {q.shape[-2]}) for q {q.shape}, got {qp.shape}")
    index_h = relative_index(qp[0], kp[0], (len(table_h) + 1) // 2)       # (T, S): r - r' + h - 1
    index_w = relative_index(qp[1], kp[1], (len(table_w) + 1) // 2)       # (T, S): c - c' + w - 1
    return q, table_h, table_w, index_h, index_w


def _gather(x, index):
    """``x[..., t, index[t, s]]``: ``(..., T, L)`` -> ``(..., T, S)``."""
    return np.take_along_axis(x, np.broadcast_to(index, (*x.shape[:-2], *index.shape)), axis=-1)


def _index_sum(g, index, rows):
    """The adjoint of ``_gather``: ``out[..., t, r] = sum of g[..., t, s] over the s with index[t, s] = r``."""
    return np.stack([np.sum(g * (index == r), axis=-1) for r in range(rows)], axis=-1)   # (..., T, L)


def decomposed_logits(q: ArrayLike, table_h: ArrayLike, table_w: ArrayLike, q_positions: ArrayLike,
                      k_positions: ArrayLike) -> np.ndarray:
    """The bias ``q_t · R_h[r_t - r'_s + h - 1] + q_t · R_w[c_t - c'_s + w - 1]`` ``(..., T, S)``, unscaled.

    q: ``(..., T, D)``; table_h ``(2h - 1, D)``, table_w ``(2w - 1, D)``; q_positions ``(2, T)``, k_positions
    ``(2, S)``: rows, then columns, integers (offsets clipped to ``±(h - 1)``, ``±(w - 1)``). Efficient form: a
    gather of ``q @ R^T`` per axis.
    """
    q, table_h, table_w, index_h, index_w = _indices(q, table_h, table_w, q_positions, k_positions)
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        out = _gather(q @ table_h.T, index_h) + _gather(q @ table_w.T, index_w)   # (..., T, S)
    return check_overflow(out, "q . R", "q or the tables")


def decomposed_logits_pairwise(q: ArrayLike, table_h: ArrayLike, table_w: ArrayLike, q_positions: ArrayLike,
                               k_positions: ArrayLike) -> np.ndarray:
    """``decomposed_logits`` as the equation reads: ``R_h`` and ``R_w`` gathered to ``(T, S, D)``, then dotted."""
    q, table_h, table_w, index_h, index_w = _indices(q, table_h, table_w, q_positions, k_positions)
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        out = np.einsum("...td,tsd->...ts", q, table_h[index_h] + table_w[index_w])   # (..., T, S)
    return check_overflow(out, "q . R", "q or the tables")


def decomposed_logits_backward(q: ArrayLike, table_h: ArrayLike, table_w: ArrayLike, q_positions: ArrayLike,
                               k_positions: ArrayLike, dlogits: ArrayLike):
    """The gradients of ``decomposed_logits`` for ``dlogits`` ``(..., T, S)``: ``(dq, dtable_h, dtable_w)``.

    Per axis, ``g = index_sum(dlogits)`` ``(..., T, 2n - 1)`` (the adjoint of the gather); then
    ``dq = g_h @ R_h + g_w @ R_w`` and ``dR = sum over ... and t of g^T q``.
    """
    q, table_h, table_w, index_h, index_w = _indices(q, table_h, table_w, q_positions, k_positions)
    dlogits = as_float_array(dlogits, "dlogits")
    if dlogits.shape != (*q.shape[:-1], index_h.shape[1]):
        raise ValueError(f"dlogits must have shape (..., T, S) = {(*q.shape[:-1], index_h.shape[1])}, got "
                         f"{dlogits.shape}")
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        g_h = _index_sum(dlogits, index_h, len(table_h))                  # (..., T, 2h - 1)
        g_w = _index_sum(dlogits, index_w, len(table_w))                  # (..., T, 2w - 1)
        dq = g_h @ table_h + g_w @ table_w                                # (..., T, D)
        flat_q = q.reshape(-1, q.shape[-1])
        dh = g_h.reshape(-1, g_h.shape[-1]).T @ flat_q                   # (2h - 1, D)
        dw = g_w.reshape(-1, g_w.shape[-1]).T @ flat_q                   # (2w - 1, D)
    return (check_overflow(dq, "the gradient of q", "dlogits or the tables"),
            check_overflow(dh, "the gradient of table_h", "dlogits or q"),
            check_overflow(dw, "the gradient of table_w", "dlogits or q"))


# --------------------------------------------------------------------------- the scheme the layer runs

class DecomposedRelPos(Scheme):
    """SAM's decomposed relative position bias: each query dotted with a learned row table and a column table.

    logits = q · k / sqrt(D) + q · R_h[r - r' + h - 1] + q · R_w[c - c' + w - 1], the bias unscaled. Learned:
    ``rel_pos_h`` ``(2 height - 1, D)`` and ``rel_pos_w`` ``(2 width - 1, D)``, shared by the heads (HF's names).
    The layer's positions ``(T,)`` are flat row-major indices of a grid ``width`` wide (``grid_of``: a SAM layer's
    sequence is its window, or its whole grid, row by row); call it with ``causal=False``, as a tower attends.
    height, width: HF ``input_size``, the window (14 in SAM ViT-B's window layers) or ``image_size // patch_size``.
    """

    name = "decomposed-rel-pos"
    seams = ("content-position",)
    sign_convention = (r"query minus key per axis: rows $r_i - r_j + h - 1$ of `rel_pos_h`, columns "
                       r"$c_i - c_j + w - 1$ of `rel_pos_w`; flat positions $p \mapsto (p \,//\, w, p \bmod w)$",
                       r"HF `SamVisionAttention.get_rel_pos` (`q_coords - k_coords + (k_size - 1)`); `relative_index`")
    terms = ("content-content", "content-position")

    def __init__(self, height: int = 14, width: int = 14):
        self.height = check_positive_int(height, "height")
        self.width = check_positive_int(width, "width")

    def bind(self, layer, rng):
        super().bind(layer, rng)
        D = self.head_dim
        check_alloc((2 * self.height + 2 * self.width, D), layer.dtype,
                    f"height = {self.height}, width = {self.width} (the tables rel_pos_h, rel_pos_w (2 n - 1, D))")
        self.rel_pos_h = (rng.standard_normal((2 * self.height - 1, D)) / np.sqrt(D)).astype(layer.dtype)
        self.rel_pos_w = (rng.standard_normal((2 * self.width - 1, D)) / np.sqrt(D)).astype(layer.dtype)

    def parameters(self):
        return {"rel_pos_h": self.rel_pos_h, "rel_pos_w": self.rel_pos_w}

    def content_position(self, q, k, q_positions, k_positions):
        qg, kg = grid_of(q_positions, self.width), grid_of(k_positions, self.width)   # (2, T), (2, S)

        def extra(qs, ks):  # q · R_h + q · R_w of one block, unscaled (HF adds it to the scaled q · k)
            return decomposed_logits(q[..., qs, :], self.rel_pos_h, self.rel_pos_w, qg[:, qs], kg[:, ks])
        return q, extra

    def extra_backward(self, q, k, q_positions, k_positions, qs, ks, dlogits, add):
        qg, kg = grid_of(q_positions[qs], self.width), grid_of(k_positions[ks], self.width)
        dq, dh, dw = decomposed_logits_backward(q[..., qs, :], self.rel_pos_h, self.rel_pos_w, qg, kg, dlogits)
        add("scheme.rel_pos_h", dh)
        add("scheme.rel_pos_w", dw)
        return dq, 0.0

    def settings(self):
        return (("height", self.height), ("width", self.width))

    def __repr__(self) -> str:
        return f"DecomposedRelPos(height={self.height}, width={self.width})"
