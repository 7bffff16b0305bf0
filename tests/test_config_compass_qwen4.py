"""``minipos.config.read`` without transformers for the families of ``minipos._config_compass_qwen4``: what it reads
(``describe``: the scheme and the window of each layer), what it refuses and how it says so (a ``ValueError`` naming
the key and the model type). Expected values are the transformers 5.24 config classes' defaults and rules, quoted
beside each test, and sections worked by hand from ``recomposition_frequencies``; the layers' outputs are checked
against transformers in test_config_interop_compass_qwen4.py."""

import json

import pytest

from minipos import cli, vectors
from minipos import config as mconfig
from minipos._config_vision import hf_interleaved_section
from minipos.mrope import MRotary
from minipos.qk_norm import QKNormAttention
from minipos.seams import NoPE

MROPE = {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [4, 2, 2]}
COMPASS = {"model_type": "cohere_compass_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
           "num_hidden_layers": 4, "sliding_window": 8, "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
           "rope_parameters": {"sliding_attention": MROPE, "full_attention": None}}


@pytest.mark.parametrize("section, half, want", [
    ([11, 11, 10], 32, [11, 11, 10]),      # Qwen4-Exp at partial_rotary_factor 0.25 of 256: the section as given
    ([11, 11, 10], 128, [107, 11, 10]),    # ... on the full head: H at 1, 4, ..., 31; W at 2, 5, ..., 29; T the rest
    ([24, 20, 20], 64, [24, 20, 20]),      # Qwen3-VL at head dim 128
    ([24, 20, 20], 8, [3, 3, 2]),          # on 8 frequencies: H at 1, 4, 7; W at 2, 5; T at 0, 3, 6
    ([2, 1, 1], 4, [2, 1, 1]),
])
def test_the_section_transformers_gives(section, half, want):
    assert hf_interleaved_section(section, half) == want


# --------------------------------------------------------------------------- Cohere Compass

def test_cohere_compass_layers_window_and_nope():
    # CohereCompassTextConfig: head_dim = hidden_size // num_attention_heads = 16; sliding layers take
    # sliding_window; CohereCompassRotaryEmbedding: a null entry leaves that layer type without RoPE.
    m = mconfig.read({"model_type": "cohere_compass", "text_config": COMPASS})
    assert m.model_type == "cohere_compass_text" and m.vision is None
    table = m.describe(width=300)
    assert "0      sliding_attention  4/2 x 16  M-RoPE half, interleaved (T H W T H W ...), theta 10000, sections " \
           "[4, 2, 2]" in table and "window 8 (i-8 < j <= i)" in table
    assert "3      full_attention     4/2 x 16  NoPE (rope_parameters['full_attention'] is null)" in table
    assert isinstance(m.layers[3].scheme, NoPE) and m.specs[3].kwargs["sliding_window"] is None
    layer = m.layers[0]
    assert isinstance(layer.scheme, MRotary) and layer.scheme.interleaved and layer.bq is None


