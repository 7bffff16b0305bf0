"""Tests for the precision and long-term-decay helpers of minipos.rope.

Expected values are hand-worked bit patterns, closed forms worked out by hand, or values printed
by torch 2.13.0 (CPU), whose float16 / bfloat16 multiply is the reference for "the way
frameworks compute angles".
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos.rope import PRECISIONS, AngleError, angle_error, long_term_decay, rope_inv_freq, to_bfloat16

# --- to_bfloat16: hand-worked bit patterns ---------------------------------------------------
# bfloat16 keeps 8 significant bits, so the spacing in [2^e, 2^(e+1)) is 2^(e-7).

HAND_WORKED = [
    (4097.0, 4096.0),                    # [4096, 8192): spacing 32; 4097 is 1 above 4096
    (4112.0, 4096.0),                    # 4096 + 16: a tie between 4096 (even) and 4128 (odd)
    (4113.0, 4128.0),                    # just above the tie
    (1 + 2**-8, 1.0),                    # [1, 2): spacing 2^-7; a tie, 1 has an even significand
    (1 + 3 * 2**-8, 1 + 2**-6),          # a tie between 1 + 2^-7 (odd) and 1 + 2^-6 (even)
    (1 + 2**-8 + 2**-20, 1 + 2**-7),     # just above the tie (exact in float32): rounds up
    (257.0, 256.0),                      # [256, 512): spacing 2; tie, 256 even
    (259.0, 260.0),                      # tie between 258 (odd) and 260 (even)
    (256.0, 256.0),                      # representable values are unchanged
    (-4097.0, -4096.0),                  # the sign bit is kept, rounding is symmetric
    (0.0, 0.0),
    # float32 0.1 = 0x3DCCCCCD; the dropped half 0xCCCD > 0x8000 rounds up to 0x3DCD0000
    # = (1 + 77/128) / 16 = 205/2048
    (0.1, 205 / 2048),
]


@pytest.mark.parametrize("x, want", HAND_WORKED)
def test_to_bfloat16_hand_worked(x, want):
    got = to_bfloat16(x)
    assert got.dtype == np.float32
    assert float(got) == want


def test_to_bfloat16_bit_patterns():
    # 4097 = 2^12 (1 + 2^-12): exponent 139 = 0x8B, significand bit 23 - 12 = 11 set, so
    # 0x45800800 in float32: kept 0x4580, dropped 0x0800 < 0x8000 -> 0x45800000 = 4096.
    # 1 + 3 * 2^-8 = 0x3F818000: dropped 0x8000 is a tie, kept 0x3F81 is odd -> 0x3F820000.
    x = np.array([4097.0, 1 + 3 * 2**-8], dtype=np.float32)
    assert x.view(np.uint32).tolist() == [0x45800800, 0x3F818000]
    assert to_bfloat16(x).view(np.uint32).tolist() == [0x45800000, 0x3F820000]


def test_to_bfloat16_matches_torch_printed_values():
    # printed by torch 2.13.0: torch.tensor(x, dtype=torch.float64).to(torch.bfloat16).item()
    xs = [65504.0, 3.4028234663852886e38, 1e-40, 1 + 2**-8 + 2**-40]
    want = [65536.0, math.inf, 9.183549615799121e-41, 1.0]
    # the last one: float64 -> float32 rounds to the tie 1 + 2^-8 first, then to even (1.0):
    # torch rounds through float32, and so does to_bfloat16
    np.testing.assert_array_equal(to_bfloat16(xs).astype(np.float64), want)


def test_to_bfloat16_keeps_shape_nan_and_inf():
    got = to_bfloat16(np.array([[np.nan, np.inf], [-np.inf, 3.0]]))
    assert got.shape == (2, 2) and np.isnan(got[0, 0])
    np.testing.assert_array_equal(got.ravel()[1:], [np.inf, -np.inf, 3.0])


@settings(max_examples=200, deadline=None)
@given(st.floats(min_value=-2.0**127, max_value=2.0**127, allow_nan=False, allow_infinity=False, width=32)
       .filter(lambda v: v == 0 or abs(v) >= 2.0**-120))        # normal numbers (and zero)
def test_to_bfloat16_is_the_nearest_with_8_significant_bits(x):
    y = float(to_bfloat16(x))
    _, e = math.frexp(x)                                          # |x| in [2^(e-1), 2^e)
    assert abs(y - x) <= 2.0 ** (e - 1 - 7) / 2                   # within half a bf16 spacing
    m, _ = math.frexp(y)                                          # y = m 2^e', 0.5 <= |m| < 1
    assert m * 2**8 == int(m * 2**8)                              # 8 significant bits


# --- angle_error: values printed by torch ---------------------------------------------------
# printed by torch 2.13.0 with
#   inv = torch.tensor([1.0, 0.1, 0.01, 0.001], dtype=torch.float64)
#   pos = torch.tensor([0, 1, 255, 257, 4097, 10000, 65000], dtype=torch.float64)
#   a = pos.to(dt)[:, None] * inv.to(dt)[None, :]
#   err = (a.double() - pos[:, None] * inv[None, :]).abs()
#   err.max(1).values, err.max(0).values

POS = [0, 1, 255, 257, 4097, 10000, 65000]
INV = [1.0, 0.1, 0.01, 0.001]
TORCH = {
    "float16": ([0.0, 2.441406250000555e-05, 0.0007812499999997335, 0.012500000000002842, 1.0, 0.0078125, 8.0],
                [8.0, 4.0, 0.0012499999999988631, 0.0078125],
                [0.0, 2.4292123629129914e-05, 0.0006486494499911011, 0.010583916526869408,
                 0.9498903238437247, 0.006538577515389221, 1.6858776564096694]),
    "bfloat16": ([0.0, 9.765624999999445e-05, 0.0031250000000002665, 1.0, 1.0, 16.0, 24.0],
                 [24.0, 4.0, 2.0, 0.0032500000000004192],
                 [0.0, 9.716789931815684e-05, 0.00259119001293151, 0.8590962890761399,
                  0.9498903238437247, 1.9519833795945587, 1.6858776564096694]),
    "float32": ([0.0, 1.4901161138336505e-09, 4.7683716086766026e-08, 7.629394502828291e-07,
                 1.2207031204525265e-05, 0.0, 0.0],
                [0.0, 1.2207031204525265e-05, 2.5939941394881316e-06, 1.2207031208077979e-07],
                [0.0, 1.4826717492644192e-09, 3.958003647053232e-08, 6.434454778991849e-07,
                 1.173890917716136e-05, 0.0, 0.0]),
}


@pytest.mark.parametrize("dtype", list(TORCH))
def test_angle_error_matches_torch(dtype):
    per_pos, per_freq, cos_sin = TORCH[dtype]
    err = angle_error(POS, INV)[dtype]
    assert isinstance(err, AngleError) and err.dtype == dtype
    np.testing.assert_allclose(err.angle, per_pos, rtol=1e-12, atol=0)
    np.testing.assert_allclose(err.angle_per_freq, per_freq, rtol=1e-12, atol=0)
    np.testing.assert_allclose(err.cos_sin, cos_sin, rtol=1e-9, atol=1e-15)  # torch's cos vs NumPy's
    assert err.max_angle == max(per_pos) and err.max_cos_sin == pytest.approx(max(cos_sin), rel=1e-9)


def test_bfloat16_position_4097_is_off_by_one_radian():
    # hand-worked: bf16(4097) = 4096, θ_0 = 1 is exact, so the angle is 4096 instead of 4097;
    # cos/sin error = max(|cos 4096 - cos 4097|, |sin 4096 - sin 4097|) (float64 libm values)
    err = angle_error([4097], [1.0], dtypes=("bfloat16", "float32", "float64"))
    assert err["bfloat16"].max_angle == 1.0
    want = max(abs(math.cos(4096) - math.cos(4097)), abs(math.sin(4096) - math.sin(4097)))
    assert err["bfloat16"].max_cos_sin == pytest.approx(want, rel=1e-12)
    assert err["float32"].max_angle == 0.0 and err["float64"].max_angle == 0.0  # 4097 is a float32


def test_float16_positions_beyond_65504_overflow_to_inf():
    # float16's largest finite value is 65504; 65520 rounds to inf (ties to even at the top)
    err = angle_error([65504, 65520], [1.0], dtypes="float16")["float16"]
    assert err.angle.tolist() == [0.0, math.inf] and err.cos_sin[1] == math.inf


def test_angle_error_order_and_repr():
    err = angle_error(3, [1.0, 0.5], dtypes=["float32", "bfloat16"])
    assert list(err) == ["float32", "bfloat16"]
    assert repr(err["float32"]) == "AngleError(dtype='float32', max_angle=0.0, max_cos_sin=0.0)"
    assert set(PRECISIONS) == {"float16", "bfloat16", "float32", "float64"}


# --- long_term_decay: hand-worked closed forms ----------------------------------------------
# dim = 4, base = 9: θ = (1, 9^(-1/2)) = (1, 1/3). S_1 = e^{im}, |S_1| = 1;
# |S_2| = |e^{im} + e^{im/3}| = 2 |cos(m/3)|. bound = (1 + 2|cos(m/3)|)/2,
# measured = 2 (cos m + cos(m/3)).
#   m = 0:     bound (1 + 2)/2 = 1.5,  measured 2 (1 + 1) = 4
#   m = π:     bound (1 + 1)/2 = 1,    measured 2 (-1 + 1/2) = -1
#   m = 3π/2:  bound (1 + 0)/2 = 0.5,  measured 2 (0 + 0) = 0
#   m = 3π:    bound (1 + 2)/2 = 1.5,  measured 2 (-1 - 1) = -4

def test_long_term_decay_hand_worked_dim_4():
    bound, measured = long_term_decay(4, [0.0, math.pi, 1.5 * math.pi, 3 * math.pi], base=9.0)
    np.testing.assert_allclose(bound, [1.5, 1.0, 0.5, 1.5], rtol=0, atol=1e-14)
    np.testing.assert_allclose(measured, [4.0, -1.0, 0.0, -4.0], rtol=0, atol=1e-14)


def test_long_term_decay_dim_2_is_flat():
    # one pair: S_1 = e^{im}, |S_1| = 1 for every m; measured = 2 cos m
    bound, measured = long_term_decay(2, [0, 1, 2, -7])
    np.testing.assert_allclose(bound, 1.0, rtol=1e-15)
    np.testing.assert_allclose(measured, [2.0, 2 * math.cos(1), 2 * math.cos(2), 2 * math.cos(7)], rtol=1e-14)


def test_long_term_decay_at_zero_and_shape():
    # m = 0: S_j = j, so bound = (1/(D/2)) Σ_{j=1}^{D/2} j = (D/2 + 1)/2 = 32.5 for D = 128; measured = D
    bound, measured = long_term_decay(128, np.zeros((2, 3)))
    assert bound.shape == measured.shape == (2, 3)
    np.testing.assert_allclose(bound, 32.5, rtol=1e-15)
    np.testing.assert_allclose(measured, 128.0, rtol=1e-15)


def test_long_term_decay_decays_for_dim_128():
    # RoFormer §3.4.3 / Fig. 2: the relative upper bound decays as the relative distance grows
    bound, _ = long_term_decay(128, 501)                 # int K -> distances arange(K)
    assert bound[:51].mean() > 2 * bound[400:].mean()
    assert bound[0] == bound.max()


@settings(max_examples=50, deadline=None)
@given(st.sampled_from([2, 4, 8, 64]), st.floats(-1e4, 1e4, allow_nan=False))
def test_measured_is_bounded_and_symmetric(dim, m):
    # all-ones q, k: h_i = 2 for every pair, so |score| <= 2 |S_{D/2}| <= D · bound; cos is even
    bound, measured = long_term_decay(dim, [m, -m])
    assert abs(measured[0]) <= dim * bound[0] + 1e-9
    np.testing.assert_allclose(bound[0], bound[1], rtol=1e-12)
    np.testing.assert_allclose(measured[0], measured[1], rtol=1e-12, atol=1e-12)


def test_measured_is_the_all_ones_score_of_the_rotation():
    # q^T R(m) k for q = k = 1, D = 8, with R(m) written out from rope_inv_freq (Eq. 15)
    theta = rope_inv_freq(8)
    for m in (0, 3, 250):
        c, s = np.cos(m * theta), np.sin(m * theta)
        want = sum(1 * (ci - si) + 1 * (si + ci) for ci, si in zip(c, s))  # [1 1] B [1 1]^T per pair
        assert long_term_decay(8, [m])[1][0] == pytest.approx(want, rel=1e-12)


# --- bad input -------------------------------------------------------------------------------

@pytest.mark.parametrize("call, exc, text", [
    (lambda: to_bfloat16(np.array([1 + 1j])), TypeError, "x must be a real numeric array"),
    (lambda: angle_error([1.5], [1.0]), ValueError, "positions must hold integers"),
    (lambda: angle_error([1], [[1.0]]), ValueError, "inv_freq must be 1-D"),
    (lambda: angle_error([1], [np.nan]), ValueError, "inv_freq must be finite"),
    (lambda: angle_error([], [1.0]), ValueError, "positions and inv_freq must be non-empty"),
    (lambda: angle_error([1], [1.0], dtypes="float8"), ValueError, "dtypes must be one of"),
    (lambda: angle_error([1], [1.0], dtypes=()), ValueError, "dtypes must name at least one"),
    (lambda: angle_error([1], [1.0], dtypes=16), TypeError, "dtypes must be a sequence"),
    (lambda: long_term_decay(5, [1.0]), ValueError, "dim must be even"),
    (lambda: long_term_decay(8, [np.inf]), ValueError, "distances must be finite"),
    (lambda: long_term_decay(8, -3), ValueError, "distances must be an integer >= 0"),
    (lambda: long_term_decay(8, ["a"]), TypeError, "distances must be a real numeric array"),
    (lambda: long_term_decay(8, [1.0], base=-2.0), ValueError, "base must be > 0"),
])
def test_errors_name_the_argument(call, exc, text):
    with pytest.raises(exc, match=text):
        call()
