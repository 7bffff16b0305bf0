"""The content-position schemes, fast: the scatter-adds by np.bincount equal the reference's np.add.at
bit for bit, the BLAS forms of the terms and their gradients equal the reference's up to rounding (the
reference functions are the oracle), and the fast layer, which builds step 5 through them and keeps a
pass's extra logits for its backward, equals the reference layer and central differences."""

import gc

import numpy as np
import pytest

import minipos.fast.layer as fast_layer
from minipos import deberta, transformer_xl
from minipos import layer as ref
from minipos.fast import MultiHeadAttention
from minipos.fast import deberta as fast_deberta
from minipos.fast import transformer_xl as fast_xl


def _wide(rng, shape, dtype):
    """Values over 16 decades, so that a sum in another order would round differently."""
    return (rng.standard_normal(shape) * 10.0 ** rng.integers(-8, 8, shape)).astype(dtype)


def test_scatter_add_is_np_add_at_bit_for_bit():
    # Pairs share buckets (a true sum, in float64) and the values span 16 decades: another order
    # of the additions would round differently.
    rng = np.random.default_rng(0)
    dout, idx = _wide(rng, (3, 2, 17, 19), np.float32), rng.integers(0, 7, (17, 19))
    for d, i in ((dout, idx), (np.swapaxes(dout, -1, -2), idx.T)):         # the p2c form reads a transpose
        want = deberta._take_along_last_backward(d, np.broadcast_to(i, d.shape), 7)
        got = fast_deberta.take_along_last_backward(d, i, 7)
        assert got.dtype == np.float64 and np.array_equal(got, want)


TOL = {np.float32: 1e-5, np.float64: 1e-10}


