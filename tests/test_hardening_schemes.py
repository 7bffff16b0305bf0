"""Bad input to the scheme modules (sinusoidal, xpos, transformer_xl, deberta, rope_scaling).

Each case was found by feeding every public function wrong types, NaN/inf, extreme integers,
empty or mismatched arrays and low-precision dtypes. The expected behaviour is worked out by hand
in the comments: a clear ValueError/TypeError naming the argument, or the exact result.
Memory checks run against a small pretend machine (``MAX_BYTES`` patched), so they are cheap.
"""

import math

import numpy as np
import pytest

import minipos._checks as checks

INT64_MIN, INT64_MAX = np.iinfo(np.int64).min, np.iinfo(np.int64).max


@pytest.fixture
def small_machine(monkeypatch):
    """A machine with 1 MiB of memory: every output above it must be refused before allocation."""
    monkeypatch.setattr(checks, "MAX_BYTES", 1 << 20)


# --- sinusoidal ----------------------------------------------------------------------------

from minipos.sinusoidal import absolute_embedding, learned_table, sinusoidal_frequencies, sinusoidal_table  # noqa: E402


@pytest.mark.parametrize("call, exc, match", [
    # tensor2tensor's last frequency is 1/base = 1e300; 1e9 * 1e300 overflows, and sin(inf) is NaN.
    (lambda: sinusoidal_table(np.array([10 ** 9]), 4, base=1e-300, layout="tensor2tensor"), ValueError,
     "positions and base"),
    # 1 / 1e-320 is inf in float64.
    (lambda: sinusoidal_frequencies(8, base=1e-320, layout="tensor2tensor"), ValueError, "^base must"),
    # 2**60 is not exact in float64 once turned into an angle.
    (lambda: sinusoidal_table(np.array([2 ** 60]), 4), ValueError, r"positions must lie within \+-2\*\*53"),
    (lambda: learned_table(2, 2, dtype="foo"), TypeError, "^dtype must be a floating dtype"),
    # normal(0, 1e6) draws beyond float16's largest value 65504.
    (lambda: learned_table(4, 4, std=1e6, dtype=np.float16), ValueError, "^std"),
    # a subnormal std draws subnormal values.
    (lambda: learned_table(4, 4, std=1e-320), ValueError, "^std must be 0 or a normal"),
    # 10**9 x 10**6 float64 is 7.45e6 GiB: refused before anything is built.
    (lambda: sinusoidal_table(10 ** 9, 10 ** 6), ValueError, "^positions and dim"),
    (lambda: learned_table(10 ** 9, 10 ** 6), ValueError, "^num_positions and dim"),
])
def test_sinusoidal_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_sinusoidal_outputs_are_checked_against_memory_first(small_machine):
    # (10**5, 64) float64 is 51 MB, more than the 1 MiB machine; the positions alone (0.8 MB) fit.
    with pytest.raises(ValueError, match="^positions and dim asks"):
        sinusoidal_table(10 ** 5, 64)
    # arange(10**6) would need 8 MB; a 4-row table has no row 999999 anyway, and says so first.
    with pytest.raises(ValueError, match="cannot extrapolate"):
        absolute_embedding(np.zeros((4, 3)), 10 ** 6)


def test_sinusoidal_extreme_but_valid_input_still_works():
    # base 1e-300 in the interleaved layout, dim 4: w = (1, 1e150); position 2 gives angles (2, 2e150).
    table = sinusoidal_table([2], 4, base=1e-300)
    np.testing.assert_allclose(table, [[math.sin(2), math.cos(2), math.sin(2e150), math.cos(2e150)]])
    assert sinusoidal_table(0, 6).shape == (0, 6)
    assert learned_table(2, 3, std=0.0).tolist() == [[0.0] * 3] * 2


# --- xpos ----------------------------------------------------------------------------------

from minipos.xpos import apply_xpos, xpos_scale  # noqa: E402


