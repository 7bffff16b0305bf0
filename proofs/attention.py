r"""Attention: what the scheme-agnostic core relies on.

- softmax is unchanged by adding a constant to a row (why a max-shift is safe, and why ALiBi's
  ``+m j`` and ``-m (i - j)`` agree under a causal mask);
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
    p.tie("minipos.attention.softmax", expected=_softmax([xi + c for xi in x]), symbols=(*x, c),
          points=[(0.1, -2.0, 3.0, 0.0), (0.1, -2.0, 3.0, 50.0), (1.0, 1.0, 1.0, -700.0)],
          call=lambda f, a, b, d, c: f([a + c, b + c, d + c])[:, None],
          reason="the code's softmax of a shifted row equals softmax of the row")
