"""``minipos.config.read`` for the families of ``minipos._config_minimax_muse``, without torch: what it builds from
the defaults of transformers 5.24's config classes (the values below are those classes' defaults and rules, quoted
from ``configuration_minimax_m3_vl.py``, ``configuration_step3p7.py``, ``configuration_muse_glimmer.py``), what
``describe()`` shows per layer, what it refuses ("not supported yet", naming the model type or key), and the golden
vectors ``vectors export --config`` writes for a small config of each family read."""

import json

import numpy as np
import pytest

from minipos import cli, vectors
from minipos import config as mconfig

SMALL = {"hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16}


def _rows(model):
    return {int(r[0]): r for r in model.rows()}


# --------------------------------------------------------------------------- MiniMax M3

def test_minimax_m3_defaults_rotate_the_whole_head_and_say_rotary_dim_is_unread():
    # MiniMaxM3VLTextConfig: 60 layers, 64 heads / 4 kv heads x 128, default_theta 5e6, rotary_dim 64, layer_types
    # ["full_attention"] * 60; MiniMaxM3VLRotaryEmbedding: dim = int(head_dim * partial_rotary_factor (1.0)) = 128.
    m = mconfig.read({"model_type": "minimax_m3_vl", "text_config": {}, "vision_config": {}})
    assert (m.model_type, len(m.layers)) == ("minimax_m3_vl_text", 60)
    row = _rows(m)[0]
    assert row[2] == "64/4 x 128" and row[3] == "RoPE half, theta 5e+06" and row[4] == "causal"
    # the spec, not a built layer: 64 heads x 128 of width 6144 would draw 150M weights
    assert "1 + w" in row[5] and m.specs[0].kwargs["norm_offset"] == 1.0 and m.specs[0].scheme().rotary_dim is None
    assert any("rotary_dim 64 is not read" in n and "= 128" in n for n in m.notes)
    assert not any("not support yet" in n for n in m.notes) and m.vision.model_type == "minimax_m3_vl_vision"


def test_minimax_m3_sparse_layers_carry_their_indexer():
    # MiniMaxM3VLTextConfig.__post_init__: "minimax_m3_sparse" if f else "full_attention" for each
    # sparse_attention_config["sparse_attention_freq"] entry, and the indexer's sizes from its legacy names there.
    m = mconfig.read({"model_type": "minimax_m3_vl_text", **SMALL, "num_hidden_layers": 4,
                      "sparse_attention_config": {"sparse_attention_freq": [0, 1, 1, 0], "sparse_block_size": 64,
                                                  "sparse_num_index_heads": 2},
                      "rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}})
    assert [s.layer_type for s in m.specs] == ["full_attention", "minimax_m3_sparse", "minimax_m3_sparse",
                                               "full_attention"]
    assert m.specs[0].indexer is None and m.layers[1].scheme.rotary_dim == 8
    assert m.specs[1].indexer == {"blocks": True, "n_heads": 2, "head_dim": 128, "block_size": 64, "topk_blocks": 16,
                                  "local_blocks": 1}
    assert "top 16 blocks of 64 keys" in m.describe(width=300) and "block_mask" in m.specs[1].notes[-1]
    assert "rotary_dim 64 is not read" in m.notes[0] and "= 8 features" in m.notes[0]    # the class default 64
    every = mconfig.read({"model_type": "minimax_m3_vl_text", **SMALL, "num_hidden_layers": 2,
                          "layer_types": ["minimax_m3_sparse"] * 2})             # refused until the per-head mask
    assert len(every.specs) == 2
    with pytest.raises(ValueError, match="'minimax_m3_vl_text'.*index_n_heads.*must divide"):
        mconfig.read({"model_type": "minimax_m3_vl_text", **SMALL, "num_hidden_layers": 2, "index_n_heads": 3,
                      "layer_types": ["minimax_m3_sparse"] * 2})


def test_minimax_m3_vision_defaults_describe_the_3d_rope():
    # MiniMaxM3VLVisionConfig: hidden 1280 / 16 heads = 80, 32 layers, spatial_merge_size 2, default_theta 10000;
    # MiniMaxM3VLVisionRotaryEmbedding: F = (80 // 3) // 2 = 13, 2 * 3 * 13 = 78 features rotated, 2 pass through.
    m = mconfig.read({"model_type": "minimax_m3_vl_vision"})
    assert (m.kind, len(m.layers)) == ("vision encoder", 32)
    row = _rows(m)[0]
    assert row[1] == "full_attention" and row[2] == "16/16 x 80" and row[4] == "bidirectional (causal=False)"
    assert row[3].startswith("3-D RoPE minimax_m3, theta 10000, the first 78 of 80 features; positions (3, T)")
    assert "merge_positions(h, w, 2)" in row[3]
    layer = m.layers[0]
    assert layer.scheme.layout == "minimax_m3" and layer.scheme.position_streams == 3
    assert all(getattr(layer, "b" + n) is not None for n in "qkvo")
    small = mconfig.read({"model_type": "minimax_m3_vl_vision", "hidden_size": 28, "num_attention_heads": 2,
                          "num_hidden_layers": 1, "spatial_merge_size": 1, "rope_parameters": {"rope_theta": 50.0}})
    assert "theta 50, the first 12 of 14 features" in small.specs[0].position and "(h, w, 1)" in small.specs[0].position


@pytest.mark.parametrize("change, key", [
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "axial", "rope_theta": 1e4, "partial_rotary_factor": 0.5}},
     "partial_rotary_factor"),
    ({"rope_parameters": {"rope_type": "axial", "rope_theta": -1.0}}, "rope_theta"),
    ({"hidden_size": 66, "num_attention_heads": 4}, "hidden_size"),
    ({"head_dim": 16}, "head_dim"),
    ({"hidden_size": 8, "num_attention_heads": 2}, "3-D RoPE of head dim 4"),
    ({"spatial_merge_size": 0}, "spatial_merge_size"),
])
def test_minimax_m3_vision_bad_configs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        mconfig.read({"model_type": "minimax_m3_vl_vision", "hidden_size": 64, "num_attention_heads": 2,
                      "num_hidden_layers": 1, **change})


