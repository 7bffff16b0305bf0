r"""DeBERTa: the three disentangled terms, the code's p2c index, the sqrt(3D) scale, log buckets.

He et al. 2021, "DeBERTa", arXiv:2006.03654, §3.1 Eq. 2-4, and the reference code
(microsoft/DeBERTa, HF ``DisentangledSelfAttention.disentangled_attention_bias``,
``make_log_bucket_position``).

- A~_ij = Q^c_i . K^c_j + Q^c_i . K^r_delta(i,j) + K^c_j . Q^r_delta', delta(i, j) =
  clip(i - j + k, 0, 2k - 1). The paper writes delta' = delta(j, i); the code's gather of
  ``clip(-r_pos + k)`` followed by a transpose reads entry (j, i) of -r_pos, i.e. -(j - i) = i - j:
  delta' = delta(i, j). The two differ whenever i != j (refuted at a point). The code's
  ``build_relative_position`` / ``relative_positions`` give r_ij = i - j (query minus key; log-bucketed
  in v2/v3), checked against the code, also for a cached step.
- For q, k and the two position vectors independent, zero-mean, unit-variance entries,
  E[A~] = 0 and Var(A~) = 3D (the cross terms vanish because every one has a zero-mean factor),
  hence the scale 1/sqrt(3D): sqrt(D (1 + number of position terms)).
- The v2/v3 log bucket is the identity for |r| <= mid = bucket_size // 2 (the code's
  ``abs_pos <= mid``), meets the log branch there (g(mid) = mid), reaches 2 mid - 1 at
  |r| = max_position - 1, is odd and non-decreasing. The exact (real-number) buckets are computed
  here in integer arithmetic and checked against the code over a range of r.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem


def _delta(a, b, k):
    """Eq. 3: delta(a, b) = clip(a - b + k, 0, 2k - 1)."""
    return sp.Min(sp.Max(a - b + k, 0), 2 * k - 1)


def _example(seed, H=2, T=4, D=3, span=2):
    rng = np.random.default_rng(seed)
    q, k = rng.normal(size=(H, T, D)), rng.normal(size=(H, T, D))
    pos_key, pos_query = rng.normal(size=(H, 2 * span, D)), rng.normal(size=(H, 2 * span, D))
    rel = np.subtract.outer(np.arange(T), np.arange(T))  # i - j
    return q, k, pos_key, pos_query, rel, span


def _terms_by_formula(q, k, pos_key, pos_query, rel, span, *, p2c="code"):
    """c2c, c2p, p2c pair by pair (Eq. 4), with delta' = delta(i, j) (code) or delta(j, i) (paper)."""
    H, T, D = q.shape
    S = k.shape[1]
    out = np.zeros((3, H, T, S))
    for i in range(T):
        for j in range(S):
            d_ij = min(max(rel[i, j] + span, 0), 2 * span - 1)   # delta(i, j)
            d_ji = min(max(-rel[i, j] + span, 0), 2 * span - 1)  # delta(j, i)
            d2 = d_ij if p2c == "code" else d_ji
            for h in range(H):
                out[:, h, i, j] = (q[h, i] @ k[h, j], q[h, i] @ pos_key[h, d_ij], k[h, j] @ pos_query[h, d2])
    return out


@theorem("deberta.terms.index",
         "A~ = c2c + c2p + p2c with delta(i, j) = clip(i - j + k, 0, 2k - 1); the code's p2c uses "
         "delta(i, j), not the paper's delta(j, i)",
         checks=("minipos.deberta.build_relative_position", "minipos.deberta.relative_positions",
                 "minipos.deberta.c2p_term", "minipos.deberta.p2c_term",
                 "minipos.deberta.disentangled_scores_definitional"))
