"""More multimodal families of ``minipos.config`` built from the machinery of ``minipos._config_vision`` and
``minipos._config_rope``: PaddleOCR-VL (its decoder and its vision tower), DeepSeek-OCR-2's decoder, Kimi K2.5's
(DeepSeek-V3's) and its vision tower, VideoLLaMA 3 (its text_config's decoder, its vision tower), ERNIE-4.5-VL (its
decoder and its vision tower), EXAONE 4.5's vision tower. Its towers are registered in ``VISION`` and
``VISION_OF``, its decoders returned in ``FAMILIES`` and ``TEXT_OF`` for ``minipos.config`` to merge.
``minipos.config``'s module docstring states the contract."""

from __future__ import annotations

from dataclasses import replace

from ._config_rope import axial_theta, dense_layers, layer_sizes, layer_types_of, rope_parameters
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from ._config_vision import VISION, VISION_OF, qwen_tower, tower_kwargs
from .axial import AxialRotary
from .decomposed import DecomposedRelPos
from .layer import MultiHeadAttention
from .mrope import MRotary
from .seams import NoPE

# --------------------------------------------------------------------------- PaddleOCR-VL

def _paddleocr_vl(c):
    """PaddleOCR-VL's text decoder (HF ``PaddleOCRAttention``): Qwen2-VL's split M-RoPE (half layout, default
    section [16, 24, 24]), GQA, ``head_dim`` from the config (default 128), ``use_bias`` on q, k, v and o alike,
    every layer full (the config class has no ``layer_types``)."""
    layer_types_of(c, lambda i: "full_attention", allowed=("full_attention",))
    bias = c.flag("use_bias", False)
    specs = dense_layers(c, bias="none", window="none", mrope=True)
    return [replace(s, kwargs={**s.kwargs, "bias": bias}, notes=s.notes + (("use_bias: biases on q, k, v, o",)
                                                                           if bias else ())) for s in specs]


def _paddleocr_vl_vision(c):
    """PaddleOCR-VL's vision encoder (HF ``PaddleOCRVisionAttention``): the Qwen towers' 2-D RoPE (``"qwen"``
    layout, frequencies over head_dim / 2), q, k, v and ``out_proj`` with biases, every layer full, bidirectional;
    positions plain row-major: HF calls ``get_vision_position_ids(grid_thw, 1)`` (the patches are merged after the
    encoder, in the projector), whatever ``spatial_merge_size`` says. A learned table of ``(image_size //
    patch_size) ** 2`` positions, bilinearly resampled, is added before layer 0."""
    side = c.int("image_size", required=True) // c.int("patch_size", required=True)
    if side < 1:
        raise c.error(f"config['image_size'] ({c.get('image_size')}) is less than patch_size ({c.get('patch_size')}): "
                      "the learned position table would hold no position")
    data = {**c.data, "spatial_merge_size": 1, "num_heads": c.int("num_attention_heads", required=True),
            "depth": c.int("num_hidden_layers", required=True)}         # qwen_tower's names for HF's keys here
    specs = qwen_tower(_Config(data, c.model_type, c.defaults), "hidden_size")
    note = (f"before this layer a learned position table ({side} x {side}, image_size // patch_size a side, "
            "bilinearly resampled to the image's grid) is added to the patch embeddings: the input seam, not RoPE, "
            "and not modelled here")
    position = specs[0].position.replace("merge_positions(h, w, 1)", "row-major: merge_positions(h, w, 1); the "
                                         "projector merges spatial_merge_size after the encoder")
    return [replace(s, position=position, notes=(note,) if s.index == 0 else ()) for s in specs]


_PADDLEOCR_TEXT = {"hidden_size": 1024, "num_hidden_layers": 18, "num_attention_heads": 16, "num_key_value_heads": 2,
                   "head_dim": 128, "rope_theta": 500000.0, "max_position_embeddings": 131072, "rms_norm_eps": 1e-5}
"""``PaddleOCRTextConfig``'s defaults."""

VISION.update({"paddleocr_vl_vision": Family(_paddleocr_vl_vision, {
    "hidden_size": 1152, "num_hidden_layers": 27, "num_attention_heads": 16, "image_size": 384, "patch_size": 14,
    "rope_theta": 10000.0})})
