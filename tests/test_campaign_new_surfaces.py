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
    with pytest.raises(ValueError, match=r"scheme.beta=0.5 \(this layer: 0.9\)"):
        layer.backward(ctx, np.ones_like(X))


# --- the config readers ---------------------------------------------------------------------------------------

MISTRAL4 = {"model_type": "mistral4", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
            "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                "original_max_position_embeddings": 8192, "llama_4_scaling_beta": 0.1,
                                "partial_rotary_factor": 0.5}}
GEMMA3N = {"model_type": "gemma3n_text", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
           "head_dim": 8, "num_hidden_layers": 10, "num_kv_shared_layers": 4, "sliding_window": 4}
GEMMA4 = {"model_type": "gemma4_text", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 6, "head_dim": 8, "global_head_dim": 16, "sliding_window": 4, "num_kv_shared_layers": 2,
          "layer_types": ["sliding_attention", "sliding_attention", "full_attention"] * 2,
          "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                              "full_attention": {"rope_type": "proportional", "rope_theta": 100.0,
                                                 "partial_rotary_factor": 0.5}}}
DIFFUSION = {**GEMMA4, "model_type": "diffusion_gemma_text", "num_kv_shared_layers": None}
MUSE = {"model_type": "muse_spark_text", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "head_dim": 8, "num_hidden_layers": 4, "sliding_window": 4}


def _rope(base, **change):
    return {**base["rope_parameters"], **change}


def _nested(kind, **change):
    return {**GEMMA4["rope_parameters"], kind: {**GEMMA4["rope_parameters"][kind], **change}}


BAD = [
    # a falsy rope_type read as "default" (the YaRN keys beside it ignored); transformers raises for it
    (MISTRAL4, {"rope_parameters": _rope(MISTRAL4, rope_type=False)}, ["rope_type", "string"]),
    (GEMMA4, {"rope_parameters": _nested("sliding_attention", rope_type=0)}, ["rope_type", "string"]),
    # int(head_dim * inf): OverflowError; int(head_dim * nan): ValueError without the key
    (MISTRAL4, {"rope_parameters": _rope(MISTRAL4, partial_rotary_factor=float("inf"))}, ["partial_rotary_factor"]),
    (MISTRAL4, {"rope_parameters": _rope(MISTRAL4, partial_rotary_factor=float("nan"))}, ["partial_rotary_factor"]),
    # checked only by a built layer: read succeeded, `minipos config` printed the table, the first layer raised
    (MISTRAL4, {"rope_parameters": _rope(MISTRAL4, factor="x")}, ["factor", "layer 0"]),
    (MISTRAL4, {"qk_rope_head_dim": 7}, ["qk_rope_head_dim", "even"]),
    (GEMMA3N, {"rope_scaling": {"rope_type": "yarn", "factor": "x"}}, ["factor", "layer 4"]),
    (GEMMA4, {"global_head_dim": 7}, ["head_dim = 7", "layer 2 (full_attention)"]),
    (GEMMA3N, {"sliding_window": 2 ** 70}, ["sliding_window", "2**62"]),
    (MUSE, {"rope_parameters": {"rope_type": "linear", "rope_theta": 10.0, "factor": -2.0}}, ["factor", ">= 1.0"]),
    # float() of the raw value: "could not convert string to float", or a late "norm_eps must be > 0"
    (GEMMA3N, {"rms_norm_eps": "x"}, ["config['rms_norm_eps']", "real number"]),
    (GEMMA4, {"rms_norm_eps": -1.0}, ["config['rms_norm_eps']", "> 0"]),
    (DIFFUSION, {"rms_norm_eps": True}, ["config['rms_norm_eps']", "real number"]),
    (MUSE, {"rms_norm_eps": []}, ["config['rms_norm_eps']", "real number"]),
    (MUSE, {"qk_scale_factor": 0}, ["config['qk_scale_factor']", "> 0"]),
    (MUSE, {"qk_scale_factor": "x"}, ["config['qk_scale_factor']", "real number"]),
    # key/value heads that do not group the heads: a late "num_kv_heads (3) must divide num_heads (4)"
    (GEMMA3N, {"num_key_value_heads": 3}, ["config['num_key_value_heads']", "must divide"]),
    (MUSE, {"num_key_value_heads": None}, ["config['num_key_value_heads'] (16", "must divide"]),   # the default
    (DIFFUSION, {"num_global_key_value_heads": 3}, ["config['num_global_key_value_heads']", "must divide"]),
    # a falsy non-integer read as 0; a non-dict read as the defaults
    (GEMMA3N, {"num_kv_shared_layers": []}, ["num_kv_shared_layers", "integer"]),
    (GEMMA3N, {"num_kv_shared_layers": False}, ["num_kv_shared_layers", "integer"]),
    (GEMMA3N, {"rope_parameters": []}, ["rope_parameters", "nested per layer type"]),
    (GEMMA4, {"rope_parameters": []}, ["rope_parameters", "nested per layer type"]),
    (GEMMA3N, {"rope_parameters": {"sliding_attention": "x"}}, ["config['rope_parameters']['sliding_attention']"]),
    # a rope_theta of null reached describe()'s f"{theta:g}"; a bad legacy base was named "scaling['rope_theta']"
    (GEMMA4, {"rope_parameters": _nested("sliding_attention", rope_theta=None)}, ["['rope_theta']", "real number"]),
    (MUSE, {"rope_parameters": {"rope_type": "default", "rope_theta": None}}, ["['rope_theta']", "real number"]),
    (GEMMA3N, {"rope_local_base_freq": "x"}, ["config['rope_local_base_freq']"]),
    # sorted() of a mixed list: "'<' not supported between instances of 'str' and 'float'"
    (MUSE, {"layer_rope_theta": [1e4, 0, "x", 0]}, ["layer_rope_theta", "one number per layer"]),
    # one LayerSpec per layer: a huge count made read() loop for ever
    (GEMMA3N, {"num_hidden_layers": 2 ** 16 + 1, "num_kv_shared_layers": 0}, ["num_hidden_layers", "at most 65536"]),
]


