"""A campaign of hostile calls over attention, the layer, its caches, its backward and MLA,
reference and fast.

Each row of ``CASES`` is one call and its expected outcome: ``Ok(check)``, a value that is finite
and passes ``check`` (an independent computation: a loop-by-loop softmax in float64, a fresh pass,
central differences; or an invariant: cached == full pass, blockwise == dense, fast == reference),
or ``Named(name)``, a ``ValueError`` or ``TypeError`` whose message names the argument. A call
fails on a silent wrong, NaN or inf result, on any other exception, or on a message that does not
name the argument. The classes of bad input: wrong types, NaN/inf, 0 / negative / 2**31 / 2**63 /
10**9, subnormal and 1e300, empty, wrong ndim and shapes, float16 / float32 / longdouble, bool for
int, head counts that do not divide, windows without causal, latent ranks that do not fit,
mismatched contexts. ``test_the_campaign_counts_its_calls`` states how many calls it makes.
"""

from __future__ import annotations

import copy
import math
from decimal import Decimal, getcontext
from typing import Callable

import numpy as np
from tools.hostile import Named, Ok, close_to
import pytest

import minipos.fast as fast
from minipos import attention as A
from minipos import layer as L
from minipos import mla
from minipos.cache import KVCache
from minipos.mrope import MRotary
from minipos.streaming import StreamingCache
from _schemes import registered


CASES: list = []


def case(label: str, call: Callable, expect) -> None:
    CASES.append((label, call, expect))


def _run(call, expect):
    try:
        result = call()
    except Exception as err:                                            # noqa: BLE001 - every exception is judged
        if isinstance(expect, Ok):
            pytest.fail(f"expected a result, got {type(err).__name__}: {err}")
        assert isinstance(err, expect.exc), f"{type(err).__name__} instead of {expect.exc}: {err}"
        fault = expect.fault(err)
        assert not fault, fault
        return
    if isinstance(expect, Named):
        pytest.fail(f"expected an error naming {expect.words!r}, got a result")
    wrong = expect.wrong(result)
    assert not wrong, wrong


# --------------------------------------------------------------------------- oracles

