"""``minipos.config.read`` without transformers: what it reads from a config, what it refuses and how it
says so, the table it prints, the q/k-norm layer's backward, the ``minipos config`` command and the
``model_layers`` golden vectors. Expected values come from the configs themselves (the published
keys of the models in docs/configs/) and from transformers' rules as its config classes state them
(quoted where used); the layers' outputs are checked against transformers in test_config_interop.py."""

import json
import os

import numpy as np
import pytest

from minipos import cli, config, vectors
from minipos.irope import NoPETemperature
from minipos.kv_share import SharedKVAttention
from minipos.mla import MultiHeadLatentAttention, ScaledDecoupledRotary
from minipos.mrope import MRotary
from minipos.prope import ProportionalRotary
from minipos.qk_norm import QKNormAttention
from minipos.query_scale import ScaledQueryRotary
from minipos.rope_scaling import Rotary
from minipos.seams import NoPE

CONFIGS = os.path.join(os.path.dirname(__file__), os.pardir, "docs", "configs")


def _shipped(name):
    return os.path.join(CONFIGS, f"{name}.json")


def _load(name):
    with open(_shipped(name)) as f:
        return json.load(f)


def _narrow(m):
    """The model at hidden_size 16 and 2 heads, every position setting kept (the golden vectors' narrowing)."""
    from minipos.vectors.model import narrowed
    return config.read(narrowed(m.config, m.model_type))


LLAMA = {"model_type": "llama", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
         "num_hidden_layers": 2, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}}


# --- what is read --------------------------------------------------------------------------------

def test_llama31_reads_its_llama3_scaling_from_transformers4_keys():
    m = config.read(_shipped("llama-3.1-8b"))
    assert len(m.layers) == 32 and m.vision is None
    kw, scheme = m.specs[5].kwargs, m.specs[5].scheme()
    assert (kw["num_heads"], kw["num_kv_heads"], kw["head_dim"]) == (32, 8, 128)   # 4096 / 32
    assert isinstance(scheme, Rotary) and scheme.layout == "half"
    assert scheme.base == 500000.0 and scheme.scaling_kind == "llama3"
    assert scheme.scaling_args["original_max_position_embeddings"] == 8192
    layer = _narrow(m).layers[5]                             # built at hidden_size 16: the same machinery
    assert layer.head_dim == 128 and layer.scheme.scaling_kind == "llama3"


def test_layers_are_built_when_indexed_and_kept():
    m = config.read(_shipped("deepseek-v3"))             # 61 layers of 128 heads: nothing built by read
    assert "0 built" in repr(m.layers)
    kw = m.specs[0].kwargs
    assert (kw["q_lora_rank"], kw["kv_lora_rank"], kw["qk_rope_head_dim"]) == (1536, 512, 64)
    small = _narrow(m)
    first = small.layers[0]
    assert small.layers[0] is first and isinstance(first, MultiHeadLatentAttention) and "1 built" in repr(small.layers)
    assert (first.kv_lora_rank, first.qk_nope_head_dim, first.qk_rope_head_dim) == (8, 128, 64)


def test_gemma3_local_and_global_layers_with_the_config_class_defaults():
    m = config.read(_shipped("gemma-3-4b"))              # the hub file leaves heads to Gemma3TextConfig
    types = [s.layer_type for s in m.specs]
    assert types.count("full_attention") == 5 and types[5] == "full_attention"  # every sixth layer (pattern 6)
    kw = m.specs[0].kwargs
    assert (kw["num_heads"], kw["num_kv_heads"], kw["head_dim"]) == (8, 4, 256)
    local, glob = _narrow(m).layers[0], _narrow(m).layers[5]
    assert isinstance(local, QKNormAttention) and local.norm_offset == 1.0
    assert local.sliding_window == 1024 and glob.sliding_window is None
    assert local.scheme.base == 10000.0 and local.scheme.scaling_kind is None     # rope_local_base_freq
    assert glob.scheme.base == 1e6 and glob.scheme.scaling_kind == "linear"
    assert local.scale == 256 ** -0.5                                             # query_pre_attn_scalar
    assert any("vision tower" in n for n in m.notes)


def test_cohere2_sliding_layers_rotate_interleaved_and_global_layers_have_no_rope():
    m = _narrow(config.read(_shipped("cohere2")))
    kinds = [type(m.layers[i].scheme) for i in range(4)]
    assert kinds == [Rotary, Rotary, Rotary, NoPE]                                # (i + 1) % 4 == 0: global
    assert m.layers[0].scheme.layout == "interleaved" and m.layers[3].sliding_window is None


def test_llama4_irope():
    m = config.read(_shipped("llama-4-scout"))
    assert m.model_type == "llama4_text"
    m = _narrow(m)
    assert m.layers[0].attention_chunk == 8192 and isinstance(m.layers[0], QKNormAttention)
    nope = m.layers[3]                                                            # no_rope_layer_interval 4
    assert isinstance(nope.scheme, NoPETemperature) and nope.attention_chunk is None
    assert (nope.scheme.attn_scale, nope.scheme.floor_scale) == (0.1, 8192)


def test_gpt_oss_sinks_biases_and_alternating_windows():
    m = _narrow(config.read(_shipped("gpt-oss-20b")))
    assert [m.layers[i].sliding_window for i in range(2)] == [128, None]
    assert m.layers[0].sinks.shape == (2,) and m.layers[0].bq is not None
    assert m.layers[0].scheme.scaling_kind == "yarn"


def test_qwen2_vl_mrope_and_qkv_biases_only():
    m = config.read(_shipped("qwen2-vl-2b"))
    layer = m.layers[0]                                      # 1536 wide, 12 heads: 38 MB, built
    assert isinstance(layer.scheme, MRotary) and layer.scheme.mrope_section == [16, 24, 24]
    assert layer.bq is not None and layer.bo is None                              # Qwen2: o_proj has no bias
    y = layer(np.zeros((1, 3, 1536)), positions=np.array([[0, 1, 2], [0, 1, 1], [0, 0, 1]]), causal=True)
    assert y.shape == (1, 3, 1536)


