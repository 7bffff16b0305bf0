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

import numpy as np

from ._checks import check_bool, check_choice, check_float, check_int, check_positive_int, check_span
from .masks import sliding_window_mask
from .rope_scaling import Rotary
from .seams import Scheme

__all__ = ["sliding_window_mask", "gemma3_attention", "gemma3_layer_types", "gemma3_rope_parameters"]


# --------------------------------------------------------------------------- Gemma 3

GEMMA3_DEFAULTS = {"head_dim": 256, "query_pre_attn_scalar": 256, "sliding_window": 4096,
                   "sliding_window_pattern": 6, "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0}
"""The defaults of transformers' ``Gemma3TextConfig`` for keys a config dict may leave out."""


LAYER_TYPES = ("sliding_attention", "full_attention")


def _check_config(config) -> dict:
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (config.json, or a config's to_dict()), got {type(config).__name__}")
    return config


def _get(config, key, *, none: bool = True):
    """``config[key]``, or the ``Gemma3TextConfig`` default where the key is absent (or None, if
    ``none``; else None is returned for the caller's check to refuse)."""
    if key not in config or (none and config[key] is None):
        return GEMMA3_DEFAULTS[key]
    return config[key]


def gemma3_layer_types(config: dict) -> list:
    """``config["layer_types"]``, or the older ``sliding_window_pattern`` rule: layer ``i`` is
    ``"sliding_attention"`` unless ``(i + 1) % pattern == 0`` (pattern 6: every sixth is global).

    ``layer_types`` must be a list of ``"sliding_attention"`` / ``"full_attention"``, one per layer
    where the config also gives ``num_hidden_layers`` (transformers 5 checks the same)."""
    _check_config(config)
    if config.get("layer_types") is not None:
        types = config["layer_types"]
        if isinstance(types, np.ndarray):
            types = types.tolist()
        if not isinstance(types, (list, tuple)):
            raise TypeError(f"config['layer_types'] must be a list of {list(LAYER_TYPES)}, got "
                            f"{type(types).__name__} {types!r}"[:300])
        for t in types:
            if not isinstance(t, str) or t not in LAYER_TYPES:
                raise ValueError(f"config['layer_types'] may hold 'sliding_attention' and 'full_attention', got {t!r}")
        n = config.get("num_hidden_layers")
        if n is not None and check_positive_int(n, "config['num_hidden_layers']") != len(types):
            raise ValueError(f"config['layer_types'] must have one entry per layer (num_hidden_layers = {n}), "
                             f"got {len(types)}")
        return list(types)
    n = check_positive_int(config.get("num_hidden_layers"), "config['num_hidden_layers']")
    pattern = check_positive_int(_get(config, "sliding_window_pattern"), "config['sliding_window_pattern']")
    return ["sliding_attention" if (i + 1) % pattern else "full_attention" for i in range(n)]


def _params(value, name: str) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a dict of RoPE parameters, got {type(value).__name__} {value!r}"[:300])
    return dict(value)


def gemma3_rope_parameters(config: dict, layer_type: str) -> dict:
    """The RoPE parameters of one layer type, ``"sliding_attention"`` or ``"full_attention"``, as
    transformers 5 stores them (``config["rope_parameters"][layer_type]``, which must then be
    there), or built from the older keys of transformers 4: local layers ``rope_local_base_freq``,
    global layers ``rope_theta`` plus ``rope_scaling``."""
    _check_config(config)
    check_choice(layer_type, "layer_type", set(LAYER_TYPES))
    params = config.get("rope_parameters")
    if params is not None:
        params = _params(params, "config['rope_parameters']")
        if layer_type not in params:
            raise ValueError(f"config['rope_parameters'] must map each layer type to its parameters "
                             f"(transformers 5), but has no {layer_type!r}: its keys are {sorted(map(str, params))}"[:300])
        return _params(params[layer_type], f"config['rope_parameters'][{layer_type!r}]")
    if layer_type == "sliding_attention":
        return {"rope_type": "default", "rope_theta": _get(config, "rope_local_base_freq")}
    scaling = config.get("rope_scaling")
    found = {"rope_type": "default", **({} if scaling is None else _params(scaling, "config['rope_scaling']"))}
    found.setdefault("rope_theta", _get(config, "rope_theta"))
    return found


def gemma3_attention(config: dict, layer_idx: int) -> tuple[Scheme, dict]:
    """``(scheme, kwargs)`` of layer ``layer_idx`` of a Gemma 3 text config (a ``config.json`` dict
    or ``Gemma3TextConfig(...).to_dict()``): ``MultiHeadAttention(scheme=scheme, **kwargs)``.

    Local (``"sliding_attention"``) layers get ``sliding_window`` and their own RoPE base; global
    ones no window and the scaled RoPE. Every layer: ``Rotary(layout="half")``, grouped-query
    heads, ``scale = query_pre_attn_scalar ** -0.5``. Gemma 3's per-head ``q_norm``/``k_norm``
    (RMSNorm before RoPE) are not modelled: apply them to q and k yourself or treat them as the
    identity. Keys minipos cannot honour raise: ``attn_logit_softcapping`` (Gemma 2) and
    ``use_bidirectional_attention``. Keys left out take ``Gemma3TextConfig``'s defaults
    (``GEMMA3_DEFAULTS``); a key given must be of its type: ``query_pre_attn_scalar`` a number > 0
    (None raises: it differs between checkpoints, so it is not guessed), ``head_dim`` an int >= 1
    (None: the default), ``sliding_window`` an int >= 1 on a local layer, ``attention_bias`` True or
    False (a string such as ``"false"`` raises ``TypeError``).
    """
    _check_config(config)
    for key in ("attn_logit_softcapping", "use_bidirectional_attention"):
        if config.get(key):
            raise ValueError(f"config[{key!r}] = {config[key]!r} is not modelled by MultiHeadAttention")
    types = gemma3_layer_types(config)
    layer_idx = check_int(layer_idx, "layer_idx", minimum=0)
    if layer_idx >= len(types):
        raise ValueError(f"layer_idx must be below the number of layers ({len(types)}), got {layer_idx}")
    kind = types[layer_idx]
    heads = check_positive_int(config.get("num_attention_heads"), "config['num_attention_heads']")
    kv = config.get("num_key_value_heads")
    scalar = check_float(_get(config, "query_pre_attn_scalar", none=False), "config['query_pre_attn_scalar']",
                         positive=True)                                # None: HF's scaling fails too; no guess
    kwargs = {
        "d_model": check_positive_int(config.get("hidden_size"), "config['hidden_size']"),
        "num_heads": heads,
        "num_kv_heads": heads if kv is None else check_positive_int(kv, "config['num_key_value_heads']"),
        "head_dim": check_positive_int(_get(config, "head_dim"), "config['head_dim']"),
        "bias": check_bool(False if config.get("attention_bias") is None else config["attention_bias"],
                           "config['attention_bias']"),
        "scale": check_float(scalar ** -0.5, "query_pre_attn_scalar ** -0.5 (the scale)", positive=True),
        "sliding_window": (check_span(_get(config, "sliding_window", none=False), "config['sliding_window']")
                           if kind == "sliding_attention" else None),
    }
    return Rotary(layout="half", scaling=gemma3_rope_parameters(config, kind)), kwargs
