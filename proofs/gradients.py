r"""Gradients: the identities every backward pass of minipos relies on.

Each backward is the vector-Jacobian product of its forward: for an output gradient ``dy`` the
input gradient is ``dx = J^T dy``, the gradient of the scalar <dy, f(x)>. Each theorem below
differentiates that scalar with SymPy at small explicit sizes, and ties the code to it.

- Softmax (``softmax_backward``): d p_i / d x_j = p_i (δ_ij - p_j), so J = diag(p) - p p^T is
  symmetric and J^T dp = p ⊙ (dp - <p, dp>). Since sum p = 1, the result sums to 0 (softmax is
  shift-invariant, so no gradient flows along the all-ones direction).
- Attention (``attention_backward``, ``blockwise_attention_backward``; FlashAttention-2, Dao 2023,
  arXiv:2307.08691, §3.1 and Alg. 2): with S = scale q k^T + b, P = softmax(S) by rows, O = P V,

      dV = P^T dO,   dP = dO V^T,   dS = P ⊙ (dP - rowsum(dP ⊙ P)),
      rowsum(dP ⊙ P)_i = sum_j P_ij sum_d dO_id V_jd = sum_d dO_id O_id = rowsum(dO ⊙ O)_i,
      dq = scale dS K,   dk = scale dS^T Q,   db = dS.

  The last equality is what lets the blockwise backward use D_i = rowsum(dO_i ⊙ O_i), one number
  per row from the stored output, instead of a second pass over the keys.
- Blockwise order: the backward recomputes P_ij = exp(S_ij - lse_i) from the forward's row
  log-sum-exp. lse = m + ln l is the log of the full row's sum whatever split and references the
  online softmax used, so P_ij is the full-row softmax restricted to block j, and dS_ij its
  restriction too; dQ_i, dK_j, dV_j are sums of per-block terms, which addition does not order.
- RoPE (``apply_rope_backward``; Su et al. 2021, arXiv:2104.09864): y = f R(m) x is linear in x,
  so dx = f R(m)^T dy = f R(-m) dy; the pass-through features of partial rotary get dy itself.
- The relative shift (``rel_shift_backward``; Dai et al. 2019, arXiv:1901.02860): pad, re-view and
  slice copy entries, so vec(rel_shift(x)) = Π vec(x) for a 0/1 matrix Π, and the adjoint is Π^T.
- T5 (``t5_bias_backward``; Raffel et al. 2020, arXiv:1910.10683): bias[h, t, s] =
  table[b(t, s), h] copies one table entry to many pairs, so its gradient adds the pairs' dbias
  per bucket (a scatter-add).
- ALiBi (``alibi_bias_backward``; Press et al. 2022, arXiv:2108.12409): bias = m_h r_ts, so
  dm_h = sum dbias r; because the rows of dS sum to 0, BLOOM's key-only r = j gets the same dm_h.
"""

from __future__ import annotations

import functools
import importlib

import numpy as np
import sympy as sp

from .core import theorem
from .rope import R, R_half, thetas, vec
from .t5 import _bucket

SOFTMAX_BACKWARD = "minipos.attention.softmax_backward"
ATTENTION_BACKWARD = "minipos.attention.attention_backward"
BLOCKWISE_BACKWARD = "minipos.attention.blockwise_attention_backward"
FAST_BLOCKWISE_BACKWARD = "minipos.fast.attention.blockwise_attention_backward"
ROPE_BACKWARD = "minipos.rope.apply_rope_backward"
REL_SHIFT = "minipos.transformer_xl.rel_shift"
REL_SHIFT_BACKWARD = "minipos.transformer_xl.rel_shift_backward"
T5_BACKWARD = "minipos.t5.t5_bias_backward"
ALIBI_BACKWARD = "minipos.alibi.alibi_bias_backward"


class Derivative(sp.Derivative):
    """``sp.Derivative`` that evaluates itself before a numeric substitution, so that the core's
    probe can evaluate a chain that starts at an unevaluated derivative and report a wrong step
    as FALSE with a counterexample (a plain Derivative cannot take a number for its variable)."""

    def _xreplace(self, rule):
        if self in rule:
            return rule[self], True
        return self.doit()._xreplace(rule)


def _softmax(x):
    """softmax(x) as the definition writes it: e^{x_i} / sum_k e^{x_k}."""
    total = sp.Add(*[sp.exp(v) for v in x])
    return [sp.exp(v) / total for v in x]


def _exps_as_symbols(e):
    """Strategy for identities rational in exponentials: evaluate derivatives, write each
    e^{n u} as E_u^n (a positive symbol per exponent u), then cancel the rational function."""
    e = sp.sympify(e).doit()
    gens, subs = {}, {}
    for x in e.atoms(sp.exp):
        n, u = x.args[0].as_content_primitive()
        if u.could_extract_minus_sign():
            n, u = -n, -u
        subs[x] = gens.setdefault(u, sp.Dummy(f"exp({u})", positive=True)) ** n
    return sp.cancel(e.xreplace(subs))


def _jacobian(p):
    """The matrix p_i (δ_ij - p_j) for a vector p (list)."""
    n = len(p)
    return sp.Matrix(n, n, lambda i, j: p[i] * (sp.KroneckerDelta(i, j) - p[j]))


def _code(name):
    """The minipos function ``name`` as it is now (a monkeypatched one included)."""
    mod, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(mod), attr)


# --------------------------------------------------------------------------- 1. softmax

@theorem("gradients.softmax_jacobian",
         "d softmax(x)_i / d x_j = p_i (δ_ij - p_j), i.e. J = diag(p) - p p^T, symmetric, so the "
         "vector-Jacobian product is J^T dp = p * (dp - sum(p * dp)), which sums to 0",
         checks=(SOFTMAX_BACKWARD,))