def test_qwen3_vl_interleaves_the_three_streams():
    m = config.read(_shipped("qwen3-vl-4b"))             # Qwen3-VL-4B-Instruct: rope_scaling, transformers 4
    assert m.model_type == "qwen3_vl_text" and len(m.specs) == 36
    layer = _narrow(m).layers[0]
    assert isinstance(layer, QKNormAttention) and isinstance(layer.scheme, MRotary)
    assert layer.scheme.interleaved and layer.scheme.mrope_section == [24, 20, 20] and layer.scheme.base == 5e6
    assert layer.bq is None and layer.bo is None                                   # attention_bias false
    y = layer(np.ones((1, 3, 16)), positions=np.array([[0, 1, 2], [0, 1, 1], [0, 0, 1]]), causal=True)
    assert y.shape == (1, 3, 16)


QWEN3_VL = {**LLAMA, "model_type": "qwen3_vl_text", "head_dim": 16,
            "rope_parameters": {"rope_type": "default", "rope_theta": 100.0, "mrope_section": [4, 2, 2]}}


@pytest.mark.parametrize("params, words", [
    ({"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8}, ["'yarn'", "MRotary"]),
    ({"mrope_section": [4, 4]}, ["mrope_section", "three counts"]),
    ({"mrope_section": [4, -1, 2]}, ["mrope_section", "qwen3_vl_text"]),
])
def test_qwen3_vl_bad_rope_parameters_are_named(params, words):
    cfg = {**QWEN3_VL, "rope_parameters": {**QWEN3_VL["rope_parameters"], **params}}
    with pytest.raises(ValueError) as err:
        config.read(cfg)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("given, read", [
    ([4, 2, 3], [4, 2, 2]),     # width at slice(2, 9, 3) of 8 frequencies: 2, 5; time the other 4
    ([2, 3, 3], [3, 3, 2]),     # height at slice(1, 9, 3): 1, 4, 7; width 2, 5; time 0, 3, 6
    (None, [3, 3, 2]),          # HF's default [24, 20, 20] (for D = 128) on D = 16: every slice runs to the end
])
def test_qwen3_vl_reads_a_section_as_transformers_assigns_it(given, read):
    # Qwen3VLTextRotaryEmbedding.apply_interleaved_mrope writes height over freqs[..., slice(1, 3 n_h, 3)] and
    # width over slice(2, 3 n_w, 3) of the D/2 temporal frequencies, whatever the section adds up to: it runs.
    cfg = {**QWEN3_VL, "rope_parameters": {**QWEN3_VL["rope_parameters"], "mrope_section": given}}
    model = config.read(cfg)
    assert model.layers[0].scheme.mrope_section == read
    assert "which is what is read" in model.specs[0].notes[-1]


def test_qwen3_vl_reads_the_moe_text_config_and_the_flag_changes_nothing():
    # HF's Qwen3VLTextRotaryEmbedding interleaves whether mrope_interleaved is true, false or absent.
    base = {**QWEN3_VL, "model_type": "qwen3_vl_moe", "text_config": {**QWEN3_VL, "model_type": None}}
    flags = [config.read({**base, "text_config": {**base["text_config"], "rope_parameters": {
        **QWEN3_VL["rope_parameters"], "mrope_interleaved": f}}}).layers[0].scheme.interleaved for f in (True, False)]
    assert flags == [True, True]
    assert config.read(base).model_type == "qwen3_vl_moe_text"


def test_proportional_rope_reads_as_p_rope():
    # HF _compute_proportional_rope_parameters: k = int(0.25 * 16 // 2) = 2 of the 8 frequencies rotate,
    # base^(-2i/16) / factor for i < 2, zero after.
    m = config.read({**LLAMA, "head_dim": 16, "rope_parameters": {
        "rope_type": "proportional", "rope_theta": 100.0, "partial_rotary_factor": 0.25, "factor": 2.0}})
    scheme = m.layers[0].scheme
    np.testing.assert_allclose(scheme.inv_freq, [0.5, 100 ** (-2 / 16) / 2, 0, 0, 0, 0, 0, 0], rtol=1e-15)
    assert m.specs[0].position == "p-RoPE half, theta 100, 0.25 of the frequencies, factor 2"


def test_gemma4_layers_from_the_hub_file():
    m = config.read(_shipped("gemma-4-26b-a4b"))         # google/gemma-4-26B-A4B-it's text config
    types = [s.layer_type for s in m.specs]
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [5, 11, 17, 23, 29]
    kw_local, kw_global = m.specs[0].kwargs, m.specs[5].kwargs
    assert (kw_local["num_kv_heads"], kw_local["head_dim"], kw_local["sliding_window"]) == (8, 256, 1024)
    assert (kw_global["num_kv_heads"], kw_global["head_dim"], kw_global["sliding_window"]) == (2, 512, None)
    small = _narrow(m)
    local, glob = small.layers[0], small.layers[5]
    assert local.scale == glob.scale == 1.0 and local.v_norm and local.norm_offset == 0.0
    assert isinstance(local.scheme, Rotary) and local.scheme.base == 1e4
    assert isinstance(glob.scheme, ProportionalRotary) and glob.scheme.partial_rotary_factor == 0.25
    assert np.count_nonzero(glob.scheme.inv_freq) == 64                           # int(0.25 * 512 // 2)


GEMMA4 = {**LLAMA, "model_type": "gemma4_text", "num_hidden_layers": 3, "head_dim": 8, "global_head_dim": 16,
          "sliding_window": 4, "layer_types": ["sliding_attention", "sliding_attention", "full_attention"],
          "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                              "full_attention": {"rope_type": "proportional", "rope_theta": 100.0,
                                                 "partial_rotary_factor": 0.5}}}


def test_gemma4_defaults_and_the_transformers_objects_per_layer_config():
    m = config.read({**GEMMA4, "layer_types": None, "num_hidden_layers": 4, "rope_parameters": None})
    assert [s.layer_type for s in m.specs] == ["sliding_attention"] * 3 + ["full_attention"]   # the last is full
    assert m.specs[3].position == "p-RoPE half, theta 1e+06, 0.25 of the frequencies"           # class defaults
    obj = {**GEMMA4, "global_head_dim": None, "per_layer_config": {"2": {"head_dim": 32, "num_key_value_heads": 1}}}
    assert (config.read(obj).specs[2].kwargs["head_dim"], config.read(obj).specs[2].kwargs["num_kv_heads"]) == (32, 1)
    no_kv = {**GEMMA4, "num_global_key_value_heads": 1}                           # only under attention_k_eq_v
    assert config.read(no_kv).specs[2].kwargs["num_kv_heads"] == 2
    assert config.read({**no_kv, "attention_k_eq_v": True}).specs[2].kwargs["num_kv_heads"] == 1


