"""``minipos.config.read`` for the SAM family's 2-D RoPE (``minipos._config_sam``): what it builds from the defaults
of transformers 5.24's config classes (values below from ``Sam3ViTConfig()``, ``Sam2VideoConfig()``,
``Inkling2VisionConfig()``), the bad input it refuses by name, and the golden vectors ``vectors export --config``
writes for a whole SAM 3 (run on each case)."""

import json
import numpy as np
import pytest

from minipos import config as mconfig
from minipos.vectors import model as vmodel

SAM3_VIT = {"model_type": "sam3_vit_model", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 32,
            "image_size": 1008, "patch_size": 14, "window_size": 24, "global_attn_indexes": [7, 15, 23, 31],
            "pretrain_image_size": 336, "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}}
SAM2_VIDEO = {"model_type": "sam2_video", "memory_attention_hidden_size": 256, "memory_attention_num_layers": 4,
              "memory_attention_num_attention_heads": 1, "memory_attention_downsample_rate": 1,
              "memory_attention_rope_feat_sizes": [64, 64], "rope_parameters": {"rope_theta": 10000.0,
                                                                                "rope_type": "axial"}}
INKLING2 = {"model_type": "inkling2_vision", "hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 23,
            "spatial_merge_size": 2, "posemb_grid_size": 32, "rope_parameters": {"rope_theta": 10000.0,
                                                                                  "rope_type": "axial"}}


def test_sam3_vit_layers():
    m = mconfig.read(SAM3_VIT)
    assert m.kind == "vision encoder" and len(m.specs) == 32
    kinds = [s.layer_type for s in m.specs]
    assert [i for i, k in enumerate(kinds) if k == "full_attention"] == [7, 15, 23, 31]
    window, full = m.layers[0], m.layers[7]
    assert window.head_dim == 64 and window.scheme.layout == "llama4" and window.scheme.position_scale == 1.0
    assert m.specs[0].patch_window == 24 and m.specs[7].patch_window is None
    assert full.scheme.position_scale == pytest.approx(1 / 3)          # window_size 24 / (1008 // 14 = 72)
    assert all(not s.causal for s in m.specs)
    # the vision config of a whole SAM 3 (sam3_vision_model, its ViT in backbone_config) reads the same
    whole = mconfig.read({"model_type": "sam3", "vision_config": {"model_type": "sam3_vision_model",
                                                                  "backbone_config": SAM3_VIT}})
    assert whole.specs == [] and whole.vision.specs[7].position == m.specs[7].position


def test_memory_attention_and_inkling2():
    m = mconfig.read(SAM2_VIDEO)
    assert m.kind == "memory attention" and len(m.specs) == 4 and m.vision is None
    assert m.layers[0].head_dim == 256 and "axial_positions(64, 64)" in m.specs[0].position
    assert any("Hiera" in n for n in m.notes) and any("cross_attn_image" in n for n in m.notes)
    t = mconfig.read({**SAM2_VIDEO, "model_type": "sam3_tracker_video", "image_size": 1008})
    assert "axial_positions(72, 72)" in t.specs[0].position and t.vision.kind == "vision encoder"
    ink = mconfig.read(INKLING2)
    assert len(ink.specs) == 23 and ink.layers[0].head_dim == 64 and ink.layers[0].bq is not None


@pytest.mark.parametrize("config, error, words", [
    ({**SAM3_VIT, "rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, ValueError,
     ["rope_type", "'default'", "axial"]),
    ({**SAM3_VIT, "rope_parameters": {"rope_type": "axial", "rope_theta": 1e4, "factor": 2}}, ValueError, ["'factor'"]),
    ({**SAM3_VIT, "rope_parameters": {"rope_type": "axial", "rope_theta": -1.0}}, ValueError, ["rope_theta"]),
    ({**SAM3_VIT, "rope_parameters": [1]}, TypeError, ["rope_parameters"]),
    ({**SAM3_VIT, "window_size": 16}, ValueError, ["72 x 72", "window_size 16", "not support"]),
    ({**SAM3_VIT, "global_attn_indexes": [1.5]}, ValueError, ["global_attn_indexes"]),
    ({**SAM3_VIT, "head_dim": 32}, ValueError, ["head_dim", "64"]),
    ({**SAM3_VIT, "hidden_size": 1000}, ValueError, ["hidden_size (1000)", "num_attention_heads (16)"]),
    ({**SAM3_VIT, "hidden_size": 16 * 6}, ValueError, ["head dim 6", "multiple of 4"]),
    ({"model_type": "sam3_vision_model", "backbone_config": {"model_type": "hiera"}}, ValueError, ["backbone_config"]),
    ({**SAM2_VIDEO, "memory_attention_rope_feat_sizes": [64]}, ValueError, ["memory_attention_rope_feat_sizes"]),
    ({**SAM2_VIDEO, "memory_attention_downsample_rate": 3}, ValueError, ["memory_attention_hidden_size (256) // 3"]),
    ({**INKLING2, "spatial_merge_size": 0}, ValueError, ["spatial_merge_size"]),
    ({"model_type": "sam3_video"}, ValueError, ["sam3_video", "not support", "detector_config"]),
])
def test_bad_input_is_refused_naming_the_key(config, error, words):
    with pytest.raises(error) as err:
        mconfig.read(config)
    for w in words:
        assert w in str(err.value)


@pytest.mark.parametrize("model_type", ["sam3", "sam3_tracker"])
def test_vectors_export_of_a_whole_sam3(model_type):
    # one case per kind of ViT layer (a window layer, a global layer), recomputed by run() from the case alone
    config = {"model_type": model_type, "vision_config": {"model_type": "sam3_vision_model",
                                                          "backbone_config": SAM3_VIT}}
    cases = vmodel.cases(config)
    assert [c["name"] for c in cases] == ["vision0", "vision7"]
    for case in cases:
        y = vmodel.run(case["inputs"], case["params"])["y"]
        assert y.shape == (2, 7, 16) and np.all(np.isfinite(y))


def test_golden_vectors_of_the_trackers_memory_attention_and_sam3s_tower(tmp_path):
    # The memory attention's layers are 256 wide (memory_attention_hidden_size), not hidden_size: the export
    # narrows them by keyword, like a tower's; SAM 3's tracker also carries the SAM 3 ViT as .vision.
    from minipos import cli, vectors
    for model_type, names in [("sam2_video", ["memory0"]), ("sam3_tracker_video", ["memory0", "vision0", "vision7"])]:
        path, out = tmp_path / f"{model_type}.json", tmp_path / model_type
        path.write_text(json.dumps({"model_type": model_type}))
        assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
        doc = json.loads((out / "model_layers.json").read_text())
        assert [c["name"] for c in doc["cases"]] == names
        assert vectors.check(str(out)) == []
