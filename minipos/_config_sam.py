"""The SAM family's 2-D RoPE for ``minipos.config`` (transformers 5.24): SAM 3's ViT image encoder (``.vision``:
``Sam3ViTLayer``, window layers and global layers), the memory attention of the video trackers (SAM 2 video, EdgeTAM
video, SAM 3 tracker video: its self-attention over the current frame's feature grid) and Inkling 2's vision tower.
Every one is ``minipos.axial``'s ``"llama4"`` layout (``cat([freq_x, freq_y]).repeat_interleave(2)`` with
``rotate_pairwise``: pairs (2i, 2i + 1), the columns first, f_i = base^(-4i/D) for both axes).
``minipos.config``'s module docstring states the contract."""

from __future__ import annotations

from ._config_rope import NOT_YET, axial_theta
from ._config_types import Family, LayerSpec, Model
from ._config_types import FamilyConfig as _Config
from .axial import AxialRotary
from .layer import MultiHeadAttention

__all__ = ["SAM_VISION", "SAM_MODELS", "read_sam"]

def _heads(c: _Config, width_key: str, heads_key: str, divisor: int = 1) -> dict:
    """The attention layer's keywords: biases on q, k, v, o; head dim ``width // divisor // heads``."""
    d_model, heads = c.int(width_key, required=True), c.int(heads_key, required=True)
    inner = d_model // divisor
    if d_model % divisor or inner % heads:
        raise c.error(f"{width_key} ({d_model}) // {divisor} is not a multiple of {heads_key} ({heads})")
    head_dim = inner // heads
    if c.has("head_dim") and c.data["head_dim"] != head_dim:          # the rotary would read it, the attention not
        raise c.error(f"config['head_dim'] ({c.data['head_dim']!r}) differs from the attention's head dim "
                      f"({head_dim}): transformers' rotary would take head_dim and its attention the quotient")
    kwargs = {"d_model": d_model, "num_heads": heads, "num_kv_heads": heads, "head_dim": head_dim, "bias": True}
    try:
        MultiHeadAttention(scheme=AxialRotary(layout="llama4"), **{**kwargs, "d_model": 1, "num_heads": 1,
                                                                    "num_kv_heads": 1})
    except (ValueError, TypeError) as err:
        raise c.error(f"2-D RoPE of head dim {head_dim}: {err}") from None
    return kwargs


# --------------------------------------------------------------------------- SAM 3's ViT

def _sam3_vit(c: _Config):
    """``Sam3ViTModel``: every layer ``Sam3ViTRoPEAttention`` (biases on all four, scale head_dim ** -0.5). A window
    layer attends within ``window_size`` squares at each window's own coordinates (0 .. W - 1); a global layer
    (``global_attn_indexes``) over the image at the grid's coordinates times ``window_size / grid``."""
    kwargs, theta = _heads(c, "hidden_size", "num_attention_heads"), axial_theta(c)
    grid = c.int("image_size", required=True) // c.int("patch_size", required=True)
    W = c.int("window_size", required=True)
    if grid < 1:
        raise c.error("config['image_size'] is smaller than config['patch_size']: no patch")
    full = c.get("global_attn_indexes", required=True)
    if not isinstance(full, list) or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in full):
        raise c.error(f"config['global_attn_indexes'] must be a list of layer indices (integers >= 0), got {full!r}")
    n = c.int("num_hidden_layers", required=True)
    if grid % W and any(i not in full for i in range(n)):
        raise c.error(f"a {grid} x {grid} patch grid with window_size {W} needs {NOT_YET['sam3_window_padding']}, which minipos "
                      "does not support yet")
    scale = W / grid
    specs = []
    for i in range(n):
        if i in full:
            position = (f"2-D RoPE llama4, theta {theta:g}; positions (2, T): rows, then columns of the {grid} x "
                        f"{grid} grid (axial_positions({grid}, {grid})), scaled by window_size / grid = {W}/{grid} "
                        "(position_scale)")
            make = (lambda s: lambda: AxialRotary(base=theta, layout="llama4", position_scale=s))(scale)
            specs.append(LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, make, position, (), (),
                                   causal=False))
        else:
            position = (f"2-D RoPE llama4, theta {theta:g}; positions (2, T): rows, then columns (axial_positions("
                        f"{grid}, {grid}); HF rotates each window at its own 0 .. {W - 1}, the same offsets)")
            notes = (f"windows of {W} x {W} patches: pass mask=axial_window_mask(positions, {W}) repeated to "
                     "(B, T, T)",)
            specs.append(LayerSpec(i, "window_attention", MultiHeadAttention, kwargs,
                                   lambda: AxialRotary(base=theta, layout="llama4"), position, (), notes,
                                   causal=False, patch_window=W))
    pre = c.int("pretrain_image_size", required=True) // c.int("patch_size", required=True)
    return specs, [f"the patch embedder adds a learned position table ({pre} x {pre}, tiled to the grid) before "
                   "layer 0: an input seam minipos does not read"]


