r"""Multi-head latent attention with decoupled RoPE (DeepSeek-V2, arXiv:2405.04434, §2.1.2-2.1.3).

Row vectors, as in minipos (``x @ W``); RoPE acts on a row as x R(t)^T with R from ``proofs.rope``.
For one head, the latent query c^Q (1 x r_q) and the cached latent c^KV (1 x r_kv) give the content
parts q^C = c^Q W^{UQ}, k^C = c^KV W^{UK}, and

    q^C_i . k^C_j = c^Q_i (W^{UQ} W^{UK T}) c^KV_j^T,

one fixed r_q x r_kv matrix in the middle: it can be folded into the query once, and attention
runs on the cached latents (§2.1.2's absorption). With RoPE on the whole key (§2.1.3),

    (q^C_i R(i)^T) . (k^C_j R(j)^T) = c^Q_i (W^{UQ} R(j - i) W^{UK T}) c^KV_j^T,

the middle matrix depends on j - i, so no fixed matrix absorbs it. Hence the decoupled score:

    [q^C_i | q^R_i R(i)^T] . [k^C_j | k^R_j R(j)^T] = c^Q_i (W^{UQ} W^{UK T}) c^KV_j^T + q^R_i R(j - i) k^R_j^T,

the latent part absorbed, the rope part a function of j - i only, with k^R_j cached as it is.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem
from .rope import R

i, j, d = sp.symbols("i j d", real=True)
MLA, NORM, MSCALE, SCHEME = ("minipos.mla.MultiHeadLatentAttention", "minipos.mla.rms_norm",
                             "minipos.mla.yarn_get_mscale", "minipos.mla.DecoupledRotary")


def row(name, size):
    """A symbolic row vector (1, size)."""
    return sp.Matrix([list(sp.symbols(f"{name}0:{size}", real=True))])


def mat(name, rows, cols):
    """A symbolic (rows, cols) matrix with entries name_{r c}."""
    return sp.Matrix(rows, cols, lambda r, c: sp.Symbol(f"{name}_{r}{c}", real=True))


@theorem("mla.absorb",
         "Without position the latent content score has one fixed matrix in the middle, W^{UQ} W^{UK T}; "
         "RoPE on the whole key puts R(j - i) there, which depends on the positions",
         checks=(MLA,),
         latex=r"\begin{aligned}"
               r"q^C_i \cdot k^C_j &= c^Q_i\, (W^{UQ} W^{UK\top})\, c^{KV\top}_j \\"
               r"(q^C_i R(i)^\top) \cdot (k^C_j R(j)^\top) &= "
               r"c^Q_i\, \big(W^{UQ} R(j - i)\, W^{UK\top}\big)\, c^{KV\top}_j"
               r"\end{aligned}")
def _(p):
    D, r_q, r_kv = 2, 2, 2
    cq, ckv, A, Bm = row("c_q", r_q), row("c_kv", r_kv), mat("a", r_q, D), mat("b", r_kv, D)
    (p.derive(((cq * A) * (ckv * Bm).T)[0, 0], shown=r"(c^Q_i W^{UQ}) (c^{KV}_j W^{UK})^\top")
      .step((cq * (A * Bm.T) * ckv.T)[0, 0], "associativity: $W^{UQ} W^{UK\\top}$ is one fixed matrix",
            by="expand", shown=r"c^Q_i\, (W^{UQ} W^{UK\top})\, c^{KV\top}_j"))
    _rotated_key(p, cq, ckv, D, r_q, r_kv)                      # shown at D = 2, checked at D = 4 too
    for Dn in p.cases(D=[4]):
        _rotated_key(p, cq, ckv, Dn, r_q, r_kv)
    p.refute(R(d, D), R(d + 1, D), {d: 0},
             "with $W^{UQ} = W^{UK} = I$ the middle matrix is $R(j - i)$; at distance 0 and 1 it differs, "
             "so no fixed matrix absorbs RoPE")


def _rotated_key(p, cq, ckv, Dn, r_q, r_kv):
    """RoPE on the whole key at head dim Dn: the middle matrix becomes W^{UQ} R(j - i) W^{UK T}."""
    A, Bm = mat("a", r_q, Dn), mat("b", r_kv, Dn)
    (p.derive(((cq * A * R(i, Dn).T) * (ckv * Bm * R(j, Dn).T).T)[0, 0],
              shown=r"(c^Q_i W^{UQ} R(i)^\top) (c^{KV}_j W^{UK} R(j)^\top)^\top")
      .step((cq * A * R(i, Dn).T * R(j, Dn) * Bm.T * ckv.T)[0, 0], "the transpose of a product",
            by="expand", shown=r"c^Q_i\, W^{UQ} R(i)^\top R(j)\, W^{UK\top} c^{KV\top}_j")
      .step((cq * A * R(j - i, Dn) * Bm.T * ckv.T)[0, 0], "$R(i)^\\top R(j) = R(j - i)$", by="trig",
            shown=r"c^Q_i\, \big(W^{UQ} R(j - i)\, W^{UK\top}\big)\, c^{KV\top}_j"))


@theorem("mla.decoupled",
         "Decoupled RoPE: the score splits into a latent part with a fixed middle matrix and a rope part "
         "that depends on j - i only",
         checks=(MLA, SCHEME),
         latex=r"[\,q^C_i \mid q^R_i R(i)^\top\,] \cdot [\,k^C_j \mid k^R_j R(j)^\top\,]"
               r" = c^Q_i\, (W^{UQ} W^{UK\top})\, c^{KV\top}_j + q^R_i\, R(j - i)\, k^{R\top}_j")
def _(p):
    D_N, D_R, r_q, r_kv = 2, 2, 2, 2
    cq, ckv, A, Bm = row("c_q", r_q), row("c_kv", r_kv), mat("a", r_q, D_N), mat("b", r_kv, D_N)
    qR, kR = row("q_R", D_R), row("k_R", D_R)
    q = (cq * A).row_join(qR * R(i, D_R).T)                     # (1, D_N + D_R)
    k = (ckv * Bm).row_join(kR * R(j, D_R).T)
    (p.derive((q * k.T)[0, 0], shown=r"[\,q^C_i \mid q^R_i R(i)^\top\,] \cdot [\,k^C_j \mid k^R_j R(j)^\top\,]")
      .step(((cq * A) * (ckv * Bm).T)[0, 0] + (qR * R(i, D_R).T * R(j, D_R) * kR.T)[0, 0],
            "a dot product of concatenations is the sum of the parts' dot products", by="expand",
            shown=r"q^C_i \cdot k^C_j + q^R_i R(i)^\top R(j)\, k^{R\top}_j")
      .step((cq * (A * Bm.T) * ckv.T)[0, 0] + (qR * R(j - i, D_R) * kR.T)[0, 0],
            "associativity (mla.absorb) and $R(i)^\\top R(j) = R(j - i)$", by=["expand", "trig"],
            shown=r"c^Q_i\, (W^{UQ} W^{UK\top})\, c^{KV\top}_j + q^R_i\, R(j - i)\, k^{R\top}_j"))
    _ties(p)


def _scale(cls, s, m_all):
    """DecoupledRotary's softmax scale for D_N + D_R = 3 + 4 under YaRN with factor s and mscale_all_dim m_all."""
    from minipos.mla import MultiHeadLatentAttention
    scaling = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": 16, "mscale": 1.0,
               "mscale_all_dim": m_all}
    layer = MultiHeadLatentAttention(8, 2, kv_lora_rank=3, qk_nope_head_dim=3, qk_rope_head_dim=4, v_head_dim=2,
                                     scheme=cls(scaling=scaling))
    return layer.scheme.scale(layer.head_dim)