@pytest.mark.parametrize("change, words", [
    ({"num_kv_shared_layers": 2}, ["num_kv_shared_layers", "layer 2 (full_attention)", "none of layers 0-0"]),
    ({"num_kv_shared_layers": 3}, ["num_kv_shared_layers", "below num_hidden_layers (3)", "assistant"]),
    ({"use_bidirectional_attention": "all"}, ["use_bidirectional_attention", "not modelled"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}, ["nested per layer type"]),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                          "full_attention": None}}, ["'full_attention'", "must be a dict"]),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0,
                                                "partial_rotary_factor": 0.5},
                          "full_attention": {"rope_type": "default", "rope_theta": 10.0}}},
     ["partial_rotary_factor", "ignores it"]),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default"},
                          "full_attention": {"rope_type": "default", "rope_theta": 10.0}}}, ["rope_theta", "required"]),
    ({"per_layer_config": {"2": {"sliding_window": 8}}}, ["per_layer_config", "sliding_window"]),
    ({"per_layer_config": {"7": {"head_dim": 8}}}, ["per_layer_config", "below 3"]),
    ({"global_head_dim": 0}, ["global_head_dim", "integer >= 1"]),
])
def test_gemma4_what_no_layer_models_is_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({**GEMMA4, **change})
    for w in words + ["gemma4_text"]:
        assert w in str(err.value)


def test_gemma3n_layers_and_their_shared_keys():
    # Gemma3nTextConfig's defaults: 35 layers, full every fifth, the last 15 shared: sliding layers 20-33 read layer
    # 18's keys, full layers 24, 29, 34 layer 19's; bases 10^4 (sliding) and 10^6 (full), window 512, scale 1.
    m = config.read({"model_type": "gemma3n", "text_config": {"model_type": "gemma3n_text"},
                     "audio_config": {"model_type": "gemma3n_audio"}})
    assert m.model_type == "gemma3n_text" and len(m.specs) == 35
    sources = [spec.kwargs.get("kv_source") for spec in m.specs]              # built layers would be 2048 wide
    assert sources[:20] == [None] * 20
    assert sources[20:] == [19 if (i + 1) % 5 == 0 else 18 for i in range(20, 35)]
    assert m.specs[20].cls is SharedKVAttention and m.specs[19].cls is QKNormAttention
    assert (m.specs[0].scheme().base, m.specs[4].scheme().base) == (10_000.0, 1_000_000.0)
    assert (m.specs[0].kwargs["sliding_window"], m.specs[4].kwargs["sliding_window"]) == (512, None)
    assert m.specs[0].kwargs["scale"] == 1.0 and m.specs[0].kwargs["v_norm"]
    small = config.read({"model_type": "gemma3n_text", "hidden_size": 32, "num_attention_heads": 4, "head_dim": 8,
                         "num_hidden_layers": 10, "num_kv_shared_layers": 4})
    assert small.layers[9].wk is None and small.layers[9].kv_source == 4 and small.layers[0].norm_offset == 0.0
    assert any("gemma3n_audio" in n for n in m.notes)
    # transformers 4's top-level bases and rope_scaling (on the full layers only, as HF's config class puts it)
    m = config.read({"model_type": "gemma3n_text", "num_hidden_layers": 5, "num_kv_shared_layers": 0,
                     "rope_theta": 5e5, "rope_local_base_freq": 50.0,
                     "rope_scaling": {"rope_type": "linear", "factor": 2.0}})
    assert (m.layers[0].scheme.base, m.layers[4].scheme.base) == (50.0, 5e5)
    assert (m.layers[0].scheme.scaling_kind, m.layers[4].scheme.scaling_kind) == (None, "linear")


@pytest.mark.parametrize("change, words", [
    ({"num_kv_shared_layers": 10}, ["num_kv_shared_layers", "below num_hidden_layers (10)"]),
    ({"num_kv_shared_layers": 6}, ["layer 4 (full_attention)", "none of layers 0-3"]),
    ({"num_kv_shared_layers": 1.5}, ["num_kv_shared_layers", "from 0 to num_hidden_layers (10)", "1.5"]),
    ({"num_kv_shared_layers": -1}, ["num_kv_shared_layers", "from 0 to num_hidden_layers (10)"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}, ["nested per layer type"]),
    ({"layer_types": ["chunked_attention"] * 10}, ["layer_types"]),
])
def test_gemma3n_bad_settings_are_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({"model_type": "gemma3n_text", "num_hidden_layers": 10, **change})
    for w in words + ["gemma3n_text"]:
        assert w in str(err.value)


def test_glm4v_split_mrope_on_half_the_head_in_neighbour_pairs():
    m = config.read(_shipped("glm-4.1v-9b"))             # GLM-4.1V-9B-Thinking: partial_rotary_factor 0.5
    layer = _narrow(m).layers[0]
    assert isinstance(layer.scheme, MRotary) and not layer.scheme.interleaved
    assert (layer.scheme.rotary_dim, layer.scheme.layout, layer.scheme.mrope_section) == (64, "interleaved", [8, 12, 12])
    assert layer.bq is not None and layer.bo is None                              # q/k/v biases, none on o_proj
    assert "HF's Glm4vTextAttention would" in _narrow(m).describe(width=300)      # the narrowed copy: 128 != 16 / 2
    assert "Glm4vTextAttention" not in m.describe(width=300)


GLM4V = {**LLAMA, "model_type": "glm4v_text", "num_attention_heads": 2, "partial_rotary_factor": 0.5,
         "rope_parameters": {"rope_type": "default", "rope_theta": 100.0, "mrope_section": [2, 1, 1]}}


def test_glm4v_moe_defaults_to_half_rotary_in_the_half_layout():
    # Glm4vMoeTextConfig: kwargs.setdefault("partial_rotary_factor", 0.5); rotate_half, not rotate_half_llm.
    cfg = {**GLM4V, "model_type": "glm4v_moe_text", "partial_rotary_factor": None, "attention_bias": False}
    layer = config.read(cfg).layers[0]
    assert (layer.scheme.rotary_dim, layer.scheme.layout) == (8, "half") and layer.bq is None


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1.0}}, ["'linear'", "MRotary"]),
    ({"partial_rotary_factor": 1.0}, ["mrope_section", "rotary_dim/2 = 8"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1.0}}, ["mrope_section", "[8, 12, 12]"]),
    ({"partial_rotary_factor": 0.35}, ["rotary_dim", "even"]),                    # int(16 * 0.35) = 5
])
def test_glm4v_bad_rope_parameters_are_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({**GLM4V, **change})
    for w in words + ["glm4v_text"]:
        assert w in str(err.value)


