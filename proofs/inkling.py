r"""Inkling 2's decoder attention (``minipos.inkling``): its relative bias, its log scale, its clips and its
convolutions, the identities its docs page relies on.

- the bias is a learned vector per backward distance read by the query's relative state:
  b_ij = (r_i P)[p_i - j] = r_i . P_{:, p_i - j} for 0 <= p_i - j < E, else 0, so with r_i fixed it depends on
  p_i - j only (a common shift of positions leaves it), and it is zero for keys after the query and E or more back;
- on a full layer the log scale s(p) = 1 + α ln max((p + 1)/N, 1) multiplies the query and the relative state
  alike, so it multiplies the query's whole row of logits, s(p)(q.k / sqrt(D) + r.P_d); the sink is not scaled.
  s = 1 while p + 1 <= N, and s(kN - 1) = 1 + α ln k;
- the L2 clip a ↦ a min(1, τ/(|a| + ε)) has, where it clips, the vector-Jacobian product
  c d - c (a.d) a / (|a|(|a| + ε)), c = τ/(|a| + ε);
- the short convolution y_t = (u_t + Σ_l w_{t,l} u_{t-l}) / sqrt(c) reads the K tokens up to t in sequence order
  (none after t, whatever the positions) and its backward sends g_t w_{t,l} / sqrt(c) to u_{t-l};
- a per-query sink s_t is one more key with logit s_t and value 0.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minipos import inkling as code
from minipos.attention import attention

from .core import theorem

BIAS = "minipos.inkling.relative_bias"
BIAS_BACKWARD = "minipos.inkling.relative_bias_backward"
LOG_SCALE = "minipos.inkling.log_scale"
CLIP = "minipos.inkling.l2_clip"
CLIP_BACKWARD = "minipos.inkling.l2_clip_backward"
CONV = "minipos.inkling.short_conv"
CONV_BACKWARD = "minipos.inkling.short_conv_backward"
LAYER = "minipos.inkling.InklingAttention"
ATTENTION = "minipos.attention.attention"

alpha = sp.Symbol("alpha", nonnegative=True)
N = sp.Symbol("N", integer=True, positive=True)
p_, k_ = sp.symbols("p k", integer=True, positive=True)
E, R = 4, 2                                                             # bias extent, relative-state width


def _P():
    return sp.Matrix(R, E, lambda a, d: sp.Symbol(f"P_{a}{d}", real=True))


@theorem("inkling.relative_bias",
         "b_ij = (r_i P)[p_i - j] = r_i . P[:, p_i - j] for 0 <= p_i - j < E, else 0: one learned vector per backward "
         "distance, read by the query's relative state; for a fixed r_i it depends on p_i - j only",
         checks=(BIAS, BIAS_BACKWARD))
def _(p):
    P, r = _P(), sp.Matrix(sp.symbols(f"r0:{R}", real=True))
    rel = (r.T * P)                                                     # (1, E): r_i P, one bias per distance
    for d in p.cases(d=range(E)):
        p.claim(rel[0, d], r.dot(P[:, d]), f"the gather at distance {d} is $r_i \\cdot P_{{:, {d}}}$", by="expand",
                shown=(f"(r_i^\\top P)_{{{d}}}", None))
    rng = np.random.default_rng(11)
    rv, Pv = rng.normal(size=R), rng.normal(size=(R, E))

    def want(qp, kp):
        d = qp - kp
        return float(rv @ Pv[:, d]) if 0 <= d < E else 0.0
    points = [(5, 3), (5, 5), (5, 6), (9, 6), (9, 5), (100, 98), (2 ** 40, 2 ** 40 - 3), (0, 0)]
    p.tie(BIAS, expected=want, points=points, call=lambda f, qp, kp: f((rv @ Pv)[None], [qp], [kp])[0, 0],
          rtol=1e-14, reason="b = r . P[:, p - j] inside the extent E = 4, 0 outside (a key after the query, or 4+ back)")
    p.tie(BIAS, expected=lambda c: f_shift(0), points=[(1,), (7,), (10 ** 6,)],
          call=lambda f, c: f_shift(c, f), rtol=0.0, atol=0.0,
          reason="a common shift c of query and key positions gives the same bias, bit for bit")
    d_bias, rels = rng.normal(size=(3, 6)), rng.normal(size=(3, E))
    qp, kp = np.array([4, 5, 9]), np.arange(3, 9)
    p.tie(BIAS_BACKWARD, expected=lambda: float((code.relative_bias(rels, qp, kp) * d_bias).sum()), points=[()],
          call=lambda f: float((rels * f(d_bias, qp, kp, E)).sum()), rtol=1e-13,
          reason="the adjoint: <b(rel), dbias> = <rel, relative_bias_backward(dbias)>")
    p.refute(rel[0, 1], 0, {**{r[a]: 1 for a in range(R)}, **{P[a, d]: 1 for a in range(R) for d in range(E)}},
             "a port that reads the forward distance $j - p_i$ gives 0 where the bias is $r \\cdot P_{:,1}$ "
             "(one key back)")


def f_shift(c, f=None):
    """The bias of queries 3 … 6 over keys 0 … 6, positions shifted by ``c`` (the code's ``f``, else the reference)."""
    f = code.relative_bias if f is None else f
    rel = np.random.default_rng(12).normal(size=(4, E))
    return f(rel, np.arange(3, 7) + c, np.arange(7) + c)


@theorem("inkling.log_scale",
         "s(p) = 1 + α ln max((p + 1)/N, 1): 1 while p + 1 <= N and 1 + α ln k at p = kN - 1; scaling the query and "
         "the relative state by s multiplies the query's row of logits by s: (s q).k/sqrt(D) + (s r).P_d = "
         "s (q.k/sqrt(D) + r.P_d)",
         checks=(LOG_SCALE, LAYER))
def _(p):
    def s(pos):
        return 1 + alpha * sp.log(sp.Max((pos + 1) / N, 1))
    p.claim(s(k_ * N - 1), 1 + alpha * sp.log(k_), "at $p = kN - 1$: $(p + 1)/N = k \\ge 1$", by="simplify",
            shown=("s(kN - 1)", None))
    p.claim(s(N - 1), sp.Integer(1), "at $p = N - 1$: $\\max(1, 1) = 1$, $\\ln 1 = 0$", by="simplify",
            shown=("s(N - 1)", None))
    q, kk = sp.Matrix(sp.symbols("q0:2", real=True)), sp.Matrix(sp.symbols("k0:2", real=True))
    r, Pd = sp.Matrix(sp.symbols(f"r0:{R}", real=True)), sp.Matrix(sp.symbols(f"P0:{R}", real=True))
    sv, D = sp.Symbol("s", positive=True), sp.Symbol("D", positive=True)
    p.claim((sv * q).dot(kk) / sp.sqrt(D) + (sv * r).dot(Pd), sv * (q.dot(kk) / sp.sqrt(D) + r.dot(Pd)),
            "the content logit and the bias are both linear in the scaled vectors", by="expand")
    p.refute(s(N), 1 + alpha * sp.log(sp.Max(N / N, 1)), {alpha: sp.Rational(1, 2), N: 4},
             "counting $p$ in place of $p + 1$ leaves $p = N$ unscaled")
    points = [(0, 0.1, 128000), (127998, 0.1, 128000), (127999, 0.1, 128000), (255999, 0.1, 128000), (3, 0.5, 4),
              (7, 0.5, 4), (15, 0.5, 4), (10 ** 9, 0.3, 7)]
    p.tie(LOG_SCALE, expected=s(p_), symbols=(p_, alpha, N), points=points,
          call=lambda f, pos, a, n: f([pos], alpha=a, n_floor=n)[0], rtol=1e-14, atol=0.0,
          reason="s(p) = 1 + α ln max((p + 1)/N, 1), the model's α = 0.1 and N = 128000 among them")

    def ratio(cls, pos):
        """A full layer's log-weights of one query against the same layer unscaled: rows differ by the factor s(p)
        on every logit but the sink's; the logits are read back as log weights relative to the first key."""
        kw = dict(num_kv_heads=1, head_dim=4, d_rel=R, rel_extent=E, conv_kernel=2, dynamic_conv=True, seed=3)
        scaled, plain = cls(8, 1, log_scaling=(0.5, 2), **kw), cls(8, 1, **kw)
        x = np.random.default_rng(13).normal(size=(1, 3, 8))
        positions = np.array([pos - 2, pos - 1, pos])
        logw = [np.log(layer(x, positions=positions, causal=True, return_weights=True)[1][0, 0, -1])
                for layer in (scaled, plain)]
        return (logw[0][1:] - logw[0][0]) / (logw[1][1:] - logw[1][0])     # (s z_j - s z_0) / (z_j - z_0) = s
    pts = [(3,), (9,), (40,)]
    p.tie(LAYER, expected=lambda pos: np.full(2, 1 + 0.5 * np.log(max((pos + 1) / 2, 1))), points=pts,
          call=ratio, rtol=1e-9, reason="InklingAttention(log_scaling=(0.5, 2)): the last query's logit differences "
          "are s(p) times the unscaled layer's")


@theorem("inkling.clip_backward",
         "where a ↦ a min(1, τ/(|a| + ε)) clips (|a| + ε > τ), its vector-Jacobian product is "
         "c d - c (a.d) a / (|a| (|a| + ε)), c = τ/(|a| + ε); elsewhere it is d",
         checks=(CLIP, CLIP_BACKWARD))
def _(p):
    a = sp.Matrix(sp.symbols("a0:3", positive=True))
    d = sp.Matrix(sp.symbols("d0:3", real=True))
    tau, eps = sp.Symbol("tau", positive=True), sp.Symbol("epsilon", positive=True)
    n = sp.sqrt(a.dot(a))
    f = a * tau / (n + eps)                                             # the clipped branch
    vjp = sp.Matrix([sum(sp.diff(f[i], a[j]) * d[i] for i in range(3)) for j in range(3)])
    c = tau / (n + eps)
    p.claim(vjp, c * d - c * a.dot(d) * a / (n * (n + eps)), "differentiate $\\tau a / (|a| + \\epsilon)$",
            by="simplify")
    rng = np.random.default_rng(14)
    pts = [(rng.normal(size=3) * 3, rng.normal(size=3), 1.5) for _ in range(3)] + [(np.array([0.1, 0.2, 0.0]),
                                                                                   np.array([1.0, -2.0, 0.5]), 1.5)]

    def numeric(av, dv, t):
        if np.linalg.norm(av) + code.CLIP_EPS <= t:
            return dv                                                    # kept: the identity
        return _signed(vjp, a, d, tau, eps, av, dv, t)
    p.tie(CLIP_BACKWARD, expected=numeric, points=pts, call=lambda fn, av, dv, t: fn(av, t, dv), rtol=1e-10,
          reason="the clip's backward against sp.diff of the clipped branch (kept vectors: d itself)")


def _signed(vjp, a, d, tau, eps, av, dv, t):
    """The VJP at ``av``, from the positive symbols: with S the signs of ``av``, f(S a) = S f(a) (the norm ignores
    signs), so the VJP at S|a| for d is S VJP(|a|; S d)."""
    S = np.where(av < 0, -1.0, 1.0)
    subs = {**dict(zip(a, [sp.Float(x) for x in np.abs(av)])), tau: t, eps: code.CLIP_EPS,
            **dict(zip(d, [sp.Float(x) for x in S * dv]))}
    return S * np.array([float(v) for v in vjp.subs(subs)])


@theorem("inkling.short_conv",
         "y_t = (u_t + Σ_l w_{t,l} u_{t-l}) / sqrt(c) reads u_{t-K+1} … u_t only, in sequence order; its backward sends "
         "g_t w_{t,l} / sqrt(c) to u_{t-l} and g_t u_{t-l} / sqrt(c) to w_{t,l}",
         checks=(CONV, CONV_BACKWARD))
def _(p):
    T, K = 3, 2
    u = sp.symbols(f"u0:{T}", real=True)
    w = sp.Matrix(T, K, lambda t, l: sp.Symbol(f"w_{t}{l}", real=True))
    g = sp.symbols(f"g0:{T}", real=True)
    c = sp.Symbol("c", positive=True)
    y = [(u[t] + sum(w[t, l] * u[t - l] for l in range(K) if t - l >= 0)) / sp.sqrt(c) for t in range(T)]
    for t in p.cases(t=range(T)):
        p.claim(sp.Matrix([sp.diff(y[t], v) for v in u[t + 1:]] or [0]), sp.zeros(max(T - t - 1, 1), 1),
                f"$y_{t}$ does not read a later token", by="expand",
                shown=(f"\\partial y_{t} / \\partial u_{{s > {t}}}", None))
    L = sum(gi * yi for gi, yi in zip(g, y))
    for s_ in p.cases(s=range(T)):
        p.claim(sp.diff(L, u[s_]), (g[s_] + sum(g[s_ + l] * w[s_ + l, l] for l in range(K) if s_ + l < T)) / sp.sqrt(c),
                f"$\\partial L / \\partial u_{s_}$: the residual and every tap that reads it", by="expand",
                shown=(f"\\partial \\langle g, y \\rangle / \\partial u_{s_}", None))
    rng = np.random.default_rng(15)
    taps, uv, hist, gv = rng.normal(size=(K, 1)), rng.normal(size=(1, T, 1)), np.zeros((1, K - 1, 1)), rng.normal(
        size=(1, T, 1))
    subs = {**{u[t]: uv[0, t, 0] for t in range(T)}, **{w[t, l]: taps[l, 0] for t in range(T) for l in range(K)},
            **{g[t]: gv[0, t, 0] for t in range(T)}, c: K + 1}
    p.tie(CONV, expected=lambda: np.array([float(yi.subs(subs)) for yi in y]), points=[()],
          call=lambda f: f(uv, hist, taps)[0, :, 0], rtol=1e-13, reason="static taps, K = 2, c = K + 1")
    p.tie(CONV_BACKWARD, expected=lambda: np.array([float(sp.diff(L, v).subs(subs)) for v in u]), points=[()],
          call=lambda f: f(uv, hist, taps, gv)[0][0, :, 0], rtol=1e-13, reason="du against sp.diff of <g, y>")
    later = np.concatenate([uv, rng.normal(size=(1, 2, 1))], axis=1)
    p.require(np.array_equal(code.short_conv(later, hist, taps)[:, :T], code.short_conv(uv, hist, taps)),
              "short_conv: appending tokens changes no earlier output (causal in sequence order)")


@theorem("inkling.sinks",
         "a per-query sink logit s_t is one more key with logit s_t and value 0: softmax([x | s_t]) V' with V' = "
         "[V; 0] drops nothing but the sink's column",
         checks=(ATTENTION,))
def _(p):
    x = sp.symbols("x0:2", real=True)
    s = sp.Symbol("s", real=True)
    v = sp.symbols("v0:2", real=True)
    z = sp.exp(s) + sum(sp.exp(xi) for xi in x)
    with_key = sum(sp.exp(xi) / z * vi for xi, vi in zip(x, v)) + sp.exp(s) / z * 0
    p.claim(with_key, sum(sp.exp(xi) * vi for xi, vi in zip(x, v)) / z, "the zero value adds nothing", by="expand",
            shown=("\\mathrm{softmax}([x \\mid s])\\,[V; 0]", None))
    rng = np.random.default_rng(16)
    q, k, vv = rng.normal(size=(1, 2, 3, 4)), rng.normal(size=(1, 2, 5, 4)), rng.normal(size=(1, 2, 5, 2))
    sinks = rng.normal(size=(1, 2, 3))
    zero_k, zero_v = np.concatenate([k, np.zeros((1, 2, 1, 4))], 2), np.concatenate([vv, np.zeros((1, 2, 1, 2))], 2)
    bias = np.concatenate([np.zeros((1, 2, 3, 5)), sinks[..., None]], -1)
    p.tie(ATTENTION, expected=lambda: attention(q, zero_k, zero_v, bias=bias).ravel(), points=[()],
          call=lambda f: f(q, k, vv, sinks=sinks).ravel(), rtol=1e-13,
          reason="sinks (B, H, T) against a zero-valued key whose bias is each row's sink")
