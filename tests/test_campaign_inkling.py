"""A campaign of hostile calls over Inkling 2's decoder attention (``minipos.inkling``): its plain functions
(``l2_clip``, ``log_scale``, ``short_conv``, ``relative_bias`` and their backwards), the layer
``InklingAttention`` (forward, ``backward``, ``new_cache``) and the per-query sinks ``(..., H, T)`` that
``minipos.attention``'s ``attention``, ``blockwise_attention`` and their backwards now take.

Each row of ``CASES`` is one call and its expected outcome: ``Ok(check)``, a result that is finite and passes
``check``, or ``Named(name)``, a ``ValueError`` or ``TypeError`` whose message names the argument. Where each
expected value comes from (never from the code under test):

- the clip by ``math.hypot`` vector by vector (overflow-free), the log scale by ``math.log`` on Python ints;
- the convolution and the relative bias by their definitions (module docstring of ``minipos.inkling``) in
  Python loops over tokens, lags and (query, key) pairs;
- attention with sinks by a loop over rows: the softmax of ``[scale q . k_s for allowed s] + [sink]`` by
  ``math.exp``, the sink column dropped;
- the layer written out with a loop over every (batch, head, query, key), following HF
  ``Inkling2SlidingAttention.forward`` / ``Inkling2FullAttention.forward`` (transformers 5.24) line by line;
- gradients by central differences (directional), of the loops above or of a forward checked against them,
  and adjoint identities (``<relative_bias(rel), d> = <rel, relative_bias_backward(d)>``);
- hand-worked values, worked in the comment above their row.

The written-out layer takes each norm by ``math.hypot`` and each RMS scaled by the largest entry, so it gives the
right answer where the layer's own arithmetic overflows (x near 1e155, weights near 1e200).

``classify`` is ``tools.hostile``'s with every floating-point warning raised: it sorts a call into *clear*
(raises, naming the argument), *accepted* (a finite result that passes its check), *silent* (a result where an
error belongs, a wrong result, NaN or inf, or a refused call that changed the cache), *crash* (an internal error
type, a stray floating-point warning, a hang) and *vague* (a message that does not name the argument). Every call
must be in the first two. A row that found a defect when the campaign was first run
keeps what the library did then (``found=``): the 65 such rows (the clip's norm overflowing, NaN at a zero vector,
shapes and dtypes not checked, overflows blamed on the wrong argument) pass since ``minipos.inkling`` was fixed,
and guard against the defect coming back.

The classes of bad input: wrong types, NaN/inf in the inputs and in each weight attribute, 0 / negative / 2**31
/ 2**63 sizes, empty arrays (B, T or S = 0), wrong ndim and shapes, float16 / float32 / longdouble, bool for int,
caches of another layer or batch size, a cache reused after a refused call (which must leave its ``k``, ``v``,
``conv_k``, ``conv_v``, ``length`` and ``seen`` as they were), sliding windows without ``causal=True``,
per-query sinks of wrong shapes, ``return_weights`` with ``block_size``, contexts of another configuration.
``python tests/test_campaign_inkling.py`` prints the counts.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable

import numpy as np
import pytest
from tools import hostile
from tools.hostile import Ok, StateChanged, close_to

from minipos.attention import attention, attention_backward, blockwise_attention, blockwise_attention_backward
from minipos.cache import KVCache
from minipos.inkling import (InklingAttention, InklingCache, l2_clip, l2_clip_backward, log_scale, relative_bias,
                             relative_bias_backward, short_conv, short_conv_backward)
from minipos.layer import MultiHeadAttention

CASES: list = []


class Named(hostile.Named):
    """``tools.hostile.Named`` with each word matched as a whole word: a one-letter argument (``a``, ``d``, ``u``,
    ``x``) is not found inside "array" or "could"."""

    def fault(self, err: BaseException) -> str:
        text = f"{type(err).__name__}: {err}"
        if "\n" in str(err).strip():
            return f"more than one line: {text[:300]}"
        words = (self.words,) if isinstance(self.words, str) else tuple(self.words)
        missing = [w for w in words if not re.search(rf"(?<![\w.]){re.escape(w)}(?!\w)", str(err))]
        return f"does not say {missing}: {text[:300]}" if missing else ""


def case(label: str, call: Callable, expect, found: str | None = None) -> None:
    """One row: ``found`` (what the library did when the campaign was first run) marks a row that found a defect."""
    CASES.append((label, call, expect, found))


def classify(call, expect) -> tuple[str, str]:
    """``tools.hostile.classify`` with every floating-point warning raised, so that a stray warning is a defect too:
    "clear", "accepted", "silent", "crash" or "vague" (a refused call that changed the cache: silent)."""
    def strict():
        with np.errstate(over="raise", invalid="raise", divide="raise"):
            return call()
    return hostile.classify(strict, expect)


def shape_is(shape, dtype=None):
    def check(got):
        got = got[0] if isinstance(got, tuple) else got
        assert got.shape == shape, f"shape {got.shape}, expected {shape}"
        assert dtype is None or got.dtype == np.dtype(dtype), f"dtype {got.dtype}, expected {np.dtype(dtype)}"
    return check


def _all_close(want, rtol=1e-12, atol=1e-14):
    """A check: each array of the result (a tuple) equals the one of ``want()`` at its place."""
    def check(got):
        for i, (g, w) in enumerate(zip(got, want())):
            np.testing.assert_allclose(np.asarray(g, np.float64), w, rtol=rtol, atol=atol, err_msg=f"result {i}")
    return check


RNG = np.random.default_rng(2024)


# --------------------------------------------------------------------------- the oracles, by loops

def _clip_loop(a, tau):
    """``a · min(1, tau / (|a| + 1e-6))`` vector by vector, the norm by ``math.hypot`` (no overflow)."""
    a = np.asarray(a, np.float64)
    out = np.empty_like(a)
    for i in np.ndindex(a.shape[:-1]):
        out[i] = a[i] * min(1.0, tau / (math.hypot(*a[i]) + 1e-6))
    return out


def _log_scale_loop(positions, alpha, n_floor):
    return np.array([1.0 + alpha * math.log(max((int(p) + 1) / n_floor, 1.0)) for p in positions])


def _conv_loop(u, history, taps, dynamic=None, keep=None):
    """``(u_t + Σ_l w_{t,l} ⊙ ũ_{t-l}) / sqrt(c)`` token by token and lag by lag; ``ũ_{t-l}`` is the history
    before the call, and zero where ``keep`` is False."""
    u, history, taps = (np.asarray(a, np.float64) for a in (u, history, taps))
    B, T, C = u.shape
    K = taps.shape[0]
    out = u.copy()
    for b in range(B):
        for t in range(T):
            for lag in range(K):
                s = t - lag
                src = history[b, K - 1 + s] if s < 0 else u[b, s] * (keep is None or bool(keep[b, s]))
                w = taps[lag].copy()
                if dynamic is not None:
                    G = dynamic.shape[2]
                    w = w + np.repeat(np.asarray(dynamic, np.float64)[b, t, :, lag], C // G)
                out[b, t] += w * src
    return out / math.sqrt(2 * K + 1 if dynamic is not None else K + 1)


def _bias_loop(rel, qp, kp):
    """``b[..., i, j] = rel[..., i, p_i - j]`` for ``0 <= p_i - j < E``, else 0, pair by pair."""
    rel = np.asarray(rel, np.float64)
    E = rel.shape[-1]
    out = np.zeros((*rel.shape[:-1], len(kp)))
    for i, p in enumerate(qp):
        for j, k in enumerate(kp):
            if 0 <= int(p) - int(k) < E:
                out[..., i, j] = rel[..., i, int(p) - int(k)]
    return out


def _attend_loop(q, k, v, *, sinks=None, mask=None, scale=None):
    """``(out, weights, lse)``: each row's softmax of ``[scale q . k_s (allowed s)] + [sink]`` by ``math.exp``,
    the sink column dropped; ``sinks`` ``(H,)`` (a head's) or ``q.shape[:-1]`` (a row's); mask ``(T, S)``."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    *lead, T, D = q.shape
    S = k.shape[-2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    out, weights = np.zeros((*lead, T, v.shape[-1])), np.zeros((*lead, T, S))
    lse = np.full((*lead, T), -np.inf)
    for idx in np.ndindex(*lead):
        for t in range(T):
            keys = [s for s in range(S) if mask is None or mask[t, s]]
            z = [scale * float(q[idx][t] @ k[idx][s]) for s in keys]
            if sinks is not None:
                z.append(float(sinks[idx[-1]] if np.ndim(sinks) == 1 else np.asarray(sinks)[idx][t]))
            if not z:
                continue
            m = max(z)
            e = [math.exp(a - m) for a in z]
            lse[idx][t] = m + math.log(sum(e))
            for s, a in zip(keys, e):
                weights[idx][t, s] = a / sum(e)
            out[idx][t] = weights[idx][t] @ v[idx]
    return out, weights, lse


def _sigmoid(g):
    return 0.5 * (1.0 + np.tanh(0.5 * g))                               # = 1 / (1 + e^-g), without overflow


def _unit_rms(v, eps):
    """``v / sqrt(mean(v^2) + eps)``, scaled by ``max |v|`` first so that ``v^2`` cannot overflow."""
    m = float(np.abs(v).max())
    if m == 0.0:
        return v * 0.0
    s = v / m
    return s / math.sqrt(float(np.mean(s * s)) + eps / m / m)


WEIGHTS = ("wq", "wk", "wv", "wo", "q_scale", "k_conv", "v_conv", "k_conv_w", "v_conv_w", "rel_w", "rel_scale",
           "rel_proj", "w_sink", "wg")


def _layer_loop(layer, x, positions=None, mask=None, causal=True, weights=False):
    """The layer's map written out, HF's forward line by line, with a loop over every (b, h, i, j); float64.
    mask: a ``(B, T)`` padding mask, which also zeroes the padded tokens' inputs to the convolutions (HF
    ``conv_mask``) when ``T > 1``."""
    x = np.asarray(x, np.float64)
    B, T, _ = x.shape
    p = list(range(T)) if positions is None else [int(a) for a in positions]
    H, KV, D, K, E, R = (layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.conv_kernel, layer.rel_extent,
                         layer.d_rel)
    w = {n: None if getattr(layer, n) is None else np.asarray(getattr(layer, n), np.float64) for n in WEIGHTS}
    if layer.log_scaling is None:
        s = [1.0] * T                                                   # sliding layers: no log scale
    else:
        s = list(_log_scale_loop(p, *layer.log_scaling))
    keep = None if mask is None or T == 1 else mask
    y, P = np.zeros_like(x), np.zeros((B, H, T, T))
    for b in range(B):
        def conv(u, taps, w_dyn, b=b):
            c = np.zeros_like(u)
            for t in range(T):
                for lag in range(min(K, t + 1)):                        # zero history: tokens before 0 add nothing
                    if keep is not None and not keep[b, t - lag]:
                        continue
                    tap = taps[lag] if w_dyn is None else taps[lag] + np.repeat(w_dyn[t].reshape(KV, K)[:, lag], D)
                    c[t] += tap * u[t - lag]
            return (u + c) / math.sqrt(2 * K + 1 if w_dyn is not None else K + 1)
        dyn = layer.dynamic_conv
        ck = conv(x[b] @ w["wk"], w["k_conv"], x[b] @ w["k_conv_w"] if dyn else None)
        cv = conv(x[b] @ w["wv"], w["v_conv"], x[b] @ w["v_conv_w"] if dyn else None)
        o = np.zeros((T, H * D))
        for h in range(H):
            g = h // (H // KV)
            for i in range(T):
                q = _clip_loop((x[b, i] @ w["wq"])[h * D:(h + 1) * D] * w["q_scale"][h], layer.qk_clip) * s[i]
                r = _clip_loop((x[b, i] @ w["rel_w"])[h * R:(h + 1) * R] * w["rel_scale"][h], layer.rel_clip) * s[i]
                profile = r @ w["rel_proj"]                              # bias against backward distance 0 … E - 1
                keys, z = [], []
                for j in range(T):
                    d = p[i] - p[j]
                    if (causal and d < 0) or (layer.sliding_window is not None and d >= layer.sliding_window) \
                            or (mask is not None and not mask[b, j]):
                        continue
                    k = _clip_loop(ck[j, g * D:(g + 1) * D], layer.qk_clip)
                    z.append(float(q @ k) / math.sqrt(D) + (float(profile[d]) if 0 <= d < E else 0.0))
                    keys.append(j)
                sink = float(x[b, i] @ w["w_sink"][:, h])
                m = max(z + [sink])
                e = [math.exp(a - m) for a in z]
                total = sum(e) + math.exp(sink - m)
                for j, a in zip(keys, e):
                    P[b, h, i, j] = a / total
                    o[i, h * D:(h + 1) * D] += a / total * _unit_rms(cv[j, g * D:(g + 1) * D], layer.norm_eps)
        gate = 1.0 if w["wg"] is None else _sigmoid(x[b] @ w["wg"])
        y[b] = (o * gate) @ w["wo"]
    return (y, P) if weights else y


# --------------------------------------------------------------------------- l2_clip and its backward

A2 = np.array([[3.0, 4.0], [0.3, 0.4]])                                 # norms 5 (clipped by 2.5) and 0.5 (kept)
A2_CLIPPED = A2 * [[2.5 / (5 + 1e-6)], [1.0]]                          # a · min(1, 2.5 / (|a| + 1e-6))
AC = RNG.standard_normal((3, 4, 5)) * 2
DC = RNG.standard_normal((3, 4, 5))

P = "l2_clip"
case(f"{P} hand-worked [3, 4] and [0.3, 0.4] at 2.5", lambda: l2_clip(A2, 2.5), Ok(close_to(A2_CLIPPED, rtol=1e-15)))
case(f"{P} 3-D == hypot loop", lambda: l2_clip(AC, 1.7), Ok(close_to(_clip_loop(AC, 1.7))))
case(f"{P} list", lambda: l2_clip(A2.tolist(), 2.5), Ok(close_to(A2_CLIPPED, rtol=1e-15)))
case(f"{P} int a", lambda: l2_clip([[3, 4]], 2.5), Ok(close_to(A2_CLIPPED[:1], rtol=1e-15, dtype=np.float64)))
case(f"{P} int threshold", lambda: l2_clip(A2, 1), Ok(close_to(_clip_loop(A2, 1.0))))
case(f"{P} threshold 2**63 keeps a", lambda: l2_clip(A2, 2 ** 63), Ok(close_to(A2, rtol=0, atol=0)))
case(f"{P} zero vector", lambda: l2_clip(np.zeros((2, 3)), 1e-3), Ok(close_to(np.zeros((2, 3)))))
case(f"{P} tiny threshold 1e-300", lambda: l2_clip(A2, 1e-300), Ok(close_to(_clip_loop(A2, 1e-300), atol=0)))
case(f"{P} N = 0 rows", lambda: l2_clip(np.zeros((0, 3)), 1.0), Ok(shape_is((0, 3))))
case(f"{P} D = 0", lambda: l2_clip(np.zeros((2, 0)), 1.0), Ok(shape_is((2, 0))))
for dtype, tol in ((np.float16, 2e-3), (np.float32, 1e-6), (np.longdouble, 1e-15)):
    case(f"{P} {np.dtype(dtype).name}", lambda d=dtype: l2_clip(AC.astype(d), 1.7),
         Ok(close_to(_clip_loop(AC.astype(dtype), 1.7), rtol=tol, atol=tol, dtype=np.dtype(dtype))))
case(f"{P} 1e200 vector (|a| fits float64)", lambda: l2_clip([[1e200, 1e200]], 1.0),
     Ok(close_to([[math.sqrt(0.5), math.sqrt(0.5)]], rtol=1e-12)),
     found="returns [[0, 0]] (np.linalg.norm squares overflow to inf, so the factor tau / inf = 0), with an "
             "overflow warning; |a| = 1.4e200 fits float64")
case(f"{P} float16 [300, 300] (|a| = 424 fits float16)", lambda: l2_clip(np.array([[300.0, 300.0]], np.float16), 2.5),
     Ok(close_to([[2.5 * math.sqrt(0.5)] * 2], rtol=2e-3, dtype=np.float16)),
     found="returns [[0, 0]]: 300**2 overflows float16 inside the norm")
case(f"{P} float16 with threshold 1e5", lambda: l2_clip(A2.astype(np.float16), 1e5),
     Ok(close_to(A2.astype(np.float16), rtol=0, atol=0)),
     found="right result, but 'overflow encountered in cast' (1e5 cast to float16 in threshold / (n + 1e-6))")
case(f"{P} NaN a", lambda: l2_clip([[np.nan, 1.0]], 1.0), Named("a"))
case(f"{P} inf a", lambda: l2_clip([[np.inf, 1.0]], 1.0), Named("a"))
for bad, exc in (("a", TypeError), (None, TypeError), (A2 > 1, TypeError), (A2 + 1j, TypeError),
                 ([[1.0, 2.0], [1.0]], ValueError)):
    case(f"{P} a {type(bad).__name__} {getattr(bad, 'dtype', '')}", lambda b=bad: l2_clip(b, 1.0), Named("a", exc))
case(f"{P} 0-D a", lambda: l2_clip(3.0, 1.0), Named("a"),
     found="numpy AxisError 'axis -1 is out of bounds for array of dimension 0', not naming a")
for bad, exc in ((0.0, ValueError), (-1.0, ValueError), (np.nan, ValueError), (np.inf, ValueError), ("1", TypeError),
                 (True, TypeError), (None, TypeError), (1e-310, ValueError), (2 ** 1100, ValueError)):
    case(f"{P} threshold {bad!r}"[:60], lambda b=bad: l2_clip(A2, b), Named("threshold", exc))


def _fd_clip(a, tau, d, h=1e-6):
    """The gradient of ``<clip(a), d>`` entry by entry, central differences of the hypot loop."""
    g = np.empty_like(a)
    for i in np.ndindex(a.shape):
        e = np.zeros_like(a)
        e[i] = h
        g[i] = ((_clip_loop(a + e, tau) - _clip_loop(a - e, tau)) * d).sum() / (2 * h)
    return g


P = "l2_clip_backward"
case(f"{P} == central differences", lambda: l2_clip_backward(AC[0], 1.7, DC[0]),
     Ok(close_to(_fd_clip(AC[0], 1.7, DC[0]), rtol=1e-6, atol=1e-8)))
case(f"{P} kept vector: d itself", lambda: l2_clip_backward([[0.3, 0.4]], 2.5, [[1.0, -2.0]]),
     Ok(close_to([[1.0, -2.0]], rtol=0, atol=0)))
# [3, 4] clipped to 2.5: c = 2.5 / (5 + 1e-6); d = [4, -3] is orthogonal to a, so the radial term is 0: c d
case(f"{P} hand-worked orthogonal d", lambda: l2_clip_backward([[3.0, 4.0]], 2.5, [[4.0, -3.0]]),
     Ok(close_to([[4.0 * 2.5 / (5 + 1e-6), -3.0 * 2.5 / (5 + 1e-6)]], rtol=1e-15)))
# d = a / |a| is radial: c d - c (a . d) a / (|a| (|a| + eps)) = c d (1 - |a| / (|a| + eps)) ~ c d eps / |a|
case(f"{P} hand-worked radial d", lambda: l2_clip_backward([[3.0, 4.0]], 2.5, [[0.6, 0.8]]),
     Ok(close_to(np.array([[0.6, 0.8]]) * (2.5 / (5 + 1e-6)) * (1e-6 / (5 + 1e-6)), rtol=1e-8)))
case(f"{P} N = 0", lambda: l2_clip_backward(np.zeros((0, 2)), 1.0, np.zeros((0, 2))), Ok(shape_is((0, 2))))
case(f"{P} zero vector, threshold 1", lambda: l2_clip_backward(np.zeros((1, 2)), 1.0, [[1.0, 2.0]]),
     Ok(close_to([[1.0, 2.0]], rtol=0, atol=0)))
for dtype, tol in ((np.float32, 1e-5), (np.longdouble, 1e-12)):
    case(f"{P} {np.dtype(dtype).name}", lambda d=dtype: l2_clip_backward(AC[0].astype(d), 1.7, DC[0].astype(d)),
         Ok(close_to(_fd_clip(AC[0], 1.7, DC[0]), rtol=tol, atol=1e-6, dtype=np.dtype(dtype))))
# at a = 0 with threshold 1e-7 < 1e-6 the vector counts as clipped (c = 1e-7 / 1e-6 = 0.1); a . d = 0, so the
# gradient is c d = 0.1 d (the radial term c (a . d) a / (|a| (|a| + eps)) -> 0 as a -> 0)
case(f"{P} zero vector, threshold 1e-7", lambda: l2_clip_backward(np.zeros((1, 2)), 1e-7, [[1.0, 2.0]]),
     Ok(close_to([[0.1, 0.2]], rtol=1e-12)),
     found="returns [[nan, nan]]: the radial term computes 0 / 0 (the code assumes a zero vector is never "
             "clipped, false once threshold < 1e-6)")
# a = [1e200, 0] clipped to 1: c = 1 / 1e200, d = [0, 1] orthogonal to a: c d = [0, 1e-200]
case(f"{P} 1e200 vector", lambda: l2_clip_backward([[1e200, 0.0]], 1.0, [[0.0, 1.0]]),
     Ok(close_to([[0.0, 1e-200]], rtol=1e-12, atol=0)),
     found="returns [[0, 0]] with an overflow warning: the norm overflows to inf")
case(f"{P} kept vector, d 1e308", lambda: l2_clip_backward([[0.1, 0.1]], 1.0, [[1e308, 1e308]]),
     Ok(close_to([[1e308, 1e308]], rtol=0, atol=0)),
     found="right result, but 'overflow encountered in divide' from the unused (clipped) branch of np.where")
case(f"{P} NaN d", lambda: l2_clip_backward(A2, 1.0, np.full((2, 2), np.nan)), Named("d"))
case(f"{P} NaN a", lambda: l2_clip_backward(np.full((2, 2), np.nan), 1.0, A2), Named("a"))
case(f"{P} str d", lambda: l2_clip_backward(A2, 1.0, "d"), Named("d", TypeError))
case(f"{P} threshold 0", lambda: l2_clip_backward(A2, 0.0, A2), Named("threshold"))
case(f"{P} threshold str", lambda: l2_clip_backward(A2, "1", A2), Named("threshold", TypeError))
case(f"{P} d (3, 2) for a (2, 2)", lambda: l2_clip_backward(A2, 1.0, np.ones((3, 2))), Named("d"),
     found="numpy 'operands could not be broadcast together with shapes (2,2) (3,2)', not naming d")
case(f"{P} d (4, 2, 2) for a (2, 2)", lambda: l2_clip_backward(A2, 1.0, np.ones((4, 2, 2))), Named("d"),
     found="returns a (4, 2, 2) 'gradient' of a (2, 2) input: d broadcasts a up")
case(f"{P} 0-D a", lambda: l2_clip_backward(3.0, 1.0, 1.0), Named("a"),
     found="numpy AxisError, not naming a")


# --------------------------------------------------------------------------- log_scale

P = "log_scale"
# alpha 0.5, n_floor 4: p + 1 = 1, 4, 8, 16 -> 1, 1, 1 + 0.5 ln 2, 1 + ln 2
case(f"{P} hand-worked", lambda: log_scale([0, 3, 7, 15], alpha=0.5, n_floor=4),
     Ok(close_to([1.0, 1.0, 1 + 0.5 * math.log(2), 1 + math.log(2)], rtol=1e-15)))
case(f"{P} int positions n", lambda: log_scale(9, alpha=0.3, n_floor=2),
     Ok(close_to(_log_scale_loop(range(9), 0.3, 2))))
case(f"{P} alpha 0", lambda: log_scale([0, 100], alpha=0.0, n_floor=1), Ok(close_to([1.0, 1.0], rtol=0)))
case(f"{P} float exact positions", lambda: log_scale([7.0], alpha=0.5, n_floor=4),
     Ok(close_to([1 + 0.5 * math.log(2)])))
case(f"{P} np.int64 n_floor", lambda: log_scale([7], alpha=0.5, n_floor=np.int64(4)),
     Ok(close_to([1 + 0.5 * math.log(2)])))
case(f"{P} positions 2**62 - 1", lambda: log_scale([2 ** 62 - 1], alpha=0.5, n_floor=4),
     Ok(close_to([1 + 0.5 * math.log(2 ** 62 / 4)], rtol=1e-15)))
case(f"{P} empty", lambda: log_scale([], alpha=0.5, n_floor=4), Ok(shape_is((0,))))
for big in (2 ** 31, 2 ** 63):
    case(f"{P} n_floor {big}", lambda b=big: log_scale([0, 10 ** 6], alpha=0.5, n_floor=b),
         Ok(close_to([1.0, 1.0], rtol=0)))
case(f"{P} alpha 1e308 overflows", lambda: log_scale([10 ** 6], alpha=1e308, n_floor=1), Named("alpha"),
     found="returns [inf] (1 + 1e308 ln 1e6) with an overflow warning")
for bad, exc in ((np.nan, ValueError), (np.inf, ValueError), (-1.0, ValueError), ("0.5", TypeError), (True, TypeError),
                 (None, TypeError)):
    case(f"{P} alpha {bad!r}", lambda b=bad: log_scale([0], alpha=b, n_floor=4), Named("alpha", exc))
for bad, exc in ((0, ValueError), (-1, ValueError), (True, TypeError), (4.0, TypeError), ("4", TypeError),
                 (None, TypeError)):
    case(f"{P} n_floor {bad!r}", lambda b=bad: log_scale([0], alpha=0.5, n_floor=b), Named("n_floor", exc))
for bad, exc in (([-1], ValueError), ([0.5], ValueError), ([[0, 1]], ValueError), ([True], TypeError), ("0", TypeError),
                 (None, TypeError), ([2 ** 63], ValueError), ([np.nan], ValueError)):
    case(f"{P} positions {bad!r}", lambda b=bad: log_scale(b, alpha=0.5, n_floor=4), Named("positions", exc))


# --------------------------------------------------------------------------- short_conv and its backward

U1 = np.array([[[1.0], [2.0], [3.0]]])                                  # one channel, T = 3
H1, TAPS1 = np.zeros((1, 1, 1)), np.array([[1.0], [10.0]])              # K = 2: lag 0 weight 1, lag 1 weight 10
UC = RNG.standard_normal((2, 5, 4))
HC = RNG.standard_normal((2, 2, 4))
TC = RNG.standard_normal((3, 4))                                        # K = 3, C = 4
DYN = RNG.standard_normal((2, 5, 2, 3))                                 # G = 2 groups of 2 channels
KEEP = np.array([[False, True, True, True, True], [True, True, False, True, True]])
DYC = RNG.standard_normal((2, 5, 4))

P = "short_conv"
# (u_t + u_t + 10 u_{t-1}) / sqrt(3) = 2, 14, 26 over sqrt(3)
case(f"{P} hand-worked static", lambda: short_conv(U1, H1, TAPS1),
     Ok(close_to(np.array([[[2.0], [14.0], [26.0]]]) / math.sqrt(3))))
# dynamic tap 1 on each lag: weights 2 and 11, divisor sqrt(5): 3, 17, 31 over sqrt(5)
case(f"{P} hand-worked dynamic", lambda: short_conv(U1, H1, TAPS1, dynamic=np.ones((1, 3, 1, 2))),
     Ok(close_to(np.array([[[3.0], [17.0], [31.0]]]) / math.sqrt(5))))
# history 5 before the call: the first output gains 10 * 5: (2 + 50) / sqrt(3)
case(f"{P} hand-worked history", lambda: short_conv(U1, np.full((1, 1, 1), 5.0), TAPS1)[0, 0, 0],
     Ok(lambda got: abs(got - 52 / math.sqrt(3)) < 1e-14))
case(f"{P} == loop", lambda: short_conv(UC, HC, TC), Ok(close_to(_conv_loop(UC, HC, TC))))
case(f"{P} dynamic == loop", lambda: short_conv(UC, HC, TC, dynamic=DYN), Ok(close_to(_conv_loop(UC, HC, TC, DYN))))
case(f"{P} keep == loop", lambda: short_conv(UC, HC, TC, dynamic=DYN, keep=KEEP),
     Ok(close_to(_conv_loop(UC, HC, TC, DYN, KEEP))))
case(f"{P} keep as lists", lambda: short_conv(UC.tolist(), HC.tolist(), TC.tolist(), keep=KEEP.tolist()),
     Ok(close_to(_conv_loop(UC, HC, TC, keep=KEEP))))
case(f"{P} K = 1 (empty history)", lambda: short_conv(UC, np.zeros((2, 0, 4)), TC[:1]),
     Ok(close_to(_conv_loop(UC, np.zeros((2, 0, 4)), TC[:1]))))
case(f"{P} G = C (a tap per channel)", lambda: short_conv(UC, HC, TC, dynamic=np.ones((2, 5, 4, 3))),
     Ok(close_to(_conv_loop(UC, HC, TC, np.ones((2, 5, 4, 3))))))
case(f"{P} T = 0", lambda: short_conv(UC[:, :0], HC, TC), Ok(shape_is((2, 0, 4))))
case(f"{P} B = 0", lambda: short_conv(UC[:0], HC[:0], TC), Ok(shape_is((0, 5, 4))))
case(f"{P} C = 0", lambda: short_conv(UC[..., :0], HC[..., :0], TC[:, :0]), Ok(shape_is((2, 5, 0))))
case(f"{P} int u", lambda: short_conv(np.ones((1, 2, 1), int), H1, TAPS1),
     Ok(close_to(_conv_loop(np.ones((1, 2, 1)), H1, TAPS1))))
case(f"{P} longdouble", lambda: short_conv(*(a.astype(np.longdouble) for a in (UC, HC, TC))),
     Ok(close_to(_conv_loop(UC, HC, TC), dtype=np.dtype(np.longdouble))))
for dtype, tol in ((np.float32, 1e-5), (np.float16, 2e-2)):
    case(f"{P} {np.dtype(dtype).name} keeps its dtype",
         lambda d=dtype: short_conv(UC.astype(d), HC.astype(d), TC.astype(d), dynamic=DYN.astype(d)),
         Ok(close_to(lambda d=dtype: _conv_loop(UC.astype(d), HC.astype(d), TC.astype(d), DYN.astype(d)), rtol=tol,
                     atol=tol, dtype=np.dtype(dtype))),
         found="returns float64: y / np.sqrt(2K + 1) divides by a float64 scalar, which promotes")
for name, args, kw in (("u", (UC * np.nan, HC, TC), {}), ("history", (UC, HC * np.inf, TC), {}),
                       ("taps", (UC, HC, TC * np.nan), {}), ("dynamic", (UC, HC, TC), {"dynamic": DYN * np.nan})):
    case(f"{P} NaN/inf {name}", lambda a=args, k=kw: short_conv(*a, **k), Named(name))
for label, name, args, kw in (("u str", "u", ("u", HC, TC), {}), ("u bool", "u", (UC > 0, HC, TC), {}),
                              ("u complex", "u", (UC + 1j, HC, TC), {}),
                              ("history None", "history", (UC, None, TC), {}),
                              ("taps str", "taps", (UC, HC, "taps"), {}),
                              ("dynamic str", "dynamic", (UC, HC, TC), {"dynamic": "d"})):
    case(f"{P} {label}", lambda a=args, k=kw: short_conv(*a, **k), Named(name, TypeError))
for label, args, kw, name in (
        ("u 2-D", (UC[0], HC, TC), {}, "u"), ("u 4-D", (UC[None], HC, TC), {}, "u"),
        ("history 2-D", (UC, HC[0], TC), {}, "history"), ("history K", (UC, HC[:, :1], TC), {}, "history"),
        ("history B", (UC, HC[:1], TC), {}, "history"), ("history C", (UC, HC[..., :3], TC), {}, "history"),
        ("taps 1-D", (UC, HC, TC[:, 0]), {}, "taps"), ("taps 3-D", (UC, HC, TC[None]), {}, "taps"),
        ("taps C", (UC, HC, TC[:, :3]), {}, "taps"), ("taps K = 0", (UC, HC, TC[:0]), {}, "taps"),
        ("dynamic 3-D", (UC, HC, TC), {"dynamic": DYN[..., 0]}, "dynamic"),
        ("dynamic T", (UC, HC, TC), {"dynamic": DYN[:, :4]}, "dynamic"),
        ("dynamic K", (UC, HC, TC), {"dynamic": DYN[..., :2]}, "dynamic"),
        ("dynamic G = 3 does not divide C = 4", (UC, HC, TC), {"dynamic": np.ones((2, 5, 3, 3))}, "dynamic")):
    case(f"{P} {label}", lambda a=args, k=kw: short_conv(*a, **k), Named(name))
case(f"{P} dynamic G = 0", lambda: short_conv(UC, HC, TC, dynamic=np.ones((2, 5, 0, 3))), Named("dynamic"),
     found="ZeroDivisionError 'integer division or modulo by zero' (C % G with G = 0)")
for label, keep in (("keep (B, T - 1)", KEEP[:, :4]), ("keep (B + 1, T)", np.ones((3, 5), bool)),
                    ("keep 3-D", KEEP[..., None])):
    case(f"{P} {label}", lambda k=keep: short_conv(UC, HC, TC, keep=k), Named("keep"),
         found="a numpy broadcasting or concatenation ValueError that does not name keep")
for label, keep in (("keep float 0.5", np.where(KEEP, 0.5, 0.0)), ("keep NaN", np.where(KEEP, np.nan, 0.0)),
                    ("keep strings", np.where(KEEP, "yes", ""))):
    case(f"{P} {label}", lambda k=keep: short_conv(UC, HC, TC, keep=k), Named("keep", TypeError),
         found="accepted: keep is cast with np.asarray(keep, bool), so 0.5, NaN and 'yes' all mean True")
case(f"{P} u 1e307 overflows", lambda: short_conv(U1 * 1e307, H1, TAPS1), Named("u"),
     found="returns inf (3e307 + 10 * 2e307 overflows) with an overflow warning")
case(f"{P} history 1e300 for float32 u", lambda: short_conv(U1.astype(np.float32), np.full((1, 1, 1), 1e300), TAPS1),
     Named("history"),
     found="returns inf: the history is cast to u's float32 (1e300 -> inf) without a check")

P = "short_conv_backward"


def _conv_adjoint(dynamic=None, keep=None):
    """``short_conv`` is linear in ``u`` and in ``taps`` (and in ``dynamic``): ``<dy, conv(u + e) - conv(u - e)> / 2
    = <du, e>`` exactly, so central differences of the loop with step 1 are the gradients' directional values."""
    def check(got):
        du, dtaps, ddyn = got
        pairs = (("u", du, UC), ("taps", dtaps, TC)) + ((("dynamic", ddyn, dynamic),) if dynamic is not None else ())
        for name, grad, arg in pairs:
            e = np.random.default_rng(len(name)).standard_normal(arg.shape)

            def f(v, name=name):
                k = {"u": UC, "taps": TC, "dynamic": dynamic, name: v}
                return (_conv_loop(k["u"], HC, k["taps"], k["dynamic"], keep) * DYC).sum()
            # conv is linear in u and taps, bilinear in (taps + dynamic) and u: central differences are exact
            num = (f(arg + e) - f(arg - e)) / 2
            assert abs((grad * e).sum() - num) < 1e-10 * (1 + abs(num)), (name, (grad * e).sum(), num)
        assert ddyn is None if dynamic is None else ddyn.shape == dynamic.shape
    return check


case(f"{P} static == loop", lambda: short_conv_backward(UC, HC, TC, DYC), Ok(_conv_adjoint()))
case(f"{P} dynamic, keep == loop", lambda: short_conv_backward(UC, HC, TC, DYC, dynamic=DYN, keep=KEEP),
     Ok(_conv_adjoint(DYN, KEEP)))
case(f"{P} T = 0", lambda: short_conv_backward(UC[:, :0], HC, TC, DYC[:, :0]),
     Ok(lambda g: g[0].shape == (2, 0, 4) and np.array_equal(g[1], np.zeros((3, 4)))))
case(f"{P} B = 0", lambda: short_conv_backward(UC[:0], HC[:0], TC, DYC[:0]),
     Ok(lambda g: g[0].shape == (0, 5, 4) and np.array_equal(g[1], np.zeros((3, 4)))))
case(f"{P} float32 keeps its dtype", lambda: short_conv_backward(*(a.astype(np.float32) for a in (UC, HC, TC, DYC))),
     Ok(lambda g: all(a.dtype == np.float32 for a in g[:2])),
     found="du and dtaps come back float64 for float32 inputs (the same np.sqrt promotion)")
case(f"{P} NaN dy", lambda: short_conv_backward(UC, HC, TC, DYC * np.nan), Named("dy"))
case(f"{P} None dy", lambda: short_conv_backward(UC, HC, TC, None), Named("dy", TypeError))
case(f"{P} NaN u", lambda: short_conv_backward(UC * np.nan, HC, TC, DYC), Named("u"))
case(f"{P} dynamic G = 3", lambda: short_conv_backward(UC, HC, TC, DYC, dynamic=np.ones((2, 5, 3, 3))),
     Named("dynamic"))
case(f"{P} dy (B, T - 1, C)", lambda: short_conv_backward(UC, HC, TC, DYC[:, :4]), Named("dy"),
     found="numpy 'operands could not be broadcast together', not naming dy")
case(f"{P} dy (2, B, T, C)", lambda: short_conv_backward(UC, HC, TC, DYC[None].repeat(2, 0)), Named("dy"),
     found="numpy 'non-broadcastable output operand', not naming dy")
case(f"{P} keep (B, T - 1)", lambda: short_conv_backward(UC, HC, TC, DYC, keep=KEEP[:, :4]), Named("keep"),
     found="numpy broadcasting ValueError, not naming keep")
case(f"{P} dy 1e308 overflows", lambda: short_conv_backward(U1, H1, TAPS1, np.full((1, 3, 1), 1e308)), Named("dy"),
     found="returns du and dtaps holding inf, with an overflow warning")


# --------------------------------------------------------------------------- relative_bias and its backward

REL = np.array([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]])                  # T = 2 queries, E = 3
RELC = RNG.standard_normal((2, 3, 4, 5))                                  # (B, H, T, E)
QP, KP = np.array([3, 5, 8, 9]), np.arange(11)
DB = RNG.standard_normal((2, 3, 4, 11))

