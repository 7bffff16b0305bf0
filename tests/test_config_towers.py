"""``minipos.config.read`` on the families of ``minipos._config_towers``: what each reads, and its bad input (a
``ValueError`` or ``TypeError`` naming the key and the model type). Expected values are worked by hand from the
transformers 5.24 config classes and modules named beside each test; the interop tests
(tests/test_config_interop_towers.py) run the modules themselves."""

import pytest

from minipos import config as mconfig
from minipos.mrope import MRotary
from minipos.qk_norm import QKNormAttention


def _qwen3_5(**kw):
    text = {"model_type": "qwen3_5_text", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
            "head_dim": 256, "num_hidden_layers": 8, **kw}
    return {k: v for k, v in text.items() if v is not None}


# --------------------------------------------------------------------------- Qwen3.5

def test_qwen3_5_decoder_reads_its_attention_layers_with_the_gate():
    # Qwen3_5TextConfig: layer_types from full_attention_interval 4, "full_attention" where (i + 1) % 4 == 0;
    # partial_rotary_factor 0.25 (its __post_init__), mrope_section [11, 11, 10] (Qwen3_5TextRotaryEmbedding);
    # Qwen3_5Attention: q_proj 2 * 4 * 256 wide (query and gate), Qwen3_5RMSNorm (1 + weight), attention_bias False.
    m = mconfig.read(_qwen3_5())
    assert [(s.index, s.layer_type) for s in m.specs] == [(3, "full_attention"), (7, "full_attention")]
    assert m.specs[0].kwargs == {"d_model": 64, "num_heads": 4, "num_kv_heads": 2, "head_dim": 256, "bias": False,
                                 "norm_eps": 1e-6, "norm_offset": 1.0, "gate": "feature"}
    layer = m.layers[1]
    assert isinstance(layer, QKNormAttention) and layer.wg.shape == (64, 4 * 256) and layer.bg is None
    sc = layer.scheme
    assert isinstance(sc, MRotary) and (sc.mrope_section, sc.base, sc.interleaved, sc.rotary_dim) == \
        ([11, 11, 10], 10000.0, True, 64)                                # int(256 * 0.25)
    assert "layers 0, 1, 2, 4, 5, 6 are gated delta nets" in m.notes[0] and "4 taps" in m.notes[0]
    assert "\n7      full_attention" in m.describe(width=300)             # rows keep the decoder's indices
    assert "on the first 64 of 256 features" in m.specs[0].position
    assert [s.index for s in mconfig.read(_qwen3_5(full_attention_interval=2)).specs] == [1, 3, 5, 7]
    m = mconfig.read(_qwen3_5(num_hidden_layers=2, layer_types=["full_attention", "linear_attention"]))
    assert [s.index for s in m.specs] == [0] and "layers 1 are gated delta nets" in m.notes[0]
    m = mconfig.read(_qwen3_5(num_hidden_layers=1, layer_types=["full_attention"]))
    assert m.notes == [] and len(m.layers) == 1


def test_qwen3_5_attention_bias_gives_the_gate_its_bias():
    # Qwen3_5Attention: q_proj, k_proj, v_proj and o_proj all take bias=config.attention_bias; the gate is half of
    # q_proj, so its bias is half of q_proj's.
    layer = mconfig.read(_qwen3_5(attention_bias=True)).layers[0]
    assert layer.bq.shape == layer.bg.shape == (4 * 256,) and layer.bo.shape == (64,)


def test_qwen3_5_rope_keys_where_its_config_class_takes_them():
    # Qwen3_5TextConfig(rope_theta=5.0).rope_parameters == {"rope_theta": 5.0, "partial_rotary_factor": 0.25, ...};
    # a partial_rotary_factor in rope_parameters wins over the top level's (printed by transformers 5.24).
    sc = mconfig.read(_qwen3_5(rope_theta=5.0)).layers[0].scheme
    assert (sc.base, sc.rotary_dim) == (5.0, 64)
    sc = mconfig.read(_qwen3_5(partial_rotary_factor=0.5, rope_parameters={
        "rope_theta": 7.0, "partial_rotary_factor": 0.125, "mrope_section": [6, 5, 5], "mrope_interleaved": True}))\
        .layers[0].scheme
    assert (sc.mrope_section, sc.base, sc.interleaved, sc.rotary_dim) == ([6, 5, 5], 7.0, True, 32)


