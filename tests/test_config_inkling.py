"""``minipos.config.read`` on Inkling 2's decoder without torch: what it reads of each layer type, the aliases a
config.json may use, what it refuses, and a sweep of hostile values over every key it reads. The comparison with
transformers' modules is in ``tests/test_config_interop_inkling.py``; the sizes below are Inkling2TextConfig's
defaults (transformers 5.24)."""

import json

import pytest

from minipos import cli, config, vectors
from minipos.inkling import InklingAttention

SMALL = {"model_type": "inkling2_text", "num_hidden_layers": 3, "hidden_size": 16, "num_attention_heads": 4,
         "num_key_value_heads": 2, "head_dim": 4, "swa_num_attention_heads": 2, "swa_num_key_value_heads": 1,
         "swa_head_dim": 6, "sliding_window_size": 5, "rel_extent": 9, "d_rel": 2,
         "layer_types": ["hybrid_sliding", "hybrid", "hybrid_sliding"]}


def test_each_layer_type_gets_its_own_sizes_and_machinery():
    m = config.read(SMALL)
    sliding, full = m.layers[0], m.layers[1]
    assert isinstance(sliding, InklingAttention) and isinstance(full, InklingAttention)
    assert (sliding.num_heads, sliding.num_kv_heads, sliding.head_dim, sliding.sliding_window, sliding.rel_extent,
            sliding.dynamic_conv, sliding.log_scaling) == (2, 1, 6, 5, 5, False, None)
    assert (full.num_heads, full.num_kv_heads, full.head_dim, full.sliding_window, full.rel_extent,
            full.dynamic_conv, full.log_scaling) == (4, 2, 4, None, 9, True, (0.1, 128000))
    assert (full.conv_kernel, full.qk_clip, full.rel_clip, full.norm_eps) == (4, 22.627416997969522, 8.0, 1e-6)
    assert any("post_attention_convolution" in n for n in m.notes)


def test_the_aliases_of_hf_attribute_map_are_read():
    """Inkling2TextConfig maps sliding_window -> sliding_window_size and sconv_kernel_size -> conv_kernel_size."""
    data = {k: v for k, v in SMALL.items() if k != "sliding_window_size"}
    m = config.read({**data, "sliding_window": 3, "sconv_kernel_size": 2})
    assert m.layers[0].sliding_window == 3 and m.layers[0].conv_kernel == 2 and m.layers[1].conv_kernel == 2


@pytest.mark.parametrize("change, words", [
    ({"layer_types": ["hybrid", "full_attention", "hybrid"]}, ["'full_attention'", "hybrid_sliding"]),
    ({"num_key_value_heads": 3}, ["num_key_value_heads (3) must divide num_attention_heads (4)"]),
    ({"swa_num_key_value_heads": 3}, ["swa_num_key_value_heads (3)"]),
    ({"log_scaling_alpha": -0.5}, ["log_scaling_alpha", ">= 0"]),
    ({"rel_extent": 0}, ["rel_extent", ">= 1"]),
    ({"conv_kernel_size": 0}, ["conv_kernel"]),
    ({"qk_l2_clip_threshold": 0.0}, ["qk_l2_clip_threshold"]),
])
def test_what_it_cannot_read_is_named(change, words):
    with pytest.raises((ValueError, TypeError)) as err:
        config.read({**SMALL, **change})
    assert "inkling2_text" in str(err.value)
    for w in words:
        assert w in str(err.value)


def test_config_cli_and_model_vectors(tmp_path, capsys):
    path, out = tmp_path / "inkling2.json", tmp_path / "v"
    path.write_text(json.dumps({"model_type": "inkling2", "text_config": SMALL}))
    assert cli.main(["config", "--runs", str(path)]) == 0 and "inkling2_text" in capsys.readouterr().out
    assert cli.main(["vectors", "export", "--config", str(path), str(out)]) == 0
    doc = json.loads((out / "model_layers.json").read_text())
    assert [c["name"] for c in doc["cases"]] == ["layer0_hybrid_sliding", "layer1_hybrid"]
    assert vectors.check(str(out)) == []


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                 "head_dim", "swa_num_attention_heads", "swa_num_key_value_heads", "swa_head_dim",
                                 "sliding_window_size", "sliding_window", "d_rel", "rel_extent", "log_scaling_n_floor",
                                 "log_scaling_alpha", "qk_l2_clip_threshold", "rel_l2_clip_threshold", "rms_norm_eps",
                                 "conv_kernel_size", "sconv_kernel_size", "layer_types"])
def test_hostile_values_are_read_or_named_never_a_crash(key):
    for value in [None, True, 0, -1, 1.5, "3", [], {}, float("nan"), 2 ** 70]:
        try:
            config.read({**SMALL, key: value})
        except (ValueError, TypeError) as err:
            assert "inkling2_text" in str(err) or key in str(err), (key, value, err)
