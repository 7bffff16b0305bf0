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

import numpy as np

from ._checks import as_float_array, as_positions, check_bool, check_float, check_int, check_positive_int
from .masks import chunk_mask
from .rope_scaling import Rotary
from .seams import NoPE

__all__ = ["attn_temperature", "apply_attn_temperature", "apply_attn_temperature_backward", "chunk_mask",
           "use_rope", "llama4_layer", "smollm3_layer", "NoPETemperature"]


def attn_temperature(positions, *, attn_scale: float = 0.1, floor_scale: float = 8192,
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
        return (logs * f32(attn_scale) + f32(1)).astype(np.float64)
    steps = np.floor((pos + 1) / floor_scale)                                    # floor((i + 1) / floor_scale)
    return np.log1p(steps) * attn_scale + 1.0                                    # (T,)


def _scales(x, name, positions, kwargs):
    """tau of the positions, checked against ``x`` ``(..., T, D)``, shaped ``(T, 1)`` in x's dtype."""
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape (..., T, D), got {x.shape}")
    tau = attn_temperature(positions, **kwargs)
    if tau.shape[0] != x.shape[-2]:
        raise ValueError(f"{name} must have T = {tau.shape[0]} rows (one per position) in (..., T, D), "
                         f"got shape {x.shape}")
    return tau[:, None].astype(x.dtype)                                          # (T, 1)


def apply_attn_temperature(q, positions, *, attn_scale: float = 0.1, floor_scale: float = 8192,
                           float32: bool = False) -> np.ndarray:
    """The queries ``q`` ``(..., T, D)`` scaled row by row: ``q_i * tau(i)``, in q's floating dtype.

    Same keywords as ``attn_temperature``; positions ``(T,)`` or an int T.
    """
    q = as_float_array(q, "q")
    return q * _scales(q, "q", positions, dict(attn_scale=attn_scale, floor_scale=floor_scale, float32=float32))


def apply_attn_temperature_backward(dy, positions, *, attn_scale: float = 0.1, floor_scale: float = 8192,
                                    float32: bool = False) -> np.ndarray:
    """The gradient of ``apply_attn_temperature`` for the output gradient ``dy`` ``(..., T, D)``.

    The map is diagonal, ``y_i = tau(i) q_i``, so ``dq_i = tau(i) dy_i``.
    """
    dy = as_float_array(dy, "dy")
    return dy * _scales(dy, "dy", positions, dict(attn_scale=attn_scale, floor_scale=floor_scale, float32=float32))


# --------------------------------------------------------------------------- the per-layer choice

def _get(config, key, default=None, *, required=False):
    if key not in config or config[key] is None:
        if required:
            raise ValueError(f"config[{key!r}] is required")
        return default
    return config[key]


def use_rope(config: dict, layer_idx: int) -> bool:
    """Whether layer ``layer_idx`` of a Llama 4 / SmolLM3 text config rotates (``no_rope_layers[i] == 1``).

    config: a dict with ``num_hidden_layers`` and ``no_rope_layers`` (a list of 0/1, 1 = RoPE) or
    ``no_rope_layer_interval`` (default 4: layers 3, 7, ... are NoPE), as HF fills it in.
    """
    if not isinstance(config, dict):
        raise TypeError(f"config must be a dict (e.g. a config.json or config.to_dict()), got {type(config).__name__}")
    layers = check_positive_int(_get(config, "num_hidden_layers", required=True), "config['num_hidden_layers']")
    layer_idx = check_int(layer_idx, "layer_idx", minimum=0)
    if layer_idx >= layers:
        raise ValueError(f"layer_idx must be < config['num_hidden_layers'] = {layers}, got {layer_idx}")
    flags = _get(config, "no_rope_layers")
    if not flags:                                                                # HF: None or [] -> the default
        interval = check_positive_int(_get(config, "no_rope_layer_interval", 4), "config['no_rope_layer_interval']")
        return (layer_idx + 1) % interval != 0
    if not isinstance(flags, (list, tuple)) or len(flags) != layers or any(f not in (0, 1) for f in flags):
        raise ValueError(f"config['no_rope_layers'] must be a list of num_hidden_layers = {layers} flags 0/1 "
                         f"(1 = the layer uses RoPE), got {flags!r}"[:300])
    return bool(flags[layer_idx])


def _layer_kwargs(config):
    d_model = check_positive_int(_get(config, "hidden_size", required=True), "config['hidden_size']")
    heads = check_positive_int(_get(config, "num_attention_heads", required=True), "config['num_attention_heads']")
    kv = _get(config, "num_key_value_heads", heads)
    head_dim = _get(config, "head_dim") or d_model // heads                     # HF: getattr(config, "head_dim", ...)
    return {"d_model": d_model, "num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim,
            "bias": bool(_get(config, "attention_bias", False))}


def _rotary(config, layout):
    params = dict(_get(config, "rope_parameters") or _get(config, "rope_scaling") or {})
    if "rope_theta" not in params and "rope_theta" in config:                   # transformers 4 configs
        params["rope_theta"] = config["rope_theta"]
    return Rotary(layout=layout, scaling=params or None)


def llama4_layer(config: dict, layer_idx: int):
    """``(scheme, layer_kwargs)`` of layer ``layer_idx`` of a Llama 4 text config (``Llama4TextConfig``).

    RoPE layers: ``Rotary(layout="interleaved", scaling=rope_parameters)`` (Llama 4 rotates pairs
    (2i, 2i+1), as a complex product). ``attention_chunk`` is ``attention_chunk_size`` on the layers
    whose ``layer_types`` entry is ``"chunked_attention"`` (HF's default: the RoPE layers), else None. NoPE layers:
    ``NoPETemperature(attn_scale, floor_scale, float32=True)`` when ``attn_temperature_tuning`` (else
    ``NoPE()``), full causal attention. The L2 q/k norm of RoPE layers (``use_qk_norm``) is not part of
    this layer: apply it between the rotate seam and attention yourself. ``MultiHeadAttention(scheme=
    scheme, **layer_kwargs)`` builds the layer; call it with ``causal=True``.
    """
    rope = use_rope(config, layer_idx)
    chunk = _get(config, "attention_chunk_size", 8192)
    types = _get(config, "layer_types")                                          # HF: chunked on RoPE layers
    chunked = chunk is not None and (types[layer_idx] == "chunked_attention" if types else rope)
    kwargs = {**_layer_kwargs(config),
              "attention_chunk": check_positive_int(chunk, "config['attention_chunk_size']") if chunked else None}
    if rope:
        return _rotary(config, "interleaved"), kwargs
    if _get(config, "attn_temperature_tuning", True):
        return NoPETemperature(attn_scale=_get(config, "attn_scale", 0.1),
                               floor_scale=_get(config, "floor_scale", 8192), float32=True), kwargs
    return NoPE(), kwargs


def smollm3_layer(config: dict, layer_idx: int):
    """``(scheme, layer_kwargs)`` of layer ``layer_idx`` of a SmolLM3 config (``SmolLM3Config``).

    RoPE layers: ``Rotary(layout="half", scaling=rope_parameters)`` (HF's ``rotate_half``); NoPE layers:
    ``NoPE()``. No temperature, no chunks. ``use_sliding_window`` (a window on the NoPE layers) is not
    modelled and raises ``ValueError``. Call the layer with ``causal=True``.
    """
    if _get(config, "use_sliding_window", False):
        raise ValueError("config['use_sliding_window'] is true: SmolLM3's sliding window on NoPE layers is not "
                         "modelled by MultiHeadAttention")
    rope = use_rope(config, layer_idx)
    return (_rotary(config, "half") if rope else NoPE()), _layer_kwargs(config)


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

    def __repr__(self) -> str:
        f32 = ", float32=True" if self.float32 else ""
        return f"NoPETemperature(attn_scale={self.attn_scale}, floor_scale={self.floor_scale:g}{f32})"
