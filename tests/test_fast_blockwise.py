"""Tests of minipos.fast.attention.blockwise_attention beyond the reference's: threads, bounds of
the bias that skip heads, the fixed softmax reference and its running-max fallback, the walk
order (diagonal first). Its equality with dense attention is tested with the reference's in
test_blockwise.py.
"""

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipos.fast.attention as fa
from minipos.attention import attention, causal_mask
from minipos.fast.attention import blockwise_attention

def _qkv(lead, T, S, D=4, Dv=3, seed=0, dtype=np.float64):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((*lead, T, D))
    k = rng.standard_normal((*lead, S, D))
    v = rng.standard_normal((*lead, S, Dv))
    return q.astype(dtype), k.astype(dtype), v.astype(dtype)


def _dense(q, k, v, bias=None, mask=None, causal=False, q_offset=None, scale=None):
    """The definitional form: full (T, S) logits through ``attention``."""
    T, S = q.shape[-2], k.shape[-2]
    if causal:
        off = S - T if q_offset is None else q_offset
        tri = np.arange(S)[None, :] <= np.arange(T)[:, None] + off  # s <= t + offset
        mask = tri if mask is None else mask & tri
    return attention(q, k, v, bias=bias, mask=mask, scale=scale)


def _fns(bias, mask):
    bias_fn = None if bias is None else (lambda qs, ks: bias[..., qs, ks])
    mask_fn = None if mask is None else (lambda qs, ks: mask[..., qs, ks])
    return bias_fn, mask_fn


@settings(max_examples=40, deadline=None)
@given(T=st.integers(1, 12), S=st.integers(1, 12), H=st.integers(1, 4), block=st.integers(1, 6),
       causal=st.booleans(), offset_shift=st.integers(-3, 3), bound=st.booleans(), seed=st.integers(0, 2**16))
def test_threads_and_bounds_give_the_same_bits_for_any_sizes(T, S, H, block, causal, offset_shift, bound, seed):
    # Two threads (forced at these sizes) against one, with and without a (valid, loose) bias
    # bound: the same bits, and equal to dense attention.
    q, k, v = _qkv((H,), T, S, D=3, Dv=2, seed=seed)
    bias = np.random.default_rng(seed + 1).standard_normal((H, T, S))
    bias_fn = _fns(bias, None)[0]
    bias_max_fn = (lambda qs, ks: bias[:, qs, ks].max(axis=(1, 2), keepdims=True) + 0.5) if bound else None
    q_offset = S - T + offset_shift if causal else None
    kw = dict(bias_fn=bias_fn, causal=causal, block_size=block, q_offset=q_offset, bias_max_fn=bias_max_fn)
    one = blockwise_attention(q, k, v, workers=1, **kw)
    saved, fa._THREADED_WORK = fa._THREADED_WORK, 0
    try:
        two = blockwise_attention(q, k, v, workers=2, **kw)
    finally:
        fa._THREADED_WORK = saved
    np.testing.assert_array_equal(one, two)
    np.testing.assert_allclose(one, _dense(q, k, v, bias, causal=causal, q_offset=q_offset), atol=1e-10)


@pytest.mark.parametrize("T, S, block, q_offset, expected", [
    # T = S = 6, blocks of 2: key blocks on or below the diagonal only, the diagonal first.
    (6, 6, 2, None, [((0, 2), (0, 2)),
                     ((2, 4), (2, 4)), ((2, 4), (0, 2)),
                     ((4, 6), (4, 6)), ((4, 6), (2, 4)), ((4, 6), (0, 2))]),
    # T = 4 cached queries of S = 5 (offset 1): query 1 sees keys <= 2, so the key block is cut at 3.
    (4, 5, 2, None, [((0, 2), (2, 3)), ((0, 2), (0, 2)),
                     ((2, 4), (4, 5)), ((2, 4), (2, 4)), ((2, 4), (0, 2))]),
    # offset -2: queries 0..1 see no key, query 2 sees key 0, query 3 keys 0..1.
    (4, 4, 2, -2, [((2, 4), (0, 2))]),
])
def test_causal_never_evaluates_future_blocks(T, S, block, q_offset, expected):
    calls = []

    def bias_fn(qs, ks):
        calls.append(((qs.start, qs.stop), (ks.start, ks.stop)))
        return np.zeros((1, qs.stop - qs.start, ks.stop - ks.start))

    q, k, v = _qkv((1,), T, S, seed=4)
    out = blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True, block_size=block, q_offset=q_offset)
    assert calls == expected
    np.testing.assert_allclose(out, _dense(q, k, v, causal=True, q_offset=q_offset), atol=1e-12)


