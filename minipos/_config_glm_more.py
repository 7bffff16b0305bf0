"""The GLM multimodal families of ``minipos.config`` that transformers 5.24 adds beside GLM-4.xV, built from the
machinery of ``minipos._config_vision`` and ``minipos._config_rope``: GLM-OCR (its decoder and its vision tower),
GLM-Image (its decoder and its vision tower, whose attention has no position machinery at all) and GLM-5.3-Flash
(``glm5_next``: its vision tower, GLM-OCR's; its decoder is in ``minipos._config_mla``). Its towers are
registered in ``VISION`` and ``VISION_OF``, its decoders returned in ``FAMILIES`` and
``TEXT_OF`` for ``minipos.config`` to merge. ``minipos.config``'s module docstring states the contract."""

from __future__ import annotations

from dataclasses import replace

from ._checks import check_float
from ._config_rope import named_errors
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from ._config_vision import VISION, VISION_OF, glm4v, qwen_tower
from .layer import MultiHeadAttention
from .qk_norm import QKNormAttention
from .seams import NoPE


def _kv_heads_null(c: _Config) -> _Config:
    """``c`` with an explicit ``num_key_value_heads: null`` read as HF's ``__post_init__`` reads it (the query heads),
    not as the family's default (GLM-OCR's 8, GLM-Image's 2)."""
    if "num_key_value_heads" in c.data and c.data["num_key_value_heads"] is None:
        return _Config({**c.data, "num_key_value_heads": c.int("num_attention_heads", required=True)}, c.model_type,
                       c.defaults)
    return c


# --------------------------------------------------------------------------- GLM-OCR

def _glm_ocr(c):
    """GLM-OCR's text decoder (HF ``GlmOcrTextAttention``): GLM-4.1V's split M-RoPE (``glm4v``: default section
    [8, 12, 12], pairs (2i, 2i + 1) by ``rotate_half_llm`` and ``repeat_interleave(2)``) on the first
    ``int(head_dim * partial_rotary_factor)`` features (the factor from ``rope_parameters``, default 1), GQA, every
    layer full. Unlike ``Glm4vTextAttention`` (q, k, v with biases), no projection has a bias: the modular file builds
    all four with ``bias=False``, and ``GlmOcrTextConfig`` has no ``attention_bias`` key (one a config sets is not
    read: a note says so). Head dim: ``head_dim`` when the config gives it (``getattr(config, "head_dim", ...)``),
    else ``hidden_size // num_attention_heads``."""
    c = _kv_heads_null(c)
    notes = ("attention_bias is not read: GlmOcrTextAttention builds q, k, v and o without bias",) \
        if c.data.get("attention_bias") else ()
    return [replace(s, kwargs={**s.kwargs, "bias": False}, no_bias=(), notes=notes) for s in glm4v(c)]


def _glm_ocr_vision(c):
    """GLM-OCR's and GLM-5.3-Flash's vision encoders (HF ``GlmOcrVisionAttention``, ``Glm5NextVisionAttention``): the
    Qwen towers' 2-D RoPE (``qwen_tower``: the ``"qwen"`` layout, frequencies over head_dim / 2, positions
    ``merge_positions(h, w, spatial_merge_size)``), one ``qkv`` and one ``proj`` whose biases are both
    ``attention_bias`` (default True; GLM-4V's ``proj`` has none), a per-head RMSNorm of q and k (weight w, eps
    ``rms_norm_eps``) before RoPE, every layer full, bidirectional. No learned position table: ``GlmOcrVisionModel``
    deletes the ``embeddings`` it inherits from ``Glm4vVisionModel``."""
    bias = c.flag("attention_bias", True)
    eps = named_errors(c, lambda: check_float(c.get("rms_norm_eps"), "config['rms_norm_eps']", positive=True))
    specs = qwen_tower(c, "hidden_size")
    note = "q/k RMSNorm per head (q_norm, k_norm: weight w), before RoPE"
    first = ("no learned position table before this layer (GLM-4V's is deleted): image_size bounds no position",)
    return [replace(s, cls=QKNormAttention, kwargs={**s.kwargs, "bias": bias, "norm_eps": eps},
                    notes=(note,) + (() if bias else ("attention_bias false: no bias on qkv or proj",))
                    + (first if s.index == 0 else ())) for s in specs]


_GLM_OCR_TEXT = {"hidden_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 8,
                 "rope_theta": 10000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5}
"""``GlmOcrTextConfig``'s defaults (its ``rope_parameters``: default type, theta 10000)."""

_GLM_OCR_VISION = {"depth": 24, "hidden_size": 1024, "num_heads": 16, "image_size": 336, "patch_size": 14,
                   "spatial_merge_size": 2, "rope_theta": 10000.0, "rms_norm_eps": 1e-5, "attention_bias": True}
"""``GlmOcrVisionConfig``'s defaults; ``Glm5NextVisionConfig``'s are the same."""


# --------------------------------------------------------------------------- GLM-Image

