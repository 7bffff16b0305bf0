r"""T5: where the log buckets start, and which of the four terms T5 keeps.

Raffel et al. 2020, arXiv:1910.10683, §2.1; the bucket function is mesh-tensorflow's
``_relative_position_bucket`` (transformers' ``T5Attention._relative_position_bucket``). With
``P`` buckets per direction (``K // 2`` bidirectional, ``K`` causal), ``E = P // 2`` and maximum
distance ``M``, a distance ``m >= E`` goes to bucket ``min(P - 1, E + floor(x(m)))`` with

    x(m) = ln(m / E) / ln(M / E) * (P - E).

- x is increasing and x(m*_k) = k exactly at m*_k = E (M/E)^(k / (P - E)), so the first integer
  distance of bucket E + k is ceil(m*_k). For 32 buckets, M = 128, bidirectional (P = 16, E = 8)
  the last bucket starts at ceil(8 * 16^(7/8)) = ceil(64 sqrt 2) = 91, not 128.
- The bucket is non-decreasing in |n| on each side; bucket P (bidirectional ``n = +0``) is never
  used.
- Of the four terms of (x_i + p_i) W_q W_k^T (x_j + p_j)^T, T5 keeps content-content only and
  replaces position-position by a learned per-head scalar table[bucket(j - i), h]; it does not
  divide by sqrt(D) (checked on the layer: ``T5Bias().scale(D)`` is 1).

The reference evaluates x(m) in float32. At the configurations checked here every threshold
where m*_k is an integer (16, 32, 64 for 32/128) is a power-of-two ratio that float32 evaluates
exactly, so the float32 buckets (``exact=False``, the default) equal the real-number closed
form; at unusual configurations a threshold within a few ulps of an integer can move by one
(``minipos.t5`` docstring: causal 15/636), which is why the last check uses ``exact=True``.
"""

from __future__ import annotations

import functools

import numpy as np
import sympy as sp

from .core import theorem

# (bidirectional, num_buckets, max_distance, exact): the T5 default first; float32 mode unless exact.
CONFIGS = [(True, 32, 128, False), (False, 32, 128, False), (True, 32, 256, False),
           (True, 64, 256, False), (True, 16, 64, False), (False, 15, 636, True)]


def _expand_logs(e):
    """Strategy: ln(a^b) = b ln a, ln(a/b) = ln a - ln b for positive a, b; then expand and cancel."""
    return sp.cancel(sp.expand(sp.expand_log(sp.expand(e))))


@functools.lru_cache(maxsize=None)
def _thresholds(P: int, M: int) -> tuple:
    """first[b]: the smallest distance m >= 0 in bucket >= b, b = 0 … P-1, by the closed form
    ceil(E (M/E)^(k/(P-E))) for b = E + k (exact: SymPy's ceiling of an algebraic number)."""
    E = P // 2
    logs = [int(sp.ceiling(E * sp.Rational(M, E) ** sp.Rational(k, P - E))) for k in range(1, P - E)]
    return tuple(range(E + 1)) + tuple(logs)


def _bucket(n: int, bidirectional: bool, K: int, M: int) -> int:
    """The math's bucket of n = key - query: the last b whose first distance is <= |n|."""
    P = K // 2 if bidirectional else K
    offset, m = (P if n > 0 else 0, abs(n)) if bidirectional else (0, max(-n, 0))
    return offset + sum(1 for t in _thresholds(P, M) if t <= m) - 1


def _first_distances(bidirectional: bool, K: int, M: int) -> np.ndarray:
    """The math's smallest |n| of each bucket, -1 where no n lands (skipped or n = +0)."""
    out = np.full(K, -1)
    for n in range(-2 * M, 2 * M + 1):  # every bucket is reached below 2M
        b = _bucket(n, bidirectional, K, M)
        if out[b] < 0 or abs(n) < out[b]:
            out[b] = abs(n)
    return out


@theorem("t5.bucket.first_distance",
         "the first distance of log bucket E + k is ceil(E (M/E)^(k/(P - E))), checked for every bucket",
         checks=("minipos.t5.relative_position_bucket", "minipos.t5.first_distance_of_bucket"))