def test_exaone4_pattern_and_its_bad_values():
    # Exaone4Config: "sliding_attention" if (i + 1) % sliding_window_pattern != 0; full layers are NoPE.
    m = config.read({**LLAMA, "model_type": "exaone4", "num_hidden_layers": 4, "sliding_window": 8})
    assert [type(s.scheme()) for s in m.specs] == [Rotary, Rotary, Rotary, NoPE]
    assert m.specs[0].kwargs["sliding_window"] == 8 and m.specs[3].kwargs["sliding_window"] is None
    with pytest.raises(ValueError, match="exaone4.*sliding_window_pattern.*'LLLG'"):
        config.read({**LLAMA, "model_type": "exaone4", "sliding_window_pattern": "LLLG"})
    with pytest.raises(ValueError, match="layer_types.*'chunked_attention'"):
        config.read({**LLAMA, "model_type": "exaone4", "layer_types": ["chunked_attention"] * 2})


def test_phi3_su_is_longrope_and_its_window_is_hf_s():
    m = _narrow(config.read(_shipped("phi-3-vision-128k-text")))
    layer = m.layers[0]
    assert layer.scheme.scaling_kind == "longrope" and layer.sliding_window == 131072
    assert layer.scheme.scaling_args["original_max_position_embeddings"] == 4096  # the top-level copy


def test_smollm3_every_fourth_layer_is_nope():
    m = config.read(_shipped("smollm3-3b"))
    assert [type(s.scheme()) for s in m.specs[:4]] == [Rotary, Rotary, Rotary, NoPE]


def test_a_dict_and_a_config_object_read_alike():
    class Fake:                                            # duck-typed: anything with to_dict()
        def to_dict(self):
            return dict(LLAMA)
    assert config.read(Fake()).describe() == config.read(LLAMA).describe()


def test_transformers5_nested_rope_parameters_per_layer_type():
    cfg = {**LLAMA, "model_type": "gemma3_text", "num_hidden_layers": 2, "head_dim": 8, "sliding_window": 4,
           "query_pre_attn_scalar": 8, "layer_types": ["sliding_attention", "full_attention"],
           "rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                               "full_attention": {"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                                  "original_max_position_embeddings": 16}}}
    m = config.read(cfg)
    assert m.layers[0].scheme.base == 10.0 and m.layers[1].scheme.scaling_kind == "yarn"


def test_ministral3_scales_its_queries_by_llama_4_scaling_beta():
    m = config.read(_shipped("ministral-3-8b"))                   # mistral3: read through its text_config
    assert m.model_type == "ministral3" and len(m.specs) == 34
    scheme = m.specs[0].scheme()
    assert isinstance(scheme, ScaledQueryRotary) and scheme.layout == "half" and scheme.scaling_kind == "yarn"
    assert (scheme.beta, scheme.original_max_position_embeddings) == (0.1, 16384)
    assert "max_position_embeddings" not in scheme.scaling_args                 # HF's class ignores it for yarn
    assert "queries x (1 + 0.1 ln(1 + floor(p/16384)))" in m.specs[0].position
    # No rope_parameters at all: Ministral3Config's own (yarn 16 from 16384, beta 0.1, theta 1e6).
    m = config.read({**LLAMA, "model_type": "ministral3", "rope_parameters": None})
    scheme = m.specs[0].scheme()
    assert (scheme.base, scheme.beta, scheme.scaling_args["factor"]) == (1e6, 0.1, 16.0)
    assert m.specs[0].kwargs["head_dim"] == 128                                  # the class's default head_dim


