r"""2-D (axial) RoPE for vision towers (Pixtral, Gemma 4, Llama 4, Qwen, Kimi K2.5; Heo et al. 2024, arXiv:2403.13298),
and MiniMax M3's 3-D one (a frame axis too).

A patch at row r and column c turns pair i, features (a_i, b_i), by B(p_{s(i)} ω_i), p_0 = r, p_1 = c:
R(r, c) = a block-diagonal rotation (in a permuted basis) whose blocks are B(r ω_i) or B(c ω_i).

- Relative in each axis separately: B(a)^T B(b) = B(b - a) blockwise, so
  <R(r, c) q, R(r', c') k> = q^T R(r' - r, c' - c) k, unchanged by a shift of the rows alone or of the
  columns alone; not a function of the distance in the flattened sequence. Scaled coordinates (SAM 3's global
  layers, position_scale s) give R(s (r' - r), s (c' - c)): still relative per axis, the offsets scaled.
- The frequencies: Pixtral's rows take RoPE's even-indexed θ_{2i} = base^(-4i/D), its columns the
  odd-indexed θ_{2i+1} = base^(-4i/D) base^(-2/D); Gemma 4, Llama 4, Qwen and Kimi K2.5 give both axes
  f_i = base^(-2i/(D/2)) = base^(-4i/D), a D/2-dim RoPE's (Qwen in Pixtral's pairs (i, i + D/2), rows first; Kimi
  in the same pairs, pair 2j the column's and 2j + 1 the row's, both at f_j).
- MiniMax M3 (layout minimax_m3): positions (frame, row, column), F = (D // 3) // 2, pairs (i, i + 3F) for i < 3F,
  by the frame, the row, then the column, F pairs each, all three at φ_j = base^(-2j/(2F)) = base^(-j/F); the last
  D - 6F features pass through. Relative in each of the three axes: R(t, r, c)^T R(t', r', c') = R(t' - t, r' - r,
  c' - c).
- A class token turned by learned angles θ_i (MLCD's class_pos_emb) instead of a position: d/dθ B(θ) = B(θ + π/2), so
  the gradient of θ_i is dy_0 · B(θ_i + π/2) x_0 over its pair i (class_angles_backward).
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minipos import axial as code

from .core import theorem
from .rope import B, B_T, B_shown

PAIRS, APPLY = "minipos.axial.axial_pairs", "minipos.axial.apply_axial_rope"
base = sp.Symbol("base", positive=True)
D_ = sp.Symbol("D", integer=True, positive=True)
i_ = sp.Symbol("i", integer=True, nonnegative=True)
r, c, r2, c2, w = sp.symbols("r c r' c' omega", real=True)
t, t2 = sp.symbols("t t'", real=True)


def table(D, layout, b_=base):
    """The layouts' table (module docstring of minipos.axial), written out: [(a, b, axis, ω)] per pair."""
    q = D // 4
    theta = [b_ ** sp.Rational(-2 * j, D) for j in range(D // 2)]
    f = [b_ ** sp.Rational(-4 * j, D) for j in range(q)]
    if layout == "pixtral":
        return [(i, i + D // 2, 0 if i < q else 1, theta[2 * i] if i < q else theta[2 * (i - q) + 1])
                for i in range(D // 2)]
    if layout == "gemma4":
        return [(i, i + q, 1, f[i]) if i < q else (D // 2 + i - q, D // 2 + i, 0, f[i - q]) for i in range(D // 2)]
    if layout == "qwen":
        return [(i, i + D // 2, 0 if i < q else 1, f[i % q]) for i in range(D // 2)]
    if layout == "kimi":
        return [(i, i + D // 2, 1 if i % 2 == 0 else 0, f[i // 2]) for i in range(D // 2)]
    if layout == "minimax_m3":                         # axis 0 the frame, 1 the row, 2 the column; D - 6F pass
        F = (D // 3) // 2
        return [(i, i + 3 * F, i // F, b_ ** sp.Rational(-(i % F), F)) for i in range(3 * F)]
    return [(2 * i, 2 * i + 1, 1 if i < q else 0, f[i % q]) for i in range(D // 2)]


def R(pos, D, layout, b_=base):
    """R(pos), (D, D): block [[cos, -sin], [sin, cos]] of angle pos[axis] ω on features (a, b); a feature in no pair
    (minimax_m3's last D - 6F) keeps its 1 on the diagonal."""
    M = sp.eye(D)
    for a, b, axis, om in table(D, layout, b_):
        ang = pos[axis] * om
        M[a, a], M[a, b], M[b, a], M[b, b] = sp.cos(ang), -sp.sin(ang), sp.sin(ang), sp.cos(ang)
    return M


def R2(row, col, D, layout, b_=base):
    """R(row, col), (D, D), a 2-D layout's."""
    return R((row, col), D, layout, b_)


def R3(frame, row, col, D, b_=base):
    """R(frame, row, col), (D, D), MiniMax M3's 3-D layout."""
    return R((frame, row, col), D, "minimax_m3", b_)


@theorem("axial.relative.per_axis",
         "<R(r, c) q, R(r', c') k> = q^T R(r' - r, c' - c) k: relative in the rows and in the columns separately, "
         "unchanged by a shift of either axis alone, and not a function of the flattened distance",
         checks=(APPLY,))
def _(p):
    (p.derive(sp.MatMul(B_T(r * w), B(r2 * w), evaluate=False), "a row pair, frequency $\\omega$")
      .step(sp.MatMul(B_shown(-r * w), B(r2 * w), evaluate=False), "$B(a)^T = B(-a)$")
      .step(B((r2 - r) * w), "$B(a) B(b) = B(a + b)$: the row offset only", by="trig"))
    p.claim(sp.MatMul(B_T(c * w), B(c2 * w), evaluate=False), B((c2 - c) * w),
            "a column pair likewise: the column offset only", by="trig")
    for layout in p.cases(layout=["pixtral", "gemma4", "llama4", "qwen", "kimi"]):
        p.claim(R2(r, c, 4, layout).T * R2(r2, c2, 4, layout), R2(r2 - r, c2 - c, 4, layout),
                "D = 4, blockwise: $R(r, c)^T R(r', c') = R(r' - r, c' - c)$", by="trig")
    qv = sp.Matrix([1, 0, 0, 0])
    score = (qv.T * R2(r, c, 4, "pixtral").T * R2(r2, c2, 4, "pixtral") * qv)[0, 0]
    p.refute(score.subs({r: 0, c: 3, r2: 1, c2: 0}), score.subs({r: 0, c: 0, r2: 0, c2: 1}), {base: 100},
             "on a 4-wide grid, (0, 3) -> (1, 0) and (0, 0) -> (0, 1) are both one step apart in the sequence: "
             "$\\cos 1 \\ne 1$")
    rng = np.random.default_rng(7)
    qn, kn = rng.normal(size=8), rng.normal(size=8)
    pts = [(0, 0, 0, 0), (2, 5, 7, 1), (9, 0, 3, 12), (-4, 6, 30, -8)]
    for layout in ("pixtral", "gemma4", "llama4", "qwen", "kimi"):
        want = (sp.Matrix(qn).T * R2(r2 - r, c2 - c, 8, layout, 10000) * sp.Matrix(kn))[0, 0]
        p.tie(APPLY, expected=want, symbols=(r, c, r2, c2), points=pts, rtol=1e-10,
              call=lambda f, a, b, a2, b2, layout=layout: (f(qn[None], np.array([[a], [b]]), layout=layout)[0]
                                                           @ f(kn[None], np.array([[a2], [b2]]), layout=layout)[0]),
              reason=f"score = q^T R(r' - r, c' - c) k, {layout}, D = 8")
    p.claim(R3(t, r, c, 7).T * R3(t2, r2, c2, 7), R3(t2 - t, r2 - r, c2 - c, 7),
            "MiniMax M3, D = 7 (F = 1: one pair per axis, feature 6 unrotated), the 7 x 7 matrices compared entry by "
            "entry", by="trig", shown=("R(t, r, c)^T R(t', r', c')", "R(t' - t, r' - r, c' - c)"))
    pts3 = [(0, 0, 0, 0, 0, 0), (1, 2, 5, 3, 7, 1), (4, 9, 0, 0, 3, 12), (-2, -4, 6, 5, 30, -8)]
    q14, k14 = rng.normal(size=14), rng.normal(size=14)
    want = (sp.Matrix(q14).T * R3(t2 - t, r2 - r, c2 - c, 14, 10000) * sp.Matrix(k14))[0, 0]
    p.tie(APPLY, expected=want, symbols=(t, r, c, t2, r2, c2), points=pts3, rtol=1e-10,
          call=lambda f, a0, a, b, a2, b2, b3: (f(q14[None], np.array([[a0], [a], [b]]), layout="minimax_m3")[0]
                                                @ f(k14[None], np.array([[a2], [b2], [b3]]), layout="minimax_m3")[0]),
          reason="score = q^T R(t' - t, r' - r, c' - c) k, minimax_m3, D = 14 (F = 2, two features unrotated)")
    pos_q3 = np.array([[0, 1, 1], [0, 3, 5], [1, 4, 0]])
    pos_k3 = np.array([[2, 0, 1], [2, 2, 7], [6, 0, 3]])

    def scores3(shift, k_shift=None):
        qs = code.apply_axial_rope(np.tile(q14, (3, 1)), pos_q3 + shift, layout="minimax_m3")
        ks = code.apply_axial_rope(np.tile(k14, (3, 1)), pos_k3 + (shift if k_shift is None else k_shift),
                                   layout="minimax_m3")
        return qs @ ks.T
    p.require(all(np.allclose(scores3(np.array(sh)[:, None]), scores3(0), rtol=1e-12, atol=1e-12)
                  for sh in ((5, 0, 0), (0, 9, 0), (0, 0, -3), (2, -1, 40))),
              "apply_axial_rope, minimax_m3: shifting the frames alone, the rows alone, the columns alone, or all "
              "three, leaves every score unchanged")
    p.require(not np.allclose(scores3(np.array([[1], [0], [0]]), 0), scores3(np.array([[0], [1], [0]]), 0)),
              "apply_axial_rope, minimax_m3: the frame is an axis of its own (the queries one frame on and one row on "
              "give other scores)")
    s_ = sp.Symbol("s", positive=True)
    p.claim(R2(s_ * r, s_ * c, 4, "llama4").T * R2(s_ * r2, s_ * c2, 4, "llama4"),
            R2(s_ * (r2 - r), s_ * (c2 - c), 4, "llama4"),
            "scaled coordinates ($s$ = position_scale, SAM 3's global layers): the offsets scaled by $s$", by="trig")
    want = (sp.Matrix(qn).T * R2((r2 - r) / 3, (c2 - c) / 3, 8, "llama4", 10000) * sp.Matrix(kn))[0, 0]
    p.tie(APPLY, expected=want, symbols=(r, c, r2, c2), points=pts, rtol=1e-10,
          call=lambda f, a, b, a2, b2: (f(qn[None], np.array([[a], [b]]), layout="llama4", position_scale=1 / 3)[0]
                                        @ f(kn[None], np.array([[a2], [b2]]), layout="llama4", position_scale=1 / 3)[0]),
          reason="score = q^T R((r' - r) / 3, (c' - c) / 3) k, llama4 with position_scale 1/3, D = 8")
    pos_q, pos_k = np.array([[0, 3, 5], [1, 4, 0]]), np.array([[2, 2, 7], [6, 0, 3]])
    for layout in ("pixtral", "gemma4", "llama4", "qwen", "kimi"):
        def scores(shift, layout=layout):
            qs = code.apply_axial_rope(np.tile(qn, (3, 1)), pos_q + shift, layout=layout)
            ks = code.apply_axial_rope(np.tile(kn, (3, 1)), pos_k + shift, layout=layout)
            return qs @ ks.T
        p.require(all(np.allclose(scores(np.array([[sr], [sc]])), scores(0), rtol=1e-12, atol=1e-12)
                      for sr, sc in ((5, 0), (0, 9), (-3, 40))),
                  f"apply_axial_rope, {layout}: shifting the rows alone, the columns alone, or both, leaves "
                  "every score unchanged")


@theorem("axial.frequencies",
         "Pixtral: rows θ_{2i} = base^(-4i/D), columns θ_{2i+1} = base^(-4i/D) base^(-2/D) (RoPE's even and odd "
         "frequencies); Gemma 4, Llama 4, Qwen and Kimi K2.5: both axes f_i = base^(-2i/(D/2)) = base^(-4i/D)",
         checks=(PAIRS,))
def _(p):
    (p.derive(base ** (-2 * (2 * i_) / D_), "Pixtral's row frequency $\\theta_{2i}$",
              shown="\\theta_{2i} = base^{-2 (2i) / D}")
      .step(base ** (-4 * i_ / D_), "$2 \\cdot 2i = 4i$", by="simplify"))
    (p.derive(base ** (-2 * (2 * i_ + 1) / D_), "Pixtral's column frequency $\\theta_{2i+1}$")
      .step(base ** (-4 * i_ / D_) * base ** (-2 / D_), "$b^{x + y} = b^x b^y$", by="simplify"))
    p.claim(base ** (-2 * i_ / (D_ / 2)), base ** (-4 * i_ / D_), "a $D/2$-dim RoPE's $f_i$", by="simplify",
            shown=("f_i = base^{-2i / (D/2)}", None))
    F_, j_ = sp.Symbol("F", integer=True, positive=True), sp.Symbol("j", integer=True, nonnegative=True)
    p.claim(base ** (-2 * j_ / (2 * F_)), base ** (-j_ / F_), "MiniMax M3's $\\varphi_j$, a $2F$-dim RoPE's "
            "(HF arange(0, 2F, 2) / 2F)", by="simplify", shown=("\\varphi_j = base^{-2j / (2F)}", None))
    for layout in ("pixtral", "gemma4", "llama4", "qwen", "kimi", "minimax_m3"):
        def expected(D, b_, layout=layout):
            rows = table(D, layout, b_)
            return np.array([[a, b, axis, float(om)] for a, b, axis, om in rows])
        p.tie(PAIRS, expected=expected, points=[(8, 10000.0), (16, 100.0), (64, 1e6)], rtol=1e-14, atol=0.0,
              call=lambda f, D, b_, layout=layout: np.stack([x.astype(float) for x in f(D, base=b_, layout=layout)],
                                                            axis=-1),
              reason=f"{layout}: pairs, axes and frequencies against the table")
    om = code.axial_pairs(16, layout="pixtral")[3]
    p.require(np.allclose(om[:4], code.axial_pairs(16, layout="llama4")[3][:4], rtol=1e-15, atol=0.0),
              "Pixtral's row frequencies are Gemma 4's and Llama 4's f_i; its columns sit half a step lower")
    qwen = code.axial_pairs(16, layout="qwen")
    p.require(np.array_equal(qwen[0], code.axial_pairs(16, layout="pixtral")[0])
              and np.array_equal(qwen[3][:4], qwen[3][4:]) and np.allclose(qwen[3][:4], om[:4], rtol=1e-15, atol=0.0),
              "Qwen pairs features as Pixtral does (i, i + D/2), and gives its rows and its columns the same f_i, "
              "Pixtral's row frequencies")
    kimi = code.axial_pairs(16, layout="kimi")
    p.require(np.array_equal(kimi[0], qwen[0]) and np.array_equal(np.sort(kimi[3]), np.sort(qwen[3]))
              and np.array_equal(kimi[2][0::2], np.ones(4)) and np.array_equal(kimi[2][1::2], np.zeros(4)),
              "Kimi K2.5 pairs features and takes frequencies as Qwen does; only the axes alternate, the column first")
    for D, F in ((80, 13), (32, 5), (7, 1)):                     # MiniMax M3's default head dim 80: 78 rotated
        a, b, axis, om = code.axial_pairs(D, layout="minimax_m3")
        p.require(len(a) == 3 * F and b[-1] == 6 * F - 1 and np.array_equal(axis, np.repeat([0, 1, 2], F))
                  and np.array_equal(om[:F], om[F:2 * F]) and np.array_equal(om[:F], om[2 * F:]),
                  f"minimax_m3, D = {D}: F = {F}, pairs (i, i + 3F) over the first 6F = {6 * F} features, frame, row, "
                  "column in thirds at the same frequencies")


GRAD = "minipos.axial.class_angles_backward"


@theorem("axial.class_angles",
         "a class token turned by learned angles θ_i (MLCD's class_pos_emb): d/dθ B(θ) = B(θ + π/2), so the gradient "
         "of θ_i is dy_0 · B(θ_i + π/2) x_0 over the class token's pair i",
         checks=(GRAD, APPLY))
def _(p):
    th = sp.Symbol("theta", real=True)
    (p.derive(sp.diff(B(th), th), shown="\\frac{d}{d\\theta} B(\\theta)")
      .step(B_shown(th + sp.pi / 2), "entry by entry: $\\cos' = -\\sin = \\cos(\\theta + \\pi/2)$, $\\sin' = "
            "\\cos = \\sin(\\theta + \\pi/2)$: the rotation by $\\theta + \\pi/2$", by="trig"))
    # qwen, D = 4: the class token's pairs (0, 2) and (1, 3) turn by θ_0 and θ_1; L = dy_0 · y_0.
    th0, th1 = sp.symbols("theta_0 theta_1", real=True)
    x, dy, e = [1, 2, -1, 3], [sp.Rational(1, 2), -1, 2, 1], [1, -2]
    pairs = [(a, b, angle) for (a, b, _, _), angle in zip(table(4, "qwen"), (th0, th1))]
    L = sum((sp.Matrix([dy[a], dy[b]]).T * B(angle) * sp.Matrix([x[a], x[b]]))[0, 0] for a, b, angle in pairs)
    turned = sum((sp.Matrix([dy[a], dy[b]]).T * B(angle + sp.pi / 2) * sp.Matrix([x[a], x[b]]))[0, 0] * ei
                 for (a, b, angle), ei in zip(pairs, e))
    p.claim(e[0] * sp.diff(L, th0) + e[1] * sp.diff(L, th1), turned,
            "qwen, D = 4: the derivative of $L = dy_0 \\cdot y_0$ along $e = (1, -2)$ is each pair turned by "
            "$\\theta_i + \\pi/2$", by="trig", shown=("e \\cdot \\nabla_\\theta L", None))
    pts = [(0.0, 0.0), (0.3, -1.2), (2.5, 4.0), (-3.0, 0.7)]
    xn, dyn = np.array(x, float), np.array([float(v) for v in dy])
    p.tie(APPLY, expected=L, symbols=(th0, th1), points=pts, rtol=1e-12,
          call=lambda f, a, b: float(dyn @ f(xn[None], np.zeros((2, 1), int), layout="qwen", class_angles=[a, b])[0]),
          reason="token 0 (positions (0, 0)) turned by the class angles, not by its position")
    p.tie(GRAD, expected=turned, symbols=(th0, th1), points=pts, rtol=1e-12,
          call=lambda f, a, b: float(np.array(e, float) @ f(xn[None], dyn[None], [a, b], layout="qwen")),
          reason="the class angles' gradient along e")
    rng = np.random.default_rng(9)
    xs, dys, ths = rng.normal(size=(3, 2, 5, 8)), rng.normal(size=(3, 2, 5, 8)), rng.normal(size=4)
    others = code.class_angles_backward(np.concatenate([xs[:, :, :1] * 0, xs[:, :, 1:]], axis=2), dys, ths,
                                        layout="qwen")
    p.require(np.all(others == 0), "class_angles_backward reads token 0 only: the patches after it do not turn by θ")