@pytest.mark.parametrize("change, key", [
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"rope_parameters": {"rope_type": "warp", "rope_theta": 1e4}}, "rope_type"),
])
def test_minimax_m3_bad_configs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        mconfig.read({"model_type": "minimax_m3_vl_text", **SMALL, "num_hidden_layers": 1, **change})


# --------------------------------------------------------------------------- Step 3.7

STEP = {"model_type": "step3p5", **SMALL, "num_hidden_layers": 4, "sliding_window": 8,
        "layer_types": ["sliding_attention", "full_attention"] * 2, "num_sliding_attention_heads": 2,
        "rope_theta": [100.0, 1000.0, 100.0, 1000.0], "partial_rotary_factors": [0.5, 1.0, 0.5, 1.0]}


def test_step3p5_describe_shows_each_layer_types_rope_window_and_heads():
    # Step3p7TextConfig: per_layer_config {i: {"num_attention_heads": num_sliding_attention_heads}} on the sliding
    # layers; each type's rope_theta and partial_rotary_factor from its first layer; query_pre_attn_scalar = head_dim.
    m = mconfig.read(STEP)
    rows = _rows(m)
    assert rows[0][2] == "2/2 x 16" and rows[0][3] == "RoPE half, theta 100, partial 0.5"
    assert rows[0][4] == "causal, window 8 (i-8 < j <= i)"
    assert rows[1][2] == "4/2 x 16" and rows[1][3] == "RoPE half, theta 1000" and rows[1][4] == "causal"
    assert "scale 0.25" in rows[1][5] and "output gate per head" in rows[1][5]
    assert m.layers[0].gate == "head" and m.layers[0].norm_offset == 1.0


