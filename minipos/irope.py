"""NoPE layers with an attention temperature, chunked attention, and the per-layer choice (iRoPE).

Sources: Meta's Llama 4 ("iRoPE": interleaved RoPE and NoPE layers) as implemented in HF
transformers 5.24 ``models/llama4/modeling_llama4.py`` (``Llama4TextAttention``) and
``masking_utils.py`` (``chunked_overlay``); the temperature follows Nakanishi 2025, "Scalable-Softmax
Is Superior for Attention", arXiv:2501.19399 (logits scaled by a factor growing like log n);
SmolLM3 in ``models/smollm3/modeling_smollm3.py`` (``SmolLM3Attention``). docs/irope.md has the
derivation and the porting notes; this docstring states the contract.

The temperature. A NoPE layer of Llama 4 (no rotation) multiplies query ``i`` by

    tau(i) = log1p(floor((i + 1) / floor_scale)) * attn_scale + 1,                 (HF's attn_scales)

so every logit of row ``i`` is scaled by ``tau(i)``: ``tau = 1`` for ``i + 1 < floor_scale``, then it
grows by steps like ``attn_scale * log(i / floor_scale)``. Keys are not scaled. HF takes ``i`` as the
*cache index* (``arange(T) + past_seen_tokens``), not the position id; the layer here passes its
``positions``, which are the cache index unless a call gives other positions. HF computes ``tau`` in
float32 (``positions.float()``); ``float32=True`` reproduces that rounding (the quotient, the floor,
``* attn_scale`` and ``+ 1`` in float32, the log correctly rounded to float32; torch's float32
``log1p`` is off by one ulp at a few integers, how many depending on the torch build and CPU), the default
computes it in float64.

Chunked attention. On Llama 4's RoPE layers (``attention_chunk_size`` C, 8192) query ``i`` sees key
``j`` only when ``i // C == j // C`` (and ``j <= i`` under the causal mask): the sequence is cut into
independent chunks of C positions. ``chunk_mask`` (from ``minipos.masks``) is that rule on positions.
HF counts chunks from the first real token of a left-padded row (``(idx - left_padding) // C``); here
positions are shared by the batch, so give positions that start at 0 at the first real token.

The per-layer choice. ``no_rope_layers[i]`` is 1 where layer ``i`` *uses* RoPE (the name says the
opposite): ``use_rope = config.no_rope_layers[layer_idx]`` in both models. Its default is
``int((i + 1) % no_rope_layer_interval != 0)`` with interval 4, so layers 3, 7, 11, ... are NoPE.
``llama4_layer`` and ``smollm3_layer`` turn a config dict and a layer index into the scheme and the
``MultiHeadAttention`` keyword arguments of that layer; the scheme class of the NoPE layers,
``NoPETemperature``, is at the bottom.
"""

from __future__ import annotations

import numbers

import numpy as np
from numpy.typing import ArrayLike

from ._checks import (as_float_array, as_positions, check_bool, check_float, check_int, check_overflow,
                      check_positive_int, check_span)
from .masks import chunk_mask
from .rope_scaling import Rotary
from .seams import NoPE, Scheme

__all__ = ["attn_temperature", "apply_attn_temperature", "apply_attn_temperature_backward", "chunk_mask",
           "use_rope", "llama4_layer", "smollm3_layer", "NoPETemperature"]


def attn_temperature(positions: ArrayLike, *, attn_scale: float = 0.1, floor_scale: float = 8192,
                     float32: bool = False) -> np.ndarray:
    """``tau(i) = log1p(floor((i + 1) / floor_scale)) * attn_scale + 1`` for each position, ``(T,)`` float64.

    positions: ``(T,)`` integers >= 0 or an int T meaning ``arange(T)``. attn_scale: >= 0 (0 gives
    tau = 1). floor_scale: > 0. float32: round as HF's float32 computation does (module docstring).
    """
    pos = as_positions(positions, "positions")
    attn_scale = check_float(attn_scale, "attn_scale", minimum=0.0)
    floor_scale = check_float(floor_scale, "floor_scale", positive=True)
    if check_bool(float32, "float32"):
        f32 = np.float32
        steps = np.floor((pos.astype(f32) + f32(1)) / f32(floor_scale))          # (T,) float32
        logs = np.log1p(steps.astype(np.float64)).astype(f32)                    # log1p, rounded once
        with np.errstate(over="ignore", invalid="ignore"):                       # checked just below
            tau = (logs * f32(attn_scale) + f32(1)).astype(np.float64)
        return check_overflow(tau, "tau(i) in float32", "attn_scale")
    steps = np.floor((pos.astype(np.float64) + 1.0) / floor_scale)               # floor((i + 1) / floor_scale)
    with np.errstate(over="ignore", invalid="ignore"):                           # checked just below
        tau = np.log1p(steps) * attn_scale + 1.0                                 # (T,)
    return check_overflow(tau, "tau(i)", "attn_scale")


