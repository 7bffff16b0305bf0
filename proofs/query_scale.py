r"""The query scale of ``llama_4_scaling_beta`` (Ministral 3, Mistral 4) on top of RoPE.

transformers 5.24's ``get_llama_4_attn_scale`` (``models/ministral3/modeling_ministral3.py``) multiplies the
rotated query at position p by

    s(p) = 1 + β ln(1 + ⌊p / L⌋),        L = rope_parameters['original_max_position_embeddings'],

and leaves the keys alone (``minipos.query_scale``). What the page relies on:

- the scale is a staircase: with p = qL + r, 0 <= r < L, s(p) = 1 + β ln(1 + q); so s = 1 below L, and at
  p = kL it is 1 + β ln(1 + k), growing like β ln(p / L). It counts p, not Llama 4's i + 1: p = L - 1 is not
  scaled (Llama 4's temperature scales it);
- the score is RoPE's times the query's scale, <s(m) R(m) q, R(n) k> = s(m) q^T R(n - m) k: relative in the
  rotation, but a common shift changes s(m) once it crosses a step, so the layer is not shift-invariant
  (it is RoPE while every query position is below L); s(m) is one number per row, so it commutes with R(m);
- the backward: the scale is diagonal, so its vector-Jacobian product is s(p) dy, and the rotate seam's
  backward is R(m)^T s(m) dy.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minipos import query_scale as code
from minipos import rope as rope_code
from minipos.layer import MultiHeadAttention

from .core import theorem
from .rope import B, B_shown, R_half

SCALE = "minipos.query_scale.llama4_query_scale"
APPLY = "minipos.query_scale.apply_query_scale"
BACKWARD = "minipos.query_scale.apply_query_scale_backward"
SCHEME = "minipos.query_scale.ScaledQueryRotary"
beta = sp.Symbol("beta", nonnegative=True)
L = sp.Symbol("L", integer=True, positive=True)
p_, q_, r_, k_ = sp.symbols("p q r k", integer=True, nonnegative=True)
m, n, t, c = sp.symbols("m n theta c", real=True)
s = sp.Symbol("s", positive=True)


def scale(pos, b_=beta, L_=L):
    """s(pos) = 1 + β ln(1 + ⌊pos / L⌋), HF's get_llama_4_attn_scale."""
    return 1 + b_ * sp.log(1 + sp.floor(pos / L_))


def _bound(beta_v, L_v, D=4):
    """A ScaledQueryRotary (half layout, HF's) bound to a one-head layer of head dim D."""
    scheme = code.ScaledQueryRotary(beta=beta_v, original_max_position_embeddings=L_v, layout="half")
    MultiHeadAttention(D, 1, scheme=scheme)
    return scheme


@theorem("query_scale.steps",
         "s(p) = 1 + β ln(1 + ⌊p/L⌋) is a staircase: s(qL + r) = 1 + β ln(1 + q) for 0 <= r < L, so s = 1 for "
         "p < L and s(kL) = 1 + β ln(1 + k); it counts p, so p = L - 1 is unscaled (Llama 4's i + 1 scales it)",
         checks=(SCALE,))
