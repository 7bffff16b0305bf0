r"""Transformer-XL: the four relative terms and the relative shift.

Dai et al. 2019, "Transformer-XL", arXiv:1901.02860, §3.3. In row-vector form (minipos uses
``x @ W``) the absolute score is (x_i + p_i) W_q W_k^T (x_j + p_j)^T. The paper

- splits W_k into W_{k,E} (content keys) and W_{k,R} (position keys) and replaces the key's
  absolute position p_j by the relative R_{i-j}: p_j W_k -> R_{i-j} W_{k,R};
- replaces the query's position p_i W_q by a learned global u where it meets a content key and
  by another global v where it meets a position key;

which gives (a) x_i W_q W_{k,E}^T x_j^T, (b) x_i W_q W_{k,R}^T R_{i-j}^T, (c) u W_{k,E}^T x_j^T,
(d) v W_{k,R}^T R_{i-j}^T, grouped as (q_i + u) . k_j + (q_i + v) . W_R R_{i-j}. The symbols are
non-commutative: only the order of the factors is used.

The relative shift (the reference ``_rel_shift``) pads a zero column on the left of the
(T, S) scores, S = T + M, re-views the buffer as (S + 1, T), drops the first row and views it
back as (T, S). Output (i, j) is flat index T + iS + j of the padded buffer, i.e. row i, column
T + j - i there, so out[i, j] = BD[i, j + T - 1 - i] for j <= i + M: column j + T - 1 - i of BD
holds distance S - 1 - (j + T - 1 - i) = (M + i) - j, the query's position minus the key's.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem


@theorem("transformer_xl.four_terms",
         "substituting R_{i-j} for the key position and u, v for the query position in the four-term "
         "expansion gives (a) + (b) + (c) + (d) = (q_i + u) . k_j + (q_i + v) . W_R R_{i-j}",
         checks=("minipos.transformer_xl.xl_terms", "minipos.transformer_xl.xl_scores"))
def _(p):
    xi, pi, Wq, WkT, xjT, pjT = sp.symbols("x_i p_i W_q W_k^T x_j^T p_j^T", commutative=False)
    WkET, WkRT, RT, u, v = (sp.Symbol(n, commutative=False) for n in ("W_{k,E}^T", "W_{k,R}^T", "R_{i-j}^T", "u", "v"))
    a, b = xi * Wq * WkET * xjT, xi * Wq * WkRT * RT
    c, d = u * WkET * xjT, v * WkRT * RT
    (p.derive((xi + pi) * Wq * WkT * (xjT + pjT), "the absolute score, row-vector form")
      .step(xi * Wq * WkT * xjT + xi * Wq * WkT * pjT + pi * Wq * WkT * xjT + pi * Wq * WkT * pjT,
            "distribute", by="expand")
      .step(xi * Wq * WkT * xjT + b + pi * Wq * WkT * xjT + pi * Wq * WkRT * RT,
            "key position: $W_k^T p_j^T \\to W_{k,R}^T R_{i-j}^T$ (relative, sinusoidal, not learned)",
            using={WkT * pjT: WkRT * RT})
      .step(a + b + pi * Wq * WkET * xjT + pi * Wq * WkRT * RT,
            "key content: $W_k \\to W_{k,E}$", using={WkT: WkET})
      .step(a + b + c + d, "query position: $p_i W_q \\to u$ against content keys, $\\to v$ against position keys",
            using={pi * Wq * WkET: u * WkET, pi * Wq * WkRT: v * WkRT})
      .step((xi * Wq + u) * WkET * xjT + (xi * Wq + v) * WkRT * RT,
            "group: $(q_i + u) \\cdot k_j + (q_i + v) \\cdot W_R R_{i-j}$", by="expand"))
    _tie_terms(p)


def _sinusoid(n, d_model, base=10000.0):
    """R_n = [sin(n w) | cos(n w)], w_c = base^(-2c/d_model): the paper's fixed table, from its formula."""
    w = base ** (-2.0 * np.arange(d_model // 2) / d_model)
    return np.concatenate([np.sin(n * w), np.cos(n * w)])


def _example(seed=11, H=2, T=3, M=2, D=2, d_model=4):
    rng = np.random.default_rng(seed)
    S = T + M
    q, k = rng.normal(size=(H, T, D)), rng.normal(size=(H, S, D))
    w_r, u, v = rng.normal(size=(d_model, H * D)), rng.normal(size=(H, D)), rng.normal(size=(H, D))
    return q, k, w_r, u, v, M


def _terms_by_formula(q, k, w_r, u, v, M):
    """(a), (b), (c), (d) pair by pair, query row i at position M + i, key j at position j."""
    H, T, D = q.shape
    S = k.shape[1]
    out = np.zeros((4, H, T, S))
    for i in range(T):
        for j in range(S):
            r = (_sinusoid((M + i) - j, w_r.shape[0]) @ w_r).reshape(H, D)  # W_R R_{i-j}, per head
            for h in range(H):
                out[:, h, i, j] = (q[h, i] @ k[h, j], q[h, i] @ r[h], u[h] @ k[h, j], v[h] @ r[h])
    return out


def _tie_terms(p):
    from minipos.transformer_xl import relative_embeddings, relative_heads

    names = (sp.Symbol("seed"),)
    p.tie("minipos.transformer_xl.xl_terms", expected=lambda s: _terms_by_formula(*_example(s)),
          points=[(11,), (12,)], symbols=names, reason="(a), (b), (c), (d) pair by pair",
          call=lambda f, s: np.stack(f(*_example(s)[:5])))

    def shifted(f, s):  # the efficient form, on the entries the causal mask keeps
        q, k, w_r, u, v, M = _example(s)
        H, T, S = q.shape[0], q.shape[1], k.shape[1]
        r = relative_heads(relative_embeddings(S, w_r.shape[0]), w_r, H)  # (H, S, D), descending distances
        return np.where(np.tril(np.ones((T, S), bool), M), f(q, k, r, u, v), 0.0)

    def grouped(s):
        a, b, c, d = _terms_by_formula(*_example(s))
        T, S = a.shape[-2:]
        return np.where(np.tril(np.ones((T, S), bool), _example(s)[-1]), a + b + c + d, 0.0)
    p.tie("minipos.transformer_xl.xl_scores", expected=grouped, call=shifted, points=[(11,), (12,)],
          symbols=names, reason="(q + u).k + (q + v).r_{i-j} for j <= i + M")


@theorem("transformer_xl.rel_shift",
         "pad-reshape-slice places BD[i, j + T - 1 - i] at (i, j) for j <= i + M (distance (M + i) - j); "
         "then the pad zero at j = i + M + 1 and BD[i + 1, j - i - M - 2] beyond",
         checks=("minipos.transformer_xl.rel_shift",))
def _(p):
    i, j, T, M = sp.symbols("i j T M", integer=True, nonnegative=True)
    S = sp.Symbol("S", integer=True, positive=True)
    (p.derive(T + i * S + j, "output $(i, j)$ of $(T, S)$ is flat index $T + iS + j$ of the padded buffer")
      .step(i * (S + 1) + (T + j - i), "row $i$, column $T + j - i$ of the $(T, S + 1)$ padded view", by="expand"))
    (p.derive(S - (T + j - i), "room left in row $i$")
      .step((i + M) - j, "$S = T + M$: non-negative exactly when $j \\leq i + M$", using={S: T + M}, by="expand"))
    (p.derive(S - 1 - (j + T - 1 - i), "padded column $T + j - i$ is BD column $c = j + T - 1 - i$ "
              "(column 0 is the pad), which holds distance $S - 1 - c$ (descending)")
      .step((M + i) - j, "the query's position $M + i$ minus the key's", using={S: T + M}, by="expand"))
    (p.derive(i * (S + 1) + (T + (i + M + 1) - i), "$j = i + M + 1$: column $S + 1$ wraps")
      .step((i + 1) * (T + M + 1), "$= (i + 1)(S + 1)$: row $i + 1$, column 0, the pad zero", using={S: T + M},
            by="expand"))
    for size in p.cases(T_M=[(3, 2), (1, 0), (3, 0), (1, 4), (4, 1), (5, 3)]):
        Tn, Mn = size
        Sn = Tn + Mn
        ok = all(divmod(Tn + a * Sn + b, Sn + 1) == (a, Tn + b - a) for a in range(Tn) for b in range(a + Mn + 1))
        p.require(ok, "divmod(T + iS + j, S + 1) = (i, T + j - i) for every j <= i + M", f"T={Tn}, M={Mn}")
        p.tie("minipos.transformer_xl.rel_shift", expected=lambda T, M: _shift_by_formula(T, M),
              points=[size], call=lambda f, T, M: f(_labels(T, T + M)), symbols=(sp.Symbol("T"), sp.Symbol("M")),
              reason="every entry, labelled BD")


def _labels(T, S):
    """BD with distinct exact labels: BD[i, c] = 1 + i S + c."""
    return 1.0 + np.arange(T * S, dtype=float).reshape(T, S)


def _shift_by_formula(T, M):
    """out[i, j] from the theorem: BD[i, j + T - 1 - i] (j <= i + M), 0 (j = i + M + 1), BD[i + 1, j - i - M - 2]."""
    S, bd = T + M, _labels(T, T + M)
    out = np.zeros((T, S))
    for i in range(T):
        for j in range(S):
            if j <= i + M:
                out[i, j] = bd[i, j + T - 1 - i]
            elif j > i + M + 1:
                out[i, j] = bd[i + 1, j - i - M - 2]
    return out