@pytest.mark.parametrize("call, exc, match", [
    # Queries: zeta_0 = 2/7 and (2/7)^(40000/512) = e^(-97.9) = 3e-43, below float32's smallest normal
    # 1.18e-38 (a subnormal with few significant bits); keys (2/7)^(-78.1) = 3e42 overflow float32.
    (lambda: apply_xpos(np.ones((1, 8), np.float32), [40000]), ValueError, "scale_offset"),
    (lambda: apply_xpos(np.ones((1, 8), np.float32), [40000], downscale=True), ValueError, "scale_offset"),
    # float16: (2/7)^(5000/512) = 4.8e-6, below float16's smallest normal 6.1e-5.
    (lambda: apply_xpos(np.ones((1, 8), np.float16), [5000]), ValueError, "float16"),
    (lambda: apply_xpos(np.ones((1, 8)), [1], scale_offset=2 ** 70), ValueError, "scale_offset"),
    (lambda: apply_xpos(np.ones((1, 8)), [1], scale_base=1e-300), ValueError, "scale_base"),
    (lambda: apply_xpos(np.ones((2, 0)), 2), ValueError, "^x must have an even head dim"),
    (lambda: apply_xpos(np.ones((1, 8)), [1], downscale="no"), TypeError, "^downscale must be True or False"),
    # (1e38, 0) rotated by -710 rad (cos = 1 - 2e-9) is still 1e38; pair 0's scale (2/7)^(-710/512) = 5.68
    # takes it to 5.7e38, beyond float32's 3.4e38.
    (lambda: apply_xpos(np.eye(1, 8, dtype=np.float32) * 1e38, [-710]), ValueError, "^x rotated and scaled"),
])
def test_xpos_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_xpos_position_count_is_checked_before_it_is_built(small_machine):
    # arange(10**9) would need 8 GB; x has 5 positions, which the error says first.
    with pytest.raises(ValueError, match="^positions must have length 5"):
        apply_xpos(np.ones((5, 8)), 10 ** 9)
    # (10**5, D/2 = 4) float64 is 3.2 MB, more than the 1 MiB machine.
    with pytest.raises(ValueError, match="^positions and dim asks"):
        xpos_scale(10 ** 5, 8)


def test_xpos_numpy_bool_flag_and_valid_extremes():
    x = np.ones((1, 2))
    np.testing.assert_array_equal(apply_xpos(x, [3], downscale=np.bool_(True)), apply_xpos(x, [3], downscale=True))
    # D = 2, float32, query at 30000: (2/7)^(30000/512) = e^(-73.4) = 1.3e-32 is a normal float32; the pair
    # (1, 1) rotated by 30000 rad is (cos - sin, sin + cos).
    n, s = 30000, (2 / 7) ** (30000 / 512)
    out = apply_xpos(np.ones((1, 2), np.float32), [n])
    assert out.dtype == np.float32
    np.testing.assert_allclose(out[0], [s * (math.cos(n) - math.sin(n)), s * (math.sin(n) + math.cos(n))], rtol=1e-5)
    # an offset far from 0, positions near it: only the exponent n - scale_offset = -6 changes, so the ratio
    # to offset 2**40 (exponent 0, scale 1) is zeta_i^(-6/512) per pair, zeta = (3.2, 5.2, 7.2, 9.2) / 11.2.
    p = 2 ** 40
    ratio = apply_xpos(np.ones((1, 8)), [p], scale_offset=p + 6) / apply_xpos(np.ones((1, 8)), [p], scale_offset=p)
    zeta = np.array([3.2, 5.2, 7.2, 9.2]) / 11.2
    np.testing.assert_allclose(ratio[0], np.repeat(zeta ** (-6 / 512), 2), rtol=1e-12)
    assert apply_xpos(np.ones((0, 8)), 0).shape == (0, 8)


# --- transformer_xl ------------------------------------------------------------------------

from minipos.transformer_xl import (  # noqa: E402
    position_scores,
    relative_embeddings,
    xl_position_logits,
    xl_scores,
    xl_terms,
)


def _xl(dtype=np.float64, scale=1.0):
    rng = np.random.default_rng(0)
    shapes = ((1, 2, 3, 4), (1, 2, 5, 4), (2, 5, 4), (2, 4), (2, 4), (6, 8))  # q, k, r, u, v, w_r
    return tuple((rng.standard_normal(s) * scale).astype(dtype) for s in shapes)