def _close(got, want, dtype):
    """Equal up to rounding: the same dtype, every element within TOL of the largest magnitude (BLAS
    sums in another order than np.einsum; near-cancelling elements keep only that absolute error)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=TOL[dtype], atol=TOL[dtype] * np.abs(want).max())


def test_scatter_without_shared_bins_is_np_add_at_bit_for_bit():
    # Rows of distinct indices (Transformer-XL's distances): the scatter is an assignment.
    rng = np.random.default_rng(1)
    dout, idx = _wide(rng, (3, 2, 5, 7), np.float32), np.array([rng.permutation(9)[:7] for _ in range(5)])
    want = deberta._take_along_last_backward(dout, np.broadcast_to(idx, dout.shape), 9)
    got = fast_deberta.take_along_last_backward(dout, idx, 9)
    assert got.dtype == np.float64 and np.array_equal(got, want)
    assert fast_deberta.take_along_last_backward(np.zeros((2, 0, 3)), np.zeros((0, 3), int), 4).shape == (2, 0, 4)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("T, S, buckets, max_position", [(9, 13, 4, 8), (16, 16, 8, 16), (5, 3, -1, -1)])
@pytest.mark.parametrize("batch", [2, 12])
def test_deberta_terms_equal_the_reference_up_to_rounding(dtype, T, S, buckets, max_position, batch):
    # The reference functions (np.einsum, np.add.at, np.take_along_axis) are the oracle. Batch 2: the
    # one-hot matrices would outgrow dout, the backward scatters by np.bincount; batch 12: by one-hot products.
    rng = np.random.default_rng(T * S)
    span = buckets if buckets > 0 else 6
    rel = deberta.relative_positions(np.arange(T), np.arange(S), bucket_size=buckets, max_position=max_position)
    q, k = rng.standard_normal((batch, 3, T, 4)).astype(dtype), rng.standard_normal((batch, 3, S, 4)).astype(dtype)
    table = rng.standard_normal((3, 2 * span, 4)).astype(dtype)
    dout = rng.standard_normal((batch, 3, T, S)).astype(dtype)
    assert len(np.unique(rel[0])) < S or buckets < 0                        # log buckets: pairs share a bucket
    for fast, slow, content in ((fast_deberta.c2p_term, deberta.c2p_term, q),
                                (fast_deberta.p2c_term, deberta.p2c_term, k)):
        _close(fast(content, table, rel, span), slow(content, table, rel, span), dtype)
    for fast, slow, content in ((fast_deberta.c2p_term_backward, deberta.c2p_term_backward, q),
                                (fast_deberta.p2c_term_backward, deberta.p2c_term_backward, k)):
        got, want = fast(content, table, rel, span, dout), slow(content, table, rel, span, dout)
        for g, w in zip(got, want):
            _close(g, w, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_one_hot_scatter_equals_np_add_at_up_to_rounding(dtype):
    # Shared buckets (a true sum): BLAS adds them in its own order, in dout's dtype.
    rng = np.random.default_rng(4)
    dout, idx = rng.standard_normal((3, 2, 17, 19)).astype(dtype), rng.integers(0, 7, (17, 19))
    for d, i in ((dout, idx), (np.swapaxes(dout, -1, -2), idx.T)):
        want = deberta._take_along_last_backward(d, np.broadcast_to(i, d.shape), 7).astype(dtype)
        got = fast_deberta.one_hot_scatter(d, i, 7)
        _close(got, want, dtype)
    # Hand-worked: one row, buckets [1, 0, 1]: bucket 0 gets 2, bucket 1 gets 1 + 4, bucket 2 nothing.
    np.testing.assert_array_equal(fast_deberta.one_hot_scatter(np.array([[1.0, 2.0, 4.0]]), np.array([[1, 0, 1]]), 3),
                                  [[2.0, 5.0, 0.0]])


def test_deberta_terms_against_a_hand_worked_case():
    # T = S = 2, att_span 1, one head, D = 1: delta(i, j) = clip(i - j, -1, 0) + 1 indexes rows {0, 1}.
    # c2p[i, j] = q_i * pos_key[delta]; p2c[i, j] = k_j * pos_query[delta] (the code's delta(i, j)).
    rel = np.array([[0, -1], [1, 0]])                                        # i - j
    q, k = np.array([[[[2.0], [3.0]]]]), np.array([[[[5.0], [7.0]]]])
    pos = np.array([[[10.0], [100.0]]])                                      # rows for delta 0 and 1
    # delta = clip(i - j + 1, 0, 1): [[1, 0], [1, 1]]
    np.testing.assert_array_equal(fast_deberta.c2p_term(q, pos, rel, 1)[0, 0], [[200.0, 20.0], [300.0, 300.0]])
    np.testing.assert_array_equal(fast_deberta.p2c_term(k, pos, rel, 1)[0, 0], [[500.0, 70.0], [500.0, 700.0]])


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("clamp_len", [None, 3])
def test_xl_position_logits_equal_the_reference_up_to_rounding(dtype, clamp_len):
    # clamp_len = 3 makes pairs share a distance (a true sum); positions out of order and negative.
    rng = np.random.default_rng(5)
    q, v, w_r = (rng.standard_normal(s).astype(dtype) for s in ((2, 2, 6, 4), (2, 4), (8, 8)))
    qp, kp = np.array([4, -2, 7, 0, 3, 3]), np.array([9, 1, -5, 2, 0, 6, 6])
    dout = rng.standard_normal((2, 2, 6, 7)).astype(dtype)
    _close(fast_xl.xl_position_logits(q, v, w_r, qp, kp, clamp_len=clamp_len),
           transformer_xl.xl_position_logits(q, v, w_r, qp, kp, clamp_len=clamp_len), dtype)
    got = fast_xl.xl_position_logits_backward(q, v, w_r, qp, kp, dout, clamp_len=clamp_len)
    want = transformer_xl.xl_position_logits_backward(q, v, w_r, qp, kp, dout, clamp_len=clamp_len)
    for g, w in zip(got, want):
        _close(g, w, dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("q_positions, k_positions", [
    (np.arange(6), np.arange(6)), (np.arange(4, 9), np.arange(9)), (np.arange(-3, 2), np.arange(5, 12)),
    (np.arange(1), np.arange(3))])
def test_xl_band_of_contiguous_positions_equals_the_reference(dtype, q_positions, k_positions):
    # Contiguous positions take the strided band (no index arrays): queries after a memory, keys after
    # the queries, one query. dout in float64 with float32 inputs: the gradients keep the inputs' dtype.
    rng = np.random.default_rng(len(q_positions) * 31 + len(k_positions))
    T, S = len(q_positions), len(k_positions)
    q, v, w_r = (rng.standard_normal(s).astype(dtype) for s in ((3, 2, T, 4), (2, 4), (8, 8)))
    index = transformer_xl.distinct_distances(q, v, w_r, q_positions, k_positions, 10000.0, None)[-1]
    assert fast_xl._is_band(index, T + S - 1)
    got = fast_xl.xl_position_logits(q, v, w_r, q_positions, k_positions)
    _close(got, transformer_xl.xl_position_logits(q, v, w_r, q_positions, k_positions), dtype)
    assert got.flags.c_contiguous
    for dout in (rng.standard_normal((3, 2, T, S)).astype(dtype), rng.standard_normal((3, 2, T, S))):
        got = fast_xl.xl_position_logits_backward(q, v, w_r, q_positions, k_positions, dout)
        want = transformer_xl.xl_position_logits_backward(q, v, w_r, q_positions, k_positions, dout)
        for g, w in zip(got, want):
            _close(g, w, dtype)


def test_xl_band_is_only_the_contiguous_index():
    # Out of order, a clamp (shared distances) or a gap: the general gather, not the band.
    for qp, kp, clamp in ((np.array([1, 0, 2]), np.arange(3), None), (np.arange(5), np.arange(5), 2),
                          (np.arange(3), np.array([0, 1, 3]), None)):
        *_, table, index = transformer_xl.distinct_distances(np.ones((1, len(qp), 2)), np.ones((1, 2)),
                                                              np.ones((2, 2)), qp, kp, 10000.0, clamp)
        assert not fast_xl._is_band(index, table.shape[0])


def test_xl_position_logits_against_the_definitional_terms():
    # Outside the gather: terms (b) + (d) of xl_terms, which builds R_{i-j} for each pair directly.
    rng = np.random.default_rng(8)
    q, k = rng.standard_normal((2, 2, 5, 4)), rng.standard_normal((2, 2, 5, 4))
    u, v, w_r = rng.standard_normal((2, 4)), rng.standard_normal((2, 4)), rng.standard_normal((8, 8))
    terms = transformer_xl.xl_terms(q, k, w_r, u, v, q_positions=np.arange(5), k_positions=np.arange(5))
    got = fast_xl.xl_position_logits(q, v, w_r, np.arange(5), np.arange(5))
    np.testing.assert_allclose(got, terms.b + terms.d, rtol=1e-12, atol=1e-12)


def test_bad_dout_is_refused_by_name():
    rel = deberta.relative_positions(np.arange(3), np.arange(3), bucket_size=-1, max_position=-1)
    with pytest.raises(ValueError, match="dout"):
        fast_deberta.c2p_term_backward(np.ones((1, 1, 3, 2)), np.ones((1, 6, 2)), rel, 3, np.ones((1, 1, 3, 4)))
    with pytest.raises(ValueError, match="dout"):
        fast_xl.xl_position_logits_backward(np.ones((1, 3, 2)), np.ones((1, 2)), np.ones((4, 2)), np.arange(3),
                                            np.arange(3), np.ones((1, 3, 2)))


SCHEMES = {"transformer_xl": ref.TransformerXL,
           "deberta": lambda: ref.DeBERTa(position_buckets=4, max_relative_positions=8)}


def _pair(name, block_size):
    a = ref.MultiHeadAttention(16, 4, scheme=SCHEMES[name](), seed=3, block_size=block_size)
    b = MultiHeadAttention(16, 4, scheme=SCHEMES[name](), seed=3, block_size=block_size)
    return a, b


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("block_size", [None, 4])
def test_fast_layer_backward_equals_reference(name, block_size):
    # T = 150 with 2 x 4 heads passes the size where the dense default runs the blockwise kernel.
    a, b = _pair(name, block_size)
    T = 150 if block_size is None else 11
    x = np.random.default_rng(2).standard_normal((2, T, 16))
    dy = np.random.default_rng(3).standard_normal((2, T, 16))
    want = a.backward(a(x, causal=True, return_context=True)[1], dy)
    y, ctx = b(x, causal=True, return_context=True)
    got = b.backward(ctx, dy)
    assert got.keys() == want.keys()
    for key in want:
        np.testing.assert_allclose(got[key], want[key], rtol=1e-9, atol=1e-11, err_msg=key)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_fast_layer_backward_against_central_differences(name):
    _, layer = _pair(name, 4)
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal((1, 9, 16)), rng.standard_normal((1, 9, 16))
    grads = layer.backward(layer(x, causal=True, return_context=True)[1], dy)
    params = {"x": x, "wq": layer.wq, "wk": layer.wk, **{"scheme." + k: v for k, v in layer.scheme.parameters().items()}}
    h = 1e-6
    for key, arr in params.items():
        for flat in rng.choice(arr.size, 3, replace=False):
            i = np.unravel_index(flat, arr.shape)
            old = arr[i]
            arr[i] = old + h
            up = np.sum(layer(x, causal=True) * dy)
            arr[i] = old - h
            down = np.sum(layer(x, causal=True) * dy)
            arr[i] = old
            assert grads[key][i] == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-8), (key, i)


@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_the_backward_reuses_the_forwards_extra_logits_while_the_context_lives(name, monkeypatch):
    _, layer = _pair(name, 4)
    calls = []
    content_position = layer._content_position

    def counted(*args):
        q, extra = content_position(*args)

        def extra_counted(qs, ks):
            calls.append((qs.start, ks.start))
            return extra(qs, ks)
        return q, extra_counted
    monkeypatch.setattr(layer, "_content_position", counted)
    x = np.random.default_rng(1).standard_normal((1, 10, 16))
    y, ctx = layer(x, causal=True, return_context=True)
    forward = len(calls)
    assert forward == len(set(calls)) == 6                                  # 3 query blocks, causal
    layer.backward(ctx, np.ones_like(y))
    assert len(calls) == forward                                            # none computed again
    assert len(layer._kept) == 1
    del ctx
    gc.collect()
    assert len(layer._kept) == 0                                            # gone with the context
    monkeypatch.setattr(fast_layer, "_KEPT_EXTRA", 0)                       # too large to keep: computed again
    y, ctx = layer(x, causal=True, return_context=True)
    layer.backward(ctx, np.ones_like(y))
    assert len(calls) == 3 * forward


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name", sorted(SCHEMES))
def test_fast_layer_takes_the_fast_step_5_and_equals_the_reference(name, dtype, monkeypatch):
    a = ref.MultiHeadAttention(16, 4, scheme=SCHEMES[name](), seed=3, dtype=dtype)
    b = MultiHeadAttention(16, 4, scheme=SCHEMES[name](), seed=3, dtype=dtype)
    x = np.random.default_rng(4).standard_normal((2, 12, 16)).astype(dtype)
    _close(b(x, causal=True), a(x, causal=True), dtype)
    used = []                                                               # the ops each method was given
    for method in ("content_position", "extra_backward"):
        original = getattr(b.scheme, method)
        monkeypatch.setattr(b.scheme, method, lambda *a, _f=original, **k: used.append(k.get("ops")) or _f(*a, **k))
    y, ctx = b(x, causal=True, return_context=True)
    b.backward(ctx, np.ones_like(y))
    ops = fast_layer.CONTENT_POSITION[type(b.scheme)]
    assert ops is {"transformer_xl": fast_xl, "deberta": fast_deberta}[name]
    assert used[0] is ops and len(used) > 1 and all(u is ops for u in used)    # step 5, then each block's backward


def test_a_subclass_runs_its_own_content_position():
    class Mine(ref.TransformerXL):
        def content_position(self, q, k, q_positions, k_positions):
            q_c, extra = super().content_position(q, k, q_positions, k_positions)
            return q_c, (lambda qs, ks: 0.0 * extra(qs, ks))                  # the position terms dropped
    x = np.random.default_rng(4).standard_normal((1, 6, 16))
    plain = MultiHeadAttention(16, 4, scheme=Mine(), seed=3)
    full = MultiHeadAttention(16, 4, scheme=ref.TransformerXL(), seed=3)
    assert not np.allclose(plain(x, causal=True), full(x, causal=True))
    want = ref.MultiHeadAttention(16, 4, scheme=Mine(), seed=3)(x, causal=True)
    np.testing.assert_allclose(plain(x, causal=True), want, rtol=1e-12, atol=1e-14)


def test_empty_queries_or_keys_give_the_reference_shapes():
    rel = deberta.relative_positions(np.arange(0), np.arange(3))
    z = np.zeros
    for qn, kn in ((0, 3), (3, 0)):
        assert (fast_xl.xl_position_logits(z((1, 2, qn, 4)), z((2, 4)), z((6, 8)), np.arange(qn), np.arange(kn)).shape
                == transformer_xl.xl_position_logits(z((1, 2, qn, 4)), z((2, 4)), z((6, 8)), np.arange(qn),
                                                     np.arange(kn)).shape == (1, 2, qn, kn))
    assert fast_deberta.c2p_term(z((1, 2, 0, 4)), z((2, 6, 4)), rel, 3).shape == (1, 2, 0, 3)
    assert fast_deberta.p2c_term(z((1, 2, 3, 4)), z((2, 6, 4)), rel, 3).shape == (1, 2, 0, 3)
    assert [g.shape for g in fast_deberta.c2p_term_backward(z((1, 2, 0, 4)), z((2, 6, 4)), rel, 3,
                                                            z((1, 2, 0, 3)))] == [(1, 2, 0, 4), (2, 6, 4)]
