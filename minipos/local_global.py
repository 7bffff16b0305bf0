"""Sliding windows and local/global layers (Mistral, Gemma 2/3, gpt-oss).

A *sliding-window* (local) layer lets the query at position ``i`` see the keys at positions

    i - W < j <= i                      (W keys, the query's own included)

which is HF transformers' ``sliding_window_causal_mask_function(W)``
(``masking_utils.sliding_window_overlay``: ``kv_idx > q_idx - sliding_window``, and'ed with the
causal mask). So ``sliding_window=1`` sees only the query itself, and ``sliding_window=W`` with a
prompt of length ``<= W`` is plain causal attention. The window is counted in positions, not in
cache slots. ``MultiHeadAttention(..., sliding_window=W)`` applies it (with ``causal=True``);
``sliding_window_mask`` (from ``minipos.masks``, where the layer's masks live) is the rule on positions.

A decoding step of a windowed layer needs only the last ``W - 1`` keys: a
``layer.new_cache(mem_len=W - 1)`` keeps exactly those (Mistral's rolling buffer cache), and every
step then equals the full forward pass.

*Local/global* models interleave windowed layers with full ones. Gemma 3 makes five of every six
layers local (``layer_types``, formerly ``sliding_window_pattern = 6``) and gives the two kinds
different RoPE: local layers ``rope_local_base_freq`` (10 000) without scaling, global layers
``rope_theta`` (1 000 000) with the checkpoint's scaling (``linear``, factor 8, in the 4B-27B
models). ``gemma3_attention(config, layer_idx)`` reads a config and gives the scheme and keyword
arguments of one layer. Docs: ``docs/local-global.md``.
"""

from __future__ import annotations

from ._checks import check_int, check_positive_int
from .masks import sliding_window_mask
from .rope_scaling import Rotary

__all__ = ["sliding_window_mask", "gemma3_attention", "gemma3_layer_types", "gemma3_rope_parameters"]


# --------------------------------------------------------------------------- Gemma 3

GEMMA3_DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                   "sliding_window_pattern": 6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
"""The defaults of transformers' ``Gemma3TextConfig`` for keys a config dict may leave out."""


def gemma3_layer_types(config: dict) -> list:
    """``config["layer_types"]``, or the older ``sliding_window_pattern`` rule: layer ``i`` is
    ``"sliding_attention"`` unless ``(i + 1) % pattern == 0`` (pattern 6: every sixth is global)."""
    if config.get("layer_types") is not None:
        types = list(config["layer_types"])
        bad = sorted({t for t in types} - {"sliding_attention", "full_attention"})
        if bad:
            raise ValueError(f"config['layer_types'] may hold 'sliding_attention' and 'full_attention', got {bad[0]!r}")
        return types
    n = check_positive_int(config.get("num_hidden_layers"), "config['num_hidden_layers']")
    pattern = check_positive_int(config.get("sliding_window_pattern", GEMMA3_DEFAULTS["sliding_window_pattern"]),
                                 "config['sliding_window_pattern']")
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def gemma3_rope_parameters(config: dict, layer_type: str) -> dict:
    """The RoPE parameters of one layer type, as transformers 5 stores them
    (``config["rope_parameters"][layer_type]``), or built from the older keys: local layers
    ``rope_local_base_freq``, global layers ``rope_theta`` plus ``rope_scaling``."""
    params = config.get("rope_parameters")
    if params is not None and layer_type in params:
        return dict(params[layer_type])
    if layer_type == "sliding_attention":
        return {"rope_type": "default", "rope_theta": config.get("rope_local_base_freq",
                                                                 GEMMA3_DEFAULTS["rope_local_base_freq"])}
    found = {"rope_type": "default", **(config.get("rope_scaling") or {})}
    found.setdefault("rope_theta", config.get("rope_theta", GEMMA3_DEFAULTS["rope_theta"]))
    return found


def gemma3_attention(config: dict, layer_idx: int):
    """``(scheme, kwargs)`` of layer ``layer_idx`` of a Gemma 3 text config (a ``config.json`` dict
    or ``Gemma3TextConfig(...).to_dict()``): ``MultiHeadAttention(scheme=scheme, **kwargs)``.

    Local (``"sliding_attention"``) layers get ``sliding_window`` and their own RoPE base; global
    ones no window and the scaled RoPE. Every layer: ``Rotary(layout="half")``, grouped-query
    heads, ``scale = query_pre_attn_scalar ** -0.5``. Gemma 3's per-head ``q_norm``/``k_norm``
    (RMSNorm before RoPE) are not modelled: apply them to q and k yourself or treat them as the
    identity. Keys minipos cannot honour raise: ``attn_logit_softcapping`` (Gemma 2) and
    ``use_bidirectional_attention``.
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (config.json, or a config's to_dict()), got {type(config).__name__}")
    for key in ("attn_logit_softcapping", "use_bidirectional_attention"):
        if config.get(key):
            raise ValueError(f"config[{key!r}] = {config[key]!r} is not modelled by MultiHeadAttention")
    types = gemma3_layer_types(config)
    layer_idx = check_int(layer_idx, "layer_idx", minimum=0)
    if layer_idx >= len(types):
        raise ValueError(f"layer_idx must be below the number of layers ({len(types)}), got {layer_idx}")
    kind = types[layer_idx]
    heads = check_positive_int(config.get("num_attention_heads"), "config['num_attention_heads']")
    kwargs = {
        "d_model": check_positive_int(config.get("hidden_size"), "config['hidden_size']"),
        "num_heads": heads,
        "num_kv_heads": config.get("num_key_value_heads") or heads,
        "head_dim": config.get("head_dim") or GEMMA3_DEFAULTS["head_dim"],
        "bias": bool(config.get("attention_bias", False)),
        "scale": float(config.get("query_pre_attn_scalar", GEMMA3_DEFAULTS["query_pre_attn_scalar"])) ** -0.5,
        "sliding_window": (config.get("sliding_window", GEMMA3_DEFAULTS["sliding_window"])
                           if kind == "sliding_attention" else None),
    }
    return Rotary(layout="half", scaling=gemma3_rope_parameters(config, kind)), kwargs
