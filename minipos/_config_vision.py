"""The multimodal families of ``minipos.config``: the M-RoPE text decoders (Qwen2-VL, Qwen3-VL, GLM-4.xV;
positions ``(3, T)``) and the vision towers with 2-D RoPE (``.vision``: Pixtral, Llama 4; positions
``(2, T)``). ``minipos.config``'s module docstring states the contract."""

from __future__ import annotations

from dataclasses import replace

from ._config_rope import dense_layers, layer_sizes, rope_parameters
from ._config_types import Family, LayerSpec, Model
from ._config_types import FamilyConfig as _Config
from .axial import AxialRotary
from .layer import MultiHeadAttention
from .mrope import MRotary
from .qk_norm import QKNormAttention

# --------------------------------------------------------------------------- M-RoPE text decoders

def qwen2_vl(c):
    return dense_layers(c, bias="qkv", window="types", mrope=True)


def _without_mrope_flag(c: _Config) -> _Config:
    """``c`` with ``mrope_interleaved`` taken out of its RoPE parameters (``rope_parameters`` or, in a
    transformers 4 file, ``rope_scaling``): for the families whose HF rotary always interleaves, the
    flag changes nothing (HF ``Qwen3VLTextRotaryEmbedding`` never reads it)."""
    data = dict(c.data)
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in data[key].items() if k != "mrope_interleaved"}
    return _Config(data, c.model_type, c.defaults)


def qwen3_vl(c):
    """Qwen3-VL and Qwen3-VL-MoE text decoders: Qwen3's layer (per-head q/k RMSNorm, ``attention_bias`` on
    all four projections, no window) with interleaved M-RoPE, HF's default section [24, 20, 20]."""
    c = _without_mrope_flag(c)
    params = rope_parameters(c)
    extra = set(params) - {"rope_type", "rope_theta", "mrope_section"}
    if params["rope_type"] != "default" or extra:
        raise c.error(f"interleaved M-RoPE with rope_type {params['rope_type']!r} and rope_parameters "
                      f"{sorted(extra)}: minipos' MRotary takes mrope_section and rope_theta only")
    section, theta = list(params.get("mrope_section") or [24, 20, 20]), params["rope_theta"]   # HF's default
    sizes = layer_sizes(c)
    try:
        MultiHeadAttention(scheme=MRotary(mrope_section=section, base=theta, interleaved=True),
                           **{**sizes, "d_model": 1, "num_heads": 1, "num_kv_heads": 1})
    except (ValueError, TypeError) as err:
        raise c.error(f"rope_parameters['mrope_section']: {err}") from None
    specs = dense_layers(c, bias="attention_bias", window="none", qk_norm=True)
    position = (f"M-RoPE half, interleaved (T H W T H W ...), theta {theta:g}, sections {section} (t, h, w); "
                "positions (3, T)")
    return [replace(s, scheme=lambda: MRotary(mrope_section=section, base=theta, interleaved=True),
                    position=position) for s in specs]


