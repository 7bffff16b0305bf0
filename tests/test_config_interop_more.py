"""``minipos.config.read`` on the families of ``minipos._config_more`` against transformers 5.24, as in
``test_config_interop_towers.py``: each model, tiny, is built by transformers with random weights in float64; a
forward hook captures each attention module's input and output, so that the positions (the tower's patch order, the
decoder's three streams) are the ones the model itself uses. The weights are copied into the layer ``read`` builds
for the same config: it must match within atol 1e-6. Bad input: the reader's errors name the key. Skipped when
torch or transformers is missing.

transformers rotates q and k in float32 (cos and sin from float32 angles) inside the float64 model: agreement is
to float32 accuracy, well inside 1e-6 at these sizes."""


import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from minipos import config as mconfig  # noqa: E402
from minipos._config_vision import VISION  # noqa: E402
from minipos.axial import merge_positions  # noqa: E402
from test_config_interop_qwen_vision import _cfg, _randomize  # noqa: E402

ATOL = 1e-6
H, W = 6, 10                             # the image: 6 x 10 patches


def _hook(module, seen, i):
    def hook(m, args, kwargs, out):
        x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
        seen[i] = (x.detach().numpy().copy(), out[0].detach().numpy().copy())
    return module.register_forward_hook(hook, with_kwargs=True)


def _copy(ref, layer, names=("q_proj", "k_proj", "v_proj", "o_proj")):
    """HF's four Linears into the minipos layer: ``W = weight.T``, the biases as they are (or ``None``)."""
    for n, name in zip("qkvo", names):
        lin = getattr(ref, name)
        setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
        setattr(layer, "b" + n, None if lin.bias is None else lin.bias.detach().numpy().copy())


def _compare_decoder(model, read, layers, positions, T, causal=True, other=None):
    """Each layer of ``model.layers`` (float64, random attention weights, the MLPs zeroed) against ``read``'s, on
    the given positions (``(3, T)`` streams, or ``(T,)``); ``other`` positions (default: the streams permuted) must
    change the output."""
    B = 2
    seen, hooks = {}, []
    for i, dec in enumerate(layers):
        dec.mlp.forward = lambda h, *a, **k: torch.zeros_like(h)
        _randomize(dec.self_attn)
        hooks.append(_hook(dec.self_attn, seen, i))
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, T, model.config.hidden_size)))
    with torch.no_grad():
        ids = np.broadcast_to(positions[:, None], (3, B, T)) if positions.ndim == 2 else np.broadcast_to(positions,
                                                                                                         (B, T))
        model(inputs_embeds=x, position_ids=torch.from_numpy(ids.copy()), use_cache=False)
    for h in hooks:
        h.remove()
    for i, dec in enumerate(layers):
        layer = read.layers[i]
        _copy(dec.self_attn, layer)
        got = layer(seen[i][0], positions=positions, causal=causal)
        np.testing.assert_allclose(got, seen[i][1], rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(seen[i][1])) > 0.1                                # a comparison that can fail
        moved = layer(seen[i][0], positions=positions[[0, 2, 1]] if other is None else other, causal=causal)
        assert np.max(np.abs(moved - seen[i][1])) > 1e-3                      # the streams matter


def _streams(T):
    return np.cumsum(np.random.default_rng(3).integers(0, 3, (3, T)), axis=1)   # three different streams


# --------------------------------------------------------------------------- ERNIE-4.5-VL

def _ernie(**kw):
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as hf
    text = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=16, intermediate_size=16,
                vocab_size=8, num_hidden_layers=2, mlp_layer_types=["dense", "dense"],
                rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [3, 3, 2]}, **kw)
    return hf, _cfg(hf.Ernie4_5_VLMoeTextConfig, **text)