@pytest.mark.parametrize("params, error, words", [
    ({"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0, "original_max_position_embeddings": 4}, ValueError,
     ["llama_4_scaling_beta", "required", "'ministral3'"]),
    ({"rope_type": "default", "rope_theta": 1.0, "llama_4_scaling_beta": 0.1}, ValueError,
     ["original_max_position_embeddings", "required"]),
    ({"rope_type": "default", "rope_theta": 1.0, "llama_4_scaling_beta": -1.0, "original_max_position_embeddings": 4},
     ValueError, ["llama_4_scaling_beta", "'ministral3'"]),
    ({"rope_type": "default", "rope_theta": 1.0, "llama_4_scaling_beta": "0.1", "original_max_position_embeddings": 4},
     TypeError, ["llama_4_scaling_beta", "'ministral3'"]),
])
def test_ministral3_bad_query_scale_settings_are_named(params, error, words):
    with pytest.raises(error) as err:
        config.read({**LLAMA, "model_type": "ministral3", "rope_parameters": params})
    for w in words:
        assert w in str(err.value)


MISTRAL4 = {"model_type": "mistral4", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2,
            "kv_lora_rank": 16, "q_lora_rank": 32, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8, "v_head_dim": 8,
            "max_position_embeddings": 65536,
            "rope_parameters": {"type": "yarn", "rope_theta": 10000.0, "factor": 8.0,
                                "original_max_position_embeddings": 8192, "max_position_embeddings": 65536,
                                "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                                "llama_4_scaling_beta": 0.1, "partial_rotary_factor": 0.5}}


def test_mistral4_is_mla_with_the_query_scale_and_reads_through_mistral3():
    # Values as Mistral4Config writes them (its rope_parameters default, partial_rotary_factor 8 / 16).
    for data in (MISTRAL4, {"model_type": "mistral3", "text_config": MISTRAL4}):
        m = config.read(data)
        assert m.model_type == "mistral4" and len(m.layers) == 2
        layer = m.layers[0]
        assert isinstance(layer, MultiHeadLatentAttention) and isinstance(layer.scheme, ScaledDecoupledRotary)
        assert (layer.scheme.beta, layer.scheme.original_max_position_embeddings) == (0.1, 8192)
        assert layer.scheme.layout == "interleaved" and layer.scheme.scaling_kind == "yarn"
        assert "partial_rotary_factor" not in layer.scheme.scaling_args            # the rope slice is the part
        assert "queries x (1 + 0.1 ln(1 + floor(p/8192)))" in m.specs[0].position
    half = config.read({**MISTRAL4, "rope_interleave": False, "q_lora_rank": None}).layers[0]
    assert half.scheme.layout == "half" and half.q_lora_rank is None
    m = config.read({"model_type": "mistral4"})                                    # the class's own defaults
    assert len(m.layers) == 36 and m.specs[0].kwargs["kv_lora_rank"] == 256
    assert m.specs[0].scheme().scaling_args["factor"] == 128.0


@pytest.mark.parametrize("change, error, words", [
    ({"partial_rotary_factor": 0.25}, ValueError, ["partial_rotary_factor", "qk_rope_head_dim", "'mistral4'"]),
    ({"partial_rotary_factor": "half"}, ValueError, ["partial_rotary_factor", "'mistral4'"]),
    ({"llama_4_scaling_beta": None}, ValueError, ["llama_4_scaling_beta", "required", "'mistral4'"]),
    ({"llama_4_scaling_beta": -1.0}, ValueError, ["llama_4_scaling_beta", "'mistral4'"]),
    ({"partial_rotary_factor": True}, ValueError, ["partial_rotary_factor", "'mistral4'"]),
])
def test_mistral4_bad_settings_are_named(change, error, words):
    params = {k: v for k, v in {**MISTRAL4["rope_parameters"], **change}.items() if v is not None}
    with pytest.raises(error) as err:
        config.read({**MISTRAL4, "rope_parameters": params})
    for w in words:
        assert w in str(err.value)


def test_mistral4_model_vectors_round_trip(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(MISTRAL4))
    out = tmp_path / "v"
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    assert vectors.check(str(out)) == []
    doc = json.loads((out / "model_layers.json").read_text())
    assert [c["name"] for c in doc["cases"]] == ["layer0_full_attention"]
    positions = np.array(doc["cases"][0]["inputs"]["positions"]["data"])
    assert positions.max() >= 8192                                      # the query scale's first step is reached


def test_deepseek_v2_lite_has_no_query_lora_and_rotates_interleaved():
    m = config.read(_shipped("deepseek-v2-lite"))
    kw = m.specs[0].kwargs
    assert kw["q_lora_rank"] is None and (kw["kv_lora_rank"], kw["qk_rope_head_dim"]) == (512, 64)  # null: q_proj
    scheme = m.specs[0].scheme()
    assert scheme.layout == "interleaved" and scheme.scaling_kind == "yarn"
    assert scheme.scaling_args["mscale_all_dim"] == 0.707
    # q_lora_rank absent: DeepseekV2Config's 1536.
    cfg = {k: v for k, v in _load("deepseek-v2-lite").items() if k != "q_lora_rank"}
    assert config.read(cfg).specs[0].kwargs["q_lora_rank"] == 1536


def test_deepseek_v32_layers_carry_their_indexer():
    m = config.read(_shipped("deepseek-v3.2-exp"))
    ix = m.specs[0].indexer
    assert (ix["num_heads"], ix["head_dim"], ix["rope_dim"], ix["topk"]) == (64, 128, 64, 2048)
    assert ix["inv_freq"].shape == (32,) and ix["attention_factor"] == 1.0      # mscale = mscale_all_dim: 1
    # YaRN factor 40 from 4096 (the V3 checkpoint's): the highest frequency is kept, the lowest divided by 40.
    assert ix["inv_freq"][0] == 1.0 and ix["inv_freq"][-1] == pytest.approx(10000 ** (-62 / 64) / 40, rel=1e-12)
    assert "the indexer's top 2048" in m.rows()[0][4] and m.specs[0].scheme().layout == "interleaved"


@pytest.mark.parametrize("change, words", [
    ({"qk_rope_head_dim": 160}, ["qk_rope_head_dim (160)", "index_head_dim (128)"]),
    ({"rope_scaling": {"type": "dynamic", "factor": 2.0}}, ["'dynamic'", "indexer"]),
    ({"index_topk": 0}, ["index_topk", "integer >= 1"]),
])
def test_deepseek_v32_bad_indexer_settings_are_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({**_load("deepseek-v3.2-exp"), **change})
    for w in words + ["'deepseek_v32'"]:
        assert w in str(err.value)


def test_glm_moe_dsa_indexer_types_by_the_config_class_rule():
    # GlmMoeDsaConfig.__post_init__: "full" where max(i - offset + 1, 0) % freq == 0 (offset 2), else "shared";
    # worked by hand for freq 3 over 6 layers: i = 0..5 -> 0, 0, 1, 2, 3, 4 -> F F S S F S.
    m = config.read({"model_type": "glm_moe_dsa", "num_hidden_layers": 6, "index_topk_freq": 3})
    assert [s.indexer["shared_from"] for s in m.specs] == [None, None, 1, 1, None, 4]
    assert m.specs[0].indexer["layout"] == "interleaved" and m.specs[0].kwargs["qk_nope_head_dim"] == 192
    m = config.read({"model_type": "glm_moe_dsa", "num_hidden_layers": 3, "index_topk_pattern": "FSF"})
    assert [s.indexer["shared_from"] for s in m.specs] == [None, 0, None]
    assert "layer 0's indexer's top 2048" in m.rows()[1][4]


@pytest.mark.parametrize("change, words", [
    ({"indexer_types": ["full", "full"]}, ["indexer_types", "3 layers"]),
    ({"indexer_types": ["shared", "full", "full"]}, ["indexer_types'][0]", "no layer before it"]),
    ({"indexer_types": ["full", "dense", "full"]}, ["indexer_types", "'dense'"]),
    ({"index_topk_pattern": "FXF"}, ["index_topk_pattern", "F and S"]),
    ({"layer_types": ["sliding_attention"] * 3}, ["layer_types", "'sliding_attention'"]),
])
def test_glm_moe_dsa_bad_indexer_types_are_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({"model_type": "glm_moe_dsa", "num_hidden_layers": 3, **change})
    for w in words + ["'glm_moe_dsa'"]:
        assert w in str(err.value)


PIXTRAL = {"model_type": "pixtral", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 2,
           "image_size": 64, "patch_size": 16}


def test_the_vision_tower_of_a_mistral3_config_is_read():
    m = config.read(_shipped("ministral-3-8b"))
    tower = m.vision
    assert tower.model_type == "pixtral" and tower.kind == "vision encoder" and len(tower.specs) == 24
    kw = tower.specs[0].kwargs
    assert (kw["num_heads"], kw["head_dim"], kw["bias"]) == (16, 64, False)        # 1024 / 16
    assert not tower.specs[0].causal and "110 x 110" in tower.specs[0].position     # 1540 / 14 patches a side
    assert "pixtral: 24 vision encoder layers" in m.describe() and not m.notes
    assert "bidirectional" in tower.rows()[0][4]


def test_a_vision_config_alone_and_llama4s_tower():
    m = config.read(PIXTRAL)                                    # PixtralVisionConfig's theta 10000 when none given
    assert m.kind == "vision encoder" and m.vision is None and m.layers[1].scheme.base == 10000.0
    m = config.read(_shipped("llama-4-scout"))
    spec = m.vision.specs[0]
    assert m.vision.model_type == "llama4_vision_model" and spec.kwargs["bias"] and spec.kwargs["head_dim"] == 88
    assert m.vision.layers[0].scheme.layout == "llama4" and "class token" in spec.position


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": {"rope_type": "axial", "rope_theta": 1.0, "factor": 2.0}}, ["'factor'", "'pixtral'"]),
    ({"hidden_size": 30}, ["hidden_size (30)", "num_attention_heads (4)", "'pixtral'"]),
    ({"hidden_size": 24, "model_type": "llama4_vision_model"}, ["head dim 6", "multiple of 4"]),
    ({"patch_size": 0}, ["patch_size", "integer >= 1"]),
])
def test_bad_vision_settings_are_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({**PIXTRAL, **change})
    for w in words:
        assert w in str(err.value)


QWEN25_VISION = {"model_type": "qwen2_5_vl_vision", "hidden_size": 64, "num_heads": 4, "depth": 4,
                 "window_size": 112, "patch_size": 14, "fullatt_block_indexes": [1, 3]}


def test_the_qwen_towers():
    m = config.read(_shipped("qwen2.5-vl-3b"))              # Qwen/Qwen2.5-VL-3B-Instruct: no model_type in vision_config
    tower = m.vision
    assert m.model_type == "qwen2_5_vl_text" and tower.model_type == "qwen2_5_vl_vision" and not m.notes
    full = [s.index for s in tower.specs if s.layer_type == "full_attention"]
    assert full == [7, 15, 23, 31] and len(tower.specs) == 32                    # fullatt_block_indexes
    kw = tower.specs[0].kwargs
    assert (kw["num_heads"], kw["head_dim"], kw["bias"]) == (16, 80, True)        # 1280 / 16
    # window_size 112 // merge 2 // patch 14 = 4 merged patches = 8 patches a side
    assert "axial_window_mask(positions, 8)" in tower.specs[0].notes[0] and not tower.specs[7].notes
    assert tower.layers[0].scheme.layout == "qwen" and not tower.specs[0].causal
    q2 = config.read(_shipped("qwen2-vl-2b")).vision                              # embed_dim, not hidden_size (1536)
    assert q2.model_type == "qwen2_vl_vision" and q2.specs[0].kwargs["d_model"] == 1280
    q3 = config.read(_shipped("qwen3-vl-4b")).vision
    assert q3.specs[0].kwargs["head_dim"] == 64 and "48 x 48" in q3.specs[0].notes[0] and not q3.specs[1].notes
    alias = config.read({**QWEN25_VISION, "num_heads": None, "num_attention_heads": 2, "depth": None,
                         "num_hidden_layers": 2})                                 # transformers' attribute_map
    assert alias.specs[0].kwargs["num_heads"] == 2 and len(alias.specs) == 2


@pytest.mark.parametrize("change, words", [
    ({"window_size": 20}, ["config['window_size'] (20) // spatial_merge_size (2) // patch_size (14) is 0"]),
    ({"fullatt_block_indexes": [1.5]}, ["fullatt_block_indexes", "integers >= 0"]),
    ({"fullatt_block_indexes": 3}, ["fullatt_block_indexes", "list"]),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, ["'linear'", "only 'axial'"]),
    ({"rope_parameters": {"rope_type": "axial", "rope_theta": 1e4, "factor": 2.0}}, ["'factor'"]),
    ({"hidden_size": 66}, ["hidden_size (66) is not a multiple of num_heads (4)"]),
    ({"hidden_size": 24}, ["head dim 6", "multiple of 4"]),
    ({"head_dim": 8}, ["head_dim", "16"]),
    ({"spatial_merge_size": 0}, ["spatial_merge_size", "integer >= 1"]),
    ({"model_type": "qwen3_vl_vision", "num_position_embeddings": -4}, ["num_position_embeddings", "integer >= 1"]),
    ({"model_type": "qwen2_vl_vision", "embed_dim": 30}, ["embed_dim (30)", "num_heads (4)", "qwen2_vl_vision"]),
])
def test_bad_qwen_vision_settings_are_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({**QWEN25_VISION, **change})
    for w in words:
        assert w in str(err.value)


