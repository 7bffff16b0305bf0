"""``minipos.config.read`` without transformers for Gemma 4's vision tower, Gemma 4 Unified, LFM3 and DiffusionGemma:
what it reads, what it refuses and how it says so. Expected values come from transformers 5.24's config classes
(``Gemma4VisionConfig``, ``Gemma4UnifiedTextConfig``, ``Lfm3Config``: their defaults and layer rules, quoted
where used); the layers' outputs are checked against transformers in test_config_interop_gemma4_lfm3.py."""

import json

import pytest

from minipos import config
from minipos.axial import AxialRotary
from minipos.prope import ProportionalRotary
from minipos.qk_norm import QKNormAttention
from minipos.rope_scaling import Rotary

GEMMA4_VISION = {"model_type": "gemma4_vision", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
                 "head_dim": 16, "num_hidden_layers": 2}


def test_gemma4_vision_defaults_are_the_config_class():
    # Gemma4VisionConfig: 768 wide, 16 layers, 12 heads of 64, 12 key/value heads, default_theta 100 ("axial").
    m = config.read({"model_type": "gemma4_vision"})
    kw = m.specs[0].kwargs
    assert len(m.specs) == 16 and (kw["d_model"], kw["num_heads"], kw["num_kv_heads"], kw["head_dim"]) == (768, 12, 12, 64)
    assert m.specs[0].cls is QKNormAttention and kw["scale"] == 1.0 and kw["v_norm"] and not kw["bias"]
    layer = config.read(GEMMA4_VISION).layers[0]
    assert isinstance(layer.scheme, AxialRotary) and (layer.scheme.layout, layer.scheme.base) == ("gemma4", 100.0)
    assert layer.norm_offset == 0.0 and not m.specs[0].causal
    assert "(2, 10240, hidden_size)" in m.notes[0]                           # position_embedding_size's default


def test_gemma4_vision_ignores_attention_bias_as_hf_does():
    # Gemma4ClippableLinear is nn.Linear(..., bias=False) whatever attention_bias says.
    m = config.read({**GEMMA4_VISION, "attention_bias": True})
    assert m.layers[0].bq is None and m.notes[0].startswith("attention_bias is not read")


def test_a_gemma4_config_reads_its_vision_tower():
    m = config.read({"model_type": "gemma4", "text_config": {
        "model_type": "gemma4_text", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 2, "head_dim": 8, "global_head_dim": 16}, "vision_config": GEMMA4_VISION})
    assert m.vision.model_type == "gemma4_vision" and len(m.vision.layers) == 2 and not m.notes
    assert "gemma4_vision: 2 vision encoder layers" in m.describe(width=300)


@pytest.mark.parametrize("change, words", [
    ({"use_clipped_linears": True}, ["use_clipped_linears", "clamp"]),
    ({"use_clipped_linears": "yes"}, ["use_clipped_linears", "true or false"]),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 100.0, "factor": 2.0}}, ["'linear'", "'axial' only"]),
    ({"rope_parameters": {"rope_type": "axial", "rope_theta": 100.0, "factor": 2.0}}, ["'factor'", "rope_theta only"]),
    ({"head_dim": 6}, ["head dim 6", "multiple of 4"]),
    ({"num_key_value_heads": 3}, ["num_kv_heads", "gemma4_vision"]),
    ({"num_key_value_heads": 0}, ["num_key_value_heads", "integer >= 1"]),
    ({"position_embedding_size": -1}, ["position_embedding_size", "integer >= 1"]),
])
def test_gemma4_vision_bad_settings_are_named(change, words):
    with pytest.raises((ValueError, TypeError)) as err:
        config.read({**GEMMA4_VISION, **change})
    for w in words + ["gemma4_vision"]:
        assert w in str(err.value)


GEMMA4_UNIFIED = {"model_type": "gemma4_unified", "text_config": {
    "model_type": "gemma4_unified_text", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
    "num_hidden_layers": 6, "head_dim": 8, "global_head_dim": 16},
    "vision_config": {"model_type": "gemma4_unified_vision", "patch_size": 16}}


