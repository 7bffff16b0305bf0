r"""FIRE: where the normalised distance lives, what the threshold keeps relative, and the gradients.

Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context Transformers",
arXiv:2310.04418; the code's form (``minipos.fire``). With query position i, key position j,
ψ(x) = log(c x + 1) for c > 0 and x >= 0, and the threshold L >= 0, FIRE feeds its MLP

    u(i, j) = ψ(i - j) / ψ(max(L, i)).

- ψ is increasing on x >= 0 (ψ' = c / (c x + 1) > 0) and ψ(0) = 0, so for every causal pair
  0 <= i - j <= i <= max(L, i): 0 <= u <= 1. Whatever the length, the MLP sees inputs in [0, 1]
  (the progressive interpolation); with the code's ε > 0 in the denominator, u < 1.
- For i <= L the normaliser is the constant ψ(L): u is a function of i - j only, so the bias is
  unchanged when every position moves by s while i + s <= L. Past L the normaliser ψ(i) grows with
  i, so one distance maps to less and less (refuted shift invariance, and ∂u/∂i < 0).
- The gradients of u in c and L that ``fire_bias_backward`` uses.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minipos import fire as code

from .core import theorem

DISTANCE, BIAS, BACKWARD = "minipos.fire.fire_distance", "minipos.fire.fire_bias", "minipos.fire.fire_bias_backward"
c = sp.Symbol("c", positive=True)
L = sp.Symbol("L", nonnegative=True)
x = sp.Symbol("x", nonnegative=True)
d = sp.Symbol("delta", nonnegative=True)          # the distance i - j >= 0
e = sp.Symbol("e", nonnegative=True)              # a gap >= 0
i, s = sp.symbols("i s", nonnegative=True)


def psi(v):
    """ψ(v) = log(c v + 1)."""
    return sp.log(c * v + 1)


@theorem("fire.distance.unit_interval",
         "for c > 0 and every causal pair 0 <= i - j <= i: 0 <= ψ(i - j) / ψ(max(L, i)) <= 1, "
         "ψ(x) = log(c x + 1): the MLP's input stays in [0, 1] at every length",
         checks=(DISTANCE,))
def _(p):
    (p.derive(sp.Derivative(psi(x), x), "$\\psi'(x)$")
      .step(c / (c * x + 1), "the chain rule", by="doit"))
    p.require((c / (c * x + 1)).is_positive, "$\\psi' > 0$ for $c > 0$, $x \\ge 0$: $\\psi$ is increasing")
    p.claim(psi(0), sp.Integer(0), "$\\log 1 = 0$: the lower end, $j = i$",
            shown=("\\psi(0) = \\log(c \\cdot 0 + 1)", None))
    gap = (p.derive(psi(d + e) - psi(d), "$\\psi(\\delta + e) - \\psi(\\delta)$: a larger argument, "
                                         "$\\delta = i - j$, $\\delta + e = \\max(L, i)$, $e \\ge 0$")
             .step(sp.log(1 + c * e / (c * d + 1)), "$\\log a - \\log b = \\log(a / b)$",
                   by=lambda r: sp.simplify(sp.expand_log(r, force=True)))).last
    p.require((c * e / (c * d + 1)).is_nonnegative,
              "$1 + c e / (c \\delta + 1) \\ge 1$: the log is $\\ge 0$, so $\\psi(i - j) \\le \\psi(\\max(L, i))$")
    p.require(gap.func == sp.log, "the gap is a log of a number >= 1", str(gap))
    rng = np.random.default_rng(11)
    points = [(T, float(cv), float(Lv)) for T, cv, Lv in ((9, 0.1, 512.0), (40, 0.1, 8.0), (40, 1.7, 0.0),
                                                           (300, 0.02, 64.0), (5, 3.0, 2.5))]
    for T, cv, Lv in points:
        u = code.fire_distance(np.arange(T), np.arange(T), c=cv, threshold=Lv)
        causal = np.tril(np.ones((T, T), bool))
        p.require(u[causal].min() >= 0.0 and u[causal].max() < 1.0,
                  f"fire_distance over the causal pairs of {T} positions, c = {cv}, L = {Lv}: in [0, 1)")
    q, k = rng.integers(0, 600, 12), rng.integers(0, 600, 12)
    p.tie(DISTANCE, expected=lambda cv, Lv: (np.log1p(cv * np.abs(q[:, None] - k[None, :]))
                                             / (np.log1p(cv * np.maximum(q, Lv))[:, None] + 1e-6)),
          points=[(0.1, 512.0), (0.5, 3.0), (2.0, 0.0)], call=lambda f, cv, Lv: f(q, k, c=cv, threshold=Lv),
          rtol=1e-13, reason="u = ψ(|i - j|) / (ψ(max(L, i)) + ε), ε = 1e-6, random positions")


@theorem("fire.distance.threshold",
         "while i <= L the normaliser is the constant ψ(L): u depends on i - j only, unchanged by a common "
         "shift that keeps i <= L; past L it is ψ(i), which grows with i, and a shift changes u",
         checks=(DISTANCE, BIAS))
def _(p):
    (p.derive(psi(d) / psi(sp.Max(L, L - e)), "a query at $i = L - e \\le L$, distance $\\delta$",
              shown="\\psi(\\delta) / \\psi(\\max(L, L - e))")
      .step(psi(d) / psi(L), "$\\max(L, L - e) = L$", by="simplify"))
    u = lambda qi, kj: psi(qi - kj) / psi(sp.Max(L, qi))  # noqa: E731
    p.claim(u(L - e, L - e - d), u(L - e - s, L - e - s - d),
            "both queries below $L$: the same $\\psi(\\delta) / \\psi(L)$", by="simplify",
            shown=("u(L - e,\\, L - e - \\delta)", "u(L - e - s,\\, L - e - s - \\delta)"))
    p.refute(u(i, i - d), u(i + s, i + s - d), {L: 2, c: 1, i: 4, d: 1, s: 4},
             "past L the shift changes u: $\\psi(1)/\\psi(4) \\ne \\psi(1)/\\psi(8)$")
    (p.derive(sp.Derivative(psi(d) / psi(i), i), "past $L$: $u = \\psi(\\delta)/\\psi(i)$, $\\delta$ fixed")
      .step(-psi(d) * c / ((c * i + 1) * psi(i) ** 2), "the quotient rule", by="doit"))
    p.require((psi(d) * c / ((c * i + 1))).is_nonnegative,
              "$\\partial u / \\partial i \\le 0$: a longer context maps one distance to a smaller input")
    q, k = np.arange(3, 9), np.arange(0, 9)
    below = [code.fire_distance(q + sh, k + sh, c=0.3, threshold=20.0) for sh in (0, 5, 11)]
    p.require(all(np.array_equal(below[0], b) for b in below[1:]),
              "fire_distance, L = 20: shifts keeping i <= 20 leave every entry unchanged (exactly)")
    past = code.fire_distance(q + 30, k + 30, c=0.3, threshold=20.0)
    p.require(np.all(past[q[:, None] > k[None, :]] < below[0][q[:, None] > k[None, :]]),
              "fire_distance, L = 20: moved past L, every distance > 0 maps to a smaller u")
    rng = np.random.default_rng(12)
    mlp = [rng.normal(size=sh) for sh in ((1, 8), (8,), (8, 3), (3,))]
    at_zero = code.fire_bias(*mlp, q, k, c=0.3, threshold=20.0)
    p.tie(BIAS, expected=lambda sh: at_zero,
          points=[(0,), (4,), (11,)], call=lambda f, sh: f(*mlp, q + sh, k + sh, c=0.3, threshold=20.0),
          rtol=0.0, atol=0.0, reason="the bias below L = 20 is the same at every shift")


@theorem("fire.backward.c_and_L",
         "∂u/∂c = ψ'_c(δ)/ψ(m) - ψ(δ) ψ'_c(m)/ψ(m)², ∂u/∂L = -ψ(δ) c / ((c L + 1) ψ(L)²) for L > i, "
         "0 for L < i (m = max(L, i), ψ'_c(v) = v / (c v + 1)): fire_bias_backward's dc and dL",
         checks=(BACKWARD,))
def _(p):
    m = sp.Symbol("m", positive=True)
    (p.derive(sp.Derivative(psi(d) / psi(m), c), "$u = \\psi(\\delta)/\\psi(m)$ in $c$")
      .step(d / (c * d + 1) / psi(m) - psi(d) * (m / (c * m + 1)) / psi(m) ** 2, "the quotient rule", by="doit"))
    (p.derive(sp.Derivative(psi(d) / psi(L), L), "$L > i$: $m = L$")
      .step(-psi(d) * c / ((c * L + 1) * psi(L) ** 2), "the quotient rule", by="doit"))
    p.claim(sp.Derivative(psi(d) / psi(i), L), sp.Integer(0), "$L < i$: $m = i$ does not depend on $L$", by="doit")
    # One hidden unit, one head: bias = a u + b with a u + b > 0, so dbias = 1 at one pair gives a ∂u.
    a, b = 0.75, 2.0
    w1, b1, w2, b2 = np.array([[a]]), np.array([b]), np.array([[1.0]]), np.array([0.0])
    qi, kj, cv, Lv = sp.symbols("q_i k_j c_v L_v", positive=True)
    uu = sp.log(cv * (qi - kj) + 1) / (sp.log(cv * sp.Max(Lv, qi) + 1) + sp.Rational(1, 10 ** 6))
    pts = [(5, 2, 0.1, 512.0), (5, 2, 0.7, 3.0), (40, 1, 0.05, 64.0), (9, 9, 1.3, 2.0)]
    for name, sym in (("c", cv), ("threshold", Lv)):
        p.tie(BACKWARD, expected=a * sp.diff(uu, sym), symbols=(qi, kj, cv, Lv), points=pts,
              call=lambda f, q_, k_, c_, L_, name=name: f(np.ones((1, 1, 1)), w1, b1, w2, b2, [q_], [k_], c=c_,
                                                         threshold=L_)[name],
              rtol=1e-9, reason=f"d{name} of a u + b at one pair, against SymPy's derivative")
