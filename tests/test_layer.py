"""Tests of minipos.layer: the seams, the KV cache, masks and errors.

Hand-worked expected values are derived in the comments; agreement with real models'
attention modules is in test_layer_interop.py.
"""

import math
import warnings

import numpy as np
import pytest

from minipos import rope, rope_scaling
from minipos.layer import ALiBi, DeBERTa, LearnedAbsolute, MultiHeadAttention, Rotary, Shaw, T5Bias, TransformerXL, XPos
from _schemes import SHIFT_INVARIANT, registered

REGISTERED = registered(512)                                   # name -> a new instance, every scheme
ALL = pytest.mark.parametrize("cls", list(REGISTERED.values()), ids=list(REGISTERED))


def _x(B=2, T=12, d=16, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, d))


def test_nope_hand_worked():
    # d_model 2, one head, identity weights: q = k = v = x. Query 0 = [a, 0] with a^2 / sqrt(2) = ln 3
    # scores keys [a, 0] and [0, 0] as [ln 3, 0] -> weights [3/4, 1/4] -> out = [3a/4, 0].
    a = math.sqrt(math.log(3.0) * math.sqrt(2.0))
    layer = MultiHeadAttention(2, 1)
    layer.wq = layer.wk = layer.wv = layer.wo = np.eye(2)
    y = layer(np.array([[[a, 0.0], [0.0, 0.0]]]))
    np.testing.assert_allclose(y[0, 0], [0.75 * a, 0.0])


def test_alibi_seam_hand_worked():
    # With wq = 0 the logits are the bias alone. One head has slope 2^-8 (paper's rule, n = 1);
    # query at position 1 sees keys 0 and 1 with biases [-2^-8, 0] -> weights [e^-m, 1] / (1 + e^-m).
    layer = MultiHeadAttention(2, 1, scheme=ALiBi())
    layer.wq = np.zeros((2, 2))
    _, w = layer(_x(1, 2, 2), causal=True, return_weights=True)
    m = 2.0 ** -8
    np.testing.assert_allclose(w[0, 0, 1], [math.exp(-m) / (1 + math.exp(-m)), 1 / (1 + math.exp(-m))])
    np.testing.assert_allclose(w[0, 0, 0], [1.0, 0.0])


def test_t5_seam_is_unscaled_and_uses_the_table():
    # wq = 0: logits = table[bucket(j - i), h]. Bidirectional, distances 0 and +1 are buckets 0 and 17
    # (16 + 1: the positive half starts at num_buckets // 2). Table 0 and ln 3 there -> [1/4, 3/4].
    scheme = T5Bias()
    layer = MultiHeadAttention(2, 1, scheme=scheme)
    layer.wq = np.zeros((2, 2))
    scheme.table = np.zeros((32, 1))
    scheme.table[17, 0] = math.log(3.0)
    _, w = layer(_x(1, 2, 2), return_weights=True)
    np.testing.assert_allclose(w[0, 0, 0], [0.25, 0.75])


@ALL
def test_cached_decoding_equals_full_forward(cls):
    # Two forms of one computation: the whole sequence at once, and token by token through the cache.
    x = _x()
    layer = MultiHeadAttention(16, 4, scheme=cls(), seed=1)
    full = layer(x, causal=True)
    cache = layer.new_cache()
    steps = [layer(x[:, t:t + 1], causal=True, cache=cache) for t in range(x.shape[1])]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=0, atol=1e-12)
    assert cache.length == x.shape[1]


@ALL
def test_prefill_then_decode_equals_full_forward(cls):
    x = _x(T=9)
    layer = MultiHeadAttention(16, 4, scheme=cls(), seed=2)
    full = layer(x, causal=True)
    cache = layer.new_cache()
    first = layer(x[:, :5], causal=True, cache=cache)
    rest = layer(x[:, 5:], causal=True, cache=cache)
    np.testing.assert_allclose(np.concatenate([first, rest], axis=1), full, atol=1e-12)