def _(p):
    n = 3
    x = sp.symbols(f"x0:{n}", real=True)
    P = _softmax(x)
    (p.derive(sp.Matrix(n, n, lambda i, j: Derivative(P[i], x[j])),
              "$J_{ij} = \\partial p_i / \\partial x_j$, $p = \\mathrm{softmax}(x)$, n = 3")
      .step(_jacobian(P), "quotient rule: $\\partial_j e^{x_i} = \\delta_{ij} e^{x_i}$, "
            "$\\partial_j \\sum_k e^{x_k} = e^{x_j}$", by=_exps_as_symbols)
      .step(sp.diag(*P) - sp.Matrix(P) * sp.Matrix(P).T, "$\\mathrm{diag}(p) - p p^T$", by="expand"))
    p.refute(sp.Matrix(n, n, lambda i, j: sp.diff(P[i], x[j])), sp.diag(*P), {v: 0 for v in x},
             "J is not diag(p): every output depends on every input through the sum")

    ps = sp.Matrix(sp.symbols(f"p0:{n}", real=True))
    dp = sp.Matrix(sp.symbols(f"dp0:{n}", real=True))
    J = sp.diag(*ps) - ps * ps.T
    p.claim(sp.Transpose(sp.ImmutableMatrix(J)), J, "$(p p^T)^T = p p^T$: J is symmetric")
    (p.derive(sp.MatMul(sp.ImmutableMatrix(J), sp.ImmutableMatrix(dp), evaluate=False), "$J^T dp = J dp$")
      .step(ps.multiply_elementwise(dp) - ps * (ps.T * dp)[0], "$\\mathrm{diag}(p) dp - p (p \\cdot dp)$",
            by="expand")
      .step(ps.multiply_elementwise(dp - sp.ones(n, 1) * (ps.T * dp)[0]),
            "$p \\odot (dp - \\sum_k p_k dp_k)$: what softmax_backward computes", by="expand"))
    (p.derive(sum(J * dp), "the entries of $J^T dp$ sum to")
      .step(sp.Integer(0), "$\\sum_i p_i = 1$", using={ps[n - 1]: 1 - sum(ps[:n - 1])}, by="expand"))
    _tie_softmax_backward(p, x, P)


def _tie_softmax_backward(p, x, P):
    n = len(x)
    dps = sp.symbols(f"dp0:{n}", real=True)
    vjp = sp.lambdify((x, dps), _jacobian(P).T * sp.Matrix(dps), "numpy")

    def softmax(x):
        e = np.exp(np.asarray(x, float) - np.max(x))
        return e / e.sum()
    names = (sp.Symbol("x"), sp.Symbol("dp"))
    points = [((0.5, -1.0, 2.0), (1.0, -2.0, 0.5)), ((3.0, 1.0, -4.0), (0.0, 1.0, 0.0)),
              ((0.0, 0.0, 0.0), (1.0, 0.0, 0.0)), ((-np.inf, 0.0, 1.0), (2.0, -1.0, 3.0))]
    p.tie(SOFTMAX_BACKWARD, expected=lambda x, dp: np.ravel(vjp(x, dp)), points=points, symbols=names,
          call=lambda f, x, dp: f(softmax(x), np.asarray(dp)),
          reason="J^T dp from the symbolic J, n = 3 (x = -inf: a masked entry, p = 0)")
    cols = points[:3]   # the same points as the columns of one (3, 3) array, softmax along axis 0
    p.tie(SOFTMAX_BACKWARD, expected=lambda: np.stack([np.ravel(vjp(x, dp)) for x, dp in cols], axis=1),
          points=[()], call=lambda f: f(np.stack([softmax(x) for x, _ in cols], axis=1),
                                        np.stack([np.asarray(dp) for _, dp in cols], axis=1), axis=0),
          reason="axis = 0: each column its own softmax")


# --------------------------------------------------------------------------- 2. attention

def _one_row(S, D, Dv):
    """One query row of attention as symbols: q (D), k (S, D), v (S, Dv), b (S), dO (Dv), scale c;
    returns (symbols, logits, P, O, L = <dO, O>)."""
    q = sp.symbols(f"q0:{D}", real=True)
    k = sp.Matrix(S, D, lambda j, d: sp.Symbol(f"k_{j}{d}", real=True))
    v = sp.Matrix(S, Dv, lambda j, d: sp.Symbol(f"v_{j}{d}", real=True))
    b = sp.symbols(f"b0:{S}", real=True)
    dO = sp.symbols(f"dO0:{Dv}", real=True)
    c = sp.Symbol("c", positive=True)
    logits = [c * sum(q[d] * k[j, d] for d in range(D)) + b[j] for j in range(S)]
    P = _softmax(logits)
    O = [sum(P[j] * v[j, d] for j in range(S)) for d in range(Dv)]
    e = [sp.exp(x) for x in logits]
    L = sp.Add(*[dO[d] * v[j, d] * e[j] for d in range(Dv) for j in range(S)]) / sp.Add(*e)   # sum_d dO_d O_d
    return (q, k, v, b, dO, c), logits, P, O, L


@functools.lru_cache(maxsize=None)
def _row_gradients(S, D=2, Dv=2):
    """sp.diff of one row's <dO, O> w.r.t. q, k, v, b, and the same lambdified (q, k, v, b, dO, c)."""
    (q, k, v, b, dO, c), _, _, _, L = _one_row(S, D, Dv)
    wrt = [list(q), list(k), list(v), list(b)]
    grads = [[sp.diff(L, s) for s in group] for group in wrt]
    f = sp.lambdify((q, list(k), list(v), b, dO, c), [g for group in grads for g in group], "numpy", cse=True)
    return grads, f


def _grads_by_definition(q, k, v, bias, dout, mask, scale):
    """(dq, dk, dv, db (H, T, S)): each row's sp.diff gradient, lambdified; masked logits -inf
    (e^{-inf} = 0: the key drops out of the row's sums); a row with no allowed key has O = 0
    and no gradient. k, v, b are shared by the rows, so their gradients add over rows."""
    H, T, D = q.shape
    S, Dv = v.shape[-2:]
    _, f = _row_gradients(S, D, Dv)
    dq, dk, dv, db = np.zeros(q.shape), np.zeros(k.shape), np.zeros(v.shape), np.zeros((H, T, S))
    allowed = np.ones((T, S), bool) if mask is None else mask
    for h in range(H):
        for t in range(T):
            if not allowed[t].any():
                continue
            g = np.array(f(q[h, t], k[h].ravel(), v[h].ravel(), np.where(allowed[t], bias[h, t], -np.inf),
                           dout[h, t], scale), dtype=float)
            dq[h, t] = g[:D]
            dk[h] += g[D:D + S * D].reshape(S, D)
            dv[h] += g[D + S * D:D + S * D + S * Dv].reshape(S, Dv)
            db[h, t] = g[D + S * D + S * Dv:]
    return dq, dk, dv, db


def _problem(seed, H, T, S, D=2, Dv=2):
    rng = np.random.default_rng(seed)
    return (rng.normal(size=(H, T, D)), rng.normal(size=(H, S, D)), rng.normal(size=(H, S, Dv)),
            rng.normal(size=(H, T, S)), rng.normal(size=(H, T, Dv)))