def test_qwen3_5_whole_and_moe_configs_are_read_through_their_text_config():
    for outer, text in (("qwen3_5", "qwen3_5_text"), ("qwen3_5_moe", "qwen3_5_moe_text")):
        m = mconfig.read({"model_type": outer, "text_config": _qwen3_5(model_type=text), "vision_config": {"depth": 1}})
        assert m.model_type == text and [s.index for s in m.specs] == [3, 7] and m.layers[0].gate == "feature"
        assert m.vision.model_type == f"{outer}_vision"                  # VISION_OF: the tower its class builds
    # Qwen3_5MoeTextConfig's defaults: 40 layers, hidden 2048, 2 key/value heads
    m = mconfig.read({"model_type": "qwen3_5_moe_text"})
    assert len(m.specs) == 10 and m.specs[0].kwargs["d_model"] == 2048 and m.specs[0].kwargs["num_kv_heads"] == 2


@pytest.mark.parametrize("kw, match", [
    ({"full_attention_interval": 0}, "full_attention_interval.*integer >= 1"),
    ({"full_attention_interval": True}, "full_attention_interval.*integer >= 1"),
    ({"layer_types": ["sliding_attention"] * 8}, "layer_types.*'sliding_attention'"),
    ({"layer_types": ["full_attention"] * 3}, "layer_types.*one type per layer"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope_type 'yarn'"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [1, -1, 1]}},
     "mrope_section"),
    ({"rope_parameters": {"rope_theta": 1e4, "mrope_section": [11, 11, 10], "factor": 2.0}}, "\\['factor'\\]"),
    ({"linear_conv_kernel_dim": 0}, "linear_conv_kernel_dim.*integer >= 1"),
])
def test_qwen3_5_bad_input_names_the_key(kw, match):
    with pytest.raises(ValueError, match=match):
        mconfig.read(_qwen3_5(**kw))


@pytest.mark.parametrize("rope, read", [
    ({"mrope_section": [1, 1, 1]}, [30, 1, 1]),              # R = 64: height at slice(1, 3, 3), width slice(2, 3, 3)
    ({"partial_rotary_factor": 0.5}, [43, 11, 10]),          # R = 128, [11, 11, 10]: slices in range, time the rest
])
def test_qwen3_5_reads_a_section_as_transformers_assigns_it(rope, read):
    # Qwen3_5TextRotaryEmbedding.apply_interleaved_mrope writes height and width over the temporal frequencies at
    # slice(1, 3 n_h, 3) and slice(2, 3 n_w, 3), whatever the section adds up to.
    m = mconfig.read(_qwen3_5(rope_parameters={"rope_type": "default", "rope_theta": 1e4, **rope}))
    assert m.layers[0].scheme.mrope_section == read and "which is what is read" in m.specs[0].notes[-1]


def test_golden_vectors_of_qwen3_5_hold_the_gate_and_the_decoders_own_layer_index(tmp_path):
    # 4 layers, interval 4: layer 3 is the only attention layer; narrowed to hidden_size 16 and 2 heads of 32, the
    # gate's wg is (16, 2 * 32) and, with attention_bias, bg (64,) (half of q_proj's bias). The tower adds vision0.
    import json

    from minipos import cli, vectors
    text = _qwen3_5(num_hidden_layers=4, head_dim=32, attention_bias=True,
                    rope_parameters={"rope_theta": 1e4, "partial_rotary_factor": 0.25, "mrope_section": [2, 1, 1]})
    path, out = tmp_path / "config.json", tmp_path / "v"
    path.write_text(json.dumps({"model_type": "qwen3_5", "text_config": text, "vision_config": {"depth": 1}}))
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    assert vectors.check(str(out)) == []
    doc = json.loads((out / "model_layers.json").read_text())
    assert [(c["name"], c["params"]["layer"]) for c in doc["cases"]] == [("layer3_full_attention", 3), ("vision0", 0)]
    inputs = doc["cases"][0]["inputs"]
    assert inputs["wg"]["shape"] == [16, 64] and inputs["bg"]["shape"] == [64]
    inputs["wg"]["data"][0] += 0.5                                       # the gate's weight is checked
    (out / "model_layers.json").write_text(json.dumps(doc))
    assert vectors.check(str(out)) != []