P = "relative_bias"
# queries 5, 6, keys 3 … 6, E = 3: distances [2, 1, 0, -1] and [3, 2, 1, 0]
case(f"{P} hand-worked", lambda: relative_bias(REL, [5, 6], [3, 4, 5, 6]),
     Ok(close_to([[12, 11, 10, 0], [0, 22, 21, 20]], rtol=0, atol=0)))
case(f"{P} 4-D == loop", lambda: relative_bias(RELC, QP, KP), Ok(close_to(_bias_loop(RELC, QP, KP), rtol=0, atol=0)))
case(f"{P} int positions n", lambda: relative_bias(REL, 2, 4),
     Ok(close_to(_bias_loop(REL, [0, 1], range(4)), rtol=0, atol=0)))
case(f"{P} unsorted, repeated positions", lambda: relative_bias(REL, [6, 5], [6, 3, 5, 5]),
     Ok(close_to(_bias_loop(REL, [6, 5], [6, 3, 5, 5]), rtol=0, atol=0)))
case(f"{P} positions near 2**62", lambda: relative_bias(REL, [2 ** 62 - 1, 2 ** 62 - 2], [0, 2 ** 62 - 3, 2 ** 62 - 1]),
     Ok(close_to(_bias_loop(REL, [2 ** 62 - 1, 2 ** 62 - 2], [0, 2 ** 62 - 3, 2 ** 62 - 1]), rtol=0, atol=0)))
