r"""Sinusoidal positions (Vaswani et al. 2017, arXiv:1706.03762, §3.5).

    PE(pos, 2i) = sin(pos w_i),  PE(pos, 2i + 1) = cos(pos w_i),  w_i = base^(-2i/D),
    i = 0 … D/2 - 1.

Proved here: a shift by k is a fixed linear map M(k) (the paper's "PE_{pos+k} can be
represented as a linear function of PE_pos"); PE(m) . PE(n) depends only on m - n and is even
in it, so it cannot tell before from after; the frequencies and wavelengths (headline form);
the interleaved and split layouts hold the same values up to a column permutation while the
tensor2tensor frequencies differ; and RoPE's frequencies are these w_i (headline).
Each 2x2 (sin, cos) pair is proved with a symbol for the frequency, then the D/2 pairs are
composed and checked at a few explicit D.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem

pos, k, m, n = sp.symbols("pos k m n", real=True)
w = sp.Symbol("w", positive=True)
base = sp.Symbol("base", positive=True)
D_ = sp.Symbol("D", integer=True, positive=True, even=True)
i_ = sp.Symbol("i", integer=True, nonnegative=True)
TABLE = "minipos.sinusoidal.sinusoidal_table"
FREQS = "minipos.sinusoidal.sinusoidal_frequencies"


def freqs(D, b=base):
    """w_i = base^(-2i/D), i = 0 … D/2 - 1 (Vaswani §3.5)."""
    return [b ** sp.Rational(-2 * i, D) for i in range(D // 2)]


def pe(p, D, layout="interleaved", b=base):
    """The row PE(p) as a column vector (D x 1) in ``layout`` ("interleaved" or "split")."""
    ws = freqs(D, b)
    if layout == "interleaved":
        return sp.Matrix([f(p * wi) for wi in ws for f in (sp.sin, sp.cos)])  # (sin, cos) pairs
    return sp.Matrix([sp.sin(p * wi) for wi in ws] + [sp.cos(p * wi) for wi in ws])  # [sin | cos]


def interleaved_columns(p, D, b=base):
    """The row PE(p) built column by column: entry 2i = sin(p w_i), 2i + 1 = cos(p w_i), (D, 1)."""
    col = sp.zeros(D, 1)
    for i, wi in enumerate(freqs(D, b)):  # i = 0 … D/2 - 1
        col[2 * i], col[2 * i + 1] = sp.sin(p * wi), sp.cos(p * wi)
    return col


def shift_block(a):
    """The 2x2 map taking (sin x, cos x) to (sin(x + a), cos(x + a))."""
    return sp.Matrix([[sp.cos(a), sp.sin(a)], [-sp.sin(a), sp.cos(a)]])


def shift_matrix(kk, D, b=base):
    """M(k) = diag(shift_block(k w_0), …, shift_block(k w_{D/2-1})), (D, D)."""
    return sp.diag(*[shift_block(kk * wi) for wi in freqs(D, b)])


@theorem("sinusoidal.shift.linear",
         "PE(pos + k) = M(k) PE(pos), with M(k) block-diagonal rotations depending on k only",
         checks=(TABLE,),
         latex=r"PE(pos + k) = M(k)\,PE(pos), \qquad M(k) = \mathrm{diag}\big(S(k w_0), \dots, "
               r"S(k w_{D/2-1})\big), \qquad S(a) = \begin{pmatrix} \cos a & \sin a \\ -\sin a & \cos a "
               r"\end{pmatrix}")
def _(p):
    pair = lambda x: sp.Matrix([sp.sin(x), sp.cos(x)])  # noqa: E731
    (p.derive(pair((pos + k) * w))
      .step(sp.Matrix([sp.sin(pos * w) * sp.cos(k * w) + sp.cos(pos * w) * sp.sin(k * w),
                       sp.cos(pos * w) * sp.cos(k * w) - sp.sin(pos * w) * sp.sin(k * w)]),
            "angle addition", by="trig")
      .step(shift_block(k * w) * pair(pos * w), "as the matrix $S(k w)$, which does not involve pos, "
            "acting on the pair at pos", by="expand",
            shown=sp.MatMul(sp.ImmutableMatrix(shift_block(k * w)), sp.ImmutableMatrix(pair(pos * w)),
                            evaluate=False)))
    for D in p.cases(D=[4, 2, 6, 8]):
        M = shift_matrix(k, D)
        p.claim(pe(pos + k, D), M * pe(pos, D), "the block identity on each of the D/2 pairs: "
                "$M(k) = \\mathrm{diag}(S(k w_i))$", by="trig",
                shown=(None, sp.MatMul(sp.ImmutableMatrix(M), sp.ImmutableMatrix(pe(pos, D)), evaluate=False)))
        p.require(pos not in M.free_symbols, "M(k) does not depend on pos",
                  f"free symbols of M(k): {M.free_symbols}")
    D = 6
    p.tie(TABLE, expected=shift_matrix(k, D, 10000) * pe(pos, D, b=10000), symbols=(pos, k),
          points=[(0, 1), (3, 5), (17, -4), (250, 1000)],
          call=lambda f, a, b: f(np.array([a + b]), D)[0][:, None],
          reason="sinusoidal_table(pos + k) = M(k) sinusoidal_table(pos), D = 6")


def dot_relative(delta, D, b=base):
    """sum_i cos(delta w_i): what PE(m) . PE(n) equals, with delta = m - n."""
    return sum(sp.cos(delta * wi) for wi in freqs(D, b))


@theorem("sinusoidal.dot.relative",
         "PE(m) . PE(n) = sum_i cos((m - n) w_i): a function of m - n only, even in it",
         checks=(TABLE,))
def _(p):
    (p.derive(sp.sin(m * w) * sp.sin(n * w) + sp.cos(m * w) * sp.cos(n * w))
      .step(sp.cos((m - n) * w), "cos(a - b) = cos a cos b + sin a sin b", by="trig"))
    for D in p.cases(D=[4, 2, 6, 8]):
        (p.derive((pe(m, D).T * pe(n, D))[0, 0])
          .step(dot_relative(m - n, D), "the pair identity, summed over i = 0 … D/2 - 1", by="trig")
          .step(dot_relative(n - m, D), "cos is even: swapping m and n changes nothing", by="expand"))
    D = 8
    p.tie(TABLE, expected=dot_relative(m - n, D, 10000), symbols=(m, n),
          points=[(0, 0), (3, 7), (7, 3), (100, 37), (37, 100)],
          call=lambda f, a, b: f(np.array([a]), D)[0] @ f(np.array([b]), D)[0],
          reason="table rows' dot product, D = 8")


@theorem("sinusoidal.frequencies",
         "w_i = base^(-2i/D) for i = 0 … D/2 - 1, wavelengths 2π / w_i forming a geometric "
         "progression from 2π to 2π · base^((D-2)/D)",
         checks=(FREQS, TABLE))
def _(p):
    def lam(j):  # the wavelength 2π / w_j, kept unevaluated for display
        return sp.Mul(2 * sp.pi, sp.Pow(base ** (-2 * j / D_), -1, evaluate=False), evaluate=False)
    (p.derive(lam(i_), "wavelength of pair i: $2\\pi / w_i$")
      .step(2 * sp.pi * base ** (2 * i_ / D_), "$1 / b^{-x} = b^x$", by="expand"))
    p.claim(lam(0), 2 * sp.pi, "i = 0: the shortest wavelength is $2\\pi$")
    (p.derive(lam(D_ / 2 - 1), "i = D/2 - 1, the last pair")
      .step(2 * sp.pi * base ** ((D_ - 2) / D_), "$2 (D/2 - 1) / D = (D - 2) / D$", by="expand"))
    (p.derive(sp.Mul(lam(i_ + 1), sp.Pow(lam(i_), -1, evaluate=False), evaluate=False),
              "ratio of consecutive wavelengths")
      .step(base ** (2 / D_), "independent of i: a geometric progression", by="simplify"))
    for D in p.cases(D=[8, 2, 4, 6]):
        p.tie(FREQS, expected=lambda: np.array([D // 2]), points=[()], call=lambda f: np.array(f(D).shape),
              reason="one frequency per pair: shape (D/2,), i = 0 … D/2 - 1")
    for b_ in (10000, 500):
        D = 8
        ws = sp.Matrix(freqs(D, b_))
        p.tie(FREQS, expected=ws, points=[()], call=lambda f: f(D, base=float(b_))[:, None],
              reason=f"w_i = base^(-2i/D), D = 8, base = {b_}")
        p.tie(FREQS, expected=sp.Matrix([2 * sp.pi * b_ ** sp.Rational(2 * j, D) for j in range(D // 2)]),
              points=[()], call=lambda f: (2 * np.pi / f(D, base=float(b_)))[:, None],
              reason=f"wavelengths 2π·base^(2i/D) from 2π to 2π·base^((D-2)/D), base = {b_}")
    for D in p.cases(D=[8, 2, 4, 6]):
        p.tie(TABLE, expected=interleaved_columns(pos, D, 10000), symbols=(pos,),
              points=[(0,), (1,), (257,), (4096,)], call=lambda f, a: f(np.array([a]), D)[0][:, None],
              reason="columns 2i, 2i + 1 = sin, cos(pos w_i) for i = 0 … D/2 - 1 fill all D columns")


def t2t_freqs(D, b=base):
    """tensor2tensor's w_i = base^(-i / (D/2 - 1)), i = 0 … D/2 - 1 (even D >= 4)."""
    return [b ** sp.Rational(-i, D // 2 - 1) for i in range(D // 2)]


def split_permutation(D):
    """perm with PE_split = PE_interleaved[perm]: the sin columns 0, 2, 4, … then cos 1, 3, …"""
    return list(range(0, D, 2)) + list(range(1, D, 2))


@theorem("sinusoidal.layouts",
         "the interleaved and split layouts are the same values up to a column permutation; "
         "the tensor2tensor frequencies are not",
         checks=(TABLE,),
         latex=r"\begin{aligned}"
               r"PE_{split}(pos) &= P\,PE_{interleaved}(pos) && (P x)_j = x_{perm[j]},\ "
               r"perm = (0, 2, \dots, D - 2, 1, 3, \dots, D - 1) \\"
               r"w^{t2t}_{D/2-1} = base^{-1} &\neq base^{-(D-2)/D} = w_{D/2-1} && \text{tensor2tensor's "
               r"} w^{t2t}_i = base^{-i/(D/2 - 1)} \text{: the lowest frequencies} \\"
               r"& && \text{differ, so no column permutation maps one table onto the other}"
               r"\end{aligned}")
def _(p):
    for D in p.cases(D=[4, 2, 6, 8]):
        perm = split_permutation(D)
        P = sp.Matrix(D, D, lambda r, c: 1 if perm[r] == c else 0)
        p.claim(pe(pos, D, "split"), P * pe(pos, D, "interleaved"),
                "column j of split is column perm[j] of interleaved", by="expand",
                shown=(None, sp.MatMul(sp.ImmutableMatrix(P), sp.ImmutableMatrix(pe(pos, D, "interleaved")),
                                       evaluate=False)))
    D = 4
    p.refute(freqs(D)[1], t2t_freqs(D)[1], {base: 10000},
             "D = 4: the lowest frequency is $10^{-2}$ in the paper, $10^{-4}$ in tensor2tensor, so "
             "no column permutation maps one table onto the other")
    perm = split_permutation(8)
    p.tie(TABLE, expected=pe(pos, 8, "split", b=10000), symbols=(pos,), points=[(0,), (5,), (-3,)],
          call=lambda f, a: f(np.array([a]), 8, layout="split")[0][:, None], reason="split layout, D = 8")
    p.tie(TABLE, expected=pe(pos, 8, "interleaved", b=10000)[perm, :], symbols=(pos,),
          points=[(0,), (5,), (-3,)],
          call=lambda f, a: f(np.array([a]), 8, layout="split")[0][:, None],
          reason="split = interleaved[:, perm], D = 8")
    t2t = t2t_freqs(8, 10000)
    p.tie(TABLE, expected=sp.Matrix([sp.sin(pos * x) for x in t2t] + [sp.cos(pos * x) for x in t2t]),
          symbols=(pos,), points=[(0,), (5,), (123,)],
          call=lambda f, a: f(np.array([a]), 8, layout="tensor2tensor")[0][:, None],
          reason="tensor2tensor layout, w_i = base^(-i/(D/2 - 1)), D = 8")
    _require_no_permutation(p)


def _require_no_permutation(p):
    from minipos.sinusoidal import sinusoidal_table
    a = sinusoidal_table(16, 8, layout="interleaved")
    b = sinusoidal_table(16, 8, layout="tensor2tensor")
    matched = [any(np.allclose(b[:, j], a[:, c]) for c in range(8)) for j in range(8)]
    p.require(not all(matched), "some tensor2tensor column matches no interleaved column (D = 8)",
              f"matches per column: {matched}")


@theorem("sinusoidal.rope_inv_freq",
         "rope_inv_freq(D) equals the sinusoidal w_i = base^(-2i/D)",
         checks=("minipos.rope.rope_inv_freq", FREQS))
def _(p):
    j = sp.Symbol("j", integer=True, positive=True)
    (p.derive(base ** (-2 * (j - 1) / D_), "RoFormer Eq. 15: $\\theta_j = base^{-2(j-1)/d}$, j = 1 … D/2")
      .step(base ** (-2 * i_ / D_), "count from 0: i = j - 1", using={j: i_ + 1}))
    (p.derive(1 / base ** (2 * i_ / D_), "HF: inv_freq = 1 / base ** (arange(0, D, 2) / D), entry i",
              shown=sp.Pow(base ** (2 * i_ / D_), -1, evaluate=False))
      .step(base ** (-2 * i_ / D_), "$1 / b^x = b^{-x}$: the sinusoidal $w_i$", by="expand"))
    for D in (2, 8, 64):
        ws = sp.Matrix(freqs(D, 10000))
        p.tie("minipos.rope.rope_inv_freq", expected=ws, points=[()],
              call=lambda f: f(D)[:, None], reason=f"rope_inv_freq(D) = w_i, D = {D}")
        p.tie(FREQS, expected=ws, points=[()], call=lambda f: f(D)[:, None],
              reason=f"sinusoidal_frequencies(D) = w_i, D = {D}")