def _naive(q, k, v, bias=None, mask=None, scale=None, sinks=None):
    """Attention one row at a time in float64 (Vaswani Eq. 1; the sink as one more column)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    *lead, T, D = q.shape
    S = k.shape[-2]
    scale = 1 / math.sqrt(D) if scale is None else scale
    logits = np.einsum("...td,...sd->...ts", q, k) * scale
    if bias is not None:
        logits = logits + np.asarray(bias, np.float64)
    allowed = np.broadcast_to(True if mask is None else mask, logits.shape) & (logits > -np.inf)
    out = np.zeros((*lead, T, v.shape[-1]))
    for idx in np.ndindex(*lead, T):
        row, ok = logits[idx], allowed[idx]
        cols = [float(x) for x in row[ok]]
        sink = None if sinks is None else float(sinks[idx[-2]])
        if not cols:
            continue
        m = max(cols + ([sink] if sink is not None else []))
        e = np.where(ok, np.exp(np.where(ok, row, m) - m), 0.0)
        total = e.sum() + (math.exp(sink - m) if sink is not None else 0.0)
        out[idx] = (e / total) @ v[idx[:-1]]
    return out


def shape_is(shape):
    def check(got):
        got = got[0] if isinstance(got, tuple) else got
        assert got.shape == shape, f"shape {got.shape}, expected {shape}"
    return check


RNG = np.random.default_rng(2024)
Q, K, V = (RNG.standard_normal((2, 5, 4)) for _ in range(3))               # (H, T|S, D)
BIAS = RNG.standard_normal((2, 5, 5))
CAUSAL = A.causal_mask(5, 5)
V_HUGE = np.abs(V) / np.abs(V).max() * 1.7e308                            # P V fits, P V + 1.7e308 does not
NAN_Q = Q.copy()
NAN_Q[0, 1, 2] = np.nan
INF_K = K.copy()
INF_K[1, 0, 0] = np.inf

ATTN = [("ref", A.attention), ("fast", fast.attention.attention)]
BLOCK = [("ref", A.blockwise_attention), ("fast", fast.attention.blockwise_attention)]
BLOCK_BWD = [("ref", A.blockwise_attention_backward), ("fast", fast.attention.blockwise_attention_backward)]

# --------------------------------------------------------------------------- attention, dense

for impl, attn in ATTN:
    p = f"attention[{impl}]"
    case(f"{p} plain", lambda a=attn: a(Q, K, V), Ok(close_to(_naive(Q, K, V))))
    case(f"{p} lists", lambda a=attn: a(Q.tolist(), K.tolist(), V.tolist()), Ok(close_to(_naive(Q, K, V))))
    case(f"{p} ints", lambda a=attn: a(np.ones((1, 2, 2), int), np.ones((1, 2, 2), int), np.arange(4).reshape(1, 2, 2)),
         Ok(close_to([[[1.0, 2.0], [1.0, 2.0]]])))
    case(f"{p} bias mask", lambda a=attn: a(Q, K, V, bias=BIAS, mask=CAUSAL),
         Ok(close_to(_naive(Q, K, V, BIAS, CAUSAL))))
    case(f"{p} -inf bias masks", lambda a=attn: a(Q, K, V, bias=np.where(CAUSAL, 0.0, -np.inf)),
         Ok(close_to(_naive(Q, K, V, mask=CAUSAL))))
    case(f"{p} masked out whole", lambda a=attn: a(Q, K, V, mask=np.zeros((5, 5), bool)), Ok(close_to(np.zeros((2, 5, 4)))))
    case(f"{p} scale 0", lambda a=attn: a(Q, K, V, scale=0.0), Ok(close_to(_naive(Q, K, V, scale=0.0))))
    case(f"{p} scale -2", lambda a=attn: a(Q, K, V, scale=-2.0), Ok(close_to(_naive(Q, K, V, scale=-2.0))))
    case(f"{p} sinks", lambda a=attn: a(Q, K, V, sinks=[0.5, -1.0]), Ok(close_to(_naive(Q, K, V, sinks=[0.5, -1.0]))))
    case(f"{p} sinks mask", lambda a=attn: a(Q, K, V, mask=CAUSAL, sinks=[3.0, 0.0]),
         Ok(close_to(_naive(Q, K, V, mask=CAUSAL, sinks=[3.0, 0.0]))))
    for dtype, tol in ((np.float32, 1e-5), (np.float16, 3e-2), (np.longdouble, 1e-12)):
        case(f"{p} {np.dtype(dtype).name}", lambda a=attn, d=dtype: a(Q.astype(d), K.astype(d), V.astype(d)),
             Ok(close_to(_naive(Q, K, V), rtol=tol, atol=tol, dtype=np.dtype(dtype))))
    case(f"{p} subnormal q", lambda a=attn: a(Q * 1e-310, K, V), Ok(close_to(_naive(Q * 1e-310, K, V))))
    case(f"{p} T=0", lambda a=attn: a(Q[:, :0], K, V), Ok(shape_is((2, 0, 4))))
    case(f"{p} S=0", lambda a=attn: a(Q, K[:, :0], V[:, :0]), Ok(close_to(np.zeros((2, 5, 4)))))
    case(f"{p} H=0", lambda a=attn: a(Q[:0], K[:0], V[:0]), Ok(shape_is((0, 5, 4))))
    case(f"{p} D=0", lambda a=attn: a(Q[..., :0], K[..., :0], V), Ok(close_to(V.mean(axis=1, keepdims=True)
                                                                                 .repeat(5, axis=1))))
    case(f"{p} 1e300 q", lambda a=attn: a(Q * 1e300, K, V), Ok(close_to(_naive(Q * 1e300, K, V))))
    case(f"{p} float16 overflow", lambda a=attn: a(Q.astype(np.float16) * 300, K.astype(np.float16) * 300,
                                                  V.astype(np.float16)), Named("q"))
    case(f"{p} NaN q", lambda a=attn: a(NAN_Q, K, V), Named("q"))
    case(f"{p} inf k", lambda a=attn: a(Q, INF_K, V), Named("k"))
    case(f"{p} NaN v", lambda a=attn: a(Q, K, V * np.nan), Named("v"))
    case(f"{p} None q", lambda a=attn: a(None, K, V), Named("q", TypeError))
    case(f"{p} str k", lambda a=attn: a(Q, "k", V), Named("k", TypeError))
    case(f"{p} bool v", lambda a=attn: a(Q, K, V > 0), Named("v", TypeError))
    case(f"{p} complex q", lambda a=attn: a(Q + 1j, K, V), Named("q", TypeError))
    case(f"{p} 1-D q", lambda a=attn: a(Q[0, 0], K, V), Named("q"))
    case(f"{p} D differs", lambda a=attn: a(Q, K[..., :3], V), Named("head dim"))
    case(f"{p} S differs", lambda a=attn: a(Q, K, V[:, :4]), Named("number of keys"))
    case(f"{p} heads differ", lambda a=attn: a(Q, K[:1], V[:1]), Named("leading dims"))
    case(f"{p} bias shape", lambda a=attn: a(Q, K, V, bias=np.zeros((3, 5, 5))), Named("bias"))
    case(f"{p} bias enlarges", lambda a=attn: a(Q, K, V, bias=np.zeros((4, 2, 5, 5))), Named("bias"))
    case(f"{p} bias NaN", lambda a=attn: a(Q, K, V, bias=np.full((5, 5), np.nan)), Named("bias"))
    case(f"{p} bias +inf", lambda a=attn: a(Q, K, V, bias=np.full((5, 5), np.inf)), Named("bias"))
    case(f"{p} bias bool", lambda a=attn: a(Q, K, V, bias=CAUSAL), Named("bias", TypeError))
    case(f"{p} bias 1e300", lambda a=attn: a(Q, K, V, bias=np.full((5, 5), 1e300)),
         Ok(close_to(_naive(Q, K, V, np.full((5, 5), 1e300)))))
    case(f"{p} bias 1e39 float32", lambda a=attn: a(Q.astype(np.float32), K.astype(np.float32), V.astype(np.float32),
                                                     bias=np.full((5, 5), 1e39)), Named("bias"))
    case(f"{p} mask int", lambda a=attn: a(Q, K, V, mask=CAUSAL.astype(int)), Named("mask", TypeError))
    case(f"{p} mask shape", lambda a=attn: a(Q, K, V, mask=CAUSAL[:4]), Named("mask"))
    for bad in (float("nan"), float("inf"), "1", True, 2 ** 1100, 1e-320):
        case(f"{p} scale {bad!r}", lambda a=attn, s=bad: a(Q, K, V, scale=s), Named("scale"))
    case(f"{p} return_weights str", lambda a=attn: a(Q, K, V, return_weights="yes"), Named("return_weights", TypeError))
    case(f"{p} return_weights", lambda a=attn: a(Q, K, V, return_weights=True)[1].sum(axis=-1),
         Ok(close_to(np.ones((2, 5)))))
    for bad, name in (([1.0], "sinks"), ([[1.0, 2.0]], "sinks"), ([np.nan, 0.0], "sinks"), ([np.inf, 0.0], "sinks"),
                      ("ab", "sinks"), ([True, False], "sinks")):
        case(f"{p} sinks {bad!r}", lambda a=attn, s=bad: a(Q, K, V, sinks=s), Named(name))
    case(f"{p} sinks 1e5 float16", lambda a=attn: a(Q.astype(np.float16), K.astype(np.float16), V.astype(np.float16),
                                                     sinks=[1e5, 0.0]), Named("sinks"))
    case(f"{p} sinks 1e300", lambda a=attn: a(Q, K, V, sinks=[1e300, 0.0]),
         Ok(close_to(_naive(Q, K, V, sinks=[1e300, 0.0]))))
    case(f"{p} sinks no head axis", lambda a=attn: a(Q[0], K[0], V[0], sinks=[0.0]), Named("sinks"))
    case(f"{p} value_fn str", lambda a=attn: a(Q, K, V, value_fn="shaw"), Named("value_fn", TypeError))
    case(f"{p} value_fn None result", lambda a=attn: a(Q, K, V, value_fn=lambda qs, ks, p: None),
         Named("value_fn", TypeError))
    case(f"{p} value_fn shape", lambda a=attn: a(Q, K, V, value_fn=lambda qs, ks, p: np.zeros(3)), Named("value_fn"))
    case(f"{p} value_fn NaN", lambda a=attn: a(Q, K, V, value_fn=lambda qs, ks, p: np.full((2, 5, 4), np.nan)),
         Named("value_fn"))
    case(f"{p} value_fn 1e300 float32", lambda a=attn: a(Q.astype(np.float32), K.astype(np.float32),
                                                          V.astype(np.float32),
                                                          value_fn=lambda qs, ks, p: np.full((2, 5, 4), 1e300)),
         Named("value_fn"))
    case(f"{p} value_fn overflow sum", lambda a=attn: a(Q, K, V_HUGE, value_fn=lambda qs, ks, p: np.full((2, 5, 4),
                                                                                                       1.7e308)),
         Named("value_fn"))
    case(f"{p} value_fn ones", lambda a=attn: a(Q, K, V, value_fn=lambda qs, ks, p: p @ np.ones((5, 4))),
         Ok(close_to(_naive(Q, K, V + 1.0))))

for impl, attn in ATTN:
    for shape in ((1, 1, 5), (2, 1, 5), (5, 1), (5,), ()):
        b = RNG.standard_normal(shape)
        case(f"attention[{impl}] bias broadcast {shape}", lambda a=attn, b=b: a(Q, K, V, bias=b),
             Ok(close_to(_naive(Q, K, V, np.broadcast_to(b, (2, 5, 5))))))
for impl, blk in BLOCK:
    case(f"blockwise[{impl}] bias_fn scalar", lambda b=blk: b(Q, K, V, bias_fn=lambda qs, ks: 1.5, block_size=2),
         Ok(close_to(_naive(Q, K, V))))
    case(f"blockwise[{impl}] bias_fn None", lambda b=blk: b(Q, K, V, bias_fn=lambda qs, ks: None, block_size=2),
         Ok(close_to(_naive(Q, K, V))))
    case(f"blockwise[{impl}] mask_fn None", lambda b=blk: b(Q, K, V, mask_fn=lambda qs, ks: None, block_size=2),
         Ok(close_to(_naive(Q, K, V))))

# 4-D (B, H, T, D) and a bigger problem through the fast kernel
Q4, K4, V4 = (RNG.standard_normal((2, 4, 130, 8)) for _ in range(3))
MASK4 = A.causal_mask(130, 130)
case("attention[fast] kernel causal", lambda: fast.attention.attention(Q4, K4, V4, mask=MASK4),
     Ok(close_to(lambda: A.attention(Q4, K4, V4, mask=MASK4))))
case("attention[fast] kernel NaN bias", lambda: fast.attention.attention(Q4, K4, V4, bias=np.where(MASK4, np.nan, 0.0)),
     Named("bias"))
case("attention[fast] kernel value_fn", lambda: fast.attention.attention(
    Q4, K4, V4, mask=MASK4, value_fn=lambda qs, ks, p: p @ np.ones((130, 8))),
    Ok(close_to(lambda: A.attention(Q4, K4, V4 + 1.0, mask=MASK4))))
case("attention[fast] kernel longdouble", lambda: fast.attention.attention(*(a.astype(np.longdouble) for a in (Q4, K4, V4))),
     Ok(close_to(lambda: A.attention(Q4, K4, V4), dtype=np.dtype(np.longdouble))))

# --------------------------------------------------------------------------- blockwise

for impl, blk in BLOCK:
    p = f"blockwise[{impl}]"
    case(f"{p} causal", lambda b=blk: b(Q, K, V, causal=True, block_size=2), Ok(close_to(_naive(Q, K, V, mask=CAUSAL))))
    case(f"{p} bias_fn", lambda b=blk: b(Q, K, V, bias_fn=lambda qs, ks: BIAS[:, qs, ks], block_size=3),
         Ok(close_to(_naive(Q, K, V, BIAS))))
    case(f"{p} mask_fn", lambda b=blk: b(Q, K, V, mask_fn=lambda qs, ks: CAUSAL[qs, ks], block_size=2),
         Ok(close_to(_naive(Q, K, V, mask=CAUSAL))))
    case(f"{p} q_offset -5", lambda b=blk: b(Q, K, V, causal=True, q_offset=-5), Ok(close_to(np.zeros((2, 5, 4)))))
    case(f"{p} q_offset 10**9", lambda b=blk: b(Q, K, V, causal=True, q_offset=10 ** 9), Ok(close_to(_naive(Q, K, V))))
    case(f"{p} block 10**9", lambda b=blk: b(Q, K, V, block_size=10 ** 9), Ok(close_to(_naive(Q, K, V))))
    case(f"{p} block 2**63", lambda b=blk: b(Q, K, V, block_size=2 ** 63), Ok(close_to(_naive(Q, K, V))))
    case(f"{p} sinks", lambda b=blk: b(Q, K, V, causal=True, block_size=2, sinks=[1.0, -2.0]),
         Ok(close_to(_naive(Q, K, V, mask=CAUSAL, sinks=[1.0, -2.0]))))
    case(f"{p} value_fn", lambda b=blk: b(Q, K, V, block_size=2, value_fn=lambda qs, ks, p: p @ np.ones((ks.stop - ks.start,
                                                                                                         4))),
         Ok(close_to(_naive(Q, K, V + 1.0))))
    case(f"{p} lse", lambda b=blk: b(Q, K, V, return_lse=True)[1],
         Ok(close_to(np.log(np.exp(np.einsum("htd,hsd->hts", Q, K) / 2).sum(-1)))))
    for dtype, tol in ((np.float32, 1e-5), (np.float16, 3e-2), (np.longdouble, 1e-12)):
        case(f"{p} {np.dtype(dtype).name}", lambda b=blk, d=dtype: b(Q.astype(d), K.astype(d), V.astype(d), causal=True,
                                                                        block_size=2),
             Ok(close_to(_naive(Q, K, V, mask=CAUSAL), rtol=tol, atol=tol, dtype=np.dtype(dtype))))
    case(f"{p} T=0", lambda b=blk: b(Q[:, :0], K, V), Ok(shape_is((2, 0, 4))))
    case(f"{p} S=0", lambda b=blk: b(Q, K[:, :0], V[:, :0]), Ok(close_to(np.zeros((2, 5, 4)))))
    case(f"{p} 2-D", lambda b=blk: b(Q[0], K[0], V[0], causal=True), Ok(close_to(_naive(Q[:1], K[:1], V[:1],
                                                                                          mask=CAUSAL)[0])))
    for bad, name, exc in ((0, "block_size", ValueError), (-1, "block_size", ValueError), (2.0, "block_size", TypeError),
                           (True, "block_size", TypeError), ("8", "block_size", TypeError)):
        case(f"{p} block_size {bad!r}", lambda b=blk, s=bad: b(Q, K, V, block_size=s), Named(name, exc))
    case(f"{p} q_offset without causal", lambda b=blk: b(Q, K, V, q_offset=0), Named("q_offset"))
    case(f"{p} q_offset 2**63", lambda b=blk: b(Q, K, V, causal=True, q_offset=2 ** 63), Named("q_offset"))
    case(f"{p} q_offset float", lambda b=blk: b(Q, K, V, causal=True, q_offset=1.0), Named("q_offset", TypeError))
    case(f"{p} causal str", lambda b=blk: b(Q, K, V, causal="yes"), Named("causal", TypeError))
    case(f"{p} causal 1", lambda b=blk: b(Q, K, V, causal=1), Named("causal", TypeError))
    case(f"{p} return_lse str", lambda b=blk: b(Q, K, V, return_lse="no"), Named("return_lse", TypeError))
    case(f"{p} bias_fn str", lambda b=blk: b(Q, K, V, bias_fn="alibi"), Named("bias_fn", TypeError))
    case(f"{p} bias_fn shape", lambda b=blk: b(Q, K, V, bias_fn=lambda qs, ks: np.zeros((3, 1, 1))), Named("bias_fn"))
    case(f"{p} bias_fn NaN", lambda b=blk: b(Q, K, V, bias_fn=lambda qs, ks: np.nan), Named("bias_fn"))
    case(f"{p} bias_fn +inf", lambda b=blk: b(Q, K, V, bias_fn=lambda qs, ks: np.inf), Named("bias_fn"))
    case(f"{p} bias_fn str result", lambda b=blk: b(Q, K, V, bias_fn=lambda qs, ks: "x"), Named("bias_fn", TypeError))
    case(f"{p} mask_fn int", lambda b=blk: b(Q, K, V, mask_fn=lambda qs, ks: np.ones((1, 1), int)),
         Named("mask_fn", TypeError))
    case(f"{p} mask_fn shape", lambda b=blk: b(Q, K, V, mask_fn=lambda qs, ks: np.ones((3, 2, 2), bool)),
         Named("mask_fn"))
    case(f"{p} NaN q", lambda b=blk: b(NAN_Q, K, V), Named("q"))
    case(f"{p} 1e300 k", lambda b=blk: b(Q, K * 1e300, V), Ok(close_to(_naive(Q, K * 1e300, V))))
    case(f"{p} 1e300 float32 overflow", lambda b=blk: b(Q.astype(np.float32) * 1e30, K.astype(np.float32) * 1e30,
                                                       V.astype(np.float32)), Named("q"))
    case(f"{p} value_fn NaN", lambda b=blk: b(Q, K, V, value_fn=lambda qs, ks, p: np.full((*p.shape[:-1], 4), np.nan)),
         Named("value_fn"))
    case(f"{p} value_fn shape", lambda b=blk: b(Q, K, V, value_fn=lambda qs, ks, p: p), Named("value_fn"))
    case(f"{p} sinks 1e5 float16", lambda b=blk: b(Q.astype(np.float16), K.astype(np.float16), V.astype(np.float16),
                                                    sinks=[1e5, 0.0]), Named("sinks"))
    case(f"{p} sinks shape", lambda b=blk: b(Q, K, V, sinks=[0.0, 0.0, 0.0]), Named("sinks"))

for bad, exc in ((0, ValueError), (-2, ValueError), ("2", TypeError), (True, TypeError), (2.0, TypeError)):
    case(f"blockwise[fast] workers {bad!r}", lambda w=bad: fast.attention.blockwise_attention(Q, K, V, workers=w),
         Named("workers", exc))
case("blockwise[fast] workers 2**31", lambda: fast.attention.blockwise_attention(Q, K, V, causal=True, workers=2 ** 31),
     Ok(close_to(_naive(Q, K, V, mask=CAUSAL))))
case("blockwise[fast] bias_max_fn str", lambda: fast.attention.blockwise_attention(Q, K, V, bias_max_fn="x"),
     Named("bias_max_fn", TypeError))
case("blockwise[fast] bias_max_fn NaN", lambda: fast.attention.blockwise_attention(
    Q, K, V, causal=True, block_size=2, bias_fn=lambda qs, ks: 0.0, bias_max_fn=lambda qs, ks: np.full((2, 1, 1), np.nan)),
    Named("bias_max_fn"))

# --------------------------------------------------------------------------- backward passes

DOUT = RNG.standard_normal((2, 5, 4))


def _fd_dq(bias=None, mask=None, sinks=None, h=1e-6):
    """The directional derivative of sum(attention(q) * DOUT) along E by central differences."""
    f = lambda q: np.sum(_naive(q, K, V, bias, mask, sinks=sinks) * DOUT)    # noqa: E731
    return (f(Q + h * E_Q) - f(Q - h * E_Q)) / (2 * h)


E_Q = RNG.standard_normal(Q.shape)


def dq_matches(fd):
    def check(got):
        assert np.isclose(np.sum(got[0] * E_Q), fd, rtol=1e-6, atol=1e-9), (np.sum(got[0] * E_Q), fd)
    return check


OUT, LSE = A.blockwise_attention(Q, K, V, causal=True, return_lse=True)
OUT_S, LSE_S = A.blockwise_attention(Q, K, V, causal=True, return_lse=True, sinks=[1.0, 0.0])

case("attention_backward mask", lambda: A.attention_backward(Q, K, V, DOUT, mask=CAUSAL), Ok(dq_matches(_fd_dq(mask=CAUSAL))))
case("attention_backward bias", lambda: A.attention_backward(Q, K, V, DOUT, bias=BIAS), Ok(dq_matches(_fd_dq(bias=BIAS))))
case("attention_backward sinks", lambda: A.attention_backward(Q, K, V, DOUT, sinks=[1.0, 0.0]),
     Ok(dq_matches(_fd_dq(sinks=[1.0, 0.0]))))
case("attention_backward dout shape", lambda: A.attention_backward(Q, K, V, DOUT[:, :4]), Named("dout"))
case("attention_backward dout NaN", lambda: A.attention_backward(Q, K, V, DOUT * np.nan), Named("dout"))
case("attention_backward dout str", lambda: A.attention_backward(Q, K, V, "d"), Named("dout", TypeError))
case("attention_backward value_fn alone", lambda: A.attention_backward(Q, K, V, DOUT, value_fn=lambda *a: 0),
     Named("value_grad_fn"))
case("attention_backward value_grad_fn str", lambda: A.attention_backward(Q, K, V, DOUT, value_grad_fn="x"),
     Named("value_grad_fn", TypeError))
for impl, bwd in BLOCK_BWD:
    p = f"blockwise_backward[{impl}]"
    case(f"{p} causal", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT, causal=True, block_size=2),
         Ok(dq_matches(_fd_dq(mask=CAUSAL))))
    case(f"{p} sinks", lambda b=bwd: b(Q, K, V, OUT_S, LSE_S, DOUT, causal=True, block_size=2, sinks=[1.0, 0.0]),
         Ok(dq_matches(_fd_dq(mask=CAUSAL, sinks=[1.0, 0.0]))))
    case(f"{p} out shape", lambda b=bwd: b(Q, K, V, OUT[:1], LSE, DOUT, causal=True), Named("out"))
    case(f"{p} lse shape", lambda b=bwd: b(Q, K, V, OUT, LSE[:, :3], DOUT, causal=True), Named("lse"))
    case(f"{p} lse NaN", lambda b=bwd: b(Q, K, V, OUT, LSE * np.nan, DOUT, causal=True), Named("lse"))
    case(f"{p} lse +inf", lambda b=bwd: b(Q, K, V, OUT, LSE + np.inf, DOUT, causal=True), Named("lse"))
    case(f"{p} dout NaN", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT * np.nan, causal=True), Named("dout"))
    case(f"{p} dout shape", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT[..., :3], causal=True), Named("dout"))
    case(f"{p} bias_grad_fn str", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT, causal=True, bias_grad_fn="x"),
         Named("bias_grad_fn", TypeError))
    case(f"{p} value_grad_fn shape", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT, causal=True,
                                                      value_grad_fn=lambda qs, ks, p, d: np.arange(6.0)),
         Named("value_grad_fn"))
    case(f"{p} value_grad_fn None", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT, causal=True,
                                                     value_grad_fn=lambda qs, ks, p, d: None),
         Named("value_grad_fn", TypeError))
    case(f"{p} value_grad_fn NaN", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT, causal=True,
                                                    value_grad_fn=lambda qs, ks, p, d: p * np.nan),
         Named("value_grad_fn"))
    case(f"{p} sinks shape", lambda b=bwd: b(Q, K, V, OUT, LSE, DOUT, causal=True, sinks=[0.0]), Named("sinks"))

# --------------------------------------------------------------------------- small helpers

case("softmax NaN", lambda: A.softmax([1.0, np.nan]), Named("x"))
case("softmax -inf row", lambda: A.softmax([[-np.inf, -np.inf]]), Ok(close_to([[0.0, 0.0]])))
case("softmax longdouble", lambda: A.softmax(np.array([0.0, np.log(3.0)], np.longdouble)),
     Ok(close_to([0.25, 0.75], dtype=np.dtype(np.longdouble))))
case("softmax axis 2**63", lambda: A.softmax([1.0], axis=2 ** 63), Named("axis"))
case("softmax_backward shapes", lambda: A.softmax_backward(np.ones(3) / 3, np.ones(2)), Named("dp"))
case("causal_mask negative", lambda: A.causal_mask(-1, 2), Named("q_len"))
case("causal_mask bool", lambda: A.causal_mask(True, 2), Named("q_len", TypeError))
case("causal_mask 2**63", lambda: A.causal_mask(2 ** 63, 2 ** 63), Named("causal_mask"))
case("causal_mask 10**9 x 0", lambda: A.causal_mask(10 ** 9, 0), Ok(shape_is((10 ** 9, 0))))
case("causal_mask 0 x 3", lambda: A.causal_mask(0, 3), Ok(shape_is((0, 3))))

# --------------------------------------------------------------------------- the layer: construction

LAYERS = [("ref", L.MultiHeadAttention), ("fast", fast.MultiHeadAttention)]
for impl, make in LAYERS:
    p = f"layer[{impl}]"
    for arg, bad, exc in (("d_model", 0, ValueError), ("d_model", -8, ValueError), ("d_model", 8.0, TypeError),
                          ("d_model", True, TypeError), ("d_model", "8", TypeError), ("d_model", None, TypeError),
                          ("num_heads", 0, ValueError), ("num_heads", True, TypeError), ("num_heads", 2.5, TypeError)):
        kwargs = {"d_model": 8, "num_heads": 2, arg: bad}
        case(f"{p} {arg}={bad!r}", lambda m=make, kw=kwargs: m(kw["d_model"], kw["num_heads"]), Named(arg, exc))
    case(f"{p} d_model 2**63", lambda m=make: m(2 ** 63, 1), Named("d_model"))
    case(f"{p} d_model 10**9", lambda m=make: m(10 ** 9, 1), Named("d_model"))
    case(f"{p} d_model 2**31 heads", lambda m=make: m(8, 2 ** 31), Named("num_heads"))
    case(f"{p} heads do not divide", lambda m=make: m(8, 3), Named("num_heads"))
    case(f"{p} head_dim 2**63", lambda m=make: m(8, 2, head_dim=2 ** 63), Named("head_dim"))
    case(f"{p} head_dim 0", lambda m=make: m(8, 2, head_dim=0), Named("head_dim"))
    case(f"{p} odd head_dim rope", lambda m=make: m(6, 2, scheme=L.Rotary()), Named("head dim"))
    case(f"{p} kv heads do not divide", lambda m=make: m(16, 4, num_kv_heads=3), Named("num_kv_heads"))
    case(f"{p} kv heads more than heads", lambda m=make: m(16, 4, num_kv_heads=8), Named("num_kv_heads"))
    case(f"{p} kv heads 0", lambda m=make: m(16, 4, num_kv_heads=0), Named("num_kv_heads"))
    case(f"{p} kv heads bool", lambda m=make: m(16, 4, num_kv_heads=True), Named("num_kv_heads", TypeError))
    case(f"{p} kv heads 2**63", lambda m=make: m(16, 4, num_kv_heads=2 ** 63), Named("num_kv_heads"))
    for arg in ("block_size", "attention_chunk", "sliding_window"):
        for bad, exc in ((0, ValueError), (-1, ValueError), (True, TypeError), (4.0, TypeError), ("4", TypeError)):
            case(f"{p} {arg}={bad!r}", lambda m=make, a=arg, b=bad: m(8, 2, **{a: b}), Named(arg, exc))
    case(f"{p} attention_chunk 2**63", lambda m=make: m(8, 2, attention_chunk=2 ** 63), Named("attention_chunk"))
    case(f"{p} sliding_window 2**63", lambda m=make: m(8, 2, sliding_window=2 ** 63), Named("sliding_window"))
    for bad, exc in ((0.0, ValueError), (-1.0, ValueError), (float("nan"), ValueError), (float("inf"), ValueError),
                     ("0.5", TypeError), (2 ** 1100, ValueError), (True, TypeError)):
        case(f"{p} scale={bad!r}", lambda m=make, b=bad: m(8, 2, scale=b), Named("scale", exc))
    case(f"{p} scale with content-position", lambda m=make: m(8, 2, scale=0.5, scheme=L.TransformerXL()), Named("scale"))
    case(f"{p} sinks str", lambda m=make: m(8, 2, sinks="yes"), Named("sinks", TypeError))
    case(f"{p} sinks 1", lambda m=make: m(8, 2, sinks=1), Named("sinks", TypeError))
    case(f"{p} bias str", lambda m=make: m(8, 2, bias="no"), Named("bias", TypeError))
    case(f"{p} dtype int", lambda m=make: m(8, 2, dtype=int), Named("dtype", TypeError))
    case(f"{p} dtype str", lambda m=make: m(8, 2, dtype="foo"), Named("dtype", TypeError))
    case(f"{p} seed -1", lambda m=make: m(8, 2, seed=-1), Named("seed"))
    case(f"{p} seed str", lambda m=make: m(8, 2, seed="0"), Named("seed", TypeError))
    case(f"{p} scheme str", lambda m=make: m(8, 2, scheme="rope"), Named("scheme", TypeError))
    case(f"{p} scheme class", lambda m=make: m(8, 2, scheme=L.Rotary), Named("scheme", TypeError))

# --------------------------------------------------------------------------- the layer: calls

X = RNG.standard_normal((2, 6, 16))


def _pair(**kw):
    """A reference and a fast layer of one configuration and the same weights."""
    return L.MultiHeadAttention(16, 4, seed=3, **copy.deepcopy(kw)), fast.MultiHeadAttention(16, 4, seed=3,
                                                                                            **copy.deepcopy(kw))


def fast_equals_reference(kw, x=X, rtol=1e-9, **call):
    def run():
        a, b = _pair(**kw)
        return a(x, **call), b(x, **call)

    def check(pair):
        np.testing.assert_allclose(pair[1], pair[0], rtol=rtol, atol=rtol)
    return run, Ok(check)


def blockwise_equals_dense(kw, x=X, **call):
    def run():
        dense = L.MultiHeadAttention(16, 4, seed=5, **{k: v() if callable(v) else v for k, v in kw.items()})
        blocked = L.MultiHeadAttention(16, 4, seed=5, block_size=2, **{k: v() if callable(v) else v for k, v in kw.items()})
        return dense(x, **call), blocked(x, **call)

    def check(pair):
        np.testing.assert_allclose(pair[1], pair[0], rtol=1e-10, atol=1e-12)
    return run, Ok(check)


def cached_equals_full(make, kw, x=X, steps=(2, 1, 3), mem_len=None):
    """Decoding in ``steps`` through a cache equals the full causal pass (mem_len=None)."""
    def run():
        layer = make(16, 4, seed=7, **{k: v() if callable(v) else v for k, v in kw.items()})
        cache, outs, start = layer.new_cache(mem_len), [], 0
        for n in steps:
            outs.append(layer(x[:, start:start + n], causal=True, cache=cache))
            start += n
        return np.concatenate(outs, axis=1), layer(x[:, :start], causal=True)

    def check(pair):
        np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)
    return run, Ok(check)


REGISTERED = {name: {"scheme": make} for name, make in registered(256).items()}   # every scheme of the registry
OPTIONS = {
    "gqa": {"num_kv_heads": 2}, "mqa": {"num_kv_heads": 1, "scheme": L.Rotary}, "sinks": {"sinks": True},
    "window": {"sliding_window": 3, "scheme": L.Rotary}, "chunk": {"attention_chunk": 4, "scheme": L.ALiBi},
    "scale": {"scale": 0.3}, "bias": {"bias": True}, "window+sinks+gqa": {"sliding_window": 2, "sinks": True,
                                                                         "num_kv_heads": 2},
}
SCHEME_OPTIONS = {**REGISTERED, **OPTIONS}
for name, kw in SCHEME_OPTIONS.items():
    for impl, make in LAYERS:
        case(f"layer[{impl}] {name} cached == full", *cached_equals_full(make, kw))
    case(f"layer {name} blockwise == dense", *blockwise_equals_dense(kw, causal=True))
    made = {k: (v() if callable(v) else v) for k, v in kw.items()}
    case(f"layer {name} fast == reference", *fast_equals_reference(made, causal=True))
case("layer xl mem_len cached == full", *cached_equals_full(L.MultiHeadAttention, {"scheme": L.TransformerXL},
                                                          steps=(1, 1, 1, 1), mem_len=10))
X_BIG = RNG.standard_normal((2, 80, 16))
for name in ("alibi", "t5", "rope", "window"):
    made = {k: (v() if callable(v) else v) for k, v in SCHEME_OPTIONS[name].items()}
    for label, pos in (("gaps", np.arange(80) * 3), ("reversed", np.arange(80)[::-1].copy()),
                       ("repeated", np.repeat(np.arange(40), 2))):
        case(f"layer {name} positions {label} fast == reference",
             *fast_equals_reference(made, x=X_BIG, causal=True, positions=pos))
for name in [*REGISTERED, "window", "gqa"]:
    made = {k: (v() if callable(v) else v) for k, v in SCHEME_OPTIONS[name].items()}
    case(f"layer {name} fast kernel == reference", *fast_equals_reference(made, x=X_BIG, causal=True))

for impl, make in LAYERS:
    p = f"layer[{impl}]"
    layer = make(16, 4, scheme=L.Rotary(), seed=1)
    case(f"{p} x 2-D", lambda m=layer: m(X[0]), Named("x"))
    case(f"{p} x d_model", lambda m=layer: m(X[..., :8]), Named("x"))
    case(f"{p} x NaN", lambda m=layer: m(X * np.nan), Named("x"))
    case(f"{p} x inf", lambda m=layer: m(X + np.inf), Named("x"))
    case(f"{p} x bool", lambda m=layer: m(X > 0), Named("x", TypeError))
    case(f"{p} x str", lambda m=layer: m("x"), Named("x", TypeError))
    case(f"{p} x 1e300", lambda m=layer: m(X * 1e300), Named("x"))
    case(f"{p} x float16 6e4", lambda m=make: m(16, 4, dtype=np.float16)(np.full((1, 2, 16), 6e4, np.float16)),
         Named("x"))
    case(f"{p} x ints", lambda m=layer: m(np.ones((1, 3, 16), int)), Ok(close_to(lambda: layer(np.ones((1, 3, 16))))))
    case(f"{p} x list", lambda m=layer: m(X.tolist()), Ok(close_to(lambda: layer(X))))
    case(f"{p} x subnormal", lambda m=layer: m(X * 1e-310), Ok(shape_is((2, 6, 16))))
    case(f"{p} x T=0", lambda m=layer: m(X[:, :0], causal=True), Ok(shape_is((2, 0, 16))))
    case(f"{p} x B=0", lambda m=layer: m(X[:0], causal=True), Ok(shape_is((0, 6, 16))))
    case(f"{p} float32", lambda m=make: m(16, 4, dtype=np.float32, scheme=L.Rotary(), seed=1)(X.astype(np.float32)),
         Ok(close_to(lambda: layer(X), rtol=1e-4, atol=1e-5, dtype=np.dtype(np.float32))))
    case(f"{p} longdouble", lambda m=make: m(16, 4, dtype=np.longdouble, scheme=L.Rotary(), seed=1)(X.astype(np.longdouble)),
         Ok(close_to(lambda: layer(X), rtol=1e-9, dtype=np.dtype(np.longdouble))))
    case(f"{p} positions short", lambda m=layer: m(X, positions=[0, 1]), Named("positions"))
    case(f"{p} positions negative", lambda m=layer: m(X, positions=np.arange(6) - 1), Named("positions"))
    case(f"{p} positions float", lambda m=layer: m(X, positions=np.arange(6) + 0.5), Named("positions"))
    case(f"{p} positions bool", lambda m=layer: m(X, positions=np.ones(6, bool)), Named("positions", TypeError))
    case(f"{p} positions 2**62", lambda m=layer: m(X, positions=2 ** 62 + np.arange(6, dtype=np.uint64)),
         Named("positions"))
    case(f"{p} positions 2**63 list", lambda m=layer: m(X, positions=[2 ** 63] * 6), Named("positions"))
    case(f"{p} positions ragged", lambda m=layer: m(X, positions=[[0, 1], [2]]), Named("positions"))
    case(f"{p} positions 2-D", lambda m=layer: m(X, positions=np.zeros((2, 6), int)), Named("positions"))
    case(f"{p} positions str", lambda m=layer: m(X, positions="0"), Named("positions", TypeError))
    case(f"{p} positions 10**9 int", lambda m=layer: m(X, positions=10 ** 9), Named("positions"))
    case(f"{p} positions shift", lambda m=layer: m(X, positions=np.arange(6) + 10 ** 6, causal=True),
         Ok(close_to(lambda: layer(X, causal=True), rtol=1e-8, atol=1e-10)))           # RoPE: only i - j counts
    case(f"{p} mask int", lambda m=layer: m(X, mask=np.ones((2, 6), int)), Named("mask", TypeError))
    case(f"{p} mask shape", lambda m=layer: m(X, mask=np.ones((2, 5), bool)), Named("mask"))
    case(f"{p} mask all False", lambda m=layer: m(X, mask=np.zeros((2, 6), bool)),
         Ok(close_to(np.zeros((2, 6, 16)))))
    case(f"{p} mask padding", lambda m=layer: m(X, mask=np.tile(np.arange(6) < 4, (2, 1)), causal=True)[:, :4],
         Ok(close_to(lambda: layer(X[:, :4], causal=True))))
    case(f"{p} causal str", lambda m=layer: m(X, causal="yes"), Named("causal", TypeError))
    case(f"{p} return_context str", lambda m=layer: m(X, return_context=1), Named("return_context", TypeError))
    case(f"{p} return_weights str", lambda m=layer: m(X, return_weights="yes"), Named("return_weights", TypeError))
    case(f"{p} return_weights blockwise", lambda m=make: m(16, 4, block_size=2)(X, return_weights=True),
         Named("return_weights"))
    case(f"{p} window without causal", lambda m=make: m(16, 4, sliding_window=2)(X), Named("causal"))
    case(f"{p} cache str", lambda m=layer: m(X, cache="c"), Named("cache", TypeError))
    case(f"{p} cache of another layer", lambda m=layer, mk=make: m(X, cache=mk(16, 4).new_cache()), Named("cache"))
    case(f"{p} mrope positions (2, T)", lambda m=make: m(16, 4, scheme=MRotary())(X, positions=np.zeros((2, 6), int)),
         Named("positions"))



# --------------------------------------------------------------------------- caches

case("KVCache mem_len -1", lambda: KVCache(-1), Named("mem_len"))
case("KVCache mem_len str", lambda: KVCache("4"), Named("mem_len", TypeError))
case("KVCache mem_len bool", lambda: KVCache(True), Named("mem_len", TypeError))
case("KVCache mem_len 2**63", lambda: KVCache(2 ** 63).append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), [0, 1])[2],
     Ok(lambda pos: pos.tolist() == [0, 1] or pytest.fail(pos)))
case("KVCache mem_len 0 decoding", *cached_equals_full(L.MultiHeadAttention, {"scheme": L.TransformerXL},
                                                       steps=(3, 1), mem_len=3))
case("KVCache k 3-D", lambda: KVCache().append(np.ones((1, 2, 2)), np.ones((1, 2, 2)), [0, 1]), Named("k and v"))
case("KVCache k NaN", lambda: KVCache().append(np.full((1, 1, 2, 2), np.nan), np.ones((1, 1, 2, 2)), [0, 1]), Named("k"))
case("KVCache other heads", lambda: (lambda c: (c.append(np.ones((1, 1, 1, 2)), np.ones((1, 1, 1, 2)), [0]),
                                                c.append(np.ones((1, 2, 1, 2)), np.ones((1, 2, 1, 2)), [1])))(KVCache()),
     Named("cache holds"))
case("KVCache positions length", lambda: KVCache().append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), [0]),
     Named("positions"))


def _mixed_rope_cache():
    layer = L.MultiHeadAttention(16, 4, scheme=L.Rotary(scaling={"rope_type": "dynamic", "factor": 2.0,
                                                                 "original_max_position_embeddings": 4}))
    cache = layer.new_cache()
    layer(X[:, :3], causal=True, cache=cache)
    return layer(X[:, 3:], causal=True, cache=cache)


case("KVCache dynamic rope", _mixed_rope_cache, Ok(close_to(lambda: L.MultiHeadAttention(16, 4, scheme=L.Rotary(
    scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}))(X, causal=True)[:, 3:])))


def stream_equals_fresh(scheme, num_sinks, window, chunks, make=L.MultiHeadAttention):
    def run():
        layer = make(16, 4, scheme=scheme(), seed=11)
        cache = StreamingCache(layer, num_sinks=num_sinks, window=window)
        x = RNG.standard_normal((1, sum(chunks), 16))
        kept, start, pairs = [], 0, []
        for T in chunks:
            got = layer(x[:, start:start + T], causal=True, cache=cache)
            tokens = kept + list(range(start, start + T))
            pairs.append((got, layer(x[:, tokens], positions=np.arange(len(tokens)), causal=True)[:, -T:]))
            start += T
            kept = list(range(min(start, num_sinks))) + list(range(max(num_sinks, start - window + 1), start))
        return pairs

    def check(pairs):
        for got, want in pairs:
            np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-11)
    return run, Ok(check)


for sinks, window, chunks in ((0, 1, [1, 1, 1]), (2, 1, [1] * 5), (3, 2, [6, 1, 2]), (1, 3, [2, 5, 1]),
                              (0, 2, [4, 4]), (5, 1, [2, 1, 4])):
    for scheme in (L.Rotary, L.ALiBi, L.NoPE):
        for impl, make in LAYERS:
            case(f"streaming[{impl}] {scheme.__name__} sinks={sinks} window={window} chunks={chunks}",
                 *stream_equals_fresh(scheme, sinks, window, chunks, make))
case("streaming t5 fresh", *stream_equals_fresh(lambda: L.T5Bias(bidirectional=False), 2, 2, [3, 1, 1]))
case("streaming xl fresh", *stream_equals_fresh(L.TransformerXL, 1, 2, [3, 1, 1]))
case("streaming num_sinks -1", lambda: StreamingCache(L.MultiHeadAttention(16, 4), num_sinks=-1), Named("num_sinks"))
case("streaming num_sinks bool", lambda: StreamingCache(L.MultiHeadAttention(16, 4), num_sinks=True),
     Named("num_sinks", TypeError))
case("streaming window 0", lambda: StreamingCache(L.MultiHeadAttention(16, 4), window=0), Named("window"))
case("streaming window 2.0", lambda: StreamingCache(L.MultiHeadAttention(16, 4), window=2.0), Named("window", TypeError))
case("streaming window 2**63", *stream_equals_fresh(L.Rotary, 2, 2 ** 63, [3, 1]))
case("streaming layer str", lambda: StreamingCache("layer"), Named("layer", TypeError))
case("streaming xpos", lambda: StreamingCache(L.MultiHeadAttention(16, 4, scheme=L.XPos())), Named("re-rotates"))
case("streaming positions given", lambda: (lambda m: m(X[:, :1], positions=[5], cache=StreamingCache(m)))(
    L.MultiHeadAttention(16, 4)), Named("positions"))

def _with(make, attr, value, **kw):
    """A layer whose weight ``attr`` was replaced by ``value`` (a checkpoint copied in wrongly)."""
    layer = make(16, 4, **kw)
    setattr(layer, attr, value)
    return layer


for impl, make in LAYERS:
    p = f"layer[{impl}]"
    case(f"{p} x ragged", lambda m=make: m(16, 4)([[[1.0] * 16], [[1.0] * 15]]), Named("x"))
    for attr, value, exc in (("wq", np.zeros((16, 8)), ValueError), ("wk", np.zeros((8, 16)), ValueError),
                             ("wv", np.zeros((16, 16), int), TypeError), ("wo", "w", TypeError),
                             ("wo", np.zeros((8, 16)), ValueError), ("wq", None, TypeError),
                             ("wq", np.zeros((16, 16), bool), TypeError)):
        case(f"{p} {attr} = {type(value).__name__} {getattr(value, 'shape', '')}",
             lambda m=make, a=attr, v=value: _with(m, a, v)(X), Named(attr, exc))
    case(f"{p} bq shape", lambda m=make: _with(m, "bq", np.zeros(3), bias=True)(X), Named("bq"))
    case(f"{p} bk given without bias", lambda m=make: _with(m, "bk", np.zeros(8), num_kv_heads=2, seed=2)(X),
         Ok(close_to(lambda m=make: m(16, 4, num_kv_heads=2, seed=2)(X))))
    case(f"{p} wq NaN", lambda m=make: _with(m, "wq", np.full((16, 16), np.nan))(X), Named("wq"))
    case(f"{p} wk gqa shape", lambda m=make: _with(m, "wk", np.zeros((16, 16)), num_kv_heads=2)(X), Named("wk"))
    case(f"{p} sinks NaN", lambda m=make: _with(m, "sinks", np.full(4, np.nan), sinks=True)(X), Named("sinks"))
    case(f"{p} sinks shape", lambda m=make: _with(m, "sinks", np.zeros(3), sinks=True)(X), Named("sinks"))
    case(f"{p} sinks 1e5 float16", lambda m=make: _with(m, "sinks", np.array([1e5, 0, 0, 0]), sinks=True,
                                                        dtype=np.float16)(X.astype(np.float16)), Named("sinks"))
    case(f"{p} cache of another batch", lambda m=make: (lambda l, c: (l(X, cache=c), l(X[:1], cache=c)))(
        m(16, 4), KVCache()), Named("cache holds"))
    case(f"{p} float16 fast == reference", lambda m=make: m(16, 4, dtype=np.float16, seed=1)(X.astype(np.float16),
                                                                                            causal=True),
         Ok(close_to(lambda: L.MultiHeadAttention(16, 4, seed=1)(X, causal=True), rtol=2e-2, atol=2e-2,
                     dtype=np.dtype(np.float16))))
    for name, kw in (("gqa", {"num_kv_heads": 2, "scheme": L.Rotary}), ("window", {"sliding_window": 2,
                                                                                   "scheme": L.Rotary})):
        case(f"streaming[{impl}] {name} fresh", *stream_equals_fresh(
            kw["scheme"], 1, 2, [3, 1, 1], lambda d, h, scheme, seed, m=make, kw=kw: m(
                d, h, scheme=scheme, seed=seed, **{k: v for k, v in kw.items() if k != "scheme"})))
for impl, make in LAYERS:
    for size in (2 ** 63, 10 ** 9, 2 ** 31):
        case(f"layer[{impl}] block_size {size} == dense", lambda m=make, n=size: (
            m(16, 4, seed=8, block_size=n, scheme=L.ALiBi())(X, causal=True),
            m(16, 4, seed=8, scheme=L.ALiBi())(X, causal=True)),
            Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-10, atol=1e-12)))
case("layer chunk bidirectional blockwise == dense", *blockwise_equals_dense({"attention_chunk": 4}))
case("layer t5 bidirectional blockwise == dense", *blockwise_equals_dense({"scheme": L.T5Bias}))
case("layer padding mask blockwise == dense", *blockwise_equals_dense({"scheme": L.ALiBi},
                                                                      mask=np.tile(np.arange(6) < 5, (2, 1))))
case("mla wkv_a shape", lambda: _with(lambda d, h: mla.MultiHeadLatentAttention(d, h, **MLA_ARGS), "wkv_a",
                                      np.zeros((16, 5)))(X), Named("wkv_a"))
case("mla wq_b shape", lambda: _with(lambda d, h: mla.MultiHeadLatentAttention(d, h, q_lora_rank=3, **MLA_ARGS), "wq_b",
                                     np.zeros((4, 24)))(X), Named("wq_b"))
case("mla kv_a_norm None", lambda: _with(lambda d, h: mla.MultiHeadLatentAttention(d, h, **MLA_ARGS), "kv_a_norm",
                                         None)(X), Named("kv_a_norm", TypeError))
case("mla latent_kv wkv_b shape", lambda: mla.latent_kv(_with(lambda d, h: mla.MultiHeadLatentAttention(d, h, **MLA_ARGS),
                                                              "wkv_b", np.zeros((6, 5))), X, np.arange(6)), Named("wkv_b"))
case("mla block_size cached == full", *cached_equals_full(
    lambda d, h, seed: mla.MultiHeadLatentAttention(d, h, seed=seed, block_size=2, **MLA_ARGS), {}))

# --------------------------------------------------------------------------- backward contexts


def _grads_match_fd(make, kw, block_size=None, key="x", **call):
    """``backward(ctx, dy)[key]`` along a random direction against central differences."""
    def run():
        layer = make(16, 4, seed=13, block_size=block_size, **{k: v() if callable(v) else v for k, v in kw.items()})
        x, dy = X[:, :5], RNG.standard_normal((2, 5, 16))
        y, ctx = layer(x, return_context=True, **call)
        grads = layer.backward(ctx, dy)
        target = x if key == "x" else getattr(layer, key)
        e, h = RNG.standard_normal(target.shape), 1e-6

        def loss(delta):
            if key == "x":
                return np.sum(layer(x + delta, **call) * dy)
            old = target.copy()
            target[...] = old + delta
            try:
                return np.sum(layer(x, **call) * dy)
            finally:
                target[...] = old
        return np.sum(grads[key] * e), (loss(h * e) - loss(-h * e)) / (2 * h)

    def check(pair):
        assert np.isclose(pair[0], pair[1], rtol=1e-6, atol=1e-8), pair
    return run, Ok(check)


for name in [*REGISTERED, "gqa", "sinks", "window", "chunk", "bias"]:
    for impl, make in LAYERS:
        for block in (None, 2):
            case(f"backward[{impl}] {name} block={block}", *_grads_match_fd(make, SCHEME_OPTIONS[name], block,
                                                                           causal=True))
case("backward sinks grad", *_grads_match_fd(L.MultiHeadAttention, {"sinks": True}, key="sinks", causal=True))
case("backward wk gqa", *_grads_match_fd(fast.MultiHeadAttention, {"num_kv_heads": 2}, key="wk", causal=True))


def _ctx(make=L.MultiHeadAttention, **kw):
    layer = make(16, 4, **kw)
    return layer(X[:, :5], causal=True, return_context=True)[1]


CTX = {"plain": lambda: _ctx(), "gqa": lambda: _ctx(num_kv_heads=2), "blockwise": lambda: _ctx(block_size=2),
       "mrope": lambda: _ctx(scheme=MRotary()), "rope": lambda: _ctx(scheme=L.Rotary()), "sinks": lambda: _ctx(sinks=True),
       "window": lambda: _ctx(sliding_window=2), "fast-gqa": lambda: _ctx(fast.MultiHeadAttention, num_kv_heads=2)}
TARGETS = {"plain": lambda: L.MultiHeadAttention(16, 4), "gqa": lambda: fast.MultiHeadAttention(16, 4, num_kv_heads=2),
           "mla": lambda: mla.MultiHeadLatentAttention(16, 4, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2,
                                                       v_head_dim=4),
           "rope": lambda: L.MultiHeadAttention(16, 4, scheme=L.Rotary()),
           "chunk": lambda: L.MultiHeadAttention(16, 4, attention_chunk=2)}
for src, make_ctx in CTX.items():
    for dst, make_layer in TARGETS.items():
        same = (src, dst) in {("plain", "plain"), ("gqa", "gqa"), ("rope", "rope"), ("fast-gqa", "gqa")}
        expect = Ok() if same else Named("ctx")
        case(f"backward {src} ctx into {dst}", lambda c=make_ctx, m=make_layer: m().backward(c(), np.ones((2, 5, 16))),
             expect)
case("backward bad weight after the forward", lambda: (lambda l, c: (setattr(l, "wo", np.zeros((8, 16))),
                                                                      l.backward(c, np.ones((2, 5, 16)))))(
    L.MultiHeadAttention(16, 4), _ctx()), Named("wo"))
for impl, make in LAYERS:
    case(f"backward[{impl}] wo's gradient overflows alone", lambda m=make: (lambda l: (
        setattr(l, "wo", l.wo * 1e-12), l.backward(l(X[:, :5], return_context=True)[1], np.full((2, 5, 16), 1.7e308))))(
        m(16, 4, bias=True)), Named("wo"))
case("backward twice gives the same", lambda: (lambda l, c: (l.backward(c, X[:, :5]), l.backward(c, X[:, :5])))(
    L.MultiHeadAttention(16, 4), _ctx()),
     Ok(lambda pair: [np.testing.assert_array_equal(pair[0][k], pair[1][k]) for k in pair[0]]))


def _cached_step_grad(make, **kw):
    """The gradient of x for a step after a cached prefix (the prefix's keys constants) against
    central differences, each evaluation on a copy of the cache."""
    def run():
        layer = make(16, 4, seed=17, **kw)
        cache = layer.new_cache()
        layer(X[:, :4], causal=True, cache=cache)
        x, dy = X[:, 4:], RNG.standard_normal((2, 2, 16))
        y, ctx = layer(x, causal=True, cache=copy.deepcopy(cache), return_context=True)
        e, h = RNG.standard_normal(x.shape), 1e-6
        loss = lambda d: np.sum(layer(x + d, causal=True, cache=copy.deepcopy(cache)) * dy)   # noqa: E731
        return np.sum(layer.backward(ctx, dy)["x"] * e), (loss(h * e) - loss(-h * e)) / (2 * h)

    def check(pair):
        assert np.isclose(pair[0], pair[1], rtol=1e-6, atol=1e-8), pair
    return run, Ok(check)


for impl, make in LAYERS:
    for name, kw in (("rope", {"scheme": L.Rotary()}), ("xl", {"scheme": L.TransformerXL()}),
                     ("gqa window", {"num_kv_heads": 2, "sliding_window": 3}), ("blockwise", {"block_size": 2})):
        case(f"backward[{impl}] cached step {name}", *_cached_step_grad(make, **copy.deepcopy(kw)))
case("backward ctx str", lambda: L.MultiHeadAttention(16, 4).backward("ctx", np.ones((2, 5, 16))), Named("ctx", TypeError))
case("backward dy shape", lambda: L.MultiHeadAttention(16, 4).backward(_ctx(), np.ones((2, 4, 16))), Named("dy"))
case("backward dy NaN", lambda: L.MultiHeadAttention(16, 4).backward(_ctx(), np.full((2, 5, 16), np.nan)), Named("dy"))
case("backward dy bool", lambda: L.MultiHeadAttention(16, 4).backward(_ctx(), np.ones((2, 5, 16), bool)),
     Named("dy", TypeError))
case("backward dy 1e300 is linear", lambda: (lambda m, c: (m.backward(c, np.full((2, 5, 16), 1e300)),
                                                             m.backward(c, np.ones((2, 5, 16)))))(
    L.MultiHeadAttention(16, 4), _ctx()),
     Ok(lambda pair: [np.testing.assert_allclose(pair[0][key], 1e300 * pair[1][key], rtol=1e-12) for key in pair[1]]))
case("backward dy 1e308 overflows", lambda: L.MultiHeadAttention(16, 4).backward(_ctx(), np.full((2, 5, 16), 1e308)),
     Named("dy"))

# --------------------------------------------------------------------------- MLA

MLA_ARGS = dict(kv_lora_rank=6, qk_nope_head_dim=4, qk_rope_head_dim=2, v_head_dim=3)
MLAS = [("ref", mla.MultiHeadLatentAttention), ("fast", fast.MultiHeadLatentAttention)]
for impl, make in MLAS:
    p = f"mla[{impl}]"
    for arg in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "q_lora_rank"):
        for bad, exc in ((0, ValueError), (-2, ValueError), (True, TypeError), (4.0, TypeError), ("4", TypeError),
                         (2 ** 63, ValueError), (2 ** 70, ValueError), (10 ** 9, ValueError)):
            if (arg, bad) == ("qk_rope_head_dim", 0):                  # MLA without RoPE (GLM-5.3-Flash): valid
                continue
            case(f"{p} {arg}={bad!r}", lambda m=make, a=arg, b=bad: m(16, 4, **{**MLA_ARGS, a: b}), Named(arg, exc))
    case(f"{p} odd rope dim", lambda m=make: m(16, 4, **{**MLA_ARGS, "qk_rope_head_dim": 3}), Named("qk_rope_head_dim"))
    case(f"{p} eps 0", lambda m=make: m(16, 4, **MLA_ARGS, eps=0.0), Named("eps"))
    case(f"{p} eps NaN", lambda m=make: m(16, 4, **MLA_ARGS, eps=float("nan")), Named("eps"))
    case(f"{p} scheme rope", lambda m=make: m(16, 4, **MLA_ARGS, scheme=L.Rotary()), Named("scheme", TypeError))
    case(f"{p} heads 0", lambda m=make: m(16, 0, **MLA_ARGS), Named("num_heads"))
    case(f"{p} d_model 2**63", lambda m=make: m(2 ** 63, 4, **MLA_ARGS), Named("d_model"))
    case(f"{p} x NaN", lambda m=make: m(16, 4, **MLA_ARGS)(X * np.nan), Named("x"))
    case(f"{p} x 1e300", lambda m=make: m(16, 4, **MLA_ARGS)(X * 1e300, causal=True), Named("x"))
    case(f"{p} x d_model", lambda m=make: m(16, 4, **MLA_ARGS)(X[..., :8]), Named("x"))
    for q_rank in (None, 5):
        kw = {**MLA_ARGS, "q_lora_rank": q_rank}
        case(f"{p} q_lora_rank={q_rank} cached == full",
             *cached_equals_full(lambda d, h, seed, m=make, kw=kw: m(d, h, seed=seed, **kw), {}))
        for key in ("x", "wkv_a", "wkv_b", "kv_a_norm", "wq" if q_rank is None else "q_a_norm"):
            case(f"{p} q_lora_rank={q_rank} backward {key}",
                 *_grads_match_fd(lambda d, h, seed, block_size, m=make, kw=kw: m(d, h, seed=seed, block_size=block_size,
                                                                                   **kw), {}, key=key, causal=True))
case("mla fast == reference", lambda: (mla.MultiHeadLatentAttention(16, 4, seed=2, **MLA_ARGS)(X_BIG, causal=True),
                                       fast.MultiHeadLatentAttention(16, 4, seed=2, **MLA_ARGS)(X_BIG, causal=True)),
     Ok(lambda pair: np.testing.assert_allclose(pair[1], pair[0], rtol=1e-9, atol=1e-10)))
case("mla large latent (rank > d_model) cached == full",
     *cached_equals_full(lambda d, h, seed: mla.MultiHeadLatentAttention(d, h, seed=seed, kv_lora_rank=40,
                                                                         qk_nope_head_dim=2, qk_rope_head_dim=2,
                                                                         v_head_dim=2), {}))
MLA = mla.MultiHeadLatentAttention(16, 4, seed=4, **MLA_ARGS)
C_KV, K_ROPE = mla.latent_kv(MLA, X, np.arange(6))
case("mla absorbed == layer", lambda: mla.absorbed_attention(MLA, X, np.arange(6), C_KV, K_ROPE, np.arange(6)),
     Ok(close_to(lambda: MLA(X, causal=True))))
case("mla latent_kv layer", lambda: mla.latent_kv(L.MultiHeadAttention(16, 4), X, np.arange(6)), Named("layer", TypeError))
case("mla latent_kv positions", lambda: mla.latent_kv(MLA, X, np.arange(5)), Named("positions"))
case("mla absorbed c_kv rank", lambda: mla.absorbed_attention(MLA, X, np.arange(6), C_KV[..., :5], K_ROPE, np.arange(6)),
     Named("c_kv"))
case("mla absorbed k_rope", lambda: mla.absorbed_attention(MLA, X, np.arange(6), C_KV, K_ROPE[:, :5], np.arange(6)),
     Named("k_rope"))
case("mla absorbed k_positions", lambda: mla.absorbed_attention(MLA, X, np.arange(6), C_KV, K_ROPE, np.arange(5)),
     Named("k_positions"))
case("mla absorbed NaN", lambda: mla.absorbed_attention(MLA, X, np.arange(6), C_KV * np.nan, K_ROPE, np.arange(6)),
     Named("c_kv"))
case("mla absorbed causal str", lambda: mla.absorbed_attention(MLA, X, np.arange(6), C_KV, K_ROPE, np.arange(6),
                                                               causal="y"), Named("causal", TypeError))


def _rms(x, w, eps=1e-6):
    """RMSNorm in 60-digit decimal arithmetic, row by row."""
    getcontext().prec = 60
    rows = []
    for row in np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1]):
        row = [Decimal(float(a)) for a in row]
        root = (sum(a * a for a in row) / len(row) + Decimal(eps)).sqrt()
        rows.append([float(Decimal(float(wi)) * a / root) for a, wi in zip(row, w)])
    return np.array(rows).reshape(np.shape(x))


for value, dtype, tol in ((1e300, np.float64, 1e-12), (1e200, np.float64, 1e-12), (1e20, np.float32, 1e-6),
                          (300.0, np.float16, 2e-3), (1e-300, np.float64, 1e-12), (3e-8, np.float32, 1e-6),
                          (1e154, np.float64, 1e-12), (1e4, np.longdouble, 1e-12)):
    x = (np.arange(1.0, 9.0).reshape(2, 4) * value).astype(dtype)
    case(f"rms_norm {value:g} {np.dtype(dtype).name}", lambda x=x: mla.rms_norm(x, np.ones(4)),
         Ok(close_to(_rms(x, np.ones(4)), rtol=tol, atol=0, dtype=np.dtype(dtype))))
case("rms_norm zeros", lambda: mla.rms_norm(np.zeros((2, 4)), np.ones(4)), Ok(close_to(np.zeros((2, 4)))))
case("rms_norm D=0", lambda: mla.rms_norm(np.zeros((2, 0)), np.ones(0)), Ok(shape_is((2, 0))))
case("rms_norm weight shape", lambda: mla.rms_norm(np.ones((2, 4)), np.ones(3)), Named("weight"))
case("rms_norm weight NaN", lambda: mla.rms_norm(np.ones((2, 4)), np.full(4, np.nan)), Named("weight"))
case("rms_norm weight 1.5e308", lambda: mla.rms_norm(np.arange(8.0).reshape(2, 4), np.full(4, 1.5e308)),
     Named("weight"))
case("rms_norm x NaN", lambda: mla.rms_norm(np.full((2, 4), np.nan), np.ones(4)), Named("x"))
case("rms_norm x 0-d", lambda: mla.rms_norm(1.0, np.ones(1)), Named("weight"))
case("rms_norm eps -1", lambda: mla.rms_norm(np.ones((2, 4)), np.ones(4), eps=-1.0), Named("eps"))
case("rms_norm eps str", lambda: mla.rms_norm(np.ones((2, 4)), np.ones(4), eps="1"), Named("eps", TypeError))
case("rms_norm_backward dy shape", lambda: mla.rms_norm_backward(np.ones((2, 4)), np.ones(4), np.ones((2, 3))),
     Named("dy"))
case("rms_norm_backward dy NaN", lambda: mla.rms_norm_backward(np.ones((2, 4)), np.ones(4), np.full((2, 4), np.nan)),
     Named("dy"))
case("rms_norm_backward dy 1e308", lambda: mla.rms_norm_backward(np.arange(8.0).reshape(2, 4), np.full(4, 1e308),
                                                                 np.full((2, 4), 1e308)), Named("dy"))
X_RMS = np.arange(1.0, 9.0).reshape(2, 4) * 1e300
E_RMS, DY_RMS = RNG.standard_normal((2, 4)) * 1e300, RNG.standard_normal((2, 4))
case("rms_norm_backward 1e300 vs central differences", lambda: (
    np.sum(mla.rms_norm_backward(X_RMS, np.ones(4), DY_RMS)[0] * E_RMS),
    np.sum((mla.rms_norm(X_RMS + 1e-6 * E_RMS, np.ones(4)) - mla.rms_norm(X_RMS - 1e-6 * E_RMS, np.ones(4))) * DY_RMS) / 2e-6),
    Ok(lambda pair: np.testing.assert_allclose(pair[0], pair[1], rtol=1e-6)))
case("rms_norm_backward float32 dtype", lambda: mla.rms_norm_backward(np.ones((2, 4), np.float32), np.ones(4),
                                                                      np.ones((2, 4), np.float32))[0],
     Ok(lambda dx: dx.dtype == np.float32 or pytest.fail(dx.dtype)))
for bad, exc in ((0.0, ValueError), (-1.0, ValueError), ("2", TypeError), (float("nan"), ValueError)):
    case(f"yarn_get_mscale scale={bad!r}", lambda b=bad: mla.yarn_get_mscale(b), Named("scale", exc))


@pytest.mark.parametrize("label, call, expect", CASES, ids=[c[0] for c in CASES])
def test_campaign(label, call, expect):
    _run(call, expect)


def test_the_campaign_counts_its_calls():
    # 930 calls, each a row of CASES: grow the table, do not shrink it.
    assert len(CASES) >= 930, len(CASES)
