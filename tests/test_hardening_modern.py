"""Bad input to M-RoPE, iRoPE, the local/global and Llama 4 / SmolLM3 config readers, Shaw and the
masks: a clear error naming the argument, or the right result (worked by hand, or from the
formulas of the papers and of transformers, with Python's exact integers as the oracle)."""

import math

import numpy as np
import pytest

from minipos import irope, masks, mrope, shaw
from minipos import local_global as lg
from minipos.layer import MultiHeadAttention
from minipos.rope_scaling import Rotary
from minipos.seams import NoPE

I64 = np.iinfo(np.int64)


# --- M-RoPE positions --------------------------------------------------------------------------

@pytest.mark.parametrize("interval", [1e300, 1e19, 2.0 ** 62])
def test_a_video_time_interval_past_int64_is_named_not_wrapped(interval):
    # [text, 2 video tokens (grid (2, 2, 2) merged by 2: one token per frame), text]: frame 1 sits at
    # 1 + floor(1 * interval), beyond 2**62; before, it came back as -9223372036854775807.
    with pytest.raises(ValueError, match="video_time_intervals"):
        mrope.mrope_positions([0, 2, 2, 0], video_grid_thw=[[2, 2, 2]], video_time_intervals=[interval])


def test_a_large_video_time_interval_that_fits_is_exact():
    # By hand: text at 0; frames at 1 + floor(0 * s) = 1 and 1 + floor(1 * s) = 1 + 2**40 (h = w = 1 after
    # merging: rows and columns 1 + 0); current = 1 + max(2, 2) // 2 = 2, so the last text token is at 2.
    pos, delta = mrope.mrope_positions([0, 2, 2, 0], video_grid_thw=[[2, 2, 2]], video_time_intervals=[2.0 ** 40])
    assert pos.tolist() == [[0, 1, 1 + 2 ** 40, 2], [0, 1, 1, 2], [0, 1, 1, 2]]
    assert delta == 1 + 2 ** 40 + 1 - 4


def test_a_huge_grid_is_refused_by_its_token_count_before_any_array():
    # 2**40 x 2**40 patches would be 2**78 positions: refused by the count (1 token here), not by NumPy.
    with pytest.raises(ValueError, match=r"image_grid_thw\[0\].*needs"):
        mrope.mrope_positions([1], image_grid_thw=[[1, 2 ** 40, 2 ** 40]])


@pytest.mark.parametrize("cache_length, length, delta", [(2 ** 63 - 2, 3, 0), (2 ** 63, 3, 0), (2 ** 62 - 1, 2, 0),
                                                         (0, 1, -2 ** 62), (5, 2 ** 63, 0)])
def test_decode_positions_past_2_62_are_named(cache_length, length, delta):
    with pytest.raises(ValueError, match="cache_length|length"):
        mrope.mrope_decode_positions(cache_length, length, delta)


def test_no_decode_positions_is_empty_whatever_the_offset():
    # length 0: no position is computed, so no offset can overflow (before: OverflowError from NumPy).
    assert mrope.mrope_decode_positions(10, 0, 2 ** 70).shape == (3, 0)


def test_decode_positions_near_the_limit_are_exact():
    # cache_length + delta + arange(2) by Python's integers.
    got = mrope.mrope_decode_positions(2 ** 62 - 10, 2, 7)
    assert got.tolist() == [[2 ** 62 - 3, 2 ** 62 - 2]] * 3
    assert mrope.mrope_decode_positions(10, 3, -4).tolist() == [[6, 7, 8]] * 3


@pytest.mark.parametrize("call", [
    lambda: mrope.mrope_streams([2 ** 63, 0, 0]),
    lambda: mrope.mrope_angles(np.zeros((3, 2), int), np.ones(2), [2 ** 63, 0, 0]),
    lambda: mrope.apply_mrope(np.ones((2, 4)), np.zeros((3, 2), int), [2 ** 63, 0, 0]),
    lambda: MultiHeadAttention(8, 2, scheme=mrope.MRotary(mrope_section=[2 ** 63, 0, 0])),
], ids=["streams", "angles", "apply", "layer"])
def test_a_huge_mrope_section_is_named(call):
    with pytest.raises(ValueError, match="mrope_section"):
        call()


