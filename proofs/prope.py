r"""Proportional RoPE (Barbero et al. 2025, arXiv:2410.06205, §6; HF ``rope_type: "proportional"``).

With head dim D, fraction p and k = floor(p D / 2) rotated pairs, p-RoPE is RoPE with

    θ_i = base^(-2i/D)  for i < k,      θ_i = 0  for k <= i < D/2,

so R_p(m) = diag(B(m θ_0), …, B(m θ_{k-1}), I, …, I) blockwise. What that keeps:

- the rotated pairs are RoPE's k fastest (denominator D, not the p D of partial rotary);
- an unrotated pair contributes q_[i] · k_[i] to the score at every pair of positions, a rotated
  one q_[i]^T B((n - m) θ_i) k_[i]: the score depends on n - m only, and its unrotated share on
  neither position;
- p = 1 is RoPE, p = 0 is no rotation at all (NoPE).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minipos import prope as code
from minipos import rope as rope_code

from .core import theorem
from .rope import B, B_T, B_shown

FREQ, APPLY = "minipos.prope.proportional_inv_freq", "minipos.prope.apply_prope"
base = sp.Symbol("base", positive=True)
D_ = sp.Symbol("D", integer=True, positive=True, even=True)
i_ = sp.Symbol("i", integer=True, nonnegative=True)
m, n, t = sp.symbols("m n theta", real=True)
p_ = sp.Symbol("p", positive=True)


def thetas(D, p, b_=base):
    """p-RoPE's θ_i, i = 0 … D/2 - 1: base^(-2i/D) for the k = floor(p D / 2) fastest, 0 after."""
    k = int(p * D // 2)
    return [b_ ** sp.Rational(-2 * i, D) if i < k else sp.Integer(0) for i in range(D // 2)]


def R_half(pos, D, p, b_=base):
    """R_p(pos) in the half layout: block i on features (i, i + D/2), (D, D)."""
    h, M = D // 2, sp.zeros(D, D)
    for i, th in enumerate(thetas(D, p, b_)):
        c, s = sp.cos(pos * th), sp.sin(pos * th)
        M[i, i], M[i, i + h], M[i + h, i], M[i + h, i + h] = c, -s, s, c
    return M


@theorem("prope.frequencies",
         "p-RoPE's rotated frequencies are RoPE's k = floor(p D / 2) fastest, θ_i = base^(-2i/D) (denominator D), "
         "and the other D/2 - k are 0; partial rotary's base^(-2i/(pD)) is another set",
         checks=(FREQ,))
def _(p):
    (p.derive(base ** (-2 * i_ / D_) / base ** (-2 * i_ / (p_ * D_)),
              "a rotated frequency of p-RoPE over partial rotary's at the same $i$ and $p$")
      .step(base ** (2 * i_ * (1 - p_) / (p_ * D_)), "$b^x / b^y = b^{x - y}$",
            by=lambda r: sp.simplify(sp.powsimp(sp.expand_power_exp(r), force=True))))
    p.refute(base ** (-2 * i_ / D_), base ** (-2 * i_ / (p_ * D_)), {base: 10000, i_: 1, D_: 8, p_: sp.Rational(1, 2)},
             "for $p < 1$ and $i \\ge 1$ the two differ: $10000^{-1/4} \\ne 10000^{-1/2}$")
    (p.derive(2 * sp.pi / (base ** (-2 * (p_ * D_ / 2 - 1) / D_)), "the slowest rotated wavelength, $i = pD/2 - 1$")
      .step(2 * sp.pi * base ** (p_ - 2 / D_), "$2\\pi / \\theta_i = 2\\pi\\, base^{2i/D}$", by="simplify"))
    points = [(8, 0.5, 10000.0), (16, 0.25, 1e6), (10, 0.3, 10000.0), (256, 0.25, 1e6), (12, 1.0, 500.0),
              (6, 0.0, 10000.0)]
    p.tie(FREQ, expected=lambda D, pr, b: np.array([float(v) for v in thetas(D, pr, b)]), points=points,
          call=lambda f, D, pr, b: f(D, base=b, partial_rotary_factor=pr)[0], rtol=1e-14, atol=0.0,
          reason="θ_i = base^(-2i/D) for i < floor(pD/2), else 0")
    for D, pr in ((16, 0.25), (256, 0.25), (64, 0.5)):
        k = int(pr * D // 2)
        ours = code.proportional_inv_freq(D, base=1e6, partial_rotary_factor=pr)[0]
        p.require(np.array_equal(ours[:k], rope_code.rope_inv_freq(D, base=1e6)[:k]) and not ours[k:].any(),
                  f"D = {D}, p = {pr}: the first {k} are rope_inv_freq(D)'s first {k}, the rest exactly 0")


@theorem("prope.score",
         "<R_p(m) q, R_p(n) k> = sum_{i<k} q_[i]^T B((n - m) θ_i) k_[i] + sum_{i>=k} q_[i] . k_[i]: the rotated "
         "pairs are relative, the unrotated pairs' share depends on neither position",
         checks=(APPLY,))
def _(p):
    (p.derive(sp.MatMul(B_T(m * 0), B(n * 0), evaluate=False), "an unrotated pair, $\\theta_i = 0$")
      .step(sp.eye(2), "$B(0) = I$: its share $q_{[i]} \\cdot k_{[i]}$ is the same at every $m, n$"))
    (p.derive(sp.MatMul(B_T(m * t), B(n * t), evaluate=False), "a rotated pair, $\\theta_i = \\theta$")
      .step(sp.MatMul(B_shown(-m * t), B(n * t), evaluate=False), "$B(a)^T = B(-a)$")
      .step(B((n - m) * t), "$B(a) B(b) = B(a + b)$", by="trig"))
    D, pr = 4, 0.5                                                   # one rotated pair (0, 2), one not (1, 3)
    q, k = sp.Matrix(sp.symbols("q0:4", real=True)), sp.Matrix(sp.symbols("k0:4", real=True))
    th = thetas(D, pr)[0]
    with p.folded("the score at D = 4, p = 1/2, entry by entry"):
        (p.derive(((R_half(m, D, pr) * q).T * (R_half(n, D, pr) * k))[0, 0],
                  "$\\langle R_p(m) q, R_p(n) k\\rangle$, D = 4, half layout, pair (0, 2) rotates, (1, 3) does not")
          .step((sp.Matrix([q[0], q[2]]).T * B((n - m) * th) * sp.Matrix([k[0], k[2]]))[0, 0]
                + q[1] * k[1] + q[3] * k[3],
                "the rotated pair gives $B((n - m)\\theta_0)$, the other $q_1 k_1 + q_3 k_3$", by="trig"))
    rng = np.random.default_rng(5)
    Dn, prn = 8, 0.5
    qv, kv = rng.normal(size=Dn), rng.normal(size=Dn)
    want = (sp.Matrix(qv).T * R_half(n - m, Dn, prn, 10000) * sp.Matrix(kv))[0, 0]
    p.tie(APPLY, expected=want, symbols=(m, n), points=[(0, 0), (3, 7), (7, 3), (100, 4099), (-5, 2)],
          call=lambda f, x, y: f(qv[None], [x], partial_rotary_factor=prn)[0] @ f(kv[None], [y],
                                                                                 partial_rotary_factor=prn)[0],
          rtol=1e-10, reason="score = q^T R_p(n - m) k, D = 8, p = 1/2, half layout")
    x = rng.normal(size=(3, 16))
    y = code.apply_prope(x, [0, 9, -40], partial_rotary_factor=0.25)
    still = np.r_[2:8, 10:16]                                        # k = 2: features [2, 8) and [10, 16)
    p.require(np.array_equal(y[:, still], x[:, still]),
              "apply_prope, D = 16, p = 1/4: features [k, D/2) and [D/2 + k, D) come out unchanged, bit for bit")


@theorem("prope.limits", "p = 1 is RoPE (every pair rotates, half layout) and p = 0 rotates nothing (NoPE)",
         checks=(APPLY,))
def _(p):
    p.claim(sp.floor(p_ * D_ / 2).subs(p_, 1), D_ / 2, "$p = 1$: $k = \\lfloor D/2 \\rfloor = D/2$ pairs, all of them "
            "($D$ even)", by="simplify", shown=("\\lfloor p D / 2 \\rfloor \\big|_{p = 1}", None))
    p.require(code.rotated_pairs(8, 1.0) == 4 and code.rotated_pairs(8, 0.0) == 0 and code.rotated_pairs(512, 0.25) == 64,
              "rotated_pairs: every pair at p = 1, none at p = 0, 64 of 256 at Gemma 4's D = 512, p = 1/4")
    rng = np.random.default_rng(6)
    x, pos = rng.normal(size=(2, 5, 8)), np.array([0, 3, 11, 200, -7])
    p.tie(APPLY, expected=lambda pr: (rope_code.apply_rope(x, pos, layout="half") if pr == 1 else x),
          points=[(1.0,), (0.0,)], call=lambda f, pr: f(x, pos, partial_rotary_factor=pr), rtol=1e-14, atol=0.0,
          reason="apply_prope at p = 1 against apply_rope (half), at p = 0 against x itself")
