"""The Gemma families of ``minipos.config`` after Gemma 3: Gemma 4 (and Gemma 4 Unified), Gemma 3n, and
DiffusionGemma's decoder. Their layers are ``QKNormAttention`` (q/k norm with the weight itself, a weightless
value norm, the scale 1), sliding layers with RoPE beside full ones with p-RoPE (Gemma 4) or RoPE (Gemma 3n), and
the last ``num_kv_shared_layers`` reading an earlier layer's keys and values (``minipos.kv_share``). Returned in
``FAMILIES`` and ``TEXT_OF`` for ``minipos.config`` to merge; its module docstring states the contract."""

from __future__ import annotations

from dataclasses import replace

from ._config_rope import (
    LAYER_TYPES,
    check_built,
    check_kv_heads,
    describe_rope,
    kv_sources,
    layer_sizes,
    layer_types_of,
    make_rotary,
    rope_parameters,
    shared_kv_spec,
    window_of,
)
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from .qk_norm import QKNormAttention


def _gemma4_layer_types(c: _Config) -> list:
    """Gemma4TextConfig's ``layer_types``: given, or five sliding layers per full one; the last is full."""
    types = layer_types_of(c, lambda i: "sliding_attention" if (i + 1) % 6 else "full_attention")
    return types[:-1] + ["full_attention"]                          # HF forces it (with a warning)


def _gemma4_sizes(c: _Config, types: list) -> list:
    """Each layer's ``(num_kv_heads, head_dim)``: the full layers take ``per_layer_config`` (a transformers
    object's ``to_dict()``) or ``global_head_dim`` and, under ``attention_k_eq_v``, ``num_global_key_value_heads``
    (a hub config.json), as ``Gemma4TextConfig.__post_init__`` builds them."""
    kv, head_dim = c.int("num_key_value_heads"), c.int("head_dim")
    full = (c.int("num_global_key_value_heads") if c.flag("attention_k_eq_v", False) else None) or kv, \
        c.int("global_head_dim")
    sizes = [full if t == "full_attention" else (kv, head_dim) for t in types]
    per_layer = c.data.get("per_layer_config")
    if per_layer is None:
        return sizes
    if not isinstance(per_layer, dict):
        raise c.error("config['per_layer_config'] must map layer indices to settings")
    sizes = [(kv, head_dim)] * len(types)
    for key, override in per_layer.items():
        i = int(key) if str(key).isdigit() else -1
        if not 0 <= i < len(types) or not isinstance(override, dict):
            raise c.error(f"config['per_layer_config'][{key!r}] must be a layer index below {len(types)} "
                          "holding a dict of settings")
        unknown = set(override) - {"head_dim", "num_key_value_heads"}
        if unknown:
            raise c.error(f"config['per_layer_config'][{key!r}] sets {sorted(unknown)}; the reader takes head_dim "
                          "and num_key_value_heads only")
        layer = _Config({**c.data, **override}, c.model_type, c.defaults)
        sizes[i] = (layer.int("num_key_value_heads"), layer.int("head_dim"))
    return sizes