@pytest.mark.parametrize("change, key", [
    ({"gating": "per-element"}, "gating"),
    ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ({"rope_theta": [1e4, 1e4]}, "rope_theta"),
    ({"per_layer_config": {"0": {"head_dim": 8}}}, "per_layer_config"),
    ({"sliding_window": None}, "sliding_window"),
])
def test_step3p5_bad_configs_name_the_key(change, key):
    with pytest.raises((ValueError, TypeError), match=key):
        mconfig.read({**STEP, **change})


def test_step3p5_vision_defaults_and_aliases():
    # Step3p7VisionConfig: hidden 1536 / 16 heads = 96, 47 layers, image 728 / patch 14 = 52 a side; the hub's
    # width / layers / heads win over hidden_size / num_hidden_layers / num_attention_heads.
    m = mconfig.read({"model_type": "step3p5_vision"})
    assert (len(m.layers), _rows(m)[0][2]) == (47, "16/16 x 96") and "52 x 52" in m.specs[0].notes[0]
    assert "axial_positions(h, w)[::-1]" in m.specs[0].position and m.layers[0].scheme.layout == "qwen"
    hub = mconfig.read({"model_type": "step3p5_vision", "width": 64, "layers": 2, "heads": 4})
    assert (len(hub.layers), hub.layers[0].num_heads, hub.layers[0].head_dim) == (2, 4, 16)


# --------------------------------------------------------------------------- Muse Glimmer, Muse Spark

def test_muse_glimmer_defaults_nope_full_every_fourth_from_the_last():
    # MuseGlimmerTextConfig: 52 layers, "full_attention" where (51 - i) % 4 == 0 (3, 7, ..., 51), layer_rope_theta 0
    # there (NoPE), sliding_window 2048 elsewhere; qk_scale_factor 3.87 on top of 128 ** -0.5.
    m = mconfig.read({"model_type": "muse_glimmer", "text_config": {}})
    rows = _rows(m)
    nope = [i for i, r in rows.items() if r[3].startswith("NoPE")]
    assert nope == list(range(3, 52, 4)) and all(rows[i][1] == "full_attention" for i in nope)
    assert rows[0][3] == "RoPE half, theta 10000" and rows[0][4] == "causal, window 2048 (i-2048 < j <= i)"
    assert m.specs[0].kwargs["scale"] == pytest.approx(3.87 / np.sqrt(128)) and m.specs[0].kwargs["gate"] == "feature"


def test_muse_vision_defaults_windows_and_full_layers():
    # MuseGlimmerVisionConfig: 50 layers, "full_attention" if (i + 1) % 4 == 0 or i == 49, else "window_attention";
    # windows of pos_emb_height 32 patches (window_size = pos_emb_height * patch_size in the model).
    for model_type in ("muse_glimmer_vision", "muse_spark_vision"):
        m = mconfig.read({"model_type": model_type})
        full = [s.index for s in m.specs if s.layer_type == "full_attention"]
        assert full == list(range(3, 48, 4)) + [49]
        assert m.specs[0].patch_window == 32 and m.specs[3].patch_window is None
        assert "[::-1] + 1" in m.specs[0].position and "windows of 32 x 32 patches" in _rows(m)[0][4]