def glm4v(c, *, moe: bool = False):
    """GLM-4.1V / GLM-4.5V text decoders: split M-RoPE (HF ``recomposition_frequencies``, default section
    [8, 12, 12]) on the first ``int(head_dim * partial_rotary_factor)`` features, q/k/v biases, none on the
    output. The dense model pairs features (2i, 2i + 1) (``repeat_interleave(2)`` and ``rotate_half_llm``) and
    takes its head dim from ``hidden_size // num_attention_heads``; the MoE model pairs (i, i + R/2)
    (``rotate_half``), takes ``head_dim`` and defaults ``partial_rotary_factor`` to 0.5. A dense config
    whose ``head_dim`` differs from the quotient is read with its ``head_dim``, and a note says so."""
    if moe and not c.has("partial_rotary_factor"):
        c = _Config({**c.data, "partial_rotary_factor": 0.5}, c.model_type, c.defaults)   # Glm4vMoeTextConfig
    sizes, notes = layer_sizes(c), ()
    if not moe and sizes["head_dim"] * sizes["num_heads"] != sizes["d_model"]:   # a narrowed copy (golden vectors)
        notes = (f"head_dim {sizes['head_dim']} as the config says; HF's Glm4vTextAttention would take "
                 f"hidden_size // num_attention_heads = {sizes['d_model'] // sizes['num_heads']}",)
    params = rope_parameters(c)
    extra = set(params) - {"rope_type", "rope_theta", "mrope_section", "partial_rotary_factor"}
    if params["rope_type"] != "default" or extra:
        raise c.error(f"GLM-4V's M-RoPE with rope_type {params['rope_type']!r} and rope_parameters {sorted(extra)}: "
                      "minipos' MRotary takes mrope_section, partial_rotary_factor and rope_theta only")
    section, theta = list(params.get("mrope_section") or [8, 12, 12]), params["rope_theta"]   # HF's default
    R = int(sizes["head_dim"] * params.get("partial_rotary_factor", 1.0))                    # HF: int(head_dim * p)
    layout = "half" if moe else "interleaved"
    kw = {"mrope_section": section, "base": theta, "rotary_dim": R, "layout": layout}
    try:
        MultiHeadAttention(scheme=MRotary(**kw), **{**sizes, "d_model": 1, "num_heads": 1, "num_kv_heads": 1})
    except (ValueError, TypeError) as err:
        raise c.error(f"rope_parameters (mrope_section, partial_rotary_factor): {err}") from None
    bias = "qkv" if not moe or c.flag("attention_bias", True) else "none"
    specs = dense_layers(c, bias=bias, window="none")
    pairs = "half" if moe else "interleaved pairs (2i, 2i+1)"                # the feature pairing, not the streams
    position = (f"M-RoPE {pairs}, theta {theta:g}, split sections {section} (t, h, w) on the first {R} of "
                f"{sizes['head_dim']} features; positions (3, T)")
    return [replace(s, scheme=lambda: MRotary(**kw), position=position, notes=s.notes + notes) for s in specs]


# --------------------------------------------------------------------------- vision towers

def _vision_theta(c: _Config) -> float:
    """The 2-D RoPE base of a vision config: ``rope_parameters['rope_theta']`` (rope_type absent, ``default`` or
    ``axial``, no other key), else ``rope_theta``, else the class's."""
    params = c.data.get("rope_parameters")
    if params is None:
        return float(c.get("rope_theta", required=True))
    if not isinstance(params, dict):
        raise TypeError(f"model_type {c.model_type!r}: config['rope_parameters'] must be a dict")
    kind = params.get("rope_type") or params.get("type") or "default"
    if kind not in ("default", "axial"):
        raise c.error(f"config['rope_parameters']['rope_type'] = {kind!r}: this vision tower's 2-D RoPE takes no "
                      "scaling (rope_type 'axial' or 'default')")
    extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
    if extra:
        raise c.error(f"config['rope_parameters'][{extra[0]!r}] is not read by this vision tower's 2-D RoPE "
                      "(it takes rope_theta only)")
    return float(params.get("rope_theta", c.get("rope_theta", required=True)))


def _vision_tower(c: _Config, layout: str, bias: bool, start: int, cls_token: bool) -> list:
    """A vision encoder's attention layers: 2-D RoPE (``minipos.axial``), bidirectional, head dim
    ``hidden_size // num_attention_heads`` (what the attention modules compute, whatever ``head_dim`` says)."""
    d_model, heads = c.int("hidden_size", required=True), c.int("num_attention_heads", required=True)
    if d_model % heads:
        raise c.error(f"hidden_size ({d_model}) is not a multiple of num_attention_heads ({heads})")
    theta, grid = _vision_theta(c), c.int("image_size", required=True) // c.int("patch_size", required=True)
    kwargs = {"d_model": d_model, "num_heads": heads, "num_kv_heads": heads, "head_dim": d_model // heads,
              "bias": bias}
    try:
        MultiHeadAttention(scheme=AxialRotary(base=theta, layout=layout), **{**kwargs, "d_model": 1, "num_heads": 1,
                                                                             "num_kv_heads": 1})
    except (ValueError, TypeError) as err:
        raise c.error(f"2-D RoPE of head dim {d_model // heads}: {err}") from None
    extra = ", the class token last at (0, 0)" if cls_token else ""
    position = (f"2-D RoPE {layout}, theta {theta:g}; positions (2, T): patch rows, then columns, from {start} "
                f"(axial_positions(h, w, start={start}{', class_token=True' if cls_token else ''})){extra}; "
                f"up to {grid} x {grid} patches")
    make = lambda: AxialRotary(base=theta, layout=layout)                     # noqa: E731
    n = c.int("num_hidden_layers", required=True)
    return [LayerSpec(i, "vision", MultiHeadAttention, kwargs, make, position, (), (), causal=False)
            for i in range(n)]