# --- iRoPE's temperature -------------------------------------------------------------------------

def test_the_temperature_at_the_largest_int64_positions_is_finite_and_right():
    # tau(i) = log1p(floor((i + 1) / 2)) * 0.1 + 1 with Python's integers: floor((2**63 - 4 + k) / 2) for
    # k = 0..4, i.e. 2**62 - 2, 2**62 - 1, 2**62 - 1, 2**62, 2**62 (float64 cannot tell them apart).
    pos = I64.max - np.arange(5)[::-1]
    want = [math.log(1 + (int(i) + 1) // 2) * 0.1 + 1 for i in pos]
    np.testing.assert_allclose(irope.attn_temperature(pos, floor_scale=2), want, rtol=1e-15)
    q = np.ones((5, 2))
    np.testing.assert_allclose(irope.apply_attn_temperature(q, pos, floor_scale=2), np.array(want)[:, None] * q,
                               rtol=1e-15)


@pytest.mark.parametrize("fn, name", [(irope.apply_attn_temperature, "q"),
                                      (irope.apply_attn_temperature_backward, "dy")])
def test_a_float16_overflow_of_the_temperature_is_named(fn, name):
    # tau(1e6) = log1p(1e6 + 1) * 10 + 1 ~ 139; 60000 * 139 > 65504, the largest float16.
    x = np.full((1, 3, 2), 60000, np.float16)
    with pytest.raises(ValueError, match=f"overflows float16; rescale {name} or attn_scale"):
        fn(x, np.arange(3) + 10 ** 6, attn_scale=10, floor_scale=1)


def test_an_attn_scale_that_makes_tau_infinite_is_named():
    with pytest.raises(ValueError, match="attn_scale"):
        irope.attn_temperature([10 ** 6], attn_scale=1e308, floor_scale=1)
    with pytest.raises(ValueError, match="attn_scale"):
        irope.attn_temperature([10 ** 6], attn_scale=1e300, floor_scale=1, float32=True)


# --- the Llama 4 and SmolLM3 config readers -------------------------------------------------------

BASE = {"num_hidden_layers": 4, "hidden_size": 16, "num_attention_heads": 2,
        "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}}


@pytest.mark.parametrize("change, exc, name", [
    ({"layer_types": "chunked_attention"}, TypeError, "layer_types"),
    ({"layer_types": ["foo"] * 4}, ValueError, "layer_types"),
    ({"layer_types": ["chunked_attention"] * 2}, ValueError, "layer_types"),
    ({"layer_types": ["sliding_attention"] * 4}, ValueError, "layer_types"),
    ({"attention_bias": "no"}, TypeError, "attention_bias"),
    ({"attention_bias": 1}, TypeError, "attention_bias"),
    ({"attn_temperature_tuning": "false"}, TypeError, "attn_temperature_tuning"),
    ({"attn_temperature_tuning": 0.5}, TypeError, "attn_temperature_tuning"),
    ({"no_rope_layers": 0}, TypeError, "no_rope_layers"),
    ({"no_rope_layers": "1110"}, TypeError, "no_rope_layers"),
    ({"no_rope_layers": ["1", "1", "1", "0"]}, ValueError, "no_rope_layers"),
    ({"num_key_value_heads": 0}, ValueError, "num_key_value_heads"),
    ({"head_dim": 0}, ValueError, "head_dim"),
    ({"num_attention_heads": 32}, ValueError, "head_dim"),
    ({"rope_parameters": "default"}, TypeError, "rope_parameters"),
    ({"attention_chunk_size": 2 ** 70}, ValueError, "attention_chunk_size"),
])
def test_llama4_config_values_it_cannot_read_are_named(change, exc, name):
    with pytest.raises(exc, match=name):
        irope.llama4_layer({**BASE, **change}, 3 if "temperature" in str(change) else 0)


def test_a_chunked_layer_without_a_chunk_length_is_named():
    # HF's create_chunked_causal_mask raises "Could not find an `attention_chunk_size`" for None; before, the
    # reader silently used 8192. A NoPE layer (not chunked) needs no chunk length; a key left out is 8192.
    with pytest.raises(ValueError, match="attention_chunk_size"):
        irope.llama4_layer({**BASE, "attention_chunk_size": None}, 0)
    assert irope.llama4_layer({**BASE, "attention_chunk_size": None}, 3)[1]["attention_chunk"] is None
    assert irope.llama4_layer(BASE, 0)[1]["attention_chunk"] == 8192


def test_llama4_layer_types_decide_the_chunks():
    types = ["full_attention", "chunked_attention", "chunked_attention", "full_attention"]
    chunks = [irope.llama4_layer({**BASE, "layer_types": types, "attention_chunk_size": 7}, i)[1]["attention_chunk"]
              for i in range(4)]
    assert chunks == [None, 7, 7, None]


def test_llama4_flags_as_numpy_and_transformers_4_integers_are_read():
    # transformers 4.51's Llama4TextConfig defaults attn_temperature_tuning=4 and Meta's Llama-4-Scout config.json
    # holds 4; HF read it by truthiness (``if self.attn_temperature_tuning and not self.use_rope``).
    assert isinstance(irope.llama4_layer({**BASE, "attn_temperature_tuning": 4}, 3)[0], irope.NoPETemperature)
    assert type(irope.llama4_layer({**BASE, "attn_temperature_tuning": 0}, 3)[0]) is NoPE
    assert type(irope.llama4_layer({**BASE, "attn_temperature_tuning": np.False_}, 3)[0]) is NoPE
    scheme, kw = irope.llama4_layer({**BASE, "no_rope_layers": np.array([0, 1, 1, 1]), "attention_bias": np.True_}, 0)
    assert type(scheme) is not Rotary and kw["bias"] is True


# transformers 4 wrote rope_theta at the top of the config and rope_scaling None (no scaling) or a dict
# without rope_theta: Llama4TextConfig(rope_theta=500000, rope_scaling=None, ...) in 4.51, and
# SmolLM3Config(rope_theta=2000000.0, rope_scaling=None, ...) in 4.53; transformers 5 moved both into
# rope_parameters with default_theta 500000.0 / 2000000.0 (configuration_llama4.py, configuration_smollm3.py).
TF4 = {"num_hidden_layers": 4, "hidden_size": 16, "num_attention_heads": 2, "rope_theta": 123456.0,
       "rope_scaling": None}
LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


@pytest.mark.parametrize("reader", [irope.llama4_layer, irope.smollm3_layer], ids=["llama4", "smollm3"])
@pytest.mark.parametrize("config", [TF4, {k: v for k, v in TF4.items() if k != "rope_scaling"}],
                         ids=["rope_scaling None", "no rope_scaling"])
def test_transformers_4_configs_are_read(reader, config):
    scheme, kw = reader(config, 0)
    assert isinstance(scheme, Rotary) and scheme.base == 123456.0 and scheme.scaling_kind is None
    assert kw["head_dim"] == 8


def test_transformers_4_scaling_dict_takes_the_top_level_theta():
    scheme, _ = irope.llama4_layer({**TF4, "rope_scaling": dict(LLAMA3)}, 0)
    assert scheme.base == 123456.0 and scheme.scaling_kind == "llama3"


@pytest.mark.parametrize("reader, theta", [(irope.llama4_layer, 500000.0), (irope.smollm3_layer, 2000000.0)])
def test_a_config_without_rope_theta_takes_the_models_default(reader, theta):
    config = {k: v for k, v in TF4.items() if k != "rope_theta"}
    assert reader(config, 0)[0].base == theta


@pytest.mark.parametrize("change, exc, name", [
    ({"use_sliding_window": "false"}, TypeError, "use_sliding_window"),
    ({"layer_types": ["full_attention"] * 3 + ["sliding_attention"]}, ValueError, "layer_types"),
    ({"layer_types": ["chunked_attention"] * 4}, ValueError, "layer_types"),
    ({"attention_bias": "false"}, TypeError, "attention_bias"),
])
def test_smollm3_config_values_it_cannot_read_are_named(change, exc, name):
    with pytest.raises(exc, match=name):
        irope.smollm3_layer({**TF4, **change}, 3)


# --- the Gemma 3 config readers ------------------------------------------------------------------

GEMMA = {"num_hidden_layers": 6, "hidden_size": 16, "num_attention_heads": 2, "head_dim": 8}


@pytest.mark.parametrize("call, exc, name", [
    (lambda: lg.gemma3_rope_parameters({}, "foo"), ValueError, "layer_type"),
    (lambda: lg.gemma3_rope_parameters({}, None), TypeError, "layer_type"),
    (lambda: lg.gemma3_rope_parameters(None, "full_attention"), TypeError, "config"),
    (lambda: lg.gemma3_rope_parameters({"rope_parameters": {"full_attention": {}}}, "sliding_attention"),
     ValueError, "rope_parameters"),
    (lambda: lg.gemma3_rope_parameters({"rope_parameters": {"full_attention": 5}}, "full_attention"),
     TypeError, "rope_parameters"),
    (lambda: lg.gemma3_rope_parameters({"rope_scaling": "linear"}, "full_attention"), TypeError, "rope_scaling"),
    (lambda: lg.gemma3_attention({**GEMMA, "query_pre_attn_scalar": 0}, 0), ValueError, "query_pre_attn_scalar"),
    (lambda: lg.gemma3_attention({**GEMMA, "query_pre_attn_scalar": "abc"}, 0), TypeError, "query_pre_attn_scalar"),
    (lambda: lg.gemma3_attention({**GEMMA, "query_pre_attn_scalar": None}, 0), TypeError, "query_pre_attn_scalar"),
    (lambda: lg.gemma3_attention({**GEMMA, "query_pre_attn_scalar": -4}, 0), ValueError, "query_pre_attn_scalar"),
    (lambda: lg.gemma3_layer_types({"layer_types": [1, 2]}), ValueError, "layer_types"),
    (lambda: lg.gemma3_layer_types({"layer_types": [1, "x"]}), ValueError, "layer_types"),
    (lambda: lg.gemma3_layer_types({"layer_types": "sliding_attention"}), TypeError, "layer_types"),
    (lambda: lg.gemma3_layer_types(None), TypeError, "config"),
    (lambda: lg.gemma3_attention({**GEMMA, "layer_types": ["full_attention"] * 2}, 3), ValueError, "layer_types"),
    (lambda: lg.gemma3_attention({**GEMMA, "head_dim": 0}, 0), ValueError, "head_dim"),
    (lambda: lg.gemma3_attention({**GEMMA, "num_key_value_heads": 0}, 0), ValueError, "num_key_value_heads"),
    (lambda: lg.gemma3_attention({**GEMMA, "attention_bias": "false"}, 0), TypeError, "attention_bias"),
    (lambda: lg.gemma3_attention({**GEMMA, "sliding_window": None}, 0), TypeError, "sliding_window"),
    (lambda: lg.gemma3_attention({**GEMMA, "sliding_window": 2 ** 70}, 0), ValueError, "sliding_window"),
])
def test_gemma3_config_values_it_cannot_read_are_named(call, exc, name):
    with pytest.raises(exc, match=name):
        call()


def test_gemma3_layer_types_as_a_numpy_array_are_read():
    types = np.array(["sliding_attention"] * 5 + ["full_attention"])
    assert lg.gemma3_layer_types({**GEMMA, "layer_types": types}) == list(types)
    assert lg.gemma3_attention({**GEMMA, "layer_types": types}, 5)[1]["sliding_window"] is None


# --- Shaw ------------------------------------------------------------------------------------------

def test_relative_buckets_at_the_ends_of_int64_do_not_wrap():
    # j - i = int64.max - int64.min = 2**64 - 1 > k = 2, so clip gives k and the row is 2k = 4 (the far-right
    # bucket); the other way round j - i = -(2**64 - 1) clips to -k, row 0. Before: j - i wrapped to -1, row 1.
    assert shaw.relative_buckets([I64.min], [I64.max], 2).tolist() == [[4]]
    assert shaw.relative_buckets([I64.max], [I64.min], 2).tolist() == [[0]]
    # Near the ends, distances below k stay exact: j - i = 1 and -1 with i = int64.max - 1.
    assert shaw.relative_buckets([I64.max - 1], [I64.max, I64.max - 2], 3).tolist() == [[4, 2]]


def test_relative_buckets_equal_the_clip_of_python_integers():
    rng = np.random.default_rng(5)
    i = rng.integers(I64.min, I64.max, 20, endpoint=True)
    j = np.concatenate([rng.integers(I64.min, I64.max, 20, endpoint=True), i[:5] + 3, i[5:10] - 2])
    want = [[max(-7, min(7, int(b) - int(a))) + 7 for b in j] for a in i]
    assert shaw.relative_buckets(i, j, 7).tolist() == want


@pytest.mark.parametrize("call", [lambda: shaw.Shaw(2 ** 70), lambda: shaw.Shaw(2 ** 62),
                                  lambda: shaw.relative_buckets([0], [1], 2 ** 70),
                                  lambda: MultiHeadAttention(8, 2, scheme=shaw.Shaw(2 ** 40))],
                         ids=["2**70", "2**62", "buckets", "bind"])
def test_a_huge_max_relative_position_is_named(call):
    with pytest.raises(ValueError, match="max_relative_position"):
        call()


# --- masks -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, name", [(masks.chunk_mask, "chunk"), (masks.sliding_window_mask, "window")])
@pytest.mark.parametrize("size", [2 ** 70, 2 ** 63, 2 ** 62 + 1])
def test_a_chunk_or_window_past_2_62_is_named_as_by_the_layer(fn, name, size):
    with pytest.raises(ValueError, match=f"{name} must be at most 2\\*\\*62"):
        fn([0, 1], [0, 1], size)


def test_a_chunk_of_2_62_puts_every_position_in_one_chunk():
    # i // 2**62 = 0 for every position below 2**62: all pairs may attend.
    got = masks.chunk_mask([0, 2 ** 62 - 1], [0, 5, 2 ** 62 - 1], 2 ** 62)
    assert got.tolist() == [[True, True, True], [True, True, True]]

SQ, SK = np.array([0, 1, 2]), np.array([0, 1, 3, 4])
RNG = np.random.default_rng(3)
QS, WK, WV = RNG.standard_normal((2, 3, 4)), RNG.standard_normal((5, 4)), RNG.standard_normal((5, 4))
WTS, DLOG, DOUT = RNG.random((2, 3, 4)), RNG.standard_normal((2, 3, 4)), RNG.standard_normal((2, 3, 4))


@pytest.mark.parametrize("call", [
    lambda f: shaw.relative_logits(f(QS) * 1e30, f(WK) * 1e30, SQ, SK, max_relative_position=2),
    lambda f: shaw.relative_logits_pairwise(f(QS) * 1e30, f(WK) * 1e30, SQ, SK, max_relative_position=2),
    lambda f: shaw.relative_values(f(WTS) * 1e20, f(WV) * 1e20, SQ, SK, max_relative_position=2),
    lambda f: shaw.relative_values_pairwise(f(WTS) * 1e20, f(WV) * 1e20, SQ, SK, max_relative_position=2),
    lambda f: shaw.relative_logits_backward(f(QS), f(WK) * 1e30, SQ, SK, f(DLOG) * 1e20, max_relative_position=2),
    lambda f: shaw.relative_values_backward(f(WTS), f(WV) * 1e30, SQ, SK, f(DOUT) * 1e20, max_relative_position=2),
], ids=["logits", "logits-pairwise", "values", "values-pairwise", "logits-backward", "values-backward"])
def test_shaw_terms_that_overflow_float32_are_named(call):
    # 1e30 * 1e30 > 3.4e38, the largest float32: before, inf and NaN came back.
    with pytest.raises(ValueError, match="overflows float32; rescale"):
        call(lambda a: a.astype(np.float32))


def test_rope_underflow_under_a_strict_errstate_is_not_reported_as_overflow():
    # hand-worked: position 0 rotates by angle 0, so its features come back exactly; at any position a
    # rotation keeps each pair's norm, here sqrt(2) * 1e-310 (a subnormal), up to subnormal rounding
    from minipos import rope
    x = np.full((3, 4), 1e-310)
    with np.errstate(all="raise"):
        got = rope.apply_rope(x, np.arange(3))
        with pytest.raises(ValueError, match="overflows"):
            rope.apply_rope(np.full((3, 4), np.finfo(np.float64).max), np.arange(3))
    np.testing.assert_array_equal(got[0], x[0])
    pair_norm = np.hypot(got[:, 0::2], got[:, 1::2])                 # interleaved layout: pairs (2i, 2i + 1)
    np.testing.assert_allclose(pair_norm, math.sqrt(2) * 1e-310, rtol=1e-9)
