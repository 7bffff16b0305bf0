"""Gradients of the bias seam's parameters: the T5 table (``t5_bias_backward``) and the ALiBi
slopes (``alibi_bias_backward``).

Expected values come from central finite differences of the forwards (alone and through
attention), from cases worked by hand, and from the dense bias gradient for the per-block sums a
scheme makes from ``blockwise_attention_backward``'s ``bias_grad_fn``.
"""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos import attention as A
from minipos.alibi import alibi_bias, alibi_bias_backward, alibi_slopes
from minipos.fast import attention as FA
from minipos.fast.alibi import alibi_bias_bound
from minipos.t5 import relative_position_bucket, t5_bias, t5_bias_backward

# Central differences with h = 1e-6 in float64. Both biases are linear in their parameters, so
# alone only rounding error remains (~1e-10 of sum|bias * W|); through attention the truncation
# error h^2 |f'''| is ~1e-12 for logits of order 1. The tolerance is 1e-6 relative to
# max(|<grad, e>|, 1e-3 sum|out * W|), the floor ten times the rounding noise.
STEP = 1e-6
RTOL = 1e-6


def _check_directional(fun, x, grad, rng, magnitude, name):
    e = rng.standard_normal(np.shape(x))
    fd = (fun(x + STEP * e) - fun(x - STEP * e)) / (2 * STEP)
    an = float(np.sum(grad * e))
    err = abs(fd - an)
    assert err <= RTOL * max(abs(an), 1e-3 * magnitude), (
        f"d{name}: <grad, e> = {an!r}, finite difference = {fd!r}, |error| = {err:.3g}")


# ----------------------------------------------------------------------------- T5