def _mask(name, T, S):
    """None, the causal mask (query t sees keys s <= t + S - T), or holes with a fully masked row."""
    if name is None:
        return None
    if name == "causal":
        return np.arange(S)[None, :] <= np.arange(T)[:, None] + (S - T)
    rows = np.array([[True, False, True], [False, True, True], [True, True, False]])
    out = np.resize(rows, (T, S)).copy()
    out[0] = False                                                   # a row with no allowed key
    return out


@functools.lru_cache(maxsize=None)
def _dense_case(seed, mask_name, bias_shape, scale, H=2, T=2, S=3):
    """The arrays of one attention_backward point and the gradients by definition, dbias summed
    over the axes the bias was broadcast along (a shared entry gets the sum of its uses)."""
    q, k, v, bias, dout = _problem(seed, H, T, S)
    bias = {"(H, T, S)": bias, "(1, T, S)": bias[:1], "(T, S)": bias[0]}[bias_shape]
    mask = _mask(mask_name, T, S)
    scale_ = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    dq, dk, dv, db = _grads_by_definition(q, k, v, np.broadcast_to(bias, (H, T, S)), dout, mask, scale_)
    lead = db.ndim - bias.ndim                                       # axes the bias was broadcast along
    db = db.sum(axis=tuple(range(lead)))
    db = db.sum(axis=tuple(i for i, n in enumerate(bias.shape) if n == 1), keepdims=True)
    return (q, k, v, bias, dout, mask), (dq, dk, dv, db)


def _blockwise(f, q, k, v, bias, dout, mask, *, scale, block_size, causal, q_offset=None, **extra):
    """Forward with return_lse, then ``f`` (a blockwise backward) with a bias_grad_fn collecting
    dS; returns (dq, dk, dv, dS (H, T, S))."""
    from minipos.attention import blockwise_attention

    q, k, v, bias, dout = (np.array(a) for a in (q, k, v, bias, dout))        # the cached arrays stay intact
    bias_fn = lambda qs, ks: bias[..., qs, ks]                                     # noqa: E731
    mask_fn = None if mask is None else (lambda qs, ks: mask[qs, ks])
    kw = dict(bias_fn=bias_fn, mask_fn=mask_fn, causal=causal, scale=scale, block_size=block_size, q_offset=q_offset)
    out, lse = blockwise_attention(q, k, v, return_lse=True, **kw)
    ds = np.zeros(bias.shape)

    def collect(qs, ks, block):
        ds[..., qs, ks] += block
    dq, dk, dv = f(q, k, v, out, lse, dout, bias_grad_fn=collect, **kw, **extra)
    return dq, dk, dv, ds


@functools.lru_cache(maxsize=None)
def _blockwise_case(seed, block_size, causal, mask_name, scale, T=2, S=3):
    q, k, v, bias, dout = _problem(seed, 2, T, S)
    mask = _mask(mask_name, T, S)
    allowed = mask if not causal else (_mask("causal", T, S) if mask is None else mask & _mask("causal", T, S))
    want = _grads_by_definition(q, k, v, bias, dout, allowed, 1 / np.sqrt(q.shape[-1]) if scale is None else scale)
    return (q, k, v, bias, dout, mask), want


_GRADS = ("dq", "dk", "dv", "dbias")


@theorem("gradients.attention_ds",
         "for O = P V, P = softmax(S) by rows: dS = P * (dP - rowsum(dO * O)) with dP = dO V^T, because "
         "rowsum(dP * P) = rowsum(dO * O); hence dq = scale dS K, dk = scale dS^T Q, dv = P^T dO, dbias = dS",
         checks=(ATTENTION_BACKWARD, BLOCKWISE_BACKWARD, FAST_BLOCKWISE_BACKWARD))
def _(p):
    S, Dv = 3, 2
    s = sp.symbols(f"S0:{S}", real=True)
    V = sp.Matrix(S, Dv, lambda j, d: sp.Symbol(f"V_{j}{d}", real=True))
    dO = sp.symbols(f"dO0:{Dv}", real=True)
    P = _softmax(s)
    dP = [sum(dO[d] * V[j, d] for d in range(Dv)) for j in range(S)]        # dP = dO V^T
    L = sum(dO[d] * sum(P[j] * V[j, d] for j in range(S)) for d in range(Dv))
    (p.derive(sp.Matrix([Derivative(L, sj) for sj in s]),
              "$dS_j = \\partial \\langle dO, O \\rangle / \\partial S_j$: one query row, S = 3 keys, Dv = 2")
      .step(sp.Matrix([sum(dP[i] * Derivative(P[i], s[j]) for i in range(S)) for j in range(S)]),
            "chain rule through $P$: $\\partial \\langle dO, P V \\rangle / \\partial P_i = (dO V^T)_i = dP_i$",
            by=_exps_as_symbols)
      .step(_jacobian(P).T * sp.Matrix(dP), "$\\partial P_i / \\partial S_j = P_i (\\delta_{ij} - P_j)$ "
            "(gradients.softmax_jacobian)", by=_exps_as_symbols))
    ps = sp.symbols(f"P0:{S}", real=True)
    Js = _jacobian(ps)
    O = [sum(ps[j] * V[j, d] for j in range(S)) for d in range(Dv)]        # O = P V
    dPs = sp.Matrix(dP)
    (p.derive(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(Js)), sp.ImmutableMatrix(dPs), evaluate=False),
              "$dS = J^T dP$")
      .step(sp.Matrix([ps[j] * (dP[j] - sum(dP[i] * ps[i] for i in range(S))) for j in range(S)]),
            "$J^T dP = P \\odot (dP - \\mathrm{rowsum}(dP \\odot P))$ (J symmetric)", by="expand")
      .step(sp.Matrix([ps[j] * (dP[j] - sum(dO[d] * O[d] for d in range(Dv))) for j in range(S)]),
            "$\\mathrm{rowsum}(dP \\odot P) = \\mathrm{rowsum}(dO \\odot O)$ (below)", by="expand"))
    (p.derive(sum(sp.Mul(dPs[j], ps[j], evaluate=False) for j in range(S)), "$\\mathrm{rowsum}(dP \\odot P)$")
      .step(sum(ps[j] * dO[d] * V[j, d] for j in range(S) for d in range(Dv)), "$dP_j = \\sum_d dO_d V_{jd}$",
            by="expand")
      .step(sum(dO[d] * O[d] for d in range(Dv)), "$O_d = \\sum_j P_j V_{jd}$: one number per row, "
            "from the stored output", by="expand"))
    _claim_input_gradients(p)
    _tie_attention_backward(p)
    for target in (BLOCKWISE_BACKWARD, FAST_BLOCKWISE_BACKWARD):
        _tie_blockwise_backward(p, target)


