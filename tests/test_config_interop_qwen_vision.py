"""``minipos.config.read``'s Qwen vision towers against transformers 5.24 (``.vision``, the ``"qwen"`` layout of
``minipos.axial``): each tower, tiny, is built by transformers with random weights in float64 and run on one image;
a forward hook captures each encoder layer's attention input and output, so that the patch order, the position
embeddings and the windows are the ones the tower itself builds. The weights are copied into the layer ``read``
builds for the same config, which runs on the captured input with ``merge_positions`` (and, on Qwen2.5-VL's window
layers, ``axial_window_mask``): it must match within atol 1e-6. Qwen2.5-VL's text decoder is compared the same way
as the other decoders (tests/test_config_interop.py). Skipped when torch or transformers is missing.

transformers rotates q and k in float32 (``apply_rotary_pos_emb_vision``'s ``.float()``, cos and sin from float32
angles) inside the float64 tower: agreement is to float32 accuracy, well inside 1e-6 at these sizes."""

import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from minipos import config as mconfig  # noqa: E402
from minipos.axial import axial_window_mask, merge_positions  # noqa: E402

ATOL = 1e-6
H, W, MERGE = 6, 10, 2                   # the image: 6 x 10 patches of 2 x 2 pixels, one channel, one frame
TOWER = dict(num_heads=2, depth=3, patch_size=2, temporal_patch_size=1, in_channels=1, spatial_merge_size=MERGE,
             rope_parameters={"rope_type": "axial", "rope_theta": 100.0})


def _cfg(cls, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        cfg = cls(**kw)
    cfg._attn_implementation = "eager"
    return cfg


def _randomize(module):
    """Every parameter drawn away from its init (the biases too, so that each is compared)."""
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 2:
                p.normal_(0.0, p.shape[1] ** -0.5)
            else:
                p.normal_(0.0, 0.5)


def _run_tower(model_cls, cfg, seed=0, **call):
    """The tower in float64 on one random H x W image: ``(tower, {layer: (attention input, output)})``."""
    torch.manual_seed(seed)
    tower = model_cls(cfg).double().eval()
    seen, hooks = {}, []
    for i, block in enumerate(tower.blocks):
        _randomize(block.attn)

        def hook(module, args, kwargs, out, i=i):
            x = kwargs["hidden_states"] if "hidden_states" in kwargs else args[0]
            seen[i] = (x.detach().numpy().copy(), out.detach().numpy().copy())
        hooks.append(block.attn.register_forward_hook(hook, with_kwargs=True))
    channels = getattr(cfg, "in_channels", getattr(cfg, "num_channels", 1))
    pixels = torch.from_numpy(np.random.default_rng(seed).standard_normal((H * W, channels * cfg.patch_size ** 2)))
    with torch.no_grad():
        tower(pixels, grid_thw=torch.tensor([[1, H, W]]), **call)
    for h in hooks:
        h.remove()
    return tower, seen


def _copy(ref, layer, qkv="qkv", proj="proj"):
    """HF ``qkv`` (one Linear, [q | k | v] rows) and ``proj`` into the minipos layer: ``W = weight.T``."""
    w, b = getattr(ref, qkv).weight.detach().numpy(), getattr(ref, qkv).bias
    d = layer.d_model
    for n, part in zip("qkv", range(3)):
        setattr(layer, "w" + n, w[part * d:(part + 1) * d].T.copy())
        setattr(layer, "b" + n, None if b is None else b.detach().numpy()[part * d:(part + 1) * d].copy())
    out = getattr(ref, proj)
    layer.wo = out.weight.detach().numpy().T.copy()
    layer.bo = None if out.bias is None else out.bias.detach().numpy().copy()


def _compare(model, tower, seen, positions, window=None, copy=_copy):
    """Every layer of ``model`` (read) against the captured module; returns the layer types compared. A window
    layer must carry ``window`` as its ``patch_window`` and runs with that window's mask."""
    assert model.kind == "vision encoder" and len(model.layers) == len(tower.blocks)
    kinds = []
    for i, block in enumerate(tower.blocks):
        x, want = seen[i]                                                       # (T, dim) each: one image
        layer, spec = model.layers[i], model.specs[i]
        copy(block.attn, layer)
        assert spec.patch_window == (None if spec.layer_type == "full_attention" else window)
        mask = None if spec.patch_window is None else axial_window_mask(positions, window)[None]
        got = layer(x[None], positions=positions, mask=mask, causal=False)[0]
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL, err_msg=f"layer {i}")
        assert np.max(np.abs(want)) > 0.1                                     # a comparison that can fail
        raster = layer(x[None], positions=np.roll(positions, 1, axis=1), mask=mask, causal=False)[0]
        assert np.max(np.abs(raster - want)) > 1e-3                           # the order of the positions matters
        kinds.append(spec.layer_type)
    return kinds