case(f"{P} S = 0", lambda: relative_bias(REL, [5, 6], []), Ok(shape_is((2, 0))))
case(f"{P} T = 0", lambda: relative_bias(np.zeros((0, 3)), [], [1]), Ok(shape_is((0, 1))))
case(f"{P} B = 0", lambda: relative_bias(np.zeros((0, 2, 3)), [5, 6], [1]), Ok(shape_is((0, 2, 1))))
for dtype in (np.float16, np.float32, np.longdouble):
    case(f"{P} {np.dtype(dtype).name}", lambda d=dtype: relative_bias(REL.astype(d), [5, 6], [3, 4, 5, 6]),
         Ok(close_to([[12, 11, 10, 0], [0, 22, 21, 20]], rtol=0, atol=0, dtype=np.dtype(dtype))))
case(f"{P} NaN rel", lambda: relative_bias(REL * np.nan, [5, 6], [3]), Named("rel"))
case(f"{P} str rel", lambda: relative_bias("r", [5, 6], [3]), Named("rel", TypeError))
case(f"{P} rel 1-D", lambda: relative_bias(REL[0], [5], [3]), Named("rel"))
case(f"{P} rel E = 0", lambda: relative_bias(np.zeros((2, 0)), [5, 6], [3]), Named("rel"))
case(f"{P} rel T != len(q_positions)", lambda: relative_bias(REL, [5], [3]), Named("rel"))
for which in ("q_positions", "k_positions"):
    for bad, exc in (([-1, 6], ValueError), ([5.5, 6], ValueError), ([[5, 6]], ValueError), ([True, False], TypeError),
                     ("56", TypeError), ([2 ** 63, 6], ValueError), ([np.nan, 6], ValueError)):
        args = (bad, [3]) if which == "q_positions" else ([5, 6], bad)
        case(f"{P} {which} {bad!r}", lambda a=args: relative_bias(REL, *a), Named(which, exc))