def test_qwen3_5_attention_bias_must_be_a_flag():
    with pytest.raises(TypeError, match="'qwen3_5_text': config\\['attention_bias'\\] must be true or false"):
        mconfig.read(_qwen3_5(attention_bias="yes"))


def test_qwen3_5_vision_tower_alone():
    # Qwen3_5VisionConfig: depth 27, hidden_size 1152, num_heads 16 (head dim 72), patch 16, merge 2, the learned
    # table of 2304 = 48 x 48 positions; Qwen3_5VisionAttention has biases on qkv and proj.
    model = mconfig.read({"model_type": "qwen3_5_vision"})
    assert model.kind == "vision encoder" and len(model.layers) == 27
    spec = model.specs[0]
    assert spec.kwargs == {"d_model": 1152, "num_heads": 16, "num_kv_heads": 16, "head_dim": 72, "bias": True}
    assert not spec.causal and "48 x 48" in spec.notes[0] and "merge_positions(h, w, 2)" in spec.position
    assert mconfig.read({"model_type": "qwen3_5_moe_vision", "depth": 2}).model_type == "qwen3_5_moe_vision"


@pytest.mark.parametrize("kw, error, match", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, ValueError, "only 'axial'"),
    ({"hidden_size": 30, "num_heads": 4}, ValueError, "hidden_size \\(30\\) is not a multiple of num_heads"),
    ({"head_dim": 8}, ValueError, "head_dim"),
    ({"depth": 0}, ValueError, "depth.*integer >= 1"),
    ({"num_position_embeddings": "many"}, ValueError, "num_position_embeddings"),
])
def test_qwen3_5_vision_bad_input_names_the_key(kw, error, match):
    with pytest.raises(error, match=match):
        mconfig.read({"model_type": "qwen3_5_vision", **kw})


def test_golden_vectors_of_a_tower_read_alone(tmp_path):
    # Qwen3.5's tower is read from its own config (no decoder): the export holds the tower's cases
    # only, one per kind of layer (3 full layers: one case), and they check.
    import json

    from minipos import cli, vectors
    path = tmp_path / "config.json"
    path.write_text(json.dumps({"model_type": "qwen3_5_vision", "depth": 3}))
    out = tmp_path / "v"
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    assert vectors.check(str(out)) == []
    doc = json.loads((out / "model_layers.json").read_text())
    assert [c["name"] for c in doc["cases"]] == ["vision0"] and doc["cases"][0]["params"]["tower"] == "vision"


# --------------------------------------------------------------------------- the Omni thinkers

def _omni(outer="qwen2_5_omni", **text):
    return {"model_type": outer, "thinker_config": {
        "text_config": {"hidden_size": 64, "num_attention_heads": 4, "num_hidden_layers": 2, **text},
        "vision_config": {"depth": 2}, "audio_config": {"num_hidden_layers": 2}}, "talker_config": {}}


def test_omni_thinkers_read_as_the_decoders_they_copy():
    # Qwen2.5-Omni's thinker text: Qwen2-VL's layer, split M-RoPE [16, 24, 24] by default (head dim 64 / 4 = 16
    # would not hold 64 frequencies, so the test gives sections of 8); Qwen3-Omni's: Qwen3-VL's, interleaved.
    model = mconfig.read(_omni(rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [4, 2, 2]}))
    assert model.model_type == "qwen2_5_omni_text" and model.vision.model_type == "qwen2_5_omni_vision_encoder"
    assert "M-RoPE half, theta 1e+06, sections [4, 2, 2]" in model.specs[0].position
    assert [s.layer_type for s in model.vision.specs] == ["window_attention", "window_attention"]   # fullatt 7, 15, ...
    model = mconfig.read(_omni("qwen3_omni_moe", rope_parameters={"rope_theta": 1e6, "mrope_section": [4, 2, 2]}))
    assert model.model_type == "qwen3_omni_moe_text" and "interleaved" in model.specs[0].position
    assert model.vision.model_type == "qwen3_omni_moe_vision_encoder"


