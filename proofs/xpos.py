r"""xPos (Sun et al. 2022, "A Length-Extrapolatable Transformer", arXiv:2212.10554, §3.1-3.2).

Interleaved RoPE (``proofs.rope``) whose pair i is also scaled: with ζ_i = (2i + 0.4 D)/(1.4 D)
and the scale base γ (torchscale's ``scale_base``), a query at n and a key at m become

    q_n = Z^{n/γ} R(n) q,   k_m = Z^{-m/γ} R(m) k,   Z^{x} = diag(ζ_0^x, ζ_0^x, ζ_1^x, ζ_1^x, …).

Z^{x} is a scalar on each 2x2 block, so it commutes with R(·); the powers combine, and

    <q_n, k_m> = q^T Z^{(n-m)/γ} R(m - n) k,

a function of n - m only, as for RoPE; for n > m every ζ_i^{(n-m)/γ} < 1, so the score decays
with distance. It needs the key's scale to be the inverse of the query's: scaling both by
Z^{+x} gives Z^{(n+m)/γ}, which depends on the absolute positions (refuted below). A common
offset c in the exponents (torchscale's centring, ``scale_offset``) cancels.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem
from .rope import R, m, n, vec

g = sp.Symbol("gamma", positive=True)
c = sp.Symbol("c", real=True)
APPLY, ZETA, SCALE = "minipos.xpos.apply_xpos", "minipos.xpos.xpos_zeta", "minipos.xpos.xpos_scale"


def zetas(D):
    """ζ_i = (2i/D + 0.4)/1.4 = (2i + 0.4 D)/(1.4 D), i = 0 … D/2 - 1, exact rationals."""
    return [(sp.Rational(2 * i, D) + sp.Rational(2, 5)) / sp.Rational(7, 5) for i in range(D // 2)]


def Z(x, D, zs=None):
    """diag(ζ_0^x, ζ_0^x, ζ_1^x, ζ_1^x, …): the per-pair scale, interleaved layout, (D, D)."""
    zs = zetas(D) if zs is None else zs
    return sp.diag(*[z ** x for z in zs for _ in (0, 1)])


@theorem("xpos.relative",
         "xPos scores depend only on n - m: "
         "<Z^{n/γ} R(n) q, Z^{-m/γ} R(m) k> = q^T Z^{(n-m)/γ} R(m - n) k",
         checks=(APPLY, ZETA, SCALE))
def _(p):
    D = 4
    zs = list(sp.symbols("zeta0:2", positive=True))
    q, k = vec("q", D), vec("k", D)
    qn, km = Z(n / g, D, zs) * R(n, D) * q, Z(-m / g, D, zs) * R(m, D) * k
    (p.derive((qn.T * km)[0, 0], "query at n, key at m, D = 4")
      .step((q.T * R(n, D).T * Z(n / g, D, zs) * Z(-m / g, D, zs) * R(m, D) * k)[0, 0],
            "$(Z R q)^T = q^T R^T Z$ (Z is diagonal)", by="expand")
      .step((q.T * R(n, D).T * Z((n - m) / g, D, zs) * R(m, D) * k)[0, 0],
            "$\\zeta^{n/\\gamma} \\zeta^{-m/\\gamma} = \\zeta^{(n-m)/\\gamma}$", by="expand")
      .step((q.T * Z((n - m) / g, D, zs) * R(n, D).T * R(m, D) * k)[0, 0],
            "Z is a scalar on each 2x2 block, so it commutes with $R(n)^T$", by="expand")
      .step((q.T * Z((n - m) / g, D, zs) * R(m - n, D) * k)[0, 0], "$R(n)^T R(m) = R(m - n)$", by="trig"))
    for Dn in p.cases(D=[4, 2, 6, 8]):
        x = sp.Symbol("x", real=True)
        p.claim(sp.MatMul(Z(x, Dn), R(m, Dn), evaluate=False), sp.MatMul(R(m, Dn), Z(x, Dn), evaluate=False),
                "blockwise: a scalar times a rotation", by="expand")
    z = sp.Rational(2, 7)
    p.refute(z ** ((n + m) / g), z ** ((n + 1 + m + 1) / g), {n: 0, m: 0, g: 1},
             "keys upscaled too: $\\zeta^{(n+m)/\\gamma}$ changes when both positions shift by 1")
    p.claim(Z((n - c) / g, 4) * Z(-(m - c) / g, 4), Z((n - m) / g, 4),
            "a common offset c in both exponents (torchscale's centring) cancels", by="expand")
    _ties(p)


def _ties(p):
    """xpos_zeta, xpos_scale and the score of apply_xpos against the formulas, D = 8, γ = 512."""
    D = 8
    p.tie(ZETA, expected=sp.Matrix(zetas(D)), points=[()], call=lambda f: f(D)[:, None],
          reason="ζ_i = (2i + 0.4 D)/(1.4 D), D = 8")
    p.tie(ZETA, expected=sp.Matrix([sp.Rational(2, 7), 1 - sp.Rational(2 * 5, 7 * 128)]), points=[()],
          call=lambda f: f(128)[[0, -1]][:, None],
          reason="ζ_0 = 0.4/1.4 = 2/7, ζ_63 = 1 - 2/(1.4 D) = 443/448, D = 128")
    p.tie(SCALE, expected=sp.Matrix([z ** (n / 512) for z in zetas(D)]), symbols=(n,),
          points=[(0,), (7,), (-300,), (4097,)], call=lambda f, a: f([a], D)[0][:, None],
          reason="the query scale ζ_i^(n/γ), γ = 512")
    rng = np.random.default_rng(8)
    qv, kv = rng.normal(size=D), rng.normal(size=D)
    want = (sp.Matrix(qv).T * Z((n - m) / 512, D) * R(m - n, D, 10000) * sp.Matrix(kv))[0, 0]
    pts = [(0, 0, 0), (5, 3, 0), (3, 5, 0), (1005, 1003, 0), (4097, 4000, 2049), (300, 0, 151)]
    p.tie(APPLY, expected=want, symbols=(n, m, c), points=pts,
          call=lambda f, a, b, off: (f(qv[None], [a], scale_offset=off)[0]
                                     @ f(kv[None], [b], downscale=True, scale_offset=off)[0]),
          reason="score q_n . k_m = q^T Z^((n-m)/γ) R(m - n) k, for any scale_offset c, D = 8")


@theorem("xpos.decay",
         "0 < ζ_i < 1 for i = 0 … D/2 - 1, so for n > m the factor ζ_i^{(n-m)/γ} < 1 "
         "shrinks as n - m grows",
         checks=(SCALE,))
def _(p):
    D_ = sp.Symbol("D", integer=True, positive=True, even=True)
    j = sp.Symbol("j", integer=True, nonnegative=True)      # i = D/2 - 1 - j runs over 0 … D/2 - 1
    zeta = lambda i: (2 * i + sp.Rational(2, 5) * D_) / (sp.Rational(7, 5) * D_)  # noqa: E731
    gap = (p.derive(1 - zeta(D_ / 2 - 1 - j), "$1 - \\zeta_i$ with $i = D/2 - 1 - j$, $j \\ge 0$")
             .step(sp.Rational(10, 7) * (1 + j) / D_, "$1.4 D - 2i - 0.4 D = D - 2i = 2 + 2j$",
                   by="cancel")).last
    i = sp.Symbol("i", integer=True, nonnegative=True)
    p.require(zeta(i).is_positive and gap.is_positive, "$0 < \\zeta_i < 1$ for every pair",
              f"ζ_i = {zeta(i)}, 1 - ζ_i = {gap}")
    z, d = sp.Symbol("zeta", positive=True), sp.Symbol("delta", positive=True)
    (p.derive(sp.Derivative(z ** (d / g), d), "derivative in the distance $\\delta = n - m > 0$")
      .step(z ** (d / g) * sp.log(z) / g, "negative when $0 < \\zeta < 1$: the factor decays", by="doit"))
    p.require(sp.log(sp.Rational(443, 448)).is_negative,
              "ln ζ < 0 even for the slowest pair (ζ_63 at D = 128)")
    p.tie(SCALE, expected=sp.Matrix([zz ** (n / 512) for zz in zetas(128)[::9]]), symbols=(n,),
          points=[(1,), (512,), (5000,)], call=lambda f, a: f([a], 128)[0][::9][:, None],
          reason="ζ_i^(n/γ) < 1 for n > 0, D = 128, γ = 512")
    from minipos.xpos import xpos_scale
    sc = xpos_scale(np.arange(0, 4096, 64), 128)                                   # (64, 64)
    p.require(np.all(np.diff(sc, axis=0) < 0) and np.all(sc[1:] < 1),
              "xpos_scale is below 1 and strictly decreasing in n > 0 for every pair (D = 128)")
