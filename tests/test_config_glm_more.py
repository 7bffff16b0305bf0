"""``minipos.config.read`` without transformers for GLM-OCR, GLM-Image and GLM-5.3-Flash (``glm5_next``): the
``describe()`` table layer by layer, what is refused and how it says so (GLM-5.3-Flash's attention layers read,
its KDA layers in a note). Expected values come from transformers
5.24's config and modeling classes (``GlmOcrTextConfig``, ``GlmImageVisionConfig``, ``Glm5NextTextConfig``, ...:
their defaults and the lines that use them, quoted where used), worked by hand; the layers' outputs are checked
against transformers in test_config_interop_glm_more.py."""

import json

import pytest

from minipos import cli, config, vectors
from minipos.layer import MultiHeadAttention
from minipos.mrope import MRotary
from minipos.qk_norm import QKNormAttention

ROPE = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5, "mrope_section": [8, 12, 12]}
GLM_OCR = {"model_type": "glm_ocr",
           "text_config": {"model_type": "glm_ocr_text", "hidden_size": 1536, "num_attention_heads": 16,
                           "num_key_value_heads": 8, "head_dim": 128, "num_hidden_layers": 3, "rope_parameters": ROPE},
           "vision_config": {"model_type": "glm_ocr_vision", "depth": 2, "hidden_size": 1024, "num_heads": 16}}
GLM_IMAGE = {"model_type": "glm_image",
             "text_config": {"model_type": "glm_image_text", "hidden_size": 4096, "num_attention_heads": 32,
                             "num_hidden_layers": 2, "rope_parameters": ROPE},
             "vision_config": {"model_type": "glm_image_vision", "depth": 2}, "vq_config": {"embed_dim": 2048}}


def _rows(model):
    return [dict(zip(["layer", "type", "heads", "position", "mask", "notes"], row)) for row in model.rows()]


# --------------------------------------------------------------------------- GLM-OCR

def test_glm_ocr_decoder_rows():
    # GlmOcrTextAttention: head_dim = getattr(config, "head_dim", ...) = 128; GlmOcrTextRotaryEmbedding: dim =
    # int(128 * 0.5) = 64, 32 frequencies split [8, 12, 12] by i % 3, repeat_interleave(2): pairs (2i, 2i+1); q_proj,
    # k_proj, v_proj, o_proj all bias=False. Every layer full and causal.
    model = config.read(GLM_OCR)
    assert model.model_type == "glm_ocr_text" and not model.notes
    for i, row in enumerate(_rows(model)):
        assert (row["layer"], row["type"], row["heads"], row["mask"], row["notes"]) == (str(i), "full_attention",
                                                                                      "16/8 x 128", "causal", "")
        assert row["position"] == ("M-RoPE interleaved pairs (2i, 2i+1), theta 10000, split sections [8, 12, 12] "
                                   "(t, h, w) on the first 64 of 128 features; positions (3, T)")
    layer = model.layers[0]
    assert isinstance(layer.scheme, MRotary) and (layer.bq, layer.bk, layer.bv, layer.bo) == (None,) * 4


def test_glm_ocr_vision_rows():
    # GlmOcrVisionAttention: head_dim 1024 // 16 = 64, q_norm/k_norm (eps rms_norm_eps 1e-5) before
    # apply_rotary_pos_emb_vision, qkv and proj with attention_bias (True); GlmOcrVisionModel: position_ids =
    # get_vision_position_ids(grid_thw, spatial_merge_size = 2), blocks called with cu_seqlens (is_causal False).
    tower = config.read(GLM_OCR).vision
    assert tower.model_type == "glm_ocr_vision" and tower.kind == "vision encoder"
    for row in _rows(tower):
        assert (row["type"], row["heads"], row["mask"]) == ("full_attention", "16/16 x 64",
                                                            "bidirectional (causal=False)")
        assert row["position"].startswith("2-D RoPE qwen, theta 10000") and "merge_positions(h, w, 2)" in row["position"]
        assert "q/k RMSNorm" in row["notes"]
    assert "no learned position table" in _rows(tower)[0]["notes"]             # GlmOcrVisionModel: del self.embeddings
    spec = tower.specs[0]
    assert spec.cls is QKNormAttention and spec.kwargs["norm_eps"] == 1e-5 and spec.kwargs["bias"]
    assert spec.no_bias == () and tower.layers[0].bo is not None               # proj has the bias, unlike GLM-4V's


def test_glm_ocr_defaults_are_the_config_classes():
    # GlmOcrTextConfig: 1024 wide, 16 layers, 16 heads, 8 key/value heads: head dim 64, 32 frequencies = 8 + 12 + 12.
    # GlmOcrVisionConfig: depth 24, 1024 wide, 16 heads, spatial_merge_size 2, attention_bias True.
    model = config.read({"model_type": "glm_ocr", "text_config": {}, "vision_config": {}})
    assert (len(model.layers), _rows(model)[0]["heads"], len(model.vision.specs)) == (16, "16/8 x 64", 24)
    assert "on the first 64 of 64 features" in _rows(model)[0]["position"]
    flat = config.read({"model_type": "glm_ocr", "num_hidden_layers": 1})       # a flat hub file: its top level
    assert flat.model_type == "glm_ocr_text" and flat.vision is None


