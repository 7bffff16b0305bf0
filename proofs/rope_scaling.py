r"""RoPE context-extension scalings (``minipos.rope_scaling``), and porting their checkpoints.

Every scaling replaces the frequencies θ_i = base^(-2i/D), i = 0 … D/2 - 1, of RoPE (RoFormer,
arXiv:2104.09864, Eq. 15); wavelengths are λ_i = 2π / θ_i = 2π base^(2i/D), and L is the
original context length. Proved here, each tied to the function that implements it:

- position interpolation (Chen et al. 2023, arXiv:2306.15595, Sec. 2.2): rotating position m by
  θ_i / s is rotating the fractional position m / s by θ_i;
- NTK-aware base b s^(D/(D-2)): θ'_i = θ_i s^(-2i/(D-2)), so the highest frequency is unchanged
  and the lowest is divided by exactly s (symbolic in base, s and D);
- dynamic NTK at seq_len = L is plain RoPE, and at n > L static NTK with factor s n/L - s + 1;
- YaRN (Peng et al. 2023, arXiv:2309.00071, Sec. 3.2): the correction index
  D ln(L / (2π r)) / (2 ln base) is where the wavelength fits r times into L, which puts the
  ramp between pairs 20 and 46 at D = 128, base 10000, L = 4096;
- YaRN's attention factor f (Sec. 3.4) multiplies cos and sin, so the logits scale by f²;
- Llama 3.1's smoothing is continuous at λ = L / low_freq_factor and λ = L / high_freq_factor;
- LongRoPE (Ding et al. 2024, arXiv:2402.13753; Phi-3, HF ``_compute_longrope_parameters``):
  θ_i / λ_i with the short factors up to L and the long ones beyond, and the attention factor
  sqrt(1 + ln s / ln L) = sqrt(ln L_max / ln L), s = L_max / L (1.1902 for Phi-3-mini-128k);
- converting the q/k weight columns between the interleaved and half layouts (what loading a
  Meta checkpoint into HF code does) preserves every score, since P^T P = I.
"""

from __future__ import annotations

import math

import numpy as np
import sympy as sp

from .core import theorem
from .rope import B, B_shown, R, R_half, P, base, m, n, perm, thetas, vec

s, f, t, r, L = sp.symbols("s f t r L", positive=True)
lo, hi, lam = sp.symbols("f_low f_high lambda", positive=True)  # low_freq_factor, high_freq_factor
D_ = sp.Symbol("D", integer=True, positive=True, even=True)
i_ = sp.Symbol("i", integer=True, nonnegative=True)
_d = sp.Symbol("d", positive=True)

SC = "minipos.rope_scaling"
ANGLES, APPLY = "minipos.rope.rope_angles", "minipos.rope.apply_rope"
TO_HALF = "minipos.rope.interleaved_to_half_weights"
CASES = [4, 2, 6, 8]


def R_freqs(pos, freqs):
    """The block-diagonal rotation with the given per-pair frequencies, interleaved, (D, D)."""
    return sp.diag(*[B(pos * w) for w in freqs])


def R_shown(angles):
    """The block-diagonal rotation with the given per-pair angles, each left as written, (D, D)."""
    return sp.ImmutableMatrix(sp.diag(*[B_shown(a) for a in angles]))


def _prod(*factors):
    """A product of explicit matrices, left unevaluated so that the LaTeX shows each factor."""
    return sp.MatMul(*[f if isinstance(f, sp.MatrixExpr) else sp.ImmutableMatrix(f) for f in factors],
                     evaluate=False)


def _T(x):
    """x^T, shown as a transpose."""
    return sp.Transpose(x if isinstance(x, sp.MatrixExpr) else sp.ImmutableMatrix(x))


def _col(x):
    return np.asarray(x, dtype=float)[:, None]


def _above_2(e):
    """Decide a residual for D > 2 (the NTK exponent D/(D-2) is then a real number): put
    D = d + 2 with d > 0, split powers of products of positives, combine powers of the same
    base and cancel their exponents."""
    e = sp.expand(sp.sympify(e).subs(D_, _d + 2), power_base=True, power_exp=True)
    e = sp.powsimp(e).replace(lambda x: x.is_Pow, lambda x: sp.Pow(x.base, sp.cancel(x.exp)))
    return sp.expand(e)


# --------------------------------------------------------------------------- linear