def _sam3_vision(c: _Config):
    """``Sam3VisionModel``: its backbone is ``backbone_config`` (a ``sam3_vit_model``)."""
    backbone = c.data.get("backbone_config") or {}
    if not isinstance(backbone, dict):
        raise TypeError(f"model_type {c.model_type!r}: config['backbone_config'] must be a dict")
    kind = backbone.get("model_type", "sam3_vit_model")
    if kind != "sam3_vit_model":
        raise c.error(f"config['backbone_config']['model_type'] = {kind!r}: minipos reads SAM 3's ViT backbone "
                      "(sam3_vit_model) only")
    inner = _Config(backbone, "sam3_vit_model", _SAM3_VIT)
    specs, notes = _sam3_vit(inner)
    return specs, notes + ["the FPN neck after the backbone has no attention"]


_SAM3_VIT = {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 32, "image_size": 1008,
             "patch_size": 14, "window_size": 24, "global_attn_indexes": [7, 15, 23, 31], "pretrain_image_size": 336,
             "rope_theta": 10000.0}


# --------------------------------------------------------------------------- Inkling 2's vision tower

def _inkling2_vision(c: _Config):
    """``Inkling2VisionAttention``: biases on all four, scale head_dim ** -0.5, each image alone (``cu_seqlens``);
    its class token first at (0, 0), the patches 1-indexed in merge blocks (``get_vision_position_ids`` + 1)."""
    kwargs, theta, m = _heads(c, "hidden_size", "num_attention_heads"), axial_theta(c), c.int("spatial_merge_size",
                                                                                               required=True)
    position = (f"2-D RoPE llama4, theta {theta:g}; positions (2, T): the class token first at (0, 0), then the "
                f"patches from 1 in merge blocks (1 + merge_positions(h, w, {m})); one image per call")
    make = lambda: AxialRotary(base=theta, layout="llama4")                   # noqa: E731
    specs = [LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, make, position, (), (), causal=False)
             for i in range(c.int("num_hidden_layers", required=True))]
    g = c.int("posemb_grid_size", required=True)
    return specs, [f"the embeddings add a learned position table ({g} x {g}, interpolated to the grid) and the class "
                   "token's own before layer 0: an input seam minipos does not read"]


SAM_VISION = {
    "sam3_vit_model": Family(_sam3_vit, _SAM3_VIT),
    "sam3_vision_model": Family(_sam3_vision, {}),
    "inkling2_vision": Family(_inkling2_vision, {"hidden_size": 1024, "num_attention_heads": 16,
                                                 "num_hidden_layers": 23, "spatial_merge_size": 2,
                                                 "posemb_grid_size": 32, "rope_theta": 10000.0}),
}
"""``model_type`` -> ``Family``: the SAM-family vision towers (``minipos.config``'s ``VISION`` holds them)."""


# --------------------------------------------------------------------------- whole SAM models

_MEMORY = {"memory_attention_hidden_size": 256, "memory_attention_num_attention_heads": 1,
           "memory_attention_downsample_rate": 1, "memory_attention_rope_feat_sizes": [64, 64],
           "rope_theta": 10000.0}