@ALL
def test_float32_in_float32_out(cls):
    layer = MultiHeadAttention(16, 4, scheme=cls(), dtype=np.float32)
    y = layer(_x().astype(np.float32), causal=True)
    assert y.dtype == np.float32
    ref = MultiHeadAttention(16, 4, scheme=cls())
    np.testing.assert_allclose(y, ref(_x(), causal=True), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("cls", [TransformerXL, DeBERTa, Shaw])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_content_position_logits_keep_the_layers_dtype(cls, dtype):
    # The scale is a Python float: a NumPy float64 scalar times float32 logits is float64 under NumPy 2's
    # promotion, which made a float32 layer's position logits (and their gradients' work) float64.
    layer = MultiHeadAttention(16, 4, scheme=cls(), dtype=dtype)
    assert type(layer.scheme.scale(layer.head_dim)) is float
    q = np.ones((1, 4, 5, 4), dtype)
    positions = np.arange(5)
    _, extra = layer.scheme.content_position(q, q, positions, positions)
    assert extra(slice(0, 5), slice(0, 5)).dtype == dtype


@pytest.mark.parametrize("name", [n for n in REGISTERED if n in SHIFT_INVARIANT])
def test_relative_schemes_ignore_a_common_shift_and_absolute_ones_see_it(name):
    x = _x()
    layer = MultiHeadAttention(16, 4, scheme=REGISTERED[name]())
    T = x.shape[1]
    moved, here = layer(x, positions=np.arange(T) + 100, causal=True), layer(x, causal=True)
    if SHIFT_INVARIANT[name]:
        np.testing.assert_allclose(moved, here, atol=1e-10)
    else:
        assert np.max(np.abs(moved - here)) > 1e-3


def test_padding_mask_hides_keys_and_fully_masked_rows_are_zero():
    x = _x(B=2, T=6)
    layer = MultiHeadAttention(16, 4, scheme=ALiBi())
    keep = np.ones((2, 6), bool)
    keep[1, 4:] = False                                   # the second sequence has 4 real tokens
    y = layer(x, mask=keep)
    np.testing.assert_allclose(y[1, :4], layer(x[1:, :4])[0], atol=1e-12)  # as if the padding were absent
    np.testing.assert_allclose(y[0], layer(x[:1])[0], atol=1e-12)
    full = np.zeros((2, 6, 6), bool)                      # nothing may attend: zeros, no NaN, no warning
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(layer(x, mask=full), 0.0)


def test_learned_absolute_cannot_extrapolate():
    layer = MultiHeadAttention(16, 4, scheme=LearnedAbsolute(max_positions=8))
    with pytest.raises(ValueError, match="positions"):
        layer(_x(T=9))


@pytest.mark.parametrize(
    "kwargs, exc, words",
    [
        ({"d_model": 16, "num_heads": 0}, ValueError, "num_heads"),
        ({"d_model": 16, "num_heads": 3}, ValueError, "num_heads"),
        ({"d_model": 0, "num_heads": 1}, ValueError, "d_model"),
        ({"d_model": 16, "num_heads": 2, "dtype": np.int32}, TypeError, "dtype"),
        ({"d_model": 16, "num_heads": 2, "scheme": "rope"}, TypeError, "scheme"),
        ({"d_model": 12, "num_heads": 4, "scheme": Rotary()}, ValueError, "dim"),      # odd head dim 3
        ({"d_model": 16, "num_heads": 2, "scheme": Rotary(rotary_dim=10)}, ValueError, "rotary_dim"),
    ],
)
def test_constructor_errors_name_the_argument(kwargs, exc, words):
    with pytest.raises(exc, match=words):
        MultiHeadAttention(**kwargs)


def test_call_errors_name_the_argument():
    layer = MultiHeadAttention(16, 4)
    x = _x()
    with pytest.raises(ValueError, match="x must have shape"):
        layer(x[..., :8])
    with pytest.raises(ValueError, match="positions"):
        layer(x, positions=np.arange(5))
    with pytest.raises(ValueError, match="positions"):
        layer(x, positions=np.arange(12) - 1)
    with pytest.raises(TypeError, match="mask"):
        layer(x, mask=np.ones((2, 12)))
    with pytest.raises(ValueError, match="mask"):
        layer(x, mask=np.ones((12, 12, 3), bool))
    with pytest.raises(ValueError, match="x must be finite"):
        layer(np.full_like(x, np.nan))
    with pytest.raises(TypeError, match="cache"):
        layer(x, cache={})


YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4096}
STATIC = [
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "ntk", "factor": 4.0},
    YARN,
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8},
]
DYNAMIC = [
    {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 4},
    {"type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 3.0],
     "original_max_position_embeddings": 4, "max_position_embeddings": 16},
]


@pytest.mark.parametrize("scaling", STATIC + DYNAMIC)
def test_scaled_rotary_decodes_like_the_full_pass_over_each_prefix(scaling):
    # Length-dependent kinds (dynamic, longrope) change frequencies with the length, so a cached
    # step must equal the full pass over the same prefix (every key rotated with that step's frequencies).
    x = _x(B=1, T=10, d=8)
    layer = MultiHeadAttention(8, 2, scheme=Rotary(layout="half", scaling=scaling))
    cache = layer.new_cache()
    for t in range(x.shape[1]):
        step = layer(x[:, t:t + 1], causal=True, cache=cache)
        np.testing.assert_allclose(step[:, 0], layer(x[:, :t + 1], causal=True)[:, -1], atol=1e-12)


