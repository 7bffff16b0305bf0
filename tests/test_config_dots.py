"""``minipos.config.read`` on Dots 3 Note's decoder without transformers: the class defaults and the layer pattern
(values printed by transformers 5.24's ``Dots3NoteTextConfig().to_dict()``), and each bad input named. The layers
against transformers' modules: ``tests/test_config_interop_dots.py``."""

import math

import pytest

from minipos import config as mconfig

SMALL = dict(model_type="dots3_note_text", hidden_size=32, num_attention_heads=4, num_hidden_layers=6, q_lora_rank=16,
             kv_lora_rank=8, qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, head_dim=10, index_n_heads=3,
             index_head_dim=8, index_topk=5, swa_num_attention_heads=2, swa_num_key_value_heads=2,
             swa_q_lora_rank=12, swa_kv_lora_rank=6, swa_head_dim=8, swa_qk_nope_head_dim=4, swa_v_head_dim=3)


def test_the_class_defaults():
    # Dots3NoteTextConfig().to_dict(): 46 layers, indexed at 0, 1 and i % 4 == 1, sliding elsewhere (window 512);
    # indexed: 128 heads, kv_lora_rank 512, qk_nope 128, rope 64, theta 8e7; sliding (per_layer_config '02'): 64 heads,
    # kv_lora_rank 1024, qk_nope 192, rope 64 (= 256 - 192), theta 50000; rms_norm_eps 1e-5.
    m = mconfig.read({"model_type": "dots3_note_text"})
    types = [s.layer_type for s in m.specs]
    assert len(types) == 46 and types[:8] == ["indexed_attention"] * 2 + ["sliding_attention"] * 3 + \
        ["indexed_attention"] + ["sliding_attention"] * 2
    assert [i for i, t in enumerate(types) if t == "indexed_attention"] == [0, 1] + list(range(5, 46, 4))
    full, sliding = m.specs[0].kwargs, m.specs[2].kwargs
    assert (full["num_heads"], full["kv_lora_rank"], full["qk_nope_head_dim"], full["qk_rope_head_dim"]) == \
        (128, 512, 128, 64)
    assert (sliding["num_heads"], sliding["kv_lora_rank"], sliding["qk_nope_head_dim"], sliding["qk_rope_head_dim"],
            sliding["v_head_dim"], sliding["q_lora_rank"]) == (64, 1024, 192, 64, 128, 1024)
    assert full["sliding_window"] is None and sliding["sliding_window"] == 512 and full["eps"] == 1e-5
    assert full["q_lora_scale"] == pytest.approx(math.sqrt(5120 / 1024))
    assert full["kv_lora_scale"] == pytest.approx(math.sqrt(5120 / 512))
    assert sliding["kv_lora_scale"] == pytest.approx(math.sqrt(5120 / 1024))
    assert full["scale"] == pytest.approx(192 ** -0.5) and sliding["scale"] == pytest.approx(256 ** -0.5)
    assert m.specs[0].scheme().base == 8e7 and m.specs[2].scheme().base == 50000.0
    assert m.specs[0].indexer["topk"] == 2048 and m.specs[2].indexer is None


def test_switches_of_the_released_config():
    assert {s.layer_type for s in mconfig.read({**SMALL, "use_sliding_window": False}).specs} == {"indexed_attention"}
    assert {s.layer_type for s in mconfig.read({**SMALL, "use_dsa": False}).specs} == {"full_attention",
                                                                                       "sliding_attention"}
    flat = mconfig.read({**SMALL, "rope_parameters": {"rope_type": "default", "rope_theta": 77.0}})
    assert {s.scheme().base for s in flat.specs} == {77.0}                  # flat: every layer type alike


@pytest.mark.parametrize("change, words", [
    ({"per_layer_config": {"2": {"skip": ["mlp"]}}}, r"per_layer_config'\]\['2'\] sets \['skip'\]"),
    ({"per_layer_config": {"9": {"num_attention_heads": 2}}}, r"layer indices 0\.\.5"),
    ({"per_layer_config": {str(i): {"num_attention_heads": None} for i in (2, 3, 4)}},
     r"sets \['num_attention_heads'\] to null"),
    ({"per_layer_config": {"2": {"num_attention_heads": 2, "num_key_value_heads": 2}}},
     "the sliding_attention layers 2 and 3 differ"),
    ({"swa_num_key_value_heads": 1}, r"num_key_value_heads \(1\) must equal num_attention_heads \(2\)"),
    ({"q_lora_rank": None}, "q_lora_rank is null"),
    ({"swa_qk_rope_head_dim": 2}, r"head_dim \(8\) must equal qk_nope_head_dim \+ qk_rope_head_dim"),
    ({"use_dsa": "yes"}, r"use_dsa'\] must be true, false or null"),
    ({"rope_parameters": {"indexed_attention": {"rope_type": "default", "rope_theta": 1.0}}},
     "no entry .* for layer type 'sliding_attention'"),
    ({"swa_head_dim": "8"}, "swa_head_dim'.* must be integers"),
    ({"swa_kv_lora_rank": None}, r"config \['swa_kv_lora_rank'\] null"),
    ({"rope_parameters": {"rope_type": "dynamic", "factor": 2.0}}, "rope_type 'dynamic' changes the frequencies"),
    ({"qk_rope_head_dim": 10, "head_dim": 16}, r"qk_rope_head_dim \(10\) is more than index_head_dim \(8\)"),
])
def test_bad_input_is_named(change, words):
    with pytest.raises(ValueError, match=words) as err:
        mconfig.read({**SMALL, **change})
    assert "dots3_note_text" in str(err.value)


HOSTILE = [None, True, 0, -1, 1.5, "3", [], {}, float("nan"), 2 ** 70]


@pytest.mark.parametrize("key", ["hidden_size", "num_attention_heads", "num_hidden_layers", "q_lora_rank",
                                 "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "head_dim",
                                 "index_n_heads", "index_head_dim", "index_topk", "sliding_window",
                                 "sliding_window_size", "swa_num_attention_heads", "swa_num_key_value_heads",
                                 "swa_q_lora_rank", "swa_kv_lora_rank", "swa_head_dim", "swa_qk_nope_head_dim",
                                 "swa_v_head_dim", "swa_qk_rope_head_dim", "swa_rope_theta", "rope_theta",
                                 "rms_norm_eps", "use_dsa", "use_sliding_window", "layer_types", "per_layer_config",
                                 "rope_parameters", "rope_scaling", "num_key_value_heads"])
def test_hostile_values_are_read_or_named_never_a_crash(key):
    # Every value either reads (None: the default; a number the key takes) or raises ValueError/TypeError naming the
    # model type; nothing else escapes (a sweep of these found null per-layer sizes read as the class default).
    for value in HOSTILE:
        try:
            mconfig.read({**SMALL, key: value})
        except (ValueError, TypeError) as err:
            assert "dots3_note_text" in str(err) or key in str(err), (key, value, err)