# --- what is refused ------------------------------------------------------------------------------

@pytest.mark.parametrize("change, words", [
    ({"model_type": "bert"}, ["'bert'", "not a family"]),
    ({"rope_parameters": {"rope_type": "su2", "rope_theta": 1.0}}, ["'su2'", "model_type 'llama'"]),
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1.0, "beta_fast": 2.0}},
     ["beta_fast", "'proportional'", "model_type 'llama'"]),
    ({"rope_parameters": {"rope_type": "proportional", "rope_theta": 1.0, "partial_rotary_factor": 1.5}},
     ["partial_rotary_factor", "[0, 1]", "model_type 'llama'"]),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1.0, "factor": 2.0, "low_freq_factor": 1.0}},
     ["low_freq_factor", "model_type 'llama'"]),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0, "factor": 2.0, "llama_4_scaling_beta": 0.1,
                          "original_max_position_embeddings": 4}}, ["llama_4_scaling_beta", "ministral3", "'llama'"]),
    ({"model_type": "ernie4_5_vl_moe_text", "rope_parameters": {"rope_type": "default", "rope_theta": 1.0,
                                                                 "mrope_section": [3, 1, 0]}},
     ["mrope_section", "'ernie4_5_vl_moe_text'", "'hw'"]),
    ({"model_type": "sam3_video"}, ["sam3_video", "not support yet"]),
    ({"model_type": "pixtral", "rope_parameters": {"rope_type": "yarn", "rope_theta": 1.0}}, ["'yarn'", "'pixtral'"]),
    ({"model_type": "deepseek_v32", "kv_lora_rank": 8, "q_lora_rank": None}, ["q_lora_rank", "'deepseek_v32'"]),
    ({"num_attention_heads": None}, ["num_attention_heads", "model_type 'llama'"]),
    ({"model_type": None}, ["model_type"]),
])
def test_what_it_does_not_understand_is_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({**LLAMA, **change})
    for w in words:
        assert w in str(err.value)