@theorem("rope_scaling.linear.positions",
         "position interpolation: rotating position m by θ_i/s equals rotating position m/s by θ_i",
         checks=(f"{SC}.linear", ANGLES, APPLY))
def _(p):
    w = sp.Symbol("theta", positive=True)
    kept = sp.UnevaluatedExpr                            # m (θ/s) and (m/s) θ, as written
    (p.derive(B(m * (w / s)), "pair i at position m with the interpolated frequency $\\theta/s$",
              shown=B_shown(m * kept(w / s)))
      .step(B((m / s) * w), "$m (\\theta / s) = (m / s) \\theta$", by="expand",
            shown=B_shown(kept(m / s) * kept(w))))
    for D in p.cases(D=CASES):
        p.claim(R_freqs(m, [th / s for th in thetas(D)]), R(m / s, D),
                "blockwise: the angle $m \\theta_i / s$ of every pair", by="expand",
                shown=(R_shown([m * kept(th / s) for th in thetas(D)]),
                       R_shown([kept(m / s) * kept(th) if th != 1 else m / s for th in thetas(D)])))
    p.refute(thetas(4)[1] / s, thetas(4, s * base)[1], {base: 10000, s: 4},
             "D = 4: dividing the frequencies by s is not multiplying the base by s")
    D = 8
    want = sp.Matrix([th / s for th in thetas(D, 10000)])
    p.tie(f"{SC}.linear", expected=want, symbols=(s,), points=[(1,), (2,), (4,), (8.5,)],
          call=lambda fn, sv: _col(fn(D, factor=sv)[0]), reason="inv_freq = θ_i / s, D = 8")
    from minipos.rope_scaling import linear
    p.tie(ANGLES, expected=want * m, symbols=(m, s), points=[(0, 2), (4097, 4), (-3, 8.5)],
          call=lambda fn, mm, sv: _col(fn([mm], linear(D, factor=sv)[0])[0]),
          reason="rope_angles(m, θ/s) = (m/s) θ_i, D = 8")
    x = vec("x", D)
    pts = [(mm, sv, *np.random.default_rng(5).normal(size=D)) for mm, sv in ((3, 2), (4097, 4), (10, 8.5))]
    p.tie(APPLY, expected=R(m / s, D, 10000) * x, symbols=(m, s, *x), points=pts,
          call=lambda fn, mm, sv, *xv: _col(fn(np.array([xv]), [mm], inv_freq=linear(D, factor=sv)[0])[0]),
          reason="apply_rope with θ/s at m = R(m/s) x, D = 8")


# --------------------------------------------------------------------------- NTK and dynamic NTK

def _ntk_base(factor):
    return base * factor ** (D_ / (D_ - 2))


@theorem("rope_scaling.ntk.extremes",
         "NTK-aware base b s^(D/(D-2)) gives θ'_i = θ_i s^(-2i/(D-2)): the highest frequency θ_0 "
         "is unchanged and the lowest θ_{D/2-1} is divided by exactly s",
         checks=(f"{SC}.ntk",))
def _(p):
    (p.derive(_ntk_base(s) ** (-2 * i_ / D_), "pair i with the base $b s^{D/(D-2)}$")
      .step(base ** (-2 * i_ / D_) * (s ** (D_ / (D_ - 2))) ** (-2 * i_ / D_),
            "power of a product of positives", by=_above_2)
      .step(base ** (-2 * i_ / D_) * s ** (-2 * i_ / (D_ - 2)), "$(s^a)^c = s^{ac}$ for s > 0, D > 2",
            by=_above_2))
    p.claim(sp.Pow(_ntk_base(s), 0, evaluate=False), 1, "i = 0: $\\theta'_0 = 1 = \\theta_0$")
    (p.derive(_ntk_base(s) ** (-2 * (D_ / 2 - 1) / D_), "i = D/2 - 1, the lowest frequency")
      .step(base ** (-(D_ - 2) / D_) * s ** (-2 * (D_ / 2 - 1) / (D_ - 2)), "the general form", by=_above_2)
      .step(base ** (-(D_ - 2) / D_) / s, "$2 (D/2 - 1) = D - 2$: divided by exactly s", by=_above_2))
    p.refute((s * base) ** sp.Rational(-1, 2), base ** sp.Rational(-1, 2) / s, {base: 10000, s: 4},
             "D = 4: the base b s (exponent 1) divides the lowest frequency by $\\sqrt{s}$ only")
    D = 8
    want = sp.Matrix([th * s ** sp.Rational(-2 * j, D - 2) for j, th in enumerate(thetas(D))])
    p.tie(f"{SC}.ntk", expected=want, symbols=(base, s), points=[(10000, 1), (10000, 2), (500000, 8)],
          call=lambda fn, bv, sv: _col(fn(D, base=bv, factor=sv)[0]), reason="θ_i s^(-2i/(D-2)), D = 8")
    want = sp.Matrix([1, base ** sp.Rational(-126, 128) / s])
    p.tie(f"{SC}.ntk", expected=want, symbols=(base, s), points=[(10000, 4), (500000, 16)],
          call=lambda fn, bv, sv: _col(fn(128, base=bv, factor=sv)[0][[0, -1]]),
          reason="θ'_0 = 1, θ'_63 = θ_63 / s, D = 128")