def test_glm_ocr_reads_hf_s_choices_where_keys_seem_to_say_otherwise():
    # attention_bias: GlmOcrTextAttention builds its Linears with bias=False whatever it says; a null
    # num_key_value_heads: GlmOcrTextConfig.__post_init__ sets num_attention_heads (not the default 8).
    text = {"model_type": "glm_ocr_text", "num_hidden_layers": 1, "attention_bias": True, "num_key_value_heads": None}
    model = config.read(text)
    assert model.layers[0].bq is None and "attention_bias is not read" in model.specs[0].notes[0]
    assert _rows(model)[0]["heads"] == "16/16 x 64"
    tower = config.read({"model_type": "glm_ocr_vision", "depth": 1, "attention_bias": False})
    assert tower.layers[0].bq is None and tower.layers[0].bo is None           # qkv and proj both follow it


@pytest.mark.parametrize("change, key", [
    ({"rope_parameters": {**ROPE, "rope_type": "yarn", "factor": 2.0}}, "rope_type"),
    ({"rope_parameters": {**ROPE, "mrope_section": [8, 12, 8]}}, "mrope_section"),    # HF: split_with_sizes fails
    ({"hidden_size": 30, "head_dim": None}, "hidden_size"),
])
def test_glm_ocr_bad_text_configs_name_the_key_and_model_type(change, key):
    with pytest.raises(ValueError, match=key) as err:
        config.read({**GLM_OCR["text_config"], **change})
    assert "'glm_ocr_text'" in str(err.value)


@pytest.mark.parametrize("model_type", ["glm_ocr_vision", "glm5_next_vision"])
@pytest.mark.parametrize("change, key, error", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type", ValueError),   # "only axial"
    ({"head_dim": 32}, "head_dim", ValueError),
    ({"hidden_size": 30}, "hidden_size", ValueError),
    ({"rms_norm_eps": "small"}, "rms_norm_eps", TypeError),
    ({"attention_bias": 1}, "attention_bias", TypeError),
])
def test_glm_ocr_and_glm5_next_bad_vision_configs_name_the_key(model_type, change, key, error):
    with pytest.raises(error, match=key) as err:
        config.read({"model_type": model_type, "depth": 1, **change})
    assert repr(model_type) in str(err.value)


# --------------------------------------------------------------------------- GLM-Image

def test_glm_image_decoder_rows():
    # GlmImageTextConfig: 4096 wide, 32 heads (head dim 128), 2 key/value heads, attention_bias True;
    # GlmImageTextRotaryEmbedding: 64 rotated features, torch.cat([freq, freq]) with rotate_half: the half layout;
    # GlmImageTextAttention: q, k, v with attention_bias, o_proj bias=False.
    model = config.read(GLM_IMAGE)
    for row in _rows(model):
        assert (row["type"], row["heads"], row["mask"], row["notes"]) == ("full_attention", "32/2 x 128", "causal",
                                                                          "biases on q, k, v only")
        assert row["position"] == ("M-RoPE half, theta 10000, split sections [8, 12, 12] (t, h, w) on the first 64 of "
                                   "128 features; positions (3, T)")
    assert model.specs[0].kwargs["bias"] and model.specs[0].no_bias == ("bo",)      # built, bq set and bo None
    plain = config.read({**GLM_IMAGE["text_config"], "attention_bias": False})
    assert not plain.specs[0].kwargs["bias"] and plain.specs[0].notes == ()


def test_glm_image_partial_rotary_defaults_to_1_not_glm4v_moe_s_half():
    # rope_parameters.get("partial_rotary_factor", 1.0): head_dim 8 (32 // 4), 4 frequencies = 2 + 1 + 1.
    rope = {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 1, 1]}
    text = {"model_type": "glm_image_text", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
            "rope_parameters": rope}
    assert "on the first 8 of 8 features" in _rows(config.read(text))[0]["position"]
    with pytest.raises(ValueError, match="mrope_section"):                      # GlmImageTextConfig() alone: HF fails
        config.read({"model_type": "glm_image_text", "num_hidden_layers": 1})


def test_glm_image_vision_rows():
    # GlmImageVisionAttention: no position_embeddings; qkv and proj with attention_bias; head dim 1536 // 16 = 96;
    # GlmImageVisionEmbeddings: (2048 // 16) ** 2 learned positions, grid_sample mode "bilinear", before the blocks.
    tower = config.read(GLM_IMAGE).vision
    rows = _rows(tower)
    assert [r["heads"] for r in rows] == ["16/16 x 96"] * 2
    assert all(r["position"].startswith("NoPE") and r["mask"] == "bidirectional (causal=False)" for r in rows)
    assert "128 x 128" in rows[0]["notes"] and "bilinearly" in rows[0]["notes"] and rows[1]["notes"] == ""
    assert tower.specs[0].cls is MultiHeadAttention and tower.layers[0].bo is not None
    assert "VQ-VAE (vq_config)" in tower.notes[0]
    keyed = config.read({"model_type": "glm_image_vision", "depth": 1, "rope_parameters": {"rope_theta": 1e4}})
    assert "not read" in keyed.notes[1]                                        # HF's tower has no rotary to read it