def test_dynamic_rotary_never_mixes_frequencies():
    # What a cache that keeps keys rotated at insertion would compute (the production bug): key j
    # rotated with the frequencies of length j + 1, the query with those of the current length.
    # Its weights differ from the consistent ones that minipos computes.
    scaling = DYNAMIC[0]
    x = _x(B=1, T=10, d=8)
    layer = MultiHeadAttention(8, 1, scheme=Rotary(scaling=scaling))
    layer.wv = np.eye(8)
    cache = layer.new_cache()
    for t in range(10):
        _, w = layer(x[:, t:t + 1], causal=True, cache=cache, return_weights=True)
    def freqs(n):
        return rope_scaling.dynamic(8, factor=4.0, original_max_position_embeddings=4, seq_len=n)[0]
    k = x[0] @ layer.wk
    stale = np.stack([rope.apply_rope(k[j:j + 1], [j], inv_freq=freqs(j + 1))[0] for j in range(10)])
    q = rope.apply_rope((x[0, 9:] @ layer.wq), [9], inv_freq=freqs(10))
    stale_w = np.exp(q @ stale.T / np.sqrt(8))
    stale_w /= stale_w.sum()
    fresh = rope.apply_rope(k, np.arange(10), inv_freq=freqs(10))
    fresh_w = np.exp(q @ fresh.T / np.sqrt(8))
    fresh_w /= fresh_w.sum()
    np.testing.assert_allclose(w[0, 0, 0], fresh_w[0], atol=1e-12)
    assert np.max(np.abs(stale_w - fresh_w)) > 1e-3


def test_changed_frequencies_with_a_cache_raise_instead_of_mixing():
    scheme = Rotary()
    layer = MultiHeadAttention(8, 2, scheme=scheme)
    cache = layer.new_cache()
    layer(_x(1, 3, 8), cache=cache)
    scheme.inv_freq = scheme.inv_freq / 2
    with pytest.raises(ValueError, match="cache"):
        layer(_x(1, 1, 8), cache=cache)


def test_yarn_attention_factor_scales_logits_by_its_square():
    # YaRN paper / HF: factor 4 gives attention factor 0.1 ln 4 + 1 = 1.1386294361 on cos and sin,
    # so every logit is that squared times the logit with plain cos and sin.
    f = 0.1 * math.log(4.0) + 1.0
    x = _x(B=1, T=6, d=8)
    scheme = Rotary(layout="half", scaling=YARN)
    layer = MultiHeadAttention(8, 1, scheme=scheme)
    _, w = layer(x, return_weights=True)
    inv_freq = rope_scaling.yarn(8, factor=4.0, original_max_position_embeddings=4096)[0]
    q = rope.apply_rope(x[0] @ layer.wq, 6, inv_freq=inv_freq, layout="half")
    k = rope.apply_rope(x[0] @ layer.wk, 6, inv_freq=inv_freq, layout="half")
    logits = f * f * (q @ k.T) / np.sqrt(8)
    expected = np.exp(logits - logits.max(-1, keepdims=True))
    np.testing.assert_allclose(w[0, 0], expected / expected.sum(-1, keepdims=True), atol=1e-12)


@pytest.mark.parametrize("scaling, exc", [({"rope_type": "cubic"}, ValueError), ("yarn", TypeError),
                                          ({"rope_type": "linear", "factor": 0.5}, ValueError)])
def test_bad_scaling_is_rejected(scaling, exc):
    with pytest.raises(exc, match="scaling|factor"):
        MultiHeadAttention(8, 2, scheme=Rotary(scaling=scaling))


@ALL
@pytest.mark.parametrize("causal", [True, False])
def test_blockwise_layer_equals_dense(cls, causal):
    # The dense path and the online-softmax path are two forms of one computation.
    x = _x(B=2, T=11)
    keep = np.ones((2, 11), bool)
    keep[1, 8:] = False
    dense = MultiHeadAttention(16, 4, scheme=cls(), seed=3)
    blocked = MultiHeadAttention(16, 4, scheme=cls(), seed=3, block_size=4)
    np.testing.assert_allclose(blocked(x, causal=causal, mask=keep), dense(x, causal=causal, mask=keep),
                               rtol=1e-10, atol=1e-12)


@ALL
def test_blockwise_layer_float32_and_cache(cls):
    x = _x(B=1, T=10)
    dense = MultiHeadAttention(16, 4, scheme=cls(), seed=4, dtype=np.float32)
    blocked = MultiHeadAttention(16, 4, scheme=cls(), seed=4, dtype=np.float32, block_size=3)
    full = dense(x.astype(np.float32), causal=True)
    got = blocked(x.astype(np.float32), causal=True)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, full, rtol=1e-5, atol=1e-5)
    cache = blocked.new_cache()
    steps = [blocked(x[:, t:t + 2].astype(np.float32), causal=True, cache=cache) for t in range(0, 10, 2)]
    np.testing.assert_allclose(np.concatenate(steps, axis=1), full, rtol=1e-5, atol=1e-5)