def test_cohere_compass_defaults_and_dangling_rope_keys():
    # layer_types default: every layer "full_attention"; a rope_theta / rope_type beside the layer types is dropped
    # (convert_rope_params_to_dict); attention_bias on all four; no mrope_section: [24, 20, 20].
    m = mconfig.read({**COMPASS, "layer_types": None, "attention_bias": True, "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 500.0}, "rope_theta": 1.0, "rope_type": "default"}})
    assert [s.layer_type for s in m.specs] == ["full_attention"] * 4
    assert m.layers[0].scheme.mrope_section == [3, 3, 2] and m.layers[0].scheme.base == 500.0  # 8 of [24, 20, 20]
    assert m.layers[0].bo is not None and "[3, 3, 2], which is what is read" in m.specs[0].notes[0]
    assert m.vision is None


def test_cohere_compass_ignores_partial_rotary_factor_as_hf_does():
    # CohereCompassRotaryEmbedding.compute_default_rope_parameters: dim = head_dim, whatever partial_rotary_factor says.
    rope = {"sliding_attention": {**MROPE, "mrope_section": [2, 1, 1], "partial_rotary_factor": 0.5},
            "full_attention": None}
    m = mconfig.read({**COMPASS, "rope_parameters": rope})
    assert m.layers[0].scheme.rotary_dim == 16 and m.layers[0].scheme.mrope_section == [6, 1, 1]
    assert any("partial_rotary_factor is not read" in n for n in m.specs[0].notes)


def test_cohere_compass_tower_and_its_renamed_model_type():
    # CohereCompassConfig.__post_init__: a vision_config of model_type "cohere_compass" is the tower.
    m = mconfig.read({"model_type": "cohere_compass", "text_config": COMPASS,
                      "vision_config": {"model_type": "cohere_compass", "depth": 2, "hidden_size": 32, "num_heads": 2}})
    assert m.vision.model_type == "cohere_compass_vision" and len(m.vision.layers) == 2
    assert "merge_positions(h, w, 2)" in m.vision.specs[0].position and "learned position table" in \
        m.vision.specs[0].notes[0]


@pytest.mark.parametrize("change, words", [
    ({"rope_parameters": None}, ["rope_parameters", "one entry per layer type"]),          # the class's default {}
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}, ["no entry for layer type 'sliding_attention'"]),
    ({"rope_parameters": {"sliding_attention": MROPE, "full_attention": None, "extra": 1}}, ["'extra'"]),
    ({"rope_parameters": {"sliding_attention": {"rope_type": "default"}, "full_attention": None}},
     ["['sliding_attention']['rope_theta'] is required"]),
    ({"rope_parameters": {"sliding_attention": {**MROPE, "rope_type": "linear", "factor": 2.0},
                          "full_attention": None}},
     ["'linear'", "MRotary"]),
    ({"rope_parameters": {"sliding_attention": {**MROPE, "mrope_section": [4, 2]}, "full_attention": None}},
     ["mrope_section"]),
    ({"layer_types": ["chunked_attention"] * 4}, ["layer_types", "'chunked_attention'"]),
    ({"hidden_size": 66}, ["hidden_size (66) is not a multiple of num_attention_heads (4)"]),
])
def test_cohere_compass_bad_configs_name_the_key(change, words):
    with pytest.raises(ValueError) as err:
        mconfig.read({**COMPASS, **change})
    for w in words + ["'cohere_compass_text'"]:
        assert w in str(err.value)


def test_cohere_compass_narrowed_head_dim_is_kept_with_a_note():
    m = mconfig.read({**COMPASS, "hidden_size": 16, "num_attention_heads": 2, "head_dim": 16})
    assert m.layers[0].head_dim == 16 and "hidden_size // num_attention_heads = 8" in m.specs[0].notes[0]


# --------------------------------------------------------------------------- Qwen4-Exp

QWEN4 = {"model_type": "qwen4_exp_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
         "head_dim": 32, "num_hidden_layers": 8, "indexer_n_heads": 4, "indexer_kv_heads": 1, "indexer_head_dim": 32,
         "indexer_budget": 2048, "indexer_compress_ratio": 4}


def test_qwen4_exp_defaults():
    # Qwen4ExpTextConfig: layer i "indexed_attention" when (i + 1) % 4 == 0, else "linear_attention"; head_dim 256,
    # 16 heads, 2 key/value heads, no partial_rotary_factor (1.0), mrope_section [11, 11, 10] of 128 frequencies.
    m = mconfig.read({"model_type": "qwen4_exp"})
    assert m.model_type == "qwen4_exp_text" and [s.index for s in m.specs] == list(range(3, 40, 4))
    assert m.specs[0].kwargs == {"d_model": 2048, "num_heads": 16, "num_kv_heads": 2, "head_dim": 256, "bias": False,
                                 "norm_eps": 1e-6, "norm_offset": 1.0, "gate": "feature"}
    layer = m.layers[0]
    assert isinstance(layer, QKNormAttention) and layer.scheme.mrope_section == [107, 11, 10]
    assert layer.scheme.rotary_dim == 256 and "[107, 11, 10], which is what is read" in m.specs[0].notes[-1]
    assert "builds its Qwen4ExpTextQSAIndexer whatever the config says" in m.notes[0]