@pytest.mark.parametrize("config, key", [
    ({"model_type": "muse_glimmer_text", "num_hidden_layers": 4, "layer_rope_theta": [0, 1e4]}, "layer_rope_theta"),
    ({"model_type": "muse_glimmer_vision", "num_hidden_layers": 1, "layer_types": ["sliding_attention"]},
     "layer_types"),
    ({"model_type": "muse_spark_vision", "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
])
def test_muse_bad_configs_name_the_key(config, key):
    with pytest.raises(ValueError, match=key):
        mconfig.read(config)


def test_muse_spark_decoder_reads_with_its_output_norm_and_its_tower_alone():
    config = {"model_type": "muse_spark", "text_config": {"num_hidden_layers": 4}, "vision_config": {"num_hidden_layers": 2}}
    m = mconfig.read(config)
    assert m.model_type == "muse_spark_text" and all(spec.kwargs["o_norm"] for spec in m.specs)
    assert m.specs[0].scheme().base == 500_000.0 and m.specs[3].position.startswith("NoPE")   # the class's defaults
    tower = mconfig.read({**config["vision_config"], "model_type": "muse_spark_vision"})
    assert tower.kind == "vision encoder" and len(tower.layers) == 2


# --------------------------------------------------------------------------- Dots 3 Note, MusicFlamingo

def test_dots3_note_decoder_at_the_top_level_its_tower_read_with_the_hub_aliases():
    # Dots3NoteConfig: the published checkpoints hold the text config at the top level.
    assert mconfig.read({"model_type": "dots3_note", "hidden_size": 64, "num_hidden_layers": 2}).model_type == \
        "dots3_note_text"
    # Dots3NoteVisionConfig.__post_init__: hidden_size = kwargs.pop("embed_dim", ...), num_heads, use_bias likewise.
    m = mconfig.read({"model_type": "dots3_note_vision_encoder", "embed_dim": 64, "num_heads": 2, "use_bias": True,
                      "num_hidden_layers": 2})
    layer = m.layers[0]
    assert (layer.d_model, layer.num_heads, layer.head_dim, layer.bo is not None) == (64, 2, 32, True)
    assert "merge_positions(h, w, 2)" in m.specs[0].position and m.layers[0].norm_offset == 0.0
    with pytest.raises(ValueError, match="rope_type"):
        mconfig.read({"model_type": "dots3_note_vision_encoder", "rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                                                                   "rope_theta": 1e4}})


def test_musicflamingo_reads_qwen2_and_names_the_audio_encoder():
    m = mconfig.read({"model_type": "musicflamingo", "text_config": {"model_type": "qwen2", **SMALL,
                                                                     "num_hidden_layers": 2}})
    assert m.model_type == "musicflamingo_text" and m.layers[0].bq is not None and m.layers[0].bo is None
    assert "audio encoder" in m.notes[0]


# --------------------------------------------------------------------------- golden vectors

CONFIGS = {
    "minimax_m3_vl": {"model_type": "minimax_m3_vl", "text_config": {**SMALL, "num_hidden_layers": 2},
                      "vision_config": {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1}},
    "minimax_m3_sparse": {"model_type": "minimax_m3_vl_text", **SMALL, "num_hidden_layers": 2,   # index heads 4: the
                          "layer_types": ["full_attention", "minimax_m3_sparse"]},            # narrowed model's 1
    "step3p7": {"model_type": "step3p7", "text_config": {**STEP, "model_type": "step3p5"},
                "vision_config": {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 1}},
    "muse_glimmer": {"model_type": "muse_glimmer", "text_config": {**SMALL, "num_hidden_layers": 4,
                                                                    "sliding_window": 8},
                     "vision_config": {"hidden_size": 64, "num_attention_heads": 2, "num_hidden_layers": 4}},
    "dots3_note_vision_encoder": {"model_type": "dots3_note_vision_encoder", "embed_dim": 64, "num_heads": 2,
                                  "num_hidden_layers": 1},
    "musicflamingo": {"model_type": "musicflamingo", "text_config": {"model_type": "qwen2", **SMALL,
                                                                     "num_hidden_layers": 1}},
}


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_vectors_export_and_check_round_trip(tmp_path, name):
    path, out = tmp_path / "config.json", tmp_path / "v"
    path.write_text(json.dumps(CONFIGS[name]))
    assert cli.main(["config", str(path)]) == 0
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    assert vectors.check(str(out)) == []
    doc = json.loads((out / "model_layers.json").read_text())
    doc["cases"][0]["expected"]["y"]["data"][0] += 1e-3
    (out / "model_layers.json").write_text(json.dumps(doc))
    assert len(vectors.check(str(out))) == 1
