"""Tests of blockwise_attention, the online-softmax form of attention, reference and fast.

The blockwise form must equal the definitional one (``attention``, dense logits) whatever the
block sizes; the small cases are worked by hand in the comments.
"""

import math
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipos.attention
import minipos.fast.attention
from minipos.attention import attention, causal_mask

# The reference (running max, one thread) and the fast kernel must pass every test here.
IMPLS = pytest.mark.parametrize("blockwise_attention", [minipos.attention.blockwise_attention,
                                                        minipos.fast.attention.blockwise_attention],
                                ids=["reference", "fast"])

LN3 = math.log(3.0)


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


# --- hand-worked ------------------------------------------------------------------------------

@IMPLS
def test_one_query_two_keys_in_two_blocks_hand_worked(blockwise_attention):
    # q = [1, 0], scale 1. Key 0 scores 0, key 1 scores ln 3, blocks of one key each.
    # block 0: m = 0,    l = 1,                       o = [3, 4]
    # block 1: m = ln 3, l = 1 e^{-ln 3} + 1 = 4/3,   o = [3, 4]/3 + [1, 2] = [2, 10/3]
    # out = o / l = [3/2, 5/2]  (= 1/4 [3, 4] + 3/4 [1, 2], the dense softmax)
    q = np.array([[[1.0, 0.0]]])                     # (H=1, T=1, D=2)
    k = np.array([[[0.0, 0.0], [LN3, 0.0]]])         # (1, S=2, 2)
    v = np.array([[[3.0, 4.0], [1.0, 2.0]]])         # (1, 2, Dv=2)
    out = blockwise_attention(q, k, v, scale=1.0, block_size=1)
    np.testing.assert_allclose(out, [[[1.5, 2.5]]], rtol=1e-15)


@IMPLS
def test_scale_multiplies_q_dot_k_only(blockwise_attention):
    # scale 2: logits = 2 [ln 3, 0] + bias [0, ln 3] = [2 ln 3, ln 3] -> weights 9:3 = [3/4, 1/4]
    # out = 3/4 [1, 2] + 1/4 [3, 4] = [1.5, 2.5]. (Scaling the bias too would give [1/2, 1/2].)
    q = np.array([[[1.0, 0.0]]])
    k = np.array([[[LN3, 0.0], [0.0, 0.0]]])
    v = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    bias = np.array([[[0.0, LN3]]])
    out = blockwise_attention(q, k, v, scale=2.0, bias_fn=lambda qs, ks: bias[..., qs, ks], block_size=1)
    np.testing.assert_allclose(out, [[[1.5, 2.5]]], rtol=1e-15)


