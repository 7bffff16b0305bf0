"""The hostile-input campaign on the surfaces added with Gemma 3n, Gemma 4's shared layers, DiffusionGemma, Mistral 4
and Muse Spark: ``minipos.kv_share.SharedKVAttention``, ``QKNormAttention(o_norm=True)``, ``ScaledDecoupledRotary``
in ``MultiHeadLatentAttention`` and the config readers of those families. Each test holds an input that a defect
answered with a silent wrong result, an internal error or a message that named neither the argument nor the
model type. Expected values: the layers' own full passes (a decoding run must equal it), the query scale's
definition (``s(p) = 1`` for every ``p < L``) and transformers 5.24's behaviour where quoted."""

import json

import numpy as np
import pytest

from minipos import cli, config
from minipos.cache import KVCache
from minipos.kv_share import SharedKVAttention
from minipos.mla import MultiHeadLatentAttention, ScaledDecoupledRotary, absorbed_attention, latent_kv
from minipos.qk_norm import QKNormAttention
from minipos.query_scale import llama4_query_scale
from minipos.rope_scaling import Rotary
from minipos.seams import NoPE
from minipos.streaming import StreamingCache

KW = {"num_kv_heads": 1, "head_dim": 8}
X = np.random.default_rng(0).standard_normal((2, 7, 16))


def _pair(window=None, source_scheme=None):
    src = QKNormAttention(16, 2, scheme=source_scheme or Rotary(layout="half"), seed=1, sliding_window=window, **KW)
    shared = SharedKVAttention(16, 2, kv_source=0, scheme=Rotary(layout="half"), seed=2, sliding_window=window, **KW)
    return src, shared


def _state(cache):
    return cache.length, cache.seen, cache.k.copy(), cache.v.copy(), cache.positions.copy()


def _unchanged(cache, before):
    after = _state(cache)
    return after[:2] == before[:2] and all(np.array_equal(a, b) for a, b in zip(after[2:], before[2:]))


# --- SharedKVAttention ----------------------------------------------------------------------------------------

def test_a_source_rotated_in_another_layout_is_refused_by_name_not_by_bytes():
    # The cache's tag held the RoPE frequencies but not the layout: keys rotated in pairs (2i, 2i + 1) were read by
    # queries rotated in pairs (i, i + D/2), silently. The message named the tags' raw bytes.
    src, shared = _pair(source_scheme=Rotary(layout="interleaved"))
    cache = src.new_cache()
    src(X, causal=True, cache=cache)
    before = _state(cache)
    with pytest.raises(ValueError, match="the source layer \\(0\\) must have this layer's scheme") as err:
        shared(X, causal=True, cache=cache)
    assert "\\x" not in str(err.value) and _unchanged(cache, before)


def test_a_cache_whose_values_are_narrower_than_the_head_is_refused():
    # A NoPE layer reads any cache of tag None; values 3 wide met wo (H * 8, d_model) in numpy's matmul.
    shared = SharedKVAttention(16, 2, kv_source=0, scheme=NoPE(), **KW)
    cache = KVCache()
    cache.append(np.ones((2, 1, 7, 8)), np.ones((2, 1, 7, 3)), np.arange(7))
    with pytest.raises(ValueError, match=r"values 3\); this layer takes num_kv_heads=1 of head_dim=8"):
        shared(X, causal=True, cache=cache)


def test_a_rolling_cache_must_keep_the_whole_window():
    # HF hands a shared layer its source's keys before the sliding cache is cut (DynamicSlidingWindowLayer.update
    # returns the full states), so at window W the shared query sees W keys; a cache of mem_len W - 1 read after the
    # source's call holds W - 1 of them: the decoding run differed from the full pass without a word.
    src, shared = _pair(window=3)
    full_cache = src.new_cache()
    src(X, causal=True, cache=full_cache)
    full = shared(X, causal=True, cache=full_cache)
    cache = src.new_cache(mem_len=2)
    for t in range(2):                                                   # nothing forgotten yet
        src(X[:, t:t + 1], causal=True, cache=cache)
        shared(X[:, t:t + 1], causal=True, cache=cache)
    src(X[:, 2:3], causal=True, cache=cache)
    before = _state(cache)
    with pytest.raises(ValueError, match=r"forgotten keys \(mem_len=2\).*sliding_window \+ T - 1 = 3"):
        shared(X[:, 2:3], causal=True, cache=cache)
    assert _unchanged(cache, before)
    cache, steps = src.new_cache(mem_len=3), []                          # the whole window: exact
    for t in range(7):
        src(X[:, t:t + 1], causal=True, cache=cache)
        steps.append(shared(X[:, t:t + 1], causal=True, cache=cache))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-12, atol=1e-13)


def test_a_cache_that_forgot_keys_without_a_window_is_refused():
    src, shared = _pair()
    cache = src.new_cache(mem_len=3)
    src(X[:, :5], causal=True, cache=cache)                             # keeps keys 2-4; the queries 2-4 need 0-4
    with pytest.raises(ValueError, match="forgotten keys"):
        shared(X[:, 2:5], causal=True, cache=cache)


