"""``minipos.config.read`` for the SAM family's 2-D RoPE against transformers 5.24, as the other interop tests do:
transformers builds the module (random weights, float64), a forward hook captures each attention module's input and
output inside it (so the positions, the scaled coordinates and the windows are transformers' own), the weights are
copied into the layer ``read`` builds for the same config, and the outputs must agree within atol 1e-6.

- SAM 3's ViT: two ``Sam3ViTLayer`` (a window layer, a global layer; the layer, not ``Sam3ViTModel``, which asks for
  torchvision), each on a 6 x 6 grid of features; the window layer's windows put back on the grid with HF's
  ``window_unpartition``, minipos runs it with ``axial_window_mask``; the global layer's coordinates are 1/2 of the grid's.
- The video trackers' memory attention (SAM 2 video, SAM 3 tracker video, EdgeTAM video): each layer's
  ``self_attn`` on a 3 x 4 feature grid (rows 3, columns 4: ``memory_attention_rope_feat_sizes`` [4, 3]).
- Inkling 2: ``Inkling2VisionAttention`` with ``Inkling2VisionRotaryEmbedding`` at the positions
  ``Inkling2VisionModel.forward`` builds (``get_vision_position_ids`` + 1, the class token first at (0, 0)).

transformers rotates q and k in float32 (``q.float()``, float32 angles) inside the float64 modules: agreement is
to float32 accuracy, inside 1e-6 at these sizes. Skipped when torch or transformers is missing."""


import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from minipos import config as mconfig  # noqa: E402
from minipos.axial import axial_positions, axial_window_mask, merge_positions  # noqa: E402
from test_config_interop_qwen_vision import _cfg  # noqa: E402

ATOL = 1e-6
ROPE = {"rope_type": "axial", "rope_theta": 100.0}


def _randomize(module, seed):
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, p.shape[1] ** -0.5 if p.ndim == 2 else 0.5)


def _copy(ref, layer, out="o_proj"):
    for n in "qkv":
        lin = getattr(ref, f"{n}_proj")
        setattr(layer, "w" + n, lin.weight.detach().numpy().T.copy())
        setattr(layer, "b" + n, lin.bias.detach().numpy().copy())
    lin = getattr(ref, out)
    layer.wo, layer.bo = lin.weight.detach().numpy().T.copy(), lin.bias.detach().numpy().copy()


def _hook(module, seen, key):
    def hook(mod, args, kwargs, output):
        x = args[0] if args else kwargs.get("hidden_states", kwargs.get("query"))
        seen[key] = (x.detach().numpy().copy(), output[0].detach().numpy().copy())
    return module.register_forward_hook(hook, with_kwargs=True)


def _sam3_vit_config(**kw):
    from transformers import Sam3ViTConfig
    return _cfg(Sam3ViTConfig, **{"hidden_size": 32, "num_attention_heads": 2, "num_hidden_layers": 2,
                                  "intermediate_size": 16, "image_size": 24, "patch_size": 4, "pretrain_image_size": 24,
                                  "window_size": 3, "global_attn_indexes": [1], "rope_parameters": ROPE, **kw})


def test_sam3_vit_window_and_global_layers():
    import transformers.models.sam3.modeling_sam3 as hf   # the module itself: its lazy package asks for torchvision
    cfg = _sam3_vit_config()
    model = mconfig.read(cfg.to_dict())
    assert model.kind == "vision encoder" and [s.layer_type for s in model.specs] == ["window_attention",
                                                                                    "full_attention"]
    assert model.specs[0].patch_window == 3 and model.layers[1].scheme.position_scale == 0.5   # 3 / (24 // 4)
    grid, B = 6, 2
    x = torch.from_numpy(np.random.default_rng(0).standard_normal((B, grid, grid, 32)))
    pos = axial_positions(grid, grid)                                            # (2, 36), row-major as HF's view
    for i, window in enumerate([3, 0]):
        layer = hf.Sam3ViTLayer(cfg, window_size=window).double().eval()
        _randomize(layer.attention, i)
        seen = {}
        h = _hook(layer.attention, seen, i)
        with torch.no_grad():
            layer(x)
        h.remove()
        xin, out = seen[i]
        if window:                                           # (B * windows, 3, 3, C): back on the 6 x 6 grid
            pad = (grid, grid)
            xin = hf.window_unpartition(torch.from_numpy(xin), window, pad, pad).numpy()
            out = hf.window_unpartition(torch.from_numpy(out), window, pad, pad).numpy()
        ours = model.layers[i]
        _copy(layer.attention, ours)
        mask = np.broadcast_to(axial_window_mask(pos, window), (B, 36, 36)) if window else None
        got = ours(xin.reshape(B, 36, 32), positions=pos, causal=False, mask=mask)
        np.testing.assert_allclose(got, out.reshape(B, 36, 32), atol=ATOL, rtol=0)


