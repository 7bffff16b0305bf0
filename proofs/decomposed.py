r"""SAM's decomposed relative position bias (ViTDet, Li et al. 2022, arXiv:2203.16527; HF ``SamVisionAttention``).

The query at (r, c) and the key at (r', c') get b = q · R_h[r - r' + h - 1] + q · R_w[c - c' + w - 1].

- Relative in each axis separately: the two table rows depend on r - r' and c - c' only, so shifting every row
  (or every column) of the queries and keys by the same amount changes no logit; on a grid, HF's grid form
  (``get_decomposed_rel_pos``, row ``q_i - k_j + (k - 1)``) and the positions form are the same numbers.
- Not relative in the flattened sequence: on a w-wide grid one step along a row and one step across a row's end
  are both one step of the sequence, with different offsets.
"""

from __future__ import annotations

import numpy as np
import sympy as sp

from minipos import decomposed as code

from .core import theorem

LOGITS, GRID = "minipos.decomposed.decomposed_logits", "minipos.decomposed.decomposed_bias"
r, c, r2, c2, a, b = sp.symbols("r c r' c' a b", integer=True)
h, w = sp.symbols("h w", integer=True, positive=True)


def row_h(r_, r2_):
    """The row of R_h a (query row, key row) pair reads: query minus key, offset by h - 1."""
    return r_ - r2_ + h - 1


@theorem("decomposed.relative.per_axis",
         "q · R_h[r - r' + h - 1] + q · R_w[c - c' + w - 1] depends on r - r' and c - c' only: a shift of every "
         "row, or of every column, changes no logit; it is not a function of the flattened distance",
         checks=(LOGITS, GRID))
def _(p):
    (p.derive(row_h(r + a, r2 + a), "the row of $R_h$ after a shift of every row by $a$",
              shown="(r + a) - (r' + a) + h - 1")
      .step(row_h(r, r2), "$a$ cancels: the row offset only", by="expand"))
    p.claim((c + b) - (c2 + b) + w - 1, c - c2 + w - 1, "the columns likewise: the column offset only", by="expand",
            shown=("(c + b) - (c' + b) + w - 1", None))
    # the flattened sequence of a w-wide grid: p = r w + c. One step along a row, one step across a row's end.
    p.refute(row_h(0, 1), row_h(0, 0), {h: 3},
             "the key (1, 0) after the query (0, w - 1) is one step of the sequence, as (0, 1) after (0, 0), but "
             "reads another row of $R_h$")
    rng = np.random.default_rng(3)
    H_, W_, D = 3, 4, 5
    qv, th, tw = rng.normal(size=D), rng.normal(size=(2 * H_ - 1, D)), rng.normal(size=(2 * W_ - 1, D))

    def want(rq, cq, rk, ck, sa, sb):                                   # the definition, by hand, on the grid
        return qv @ th[rq - rk + H_ - 1] + qv @ tw[cq - ck + W_ - 1]
    pts = [(0, 0, 0, 0, 0, 0), (2, 3, 0, 1, 5, -2), (0, 1, 2, 3, -7, 40), (1, 0, 0, 3, 9, 9)]
    p.tie(LOGITS, expected=want, points=pts, rtol=1e-12,
          call=lambda f, rq, cq, rk, ck, sa, sb: f(qv[None], th, tw, np.array([[rq + sa], [cq + sb]]),
                                                   np.array([[rk + sa], [ck + sb]]))[0, 0],
          reason="the logit at rows and columns shifted by (a, b) is q · R_h[r - r' + h - 1] + q · R_w[c - c' + w - 1]")
    grid = np.stack(np.meshgrid(np.arange(H_), np.arange(W_), indexing="ij")).reshape(2, -1)   # (2, h w)
    qs = rng.normal(size=(H_ * W_, D))

    def positions_form(shift):
        return code.decomposed_logits(qs, th, tw, grid + shift, grid + shift)
    p.tie(GRID, expected=lambda _: positions_form(np.zeros((2, 1), np.int64)), points=[(0,)], rtol=1e-12,
          call=lambda f, _: f(qs, th, tw, (H_, W_), (H_, W_)),
          reason="HF's grid form equals the positions form on the h x w grid")
    p.require(all(np.allclose(positions_form(np.array([[sa], [sb]])), positions_form(np.zeros((2, 1), np.int64)),
                              rtol=1e-12, atol=1e-12) for sa, sb in ((5, 0), (0, 9), (-3, 40))),
              "decomposed_logits: shifting the rows alone, the columns alone, or both, leaves every logit unchanged")
