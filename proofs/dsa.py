r"""DeepSeek-V3.2's indexer RoPE beside MLA's (``minipos.dsa``; transformers ``DeepseekV32Indexer``).

With D features of which D_R rotate, the indexer rotates the first D_R in the half layout (pair i =
features (i, i + D_R/2)), MLA the last D_R in the interleaved layout (pair i = (D - D_R + 2i, D - D_R + 2i + 1)),
both with θ_i = base^(-2i/D_R). Written as matrices,

    R_index(m) = P^T R_mla(m) P,

P the permutation that moves the rotated slice to the end and interleaves its halves: the same
rotation in another feature order. So the indexer's score <R_index(m) q, R_index(n) k> is relative
(q^T R_index(n - m) k), and equals MLA's only for the permuted vectors P q, P k.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minipos import rope as rope_code

from .core import theorem

INDEX, MLA = "minipos.dsa.indexer_rope", "minipos.dsa.mla_rope"
m, n = sp.symbols("m n", real=True)
base = sp.Symbol("base", positive=True)


def _block(M, a, b, angle):
    M[a, a], M[a, b], M[b, a], M[b, b] = sp.cos(angle), -sp.sin(angle), sp.sin(angle), sp.cos(angle)


def R_index(pos, D, R, b_=base):
    """The indexer's R(pos), (D, D): half-layout pairs (i, i + R/2) of the first R features, identity after."""
    M = sp.eye(D)
    for i in range(R // 2):
        _block(M, i, i + R // 2, pos * b_ ** sp.Rational(-2 * i, R))
    return M


def R_mla(pos, D, R, b_=base):
    """MLA's R(pos), (D, D): interleaved pairs (D - R + 2i, D - R + 2i + 1) of the last R features."""
    M = sp.eye(D)
    for i in range(R // 2):
        _block(M, D - R + 2 * i, D - R + 2 * i + 1, pos * b_ ** sp.Rational(-2 * i, R))
    return M


def P(D, R):
    """(P x)_j = x_{src[j]}: the indexer's feature order read into MLA's."""
    dst = np.concatenate([D - R + rope_code.layout_permutation(R), np.arange(D - R)])   # MLA index of feature j
    src = np.argsort(dst)
    return sp.Matrix(D, D, lambda r, c: 1 if src[r] == c else 0)


@theorem("dsa.layouts",
         "R_index(m) = P^T R_mla(m) P: DeepSeek-V3.2's indexer RoPE (first D_R features, half layout) is MLA's "
         "(last D_R, interleaved) in another feature order; its score is relative, q^T R_index(n - m) k",
         checks=(INDEX, MLA))
def _(p):
    for D, R in p.cases(case=[(6, 4), (8, 4)]):
        p.claim(P(D, R).T * R_mla(m, D, R) * P(D, R), R_index(m, D, R),
                f"D = {D}, D_R = {R}: permuting rows and columns moves each block onto the indexer's pair",
                shown=("P^\\top R_{mla}(m)\\, P", None))
    D, R = 6, 4
    p.claim(R_index(m, D, R).T * R_index(n, D, R), R_index(n - m, D, R),
            "blockwise $B(a)^T B(b) = B(b - a)$; the pass-through block is $I$", by="trig",
            shown=("R_{index}(m)^\\top R_{index}(n)", "R_{index}(n - m)"))      # the 6 x 6 product is too wide to show
    rng = np.random.default_rng(9)
    qv, kv = rng.normal(size=8), rng.normal(size=8)
    pts = [(0, 0), (3, 7), (40, 2), (-5, 100)]
    for target, Rm in ((INDEX, R_index), (MLA, R_mla)):
        want = (sp.Matrix(qv).T * Rm(n - m, 8, 4, 100) * sp.Matrix(kv))[0, 0]
        p.tie(target, expected=want, symbols=(m, n), points=pts, rtol=1e-10,
              call=lambda f, a, b: f(qv[None], [a], rope_dim=4, base=100.0)[0] @ f(kv[None], [b], rope_dim=4,
                                                                                     base=100.0)[0],
              reason=f"score = q^T R(n - m) k with the proof's own {Rm.__name__}, D = 8, D_R = 4")