@pytest.mark.parametrize("call, exc, match", [
    # (2**62 + 2**61) - (-2**62) = 1.25 * 2**63 does not fit int64 (it wrapped to a negative distance).
    (lambda q, k, r, u, v, w_r: xl_position_logits(q[..., :1, :], v, w_r, [2 ** 62 + 2 ** 61], [-(2 ** 62)]),
     ValueError, "q_positions and k_positions give distances i - j beyond int64"),
    # a distance of 2**60 is not exact in float64 (the sinusoid would be taken at a rounded distance).
    (lambda q, k, r, u, v, w_r: xl_position_logits(q[..., :1, :], v, w_r, [2 ** 60], [0]), ValueError,
     r"within \+-2\*\*53"),
    (lambda q, k, r, u, v, w_r: xl_scores(q, None, r, u, v), TypeError, "^k must be a real numeric array"),
    # d_model = 0: no [sin | cos] table can be built.
    (lambda q, k, r, u, v, w_r: xl_terms(q, k, np.zeros((0, 8)), u, v), ValueError, "^w_r must have shape"),
    # the default puts the 3 queries last among the keys: impossible with 2 keys.
    (lambda q, k, r, u, v, w_r: xl_terms(q, k[..., :2, :], w_r, u, v), ValueError, "fewer keys"),
    # v's shape is read off q, and the message says so.
    (lambda q, k, r, u, v, w_r: xl_position_logits(q[..., :3], v, w_r[:, :6], [0, 1, 2], [0]), ValueError,
     r"^v must have shape \(H, D\) = \(2, 3\) to match q"),
    # 2**63 keys cannot fit in memory (it returned an empty table).
    (lambda q, k, r, u, v, w_r: relative_embeddings(2 ** 63, 2), ValueError, "^k_len and d_model"),
])
def test_transformer_xl_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call(*_xl())


@pytest.mark.parametrize("call", [
    lambda q, k, r, u, v, w_r: xl_scores(q, k, r, u, v),
    lambda q, k, r, u, v, w_r: position_scores(q, r, v),
    lambda q, k, r, u, v, w_r: xl_terms(q, k, w_r, u, v),
    lambda q, k, r, u, v, w_r: xl_position_logits(q, v, w_r, [2, 3, 4], 5),
])
def test_transformer_xl_scores_that_overflow_float32_raise(call):
    # entries ~1e20: every product q . k, (q + v) . r, (q + v) . W_R R ~ 1e40 is beyond float32's 3.4e38
    # (they returned inf).
    with pytest.raises(ValueError, match="overflows float32"):
        call(*_xl(np.float32, 1e20))


def test_transformer_xl_clamp_len_beyond_every_distance_changes_nothing():
    # clamp_len caps |i - j|; 2**70 exceeds every distance (it raised OverflowError).
    np.testing.assert_array_equal(relative_embeddings(4, 8, clamp_len=2 ** 70), relative_embeddings(4, 8))
    q, k, r, u, v, w_r = _xl()
    np.testing.assert_array_equal(xl_position_logits(q, v, w_r, [2, 3, 4], 5, clamp_len=2 ** 70),
                                  xl_position_logits(q, v, w_r, [2, 3, 4], 5))
    # a distance of 2**60 capped at 3 is distance 3.
    np.testing.assert_array_equal(xl_position_logits(q[..., :1, :], v, w_r, [2 ** 60], [0], clamp_len=3),
                                  xl_position_logits(q[..., :1, :], v, w_r, [3], [0]))


def test_transformer_xl_sizes_are_checked_before_building(small_machine):
    q, k, r, u, v, w_r = _xl()
    # arange(10**9) would need 8 GB; q has 3 queries, which the error says first.
    with pytest.raises(ValueError, match="^q_positions must have length 3"):
        xl_position_logits(q, v, w_r, 10 ** 9, 5)
    # 10**5 keys: the output (1, 2, 3, 10**5) float64 is 4.8 MB, more than the 1 MiB machine.
    with pytest.raises(ValueError, match="^k_positions asks"):
        xl_position_logits(q, v, w_r, [0, 1, 2], 10 ** 5)