def test_qwen4_exp_layers_qsa_and_describe():
    # The checkpoint's layer_types say "full_attention" where Qwen4ExpTextConfig means "indexed_attention".
    cfg = {**QWEN4, "layer_types": ["linear_attention"] * 3 + ["full_attention"] + ["linear_attention"] * 3 +
           ["full_attention"], "rope_parameters": {"rope_type": "default", "rope_theta": 1e7,
                                                   "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1],
                                                   "mrope_interleaved": True}}
    m = mconfig.read({"model_type": "qwen4_exp", "text_config": cfg})
    assert [(s.index, s.layer_type) for s in m.specs] == [(3, "indexed_attention"), (7, "indexed_attention")]
    table = m.describe(width=300)
    assert ("3      indexed_attention  4/2 x 32  M-RoPE half, interleaved (T H W T H W ...), theta 1e+07, sections "
            "[2, 1, 1] (t, h, w), on the first 8 of 32 features; positions (3, T)  causal") in table
    assert "top 512 blocks of 4" in m.notes[0] and "fewer than 2052 keys keeps them all" in m.notes[0]
    assert "layers 0, 1, 2, 4, 5, 6 are gated delta nets" in m.notes[1]


@pytest.mark.parametrize("change, words", [
    ({"indexer_budget": None}, ["config['indexer_budget'] is required"]),
    ({"indexer_kv_heads": 2}, ["indexer_kv_heads", "one key head"]),
    ({"indexer_budget": 10}, ["indexer_budget", "multiple of indexer_compress_ratio"]),
    ({"layer_types": ["sliding_attention"] * 8}, ["layer_types", "'sliding_attention'"]),
    ({"full_attention_interval": 0}, ["full_attention_interval"]),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, ["'yarn'", "MRotary"]),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.3}},
     ["partial_rotary_factor"]),
    ({"head_dim": None, "hidden_size": 64}, []),                                  # the class's 256
])
def test_qwen4_exp_bad_configs_name_the_key(change, words):
    cfg = {k: v for k, v in {**QWEN4, **change}.items() if v is not None}
    if not words:
        assert mconfig.read(cfg).layers[0].head_dim == 256
        return
    with pytest.raises(ValueError) as err:
        mconfig.read(cfg)
    for w in words + ["'qwen4_exp_text'"]:
        assert w in str(err.value)


# --------------------------------------------------------------------------- MLCD, LFM3-VL's tower

def test_mlcd_defaults_and_notes():
    # MLCDVisionConfig: 1664 wide, 48 layers, 16 heads (head dim 104), image 336, patch 14, rope_theta 1e4 "axial".
    m = mconfig.read({"model_type": "mlcd_vision_model"})
    assert m.kind == "vision encoder" and len(m.layers) == 48
    assert m.specs[0].kwargs == {"d_model": 1664, "num_heads": 16, "num_kv_heads": 16, "head_dim": 104, "bias": True}
    assert "axial_positions(h, w, class_token='first')" in m.specs[0].position
    assert "scheme.class_pos_emb = HF's class_pos_emb[0]" in m.specs[0].position
    assert "class_pos_emb (52 values" in m.notes[0] and "no learned position table" in m.notes[1]
    # MLCDVisionModel.class_pos_emb is (1, head_dim // 2): one angle per pair (i, i + 52) of the "qwen" layout
    scheme = m.layers[0].scheme
    assert scheme.class_angles and scheme.layout == "qwen" and scheme.class_pos_emb.shape == (52,)
    assert list(scheme.parameters()) == ["class_pos_emb"]


@pytest.mark.parametrize("change, words", [
    ({"num_key_value_groups": 2}, ["num_key_value_groups"]),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, ["'linear'", "only 'axial'"]),
    ({"hidden_size": 30, "num_attention_heads": 4}, ["hidden_size (30)"]),
])
def test_mlcd_bad_configs_name_the_key(change, words):
    with pytest.raises(ValueError) as err:
        mconfig.read({"model_type": "mlcd_vision_model", **change})
    for w in words + ["'mlcd_vision_model'"]:
        assert w in str(err.value)


