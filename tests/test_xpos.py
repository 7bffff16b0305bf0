"""xPos against a transcription of torchscale's XPOS, hand-worked values and the relative property."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos.xpos import apply_xpos, xpos_scale, xpos_zeta

# --- A line-by-line NumPy transcription of ``XPOS`` from microsoft/torchscale,
# torchscale/component/xpos_relative_position.py (commit 776b070d68aef2aca447dc3e1adb64682fbec126),
# the module torchscale's MultiheadAttention imports. x is (batch * heads, length, head_dim).


def ts_fixed_pos_embedding(x):
    seq_len, dim = x.shape
    inv_freq = 1.0 / (10000 ** (np.arange(0, dim) / dim))
    sinusoid_inp = np.einsum("i , j -> i j", np.arange(0, seq_len, dtype=np.float64), inv_freq)
    return np.sin(sinusoid_inp), np.cos(sinusoid_inp)


def ts_rotate_every_two(x):
    x1 = x[:, :, ::2]
    x2 = x[:, :, 1::2]
    x = np.stack((-x2, x1), axis=-1)
    return x.reshape(*x.shape[:-2], -1)  # flatten(-2)


def ts_duplicate_interleave(m):
    dim0 = m.shape[0]
    m = m.reshape(-1, 1)
    m = np.tile(m, (1, 2))  # repeat(1, 2)
    return m.reshape(dim0, -1)


def ts_apply_rotary_pos_emb(x, sin, cos, scale=1):
    sin, cos = map(lambda t: ts_duplicate_interleave(t * scale), (sin, cos))
    return (x * cos) + (ts_rotate_every_two(x) * sin)


def ts_xpos(x, head_dim, scale_base=512, offset=0, downscale=False):
    scale_vec = (np.arange(0, head_dim, 2) + 0.4 * head_dim) / (1.4 * head_dim)  # XPOS.__init__
    length = x.shape[1]
    min_pos = -(length + offset) // 2
    max_pos = length + offset + min_pos
    scale = scale_vec ** (np.arange(min_pos, max_pos, 1) / scale_base)[:, None]
    sin, cos = ts_fixed_pos_embedding(scale)
    if scale.shape[0] > length:
        scale = scale[-length:]
        sin = sin[-length:]
        cos = cos[-length:]
    if downscale:
        scale = 1 / scale
    return ts_apply_rotary_pos_emb(x, sin, cos, scale)


def centre(total):
    """torchscale's exponent shift: -min_pos = ceil(total / 2)."""
    return (total + 1) // 2


@pytest.mark.parametrize("L, D, scale_base", [(7, 8, 512), (8, 16, 512), (5, 4, 3.0), (1, 2, 512)])
@pytest.mark.parametrize("downscale", [False, True])
def test_matches_torchscale_on_a_whole_sequence(L, D, scale_base, downscale):
    x = np.random.default_rng(L * D).standard_normal((3, L, D))
    expected = ts_xpos(x, D, scale_base, offset=0, downscale=downscale)
    got = apply_xpos(x, np.arange(L), scale_base=scale_base, downscale=downscale, scale_offset=centre(L))
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("S, T", [(9, 1), (10, 1), (8, 3), (600, 1)])
def test_matches_torchscale_with_a_cache(S, T):
    # torchscale decoding: keys over all S positions with offset 0, the T new queries with
    # offset S - T (its MultiheadAttention passes offset = src_len - 1 for one new token).
    rng = np.random.default_rng(S)
    D, offset = 16, S - T
    q, k = rng.standard_normal((2, T, D)), rng.standard_normal((2, S, D))
    c = centre(S)
    got_q = apply_xpos(q, np.arange(offset, S), scale_offset=c)
    got_k = apply_xpos(k, np.arange(S), scale_offset=c, downscale=True)
    np.testing.assert_allclose(got_q, ts_xpos(q, D, offset=offset), rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(got_k, ts_xpos(k, D, downscale=True), rtol=1e-11, atol=1e-12)
    # The centring cancels in the scores: the default (no shift) gives torchscale's q.k.
    ours = apply_xpos(q, np.arange(offset, S)) @ np.swapaxes(apply_xpos(k, S, downscale=True), -1, -2)
    theirs = ts_xpos(q, D, offset=offset) @ np.swapaxes(ts_xpos(k, D, downscale=True), -1, -2)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


# --- hand-worked values


def test_zeta_and_scale_hand_worked():
    # D = 4: zeta = [(0 + 1.6) / 5.6, (2 + 1.6) / 5.6] = [2/7, 9/14].
    np.testing.assert_allclose(xpos_zeta(4), [2 / 7, 9 / 14], rtol=1e-15)
    got = xpos_scale(np.array([0, 512, -512, 1024, 256]), 4)
    expected = [[1, 1], [2 / 7, 9 / 14], [7 / 2, 14 / 9], [4 / 49, 81 / 196],
                [math.sqrt(2 / 7), math.sqrt(9 / 14)]]
    np.testing.assert_allclose(got, expected, rtol=1e-14)
    assert got.dtype == np.float64 and got.shape == (5, 2)


def test_apply_xpos_hand_worked():
    # D = 4, base 10000: w = [1, 0.01]. At n = 512 = scale_base the query scale is zeta itself,
    # so pair 0 of (1, 0) becomes (2/7)(cos 512, sin 512) and pair 1 becomes (9/14)(cos 5.12, sin 5.12).
    q = np.array([[1.0, 0.0, 1.0, 0.0]])
    got = apply_xpos(q, [512])
    expected = [[2 / 7 * math.cos(512), 2 / 7 * math.sin(512),
                 9 / 14 * math.cos(5.12), 9 / 14 * math.sin(5.12)]]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # The key at n = 512 is divided instead: (7/2, 14/9).
    got = apply_xpos(q, [512], downscale=True)
    expected = [[3.5 * math.cos(512), 3.5 * math.sin(512), 14 / 9 * math.cos(5.12), 14 / 9 * math.sin(5.12)]]
    np.testing.assert_allclose(got, expected, rtol=1e-12)
    # A key at 0 is unchanged; the score with the query at 512 is a rotated, decayed sum.
    k0 = apply_xpos(q, [0], downscale=True)
    np.testing.assert_allclose(k0, q, rtol=0, atol=0)
    score = (apply_xpos(q, [512]) @ k0.T).item()
    assert score == pytest.approx(2 / 7 * math.cos(512) + 9 / 14 * math.cos(5.12), rel=1e-12)


def test_float32_stays_float32():
    x = np.random.default_rng(0).standard_normal((2, 5, 8))
    got = apply_xpos(x.astype(np.float32), np.arange(5), downscale=True)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, apply_xpos(x, np.arange(5), downscale=True), rtol=1e-5, atol=1e-6)