def test_ernie4_5_vl_rotary_by_hand():
    # Ernie4_5_VLMoeTextRotaryEmbedding (transformers 5.24), head_dim 16, section [3, 3, 2] (h, w, t), theta 100: a
    # (t, h, w) = (3, 2, 1) token turns frequency i by 2 theta_i (height) for even i < 6, 1 theta_i (width) for odd
    # i < 6, 3 theta_i (temporal) for i = 6, 7, theta_i = 100^(-2i/16); each angle twice, pairs (2i, 2i + 1).
    from minipos.mrope import mrope_angles, mrope_streams
    hf, cfg = _ernie()
    cfg.rope_parameters["rope_theta"] = 100.0
    cos, sin = hf.Ernie4_5_VLMoeTextRotaryEmbedding(cfg)(torch.zeros(1), torch.tensor([[[3]], [[2]], [[1]]]))
    angles = np.arctan2(sin.numpy()[0, 0], cos.numpy()[0, 0])
    theta = 100.0 ** (-2 * np.arange(8) / 16)
    want = np.array([2, 1, 2, 1, 2, 1, 3, 3]) * theta
    np.testing.assert_allclose(angles, np.repeat(want, 2), rtol=0, atol=1e-6)
    assert list(mrope_streams([2, 3, 3], interleaved="hw")) == [1, 2, 1, 2, 1, 2, 0, 0]
    np.testing.assert_allclose(mrope_angles(np.array([[3], [2], [1]]), theta, [2, 3, 3], interleaved="hw")[0], want,
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("bias", [False, True])
def test_ernie4_5_vl_text_decoder(bias):
    # Ernie4_5_VLMoeTextAttention: M-RoPE "hw" ([3, 3, 2] h, w, t in the config: minipos [2, 3, 3]), pairs (2i, 2i+1),
    # GQA, use_bias on all four; against the text model with its own cos and sin from (3, B, T) position ids.
    hf, cfg = _ernie(use_bias=bias)
    read = mconfig.read(cfg)
    assert read.model_type == "ernie4_5_vl_moe_text" and read.layers[0].scheme.mrope_section == [2, 3, 3]
    assert read.layers[0].scheme.interleaved == "hw" and (read.layers[0].bo is None) == (not bias)
    torch.manual_seed(0)
    model = hf.Ernie4_5_VLMoeTextModel(cfg).double().eval()
    _compare_decoder(model, read, model.layers, _streams(12), 12)


def test_ernie4_5_vl_reads_its_decoder_and_its_tower():
    from test_config_interop_qwen_vision import H as QH, MERGE, W as QW, _compare as compare_tower, _run_tower
    from transformers.models.ernie4_5_vl_moe import modeling_ernie4_5_vl_moe as hf
    _, text = _ernie()
    vision = dict(hidden_size=32, num_heads=2, depth=2, patch_size=2, in_channels=1, spatial_merge_size=MERGE,
                  intermediate_size=8, rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    cfg = _cfg(hf.Ernie4_5_VLMoeConfig, text_config=text.to_dict(), vision_config=vision)
    read = mconfig.read(cfg)
    assert (read.model_type, read.vision.model_type) == ("ernie4_5_vl_moe_text", "ernie4_5_vl_moe_vision")
    tower, seen = _run_tower(hf.Ernie4_5_VLMoeVisionTransformerPretrainedModel, cfg.vision_config)
    assert compare_tower(read.vision, tower, seen, merge_positions(QH, QW, MERGE)) == ["full_attention"] * 2


@pytest.mark.parametrize("change, key", [
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [4, 2, 2]}}, "mrope_section"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [2, 2]}}, "mrope_section"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [3, 3, 3]}}, "mrope_section"),
])
def test_ernie4_5_vl_bad_configs_name_the_key(change, key):
    raw = {"model_type": "ernie4_5_vl_moe_text", "hidden_size": 32, "num_attention_heads": 4, "num_hidden_layers": 1,
           **change}
    with pytest.raises(ValueError, match=key) as err:
        mconfig.read(raw)
    assert "ernie4_5_vl_moe_text" in str(err.value)


# --------------------------------------------------------------------------- rope_type "default" in a tower