@pytest.mark.parametrize("base, change, words", BAD, ids=[f"{b['model_type']}-{'-'.join(c)}" for b, c, _ in BAD])
def test_bad_values_are_named_with_the_key_and_the_model_type(base, change, words):
    with pytest.raises((ValueError, TypeError)) as err:
        config.read({**base, **change})
    for w in words + [repr(base["model_type"])]:
        assert w in str(err.value)


def test_a_text_config_that_is_not_an_object_is_named():
    with pytest.raises(TypeError, match=r"model_type 'mistral3': config\['text_config'\] must be an object"):
        config.read({"model_type": "mistral3", "text_config": [MISTRAL4]})


def test_muse_reads_an_unread_partial_rotary_factor_of_any_type_with_its_note():
    # transformers 5.24's default rotary reads no partial_rotary_factor; the note formatted it with :g and raised
    # "Unknown format code 'g' for object of type 'str'".
    m = config.read({**MUSE, "partial_rotary_factor": "half"})
    assert any(n.startswith("partial_rotary_factor half is not read") for n in m.notes)


def _write(tmp_path, name, data):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


@pytest.mark.parametrize("data, words", [
    ({**MUSE, "layer_rope_theta": [1e4, 0, "x", 0]}, ["layer_rope_theta"]),
    ({"model_type": "gemma3n", "text_config": {**GEMMA3N, "rope_parameters": {"sliding_attention": "x"}}},
     ["sliding_attention"]),
    ({"model_type": "mistral3", "text_config": {**MISTRAL4, "rope_parameters": _rope(MISTRAL4, factor="x")}},
     ["factor"]),
])
def test_the_commands_say_it_in_one_line(tmp_path, capsys, data, words):
    path = _write(tmp_path, "config.json", data)
    for argv in (["config", path], ["vectors", "export", "--config", path, str(tmp_path / "out")]):
        assert cli.main(argv) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "Traceback" not in err
        for w in words:
            assert w in err


def test_model_vectors_of_an_original_length_no_position_reaches(tmp_path, capsys):
    # The stride that takes seven tokens past L = 2**70 overflowed int64: a traceback from `vectors export`.
    data = {**MISTRAL4, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "llama_4_scaling_beta": 0.1,
                                            "original_max_position_embeddings": 2 ** 70}}
    assert cli.main(["vectors", "export", "--config", _write(tmp_path, "c.json", data), str(tmp_path / "v")]) == 0
    assert cli.main(["vectors", "check", str(tmp_path / "v")]) == 0


@pytest.mark.parametrize("model_type", ["qwen3", "lfm3", "exaone4", "minimax_m3_vl_text", "step3p5", "llama4_text",
                                        "gemma3_text", "qwen3_5_text"])
@pytest.mark.parametrize("eps, error", [("x", TypeError), (True, TypeError), (-1e-6, ValueError), (0.0, ValueError)])
def test_every_reader_names_a_bad_norm_eps(model_type, eps, error):
    # The readers read rms_norm_eps (LFM3: norm_eps) through FamilyConfig.float: a string, a bool, a negative or zero
    # epsilon is refused naming the key and the model type (float() took True for 1.0 and named nothing).
    from minipos import config
    data = {"model_type": model_type, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 16, "num_hidden_layers": 2, "rope_theta": 1e4, "rms_norm_eps": eps, "norm_eps": eps}
    with pytest.raises(error) as err:
        config.read(data)
    assert "eps" in str(err.value) and f"'{model_type}'" in str(err.value)
