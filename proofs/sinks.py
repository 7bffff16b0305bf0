r"""Attention sinks (gpt-oss): a per-head logit appended to every row's softmax and dropped after.

With logits x_1 … x_S of one query row and the head's sink logit s,

    P_j = e^{x_j} / (e^s + sum_k e^{x_k}),   p_sink = e^s / (e^s + sum_k e^{x_k}) = 1 - sum_j P_j,
    O = P V  (the sink has no value),

and for the output gradient dO, with L = <dO, O>:

    dL/dx_j = P_j (dP_j - <dO, O>),   dP = dO V^T      (the sink-free formula, with these P)
    dL/ds   = -p_sink <dO, O>

The blockwise forward starts each row from the sink, m = s and l = 1, so the row's log-sum-exp
counts it: e^{lse} = e^s + sum_k e^{x_k}, and p_sink = e^{s - lse}. Tied to
``attention``, ``attention_backward`` and ``blockwise_attention_backward``.
"""

from __future__ import annotations

import functools

import numpy as np
import sympy as sp

from .core import theorem
from .gradients import Derivative, _exps_as_symbols

ATTENTION = "minipos.attention.attention"
ATTENTION_BACKWARD = "minipos.attention.attention_backward"
BLOCKWISE_BACKWARD = "minipos.attention.blockwise_attention_backward"
S, DV = 2, 2


def _row():
    """One row with S = 2 keys and Dv = 2: (x, s, V, dO), P, p_sink, O, L = <dO, O>."""
    x = sp.symbols(f"x0:{S}", real=True)
    s = sp.Symbol("s", real=True)
    V = sp.Matrix(S, DV, lambda j, d: sp.Symbol(f"V_{j}{d}", real=True))
    dO = sp.symbols(f"dO0:{DV}", real=True)
    total = sp.exp(s) + sp.Add(*[sp.exp(v) for v in x])
    P = [sp.exp(v) / total for v in x]
    O = [sum(P[j] * V[j, d] for j in range(S)) for d in range(DV)]
    L = sum(dO[d] * O[d] for d in range(DV))
    return (x, s, V, dO), P, sp.exp(s) / total, O, L


def _split_exps(e):
    """Strategy: e^{a - b} split into e^a e^{-b}, then each exponential a symbol (gradients' strategy)."""
    return _exps_as_symbols(sp.expand(sp.sympify(e).doit(), power_exp=True, mul=False, multinomial=False))


@functools.lru_cache(maxsize=None)
def _gradients():
    """(dL/dx, dL/ds) by sp.diff, lambdified in (x, s, V, dO)."""
    (x, s, V, dO), _, _, _, L = _row()
    grads = [sp.diff(L, v) for v in x] + [sp.diff(L, s)]
    return sp.lambdify((x, s, list(V), dO), grads, "numpy")


@theorem("sinks.sink_softmax",
         "with a sink logit s appended to a row and dropped after the softmax: the weights sum to "
         "1 - p_sink; dS_j = P_j (dP_j - rowsum(dO * O)) as without a sink; ds = -p_sink rowsum(dO * O); "
         "the blockwise row starting from m = s, l = 1 has e^lse = e^s + sum e^x",
         checks=(ATTENTION, ATTENTION_BACKWARD, BLOCKWISE_BACKWARD))
def _(p):
    (x, s, V, dO), P, p_sink, O, L = _row()
    p.claim(sum(P) + p_sink, sp.Integer(1), "the sink's column takes the rest: $\\sum_j P_j = 1 - p_{sink}$",
            by=_exps_as_symbols)
    dP = [sum(dO[d] * V[j, d] for d in range(DV)) for j in range(S)]            # dP = dO V^T
    rowsum = sum(dO[d] * O[d] for d in range(DV))                               # rowsum(dO * O)
    (p.derive(sp.Matrix([Derivative(L, v) for v in x]),
              "$dS_j = \\partial \\langle dO, O \\rangle / \\partial x_j$, one row, S = 2 keys, Dv = 2")
      .step(sp.Matrix([P[j] * (dP[j] - rowsum) for j in range(S)]),
            "$P_j (dP_j - \\mathrm{rowsum}(dO \\odot O))$: the formula without a sink, P the sink softmax",
            by=_exps_as_symbols))
    (p.derive(Derivative(L, s), "$ds = \\partial \\langle dO, O \\rangle / \\partial s$")
      .step(-p_sink * rowsum, "$-p_{sink}\\, \\mathrm{rowsum}(dO \\odot O)$: the sink's $dP$ is 0 (no value)",
            by=_exps_as_symbols))
    m, lse = s, s + sp.log(1 + sp.Add(*[sp.exp(v - s) for v in x]))             # m = s, l = 1, then the keys
    (p.derive(sp.exp(lse), "$e^{lse}$, $lse = m + \\ln l$ after the keys, starting from $m = s$, $l = 1$")
      .step(sp.exp(s) + sp.Add(*[sp.exp(v) for v in x]), "the row's full sum, the sink counted", by="expand"))
    p.claim(sp.exp(s - lse), p_sink, "$p_{sink} = e^{s - lse}$", by=_split_exps)
    p.refute(sum(P), sp.Integer(1), {x[0]: 0, x[1]: 0, s: 0}, "with a sink the weights do not sum to 1")
    _tie(p)


def _case(seed):
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((1, 1, 1, 2)), rng.standard_normal((1, 1, S, 2)), rng.standard_normal((1, 1, S, DV))
    sink, dout = rng.standard_normal(1), rng.standard_normal((1, 1, 1, DV))
    x = (q[0, 0] @ k[0, 0].T)[0]                                                 # logits, scale 1
    return (q, k, v, sink, dout), (x, sink[0], v[0, 0].ravel(), dout[0, 0, 0])


def _tie(p):
    names = (sp.Symbol("seed"),)
    points = [(0,), (1,), (2,)]
    (x, s, V, dO), P, _, O, _ = _row()
    forward = sp.lambdify((x, s, list(V)), O, "numpy")
    p.tie(ATTENTION, expected=lambda seed: np.ravel(forward(*_case(seed)[1][:3])), points=points, symbols=names,
          call=lambda f, seed: np.ravel(f(*_case(seed)[0][:3], scale=1.0, sinks=_case(seed)[0][3])),
          reason="O = P V with the sink's column dropped, S = 2")

    def expected(seed, which):
        g = np.ravel(_gradients()(*_case(seed)[1]))
        return g[S:] if which == "dsinks" else g[:S]

    def dense(f, seed):
        (q, k, v, sink, dout), _ = _case(seed)
        return f(q, k, v, dout, scale=1.0, sinks=sink)[4]

    p.tie(ATTENTION_BACKWARD, expected=lambda seed: expected(seed, "dsinks"), points=points, symbols=names,
          call=dense, reason="dsinks = sp.diff of <dO, O> by s")

    def blockwise(f, seed):
        from minipos.attention import blockwise_attention
        (q, k, v, sink, dout), _ = _case(seed)
        out, lse = blockwise_attention(q, k, v, scale=1.0, sinks=sink, block_size=1, return_lse=True)
        return f(q, k, v, out, lse, dout, scale=1.0, sinks=sink, block_size=1)[3]

    p.tie(BLOCKWISE_BACKWARD, expected=lambda seed: expected(seed, "dsinks"), points=points, symbols=names,
          call=blockwise, reason="dsinks = sp.diff of <dO, O> by s, from lse (one key per block)")