# --- the relative property


@settings(max_examples=60, deadline=None)
@given(st.sampled_from([2, 4, 8, 16]), st.integers(0, 3000), st.integers(0, 3000), st.integers(-1000, 1000),
       st.integers(0, 2 ** 32 - 1), st.sampled_from([64, 512]))
def test_scores_depend_only_on_the_offset(D, n, m, shift, seed, scale_base):
    # <zeta^(n/g) R(n) q, zeta^(-m/g) R(m) k> = sum_i zeta_i^((n-m)/g) (...): shifting both
    # positions (or the common scale_offset) leaves every score unchanged.
    rng = np.random.default_rng(seed)
    q, k = rng.standard_normal((1, D)), rng.standard_normal((1, D))

    def score(n, m, offset=0):
        qn = apply_xpos(q, [n], scale_base=scale_base, scale_offset=offset)
        km = apply_xpos(k, [m], scale_base=scale_base, scale_offset=offset, downscale=True)
        return (qn @ km.T).item()

    # Tolerance: 1e-9 of sum_i |q_i||k_i| zeta_i^((n-m)/g), the largest the score can be.
    qn, kn = np.hypot(q[0, 0::2], q[0, 1::2]), np.hypot(k[0, 0::2], k[0, 1::2])
    tol = 1e-9 * np.sum(qn * kn * xpos_zeta(D) ** ((n - m) / scale_base))
    ref = score(n, m)
    assert abs(score(n + abs(shift), m + abs(shift)) - ref) <= tol
    assert abs(score(n, m, offset=shift) - ref) <= tol


def test_scores_decay_with_distance_for_aligned_vectors():
    # D = 2, q = k = (1, 0), query d after the key: the score is zeta_0^(d/g) cos(d w_0), with
    # zeta_0 = 2/7 and w_0 = 1, i.e. RoPE's cos(d) under a decaying envelope.
    q = np.array([[1.0, 0.0]])
    for d in (0, 1, 100, 1000):
        s = (apply_xpos(q, [d + 5]) @ apply_xpos(q, [5], downscale=True).T).item()
        assert s == pytest.approx((2 / 7) ** (d / 512) * math.cos(d), rel=1e-9, abs=1e-12)


# --- errors


@pytest.mark.parametrize("call, exc, match", [
    (lambda: apply_xpos(np.ones((3, 5)), np.arange(3)), ValueError, "D"),
    (lambda: apply_xpos(np.ones((3, 4)), np.arange(2)), ValueError, "positions"),
    (lambda: apply_xpos(np.ones((3, 4)), np.array([0.5, 1, 2])), ValueError, "positions"),
    (lambda: apply_xpos(np.ones(4), 1), ValueError, "x"),
    (lambda: apply_xpos(np.full((2, 4), np.nan), 2), ValueError, "x"),
    (lambda: apply_xpos(np.ones((2, 4)), 2, scale_base=0), ValueError, "scale_base"),
    (lambda: apply_xpos(np.ones((2, 4)), 2, downscale=1), TypeError, "downscale"),
    (lambda: apply_xpos(np.ones((2, 4)), 2, scale_offset=0.5), TypeError, "scale_offset"),
    (lambda: apply_xpos(np.ones((1, 4), np.float32), [100000], downscale=True), ValueError, "scale_offset"),
    (lambda: xpos_scale(3, 5), ValueError, "dim"),
    (lambda: xpos_scale(3, 4, scale_base=float("inf")), ValueError, "scale_base"),
])
def test_bad_input_raises(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_xpos_scale_refuses_to_overflow():
    # zeta_0 = 0.4 D / 1.4 D = 2/7; (2/7)^(-10^6/512) is far beyond float64 (e^2447 > 1.8e308).
    with pytest.raises(ValueError, match="positions are too far"):
        xpos_scale([-10 ** 6], 4)