def test_an_evicting_streaming_cache_is_refused():
    # After an eviction the kept keys sit at new positions: the shared query met the sink one step nearer than its
    # source did.
    src, shared = _pair()
    cache = StreamingCache(src, num_sinks=1, window=2)
    for t in range(2):
        src(X[:, t:t + 1], causal=True, cache=cache)
        shared(X[:, t:t + 1], causal=True, cache=cache)
    src(X[:, 2:3], causal=True, cache=cache)
    with pytest.raises(ValueError, match="StreamingCache that has evicted keys"):
        shared(X[:, 2:3], causal=True, cache=cache)


def test_the_context_keeps_its_key_positions_when_the_source_cache_moves_on():
    # ctx.k_positions was a view of the cache's positions, which a commit with mem_len rewrites in place: the
    # backward after the source's next step masked with the moved positions.
    src, shared = _pair()
    cache = src.new_cache(mem_len=3)
    src(X[:, :3], causal=True, cache=cache)
    _, ctx = shared(X[:, :3], causal=True, cache=cache, return_context=True)
    dy = np.random.default_rng(1).standard_normal((2, 3, 16))
    before = shared.backward(ctx, dy)
    src(X[:, 3:4], causal=True, cache=cache)                             # drops key 0, moves the rest down
    after = shared.backward(ctx, dy)
    assert ctx.k_positions.tolist() == [0, 1, 2]
    for name in before:
        np.testing.assert_array_equal(after[name], before[name])


def test_an_empty_call_gives_an_empty_output():
    # T = 0 took the whole cache as its positions (cache.positions[-0:]) and failed with "positions must have
    # length 0, got shape (7,)"; MultiHeadAttention returns (B, 0, d_model).
    src, shared = _pair()
    cache = src.new_cache()
    src(X, causal=True, cache=cache)
    assert shared(X[:, :0], causal=True, cache=cache).shape == (2, 0, 16)


# --- QKNormAttention(o_norm=True) ---------------------------------------------------------------------------

@pytest.mark.parametrize("value", ["no", None, 1])
def test_o_norm_switched_to_a_non_bool_is_refused_at_the_call(value):
    # The constructor checks o_norm; the attribute, switchable between calls, was read by truthiness ("no": on).
    layer = QKNormAttention(16, 4, o_norm=True, seed=3)
    layer.o_norm = value
    with pytest.raises(TypeError, match="o_norm must be True or False"):
        layer(X)


def test_norm_eps_set_after_construction_is_named():
    layer = QKNormAttention(16, 4, o_norm=True, seed=3)
    layer.norm_eps = -1.0
    with pytest.raises(ValueError, match="norm_eps must be > 0"):           # was "eps must be > 0" (rms_norm's)
        layer(X)


def test_a_context_of_an_o_norm_pass_is_refused_once_o_norm_is_off():
    layer = QKNormAttention(16, 4, o_norm=True, gate="feature", seed=3)
    _, ctx = layer(X, causal=True, return_context=True)
    layer.o_norm = False
    with pytest.raises(ValueError, match=r"o_norm=True \(this layer: False\)"):
        layer.backward(ctx, np.ones_like(X))


# --- ScaledDecoupledRotary in MultiHeadLatentAttention -------------------------------------------------------

def _mla(scheme, **kw):
    return MultiHeadLatentAttention(16, 2, kv_lora_rank=6, q_lora_rank=5, qk_nope_head_dim=4, qk_rope_head_dim=4,
                                    v_head_dim=3, scheme=scheme, seed=1, **kw)


def test_an_original_length_past_int64_scales_no_query():
    # Every int64 position p is below L = 2**70, so floor(p / L) = 0 and s(p) = 1 (transformers: position_ids / L in
    # float32, floored: 0). The reference raised OverflowError at the first call.
    assert llama4_query_scale(np.array([0, 5, 2**62]), beta=0.5, original_max_position_embeddings=2**70).tolist() == [1.0] * 3
    far = _mla(ScaledDecoupledRotary(beta=0.5, original_max_position_embeddings=2**70))
    plain = _mla(ScaledDecoupledRotary(beta=0.0, original_max_position_embeddings=4))
    pos = np.arange(7)
    np.testing.assert_array_equal(far(X, causal=True), plain(X, causal=True))
    np.testing.assert_array_equal(absorbed_attention(far, X, pos, *latent_kv(far, X, pos), pos),
                                  absorbed_attention(plain, X, pos, *latent_kv(plain, X, pos), pos))


def test_empty_batches_and_sequences_go_through_the_latent_layer():
    layer = _mla(ScaledDecoupledRotary(beta=0.5, original_max_position_embeddings=4))
    assert layer(X[:, :0]).shape == (2, 0, 16) and layer(X[:0]).shape == (0, 7, 16)
    c_kv, k_rope = latent_kv(layer, X, np.arange(7))
    assert absorbed_attention(layer, X[:, :0], np.arange(0), c_kv, k_rope, np.arange(7)).shape == (2, 0, 16)


def test_a_context_is_refused_once_the_query_scale_changed():
    # beta is read at every call: a backward with another beta than its forward's gave gradients of neither.
    layer = _mla(ScaledDecoupledRotary(beta=0.5, original_max_position_embeddings=4))
    _, ctx = layer(X, causal=True, return_context=True)
    layer.scheme.beta = 0.9
    with pytest.raises(ValueError, match=r"query_scale=\(0.5, 4\) \(this layer: \(0.9, 4\)\)"):
        layer.backward(ctx, np.ones_like(X))