def _glm_image(c):
    """GLM-Image's text decoder (HF ``GlmImageTextAttention``): split M-RoPE (default section [8, 12, 12]) in the half
    layout (``rotate_half``, ``torch.cat([freq, freq])``: pairs (i, i + R/2)) on the first ``int(head_dim *
    partial_rotary_factor)`` features, the factor from ``rope_parameters`` with default 1 (where
    ``Glm4vMoeTextConfig``'s is 0.5), GQA (default 2 key/value heads), ``attention_bias`` (default True) on q, k and v,
    never on o, every layer full. Head dim: ``head_dim`` when given, else ``hidden_size // num_attention_heads``."""
    c = _kv_heads_null(c)
    if not c.has("partial_rotary_factor"):                        # HF: rope_parameters.get("partial_rotary_factor", 1.0)
        c = _Config({**c.data, "partial_rotary_factor": 1.0}, c.model_type, c.defaults)
    return glm4v(c, moe=True)


def _alias(c: _Config, key: str, alias: str) -> int:
    """``config[key]``, or its transformers alias (``attribute_map``) when only that is given, else the default."""
    return c.int(alias) if c.has(alias) and not c.has(key) else c.int(key, required=True)


def _patch_nope() -> NoPE:
    """A ``NoPE`` that a tower's layer calls, as the 2-D RoPE towers' layers are called, with positions ``(2, T)``
    (rows, then columns): ``position_streams`` 2 (``minipos.seams.Scheme``'s hook) makes the layer take them, and NoPE
    reads none of them. The scheme of a vision tower whose attention has no position machinery (GLM-Image's)."""
    scheme = NoPE()
    scheme.position_streams = 2
    return scheme


def _glm_image_vision(c):
    """GLM-Image's vision encoder (HF ``GlmImageVisionAttention``): no rotary at all (its blocks get no
    ``position_embeddings``), one ``qkv`` and one ``proj`` whose biases are both ``attention_bias`` (default True),
    head dim ``hidden_size // num_heads``, scale ``head_dim ** -0.5``, every layer full, bidirectional within each
    image. Positions enter once, before layer 0: a learned table of ``(image_size // patch_size) ** 2`` entries,
    resampled to the image's grid by ``grid_sample`` (bilinear, ``align_corners=False``) at the patches' (row,
    column) of ``get_vision_position_ids(grid_thw, spatial_merge_size)`` and added to the patch embeddings; the
    tower's output goes to the VQ-VAE (``vq_config``), which turns it into image tokens without attention.
    ``(specs, notes)``."""
    d_model, heads = c.int("hidden_size", required=True), _alias(c, "num_heads", "num_attention_heads")
    if d_model % heads:
        raise c.error(f"hidden_size ({d_model}) is not a multiple of num_heads ({heads})")
    side = c.int("image_size", required=True) // c.int("patch_size", required=True)
    if side < 1:
        raise c.error(f"config['image_size'] ({c.get('image_size')}) is less than patch_size ({c.get('patch_size')}): "
                      "the learned position table would hold no position")
    kwargs = {"d_model": d_model, "num_heads": heads, "num_kv_heads": heads, "head_dim": d_model // heads,
              "bias": c.flag("attention_bias", True)}
    table = (f"before this layer a learned position table ({side} x {side}, image_size // patch_size a side, "
             "bilinearly resampled to the image's grid) is added to the patch embeddings: the input seam, not "
             "modelled here")
    specs = [LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, _patch_nope,
                       "NoPE (no rotation; positions (2, T) accepted and ignored)", (), (table,) if i == 0 else (),
                       causal=False) for i in range(_alias(c, "depth", "num_hidden_layers"))]
    notes = [("the tower's output is turned into image tokens by the VQ-VAE (vq_config), which has no attention: "
              "not read")]
    if c.data.get("rope_parameters") or c.data.get("rope_theta"):
        notes.append("rope_parameters / rope_theta is not read: GlmImageVisionAttention rotates nothing")
    return specs, notes


_GLM_IMAGE_TEXT = {"hidden_size": 4096, "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 2,
                   "rope_theta": 10000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5,
                   "attention_bias": True}
"""``GlmImageTextConfig``'s defaults."""


# --------------------------------------------------------------------------- GLM-5.3-Flash


VISION.update({"glm_ocr_vision": Family(_glm_ocr_vision, _GLM_OCR_VISION),
               "glm5_next_vision": Family(_glm_ocr_vision, _GLM_OCR_VISION),
               "glm_image_vision": Family(_glm_image_vision, {
                   "depth": 40, "hidden_size": 1536, "num_heads": 16, "image_size": 2048, "patch_size": 16,
                   "spatial_merge_size": 1, "attention_bias": True})})
VISION_OF.update({"glm_ocr": "glm_ocr_vision", "glm5_next": "glm5_next_vision", "glm_image": "glm_image_vision"})

FAMILIES = {"glm_ocr_text": Family(_glm_ocr, _GLM_OCR_TEXT),
            "glm_image_text": Family(_glm_image, _GLM_IMAGE_TEXT)}
"""``model_type`` -> ``Family``: the decoders of this module (``minipos.config`` merges them into its own)."""

TEXT_OF = {"glm_ocr": "glm_ocr_text", "glm_image": "glm_image_text", "glm5_next": "glm5_next_text"}