def _(p):
    (p.derive(scale(q_ * L + r_), "$p = qL + r$, $0 \\le r < L$",
              shown="1 + \\beta \\ln(1 + \\lfloor (qL + r) / L \\rfloor)")
      .step(1 + beta * sp.log(1 + q_ + sp.floor(r_ / L)), "$\\lfloor q + x \\rfloor = q + \\lfloor x \\rfloor$ for an "
            "integer $q$", by="expand", shown="1 + \\beta \\ln(1 + q + \\lfloor r / L \\rfloor)")
      .step(1 + beta * sp.log(1 + q_), "$0 \\le r < L$: $\\lfloor r / L \\rfloor = 0$", using={sp.floor(r_ / L): 0},
            shown="1 + \\beta \\ln(1 + q)")
      .step(sp.Integer(1), "below $L$: $q = 0$, $\\ln 1 = 0$", using={q_: 0}))
    (p.derive(scale(k_ * L), "the $k$-th step, $p = kL$", shown="1 + \\beta \\ln(1 + \\lfloor kL / L \\rfloor)")
      .step(1 + beta * sp.log(1 + k_), "$\\lfloor k \\rfloor = k$", by="simplify", shown="1 + \\beta \\ln(1 + k)"))
    p.refute(scale(L - 1), 1 + beta * sp.log(1 + sp.floor((L - 1 + 1) / L)), {beta: sp.Rational(1, 10), L: 4},
             "Llama 4's rule counts $i + 1$: at $p = L - 1$ it gives $1 + \\beta \\ln 2$, this one $1$")
    points = [(0, 0.1, 16384), (16383, 0.1, 16384), (16384, 0.1, 16384), (32767, 0.1, 16384), (49152, 0.1, 16384),
              (3, 1.0, 4), (4, 1.0, 4), (5, 0.5, 2), (10 ** 9 + 6, 0.3, 7), (123456, 0.0, 1)]
    p.tie(SCALE, expected=scale(p_), symbols=(p_, beta, L), points=points,
          call=lambda f, pos, b_, L_: f([pos], beta=b_, original_max_position_embeddings=L_)[0],
          rtol=1e-15, atol=0.0, reason="s(p) = 1 + β ln(1 + ⌊p/L⌋), Ministral 3's β = 0.1 and L = 16384 among them")
    steps = code.llama4_query_scale(np.arange(40), beta=0.25, original_max_position_embeddings=8)
    p.require(np.all(steps[:8] == 1.0) and all(np.all(steps[8 * j:8 * j + 8] == steps[8 * j]) for j in range(5))
              and np.all(np.diff(steps[::8]) > 0),
              "llama4_query_scale, L = 8: exactly 1 for p < 8, constant on each [8j, 8j + 8), rising from step to step")


@theorem("query_scale.score",
         "<s(m) R(m) q, R(n) k> = s(m) q^T R(n - m) k: RoPE's score times the query's scale, relative in the "
         "rotation but not shift-invariant once a shift crosses a step; s(m) commutes with R(m)",
         checks=(APPLY, SCHEME))
def _(p):
    qv, kv = sp.Matrix(sp.symbols("q0:2", real=True)), sp.Matrix(sp.symbols("k0:2", real=True))
    (p.derive(B(m * t) * (s * qv), "scaling before the rotation", shown="B(m\\theta)\\,(s\\, q)")
      .step(s * (B(m * t) * qv), "$s$ is one number per row: scaling after it is the same",
            shown="s\\, B(m\\theta)\\, q"))
    (p.derive(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(s * B(m * t))), B(n * t), evaluate=False),
              "one pair, $\\theta$ its frequency: the scaled rotated query against the rotated key",
              shown="(s\\, B(m\\theta))^\\top B(n\\theta)")
      .step(s * B_shown(-m * t) * B(n * t), "$(sB)^\\top = s B^\\top$, $B(a)^\\top = B(-a)$",
            shown="s\\, B(-m\\theta)\\, B(n\\theta)")
      .step(s * B((n - m) * t), "$B(a) B(b) = B(a + b)$ (proof rope.relative.transpose_left)", by="trig",
            shown="s\\, B((n - m)\\theta)"))
    p.refute(scale(m + c), scale(m), {beta: sp.Rational(1, 10), L: 4, m: 3, c: 1},
             "a shift by $c = 1$ from $m = 3$ crosses the step at $L = 4$: $s(4) = 1 + \\beta \\ln 2 \\ne s(3) = 1$, "
             "so the score at $(m + c, n + c)$ is not the score at $(m, n)$")
    rng = np.random.default_rng(7)
    qn, kn = rng.normal(size=4), rng.normal(size=4)
    bv, Lv = 0.25, 3
    want = scale(m, sp.Rational(1, 4), Lv) * (sp.Matrix(qn).T * R_half(n - m, 4, 10000) * sp.Matrix(kn))[0, 0]
    points = [(0, 0), (2, 5), (3, 1), (7, 7), (40, 2), (100, 4099)]
    p.tie(APPLY, expected=want, symbols=(m, n), points=points,
          call=lambda f, mv, nv: (f(rope_code.apply_rope(qn[None], [mv], layout="half"), [mv], beta=bv,
                                    original_max_position_embeddings=Lv)[0]
                                  @ rope_code.apply_rope(kn[None], [nv], layout="half")[0]),
          rtol=1e-12, reason="apply_query_scale after apply_rope (half, D = 4, β = 1/4, L = 3): s(m) q^T R(n - m) k")

    def scheme_score(cls, mv, nv):
        scheme = _bound(bv, Lv)
        assert isinstance(scheme, cls)
        seq = max(mv, nv) + 1
        rq = scheme.rotate_q(qn[None, None, None], [mv], seq_len=seq)[0, 0, 0]
        return rq @ scheme.rotate_k(kn[None, None, None], [nv], seq_len=seq)[0, 0, 0]
    p.tie(SCHEME, expected=want, symbols=(m, n), points=points, call=scheme_score, rtol=1e-12,
          reason="ScaledQueryRotary's rotate_q . rotate_k: s(m) q^T R(n - m) k, keys unscaled")
    scheme, x = _bound(bv, Lv), rng.normal(size=(1, 1, 3, 4))
    below = np.arange(3)                                                 # every query position < L = 3
    p.require(np.array_equal(scheme.rotate_q(x, below, seq_len=3), rope_code.apply_rope(x, below, layout="half")),
              "ScaledQueryRotary, L = 3: queries at positions below L are RoPE's bit for bit (s = 1): the layer is "
              "RoPE, and shift-invariant, while every query position stays below L")