def _claim_input_gradients(p):
    """From dS to the inputs: the logits l_j = c q . k_j + b_j are linear in q, k and b, so the
    chain rule multiplies dS by their (constant-coefficient) Jacobians."""
    S, D = 3, 2
    (q, k, _, b, _, c), logits, _, _, _ = _one_row(S, D, 2)
    l = sp.Matrix(logits)
    dS = sp.Matrix(sp.symbols(f"dS0:{S}", real=True))
    (p.derive(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(l.jacobian(q))), sp.ImmutableMatrix(dS), evaluate=False),
              "$dq = (\\partial l / \\partial q)^T dS$, $l_j = c\\, q \\cdot k_j + b_j$ (chain rule), S = 3, D = 2")
      .step(c * k.T * dS, "$= c K^T dS$: $dq = \\mathrm{scale}\\, dS\\, K$ in row form", by="expand"))
    (p.derive(sp.Matrix(S, D, list(l.jacobian(list(k)).T * dS)), "$dK = (\\partial l / \\partial K)^T dS$, "
              "arranged as K")
      .step(c * dS * sp.Matrix([q]), "$= c\\, dS\\, q^T$: $dk = \\mathrm{scale}\\, dS^T Q$, summed over the query rows",
            by="expand", shown=sp.MatMul(c, sp.ImmutableMatrix(dS), sp.ImmutableMatrix([q]), evaluate=False)))
    p.claim(l.jacobian(b).T * dS, dS, "$\\partial l / \\partial b = I$: dbias = dS", by="expand",
            shown=(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(l.jacobian(b))), sp.ImmutableMatrix(dS), evaluate=False),
                   None))


def _tie_attention_backward(p):
    """attention_backward's four gradients against sp.diff of <dO, O>, H = 2, T = 2, S = 3, D = Dv = 2."""
    names = (sp.Symbol("seed"), sp.Symbol("mask"), sp.Symbol("bias_shape"), sp.Symbol("scale"))
    points = [(0, None, "(H, T, S)", None), (1, "causal", "(T, S)", 0.7), (2, "holes", "(1, T, S)", 1.0)]

    runs = {}                                                        # one call per point serves the 4 ties

    def call(i):
        def run(f, *point):
            if (f, point) not in runs:
                (q, k, v, bias, dout, mask), _ = _dense_case(*point)
                q, k, v, bias, dout = (np.array(a) for a in (q, k, v, bias, dout))  # the cached arrays stay intact
                runs[f, point] = f(q, k, v, dout, bias=bias, mask=mask, scale=point[3])
            return runs[f, point][i]
        return run
    for i, g in enumerate(_GRADS):
        p.tie(ATTENTION_BACKWARD, expected=lambda *point, i=i: _dense_case(*point)[1][i], points=points,
              symbols=names, call=call(i), reason=f"{g} = sp.diff of <dO, O>, summed to the bias shape")


def _tie_blockwise_backward(p, target):
    """A blockwise backward (given the forward's out and lse; dS collected through bias_grad_fn)
    against sp.diff of <dO, O>, block sizes that do and do not divide S = 3, causal and not."""
    names = (sp.Symbol("seed"), sp.Symbol("block_size"), sp.Symbol("causal"), sp.Symbol("mask"), sp.Symbol("scale"))
    points = [(0, 1, False, None, None), (0, 2, False, None, 0.7), (1, 2, True, None, 0.7), (1, 3, True, None, None),
              (2, 2, False, "holes", 1.0), (3, 4, True, "holes", 0.5)]

    runs = {}                                                        # one call per point serves the 4 ties

    def call(i):
        def run(f, seed, block, causal, mask_name, scale):
            point = (seed, block, causal, mask_name, scale)
            if (f, point) not in runs:
                (q, k, v, bias, dout, mask), _ = _blockwise_case(*point)
                runs[f, point] = _blockwise(f, q, k, v, bias, dout, mask, scale=scale, block_size=block,
                                            causal=causal)
            return runs[f, point][i]
        return run
    for i, g in enumerate(_GRADS):
        p.tie(target, expected=lambda *point, i=i: _blockwise_case(*point)[1][i], points=points, symbols=names,
              call=call(i), reason=f"{g} (dS through bias_grad_fn) = sp.diff of <dO, O>")


# --------------------------------------------------------------------------- 3. RoPE

@theorem("gradients.rope_transpose",
         "the gradient of x -> f R(m) x is f R(m)^T dy = f R(-m) dy (both layouts; the pass-through "
         "features of partial rotary get dy itself)",
         checks=(ROPE_BACKWARD,))
def _(p):
    m, f = sp.Symbol("m", real=True), sp.Symbol("f", positive=True)
    D = 4
    x, dy = vec("x", D), vec("dy", D)
    for layout, Rl in (("interleaved", R), ("half", R_half)):
        Rm = Rl(m, D)
        (p.derive(sp.Matrix([Derivative((dy.T * Rm * x)[0, 0], xi) for xi in x]),
                  f"$dx = \\nabla_x \\langle dy, R(m) x \\rangle$, {layout} layout, D = 4")
          .step(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(Rm)), sp.ImmutableMatrix(dy), evaluate=False),
                "linear in x: the gradient is $R(m)^T dy$", by="doit")
          .step(sp.MatMul(sp.ImmutableMatrix(Rl(-m, D)), sp.ImmutableMatrix(dy), evaluate=False),
                "$R(m)^T = R(-m)$: cos is even, sin is odd", by="expand"))
    _claim_eq34_adjoint(p, m, D, dy)
    Dp, Rd = 6, 4                          # the half layout differs only in R's block placement (tied below)
    x, dy = vec("x", Dp), vec("dy", Dp)
    Mf = sp.diag(f * R(m, Rd), sp.eye(Dp - Rd))                               # rotate the first 4, pass 2
    (p.derive(sp.Matrix([Derivative((dy.T * Mf * x)[0, 0], xi) for xi in x]),
              "partial rotary (4 of D = 6) with attention factor f, interleaved")
      .step(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(Mf)), sp.ImmutableMatrix(dy), evaluate=False),
            "$\\mathrm{diag}(f R(m), I)^T dy$", by="doit")
      .step(sp.Matrix.vstack(f * R(-m, Rd) * dy[:Rd, :], dy[Rd:, :]),
            "$[f R(-m) dy_{:4};\\ dy_{4:}]$: the pass-through features get dy", by="expand"))
    _tie_rope_backward(p, m, f)