def test_block_masked_by_mask_fn_is_skipped():
    # Keys 2..3 are masked for every query: that key block is never scored or biased.
    calls = []
    mask = np.ones((4, 6), bool)
    mask[:, 2:4] = False

    def bias_fn(qs, ks):
        calls.append((ks.start, ks.stop))
        return np.ones((1, qs.stop - qs.start, ks.stop - ks.start))

    q, k, v = _qkv((1,), 4, 6, seed=5)
    out = blockwise_attention(q, k, v, bias_fn=bias_fn, mask_fn=_fns(None, mask)[1], block_size=2)
    assert calls == [(4, 6), (0, 2), (4, 6), (0, 2)]  # per query block, the last key block first
    np.testing.assert_allclose(out, _dense(q, k, v, bias=np.ones((1, 4, 6)), mask=mask), atol=1e-12)


def _alibi_like(H, T, slopes, dtype):
    """-slope_h |i - j| as (H, T, T) and its block bound -slope_h min |i - j| over the block."""
    i = np.arange(T)
    dist = np.abs(i[:, None] - i[None, :]).astype(dtype)
    bias = (-np.asarray(slopes, dtype)[:, None, None] * dist).astype(dtype)

    def bound(qs, ks):
        least = max(qs.start - (ks.stop - 1), ks.start - (qs.stop - 1), 0)
        return -np.asarray(slopes, float)[:, None, None] * least
    return bias, bound


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_bias_max_fn_skips_heads_that_underflow_without_changing_a_bit(dtype, monkeypatch):
    # Head 0 has a bias of -300 per unit of distance: past the diagonal block every key gives
    # e^(x - m) = 0 exactly in either dtype (|scale q.k| <= |q||k|/2 is far below 300), so with
    # the bound those blocks are skipped for head 0; head 1 (no bias) is computed in full. The
    # result is bit-identical to the run without the bound, and equal to dense attention.
    rng = np.random.default_rng(11)
    q, k, v = (rng.standard_normal((2, 16, 4)).astype(dtype) for _ in range(3))
    bias, bound = _alibi_like(2, 16, [300.0, 0.0], dtype)
    live = []
    real = fa._Blockwise._live_heads
    monkeypatch.setattr(fa._Blockwise, "_live_heads",
                        lambda self, *a: live.append(real(self, *a)) or live[-1])
    bias_fn = lambda qs, ks: bias[:, qs, ks]  # noqa: E731
    with_bound = blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True, block_size=4, bias_max_fn=bound)
    without = blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True, block_size=4)
    assert slice(1, 2) in live                                 # head 0 was skipped somewhere
    np.testing.assert_array_equal(with_bound, without)
    tol = 1e-12 if dtype == np.float64 else 1e-5
    np.testing.assert_allclose(with_bound, attention(q, k, v, bias=bias, mask=causal_mask(16, 16)), rtol=tol, atol=tol)


def test_a_block_no_head_can_reach_is_skipped_before_bias_fn_is_called():
    # Every head has slope 1000 (e^-1000 = 0 even in float64): only the diagonal blocks are
    # scored (bias_fn is called there alone); the output still equals dense attention.
    rng = np.random.default_rng(12)
    q, k, v = (rng.standard_normal((2, 12, 4)) for _ in range(3))
    bias, bound = _alibi_like(2, 12, [1000.0, 1000.0], np.float64)
    calls = []

    def bias_fn(qs, ks):
        calls.append((qs.start, ks.start))
        return bias[:, qs, ks]
    out = blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True, block_size=4, bias_max_fn=bound)
    assert calls == [(0, 0), (4, 4), (8, 8)]
    np.testing.assert_allclose(out, attention(q, k, v, bias=bias, mask=causal_mask(12, 12)), atol=1e-12)