@pytest.mark.parametrize("change, key", [
    ({"hidden_size": 30, "num_heads": 4}, "hidden_size"),
    ({"image_size": 8, "patch_size": 16}, "image_size"),
])
def test_glm_image_bad_vision_configs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key) as err:
        config.read({"model_type": "glm_image_vision", **change})
    assert "'glm_image_vision'" in str(err.value)


# --------------------------------------------------------------------------- GLM-5.3-Flash

@pytest.mark.parametrize("cfg", [
    {"model_type": "glm5_next", "text_config": {"num_hidden_layers": 4}, "vision_config": {"depth": 1}},
    {"model_type": "glm5_next", "num_hidden_layers": 4},                       # flat: Glm5NextConfig forwards the top
    {"model_type": "glm5_next_text", "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"]},
])
def test_glm5_next_attention_layers_are_read(cfg):
    # Glm5NextTextConfig: layer_types "linear_attention" (KDA) for idx % 4 != 3, else "indexed_attention" (its
    # "full_attention" renamed); MLA with qk_rope_head_dim 0 behind the k-pool indexer (class defaults: 64 heads,
    # kv_lora_rank 512, q_lora_rank 1536, qk_nope_head_dim 256, v_head_dim 256, rms_norm_eps 1e-5, index_kpool 16).
    read = config.read(cfg)
    assert read.model_type == "glm5_next_text" and [s.index for s in read.specs] == [3]
    layer, spec = read.specs[0].kwargs, read.specs[0]
    assert (layer["num_heads"], layer["kv_lora_rank"], layer["q_lora_rank"], layer["qk_nope_head_dim"],
            layer["qk_rope_head_dim"], layer["v_head_dim"], layer["eps"]) == (64, 512, 1536, 256, 0, 256, 1e-5)
    assert spec.indexer["kpool"] == 16 and spec.indexer["topk"] == 2048 and spec.layer_type == "indexed_attention"
    assert type(spec.scheme()).__name__ == "NoPE"                         # the scale D_N ** -0.5: test_mla_dots.py
    assert any("layers 0, 1, 2 are KDA" in n for n in read.notes)


@pytest.mark.parametrize("change, words", [
    ({"qk_rope_head_dim": 64}, "has no RoPE"),
    ({"num_key_value_heads": 1}, r"num_key_value_heads \(1\) must equal num_attention_heads"),
    ({"q_lora_rank": None}, "q_lora_rank'] is null"),
    ({"index_topk": 10, "index_kpool": 4}, r"index_topk \(10\) must be a multiple of index_kpool \(4\)"),
    ({"indexer_types": ["full", "full", "full", "shared"]}, "layer 3 is 'shared'.* layer 2 is not an attention layer"),
    ({"layer_types": ["sliding_attention"] * 4}, "layer_types"),
])
def test_glm5_next_bad_input_is_named(change, words):
    with pytest.raises(ValueError, match=words):
        config.read({"model_type": "glm5_next_text", "num_hidden_layers": 4, **change})


def test_glm5_next_tower_reads_alone():
    tower = config.read({"model_type": "glm5_next_vision", "depth": 2, "hidden_size": 64, "num_heads": 4})
    assert tower.model_type == "glm5_next_vision" and [r["heads"] for r in _rows(tower)] == ["4/4 x 16"] * 2


# --------------------------------------------------------------------------- the command line

@pytest.mark.parametrize("name, cfg, cases", [
    ("glm_ocr", GLM_OCR, ["layer0_full_attention", "vision0"]),
    ("glm_image", GLM_IMAGE, ["layer0_full_attention", "vision0"]),
    ("glm5_next_vision", {"model_type": "glm5_next_vision", "depth": 2}, ["vision0"]),
])
def test_config_cli_and_model_vectors(tmp_path, capsys, name, cfg, cases):
    path, out = tmp_path / f"{name}.json", tmp_path / "v"
    path.write_text(json.dumps(cfg))
    assert cli.main(["config", "--runs", str(path)]) == 0 and name.split("_vision")[0] in capsys.readouterr().out
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    doc = json.loads((out / "model_layers.json").read_text())
    assert [c["name"] for c in doc["cases"]] == cases and vectors.check(str(out)) == []


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                 "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
                                 "rms_norm_eps", "attention_bias", "index_topk", "index_kpool", "index_n_heads",
                                 "index_head_dim", "index_kpool_always_select_tail", "layer_types", "indexer_types",
                                 "index_topk_pattern", "hc_mult", "linear_conv_kernel_dim"])
def test_glm5_next_hostile_values_are_read_or_named_never_a_crash(key):
    for value in [None, True, 0, -1, 1.5, "3", [], {}, float("nan"), 2 ** 70]:
        try:
            config.read({"model_type": "glm5_next_text", "num_hidden_layers": 4, key: value})
        except (ValueError, TypeError) as err:
            assert "glm5_next_text" in str(err) or key in str(err), (key, value, err)