def _claim_eq34_adjoint(p, m, D, dy):
    """The code's form: R(m)^T dy = dy * cos - rot(dy) * sin (the adjoint of rot is -rot)."""
    th = thetas(D)
    inter = (list(sp.Matrix([-dy[1], dy[0], -dy[3], dy[2]])), [t for t in th for _ in (0, 1)], R)
    half = (list(sp.Matrix([-dy[2], -dy[3], dy[0], dy[1]])), th * 2, R_half)
    for layout, (rot, ang, Rl) in (("interleaved", inter), ("half", half)):
        cos = sp.Matrix([sp.cos(m * t) for t in ang])
        sin = sp.Matrix([sp.sin(m * t) for t in ang])
        p.claim(Rl(m, D).T * dy, dy.multiply_elementwise(cos) - sp.Matrix(rot).multiply_elementwise(sin),
                f"{layout}: $R(m)^T dy = dy \\odot \\cos m\\Theta - \\mathrm{{rot}}(dy) \\odot \\sin m\\Theta$ "
                "(rot is antisymmetric: its adjoint is $-$rot)", by="expand",
                shown=(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(Rl(m, D))), sp.ImmutableMatrix(dy), evaluate=False),
                       None))


def _tie_rope_backward(p, m, f):
    rng = np.random.default_rng(21)
    for layout, Rl in (("interleaved", R), ("half", R_half)):
        D = 8
        dy = vec("dy", D)
        pts = [(mm, *rng.normal(size=D)) for mm in (0, 5, 4097, -3)]
        p.tie(ROPE_BACKWARD, expected=Rl(m, D, 10000).T * dy, symbols=(m, *dy), points=pts,
              call=lambda fn, mm, *g: fn(np.array([g]), [mm], layout=layout)[0][:, None],
              reason=f"R(m)^T dy, {layout}, D = 8")
        D, Rd = 6, 4
        dy = vec("dy", D)
        want = sp.diag(f * Rl(m, Rd, 10000), sp.eye(D - Rd)).T * dy
        pts = [(mm, ff, *rng.normal(size=D)) for mm, ff in ((0, 1.0), (7, 1.5), (4097, 0.8))]
        p.tie(ROPE_BACKWARD, expected=want, symbols=(m, f, *dy), points=pts,
              call=lambda fn, mm, ff, *g: fn(np.array([g]), [mm], layout=layout, rotary_dim=Rd,
                                             attention_factor=ff)[0][:, None],
              reason=f"[f R(m)^T dy_rot; dy_pass], rotary_dim = 4 of D = 6, {layout}")
    D = 4
    rows = np.random.default_rng(22).normal(size=(2, 3, D))          # (B, T, D): positions by row
    positions = [0, 9, 4097]
    lam = sp.lambdify((m, *vec("dy", D)), R(m, D, 10000).T * vec("dy", D), "numpy")
    p.tie(ROPE_BACKWARD, points=[()],
          expected=lambda: np.array([[np.ravel(lam(mm, *g)) for mm, g in zip(positions, b)] for b in rows]),
          call=lambda fn: fn(rows, positions), reason="(B, T, D): row t rotated back by its position")


# --------------------------------------------------------------------------- 4. relative shift

def _shift_by_trick(x):
    """The pad-reshape-slice of the reference _rel_shift, on a SymPy (T, S) matrix."""
    T, S = x.shape
    flat = [e for i in range(T) for e in [sp.Integer(0), *x.row(i)]]   # [0 | x], (T, S + 1), flat
    return sp.Matrix(T, S, flat[T:])                                  # drop the first T, view (T, S)


def _adjoint_formula(y):
    """Π^T y in closed form: x[a, c] is read at (a, c + a + 1 - T) when c >= T - 1 - a (the causal
    entries), else at (a - 1, c + a + M + 1) beyond the pad (a >= 1), else never (row 0)."""
    T, S = y.shape
    M = S - T

    def entry(a, c):
        if c >= T - 1 - a:
            return y[a, c + a + 1 - T]
        return y[a - 1, c + a + M + 1] if a >= 1 else sp.Integer(0)
    return sp.Matrix(T, S, entry)


def _inner(a, b):
    return sp.Matrix([[sum(a.multiply_elementwise(b))]])


@theorem("gradients.rel_shift_adjoint",
         "the relative shift is a 0/1 selection vec(rel_shift(x)) = Π vec(x); its adjoint is Π^T: "
         "<rel_shift(x), y> = <x, rel_shift_backward(y)>",
         checks=(REL_SHIFT, REL_SHIFT_BACKWARD))
def _(p):
    for size in p.cases(T_M=[(2, 1), (3, 0), (3, 2), (1, 2)]):
        T, M = size
        S = T + M
        x = sp.Matrix(T, S, lambda i, j: sp.Symbol(f"x_{i}{j}", real=True))
        y = sp.Matrix(T, S, lambda i, j: sp.Symbol(f"y_{i}{j}", real=True))
        vx, vy = sp.Matrix(list(x)), sp.Matrix(list(y))
        out = _shift_by_trick(x)
        Pi = sp.Matrix(list(out)).jacobian(list(x))
        p.require(all(e in (0, 1) for e in Pi) and all(sum(Pi.row(r)) <= 1 for r in range(T * S))
                  and all(sum(Pi.col(c)) <= 1 for c in range(T * S)),
                  "Π is 0/1 with at most one 1 per row and column: each output copies at most one input")
        p.claim(sp.Matrix(list(out)), sp.MatMul(sp.ImmutableMatrix(Pi), sp.ImmutableMatrix(vx), evaluate=False),
                "$\\mathrm{vec}(\\mathrm{rel\\_shift}(x)) = \\Pi\\, \\mathrm{vec}(x)$, "
                "$\\Pi = \\partial \\mathrm{vec}(\\mathrm{out}) / \\partial \\mathrm{vec}(x)$: linear", by="expand")
        (p.derive(_inner(out, y), "$\\langle \\mathrm{rel\\_shift}(x), y \\rangle$")
          .step(sp.MatMul(sp.ImmutableMatrix(vx.T), sp.ImmutableMatrix(Pi.T), sp.ImmutableMatrix(vy), evaluate=False),
                "$(\\Pi x) \\cdot y = x \\cdot (\\Pi^T y)$", by="expand")
          .step(_inner(x, _adjoint_formula(y)),
                "$(\\Pi^T y)_{a, c} = y_{a, c + a + 1 - T}$ for $c \\geq T - 1 - a$, "
                "$y_{a - 1, c + a + M + 1}$ for $a \\geq 1$ otherwise, else 0", by="expand"))
        p.claim(Pi.T * vy, sp.Matrix(list(_adjoint_formula(y))), "every entry of $\\Pi^T y$", by="expand",
                shown=(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(Pi)), sp.ImmutableMatrix(vy), evaluate=False), None))
        _tie_rel_shift(p, T, S, x, y, vx, Pi)


