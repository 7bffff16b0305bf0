r"""ALiBi: the slope rule and why the two bias forms give the same attention.

Press, Smith & Lewis 2022, "Train Short, Test Long", arXiv:2108.12409, §3, and the reference
``get_slopes`` (github.com/ofirpress/attention_with_linear_biases):

- for H = 2^k heads the slopes are geometric, first term and ratio 2^(-8/H): m_h = 2^(-8h/H);
- for other H, with P = 2^floor(log2 H): the P slopes of P heads, then every other slope
  (``[0::2]``) of the 2P-head sequence, the first H - P of them: 2^(-4(2i + 1)/P);
- the biases -m(i - j) and +m j give the same softmax row WITH OR WITHOUT a mask: they differ by
  m i, a constant of the row (softmax is shift-invariant per row). Only their equality with the
  distance penalty -m|i - j| needs the causal mask: over the allowed keys j <= i, |i - j| = i - j;
  without it, keys j > i are rewarded by +m j and penalised by -m|i - j|;
- the bias depends on i - j only, so shifting every position (a cached step) leaves it unchanged.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem

_two = sp.Integer(2)


def _add_exponents(e):
    """Strategy: combine powers of the same base, then expand (2^a 2^b = 2^(a + b))."""
    return sp.expand(sp.powsimp(sp.expand(e)))


def _log2_pow2(H: int) -> list:
    """log2 of the reference ``get_slopes_power_of_2(H)`` = start * ratio**i, start = ratio = 2^(-8/H):
    log2(start) + i log2(ratio), exact rationals."""
    log2_start = sp.Rational(-8, H)
    return [log2_start + i * log2_start for i in range(H)]


def _log2_pow2_shown(H: int) -> list:
    """:func:`_log2_pow2` as the docs show it: each entry log2(start) + i log2(ratio), unevaluated."""
    log2_start = sp.UnevaluatedExpr(sp.Rational(-8, H))
    return [log2_start if i == 0 else sp.Add(log2_start, sp.Mul(i, log2_start, evaluate=False), evaluate=False)
            for i in range(H)]


def _log2_reference(H: int) -> list:
    """log2 of the reference ``get_slopes(H)``, recursion and all (slicing acts on the list)."""
    if H & (H - 1) == 0:
        return _log2_pow2(H)
    P = 1 << (H.bit_length() - 1)  # 2**floor(log2(H))
    return _log2_pow2(P) + _log2_reference(2 * P)[0::2][: H - P]


def _log2_reference_shown(H: int) -> list:
    """:func:`_log2_reference` as the docs show it: the P-head entries, then the [0::2] picks of
    the 2P-head ones, each as log2(start) + i log2(ratio)."""
    if H & (H - 1) == 0:
        return _log2_pow2_shown(H)
    P = 1 << (H.bit_length() - 1)
    return _log2_pow2_shown(P) + _log2_reference_shown(2 * P)[0::2][: H - P]


def _log2_closed_form(H: int) -> list:
    """The interleaving rule in closed form: -8h/P, h = 1..P, then -4(2i + 1)/P, i < H - P."""
    P = 1 << (H.bit_length() - 1)
    return ([sp.Rational(-8 * h, P) for h in range(1, P + 1)]
            + [sp.Rational(-4 * (2 * i + 1), P) for i in range(H - P)])


def _as_floats(log2s) -> np.ndarray:
    return np.array([2.0 ** float(e) for e in log2s])


@theorem("alibi.slopes.power_of_two",
         "for H = 2^k heads the slopes are geometric with first term and ratio 2^(-8/H): m_h = 2^(-8h/H)",
         checks=("minipos.alibi.alibi_slopes",))
def _(p):
    H = sp.Symbol("H", positive=True)
    h = sp.Symbol("h", integer=True, positive=True)
    p.claim(_two ** (-(sp.log(H, 2) - 3)), 8 / H,
            "the reference's start is $2^{-x}$ with this $x$; $2^{3 - \\log_2 H} = 8 / H$, so start $= 2^{-8/H}$",
            by="expand")
    start = _two ** (-8 / H)
    (p.derive(start * start ** (h - 1), "$m_h = \\mathrm{start} \\cdot \\mathrm{ratio}^{h-1}$, ratio = start")
      .step(_two ** (-8 * h / H), "add the exponents", by=_add_exponents))
    p.claim(_two ** (-8 * (h + 1) / H) / _two ** (-8 * h / H), start,
            "consecutive heads: the ratio is $2^{-8/H}$", by=_add_exponents)
    (p.derive(sp.Matrix([_two ** (-8 * k / H) for k in range(1, 9)]), "$m_h = 2^{-8h/H}$, $h = 1 \\ldots 8$")
      .step(sp.Matrix([sp.Rational(1, 2**k) for k in range(1, 9)]), "8 heads: the paper's 1/2, 1/4, ..., 1/256",
            using={H: 8}))
    for H in p.cases(H=[8, 1, 2, 4, 16, 32, 64]):
        p.claim(sp.Matrix(_log2_pow2(H)), sp.Matrix([sp.Rational(-8 * h, H) for h in range(1, H + 1)]),
                "$\\log_2$ of the reference's products $\\mathrm{start} \\cdot \\mathrm{ratio}^i$: "
                "$\\log_2 \\mathrm{start} + i \\log_2 \\mathrm{ratio} = -8h/H$, $h = i + 1$",
                shown=(sp.Matrix(_log2_pow2_shown(H)), None))
    p.tie("minipos.alibi.alibi_slopes", expected=lambda H: _as_floats(_log2_pow2(H)),
          points=[(1,), (2,), (4,), (8,), (16,), (32,), (64,)], call=lambda f, H: f(H),
          rtol=1e-14, reason="powers of two")


@theorem("alibi.slopes.interleave",
         "for H not a power of two, with P = 2^floor(log2 H): the P-head slopes, then every other "
         "slope of the 2P-head sequence, 2^(-4(2i+1)/P) for i < H - P",
         checks=("minipos.alibi.alibi_slopes",))
def _(p):
    P = sp.Symbol("P", positive=True)
    i = sp.Symbol("i", integer=True, nonnegative=True)
    m2P = lambda h: _two ** (-8 * h / (2 * P))  # noqa: E731  the 2P-head slope m_h, h = 1..2P
    p.claim(m2P(2 * i + 1), _two ** (-4 * (2 * i + 1) / P),
            "$[0::2]$ takes $h = 2i + 1$ of the 2P-head sequence", by=_add_exponents)
    p.claim(m2P(2 * (i + 1)), _two ** (-8 * (i + 1) / P),
            "the other half, $h = 2(i + 1)$, are the P-head slopes already taken", by=_add_exponents)
    for H in p.cases(H=[3, 5, 6, 7, 12, 20, 24, 48, 80]):
        ref, closed = _log2_reference(H), _log2_closed_form(H)
        p.claim(sp.Matrix(ref), sp.Matrix(closed), "$\\log_2$ of the reference recursion equals the closed form",
                shown=(sp.Matrix(_log2_reference_shown(H)), None))
        p.require(set(closed) <= set(_log2_pow2(1 << H.bit_length())) and len(set(closed)) == H,
                  "the H slopes are distinct slopes of the 2P-head model")
    p.claim(sp.Matrix([_two**e for e in _log2_reference(6)]),
            sp.Matrix([sp.Rational(1, 4), sp.Rational(1, 16), sp.Rational(1, 64), sp.Rational(1, 256),
                       sp.Rational(1, 2), sp.Rational(1, 8)]),
            "6 heads: 1/4, 1/16, 1/64, 1/256, then 1/2, 1/8 (the head order is not monotone)",
            shown=(sp.Matrix([sp.UnevaluatedExpr(_two) ** e for e in _log2_reference(6)]), None))
    p.tie("minipos.alibi.alibi_slopes", expected=lambda H: _as_floats(_log2_reference(H)),
          points=[(H,) for H in (3, 5, 6, 7, 12, 20, 24, 48, 80)], call=lambda f, H: f(H),
          rtol=1e-14, reason="non-powers of two")


def _masked_softmax(row, allowed):
    """softmax over the allowed entries of a row of SymPy expressions; 0 elsewhere."""
    total = sum(sp.exp(x) for x, ok in zip(row, allowed) if ok)
    return [sp.exp(x) / total if ok else sp.Integer(0) for x, ok in zip(row, allowed)]


def _rows(T, S, bias, causal=True):
    """The (T, S) softmax matrix of s_{t,j} + bias(i, j), query t at position i = S - T + t;
    under the causal mask (keys j <= i) or over every key."""
    s, m = sp.symbols(f"s0:{T * S}", real=True), sp.Symbol("m", positive=True)
    rows = []
    for t in range(T):
        i = S - T + t
        rows.append(_masked_softmax([s[t * S + j] + bias(m, i, j) for j in range(S)],
                                    [j <= i or not causal for j in range(S)]))
    return sp.Matrix(rows), s, m


@theorem("alibi.bias.causal_equivalence",
         "the biases -m(i - j) and +m j give the same softmax rows with or without a mask (they differ "
         "by m i, constant in a row); -m|i - j| equals them only under a causal mask",
         checks=("minipos.alibi.alibi_bias", "minipos.alibi.alibi_bias_key_only", "minipos.attention.softmax"))
def _(p):
    i, j = sp.symbols("i j", integer=True)
    m = sp.Symbol("m", positive=True)
    d = sp.Symbol("d", integer=True, nonnegative=True)
    p.claim(-m * (i - j) - m * j, -m * i, "the two forms differ by $-m i$, the same for every key of row $i$")
    for n in p.cases(n=[3, 1, 2]):  # no mask: row i (any integer) sees every key j = 0..n-1, also j > i
        s = sp.symbols(f"s0:{n}", real=True)
        (p.derive(sp.Matrix(_masked_softmax([s[k] - m * (i - k) for k in range(n)], [True] * n)),
                  "no mask: row $i$ over every key $j = 0 \\ldots n - 1$, future keys $j > i$ included")
          .step(sp.Matrix([sp.exp(-m * i) * sp.exp(s[k] + m * k)
                           / sum(sp.exp(-m * i) * sp.exp(s[q] + m * q) for q in range(n)) for k in range(n)]),
                "$e^{s_j - m(i - j)} = e^{-m i} e^{s_j + m j}$", by="cancel")
          .step(sp.Matrix(_masked_softmax([s[k] + m * k for k in range(n)], [True] * n)),
                "cancel $e^{-m i}$ (softmax is shift-invariant per row): no mask is needed", by="cancel"))
    (p.derive(-m * sp.Abs(i - j))
      .step(-m * d, "under the causal mask an allowed key is $j = i - d$ with $d \\geq 0$", using={j: i - d})
      .step(-m * (i - j), "so $-m|i - j| = -m(i - j)$ there", using={d: i - j}))
    for n in p.cases(n=[3, 1, 2]):  # causal: row i = n - 1 sees keys j = 0..n-1
        s = sp.symbols(f"s0:{n}", real=True)
        ii = n - 1
        (p.derive(sp.Matrix(_masked_softmax([s[k] - m * (ii - k) for k in range(n)], [True] * n)))
          .step(sp.Matrix([sp.exp(-m * ii) * sp.exp(s[k] + m * k)
                           / sum(sp.exp(-m * ii) * sp.exp(s[q] + m * q) for q in range(n)) for k in range(n)]),
                "$e^{s_j - m(i - j)} = e^{-m i} e^{s_j + m j}$", by="cancel")
          .step(sp.Matrix(_masked_softmax([s[k] + m * k for k in range(n)], [True] * n)),
                "cancel $e^{-m i}$ (softmax is shift-invariant per row)", by="cancel"))
    s = sp.symbols("s0:3", real=True)
    p.refute((-m * sp.Abs(0 - 1) - m * 1) - (-m * sp.Abs(0 - 2) - m * 2), 0, {m: 1},
             "row $i = 0$ without a mask: $-m|i - j| - m j$ is not constant over $j = 1, 2$")
    p.refute(_masked_softmax([s[k] - m * abs(0 - k) for k in range(3)], [True] * 3)[0],
             _masked_softmax([s[k] + m * k for k in range(3)], [True] * 3)[0],
             {m: 1, s[0]: 0, s[1]: 0, s[2]: 0},
             "so the weight of key 0 in row 0 differs: $-m|i - j|$ penalises the keys $+m j$ rewards")
    _tie_causal_rows(p)
    _tie_unmasked_rows(p)


def _tie_unmasked_rows(p):
    """Without a mask: softmax of s - m(i - j) (``alibi_bias``) = softmax of s + m j (``alibi_bias_key_only``)."""
    from minipos.attention import softmax

    rng = np.random.default_rng(4)
    names = (sp.Symbol("s"), sp.Symbol("m"))
    for T, S in ((3, 3), (2, 5)):  # queries at S - T … S - 1; rows before the last have future keys
        key_only, s, m = _rows(T, S, lambda m, i, j: m * j, causal=False)
        distance, _, _ = _rows(T, S, lambda m, i, j: -m * (i - j), causal=False)
        lam_key_only = sp.lambdify((s, m), key_only, "numpy")
        lam_distance = sp.lambdify((s, m), distance, "numpy")
        points = [(tuple(rng.normal(size=T * S).round(3)), m) for m in (0.5, 2.0 ** -0.5)]
        qpos = np.arange(S - T, S)
        p.tie("minipos.alibi.alibi_bias", expected=lambda s, m: lam_key_only(s, m), points=points, symbols=names,
              call=lambda f, s, m: softmax(np.reshape(s, (T, S)) + f([m], qpos, S)[0]),
              reason=f"-m(i - j) with no mask = softmax of s + m j, T={T}, S={S}")
        p.tie("minipos.alibi.alibi_bias_key_only", expected=lambda s, m: lam_distance(s, m), points=points,
              symbols=names, call=lambda f, s, m: softmax(np.reshape(s, (T, S)) + f([m], S)[0]),
              reason=f"+m j with no mask = softmax of s - m(i - j), T={T}, S={S}")


def _tie_causal_rows(p):
    """Each code form, masked causally and softmaxed, equals the math of the OTHER form."""
    from minipos.attention import causal_mask, softmax

    def rows(bias, s, T, S):  # (T, S) softmax rows of s + bias under causal_mask(T, S)
        return softmax(np.where(causal_mask(T, S), np.reshape(s, (T, S)) + bias, -np.inf))

    rng = np.random.default_rng(3)
    names = (sp.Symbol("s"), sp.Symbol("m"))
    for T, S in ((3, 3), (2, 5)):  # a full pass and a cached step (queries at S - T ... S - 1)
        key_only, s, m = _rows(T, S, lambda m, i, j: m * j)
        distance, _, _ = _rows(T, S, lambda m, i, j: -m * (i - j))
        lam_key_only = sp.lambdify((s, m), key_only, "numpy")
        lam_distance = sp.lambdify((s, m), distance, "numpy")
        points = [(tuple(rng.normal(size=T * S).round(3)), m) for m in (0.5, 2.0 ** -0.5)]
        p.tie("minipos.alibi.alibi_bias", expected=lambda s, m: lam_key_only(s, m), points=points,
              call=lambda f, s, m: rows(f([m], np.arange(S - T, S), S)[0], s, T, S), symbols=names,
              reason=f"-m(i - j) masked = softmax of s + m j, T={T}, S={S}")
        p.tie("minipos.alibi.alibi_bias", expected=lambda s, m: lam_key_only(s, m), points=points,
              call=lambda f, s, m: rows(f([m], np.arange(S - T, S), S, symmetric=True)[0], s, T, S),
              symbols=names,
              reason=f"-m|i - j| masked = softmax of s + m j, T={T}, S={S}")
        p.tie("minipos.alibi.alibi_bias_key_only", expected=lambda s, m: lam_distance(s, m), points=points,
              call=lambda f, s, m: rows(f([m], S)[0], s, T, S), symbols=names,
              reason=f"+m j masked = softmax of s - m(i - j), T={T}, S={S}")


@theorem("alibi.bias.shift",
         "b(i, j) = -m(i - j) depends on i - j only: shifting every position by c leaves the bias unchanged",
         checks=("minipos.alibi.alibi_bias",))
def _(p):
    i, j, c = sp.symbols("i j c", integer=True)
    m = sp.Symbol("m", positive=True)
    i2, j2 = sp.symbols("i' j'", integer=True)  # the shifted positions
    shift = {i2: i + c, j2: j + c}
    p.claim(-m * (i2 - j2), -m * (i - j), "$i' = i + c$, $j' = j + c$: $c$ cancels", using=shift)
    p.claim(-m * sp.Abs(i2 - j2), -m * sp.Abs(i - j), "and in $|i' - j'|$", using=shift)
    T, S = 3, 4
    slopes = _as_floats(_log2_closed_form(3))
    want = [[[-float(mh) * (ii - jj) for jj in range(S)] for ii in range(T)] for mh in slopes]
    sym = [[[-float(mh) * abs(ii - jj) for jj in range(S)] for ii in range(T)] for mh in slopes]
    p.tie("minipos.alibi.alibi_bias", expected=lambda c: np.array(want), points=[(0,), (1,), (7,), (1000,)],
          call=lambda f, c: f(slopes, np.arange(T) + c, np.arange(S) + c), symbols=(c,),
          reason="positions shifted by c")
    p.tie("minipos.alibi.alibi_bias", expected=lambda c: np.array(sym), points=[(0,), (5,)],
          call=lambda f, c: f(slopes, np.arange(T) + c, np.arange(S) + c, symmetric=True), symbols=(c,),
          reason="symmetric, positions shifted by c")