def _rewrites_default(model_type):
    """Whether transformers' config class turns a rope_type "default" into "axial" (default_rope_type "axial")."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = transformers.CONFIG_MAPPING[model_type](rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    return cfg.rope_parameters.get("rope_type") == "axial"


@pytest.mark.parametrize("model_type", sorted(m for m in VISION if _rewrites_default(m)))
def test_a_tower_reads_rope_type_default_as_its_config_class_does(model_type):
    # transformers' RotaryEmbeddingConfigMixin: a class with default_rope_type "axial" rewrites a "default" rope_type
    # to "axial" (modeling_rope_utils), so a config.json saying "default" runs as "axial"; read it the same.
    cls = transformers.CONFIG_MAPPING[model_type]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        raw = cls().to_dict()
    axial = mconfig.read({**raw, "rope_parameters": {"rope_type": "axial", "rope_theta": 100.0}})
    default = mconfig.read({**raw, "rope_parameters": {"rope_type": "default", "rope_theta": 100.0}})
    assert default.describe() == axial.describe() and "theta 100" in default.specs[0].position


# --------------------------------------------------------------------------- EXAONE 4.5's tower

def test_exaone4_5_vision_tower_windows_and_grouped_keys():
    # Exaone4_5_VisionModel: Qwen2.5-VL's tower (window order, window layers, fullatt_block_indexes) with one qkv
    # Linear of 2 query heads and 1 key/value head (rows [q | k | v] of sizes 32, 16, 16).
    from test_config_interop_qwen_vision import H as QH, MERGE, TOWER, W as QW, _compare as compare_tower, _run_tower
    from transformers.models.exaone4_5 import modeling_exaone4_5 as hf

    def copy(ref, layer):
        w, b = ref.qkv.weight.detach().numpy(), ref.qkv.bias.detach().numpy()
        for n, rows in zip("qkv", (slice(0, 32), slice(32, 48), slice(48, 64))):
            setattr(layer, "w" + n, w[rows].T.copy())
            setattr(layer, "b" + n, b[rows].copy())
        layer.wo, layer.bo = ref.proj.weight.detach().numpy().T.copy(), ref.proj.bias.detach().numpy().copy()
    cfg = _cfg(hf.Exaone4_5_VisionConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8, window_size=8,
               fullatt_block_indexes=[1], num_key_value_heads=1, **TOWER)
    tower, seen = _run_tower(hf.Exaone4_5_VisionModel, cfg)
    model = mconfig.read(cfg)
    assert model.specs[0].kwargs["num_kv_heads"] == 1
    kinds = compare_tower(model, tower, seen, merge_positions(QH, QW, MERGE, window=4), window=4, copy=copy)
    assert kinds == ["window_attention", "full_attention", "window_attention"]
    whole = mconfig.read(transformers.Exaone4_5_Config(vision_config=cfg.to_dict()).to_dict())
    assert whole.vision.model_type == "exaone4_5_vision" and whole.vision.specs[1].layer_type == "full_attention"
    with pytest.raises(ValueError, match="num_key_value_heads"):
        mconfig.read({**cfg.to_dict(), "num_key_value_heads": 3})


# --------------------------------------------------------------------------- PaddleOCR-VL

def _paddle_text(**kw):
    from transformers.models.paddleocr_vl import modeling_paddleocr_vl as hf
    cfg = _cfg(hf.PaddleOCRTextConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8,
               intermediate_size=16, vocab_size=8, num_hidden_layers=2,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 1, 1]}, **kw)
    return hf, cfg


@pytest.mark.parametrize("bias", [False, True])
def test_paddleocr_vl_text_decoder(bias):
    # PaddleOCRAttention: Qwen2-VL's split M-RoPE ([2, 1, 1]: 4 frequencies of head dim 8), use_bias on all four.
    hf, cfg = _paddle_text(use_bias=bias)
    read = mconfig.read(cfg)
    assert read.model_type == "paddleocr_vl_text" and read.layers[0].scheme.mrope_section == [2, 1, 1]
    assert (read.layers[0].bo is None) == (not bias) and read.specs[0].no_bias == ()
    torch.manual_seed(0)
    model = hf.PaddleOCRTextModel(cfg).double().eval()
    _compare_decoder(model, read, model.layers, _streams(12), 12)


def _paddle_vision(**kw):
    from transformers.models.paddleocr_vl import modeling_paddleocr_vl as hf
    cfg = _cfg(hf.PaddleOCRVisionConfig, hidden_size=32, intermediate_size=8, num_hidden_layers=3,
               num_attention_heads=2, num_channels=1, image_size=8, patch_size=2, spatial_merge_size=2,
               rope_parameters={"rope_type": "axial", "rope_theta": 100.0}, **kw)
    return hf, cfg


def test_paddleocr_vl_vision_tower():
    # PaddleOCRVisionEncoder: get_vision_position_ids(grid_thw, 1): row-major positions whatever spatial_merge_size
    # (2 here) says; the learned table (8 // 2 = 4 a side, resampled to 6 x 10) is in the captured input.
    hf, cfg = _paddle_vision()
    torch.manual_seed(0)
    tower = hf.PaddleOCRVisionModel(cfg).double().eval()
    layers = tower.vision_model.encoder.layers
    seen = {}
    for i, block in enumerate(layers):
        _randomize(block.self_attn)
        _hook(block.self_attn, seen, i)
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((1, H * W, 1, 2, 2)))
    with torch.no_grad():
        tower(pixels, grid_thw=torch.tensor([[1, H, W]]))
    model, positions = mconfig.read(cfg), merge_positions(H, W, 1)
    assert model.kind == "vision encoder" and "4 x 4" in model.specs[0].notes[0]
    assert np.array_equal(positions, np.stack(np.divmod(np.arange(H * W), W)))  # row-major
    for i, block in enumerate(layers):
        layer = model.layers[i]
        _copy(block.self_attn, layer, ("q_proj", "k_proj", "v_proj", "out_proj"))
        x, want = seen[i]
        np.testing.assert_allclose(layer(x[None], positions=positions, causal=False)[0], want, rtol=0, atol=ATOL)
        assert np.max(np.abs(want)) > 0.1
        merged = layer(x[None], positions=merge_positions(H, W, 2), causal=False)[0]
        assert np.max(np.abs(merged - want)) > 1e-3                           # not the Qwen towers' merge order


def test_paddleocr_vl_whole_config_reads_its_decoder_and_its_tower():
    cfg = _cfg(transformers.PaddleOCRVLConfig, text_config={"hidden_size": 256, "num_attention_heads": 2,
                                                            "num_hidden_layers": 2},
               vision_config={"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2})
    model = mconfig.read(cfg)
    assert (model.model_type, model.vision.model_type) == ("paddleocr_vl_text", "paddleocr_vl_vision")
    assert (len(model.layers), len(model.vision.layers), model.layers[0].scheme.mrope_section) == (2, 2, [16, 24, 24])
    flat = mconfig.read({"model_type": "paddleocr_vl", "num_hidden_layers": 1})   # a flat hub config: the defaults
    assert flat.model_type == "paddleocr_vl_text" and flat.layers[0].head_dim == 128


@pytest.mark.parametrize("change, key", [
    ({"layer_types": ["sliding_attention"]}, "layer_types"),
    ({"rope_parameters": {"rope_type": "linear", "factor": 2.0, "rope_theta": 1e4, "mrope_section": [16, 24, 24]}},
     "rope_type"),
    ({"rope_parameters": {"rope_type": "default", "rope_theta": 1e4, "mrope_section": [16, 24]}}, "mrope_section"),
])
def test_paddleocr_vl_bad_text_configs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        mconfig.read({"model_type": "paddleocr_vl_text", "num_hidden_layers": 1, **change})


@pytest.mark.parametrize("change, key", [
    ({"image_size": 8, "patch_size": 14}, "image_size"),
    ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),   # "only axial"
    ({"rope_parameters": {"rope_type": "axial", "rope_theta": 1e4, "factor": 2.0}}, "factor"),
])
def test_paddleocr_vl_bad_vision_configs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        mconfig.read({"model_type": "paddleocr_vl_vision", **change})


# --------------------------------------------------------------------------- DeepSeek-OCR-2

def _ocr2_text(**kw):
    from transformers.models.deepseek_ocr2 import modeling_deepseek_ocr2 as hf
    cfg = _cfg(hf.DeepseekOcr2TextConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=16, moe_intermediate_size=8, n_routed_experts=2, num_experts_per_tok=1,
               n_shared_experts=1, vocab_size=8, num_hidden_layers=2, mlp_layer_types=["dense", "sparse"],
               rope_parameters={"rope_type": "default", "rope_theta": 100.0}, **kw)
    return hf, cfg


@pytest.mark.parametrize("bias", [False, True])
def test_deepseek_ocr2_text_decoder(bias):
    # DeepseekOcr2TextAttention: Llama's layer (RoPE half, GQA 4/2, head_dim 32 // 4 = 8), attention_bias on all four.
    hf, cfg = _ocr2_text(attention_bias=bias)
    read = mconfig.read(cfg)
    assert read.model_type == "deepseek_ocr2_text" and (read.layers[0].num_kv_heads, read.layers[0].head_dim) == (2, 8)
    torch.manual_seed(0)
    model = hf.DeepseekOcr2TextModel(cfg).double().eval()
    T = 12
    # 1-D positions stepping by 1, from 5: transformers' mask (find_packed_sequence_indices) takes any other step for the
    # start of a packed sequence and masks across it.
    _compare_decoder(model, read, model.layers, 5 + np.arange(T), T, other=2 * np.arange(T))


def test_deepseek_ocr2_whole_config_reads_its_decoder_and_its_sam_tower():
    from transformers.models.deepseek_ocr2 import configuration_deepseek_ocr2 as hf
    cfg = _cfg(hf.DeepseekOcr2Config, text_config={"hidden_size": 64, "num_attention_heads": 4,
                                                    "num_hidden_layers": 2})
    model = mconfig.read(cfg)
    assert (model.model_type, model.layers[0].head_dim) == ("deepseek_ocr2_text", 16)
    tower = model.vision                                                # SAM ViT-B's defaults: 12 layers, 14 and 64
    assert tower.model_type == "deepseek_ocr2_vision" and len(tower.layers) == 12
    kinds = [s.layer_type for s in tower.specs]
    assert [i for i, k in enumerate(kinds) if k == "full_attention"] == [2, 5, 8, 11]
    assert repr(tower.layers[0].scheme) == "DecomposedRelPos(height=14, width=14)"
    assert repr(tower.layers[2].scheme) == "DecomposedRelPos(height=64, width=64)"
    assert tower.layers[2].scheme.rel_pos_h.shape == (127, 64)          # (2 x 64 - 1, 768 // 12)
    assert any("Qwen2 encoder" in n and "not read" in n for n in tower.notes)


def _ocr2_sam(**kw):
    from transformers.models.deepseek_ocr2 import modeling_deepseek_ocr2 as hf
    sam = dict(hidden_size=16, num_attention_heads=2, num_hidden_layers=3, image_size=80, patch_size=16,
               window_size=3, global_attn_indexes=[1], mlp_dim=8, **kw)      # a 5 x 5 grid, 3 x 3 windows, padded
    cfg = _cfg(hf.DeepseekOcr2Config, vision_config={"sam_config": sam},
               text_config={"hidden_size": 16, "num_attention_heads": 2, "num_hidden_layers": 1})
    return hf, cfg


@pytest.mark.parametrize("qkv_bias", [True, False])
def test_deepseek_ocr2_sam_tower_layers(qkv_bias):
    # Each DeepseekOcr2SamVisionSdpaAttention (the SDPA class: the eager one takes its softmax in float32) against the
    # layer read builds, on the inputs the tower itself gives it: a window layer gets each padded 3 x 3 window (4 of
    # them per image: the 5 x 5 grid padded to 6 x 6), the global layer the whole 5 x 5 grid.
    hf, cfg = _ocr2_sam(qkv_bias=qkv_bias)
    read = mconfig.read(cfg).vision
    sam_cfg = cfg.vision_config.sam_config
    sam_cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    encoder = hf.DeepseekOcr2SamVisionEncoder(sam_cfg).double().eval()
    _randomize(encoder)
    seen = {}
    hooks = [_hook(layer.attn, seen, i) for i, layer in enumerate(encoder.layers)]
    x = torch.tensor(np.random.default_rng(0).standard_normal((2, 5, 5, 16)))
    with torch.no_grad():
        for layer in encoder.layers:
            x = layer(x)
    for h in hooks:
        h.remove()
    assert [s.layer_type for s in read.specs] == ["window_attention", "full_attention", "window_attention"]
    for i, layer in enumerate(encoder.layers):
        mine, attn = read.layers[i], layer.attn
        C = 16
        W_, b_ = attn.qkv.weight.detach().numpy(), None if attn.qkv.bias is None else attn.qkv.bias.detach().numpy()
        mine.wq, mine.wk, mine.wv = (W_[j * C:(j + 1) * C].T.copy() for j in range(3))
        assert (mine.bq is None) == (not qkv_bias)
        if qkv_bias:
            mine.bq, mine.bk, mine.bv = (b_[j * C:(j + 1) * C].copy() for j in range(3))
        mine.wo, mine.bo = attn.proj.weight.detach().numpy().T.copy(), attn.proj.bias.detach().numpy().copy()
        mine.scheme.rel_pos_h = attn.rel_pos_h.detach().numpy().copy()
        mine.scheme.rel_pos_w = attn.rel_pos_w.detach().numpy().copy()
        inp, out = seen[i]                                                # (N, h, w, C): windows or the grid
        N, h, w, _ = inp.shape
        assert (h, w) == ((3, 3) if i != 1 else (5, 5)) and N == (8 if i != 1 else 2)
        got = mine(inp.reshape(N, h * w, C), causal=False)
        np.testing.assert_allclose(got, out.reshape(N, h * w, C), rtol=0, atol=ATOL)


def test_deepseek_ocr2_bad_configs_name_the_key():
    with pytest.raises(ValueError, match="hidden_size"):
        mconfig.read({"model_type": "deepseek_ocr2_text", "hidden_size": 30, "num_attention_heads": 4})
    with pytest.raises(ValueError, match="rope_type"):
        mconfig.read({"model_type": "deepseek_ocr2_text", "rope_parameters": {"rope_type": "warp", "rope_theta": 1e4}})
    narrowed = mconfig.read({"model_type": "deepseek_ocr2_text", "hidden_size": 16, "num_attention_heads": 2,
                             "head_dim": 128, "num_hidden_layers": 1})          # a narrowed copy keeps head_dim
    assert narrowed.layers[0].head_dim == 128 and "head_dim 128" in narrowed.specs[0].notes[-1]


# --------------------------------------------------------------------------- Kimi K2.5

def _kimi(text_type="deepseek_v3"):
    text = dict(model_type=text_type, hidden_size=32, num_attention_heads=4, num_key_value_heads=4,
                intermediate_size=16, moe_intermediate_size=8, vocab_size=8, num_hidden_layers=2,
                first_k_dense_replace=1, n_routed_experts=4, num_experts_per_tok=2, n_group=1, topk_group=1,
                q_lora_rank=16, kv_lora_rank=8, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=6,
                rope_parameters={"rope_type": "yarn", "rope_theta": 1000.0, "factor": 4.0,
                                 "original_max_position_embeddings": 4, "mscale": 1.0, "mscale_all_dim": 0.5,
                                 "beta_fast": 8.0, "beta_slow": 1.0})
    return _cfg(transformers.Kimi_K25Config, text_config=text,
                vision_config={"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 1})


@pytest.mark.parametrize("text_type", ["deepseek_v3", "kimi_k2"])
def test_kimi_k25_reads_its_deepseek_v3_decoder(text_type):
    # Kimi_K25Model builds AutoModel.from_config(text_config): a DeepseekV3Model (the hub's "kimi_k2" renamed by
    # Kimi_K25Config.__post_init__). Its MLA layers against read(the whole Kimi config), as test_config_interop does.
    from test_config_interop import _compare as compare_layers, _run_model
    cfg = _kimi(text_type)
    assert cfg.text_config.model_type == "deepseek_v3"
    model, seen = _run_model(transformers.DeepseekV3Model, cfg.text_config)
    compare_layers(cfg, model, seen)
    raw = cfg.to_dict()
    raw["text_config"]["model_type"] = text_type                             # the hub file as it is
    read = mconfig.read(raw)
    assert read.model_type == "deepseek_v3" and read.vision.model_type == "kimi_k25_vision"


def test_kimi_k25_vision_rotary_angles():
    # Kimi_K25VisionRotaryEmbedding (head_dim 16, theta 100) at a patch of row 2, column 1: pair i = (i, i + 8) turns
    # by 1 * f_(i//2) for even i (the column), 2 * f_(i//2) for odd i (the row), f_j = 100^(-4j/16), worked by hand
    # and read back from HF's cos and sin; minipos's "kimi" layout gives the same pairs, axes and frequencies.
    from minipos.axial import axial_angles, axial_pairs
    from transformers.models.kimi_k25 import modeling_kimi_k25 as hf
    cfg = _cfg(hf.Kimi_K25VisionConfig, hidden_size=32, num_attention_heads=2, num_hidden_layers=1,
               rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    cos, sin = hf.Kimi_K25VisionRotaryEmbedding(cfg)(torch.zeros(1), torch.tensor([[2, 1]]))
    angles = np.arctan2(sin.numpy()[0], cos.numpy()[0])                       # (16,): [a_0 .. a_7 | a_0 .. a_7]
    f = 100.0 ** (-4 * np.arange(4) / 16)
    want = np.array([(1 if i % 2 == 0 else 2) * f[i // 2] for i in range(8)])
    np.testing.assert_allclose(angles, np.concatenate([want, want]), rtol=0, atol=1e-6)
    a, b, _, _ = axial_pairs(16, base=100.0, layout="kimi")
    assert list(a) == list(range(8)) and list(b) == list(range(8, 16))
    np.testing.assert_allclose(axial_angles(np.array([[2], [1]]), 16, base=100.0, layout="kimi")[0], want,
                               rtol=1e-12, atol=0)


@pytest.mark.parametrize("frames", [1, 2])
def test_kimi_k25_vision_tower(frames):
    # Kimi_K25VisionModel: get_vision_position_ids(grid_thw, 1), row-major, each frame the same grid; one clip attends
    # as a whole (merge_temporal=True); q, k, v and proj with biases; the learned and the frame tables are added
    # before layer 0 (inside the hooked input).
    from minipos.axial import axial_positions
    from transformers.models.kimi_k25 import modeling_kimi_k25 as hf
    cfg = _cfg(hf.Kimi_K25VisionConfig, hidden_size=32, intermediate_size=8, num_hidden_layers=2,
               num_attention_heads=2, patch_size=2, pos_emb_height=4, pos_emb_width=4,
               rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    torch.manual_seed(0)
    tower = hf.Kimi_K25VisionModel(cfg).double().eval()
    seen = {}
    for i, block in enumerate(tower.layers):
        _randomize(block.attn)

        def hook(m, args, kwargs, out, i=i):
            seen[i] = (kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]).detach().numpy().copy(), \
                out.detach().numpy().copy()
        block.attn.register_forward_hook(hook, with_kwargs=True)
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((frames * H * W, 3, 2, 2)))
    with torch.no_grad():
        tower(pixels, grid_thw=torch.tensor([[frames, H, W]]))
    model = mconfig.read(cfg)
    positions = np.tile(axial_positions(H, W), frames)
    assert model.model_type == "kimi_k25_vision" and "kimi" in model.specs[0].position
    for i, block in enumerate(tower.layers):
        layer = model.layers[i]
        _copy(block.attn, layer, ("q_proj", "k_proj", "v_proj", "proj"))
        x, want = seen[i]
        np.testing.assert_allclose(layer(x[None], positions=positions, causal=False)[0], want, rtol=0, atol=ATOL)
        assert np.max(np.abs(want)) > 0.1
        wrong = layer(x[None], positions=positions[::-1], causal=False)[0]
        assert np.max(np.abs(wrong - want)) > 1e-3                            # rows and columns are not alike


def test_kimi_k25_reads_its_tower():
    read = mconfig.read(_kimi())
    assert read.vision.model_type == "kimi_k25_vision" and len(read.vision.layers) == 1
    assert "learned position table" in read.vision.specs[0].notes[0]


@pytest.mark.parametrize("change, key", [
    ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
    ({"rope_parameters": {"rope_type": "axial", "rope_theta": -1.0}}, "rope_theta"),
    ({"head_dim": 32}, "head_dim"),
])
def test_kimi_k25_bad_vision_configs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        mconfig.read({"model_type": "kimi_k25_vision", **change})


def test_kimi_k25_bad_text_config_names_the_key():
    raw = _kimi().to_dict()
    raw["text_config"]["rope_parameters"]["rope_type"] = "warp"
    with pytest.raises(ValueError, match="rope_type"):
        mconfig.read(raw)


# --------------------------------------------------------------------------- VideoLLaMA 3

@pytest.mark.parametrize("merge", [1, 2])
def test_video_llama_3_vision_tower(merge):
    # VideoLlama3VisionModel: get_vision_position_ids(grid_thw, merge_sizes), the merge size a call input (the image
    # processor's 1, the video processor's 2); q, k, v, out_proj with biases; no learned table.
    from transformers.models.video_llama_3 import modeling_video_llama_3 as hf
    cfg = _cfg(hf.VideoLlama3VisionConfig, hidden_size=32, intermediate_size=8, num_hidden_layers=3,
               num_attention_heads=2, num_channels=1, patch_size=2,
               rope_parameters={"rope_type": "axial", "rope_theta": 100.0})
    torch.manual_seed(0)
    tower = hf.VideoLlama3VisionModel(cfg).double().eval()
    layers = tower.encoder.layers
    seen = {}
    for i, block in enumerate(layers):
        _randomize(block.self_attn)
        _hook(block.self_attn, seen, i)
    pixels = torch.from_numpy(np.random.default_rng(0).standard_normal((H * W, 1 * 2 * 2)))
    with torch.no_grad():
        tower(pixels, grid_thw=torch.tensor([[1, H, W]]), merge_sizes=torch.tensor([merge]))
    model, positions = mconfig.read(cfg), merge_positions(H, W, merge)
    assert model.model_type == "video_llama_3_vision" and "merge_sizes" in model.specs[0].position
    for i, block in enumerate(layers):
        layer = model.layers[i]
        _copy(block.self_attn, layer, ("q_proj", "k_proj", "v_proj", "out_proj"))
        x, want = seen[i]
        np.testing.assert_allclose(layer(x[None], positions=positions, causal=False)[0], want, rtol=0, atol=ATOL)
        assert np.max(np.abs(want)) > 0.1
        wrong = layer(x[None], positions=merge_positions(H, W, 3 - merge), causal=False)[0]
        assert np.max(np.abs(wrong - want)) > 1e-3                            # the merge size matters


def test_video_llama_3_reads_its_qwen2_decoder_and_its_tower():
    # VideoLlama3Model builds AutoModel.from_config(text_config): a Qwen2Model by default (RoPE half, q/k/v biases).
    from test_config_interop import SMALL
    from test_config_interop import _compare as compare_layers, _run_model
    cfg = _cfg(transformers.VideoLlama3Config, text_config={**SMALL, "model_type": "qwen2", "num_hidden_layers": 2,
                                                            "rope_parameters": {"rope_type": "default",
                                                                                "rope_theta": 100.0}},
               vision_config={"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2})
    model, seen = _run_model(transformers.Qwen2Model, cfg.text_config)
    compare_layers(cfg, model, seen)
    read = mconfig.read(cfg)
    assert (read.model_type, read.vision.model_type, len(read.vision.layers)) == ("qwen2", "video_llama_3_vision", 2)


@pytest.mark.parametrize("change, key", [
    ({"hidden_size": 30, "num_attention_heads": 4}, "hidden_size"),
    ({"rope_parameters": {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0}}, "rope_type"),
    ({"head_dim": 32}, "head_dim"),
])
def test_video_llama_3_bad_vision_configs_name_the_key(change, key):
    with pytest.raises(ValueError, match=key):
        mconfig.read({"model_type": "video_llama_3_vision", **change})