def test_the_backward_skips_a_block_no_head_can_reach_too():
    # The same slope-1000 bias through the backward: off-diagonal blocks are skipped before bias_fn
    # (P = 0 there), and the gradients equal the reference's, whose blocks are all computed.
    from minipos.attention import blockwise_attention_backward as reference_backward
    rng = np.random.default_rng(13)
    q, k, v, dout = (rng.standard_normal((2, 12, 4)) for _ in range(4))
    bias, bound = _alibi_like(2, 12, [1000.0, 1000.0], np.float64)
    out, lse = blockwise_attention(q, k, v, bias_fn=lambda qs, ks: bias[:, qs, ks], causal=True, block_size=4,
                                   return_lse=True)
    calls = []

    def bias_fn(qs, ks):
        calls.append((qs.start, ks.start))
        return bias[:, qs, ks]
    got = fa.blockwise_attention_backward(q, k, v, out, lse, dout, bias_fn=bias_fn, causal=True, block_size=4,
                                          bias_max_fn=bound, workers=1)
    assert sorted(calls) == [(0, 0), (4, 4), (8, 8)]
    want = reference_backward(q, k, v, out, lse, dout, bias_fn=lambda qs, ks: bias[:, qs, ks], causal=True,
                              block_size=4)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


def test_bias_max_fn_errors_are_named():
    q, k, v = _qkv((2,), 8, 8)
    with pytest.raises(TypeError, match="bias_max_fn must be a callable"):
        blockwise_attention(q, k, v, causal=True, bias_max_fn=3.0)
    with pytest.raises(ValueError, match="bias_max_fn.*NaN"):
        blockwise_attention(q, k, v, causal=True, block_size=2, bias_max_fn=lambda qs, ks: np.full((2, 1, 1), np.nan))
    with pytest.raises(ValueError, match="bias_max_fn.*does not broadcast"):
        blockwise_attention(q, k, v, causal=True, block_size=2, bias_max_fn=lambda qs, ks: np.zeros((3, 1, 1)))


def test_the_running_max_path_skips_heads_that_underflow(monkeypatch):
    # When the fixed reference overflows, the query block is redone with the running max, which
    # skips (exactly) a head whose block lies more than -ln(tiny) below it. Head 0: for queries
    # 8..11, keys 0..3 carry +800 and the rest -1000 per unit of distance (e^-1000 = 0 in
    # float64); head 1 has no bias.
    rng = np.random.default_rng(14)
    q, k, v = (rng.standard_normal((2, 12, 4)) for _ in range(3))
    i = np.arange(12)
    bias = np.zeros((2, 12, 12))
    bias[0] = -1000.0 * np.abs(i[:, None] - i[None, :])
    bias[0, 8:, :4] = 800.0
    kept = []
    real = fa._heads_that_count
    monkeypatch.setattr(fa, "_heads_that_count", lambda *a: kept.append(real(*a)) or kept[-1])
    out = blockwise_attention(q, k, v, bias_fn=lambda qs, ks: bias[:, qs, ks], causal=True, block_size=4)
    assert any(h is not None and list(h) == [1] for h in kept)
    np.testing.assert_allclose(out, attention(q, k, v, bias=bias, mask=causal_mask(12, 12)), atol=1e-12)


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("causal, with_mask", [(True, False), (False, True), (True, True)])
def test_workers_do_not_change_a_bit(workers, causal, with_mask, monkeypatch):
    # The query blocks (and groups of heads) are independent tasks: whatever thread runs them,
    # the output is the same bits here, where every head takes the same path and the products are
    # too small for the BLAS to thread. The size threshold is lowered so that threads are used.
    monkeypatch.setattr(fa, "_THREADED_WORK", 0)
    q, k, v = _qkv((2, 3), 10, 13, seed=15, dtype=np.float32)
    rng = np.random.default_rng(16)
    bias = rng.standard_normal((3, 10, 13)).astype(np.float32)
    mask = rng.random((2, 1, 10, 13)) > 0.2 if with_mask else None
    bias_fn, mask_fn = _fns(bias, mask)
    one = blockwise_attention(q, k, v, bias_fn=bias_fn, mask_fn=mask_fn, causal=causal, block_size=4, workers=1)
    many = blockwise_attention(q, k, v, bias_fn=bias_fn, mask_fn=mask_fn, causal=causal, block_size=4,
                               workers=workers)
    np.testing.assert_array_equal(one, many)
    np.testing.assert_allclose(one, _dense(q, k, v, bias=bias, mask=mask, causal=causal), rtol=1e-5, atol=1e-6)


