"""Absolute position tables: the fixed sinusoids and the learned table (the input seam).

Sinusoidal (Vaswani et al. 2017, "Attention Is All You Need", arXiv:1706.03762, §3.5):

    PE(pos, 2i)     = sin(pos · w_i)
    PE(pos, 2i + 1) = cos(pos · w_i),       w_i = base^(-2i/D),   i = 0 … D/2 - 1

with ``base = 10000``. The index ``i`` runs over the D/2 sin/cos *pairs*, not over the D
columns. Real code stores the same sinusoids in three ways, which are not interchangeable:

=================  =====================  ==========================  ==========================
layout             column order           w_i                         used by
=================  =====================  ==========================  ==========================
``interleaved``    sin, cos, sin, cos, …  base^(-2i/D)                the paper; XLM, DistilBERT
``split``          [sin … | cos …]        base^(-2i/D)                Transformer-XL
                                                                      ``PositionalEmbedding``,
                                                                      Marian
``tensor2tensor``  [sin … | cos …]        base^(-i/(D/2 - 1))         tensor2tensor
                                                                      ``get_timing_signal_1d``,
                                                                      fairseq, HF Speech2Text,
                                                                      M2M100, FSMT
=================  =====================  ==========================  ==========================

``split`` is ``interleaved`` with its columns permuted (same numbers). ``tensor2tensor`` has
different frequencies: its geometric sequence of timescales runs from 1 to exactly ``base``
(``num_timescales = D // 2``, ``log_timescale_increment = log(base) / max(num_timescales - 1, 1)``,
``w_i = exp(-i · log_timescale_increment)``), whereas the paper's lowest frequency is
``base^(-(D-2)/D)``. For odd D, tensor2tensor and fairseq append one zero column.

Porting pitfalls
----------------
- fairseq's ``SinusoidalPositionalEmbedding.get_embedding(num_embeddings, embedding_dim,
  padding_idx)`` is the ``tensor2tensor`` table with row ``padding_idx`` zeroed, and
  ``utils.make_positions`` numbers real tokens from ``padding_idx + 1`` (HF Speech2Text/M2M100:
  "Position numbers begin at padding_idx+1"). With ``padding_idx = 1`` the first token reads
  row 2, so fairseq's embedding of tokens ``0 … T-1`` is
  ``sinusoidal_table(np.arange(T) + padding_idx + 1, D, layout="tensor2tensor")``.
- fairseq divides by ``half_dim - 1`` unguarded (D = 2 or 3 divides by zero); tensor2tensor
  guards with ``max(num_timescales - 1, 1)``, and minipos follows tensor2tensor.
- Transformer-XL evaluates its ``split`` table at *relative distances* ``klen-1, …, 0``, and
  bidirectional variants (XLNet) at negative ones, so negative positions are allowed here.
- Reference implementations build the table in float32 (fairseq, Speech2Text) or in float64 and
  cast to float32 (XLM, Marian). minipos returns float64; compare with ``rtol ≈ 1e-6``.

Learned absolute positions (GPT-2 ``wpe``, BERT ``position_embeddings``): a ``(P, D)`` table,
initialised ``normal(0, 0.02)``, whose row ``pos`` is added to token ``pos``. It has no row for
``pos >= P``: unlike the sinusoids it cannot extrapolate. (RoBERTa offsets positions by
``padding_idx + 1`` like fairseq, hence its 514-row table for 512 tokens.)

Shapes: ``positions`` ``(T,)``; tables ``(T, D)``; frequencies ``(D // 2,)``.

Gradients: the sinusoids are fixed; the learned table's gradient is
``absolute_embedding_backward(table, positions, dout)``, a scatter-add of ``dout`` by position.

Errors: a ``base`` whose frequencies leave float64's normal range, positions beyond ``2**53``
(where float64 stops holding every integer) and angles ``pos · w_i`` that overflow raise
``ValueError`` naming the argument, as does a table too large for this machine's memory or a
learned table whose ``std`` draws values that are not finite, normal numbers of its ``dtype``.

The scheme classes the layer runs, ``Sinusoidal`` and ``LearnedAbsolute``, are at the bottom of this
module.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike, DTypeLike

from ._checks import (as_float_array, as_positions, check_alloc, check_choice, check_float, check_float_dtype,
                      check_int, check_positive_int)
from .seams import TERMS, Scheme

__all__ = ["sinusoidal_table", "sinusoidal_frequencies", "learned_table", "absolute_embedding",
           "absolute_embedding_backward", "Sinusoidal", "LearnedAbsolute"]

MAX_POSITION = 2 ** 53
"""Largest ``|position|`` accepted: float64 holds every integer up to here, and no further."""

LAYOUTS = ("interleaved", "split", "tensor2tensor")


def _check_dim(dim, layout: str) -> int:
    """``dim`` as an int: even >= 2 for sin/cos pairs, >= 1 for tensor2tensor (zero-padded)."""
    check_choice(layout, "layout", LAYOUTS)
    if layout == "tensor2tensor":
        return check_int(dim, "dim", minimum=1)
    dim = check_int(dim, "dim", minimum=2)
    if dim % 2:
        raise ValueError(
            f"dim must be even for layout {layout!r} (D/2 sin/cos pairs), got {dim}; "
            "only layout 'tensor2tensor' pads an odd dim with a zero column"
        )
    return dim


def sinusoidal_frequencies(dim: int, *, base: float = 10000.0, layout: str = "interleaved") -> np.ndarray:
    """The angular frequencies ``w_i``, ``i = 0 … D//2 - 1``, as float64 ``(D // 2,)``.

    ``"interleaved"`` and ``"split"``: ``w_i = base^(-2i/D)`` (Vaswani §3.5).
    ``"tensor2tensor"``: ``w_i = base^(-i / max(D//2 - 1, 1))`` (first 1, last exactly 1/base).
    """
    dim = _check_dim(dim, layout)
    base = check_float(base, "base", positive=True)
    check_alloc((dim // 2,), np.float64, "dim")
    w = np.arange(dim // 2, dtype=np.float64)                # i, then the exponent, then w: in place
    with np.errstate(over="ignore", under="ignore"):          # checked just below
        if layout == "tensor2tensor":
            np.divide(np.negative(w, out=w), max(dim // 2 - 1, 1), out=w)
        else:
            np.divide(np.multiply(w, -2.0, out=w), dim, out=w)
        np.power(base, w, out=w)                              # w_i = base^(-2i/D) or base^(-i/(D/2 - 1))
    if w.size and not (np.all(np.isfinite(w)) and w.min() >= np.finfo(np.float64).tiny):
        raise ValueError(f"base must keep the frequencies w_i within float64's normal range, got "
                         f"base = {base}, which makes them reach {w.min() if w.min() < 1 else w.max()}")
    return w


def _is_count(positions) -> bool:
    """True for an int n that stands for ``arange(n)`` (not a bool, not an array)."""
    return isinstance(positions, numbers.Integral) and not isinstance(positions, bool)


def _table_positions(positions, dim: int) -> np.ndarray:
    """``positions`` as int64 ``(T,)`` once a ``(T, dim)`` float64 table is known to fit in memory."""
    if _is_count(positions) and positions > 0:                # before arange(n) is built
        check_alloc((positions, dim), np.float64, "positions and dim")
    pos = as_positions(positions, "positions", allow_negative=True)
    check_alloc((pos.shape[0], dim), np.float64, "positions and dim")
    if pos.size and max(-int(pos.min()), int(pos.max())) > MAX_POSITION:
        raise ValueError(f"positions must lie within +-2**53 (float64 holds every integer only up to "
                         f"there), got {int(pos.min())} ... {int(pos.max())}")
    return pos


def sinusoidal_table(positions: ArrayLike, dim: int, *, base: float = 10000.0,
                     layout: str = "interleaved") -> np.ndarray:
    """The sinusoidal position table ``(T, D)`` in float64.

    positions: an int T (meaning ``arange(T)``) or an integer array ``(T,)``; negative entries
    are allowed (relative distances). See the module docstring for the three layouts.
    """
    dim = _check_dim(dim, layout)
    pos = _table_positions(positions, dim)                      # (T,), the table known to fit
    w = sinusoidal_frequencies(dim, base=base, layout=layout)   # (D//2,)
    if pos.size and w.size and not np.isfinite(float(np.abs(pos).max()) * float(w.max())):
        raise ValueError(f"positions and base make the angles pos · w_i overflow float64 (largest |position| "
                         f"{int(np.abs(pos).max())}, largest frequency {w.max()} from base = {base})")
    angles = pos.astype(np.float64)[:, None] * w[None, :]       # pos · w_i, (T, D//2)
    sin, cos = np.sin(angles), np.cos(angles)
    if layout == "interleaved":
        return np.stack([sin, cos], axis=-1).reshape(len(pos), dim)  # PE(pos, 2i), PE(pos, 2i+1)
    table = np.concatenate([sin, cos], axis=-1)                 # [sin | cos], (T, 2 * (D//2))
    if dim % 2:
        table = np.concatenate([table, np.zeros((len(pos), 1))], axis=-1)  # zero column, (T, D)
    return table


def learned_table(num_positions: int, dim: int, *, seed: int = 0, std: float = 0.02,
                  dtype: DTypeLike = np.float64) -> np.ndarray:
    """A learned absolute table ``(P, D)`` drawn from ``normal(0, std)`` (HF's re-initialisation, std 0.02;
    GPT-2's own code draws ``wpe`` at std 0.01, BERT's a truncated normal at 0.02).

    Deterministic given ``seed`` (``numpy.random.default_rng``); drawn in float64, then cast
    to the floating ``dtype``.
    """
    P = check_int(num_positions, "num_positions", minimum=1)
    D = check_int(dim, "dim", minimum=1)
    std = check_float(std, "std", minimum=0.0)
    dtype = check_float_dtype(dtype)
    if 0 < std < float(np.finfo(dtype).tiny):
        raise ValueError(f"std must be 0 or a normal {dtype} (>= {np.finfo(dtype).tiny}), got {std}: "
                         "the draws would be subnormal or 0")
    check_alloc((P, D), np.float64, "num_positions and dim")
    rng = np.random.default_rng(check_int(seed, "seed", minimum=0))
    with np.errstate(over="ignore"):                          # checked just below
        table = rng.normal(0.0, std, size=(P, D)).astype(dtype)  # (P, D)
    if not np.all(np.isfinite(table)):
        raise ValueError(f"std = {std} draws values beyond the range of dtype {dtype}")
    return table


def absolute_embedding(table: ArrayLike, positions: ArrayLike) -> np.ndarray:
    """Rows of a learned table at ``positions``: ``(T, D)`` (or ``(..., T, D)``), table's dtype.

    table: ``(P, D)``. positions: an int T (meaning ``arange(T)``) or an integer array ``(T,)``
    or ``(..., T)`` with ``0 <= pos < P``; a position ``>= P`` raises, since a learned table has
    no row there and cannot extrapolate.
    """
    table, pos = _embedding_args(table, positions)
    check_alloc((*pos.shape, table.shape[1]), table.dtype, "positions")
    return table[pos]  # (..., T, D)


def _embedding_args(table, positions) -> tuple[np.ndarray, np.ndarray]:
    """The table (P, D) as a finite float array and the positions as int64 (..., T) in [0, P)."""
    table = as_float_array(table, "table")
    if table.ndim != 2:
        raise ValueError(f"table must have shape (num_positions, D), got shape {table.shape}")
    P = table.shape[0]
    if _is_count(positions) and positions > P:                # arange(n) reaches n - 1 >= P
        _cannot_extrapolate(P, positions - 1)
    pos = as_positions(positions, "positions", ndim=None)
    if pos.size and pos.max() >= P:
        _cannot_extrapolate(P, int(pos.max()))
    return table, pos


def absolute_embedding_backward(table: ArrayLike, positions: ArrayLike, dout: ArrayLike) -> np.ndarray:
    """The gradient of ``absolute_embedding(table, positions)`` for the output gradient ``dout``.

    dout: ``(..., T, D)``, the shape of the forward's output (positions' shape plus D). Returns
    dtable ``(P, D)`` in table's dtype. The forward gathers rows, ``out[t] = table[pos[t]]``, so
    its adjoint scatters and adds: ``dtable[p] = sum of dout[t] over the t with pos[t] = p``
    (a repeated position sums; a row no position reads gets 0). Summed in float64. The table's
    values do not enter (only its shape and dtype); it is taken to mirror the forward.
    """
    table, pos = _embedding_args(table, positions)
    dout = as_float_array(dout, "dout")
    if dout.shape != (*pos.shape, table.shape[1]):
        raise ValueError(f"dout must have the shape of the forward's output (..., T, D) = "
                         f"{(*pos.shape, table.shape[1])} (positions of shape {pos.shape}, table of shape "
                         f"{table.shape}), got shape {dout.shape}")
    dtable = np.zeros(table.shape)                            # (P, D), float64
    np.add.at(dtable, pos, dout)                              # dtable[pos[t]] += dout[t]
    with np.errstate(over="ignore"):                          # checked just below
        dtable = dtable.astype(table.dtype, copy=False)
    if not np.all(np.isfinite(dtable)):
        raise ValueError(f"the gradient of table overflows {table.dtype}: dout summed over repeated positions "
                         f"exceeds its range; rescale dout")
    return dtable


def _cannot_extrapolate(P: int, largest: int):
    raise ValueError(
        f"positions must be < num_positions = {P} (the rows of table), got maximum "
        f"{largest}: a learned absolute table cannot extrapolate beyond the "
        "positions it was trained on"
    )


# --------------------------------------------------------------------------- the scheme the layer runs

class Sinusoidal(Scheme):
    """Fixed sinusoidal table added to the token embeddings (Vaswani et al. 2017, §3.5)."""

    name = "sinusoidal"
    seams = ("input",)
    terms = TERMS

    def __init__(self, *, base: float = 10000.0, layout: str = "interleaved"):
        self.base = check_float(base, "base", positive=True)
        self.layout = check_choice(layout, "layout", {"interleaved", "split", "tensor2tensor"})

    def embed(self, x, positions):
        pe = sinusoidal_table(positions, x.shape[-1], base=self.base, layout=self.layout)
        return x + pe.astype(x.dtype, copy=False)  # (B, T, d_model) + (T, d_model)

    def settings(self):
        return (("base", self.base), ("layout", self.layout))

    def __repr__(self) -> str:
        return f"Sinusoidal(layout={self.layout!r})"


class LearnedAbsolute(Scheme):
    """A learned ``(max_positions, d_model)`` table added to the embeddings (BERT, GPT-2).

    ``table`` is GPT-2's ``wpe.weight`` / BERT's ``position_embeddings.weight``. It has no row
    for a position >= ``max_positions``: such input raises ``ValueError``.
    """

    name = "learned"
    seams = ("input",)
    terms = TERMS

    def __init__(self, max_positions: int = 512, *, std: float = 0.02):
        self.max_positions = check_positive_int(max_positions, "max_positions")
        self.std = check_float(std, "std", minimum=0.0)

    def bind(self, layer, rng):
        check_alloc((self.max_positions, layer.d_model), np.float64, "max_positions (rows of d_model)")
        super().bind(layer, rng)
        self.table = learned_table(self.max_positions, self.d_model, seed=int(rng.integers(2 ** 31)),
                                              std=self.std, dtype=layer.dtype)  # (max_positions, d_model)

    def parameters(self):
        return {"table": self.table}

    def embed(self, x, positions):
        return x + absolute_embedding(self.table, positions).astype(x.dtype, copy=False)

    def embed_backward(self, dx, positions, add):
        add("scheme.table", absolute_embedding_backward(self.table, positions, dx.sum(axis=0)))
        return dx

    def settings(self):  # std only draws the table
        return (("max_positions", self.max_positions),)

    def __repr__(self) -> str:
        return f"LearnedAbsolute(max_positions={self.max_positions})"