def test_sam3_vit_global_layer_needs_its_scale():
    # Without position_scale (the grid's integer coordinates) the global layer differs from HF's: the scale is seen.
    import transformers.models.sam3.modeling_sam3 as hf   # the module itself: its lazy package asks for torchvision
    cfg = _sam3_vit_config()
    layer = hf.Sam3ViTLayer(cfg, window_size=0).double().eval()
    _randomize(layer.attention, 5)
    seen = {}
    h = _hook(layer.attention, seen, 0)
    x = torch.from_numpy(np.random.default_rng(1).standard_normal((1, 6, 6, 32)))
    with torch.no_grad():
        layer(x)
    h.remove()
    ours = mconfig.read(cfg.to_dict()).layers[1]
    _copy(layer.attention, ours)
    pos = axial_positions(6, 6)
    np.testing.assert_allclose(ours(seen[0][0].reshape(1, 36, 32), positions=pos, causal=False),
                               seen[0][1].reshape(1, 36, 32), atol=ATOL, rtol=0)
    ours.scheme.position_scale = 1.0
    assert np.abs(ours(seen[0][0].reshape(1, 36, 32), positions=pos, causal=False)
                  - seen[0][1].reshape(1, 36, 32)).max() > 1e-3


def _memory_run(model_type):
    """The memory attention module of ``model_type``, tiny, on a 3 x 4 frame (SAM 3 tracker: 3 x 3, its grid is
    image_size // patch_size) and a memory of two frames and two object pointers; ``(cfg, module, seen, (h, w))``."""
    mod = {"sam2_video": ("sam2_video", "Sam2Video"), "sam3_tracker_video": ("sam3_tracker_video", "Sam3TrackerVideo"),
           "edgetam_video": ("edgetam_video", "EdgeTamVideo")}[model_type]
    hf = __import__(f"transformers.models.{mod[0]}.modeling_{mod[0]}", fromlist=["x"])
    conf = __import__(f"transformers.models.{mod[0]}.configuration_{mod[0]}", fromlist=["x"])
    kw = {"memory_attention_hidden_size": 32, "memory_attention_num_attention_heads": 2,
          "memory_attention_num_layers": 2, "memory_attention_rope_feat_sizes": [4, 3], "rope_parameters": ROPE}
    if model_type == "edgetam_video":
        kw.update(memory_attention_rope_k_sizes=[2, 2], memory_attention_mlp_hidden_size=16)
    else:
        kw.update(memory_attention_feed_forward_hidden_size=16)
    if model_type == "sam3_tracker_video":      # its image_size setter makes the grid image_size // patch_size (14)
        kw.update(image_size=42)
    cfg = _cfg(getattr(conf, f"{mod[1]}Config"), **kw)
    attn = getattr(hf, f"{mod[1]}MemoryAttention")(cfg).double().eval()
    seen, hooks = {}, []
    for i, layer in enumerate(attn.layers):
        _randomize(layer.self_attn, 10 + i)
        hooks.append(_hook(layer.self_attn, seen, i))
    rng = np.random.default_rng(2)
    w, h = cfg.memory_attention_rope_feat_sizes
    feats = torch.from_numpy(rng.standard_normal((h * w, 1, 32)))                # (T, B, C), seq-first
    # two past frames of h * w tokens each (EdgeTAM: 2 latents + the 2 x 2 resampled grid), then 2 object pointers
    memory = torch.from_numpy(rng.standard_normal((8 if model_type == "edgetam_video" else 2 * h * w + 2, 1, 64)))
    extra = {"num_spatial_memory_tokens": 1} if model_type == "edgetam_video" else {}
    with torch.no_grad():
        attn(feats, memory, current_vision_position_embeddings=feats, memory_posision_embeddings=memory,
             num_object_pointer_tokens=2, **extra)
    for hk in hooks:
        hk.remove()
    return cfg, attn, seen, (h, w)