@IMPLS
@pytest.mark.parametrize("dtype, shift", [(np.float64, 1000.0), (np.float32, 100.0)])
def test_large_logits_do_not_overflow(blockwise_attention, dtype, shift):
    # The hand-worked case with every logit raised by `shift` (e^100 overflows float32, e^1000
    # float64): softmax is shift-invariant, so out stays [1.5, 2.5].
    q = np.array([[[1.0, 0.0]]], dtype)
    k = np.array([[[0.0, 0.0], [LN3, 0.0]]], dtype)
    v = np.array([[[3.0, 4.0], [1.0, 2.0]]], dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = blockwise_attention(q, k, v, scale=1.0, block_size=1,
                                  bias_fn=lambda qs, ks: np.full((1, 1, 1), shift))
    assert out.dtype == dtype
    np.testing.assert_allclose(out, [[[1.5, 2.5]]], rtol=1e-5 if dtype == np.float32 else 1e-12)


# --- equal to the dense form ------------------------------------------------------------------

SIZES = [(7, 7), (5, 12), (1, 9), (12, 12), (6, 3)]      # T < S: cached queries; T > S too
BLOCKS = [1, 3, 4, 16]                                    # 16 exceeds every T and S


@IMPLS
@pytest.mark.parametrize("T, S", SIZES)
@pytest.mark.parametrize("block", BLOCKS)
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("with_bias, with_mask", [(False, False), (True, False), (True, True)])
def test_equals_dense_float64(blockwise_attention, T, S, block, causal, with_bias, with_mask):
    q, k, v = _qkv((2, 3), T, S, seed=T * 100 + S)
    rng = np.random.default_rng(1)
    bias = rng.standard_normal((3, T, S)) if with_bias else None          # (H, T, S)
    mask = rng.random((2, 1, T, S)) > 0.3 if with_mask else None           # (B, 1, T, S)
    bias_fn, mask_fn = _fns(bias, mask)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = blockwise_attention(q, k, v, bias_fn=bias_fn, mask_fn=mask_fn, causal=causal,
                                  block_size=block)
    np.testing.assert_allclose(out, _dense(q, k, v, bias, mask, causal), rtol=0, atol=1e-10)


@IMPLS
@pytest.mark.parametrize("T, S, block", [(7, 7, 3), (5, 12, 4), (12, 12, 16), (64, 80, 24)])
@pytest.mark.parametrize("causal", [False, True])
def test_equals_dense_float32(blockwise_attention, T, S, block, causal):
    q, k, v = _qkv((2, 2), T, S, D=8, Dv=5, seed=7, dtype=np.float32)
    bias = np.random.default_rng(2).standard_normal((2, T, S)).astype(np.float32)
    out = blockwise_attention(q, k, v, bias_fn=_fns(bias, None)[0], causal=causal, block_size=block)
    assert out.dtype == np.float32
    ref = _dense(*(a.astype(np.float64) for a in (q, k, v)), bias.astype(np.float64), causal=causal)
    np.testing.assert_allclose(out, ref, rtol=1e-5, atol=1e-6)


@IMPLS
@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 12), S=st.integers(1, 12), H=st.integers(1, 3), D=st.integers(1, 5),
       block=st.integers(1, 14), causal=st.booleans(), with_bias=st.booleans(),
       offset_shift=st.integers(-3, 3), seed=st.integers(0, 2**16))
def test_equals_dense_for_any_sizes(blockwise_attention, T, S, H, D, block, causal, with_bias, offset_shift, seed):
    q, k, v = _qkv((H,), T, S, D=D, Dv=2, seed=seed)
    bias = np.random.default_rng(seed + 1).standard_normal((H, T, S)) if with_bias else None
    q_offset = S - T + offset_shift if causal else None
    out = blockwise_attention(q, k, v, bias_fn=_fns(bias, None)[0], causal=causal, block_size=block,
                              q_offset=q_offset)
    np.testing.assert_allclose(out, _dense(q, k, v, bias, causal=causal, q_offset=q_offset), atol=1e-10)


# --- masks and skipped blocks -----------------------------------------------------------------

@IMPLS
def test_fully_masked_rows_give_zeros_without_warning(blockwise_attention):
    q, k, v = _qkv((2,), 6, 6, seed=3)
    mask = np.ones((6, 6), bool)
    mask[4] = False                                       # query 4 may attend nothing
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = blockwise_attention(q, k, v, mask_fn=_fns(None, mask)[1], causal=True, q_offset=-2,
                                  block_size=4)
    # q_offset -2: query t sees keys s <= t - 2, so queries 0 and 1 see nothing either.
    np.testing.assert_array_equal(out[:, [0, 1, 4]], 0.0)
    assert np.all(np.abs(out[:, [2, 3, 5]]).sum(-1) > 0)
    np.testing.assert_allclose(out, _dense(q, k, v, mask=mask, causal=True, q_offset=-2), atol=1e-12)


