"""RoPE scalings against HF transformers' ``modeling_rope_utils`` and hand-worked facts."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos import rope_scaling as rs

RTOL_FREQ, RTOL_ATTN = 2e-6, 1e-6


def plain(dim, base):
    """Unscaled RoPE frequencies base^(-2i/D), written out for the expectations."""
    return np.array([base ** (-2 * i / dim) for i in range(dim // 2)])


# --- values printed by transformers 5.24.0 ``ROPE_INIT_FUNCTIONS[kind](config, "cpu", seq_len=...)``
# on ``LlamaConfig(head_dim=D, max_position_embeddings=..., rope_parameters={...})``; float32
# outputs shown to 8 significant digits.
HF_PRINTED = [
    ("linear", dict(dim=8, factor=4.0),
     [0.25, 0.025, 0.0025, 0.00025], 1.0),
    ("dynamic", dict(dim=8, factor=2.0, original_max_position_embeddings=2048, seq_len=8192),
     [1.0, 0.052275795, 0.0027327589, 0.00014285714], 1.0),
    ("yarn", dict(dim=16, factor=4.0, original_max_position_embeddings=4096),
     [1.0, 0.31622776, 0.1, 0.025693506, 0.0062499996, 0.0013834966, 0.00025, 7.9056947e-05],
     1.138629436111989),
    ("yarn", dict(dim=16, factor=40.0, original_max_position_embeddings=4096, mscale=0.707, mscale_all_dim=1.0),
     [1.0, 0.31622776, 0.1, 0.023914725, 0.0051249997, 0.00084986218, 2.4999999e-05, 7.9056945e-06],
     0.9210423553163399),
    ("llama3", dict(dim=16, base=500000.0, factor=8.0, original_max_position_embeddings=8192),
     [1.0, 0.19392276, 0.037606031, 0.0072926651, 0.00052484602, 3.4281024e-05, 6.6478697e-06,
      1.2891732e-06], 1.0),
    ("longrope", dict(dim=8, short_factor=[1.0, 1.5, 2.0, 3.0], long_factor=[2.0, 3.0, 4.0, 5.0],
                      original_max_position_embeddings=4096, max_position_embeddings=131072, seq_len=5000),
     [0.5, 0.033333335, 0.0025, 0.0002], 1.1902380714238083),
    ("longrope", dict(dim=8, short_factor=[1.0, 1.5, 2.0, 3.0], long_factor=[2.0, 3.0, 4.0, 5.0],
                      original_max_position_embeddings=4096, max_position_embeddings=131072, seq_len=4096),
     [1.0, 0.06666667, 0.005, 0.00033333333], 1.1902380714238083),
]


@pytest.mark.parametrize("kind, kwargs, inv_freq, attention_factor", HF_PRINTED)
def test_matches_values_printed_by_transformers(kind, kwargs, inv_freq, attention_factor):
    got, af = rs.REGISTRY[kind](**kwargs)
    assert got.dtype == np.float64 and got.shape == (kwargs["dim"] // 2,)
    np.testing.assert_allclose(got, inv_freq, rtol=RTOL_FREQ)
    assert af == pytest.approx(attention_factor, rel=RTOL_ATTN)


# --- hand-worked cases


def test_linear_divides_every_frequency():
    # D = 4, base 10000: w = [1, 10000^(-1/2)] = [1, 0.01]; PI with s = 2 halves both.
    inv, af = rs.linear(4, factor=2.0)
    np.testing.assert_allclose(inv, [0.5, 0.005], rtol=1e-15)
    assert af == 1.0


def test_ntk_hand_worked():
    # D = 4, s = 4: base' = 10000 * 4^(4/2) = 160000, w = [1, 160000^(-1/2)] = [1, 1/400].
    inv, af = rs.ntk(4, factor=4.0)
    np.testing.assert_allclose(inv, [1.0, 0.0025], rtol=1e-14)
    assert af == 1.0


@settings(max_examples=50, deadline=None)
@given(st.sampled_from([4, 8, 64, 128]), st.sampled_from([10000.0, 500000.0]), st.floats(1.0, 64.0))
def test_ntk_keeps_the_highest_and_divides_the_lowest_frequency(dim, base, factor):
    # bloc97's choice of exponent D/(D-2): w_0 stays 1, w_{D/2-1} becomes w_{D/2-1} / s.
    inv, _ = rs.ntk(dim, base=base, factor=factor)
    assert inv[0] == 1.0
    assert inv[-1] == pytest.approx(base ** (-(dim - 2) / dim) / factor, rel=1e-12)


def test_dynamic_is_plain_rope_up_to_the_original_length():
    # HF takes max(seq_len, L): at or below L the base factor is s L/L - (s - 1) = 1.
    for seq_len in (1, 100, 2048):
        inv, _ = rs.dynamic(64, factor=4.0, original_max_position_embeddings=2048, seq_len=seq_len)
        np.testing.assert_allclose(inv, plain(64, 10000.0), rtol=1e-14)
    inv, _ = rs.dynamic(64, factor=4.0, original_max_position_embeddings=2048, seq_len=2049)
    assert inv[-1] < plain(64, 10000.0)[-1]


def test_dynamic_at_factor_one_is_static_ntk():
    # s = 1: the base factor is n / L, so n = 3 L gives ntk with factor 3.
    a, _ = rs.dynamic(32, factor=1.0, original_max_position_embeddings=1024, seq_len=3072)
    b, _ = rs.ntk(32, factor=3.0)
    np.testing.assert_allclose(a, b, rtol=1e-13)


def test_yarn_llama2_4x_attention_factor_and_ramp_boundaries():
    # s = 4, L = 4096, D = 128, base 10000. Temperature: 0.1 ln 4 + 1 = 1.1386294361.
    # Ramp: 128 ln(4096 / (2 pi 32)) / (2 ln 10000) = 20.95 -> floor 20;
    #       128 ln(4096 / (2 pi))    / (2 ln 10000) = 45.03 -> ceil 46.
    inv, af = rs.yarn(128, factor=4.0, original_max_position_embeddings=4096)
    w = plain(128, 10000.0)
    assert af == pytest.approx(1.1386294361119890, rel=1e-12)
    np.testing.assert_allclose(inv[:21], w[:21], rtol=1e-14)        # pairs 0..20 keep w
    np.testing.assert_allclose(inv[46:], w[46:] / 4, rtol=1e-14)    # pairs 46..63 get w / 4
    assert np.all((inv[21:46] < w[21:46]) & (inv[21:46] > w[21:46] / 4))
    # Inside the ramp, pair i mixes with weight (i - 20) / 26 on w / s.
    np.testing.assert_allclose(inv[33], w[33] * (1 - 13 / 26) + w[33] / 4 * (13 / 26), rtol=1e-14)


def test_yarn_deepseek_equal_mscales_give_attention_factor_one():
    # DeepSeek-V3: factor 40, mscale = mscale_all_dim = 1.0 -> ratio 1 (the softmax scale carries it).
    _, af = rs.yarn(64, factor=40.0, original_max_position_embeddings=4096, mscale=1.0, mscale_all_dim=1.0)
    assert af == 1.0
    # Only one of them given: HF falls back to 0.1 ln s + 1.
    _, af = rs.yarn(64, factor=40.0, original_max_position_embeddings=4096, mscale=0.707)
    assert af == pytest.approx(0.1 * math.log(40) + 1, rel=1e-14)


def test_llama31_keeps_the_first_29_frequencies():
    # Llama 3.1: base 500000, D = 128, s = 8, L = 8192, low/high 1/4. Pairs with wavelength
    # 2 pi 500000^(i/64) < 8192 / 4 = 2048 are kept: i < 64 ln(2048 / 2 pi) / ln 500000 = 28.2.
    inv, af = rs.llama3(128, base=500000.0, factor=8.0, original_max_position_embeddings=8192)
    w = plain(128, 500000.0)
    np.testing.assert_allclose(inv[:29], w[:29], rtol=1e-14)
    assert np.all(inv[29:] < w[29:]) and af == 1.0
    # Wavelength > 8192 (i >= 64 ln(8192 / 2 pi) / ln 500000 = 35.5): w / 8.
    np.testing.assert_allclose(inv[36:], w[36:] / 8, rtol=1e-14)


def test_longrope_phi3_attention_factor():
    # Phi-3-mini-128k: L = 4096, max 131072, s = 32; ln 32 / ln 4096 = 5/12, so sqrt(17/12).
    short, long = [1.0] * 48, [2.0] * 48
    _, af = rs.longrope(96, short_factor=short, long_factor=long, original_max_position_embeddings=4096,
                        max_position_embeddings=131072, seq_len=10)
    assert af == pytest.approx(math.sqrt(17 / 12), rel=1e-14)


def test_longrope_switches_lists_past_the_original_length():
    kw = dict(short_factor=[1.0, 2.0], long_factor=[4.0, 8.0], original_max_position_embeddings=4096,
              max_position_embeddings=4096)
    w = plain(4, 10000.0)
    np.testing.assert_allclose(rs.longrope(4, seq_len=4096, **kw)[0], w / [1, 2], rtol=1e-15)
    np.testing.assert_allclose(rs.longrope(4, seq_len=4097, **kw)[0], w / [4, 8], rtol=1e-15)
    assert rs.longrope(4, seq_len=4097, **kw)[1] == 1.0  # s = 1: no attention factor
    assert rs.longrope(4, seq_len=1, factor=4.0, attention_factor=1.5, **kw)[1] == 1.5


def test_registry_names():
    assert rs.REGISTRY == {"linear": rs.linear, "ntk": rs.ntk, "dynamic": rs.dynamic, "yarn": rs.yarn,
                           "llama3": rs.llama3, "longrope": rs.longrope}


# --- bad parameters

YARN = dict(factor=4.0, original_max_position_embeddings=4096)
LONG = dict(short_factor=[1.0] * 4, long_factor=[2.0] * 4, original_max_position_embeddings=4096,
            max_position_embeddings=8192, seq_len=10)


@pytest.mark.parametrize("fn, kwargs, match", [
    (rs.linear, dict(dim=8, factor=0.5), "factor"),
    (rs.ntk, dict(dim=8, factor=0.99), "factor"),
    (rs.linear, dict(dim=7, factor=2.0), "dim"),
    (rs.ntk, dict(dim=2, factor=2.0), "dim"),
    (rs.linear, dict(dim=8, factor=float("nan")), "factor"),
    (rs.linear, dict(dim=8, factor=float("inf")), "factor"),
    (rs.linear, dict(dim=8, base=1.0, factor=2.0), "base"),
    (rs.linear, dict(dim=8, base=float("inf"), factor=2.0), "base"),
    (rs.dynamic, dict(dim=8, factor=2.0, original_max_position_embeddings=2048, seq_len=0), "seq_len"),
    (rs.dynamic, dict(dim=8, factor=2.0, original_max_position_embeddings=0, seq_len=5), "original_max"),
    (rs.yarn, dict(dim=8, beta_fast=1.0, beta_slow=1.0, **YARN), "beta_fast"),
    (rs.yarn, dict(dim=8, beta_fast=2.0, beta_slow=4.0, **YARN), "beta_fast"),
    (rs.yarn, dict(dim=8, beta_slow=0.0, **YARN), "beta_slow"),
    (rs.yarn, dict(dim=8, mscale=float("nan"), mscale_all_dim=1.0, **YARN), "mscale"),
    (rs.yarn, dict(dim=8, attention_factor=-1.0, **YARN), "attention_factor"),
    (rs.llama3, dict(dim=8, factor=8.0, original_max_position_embeddings=8192, low_freq_factor=4.0,
                     high_freq_factor=2.0), "high_freq_factor"),
    (rs.longrope, dict(dim=8, **{**LONG, "short_factor": []}), "short_factor"),
    (rs.longrope, dict(dim=8, **{**LONG, "long_factor": [2.0] * 5}), "long_factor"),
    (rs.longrope, dict(dim=8, **{**LONG, "long_factor": [2.0, 2.0, 0.0, 2.0]}), "long_factor"),
    (rs.longrope, dict(dim=8, **{**LONG, "short_factor": [1.0, float("nan"), 1.0, 1.0]}), "short_factor"),
    (rs.longrope, dict(dim=8, **{**LONG, "seq_len": 0}), "seq_len"),
    (rs.longrope, dict(dim=8, **{**LONG, "factor": 0.5}), "factor"),
    (rs.longrope, dict(dim=8, **{**LONG, "max_position_embeddings": 1024}), "max_position_embeddings"),
])
def test_bad_parameters_raise_naming_them(fn, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fn(**kwargs)


def test_wrong_types_raise_type_error():
    with pytest.raises(TypeError, match="truncate"):
        rs.yarn(8, truncate="no", **YARN)
    with pytest.raises(TypeError, match="original_max_position_embeddings"):
        rs.llama3(8, factor=8.0, original_max_position_embeddings=8192.5)
    with pytest.raises(TypeError, match="short_factor"):
        rs.longrope(8, **{**LONG, "short_factor": ["a"] * 4})


# --- live comparison with transformers (skipped where it is not installed)


def _hf(kind, dim, params, *, max_pos, orig=None, seq_len=None):
    """``ROPE_INIT_FUNCTIONS[kind]`` on a bare config with head_dim = dim, as float64."""
    pytest.importorskip("torch")
    cu = pytest.importorskip("transformers.configuration_utils")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    config = cu.PreTrainedConfig()  # the attributes a model config would carry
    config.head_dim, config.hidden_size, config.num_attention_heads = dim, 2 * dim, 2
    config.max_position_embeddings = max_pos
    config.rope_parameters = {"rope_type": kind, **params}
    if orig is not None:
        config.original_max_position_embeddings = orig  # where Phi-3 keeps it
    kw = {} if seq_len is None else {"seq_len": seq_len}
    inv, af = ROPE_INIT_FUNCTIONS[kind](config, "cpu", **kw)
    return inv.double().numpy(), float(af)


def _compare(ours, theirs):
    np.testing.assert_allclose(ours[0], theirs[0], rtol=RTOL_FREQ)
    assert ours[1] == pytest.approx(theirs[1], rel=RTOL_ATTN)


@pytest.mark.parametrize("dim", [8, 64, 128])
@pytest.mark.parametrize("base", [10000.0, 500000.0])
@pytest.mark.parametrize("factor", [1.0, 2.0, 8.5])
def test_linear_matches_transformers(dim, base, factor):
    theirs = _hf("linear", dim, dict(rope_theta=base, factor=factor), max_pos=4096)
    _compare(rs.linear(dim, base=base, factor=factor), theirs)


@pytest.mark.parametrize("dim, base", [(8, 10000.0), (128, 10000.0), (128, 1e6)])
@pytest.mark.parametrize("factor", [1.0, 2.0, 4.0])
@pytest.mark.parametrize("L, seq_len", [(2048, 100), (2048, 2048), (2048, 5000), (4096, 16384)])
def test_dynamic_and_ntk_match_transformers(dim, base, factor, L, seq_len):
    theirs = _hf("dynamic", dim, dict(rope_theta=base, factor=factor), max_pos=L, seq_len=seq_len)
    ours = rs.dynamic(dim, base=base, factor=factor, original_max_position_embeddings=L, seq_len=seq_len)
    _compare(ours, theirs)
    # static NTK with factor s = HF dynamic at factor 1 and seq_len = s L
    theirs = _hf("dynamic", dim, dict(rope_theta=base, factor=1.0), max_pos=L, seq_len=int(factor * L))
    _compare(rs.ntk(dim, base=base, factor=factor), theirs)


YARN_CASES = [
    dict(),
    dict(beta_fast=16.0, beta_slow=2.0),
    dict(truncate=False),
    dict(mscale=0.707, mscale_all_dim=0.707),
    dict(mscale=1.0, mscale_all_dim=0.5),
    dict(mscale=1.0),
    dict(attention_factor=1.25),
]


@pytest.mark.parametrize("dim, base", [(64, 10000.0), (128, 10000.0), (128, 1e6), (16, 500000.0)])
@pytest.mark.parametrize("factor, L", [(1.0, 4096), (1.5, 2048), (4.0, 4096), (16.0, 32768), (40.0, 4096)])
@pytest.mark.parametrize("extra", YARN_CASES)
def test_yarn_matches_transformers(dim, base, factor, L, extra):
    if extra.get("truncate") is False and factor > 16:
        # HF's ramp is float32 (error ~6e-8) and w/s vs w mixing amplifies it by ~s: 2.4e-6 at s = 40.
        pytest.skip("beyond float32 resolution of the reference")
    params = dict(rope_theta=base, factor=factor, original_max_position_embeddings=L, **extra)
    theirs = _hf("yarn", dim, params, max_pos=int(factor * L))
    _compare(rs.yarn(dim, base=base, factor=factor, original_max_position_embeddings=L, **extra), theirs)


@pytest.mark.parametrize("dim, base", [(128, 500000.0), (64, 10000.0), (16, 500000.0)])
@pytest.mark.parametrize("factor, L", [(8.0, 8192), (32.0, 8192), (4.0, 2048)])
@pytest.mark.parametrize("lo, hi", [(1.0, 4.0), (2.0, 8.0), (0.5, 1.5)])
def test_llama3_matches_transformers(dim, base, factor, L, lo, hi):
    params = dict(rope_theta=base, factor=factor, original_max_position_embeddings=L,
                  low_freq_factor=lo, high_freq_factor=hi)
    theirs = _hf("llama3", dim, params, max_pos=int(factor * L))
    ours = rs.llama3(dim, base=base, factor=factor, original_max_position_embeddings=L,
                     low_freq_factor=lo, high_freq_factor=hi)
    _compare(ours, theirs)


@pytest.mark.parametrize("dim", [8, 96])
@pytest.mark.parametrize("L, L_max", [(4096, 131072), (8192, 8192), (2048, 16384)])
@pytest.mark.parametrize("seq_len", [1, 2048, 4096, 4097, 100000])
@pytest.mark.parametrize("extra", [dict(), dict(factor=8.0), dict(attention_factor=1.1)])
def test_longrope_matches_transformers(dim, L, L_max, seq_len, extra):
    rng = np.random.default_rng(dim + L)
    short = [float(v) for v in rng.uniform(1.0, 2.0, dim // 2)]
    long = [float(v) for v in rng.uniform(1.0, 40.0, dim // 2)]
    params = dict(rope_theta=10000.0, short_factor=short, long_factor=long, original_max_position_embeddings=L,
                  **extra)
    theirs = _hf("longrope", dim, params, max_pos=L_max, orig=L, seq_len=seq_len)
    ours = rs.longrope(dim, short_factor=short, long_factor=long, original_max_position_embeddings=L,
                       max_position_embeddings=L_max, seq_len=seq_len, **extra)
    _compare(ours, theirs)


def test_yarn_refuses_a_negative_mscale():
    # 0.1 * (-20) * ln 4 + 1 < 0 would give a negative attention factor (cos and sin flipped).
    with pytest.raises(ValueError, match="mscale"):
        rs.yarn(128, factor=4.0, original_max_position_embeddings=4096, mscale=-20, mscale_all_dim=1)