def test_blockwise_layer_refuses_weights():
    layer = MultiHeadAttention(16, 4, block_size=4)
    with pytest.raises(ValueError, match="return_weights"):
        layer(_x(), return_weights=True)
    with pytest.raises(ValueError, match="block_size"):
        MultiHeadAttention(16, 4, block_size=0)


@pytest.mark.parametrize("cls", [TransformerXL, ALiBi, Rotary])
def test_segment_memory_matches_its_definition(cls):
    # Transformer-XL's recurrence: segment s (positions 4s..4s+3) attends, causally, to the
    # previous mem_len = 3 positions and to itself; the memory is then the last 3 positions seen.
    # Written as one dense pass with a banded mask: query i sees j iff start(i) - 3 <= j <= i.
    x = _x(B=1, T=12)
    layer = MultiHeadAttention(16, 4, scheme=cls(), seed=5)
    cache = layer.new_cache(mem_len=3)
    segments = [layer(x[:, s:s + 4], causal=True, cache=cache) for s in range(0, 12, 4)]
    i, j = np.arange(12)[:, None], np.arange(12)[None, :]
    band = (j <= i) & (j >= (i // 4) * 4 - 3)
    expected = layer(x, mask=band[None])
    np.testing.assert_allclose(np.concatenate(segments, axis=1), expected, atol=1e-12)
    assert cache.length == 3 and list(cache.positions) == [9, 10, 11] and cache.seen == 12


def test_deberta_takes_the_config_string_and_minus_one():
    # DeBERTa-v3's config: pos_att_type "p2c|c2p", max_relative_positions -1 (= max_position_embeddings).
    scheme = DeBERTa(position_buckets=8, max_relative_positions=-1, pos_att_type="p2c|c2p",
                     max_position_embeddings=16)
    MultiHeadAttention(16, 2, scheme=scheme)
    assert scheme.pos_att_type == ("p2c", "c2p") and scheme.max_relative_positions == 16
    assert scheme.scale(8) == pytest.approx(1 / math.sqrt(24))  # sqrt(D (1 + 2))
    with pytest.raises(ValueError, match="pos_att_type"):
        DeBERTa(pos_att_type=("c2p", "c2p"))
    with pytest.raises(ValueError, match="pos_att_type"):
        DeBERTa(pos_att_type="c2p|x")


def test_rotary_takes_rope_theta_from_rope_parameters():
    # transformers 5 keeps rope_theta inside rope_parameters: base 500000 gives theta_1 = 500000^(-1/2)
    # for a 4-dim head (pairs 0 and 1: 1 and 500000^(-2/4)).
    scheme = Rotary(scaling={"rope_type": "default", "rope_theta": 500000.0})
    MultiHeadAttention(8, 2, scheme=scheme)
    np.testing.assert_allclose(scheme.inv_freq, [1.0, 500000.0 ** -0.5])
    yarn = Rotary(scaling={"rope_type": "yarn", "rope_theta": 500000.0, "factor": 4.0,
                           "original_max_position_embeddings": 64})
    MultiHeadAttention(8, 2, scheme=yarn)
    assert yarn.base == 500000.0
    with pytest.raises(ValueError, match="rope_theta"):
        Rotary(base=10.0, scaling={"rope_type": "default", "rope_theta": 500000.0})


@pytest.mark.parametrize("make", [lambda: T5Bias(bidirectional="no"), lambda: ALiBi(symmetric="no"),
                                  lambda: MultiHeadAttention(8, 2)(_x(d=8), causal="no"),
                                  lambda: MultiHeadAttention(8, 2, seed=-1),
                                  lambda: LearnedAbsolute(std=float("nan")),
                                  lambda: XPos(scale_base=0)])
def test_more_bad_arguments_are_named(make):
    with pytest.raises((TypeError, ValueError), match="bidirectional|symmetric|causal|seed|std|scale_base"):
        make()


def test_alibi_default_is_the_distance_penalty_without_a_mask():
    # Bidirectional, wq = 0: the logits are -m |i - j| with m = 2^-8 for one head; query 1 sees
    # keys 0, 1, 2 with biases [-m, 0, -m] -> weights [e^-m, 1, e^-m] / (1 + 2 e^-m).
    layer = MultiHeadAttention(2, 1, scheme=ALiBi())
    layer.wq = np.zeros((2, 2))
    _, w = layer(_x(1, 3, 2), return_weights=True)
    m = 2.0 ** -8
    z = 1 + 2 * math.exp(-m)
    np.testing.assert_allclose(w[0, 0, 1], [math.exp(-m) / z, 1 / z, math.exp(-m) / z])