@theorem("query_scale.backward",
         "the scale is diagonal: ∂<s q, dy>/∂q = s dy, and the rotate seam's backward is (s R(m))^T dy = s R(-m) dy",
         checks=(BACKWARD, SCHEME))
def _(p):
    qv, dv = sp.Matrix(sp.symbols("q0:2", real=True)), sp.Matrix(sp.symbols("dy0:2", real=True))
    inner = (s * qv).dot(dv)
    (p.derive(sp.Matrix([sp.Derivative(inner, v) for v in qv]), "the gradient of $\\langle s q, dy\\rangle$ in $q$",
              shown="\\nabla_q \\langle s\\, q, dy \\rangle")
      .step(s * dv, "each output row is $s$ times its input row", by="doit", shown="s\\, dy"))
    (p.derive(sp.MatMul(sp.Transpose(sp.ImmutableMatrix(s * B(m * t))), dv, evaluate=False),
              "the vector-Jacobian product of $q \\mapsto s B(m\\theta) q$", shown="(s\\, B(m\\theta))^\\top dy")
      .step(s * (B(-m * t) * dv), "$B(a)^\\top = B(-a)$", by="trig", shown="s\\, B(-m\\theta)\\, dy"))
    rng = np.random.default_rng(8)
    dy = rng.normal(size=(2, 6, 4))                                      # (H, T, D)
    pos = np.array([0, 2, 3, 5, 9, 20])
    p.tie(BACKWARD, expected=lambda bv, Lv: np.array([float(scale(int(v), sp.Float(bv), Lv)) for v in pos])[:, None] * dy,
          points=[(0.1, 3), (0.5, 1), (0.0, 2)],
          call=lambda f, bv, Lv: f(dy, pos, beta=bv, original_max_position_embeddings=Lv),
          rtol=1e-14, reason="s(p) dy, row by row")
    dn = rng.normal(size=4)
    want = scale(m, sp.Rational(1, 4), 3) * (R_half(m, 4, 10000).T * sp.Matrix(dn))
    p.tie(SCHEME, expected=want, symbols=(m,), points=[(0,), (2,), (3,), (8,), (300,)],
          call=lambda cls, mv: _bound(0.25, 3).rotate_q_backward(dn[None, None, None], [mv], seq_len=mv + 1)[0, 0, 0][:, None],
          rtol=1e-12, reason="ScaledQueryRotary.rotate_q_backward: s(m) R(m)^T dy (half, D = 4, β = 1/4, L = 3)")
    scheme, x, g = _bound(0.1, 2), rng.normal(size=(1, 1, 7, 4)), rng.normal(size=(1, 1, 7, 4))
    at = np.arange(7)
    lhs = np.sum(scheme.rotate_q(x, at, seq_len=7) * g)
    rhs = np.sum(x * scheme.rotate_q_backward(g, at, seq_len=7))
    p.require(np.isclose(lhs, rhs, rtol=1e-13, atol=0.0),
              "<rotate_q(x), g> = <x, rotate_q_backward(g)> over positions 0 ... 6 at L = 2 (three steps)",
              f"{lhs!r} against {rhs!r}")
