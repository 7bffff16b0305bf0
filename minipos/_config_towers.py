"""More multimodal families of ``minipos.config``, whose towers or decoders reuse the machinery of
``minipos._config_vision``: Qwen3.5 (its decoder's attention layers, with their gated output, and its vision
tower), the thinkers of Qwen2.5-Omni and Qwen3-Omni (``THINKER_OF``: a whole Omni config is read through its
``thinker_config``) and GLM-4V's towers, registered in ``VISION`` and ``VISION_OF``. ``minipos.config``'s module
docstring states the contract."""

from __future__ import annotations

from dataclasses import replace

from ._config_rope import layer_sizes, layer_types_of, rope_parameters
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from ._config_vision import (VISION, VISION_OF, hf_interleaved_section, interleaved_section_note, qwen2_vl,
                             qwen3_vl, qwen_tower)
from .layer import MultiHeadAttention
from .mrope import MRotary
from .qk_norm import QKNormAttention

# --------------------------------------------------------------------------- Qwen3.5

def _qwen3_5_rope(c: _Config) -> tuple:
    """What Qwen3.5's attention does with positions, read and checked (HF ``Qwen3_5TextRotaryEmbedding``):
    interleaved M-RoPE (section default [11, 11, 10], whatever ``mrope_interleaved`` says) on the first
    ``int(head_dim * partial_rotary_factor)`` features, half layout; the rest pass through; a section HF reads as
    another (``hf_interleaved_section``) is read as HF reads it. ``(MRotary's keyword arguments, the description,
    notes)``."""
    data = dict(c.data)
    given = [d for d in (data.get("rope_parameters"), data.get("rope_scaling")) if isinstance(d, dict)]
    if not any("partial_rotary_factor" in d for d in given) and data.get("partial_rotary_factor") is None:
        data["partial_rotary_factor"] = 0.25                  # Qwen3_5TextConfig.__post_init__'s default
    for key in ("rope_parameters", "rope_scaling"):           # HF never reads mrope_interleaved: always interleaved
        if isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in data[key].items() if k != "mrope_interleaved"}
    c = _Config(data, c.model_type, c.defaults)
    params = rope_parameters(c)
    extra = set(params) - {"rope_type", "rope_theta", "mrope_section", "partial_rotary_factor"}
    if params["rope_type"] != "default" or extra:
        raise c.error(f"Qwen3.5's M-RoPE with rope_type {params['rope_type']!r} and rope_parameters {sorted(extra)}: "
                      "minipos' MRotary takes mrope_section, partial_rotary_factor and rope_theta only")
    sizes = layer_sizes(c)
    given, theta = list(params.get("mrope_section") or [11, 11, 10]), params["rope_theta"]   # HF's default
    R = int(sizes["head_dim"] * params.get("partial_rotary_factor", 1.0))                   # HF: int(head_dim * p)
    try:
        section = hf_interleaved_section(given, R // 2)                   # as HF assigns it (a note if not given)
        kw = {"mrope_section": section, "base": theta, "interleaved": True, "rotary_dim": R}
        MultiHeadAttention(scheme=MRotary(**kw), **{**sizes, "d_model": 1, "num_heads": 1, "num_kv_heads": 1})
    except (ValueError, TypeError) as err:
        raise c.error(f"rope_parameters (mrope_section, partial_rotary_factor): {err}") from None
    return kw, (f"M-RoPE half, interleaved (T H W T H W ...), theta {theta:g}, sections {section} (t, h, w), on the "
                f"first {R} of {sizes['head_dim']} features; positions (3, T)"), \
        interleaved_section_note(given, section, R // 2)


def qwen3_5(c):
    """Qwen3.5's text decoder (dense and MoE, HF ``Qwen3_5Attention``, ``Qwen3_5MoeAttention``): its attention
    layers (``spec.index`` their place among all the layers), the gated delta nets named in a note. ``(specs,
    notes)``.

    Each attention layer is a ``QKNormAttention``: interleaved M-RoPE on the first ``int(head_dim *
    partial_rotary_factor)`` features (``_qwen3_5_rope``), per-head q/k RMSNorm with weight ``1 + w``
    (``Qwen3_5RMSNorm``: ``norm_offset=1``), ``attention_bias`` on q, k, v and o, and the output gate per feature
    (``gate="feature"``): ``q_proj`` is ``2 * num_attention_heads * head_dim`` wide, each head's ``head_dim`` query
    features followed by ``head_dim`` gate features g, and the heads' output o becomes ``o * sigmoid(g)`` before
    ``o_proj``. ``minipos.qk_norm`` says how to split ``q_proj`` into ``wq`` and ``wg``."""
    interval = c.get("full_attention_interval", 4)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise c.error(f"config['full_attention_interval'] must be an integer >= 1, got {interval!r}")
    types = layer_types_of(c, lambda i: "linear_attention" if (i + 1) % interval else "full_attention",
                           allowed=("full_attention", "linear_attention"))
    rope, position, section_notes = _qwen3_5_rope(c)
    kwargs = {**layer_sizes(c), "bias": c.flag("attention_bias", False), "norm_eps": c.float("rms_norm_eps", positive=True),
              "norm_offset": 1.0, "gate": "feature"}
    notes = ("q/k RMSNorm per head, weight 1 + w (norm_offset=1)",
             "output gate per feature: o * sigmoid(g), g from q_proj's second half of each head (wg)", *section_notes)
    specs = [LayerSpec(i, kind, QKNormAttention, kwargs, lambda: MRotary(**rope), position, (), notes)
             for i, kind in enumerate(types) if kind == "full_attention"]
    deltas = [str(i) for i, kind in enumerate(types) if kind == "linear_attention"]
    note = (f"layers {', '.join(deltas)} are gated delta nets, not softmax attention (Qwen3_5GatedDeltaNet: a causal "
            f"depthwise conv1d of linear_conv_kernel_dim = {c.int('linear_conv_kernel_dim')} taps, then a "
            "linear-attention recurrence with a decaying state): they see order by their recurrence, not by positions, "
            "which minipos does not model; .layers holds the attention layers only, spec.index their place")
    return specs, [note] if deltas else []


_QWEN3_5_TEXT = {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
                 "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 32768,
                 "linear_conv_kernel_dim": 4}
"""``Qwen3_5TextConfig``'s defaults (``partial_rotary_factor``, 0.25 by its ``__post_init__``, is set where read)."""

FAMILIES = {
    "qwen3_5_text": Family(qwen3_5, _QWEN3_5_TEXT),
    "qwen3_5_moe_text": Family(qwen3_5, {**_QWEN3_5_TEXT, "hidden_size": 2048, "num_hidden_layers": 40,
                                          "num_key_value_heads": 2}),
    # Qwen2_5OmniAttention is Qwen2-VL's (split M-RoPE, default [16, 24, 24], biases on q, k, v; sliding layers
    # from layer_types / max_window_layers); Qwen3OmniMoeThinkerTextAttention is Qwen3-VL's (interleaved M-RoPE,
    # default [24, 20, 20], q/k RMSNorm with weight w, attention_bias on all four, no window). Neither config class
    # has a head_dim: the attention takes hidden_size // num_attention_heads unless a config gives one.
    "qwen2_5_omni_text": Family(qwen2_vl, {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
                                           "max_window_layers": 28, "hidden_size": 3584, "num_attention_heads": 28,
                                           "num_key_value_heads": 4, "num_hidden_layers": 28}),
    "qwen3_omni_moe_text": Family(qwen3_vl, {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
                                             "hidden_size": 2048, "num_attention_heads": 28, "num_key_value_heads": 4,
                                             "num_hidden_layers": 28, "rms_norm_eps": 1e-6}),
}
"""``model_type`` -> ``Family``: the decoders of this module (``minipos.config`` merges them into its own)."""

TEXT_OF = {"qwen3_5": "qwen3_5_text", "qwen3_5_moe": "qwen3_5_moe_text",
           "qwen2_5_omni_thinker": "qwen2_5_omni_text", "qwen3_omni_moe_thinker": "qwen3_omni_moe_text"}

THINKER_OF = {"qwen2_5_omni": "qwen2_5_omni_thinker", "qwen3_omni_moe": "qwen3_omni_moe_thinker"}
"""An Omni ``model_type`` -> its thinker's: ``read`` reads the thinker (``thinker_config``: the text decoder and the
vision tower); the audio encoder and the talker (the speech decoder and its code predictor) are named in a note."""


def _qwen3_5_vision(c):
    # Qwen3_5VisionModel (and the MoE's): Qwen3-VL's tower without its deepstack mergers, the same attention
    # (Qwen3_5VisionAttention: qkv, proj, biases), the same 2-D RoPE and the learned table added before layer 0.
    return qwen_tower(c, "hidden_size", learned=True)


_QWEN3_5_VISION = {"depth": 27, "hidden_size": 1152, "num_heads": 16, "patch_size": 16, "spatial_merge_size": 2,
                   "rope_theta": 10000.0, "num_position_embeddings": 2304}
VISION.update({
    "qwen3_5_vision": Family(_qwen3_5_vision, _QWEN3_5_VISION),
    "qwen3_5_moe_vision": Family(_qwen3_5_vision, _QWEN3_5_VISION),
})
VISION_OF.update({"qwen3_5": "qwen3_5_vision", "qwen3_5_moe": "qwen3_5_moe_vision"})


def _qwen2_5_omni_vision(c):
    # Qwen2_5OmniVisionEncoder: Qwen2.5-VL's tower (window order, window layers but fullatt_block_indexes), its
    # attention with three Linears q, k, v (Qwen2_5OmniVisionAttention) where Qwen2.5-VL has one qkv.
    return qwen_tower(c, "hidden_size", windows=True)


VISION.update({
    "qwen2_5_omni_vision_encoder": Family(_qwen2_5_omni_vision, {"depth": 32, "hidden_size": 3584, "num_heads": 16,
                                                                 "patch_size": 14, "spatial_merge_size": 2,
                                                                 "rope_theta": 10000.0, "window_size": 112,
                                                                 "fullatt_block_indexes": [7, 15, 23, 31]}),
    # Qwen3OmniMoeVisionEncoder: Qwen3-VL's tower (one qkv, the learned table before layer 0, deepstack mergers).
    "qwen3_omni_moe_vision_encoder": Family(_qwen3_5_vision, _QWEN3_5_VISION),
})
VISION_OF.update({"qwen2_5_omni_thinker": "qwen2_5_omni_vision_encoder",
                  "qwen3_omni_moe_thinker": "qwen3_omni_moe_vision_encoder"})


def _glm4v_vision(c):
    """GLM-4.1V / GLM-4.5V towers (HF ``Glm4vVisionAttention``, ``Glm4vMoeVisionAttention``): the Qwen towers' 2-D
    RoPE and patch order, every layer full, one ``qkv`` whose bias is ``attention_bias``, ``proj`` without bias; a
    learned table of ``(image_size // patch_size) ** 2`` positions, bicubically resampled, added before layer 0."""
    bias, side = c.flag("attention_bias", False), c.int("image_size", required=True) // c.int("patch_size")
    if side < 1:
        raise c.error(f"config['image_size'] ({c.get('image_size')}) is less than patch_size ({c.get('patch_size')}): "
                      "the learned position table would hold no position")
    specs = qwen_tower(c, "hidden_size")
    note = (f"before this layer a learned position table ({side} x {side}, image_size // patch_size a side, "
            "bicubically resampled to the image's grid) is added to the patch embeddings: the input seam, not RoPE, "
            "and not modelled here")
    return [replace(s, kwargs={**s.kwargs, "bias": bias}, no_bias=("bo",) if bias else (),
                    notes=((note,) if s.index == 0 else ()) + (("biases on q, k, v only",) if bias else ()))
            for s in specs]


_GLM4V_VISION = {"depth": 24, "hidden_size": 1536, "num_heads": 12, "image_size": 336, "patch_size": 14,
                 "spatial_merge_size": 2, "rope_theta": 10000.0}
VISION.update({"glm4v_vision": Family(_glm4v_vision, _GLM4V_VISION),
               "glm4v_moe_vision": Family(_glm4v_vision, _GLM4V_VISION)})
VISION_OF.update({"glm4v": "glm4v_vision", "glm4v_moe": "glm4v_moe_vision"})