def _tie_rel_shift(p, T, S, x, y, vx, Pi):
    rng = np.random.default_rng(30 + T * 7 + S)
    batch = rng.normal(size=(2, T, S))
    shift = sp.lambdify(list(x), (Pi * vx).reshape(T, S), "numpy")
    adjoint = sp.lambdify(list(y), _adjoint_formula(y), "numpy")
    p.tie(REL_SHIFT, expected=lambda: np.stack([shift(*b.ravel()) for b in batch]), points=[()],
          call=lambda f: f(batch), reason=f"rel_shift(x) = Π x, (2, T, S) = (2, {T}, {S})")
    p.tie(REL_SHIFT_BACKWARD, expected=lambda: np.stack([adjoint(*b.ravel()) for b in batch]), points=[()],
          call=lambda f: f(batch), reason=f"rel_shift_backward(y) = Π^T y, (2, T, S) = (2, {T}, {S})")


# --------------------------------------------------------------------------- 5. T5 table

def _at(exprs, syms, values):
    """The SymPy matrix ``exprs`` at ``syms = values``, as floats."""
    return np.array(exprs.xreplace(dict(zip(syms, map(sp.Float, np.ravel(values))))), dtype=float)


@functools.lru_cache(maxsize=None)
def _t5_gradient(q_pos, k_pos, H, bidirectional, K, M):
    """sp.diff of <dbias, bias> w.r.t. each table entry, bias[h, t, s] = table[b(k_s - q_t), h]
    with the math's bucket b (proofs.t5) (0 for an entry L does not contain); returns
    (table, dbias, buckets, L, gradient (K, H))."""
    T, S = len(q_pos), len(k_pos)
    table = sp.Matrix(K, H, lambda b, h: sp.Symbol(f"w_{{{b},{h}}}", real=True))
    dbias = [sp.Matrix(T, S, lambda t, s, h=h: sp.Symbol(f"g_{{{h},{t},{s}}}", real=True)) for h in range(H)]
    buckets = [[_bucket(k - q, bidirectional, K, M) for k in k_pos] for q in q_pos]
    L = sp.Add(*[dbias[h][t, s] * table[buckets[t][s], h] for h in range(H) for t in range(T) for s in range(S)])
    used = L.free_symbols
    return table, dbias, buckets, L, table.applyfunc(lambda w: sp.diff(L, w) if w in used else sp.Integer(0))


@theorem("gradients.t5_table",
         "for bias[h, t, s] = table[b(t, s), h]: d<dbias, bias>/d table[b, h] = the sum of dbias[h, t, s] "
         "over the pairs (t, s) in bucket b",
         checks=(T5_BACKWARD,))
def _(p):
    q_pos, k_pos, H, K, M = (0, 5), (0, 2, 3, 9), 1, 8, 16   # 8 buckets, max distance 16, bidirectional
    table, dbias, buckets, L, _ = _t5_gradient(q_pos, k_pos, H, True, K, M)    # one head: heads are independent
    T, S = len(q_pos), len(k_pos)
    by_bucket = sp.Matrix(K, H, lambda b, h: sp.Add(*[dbias[h][t, s] for t in range(T) for s in range(S)
                                                      if buckets[t][s] == b]))
    p.require(sorted(sum(buckets, [])) == [0, 2, 2, 2, 6, 6, 6, 7],
              "the pairs' buckets (8 buckets, max distance 16): |n| = 2, 3, 5 share log bucket 2, "
              "n = 2, 3, 4 bucket 6", f"{buckets}")
    (p.derive(sp.Matrix(K, H, lambda b, h: Derivative(L, table[b, h])),
              "$\\partial \\langle dbias, bias \\rangle / \\partial\\, table_{b, h}$, queries at 0, 5, keys at "
              "0, 2, 3, 9, one head")
      .step(by_bucket, "$bias_{h,t,s} = table_{b(t,s), h}$: each pair contributes its dbias to its own bucket, "
            "0 to the others (buckets 1, 3, 4, 5 hold no pair)", by="doit"))
    p.claim(sum(by_bucket), sum(sum(g) for g in dbias), "the scatter-add loses nothing: the buckets' sums "
            "add up to the sum of dbias", by="expand",
            shown=(sp.MatMul(sp.ImmutableMatrix(sp.ones(1, K)), sp.ImmutableMatrix(by_bucket), evaluate=False), None))
    _tie_t5(p)


def _tie_t5(p):
    """t5_bias_backward against the symbolic gradient: the T5 default config (n = -11 … -9 share
    bucket 8, n = 49 … 60 bucket 29, ...), causal 32/128 (n = -42, -41 share bucket 23), and the small
    config above with two heads; a batch is summed."""
    cases = [((0, 3, 20, 40, 61), (0, 9, 10, 11, 30, 52, 60, 75), True, 32, 128, 1),
             ((30, 41, 52), (0, 10, 11, 29, 40), False, 32, 128, 1),
             ((0, 5), (0, 2, 3, 9), True, 8, 16, 2)]
    names = (sp.Symbol("seed"), sp.Symbol("case"), sp.Symbol("batch"))

    def dbias(seed, case, batch):
        q_pos, k_pos, *_, H = cases[case]
        return np.random.default_rng(seed).normal(size=(batch, H, len(q_pos), len(k_pos)))

    def expected(seed, case, batch):
        q_pos, k_pos, bidirectional, K, M, H = cases[case]
        _, syms, _, _, grad = _t5_gradient(q_pos, k_pos, H, bidirectional, K, M)
        syms = [s for g in syms for s in g]
        return sum(_at(grad, syms, d) for d in dbias(seed, case, batch))      # the table is shared: sum

    def call(f, seed, case, batch):
        q_pos, k_pos, bidirectional, K, M, _ = cases[case]
        d = dbias(seed, case, batch)
        return f(d if batch > 1 else d[0], np.array(q_pos), np.array(k_pos), bidirectional=bidirectional,
                 num_buckets=K, max_distance=M)
    p.tie(T5_BACKWARD, expected=expected, call=call, symbols=names,
          points=[(0, 0, 1), (1, 0, 3), (2, 1, 1), (3, 2, 1), (4, 2, 2)],
          reason="dtable = the per-bucket sum of dbias")


