r"""Online softmax: merging two blocks' statistics gives exactly the softmax over their union.

Milakov & Gimelshein 2018, "Online normalizer calculation for softmax", arXiv:1805.02867, and
the blockwise attention built on it (Dao et al. 2022, FlashAttention, arXiv:2205.14135, Alg. 1).
A block A of logits x_k with values v_k is summarised by (m_A, l_A, a_A):

    l_A = sum_{k in A} e^{x_k - m_A},   a_A = sum_{k in A} e^{x_k - m_A} v_k,   o_A = a_A / l_A.

Two blocks merge by rescaling to a common reference m:

    l = l_A e^{m_A - m} + l_B e^{m_B - m},   a = a_A e^{m_A - m} + a_B e^{m_B - m},
    o = (o_A l_A e^{m_A - m} + o_B l_B e^{m_B - m}) / l = a / l.

The identities hold for EVERY choice of m_A, m_B, m: the max (m_A = max_A x, m = max(m_A, m_B),
so every exponent is <= 0) is what keeps the floating-point sums finite, not what makes the
result right. Checked symbolically for explicit block sizes (2 + 2, 1 + 3) and for
streaming one key at a time, which is what a blockwise or cached kernel does.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from .core import theorem

#: The blockwise (online-softmax) attention of ``minipos.attention`` (the running max) and of
#: ``minipos.fast.attention`` (a fixed reference m, which the merge allows since it holds for any
#: m, with the running max as its fallback); ``_tie_blockwise`` checks both against the
#: softmax-weighted sum (see there).
BLOCKWISE = "minipos.attention.blockwise_attention"
FAST_BLOCKWISE = "minipos.fast.attention.blockwise_attention"


def _stats(x, v, m):
    """(l, a) of a block with reference m: sum e^{x - m} and sum e^{x - m} v."""
    return sum(sp.exp(xi - m) for xi in x), sum(sp.exp(xi - m) * vi for xi, vi in zip(x, v))


def _softmax_sum(x, v):
    """sum_k softmax(x)_k v_k, as the definition writes it."""
    total = sum(sp.exp(xi) for xi in x)
    return sum(sp.exp(xi) * vi for xi, vi in zip(x, v)) / total


@theorem("online_softmax.merge",
         "merging (m, l, o) of two blocks with l = l1 e^{m1-m} + l2 e^{m2-m}, "
         "o = (o1 l1 e^{m1-m} + o2 l2 e^{m2-m}) / l gives the softmax-weighted sum over the union, for any m",
         checks=("minipos.attention.softmax", BLOCKWISE, FAST_BLOCKWISE))
def _(p):
    m1, m2, m = sp.symbols("m_1 m_2 m", real=True)
    for sizes in p.cases(blocks=[(2, 2), (1, 3)]):
        n = sum(sizes)
        x, v = sp.symbols(f"x0:{n}", real=True), sp.symbols(f"v0:{n}", real=True)
        A, B = slice(0, sizes[0]), slice(sizes[0], n)
        l1, a1 = _stats(x[A], v[A], m1)
        l2, a2 = _stats(x[B], v[B], m2)
        l_all, a_all = _stats(x, v, m)
        p.claim(l1 * sp.exp(m1 - m) + l2 * sp.exp(m2 - m), l_all,
                "$e^{x - m_1} e^{m_1 - m} = e^{x - m}$: the rescaled sums add up", by="expand")
        p.claim(a1 * sp.exp(m1 - m) + a2 * sp.exp(m2 - m), a_all,
                "the un-normalised outputs rescale the same way", by="expand")
        o1s, o2s, l1s, l2s = sp.symbols("o_1 o_2 l_1 l_2", positive=True)
        merged = (o1s * l1s * sp.exp(m1 - m) + o2s * l2s * sp.exp(m2 - m)) / (l1s * sp.exp(m1 - m) + l2s * sp.exp(m2 - m))
        (p.derive(merged, "merge the normalised outputs")
          .step(a_all / l_all, "$o_i = a_i / l_i$, then the two sums above", by="cancel",
                using={o1s: a1 / l1, o2s: a2 / l2, l1s: l1, l2s: l2})
          .step(_softmax_sum(x, v), "$e^{-m}$ cancels: the result does not depend on $m$", by="cancel"))
    x = sp.symbols("x0:4", real=True)
    p.claim(sp.Max(sp.Max(x[0], x[1]), sp.Max(x[2], x[3]), evaluate=False), sp.Max(*x), by="doit",
            reason="$m = \\max(m_1, m_2)$ is the max over the union: every exponent $x - m \\leq 0$")
    _tie_blocks(p)
    _tie_blockwise(p)


@theorem("online_softmax.stream",
         "folding the merge over keys one at a time (a running max, sum and output) gives softmax(x) . v",
         checks=("minipos.attention.softmax",))
def _(p):
    for n in p.cases(n=[4, 2, 3]):
        x, v = sp.symbols(f"x0:{n}", real=True), sp.symbols(f"v0:{n}", real=True)
        mk = sp.symbols(f"m0:{n}", real=True)  # any running references; the code takes running maxima
        l, a = _stats(x[:1], v[:1], mk[0])
        for t in range(1, n):  # merge the state with the block {t}, reference m_t
            lt, at = _stats(x[t:t + 1], v[t:t + 1], mk[t])
            l, a = l * sp.exp(mk[t - 1] - mk[t]) + lt, a * sp.exp(mk[t - 1] - mk[t]) + at
        (p.derive(a / l, "the state after the last key, references $m_0, \\ldots, m_{n-1}$")
          .step(_softmax_sum(x, v), "every rescaling telescopes to $e^{-m_{n-1}}$, which cancels", by="cancel"))


def _blocks_via_softmax(softmax, x, v, split):
    """Merge two blocks whose normalised outputs come from ``softmax``; returns (weights, o)."""
    x, v = np.asarray(x, float), np.asarray(v, float)
    parts = [(x[:split], v[:split]), (x[split:], v[split:])]
    ms = [xb.max() for xb, _ in parts]
    ls = [np.exp(xb - mb).sum() for (xb, _), mb in zip(parts, ms)]
    m = max(ms)
    scale = [lb * np.exp(mb - m) for lb, mb in zip(ls, ms)]   # l_i e^{m_i - m}
    l = sum(scale)
    weights = np.concatenate([softmax(xb) * s / l for (xb, _), s in zip(parts, scale)])
    o = sum((softmax(xb) @ vb) * s for (xb, vb), s in zip(parts, scale)) / l
    return weights, o


def _tie_blocks(p):
    x, v = sp.symbols("x0:4", real=True), sp.symbols("v0:4", real=True)
    total = sum(sp.exp(xi) for xi in x)
    weights = sp.lambdify((x, v), sp.Matrix([sp.exp(xi) / total for xi in x]), "numpy")
    summed = sp.lambdify((x, v), _softmax_sum(x, v), "numpy")
    points = [((0.5, -1.0, 2.0, 0.25), (1.0, -2.0, 3.0, 0.5)), ((3.0, 1.0, -4.0, 0.0), (0.0, 1.0, 0.0, -1.0))]
    names = (sp.Symbol("x"), sp.Symbol("v"))
    for split in (2, 1, 3):
        p.tie("minipos.attention.softmax", expected=lambda x, v: np.ravel(weights(x, v)), points=points,
              symbols=names, call=lambda f, x, v: _blocks_via_softmax(f, x, v, split)[0],
              reason=f"rescaled block weights = softmax of the union, blocks {split} + {4 - split}")
        p.tie("minipos.attention.softmax", expected=lambda x, v: summed(x, v), points=points, symbols=names,
              call=lambda f, x, v: _blocks_via_softmax(f, x, v, split)[1],
              reason=f"merged output = softmax(x) . v, blocks {split} + {4 - split}")
    shifted = (tuple(xi + 1000.0 for xi in points[0][0]), points[0][1])  # e^{1000} overflows: only the max saves it
    p.tie("minipos.attention.softmax", expected=lambda x, v: summed(tuple(xi - 1000.0 for xi in x), v),
          points=[shifted], symbols=names, call=lambda f, x, v: _blocks_via_softmax(f, x, v, 2)[1],
          reason="logits near 1000: the max reference keeps the merge finite")


def _tie_blockwise(p):
    """Tie the blockwise attention of ``minipos.attention`` (``BLOCKWISE``; MISSING if absent).

    It must equal softmax(scale q . k) v, computed here from the definition, for block sizes
    that do and do not divide S, with and without the causal mask. At scale 1/2 every path keeps
    a fixed reference after a block (the merge above, for any m); at scale 400 a later block's
    logits rise far above the first one's, so the fixed reference overflows and the running max
    (m = max) is what brings the merge back.
    """
    rng = np.random.default_rng(7)
    q, k, v = rng.normal(size=(2, 3, 4)), rng.normal(size=(2, 5, 4)), rng.normal(size=(2, 5, 2))

    def expected(block_size, causal, scale):
        logits = np.einsum("htd,hsd->hts", q, k) * scale
        if causal:  # query t (the last 3 of 5 positions) sees keys s <= t + 2
            logits = np.where(np.tril(np.ones((3, 5), bool), 2), logits, -np.inf)
        w = np.exp(logits - logits.max(-1, keepdims=True))
        return (w / w.sum(-1, keepdims=True)) @ v
    for target in (BLOCKWISE, FAST_BLOCKWISE):
        p.tie(target, expected=expected,
              points=[(1, False, 0.5), (2, False, 0.5), (5, False, 0.5), (2, True, 0.5), (4, True, 0.5),
                      (1, False, 400.0), (2, True, 400.0)],
              symbols=(sp.Symbol("block_size"), sp.Symbol("causal"), sp.Symbol("scale")),
              call=lambda f, b, c, s: f(q, k, v, block_size=b, causal=c, scale=s),
              reason="equals softmax(scale q.k) v, for logits near 1 and near 1000")