@pytest.mark.parametrize("config, match", [
    ({"model_type": "qwen2_5_omni"}, "qwen2_5_omni.*thinker_config.*required"),
    ({"model_type": "qwen3_omni_moe", "thinker_config": "x"}, "qwen3_omni_moe.*thinker_config.*required"),
    # Qwen3OmniMoeTextConfig's defaults: hidden_size 2048, 28 heads, no head_dim: the attention's 2048 // 28 is odd.
    ({"model_type": "qwen3_omni_moe", "thinker_config": {"text_config": {}}}, "2048 // 28 = 73, odd.*give head_dim"),
    (_omni(rope_parameters={"rope_theta": 1e6, "mrope_section": [4, 2, 1]}), "mrope_section"),
    (_omni(rope_parameters={"rope_type": "yarn", "rope_theta": 1e6, "factor": 2.0}), "M-RoPE.*'yarn'"),
    ({"model_type": "qwen2_5_omni_vision_encoder", "window_size": 16}, "window_size.*is 0"),     # 16 // 2 // 14
    ({"model_type": "qwen2_5_omni_vision_encoder", "fullatt_block_indexes": [-1]}, "fullatt_block_indexes"),
])
def test_omni_bad_input_names_the_key(config, match):
    with pytest.raises(ValueError, match=match):
        mconfig.read(config)


# --------------------------------------------------------------------------- GLM-4V's towers

def test_glm4v_tower_from_a_whole_config():
    # Glm4vVisionConfig: depth 24, hidden_size 1536, 12 heads (head dim 128), image 336 // patch 14 = 24 a side;
    # the tower Glm4vConfig builds, whatever its vision_config's model_type says.
    model = mconfig.read({"model_type": "glm4v", "text_config": {"model_type": "glm4v_text", "hidden_size": 512,
                          "num_attention_heads": 4, "num_hidden_layers": 1, "partial_rotary_factor": 0.5},
                          "vision_config": {"model_type": "glm4v"}})
    tower = model.vision
    assert tower.model_type == "glm4v_vision" and len(tower.layers) == 24 and not model.notes
    assert tower.specs[0].kwargs == {"d_model": 1536, "num_heads": 12, "num_kv_heads": 12, "head_dim": 128,
                                     "bias": False}
    assert "24 x 24" in tower.specs[0].notes[0] and tower.specs[1].notes == ()


@pytest.mark.parametrize("kw, error, match", [
    ({"attention_bias": "yes"}, TypeError, "attention_bias.*true or false"),
    ({"image_size": 8}, ValueError, "image_size.*less than patch_size"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4}}, ValueError, "only 'axial'"),
    ({"hidden_size": 100}, ValueError, "hidden_size \\(100\\) is not a multiple of num_heads \\(12\\)"),
])
def test_glm4v_vision_bad_input_names_the_key(kw, error, match):
    with pytest.raises(error, match=match):
        mconfig.read({"model_type": "glm4v_moe_vision", **kw})


def test_golden_vectors_of_a_tower_on_a_grid_of_its_own(tmp_path):
    # DeepSeek-OCR-2's SAM-style tower: its decomposed relative position bias takes flat (T,) positions of its own grid
    # (14 x 14 windows, the 64 x 64 global grid of image 1024 / patch 16); the export gave it (2, T) and failed.
    import json

    from minipos import cli, vectors
    path, out = tmp_path / "config.json", tmp_path / "v"
    path.write_text(json.dumps({"model_type": "deepseek_ocr2_vision"}))
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    cases = json.loads((out / "model_layers.json").read_text())["cases"]
    flat = {c["name"]: c["inputs"]["positions"]["data"] for c in cases}
    assert flat == {"vision0": [0, 1, 14, 15, 31, 195, 195], "vision2": [0, 1, 64, 65, 131, 2069, 4095]}
    assert vectors.check(str(out)) == []