def test_settings_no_layer_models_are_refused():
    cfg = {**LLAMA, "model_type": "gemma3_text", "attn_logit_softcapping": 50.0, "query_pre_attn_scalar": 8}
    with pytest.raises(ValueError, match="attn_logit_softcapping.*not modelled"):
        config.read(cfg)
    with pytest.raises(ValueError, match="mrope_interleaved.*not support yet"):
        config.read({**LLAMA, "model_type": "qwen2_vl", "rope_parameters": {
            "rope_type": "default", "rope_theta": 1.0, "mrope_section": [1, 1, 0], "mrope_interleaved": True}})
    with pytest.raises(ValueError, match="layer_types.*'chunked_attention'"):
        config.read({**LLAMA, "model_type": "gpt_oss", "layer_types": ["chunked_attention"] * 2})
    with pytest.raises(TypeError, match="config\\['attention_bias'\\] must be true or false"):
        config.read({**LLAMA, "attention_bias": "false"})
    with pytest.raises(TypeError, match="config must be"):
        config.read(42)


# --- the table and the command ---------------------------------------------------------------------

def test_describe_has_one_row_per_layer_and_the_models_settings():
    text = config.read(_shipped("gpt-oss-20b")).describe(width=400)
    lines = text.splitlines()
    assert lines[0] == "gpt_oss: 24 decoder layers"
    rows = [line for line in lines if line[:1].isdigit()]
    assert len(rows) == 24
    assert "window 128 (i-128 < j <= i)" in rows[0] and "window" not in rows[1]
    assert "sinks" in rows[0] and "yarn(factor=32" in rows[0]


def test_minipos_config_prints_the_table_and_errors_in_one_line(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["config", _shipped("llama-4-scout")]) == 0
    out = capsys.readouterr().out
    assert "llama4_text: 48 decoder layers" in out and "chunks of 8192" in out
    bad = tmp_path / "c.json"
    bad.write_text(json.dumps({**LLAMA, "model_type": "sam3_video"}))
    assert cli.main(["config", str(bad)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "not support yet" in err and "Traceback" not in err


def test_minipos_config_runs_shows_alike_layers_as_one_row(capsys, monkeypatch):
    monkeypatch.setenv("COLUMNS", "400")
    assert cli.main(["config", "--runs", _shipped("gpt-oss-20b")]) == 0       # 24 layers, sliding and full alternating
    rows = [line.split()[0] for line in capsys.readouterr().out.splitlines()[3:] if line[:1].isdigit()]
    assert rows == ["0,", "1,"] and cli.main(["config", _shipped("gpt-oss-20b")]) == 0
    assert sum(line[:1].isdigit() for line in capsys.readouterr().out.splitlines()) == 24


# --- the q/k norm layer ---------------------------------------------------------------------------

@pytest.mark.parametrize("v_norm", [False, True])
def test_qk_norm_backward_matches_finite_differences(v_norm):
    rng = np.random.default_rng(0)
    layer = QKNormAttention(16, 4, num_kv_heads=2, scheme=Rotary(layout="half"), norm_offset=1.0, norm_eps=1e-5,
                            v_norm=v_norm)
    layer.q_norm, layer.k_norm = rng.uniform(-0.5, 0.5, 4), rng.uniform(-0.5, 0.5, 4)
    x, dy = rng.standard_normal((2, 5, 16)), rng.standard_normal((2, 5, 16))
    _, ctx = layer(x, causal=True, return_context=True)
    grads = layer.backward(ctx, dy)
    for name in ("q_norm", "k_norm", "wq", "wk", "wv", "x"):
        a = x if name == "x" else getattr(layer, name)
        e, h = rng.standard_normal(a.shape), 1e-6
        saved = a.copy()
        a[...] = saved + h * e
        plus = layer(x, causal=True)
        a[...] = saved - h * e
        minus = layer(x, causal=True)
        a[...] = saved
        fd = np.sum((plus - minus) * dy) / (2 * h)
        assert abs(np.sum(grads[name] * e) - fd) <= 1e-6 * max(1.0, abs(fd)), name


def test_qk_norm_off_is_the_plain_layer():
    layer = QKNormAttention(16, 4, scheme=Rotary(), seed=3)
    layer.q_norm = layer.k_norm = None
    from minipos.layer import MultiHeadAttention
    plain = MultiHeadAttention(16, 4, scheme=Rotary(), seed=3)
    x = np.random.default_rng(1).standard_normal((1, 6, 16))
    np.testing.assert_array_equal(layer(x, causal=True), plain(x, causal=True))


def test_v_norm_by_hand():
    # One head, D = 2, v = (3, 4): the weightless RMSNorm gives v / 3.5355... = (0.8485, 1.1314); one key, so
    # the output is that value: y = v_n @ wo with wo = I.
    layer = QKNormAttention(2, 1, norm_eps=1e-300, v_norm=True)
    layer.wv, layer.wo = np.array([[3.0, 4.0], [0.0, 0.0]]), np.eye(2)
    y = layer(np.array([[[1.0, 0.0]]]), causal=True)
    np.testing.assert_allclose(y[0, 0], [3 / np.sqrt(12.5), 4 / np.sqrt(12.5)], rtol=1e-12)
    with pytest.raises(TypeError, match="v_norm"):
        QKNormAttention(2, 1, v_norm="yes")


def test_qk_norm_by_hand():
    # One head, D = 2, q = (3, 4): rms = sqrt((9 + 16) / 2) = 3.5355..., so q / rms = (0.8485, 1.1314).
    layer = QKNormAttention(2, 1, norm_eps=1e-300)
    layer.wq = np.array([[3.0, 4.0], [0.0, 0.0]])
    q, _, _ = layer._project(np.array([[[1.0, 0.0]]]))                             # x = (1, 0): q = (3, 4)
    np.testing.assert_allclose(q[0, 0, 0], [3 / np.sqrt(12.5), 4 / np.sqrt(12.5)], rtol=1e-12)


# --- golden vectors of one model -------------------------------------------------------------------

@pytest.mark.parametrize("text_type", [None, "exaone4", "exaone4_5_text"])
def test_exaone4_5_reads_its_text_config_as_exaone4(text_type):
    # Exaone4_5_Config: text_config is an Exaone4Config; its __post_init__ renames the first release's
    # "exaone4_5_text" to "exaone4" (configuration_exaone4_5.py, "BC: EXAONE 4.5 first released with ...").
    text = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
            "num_hidden_layers": 4, "sliding_window": 8, "sliding_window_pattern": 4}
    if text_type is not None:
        text["model_type"] = text_type
    m = config.read({"model_type": "exaone4_5", "text_config": text, "vision_config": {"depth": 2}})
    assert m.model_type == "exaone4" and len(m.layers) == 4 and m.vision.model_type == "exaone4_5_vision"


def test_model_vectors_round_trip_and_a_changed_value_fails(tmp_path):
    out = tmp_path / "v"
    assert cli.main(["vectors", "export", "--config", _shipped("gemma-3-4b"), str(out)]) == 0
    assert sorted(os.listdir(out)) == ["model_layers.json"]
    assert vectors.check(str(out)) == []
    doc = json.loads((out / "model_layers.json").read_text())
    names = [c["name"] for c in doc["cases"]]
    assert names == ["layer0_sliding_attention", "layer5_full_attention"]       # one case per kind of layer
    params = doc["cases"][0]["params"]
    assert params["config"]["sliding_window"] == 1024 and params["config"]["hidden_size"] == 16
    doc["cases"][0]["expected"]["y"]["data"][0] += 1e-3
    (out / "model_layers.json").write_text(json.dumps(doc))
    assert len(vectors.check(str(out))) == 1


def test_model_vectors_of_a_config_without_its_widths(tmp_path):
    # A GLM-Image decoder config stating neither hidden_size nor head_dim: the class's 4096 / 32 = 128, rotary dim
    # 64 with partial 0.5, whose 32 frequencies the sections [8, 12, 12] fill; the narrowed config keeps head dim 128.
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "glm_image_text", "num_hidden_layers": 1, "rope_parameters": {
        "rope_type": "default", "rope_theta": 10000.0, "mrope_section": [8, 12, 12], "partial_rotary_factor": 0.5}}))
    out = tmp_path / "v"
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    assert vectors.check(str(out)) == []
    doc = json.loads((out / "model_layers.json").read_text())
    assert doc["cases"][0]["params"]["config"]["head_dim"] == 128