def test_an_error_in_a_worker_reaches_the_caller(monkeypatch):
    monkeypatch.setattr(fa, "_THREADED_WORK", 0)
    q, k, v = _qkv((2,), 8, 8)

    def bias_fn(qs, ks):
        return np.full((2, qs.stop - qs.start, ks.stop - ks.start), np.nan if qs.start == 4 else 0.0)
    with pytest.raises(ValueError, match=r"bias_fn must return finite values.*slice\(4, 6\)"):
        blockwise_attention(q, k, v, bias_fn=bias_fn, block_size=2, workers=2)


@pytest.mark.parametrize("workers, error", [(0, ValueError), (1.5, TypeError), (True, TypeError)])
def test_workers_must_be_a_positive_int(workers, error):
    q, k, v = _qkv((1,), 3, 3)
    with pytest.raises(error, match="workers"):
        blockwise_attention(q, k, v, workers=workers)


def test_small_problems_stay_on_the_calling_thread():
    # Below _THREADED_WORK handing blocks to threads costs more than it saves: every block is
    # computed here, in order, even when workers=2 is asked for.
    import threading
    threads, calls = set(), []

    def bias_fn(qs, ks):
        threads.add(threading.get_ident())
        calls.append((qs.start, ks.start))
        return np.zeros((2, qs.stop - qs.start, ks.stop - ks.start))
    q, k, v = _qkv((2,), 6, 6)
    blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True, block_size=2, workers=2)
    assert threads == {threading.get_ident()}
    assert calls == [(0, 0), (2, 2), (2, 0), (4, 4), (4, 2), (4, 0)]


@pytest.mark.parametrize("kind", ["scalar", "float32", "-inf off the diagonal"])
def test_bias_max_fn_may_be_a_scalar_float32_or_minus_inf_without_warnings(kind):
    # Block 4, T = 8. In the "-inf" case keys of the other block of 4 are masked by the bias
    # (-inf), and the bound says so there (a bound must hold: 0 on the diagonal blocks).
    q, k, v = _qkv((2,), 8, 8, seed=18, dtype=np.float32)
    i = np.arange(8)
    far = (i[:, None] // 4) != (i[None, :] // 4)
    minus_inf = kind.startswith("-inf")
    bias = np.where(far, -np.inf, 0.0).astype(np.float32) if minus_inf else np.zeros((8, 8), np.float32)

    def bound(qs, ks):
        if kind == "scalar":
            return 0.0
        if kind == "float32":
            return np.zeros((2, 1, 1), np.float32)
        return np.full((2, 1, 1), -np.inf if qs.start != ks.start else 0.0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = blockwise_attention(q, k, v, causal=True, block_size=4, bias_fn=lambda qs, ks: bias[qs, ks],
                                  bias_max_fn=bound)
    mask = causal_mask(8, 8) & ~far if minus_inf else causal_mask(8, 8)
    np.testing.assert_allclose(out, attention(q, k, v, mask=mask), rtol=1e-5, atol=1e-6)


def test_heads_on_different_paths_agree_to_rounding_whatever_the_workers(monkeypatch):
    # Head 1's row 0 has no allowed key in its first key block, so a task holding head 1 stays
    # on the running max; grouping heads into tasks (few query blocks, two workers) then moves
    # head 0 onto the fixed reference. Both are the same attention: equal to rounding.
    monkeypatch.setattr(fa, "_THREADED_WORK", 0)
    q, k, v = _qkv((2,), 8, 16, D=8, seed=19)
    mask = np.ones((2, 8, 16), bool)
    mask[1, 0, 8:] = False
    mask_fn = lambda qs, ks: mask[:, qs, ks]  # noqa: E731
    one = blockwise_attention(q, k, v, mask_fn=mask_fn, block_size=8, workers=1)
    two = blockwise_attention(q, k, v, mask_fn=mask_fn, block_size=8, workers=2)
    np.testing.assert_allclose(two, one, rtol=1e-13, atol=1e-15)
    np.testing.assert_allclose(one, _dense(q, k, v, mask=mask), atol=1e-12)