# --- deberta -------------------------------------------------------------------------------

from minipos.deberta import (  # noqa: E402
    build_relative_position,
    c2p_term,
    disentangled_scores,
    disentangled_scores_definitional,
    make_log_bucket_position,
    parse_pos_att_type,
    relative_index,
    relative_positions,
    spans_from_config,
)


def _deb(dtype=np.float64, scale=1.0):
    rng = np.random.default_rng(1)
    shapes = ((1, 2, 3, 4), (1, 2, 4, 4), (2, 8, 4), (2, 8, 4))  # q, k, pos_key, pos_query (att_span 4)
    return tuple((rng.standard_normal(s) * scale).astype(dtype) for s in shapes)


REL = np.subtract.outer(np.arange(3), np.arange(4))  # (T, S) = (3, 4), i - j


@pytest.mark.parametrize("call, exc, match", [
    # |-2**63| does not fit int64: np.abs gave -2**63 back, and so did the bucket.
    (lambda: make_log_bucket_position([INT64_MIN], 256, 512), ValueError, "^relative_pos"),
    (lambda: relative_index([1], 2 ** 70), ValueError, r"^att_span must be <= 2\*\*62"),
    # config errors name the config keys, not the bucket_size / max_position they become.
    (lambda: spans_from_config(position_buckets=1), ValueError, "^position_buckets must be >= 2"),
    (lambda: spans_from_config(position_buckets=256, max_relative_positions=3), ValueError,
     r"^max_relative_positions must be > position_buckets // 2 \+ 1 = 129"),
    (lambda: spans_from_config(position_buckets=256, max_relative_positions=-1, max_position_embeddings=100),
     ValueError, r"^max_position_embeddings must be > .* \(used since max_relative_positions < 1\)"),
    (lambda: spans_from_config(max_relative_positions=16, max_position_embeddings="512"), TypeError,
     "^max_position_embeddings"),
    (lambda: spans_from_config(max_relative_positions=2 ** 63), ValueError, "^max_relative_positions must be <="),
    (lambda: parse_pos_att_type(None), TypeError, "^pos_att_type must be a sequence"),
    (lambda: parse_pos_att_type(3), TypeError, "^pos_att_type must be a sequence"),
    # a relative_pos with 3 rows against q with 4 queries: the message says where T = 4 came from.
    (lambda: c2p_term(np.ones((2, 4, 4)), np.ones((2, 8, 4)), REL, 4), ValueError, r"T from q of shape \(2, 4, 4\)"),
])
def test_deberta_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_deberta_layer_names_the_config_keys():
    from minipos.layer import DeBERTa

    with pytest.raises(ValueError, match="^position_buckets"):
        DeBERTa(position_buckets=1)
    with pytest.raises(ValueError, match="^max_relative_positions"):
        DeBERTa(max_relative_positions=3)
    with pytest.raises(TypeError, match="^pos_att_type"):
        DeBERTa(pos_att_type=None)


def test_deberta_indices_never_wrap():
    # delta = clip(r + k, 0, 2k - 1) with k = 4: r = int64 max -> 7 (r + k wrapped to a negative -> 0),
    # r = int64 min -> 0, r = -1 -> 3.
    assert relative_index([INT64_MAX, INT64_MIN, -1], 4).tolist() == [7, 0, 3]
    # the paper's p2c index clip(-r + k, 0, 2k - 1): r = int64 min gives 2k - 1 = 7, exactly as r = -10**6
    # does (negating int64 min wrapped back to int64 min, giving 0).
    q, k, pk, pq = _deb()
    far, near = np.full((3, 4), INT64_MIN), np.full((3, 4), -10 ** 6)
    kw = dict(att_span=4, pos_att_type=("p2c",), p2c_convention="paper")
    np.testing.assert_array_equal(disentangled_scores_definitional(q, k, pk, pq, far, **kw),
                                  disentangled_scores_definitional(q, k, pk, pq, near, **kw))