P = "relative_bias_backward"
case(f"{P} hand-worked", lambda: relative_bias_backward(np.arange(8.0).reshape(2, 4), [5, 6], [3, 4, 5, 6], 3),
     Ok(close_to([[2, 1, 0], [7, 6, 5]], rtol=0, atol=0)))
case(f"{P} adjoint of the loop", lambda: relative_bias_backward(DB, QP, KP, 5),
     Ok(lambda g: abs((RELC * g).sum() - (_bias_loop(RELC, QP, KP) * DB).sum()) < 1e-12 * np.abs(DB).sum()))
case(f"{P} extent 10**6 (distances all inside)", lambda: relative_bias_backward(np.ones((1, 2)), [5], [3, 4], 10 ** 6),
     Ok(lambda g: g.shape == (1, 10 ** 6) and g[0, 1] == 1 and g[0, 2] == 1 and g.sum() == 2))
case(f"{P} T = 0", lambda: relative_bias_backward(np.zeros((0, 4)), [], [3, 4, 5, 6], 3), Ok(shape_is((0, 3))))
case(f"{P} B = 0", lambda: relative_bias_backward(np.zeros((0, 2, 4)), [5, 6], [3, 4, 5, 6], 3),
     Ok(shape_is((0, 2, 3))))
case(f"{P} S = 0", lambda: relative_bias_backward(np.zeros((2, 0)), [5, 6], [], 3),
     Ok(close_to(np.zeros((2, 3)), rtol=0, atol=0)),
     found="ValueError 'cannot reshape array of size 0 into shape (0)' for no keys (dbias.reshape(-1, 0))")
for dtype in (np.float16, np.float32):
    case(f"{P} {np.dtype(dtype).name}", lambda d=dtype: relative_bias_backward(np.arange(8.0).reshape(2, 4).astype(d),
                                                                              [5, 6], [3, 4, 5, 6], 3),
         Ok(close_to([[2, 1, 0], [7, 6, 5]], rtol=0, atol=0, dtype=np.dtype(dtype))))
case(f"{P} longdouble", lambda: relative_bias_backward(np.arange(8.0).reshape(2, 4).astype(np.longdouble), [5, 6],
                                                      [3, 4, 5, 6], 3),
     Ok(close_to([[2, 1, 0], [7, 6, 5]], rtol=0, atol=0, dtype=np.dtype(np.longdouble))),
     found="TypeError 'Cannot cast array data from dtype(float128) to dtype(float64) according to the rule "
             "safe' (np.bincount's weights), not naming dbias")
case(f"{P} float16 sum overflows", lambda: relative_bias_backward(np.full((1, 3), 6e4, np.float16), [5], [5, 5, 5], 3),
     Named("dbias"),
     found="returns [[inf, 0, 0]] (3 x 6e4 summed in float64, cast to float16) with an overflow warning")
case(f"{P} NaN dbias", lambda: relative_bias_backward(np.full((2, 4), np.nan), [5, 6], [3, 4, 5, 6], 3), Named("dbias"))
case(f"{P} str dbias", lambda: relative_bias_backward("d", [5, 6], [3, 4, 5, 6], 3), Named("dbias", TypeError))
for bad, exc in ((0, ValueError), (-1, ValueError), (True, TypeError), (3.0, TypeError), ("3", TypeError),
                 (None, TypeError)):
    case(f"{P} extent {bad!r}", lambda b=bad: relative_bias_backward(np.ones((2, 4)), [5, 6], [3, 4, 5, 6], b),
         Named("extent", exc))
for big, what in ((2 ** 31, "MemoryError (a 32 GiB np.bincount result)"),
                  (2 ** 63, "OverflowError 'Python int too large to convert to C long'")):
    case(f"{P} extent {big}", lambda b=big: relative_bias_backward(np.ones((2, 4)), [5, 6], [3, 4, 5, 6], b),
         Named("extent"), found=f"{what}: the (..., T, E) result is not checked against memory")
case(f"{P} dbias T != len(q_positions)", lambda: relative_bias_backward(np.ones((2, 4)), [5], [3, 4, 5, 6], 3),
     Named("dbias"), found="IndexError 'boolean index did not match indexed array'")
case(f"{P} dbias S != len(k_positions)", lambda: relative_bias_backward(np.ones((2, 4)), [5, 6], [3, 4, 5], 3),
     Named("dbias"), found="ValueError 'cannot reshape array of size 8 into shape (3)', not naming dbias")
case(f"{P} dbias 1-D", lambda: relative_bias_backward(np.ones(4), [5], [3, 4, 5, 6], 3), Named("dbias"),
     found="accepted: a (S,) dbias is read as (1, S) and a (1, E) gradient returned")
case(f"{P} dbias 0-D", lambda: relative_bias_backward(1.0, [5], [3], 3), Named("dbias"),
     found="accepted: a scalar dbias gives a (1, E) gradient")