def _(p):
    E, M, W, k, m = sp.symbols("E M W k m", positive=True)  # W = P - E, the number of log buckets
    eps = sp.Symbol("epsilon", positive=True)
    x = sp.log(m / E) / sp.log(M / E) * W
    m_star = E * (M / E) ** (k / W)
    (p.derive(x.subs(m, m_star), "$x(m) = \\ln(m/E) / \\ln(M/E) \\cdot (P - E)$ at $m^*_k = E (M/E)^{k/(P-E)}$")
      .step(sp.Mul(k / W, sp.log(M / E), W, 1 / sp.log(M / E), evaluate=False), "$\\ln a^b = b \\ln a$",
            by=_expand_logs)
      .step(k, "cancel: $x(m^*_k) = k$ exactly", by="cancel"))
    (p.derive(sp.Derivative(x, m))
      .step(W / (m * sp.log(M / E)), "differentiate $\\ln(m/E)$", by="doit")
      .step(W / (m * sp.log(1 + eps)), "$M > E$: write $M/E = 1 + \\epsilon$", using={M: E * (1 + eps)}))
    p.require((W / (m * sp.log(1 + eps))).is_positive,
              "dx/dm > 0: x is increasing, so floor(x(m)) >= k iff m >= m*_k iff m >= ceil(m*_k)")
    for config in p.cases(config=CONFIGS):
        bidirectional, K, M_, exact = config
        P = K // 2 if bidirectional else K
        first = _thresholds(P, M_)
        p.require(all(a <= b for a, b in zip(first, first[1:])), "the first distances are non-decreasing",
                  f"{first}")
        kw = dict(bidirectional=bidirectional, num_buckets=K, max_distance=M_, exact=exact)
        p.tie("minipos.t5.first_distance_of_bucket", expected=lambda: _first_distances(bidirectional, K, M_),
              points=[()], call=lambda f: f(**kw), reason=f"every bucket, {config}")
        n = np.arange(-2 * M_, 2 * M_ + 1)
        p.tie("minipos.t5.relative_position_bucket",
              expected=lambda: np.array([_bucket(int(v), bidirectional, K, M_) for v in n]),
              points=[()], call=lambda f: f(n, **kw), reason=f"every n in [-2M, 2M], {config}")


@theorem("t5.bucket.last_starts_at_91",
         "32 buckets, max distance 128, bidirectional: the last bucket starts at |n| = 91, not 128, "
         "and bucket 16 is never used",
         checks=("minipos.t5.relative_position_bucket", "minipos.t5.first_distance_of_bucket"))
def _(p):
    E, M, P, k = 8, 128, 16, 7  # the last bucket is E + k = 15 (and 31 for keys after the query)
    first = E * sp.Rational(M, E) ** sp.Rational(k, P - E)
    (p.derive(sp.Mul(E, sp.Pow(sp.Rational(M, E), sp.Rational(k, P - E), evaluate=False), evaluate=False),
              "$m^*_k = E (M/E)^{k/(P-E)}$ at $E = 8$, $M = 128$, $P = 16$, $k = 7$")
      .step(sp.Mul(8, sp.Pow(2, sp.Rational(7, 2), evaluate=False), evaluate=False), "$16^{7/8} = 2^{7/2}$",
            by="doit")
      .step(64 * sp.sqrt(2), "$2^{7/2} = 8 \\sqrt{2}$", by="doit"))
    p.require(90**2 < (64 * sp.sqrt(2)) ** 2 < 91**2, "8100 < 8192 < 8281, so 90 < 64 sqrt 2 < 91")
    p.claim(sp.ceiling(first, evaluate=False), 91, "the first distance of the last bucket", by="doit")
    Es, Ms, Ps, ks = sp.symbols("E M P k", positive=True)
    p.refute(sp.ceiling(Es * (Ms / Es) ** (ks / (Ps - Es))), Ms, {Es: E, Ms: M, Ps: P, ks: k},
             "the last bucket does not start at max_distance")
    p.require(_thresholds(P, M) == (0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 91),
              "first distances of buckets 0 … 15: 0 … 8, 12, 16, 23, 32, 46, 64, 91")
    p.require(_bucket(1, True, 2 * P, M) == P + 1 and _bucket(0, True, 2 * P, M) == 0,
              "bucket = P [n > 0] + b(|n|) with b non-decreasing: n > 0 has |n| >= 1, so bucket >= "
              "P + b(1) = 17; n <= 0 gives bucket <= P - 1 = 15; bucket 16 would need n > 0 and |n| = 0")
    p.tie("minipos.t5.relative_position_bucket", expected=lambda: np.array([14, 15, 15, 15, 30, 31, 31, 0, 17]),
          points=[()], call=lambda f: f(np.array([-90, -91, -128, -10**6, 90, 91, 10**6, 0, 1])),
          reason="n = -90, -91, -128, -10^6, 90, 91, 10^6, 0, 1")
    p.tie("minipos.t5.first_distance_of_bucket", expected=lambda: np.array([91, 91, -1]), points=[()],
          call=lambda f: f()[[15, 31, 16]], reason="buckets 15, 31 start at 91; bucket 16 is unused")
    everything = np.arange(-10**4, 10**4 + 1)
    p.tie("minipos.t5.relative_position_bucket", expected=lambda: np.array(False), points=[()],
          call=lambda f: np.isin(16, f(everything)), reason="16 never occurs for |n| <= 10^4")


@theorem("t5.bucket.monotone",
         "the bucket is non-decreasing in |n| on each side and constant from the last threshold on",
         checks=("minipos.t5.relative_position_bucket",),
         latex=r"\begin{aligned}"
               r"\mathrm{bucket}(n) &= P\,[n > 0] + b(|n|) && \text{bidirectional; causal: } b(\max(-n, 0)) \\"
               r"b(m) &= \begin{cases} m & m < E \\ \min\big(P - 1, E + \lfloor x(m) \rfloor\big) & m \ge E "
               r"\end{cases} && \text{non-decreasing, as } x \text{ is} \\"
               r"x(m) &= \frac{\ln(m/E)}{\ln(M/E)}\,(P - E) && \text{increasing; } b = P - 1 "
               r"\text{ from the last threshold on}"
               r"\end{aligned}")
