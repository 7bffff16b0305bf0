r"""Attention: what the scheme-agnostic core relies on.

- softmax is unchanged by adding a constant to a row (why a max-shift is safe, and why ALiBi's
  ``+m j`` and ``-m (i - j)`` agree after softmax with or without a mask: they differ by ``m i``,
  constant in a row; only their equality with ``-m |i - j|`` needs the causal mask);
- Var(q . k) = D for independent zero-mean unit-variance entries, hence the scale 1/sqrt(D)
  (Vaswani et al. 2017, arXiv:1706.03762, Sec. 3.2.1, footnote 4);
- (x_i + p_i) W_q W_k^T (x_j + p_j)^T splits into the four content/position terms
  (the seams of design.md).
"""

from __future__ import annotations

import sympy as sp

from .core import theorem


def _softmax(xs):
    """softmax of a list of SymPy expressions, as the definition writes it."""
    total = sum(sp.exp(x) for x in xs)
    return sp.Matrix([sp.exp(x) / total for x in xs])


@theorem("attention.softmax.shift", "softmax(x + c) = softmax(x) for a constant c added to a row",
         checks=("minipos.attention.softmax",))
def _(p):
    c = sp.Symbol("c", real=True)
    for n in p.cases(n=[2, 3, 1, 4]):
        x = sp.symbols(f"x0:{n}", real=True)
        (p.derive(_softmax([xi + c for xi in x]))
          .step(sp.Matrix([sp.exp(c) * sp.exp(xi) / sum(sp.exp(c) * sp.exp(xj) for xj in x) for xi in x]),
                "$e^{x + c} = e^c e^x$", by="expand")
          .step(_softmax(x), "cancel the common factor $e^c$", by="cancel"))
    x = sp.symbols("x0:3", real=True)
    p.tie("minipos.attention.softmax", expected=_softmax(x), symbols=(*x, c),
          points=[(0.1, -2.0, 3.0, 0.0), (0.1, -2.0, 3.0, 50.0), (0.1, -2.0, 3.0, 800.0),
                  (1.0, 1.0, 1.0, -800.0)],
          call=lambda f, a, b, d, c: f([a + c, b + c, d + c])[:, None],
          reason="the code's softmax of a row shifted by c, even c = ±800, equals softmax of the row")


def _expect(poly, q, k, mu, nu):
    """E[poly] for independent entries q_i (moments mu[n] = E[q^n]) and k_i (moments nu[n]).

    Linearity plus independence: E[c prod q_i^a_i prod k_i^b_i] = c prod mu[a_i] prod nu[b_i].
    """
    gens = (*q, *k)
    total = sp.Integer(0)
    for powers, coeff in sp.Poly(sp.expand(poly), *gens).terms():
        term = coeff
        for a in powers[: len(q)]:
            term *= mu[a]
        for b in powers[len(q):]:
            term *= nu[b]
        total += term
    return sp.expand(total)


@theorem("attention.scale.variance",
         "Var(q . k) = D for independent zero-mean unit-variance entries, hence the scale 1/sqrt(D)",
         checks=("minipos.attention.attention",))
def _(p):
    mu = {0: 1, **{n: sp.Symbol(f"mu{n}") for n in (1, 2, 3, 4)}}   # E[q_i^n], the same for every i
    nu = {0: 1, **{n: sp.Symbol(f"nu{n}") for n in (1, 2, 3, 4)}}   # E[k_i^n]
    per_term = mu[2] * nu[2] - mu[1] ** 2 * nu[1] ** 2               # Var(q_i k_i)
    for D in p.cases(D=[3, 1, 2, 4, 5]):
        q, k = sp.symbols(f"q0:{D}"), sp.symbols(f"k0:{D}")
        dot = sum(qi * ki for qi, ki in zip(q, k))
        E = sp.Function("E")
        (p.derive(E(dot**2) - E(dot) ** 2, "$\\mathrm{Var}(q \\cdot k) = E[(q \\cdot k)^2] - E[q \\cdot k]^2$")
          .step(D * per_term, "linearity and independence; the cross terms $i \\neq j$ cancel",
                using={E: lambda e: _expect(e, q, k, mu, nu)}))
    D, i = sp.Symbol("D", integer=True, positive=True), sp.Symbol("i", integer=True, positive=True)
    (p.derive(sp.Sum(per_term, (i, 1, D)))
      .step(D * per_term, "the D terms are equal", by="doit")
      .step(D, "zero mean, unit variance: $\\mu_1 = \\nu_1 = 0$, $\\mu_2 = \\nu_2 = 1$",
            using={mu[1]: 0, nu[1]: 0, mu[2]: 1, nu[2]: 1}))
    V = sp.Symbol(r"\mathrm{Var}(q \cdot k)", positive=True)
    p.claim((1 / sp.sqrt(D)) ** 2 * V, 1,
            "$\\mathrm{Var}(q \\cdot k) = D$: the scaled logits $q \\cdot k / \\sqrt{D}$ have unit variance",
            using={V: D})
    _tie_default_scale(p)


def _tie_default_scale(p):
    """attention(q, k, v) with the default scale is softmax(q.k / sqrt(D)) v (one query, two keys)."""
    D = 4
    q, k0, k1 = sp.symbols(f"q0:{D}"), sp.symbols(f"a0:{D}"), sp.symbols(f"b0:{D}")
    dot = lambda u, w: sum(a * b for a, b in zip(u, w))  # noqa: E731
    weights = _softmax([dot(q, k0) / sp.sqrt(D), dot(q, k1) / sp.sqrt(D)])
    rng = __import__("numpy").random.default_rng(0)
    points = [tuple(rng.normal(size=3 * D)) for _ in range(3)]

    def call(f, *v):
        qv, kv = [[list(v[:D])]], [[list(v[D:2 * D]), list(v[2 * D:])]]
        return f(qv, kv, [[[1.0, 0.0], [0.0, 1.0]]])[0, 0][:, None]  # v = I: out = weights, (2, 1)
    p.tie("minipos.attention.attention", expected=weights, symbols=(*q, *k0, *k1), points=points,
          call=call, reason="default scale 1/sqrt(D), D = 4")


@theorem("attention.four_terms",
         "(x_i + p_i) W_q W_k^T (x_j + p_j)^T = content-content + content-position"
         " + position-content + position-position")
def _(p):
    d, D = 3, 2  # sizes only fix the shapes; the algebra is that of matrix products
    xi, pi, xj, pj = (sp.MatrixSymbol(n, 1, d) for n in ("x_i", "p_i", "x_j", "p_j"))
    Wq, Wk = sp.MatrixSymbol("W_q", d, D), sp.MatrixSymbol("W_k", d, D)
    A = Wq * Wk.T
    (p.derive((xi + pi) * Wq * Wk.T * (xj + pj).T)
      .step(xi * A * xj.T + xi * A * pj.T + pi * A * xj.T + pi * A * pj.T,
            "distribute: content-content, content-position, position-content, position-position",
            by="expand"))