def _(p):
    i, j = sp.symbols("i j", integer=True)
    k = sp.Symbol("k", integer=True, positive=True)
    r_pos = sp.Function("r")  # r(a, b) = a - b: build_relative_position
    bucket = sp.Function("bucket")
    (p.derive(_delta(-r_pos(j, i), 0, k), "the code's p2c index at entry $(j, i)$ before the transpose: "
              "clip$(-r_{ji} + k)$")
      .step(_delta(i, j, k), "$r_{ji} = j - i$ (query minus key), so $-r_{ji} = i - j$: after the transpose, "
            "entry $(i, j)$ reads $\\delta(i, j)$", using={r_pos: lambda a, b: a - b}))
    (p.derive(_delta(-bucket(j - i), 0, k), "bucketed (v2/v3): clip$(-\\mathrm{bucket}(j - i) + k)$")
      .step(_delta(bucket(i - j), 0, k), "the bucket is odd: $\\mathrm{bucket}(-r) = -\\mathrm{bucket}(r)$",
            using={bucket(j - i): -bucket(i - j)})
      .step(_delta(r_pos(i, j), 0, k), "the same index as c2p: clip$(r_{ij} + k)$, $r_{ij}$ = bucket$(i - j)$",
            using={bucket(i - j): r_pos(i, j)}))
    p.refute(_delta(i, j, k), _delta(j, i, k), {i: 1, j: 0, k: 4},
             "the paper's $\\delta(j, i)$ is not the code's $\\delta(i, j)$: one key back, $k = 4$")
    _tie_relative_positions(p)
    seeds = [(3,), (4,)]
    names = (sp.Symbol("seed"),)
    p.tie("minipos.deberta.c2p_term", expected=lambda s: _terms_by_formula(*_example(s))[1], points=seeds,
          symbols=names, call=lambda f, s: f(*(lambda q, k, pk, pq, rel, sp_: (q, pk, rel, sp_))(*_example(s))),
          reason="q_i . K^r[delta(i, j)]")
    p.tie("minipos.deberta.p2c_term", expected=lambda s: _terms_by_formula(*_example(s))[2], points=seeds,
          symbols=names, call=lambda f, s: f(*(lambda q, k, pk, pq, rel, sp_: (k, pq, rel, sp_))(*_example(s))),
          reason="k_j . Q^r[delta(i, j)], as in the code")
    for convention in ("code", "paper"):
        p.tie("minipos.deberta.disentangled_scores_definitional",
              expected=lambda s: _terms_by_formula(*_example(s), p2c=convention).sum(0) / np.sqrt(3 * 3),
              points=seeds, symbols=names, reason=f"(c2c + c2p + p2c) / sqrt(3D), p2c_convention={convention!r}",
              call=lambda f, s: f(*_example(s)[:5], att_span=_example(s)[5], p2c_convention=convention))


def _tie_relative_positions(p):
    """r_ij = i - j (query minus key) in the code, plain and log-bucketed, from position 0 or a cache."""
    grid = lambda qs, ks: np.subtract.outer(np.asarray(qs), np.asarray(ks))  # noqa: E731  r_ij = i - j
    p.tie("minipos.deberta.build_relative_position", expected=lambda T, S: grid(range(T), range(S)),
          points=[(4, 4), (3, 6), (6, 2)], symbols=(sp.Symbol("T"), sp.Symbol("S")),
          call=lambda f, T, S: f(T, S), reason="entry (i, j) = i - j, queries 0 … T-1, keys 0 … S-1")
    p.tie("minipos.deberta.relative_positions", expected=lambda c: grid(range(c, c + 3), range(c + 5)),
          points=[(0,), (7,)], symbols=(sp.Symbol("cache"),),
          call=lambda f, c: f(np.arange(c, c + 3), c + 5), reason="a cached step: queries c … c+2, keys 0 … c+4")
    qs, ks = np.arange(0, 60, 7), np.arange(45)
    bucketed = _exact_log_bucket(grid(qs, ks).ravel(), 8, 32).reshape(qs.size, ks.size)
    p.tie("minipos.deberta.relative_positions", expected=lambda: bucketed, points=[()],
          call=lambda f: f(qs, ks, bucket_size=8, max_position=32),
          reason="bucketed: make_log_bucket_position(i - j), bucket_size 8, max_position 32")


def _expect(poly, gens, mu):
    """E[poly] for independent entries ``gens`` sharing the moments mu[n] = E[z^n] (linearity + independence)."""
    total = sp.Integer(0)
    for powers, coeff in sp.Poly(sp.expand(poly), *gens).terms():
        term = coeff
        for a in powers:
            term *= mu[a]
        total += term
    return sp.expand(total)


@theorem("deberta.scale.variance",
         "for independent zero-mean unit-variance entries Var(c2c + c2p + p2c) = 3D, hence the scale "
         "1/sqrt(3D) = 1/sqrt(D (1 + number of position terms))",
         checks=("minipos.deberta.disentangled_scores",))
def _(p):
    mu = {0: 1, **{n: sp.Symbol(f"mu{n}") for n in (1, 2, 3, 4)}}  # E[z^n], the same for every entry
    E = sp.Function("E")
    for D in p.cases(D=[2, 1, 3]):
        q, kc, kr, qr = (sp.symbols(f"{n}0:{D}") for n in ("q", "k", "kr", "qr"))
        gens = (*q, *kc, *kr, *qr)
        dot = lambda a, b: sum(x * y for x, y in zip(a, b))  # noqa: E731
        score = dot(q, kc) + dot(q, kr) + dot(kc, qr)  # c2c + c2p + p2c: q and k each appear twice
        (p.derive(E(score**2) - E(score) ** 2, "$\\mathrm{Var} = E[A^2] - E[A]^2$")
          .step(D * (mu[2] - mu[1] ** 2) * (3 * mu[2] + 7 * mu[1] ** 2),
                "linearity and independence, entry by entry; the $7\\mu_1^2$ part: shared $q$, $k$ correlate "
                "the terms unless the mean is zero", using={E: lambda e: _expect(e, gens, mu)}, by="expand")
          .step(3 * D, "zero mean, unit variance: $\\mu_1 = 0$, $\\mu_2 = 1$", using={mu[1]: 0, mu[2]: 1}))
    D = sp.Symbol("D", positive=True)
    V = sp.Symbol("V", positive=True)
    p.claim((1 / sp.sqrt(3 * D)) ** 2 * V, 1, "$V = 3D$: the scaled logits have unit variance", using={V: 3 * D})
    _tie_scale(p)


