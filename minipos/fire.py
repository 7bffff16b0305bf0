r"""FIRE: functional interpolation for relative positions, a learned bias of the log distance.

Li, You, Guruganesh, Ainslie, Ontanon, Zaheer, Sanghai, Yang, Kumar, Bhojanapalli 2023, "Functional
Interpolation for Relative Positions Improves Long Context Transformers", arXiv:2310.04418 (ICLR 2024).
Each head adds a bias to its logits (the bias seam, like T5 and ALiBi), a small MLP of the distance
after a log transform and a division by the query's own (thresholded) position:

    b(i, j) = f_θ( ψ(i - j) / (ψ(max(L, i)) + ε) )          (H values: one per head)
    ψ(x)    = log(|c x| + 1)

with query position ``i`` and key position ``j`` (the distance ``i - j``, query minus key, as ALiBi and
Transformer-XL write it). What each piece is, as the reference code has it (the PyTorch ``FIRE``
module that public re-implementations reproduce, e.g. ``cramming/architectures/embeddings.py`` of
github.com/mcleish7/arithmetic, McLeish et al. 2024, arXiv:2405.17399, and the ``FIRE`` bias issue
of meta-pytorch/torchtune #2325):

- ``f_θ`` = ``Linear(1, mlp_width) -> ReLU -> Linear(mlp_width, H)``, ``mlp_width`` 32: ``w1 (1, W)``,
  ``b1 (W,)``, ``w2 (W, H)``, ``b2 (H,)`` here are ``mlp.0.weight.T``, ``mlp.0.bias``,
  ``mlp.2.weight.T``, ``mlp.2.bias`` there (weights ``(d_in, d_out)``, used as ``x @ W``), drawn as
  torch's ``nn.Linear`` draws them (uniform in ``±1/sqrt(d_in)``, biases too).
- ``c``: learned, initialised to 0.1 (``init_c``). The code writes ``ψ(x) = log(|c x| + 1)``: the
  absolute value makes a negative ``c`` act as ``|c|`` and a key after the query (``j > i``, only
  without a causal mask) count as the distance ``|i - j|``. FIRE is a causal scheme; minipos keeps the
  code's symmetric rule for bidirectional calls rather than refusing them.
- ``L``, the threshold of the normaliser: learned, as ``L = |L_multiplier · init_L|`` with
  ``L_multiplier`` learned (initialised to 1) and ``init_L`` fixed (512 in the code). Below ``L`` the
  normaliser is the constant ``ψ(L)`` (the paper's thresholding, for short sequences); past it, ``ψ(i)``
  (the progressive interpolation: every causal distance ``0 <= i - j <= i`` maps into ``[0, 1]``, so a
  longer input feeds the MLP no input it has not seen).
- ``ε`` = 1e-6 (``eps``) keeps ``ψ(max(L, i)) + ε > 0`` when ``L = i = 0``.

The gradients (``fire_bias_backward``) follow torch's conventions where the function has a kink: ReLU
passes no gradient at 0, ``|x|`` has slope 0 at 0, and where ``L = i`` exactly the maximum gives
half the gradient to ``L`` (``torch.max`` of two tensors).

Shapes: positions ``(T,)`` and ``(S,)``, the distance ``(T, S)``, the bias ``(H, T, S)``. Logs, the
MLP and the gradients are computed in float64; the bias and the gradients keep the parameters'
floating dtype. The derivation and the porting notes: ``docs/schemes/fire.md``; the identities the
page relies on: ``proofs.fire``.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from ._checks import as_float_array, as_positions, check_alloc, check_float, check_positive_int, check_result
from .seams import Scheme

__all__ = ["fire_psi", "fire_distance", "fire_mlp", "fire_bias", "fire_bias_backward", "FIRE"]


def fire_psi(x: ArrayLike, c: float) -> np.ndarray:
    """``ψ(x) = log(|c x| + 1)``, float64, the shape of ``x`` (any real array; ``c`` a real number)."""
    c = check_float(c, "c")
    x = as_float_array(x, "x").astype(np.float64)
    return np.log1p(np.abs(c * x))                                     # log(|c x| + 1)


def _positions_and_config(q_positions, k_positions, c, threshold, eps):
    q = as_positions(q_positions, "q_positions")
    k = as_positions(k_positions, "k_positions")
    c = check_float(c, "c")
    threshold = check_float(threshold, "threshold", minimum=0.0)
    eps = check_float(eps, "eps", positive=True)
    return q, k, c, threshold, eps


def _distance_parts(q, k, c, threshold, eps):
    """``(r, n, d, m)``: ``r = ψ(i - j)`` ``(T, S)``, ``n = ψ(max(L, i)) + ε`` ``(T, 1)``, the distances
    ``d = i - j`` and the normalising positions ``m = max(L, i)``, float64."""
    d = (q[:, None] - k[None, :]).astype(np.float64)                  # i - j, (T, S)
    m = np.maximum(q.astype(np.float64), threshold)[:, None]          # max(L, i), (T, 1)
    r = np.log1p(np.abs(c * d))                                        # ψ(i - j)
    n = np.log1p(np.abs(c * m)) + eps                                  # ψ(max(L, i)) + ε
    return r, n, d, m


def fire_distance(q_positions: ArrayLike, k_positions: ArrayLike, *, c: float = 0.1, threshold: float = 512.0,
                  eps: float = 1e-6) -> np.ndarray:
    """The normalised distance ``u = ψ(i - j) / (ψ(max(L, i)) + ε)`` ``(T, S)``, float64.

    q_positions ``(T,)`` (or an int T), k_positions ``(S,)`` (or an int S): non-negative integers.
    ``threshold`` is ``L`` (>= 0), ``c`` any real number, ``eps`` > 0. For ``0 <= i - j <= i`` the
    result lies in ``[0, 1)`` (``proofs.fire``).
    """
    q, k, c, threshold, eps = _positions_and_config(q_positions, k_positions, c, threshold, eps)
    check_alloc((q.size, k.size), np.float64, "fire_distance(q_positions, k_positions)", copies=4)
    r, n, _, _ = _distance_parts(q, k, c, threshold, eps)
    return r / n                                                       # (T, S)


def _check_mlp(w1, b1, w2, b2):
    """The MLP's weights as floating arrays of shapes ``(1, W)``, ``(W,)``, ``(W, H)``, ``(H,)``."""
    w1, b1, w2, b2 = (as_float_array(a, name) for a, name in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2")))
    if w1.ndim != 2 or w1.shape[0] != 1:
        raise ValueError(f"w1 must have shape (1, W) (mlp.0.weight.T), got {w1.shape}")
    W = w1.shape[1]
    if b1.shape != (W,):
        raise ValueError(f"b1 must have shape (W,) = ({W},) (mlp.0.bias), got {b1.shape}")
    if w2.ndim != 2 or w2.shape[0] != W:
        raise ValueError(f"w2 must have shape (W, H) with W = {W} (mlp.2.weight.T), got {w2.shape}")
    if b2.shape != (w2.shape[1],):
        raise ValueError(f"b2 must have shape (H,) = ({w2.shape[1]},) (mlp.2.bias), got {b2.shape}")
    return w1, b1, w2, b2


def _hidden(u, w1, b1):
    """The MLP's first layer before the ReLU, ``u w1 + b1`` ``(T, S, W)``, float64."""
    return u[..., None] * w1[0].astype(np.float64) + b1.astype(np.float64)


def fire_mlp(u: ArrayLike, w1: ArrayLike, b1: ArrayLike, w2: ArrayLike, b2: ArrayLike) -> np.ndarray:
    """``f_θ(u)`` per head, ``(H, T, S)``: ``ReLU(u w1 + b1) w2 + b2`` for every entry of ``u`` ``(T, S)``.

    w1 ``(1, W)``, b1 ``(W,)``, w2 ``(W, H)``, b2 ``(H,)``; computed in float64, returned in the
    weights' floating dtype.
    """
    w1, b1, w2, b2 = _check_mlp(w1, b1, w2, b2)
    u = as_float_array(u, "u").astype(np.float64)
    check_alloc((*u.shape, w1.shape[1]), np.float64, "fire_mlp(u, ...)'s hidden layer (T, S, W)", copies=2)
    with np.errstate(over="ignore", invalid="ignore"):
        a = np.maximum(_hidden(u, w1, b1), 0.0)                        # ReLU(u w1 + b1), (T, S, W)
        out = a @ w2.astype(np.float64) + b2.astype(np.float64)        # (T, S, H)
        out = np.moveaxis(out, -1, 0).astype(np.result_type(w1, b1, w2, b2))   # (H, T, S)
    return check_result(np.ascontiguousarray(out), "the FIRE bias")


def fire_bias(w1: ArrayLike, b1: ArrayLike, w2: ArrayLike, b2: ArrayLike, q_positions: ArrayLike,
              k_positions: ArrayLike, *, c: float = 0.1, threshold: float = 512.0, eps: float = 1e-6) -> np.ndarray:
    """The FIRE bias ``(H, T, S)``: ``f_θ(ψ(i - j) / (ψ(max(L, i)) + ε))`` (``fire_mlp`` of ``fire_distance``).

    w1 ``(1, W)``, b1 ``(W,)``, w2 ``(W, H)``, b2 ``(H,)``: the MLP (``mlp.0``, ``mlp.2`` of the
    reference, weights transposed); q_positions ``(T,)``, k_positions ``(S,)``; ``c``, ``threshold``
    (``L``, >= 0) and ``eps`` as in ``fire_distance``. The result has the weights' floating dtype.
    """
    w1, b1, w2, b2 = _check_mlp(w1, b1, w2, b2)
    u = fire_distance(q_positions, k_positions, c=c, threshold=threshold, eps=eps)   # (T, S)
    return fire_mlp(u, w1, b1, w2, b2)


def fire_bias_backward(dbias: ArrayLike, w1: ArrayLike, b1: ArrayLike, w2: ArrayLike, b2: ArrayLike,
                       q_positions: ArrayLike, k_positions: ArrayLike, *, c: float = 0.1, threshold: float = 512.0,
                       eps: float = 1e-6) -> dict:
    """The gradients of ``fire_bias`` for the bias gradient ``dbias`` ``(..., H, T, S)`` (leading dims
    summed): ``{"w1", "b1", "w2", "b2"}`` of the weights' shapes and dtypes, and ``"c"`` and
    ``"threshold"`` (``L``) as Python floats. Same arguments as ``fire_bias``.

    With ``g = dbias`` per entry, ``h = u w1 + b1``, ``a = ReLU(h)``:
    ``db2 = Σ g``, ``dw2 = Σ a^T g``, ``dh = (g w2^T) [h > 0]``, ``db1 = Σ dh``, ``dw1 = Σ u dh``,
    ``du = dh w1^T``; then ``u = r / n`` with ``r = ψ(i - j)``, ``n = ψ(max(L, i)) + ε`` gives
    ``dc = Σ du (r'_c / n - r n'_c / n²)`` and ``dL = Σ du (-r / n²) ψ'(m) [L > i]`` (half at ``L = i``),
    ``r'_c = sign(c) |i - j| / (|c (i - j)| + 1)``, ``ψ'(m) = |c| / (|c m| + 1)``.
    """
    w1, b1, w2, b2 = _check_mlp(w1, b1, w2, b2)
    q, k, c, threshold, eps = _positions_and_config(q_positions, k_positions, c, threshold, eps)
    dbias = as_float_array(dbias, "dbias")
    H, W = w2.shape[1], w1.shape[1]
    if dbias.ndim < 3 or dbias.shape[-3:] != (H, q.size, k.size):
        raise ValueError(f"dbias must have shape (..., H, T, S) = (..., {H}, {q.size}, {k.size}), got {dbias.shape}")
    check_alloc((q.size, k.size, W), np.float64, "fire_bias_backward's hidden layer (T, S, W)", copies=4)
    r, n, d, m = _distance_parts(q, k, c, threshold, eps)
    u = r / n                                                          # (T, S)
    with np.errstate(over="ignore", invalid="ignore"):
        g = np.moveaxis(dbias.sum(axis=tuple(range(dbias.ndim - 3))).astype(np.float64), 0, -1)   # (T, S, H)
        h = _hidden(u, w1, b1)                                         # (T, S, W)
        a = np.maximum(h, 0.0)
        dw2 = a.reshape(-1, W).T @ g.reshape(-1, H)                    # Σ a^T g, (W, H)
        dh = (g @ w2.astype(np.float64).T) * (h > 0)                   # (T, S, W)
        dw1 = np.einsum("ts,tsw->w", u, dh)[None, :]                   # Σ u dh, (1, W)
        du = dh @ w1[0].astype(np.float64)                             # (T, S)
        dr_dc = np.sign(c) * np.abs(d) / (np.abs(c * d) + 1.0)         # ∂ψ(i - j)/∂c
        dn_dc = np.sign(c) * np.abs(m) / (np.abs(c * m) + 1.0)         # ∂ψ(m)/∂c, (T, 1)
        dc = np.sum(du * (dr_dc / n - r * dn_dc / n ** 2))
        share = np.where(threshold > q, 1.0, np.where(threshold == q, 0.5, 0.0))[:, None]   # ∂ max(L, i)/∂L
        dL = np.sum(du * (-r / n ** 2) * (abs(c) / (np.abs(c * m) + 1.0)) * share)
        grads = {"w1": dw1, "b1": dh.sum(axis=(0, 1)), "w2": dw2, "b2": g.sum(axis=(0, 1))}
    out = {name: check_result(grad.astype(like.dtype), f"the gradient of {name} for this dbias")
           for (name, grad), like in zip(grads.items(), (w1, b1, w2, b2))}
    out["c"] = float(check_result(np.asarray(dc), "the gradient of c for this dbias"))
    out["threshold"] = float(check_result(np.asarray(dL), "the gradient of threshold for this dbias"))
    return out


# --------------------------------------------------------------------------- the scheme the layer runs

class FIRE(Scheme):
    """FIRE's learned bias (Li et al. 2023): ``f_θ(ψ(i - j) / (ψ(max(L, i)) + ε))`` per head, causal.

    Learned: the MLP ``w1`` ``(1, mlp_width)``, ``b1`` ``(mlp_width,)``, ``w2`` ``(mlp_width, H)``,
    ``b2`` ``(H,)``, and the 0-d ``c`` (initialised to ``init_c``) and ``L_multiplier`` (initialised to
    1): the threshold is ``L = |L_multiplier · init_L|``. ``init_L`` (512 in the reference), ``eps``
    (1e-6) and ``mlp_width`` (32) are fixed. The logits keep the usual ``1/sqrt(D)`` on ``q . k``.
    """

    name = "fire"
    seams = ("bias",)
    sign_convention = (r"distance $i - j$ (query minus key) as $\psi(i - j) = \log(\lvert c (i - j) \rvert + 1)$, "
                       r"over the query's own $\psi(\max(L, i))$; the absolute value counts a key after the query "
                       r"at $\lvert i - j \rvert$",
                       r"Li et al. 2023 and the reference `FIRE` module; `fire_distance`, `fire_bias`")
    terms = ("content-content", "position-position")

    def __init__(self, *, mlp_width: int = 32, init_c: float = 0.1, init_L: float = 512.0, eps: float = 1e-6):
        self.mlp_width = check_positive_int(mlp_width, "mlp_width")
        self.init_c = check_float(init_c, "init_c")
        self.init_L = check_float(init_L, "init_L", positive=True)
        self.eps = check_float(eps, "eps", positive=True)

    def bind(self, layer, rng):
        super().bind(layer, rng)
        dtype, W, H = layer.dtype, self.mlp_width, self.num_heads
        uniform = lambda shape, fan_in: rng.uniform(-1, 1, shape).astype(dtype) * dtype.type(1 / math.sqrt(fan_in))  # noqa: E731
        self.w1, self.b1 = uniform((1, W), 1), uniform((W,), 1)          # nn.Linear(1, W)
        self.w2, self.b2 = uniform((W, H), W), uniform((H,), W)          # nn.Linear(W, H)
        self.c, self.L_multiplier = np.array(self.init_c, dtype), np.array(1.0, dtype)

    @property
    def c(self) -> np.ndarray:
        """``c`` of ``ψ(x) = log(|c x| + 1)``, a 0-d array (a scalar assigned here becomes one)."""
        return self._c

    @c.setter
    def c(self, value):
        self._c = _scalar(value, "c")

    @property
    def L_multiplier(self) -> np.ndarray:
        """The learned factor of the threshold ``L = |L_multiplier · init_L|``, a 0-d array."""
        return self._L_multiplier

    @L_multiplier.setter
    def L_multiplier(self, value):
        self._L_multiplier = _scalar(value, "L_multiplier")

    def threshold(self) -> float:
        """``L = |L_multiplier · init_L|``."""
        return abs(float(self.L_multiplier) * self.init_L)

    def parameters(self):
        return {"w1": self.w1, "b1": self.b1, "w2": self.w2, "b2": self.b2, "c": self.c,
                "L_multiplier": self.L_multiplier}

    def bias(self, q_positions, k_positions):
        return fire_bias(self.w1, self.b1, self.w2, self.b2, q_positions, k_positions, c=float(self.c),
                         threshold=self.threshold(), eps=self.eps)                     # (H, T, S)

    def bias_backward(self, q_positions, k_positions, dbias):
        g = fire_bias_backward(dbias, self.w1, self.b1, self.w2, self.b2, q_positions, k_positions,
                               c=float(self.c), threshold=self.threshold(), eps=self.eps)
        scaled = float(self.L_multiplier) * self.init_L
        d_mult = g["threshold"] * math.copysign(1.0, scaled) * self.init_L if scaled else 0.0   # L = |m init_L|
        grads = {f"scheme.{name}": g[name] for name in ("w1", "b1", "w2", "b2")}
        grads["scheme.c"] = np.array(g["c"], self.c.dtype)
        grads["scheme.L_multiplier"] = np.array(d_mult, self.L_multiplier.dtype)
        return grads

    def settings(self):  # init_c only starts the learned c; init_L scales the threshold at every call
        return (("mlp_width", self.mlp_width), ("init_L", self.init_L), ("eps", self.eps))

    def __repr__(self) -> str:
        return f"FIRE(mlp_width={self.mlp_width}, init_c={self.init_c}, init_L={self.init_L}, eps={self.eps})"


def _scalar(value, name: str) -> np.ndarray:
    """``value`` as a finite 0-d floating array (a NumPy or Python scalar becomes one)."""
    arr = as_float_array(value, name)
    if arr.ndim != 0:
        raise ValueError(f"{name} must be a scalar (a 0-d array), got shape {arr.shape}")
    return arr if isinstance(value, np.ndarray) else np.array(arr)