VISION_OF.update({"paddleocr_vl": "paddleocr_vl_vision"})


# --------------------------------------------------------------------------- DeepSeek-OCR-2

def _deepseek_ocr2(c):
    """DeepSeek-OCR-2's text decoder (HF ``DeepseekOcr2TextAttention``): Llama's layer, not DeepSeek-V2's latent
    attention: RoPE half layout (any ``rope_type``), GQA, ``attention_bias`` on q, k, v and o, every layer full. HF's
    config sets ``head_dim = hidden_size // num_attention_heads`` whatever it is given; a config whose ``head_dim``
    differs (a narrowed copy) is read with its ``head_dim``, and a note says so."""
    d_model, heads = c.int("hidden_size", required=True), c.int("num_attention_heads", required=True)
    if d_model % heads:
        raise c.error(f"hidden_size ({d_model}) is not a multiple of num_attention_heads ({heads})")
    notes = ()
    if c.int("head_dim") is None:
        c = _Config({**c.data, "head_dim": d_model // heads}, c.model_type, c.defaults)
    elif c.int("head_dim") != d_model // heads:
        notes = (f"head_dim {c.int('head_dim')} as the config says; HF's DeepseekOcr2TextConfig would set "
                 f"hidden_size // num_attention_heads = {d_model // heads}",)
    specs = dense_layers(c, bias="attention_bias", window="none")
    return [replace(s, notes=s.notes + notes) for s in specs]


# --------------------------------------------------------------------------- Kimi K2.5's tower

def _kimi_k25_vision(c):
    """Kimi K2.5's vision encoder (HF ``Kimi_K25VisionAttention`` with ``Kimi_K25VisionRotaryEmbedding``): 2-D RoPE in
    the ``"kimi"`` layout of ``minipos.axial`` (pairs (i, i + D/2); pair 2j by the column, 2j + 1 by the row, both at
    f_j = base^(-4j/D)), ``rope_type`` "axial" (or "default", which ``Kimi_K25VisionConfig`` rewrites to "axial"; HF
    raises for any other); q, k, v and ``proj`` with biases; head
    dim ``hidden_size // num_attention_heads``; every layer full and bidirectional over one clip (HF
    ``get_vision_attention_seqlens(..., merge_temporal=True)``: a video's frames attend each other). Positions
    row-major (``get_vision_position_ids(grid_thw, 1)``), each frame of a video the same grid again. Before layer 0 a
    learned ``pos_emb_height`` x ``pos_emb_width`` table, bicubically resampled to the grid, and for a video a
    sinusoidal table by frame are added to the patch embeddings: the input seam, named in a note."""
    theta = axial_theta(c)                          # "default" is "axial" here: the config class rewrites it
    kwargs = tower_kwargs(c, "hidden_size", c.int("num_attention_heads", required=True), theta, "kimi")
    position = (f"2-D RoPE kimi, theta {theta:g}; positions (2, T): rows, then columns, row-major "
                "(axial_positions(h, w)), each frame of a clip the same grid")
    note = (f"before this layer a learned position table ({c.int('pos_emb_height', required=True)} x "
            f"{c.int('pos_emb_width', required=True)}, bicubically resampled to the image's grid) and, for a video, a "
            "sinusoidal table by frame are added to the patch embeddings: the input seam, not RoPE, and not modelled "
            "here")
    make = lambda: AxialRotary(base=theta, layout="kimi")                     # noqa: E731
    return [LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, make, position, (), (note,) if i == 0 else (),
                      causal=False) for i in range(c.int("num_hidden_layers", required=True))]


VISION.update({"kimi_k25_vision": Family(_kimi_k25_vision, {
    "hidden_size": 1152, "num_hidden_layers": 27, "num_attention_heads": 16, "pos_emb_height": 64,
    "pos_emb_width": 64, "rope_theta": 10000.0})})
VISION_OF.update({"kimi_k25": "kimi_k25_vision"})


# --------------------------------------------------------------------------- VideoLLaMA 3

def _video_llama_3_vision(c):
    """VideoLLaMA 3's vision encoder (HF ``VideoLlama3VisionAttention``): the Qwen towers' 2-D RoPE (``"qwen"``
    layout), q, k, v and ``out_proj`` with biases, every layer full, bidirectional, no learned position table. Its
    patches come in merge blocks of a size given with each image at call time (``merge_sizes``: the image
    processor's ``merge_size`` 1, the video processor's 2), not by the config."""
    data = {**c.data, "spatial_merge_size": 1, "num_heads": c.int("num_attention_heads", required=True),
            "depth": c.int("num_hidden_layers", required=True)}         # qwen_tower's names for HF's keys here
    specs = qwen_tower(_Config(data, c.model_type, c.defaults), "hidden_size")
    position = specs[0].position.replace("merge_positions(h, w, 1)", "merge_positions(h, w, m), m the image's "
                                         "merge_sizes entry: 1 for images, 2 for video frames by the processors")
    return [replace(s, position=position) for s in specs]


VISION.update({"video_llama_3_vision": Family(_video_llama_3_vision, {
    "hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "patch_size": 16, "rope_theta": 10000.0})})
VISION_OF.update({"video_llama_3": "video_llama_3_vision"})

# --------------------------------------------------------------------------- EXAONE 4.5's tower

def _exaone4_5_vision(c):
    """EXAONE 4.5's vision encoder (HF ``Exaone4_5_VisionAttention`` in ``Exaone4_5_VisionModel``): Qwen2.5-VL's
    tower (2-D RoPE in the ``"qwen"`` layout, the patches permuted into window order, window layers and the full
    ones of ``fullatt_block_indexes``, biases on all four) with grouped keys and values: one ``qkv`` Linear of
    ``num_heads`` query heads and ``num_key_value_heads`` key and value heads."""
    specs = qwen_tower(c, "hidden_size", windows=True)
    heads, kv = specs[0].kwargs["num_heads"], c.int("num_key_value_heads", required=True)
    if kv < 1 or heads % kv:
        raise c.error(f"num_key_value_heads ({kv}) must divide num_heads ({heads})")
    return [replace(s, kwargs={**s.kwargs, "num_kv_heads": kv}) for s in specs]


VISION.update({"exaone4_5_vision": Family(_exaone4_5_vision, {
    "hidden_size": 3584, "depth": 32, "num_heads": 16, "num_key_value_heads": 8, "patch_size": 14,
    "spatial_merge_size": 2, "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31], "rope_theta": 10000.0})})
VISION_OF.update({"exaone4_5": "exaone4_5_vision"})


# --------------------------------------------------------------------------- ERNIE-4.5-VL

def _ernie4_5_vl(c):
    """ERNIE-4.5-VL's text decoder (HF ``Ernie4_5_VLMoeTextAttention`` with ``Ernie4_5_VLMoeTextRotaryEmbedding``):
    M-RoPE whose first ``2 n_h`` frequencies alternate height and width and whose last ``n_t`` are temporal
    (``MRotary(interleaved="hw")``), each frequency at its own θ_i = base^(-2i/D), in pairs (2i, 2i + 1)
    (``rotate_half_text``: ``layout="interleaved"``); ``rope_parameters['mrope_section']`` is ``[n_h, n_w, n_t]``
    (height first; default [22, 22, 20]) where minipos writes ``[n_t, n_h, n_w]``; ``rope_type`` "default" only
    (HF raises for any other). GQA, ``head_dim`` (default ``hidden_size // num_attention_heads``), ``use_bias`` on
    q, k, v and o alike, every layer full and causal. Positions ``(3, T)`` (temporal, height, width) as its
    ``get_rope_index`` builds them."""
    layer_types_of(c, lambda i: "full_attention", allowed=("full_attention",))
    sizes, params = layer_sizes(c), rope_parameters(c)
    extra = sorted(set(params) - {"rope_type", "rope_theta", "mrope_section"})
    if params["rope_type"] != "default" or extra:
        raise c.error(f"rope_type {params['rope_type']!r} with rope_parameters {extra}: ERNIE-4.5-VL's M-RoPE takes "
                      "rope_type 'default', rope_theta and mrope_section only (HF raises for any other rope_type)")
    hwt = params.get("mrope_section", [22, 22, 20])                          # HF's default, (h, w, t)
    if isinstance(hwt, (str, bytes)) or not isinstance(hwt, (list, tuple)) or len(hwt) != 3:
        raise c.error(f"rope_parameters['mrope_section'] must hold three counts [height, width, temporal], got {hwt!r}")
    section, theta = [hwt[2], hwt[0], hwt[1]], params["rope_theta"]         # minipos: (t, h, w)
    kw = {"mrope_section": section, "base": theta, "interleaved": "hw", "layout": "interleaved"}
    try:
        MultiHeadAttention(scheme=MRotary(**kw), **{**sizes, "d_model": 1, "num_heads": 1, "num_kv_heads": 1})
    except (ValueError, TypeError) as err:
        raise c.error(f"rope_parameters['mrope_section'] {list(hwt)} (height, width, temporal): {err}") from None
    bias = c.flag("use_bias", False)
    position = (f"M-RoPE interleaved pairs (2i, 2i+1), H W H W ... T, theta {theta:g}, sections {section} (t, h, w; "
                f"the config's {list(hwt)} is h, w, t); positions (3, T)")
    specs = dense_layers(c, bias="none", window="none")
    return [replace(s, kwargs={**s.kwargs, "bias": bias}, scheme=lambda: MRotary(**kw), position=position,
                    notes=s.notes + (("use_bias: biases on q, k, v, o",) if bias else ())) for s in specs]


def _ernie4_5_vl_vision(c):
    """ERNIE-4.5-VL's vision encoder (HF ``Ernie4_5_VLMoeVisionAttention``): the Qwen towers' layer (one ``qkv``, a
    ``proj``, biases on all four, 2-D RoPE in the ``"qwen"`` layout, bidirectional), positions in
    ``spatial_merge_size`` blocks (``get_vision_position_ids(grid_thw, spatial_merge_size)``), no learned table."""
    return qwen_tower(c, "hidden_size")


VISION.update({"ernie4_5_vl_moe_vision": Family(_ernie4_5_vl_vision, {
    "hidden_size": 1280, "depth": 32, "num_heads": 16, "spatial_merge_size": 2,
    "rope_parameters": {"rope_theta": 10000.0, "rope_type": "axial"}})})
VISION_OF.update({"ernie4_5_vl_moe": "ernie4_5_vl_moe_vision"})

_ERNIE_TEXT = {"hidden_size": 2560, "num_hidden_layers": 28, "num_attention_heads": 20, "num_key_value_heads": 4,
               "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "use_bias": False,
               "max_position_embeddings": 131072, "rms_norm_eps": 1e-5}
"""``Ernie4_5_VLMoeTextConfig``'s defaults."""


# --------------------------------------------------------------------------- DeepSeek-OCR-2's SAM ViT-B

def _deepseek_ocr2_vision(c):
    """DeepSeek-OCR-2's tower (HF ``DeepseekOcr2VisionModel``): its ``sam_config``, a SAM ViT-B
    (``DeepseekOcr2SamVisionEncoder``), is read; its ``encoder_config``, a Qwen2 encoder over the SAM features and
    learned queries, is named in a note. Each SAM layer is ``DeepseekOcr2SamVisionAttention``: one ``qkv`` (biases with
    ``qkv_bias``) and ``proj`` (bias), scale ``head_dim ** -0.5``, and with ``use_rel_pos`` the decomposed relative
    position bias (``minipos.decomposed``) over a ``window_size`` square (a window layer) or the whole
    ``image_size // patch_size`` grid (``global_attn_indexes``), bidirectional, positions row-major."""
    sam = c.data.get("sam_config") or {}
    if not isinstance(sam, dict):
        raise TypeError(f"model_type {c.model_type!r}: config['sam_config'] must be a dict")
    s = _Config(sam, "deepseek_ocr2_sam_vision_model", _OCR2_SAM)
    d_model, heads = s.int("hidden_size", required=True), s.int("num_attention_heads", required=True)
    if heads < 1 or d_model % heads:
        raise s.error(f"hidden_size ({d_model}) is not a multiple of num_attention_heads ({heads})")
    grid = s.int("image_size", required=True) // s.int("patch_size", required=True)
    if grid < 1:
        raise s.error("config['image_size'] is smaller than config['patch_size']: no patch")
    W, n = s.int("window_size", required=True), s.int("num_hidden_layers", required=True)
    full = s.get("global_attn_indexes", required=True)
    if not isinstance(full, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in full):
        raise s.error(f"config['global_attn_indexes'] must be a list of layer indices, got {full!r}")
    rel = s.flag("use_rel_pos", True)
    kwargs = {"d_model": d_model, "num_heads": heads, "num_kv_heads": heads, "head_dim": d_model // heads,
              "bias": True}
    no_bias = () if s.flag("qkv_bias", True) else ("bq", "bk", "bv")
    specs = []
    for i in range(n):
        window = W if (W > 0 and i not in full) else 0                  # HF: window_size if i not in ... else 0
        side = window or grid
        what = (f"each {W} x {W} window of the grid alone" if window else f"the whole {grid} x {grid} grid")
        if rel:
            make = (lambda m: lambda: DecomposedRelPos(m, m))(side)
            position = (f"decomposed relative position bias over {what}: DecomposedRelPos({side}, {side}), positions "
                        f"arange({side * side}) (row-major; rel_pos_h, rel_pos_w (2 x {side} - 1, head_dim))")
        else:
            make, position = NoPE, f"no position in the attention (use_rel_pos false), over {what}"
        notes = ((f"HF zero-pads the grid to a multiple of {W} and attends within each {W} x {W} window, the padded "
                  "patches included as keys (not masked): call the layer on each padded window",) if window else ())
        specs.append(LayerSpec(i, "window_attention" if window else "full_attention", MultiHeadAttention, kwargs, make,
                               position, no_bias, notes, causal=False))
    notes = ["the patch embedder adds a learned position table (image_size // patch_size a side) before layer 0: an "
             "input seam minipos does not read" if s.flag("use_abs_pos", True) else "no absolute position table",
             "the Qwen2 encoder after the SAM ViT-B and its neck (encoder_config: Qwen2 layers with 1-D RoPE, "
             "bidirectional over the image tokens and causal over its learned queries) is not read"]
    return specs, notes


_OCR2_SAM = {"hidden_size": 768, "num_hidden_layers": 12, "num_attention_heads": 12, "image_size": 1024,
             "patch_size": 16, "window_size": 14, "global_attn_indexes": [2, 5, 8, 11], "qkv_bias": True,
             "use_rel_pos": True, "use_abs_pos": True}
"""``DeepseekOcr2SamVisionConfig``'s defaults."""

VISION.update({"deepseek_ocr2_vision": Family(_deepseek_ocr2_vision, {})})
VISION_OF.update({"deepseek_ocr2": "deepseek_ocr2_vision"})


FAMILIES = {"paddleocr_vl_text": Family(_paddleocr_vl, _PADDLEOCR_TEXT),
            "ernie4_5_vl_moe_text": Family(_ernie4_5_vl, _ERNIE_TEXT),
            "deepseek_ocr2_text": Family(_deepseek_ocr2, {"hidden_size": 4096, "num_hidden_layers": 32,
                                                          "num_attention_heads": 32, "rope_theta": 10000.0,
                                                          "max_position_embeddings": 2048, "rms_norm_eps": 1e-6})}
"""``model_type`` -> ``Family``: the decoders of this module (``minipos.config`` merges them into its own)."""

TEXT_OF = {"paddleocr_vl": "paddleocr_vl_text", "deepseek_ocr2": "deepseek_ocr2_text",
           "kimi_k25": "deepseek_v3",         # Kimi_K25Config's text_config: a DeepseekV3Config by default
           "video_llama_3": "qwen2",          # VideoLlama3Config's text_config: a Qwen2Config by default
           "ernie4_5_vl_moe": "ernie4_5_vl_moe_text",
           "exaone4_5": "exaone4"}

TEXT_RENAMED = {("kimi_k25", "kimi_k2"): "deepseek_v3",
                ("exaone4_5", "exaone4_5_text"): "exaone4"}   # Exaone4_5_Config.__post_init__: the first release's name
"""``(outer model_type, its text_config's model_type)`` -> the family read: a text ``model_type`` the outer config
class renames (``Kimi_K25Config.__post_init__``: the hub's ``kimi_k2`` is built as ``deepseek_v3``)."""