def test_qwen2_vl_vision_tower():
    from transformers.models.qwen2_vl import modeling_qwen2_vl as hf
    # embed_dim is the tower's width (head dim 32 / 2 = 16); hidden_size, the merger's output, plays no part.
    cfg = _cfg(hf.Qwen2VLVisionConfig, embed_dim=32, hidden_size=8, mlp_ratio=1, **TOWER)
    tower, seen = _run_tower(hf.Qwen2VisionTransformerPretrainedModel, cfg)
    assert _compare(mconfig.read(cfg), tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3
    assert mconfig.read(cfg).specs[0].kwargs["head_dim"] == 16


def test_qwen2_5_vl_vision_tower_window_and_full_layers():
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf
    # window_size 8 // merge 2 // patch 2 = 2 merged patches a side: windows of 4 x 4 patches, cut at the grid's
    # edge (rows 4-5, columns 8-9). Layer 1 attends over the whole image.
    cfg = _cfg(hf.Qwen2_5_VLVisionConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8, window_size=8,
               fullatt_block_indexes=[1], **TOWER)
    tower, seen = _run_tower(hf.Qwen2_5_VisionTransformerPretrainedModel, cfg)
    positions = merge_positions(H, W, MERGE, window=4)                          # the window order, every layer
    kinds = _compare(mconfig.read(cfg), tower, seen, positions, window=4)
    assert kinds == ["window_attention", "full_attention", "window_attention"]
    layer, x = mconfig.read(cfg).layers[0], seen[0][0]
    _copy(tower.blocks[0].attn, layer)
    whole = layer(x[None], positions=positions, causal=False)[0]               # without the windows: another output
    assert np.max(np.abs(whole - seen[0][1])) > 1e-3


def test_qwen3_vl_vision_tower_with_its_learned_position_table():
    from transformers.models.qwen3_vl import modeling_qwen3_vl as hf
    # The learned table (num_position_embeddings 16: 4 x 4, resampled to 6 x 10) is added before layer 0, so the
    # captured input already holds it; the attention layers themselves carry 2-D RoPE only.
    cfg = _cfg(hf.Qwen3VLVisionConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8,
               num_position_embeddings=16, deepstack_visual_indexes=[], **TOWER)
    tower, seen = _run_tower(hf.Qwen3VLVisionModel, cfg)
    assert _compare(mconfig.read(cfg), tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3
    assert "learned position table" in mconfig.read(cfg).specs[0].notes[0]


def test_qwen3_vl_moe_vision_tower():
    from transformers.models.qwen3_vl_moe import modeling_qwen3_vl_moe as hf
    cfg = _cfg(hf.Qwen3VLMoeVisionConfig, hidden_size=32, out_hidden_size=8, intermediate_size=8,
               num_position_embeddings=16, deepstack_visual_indexes=[], **TOWER)
    tower, seen = _run_tower(hf.Qwen3VLMoeVisionModel, cfg)
    assert _compare(mconfig.read(cfg), tower, seen, merge_positions(H, W, MERGE)) == ["full_attention"] * 3


@pytest.mark.parametrize("outer, vision_cls", [("Qwen2VLConfig", "Qwen2VLVisionConfig"),
                                               ("Qwen2_5_VLConfig", "Qwen2_5_VLVisionConfig"),
                                               ("Qwen3VLConfig", "Qwen3VLVisionConfig"),
                                               ("Qwen3VLMoeConfig", "Qwen3VLMoeVisionConfig")])
def test_the_tower_of_a_whole_config_is_its_config_class_one(outer, vision_cls):
    # A hub file's vision_config has no model_type, or the outer one ("qwen2_vl"); transformers builds the tower
    # its config class names all the same, and so does the reader.
    cls = getattr(transformers, outer)
    cfg = _cfg(cls, vision_config={"depth": 2, "num_heads": 2, "hidden_size": 32, "embed_dim": 32,
                                   "model_type": cls.model_type})
    assert type(cfg.vision_config).__name__ == vision_cls
    model = mconfig.read(cfg)
    assert model.vision.model_type == type(cfg.vision_config).model_type and len(model.vision.layers) == 2
    assert model.vision.layers[0].scheme.layout == "qwen" and not model.notes


def test_qwen2_5_vl_text_decoder():
    # Qwen2_5_VLAttention is Qwen2VLAttention (M-RoPE with mrope_section, q/k/v biases): read as qwen2_vl.
    from transformers.models.qwen2_5_vl import modeling_qwen2_5_vl as hf
    B, T = 2, 12
    cfg = _cfg(transformers.Qwen2_5_VLTextConfig, hidden_size=32, num_attention_heads=4, num_key_value_heads=2,
               intermediate_size=16, vocab_size=8, num_hidden_layers=2,
               rope_parameters={"rope_type": "default", "rope_theta": 1000.0, "mrope_section": [2, 1, 1]})
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    model = hf.Qwen2_5_VLTextModel(cfg).double().eval()
    positions = np.cumsum(np.random.default_rng(3).integers(0, 3, (3, T)), axis=1)     # three different streams
    seen = {}
    for i, dec in enumerate(model.layers):
        _randomize(dec.self_attn)
        dec.self_attn.register_forward_hook(
            lambda m, a, k, out, i=i: seen.__setitem__(i, (k["hidden_states"].numpy().copy(), out[0].numpy().copy())),
            with_kwargs=True)
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, T, 32)))
    with torch.no_grad():
        model(inputs_embeds=x, position_ids=torch.from_numpy(np.broadcast_to(positions[:, None], (3, B, T)).copy()),
              use_cache=False)
    read = mconfig.read(cfg)
    assert read.model_type == "qwen2_5_vl_text"
    for i, dec in enumerate(model.layers):
        layer, ref = read.layers[i], dec.self_attn
        for n in "qkvo":
            lin = getattr(ref, f"{n}_proj")
            setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
            setattr(layer, "b" + n, None if lin.bias is None else lin.bias.detach().numpy().copy())
        np.testing.assert_allclose(layer(seen[i][0], positions=positions, causal=True), seen[i][1], rtol=0, atol=ATOL)