def test_gemma4_unified_defaults():
    # Gemma4UnifiedTextConfig: sliding_window 1024, five sliding layers per full one, use_bidirectional_attention
    # "vision"; its vision embedder has no attention layers, so .vision is None and a note names it.
    m = config.read(GEMMA4_UNIFIED)
    assert m.model_type == "gemma4_unified_text" and m.vision is None
    assert [s.layer_type for s in m.specs] == ["sliding_attention"] * 5 + ["full_attention"]
    assert m.specs[0].kwargs["sliding_window"] == 1024 and m.specs[5].kwargs["head_dim"] == 16
    assert isinstance(m.layers[5].scheme, ProportionalRotary) and m.layers[5].scheme.partial_rotary_factor == 0.25
    assert any("gemma4_unified_vision" in n for n in m.notes)
    assert any("use_bidirectional_attention 'vision'" in n for n in m.notes)
    text_only = {**GEMMA4_UNIFIED["text_config"], "use_bidirectional_attention": None}
    assert not any("bidirectional" in n for n in config.read(text_only).notes)


@pytest.mark.parametrize("change, words", [
    ({"use_bidirectional_attention": "all"}, ["use_bidirectional_attention", "not modelled"]),
    ({"use_bidirectional_attention": "text"}, ["use_bidirectional_attention", "'text'"]),
])
def test_gemma4_unified_what_no_layer_models_is_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({**GEMMA4_UNIFIED["text_config"], **change})
    for w in words + ["gemma4_unified_text"]:
        assert w in str(err.value)


LFM3 = {"model_type": "lfm3", "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
        "num_hidden_layers": 10, "head_dim": 8, "use_attention_gate": False}


def test_lfm3_layer_rule_rope_and_conv_note():
    # Lfm3Config: layer i is full if i % 4 == 2, sliding if i % 4 == 0 and i > 0, else conv; sliding_window 256,
    # rope_parameters sliding default theta 1e4, full proportional theta 1e6 with p = 0.5; norm_eps 1e-5.
    m = config.read(LFM3)
    assert [(s.index, s.layer_type) for s in m.specs] == [(2, "full_attention"), (4, "sliding_attention"),
                                                         (6, "full_attention"), (8, "sliding_attention")]
    assert m.specs[1].kwargs["sliding_window"] == 256 and m.specs[0].kwargs["sliding_window"] is None
    assert m.specs[0].kwargs["norm_eps"] == 1e-5 and m.specs[0].cls is QKNormAttention
    full, sliding = m.layers[0], m.layers[1]
    assert isinstance(full.scheme, ProportionalRotary) and full.scheme.partial_rotary_factor == 0.5
    assert full.scheme.base == 1e6 and isinstance(sliding.scheme, Rotary) and sliding.scheme.base == 1e4
    assert "layers 0, 1, 3, 5, 7, 9 are short convolutions" in m.notes[0] and "7 taps" in m.notes[0]
    assert "\n4      sliding_attention" in m.describe(width=300)            # rows keep the decoder's indices
    assert config.read({"model_type": "lfm3_vl", "text_config": LFM3}).model_type == "lfm3"


@pytest.mark.parametrize("gate", [True, None])                      # absent: Lfm3Config's True
def test_lfm3_attention_gate_is_one_per_head(gate):
    # Lfm3Attention: g_proj = nn.Linear(hidden_size, num_attention_heads, bias=False) when use_attention_gate, its
    # sigmoid multiplying each head's output; attention_bias puts biases on q, k, v, o but never on g_proj.
    m = config.read({k: v for k, v in {**LFM3, "use_attention_gate": gate, "attention_bias": True}.items()
                     if v is not None})
    assert [s.kwargs["gate"] for s in m.specs] == ["head"] * 4 and m.specs[0].no_bias == ("bg",)
    layer = m.layers[0]
    assert layer.wg.shape == (32, 4) and layer.bg is None and layer.bq.shape == (32,)
    assert "output gate per head" in m.specs[0].notes[1]
    off = config.read(LFM3)
    assert off.specs[0].kwargs["gate"] is None and off.layers[0].wg is None and len(off.specs[0].notes) == 1