for which in ("q_positions", "k_positions"):
    args = ([-1, 6], [3, 4, 5, 6]) if which == "q_positions" else ([5, 6], [3, 4, 5, -6])
    case(f"{P} negative {which}", lambda a=args: relative_bias_backward(np.ones((2, 4)), *a, 3), Named(which))


# --------------------------------------------------------------------------- per-query sinks in attention

QA, KA, VA = RNG.standard_normal((2, 3, 4, 5)), RNG.standard_normal((2, 3, 6, 5)), RNG.standard_normal((2, 3, 6, 2))
SQ = RNG.standard_normal((2, 3, 4))                                      # (B, H, T): one sink per query
SH = RNG.standard_normal(3)                                             # (H,): one per head
DOUT = RNG.standard_normal((2, 3, 4, 2))
MASK = np.tril(np.ones((4, 6), bool), 2)
MASK[1] = False                                                         # a row that sees no key: only its sink


def _fd_attention(sinks, mask=None, h=1e-6):
    """``d <out, dout> / d sinks`` along a random direction, central differences of the loop."""
    e = np.random.default_rng(7).standard_normal(np.shape(sinks))
    up = (_attend_loop(QA, KA, VA, sinks=sinks + h * e, mask=mask)[0] * DOUT).sum()
    down = (_attend_loop(QA, KA, VA, sinks=sinks - h * e, mask=mask)[0] * DOUT).sum()
    return e, (up - down) / (2 * h)


def _dsinks_match(position, sinks, mask=None):
    def check(got):
        ds = got[position]
        assert ds.shape == np.shape(sinks), ds.shape
        e, num = _fd_attention(sinks, mask)
        assert abs((ds * e).sum() - num) < 1e-6 * (1 + abs(num)), ((ds * e).sum(), num)
    return check


def _mask_fn(qs, ks):
    return MASK[qs, ks]


P = "attention sinks"
case(f"{P} per query == loop", lambda: attention(QA, KA, VA, sinks=SQ),
     Ok(close_to(_attend_loop(QA, KA, VA, sinks=SQ)[0])))
case(f"{P} per head == loop", lambda: attention(QA, KA, VA, sinks=SH),
     Ok(close_to(_attend_loop(QA, KA, VA, sinks=SH)[0])))
case(f"{P} per query, masked, weights == loop", lambda: attention(QA, KA, VA, sinks=SQ, mask=MASK, return_weights=True),
     Ok(_all_close(lambda: _attend_loop(QA, KA, VA, sinks=SQ, mask=MASK)[:2])))
case(f"{P} per query (H, T) for 3-D q", lambda: attention(QA[0], KA[0], VA[0], sinks=SQ[0]),
     Ok(close_to(_attend_loop(QA[0], KA[0], VA[0], sinks=SQ[0])[0])))
case(f"{P} per query lists", lambda: attention(QA, KA, VA, sinks=SQ.tolist()),
     Ok(close_to(_attend_loop(QA, KA, VA, sinks=SQ)[0])))
case(f"{P} per query 1e300 (all weight on the sink)", lambda: attention(QA, KA, VA, sinks=np.full_like(SQ, 1e300)),
     Ok(close_to(np.zeros((2, 3, 4, 2)), rtol=0, atol=0)))
case(f"{P} per query -1e300 (no sink)", lambda: attention(QA, KA, VA, sinks=np.full_like(SQ, -1e300)),
     Ok(close_to(_attend_loop(QA, KA, VA)[0])))
Q32, K32, V32, S32 = (a.astype(np.float32) for a in (QA, KA, VA, SQ))
case(f"{P} per query float32 q k v sinks", lambda: attention(Q32, K32, V32, sinks=S32),
     Ok(close_to(_attend_loop(Q32, K32, V32, sinks=S32)[0], rtol=1e-5, atol=1e-6, dtype=np.float32)))
case(f"{P} T = 0", lambda: attention(QA[:, :, :0], KA, VA, sinks=SQ[:, :, :0]), Ok(shape_is((2, 3, 0, 2))))
case(f"{P} B = 0", lambda: attention(QA[:0], KA[:0], VA[:0], sinks=SQ[:0]), Ok(shape_is((0, 3, 4, 2))))
case(f"{P} S = 0 (only the sink: zeros)", lambda: attention(QA, KA[:, :, :0], VA[:, :, :0], sinks=SQ),
     Ok(close_to(np.zeros((2, 3, 4, 2)), rtol=0, atol=0)))
case(f"{P} backward per query == central differences",
     lambda: attention_backward(QA, KA, VA, DOUT, sinks=SQ, mask=MASK), Ok(_dsinks_match(4, SQ, MASK)))
case(f"{P} backward per head == central differences", lambda: attention_backward(QA, KA, VA, DOUT, sinks=SH),
     Ok(_dsinks_match(4, SH)))
case(f"{P} backward T = 0", lambda: attention_backward(QA[:, :, :0], KA, VA, DOUT[:, :, :0], sinks=SQ[:, :, :0]),
     Ok(lambda g: g[4].shape == (2, 3, 0) and not g[1].any()))
case(f"{P} backward S = 0", lambda: attention_backward(QA, KA[:, :, :0], VA[:, :, :0], DOUT, sinks=SQ),
     Ok(lambda g: g[4].shape == (2, 3, 4) and not g[4].any() and not g[0].any()))
case(f"{P} blockwise per query == loop",
     lambda: blockwise_attention(QA, KA, VA, sinks=SQ, mask_fn=_mask_fn, block_size=2),
     Ok(close_to(_attend_loop(QA, KA, VA, sinks=SQ, mask=MASK)[0])))
case(f"{P} blockwise per query causal == loop",
     lambda: blockwise_attention(QA, KA, VA, sinks=SQ, causal=True, block_size=3),
     Ok(close_to(_attend_loop(QA, KA, VA, sinks=SQ, mask=np.tril(np.ones((4, 6), bool), 2))[0])))
case(f"{P} blockwise lse counts the sink",
     lambda: blockwise_attention(QA, KA, VA, sinks=SQ, mask_fn=_mask_fn, block_size=4, return_lse=True)[1],
     Ok(close_to(_attend_loop(QA, KA, VA, sinks=SQ, mask=MASK)[2])))
case(f"{P} blockwise per query 3-D q", lambda: blockwise_attention(QA[0], KA[0], VA[0], sinks=SQ[0], block_size=3),
     Ok(close_to(_attend_loop(QA[0], KA[0], VA[0], sinks=SQ[0])[0])))
case(f"{P} blockwise T = 0", lambda: blockwise_attention(QA[:, :, :0], KA, VA, sinks=SQ[:, :, :0], block_size=2),
     Ok(shape_is((2, 3, 0, 2))))
case(f"{P} blockwise S = 0", lambda: blockwise_attention(QA, KA[:, :, :0], VA[:, :, :0], sinks=SQ, block_size=2),
     Ok(close_to(np.zeros((2, 3, 4, 2)), rtol=0, atol=0)))


def _blockwise_grads(sinks, block=2):
    out, lse = blockwise_attention(QA, KA, VA, sinks=sinks, mask_fn=_mask_fn, block_size=block, return_lse=True)
    return blockwise_attention_backward(QA, KA, VA, out, lse, DOUT, sinks=sinks, mask_fn=_mask_fn, block_size=block)


case(f"{P} blockwise backward per query == central differences", lambda: _blockwise_grads(SQ),
     Ok(_dsinks_match(3, SQ, MASK)))
case(f"{P} blockwise backward per head == central differences", lambda: _blockwise_grads(SH, 3),
     Ok(_dsinks_match(3, SH, MASK)))
OUT_LSE = blockwise_attention(QA, KA, VA, sinks=SQ, block_size=2, return_lse=True)
SINK_CALLS = {
    "attention": lambda s: attention(QA, KA, VA, sinks=s),
    "attention_backward": lambda s: attention_backward(QA, KA, VA, DOUT, sinks=s),
    "blockwise_attention": lambda s: blockwise_attention(QA, KA, VA, sinks=s, block_size=2),
    "blockwise_attention_backward": lambda s: blockwise_attention_backward(QA, KA, VA, *OUT_LSE, DOUT, sinks=s,
                                                                           block_size=2),
}
for fn, call in SINK_CALLS.items():
    for label, bad, exc in (("(H, T) for 4-D q", SQ[0], ValueError), ("(B, H, T, 1)", SQ[..., None], ValueError),
                            ("(B, H, T - 1)", SQ[..., :3], ValueError), ("(B, H - 1, T)", SQ[:, :2], ValueError),
                            ("(1, H, T)", SQ[:1], ValueError), ("(T,)", SQ[0, 0], ValueError), ("0-D", 0.5, ValueError),
                            ("(H + 1,)", np.zeros(4), ValueError), ("NaN", SQ * np.nan, ValueError),
                            ("+inf", np.where(SQ > 0, np.inf, SQ), ValueError),
                            ("-inf", np.full_like(SQ, -np.inf), ValueError),
                            ("bool", SQ > 0, TypeError), ("str", "sinks", TypeError)):
        case(f"{fn} sinks {label}", lambda c=call, b=bad: c(b), Named("sinks", exc))
case("attention sinks 1e300 for float32 logits", lambda: attention(Q32, K32, V32, sinks=SQ * 1e300), Named("sinks"))
case("attention sinks 7e4 for float16 logits",
     lambda: attention(*(a.astype(np.float16) for a in (QA, KA, VA)), sinks=np.full_like(SQ, 7e4)), Named("sinks"))


# --------------------------------------------------------------------------- the layer

SIZES = {"num_kv_heads": 2, "head_dim": 6, "d_rel": 3, "conv_kernel": 3, "qk_clip": 1.5, "rel_clip": 0.7, "seed": 1}
FULL = {"rel_extent": 4, "dynamic_conv": True, "log_scaling": (0.3, 2)}    # E = 4 < T: the bias ends inside the call
SLIDE = {"sliding_window": 3}                                               # W = 3 < T: the window bites


def _layer(full=True, **kw):
    """A small layer (d_model 16, 4 heads over 2 key/value heads, head_dim 6), its weights drawn away from their
    start so that the clips bite on some vectors and not on others."""
    layer = InklingAttention(16, 4, **{**SIZES, **(FULL if full else SLIDE), **kw})
    rng = np.random.default_rng(11)
    for name in WEIGHTS:
        w = getattr(layer, name)
        if w is not None:
            setattr(layer, name, (w + 0.3 * rng.standard_normal(w.shape)).astype(w.dtype))
    return layer


def _changed(layer, **weights):
    """``layer`` with weight attributes replaced, each by a value or by a function of the old one."""
    for name, value in weights.items():
        setattr(layer, name, value(getattr(layer, name)) if callable(value) else value)
    return layer


XL = RNG.standard_normal((2, 6, 16))
DYL = RNG.standard_normal((2, 6, 16))
PADL = np.ones((2, 6), bool)
PADL[1, :2] = False                                                     # left padding in the second row
LAYERS = {"full": True, "sliding": False}


DEFAULT = object()                                                      # x not given: XL


def _call(full=True, x=DEFAULT, layer_kw=None, **kw):
    return lambda: _layer(full, **(layer_kw or {}))(XL if x is DEFAULT else x, **{"causal": True, **kw})


WRITTEN: dict = {}


def _written_out(full=True, layer_kw=None, **kw):
    """The written-out layer on ``XL``, kept once computed: many rows compare with the same one."""
    key = (full, repr(sorted((layer_kw or {}).items())), repr(sorted(kw.items())))
    if key not in WRITTEN:
        WRITTEN[key] = _layer_loop(_layer(full, **(layer_kw or {})), XL, **kw)
    return WRITTEN[key]


