"""Tests of minipos.attention. Expected values are worked by hand in the comments."""

import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from hypothesis.extra.numpy import arrays

from minipos.attention import attention, causal_mask, softmax


def test_softmax_hand_worked():
    # exp(0) : exp(ln 3) = 1 : 3  ->  [1/4, 3/4]
    np.testing.assert_allclose(softmax(np.array([0.0, math.log(3.0)])), [0.25, 0.75], rtol=1e-15)


def test_softmax_large_logits_do_not_overflow():
    # [1000, 1000 + ln 3] is [0, ln 3] shifted: same weights, no overflow.
    np.testing.assert_allclose(softmax(np.array([1000.0, 1000.0 + math.log(3.0)])), [0.25, 0.75], rtol=1e-12)


def test_fully_masked_row_gives_zeros_without_warning():
    x = np.array([[-np.inf, -np.inf], [0.0, math.log(3.0)]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = softmax(x)
    np.testing.assert_array_equal(out[0], [0.0, 0.0])
    np.testing.assert_allclose(out[1], [0.25, 0.75])


@settings(max_examples=50, deadline=None)
@given(arrays(np.float64, (3, 5), elements=st.floats(-50, 50)), st.floats(-100, 100))
def test_softmax_is_shift_invariant_per_row(x, c):
    np.testing.assert_allclose(softmax(x + c), softmax(x), atol=1e-12)


def test_causal_mask_offsets_for_cached_queries():
    # 2 queries are the last 2 of 3 positions: query 0 sees keys 0..1, query 1 sees 0..2.
    expected = np.array([[True, True, False], [True, True, True]])
    np.testing.assert_array_equal(causal_mask(2, 3), expected)
    np.testing.assert_array_equal(causal_mask(3, 3), np.tril(np.ones((3, 3), bool)))


def test_attention_hand_worked():
    # One head, T=1, S=2, scale 1: logits = [ln 3, 0] -> weights [3/4, 1/4]
    # out = 3/4 [1, 2] + 1/4 [3, 4] = [1.5, 2.5]
    q = np.array([[[1.0, 0.0]]])                       # (H=1, T=1, D=2)
    k = np.array([[[math.log(3.0), 0.0], [0.0, 0.0]]])  # (1, 2, 2)
    v = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    out, w = attention(q, k, v, scale=1.0, return_weights=True)
    np.testing.assert_allclose(w, [[[0.75, 0.25]]])
    np.testing.assert_allclose(out, [[[1.5, 2.5]]])


def test_attention_bias_and_default_scale():
    # D = 4, so the default scale is 1/2: q.k = 2 ln 3 -> logit ln 3; a bias of -ln 3 on key 0
    # cancels it: weights [1/2, 1/2].
    q = np.array([[[1.0, 1.0, 0.0, 0.0]]])
    k = np.array([[[math.log(3.0), math.log(3.0), 0, 0], [0, 0, 0, 0]]])
    v = np.array([[[2.0], [4.0]]])
    out = attention(q, k, v)
    np.testing.assert_allclose(out, [[[0.75 * 2 + 0.25 * 4]]])
    out = attention(q, k, v, bias=np.array([[[-math.log(3.0), 0.0]]]))
    np.testing.assert_allclose(out, [[[3.0]]])


def test_attention_masked_row_is_zero_and_float32_kept():
    rng = np.random.default_rng(0)
    q = rng.standard_normal((2, 3, 4, 8)).astype(np.float32)
    mask = np.ones((4, 4), bool)
    mask[1] = False
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out, w = attention(q, q, q, mask=mask, return_weights=True)
    assert out.dtype == np.float32 and w.dtype == np.float32
    np.testing.assert_array_equal(out[:, :, 1], 0.0)
    np.testing.assert_allclose(w.sum(-1)[:, :, [0, 2, 3]], 1.0, rtol=1e-6)


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        ({"mask": np.ones((4, 4))}, TypeError, "mask"),
        ({"mask": np.ones((5, 4), bool)}, ValueError, "mask"),
        ({"bias": np.zeros((3, 2, 4, 4))}, ValueError, "bias"),  # would enlarge the logits
        ({"bias": np.full((4, 4), np.nan)}, ValueError, "bias"),
    ],
)
def test_attention_rejects_bad_bias_and_mask(kwargs, exc, words):
    q = np.zeros((2, 4, 8))
    with pytest.raises(exc, match=words):
        attention(q, q, q, **kwargs)