# --------------------------------------------------------------------------- 6. blockwise order

def _merged_lse(s, split, refs, m):
    """lse = m + ln l after merging the blocks' (l_B, m_B) of ``split`` with references ``refs``."""
    blocks = [s[a:b] for a, b in zip((0, *np.cumsum(split)[:-1]), np.cumsum(split))]
    l = sum(sum(sp.exp(x - mB) for x in blk) * sp.exp(mB - m) for blk, mB in zip(blocks, refs))
    return m + sp.log(l), blocks


@theorem("gradients.online_softmax_backward_order",
         "the blockwise backward does not depend on the block split or order: P_ij = exp(S_ij - lse_i) is "
         "the full-row softmax restricted to block j whatever the split, and dQ, dK, dV are sums of "
         "per-block terms",
         checks=(BLOCKWISE_BACKWARD, FAST_BLOCKWISE_BACKWARD))
def _(p):
    S = 3
    s = sp.symbols(f"S0:{S}", real=True)
    dP = sp.symbols(f"dP0:{S}", real=True)
    Kk = sp.Matrix(S, 2, lambda j, d: sp.Symbol(f"K_{j}{d}", real=True))
    Di, c, m = sp.Symbol("D_i", real=True), sp.Symbol("c", positive=True), sp.Symbol("m", real=True)
    P = _softmax(s)
    for split in p.cases(split=[(1, 2), (2, 1)]):
        refs = sp.symbols("m_A m_B", real=True)
        lse, blocks = _merged_lse(s, split, refs, m)
        (p.derive(sp.exp(lse), "$e^{lse}$, $lse = m + \\ln(l_A e^{m_A - m} + l_B e^{m_B - m})$, "
                  "$l_B = \\sum_{j \\in B} e^{S_j - m_B}$, any references $m_A, m_B, m$")
          .step(sp.Add(*[sp.exp(x) for x in s]), "the references cancel: the full row's sum", by="expand"))
        Pb = [sp.exp(s[j] - lse) for j in range(S)]
        p.claim(sp.Matrix(Pb), sp.Matrix(P), "$P_{ij} = e^{S_{ij} - lse_i}$ is the full-row softmax, "
                "restricted to each block", by="cancel")
        starts = np.cumsum((0, *split))
        per_block = [sum((c * Pb[j] * (dP[j] - Di) * Kk.row(j) for j in range(a, b)), sp.zeros(1, 2))
                     for a, b in zip(starts[:-1], starts[1:])]
        (p.derive(sp.Add(*reversed(per_block)), "$dQ_i = \\sum_B c\\, dS_{iB} K_B$, blocks in reverse order, "
                  "$dS_{ij} = P_{ij}(dP_{ij} - D_i)$")
          .step(c * sp.Matrix([[P[j] * (dP[j] - Di) for j in range(S)]]) * Kk,
                "$= c\\, dS_i K$, the full row: the split and the order do not matter", by="cancel"))
    blockD = P[0] * dP[0]                                              # the block {0}'s own rowsum(dP * P)
    fullD = sum(P[j] * dP[j] for j in range(S))
    p.refute(P[0] * (dP[0] - blockD), P[0] * (dP[0] - fullD), {s[0]: 0, s[1]: 0, s[2]: 0, dP[0]: 0, dP[1]: 1, dP[2]: 0},
             "$D_i$ must be the whole row's, not the block's $\\mathrm{rowsum}(dP_{iB} \\odot P_{iB})$")
    p.refute(sp.exp(s[1]) / (sp.exp(s[1]) + sp.exp(s[2])), P[1], {s[0]: 0, s[1]: 0, s[2]: 0},
             "P normalised within the block {1, 2} is not the row's softmax restricted to it")
    T = 2
    Pr = [_softmax([sp.Symbol(f"S_{t}{j}", real=True) for j in range(S)]) for t in range(T)]
    dO = sp.Matrix(T, 2, lambda t, d: sp.Symbol(f"dO_{t}{d}", real=True))
    (p.derive(sum((sp.Matrix([Pr[t]]).T * dO.row(t) for t in range(T)), sp.zeros(S, 2)),
              "$dV = \\sum_i P_i^T dO_i$ over query blocks {0}, {1}, each row with its own lse",
              shown=sp.MatAdd(*[sp.MatMul(sp.Transpose(sp.ImmutableMatrix([Pr[t]])), sp.ImmutableMatrix(dO.row(t)),
                                          evaluate=False) for t in range(T)], evaluate=False))
      .step(sp.Matrix([Pr[0], Pr[1]]).T * dO, "$= P^T dO$", by="expand",
            shown=sp.MatMul(sp.Transpose(sp.ImmutableMatrix([Pr[0], Pr[1]])), sp.ImmutableMatrix(dO), evaluate=False)))
    _tie_order_symbolic(p)
    _tie_order_sizes(p)


def _tie_order_symbolic(p):
    """T = 4 queries, S = 3 keys, causal with q_offset S - T = -1 (query 0 sees no key): every block
    size against sp.diff of <dO, O>."""
    names = (sp.Symbol("seed"), sp.Symbol("block_size"), sp.Symbol("causal"))
    points = [(5, b, causal) for causal in (False, True) for b in (1, 2, 3, 4)]

    def case(seed, block, causal):
        return _blockwise_case(seed, block, causal, None, 0.6, T=4, S=3)
    for target in (BLOCKWISE_BACKWARD, FAST_BLOCKWISE_BACKWARD):
        def run(f, seed, block, causal):
            (q, k, v, bias, dout, mask), _ = case(seed, block, causal)
            return np.concatenate([np.ravel(g) for g in _blockwise(f, q, k, v, bias, dout, mask, scale=0.6,
                                                                   block_size=block, causal=causal)])
        p.tie(target, expected=lambda *pt: np.concatenate([np.ravel(g) for g in case(*pt)[1]]), points=points,
              symbols=names, call=run, reason="(dq, dk, dv, dS) = sp.diff of <dO, O>, T = 4, S = 3")