def _like_loop(full=True, x=DEFAULT, layer_kw=None, rtol=1e-10, atol=1e-12, dtype=None, **kw):
    """A check: the result equals the written-out layer (float64) on the same layer and arguments."""
    def want():
        loop_kw = {k: v for k, v in kw.items() if k in ("positions", "mask", "causal")}
        if x is DEFAULT:
            return _written_out(full, layer_kw, **loop_kw)
        return _layer_loop(_layer(full, **(layer_kw or {})), x, **loop_kw)
    return Ok(close_to(want, rtol=rtol, atol=atol, dtype=dtype))


for kind, full in LAYERS.items():
    P = f"layer {kind}"
    case(f"{P} == written out", _call(full), _like_loop(full))
    case(f"{P} padded == written out", _call(full, mask=PADL), _like_loop(full, mask=PADL))
    case(f"{P} positions 2**31 + t == written out", _call(full, positions=np.arange(6) + 2 ** 31),
         _like_loop(full, positions=np.arange(6) + 2 ** 31))
    case(f"{P} positions near 2**62 == written out", _call(full, positions=np.arange(6) + 2 ** 62 - 7),
         _like_loop(full, positions=np.arange(6) + 2 ** 62 - 7))
    case(f"{P} positions int 6", _call(full, positions=6), _like_loop(full))
    case(f"{P} positions float exact", _call(full, positions=np.arange(6.0) + 3),
         _like_loop(full, positions=np.arange(6) + 3))
    case(f"{P} positions with a gap", _call(full, positions=[0, 1, 2, 10, 11, 12]),
         _like_loop(full, positions=[0, 1, 2, 10, 11, 12]))
    case(f"{P} blockwise == written out", _call(full, layer_kw={"block_size": 2}), _like_loop(full))
    case(f"{P} blockwise 2**63 == written out", _call(full, layer_kw={"block_size": 2 ** 63}), _like_loop(full))
    case(f"{P} weights == written out", _call(full, return_weights=True),
         Ok(lambda got, f=full: np.testing.assert_allclose(got[1], _layer_loop(_layer(f), XL, weights=True)[1],
                                                           rtol=1e-10, atol=1e-13)))
    case(f"{P} gate off == written out", lambda f=full: _changed(_layer(f), wg=None)(XL, causal=True),
         Ok(close_to(lambda f=full: _layer_loop(_changed(_layer(f), wg=None), XL))))
    case(f"{P} T = 1", _call(full, x=XL[:, :1]), _like_loop(full, x=XL[:, :1]))
    case(f"{P} T = 0", _call(full, x=XL[:, :0]), Ok(shape_is((2, 0, 16))))
    case(f"{P} B = 0", _call(full, x=XL[:0]), Ok(shape_is((0, 6, 16))))
    case(f"{P} T = 0 blockwise", _call(full, x=XL[:, :0], layer_kw={"block_size": 2}), Ok(shape_is((2, 0, 16))))
    case(f"{P} B = 0 blockwise", _call(full, x=XL[:0], layer_kw={"block_size": 2}), Ok(shape_is((0, 6, 16))))
    case(f"{P} T = 0 weights", _call(full, x=XL[:, :0], return_weights=True), Ok(lambda g: g[1].shape == (2, 4, 0, 0)))
    case(f"{P} list x", _call(full, x=XL.tolist()), _like_loop(full))
    case(f"{P} int x", _call(full, x=np.round(XL * 2).astype(int)), _like_loop(full, x=np.round(XL * 2)))
    case(f"{P} float32 x into a float64 layer", _call(full, x=XL.astype(np.float32)),
         _like_loop(full, x=XL.astype(np.float32).astype(np.float64), dtype=np.float64))
    case(f"{P} longdouble", _call(full, x=XL.astype(np.longdouble), layer_kw={"dtype": np.longdouble}),
         _like_loop(full, dtype=np.longdouble, rtol=1e-10))
    case(f"{P} float32 values", _call(full, x=XL.astype(np.float32), layer_kw={"dtype": np.float32}),
         _like_loop(full, x=XL.astype(np.float32), rtol=1e-4, atol=1e-5))
    for dtype, tol in ((np.float32, 1e-4), (np.float16, 5e-2)):
        case(f"{P} {np.dtype(dtype).name} layer keeps its dtype",
             _call(full, x=XL.astype(dtype), layer_kw={"dtype": dtype}),
             _like_loop(full, x=XL.astype(dtype), rtol=tol, atol=tol, dtype=dtype),
             found="the output (and ctx.k, ctx.out, every gradient) is float64: short_conv promotes the keys and "
                     "values to float64 (np.sqrt of a Python int), where MultiHeadAttention(dtype=float32) stays "
                     "float32")
    # the clips make q, k and r independent of the scale of x once it is large, and the values' RMSNorm too
    case(f"{P} x 1e150 == written out", _call(full, x=XL * 1e150, layer_kw={"dynamic_conv": False}),
         _like_loop(full, x=XL * 1e150, layer_kw={"dynamic_conv": False}, rtol=1e-9))
    case(f"{P} x 1e155 == written out", _call(full, x=XL * 1e155, layer_kw={"dynamic_conv": False}),
         _like_loop(full, x=XL * 1e155, layer_kw={"dynamic_conv": False}, rtol=1e-9),
         found="a silently wrong result: l2_clip's np.linalg.norm overflows (|q|^2 ~ 1e310), so q, k and the "
                 "relative states are multiplied by tau / inf = 0 (an overflow warning, no error)")
    if full:                                                            # dynamic taps: quadratic in x
        case(f"{P} x 1e300 overflows", _call(full, x=XL * 1e300), Named("x"))
    else:
        case(f"{P} x 1e300 == written out", _call(full, x=XL * 1e300), _like_loop(full, x=XL * 1e300, rtol=1e-9),
             found="a silently wrong result (off by 0.9), with an overflow warning: l2_clip's norm overflows, "
                     "q, k and r become 0")
    case(f"{P} NaN x", _call(full, x=XL * np.nan), Named("x"))
    case(f"{P} inf x", _call(full, x=np.where(XL > 1, np.inf, XL)), Named("x"))
    for bad, exc in ((None, TypeError), ("x", TypeError), (XL > 0, TypeError), (XL + 1j, TypeError),
                     (XL[0], ValueError), (XL[None], ValueError), (XL[..., :15], ValueError),
                     ([[[1.0] * 16], [[1.0]]], ValueError)):
        case(f"{P} x {getattr(bad, 'shape', type(bad).__name__)} {getattr(bad, 'dtype', '')}",
             _call(full, x=bad), Named("x", exc))
    for bad, exc in ((np.arange(5), ValueError), (np.arange(6)[None], ValueError), (np.arange(6) - 1, ValueError),
                     (np.arange(6) + 0.5, ValueError), (np.arange(6) > 2, TypeError), ("p", TypeError),
                     ([2 ** 63] * 6, ValueError), (7, ValueError), (np.full(6, np.nan), ValueError)):
        case(f"{P} positions {bad!r}"[:80], _call(full, positions=bad), Named("positions", exc))
    for bad, exc in ((np.ones((2, 5), bool), ValueError), (np.ones((3, 6), bool), ValueError),
                     (np.ones((2, 6)), TypeError), (np.ones(6, bool), ValueError),
                     (np.ones((2, 1, 1, 1, 6), bool), ValueError), ("m", TypeError),
                     (np.ones((2, 4, 6, 5), bool), ValueError)):
        case(f"{P} mask {getattr(bad, 'shape', bad)} {getattr(bad, 'dtype', '')}", _call(full, mask=bad),
             Named("mask", exc))
    for arg, bad in (("causal", "yes"), ("causal", 1), ("return_weights", "yes"), ("return_context", 1)):
        case(f"{P} {arg} {bad!r}", _call(full, **{arg: bad}), Named(arg, TypeError))
    case(f"{P} return_weights with block_size", _call(full, layer_kw={"block_size": 2}, return_weights=True),
         Named(("return_weights", "block_size")))
    # every weight: NaN, inf, another shape, another type, float32, 1e200
    for name in WEIGHTS:
        if not full and name in ("k_conv_w", "v_conv_w"):
            continue
        shape = getattr(_layer(full), name).shape

        def setting(value, f=full, n=name):
            return lambda: _changed(_layer(f), **{n: value})(XL, causal=True)
        wider = shape[:-1] + (shape[-1] + 1,)
        case(f"{P} {name} NaN", setting(lambda w: np.where(np.arange(w.size).reshape(w.shape) == 1, np.nan, w)),
             Named(name))
        case(f"{P} {name} inf", setting(lambda w: np.full_like(w, np.inf)), Named(name))
        case(f"{P} {name} {wider}", setting(np.zeros(wider)), Named(name))
        if shape[0] != shape[-1]:
            case(f"{P} {name} {shape[::-1]} (transposed)", setting(np.zeros(shape[::-1])), Named(name))
        case(f"{P} {name} 1-D", setting(np.zeros(int(np.prod(shape)))), Named(name))
        case(f"{P} {name} list", setting(lambda w: w.tolist()), Named(name, TypeError))
        case(f"{P} {name} int", setting(lambda w: np.ones(w.shape, int)), Named(name, TypeError))
        if name != "wg":
            case(f"{P} {name} None", setting(None), Named(name, TypeError))

        def scaled(s, f=full, n=name, dtype=np.float64):
            return _changed(_layer(f), **{n: lambda w: (w * s).astype(dtype)})
        case(f"{P} {name} float32", lambda s=scaled: s(1.0, dtype=np.float32)(XL, causal=True),
             Ok(close_to(lambda s=scaled: _layer_loop(s(1.0, dtype=np.float32), XL))))
        clipped = name in ("wq", "wk", "q_scale", "k_conv", "k_conv_w", "rel_w", "rel_scale")
        case(f"{P} {name} 1e200", lambda s=scaled: s(1e200)(XL, causal=True),
             Ok(close_to(lambda s=scaled: _layer_loop(s(1e200), XL), rtol=1e-9, atol=1e-12)),
             found=("a silently wrong result: the vectors this weight scales reach ~1e200, l2_clip's norm "
                      "overflows and clips them to 0 (an overflow warning, no error)") if clipped else None)
case("layer full wq 1e100 == written out (the clip bites, no overflow)",
     lambda: _changed(_layer(), wq=lambda w: w * 1e100)(XL, causal=True),
     Ok(close_to(lambda: _layer_loop(_changed(_layer(), wq=lambda w: w * 1e100), XL))))
case("layer sliding float32 x 1e20 == written out",
     _call(False, x=(XL * 1e20).astype(np.float32), layer_kw={"dtype": np.float32}),
     _like_loop(False, x=(XL * 1e20).astype(np.float32), rtol=1e-4, atol=1e-5),
     found="a silently wrong result: |q|^2 ~ 1e40 overflows float32 in l2_clip's norm, so q, k and r become 0")
for name in ("bq", "bk", "bv", "bo", "bg"):
    def with_bias(value, n=name):
        return lambda: _changed(_layer(True, bias=True), **{n: value})(XL, causal=True)
    case(f"layer full bias {name} NaN", with_bias(lambda w: np.where(np.arange(w.size) == 0, np.nan, w)),
         Named(name))
    case(f"layer full bias {name} (n + 1,)", with_bias(lambda w: np.zeros(w.size + 1)), Named(name))
case("layer full bg without wg", lambda: _changed(_layer(True, bias=True), wg=None)(XL, causal=True),
     Named(("bg", "wg")))
case("layer sliding without causal", _call(False, causal=False), Named(("sliding_window", "causal")))
# a full layer's own key and value inputs (x_k, x_v): checked like x; equal to x, they change nothing
case("layer full x_k of another shape", _call(True, x_k=np.zeros((2, 5, 16))), Named("x_k"))
case("layer full x_v NaN", _call(True, x_v=np.full((2, 6, 16), np.nan)), Named("x_v"))
case("layer full x_k a string", _call(True, x_k="keys"), Named("x_k"))
case("layer full x_k = x_v = x == written out", _call(True, x_k=XL, x_v=XL), _like_loop(True))
case("layer sliding x_k, x_v lists = x == written out", _call(False, x_k=XL.tolist(), x_v=XL.tolist()),
     _like_loop(False))