def test_deberta_empty_and_overflowing_scores():
    q, k, pk, pq = _deb()
    # no batch: an empty result, not an IndexError
    assert c2p_term(q[:0], pk, REL, 4).shape == (0, 2, 3, 4)
    # entries ~1e20 in float32: q . k ~ 1e40 overflows float32 (it returned inf).
    q, k, pk, pq = _deb(np.float32, 1e20)
    with pytest.raises(ValueError, match="overflows float32"):
        disentangled_scores(q, k, pk, pq, REL, att_span=4)
    with pytest.raises(ValueError, match="overflows float32"):
        c2p_term(q, pk, REL, 4)


def test_deberta_sizes_are_checked_before_building(small_machine):
    # (2000, 2000) int64 is 32 MB, more than the 1 MiB machine (the positions alone, 16 kB, fit).
    with pytest.raises(ValueError, match="^q_len and k_len asks"):
        build_relative_position(2000, 2000)
    with pytest.raises(ValueError, match="^q_positions and k_positions asks"):
        relative_positions(2000, 2000)


# --- rope_scaling --------------------------------------------------------------------------

from minipos import rope_scaling as rs  # noqa: E402

LONG = dict(long_factor=[1.0] * 4, original_max_position_embeddings=16, max_position_embeddings=64, seq_len=20)
YARN = dict(factor=4.0, original_max_position_embeddings=64)


@pytest.mark.parametrize("call, exc, match", [
    # w_0 / 1e-320 = 1 / 1e-320 is inf in float64.
    (lambda: rs.longrope(8, short_factor=[1e-320, 1.0, 1.0, 1.0], **LONG), ValueError, "short_factor"),
    # 1e300^(8/6) = 1e400 is beyond float64 (Python's ** raised OverflowError).
    (lambda: rs.ntk(8, factor=1e300), ValueError, "factor"),
    (lambda: rs.dynamic(8, factor=1e300, original_max_position_embeddings=16, seq_len=2 ** 40), ValueError,
     "factor"),
    # w_3 / s = 10000^(-3/4) / 1e308 = 1e-311: subnormal, and 2 pi / w = inf.
    (lambda: rs.linear(8, factor=1e308), ValueError, "factor"),
    # L / (2 pi 1e-320) = 1e321 is inf: the ramp's end is at pair index inf (it raised OverflowError).
    (lambda: rs.yarn(8, beta_slow=1e-320, **YARN), ValueError, "^beta_slow"),
    # the logits scale by the square: (1e-200)^2 = 1e-400 is 0 in float64.
    (lambda: rs.yarn(8, attention_factor=1e-200, **YARN), ValueError, "attention_factor"),
    # mscale ratio (0.1 * 1e308 * ln 4 + 1) / (0.1 * 1e-300 * ln 4 + 1) = 1.4e307; its square is inf.
    (lambda: rs.yarn(8, mscale=1e308, mscale_all_dim=1e-300, **YARN), ValueError, "mscale"),
    (lambda: rs.dynamic(8, factor=2.0, original_max_position_embeddings=16, seq_len=2 ** 70), ValueError,
     r"^seq_len must be <= 2\*\*53"),
    (lambda: rs.yarn(8, truncate="no", **YARN), TypeError, "^truncate must be True or False"),
    # 8 vectors of 2**39 float64 are 32 TiB: refused at once (it died in MemoryError).
    (lambda: rs.linear(2 ** 40, factor=2.0), ValueError, "^dim"),
    # rope_theta reaches these functions as base: the message gives both names.
    (lambda: rs.linear(8, base=1.0, factor=2.0), ValueError, r"^base must be > 1 \(a checkpoint's rope_theta\)"),
])
def test_rope_scaling_bad_input(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


def test_rope_scaling_numpy_bool_and_extreme_but_valid_input():
    np.testing.assert_array_equal(rs.yarn(8, truncate=np.bool_(False), **YARN)[0],
                                  rs.yarn(8, truncate=False, **YARN)[0])
    # base 1e300, dim 4: w = (1, 1e-150); linear factor 2 halves both.
    np.testing.assert_allclose(rs.linear(4, base=1e300, factor=2.0)[0], [0.5, 0.5e-150], rtol=1e-15)