def _(p):
    from minipos.t5 import relative_position_bucket

    for config in p.cases(config=CONFIGS):
        bidirectional, K, M, exact = config
        P = K // 2 if bidirectional else K
        kw = dict(bidirectional=bidirectional, num_buckets=K, max_distance=M, exact=exact)
        m = np.arange(0, 3 * M)
        past = relative_position_bucket(-m, **kw)  # keys before the query: |n| = m
        p.require(np.all(np.diff(past) >= 0) and np.all(np.diff(past) <= 1),
                  "keys before the query: non-decreasing in |n|, never skipping a used bucket",
                  f"{config}: {past[:40]} …")
        p.require(np.all(past[_thresholds(P, M)[-1]:] == P - 1), "constant from the last threshold on",
                  f"{config}")
        if bidirectional:
            future = relative_position_bucket(m[1:], **kw)
            p.require(np.all(future == past[1:] + P),
                      "keys after the query: the same buckets shifted by P", f"{config}")
        else:
            p.require(np.all(relative_position_bucket(m, **kw) == 0), "causal: every future key is bucket 0",
                      f"{config}")


@theorem("t5.score.terms",
         "T5 keeps content-content, replaces position-position by a per-head scalar "
         "table[bucket(j - i), h], drops the mixed terms and does not divide by sqrt(D)",
         checks=("minipos.t5.t5_bias", "minipos.layer.T5Bias", "minipos.attention.attention"))
def _(p):
    xi, pi, Wq, WkT, xjT, pjT = sp.symbols("x_i p_i W_q W_k^T x_j^T p_j^T", commutative=False)
    i, j = sp.symbols("i j", integer=True)
    beta = sp.Function("b_h")(sp.Function("bucket")(j - i))
    (p.derive((xi + pi) * Wq * WkT * (xjT + pjT), "absolute positions added: query $x_i + p_i$, key $x_j + p_j$")
      .step(xi * Wq * WkT * xjT + xi * Wq * WkT * pjT + pi * Wq * WkT * xjT + pi * Wq * WkT * pjT,
            "distribute", by="expand")
      .step(xi * Wq * WkT * xjT + beta,
            "T5: no position enters $W_q$, $W_k$ (mixed terms 0); position-position becomes the learned "
            "scalar $b_h(\\mathrm{bucket}(j - i))$",
            using={xi * Wq * WkT * pjT: 0, pi * Wq * WkT * xjT: 0, pi * Wq * WkT * pjT: beta}))
    s, b, D = sp.symbols("s b D", positive=True)
    p.refute(s + b, s / sp.sqrt(D) + b, {s: 2, b: 0, D: 4},
             "the T5 logit $q \\cdot k + b$ is not scaled by $1/\\sqrt{D}$")
    p.tie("minipos.layer.T5Bias", expected=sp.Integer(1), symbols=(D,), points=[(4,), (64,), (128,)],
          call=lambda cls, d: cls().scale(d), reason="T5Bias().scale(D) = 1, not 1/sqrt(D)")
    _tie_t5_attention(p)


def _tie_t5_attention(p):
    """attention(q, k, v, bias=t5_bias(...), scale=T5Bias().scale(D))
    = softmax(q.k + table[bucket(j - i), h]) v."""
    from minipos.attention import attention
    from minipos.layer import T5Bias

    rng = np.random.default_rng(5)
    H, T, S, D, K, M = 2, 3, 20, 4, 32, 128
    table = rng.normal(size=(K, H)).round(3)
    q, k = rng.normal(size=(H, T, D)), rng.normal(size=(H, S, D))
    v = np.broadcast_to(np.eye(S), (H, S, S))  # v = I: the output rows are the weights
    qpos = np.array([0, 9, 19])

    def expected(offset):
        logits = np.einsum("htd,hsd->hts", q, k)  # scale 1: no 1/sqrt(D)
        for t, i in enumerate(qpos):
            for j in range(S):
                logits[:, t, j] += table[_bucket(j - int(i), True, K, M)]  # b_h(bucket(j - i))
        w = np.exp(logits - logits.max(-1, keepdims=True))
        return w / w.sum(-1, keepdims=True)

    def call(f, offset):  # positions shifted by offset: a Toeplitz bias gives the same weights
        bias = f(table, qpos + offset, np.arange(S) + offset)
        return attention(q, k, v, bias=bias, scale=T5Bias().scale(D))  # the layer's scale
    p.tie("minipos.t5.t5_bias", expected=expected, points=[(0,), (1000,)], call=call,
          symbols=(sp.Symbol("offset"),), reason="softmax(q.k + table[bucket(j - i), h]), the T5Bias scale")