def _tie_scale(p):
    def expected(s, n_terms):
        c2c, c2p, p2c = _terms_by_formula(*_example(s))
        keep = {0: c2c, 1: c2c + c2p, 2: c2c + c2p + p2c}[n_terms]
        return keep / np.sqrt(3 * (1 + n_terms))  # D = 3

    types = {0: (), 1: ("c2p",), 2: ("c2p", "p2c")}
    p.tie("minipos.deberta.disentangled_scores", expected=expected,
          points=[(3, 2), (4, 2), (3, 1), (3, 0)], symbols=(sp.Symbol("seed"), sp.Symbol("n_terms")),
          call=lambda f, s, n: f(*_example(s)[:5], att_span=_example(s)[5], pos_att_type=types[n]),
          reason="scale sqrt(D (1 + n_terms)), D = 3")


def _exact_log_bucket(r, bucket_size, max_position):
    """The real-number v2/v3 bucket of each r (int array), decided in exact integer arithmetic.

    |r| <= mid: r. Otherwise sign(r) (mid + ceil(x)), x = ln(a/mid) / ln((mp-1)/mid) (mid - 1), a = |r|.
    Float64 gives ceil(x) unless x is within 1e-9 of an integer n; then x <= n iff
    a^(mid-1) mid^n <= (mp-1)^n mid^(mid-1), compared in Python integers.
    """
    mid, L = bucket_size // 2, max_position - 1
    r = np.asarray(r, dtype=np.int64)
    a = np.maximum(np.abs(r), mid)
    x = np.log(a / mid) / np.log(L / mid) * (mid - 1)
    n = np.ceil(x).astype(np.int64)
    for idx in np.flatnonzero(np.abs(x - np.round(x)) < 1e-9):
        m, ai = int(np.round(x[idx])), int(a[idx])
        n[idx] = m if ai ** (mid - 1) * mid**m <= L**m * mid ** (mid - 1) else m + 1
    return np.where(np.abs(r) <= mid, r, np.sign(r) * (mid + n))


LOG_CONFIGS = [(256, 512), (32, 128), (8, 32), (8, 33), (64, 512)]


@theorem("deberta.log_bucket",
         "make_log_bucket_position is the identity for |r| <= bucket_size // 2, odd, non-decreasing, "
         "2 mid - 1 at |r| = max_position - 1; checked exhaustively against the exact buckets",
         checks=("minipos.deberta.make_log_bucket_position",))
def _(p):
    a, L = sp.symbols("a L", positive=True)  # a = |r|, L = max_position - 1
    mid = sp.Symbol("mid", integer=True, positive=True)
    g = sp.ceiling(sp.log(a / mid) / sp.log(L / mid) * (mid - 1)) + mid  # the log branch
    p.claim(g, mid, "at $a = |r| = $ mid the log branch gives mid: the two branches meet", using={a: mid})
    p.claim(g, 2 * mid - 1, "at $a = |r| = $ max_position $- 1 = L$: $\\lceil$mid $- 1\\rceil +$ mid",
            using={a: L})
    r, s = sp.symbols("r s", integer=True)
    G = sp.Function("g")
    p.claim(sp.sign(s) * G(sp.Abs(s)), -(sp.sign(r) * G(sp.Abs(r))),
            "odd: at $s = -r$, sign$(-r) = -$sign$(r)$ and $|-r| = |r|$", using={s: -r})
    from minipos.deberta import make_log_bucket_position

    for config in p.cases(config=LOG_CONFIGS):
        bs, mp = config
        m = bs // 2
        rr = np.arange(-2 * mp, 2 * mp + 1)
        got = make_log_bucket_position(rr, bs, mp)
        inner = np.abs(rr) <= m
        p.require(np.array_equal(got[inner], rr[inner]), "the identity for |r| <= bucket_size // 2",
                  f"{config}: r = {rr[inner][got[inner] != rr[inner]][:5]} -> {got[inner][got[inner] != rr[inner]][:5]}")
        p.require(np.array_equal(got[::-1], -got), "odd: bucket(-r) = -bucket(r)", f"{config}")
        p.require(np.all(np.diff(got) >= 0), "non-decreasing in r", f"{config}")
        p.require(got[rr == mp - 1][0] == 2 * m - 1, "2 mid - 1 at r = max_position - 1",
                  f"{config}: {got[rr == mp - 1][0]}")
        p.tie("minipos.deberta.make_log_bucket_position", expected=lambda: _exact_log_bucket(rr, bs, mp),
              points=[()], call=lambda f: f(rr, bs, mp), reason=f"every r in [-2 mp, 2 mp], {config}")
    exact = _exact_log_bucket(np.arange(0, 140), 256, 512)
    p.require(np.array_equal(exact[:132], np.arange(132)) and exact[132] == 131,
              "256 / 512: the identity holds up to |r| = 131; 131 and 132 share a bucket")