def _gemma4(c):
    """Gemma 4's text decoder: sliding layers (window, RoPE) and full layers (p-RoPE by default, their own
    head dim and key/value heads, keys as values under ``attention_k_eq_v``); q/k RMSNorm with the weight
    itself, a weightless RMSNorm of the values, the scale 1 (HF ``Gemma4TextAttention``). Also Gemma 4
    Unified's decoder (``Gemma4UnifiedTextAttention``, the same layer). ``(specs, notes)``."""
    both_ways = c.data.get("use_bidirectional_attention", c.defaults.get("use_bidirectional_attention"))  # null: causal
    if both_ways not in (None, "vision"):
        raise c.error(f"config['use_bidirectional_attention'] = {both_ways!r}: every token attending both ways, the "
                      "sliding layers within a window of sliding_window // 2 + 1 each side, is not modelled by "
                      "minipos' attention layers (their sliding window is causal)")
    found = c.get("rope_parameters")
    if found is None:                                                       # Gemma4TextConfig's own
        found = {"sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
                 "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                    "rope_theta": 1_000_000.0}}
    if not isinstance(found, dict) or not set(found) & set(LAYER_TYPES):
        raise c.error("config['rope_parameters'] must be nested per layer type ('sliding_attention', "
                      "'full_attention'), as Gemma4TextConfig's")
    nested = {k: v for k, v in found.items() if k in LAYER_TYPES}       # hub files may add null top-level keys
    c = _Config({**c.data, "rope_parameters": nested}, c.model_type, c.defaults)
    types = _gemma4_layer_types(c)
    d_model, heads = c.int("hidden_size", required=True), c.int("num_attention_heads")
    k_eq_v, specs, sources = c.flag("attention_k_eq_v", False), [], kv_sources(c, types)
    for i, (kind, (kv, head_dim)) in enumerate(zip(types, _gemma4_sizes(c, types))):
        check_kv_heads(c, heads, kv, "num_global_key_value_heads" if k_eq_v and kind == "full_attention" and
                       c.has("num_global_key_value_heads") else "num_key_value_heads")
        if not isinstance(nested.get(kind), dict):
            raise c.error(f"config['rope_parameters'][{kind!r}] must be a dict of RoPE parameters, got "
                          f"{nested.get(kind)!r}")
        theta = {"rope_theta": nested[kind].get("rope_theta")}              # each layer type has its own
        params = rope_parameters(_Config({**c.data, **theta}, c.model_type, c.defaults), kind)
        if params["rope_type"] == "default" and "partial_rotary_factor" in params:
            raise c.error(f"config['rope_parameters'][{kind!r}]['partial_rotary_factor'] under rope_type 'default': "
                          "Gemma 4's default RoPE ignores it (it rotates the whole head); drop it or use "
                          "rope_type 'proportional'")
        kwargs = {"d_model": d_model, "num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim,
                  "bias": c.flag("attention_bias", False), "sliding_window": window_of(c, kind), "scale": 1.0,
                  "norm_eps": c.float("rms_norm_eps", 1e-6, positive=True), "v_norm": True}
        notes = ["q/k RMSNorm per head (weight w), values RMSNorm without weight"]
        if k_eq_v and kind == "full_attention" and sources[i] is None:
            notes.append("attention_k_eq_v: the values are the key projection (set wv = wk, bv = bk)")
        specs.append(shared_kv_spec(LayerSpec(i, kind, QKNormAttention, kwargs, make_rotary(c, params, "half"),
                                              describe_rope(params, "half"), (), tuple(notes)), sources[i]))
    check_built(c, specs)
    if both_ways == "vision":                                    # HF create_masks_for_vision_model
        return specs, ["use_bidirectional_attention 'vision': on the sliding layers the tokens of one image also "
                       "attend to each other both ways (the full layers stay causal); text alone is causal, as "
                       "built; with images, pass that mask (causal=False)"]
    return specs


def _gemma3n(c):
    """Gemma 3n's text decoder (HF ``Gemma3nTextAttention``): sliding layers (window, ``rope_parameters
    ["sliding_attention"]``, base 10^4 by default) and full ones (base 10^6), RoPE in the half layout; q/k RMSNorm
    with the weight itself, a weightless RMSNorm of the values, the scale 1; the last ``num_kv_shared_layers`` (15 by
    default) attend with the keys and values of the last earlier layer of their type (``minipos.kv_share``)."""
    nested = c.get("rope_parameters", {})
    if not isinstance(nested, dict) or (nested and not set(nested) <= set(LAYER_TYPES)):
        raise c.error("config['rope_parameters'] must be nested per layer type ('sliding_attention', "
                      "'full_attention'), as Gemma3nTextConfig's")
    legacy = {"sliding_attention": ("rope_local_base_freq", 10_000.0), "full_attention": ("rope_theta", 1_000_000.0)}
    for kind, (key, default) in legacy.items():                           # HF: the legacy base where none is given
        own = nested.get(kind) or {}
        if not isinstance(own, dict):
            raise c.error(f"config['rope_parameters'][{kind!r}] must be a dict of RoPE parameters, got {own!r}")
        theta = own["rope_theta"] if "rope_theta" in own else c.float(key, default, positive=True)
        nested = {**nested, kind: {"rope_type": "default", "rope_theta": theta, **own}}
    if c.data.get("rope_scaling") is not None:                           # HF: transformers 4's scaling, full layers
        if not isinstance(c.data["rope_scaling"], dict):
            raise c.error("config['rope_scaling'] must be a dict or null")
        nested["full_attention"].update(c.data["rope_scaling"])
    c = _Config({**c.data, "rope_parameters": nested}, c.model_type, c.defaults)
    types = layer_types_of(c, lambda i: "full_attention" if (i + 1) % 5 == 0 else "sliding_attention",
                           allowed=("full_attention", "sliding_attention"))
    sizes, sources, specs = layer_sizes(c), kv_sources(c, types), []
    for i, kind in enumerate(types):
        params = rope_parameters(c, kind)
        kwargs = {**sizes, "bias": c.flag("attention_bias", False), "sliding_window": window_of(c, kind), "scale": 1.0,
                  "norm_eps": c.float("rms_norm_eps", 1e-6, positive=True), "v_norm": True}
        spec = LayerSpec(i, kind, QKNormAttention, kwargs, make_rotary(c, params, "half"), describe_rope(params, "half"),
                         (), ("q/k RMSNorm per head (weight w), values RMSNorm without weight",))
        specs.append(shared_kv_spec(spec, sources[i]))
    return check_built(c, specs)


def _diffusion_gemma(c):
    """DiffusionGemma's decoder (HF ``DiffusionGemmaDecoderTextAttention``): Gemma 4's layers (sliding RoPE, full
    p-RoPE with ``global_head_dim``, ``num_global_key_value_heads`` and no value projection: values = keys'
    projection), run on a *canvas* that attends both ways, without a window, over the keys and values its encoder
    pass left in this layer's cache plus its own, which it does not keep. The encoder pass is the same layer (the
    weights are tied), causal with Gemma 4's window; a note says how to run both. ``(specs, notes)``."""
    both_ways = c.data.get("use_bidirectional_attention")
    if both_ways not in (None, "vision"):
        raise c.error(f"config['use_bidirectional_attention'] = {both_ways!r}: an encoder attending both ways (its "
                      "sliding layers within sliding_window // 2 + 1 each side) is not modelled by minipos' layers")
    gemma4 = _Config({**c.data, "attention_k_eq_v": True, "num_kv_shared_layers": 0}, c.model_type, c.defaults)
    specs, out = _gemma4(gemma4), []
    specs, encoder_notes = specs if isinstance(specs, tuple) else (specs, [])   # "vision": the encoder pass's images
    for s in specs:
        window = s.kwargs["sliding_window"]
        notes = [n for n in s.notes if not n.startswith("attention_k_eq_v")]
        if s.layer_type == "full_attention":
            notes.append("no value projection: the values are the key projection (set wv = wk, bv = bk)")
        if window is not None:
            notes.append(f"the canvas sees at most the last {window - 1} keys of the encoder pass (HF's rolling cache "
                         f"keeps sliding_window - 1): encode with cache = layer.new_cache(mem_len={window - 1}) and "
                         f"the causal window mask sliding_window_mask(p, p, {window})")
        out.append(replace(s, kwargs={**s.kwargs, "sliding_window": None}, causal=False, notes=tuple(notes)))
    note = ("each layer serves the encoder and the decoder (tied weights): encode the prompt causally with a cache "
            "(layer(x, causal=True, cache=cache), a window mask on the sliding layers), then run the canvas at the "
            "positions that follow on a copy of that cache, layer(x_canvas, causal=False, cache=copy.deepcopy(cache)): "
            "it attends to the prompt's keys and its own, both ways, and the encoder's cache keeps none of its keys")
    return out, [note, *(f"the encoder pass: {n}" for n in encoder_notes)]


FAMILIES = {
    "gemma4_text": Family(_gemma4, {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                                    "global_head_dim": 512, "sliding_window": 512, "rms_norm_eps": 1e-6,
                                    "max_position_embeddings": 131072}),
    "gemma4_unified_text": Family(_gemma4, {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                                            "global_head_dim": 512, "sliding_window": 1024, "rms_norm_eps": 1e-6,
                                            "max_position_embeddings": 262144,
                                            "use_bidirectional_attention": "vision"}),
    "gemma3n_text": Family(_gemma3n, {"num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
                                      "hidden_size": 2048, "num_hidden_layers": 35, "sliding_window": 512,
                                      "rms_norm_eps": 1e-6, "num_kv_shared_layers": 15,
                                      "max_position_embeddings": 32768}),
    "diffusion_gemma_text": Family(_diffusion_gemma, {"num_attention_heads": 8, "num_key_value_heads": 4,
                                                      "head_dim": 256, "global_head_dim": 512, "hidden_size": 2304,
                                                      "num_hidden_layers": 30, "sliding_window": 512,
                                                      "rms_norm_eps": 1e-6, "max_position_embeddings": 131072}),
}
"""``model_type`` -> ``Family``: the Gemma decoders of this module."""

TEXT_OF = {"gemma4": "gemma4_text", "gemma4_unified": "gemma4_unified_text", "gemma3n": "gemma3n_text",
           "diffusion_gemma": "diffusion_gemma_text"}