def test_attention_rejects_mismatched_shapes_and_nan():
    q = np.zeros((2, 4, 8))
    with pytest.raises(ValueError, match="head dim"):
        attention(q, np.zeros((2, 4, 6)), np.zeros((2, 4, 6)))
    with pytest.raises(ValueError, match="k and v"):
        attention(q, q, np.zeros((2, 5, 8)))
    with pytest.raises(ValueError, match="leading dims"):
        attention(q, np.zeros((3, 4, 8)), np.zeros((3, 4, 8)))
    with pytest.raises(ValueError, match="q must be finite"):
        attention(np.full((2, 4, 8), np.nan), q, q)


def test_softmax_rejects_nan():
    with pytest.raises(ValueError, match="NaN"):
        softmax(np.array([0.0, np.nan]))


def test_causal_mask_rejects_bad_lengths():
    with pytest.raises(ValueError, match="k_len"):
        causal_mask(2, -1)
    with pytest.raises(TypeError, match="q_len"):
        causal_mask(2.5, 3)


def test_attention_refuses_logits_that_overflow():
    # float32 scale q . k = -(1/2) 4 (4e19)^2 = -3.2e39 overflows to -inf; silently it would look
    # like a masked row.
    q = np.full((1, 1, 4), -4e19, np.float32)
    k = np.full((1, 2, 4), 4e19, np.float32)
    with pytest.raises(ValueError, match="overflow"):
        attention(q, k, k)


def test_minus_inf_bias_masks_the_key_hand_worked():
    # One query, keys with logits [0, ln 3, 5]; a bias of -inf on the third leaves the softmax of
    # [0, ln 3]: weights [1/4, 3/4, 0], out = 1/4 v0 + 3/4 v1. D = 1, scale 1, so q . k = k.
    q = np.array([[[1.0]]])
    k = np.array([[[0.0], [math.log(3.0)], [5.0]]])
    v = np.array([[[4.0, 0.0], [0.0, 8.0], [100.0, 100.0]]])
    out, w = attention(q, k, v, bias=np.array([[0.0, 0.0, -np.inf]]), scale=1.0, return_weights=True)
    np.testing.assert_allclose(w, [[[0.25, 0.75, 0.0]]], rtol=1e-15)
    np.testing.assert_allclose(out, [[[1.0, 6.0]]], rtol=1e-15)
    # a row whose every bias is -inf has no key: zero weights, zero output, as under the mask
    out = attention(q, k, v, bias=np.full((1, 3), -np.inf), scale=1.0)
    np.testing.assert_array_equal(out, 0.0)


def test_entries_under_the_mask_are_not_read():
    # NaN or +inf where the mask forbids: the result is the one with zeros there.
    rng = np.random.default_rng(5)
    q, k, v = (rng.standard_normal((2, 6, 4)) for _ in range(3))
    mask = causal_mask(6, 6)
    bias = rng.standard_normal((2, 6, 6))
    dirty = bias.copy()
    dirty[:, ~mask] = np.nan
    dirty[0, 0, 5] = np.inf
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = attention(q, k, v, bias=dirty, mask=mask)
    np.testing.assert_array_equal(got, attention(q, k, v, bias=np.where(mask, bias, 0.0), mask=mask))


@pytest.mark.parametrize("bad", [np.nan, np.inf])
def test_nan_or_plus_inf_where_a_query_attends_is_refused(bad):
    q = np.zeros((1, 3, 2))
    bias = np.zeros((3, 3))
    bias[2, 1] = bad
    with pytest.raises(ValueError, match="bias must not hold NaN or \\+inf where the mask lets a query attend"):
        attention(q, q, q, bias=bias, mask=causal_mask(3, 3))
    bias[1, 2] = bad                                                      # under the causal mask only: read nowhere
    bias[2, 1] = 0.0
    attention(q, q, q, bias=bias, mask=causal_mask(3, 3))


def test_an_overflowing_logit_is_refused_unless_the_bias_masks_it():
    # scale q . k = (1/sqrt 2) 2 (2e19)^2 ~ 5.7e38 > float32's 3.4e38 at (0, 0) only.
    q = np.zeros((1, 2, 2), np.float32)
    q[0, 0] = 2e19
    bias = np.zeros((2, 2), np.float32)
    with np.errstate(over="ignore"):
        with pytest.raises(ValueError, match="overflow"):
            attention(q, q, q, bias=bias)
        bias[0, 0] = -np.inf                                              # that key is masked: not read
        out = attention(q, q, q, bias=bias)
    np.testing.assert_array_equal(out[0, 0], q[0, 1])                     # all weight on key 1