@pytest.mark.parametrize("model_type", ["sam2_video", "sam3_tracker_video", "edgetam_video"])
def test_memory_self_attention(model_type):
    cfg, attn, seen, (h, w) = _memory_run(model_type)
    data = cfg.to_dict()
    if model_type == "sam3_tracker_video":      # its ViT's 24-wide windows would pad the 3 x 3 grid (refused)
        data["vision_config"]["backbone_config"]["window_size"] = 3
    model = mconfig.read(data)
    assert model.kind == "memory attention" and len(model.layers) == 2
    assert any("cross_attn_image is not read" in n for n in model.notes)
    assert f"axial_positions({h}, {w})" in model.specs[0].position
    pos, T = axial_positions(h, w), h * w                  # rows h (feat_sizes[1]), columns w (feat_sizes[0])
    for i, ref in enumerate(attn.layers):
        ours = model.layers[i]
        _copy(ref.self_attn, ours)
        x, out = seen[i]
        got = ours(x.reshape(1, T, 32), positions=pos, causal=False)
        np.testing.assert_allclose(got, out.reshape(1, T, 32), atol=ATOL, rtol=0)
    # rows and columns swapped do not match: the axes are seen
    swapped = np.stack([pos[1], pos[0]])
    assert np.abs(model.layers[0](seen[0][0].reshape(1, T, 32), positions=swapped, causal=False)
                  - seen[0][1].reshape(1, T, 32)).max() > 1e-3


def test_inkling2_vision_attention():
    from transformers.models.inkling2 import configuration_inkling2 as conf, modeling_inkling2 as hf
    from transformers.vision_utils import get_vision_position_ids
    cfg = _cfg(conf.Inkling2VisionConfig, hidden_size=32, num_attention_heads=2, num_hidden_layers=1,
               spatial_merge_size=2, rope_parameters=ROPE)
    model = mconfig.read(cfg.to_dict())
    assert model.kind == "vision encoder" and len(model.layers) == 1
    h, w, m = 4, 6, 2
    # Inkling2VisionModel.forward: get_vision_position_ids(patch_grid_thw, merge) + 1 placed after the class token
    ids = get_vision_position_ids(torch.tensor([[1, h, w]]), m)
    position_ids = torch.cat([torch.zeros(1, 2, dtype=ids.dtype), ids + 1])                     # (T, 2): (h, w)
    rotary = hf.Inkling2VisionRotaryEmbedding(cfg)
    attn = hf.Inkling2VisionAttention(cfg).double().eval()
    _randomize(attn, 3)
    x = torch.from_numpy(np.random.default_rng(4).standard_normal((h * w + 1, 32)))
    with torch.no_grad():
        want = attn(x, cu_seqlens=torch.tensor([0, h * w + 1]), position_embeddings=rotary(x, position_ids))[0]
    pos = np.concatenate([np.zeros((2, 1), np.int64), merge_positions(h, w, m) + 1], axis=1)
    np.testing.assert_array_equal(pos.T, position_ids.numpy())                # the reader's positions are HF's
    ours = model.layers[0]
    _copy(attn, ours, out="out_proj")
    got = ours(x.numpy()[None], positions=pos, causal=False)
    np.testing.assert_allclose(got[0], want.numpy(), atol=ATOL, rtol=0)
