r"""Sinusoidal positions through the projections: the relative property does not reach the logits.

PE(m) . PE(n) depends on m - n only (``sinusoidal.dot.relative``), but attention's
position-position term is PE(m) W_q W_k^T PE(n)^T. For one sin/cos pair of frequency w and
A = W_q W_k^T = [[a, b], [c, d]] (rows and columns in the order sin, cos):

    PE(m) A PE(n)^T = (a + d)/2 cos((m - n) w) + (b - c)/2 sin((m - n) w)
                    + (d - a)/2 cos((m + n) w) + (b + c)/2 sin((m + n) w)

The (m + n) terms vanish only when d = a and c = -b, i.e. when A is a scaled rotation; for
other weights the term moves with m at a fixed m - n (Vaswani et al. 2017, arXiv:1706.03762,
§3.5, which states the linear-shift property of PE itself, not of the logits).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem

m, n = sp.symbols("m n", real=True)
w = sp.Symbol("w", positive=True)
a, b, c, d = sp.symbols("a b c d", real=True)
TABLE = "minipos.sinusoidal.sinusoidal_table"


def pe_pair(pos, freq=w):
    """One pair of the interleaved table: [sin(pos w), cos(pos w)], (1, 2)."""
    return sp.Matrix([[sp.sin(pos * freq), sp.cos(pos * freq)]])


def projected(A, freq=w):
    """PE(m) A PE(n)^T for one pair, as an expression in m and n."""
    return (pe_pair(m, freq) * A * pe_pair(n, freq).T)[0, 0]


def split(a_, b_, c_, d_, freq=w):
    """The same term split into a part in m - n and a part in m + n."""
    rel = (a_ + d_) / 2 * sp.cos((m - n) * freq) + (b_ - c_) / 2 * sp.sin((m - n) * freq)
    absolute = (d_ - a_) / 2 * sp.cos((m + n) * freq) + (b_ + c_) / 2 * sp.sin((m + n) * freq)
    return rel, absolute


@theorem("sinusoidal.projected.not_relative",
         "PE(m) W_q W_k^T PE(n)^T is not a function of m - n: for one pair it has a part in "
         "m + n that vanishes only when W_q W_k^T is a scaled rotation",
         checks=(TABLE,))
def _(p):
    A = sp.Matrix([[a, b], [c, d]])
    rel, absolute = split(a, b, c, d)
    (p.derive(projected(A), "one pair, $A = W_q W_k^\\top$",
              shown=r"PE(m)\,A\,PE(n)^\top")
      .step(rel + absolute, "product-to-sum: a part in $m - n$ and a part in $m + n$", by="trig"))
    (p.derive(absolute, "the part in $m + n$")
      .step(sp.Integer(0), "vanishes for $d = a$, $c = -b$: $A$ a scaled rotation", using={d: a, c: -b}))
    sine_only = sp.Matrix([[1, 0], [0, 0]])           # A keeps the sine column only
    p.refute(projected(sine_only), projected(sine_only).subs({m: m + 1, n: n + 1}, simultaneous=True),
             {m: 1, n: 0, w: 1},
             "$A = \\mathrm{diag}(1, 0)$: $(m, n) = (1, 0)$ and $(2, 1)$, the same $m - n$, differ")
    rng = np.random.default_rng(0)
    wq, wk = rng.standard_normal((2, 2, 3))           # one pair (D = 2) into a head of 3 features
    An = wq @ wk.T                                    # (2, 2): a general A, not a rotation
    p.tie(TABLE, expected=sum(split(*(float(x) for x in An.ravel()), freq=1)), symbols=(m, n),
          points=[(3, 0), (10, 7), (110, 107), (0, 3)],
          call=lambda f, mm, nn: f([mm], 2)[0] @ An @ f([nn], 2)[0],
          reason="PE(m) W_q W_k^T PE(n)^T from the table, random W_q, W_k, D = 2")