def test_model_vectors_cover_the_vision_tower_bidirectionally(tmp_path):
    # Ministral 3's Pixtral tower: head dim 1024 / 16 = 64 kept, 2 heads in d_model 16, image 1540 / patch 14 =
    # 110 patches a side (Mistral3Config's vision_config), so the last position is (109, 109).
    from minipos.vectors import model
    out = tmp_path / "v"
    assert cli.main(["vectors", "export", "--config", _shipped("ministral-3-8b"), str(out)]) == 0
    assert vectors.check(str(out)) == []
    doc = json.loads((out / "model_layers.json").read_text())
    case = doc["cases"][-1]
    assert case["name"] == "vision0" and case["params"]["tower"] == "vision"
    assert case["params"]["narrow"] == {"d_model": 16, "num_heads": 2, "num_kv_heads": 2}
    inputs = {k: np.array(v["data"]).reshape(v["shape"]) for k, v in case["inputs"].items()}
    assert inputs["positions"][:, -1].tolist() == [109, 109] and inputs["wq"].shape == (16, 128)
    got = model.run(inputs, case["params"])["y"]
    spec = config.read(case["params"]["config"]).specs[0]
    layer = spec.cls(scheme=spec.scheme(), **{**spec.kwargs, **case["params"]["narrow"]})
    for name in ("wq", "wk", "wv", "wo"):
        setattr(layer, name, inputs[name])
    causal = layer(inputs["x"], positions=inputs["positions"], causal=True)
    assert np.max(np.abs(causal - got)) > 1e-3                           # the case is the bidirectional pass
    doc["cases"][-1]["expected"]["y"]["data"][5] += 1e-3
    (out / "model_layers.json").write_text(json.dumps(doc))
    assert len(vectors.check(str(out))) == 1
    for params, words in [({"tower": "text"}, "params.tower"), ({"narrow": None}, "params.narrow"),
                          ({"narrow": {"d_model": 16}}, "params.narrow")]:
        with pytest.raises(ValueError, match=words):
            model.run(inputs, {**case["params"], **params})


def test_model_vectors_of_a_windowed_tower_use_its_windows(tmp_path):
    # Qwen2.5-VL-3B's tower: full attention in blocks 7, 15, 23, 31, windows of 112 // 2 // 14 * 2 = 8 patches
    # elsewhere; the exported window case is the masked pass (patches 0-4 share the square at the origin).
    from minipos.vectors import model
    cases = [c for c in model.cases(_shipped("qwen2.5-vl-3b")) if c["params"].get("tower") == "vision"]
    assert [c["name"] for c in cases] == ["vision0", "vision7"]
    window = next(s for s in config.read(cases[0]["params"]["config"]).specs if s.index == 0)
    assert window.patch_window == 8 and window.layer_type == "window_attention"
    inputs = {k: np.array(v) for k, v in cases[0]["inputs"].items()}
    masked = model.run(inputs, cases[0]["params"])["y"]
    layer = window.cls(scheme=window.scheme(), **{**window.kwargs, **cases[0]["params"]["narrow"]})
    for name in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
        setattr(layer, name, inputs[name])
    assert np.max(np.abs(layer(inputs["x"], positions=inputs["positions"], causal=False) - masked)) > 1e-3


def test_model_vectors_positions_reach_the_window():
    from minipos.vectors import model
    case = model.cases(_shipped("mistral-7b-v0.1"))[0]
    positions = case["inputs"]["positions"]
    assert positions[-1] > 4096 > positions[1] - positions[0]                      # the window of 4096 bites