def _scales(x, name, positions, kwargs):
    """tau of the positions, checked against ``x`` ``(..., T, D)``, shaped ``(T, 1)`` in x's dtype."""
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., T, D), got {x.shape}")
    tau = attn_temperature(positions, **kwargs)
    if tau.shape[0] != x.shape[-2]:
        raise ValueError(f"{name} must have T = {tau.shape[0]} rows (one per position) in (..., T, D), "
                         f"got shape {x.shape}")
    with np.errstate(over="ignore"):                                             # an inf is caught by the caller
        return tau[:, None].astype(x.dtype)                                      # (T, 1)


def apply_attn_temperature(q: ArrayLike, positions: ArrayLike, *, attn_scale: float = 0.1, floor_scale: float = 8192,
                           float32: bool = False) -> np.ndarray:
    """The queries ``q`` ``(..., T, D)`` scaled row by row: ``q_i * tau(i)``, in q's floating dtype.

    Same keywords as ``attn_temperature``; positions ``(T,)`` or an int T. ``ValueError`` if the
    scaled queries overflow q's dtype (float16 q of 6e4 times tau > 1, say).
    """
    q = as_float_array(q, "q")
    tau = _scales(q, "q", positions, dict(attn_scale=attn_scale, floor_scale=floor_scale, float32=float32))
    with np.errstate(over="ignore", invalid="ignore"):                           # checked just below
        out = q * tau                                                            # (..., T, D)
    return check_overflow(out, "the scaled queries q * tau(i)", "q or attn_scale")


def apply_attn_temperature_backward(dy: ArrayLike, positions: ArrayLike, *, attn_scale: float = 0.1,
                                    floor_scale: float = 8192, float32: bool = False) -> np.ndarray:
    """The gradient of ``apply_attn_temperature`` for the output gradient ``dy`` ``(..., T, D)``.

    The map is diagonal, ``y_i = tau(i) q_i``, so ``dq_i = tau(i) dy_i``.
    """
    dy = as_float_array(dy, "dy")
    tau = _scales(dy, "dy", positions, dict(attn_scale=attn_scale, floor_scale=floor_scale, float32=float32))
    with np.errstate(over="ignore", invalid="ignore"):                           # checked just below
        out = dy * tau                                                           # (..., T, D)
    return check_overflow(out, "the gradient of q, tau(i) * dy", "dy or attn_scale")


# --------------------------------------------------------------------------- the per-layer choice

def _get(config, key, default=None, *, required=False):
    if key not in config or config[key] is None:
        if required:
            raise ValueError(f"config[{key!r}] is required")
        return default
    return config[key]


def _check_config(config) -> dict:
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (e.g. a config.json or config.to_dict()), got {type(config).__name__}")
    return config


def _flag(config, key, default: bool) -> bool:
    """A config flag: True or False (absent or None: ``default``); a string such as ``"false"`` is not a bool."""
    return check_bool(_get(config, key, default), f"config[{key!r}]")


def _list(config, key, layers: int, what: str):
    """``config[key]`` as a list of ``layers`` entries (a tuple or NumPy array is read as a list), or None."""
    value = _get(config, key)
    if value is None:
        return None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"config[{key!r}] must be a list of num_hidden_layers = {layers} {what}, got "
                        f"{type(value).__name__} {value!r}"[:300])
    return list(value)


def _num_layers(config, layer_idx) -> tuple[int, int]:
    layers = check_positive_int(_get(_check_config(config), "num_hidden_layers", required=True),
                                "config['num_hidden_layers']")
    layer_idx = check_int(layer_idx, "layer_idx", minimum=0)
    if layer_idx >= layers:
        raise ValueError(f"layer_idx must be < config['num_hidden_layers'] = {layers}, got {layer_idx}")
    return layers, layer_idx