@st.composite
def t5_problems(draw):
    bidirectional = draw(st.booleans())
    num_buckets = draw(st.sampled_from([4, 8, 16, 32]) if bidirectional else st.sampled_from([2, 8, 32]))
    per_dir = num_buckets // 2 if bidirectional else num_buckets
    max_distance = draw(st.integers(per_dir // 2 + 1, 160))
    H, T, S = draw(st.integers(1, 3)), draw(st.integers(1, 8)), draw(st.integers(1, 8))
    batch = draw(st.sampled_from([(), (2,)]))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    # positions spread wide enough to reach the log buckets and the clamp at max_distance
    spread = draw(st.sampled_from([10, 200]))
    return dict(keywords=dict(bidirectional=bidirectional, num_buckets=num_buckets, max_distance=max_distance,
                              exact=draw(st.booleans())),
                table=rng.standard_normal((num_buckets, H)), qpos=np.sort(rng.integers(0, spread, T)),
                kpos=np.sort(rng.integers(0, spread, S)), W=rng.standard_normal((*batch, H, T, S)), rng=rng)


@settings(max_examples=60, deadline=None)
@given(p=t5_problems())
def test_t5_bias_backward_matches_finite_differences(p):
    table, qpos, kpos, W, kw = p["table"], p["qpos"], p["kpos"], p["W"], p["keywords"]
    dtable = t5_bias_backward(W, qpos, kpos, **kw)
    assert dtable.shape == table.shape
    f = lambda t: float(np.sum(t5_bias(t, qpos, kpos, **kw) * W))   # noqa: E731 (batch broadcast)
    magnitude = float(np.sum(np.abs(t5_bias(table, qpos, kpos, **kw) * W)))
    _check_directional(f, table, dtable, p["rng"], magnitude, "table")


@settings(max_examples=40, deadline=None)
@given(p=t5_problems())
def test_t5_bias_backward_is_the_per_bucket_sum(p):
    # An independent loop over pairs, bucketing one pair at a time.
    qpos, kpos, W, kw = p["qpos"], p["kpos"], p["W"], p["keywords"]
    per_pair = W.reshape(-1, *W.shape[-3:]).sum(axis=0)
    expected = np.zeros_like(p["table"])
    for t, i in enumerate(qpos):
        for s, j in enumerate(kpos):
            expected[int(relative_position_bucket(int(j - i), **kw))] += per_pair[:, t, s]
    np.testing.assert_allclose(t5_bias_backward(W, qpos, kpos, **kw), expected, rtol=1e-12, atol=1e-12)


def test_t5_bias_backward_by_hand():
    # Bidirectional, 32 buckets, max distance 128: P = 16 per direction, E = 8 exact buckets, so
    # n = key - query in -7 ... 7 has its own bucket: n <= 0 -> bucket |n|, n > 0 -> 16 + n.
    # q = k = (0, 1, 2), H = 1, dbias[t, s] = 10 t + s + 1:
    #   n = 0  (bucket 0):  (0,0) (1,1) (2,2) -> 1 + 12 + 23 = 36   (three pairs, one bucket)
    #   n = -1 (bucket 1):  (1,0) (2,1)       -> 11 + 22 = 33
    #   n = -2 (bucket 2):  (2,0)             -> 21
    #   n = +1 (bucket 17): (0,1) (1,2)       -> 2 + 13 = 15
    #   n = +2 (bucket 18): (0,2)             -> 3
    dbias = (10 * np.arange(3)[:, None] + np.arange(3)[None, :] + 1.0)[None]
    expected = np.zeros((32, 1))
    expected[[0, 1, 2, 17, 18], 0] = [36, 33, 21, 15, 3]
    for exact in (False, True):
        np.testing.assert_array_equal(t5_bias_backward(dbias, 3, 3, exact=exact), expected)
    # Distances at or beyond max_distance share the last bucket of their direction. Query 0, keys
    # 200, 300, 500 (n > 128): bucket 31, all three summed; causal (P = 32, E = 16), query 500 and
    # keys 0, 100, 372 (n = -500, -400, -128): the last bucket 31 too. A batch of two adds up.
    dbias = np.array([[[1.0, 2.0, 4.0]]])
    got = t5_bias_backward(dbias, [0], [200, 300, 500])
    assert got[31, 0] == 7 and np.count_nonzero(got) == 1
    got = t5_bias_backward(np.stack([dbias, 10 * dbias]), [500], [0, 100, 372], bidirectional=False)
    assert got[31, 0] == 77 and np.count_nonzero(got) == 1
    # Causal: every future key shares bucket 0 with n = 0. q = (0,), k = (0, 1, 2): 1 + 2 + 4 = 7.
    got = t5_bias_backward(dbias, [0], [0, 1, 2], bidirectional=False)
    assert got[0, 0] == 7 and np.count_nonzero(got) == 1


@settings(max_examples=40, deadline=None)
@given(p=t5_problems(), D=st.integers(1, 4), seed=st.integers(0, 2 ** 32 - 1), causal=st.booleans())
def test_t5_table_gradient_through_attention(p, D, seed, causal):
    # T5 attention (scale 1.0): logits q.k + table[bucket], so d table = t5_bias_backward(dbias).
    table, qpos, kpos, kw, W = p["table"], p["qpos"], p["kpos"], p["keywords"], p["W"]
    rng = np.random.default_rng(seed)
    lead, T, S = W.shape[:-2], len(qpos), len(kpos)
    q, k, v = rng.standard_normal((*lead, T, D)), rng.standard_normal((*lead, S, D)), rng.standard_normal((*lead, S, 2))
    dout = rng.standard_normal((*lead, T, 2))
    mask = A.causal_mask(T, S) if causal else None

    def f(t):
        return float(np.sum(A.attention(q, k, v, bias=t5_bias(t, qpos, kpos, **kw), mask=mask, scale=1.0) * dout))

    _, _, _, dbias = A.attention_backward(q, k, v, dout, bias=t5_bias(table, qpos, kpos, **kw), mask=mask, scale=1.0)
    dtable = t5_bias_backward(dbias, qpos, kpos, **kw)
    magnitude = float(np.sum(np.abs(A.attention(q, k, v, bias=t5_bias(table, qpos, kpos, **kw), mask=mask,
                                                scale=1.0) * dout)))
    _check_directional(f, table, dtable, rng, magnitude, "table")


BACKWARDS = [pytest.param(A.blockwise_attention_backward, id="reference")]
if hasattr(FA, "blockwise_attention_backward"):
    BACKWARDS.append(pytest.param(FA.blockwise_attention_backward, id="fast"))


@pytest.mark.parametrize("backward", BACKWARDS)
@settings(max_examples=30, deadline=None)
@given(p=t5_problems(), block=st.integers(1, 5), causal=st.booleans(), seed=st.integers(0, 2 ** 32 - 1))
def test_t5_table_gradient_summed_from_bias_grad_fn_blocks(backward, p, block, causal, seed):
    # The blockwise form: t5_bias_backward on each block's dS with that block's positions, summed,
    # equals t5_bias_backward of the dense dbias.
    table, qpos, kpos, kw, W = p["table"], p["qpos"], p["kpos"], p["keywords"], p["W"]
    rng = np.random.default_rng(seed)
    lead, T, S = W.shape[:-2], len(qpos), len(kpos)
    q, k, v = (rng.standard_normal((*lead, n, 3)) for n in (T, S, S))
    dout = rng.standard_normal((*lead, T, 3))
    dtable = np.zeros_like(table)

    def bias_grad_fn(qs, ks, ds):
        dtable[...] += t5_bias_backward(ds, qpos[qs], kpos[ks], **kw)

    blockwise = dict(bias_fn=lambda qs, ks: t5_bias(table, qpos[qs], kpos[ks], **kw), causal=causal, scale=1.0,
                     block_size=block)
    out, lse = A.blockwise_attention(q, k, v, return_lse=True, **blockwise)
    backward(q, k, v, out, lse, dout, bias_grad_fn=bias_grad_fn, **blockwise)
    mask = A.causal_mask(T, S) if causal else None
    _, _, _, dbias = A.attention_backward(q, k, v, dout, bias=t5_bias(table, qpos, kpos, **kw), mask=mask, scale=1.0)
    np.testing.assert_allclose(dtable, t5_bias_backward(dbias, qpos, kpos, **kw), rtol=1e-10, atol=1e-12)


def test_t5_bias_backward_names_a_misshapen_dbias():
    with pytest.raises(ValueError, match="dbias"):
        t5_bias_backward(np.ones((2, 3, 4)), 3, 5)                    # S = 5, dbias has 4 keys
    with pytest.raises(ValueError, match="dbias"):
        t5_bias_backward(np.ones((3, 4)), 3, 4)                       # no head axis


# ----------------------------------------------------------------------------- ALiBi


@settings(max_examples=60, deadline=None)
@given(H=st.integers(1, 6), T=st.integers(1, 7), S=st.integers(1, 7), symmetric=st.booleans(),
       batch=st.sampled_from([(), (2,)]), seed=st.integers(0, 2 ** 32 - 1))
def test_alibi_bias_backward_matches_finite_differences(H, T, S, symmetric, batch, seed):
    rng = np.random.default_rng(seed)
    slopes = alibi_slopes(H)
    qpos, kpos = np.sort(rng.integers(0, 50, T)), np.sort(rng.integers(0, 50, S))
    W = rng.standard_normal((*batch, H, T, S))
    dslopes = alibi_bias_backward(W, qpos, kpos, symmetric=symmetric)
    assert dslopes.shape == (H,)
    f = lambda m: float(np.sum(alibi_bias(m, qpos, kpos, symmetric=symmetric) * W))  # noqa: E731
    magnitude = float(np.sum(np.abs(alibi_bias(slopes, qpos, kpos, symmetric=symmetric) * W)))
    _check_directional(f, slopes, dslopes, rng, magnitude, "slopes")


def test_alibi_bias_backward_by_hand():
    # H = 1, q = k = (0, 1). The bias is m r with r[t, s] = j_s - i_t = [[0, 1], [-1, 0]]
    # (-m (i - j)), or r = -|i - j| = [[0, -1], [-1, 0]] when symmetric. dm = sum dbias * r:
    # dbias = [[1, 2], [3, 4]] -> dm = 2 - 3 = -1, symmetric: -2 - 3 = -5.
    dbias = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    np.testing.assert_array_equal(alibi_bias_backward(dbias, 2, 2), [-1.0])
    np.testing.assert_array_equal(alibi_bias_backward(dbias, 2, 2, symmetric=True), [-5.0])
    # A cached step: query at 1, keys 0, 1, 2 (future key 2 masked in practice):
    # r = (-1, 0, 1), symmetric (-1, 0, -1); dbias (1, 2, 4) -> 3 and -5.
    dbias = np.array([[[1.0, 2.0, 4.0]]])
    np.testing.assert_array_equal(alibi_bias_backward(dbias, [1], [0, 1, 2]), [3.0])
    np.testing.assert_array_equal(alibi_bias_backward(dbias, [1], [0, 1, 2], symmetric=True), [-5.0])
    # Two heads and a batch of two: each head sums its own entries over the batch.
    dbias = np.stack([np.array([[[1.0, 2.0], [3.0, 4.0]], [[0.0, 1.0], [0.0, 0.0]]])] * 2)
    np.testing.assert_array_equal(alibi_bias_backward(dbias, 2, 2), [-2.0, 2.0])


@settings(max_examples=40, deadline=None)
@given(H=st.integers(1, 4), T=st.integers(1, 7), S=st.integers(1, 7), symmetric=st.booleans(),
       seed=st.integers(0, 2 ** 32 - 1))
def test_alibi_slope_gradient_through_attention(H, T, S, symmetric, seed):
    # A learned-slope variant: logits q.k / sqrt(D) + alibi_bias(m), causal unless symmetric.
    rng = np.random.default_rng(seed)
    q, k, v = rng.standard_normal((H, T, 4)), rng.standard_normal((H, S, 4)), rng.standard_normal((H, S, 3))
    dout = rng.standard_normal((H, T, 3))
    qpos, kpos = np.arange(S - T, S) if S >= T else np.arange(T), np.arange(S)
    mask = None if symmetric else A.causal_mask(T, S)
    slopes = alibi_slopes(H) * 4                                    # steeper, so the bias matters at small T

    def f(m):
        return float(np.sum(A.attention(q, k, v, bias=alibi_bias(m, qpos, kpos, symmetric=symmetric), mask=mask) * dout))

    _, _, _, dbias = A.attention_backward(q, k, v, dout, bias=alibi_bias(slopes, qpos, kpos, symmetric=symmetric),
                                          mask=mask)
    dslopes = alibi_bias_backward(dbias, qpos, kpos, symmetric=symmetric)
    magnitude = float(np.sum(np.abs(A.attention(q, k, v, bias=alibi_bias(slopes, qpos, kpos, symmetric=symmetric),
                                                mask=mask) * dout)))
    _check_directional(f, slopes, dslopes, rng, magnitude, "slopes")


@pytest.mark.parametrize("backward", BACKWARDS)
@pytest.mark.parametrize("symmetric", [False, True])
def test_alibi_slope_gradient_summed_from_bias_grad_fn_blocks(backward, symmetric):
    # Blockwise, with the fast path's bias bound where the fast backward runs (so far blocks of
    # steep heads are skipped): the per-block slope gradients add up to the dense one.
    rng = np.random.default_rng(3)
    H, T, S = 4, 300, 300
    q, k, v = rng.standard_normal((H, T, 8)), rng.standard_normal((H, S, 8)), rng.standard_normal((H, S, 8))
    dout = rng.standard_normal((H, T, 8))
    slopes, pos = alibi_slopes(H) * 32, np.arange(T)          # 8, 2, 0.5, 0.125: head 0 underflows far off
    dslopes = np.zeros(H)

    def bias_grad_fn(qs, ks, ds):
        dslopes[...] += alibi_bias_backward(ds, pos[qs], pos[ks], symmetric=symmetric)

    kw = dict(bias_fn=lambda qs, ks: alibi_bias(slopes, pos[qs], pos[ks], symmetric=symmetric), causal=not symmetric,
              block_size=64)
    out, lse = A.blockwise_attention(q, k, v, return_lse=True, **kw)
    extra = {}
    if backward is not A.blockwise_attention_backward:
        extra["bias_max_fn"] = lambda qs, ks: alibi_bias_bound(slopes, pos[qs], pos[ks], symmetric=symmetric)
    backward(q, k, v, out, lse, dout, bias_grad_fn=bias_grad_fn, **kw, **extra)
    mask = None if symmetric else A.causal_mask(T, S)
    _, _, _, dbias = A.attention_backward(q, k, v, dout, bias=alibi_bias(slopes, pos, pos, symmetric=symmetric),
                                          mask=mask)
    np.testing.assert_allclose(dslopes, alibi_bias_backward(dbias, pos, pos, symmetric=symmetric), rtol=1e-10,
                               atol=1e-12)


def test_alibi_bias_backward_names_a_misshapen_dbias():
    with pytest.raises(ValueError, match="dbias"):
        alibi_bias_backward(np.ones((2, 3, 4)), 3, 5)
    with pytest.raises(ValueError, match="dbias"):
        alibi_bias_backward(np.ones((3, 4)), 3, 4)
