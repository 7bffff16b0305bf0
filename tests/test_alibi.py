"""ALiBi slopes and biases against the paper, the reference get_slopes and BLOOM."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos.alibi import alibi_bias, alibi_bias_key_only, alibi_slopes
from minipos.fast.alibi import alibi_bias_bound
from minipos.attention import attention, causal_mask, softmax

# --- slopes -------------------------------------------------------------------------------

def test_slopes_8_heads_from_the_paper():
    # Press et al. 2022 §3: with 8 heads the slopes are the geometric sequence 1/2^1, 1/2^2, ..., 1/2^8.
    np.testing.assert_array_equal(alibi_slopes(8), [1 / 2 ** k for k in range(1, 9)])


def test_slopes_16_heads_from_the_paper():
    # §3: with 16 heads the 8-head slopes are interpolated by geometric averages of consecutive
    # pairs, giving 1/2^0.5, 1/2^1, 1/2^1.5, ..., 1/2^8.
    np.testing.assert_allclose(alibi_slopes(16), [2 ** (-k / 2) for k in range(1, 17)], rtol=1e-15)


# Printed by the reference `get_slopes(n)` of github.com/ofirpress/attention_with_linear_biases
# (fairseq/models/transformer.py), float64 Python floats.
REFERENCE_GET_SLOPES = {
    1: [0.00390625],
    2: [0.0625, 0.00390625],
    3: [0.0625, 0.00390625, 0.25],
    6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
    12: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
         0.7071067811865476, 0.35355339059327384, 0.17677669529663692, 0.08838834764831849],
    20: [0.7071067811865476, 0.5000000000000001, 0.35355339059327384, 0.25000000000000006,
         0.17677669529663692, 0.12500000000000006, 0.08838834764831849, 0.06250000000000004,
         0.044194173824159244, 0.03125000000000002, 0.022097086912079626, 0.01562500000000001,
         0.011048543456039816, 0.007812500000000007, 0.005524271728019908, 0.003906250000000004,
         0.8408964152537145, 0.5946035575013604, 0.42044820762685714, 0.2973017787506802],
}

# Printed by transformers 5.24.0 `bloom.modeling_bloom.build_alibi_tensor(ones(1, 4), n, float32)`
# at key position 1, i.e. the slopes BLOOM uses (computed in float32).
BLOOM_SLOPES = {
    6: [0.25, 0.0625, 0.015625, 0.00390625, 0.5, 0.125],
    12: [0.5, 0.25, 0.125, 0.0625, 0.03125, 0.015625, 0.0078125, 0.00390625,
         0.7071067690849304, 0.3535533845424652, 0.1767766773700714, 0.0883883386850357],
    20: [0.7071067690849304, 0.4999999701976776, 0.3535533845424652, 0.2499999850988388,
         0.1767766773700714, 0.1249999850988388, 0.0883883386850357, 0.0624999925494194,
         0.044194165617227554, 0.031249994412064552, 0.022097082808613777, 0.015624997206032276,
         0.011048540472984314, 0.007812498137354851, 0.005524270236492157, 0.0039062488358467817,
         0.8408964276313782, 0.5946035981178284, 0.4204482436180115, 0.2973017990589142],
}


@pytest.mark.parametrize("n", sorted(REFERENCE_GET_SLOPES))
def test_slopes_match_reference_get_slopes(n):
    got = alibi_slopes(n)
    assert got.dtype == np.float64 and got.shape == (n,)
    # The reference multiplies start * ratio**i and drifts by a few ulps (0.5000000000000001);
    # minipos computes 2^(-e) directly.
    np.testing.assert_allclose(got, REFERENCE_GET_SLOPES[n], rtol=4e-15)


@pytest.mark.parametrize("n", sorted(BLOOM_SLOPES))
def test_slopes_match_bloom(n):
    np.testing.assert_allclose(alibi_slopes(n), BLOOM_SLOPES[n], rtol=3e-7)


def test_non_power_of_two_rule_by_hand():
    # 6 heads: closest lower power of two 4 -> 2^(-2h), h = 1..4; then 8-head slopes
    # 2^(-h), h = 1..8, every other one ([0::2] -> 2^-1, 2^-3, ...), first 6 - 4 = 2 of them.
    np.testing.assert_array_equal(alibi_slopes(6), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3])


def test_slopes_live_bloom():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    for n in range(1, 41):
        ref = build_alibi_tensor(torch.ones(1, 2, dtype=torch.long), n, torch.float32)[:, 0, 1]
        np.testing.assert_allclose(alibi_slopes(n), ref.double().numpy(), rtol=1e-6)


# --- biases -------------------------------------------------------------------------------

def test_bias_by_hand():
    # b[h, i, j] = -m_h (i - j), slopes 1/2 and 1/4, positions 0, 1, 2.
    expected = [
        [[0.0, 0.5, 1.0], [-0.5, 0.0, 0.5], [-1.0, -0.5, 0.0]],
        [[0.0, 0.25, 0.5], [-0.25, 0.0, 0.25], [-0.5, -0.25, 0.0]],
    ]
    got = alibi_bias([0.5, 0.25], 3, 3)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, expected)


def test_symmetric_bias_of_a_cached_step_by_hand():
    # Queries 2, 3 over keys 0..3, slope 1/2: -m |i - j|.
    expected = [[[-1.0, -0.5, 0.0, -0.5], [-1.5, -1.0, -0.5, 0.0]]]
    np.testing.assert_array_equal(alibi_bias([0.5], [2, 3], 4, symmetric=True), expected)
    causal = [[[-1.0, -0.5, 0.0, 0.5], [-1.5, -1.0, -0.5, 0.0]]]
    np.testing.assert_array_equal(alibi_bias([0.5], [2, 3], 4), causal)


def test_paper_figure_row():
    # §3 / Fig. 3: the last query of a 5-token causal window sees m * [-4, -3, -2, -1, 0].
    got = alibi_bias(alibi_slopes(8), 5, 5)[0, 4]
    np.testing.assert_array_equal(got, [-2.0, -1.5, -1.0, -0.5, 0.0])


def test_key_only_by_hand_and_dtype():
    np.testing.assert_array_equal(alibi_bias_key_only([0.5, 0.25], 3), [[[0.0, 0.5, 1.0]], [[0.0, 0.25, 0.5]]])
    assert alibi_bias_key_only(np.float32([0.5]), 3).dtype == np.float32
    assert alibi_bias(np.float32([0.5]), 2, 2).dtype == np.float32
    assert alibi_bias(np.array([1, 2]), 2, 2).dtype == np.float64


def test_key_only_matches_bloom_with_left_padding():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    mask = np.array([[0, 0, 1, 1, 1]])
    ref = build_alibi_tensor(torch.tensor(mask), 12, torch.float32).double().numpy()  # (H, 1, S)
    positions = (np.cumsum(mask[0]) - 1) * mask[0]                                  # [0, 0, 0, 1, 2]
    np.testing.assert_allclose(alibi_bias_key_only(alibi_slopes(12), positions), ref, rtol=1e-6)


def _weights(logits, bias, mask):
    return softmax(np.where(mask, logits + bias, -np.inf))


@settings(max_examples=30, deadline=None)
@given(H=st.integers(1, 6), T=st.integers(1, 7), extra=st.integers(0, 3), seed=st.integers(0, 2**16))
def test_key_only_equals_alibi_after_softmax(H, T, extra, seed):
    S = T + extra
    rng = np.random.default_rng(seed)
    logits = rng.normal(size=(H, T, S))
    m = alibi_slopes(H)
    q, k = np.arange(S - T, S), np.arange(S)
    key_only, full, dist = alibi_bias_key_only(m, k), alibi_bias(m, q, k), alibi_bias(m, q, k, symmetric=True)
    everything = np.ones((T, S), dtype=bool)
    # -m (i - j) and +m j differ by m i, constant per row: equal weights with or without a mask.
    np.testing.assert_allclose(_weights(logits, key_only, everything), _weights(logits, full, everything), atol=1e-12)
    # Under the causal mask all three agree (j <= i, so |i - j| = i - j).
    causal = causal_mask(T, S)
    np.testing.assert_allclose(_weights(logits, key_only, causal), _weights(logits, dist, causal), atol=1e-12)


def test_key_only_differs_from_distance_penalty_without_mask():
    H, T = 4, 5
    logits = np.random.default_rng(0).normal(size=(H, T, T))
    m = alibi_slopes(H)
    key_only, dist = alibi_bias_key_only(m, T), alibi_bias(m, T, T, symmetric=True)
    everything = np.ones((T, T), dtype=bool)
    assert not np.allclose(_weights(logits, key_only, everything), _weights(logits, dist, everything), atol=1e-3)
    assert not np.allclose(key_only, alibi_bias(m, T, T))  # the logits themselves never agree


def test_key_only_in_attention_layer_seam():
    rng = np.random.default_rng(1)
    H, T, D = 3, 6, 4
    q, k, v = rng.normal(size=(3, H, T, D))
    m = alibi_slopes(H)
    mask = causal_mask(T, T)
    a = attention(q, k, v, bias=np.broadcast_to(alibi_bias_key_only(m, T), (H, T, T)), mask=mask)
    b = attention(q, k, v, bias=alibi_bias(m, T, T, symmetric=True), mask=mask)
    np.testing.assert_allclose(a, b, atol=1e-12)


# --- errors -------------------------------------------------------------------------------

def test_errors():
    with pytest.raises(ValueError, match="num_heads"):
        alibi_slopes(0)
    with pytest.raises(TypeError, match="num_heads"):
        alibi_slopes(8.0)
    with pytest.raises(ValueError, match=r"slopes must have shape \(H,\)"):
        alibi_bias(np.ones((2, 2)), 3, 3)
    with pytest.raises(ValueError, match="slopes must be finite"):
        alibi_bias([0.5, np.nan], 3, 3)
    with pytest.raises(ValueError, match="slopes must be finite"):
        alibi_bias_key_only([np.inf], 3)
    with pytest.raises(ValueError, match="q_positions"):
        alibi_bias([0.5], [-1, 0], 2)
    with pytest.raises(ValueError, match="k_positions must hold integers"):
        alibi_bias([0.5], 2, np.array([0.0, 0.5]))
    with pytest.raises(ValueError, match="k_positions"):
        alibi_bias_key_only([0.5], np.zeros((2, 2), dtype=int))


@settings(max_examples=80, deadline=None)
@given(i=st.lists(st.integers(0, 80), min_size=1, max_size=9), j=st.lists(st.integers(0, 80), min_size=1, max_size=9),
       symmetric=st.booleans())
def test_bias_bound_is_never_below_the_bias(i, j, symmetric):
    # blockwise_attention skips heads by this bound: it must hold for any positions, sorted or not.
    slopes = alibi_slopes(4)
    bias = alibi_bias(slopes, i, j, symmetric=symmetric)                   # (H, tq, tk)
    bound = alibi_bias_bound(slopes, i, j, symmetric=symmetric)           # (H, 1, 1)
    assert bound.shape == (4, 1, 1)
    assert np.all(bias.max(axis=(1, 2), keepdims=True) <= bound)


def test_bias_bound_hand_worked():
    # Queries 10..11, keys 0..3: least i - j = 10 - 3 = 7, and so is the least |i - j|; slopes of
    # H = 2 are 1/16 and 1/256 -> bounds -7/16 and -7/256. Overlapping ranges bound |i - j| by 0;
    # an empty block has no bias at all.
    slopes = alibi_slopes(2)
    for symmetric in (False, True):
        np.testing.assert_allclose(alibi_bias_bound(slopes, [10, 11], [0, 1, 2, 3], symmetric=symmetric).ravel(),
                                   [-7 / 16, -7 / 256])
    np.testing.assert_array_equal(alibi_bias_bound(slopes, [2, 5], [4, 9], symmetric=True).ravel(), [0.0, 0.0])
    np.testing.assert_allclose(alibi_bias_bound(slopes, [2, 5], [4, 9]).ravel(), [7 / 16, 7 / 256])
    assert np.all(np.isneginf(alibi_bias_bound(slopes, [], [1, 2])))