@pytest.mark.parametrize("T, S, block, q_offset, expected", [
    # T = S = 6, blocks of 2: key blocks on or below the diagonal only.
    (6, 6, 2, None, [((0, 2), (0, 2)),
                     ((2, 4), (2, 4)), ((2, 4), (0, 2)),
                     ((4, 6), (4, 6)), ((4, 6), (2, 4)), ((4, 6), (0, 2))]),
    # T = 4 cached queries of S = 5 (offset 1): query 1 sees keys <= 2, so the key block is cut at 3.
    (4, 5, 2, None, [((0, 2), (2, 3)), ((0, 2), (0, 2)),
                     ((2, 4), (4, 5)), ((2, 4), (2, 4)), ((2, 4), (0, 2))]),
    # offset -2: queries 0..1 see no key, query 2 sees key 0, query 3 keys 0..1.
    (4, 4, 2, -2, [((2, 4), (0, 2))]),
])
@IMPLS
def test_causal_never_evaluates_future_blocks(blockwise_attention, T, S, block, q_offset, expected):
    calls = []

    def bias_fn(qs, ks):
        calls.append(((qs.start, qs.stop), (ks.start, ks.stop)))
        return np.zeros((1, qs.stop - qs.start, ks.stop - ks.start))

    q, k, v = _qkv((1,), T, S, seed=4)
    out = blockwise_attention(q, k, v, bias_fn=bias_fn, causal=True, block_size=block, q_offset=q_offset)
    assert sorted(calls) == sorted(expected)
    np.testing.assert_allclose(out, _dense(q, k, v, causal=True, q_offset=q_offset), atol=1e-12)


@IMPLS
def test_block_masked_by_mask_fn_is_skipped(blockwise_attention):
    # Keys 2..3 are masked for every query: that key block is never scored or biased.
    calls = []
    mask = np.ones((4, 6), bool)
    mask[:, 2:4] = False

    def bias_fn(qs, ks):
        calls.append((ks.start, ks.stop))
        return np.ones((1, qs.stop - qs.start, ks.stop - ks.start))

    q, k, v = _qkv((1,), 4, 6, seed=5)
    out = blockwise_attention(q, k, v, bias_fn=bias_fn, mask_fn=_fns(None, mask)[1], block_size=2)
    assert sorted(calls) == [(0, 2), (0, 2), (4, 6), (4, 6)]  # never the masked key block (2, 4)
    np.testing.assert_allclose(out, _dense(q, k, v, bias=np.ones((1, 4, 6)), mask=mask), atol=1e-12)


# --- memory -----------------------------------------------------------------------------------

@IMPLS
def test_peak_memory_far_below_dense_logits(blockwise_attention):
    T = S = 4096
    q, k, v = _qkv((1,), T, S, D=16, Dv=16, seed=6, dtype=np.float32)   # (H=1, T, D=16)
    tracemalloc.start()
    try:
        out = blockwise_attention(q, k, v, block_size=256)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < T * S * 4 / 8, f"peak {peak} bytes vs dense logits {T * S * 4}"
    rows = [0, 1000, 4095]                                                 # rows are independent
    ref = attention(q[:, rows].astype(np.float64), k.astype(np.float64), v.astype(np.float64))
    np.testing.assert_allclose(out[:, rows], ref, rtol=1e-5, atol=1e-6)


# --- argument errors --------------------------------------------------------------------------

@IMPLS
@pytest.mark.parametrize("block_size, error", [(0, ValueError), (-2, ValueError), (2.5, TypeError),
                                               (True, TypeError), ("8", TypeError)])
def test_block_size_must_be_a_positive_int(blockwise_attention, block_size, error):
    q, k, v = _qkv((1,), 3, 3)
    with pytest.raises(error, match="block_size"):
        blockwise_attention(q, k, v, block_size=block_size)


@IMPLS
def test_bad_callables_and_their_results_are_named(blockwise_attention):
    q, k, v = _qkv((2,), 3, 4)
    with pytest.raises(TypeError, match="bias_fn"):
        blockwise_attention(q, k, v, bias_fn=np.zeros((2, 3, 4)))
    with pytest.raises(ValueError, match="bias_fn.*does not broadcast"):
        blockwise_attention(q, k, v, bias_fn=lambda qs, ks: np.zeros((3, 3, 4)))
    with pytest.raises(ValueError, match="bias_fn.*finite"):
        blockwise_attention(q, k, v, bias_fn=lambda qs, ks: np.full((1, 1, 1), np.nan))
    with pytest.raises(TypeError, match="mask_fn.*boolean"):
        blockwise_attention(q, k, v, mask_fn=lambda qs, ks: np.ones((1, 1)))
    with pytest.raises(ValueError, match="mask_fn.*does not broadcast"):
        blockwise_attention(q, k, v, mask_fn=lambda qs, ks: np.ones((5, 3, 4), bool))