def _pixtral_vision(c):
    # PixtralAttention: no biases, scale head_dim ** -0.5, one image per call (several: a block mask per image).
    return _vision_tower(c, "pixtral", False, 0, False)


def _llama4_vision(c):
    # Llama4VisionAttention: biases on q, k, v and o; positions from 1, the class token (last) unrotated.
    return _vision_tower(c, "llama4", True, 1, True)


def _gemma4_vision(c):
    """Gemma 4's vision encoder (HF ``Gemma4VisionAttention``): 2-D RoPE in the ``"gemma4"`` layout, GQA,
    ``head_dim`` from the config, q/k RMSNorm (weight w), a weightless value norm, scale 1, no biases
    (``Gemma4ClippableLinear`` has none, whatever ``attention_bias`` says); ``(specs, notes)``."""
    if c.flag("use_clipped_linears", False):
        raise c.error("config['use_clipped_linears'] = True: the projections clamp their inputs and outputs to "
                      "bounds stored in the checkpoint, which minipos' attention layers do not model")
    params = c.data.get("rope_parameters")
    kind = (params.get("rope_type") or "axial") if isinstance(params, dict) else "axial"
    if kind != "axial":                                     # Gemma4VisionRotaryEmbedding raises for any other
        raise c.error(f"config['rope_parameters']['rope_type'] = {kind!r}: Gemma 4's vision rotary is 'axial' only")
    theta, heads = _vision_theta(c), c.int("num_attention_heads", required=True)
    kwargs = {"d_model": c.int("hidden_size", required=True), "num_heads": heads,
              "num_kv_heads": c.int("num_key_value_heads") or heads, "head_dim": c.int("head_dim", required=True),
              "bias": False, "scale": 1.0, "norm_eps": float(c.get("rms_norm_eps", 1e-6)), "v_norm": True}
    try:
        QKNormAttention(scheme=AxialRotary(base=theta, layout="gemma4"), **kwargs)
    except (ValueError, TypeError) as err:
        raise c.error(f"2-D RoPE of head dim {kwargs['head_dim']}: {err}") from None
    position = (f"2-D RoPE gemma4, theta {theta:g}; positions (2, T): patch rows, then columns, from 0 "
                "(axial_positions(h, w)); HF's pixel_position_ids are (x, y), the columns first: reverse them")
    notes = ("q/k RMSNorm per head (weight w), values RMSNorm without weight",)
    make = lambda: AxialRotary(base=theta, layout="gemma4")                 # noqa: E731
    specs = [LayerSpec(i, "vision", QKNormAttention, kwargs, make, position, (), notes, causal=False)
             for i in range(c.int("num_hidden_layers", required=True))]
    table = c.int("position_embedding_size", required=True)
    unread = ["attention_bias is not read: Gemma4VisionAttention's projections have no bias"] \
        if c.data.get("attention_bias") else []
    return specs, unread + [f"the patch embedder adds a learned 2-D table before layer 0 (position_embedding_table "
                   f"(2, {table}, hidden_size): the x row plus the y row, an input seam minipos does not read)",
                   "padding patches (pixel_position_ids (-1, -1)) are masked as keys: pass that mask"]


VISION = {
    "pixtral": Family(_pixtral_vision, {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
                                        "image_size": 1024, "patch_size": 16, "rope_theta": 10000.0}),
    "gemma4_vision": Family(_gemma4_vision, {"hidden_size": 768, "num_attention_heads": 12, "num_key_value_heads": 12,
                                             "head_dim": 64, "num_hidden_layers": 16, "rms_norm_eps": 1e-6,
                                             "rope_theta": 100.0, "position_embedding_size": 10240}),
    "llama4_vision_model": Family(_llama4_vision, {"hidden_size": 768, "num_attention_heads": 16,
                                                   "num_hidden_layers": 34, "image_size": 448, "patch_size": 14,
                                                   "rope_theta": 10000.0}),
}
"""``vision_config['model_type']`` -> ``Family``: the vision towers with 2-D RoPE the reader builds (``.vision``)."""


def read_vision(vision: dict) -> Model:
    model_type = vision.get("model_type")
    c = _Config(vision, model_type, VISION[model_type].defaults)
    specs = VISION[model_type].read(c)
    specs, notes = specs if isinstance(specs, tuple) else (specs, [])        # a family may add notes
    return Model(model_type, vision, specs, list(notes), kind="vision encoder")