SAM_MODELS = {"sam3": {}, "sam3_tracker": {}, "sam2_video": {**_MEMORY, "memory_attention_num_layers": 4},
              "edgetam_video": {**_MEMORY, "memory_attention_num_layers": 2},
              "sam3_tracker_video": {**_MEMORY, "memory_attention_num_layers": 4,
                                     "memory_attention_rope_feat_sizes": [72, 72]}}
"""The SAM models ``read`` takes whole, with their config classes' defaults for the memory attention."""


def _memory_attention(c: _Config) -> tuple:
    """The memory attention's self-attention layers (``Sam2VideoRoPEAttention``, ``EdgeTamVideoRoPESelfAttention``):
    the current frame's features over the grid ``memory_attention_rope_feat_sizes`` ([width, height])."""
    kwargs = _heads(c, "memory_attention_hidden_size", "memory_attention_num_attention_heads",
                    c.int("memory_attention_downsample_rate", required=True))
    theta, sizes = axial_theta(c), c.get("memory_attention_rope_feat_sizes", required=True)
    if c.model_type == "sam3_tracker_video":     # HF's image_size setter overwrites the stored sizes on loading
        backbone = ((c.data.get("vision_config") or {}).get("backbone_config") or {})
        side = c.int("image_size", default=1008) // (backbone.get("patch_size") or 14)
        sizes = [side, side]
    if not (isinstance(sizes, list) and len(sizes) == 2 and all(isinstance(s, int) and not isinstance(s, bool)
                                                                and s >= 1 for s in sizes)):
        raise c.error(f"config['memory_attention_rope_feat_sizes'] must be [width, height], integers >= 1, got "
                      f"{sizes!r}")
    w, h = sizes
    position = (f"2-D RoPE llama4, theta {theta:g}; positions (2, T): rows, then columns of the {h} x {w} feature grid "
                f"(axial_positions({h}, {w}))")
    notes = ("self-attention of the memory attention layer; its cross-attention to the memory of past frames "
             "(cross_attn_image) is not modelled: see the model's notes",)
    make = lambda: AxialRotary(base=theta, layout="llama4")                   # noqa: E731
    specs = [LayerSpec(i, "memory_self_attention", MultiHeadAttention, kwargs, make, position, (), notes,
                       causal=False) for i in range(c.int("memory_attention_num_layers", required=True))]
    cross = ("each memory attention layer's cross_attn_image is not read: a cross-attention (keys and values from "
             "the 64-wide memory features, minipos' layers attend to themselves) whose keys are rotated at the grid "
             "positions repeated per past frame" + (" (EdgeTAM: the resampled memory_attention_rope_k_sizes grid, "
                                                    "its 1-D latents unrotated)" if c.model_type == "edgetam_video"
                                                    else "") + ", the object pointer tokens unrotated")
    return specs, [cross, "0.1 x the sine position embedding is added to the current frame's features before the "
                          "first layer: an input seam minipos does not read"]


def read_sam(data: dict, read_tower) -> Model:
    """A whole SAM model (``SAM_MODELS``): its memory attention's self-attention layers (SAM 2, EdgeTAM, SAM 3
    tracker video; none for SAM 3 and SAM 3 tracker) and ``.vision``, SAM 3's ViT (``read_tower``, the reader's
    vision reader), or ``None`` with a note for SAM 2's Hiera, which has no RoPE."""
    model_type = data["model_type"]
    c = _Config(data, model_type, SAM_MODELS[model_type])
    specs, notes = _memory_attention(c) if c.defaults else ([], [])
    vision = data.get("vision_config")
    tower = None
    if model_type.startswith("sam3"):
        vision = {**(vision if isinstance(vision, dict) else {}), "model_type": "sam3_vision_model"}
        tower = read_tower(vision)
    else:
        notes = notes + [f"the image encoder ({(vision or {}).get('model_type', 'sam2_vision_model')}: Hiera, "
                         "absolute position embeddings and windows, no RoPE) is not read; .vision is None"]
    if model_type in ("sam3", "sam3_tracker"):
        notes = notes + ["no decoder layer with RoPE: the layers are the image encoder's (.vision); the text "
                         "encoder, the DETR encoder and decoder and the mask decoder are not read"]
    return Model(model_type, data, specs, notes, tower, kind="memory attention")