def _ties(p):
    """RMSNorm, YaRN's mscale and the softmax scale that squares it, against their formulas."""
    s, m_all, eps = sp.Symbol("s", positive=True), sp.Symbol("m", positive=True), sp.Symbol("epsilon", positive=True)
    x, w = sp.symbols("x0:3", real=True), sp.symbols("w0:3", real=True)
    rms = sp.sqrt(sum(v ** 2 for v in x) / 3 + eps)
    p.tie(NORM, expected=sp.Matrix([w[t] * x[t] / rms for t in range(3)]), symbols=(*x, *w, eps),
          points=[(3, 4, 0, 1, 2, 1, 1e-6), (-1, 0.5, 2, 0.3, -1, 2, 0.5), (1e-3, 0, 0, 1, 1, 1, 1e-6)],
          call=lambda f, *v: f(np.array(v[:3]), np.array(v[3:6]), eps=v[6])[:, None],
          reason="w x / sqrt(mean(x^2) + eps)")
    mscale = sp.Rational(1, 10) * m_all * sp.log(s) + 1
    p.tie(MSCALE, expected=mscale, symbols=(s, m_all), points=[(40, 1), (4, 0.707), (1.5, 2)],
          call=lambda f, a, b: f(a, b), reason="0.1 m ln s + 1 for s > 1")
    p.tie(MSCALE, expected=lambda a, b: 1.0, points=[(1, 1), (0.5, 3)], call=lambda f, a, b: f(a, b),
          reason="1 for s <= 1 (no extension)")
    p.tie(SCHEME, expected=7 ** sp.Rational(-1, 2) * mscale ** 2, symbols=(s, m_all),
          points=[(40, 1), (4, 0.5), (2, 0.707)], call=_scale,
          reason="softmax scale (D_N + D_R)^(-1/2) mscale(s, mscale_all_dim)^2, D_N + D_R = 7")
