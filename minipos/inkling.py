r"""Inkling 2's decoder attention: no RoPE; position enters through a relative bias that each query mixes
from its own hidden state, short causal convolutions of the keys and values, and a logarithmic query scale.

Source: transformers 5.24, ``models/inkling2/modeling_inkling2.py`` (``Inkling2SlidingAttention``,
``Inkling2FullAttention`` and the modules they call). With ``x`` ``(B, T, d_model)`` the layer's input, ``p``
the query positions and ``j`` the key positions, each head ``h`` computes (H query heads, KV key/value heads,
head dim D, kernel K, bias extent E, relative-state width d_rel)::

    q      = clip(q_scale ⊙ heads(x wq), τ_qk) · s(p)                   (B, H, T, D)     s = 1 on sliding layers
    u_k    = x_k wk,   u_v = x_v wv                                      (B, T, KV*D)     x_k = x_v = x unless given
    k      = clip(conv(u_k), τ_qk),   v = rms(conv(u_v))                 (B, KV, S, D)    rms: RMSNorm without a weight
    r      = clip(rel_scale ⊙ heads(x rel_w), τ_rel) · s(p)              (B, H, T, d_rel) the relative states
    b[i,j] = (r_i rel_proj)[p_i - j]  if 0 <= p_i - j < E, else 0        (B, H, T, S)     the relative bias
    sink   = x w_sink                                                    (B, H, T)        one per query and head
    out    = softmax([D^-1/2 q k^T + b | sink]) v, the sink column dropped (masked: causal, and the window W)
    y      = (merge(out) ⊙ sigmoid(x wg)) wo                             (B, T, d_model)

with ``clip(a, τ) = a · min(1, τ / (|a| + 1e-6))`` on each head's vector (HF ``Inkling2L2Clip``) and the
logarithmic scale of the full-attention layers (HF ``Inkling2LogScale``)::

    s(p) = 1 + alpha · ln(max((p + 1) / n_floor, 1))                    1 until p + 1 = n_floor, then grows like ln p

The bias is what replaces RoPE: a trained bank of E-long profiles of bias against backward distance
(``rel_proj``, ``(d_rel, E)``), which each query mixes by its own relative state. It is zero for keys E or more
tokens back (and for keys after the query): beyond E, nothing in a logit depends on the distance itself. A sliding
layer's E is its window W, so its bias covers exactly the keys it sees.

The convolutions (HF ``Inkling2ShortConvolution`` on the sliding layers, ``Inkling2DynamicShortConvolution``
on the full ones) mix each channel over the last K tokens, with a residual, before the clip and the norm::

    conv(u)_t = (u_t + Σ_{l<K} w_{t,l} ⊙ ũ_{t-l}) / sqrt(c)
    static:   w_{t,l} = conv[l]                              c = K + 1    (K, KV*D): HF conv1d.weight[:, 0].flip(-1).T
    dynamic:  w_{t,l} = conv[l] + (x_k,t conv_w)_{g,l}       c = 2K + 1   K per-token taps (one per lag) per
                                                                           key/value head g, on its D channels

``ũ`` is ``u`` with the call's padding zeroed (a ``(B, S)`` mask's last T columns, HF's ``conv_mask``; not for
a single-token call, which HF never pads), preceded by the K - 1 inputs before the call (zeros at the start of a
sequence, else the cache's: ``InklingCache``). The taps are indexed by lag: ``conv[0]`` weights the token itself.
HF's conv state holds the last K inputs, channels first, ``(B, KV*D, K)``: ``InklingCache.conv_k`` is its
``[..., 1:]`` transposed.

Not position machinery, but part of the map: the clips, the values' RMSNorm and the sigmoid output gate
(``minipos.gate``, ``"feature"``); ``wg = None`` switches the gate off. The model calls its sliding layers on one
input; a full layer after the first gets three, the query's, the keys' and the values' own mixes of the residual
stream, each through its own RMSNorm (``hidden_states``, ``key_hidden_states``, ``value_hidden_states``; the dynamic
taps are projected from the keys' and the values' inputs). This layer takes them as ``x``, ``x_k`` and ``x_v``
(``x_k``, ``x_v`` default to ``x``).

Positions: ``p`` is the layer's ``positions`` (one row for the batch) for both the bias's distances and the log
scale. HF counts the distances from the cache's sequence indices and the scale from ``position_ids`` (per row);
they agree unless ``position_ids`` are shifted, as ``generate`` does for left-padded rows, which matters only where
``p + 1 > n_floor``. Precision: HF computes the clips with their learned scales, the log scale, the convolutions
(the dynamic taps too), the values' norm, the softmax with its sinks and the gate in float32 (``.float()``, which
casts a float64 model's tensors down); minipos computes every step in the dtype of ``x`` and the weights (NumPy's
promotion: float64 for float64 weights).

Conventions: weights ``(d_in, d_out)`` used as ``x @ W``; heads laid out ``h * D + d`` (HF ``view``).
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (Overflow, as_float_array, as_positions, check_alloc, check_bool, check_context, check_float,
                      check_overflow, check_positive_int, check_weighted)
from .attention import attention, attention_backward, blockwise_attention, blockwise_attention_backward
from .cache import KVCache
from .gate import OutputGate
from .layer import MultiHeadAttention
from .mla import rms_norm, rms_norm_backward
from .seams import NoPE

__all__ = ["l2_clip", "l2_clip_backward", "log_scale", "short_conv", "short_conv_backward", "relative_bias",
           "relative_bias_backward", "InklingAttention", "InklingCache", "InklingContext"]

CLIP_EPS = 1e-6
"""The ``1e-6`` HF adds to the norm in ``Inkling2L2Clip``."""


# --------------------------------------------------------------------------- the pieces, as plain functions

def _wide(a):  # a in float64 (or longdouble): the norms below neither overflow nor underflow in it
    return a.astype(np.promote_types(a.dtype, np.float64), copy=False)


def _norm_and_unit(a):
    """``(|a|, a / |a|)`` over the last axis of a wide array, ``(..., 1)`` and ``(..., D)``, computed from ``a`` scaled
    by its largest entry first, so that no square overflows (a zero vector: norm 0, unit 0)."""
    m = np.max(np.abs(a), axis=-1, keepdims=True) if a.shape[-1] else np.zeros((*a.shape[:-1], 1), a.dtype)
    safe = np.where(m > 0, m, 1.0)
    scaled = a / safe
    n = m * np.sqrt(np.sum(scaled * scaled, axis=-1, keepdims=True))     # |a| = m |a / m|
    return n, np.where(n > 0, a / np.where(n > 0, n, 1.0), 0.0)


def _check_clip(a, threshold):
    a = as_float_array(a, "a")
    if a.ndim < 1:
        raise ValueError(f"a must have shape (..., D), one vector per row, got a scalar of shape {a.shape}")
    return a, check_float(threshold, "threshold", positive=True)


def l2_clip(a: ArrayLike, threshold: float) -> np.ndarray:
    """``a · min(1, threshold / (|a| + 1e-6))`` over the last axis: a vector longer than ``threshold`` is
    shortened to it, a shorter one kept. ``(..., D) -> (..., D)`` in a's dtype (the norm computed wide and scaled,
    so any finite ``a`` is clipped right)."""
    a, threshold = _check_clip(a, threshold)
    w = _wide(a)
    n, _ = _norm_and_unit(w)                                               # (..., 1)
    return (w * np.minimum(1.0, threshold / (n + CLIP_EPS))).astype(a.dtype, copy=False)


def l2_clip_backward(a: ArrayLike, threshold: float, d: ArrayLike) -> np.ndarray:
    """The gradient of ``l2_clip(a, threshold)`` for the output gradient ``d`` (a's shape): ``c d`` where the
    vector is kept (``c = 1``), and ``c d - c (â · d) â |a| / (|a| + 1e-6)`` where it is clipped
    (``c = threshold / (|a| + 1e-6)``, ``â = a / |a|``; 0 at ``a = 0``)."""
    a, threshold = _check_clip(a, threshold)
    d = as_float_array(d, "d")
    if d.shape != a.shape:
        raise ValueError(f"d must have the shape of a {a.shape}, got {d.shape}")
    w, dw = _wide(a), _wide(d)
    n, unit = _norm_and_unit(w)
    c = threshold / (n + CLIP_EPS)
    clipped = c < 1.0
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        radial = c * np.sum(unit * dw, axis=-1, keepdims=True) * (n / (n + CLIP_EPS)) * unit
        got = np.where(clipped, c * dw - radial, dw).astype(np.result_type(a, d), copy=False)
    return check_overflow(got, "l2_clip_backward's gradient", "d")


def log_scale(positions: ArrayLike, *, alpha: float, n_floor: int) -> np.ndarray:
    """``s(p) = 1 + alpha ln(max((p + 1) / n_floor, 1))`` for each position, float64 ``(T,)`` (HF
    ``Inkling2LogScale``; 1 for ``p + 1 <= n_floor``)."""
    p = as_positions(positions, "positions")
    alpha = check_float(alpha, "alpha", minimum=0.0)
    n_floor = check_positive_int(n_floor, "n_floor")
    with np.errstate(over="ignore"):                                      # checked just below
        s = 1.0 + alpha * np.log(np.maximum((p + 1.0) / n_floor, 1.0))
    if not np.isfinite(s).all():
        raise ValueError(f"alpha ({alpha:g}) makes s(p) overflow float64 at position {int(p.max())}; alpha must "
                         "be smaller")
    return s


def _check_conv(u, history, taps, dynamic, keep):
    u, history, taps = as_float_array(u, "u"), as_float_array(history, "history"), as_float_array(taps, "taps")
    if u.ndim != 3:
        raise ValueError(f"u must have shape (B, T, C), got {u.shape}")
    B, T, C = u.shape
    if taps.ndim != 2 or taps.shape[1] != C or taps.shape[0] < 1:
        raise ValueError(f"taps must have shape (K, C) with K >= 1 and C = {C}, got {taps.shape}")
    K = taps.shape[0]
    if history.shape != (B, K - 1, C):
        raise ValueError(f"history must have shape (B, K - 1, C) = {(B, K - 1, C)}, got {history.shape}")
    with np.errstate(over="ignore"):                                      # checked just below
        if not np.isfinite(history.astype(u.dtype)).all():
            raise ValueError(f"history must fit u's dtype {u.dtype}, got values up to {np.abs(history).max():.3g}")
    if dynamic is not None:
        dynamic = as_float_array(dynamic, "dynamic")
        if dynamic.ndim != 4 or dynamic.shape[:2] != (B, T) or dynamic.shape[3] != K or dynamic.shape[2] < 1 \
                or C % dynamic.shape[2]:
            raise ValueError(f"dynamic must have shape (B, T, G, K) = ({B}, {T}, G, {K}) with G >= 1 dividing "
                             f"C = {C}, got {dynamic.shape}")
    if keep is not None:
        keep = np.asarray(keep)
        if keep.dtype != bool:
            raise TypeError(f"keep must be a boolean array (False: a padded token), got dtype {keep.dtype}")
        if keep.shape != (B, T):
            raise ValueError(f"keep must have shape (B, T) = {(B, T)}, got {keep.shape}")
    return u, history, taps, dynamic, keep


def _conv_weights(taps, dynamic, B, T):
    """The taps of each token ``(B, T, C, K)`` (lag last): ``taps`` alone, or plus each group's dynamic tap."""
    K, C = taps.shape
    w = np.broadcast_to(taps.T, (B, T, C, K))
    if dynamic is None:
        return w
    G = dynamic.shape[2]
    return w + np.repeat(dynamic, C // G, axis=2)                         # group g's tap on its C / G channels


def _conv_context(u, history, keep):  # (B, K - 1 + T, C): the inputs before the call, then ũ
    tilde = u if keep is None else u * keep[..., None]
    return np.concatenate([history.astype(u.dtype, copy=False), tilde], axis=1)


def short_conv(u: ArrayLike, history: ArrayLike, taps: ArrayLike, *, dynamic: ArrayLike | None = None,
               keep: ArrayLike | None = None) -> np.ndarray:
    """``conv(u)_t = (u_t + Σ_l w_{t,l} ⊙ ũ_{t-l}) / sqrt(c)`` (module docstring), ``(B, T, C)``.

    u: this call's inputs ``(B, T, C)``; history: the K - 1 inputs before them ``(B, K - 1, C)`` (zeros at the
    start of a sequence); taps: ``(K, C)``, ``taps[l]`` weighting the token ``l`` back; dynamic: ``(B, T, G, K)``
    per-token taps, one per group of ``C / G`` channels, added to ``taps`` (then ``c = 2K + 1``; else
    ``c = K + 1``); keep: ``(B, T)`` booleans, False zeroes that token's input to the taps (padding), or None.
    """
    u, history, taps, dynamic, keep = _check_conv(u, history, taps, dynamic, keep)
    B, T, _ = u.shape
    K = taps.shape[0]
    context = _conv_context(u, history, keep)
    w = _conv_weights(taps, dynamic, B, T)                                 # (B, T, C, K)
    y = u.copy()                                                           # the residual u_t
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        for lag in range(K):                                               # a loop over the K taps
            y += w[..., lag] * context[:, K - 1 - lag: K - 1 - lag + T]   # w_{t,l} ⊙ ũ_{t-l}
        y = y / math.sqrt(2 * K + 1 if dynamic is not None else K + 1)
    return check_overflow(y, "short_conv's output", "u, history, taps or dynamic")


def short_conv_backward(u: ArrayLike, history: ArrayLike, taps: ArrayLike, dy: ArrayLike, *,
                        dynamic: ArrayLike | None = None, keep: ArrayLike | None = None) -> tuple:
    """``(du, dtaps, ddynamic)`` of ``short_conv`` for ``dy`` ``(B, T, C)`` (``ddynamic`` None without
    ``dynamic``); the history is a constant (an earlier call's)."""
    u, history, taps, dynamic, keep = _check_conv(u, history, taps, dynamic, keep)
    dy = as_float_array(dy, "dy")
    if dy.shape != u.shape:
        raise ValueError(f"dy must have the shape of u {u.shape}, got {dy.shape}")
    B, T, C = u.shape
    K = taps.shape[0]
    context = _conv_context(u, history, keep)
    w = _conv_weights(taps, dynamic, B, T)
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        g = dy / math.sqrt(2 * K + 1 if dynamic is not None else K + 1)   # (B, T, C)
        dcontext = np.zeros(context.shape, np.result_type(context, g))
        dw = np.empty((B, T, C, K), np.result_type(context, g))
        for lag in range(K):
            dcontext[:, K - 1 - lag: K - 1 - lag + T] += w[..., lag] * g  # d ũ_{t-l} += w_{t,l} g_t
            dw[..., lag] = g * context[:, K - 1 - lag: K - 1 - lag + T]   # d w_{t,l} = g_t ũ_{t-l}
        dtilde = dcontext[:, K - 1:]
        du = g + (dtilde if keep is None else dtilde * keep[..., None])
        dtaps = dw.sum(axis=(0, 1)).T                                      # (K, C)
        ddynamic = None
        if dynamic is not None:
            G = dynamic.shape[2]
            ddynamic = dw.reshape(B, T, G, C // G, K).sum(axis=3)          # a group's channels share its tap
    for name, got in (("du", du), ("dtaps", dtaps), ("ddynamic", ddynamic)):
        if got is not None:
            check_overflow(got, f"short_conv_backward's {name}", "dy (or u and the taps)")
    return du, dtaps, ddynamic


def _distances(q_positions, k_positions, extent):
    d = q_positions[:, None] - k_positions[None, :]                        # (T, S): p_i - j, backward
    return np.clip(d, 0, extent - 1), (d >= 0) & (d < extent)


def relative_bias(rel: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike) -> np.ndarray:
    """``b[..., i, j] = rel[..., i, p_i - j]`` where ``0 <= p_i - j < E``, else 0: ``(..., T, E) -> (..., T, S)``.

    rel: each query's bias at backward distances 0 … E - 1 (``r_i rel_proj``); positions ``(T,)`` and ``(S,)``
    (HF ``Inkling2RelativePositionBias``'s gather).
    """
    rel = as_float_array(rel, "rel")
    qp, kp = as_positions(q_positions, "q_positions"), as_positions(k_positions, "k_positions")
    if rel.ndim < 2 or rel.shape[-2] != len(qp) or rel.shape[-1] < 1:
        raise ValueError(f"rel must have shape (..., T, E) with T = {len(qp)} and E >= 1, got {rel.shape}")
    index, inside = _distances(qp, kp, rel.shape[-1])
    check_alloc((*rel.shape[:-1], len(kp)), rel.dtype, "the relative bias (..., T, S)")
    got = np.take_along_axis(rel, np.broadcast_to(index, (*rel.shape[:-1], len(kp))), axis=-1)
    return np.where(inside, got, 0.0).astype(rel.dtype, copy=False)


def relative_bias_backward(dbias: ArrayLike, q_positions: ArrayLike, k_positions: ArrayLike,
                           extent: int) -> np.ndarray:
    """The gradient of ``rel`` ``(..., T, E)`` in ``relative_bias`` for ``dbias`` ``(..., T, S)``: each
    ``dbias[..., i, j]`` inside the extent summed into ``drel[..., i, p_i - j]``."""
    dbias = as_float_array(dbias, "dbias")
    qp, kp = as_positions(q_positions, "q_positions"), as_positions(k_positions, "k_positions")
    E = check_positive_int(extent, "extent")
    T, S = len(qp), len(kp)
    if dbias.ndim < 2 or dbias.shape[-2:] != (T, S):
        raise ValueError(f"dbias must have shape (..., T, S) with (T, S) = {(T, S)} (the positions' lengths), got "
                         f"{dbias.shape}")
    lead = dbias.shape[:-2]
    check_alloc((*lead, T, E), dbias.dtype, "the gradient of rel (..., T, extent)")
    drel = np.zeros((*lead, T, E), dbias.dtype)
    index, inside = _distances(qp, kp, E)
    rows, cols = np.nonzero(inside)                                        # the (i, j) inside the extent
    with np.errstate(over="ignore", invalid="ignore"):                    # checked just below
        np.add.at(drel, (..., rows, index[rows, cols]), dbias[..., rows, cols])   # drel[.., i, p_i - j] += dbias[.., i, j]
    return check_overflow(drel, "relative_bias_backward's gradient", "dbias")


# --------------------------------------------------------------------------- the cache and the context

class InklingCache(KVCache):
    """``KVCache`` plus the K - 1 convolution inputs before the next call, ``conv_k`` and ``conv_v``
    ``(B, K - 1, KV*D)`` (``None`` before the first call: zeros), changed only once a call has succeeded. HF's conv
    state ``(B, KV*D, K)`` holds one input more: ``conv_k = state[..., 1:].transpose(0, 2, 1)``."""

    def __init__(self, mem_len: int | None = None):
        super().__init__(mem_len)
        self.conv_k = self.conv_v = None
        self._staged = None

    def commit(self, count: int, tag=None) -> None:
        super().commit(count, tag)
        if self._staged is not None:
            self.conv_k, self.conv_v = self._staged
            self._staged = None


@dataclass(frozen=True, eq=False)
class InklingContext:
    """What ``InklingAttention.backward`` needs of a forward pass (``return_context=True``); no reference to
    the layer."""

    x: np.ndarray              # (B, T, d_model)
    positions: np.ndarray      # (T,)
    k_positions: np.ndarray    # (S,)
    mask: np.ndarray | None    # (B, 1|H, 1|T, S)
    causal: bool
    past: int                  # cached keys in front of this call's
    keep: np.ndarray | None    # (B, T): the convolutions' padding (False: zeroed), or None
    history: tuple             # (conv_k, conv_v), each (B, K - 1, KV*D): the inputs before this call
    x_kv: tuple                # (x_k, x_v): the keys' and the values' inputs, each None where it is x
    k: np.ndarray              # every key attended (B, KV, S, D)
    v: np.ndarray              # (B, KV, S, D)
    out: np.ndarray            # attention's output (B, H, T, D)
    lse: np.ndarray | None     # the blockwise path's (B, H, T)
    merged: np.ndarray         # after the gate (B, T, H*D)
    configuration: tuple = ()

    @property
    def x_in(self):            # the gate reads the layer input (minipos.gate)
        return self.x


# --------------------------------------------------------------------------- the layer

class InklingAttention(OutputGate, MultiHeadAttention):
    """Inkling 2's decoder attention (module docstring), a sliding-window layer (``sliding_window=W``: static
    convolutions, bias extent W) or a full one (``dynamic_conv=True``, ``log_scaling=(alpha, n_floor)``).

    Takes ``MultiHeadAttention``'s sizes (``num_kv_heads``, ``head_dim``), ``block_size``, ``sliding_window``
    and ``scale``, and: ``d_rel`` (HF ``d_rel``), ``rel_extent`` E (HF ``rel_extent``, default 1024; a sliding
    layer's is its window), ``conv_kernel`` K (HF ``conv_kernel_size``), ``dynamic_conv``, ``log_scaling`` (``None``, or HF's
    ``(log_scaling_alpha, log_scaling_n_floor)``), ``qk_clip`` (HF ``qk_l2_clip_threshold``), ``rel_clip``
    (``rel_l2_clip_threshold``), ``norm_eps`` (``rms_norm_eps``). Its scheme is ``NoPE``: the position
    machinery is the layer's own. Weights, HF's ``Inkling2SlidingAttention`` / ``Inkling2FullAttention`` names:

    ==============  ==========================  ==============================================================
    minipos         shape                       HF
    ==============  ==========================  ==============================================================
    ``wq``          (d_model, H*D)              ``q_proj.linear.weight.T``
    ``q_scale``     (H, D)                      ``q_proj.norm.scale``
    ``wk``, ``wv``  (d_model, KV*D)             ``k_proj.linear.weight.T``, ``v_proj.linear.weight.T``
    ``k_conv``      (K, KV*D)                   sliding: ``k_proj.sconv.conv1d.weight[:, 0].flip(-1).T``;
    ``v_conv``                                  full: ``k_proj.sconv.static_weight`` (v likewise)
    ``k_conv_w``    (d_model, KV*K)             full only: ``k_proj.sconv.weight_proj.weight.T`` (v likewise)
    ``rel_w``       (d_model, H*d_rel)          ``relative_position_bias.linear.weight.T``
    ``rel_scale``   (H, d_rel)                  ``relative_position_bias.norm.scale``
    ``rel_proj``    (d_rel, E)                  ``relative_position_bias.proj``
    ``w_sink``      (d_model, H)                ``sink_proj.weight.T``
    ``wg``          (d_model, H*D)              ``o_proj.gate_proj.weight.T`` (``None``: no gate)
    ``wo``          (H*D, d_model)              ``o_proj.linear.weight.T``
    ==============  ==========================  ==============================================================

    Called like every layer, ``layer(x, positions=p, causal=True)``, and ``x_k=``, ``x_v=`` for a full layer's own
    key and value inputs; ``new_cache()`` gives an ``InklingCache``. ``backward(ctx, dy)`` returns the gradients of
    ``x`` (and ``x_k``, ``x_v``) and of every weight above.
    """

    def __init__(self, d_model: int, num_heads: int, *, d_rel: int = 16, rel_extent: int | None = None,
                 conv_kernel: int = 4, dynamic_conv: bool = False, log_scaling: tuple | None = None,
                 qk_clip: float = 22.627416997969522, rel_clip: float = 8.0, norm_eps: float = 1e-6,
                 scheme=None, **kwargs):
        self.d_rel = check_positive_int(d_rel, "d_rel")
        self.conv_kernel = check_positive_int(conv_kernel, "conv_kernel")
        self.dynamic_conv = check_bool(dynamic_conv, "dynamic_conv")
        self.log_scaling = self._check_log_scaling(log_scaling)
        self.qk_clip = check_float(qk_clip, "qk_clip", positive=True)
        self.rel_clip = check_float(rel_clip, "rel_clip", positive=True)
        self.norm_eps = check_float(norm_eps, "norm_eps", positive=True)
        window = kwargs.get("sliding_window")
        if window is not None and rel_extent not in (None, window):
            raise ValueError(f"rel_extent ({rel_extent}) is the window ({window}) on a sliding layer (HF); leave "
                             "it out")
        self._extent_name = "rel_extent" if window is None else "sliding_window"       # E: an error names it
        self.rel_extent = check_positive_int(window if window is not None else 1024 if rel_extent is None
                                             else rel_extent, "sliding_window" if window is not None else "rel_extent")
        if scheme is not None and type(scheme) is not NoPE:
            raise ValueError(f"InklingAttention carries its own position machinery (a relative bias, convolutions, "
                             f"a log scale); its scheme is NoPE, got {type(scheme).__name__}")
        if kwargs.get("sinks"):
            raise ValueError("InklingAttention's sinks are per query (w_sink); sinks=True is gpt-oss's per-head kind")
        self.gate = "feature"
        super().__init__(d_model, num_heads, scheme=NoPE(), **kwargs)

    @staticmethod
    def _check_log_scaling(log_scaling):
        if log_scaling is None:
            return None
        if not isinstance(log_scaling, (tuple, list)) or len(log_scaling) != 2:
            raise TypeError(f"log_scaling must be None or (alpha, n_floor), got {log_scaling!r}")
        return (check_float(log_scaling[0], "log_scaling alpha", minimum=0.0),
                check_positive_int(log_scaling[1], "log_scaling n_floor"))

    def _init_weights(self, rng, bias):
        super()._init_weights(rng, bias)
        H, KV, D, K, R = self.num_heads, self.num_kv_heads, self.head_dim, self.conv_kernel, self.d_rel
        d, E = self.d_model, self.rel_extent
        for shape, what in (((d, H * R), "rel_w (d_model, num_heads * d_rel)"), ((R, E), f"rel_proj (d_rel, {self._extent_name})"),
                            ((K, KV * D), "k_conv (conv_kernel, num_kv_heads * head_dim)"),
                            ((d, KV * K), "k_conv_w (d_model, num_kv_heads * conv_kernel)")):
            check_alloc(shape, self.dtype, what, copies=2)
        self.q_scale = np.ones((H, D), self.dtype)
        self.k_conv, self.v_conv = (self._init(rng, K, KV * D) for _ in range(2))
        self.k_conv_w = self._init(rng, self.d_model, KV * K) if self.dynamic_conv else None
        self.v_conv_w = self._init(rng, self.d_model, KV * K) if self.dynamic_conv else None
        self.rel_w = self._init(rng, self.d_model, H * R)
        self.rel_scale = np.ones((H, R), self.dtype)
        self.rel_proj = self._init(rng, R, self.rel_extent)
        self.w_sink = self._init(rng, self.d_model, H)
        self._init_gate(rng, bias)

    def _weight_shapes(self) -> dict:
        d, H, KV, D, K, R = self.d_model, self.num_heads, self.num_kv_heads, self.head_dim, self.conv_kernel, self.d_rel
        shapes = {**super()._weight_shapes(), "q_scale": ((H, D), "(num_heads, head_dim)", False),
                  "k_conv": ((K, KV * D), "(conv_kernel, num_kv_heads * head_dim)", False),
                  "v_conv": ((K, KV * D), "(conv_kernel, num_kv_heads * head_dim)", False),
                  "rel_w": ((d, H * R), "(d_model, num_heads * d_rel)", False),
                  "rel_scale": ((H, R), "(num_heads, d_rel)", False),
                  "rel_proj": ((R, self.rel_extent), "(d_rel, rel_extent)", False),
                  "w_sink": ((d, H), "(d_model, num_heads)", False), **self._gate_shapes()}
        if self.dynamic_conv:
            shapes.update({name: ((d, KV * K), "(d_model, num_kv_heads * conv_kernel)", False)
                           for name in ("k_conv_w", "v_conv_w")})
        return shapes

    def _check_weights(self) -> None:
        super()._check_weights()
        self._check_gate_weights()

    def configuration(self) -> tuple:
        """``MultiHeadAttention.configuration()`` with the layer's own settings."""
        return (*super().configuration(), ("d_rel", self.d_rel), ("rel_extent", self.rel_extent),
                ("conv_kernel", self.conv_kernel), ("dynamic_conv", self.dynamic_conv),
                ("log_scaling", self.log_scaling), ("qk_clip", self.qk_clip), ("rel_clip", self.rel_clip),
                ("norm_eps", self.norm_eps), ("gate", self.gate if self._gated() else None))

    def new_cache(self, mem_len: int | None = None) -> InklingCache:
        """An empty ``InklingCache`` of this layer (``mem_len``: see ``KVCache``; ``W - 1`` on a sliding layer
        keeps what its window sees)."""
        cache = InklingCache(mem_len)
        cache._owner = weakref.ref(self)
        return cache

    # ----------------------------------------------------------------------- forward

    def _scale_of(self, positions):  # (T,) in the layer's dtype: s(p) on a full layer, ones on a sliding one
        if self.log_scaling is None:
            return np.ones(len(positions), self.dtype)
        alpha, n_floor = self.log_scaling
        try:
            s = log_scale(positions, alpha=alpha, n_floor=n_floor)
        except ValueError as err:
            raise ValueError(f"log_scaling: {err}") from None
        with np.errstate(over="ignore"):
            if not np.isfinite(s.astype(self.dtype)).all():
                raise ValueError(f"log_scaling: alpha ({alpha:g}) makes s(p) overflow {self.dtype} at position "
                                 f"{int(np.max(positions))}; alpha must be smaller")
        return s.astype(self.dtype)

    def _parts(self, x, positions, keep, history, x_kv=(None, None)):
        """Everything before attention, from the input ``x`` and the keys' and values' inputs ``x_kv`` (``None``:
        ``x``) (module docstring's first five lines): a dict of the intermediate arrays, which ``backward`` computes
        again."""
        xk, xv = (x if a is None else a for a in x_kv)
        B, T, _ = x.shape
        H, KV, D, K = self.num_heads, self.num_kv_heads, self.head_dim, self.conv_kernel
        s = self._scale_of(positions)[:, None, None]                          # (T, 1, 1)
        with np.errstate(over="ignore", invalid="ignore"):                   # checked by check_weighted below
            lin_q = x @ self.wq if self.bq is None else x @ self.wq + self.bq
            a_q = lin_q.reshape(B, T, H, D) * self.q_scale                      # q_scale ⊙ heads(x wq)
            lin_r = x @ self.rel_w
            a_r = lin_r.reshape(B, T, H, self.d_rel) * self.rel_scale
            u_k = xk @ self.wk if self.bk is None else xk @ self.wk + self.bk   # (B, T, KV*D)
            u_v = xv @ self.wv if self.bv is None else xv @ self.wv + self.bv
            dyn_k = None if not self.dynamic_conv else (xk @ self.k_conv_w).reshape(B, T, KV, K)
            dyn_v = None if not self.dynamic_conv else (xv @ self.v_conv_w).reshape(B, T, KV, K)
            sinks = (x @ self.w_sink).transpose(0, 2, 1)                        # (B, H, T)
        for name, a in (("q", a_q), ("k", u_k), ("v", u_v), ("relative states", a_r), ("sinks", sinks),
                        ("k_conv_w", dyn_k), ("v_conv_w", dyn_v), ("k_conv", self.k_conv), ("v_conv", self.v_conv)):
            check_weighted(a, name if "_conv" in name else f"the projection {name} of x", self._weights,
                           "x or the weights")
        try:
            c_k = short_conv(u_k, history[0], self.k_conv, dynamic=dyn_k, keep=keep)    # (B, T, KV*D)
            c_v = short_conv(u_v, history[1], self.v_conv, dynamic=dyn_v, keep=keep)
        except ValueError as err:                                           # an overflow (the rest is checked)
            raise Overflow(f"x or the weights are too large: {err}") from None
        with np.errstate(over="ignore", invalid="ignore"):                   # checked just below
            q = l2_clip(a_q, self.qk_clip) * s                                  # (B, T, H, D)
            r = l2_clip(a_r, self.rel_clip) * s                                # (B, T, H, d_rel)
        if not (np.isfinite(q).all() and np.isfinite(r).all()):               # |clip| <= its threshold: s is huge
            raise Overflow(f"the log scale s(p) (up to {float(s.max()):.3g}: log_scaling {self.log_scaling}) times the "
                           f"clipped queries overflows {q.dtype}; log_scaling's alpha (or qk_clip, rel_clip) must be "
                           "smaller")
        k = l2_clip(c_k.reshape(B, T, KV, D), self.qk_clip)
        v = rms_norm(c_v.reshape(B, T, KV, D), np.ones(D, self.dtype), eps=self.norm_eps)
        heads = lambda a: a.transpose(0, 2, 1, 3)                               # noqa: E731  (B, T, n, X) -> (B, n, T, X)
        with np.errstate(over="ignore", invalid="ignore"):
            rel = heads(r) @ self.rel_proj                                      # (B, H, T, E): r_i rel_proj
        check_weighted(rel, "the relative bias r rel_proj", self._weights, "x or the weights")
        return {"s": s, "lin_q": lin_q, "a_q": a_q, "lin_r": lin_r, "a_r": a_r, "u_k": u_k, "u_v": u_v,
                "dyn_k": dyn_k, "dyn_v": dyn_v, "c_k": c_k, "c_v": c_v, "q": heads(q), "r": heads(r),
                "k": heads(k), "v": heads(v), "sinks": sinks, "rel": rel}

    def _history(self, cache, B):
        C, K = self.num_kv_heads * self.head_dim, self.conv_kernel
        if cache is not None and cache.conv_k is not None:
            if cache.conv_k.shape != (B, K - 1, C):
                raise ValueError(f"cache holds convolution inputs of shape {cache.conv_k.shape}; this call needs "
                                 f"(B, K - 1, KV*D) = {(B, K - 1, C)}")
            return cache.conv_k, cache.conv_v
        zeros = np.zeros((B, K - 1, C), self.dtype)
        return zeros, zeros

    @staticmethod
    def _check_input(a, name, x):  # x_k or x_v: a finite float array of x's shape
        a = as_float_array(a, name)
        if a.shape != x.shape:
            raise ValueError(f"{name} must have the shape of x {x.shape} (B, T, d_model), got {a.shape}")
        return a

    @staticmethod
    def _keep(mask, T):  # (B, T) booleans from a (B, S) padding mask (HF's conv_mask), or None
        if mask is None or mask.shape[2] != 1 or mask.shape[1] != 1 or T == 1:
            return None
        return mask[:, 0, 0, mask.shape[-1] - T:]

    def __call__(self, x: ArrayLike, *, positions: ArrayLike | None = None, mask: ArrayLike | None = None,
                 causal: bool = False, cache: InklingCache | None = None, return_weights: bool = False,
                 return_context: bool = False, x_k: ArrayLike | None = None, x_v: ArrayLike | None = None):
        """Attend ``x`` ``(B, T, d_model)`` to itself (and to the cache); return ``(B, T, d_model)``. The
        arguments are ``MultiHeadAttention``'s; a ``(B, S)`` mask also zeroes the padded tokens' inputs to the
        convolutions (module docstring). ``x_k``, ``x_v`` (``x``'s shape; ``None``: ``x``) are the keys' and the
        values' own inputs, as the model's full layers after the first get them (HF ``key_hidden_states``,
        ``value_hidden_states``): the keys' projection and dynamic taps read ``x_k``, the values' ``x_v``; the
        query, the relative states, the sinks and the gate read ``x``."""
        if cache is not None and not isinstance(cache, InklingCache):
            raise TypeError(f"cache must be an InklingCache (layer.new_cache()), got {type(cache).__name__}")
        x, positions, mask, causal = self._check_call(x, positions, mask, causal, cache, return_weights)
        x_kv = tuple(None if a is None else self._check_input(a, name, x) for a, name in ((x_k, "x_k"), (x_v, "x_v")))
        return_context = check_bool(return_context, "return_context")
        B, T, _ = x.shape
        past, k_pos = self._key_positions(positions, cache)
        keep, history = self._keep(mask, T), self._history(cache, B)
        parts = self._parts(x, positions, keep, history, x_kv)
        k, v = parts["k"], parts["v"]                                           # (B, KV, T, D)
        if cache is not None:
            k, v = cache.extend(k, v, positions)[:2]                            # (B, KV, S, D)
        out, weights, lse = self._attend_all(parts, self._repeat_kv(k), self._repeat_kv(v), positions, k_pos, mask,
                                             causal, return_weights, return_context)
        merged = self._gate(x, out.transpose(0, 2, 1, 3).reshape(B, T, self.num_heads * self.head_dim))   # (B, T, H*D)
        y = check_weighted(self._output(merged), "the output projection merged @ wo + bo", self._weights,
                           "x, wo or bo")
        if cache is not None:                                                   # the call succeeded
            cache._staged = tuple(np.concatenate([h, u if keep is None else u * keep[..., None]], axis=1)[:, T:]
                                  for h, u in zip(history, (parts["u_k"], parts["u_v"])))   # the last K - 1 inputs
            self._commit(cache, T, None)
        result = (y, weights) if return_weights else (y,)
        if return_context:
            result += (InklingContext(x, positions, k_pos, mask, causal, len(past), keep, history, x_kv, k, v, out,
                                      lse, merged, self.configuration()),)
        return result if len(result) > 1 else y

    def _attend_all(self, parts, k, v, q_pos, k_pos, mask, causal, return_weights, return_lse):
        """Attention of ``parts["q"]`` over ``k``, ``v`` ``(B, H, S, D)`` with the relative bias and the
        per-query sinks, dense or blockwise: ``(out, weights or None, lse or None)``."""
        rel, allowed = parts["rel"], self._allowed_fn(mask, causal, q_pos, k_pos)
        bias = lambda qs, ks: relative_bias(rel[..., qs, :], q_pos[qs], k_pos[ks])   # noqa: E731
        q, sinks, scale = parts["q"], parts["sinks"], self.attention_scale()
        try:
            if self.block_size is None:
                every = (slice(0, len(q_pos)), slice(0, len(k_pos)))
                got = attention(q, k, v, bias=bias(*every), mask=allowed(*every), scale=scale,
                                return_weights=return_weights, sinks=sinks)
                return (*got, None) if return_weights else (got, None, None)
            got = blockwise_attention(q, k, v, bias_fn=bias, mask_fn=allowed, scale=scale,
                                      block_size=self.block_size, return_lse=return_lse, sinks=sinks)
        except Overflow as err:
            raise Overflow(f"x or the weights are too large: {err}") from None
        return (got[0], None, got[1]) if return_lse else (got, None, None)

    # ----------------------------------------------------------------------- backward

    def backward(self, ctx: InklingContext, dy: ArrayLike) -> dict:
        """The gradients of a pass for ``dy`` ``(B, T, d_model)``: a dict with ``"x"`` (and ``"x_k"``, ``"x_v"`` for
        a pass given them) and every weight by its attribute name. Keys, values and convolution inputs from earlier
        calls are constants."""
        if not isinstance(ctx, InklingContext):
            raise TypeError(f"ctx must be the InklingContext of a forward pass (return_context=True), got "
                            f"{type(ctx).__name__}")
        check_context(self.configuration(), ctx.configuration)
        self._check_weights()
        dy = as_float_array(dy, "dy")
        if dy.shape != ctx.x.shape:
            raise ValueError(f"dy must have the shape of the output {ctx.x.shape}, got {dy.shape}")
        shapes = {"x": ctx.x.shape, **{n: ctx.x.shape for n, a in zip(("x_k", "x_v"), ctx.x_kv) if a is not None},
                  **{n: w.shape for n, w in self._weights().items() if w is not None}}
        if not dy.size:
            return {n: np.zeros(shape, np.result_type(ctx.merged, dy)) for n, shape in shapes.items()}
        grads = {}
        add = lambda name, g: grads.__setitem__(name, g if name not in grads else grads[name] + g)  # noqa: E731
        x, B, T = ctx.x, *dy.shape[:2]
        inputs = {"x": x, "k": x if ctx.x_kv[0] is None else ctx.x_kv[0], "v": x if ctx.x_kv[1] is None else ctx.x_kv[1]}
        outer = lambda d, of="x": inputs[of].reshape(B * T, -1).T @ d.reshape(B * T, -1)   # noqa: E731  input^T d
        parts = self._parts(x, ctx.positions, ctx.keep, ctx.history, ctx.x_kv)
        dxs = {"k": 0.0, "v": 0.0}                                              # the keys' and values' inputs
        with np.errstate(over="ignore", invalid="ignore"):                       # every gradient is checked at the end
            # 8) output projection and gate
            add("wo", ctx.merged.reshape(B * T, -1).T @ dy.reshape(B * T, -1))
            if self.bo is not None:
                add("bo", dy.sum(axis=(0, 1)))
            dmerged, dx = self._gate_backward(ctx, dy @ self.wo.T, add)
            dmerged = check_weighted(dmerged, "dy @ wo^T", self._weights, "dy or wo")
            dout = dmerged.reshape(B, T, self.num_heads, -1).transpose(0, 2, 1, 3)   # (B, H, T, D)
            # 7) attention with the bias and the sinks
            dq, dk, dv, drel, dsinks = self._attend_backward_all(ctx, parts, dout)
            # 6) the bias: rel = r rel_proj; the sinks: x w_sink
            add("rel_proj", np.einsum("bhtr,bhte->re", parts["r"], drel))
            dr = (drel @ self.rel_proj.T).transpose(0, 2, 1, 3)                  # (B, T, H, d_rel)
            add("w_sink", outer(dsinks.transpose(0, 2, 1)))
            dx = dx + dsinks.transpose(0, 2, 1) @ self.w_sink.T
            # the queries and the relative states: clip, then the log scale
            for a_name, d, clip, scale_name, w_name, b_name in (
                    ("a_q", dq.transpose(0, 2, 1, 3), self.qk_clip, "q_scale", "wq", "bq"),
                    ("a_r", dr, self.rel_clip, "rel_scale", "rel_w", None)):
                da = l2_clip_backward(parts[a_name], clip, d * parts["s"])
                lin = parts["lin_q" if w_name == "wq" else "lin_r"].reshape(da.shape)
                add(scale_name, (da * lin).sum(axis=(0, 1)))
                dlin = (da * getattr(self, scale_name)).reshape(B, T, -1)
                add(w_name, outer(dlin))
                if b_name is not None and getattr(self, b_name) is not None:
                    add(b_name, dlin.sum(axis=(0, 1)))
                dx = dx + dlin @ getattr(self, w_name).T
            # the keys and values: the clip or norm, the convolution, the projection
            for name, d in (("k", dk), ("v", dv)):
                d = self._repeat_kv_backward(d)[..., ctx.past:, :].transpose(0, 2, 1, 3)   # (B, T, KV, D)
                c = parts["c_" + name].reshape(d.shape)
                if name == "k":
                    dc = l2_clip_backward(c, self.qk_clip, d)
                else:
                    dc = rms_norm_backward(c, np.ones(self.head_dim, c.dtype), d, eps=self.norm_eps)[0]
                history = ctx.history[0 if name == "k" else 1]
                du, dtaps, ddyn = short_conv_backward(parts["u_" + name], history, getattr(self, name + "_conv"),
                                                      dc.reshape(B, T, -1), dynamic=parts["dyn_" + name],
                                                      keep=ctx.keep)
                add(name + "_conv", dtaps)
                if ddyn is not None:
                    add(name + "_conv_w", outer(ddyn, name))
                    dxs[name] = dxs[name] + ddyn.reshape(B, T, -1) @ getattr(self, name + "_conv_w").T
                add("w" + name, outer(du, name))
                if getattr(self, "b" + name) is not None:
                    add("b" + name, du.sum(axis=(0, 1)))
                dxs[name] = dxs[name] + du @ getattr(self, "w" + name).T
        for name, given in zip("kv", ctx.x_kv):
            if given is None:
                dx = dx + dxs[name]                                             # x was the input of the keys / values
            else:
                add("x_" + name, dxs[name])
        add("x", dx)
        for name, g in grads.items():
            check_weighted(np.asarray(g), f"the gradient of {name}", self._weights, "dy (or x and the weights)")
        return grads

    def _attend_backward_all(self, ctx, parts, dout):
        """Attention reversed: ``(dq, dk, dv, drel, dsinks)``, dk and dv per query head ``(B, H, S, D)``."""
        q_pos, k_pos, rel = ctx.positions, ctx.k_positions, parts["rel"]
        k, v = self._repeat_kv(ctx.k), self._repeat_kv(ctx.v)
        allowed = self._allowed_fn(ctx.mask, ctx.causal, q_pos, k_pos)
        scale, E = self.attention_scale(), self.rel_extent
        if self.block_size is None:
            every = (slice(0, len(q_pos)), slice(0, len(k_pos)))
            dq, dk, dv, dbias, dsinks = attention_backward(
                parts["q"], k, v, dout, bias=relative_bias(rel, q_pos, k_pos), mask=allowed(*every), scale=scale,
                sinks=parts["sinks"])
            return dq, dk, dv, relative_bias_backward(dbias, q_pos, k_pos, E), dsinks
        drel = np.zeros_like(rel)

        def bias_grad(qs, ks, ds):
            drel[..., qs, :] += relative_bias_backward(ds, q_pos[qs], k_pos[ks], E)
        dq, dk, dv, dsinks = blockwise_attention_backward(
            parts["q"], k, v, ctx.out, ctx.lse, dout,
            bias_fn=lambda qs, ks: relative_bias(rel[..., qs, :], q_pos[qs], k_pos[ks]), mask_fn=allowed,
            scale=scale, block_size=self.block_size, bias_grad_fn=bias_grad, sinks=parts["sinks"])
        return dq, dk, dv, drel, dsinks

    def __repr__(self) -> str:
        kind = "full" if self.sliding_window is None else f"sliding_window={self.sliding_window}"
        return (f"InklingAttention(d_model={self.d_model}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"head_dim={self.head_dim}, {kind}, rel_extent={self.rel_extent}, d_rel={self.d_rel}, "
                f"conv_kernel={self.conv_kernel}, dynamic_conv={self.dynamic_conv}, log_scaling={self.log_scaling}, "
                f"gate={'on' if self._gated() else 'off'})")
