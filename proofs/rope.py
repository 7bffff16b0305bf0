r"""Rotary position embedding (Su et al. 2021, RoFormer, arXiv:2104.09864, §3.2-3.4.3).

    R(m) = diag(B(m θ_0), …, B(m θ_{D/2-1})),  B(a) = [[cos a, -sin a], [sin a, cos a]],
    θ_i = base^(-2i/D),  i = 0 … D/2 - 1                                  (Eq. 14-15)

in the interleaved layout (pair i = features (2i, 2i+1)); the half layout pairs (i, i + D/2).
Every identity is proved on the 2x2 block B with a symbol for the angle. For any even D,
block-diagonal matrices multiply blockwise, so block i of R(m) R(n)^T is
B(m θ_i) B(n θ_i)^T = B((m - n) θ_i): checked with symbolic i, D and base. The whole
block-diagonal form is also checked at a few explicit D (2, 4, 6, 8). Headline:
R(m) R(n)^T = R(m - n), hence <R(m) q, R(n) k> depends on m - n only (written
q^T R(n - m) k, Eq. 16).

RoFormer's "long-term decay" (§3.4.3) is an upper bound on the score, not its expected value:
for independent zero-mean q and k, E[q^T R(Δ) k] = 0 and (unit variance) Var = D at every Δ;
only correlated q, k have a mean that moves with Δ (``rope.score.expectation``).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem

a, b, m, n = sp.symbols("a b m n", real=True)
base = sp.Symbol("base", positive=True)
D_ = sp.Symbol("D", integer=True, positive=True, even=True)
i_ = sp.Symbol("i", integer=True, nonnegative=True)
theta_i = base ** (-2 * i_ / D_)  # θ_i = base^(-2i/D) with symbolic i and D
CASES = [4, 2, 6, 8]
RMAT = "minipos.rope.rotation_matrix"
APPLY = "minipos.rope.apply_rope"


def B(t):
    """The 2x2 counter-clockwise rotation by angle t."""
    return sp.Matrix([[sp.cos(t), -sp.sin(t)], [sp.sin(t), sp.cos(t)]])


def B_shown(t):
    """B(t) with cos and sin left unevaluated, so that B(-b) shows its minus sign."""
    c, s_ = sp.cos(t, evaluate=False), sp.sin(t, evaluate=False)
    return sp.ImmutableMatrix([[c, -s_], [s_, c]])


def B_T(t):
    """B(t)^T, shown as a transpose (evaluated when compared)."""
    return sp.Transpose(sp.ImmutableMatrix(B(t)))


def thetas(D, b_=base):
    """θ_i = base^(-2i/D), i = 0 … D/2 - 1 (Eq. 15, counted from 0)."""
    return [b_ ** sp.Rational(-2 * i, D) for i in range(D // 2)]


def R(pos, D, b_=base):
    """The definitional R(pos), interleaved layout: blocks on pairs (2i, 2i+1), (D, D)."""
    return sp.diag(*[B(pos * t) for t in thetas(D, b_)])


def R_half(pos, D, b_=base):
    """R(pos) in the half layout, written directly: block i on features (i, i + D/2), (D, D)."""
    h, M = D // 2, sp.zeros(D, D)
    for i, t in enumerate(thetas(D, b_)):
        c, s = sp.cos(pos * t), sp.sin(pos * t)
        M[i, i], M[i, i + h], M[i + h, i], M[i + h, i + h] = c, -s, s, c
    return M


def perm(D):
    """x_half = x_interleaved[perm]: features 0, 2, 4, … then 1, 3, 5, …"""
    return list(range(0, D, 2)) + list(range(1, D, 2))


def P(D):
    """The permutation matrix with (P x)_j = x_{perm[j]}, (D, D)."""
    pm = perm(D)
    return sp.Matrix(D, D, lambda r, c: 1 if pm[r] == c else 0)


def vec(name, D):
    return sp.Matrix(sp.symbols(f"{name}0:{D}", real=True))


def _M(x):
    """An explicit matrix as a factor of an unevaluated product (for display)."""
    return sp.ImmutableMatrix(x)


def _prod(*factors):
    """The product of explicit matrices, left unevaluated so the LaTeX shows each factor."""
    return sp.MatMul(*[f if isinstance(f, sp.MatrixExpr) else _M(f) for f in factors], evaluate=False)


def _T(x):
    """x^T, shown as a transpose."""
    return sp.Transpose(x if isinstance(x, sp.MatrixExpr) else _M(x))


_POINTS = [(0, 0), (1, 0), (3, 7), (7, 3), (100, 4099)]


@theorem("rope.block.group", "R(a) R(b) = R(a + b) and R(a)^T = R(-a) for the 2x2 block R(a) = [[cos a, -sin a], [sin a, cos a]]",
         checks=(RMAT,))
def _(p):
    (p.derive(sp.MatMul(B(a), B(b), evaluate=False))
      .step(sp.Matrix([[sp.cos(a) * sp.cos(b) - sp.sin(a) * sp.sin(b), -(sp.sin(a) * sp.cos(b) + sp.cos(a) * sp.sin(b))],
                       [sp.sin(a) * sp.cos(b) + sp.cos(a) * sp.sin(b), sp.cos(a) * sp.cos(b) - sp.sin(a) * sp.sin(b)]]),
            "multiply", by="expand")
      .step(B(a + b), "angle addition", by="trig"))
    p.claim(B_T(a), B_shown(-a), "cos is even, sin is odd")
    p.tie(RMAT, expected=B(a), symbols=(a,), points=[(0,), (1,), (-5,), (4097,)],
          call=lambda f, x: f(x, 2), reason="D = 2: R(m) = B(m θ_0), θ_0 = 1")


@theorem("rope.relative.transpose_left",
         "R(m)^T R(n) = R(n - m) for the block-diagonal R of any even D",
         checks=(RMAT,))
def _(p):
    (p.derive(sp.MatMul(B_T(a), B(b), evaluate=False))
      .step(sp.MatMul(B_shown(-a), B(b), evaluate=False), "$B(a)^T = B(-a)$")
      .step(B(b - a), "$B(a) B(b) = B(a + b)$", by="trig"))
    (p.derive(sp.MatMul(B_T(m * theta_i), B(n * theta_i), evaluate=False),
              "block i of $R(m)^T R(n)$, any even D, $i = 0 \\ldots D/2 - 1$, $\\theta_i = base^{-2i/D}$")
      .step(B((n - m) * theta_i), "block-diagonal matrices multiply blockwise: "
            "$B(m\\theta_i)^T B(n\\theta_i) = B((n - m)\\theta_i)$, block i of $R(n - m)$", by="trig"))
    for D in p.cases(D=CASES):
        p.claim(R(m, D).T * R(n, D), R(n - m, D),
                "explicit D: the block identity with angles $m\\theta_i$, $n\\theta_i$", by="trig",
                shown=(_prod(_T(R(m, D)), R(n, D)), None))
    for D in (4, 8):
        p.tie(RMAT, expected=R(n - m, D, 10000), symbols=(m, n), points=_POINTS,
              call=lambda f, x, y: f(x, D).T @ f(y, D), reason=f"R(m)^T R(n), D = {D}")


@theorem("rope.relative.headline",
         "R(m) R(n)^T = R(m - n) for the block-diagonal RoPE matrix of any even D; the score of the "
         "rotated column vectors is <R(m) q, R(n) k> = q^T R(m)^T R(n) k = q^T R(n - m) k, a function "
         "of n - m only",
         checks=(RMAT, APPLY),
         latex=r"\begin{aligned}"
               r"R(m)\,R(n)^\top &= R(m - n) && \text{blockwise: } B(a)\,B(b)^\top = B(a)\,B(-b) = B(a - b) \\"
               r"\langle R(m)\,q, R(n)\,k\rangle &= q^\top R(m)^\top R(n)\,k = q^\top R(n - m)\,k"
               r" && \text{column vectors; } R(m)^\top R(n) = R(n - m) \\"
               r"&= \mathrm{Re}\Big[\sum_{i=0}^{D/2-1} q_{[i]}\,\overline{k_{[i]}}\,e^{\mathrm{i}(m - n)\theta_i}\Big]"
               r" && \text{RoFormer's complex form, } q_{[i]} = q_{2i} + \mathrm{i}\,q_{2i+1},"
               r"\ k_{[i]} = k_{2i} + \mathrm{i}\,k_{2i+1}"
               r"\end{aligned}")
def _(p):
    (p.derive(sp.MatMul(B(a), B_T(b), evaluate=False))
      .step(sp.MatMul(B(a), B_shown(-b), evaluate=False), "$B(b)^T = B(-b)$")
      .step(B(a - b), "$B(a) B(b) = B(a + b)$", by="trig"))
    (p.derive(sp.MatMul(B(m * theta_i), B_T(n * theta_i), evaluate=False),
              "block i of $R(m) R(n)^T$, any even D, $i = 0 \\ldots D/2 - 1$, $\\theta_i = base^{-2i/D}$")
      .step(B((m - n) * theta_i), "block-diagonal matrices multiply blockwise: "
            "$B(m\\theta_i) B(n\\theta_i)^T = B((m - n)\\theta_i)$, block i of $R(m - n)$", by="trig"))
    for D in p.cases(D=CASES):
        p.claim(R(m, D) * R(n, D).T, R(m - n, D), "explicit D: blockwise, for each pair i", by="trig",
                shown=(_prod(R(m, D), _T(R(n, D))), None))
    D = 4
    q, k = vec("q", D), vec("k", D)
    with p.folded("the score at D = 4, entry by entry"):
        (p.derive(((R(m, D) * q).T * (R(n, D) * k))[0, 0], "$\\langle R(m) q, R(n) k \\rangle$, D = 4")
          .step((q.T * R(m, D).T * R(n, D) * k)[0, 0], "$(R q)^T = q^T R^T$", by="expand")
          .step((q.T * R(n - m, D) * k)[0, 0], "$R(m)^T R(n) = R(n - m)$ (rope.relative.transpose_left): "
                "m and n enter only as n - m", by="trig"))
    for D in (4, 8):
        p.tie(RMAT, expected=R(m - n, D, 10000), symbols=(m, n), points=_POINTS,
              call=lambda f, x, y: f(x, D) @ f(y, D).T, reason=f"R(m) R(n)^T, D = {D}")
    _tie_score(p)


def _tie_score(p):
    """apply_rope(q, m) . apply_rope(k, n) = q^T R(n - m) k in both layouts (q, k fixed, D = 8)."""
    D = 8
    rng = np.random.default_rng(1)
    qv, kv = rng.normal(size=D), rng.normal(size=D)
    for layout, Rl in (("interleaved", R), ("half", R_half)):
        want = (sp.Matrix(qv).T * Rl(n - m, D, 10000) * sp.Matrix(kv))[0, 0]
        p.tie(APPLY, expected=want, symbols=(m, n), points=_POINTS,
              call=lambda f, x, y: f(qv[None], [x], layout=layout)[0] @ f(kv[None], [y], layout=layout)[0],
              reason=f"score <R(m) q, R(n) k> = q^T R(n - m) k, {layout}, D = 8")


@theorem("rope.orthogonal", "R(m) is orthogonal with determinant 1", checks=(RMAT,))
def _(p):
    p.claim(B(a).T * B(a), sp.eye(2), "$\\cos^2 + \\sin^2 = 1$", by="pythagoras",
            shown=(_prod(_T(B(a)), B(a)), None))
    p.claim(B(a).det(), 1, "$\\det B(a) = \\cos^2 + \\sin^2 = 1$", by="pythagoras")
    for D in p.cases(D=CASES):
        p.claim(R(m, D).T * R(m, D), sp.eye(D), "blockwise: $B^T B = I$", by="pythagoras",
                shown=(_prod(_T(R(m, D)), R(m, D)), None))
        p.claim(sp.prod([B(m * t).det() for t in thetas(D)]), 1,
                "det of a block-diagonal matrix = product of block dets = 1", by="pythagoras")
    for D in (2, 8):
        p.tie(RMAT, expected=sp.eye(D), symbols=(m,), points=[(0,), (3,), (4097,)],
              call=lambda f, x: f(x, D).T @ f(x, D), reason=f"R(m)^T R(m) = I, D = {D}")
        p.tie(RMAT, expected=sp.Integer(1), symbols=(m,), points=[(0,), (3,), (4097,)],
              call=lambda f, x: np.linalg.det(f(x, D)), reason=f"det R(m) = 1, D = {D}")


@theorem("rope.complex",
         "(x_{2k} + i x_{2k+1}) e^{i m θ_k} is the real rotation of the pair (x_{2k}, x_{2k+1})",
         checks=(APPLY,))
def _(p):
    x0, x1, t = sp.symbols("x0 x1 theta", real=True)
    z = sp.expand((x0 + sp.I * x1) * sp.exp(sp.I * m * t))
    product = sp.Mul(x0 + sp.I * x1, sp.exp(sp.I * m * t), evaluate=False)
    (p.derive(sp.Matrix([sp.re(z), sp.im(z)]), "real and imaginary parts of the product",
              shown=sp.Matrix([sp.re(product, evaluate=False), sp.im(product, evaluate=False)]))
      .step(sp.Matrix([x0 * sp.cos(m * t) - x1 * sp.sin(m * t), x0 * sp.sin(m * t) + x1 * sp.cos(m * t)]),
            "Euler: $e^{i m\\theta} = \\cos m\\theta + i \\sin m\\theta$", by="complex")
      .step(B(m * t) * sp.Matrix([x0, x1]), "as the block $B(m\\theta)$", by="expand",
            shown=_prod(B(m * t), sp.Matrix([x0, x1]))))
    D = 8
    x = vec("x", D)
    zs = [sp.expand_complex((x[2 * j] + sp.I * x[2 * j + 1]) * sp.exp(sp.I * m * th))
          for j, th in enumerate(thetas(D, 10000))]
    want = sp.Matrix([part for zj in zs for part in (sp.re(zj), sp.im(zj))])
    rng = np.random.default_rng(2)
    pts = [(mm, *rng.normal(size=D)) for mm in (0, 5, 4097)]
    p.tie(APPLY, expected=want, symbols=(m, *x), points=pts,
          call=lambda f, mm, *xv: f(np.array([xv]), [mm])[0][:, None],
          reason="Meta LLaMA's complex multiplication = apply_rope interleaved, D = 8")


@theorem("rope.layouts",
         "R_half(m) = P R(m) P^T for the layout permutation P, so the layouts agree once the "
         "q/k weight columns are permuted",
         checks=(RMAT, "minipos.rope.layout_permutation", APPLY),
         latex=r"\begin{aligned}"
               r"R_{half}(m) &= P\,R(m)\,P^\top && (P x)_j = x_{perm[j]},\ "
               r"perm = (0, 2, \dots, D - 2, 1, 3, \dots, D - 1) \\"
               r"\big(R_{half}(m)\,P q\big)^\top \big(R_{half}(n)\,P k\big) &= (P\,R(m)\,q)^\top (P\,R(n)\,k)"
               r" = (R(m)\,q)^\top (R(n)\,k) && P^\top P = I"
               r"\end{aligned}")
def _(p):
    for D in p.cases(D=CASES):
        p.claim(R_half(m, D), P(D) * R(m, D) * P(D).T, "pair i moves from (2i, 2i + 1) to (i, i + D/2)",
                shown=(None, _prod(P(D), R(m, D), _T(P(D)))))
    D = 4
    q, k = vec("q", D), vec("k", D)
    Pm = P(D)
    with p.folded("the score at D = 4"):
        (p.derive(((R_half(m, D) * Pm * q).T * (R_half(n, D) * Pm * k))[0, 0],
                  "half layout on permuted q, k (q/k weight columns permuted)",
                  shown=_prod(_T(_prod(R_half(m, D), Pm, q)), _prod(R_half(n, D), Pm, k)))
          .step(((Pm * R(m, D) * q).T * (Pm * R(n, D) * k))[0, 0], "$R_{half}(m) P = P R(m)$", by="expand",
                shown=_prod(_T(_prod(Pm, R(m, D), q)), _prod(Pm, R(n, D), k)))
          .step(((R(m, D) * q).T * (R(n, D) * k))[0, 0], "$P^T P = I$: the interleaved score", by="expand",
                shown=_prod(_T(_prod(R(m, D), q)), _prod(R(n, D), k))))
    for D in (2, 8):
        p.tie("minipos.rope.layout_permutation", expected=sp.Matrix(perm(D)), points=[()],
              call=lambda f: f(D)[:, None], reason=f"perm = evens then odds, D = {D}")
        p.tie(RMAT, expected=R_half(m, D, 10000), symbols=(m,), points=[(0,), (3,), (4097,)],
              call=lambda f, x: f(x, D, layout="half"), reason=f"half layout, D = {D}")
    D = 8
    x = vec("x", D)
    rng = np.random.default_rng(3)
    pts = [(mm, *rng.normal(size=D)) for mm in (0, 5, 4097)]
    pm = perm(D)
    p.tie(APPLY, expected=(P(D) * R(m, D, 10000) * x), symbols=(m, *x), points=pts,
          call=lambda f, mm, *xv: f(np.array([xv])[:, pm], [mm], layout="half")[0][:, None],
          reason="apply_rope(x[perm], half) = (R(m) x)[perm], D = 8")


def rotate_half_sym(x):
    h = len(x) // 2
    return sp.Matrix([-v for v in x[h:]] + list(x[:h]))


def rotate_half_matrix(D):
    """rotate_half as a matrix: J = [[0, -I], [I, 0]] with I the (D/2, D/2) identity, (D, D)."""
    h = D // 2
    return sp.Matrix(sp.BlockMatrix([[sp.zeros(h), -sp.eye(h)], [sp.eye(h), sp.zeros(h)]]))


@theorem("rope.rotate_half",
         "x * cos(mΘ) + rotate_half(x) * sin(mΘ) = R(m) x in the half layout (RoFormer Eq. 34)",
         checks=("minipos.rope.rotate_half", APPLY),
         latex=r"\begin{aligned}"
               r"\mathrm{rotate\_half}(x) &= J x, \quad J = \begin{pmatrix} 0 & -I_{D/2} \\ I_{D/2} & 0 "
               r"\end{pmatrix} && [x_1 \mid x_2] \mapsto [-x_2 \mid x_1] \\"
               r"x \odot \cos(m\Theta) + (J x) \odot \sin(m\Theta) &= R_{half}(m)\,x"
               r" && \Theta = (\theta_0, \dots, \theta_{D/2-1}, \theta_0, \dots, \theta_{D/2-1}) \\"
               r"\text{entries } i,\ i + D/2 &= \begin{pmatrix} x_i \cos m\theta_i - x_{i+D/2} \sin m\theta_i \\"
               r" x_{i+D/2} \cos m\theta_i + x_i \sin m\theta_i \end{pmatrix}"
               r" = B(m\theta_i) \begin{pmatrix} x_i \\ x_{i+D/2} \end{pmatrix}"
               r" && \text{block } i \text{ of } R_{half}(m) \text{ on features } (i, i + D/2)"
               r"\end{aligned}")
def _(p):
    for D in p.cases(D=CASES):
        x = vec("x", D)
        ang = [m * t for t in thetas(D)] * 2          # θ_0 … θ_{D/2-1}, θ_0 … θ_{D/2-1}
        cos, sin = sp.Matrix([sp.cos(v) for v in ang]), sp.Matrix([sp.sin(v) for v in ang])
        shown = sp.MatAdd(sp.HadamardProduct(_M(x), _M(cos)),
                          sp.HadamardProduct(_prod(rotate_half_matrix(D), x), _M(sin)), evaluate=False)
        p.claim(x.multiply_elementwise(cos) + rotate_half_sym(x).multiply_elementwise(sin),
                R_half(m, D) * x, "entry i: $x_i \\cos - x_{i+D/2} \\sin$; entry i + D/2: "
                "$x_{i+D/2} \\cos + x_i \\sin$", by="expand", shown=(shown, _prod(R_half(m, D), x)))
    D = 8
    x = vec("x", D)
    rng = np.random.default_rng(4)
    xs = [tuple(rng.normal(size=D)) for _ in range(2)]
    p.tie("minipos.rope.rotate_half", expected=rotate_half_sym(x), symbols=tuple(x), points=xs,
          call=lambda f, *xv: f(np.array(xv))[:, None], reason="[x1 | x2] -> [-x2 | x1], D = 8")
    pts = [(mm, *xv) for mm in (0, 5, 4097) for xv in xs[:1]]
    for layout, Rl in (("half", R_half), ("interleaved", R)):
        p.tie(APPLY, expected=Rl(m, D, 10000) * x, symbols=(m, *x), points=pts,
              call=lambda f, mm, *xv: f(np.array([xv]), [mm], layout=layout)[0][:, None],
              reason=f"apply_rope = R(m) x, {layout}, D = 8")


@theorem("rope.abel",
         "sum_i h_i e^{i m θ_i} = -sum_i S_{i+1} (h_{i+1} - h_i), S_j = sum_{k<j} e^{i m θ_k}, "
         "h_{D/2} = 0 (RoFormer §3.4.3)",
         latex=r"\begin{aligned}"
               r"\sum_{i=0}^{N-1} h_i\,e^{\mathrm{i} m\theta_i} &= \sum_{i=0}^{N-1} h_i\,(S_{i+1} - S_i)"
               r" && e^{\mathrm{i} m\theta_i} = S_{i+1} - S_i,\ S_j = \sum_{k<j} e^{\mathrm{i} m\theta_k},\ "
               r"N = D/2 \\"
               r"&= \sum_{i=0}^{N-1} h_i\,S_{i+1} - \sum_{i=0}^{N-1} h_{i+1}\,S_{i+1}"
               r" && \text{shift the index of the second sum; } S_0 = 0,\ h_N = 0 \\"
               r"&= -\sum_{i=0}^{N-1} S_{i+1}\,(h_{i+1} - h_i) && \text{Abel summation}"
               r"\end{aligned}")
def _(p):
    for N in p.cases(N=[4, 1, 2, 3, 5, 6]):            # N = D/2 pairs
        h = list(sp.symbols(f"h0:{N}")) + [sp.Integer(0)]  # h_N = 0
        e = [sp.exp(sp.I * m * t) for t in sp.symbols(f"theta0:{N}", real=True)]
        S = [sum(e[:j], sp.Integer(0)) for j in range(N + 1)]  # S_0 = 0, S_j = sum_{k<j} e_k
        Sn = sp.symbols(f"S0:{N + 1}")                          # S_j by name, for display
        sums = lambda terms: sp.latex(sp.Add(*terms, evaluate=False), order="none")  # noqa: E731
        (p.derive(sum(h[i] * e[i] for i in range(N)))
          .step(sum(h[i] * (S[i + 1] - S[i]) for i in range(N)), "$e_i = S_{i+1} - S_i$", by="expand",
                shown=sums([h[i] * (Sn[i + 1] - Sn[i]) for i in range(N)]))
          .step(sum(h[i] * S[i + 1] for i in range(N)) - sum(h[i + 1] * S[i + 1] for i in range(N)),
                "split the sum; shift the index of the second; $S_0 = 0$, $h_N = 0$", by="expand",
                shown=sums([h[i] * Sn[i + 1] for i in range(N)] + [-h[i + 1] * Sn[i + 1] for i in range(N - 1)]))
          .step(-sum(S[i + 1] * (h[i + 1] - h[i]) for i in range(N)), "collect (Abel summation)",
                by="expand", shown=sums([-Sn[i + 1] * (h[i + 1] - h[i]) for i in range(N)])))


Delta = sp.Symbol("Delta", real=True)
_ZERO_MEAN_UNIT = {0: 1, 1: 0, 2: 1}   # E[x^n] for one feature: zero mean, unit variance


def _blocks_sum(M):
    """The sum of the entries of M, as an expression."""
    return sum(M[r, c] for r in range(M.rows) for c in range(M.cols))


@theorem("rope.score.expectation",
         "For independent zero-mean q, k: E[q^T R(Delta) k] = 0 and, with unit-variance features, "
         "Var[q^T R(Delta) k] = D at every distance Delta; only correlated q, k have a mean that "
         "moves with Delta (for q = k: E[q^T R(Delta) q] = tr R(Delta) = 2 sum_i cos(Delta theta_i))",
         checks=("minipos.rope.long_term_decay",))
def _(p):
    from .attention import _expect                      # E over independent entries, by moments
    mu = {0: 1, **{k_: sp.Symbol(f"mu{k_}") for k_ in (1, 2)}}   # E[q_a^n], the same for every a
    nu = {0: 1, **{k_: sp.Symbol(f"nu{k_}") for k_ in (1, 2)}}   # E[k_b^n]
    E = sp.Function("E")
    for D in p.cases(D=[4, 2]):
        q, k, Rd = vec("q", D), vec("k", D), R(Delta, D, 10000)
        score = (q.T * Rd * k)[0, 0]                                       # q^T R(Δ) k
        (p.derive(E(score), "the score $s = q^\\top R(\\Delta) k$", shown=r"E[q^\top R(\Delta)\,k]")
          .step(mu[1] * nu[1] * _blocks_sum(Rd),
                "linearity and independence: $E[q_a k_b] = \\mu_1 \\nu_1$ for every entry $R_{ab}$",
                using={E: lambda e: _expect(e, list(q), list(k), mu, nu)})
          .step(sp.Integer(0), "zero mean: $\\mu_1 = 0$", using={mu[1]: 0}))
        (p.derive(E(score ** 2) - E(score) ** 2, "$\\mathrm{Var}[s] = E[s^2] - E[s]^2$",
                  shown=r"E[s^2] - E[s]^2")
          .step(_blocks_sum(Rd.applyfunc(lambda r: r ** 2)),
                "independent, zero mean, unit variance: $E[q_a q_{a'}] = \\delta_{aa'}$, "
                "so $\\mathrm{Var} = \\sum_{ab} R_{ab}^2 = \\mathrm{tr}(R R^\\top)$",
                using={E: lambda e: _expect(e, list(q), list(k), _ZERO_MEAN_UNIT, _ZERO_MEAN_UNIT)})
          .step(sp.Integer(D), "$\\cos^2 + \\sin^2 = 1$ in each block: no $\\Delta$ left", by="pythagoras"))
        (p.derive(E((q.T * Rd * q)[0, 0]), "$q = k$: correlated", shown=r"E[q^\top R(\Delta)\,q]")
          .step(Rd.trace(), "$E[q_a q_{a'}] = \\delta_{aa'}$ keeps the diagonal: $\\mathrm{tr}\\,R(\\Delta)$",
                using={E: lambda e: _expect(e, list(q), [], _ZERO_MEAN_UNIT, {})}, shown=r"\mathrm{tr}\,R(\Delta)")
          .step(2 * sum(sp.cos(Delta * t) for t in thetas(D, 10000)),
                "each block contributes $2\\cos(\\Delta\\theta_i)$"))
    p.tie("minipos.rope.long_term_decay", expected=2 * sum(sp.cos(Delta * t) for t in thetas(8, 10000)),
          symbols=(Delta,), points=[(0,), (1,), (7,), (300,), (4097,)],
          call=lambda f, d: f(8, np.array([d]))[1][0],
          reason="the all-ones score of long_term_decay is E[q^T R(Delta) q] for unit-variance q, D = 8")