def use_rope(config: dict, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` of a Llama 4 / SmolLM3 text config rotates (``no_rope_layers[i] == 1``).

    config: a dict with ``num_hidden_layers`` and ``no_rope_layers`` (a list of 0/1, 1 = RoPE, one
    per layer) or ``no_rope_layer_interval`` (default 4: layers 3, 7, ... are NoPE), as HF fills it in.
    """
    layers, layer_idx = _num_layers(config, layer_idx)
    flags = _list(config, "no_rope_layers", layers, "flags 0/1 (1 = the layer uses RoPE)")
    if not flags:                                                                # HF: None or [] -> the default
        interval = check_positive_int(_get(config, "no_rope_layer_interval", 4), "config['no_rope_layer_interval']")
        return (layer_idx + 1) % interval != 0
    if len(flags) != layers or any(isinstance(f, str) or f not in (0, 1) for f in flags):
        raise ValueError(f"config['no_rope_layers'] must be a list of num_hidden_layers = {layers} flags 0/1 "
                         f"(1 = the layer uses RoPE), got {flags!r}"[:300])
    return bool(flags[layer_idx])


def _layer_type(config, layers: int, layer_idx: int, allowed) -> str | None:
    """The entry ``layer_idx`` of ``config["layer_types"]`` (None where the config has none), each
    entry checked to be one of ``allowed`` and the list to have one entry per layer."""
    types = _list(config, "layer_types", layers, f"layer types ({', '.join(sorted(allowed))})")
    if types is None:
        return None
    if len(types) != layers:
        raise ValueError(f"config['layer_types'] must have one entry per layer (num_hidden_layers = {layers}), "
                         f"got {len(types)}")
    for t in types:
        if not isinstance(t, str) or t not in allowed:
            raise ValueError(f"config['layer_types'] may hold {sorted(allowed)}, got {t!r}")
    return types[layer_idx]


def _layer_kwargs(config):
    d_model = check_positive_int(_get(config, "hidden_size", required=True), "config['hidden_size']")
    heads = check_positive_int(_get(config, "num_attention_heads", required=True), "config['num_attention_heads']")
    kv = check_positive_int(_get(config, "num_key_value_heads", heads), "config['num_key_value_heads']")
    head_dim = _get(config, "head_dim")                                          # HF: head_dim or hidden // heads
    head_dim = (check_positive_int(d_model // heads, "config['hidden_size'] // config['num_attention_heads'] "
                                   "(the head_dim of a config without one)") if head_dim is None
                else check_positive_int(head_dim, "config['head_dim']"))
    return {"d_model": d_model, "num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim,
            "bias": _flag(config, "attention_bias", False)}


def _rotary(config, layout, default_theta):
    """``Rotary`` of a transformers 5 config (``rope_parameters``, ``rope_theta`` inside it) or a
    transformers 4 one (``rope_theta`` at the top, ``rope_scaling`` None or a dict of the scaling)."""
    key = "rope_parameters" if _get(config, "rope_parameters") is not None else "rope_scaling"
    params = _get(config, key, {})
    if not isinstance(params, dict):
        raise TypeError(f"config[{key!r}] must be a dict of RoPE parameters (or None), got {type(params).__name__}")
    params = dict(params)
    if "rope_type" not in params and "type" not in params:                      # transformers 4: no scaling
        params["rope_type"] = "default"
    if "rope_theta" not in params:                                              # transformers 4: at the top
        params["rope_theta"] = _get(config, "rope_theta", default_theta)
    return Rotary(layout=layout, scaling=params)


def _temperature_tuning(config) -> bool:
    """``attn_temperature_tuning``: a bool (transformers 5), or transformers 4's integer (its default
    and Meta's Llama 4 config.json hold 4; HF read it as true when non-zero). A string is refused."""
    value = _get(config, "attn_temperature_tuning", True)
    if isinstance(value, (bool, np.bool_)):
        return bool(value)
    if isinstance(value, numbers.Integral):
        return value != 0
    raise TypeError(f"config['attn_temperature_tuning'] must be True or False (or transformers 4's integer, "
                    f"such as 4), got {type(value).__name__} {value!r}")


LLAMA4_THETA, SMOLLM3_THETA = 500_000.0, 2_000_000.0
"""The ``rope_theta`` of ``Llama4TextConfig`` and ``SmolLM3Config`` (``default_theta`` in transformers 5,
the ``rope_theta`` default of transformers 4), for a config dict that leaves it out."""


def llama4_layer(config: dict, layer_idx: int) -> tuple[Scheme, dict]:
    """``(scheme, layer_kwargs)`` of layer ``layer_idx`` of a Llama 4 text config (``Llama4TextConfig``).

    RoPE layers: ``Rotary(layout="interleaved", scaling=rope_parameters)`` (Llama 4 rotates pairs
    (2i, 2i+1), as a complex product). ``attention_chunk`` is ``attention_chunk_size`` on the layers
    whose ``layer_types`` entry is ``"chunked_attention"`` (HF's default: the RoPE layers), else None. NoPE layers:
    ``NoPETemperature(attn_scale, floor_scale, float32=True)`` when ``attn_temperature_tuning`` (else
    ``NoPE()``), full causal attention. The L2 q/k norm of RoPE layers (``use_qk_norm``) is not part of
    this layer: apply it between the rotate seam and attention yourself. ``MultiHeadAttention(scheme=
    scheme, **layer_kwargs)`` builds the layer; call it with ``causal=True``.

    Both transformers 5 configs (``rope_parameters`` with ``rope_theta`` inside) and transformers 4
    ones (``rope_theta`` at the top, ``rope_scaling`` None or a scaling dict) are read. Flags are
    bools: ``attention_bias`` True or False, ``attn_temperature_tuning`` True or False or transformers
    4's integer (4 in its default and in Meta's config.json; non-zero is true); a string such as
    ``"false"`` raises ``TypeError``. ``layer_types`` must list ``"chunked_attention"`` or
    ``"full_attention"`` for every layer. ``attention_chunk_size`` left out is 8192; None on a
    chunked layer raises ``ValueError``, as HF's ``create_chunked_causal_mask`` does.
    """
    layers, layer_idx = _num_layers(config, layer_idx)
    rope = use_rope(config, layer_idx)
    kind = _layer_type(config, layers, layer_idx, {"chunked_attention", "full_attention"})
    chunked = kind == "chunked_attention" if kind is not None else rope
    chunk = config.get("attention_chunk_size", 8192)                             # absent: Llama4TextConfig's 8192
    if chunked and chunk is None:                                                # HF's chunked mask refuses it too
        raise ValueError(f"config['attention_chunk_size'] is None, but layer {layer_idx} is chunked "
                         f"({'its layer_types entry' if kind is not None else 'a RoPE layer'}); give the chunk length")
    kwargs = {**_layer_kwargs(config),
              "attention_chunk": check_span(chunk, "config['attention_chunk_size']") if chunked else None}
    if rope:
        return _rotary(config, "interleaved", LLAMA4_THETA), kwargs
    if _temperature_tuning(config):
        return NoPETemperature(attn_scale=_get(config, "attn_scale", 0.1),
                               floor_scale=_get(config, "floor_scale", 8192), float32=True), kwargs
    return NoPE(), kwargs


def smollm3_layer(config: dict, layer_idx: int) -> tuple[Scheme, dict]:
    """``(scheme, layer_kwargs)`` of layer ``layer_idx`` of a SmolLM3 config (``SmolLM3Config``).

    RoPE layers: ``Rotary(layout="half", scaling=rope_parameters)`` (HF's ``rotate_half``); NoPE layers:
    ``NoPE()``. No temperature, no chunks. ``use_sliding_window`` (a window on the NoPE layers) and a
    ``"sliding_attention"`` entry of ``layer_types`` are not modelled and raise ``ValueError``. Read
    from transformers 5 and transformers 4 configs alike, flags as bools (see ``llama4_layer``). Call
    the layer with ``causal=True``.
    """
    layers, layer_idx = _num_layers(config, layer_idx)
    if _flag(config, "use_sliding_window", False):
        raise ValueError("config['use_sliding_window'] is true: SmolLM3's sliding window on NoPE layers is not "
                         "modelled by MultiHeadAttention")
    if _layer_type(config, layers, layer_idx, {"full_attention", "sliding_attention"}) == "sliding_attention":
        raise ValueError(f"config['layer_types'][{layer_idx}] is 'sliding_attention': SmolLM3's sliding window is "
                         "not modelled by MultiHeadAttention")
    rope = use_rope(config, layer_idx)
    return (_rotary(config, "half", SMOLLM3_THETA) if rope else NoPE()), _layer_kwargs(config)


# --------------------------------------------------------------------------- the scheme the layer runs

class NoPETemperature(NoPE):
    """NoPE with Llama 4's attention temperature: query i scaled by ``tau(i)`` (``attn_temperature``).

    ``tau(i) = log1p(floor((i + 1) / floor_scale)) * attn_scale + 1`` multiplies the queries only, so
    every logit of row i is scaled by ``tau(i)``; it is 1 until ``i + 1 = floor_scale``. ``attn_scale``,
    ``floor_scale`` are the config keys of the same names (Llama 4: 0.1, 8192); ``float32=True`` rounds
    ``tau`` as HF does. Fixed, not learned.
    """

    name = "nope-temperature"
    seams = ("rotate",)

    def __init__(self, *, attn_scale: float = 0.1, floor_scale: float = 8192, float32: bool = False):
        self.attn_scale = check_float(attn_scale, "attn_scale", minimum=0.0)
        self.floor_scale = check_float(floor_scale, "floor_scale", positive=True)
        self.float32 = check_bool(float32, "float32")

    def _kw(self):
        return dict(attn_scale=self.attn_scale, floor_scale=self.floor_scale, float32=self.float32)

    def rotate_q(self, q, positions, *, seq_len):  # q_i * tau(i); keys unchanged
        return apply_attn_temperature(q, positions, **self._kw())

    def rotate_q_backward(self, dq, positions, *, seq_len):
        return apply_attn_temperature_backward(dq, positions, **self._kw())

    def settings(self):
        return (("attn_scale", self.attn_scale), ("floor_scale", self.floor_scale), ("float32", self.float32))

    def __repr__(self) -> str:
        f32 = ", float32=True" if self.float32 else ""
        return f"NoPETemperature(attn_scale={self.attn_scale}, floor_scale={self.floor_scale:g}{f32})"