@theorem("rope_scaling.dynamic.original_length",
         "dynamic NTK at seq_len = L is plain RoPE: b (s L/L - (s - 1))^(D/(D-2)) = b; at seq_len "
         "n > L it is static NTK with factor s n/L - s + 1",
         checks=(f"{SC}.dynamic", f"{SC}.ntk"))
def _(p):
    (p.derive(base * (s * n / L - (s - 1)) ** (D_ / (D_ - 2)), "HF's dynamic base at length n")
      .step(sp.Mul(base, sp.Pow(1, D_ / (D_ - 2), evaluate=False), evaluate=False),
            "n = L: $s L / L - (s - 1) = 1$", using={n: L})
      .step(base, "$1^x = 1$", by="expand"))
    p.refute(base * (s * n / L - (s - 1)) ** 2, _ntk_base(s).subs(D_, 4), {n: 2 * L, s: 2},
             "D = 4, n = s L: dynamic NTK is not static NTK with factor s ($b (s^2 - s + 1)^{D/(D-2)}$)")
    D = 8
    plain = sp.Matrix(thetas(D, 10000))
    for name, seq in (("seq_len = L", lambda Lv: Lv), ("seq_len = L/2", lambda Lv: Lv // 2)):
        p.tie(f"{SC}.dynamic", expected=plain, symbols=(s, L), points=[(1, 64), (2, 4096), (8, 2048)],
              call=lambda fn, sv, Lv: _col(fn(D, factor=sv, original_max_position_embeddings=Lv,
                                              seq_len=seq(Lv))[0]),
              reason=f"{name}: plain RoPE, D = 8")
    want = sp.Matrix([th * (s * n / L - s + 1) ** sp.Rational(-2 * j, D - 2) for j, th in enumerate(plain)])
    pts = [(2, 8192, 4096), (4, 5000, 4096), (1.5, 100, 64)]
    p.tie(f"{SC}.dynamic", expected=want, symbols=(s, n, L), points=pts,
          call=lambda fn, sv, nv, Lv: _col(fn(D, factor=sv, original_max_position_embeddings=Lv,
                                              seq_len=nv)[0]),
          reason="seq_len = n > L: θ_i (s n/L - s + 1)^(-2i/(D-2)), D = 8")
    p.tie(f"{SC}.ntk", expected=want, symbols=(s, n, L), points=pts,
          call=lambda fn, sv, nv, Lv: _col(fn(D, factor=sv * nv / Lv - sv + 1)[0]),
          reason="ntk with factor s n/L - s + 1, D = 8")


# --------------------------------------------------------------------------- YaRN

def correction_index(rot, D, b=base, length=L):
    """YaRN's pair index whose wavelength fits ``rot`` times into ``length``."""
    return D * sp.log(length / (rot * 2 * sp.pi)) / (2 * sp.log(b))


def _yarn_ramp_from_output(fn, D, b, Lv, sv, truncate=True):
    """The ramp recovered from yarn's inv_freq: w' = w (g + (1 - g)/s), ramp = 1 - g."""
    from minipos.rope import rope_inv_freq
    w_new, _ = fn(D, base=b, factor=sv, original_max_position_embeddings=Lv, truncate=truncate)
    return (1 - w_new / rope_inv_freq(D, base=b)) / (1 - 1 / sv)  # (D/2,)


def _boundaries(ramp):
    """The last pair still extrapolated (ramp 0) and the first fully interpolated (ramp 1)."""
    return [int(np.flatnonzero(ramp <= 1e-12).max()), int(np.flatnonzero(ramp >= 1 - 1e-12).min())]


YARN_CONFIGS = [(128, 10000, 4096, 4), (64, 500000, 8192, 16)]


@theorem("rope_scaling.yarn.correction_dim",
         "YaRN's correction index i(r) = D ln(L/(2π r)) / (2 ln base) solves L/λ_i = r: the ramp "
         "boundaries for beta_fast = 32, beta_slow = 1 are pairs 20 and 46 at D = 128, L = 4096",
         checks=(f"{SC}.yarn",))
def _(p):
    istar = sp.Symbol("i_r", positive=True)                       # shown as i_r, then replaced
    over = lambda x: sp.Mul(L, sp.Pow(x, -1, evaluate=False), evaluate=False)  # noqa: E731  L / x, kept
    (p.derive(over(2 * sp.pi * sp.Pow(base, 2 * istar / D_, evaluate=False)), "$L / \\lambda_i$ at $i = i_r$")
      .step(over(2 * sp.pi * sp.exp(2 * istar / D_ * sp.log(base), evaluate=False)), "$b^x = e^{x \\ln b}$",
            by="simplify")
      .step(over(2 * sp.pi * sp.exp(sp.log(L / (2 * sp.pi * r), evaluate=False), evaluate=False)),
            "$i_r = D \\ln(L / (2\\pi r)) / (2 \\ln b)$: $(2 i_r / D) \\ln b = \\ln(L / (2\\pi r))$, "
            "and $e^{\\ln x} = x$", using={istar: correction_index(r, D_)}, by="simplify")
      .step(r, "cancel", by="simplify"))
    D, b, Lv, sv = YARN_CONFIGS[0]
    i32, i1 = correction_index(32, D, b, Lv), correction_index(1, D, b, Lv)
    p.require([sp.floor(i32), sp.ceiling(i1)] == [20, 46],
              "at D = 128, base 10000, L = 4096: floor(i(32)) = 20, ceil(i(1)) = 46",
              f"got {[sp.floor(i32), sp.ceiling(i1)]}")
    for D, b, Lv, sv in YARN_CONFIGS:
        edges = sp.Matrix([sp.floor(correction_index(32, D, b, Lv)), sp.ceiling(correction_index(1, D, b, Lv))])
        p.tie(f"{SC}.yarn", expected=edges, points=[()],
              call=lambda fn: _col(_boundaries(_yarn_ramp_from_output(fn, D, b, Lv, sv))),
              reason=f"last pair kept and first pair divided by s, D = {D}, base = {b}, L = {Lv}")
    D, b, Lv, sv = YARN_CONFIGS[0]
    for trunc, (a_, z_) in ((True, (sp.floor(i32), sp.ceiling(i1))), (False, (i32, i1))):
        a_, z_ = sp.N(a_, 30), sp.N(z_, 30)               # numbers: Min/Max of exact logs is slow
        ramp = sp.Matrix([sp.Min(1, sp.Max(0, (j - a_) / (z_ - a_))) for j in range(D // 2)])
        p.tie(f"{SC}.yarn", expected=ramp, points=[()],
              call=lambda fn: _col(_yarn_ramp_from_output(fn, D, b, Lv, sv, trunc)),
              reason=f"ramp (i - i(32)) / (i(1) - i(32)) clipped to [0, 1], truncate = {trunc}, D = {D}")

def rot_every_two(x):
    """(x_0, x_1, x_2, x_3, …) -> (-x_1, x_0, -x_3, x_2, …)."""
    return sp.Matrix([v for j in range(0, len(x), 2) for v in (-x[j + 1], x[j])])


@theorem("rope_scaling.yarn.attention_factor",
         "<f R(m) q, f R(n) k> = f² q^T R(n - m) k: YaRN's attention factor multiplies cos and sin, "
         "so the logits scale by f² = 1/t",
         checks=(APPLY, f"{SC}.yarn"))
def _(p):
    for D in p.cases(D=CASES):
        x = vec("x", D)
        cos = sp.Matrix([sp.cos(m * th) for th in thetas(D) for _ in (0, 1)])
        sin = sp.Matrix([sp.sin(m * th) for th in thetas(D) for _ in (0, 1)])
        p.claim(x.multiply_elementwise(f * cos) + rot_every_two(x).multiply_elementwise(f * sin),
                f * (R(m, D) * x), "Eq. 34 with $f \\cos$, $f \\sin$: the whole pair is scaled by f",
                by="expand")
    D = 4
    q, k = vec("q", D), vec("k", D)
    with p.folded("the score at D = 4, entry by entry"):
        (p.derive(((f * R(m, D) * q).T * (f * R(n, D) * k))[0, 0],
                  "$\\langle f R(m) q, f R(n) k \\rangle$, D = 4")
          .step(f ** 2 * (q.T * R(m, D).T * R(n, D) * k)[0, 0], "one f from each side", by="expand")
          .step(f ** 2 * (q.T * R(n - m, D) * k)[0, 0], "$R(m)^T R(n) = R(n - m)$", by="trig"))
    p.claim(sp.sqrt(1 / t) ** 2, 1 / t, "YaRN Sec. 3.4: $f = \\sqrt{1/t}$, so the logits are divided by t",
            shown=(sp.Pow(sp.sqrt(1 / t), 2, evaluate=False), None))
    p.refute(f ** 2, f, {f: sp.Rational(6, 5)}, "the logits scale by $f^2$, not f")
    Dn = 8
    rng = np.random.default_rng(6)
    qv, kv = rng.normal(size=Dn), rng.normal(size=Dn)
    for layout, Rl in (("interleaved", R), ("half", R_half)):
        want = f ** 2 * (sp.Matrix(qv).T * Rl(n - m, Dn, 10000) * sp.Matrix(kv))[0, 0]
        p.tie(APPLY, expected=want, symbols=(m, n, f), points=[(0, 0, 1.2), (3, 7, 1.1386), (4097, 5, 2.0)],
              call=lambda fn, a, b, fv: (fn(qv[None], [a], layout=layout, attention_factor=fv)[0]
                                         @ fn(kv[None], [b], layout=layout, attention_factor=fv)[0]),
              reason=f"score with attention_factor f = f² q^T R(n - m) k, {layout}, D = 8")
    p.tie(f"{SC}.yarn", expected=sp.Rational(1, 10) * sp.log(s) + 1, symbols=(s,),
          points=[(1,), (4,), (16,), (40,)],
          call=lambda fn, sv: fn(8, factor=sv, original_max_position_embeddings=4096)[1],
          reason="f = sqrt(1/t) = 0.1 ln s + 1")


# --------------------------------------------------------------------------- Llama 3.1

def smooth(lam_, L_=L, lo_=lo, hi_=hi, s_=s):
    """Llama 3.1's middle branch at wavelength λ: (1 - a) θ/s + a θ, a = (L/λ - lo)/(hi - lo)."""
    a = (L_ / lam_ - lo_) / (hi_ - lo_)
    th = 2 * sp.pi / lam_
    return (1 - a) * th / s_ + a * th


def _theta_at(wavelength):
    """θ = 2π / λ at the given wavelength, kept unevaluated for display."""
    return sp.Mul(2 * sp.pi, sp.Pow(wavelength, -1, evaluate=False), evaluate=False)


LLAMA = dict(factor=8.0, original_max_position_embeddings=8192, low_freq_factor=1.0, high_freq_factor=4.0)


def _llama_branch(lam_):
    """The whole piecewise frequency of Llama 3.1 at wavelength λ (HF ``_compute_llama3_parameters``)."""
    Lv, lo_, hi_, sv = 8192, 1, 4, 8
    th = 2 * sp.pi / lam_
    return sp.Piecewise((th, lam_ < sp.Rational(Lv, hi_)), (th / sv, lam_ > sp.Rational(Lv, lo_)),
                        (smooth(lam_, Lv, lo_, hi_, sv), True))


@theorem("rope_scaling.llama3.continuous",
         "Llama 3.1's smoothed frequency is continuous: at λ = L/low_freq_factor it equals θ/s, at "
         "λ = L/high_freq_factor it equals θ",
         checks=(f"{SC}.llama3",))
def _(p):
    (p.derive(smooth(lam), "the middle branch at wavelength λ, $\\theta = 2\\pi/\\lambda$")
      .step(2 * sp.pi * lo / (L * s), "$\\lambda = L / f_{low}$ (low_freq_factor): a = 0",
            using={lam: L / lo})
      .step(_theta_at(L / lo) / s, "the long-wavelength branch $\\theta / s$ there"))
    (p.derive(smooth(lam))
      .step(2 * sp.pi * hi / L, "$\\lambda = L / f_{high}$ (high_freq_factor): a = 1", using={lam: L / hi})
      .step(_theta_at(L / hi), "the short-wavelength branch $\\theta$ there"))
    # D = 4 puts pair 1 (λ_1 = 2π base^(1/2)) on a boundary λ* when base = (λ* / 2π)^2;
    # llama3 at base (1 ± 1e-9) lands just inside and just outside it.
    for name, edge in (("low", 8192 / 1), ("high", 8192 / 4)):
        b_edge = (edge / (2 * math.pi)) ** 2
        at_edge = sp.Float(2 * math.pi / edge) / (8 if name == "low" else 1)
        p.tie(f"{SC}.llama3", expected=at_edge, symbols=(sp.Symbol("eps"),), points=[(-1e-9,), (1e-9,)],
              call=lambda fn, eps: fn(4, base=b_edge * (1 + eps), **LLAMA)[0][1], rtol=1e-7,
              reason=f"pair 1 just inside / outside λ = L / {name}_freq_factor, D = 4")
    for b in (500000.0, 10000.0):      # D = 16: pairs in each of the three branches at both bases
        want = sp.Matrix([_llama_branch(2 * sp.pi / th) for th in thetas(16, sp.Float(b))])
        p.tie(f"{SC}.llama3", expected=want, points=[()],
              call=lambda fn: _col(fn(16, base=b, **LLAMA)[0]),
              reason=f"the three branches, D = 16, base = {b:g}")


# --------------------------------------------------------------------------- LongRoPE

_SHORT = [sp.Integer(1), sp.Rational(5, 4), sp.Rational(3, 2), sp.Integer(2)]   # D = 8: one factor per pair
_LONG = [sp.Integer(1), sp.Integer(2), sp.Integer(3), sp.Rational(9, 2)]
_PHI3 = dict(original_max_position_embeddings=4096, max_position_embeddings=131072)  # Phi-3-mini-128k


def _longrope(fn, D=8, **kw):
    """``longrope`` with the D = 8 factors above (Phi-3's lengths unless overridden)."""
    return fn(D, short_factor=[float(x) for x in _SHORT], long_factor=[float(x) for x in _LONG],
              **{**_PHI3, **kw})


@theorem("rope_scaling.longrope.factors",
         "LongRoPE: inv_freq_i = θ_i / λ_i with the short factors λ for seq_len <= L and the long "
         "factors above; attention factor sqrt(1 + ln s / ln L) with s = max_position_embeddings / L",
         checks=(f"{SC}.longrope",))
def _(p):
    Lmax = sp.Symbol("L_max", positive=True)
    g = sp.sqrt(1 + sp.log(s) / sp.log(L))
    (p.derive(g, "the attention factor, $s = L_{max} / L$")
      .step(sp.sqrt(sp.log(Lmax) / sp.log(L)), "$\\ln L + \\ln s = \\ln L_{max}$", using={s: Lmax / L}))
    (p.derive(g.subs({s: 32, L: 4096}), "Phi-3-mini-128k: $L = 4096$, $L_{max} = 131072$, $s = 32$")
      .step(sp.sqrt(sp.Add(1, sp.Rational(5, 12), evaluate=False), evaluate=False),
            "$\\ln 32 / \\ln 4096 = 5 \\ln 2 / (12 \\ln 2)$", by="expand")
      .step(sp.sqrt(sp.Rational(17, 12), evaluate=False), "$\\approx 1.1902$", by="expand"))
    p.claim(g, 1, "$s = 1$ ($L_{max} = L$): no attention scaling", using={s: 1})
    D, nL = 8, sp.Symbol("seq_len", integer=True, positive=True)
    for name, factors, pts, rule in (("short", _SHORT, [(1,), (2048,), (4096,)], "<="),
                                     ("long", _LONG, [(4097,), (131072,)], ">")):
        want = sp.Matrix([th / fi for th, fi in zip(thetas(D, 10000), factors)])
        p.tie(f"{SC}.longrope", expected=want, symbols=(nL,), points=pts,
              call=lambda fn, nv: _col(_longrope(fn, seq_len=nv)[0]),
              reason=f"inv_freq = θ_i / {name}_factor_i for seq_len {rule} L = 4096, D = 8")
    p.tie(f"{SC}.longrope", expected=sp.sqrt(1 + sp.log(Lmax / L) / sp.log(L)), symbols=(Lmax, L),
          points=[(131072, 4096), (8192, 4096), (4096, 4096), (262144, 8192)],
          call=lambda fn, lm, lv: _longrope(fn, original_max_position_embeddings=lv, max_position_embeddings=lm,
                                            seq_len=1)[1],
          reason="attention factor sqrt(1 + ln s / ln L), s = max_position_embeddings / L")


# --------------------------------------------------------------------------- porting: the weight layout

@theorem("rope_scaling.layout.weights",
         "permuting each head's q/k weight columns by the layout permutation P (interleaved -> half) "
         "preserves every score: P^T P = I",
         checks=(TO_HALF,))
def _(p):
    for Dn in p.cases(D=CASES):
        p.claim(sp.MatMul(P(Dn).T, P(Dn), evaluate=False), sp.eye(Dn), "a permutation matrix is orthogonal",
                by="expand")
    Dn, dm = 4, 2
    W = sp.Matrix(dm, Dn, lambda a_, c: sp.Symbol(f"W{a_}{c}", real=True))
    x = vec("x", dm)
    pm = perm(Dn)
    p.claim(W[:, pm], sp.MatMul(W, P(Dn).T, evaluate=False),
            "column j of the converted W is column perm[j]: $W P^T$", by="expand")
    p.claim(sp.MatMul((W * P(Dn).T).T, x, evaluate=False), sp.MatMul(P(Dn), W.T, x, evaluate=False),
            "so $q_{half} = (W P^T)^T x = P W^T x = P q$", by="expand")
    q, k = vec("q", Dn), vec("k", Dn)
    Pm = P(Dn)
    with p.folded("the score at D = 4"):
        (p.derive(((R_half(m, Dn) * Pm * q).T * (R_half(n, Dn) * Pm * k))[0, 0],
                  "half layout on the converted q, k",
                  shown=_prod(_T(_prod(R_half(m, Dn), Pm, q)), _prod(R_half(n, Dn), Pm, k)))
          .step(((Pm * R(m, Dn) * q).T * (Pm * R(n, Dn) * k))[0, 0], "$R_{half}(m) P = P R(m)$",
                by="expand", shown=_prod(_T(_prod(Pm, R(m, Dn), q)), _prod(Pm, R(n, Dn), k)))
          .step((q.T * R(m, Dn).T * (Pm.T * Pm) * R(n, Dn) * k)[0, 0], "transpose the product", by="expand",
                shown=_prod(_T(q), _T(R(m, Dn)), _prod(_T(Pm), Pm), R(n, Dn), k))
          .step((q.T * R(n - m, Dn) * k)[0, 0], "$P^T P = I$, $R(m)^T R(n) = R(n - m)$", by="trig",
                shown=_prod(_T(q), R(n - m, Dn), k)))
    for Dn in (4, 8):
        p.tie(TO_HALF, expected=P(Dn).T, points=[()], call=lambda fn: fn(np.eye(Dn), 1),
              reason=f"W = I, one head: the converted matrix is P^T, D = {Dn}")
    _tie_scores(p)


def _tie_scores(p):
    """Two heads of D = 4: half-layout scores with converted weights = interleaved scores."""
    from minipos.rope import apply_rope
    H, Dn, dm = 2, 4, 3
    rng = np.random.default_rng(7)
    wq, wk, x = rng.normal(size=(dm, H * Dn)), rng.normal(size=(dm, H * Dn)), rng.normal(size=dm)
    qh, kh = (x @ wq).reshape(H, Dn), (x @ wk).reshape(H, Dn)
    want = sp.Matrix([(sp.Matrix(qh[h]).T * R(n - m, Dn, 10000) * sp.Matrix(kh[h]))[0, 0] for h in range(H)])

    def scores(fn, a, b):
        q_, k_ = ((x @ fn(w, H)).reshape(H, 1, Dn) for w in (wq, wk))
        return _col((apply_rope(q_, [a], layout="half") * apply_rope(k_, [b], layout="half")).sum(-1)[:, 0])
    p.tie(TO_HALF, expected=want, symbols=(m, n), points=[(0, 0), (3, 7), (4097, 12)], call=scores,
          reason="per-head scores, half layout with converted weights = q^T R(n - m) k, H = 2, D = 4")