def test_lfm3_vl_tower_attention_layers():
    # Lfm3VlVisionConfig: layer i "conv" if i < 2 or i odd, else "full_attention" (14 layers: 2, 4, ..., 12); 16
    # heads of 1024 // 16 = 64, 8 key/value heads, norm_eps 1e-5, default_theta 1e6 ("axial"), merge 2.
    text = {"model_type": "lfm3", "hidden_size": 32, "num_hidden_layers": 3}
    m = mconfig.read({"model_type": "lfm3_vl", "text_config": text, "vision_config": {}})
    tower = m.vision
    assert tower.model_type == "lfm3_vl_vision" and [s.index for s in tower.specs] == list(range(2, 14, 2))
    assert tower.specs[0].kwargs == {"d_model": 1024, "num_heads": 16, "num_kv_heads": 8, "head_dim": 64,
                                     "bias": False, "norm_eps": 1e-5}
    assert tower.layers[0].scheme.base == 1e6 and tower.layers[0].scheme.layout == "qwen"
    assert "merge_positions(h, w, 2)" in tower.specs[0].position and "0, 1, 3, 5, 7, 9, 11, 13" in tower.notes[0]


@pytest.mark.parametrize("change, words", [
    ({"layer_types": ["sliding_attention"]}, ["layer_types"]),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, ["'linear'"]),
    ({"num_key_value_heads": 3}, ["num_kv_heads"]),
])
def test_lfm3_vl_tower_bad_configs_name_the_key(change, words):
    with pytest.raises(ValueError) as err:
        mconfig.read({"model_type": "lfm3_vl_vision", "num_hidden_layers": 1, **change})
    for w in words + ["'lfm3_vl_vision'"]:
        assert w in str(err.value)


# --------------------------------------------------------------------------- Qwen3-Omni's head dim, Inkling 2

def test_qwen3_omni_moe_default_head_dim_is_refused_with_hfs_rule():
    # Qwen3OmniMoeTextConfig: hidden_size 2048, 28 heads, no head_dim; the attention's 2048 // 28 = 73 is odd.
    with pytest.raises(ValueError, match="2048 // 28 = 73, odd"):
        mconfig.read({"model_type": "qwen3_omni_moe_text"})
    m = mconfig.read({"model_type": "qwen3_omni_moe_text", "head_dim": 128, "num_hidden_layers": 1})
    assert m.layers[0].head_dim == 128 and m.layers[0].scheme.mrope_section == [24, 20, 20]


@pytest.mark.parametrize("model_type", ["inkling2", "inkling2_text"])
def test_inkling2_decoder_is_read(model_type):
    """Inkling 2's decoder (minipos.inkling; its reader and its checks are in tests/test_config_inkling.py)."""
    m = mconfig.read({"model_type": model_type, "text_config": {"model_type": "inkling2_text"}})
    assert m.model_type == "inkling2_text" and len(m.layers) == 48


# --------------------------------------------------------------------------- golden vectors

@pytest.mark.parametrize("config, names", [
    ({"model_type": "cohere_compass", "text_config": COMPASS,
      "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2}},
     ["layer0_sliding_attention", "layer3_full_attention", "vision0"]),
    ({"model_type": "qwen4_exp", "text_config": {**QWEN4, "num_hidden_layers": 4},
      "vision_config": {"depth": 1, "hidden_size": 32, "num_heads": 2}}, ["layer3_indexed_attention", "vision0"]),
    ({"model_type": "mlcd_vision_model", "hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2},
     ["vision0"]),
    ({"model_type": "lfm3_vl_vision", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
      "num_hidden_layers": 3}, ["vision2"]),
])
def test_golden_vectors_export_and_check(tmp_path, config, names):
    path, out = tmp_path / "config.json", tmp_path / "v"
    path.write_text(json.dumps(config))
    assert cli.main(["config", str(path)]) == 0
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    assert vectors.check(str(out)) == []
    assert [c["name"] for c in json.loads((out / "model_layers.json").read_text())["cases"]] == names