@IMPLS
def test_bad_options_and_shapes_are_named(blockwise_attention):
    q, k, v = _qkv((2,), 3, 4)
    with pytest.raises(ValueError, match="q_offset"):
        blockwise_attention(q, k, v, q_offset=1)
    with pytest.raises(TypeError, match="q_offset"):
        blockwise_attention(q, k, v, causal=True, q_offset=1.5)
    with pytest.raises(TypeError, match="causal"):
        blockwise_attention(q, k, v, causal="yes")
    with pytest.raises(ValueError, match="scale"):
        blockwise_attention(q, k, v, scale=float("inf"))
    with pytest.raises(ValueError, match="head dim D"):
        blockwise_attention(q, k[..., :3], v)
    with pytest.raises(ValueError, match="q must be finite"):
        blockwise_attention(np.full_like(q, np.nan), k, v)


# --- the fixed reference and its fallback ------------------------------------------------------

@IMPLS
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_a_later_block_far_above_the_first_falls_back_to_the_running_max(blockwise_attention, dtype):
    # Causal, block 2, T = S = 4. The first block each query block meets is its diagonal one;
    # keys 0..1 then carry a bias of +800 (float64) / +120 (float32), so e^(x - m) against the
    # diagonal's logit overflows: the fixed-reference pass is not finite and the query block is
    # redone with the running max. Softmax is shift-invariant, so rows 2..3 put their weight on
    # keys 0..1 alone: out[t] = softmax(q_t . k_{0,1} / 2) v_{0,1}.
    big = 800.0 if dtype == np.float64 else 120.0
    q, k, v = _qkv((1,), 4, 4, seed=13, dtype=dtype)
    bias = np.zeros((1, 4, 4), dtype)
    bias[..., :2] = big
    with warnings.catch_warnings():
        warnings.simplefilter("error")                           # no overflow warning escapes
        out = blockwise_attention(q, k, v, bias_fn=lambda qs, ks: bias[..., qs, ks], causal=True, block_size=2)
    logits = q[0, 2:] @ k[0, :2].T / 2.0
    w = np.exp(logits - logits.max(-1, keepdims=True))
    expected = (w / w.sum(-1, keepdims=True)) @ v[0, :2]
    tol = 1e-5 if dtype == np.float32 else 1e-12          # float32: 120 + logit keeps ~1e-5 of it
    np.testing.assert_allclose(out[0, 2:], expected, rtol=tol, atol=tol)
    np.testing.assert_allclose(out, _dense(q, k, v, bias=bias, causal=True), rtol=1e-5, atol=1e-6)


@IMPLS
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("term", ["scalar", "keys", "one row", "mask keys"])
def test_block_terms_of_any_broadcastable_shape(blockwise_attention, causal, term):
    # A block term need only broadcast to (..., H, tq, tk): a scalar, a (tk,) row of per-key
    # biases, a (1, tk) one, or a (tk,) mask. Block 16 with T = 16 cuts the causal diagonal block
    # into bands of rows, which must not slice a size-1 row axis.
    q, k, v = _qkv((2,), 16, 16, seed=17)
    per_key = np.linspace(-1.0, 1.0, 16)
    keep = np.arange(16) % 3 != 1
    bias, mask, fns = None, None, {}
    if term == "scalar":
        bias, fns["bias_fn"] = np.full((16, 16), 0.5), lambda qs, ks: 0.5
    elif term == "keys":
        bias, fns["bias_fn"] = np.broadcast_to(per_key, (16, 16)), lambda qs, ks: per_key[ks]
    elif term == "one row":
        bias, fns["bias_fn"] = np.broadcast_to(per_key, (16, 16)), lambda qs, ks: per_key[None, ks]
    else:
        mask, fns["mask_fn"] = np.broadcast_to(keep, (16, 16)), lambda qs, ks: keep[ks]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = blockwise_attention(q, k, v, causal=causal, block_size=16, **fns)
    np.testing.assert_allclose(out, _dense(q, k, v, bias=bias, mask=mask, causal=causal), atol=1e-12)