case("layer full without causal == written out", _call(True, causal=False), _like_loop(True, causal=False))
case("layer full without causal, padded == written out", _call(True, causal=False, mask=PADL),
     _like_loop(True, causal=False, mask=PADL))
case("layer full log_scaling n_floor 2**63 == written out", _call(True, layer_kw={"log_scaling": (0.3, 2 ** 63)}),
     _like_loop(True, layer_kw={"log_scaling": (0.3, 2 ** 63)}))
case("layer full log_scaling alpha 1e308 overflows", _call(True, layer_kw={"log_scaling": (1e308, 1)}),
     Named("log_scaling"),
     found="Overflow 'the relative bias r rel_proj overflows float64; rescale x or the weights' (after an "
             "overflow warning): it blames x and the weights, while s(p) = 1 + 1e308 ln(p + 1) is the culprit")


# --------------------------------------------------------------------------- the constructor

P = "InklingAttention"
for arg in ("d_rel", "rel_extent", "conv_kernel", "sliding_window", "block_size", "num_kv_heads", "head_dim"):
    for bad, exc in ((0, ValueError), (-1, ValueError), (True, TypeError), (2.0, TypeError), ("4", TypeError)):
        case(f"{P} {arg}={bad!r}", lambda a=arg, b=bad: InklingAttention(16, 4, **{a: b}), Named(arg, exc))
for arg in ("rel_extent", "num_kv_heads", "head_dim"):
    for big in (2 ** 31, 2 ** 63):
        case(f"{P} {arg}={big}", lambda a=arg, b=big: InklingAttention(16, 4, **{a: b}), Named(arg))
for arg in ("d_rel", "conv_kernel", "sliding_window"):
    for big in (2 ** 31, 2 ** 63):
        case(f"{P} {arg}={big}", lambda a=arg, b=big: InklingAttention(16, 4, **{a: b}), Named(arg),
             found=f"refused for memory, but the message ('InklingAttention's weights …' or 'rel_proj (d_rel, "
                     f"rel_extent) …') does not name {arg}")
for arg in ("qk_clip", "rel_clip", "norm_eps"):
    for bad, exc in ((0.0, ValueError), (-1.0, ValueError), (np.nan, ValueError), (np.inf, ValueError),
                     ("1", TypeError), (True, TypeError), (None, TypeError), (1e-310, ValueError),
                     (2 ** 1100, ValueError)):
        case(f"{P} {arg}={bad!r}"[:60], lambda a=arg, b=bad: InklingAttention(16, 4, **{a: b}), Named(arg, exc))
for bad in ("yes", 1, None):
    case(f"{P} dynamic_conv={bad!r}", lambda b=bad: InklingAttention(16, 4, dynamic_conv=b),
         Named("dynamic_conv", TypeError))
for bad, words, exc in (((0.1,), "log_scaling", TypeError), ((0.1, 4, 5), "log_scaling", TypeError),
                        ("ab", "log_scaling", TypeError), (np.array([0.1, 4.0]), "log_scaling", TypeError),
                        ((np.nan, 4), "log_scaling alpha", ValueError), ((-0.1, 4), "log_scaling alpha", ValueError),
                        (("0.1", 4), "log_scaling alpha", TypeError), ((True, 4), "log_scaling alpha", TypeError),
                        ((0.1, 0), "log_scaling n_floor", ValueError), ((0.1, 4.0), "log_scaling n_floor", TypeError),
                        ((0.1, True), "log_scaling n_floor", TypeError)):
    case(f"{P} log_scaling={bad!r}", lambda b=bad: InklingAttention(16, 4, log_scaling=b), Named(words, exc))
case(f"{P} sliding_window with another rel_extent", lambda: InklingAttention(16, 4, sliding_window=5, rel_extent=6),
     Named(("rel_extent", "window")))
case(f"{P} sliding_window with its own rel_extent",
     lambda: InklingAttention(16, 4, sliding_window=5, rel_extent=5).rel_extent, Ok(lambda e: e == 5))
case(f"{P} sinks=True", lambda: InklingAttention(16, 4, sinks=True), Named("sinks"))
case(f"{P} scheme str", lambda: InklingAttention(16, 4, scheme="nope"), Named("scheme"))
case(f"{P} d_model 0", lambda: InklingAttention(0, 4), Named("d_model"))
case(f"{P} num_kv_heads 3 of 4", lambda: InklingAttention(16, 4, num_kv_heads=3), Named("num_kv_heads"))
case(f"{P} dtype int", lambda: InklingAttention(16, 4, dtype=int), Named("dtype", TypeError))
case(f"{P} new_cache mem_len -1", lambda: InklingAttention(16, 4).new_cache(mem_len=-1), Named("mem_len"))
case(f"{P} new_cache mem_len str", lambda: InklingAttention(16, 4).new_cache(mem_len="4"), Named("mem_len", TypeError))
case(f"{P} new_cache mem_len bool", lambda: InklingAttention(16, 4).new_cache(mem_len=True),
     Named("mem_len", TypeError))


# --------------------------------------------------------------------------- the cache

def _snapshot(cache):
    arrays = (cache.k, cache.v, cache.conv_k, cache.conv_v)
    return (*(None if a is None else np.array(a, copy=True) for a in arrays), cache.length, cache.seen)


def _same(a, b) -> bool:
    for u, w in zip(a, b):
        if isinstance(u, np.ndarray) or isinstance(w, np.ndarray):
            if u is None or w is None or u.shape != w.shape or not np.array_equal(u, w):
                return False
        elif u != w:
            return False
    return True


def _primed(full=True, n=3, **layer_kw):
    """A layer and its cache after a call on the first ``n`` tokens of ``XL``."""
    layer = _layer(full, **layer_kw)
    cache = layer.new_cache()
    layer(XL[:, :n], causal=True, cache=cache)
    return layer, cache


def _refused_keeps_cache(bad, full=True, **layer_kw):
    """A call: ``bad(layer, cache)`` on a primed cache; a refusal that changed ``k``, ``v``, ``conv_k``,
    ``conv_v``, ``length`` or ``seen`` raises ``StateChanged``."""
    def call():
        layer, cache = _primed(full, **layer_kw)
        before = _snapshot(cache)
        try:
            return bad(layer, cache)
        except Exception:
            if not _same(before, _snapshot(cache)):
                raise StateChanged("the cache's k, v, conv_k, conv_v, length or seen changed") from None
            raise
    return call


def _with_weight(name, value):
    return lambda layer, cache: _changed(layer, **{name: value})(XL[:, 3:], causal=True, cache=cache)


REFUSALS = {
    "another batch size": (lambda l, c: l(np.zeros((3, 2, 16)), causal=True, cache=c), Named("cache")),
    "B = 0": (lambda l, c: l(XL[:0, 3:], causal=True, cache=c), Named("cache")),
    "NaN x": (lambda l, c: l(XL[:, 3:] * np.nan, causal=True, cache=c), Named("x")),
    "x 1e300": (lambda l, c: l(XL[:, 3:] * 1e300, causal=True, cache=c), Named("x")),
    "x of another d_model": (lambda l, c: l(XL[:, 3:, :15], causal=True, cache=c), Named("x")),
    "negative positions": (lambda l, c: l(XL[:, 3:], positions=[-1, 0, 1], causal=True, cache=c), Named("positions")),
    "a (B, T) mask without the cached keys": (
        lambda l, c: l(XL[:, 3:], mask=np.ones((2, 3), bool), causal=True, cache=c), Named("mask")),
    "return_context str": (lambda l, c: l(XL[:, 3:], causal=True, cache=c, return_context="yes"),
                           Named("return_context")),
    "wo NaN": (_with_weight("wo", lambda w: w * np.nan), Named("wo")),
    "rel_proj inf": (_with_weight("rel_proj", lambda w: w * np.inf), Named("rel_proj")),
    "k_conv_w NaN": (_with_weight("k_conv_w", lambda w: w * np.nan), Named("k_conv_w")),
    "w_sink NaN": (_with_weight("w_sink", lambda w: w * np.nan), Named("w_sink")),
    "v_conv of another shape": (_with_weight("v_conv", lambda w: w[:2]), Named("v_conv")),
    "another layer's cache": (lambda l, c: _layer()(XL[:, 3:], causal=True, cache=c), Named("cache")),
}
for label, (bad, expect) in REFUSALS.items():
    case(f"cache kept after a refused call: {label}", _refused_keeps_cache(bad), expect)
case("cache kept after a refused call: sliding without causal",
     _refused_keeps_cache(lambda l, c: l(XL[:, 3:], causal=False, cache=c), full=False),
     Named(("sliding_window", "causal")))
case("cache kept after a refused call: return_weights with block_size",
     _refused_keeps_cache(lambda l, c: l(XL[:, 3:], causal=True, cache=c, return_weights=True), block_size=2),
     Named("return_weights"))


def _after_refusals(full=True):
    """Every refusal above on one cache, then the rest of the sequence: it must continue like the full pass."""
    def call():
        layer, cache = _primed(full)
        keep = {n: getattr(layer, n) for n in WEIGHTS}
        for label, (bad, _) in REFUSALS.items():
            if not full and label in ("x 1e300", "k_conv_w NaN"):      # a sliding layer: no k_conv_w; see its x 1e300
                continue
            try:
                bad(layer, cache)
            except (ValueError, TypeError):
                pass
            for n, w in keep.items():
                setattr(layer, n, w)
        return np.concatenate([layer(XL[:, 3:4], causal=True, cache=cache), layer(XL[:, 4:], causal=True, cache=cache)],
                              axis=1)
    return call


def _cached_steps(full=True, steps=((0, 3), (3, 4), (4, 6)), mask=None, mem_len=None, layer_kw=None):
    def call():
        layer = _layer(full, **(layer_kw or {}))
        cache = layer.new_cache(mem_len=mem_len)
        return np.concatenate([layer(XL[:, a:b], causal=True, cache=cache, mask=None if mask is None else mask[:, :b])
                               for a, b in steps], axis=1)
    return call


for kind, full in LAYERS.items():
    P = f"cache {kind}"
    case(f"{P} steps == written out", _cached_steps(full), _like_loop(full))
    case(f"{P} padded steps == written out", _cached_steps(full, mask=PADL), _like_loop(full, mask=PADL))
    case(f"{P} one token at a time == written out", _cached_steps(full, steps=[(t, t + 1) for t in range(6)]),
         _like_loop(full))
    case(f"{P} mem_len 2**63 == written out", _cached_steps(full, mem_len=2 ** 63), _like_loop(full))
    case(f"{P} continues like the full pass after every refusal", _after_refusals(full),
         Ok(close_to(lambda f=full: _written_out(f)[:, 3:])))
    case(f"{P} T = 0 call then steps == written out", _cached_steps(full, steps=((0, 2), (2, 2), (2, 6))),
         _like_loop(full))
case("cache sliding rolling mem_len W - 1 == written out",
     _cached_steps(False, steps=[(t, t + 1) for t in range(6)], mem_len=2), _like_loop(False))
case("cache K = 1 steps == written out", _cached_steps(layer_kw={"conv_kernel": 1}),
     _like_loop(layer_kw={"conv_kernel": 1}))
case("cache K = 5 > T steps == written out", _cached_steps(layer_kw={"conv_kernel": 5}, steps=((0, 1), (1, 2), (2, 6))),
     _like_loop(layer_kw={"conv_kernel": 5}))