@pytest.mark.parametrize("change, words", [
    ({"use_attention_gate": "yes"}, ["use_attention_gate", "true or false"]),
    ({"layer_types": ["conv", "mamba"] + ["conv"] * 8}, ["layer_types", "'mamba'"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}, ["nested per layer type"]),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0}}},
     ["'full_attention'", "must be a dict"]),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default", "rope_theta": 10.0},
                          "full_attention": {"rope_type": "proportional", "rope_theta": 10.0, "beta": 1.0}}},
     ["'beta'", "proportional"]),
    ({"sliding_window": 0}, ["sliding_window", "integer >= 1"]),
])
def test_lfm3_bad_settings_are_named(change, words):
    with pytest.raises((ValueError, TypeError)) as err:
        config.read({**LFM3, **change})
    for w in words + ["'lfm3'"]:
        assert w in str(err.value)


def test_diffusion_gemma_decoder_is_gemma4s_layers_bidirectional_without_a_window():
    # DiffusionGemmaTextConfig's defaults: 30 layers, every sixth full (p-RoPE 0.25, head dim 512, values = keys),
    # window 512 on the others; the read layers are the canvas's: bidirectional, their window the encoder cache's.
    m = config.read({"model_type": "diffusion_gemma", "text_config": {"model_type": "diffusion_gemma_text"}})
    assert m.model_type == "diffusion_gemma_text" and len(m.specs) == 30
    assert all(not s.causal and s.kwargs["sliding_window"] is None for s in m.specs)
    full, sliding = m.specs[5], m.specs[0]
    assert full.layer_type == "full_attention" and full.kwargs["head_dim"] == 512
    assert isinstance(full.scheme(), ProportionalRotary) and any("wv = wk" in n for n in full.notes)
    assert any("mem_len=511" in n for n in sliding.notes) and any("deepcopy" in n for n in m.notes)
    assert not any("wv = wk" in n for n in sliding.notes)
    vision = config.read({"model_type": "diffusion_gemma_text", "num_hidden_layers": 6,
                          "use_bidirectional_attention": "vision"})
    assert any(n.startswith("the encoder pass: use_bidirectional_attention 'vision'") for n in vision.notes)


@pytest.mark.parametrize("change, words", [
    ({"use_bidirectional_attention": "all"}, ["use_bidirectional_attention", "not modelled"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 10.0}}, ["nested per layer type"]),
])
def test_diffusion_gemma_what_no_layer_models_is_named(change, words):
    with pytest.raises(ValueError) as err:
        config.read({"model_type": "diffusion_gemma_text", "num_hidden_layers": 6, **change})
    for w in words + ["diffusion_gemma_text"]:
        assert w in str(err.value)


def test_lfm3_golden_vectors_name_the_decoders_own_layer_indices(tmp_path):
    # LFM3's attention layers are 2, 4, 6, 8 of its 10 (the rest are convolutions): a case's params.layer is
    # the decoder's index, and the checker rebuilds that very layer (a full p-RoPE layer for 2, a sliding one
    # for 4), not the list position.
    from minipos import cli, vectors
    path, out = tmp_path / "lfm3.json", tmp_path / "v"
    path.write_text(json.dumps(LFM3))
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    doc = json.loads((out / "model_layers.json").read_text())
    assert [(c["name"], c["params"]["layer"]) for c in doc["cases"]] == [("layer2_full_attention", 2),
                                                                         ("layer4_sliding_attention", 4)]
    assert vectors.check(str(out)) == []
    from minipos.vectors import model
    with pytest.raises(ValueError, match="attention layers"):
        model.run(doc["cases"][0]["inputs"], {**doc["cases"][0]["params"], "layer": 1})   # a convolution