def _tie_order_sizes(p):
    """H = 2, T = 5, S = 7: every block size (and, for the fast form, thread count) gives the
    one-block result, causal with several q_offset, a mask_fn and a bias_fn."""
    q, k, v, bias, dout = _problem(9, 2, 5, 7, D=3)
    holes = np.resize(np.array([True, True, False]), (5, 7))
    names = (sp.Symbol("block_size"), sp.Symbol("causal"), sp.Symbol("q_offset"), sp.Symbol("mask"),
             sp.Symbol("workers"))

    def grads(f, block, causal, q_offset, masked, workers):
        extra = {} if workers is None else {"workers": workers}
        g = _blockwise(f, q, k, v, bias, dout, holes if masked else None, scale=0.5, block_size=block,
                       causal=causal, q_offset=q_offset, **extra)
        return np.concatenate([np.ravel(a) for a in g])
    for target, workers in ((BLOCKWISE_BACKWARD, None), (FAST_BLOCKWISE_BACKWARD, 3)):
        one_block = {}

        def expected(b, causal, off, masked, w, target=target):   # the same call with a single block
            if (causal, off, masked) not in one_block:
                one_block[causal, off, masked] = grads(_code(target), 7, causal, off, masked, None)
            return one_block[causal, off, masked]
        points = [(b, causal, off, masked, workers) for b in (1, 2, 3, 6) for causal, off, masked in
                  ((False, None, False), (True, None, True), (True, 0, False), (True, 4, True))]
        p.tie(target, expected=expected, points=points, symbols=names, call=grads,
              reason="every block size (and thread count) gives the one-block (dq, dk, dv, dS), T = 5, S = 7")


# --------------------------------------------------------------------------- 7. ALiBi

@functools.lru_cache(maxsize=None)
def _alibi_gradient(q_pos, k_pos, H, symmetric):
    T, S = len(q_pos), len(k_pos)
    slopes = sp.symbols(f"m0:{H}", real=True)
    dbias = [sp.Matrix(T, S, lambda t, s, h=h: sp.Symbol(f"g_{{{h},{t},{s}}}", real=True)) for h in range(H)]
    r = sp.Matrix(T, S, lambda t, s: -abs(q_pos[t] - k_pos[s]) if symmetric else k_pos[s] - q_pos[t])
    L = sum(dbias[h][t, s] * slopes[h] * r[t, s] for h in range(H) for t in range(T) for s in range(S))
    return slopes, dbias, r, L, sp.Matrix([sp.diff(L, mh) for mh in slopes])


@theorem("gradients.alibi_slopes",
         "d<dbias, m_h r>/dm_h = sum dbias r (r = j - i, or -|i - j| symmetric); the rows of dS sum to 0, so "
         "the key-only r = j gets the same slope gradient",
         checks=(ALIBI_BACKWARD, ATTENTION_BACKWARD))
def _(p):
    q_pos, k_pos, H = (2, 3), (0, 1, 2, 3), 2
    for symmetric in p.cases(symmetric=[False, True]):
        slopes, dbias, r, L, _ = _alibi_gradient(q_pos, k_pos, H, symmetric)
        (p.derive(sp.Matrix([Derivative(L, mh) for mh in slopes]),
                  "$\\partial \\langle dbias, bias \\rangle / \\partial m_h$, $bias_{h,t,s} = m_h r_{ts}$, queries at "
                  "2, 3, keys at 0 … 3")
          .step(sp.Matrix([sum(dbias[h].multiply_elementwise(r)) for h in range(H)]),
                "$dm_h = \\sum_{t,s} dbias_{h,t,s} r_{ts}$", by="doit"))
    T, S = len(q_pos), len(k_pos)
    dS = sp.Matrix(T, S, lambda t, s: sp.Symbol(f"dS_{t}{s}", real=True))
    rowsum_zero = {dS[t, S - 1]: -sum(dS[t, s] for s in range(S - 1)) for t in range(T)}
    key_only = sum(dS[t, s] * k_pos[s] for t in range(T) for s in range(S))
    (p.derive(sp.Add(key_only, -sum(dS[t, s] * (k_pos[s] - q_pos[t]) for t in range(T) for s in range(S)),
                     evaluate=False),
              "$\\sum_{t,s} dS_{ts}\\, j_s - \\sum_{t,s} dS_{ts} (j_s - i_t)$: the key-only form $+m j$ against "
              "$-m (i - j)$, queries at 2, 3")
      .step(sum(q_pos[t] * sum(dS.row(t)) for t in range(T)), "$= \\sum_t i_t \\sum_s dS_{ts}$", by="expand")
      .step(sp.Integer(0), "$\\sum_s dS_{ts} = 0$: the entries of a softmax VJP sum to 0 "
            "(gradients.softmax_jacobian)", using=rowsum_zero, by="expand"))
    _tie_alibi(p, q_pos, k_pos, H)


def _tie_alibi(p, q_pos, k_pos, H):
    names = (sp.Symbol("seed"), sp.Symbol("symmetric"), sp.Symbol("batch"))

    def dbias(seed, batch):
        return np.random.default_rng(seed).normal(size=(batch, H, len(q_pos), len(k_pos)))

    def expected(seed, symmetric, batch):
        _, syms, _, _, grad = _alibi_gradient(q_pos, k_pos, H, symmetric)
        syms = [s for g in syms for s in g]
        return sum(np.ravel(_at(grad, syms, d)) for d in dbias(seed, batch))    # the slopes are shared: sum

    def call(f, seed, symmetric, batch):
        d = dbias(seed, batch)
        return f(d if batch > 1 else d[0], np.array(q_pos), np.array(k_pos), symmetric=symmetric)
    p.tie(ALIBI_BACKWARD, expected=expected, call=call, symbols=names,
          points=[(0, False, 1), (1, True, 1), (2, False, 3)], reason="dm_h = sum dbias r")

    from minipos.alibi import alibi_bias
    q, k, v, _, dout = _problem(40, H, len(q_pos), len(k_pos))
    slopes = np.array([0.5, 0.25])
    causal = np.array(k_pos)[None, :] <= np.array(q_pos)[:, None]
    dS = _code(ATTENTION_BACKWARD)(q, k, v, dout, bias=alibi_bias(slopes, q_pos, k_pos), mask=causal)[3]
    p.tie(ALIBI_BACKWARD, expected=lambda: np.einsum("hts,s->h", dS, np.array(k_pos, float)), points=[()],
          call=lambda f: f(dS, np.array(q_pos), np.array(k_pos)),
          reason="through attention (dS from attention_backward), dm is the key-only form's sum dS j")