case("cache a KVCache", lambda: _layer()(XL, causal=True, cache=KVCache()), Named("cache", TypeError))
case("cache a str", lambda: _layer()(XL, causal=True, cache="cache"), Named("cache", TypeError))
case("cache another layer's", lambda: _layer()(XL, causal=True, cache=_layer().new_cache()), Named("cache"))
case("cache a MultiHeadAttention's", lambda: _layer()(XL, causal=True, cache=MultiHeadAttention(16, 4).new_cache()),
     Named("cache", TypeError))
def _bare_cache_steps():
    layer, cache = _layer(), InklingCache()
    return np.concatenate([layer(XL[:, :3], causal=True, cache=cache), layer(XL[:, 3:], causal=True, cache=cache)], 1)


def _claimed_then_other():
    cache = InklingCache()
    _layer(False)(XL[:, :2], causal=True, cache=cache)                # claimed by this sliding layer
    return _layer(True)(XL[:, 2:], causal=True, cache=cache)


case("cache a bare InklingCache == written out", _bare_cache_steps, _like_loop())
case("cache a bare InklingCache claimed by a sliding layer, then given to a full one", _claimed_then_other,
     Named("cache"))


def _another_batch_size():
    layer, cache = _primed()                                            # B = 2
    return layer(XL[:1, 3:], causal=True, cache=cache)


case("cache of another batch size", _another_batch_size, Named("cache"))


# --------------------------------------------------------------------------- backward

def _grads_match_fd(full=True, x=None, dy=None, **kw):
    """A call and its check: ``backward``'s gradient of ``x`` and of every weight against central differences of
    the forward (itself checked against the written-out layer above) along one random direction each."""
    layer_kw = {k: kw.pop(k) for k in ("block_size",) if k in kw}
    x = XL if x is None else x
    dy = DYL[:, :x.shape[1]] if dy is None else dy

    def call():
        layer = _layer(full, **layer_kw)
        _, ctx = layer(x, causal=True, return_context=True, **kw)
        return layer.backward(ctx, dy)

    def check(grads):
        layer, xx = _layer(full, **layer_kw), np.array(x, copy=True)
        names = {n for n in WEIGHTS if getattr(layer, n) is not None}
        assert set(grads) == {"x", *names}, set(grads) ^ {"x", *names}
        rng, h = np.random.default_rng(5), 1e-6
        for name in sorted(grads):
            a = xx if name == "x" else getattr(layer, name)
            assert grads[name].shape == a.shape, (name, grads[name].shape)
            e = rng.standard_normal(a.shape)
            a += h * e
            up = (layer(xx, causal=True, **kw) * dy).sum()
            a -= 2 * h * e
            down = (layer(xx, causal=True, **kw) * dy).sum()
            a += h * e
            num = (up - down) / (2 * h)
            assert abs((grads[name] * e).sum() - num) <= 1e-6 * abs(num) + 1e-8, (name, (grads[name] * e).sum(), num)
    return call, Ok(check)


def _backward_of(full=True, dy=DYL, x=XL, layer_kw=None, other=None, **kw):
    """``backward(ctx, dy)`` of a pass of one layer, given to ``other(layer)`` (or to the layer itself)."""
    def call():
        layer = _layer(full, **(layer_kw or {}))
        _, ctx = layer(x, causal=True, return_context=True, **kw)
        target = layer if other is None else other(layer)
        return target.backward(ctx, dy() if callable(dy) else dy)
    return call


def _scaled_grads(s, full=True):
    base = _backward_of(full)()

    def check(got):
        for n in base:
            np.testing.assert_allclose(got[n] / s, base[n], rtol=1e-9, atol=1e-12, err_msg=n)
    return check


def _zero_grads(shapes_of):
    def check(got):
        layer = _layer(True)
        for name, g in got.items():
            want = shapes_of if name == "x" else getattr(layer, name).shape
            assert g.shape == want and not g.any(), (name, g.shape)
    return check


for kind, full in LAYERS.items():
    P = f"backward {kind}"
    case(f"{P} == central differences", *_grads_match_fd(full))
    case(f"{P} padded == central differences", *_grads_match_fd(full, mask=PADL))
    case(f"{P} blockwise == central differences", *_grads_match_fd(full, block_size=4))
    case(f"{P} T = 1 == central differences", *_grads_match_fd(full, x=XL[:, :1]))
def _grads_like(dy):
    """A check: the gradients equal those of ``dy`` (float64)."""
    def check(got):
        for n, g in _backward_of(dy=dy)().items():
            np.testing.assert_allclose(np.asarray(got[n], np.float64), g, rtol=1e-12, atol=1e-14, err_msg=n)
    return check


for dtype in (np.float16, np.float32, np.longdouble):
    case(f"backward full dy {np.dtype(dtype).name}", _backward_of(dy=DYL.astype(dtype)),
         Ok(_grads_like(DYL.astype(dtype).astype(np.float64))))
case("backward full dy 1e300 (linear in dy)", _backward_of(dy=DYL * 1e300), Ok(_scaled_grads(1e300)))
case("backward full T = 0", _backward_of(x=XL[:, :0], dy=DYL[:, :0]), Ok(_zero_grads((2, 0, 16))))
case("backward full B = 0", _backward_of(x=XL[:0], dy=DYL[:0]), Ok(_zero_grads((0, 6, 16))))
case("backward full blockwise T = 0", _backward_of(x=XL[:, :0], dy=DYL[:, :0], layer_kw={"block_size": 2}),
     Ok(_zero_grads((2, 0, 16))))


def _cached_backward():
    """The gradient of x for a cached call against central differences, the cache replayed for each loss."""
    def replayed():
        layer = _layer()
        cache = layer.new_cache()
        layer(XL[:, :3], causal=True, cache=cache)
        return layer, cache

    def call():
        layer, cache = replayed()
        _, ctx = layer(XL[:, 3:], causal=True, cache=cache, return_context=True)
        return layer.backward(ctx, DYL[:, 3:])

    def check(grads):
        e, h = np.random.default_rng(6).standard_normal((2, 3, 16)), 1e-6
        def loss(x1):
            layer, cache = replayed()
            return (layer(x1, causal=True, cache=cache) * DYL[:, 3:]).sum()
        num = (loss(XL[:, 3:] + h * e) - loss(XL[:, 3:] - h * e)) / (2 * h)
        assert abs((grads["x"] * e).sum() - num) <= 1e-6 * abs(num) + 1e-8, ((grads["x"] * e).sum(), num)
    return call, Ok(check)


case("backward full cached call == central differences", *_cached_backward())


def _ctx_outlives_the_cache(full, mem_len, fail):
    """The gradients of a cached call's context, computed again after the cache has moved on (a later call, or a
    refused one): a context must not see the cache's buffers change."""
    def run():
        layer = _layer(full)
        cache = layer.new_cache(mem_len=mem_len)
        layer(XL[:, :2], causal=True, cache=cache)
        _, ctx = layer(XL[:, 2:4], causal=True, cache=cache, return_context=True)
        before = layer.backward(ctx, DYL[:, 2:4])
        try:
            layer(XL[:, 4:] * (1e300 if fail else 1.0), causal=True, cache=cache)
        except ValueError:
            pass
        return before, layer.backward(ctx, DYL[:, 2:4])

    def check(pair):
        for n in pair[0]:
            np.testing.assert_array_equal(pair[0][n], pair[1][n], err_msg=n)
    return run, Ok(check)


for full, mem_len, fail in ((True, None, False), (True, None, True), (False, 2, False), (True, 3, False)):
    kind = "full" if full else "sliding"
    case(f"backward {kind} ctx of a cached call after {'a refused' if fail else 'another'} call"
         f"{'' if mem_len is None else f', mem_len {mem_len}'}", *_ctx_outlives_the_cache(full, mem_len, fail))
P = "backward full"
for label, dy, exc in (("dy (B, T - 1, d)", DYL[:, :5], ValueError), ("dy NaN", DYL * np.nan, ValueError),
                       ("dy str", "dy", TypeError), ("dy bool", DYL > 0, TypeError), ("dy None", None, TypeError),
                       ("dy 2-D", DYL[0], ValueError), ("dy (B, T, d + 1)", np.zeros((2, 6, 17)), ValueError)):
    case(f"{P} {label}", _backward_of(dy=dy), Named("dy", exc))
MHA_CTX = MultiHeadAttention(16, 4)(XL, causal=True, return_context=True)[1]
for label, ctx in (("ctx None", None), ("ctx a tuple", ("y", "ctx")), ("ctx a MultiHeadAttention's Context", MHA_CTX)):
    case(f"{P} {label}", lambda c=ctx: _layer().backward(c, DYL), Named("ctx", TypeError))
case(f"{P} MultiHeadAttention given an InklingContext",
     _backward_of(other=lambda layer: MultiHeadAttention(16, 4)), Named("ctx", TypeError))
for label, other_kw in (
        ("a sliding window", {"sliding_window": 3, "rel_extent": None, "dynamic_conv": False, "log_scaling": None}),
        ("conv_kernel 2", {"conv_kernel": 2}), ("d_rel 4", {"d_rel": 4}), ("qk_clip 2", {"qk_clip": 2.0}),
        ("rel_clip 1", {"rel_clip": 1.0}), ("norm_eps 1e-5", {"norm_eps": 1e-5}), ("block_size 2", {"block_size": 2}),
        ("rel_extent 5", {"rel_extent": 5}), ("static convolutions", {"dynamic_conv": False}),
        ("log_scaling (0.3, 3)", {"log_scaling": (0.3, 3)}), ("float32", {"dtype": np.float32}),
        ("num_kv_heads 4", {"num_kv_heads": 4})):
    case(f"{P} ctx of a layer with {label}", _backward_of(other=lambda layer, k=other_kw: _layer(True, **k)),
         Named("ctx"))
case(f"{P} ctx of a layer with the gate on, given to one with it off",
     _backward_of(other=lambda layer: _changed(layer, wg=None)), Named("ctx"))
case(f"{P} rel_proj NaN after the forward", _backward_of(other=lambda l: _changed(l, rel_proj=lambda w: w * np.nan)),
     Named("rel_proj"))
case(f"{P} k_conv_w NaN after the forward", _backward_of(other=lambda l: _changed(l, k_conv_w=lambda w: w * np.nan)),
     Named("k_conv_w"))
case(f"{P} wq of another shape after the forward", _backward_of(other=lambda l: _changed(l, wq=lambda w: w.T.copy())),
     Named("wq"))
case(f"{P} wo NaN after the forward", _backward_of(other=lambda l: _changed(l, wo=lambda w: w * np.nan)), Named("wo"),
     found="ValueError 'dout must be finite, but it holds … NaN' from attention_backward: it names dout, an "
             "internal argument, not wo (dy @ wo.T is passed on unchecked)")


# --------------------------------------------------------------------------- running it

@pytest.mark.parametrize("label, call, expect", [pytest.param(*c[:3], id=c[0]) for c in CASES])
def test_campaign(label, call, expect):
    kind, detail = classify(call, expect)
    if kind not in ("clear", "accepted"):
        pytest.fail(f"{kind}: {detail}", pytrace=False)    # no traceback: the row and its detail say it all


def test_the_campaign_counts_its_calls():
    # Each row of CASES is one call: grow the table, do not shrink it.
    assert len(CASES) >= 852, len(CASES)
    assert len({c[0] for c in CASES}) == len(CASES), "labels must be unique"


if __name__ == "__main__":
    from collections import Counter
    counts = Counter()
    for label, call, expect, found in CASES:
        kind, detail = classify(call, expect)
        counts[kind] += 1
        if kind not in ("clear", "accepted"):
            print(f"{kind:7s} {label}: {detail[:300]}" + (f" (found before: {found[:100]})" if found else ""))
    print(f"{len(CASES)} calls:", dict(counts))
