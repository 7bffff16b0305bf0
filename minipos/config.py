"""What a model does with positions, read from its own config.json.

``read(config)`` takes a checkpoint's config (a path to its ``config.json``, the dict, or a
transformers config object, read through its ``to_dict()``: minipos never imports transformers)
and returns a ``Model``: ``.layers``, one attention layer per decoder layer, built as the model
builds it (heads, key/value heads, head dim, the scheme and its parameters, the window, the chunks,
the sinks, the scale, the per-head q/k norms), ``.vision`` (the vision tower's attention layers,
a ``Model`` of its own, for the towers with 2-D RoPE below; else ``None``) and ``.describe()``, the
per-layer table (the tower's after the decoder's). Layers are built when first indexed, so reading the
config of a 70B model allocates nothing; each is then an ordinary minipos layer, with random
weights to be replaced by the checkpoint's (``wq``, ``wk``, ``wv``, ``wo`` and biases; the MLA
layer's as ``minipos.mla`` names them; ``q_norm``, ``k_norm`` of ``minipos.qk_norm``), called as
``layer(x, positions=p, causal=True)`` with ``p`` ``(T,)``, or ``(3, T)`` for M-RoPE.

The families read (``model_type``; transformers 5.24 defines what each key means):

==============================  ====================================================================
model_type                      what the reader builds
==============================  ====================================================================
llama                           RoPE (half layout), any ``rope_type`` below, GQA, ``attention_bias``
mistral, phi3                   the same; ``sliding_window`` on every layer when set; Phi-3's
                                ``partial_rotary_factor`` and LongRoPE
qwen2, qwen3                    the same, q/k/v biases (Qwen2), per-head q/k RMSNorm (Qwen3),
                                sliding layers from ``layer_types`` / ``max_window_layers``
gemma3_text (gemma3)            local layers: window and ``rope_parameters["sliding_attention"]``;
                                global: ``rope_parameters["full_attention"]``; scale
                                ``query_pre_attn_scalar ** -0.5``; q/k norm with Gemma's ``1 + w``
cohere2                         sliding layers: interleaved RoPE and a window; full layers: NoPE
smollm3                         NoPE every ``no_rope_layers[i] == 0`` layer, RoPE elsewhere
llama4_text (llama4)            iRoPE: chunked RoPE layers (interleaved, with the L2 q/k norm) and
                                NoPE layers with the attention temperature
gpt_oss                         sinks, biases, alternating sliding/full layers, YaRN
deepseek_v3                     multi-head latent attention with decoupled RoPE (``rope_interleave``)
deepseek_v2                     the same, always interleaved (complex pairs); ``q_lora_rank`` null: a full
                                ``wq`` (DeepSeek-V2-Lite)
deepseek_v32                    the same, plus each layer's indexer (``spec.indexer``: heads, head dim, top-k,
                                the frequencies of its half-layout RoPE on the first ``qk_rope_head_dim``
                                features, as ``minipos.dsa`` takes them); its picks are the layer's ``mask``
ministral3 (mistral3)           Mistral's RoPE layers, each query then scaled by ``llama_4_scaling_beta``:
                                1 + beta ln(1 + floor(p / original_max_position_embeddings))
qwen2_vl (qwen2_vl_text)        M-RoPE with ``mrope_section``: positions ``(3, T)``
vision_config: pixtral          ``.vision``: 2-D RoPE (``minipos.axial``, ``"pixtral"`` layout), bidirectional,
(mistral3, llava; or alone)     positions ``(2, T)`` (rows, then columns), no biases
vision_config:                  ``.vision``: 2-D RoPE in the ``"llama4"`` layout, positions from 1 and the
llama4_vision_model (llama4)    class token last at (0, 0); biases on q, k, v, o
==============================  ====================================================================

Conventions. Every ``rope_type`` of ``minipos.rope_scaling`` is read (``default``, ``linear``,
``dynamic``, ``yarn``, ``llama3``, ``longrope``), from transformers 5's ``rope_parameters`` (flat,
or nested per layer type) or transformers 4's ``rope_theta`` + ``rope_scaling``. The sliding window
is the model's own: HF's rule, the query at ``i`` sees keys ``i - W < j <= i`` (W keys, its own
included). Keys the config leaves out take the defaults of the family's transformers config class.
A key the reader does not understand raises ``ValueError`` naming the key and the model type, never
a silent default: an unknown ``model_type`` or ``rope_type``, a key of ``rope_parameters`` that its
type does not take, a setting no minipos layer models (Gemma 2's logit soft-capping, say). Schemes
minipos does not have yet (``rope_type`` ``"proportional"``, interleaved M-RoPE) raise ``ValueError``
saying "not supported yet"; another vision tower is named in ``.notes`` and ``.vision`` is ``None``.
Docs: "What does my model do with positions?" (``docs/my-model.md``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Callable

from . import safe_io
from ._checks import check_float
from ._config_types import FamilyConfig as _Config, LayerSpec, Model
from .axial import AxialRotary
from .irope import llama4_layer, smollm3_layer
from .layer import MultiHeadAttention
from .local_global import gemma3_attention, gemma3_layer_types, gemma3_rope_parameters
from .mla import DecoupledRotary, MultiHeadLatentAttention
from .mrope import MRotary
from .qk_norm import QKNormAttention
from .query_scale import ScaledQueryRotary
from .rope import rope_inv_freq
from .rope_scaling import REGISTRY, Rotary
from .seams import NoPE

__all__ = ["read", "Model", "LayerSpec", "FAMILIES", "NOT_YET"]

ROPE_TYPES = ("default", *REGISTRY)
"""The ``rope_type`` values the reader builds (``ntk`` is minipos's name for static NTK; HF has none)."""

NOT_YET = {
    "proportional": "proportional RoPE (p-RoPE: only a fraction of the frequencies rotate)",
    "mrope_interleaved": "interleaved M-RoPE (Qwen3-VL and later)",
    "qwen3_vl": "interleaved M-RoPE (Qwen3-VL and later)", "qwen3_vl_moe": "interleaved M-RoPE (Qwen3-VL MoE)",
    "glm4v": "GLM-4.xV's M-RoPE layout", "glm4v_moe": "GLM-4.xV's M-RoPE layout",
    "ernie4_5_vl": "ERNIE-4.5-VL's M-RoPE layout",
    "gemma3n": "Gemma 3n's position machinery",
}
"""Machinery minipos does not have yet, by the key or ``model_type`` that asks for it."""


# --------------------------------------------------------------------------- RoPE parameters

LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def _rope_type(c: _Config, params: dict) -> str:
    """Pop and check ``params``' ``rope_type`` (older: ``type``): one minipos builds, or ``ValueError``
    naming it (and saying "not supported yet" for a scheme minipos does not have yet)."""
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind == "mrope":                                                    # Qwen2-VL's hub config: default + sections
        kind = "default"
    for key in ("mrope_interleaved",):
        if params.get(key):
            raise c.error(f"config['rope_parameters'][{key!r}] asks for {NOT_YET[key]}, which minipos does "
                          "not support yet")
    if params.get("llama_4_scaling_beta") is not None and c.model_type not in QUERY_SCALED:
        raise c.error("config['rope_parameters']['llama_4_scaling_beta'] is read by transformers' "
                      f"{' and '.join(QUERY_SCALED)} only, not by this family")
    if kind == "proportional":
        raise c.error("config['rope_parameters']['rope_type'] = 'proportional' asks for "
                      f"{NOT_YET['proportional']}, which minipos does not support yet")
    if kind not in ROPE_TYPES:
        raise c.error(f"config['rope_parameters']['rope_type'] = {kind!r} is not a RoPE type minipos knows "
                      f"({', '.join(ROPE_TYPES)})")
    return kind


def rope_parameters(c: _Config, layer_type: str | None = None) -> dict:
    """The RoPE parameters of a layer type, with ``rope_theta`` and every top-level key HF reads
    into them (``partial_rotary_factor``; LongRoPE's ``max_position_embeddings``; the original
    length of ``dynamic``, ``yarn``, ``llama3``, ``longrope``); ``rope_type`` checked."""
    found = c.data.get("rope_parameters")
    if found is None:                                                      # transformers 4
        scaling = c.data.get("rope_scaling") or {}
        if not isinstance(scaling, dict):
            raise TypeError(f"model_type {c.model_type!r}: config['rope_scaling'] must be a dict or null")
        params = dict(scaling)
        if "rope_theta" not in params:
            params["rope_theta"] = c.get("rope_theta", required=True)
    else:
        if not isinstance(found, dict):
            raise TypeError(f"model_type {c.model_type!r}: config['rope_parameters'] must be a dict")
        if found and all(k in LAYER_TYPES for k in found):              # nested per layer type (transformers 5)
            if layer_type not in found:
                raise c.error(f"config['rope_parameters'] has no entry for layer type {layer_type!r} "
                              f"(it has {sorted(found)})")
            found = found[layer_type]
        params = dict(found)
        params.setdefault("rope_theta", c.get("rope_theta", required=True))
    kind = _rope_type(c, params)
    if c.has("partial_rotary_factor") and "partial_rotary_factor" not in params:
        params["partial_rotary_factor"] = c.get("partial_rotary_factor")
    if params.get("partial_rotary_factor") == 1.0:
        params.pop("partial_rotary_factor")
    if kind in ("yarn", "llama3", "longrope"):                             # HF: the top-level copy first (Phi-3)
        if c.has("original_max_position_embeddings"):
            params["original_max_position_embeddings"] = c.get("original_max_position_embeddings")
        params.setdefault("original_max_position_embeddings", c.get("max_position_embeddings", required=True))
    if kind == "dynamic":
        params.setdefault("original_max_position_embeddings", c.get("max_position_embeddings", required=True))
    if kind == "longrope":
        params.setdefault("max_position_embeddings", c.get("max_position_embeddings", required=True))
    return {"rope_type": kind, **params}


def _rotary(c: _Config, params: dict, layout: str) -> Callable:
    """A function making the ``Rotary`` of ``params``; built once now, so a bad key raises here."""
    params = {k: v for k, v in params.items() if k != "mrope_section"}
    try:
        Rotary(layout=layout, scaling=dict(params))
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    return lambda: Rotary(layout=layout, scaling=dict(params))


def _describe_rope(params: dict, layout: str) -> str:
    kind, theta = params["rope_type"], params["rope_theta"]
    text = f"RoPE {layout}, theta {theta:g}"
    if kind != "default":
        extra = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta", "partial_rotary_factor")}
        shown = ", ".join(f"{k}={_short(v)}" for k, v in extra.items())
        text += f", {kind}({shown})"
    if "partial_rotary_factor" in params:
        text += f", partial {params['partial_rotary_factor']:g}"
    return text


def _short(v) -> str:
    if isinstance(v, list):
        return f"[{len(v)} values]" if len(v) > 3 else str(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- the families

def _sizes(c: _Config) -> dict:
    d_model = c.int("hidden_size", required=True)
    heads = c.int("num_attention_heads", required=True)
    kv = c.int("num_key_value_heads") or heads
    head_dim = c.int("head_dim")
    if head_dim is None:
        if d_model % heads:
            raise c.error(f"hidden_size ({d_model}) is not a multiple of num_attention_heads ({heads}); "
                          "give head_dim")
        head_dim = d_model // heads
    return {"d_model": d_model, "num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim}


def _layer_types(c: _Config, rule: Callable[[int], str], allowed=("full_attention", "sliding_attention")) -> list:
    """``config["layer_types"]`` (checked), else ``rule(i)`` for each layer (the config class's own)."""
    n = c.int("num_hidden_layers", required=True)
    types = c.data.get("layer_types")
    if types is None:
        return [rule(i) for i in range(n)]
    if not isinstance(types, list) or len(types) != n:
        raise c.error(f"config['layer_types'] must list one type per layer (num_hidden_layers = {n})")
    for t in types:
        if t not in allowed:
            raise c.error(f"config['layer_types'] holds {t!r}; this family's layers are {list(allowed)}")
    return list(types)


def _refuse(c: _Config, keys) -> None:
    """Raise for a key that is set (true, or a value) but that no minipos layer models."""
    for key in keys:
        if c.data.get(key):
            raise c.error(f"config[{key!r}] = {c.data[key]!r} is not modelled by minipos' attention layers")


def _window(c: _Config, kind: str):
    return c.int("sliding_window", required=True) if kind == "sliding_attention" else None


def _dense(c: _Config, *, bias: str, window: str, qk_norm: bool = False, mrope: bool = False) -> list:
    """Llama-like families: ``bias`` "attention_bias" / "qkv" (q, k, v only) / "none"; ``window``
    "all" (every layer when ``sliding_window`` is set) or "types" (``layer_types``)."""
    sizes, specs = _sizes(c), []
    n = c.int("num_hidden_layers", required=True)
    if window == "none":
        types = ["full_attention"] * n
    elif window == "all":
        types = ["sliding_attention" if c.has("sliding_window") else "full_attention"] * n
    else:
        use = c.flag("use_sliding_window", False) and c.has("sliding_window")
        start = c.int("max_window_layers") if use else None
        types = _layer_types(c, lambda i: "sliding_attention" if use and i >= start else "full_attention")
    with_bias = {"attention_bias": c.flag("attention_bias", False), "qkv": True, "none": False}[bias]
    for i, kind in enumerate(types):
        params = rope_parameters(c)
        kwargs = {**sizes, "bias": with_bias, "sliding_window": _window(c, kind)}
        notes = []
        if mrope:
            if params["rope_type"] != "default" or set(params) - {"rope_type", "rope_theta", "mrope_section"}:
                raise c.error(f"M-RoPE with rope_parameters {sorted(set(params) - {'rope_type'})} and rope_type "
                              f"{params['rope_type']!r}: minipos' MRotary takes mrope_section and rope_theta only")
            section = list(params.get("mrope_section", [16, 24, 24]))             # HF's default
            theta = params["rope_theta"]
            try:
                MultiHeadAttention(scheme=MRotary(mrope_section=section, base=theta), **{**sizes, "d_model": 1,
                                   "num_heads": 1, "num_kv_heads": 1})
            except (ValueError, TypeError) as err:
                raise c.error(f"rope_parameters['mrope_section']: {err}") from None
            scheme, position = (lambda s=section, t=theta: MRotary(mrope_section=s, base=t)), \
                f"M-RoPE half, theta {theta:g}, sections {section} (t, h, w); positions (3, T)"
        else:
            scheme, position = _rotary(c, params, "half"), _describe_rope(params, "half")
        cls = MultiHeadAttention
        if qk_norm:
            cls, kwargs["norm_eps"] = QKNormAttention, float(c.get("rms_norm_eps", 1e-6))
            notes.append("q/k RMSNorm per head (q_norm, k_norm)")
        if bias == "qkv":
            notes.append("biases on q, k, v only")
        specs.append(LayerSpec(i, kind, cls, kwargs, scheme, position, ("bo",) if bias == "qkv" else (),
                               tuple(notes)))
    return specs


def _llama(c):
    return _dense(c, bias="attention_bias", window="none")


def _mistral(c):
    return _dense(c, bias="none", window="all")


def _phi3(c):
    for key in ("rope_scaling", "rope_parameters"):             # Phi3Config: the older names of LongRoPE
        params = c.data.get(key)
        if isinstance(params, dict) and (params.get("rope_type") or params.get("type")) in ("su", "yarn"):
            c.data = {**c.data, key: {**{k: v for k, v in params.items() if k != "type"}, "rope_type": "longrope"}}
    return _dense(c, bias="none", window="all")


def _qwen2(c):
    return _dense(c, bias="qkv", window="types")


def _qwen3(c):
    return _dense(c, bias="attention_bias", window="types", qk_norm=True)


def _qwen2_vl(c):
    return _dense(c, bias="qkv", window="types", mrope=True)


def _wrap(c: _Config, build):
    """``build()`` with its ValueError/TypeError prefixed by the model type (from minipos' own readers)."""
    try:
        return build()
    except (ValueError, TypeError) as err:
        if str(err).startswith("model_type"):
            raise
        raise type(err)(f"model_type {c.model_type!r}: {err}") from None


def _gemma3(c):
    _refuse(c, ("attn_logit_softcapping", "use_bidirectional_attention"))
    data = {**c.defaults, **{k: v for k, v in c.data.items() if v is not None}}   # Gemma3TextConfig's defaults
    if data.get("rope_parameters") is not None and not set(data["rope_parameters"]) & set(LAYER_TYPES):
        flat = dict(data["rope_parameters"])                                 # one dict for both layer types
        data["rope_parameters"] = {"full_attention": flat, "sliding_attention": flat}
    specs = []
    for i in range(c.int("num_hidden_layers", required=True)):
        kind = _wrap(c, lambda: gemma3_layer_types(data))[i]
        params = _wrap(c, lambda: gemma3_rope_parameters(data, kind))
        params = {"rope_type": _rope_type(c, params), **params}
        _, kwargs = _wrap(c, lambda: gemma3_attention({**data, "rope_parameters": {kind: params}}, i))
        kwargs = {**kwargs, "norm_eps": float(c.get("rms_norm_eps", 1e-6)), "norm_offset": 1.0}
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, _rotary(c, params, "half"),
                               _describe_rope(params, "half"), (), ("q/k RMSNorm per head, weight 1 + w",)))
    return specs


def _cohere2(c):
    pattern = c.int("sliding_window_pattern") or 4
    types = _layer_types(c, lambda i: "sliding_attention" if (i + 1) % pattern else "full_attention")
    sizes, specs = _sizes(c), []
    for i, kind in enumerate(types):
        kwargs = {**sizes, "bias": c.flag("attention_bias", False), "sliding_window": _window(c, kind)}
        if kind == "sliding_attention":
            params = rope_parameters(c)
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, _rotary(c, params, "interleaved"),
                                   _describe_rope(params, "interleaved")))
        else:
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, NoPE, "NoPE (no rotation)"))
    return specs


def _smollm3(c):
    n = c.int("num_hidden_layers", required=True)
    specs = []
    for i in range(n):
        scheme, kwargs = _wrap(c, lambda: smollm3_layer(dict(c.data), i))
        if isinstance(scheme, Rotary):
            params = rope_parameters(c)
            specs.append(LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, _rotary(c, params, "half"),
                                   _describe_rope(params, "half")))
        else:
            specs.append(LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, NoPE, "NoPE (no_rope_layers)"))
    return specs


def _llama4(c):
    n = c.int("num_hidden_layers", required=True)
    qk_norm = c.flag("use_qk_norm", True)
    specs = []
    for i in range(n):
        scheme, kwargs = _wrap(c, lambda: llama4_layer(dict(c.data), i))
        kind = "chunked_attention" if kwargs["attention_chunk"] else "full_attention"
        if isinstance(scheme, Rotary):
            params = rope_parameters(c)
            make = _rotary(c, params, "interleaved")
            if params["rope_type"] in ("yarn", "longrope") and qk_norm:
                raise c.error(f"use_qk_norm with rope_type {params['rope_type']!r}: its attention factor makes the L2 "
                              "norm after RoPE differ from the norm before it, which is the one minipos models")
            notes, cls = (), MultiHeadAttention
            if qk_norm:                      # L2 norm without weight, after RoPE = before it (rotations keep RMS)
                cls, kwargs = QKNormAttention, {**kwargs, "norm_eps": float(c.get("rms_norm_eps", 1e-5))}
                notes = ("L2 q/k norm per head (no weight: q_norm = k_norm = 1)",)
            specs.append(LayerSpec(i, kind, cls, kwargs, make, _describe_rope(params, "interleaved"), (), notes))
        elif type(scheme) is NoPE:
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, NoPE, "NoPE"))
        else:
            t = (scheme.attn_scale, scheme.floor_scale)
            specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs,
                                   lambda t=t, cls=type(scheme): cls(attn_scale=t[0], floor_scale=t[1], float32=True),
                                   f"NoPE, temperature 1 + {t[0]:g} log1p(floor((i+1)/{t[1]:g}))"))
    return specs


def _gpt_oss(c):
    types = _layer_types(c, lambda i: "sliding_attention" if i % 2 == 0 else "full_attention")
    sizes, specs = _sizes(c), []
    for i, kind in enumerate(types):
        params = rope_parameters(c)
        kwargs = {**sizes, "bias": c.flag("attention_bias", True), "sinks": True, "sliding_window": _window(c, kind)}
        specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, _rotary(c, params, "half"),
                               _describe_rope(params, "half")))
    return specs


def _mla(c: _Config, layout: str, q_lora_rank) -> tuple:
    """The MLA layers of the DeepSeek families (``minipos.mla``): ``(specs, rope parameters)``."""
    n = c.int("num_hidden_layers", required=True)
    params = rope_parameters(c)
    scaling = None if params["rope_type"] == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
    theta = params["rope_theta"]

    def make():
        return DecoupledRotary(layout=layout, base=theta, scaling=None if scaling is None else dict(scaling))
    try:
        make()
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    if q_lora_rank is not None and (isinstance(q_lora_rank, bool) or not isinstance(q_lora_rank, int)
                                    or q_lora_rank < 1):
        raise c.error(f"config['q_lora_rank'] must be an integer >= 1 or null, got {q_lora_rank!r}")
    kwargs = {"d_model": c.int("hidden_size", required=True), "num_heads": c.int("num_attention_heads", required=True),
              "kv_lora_rank": c.int("kv_lora_rank", required=True), "q_lora_rank": q_lora_rank,
              "qk_nope_head_dim": c.int("qk_nope_head_dim", required=True),
              "qk_rope_head_dim": c.int("qk_rope_head_dim", required=True),
              "v_head_dim": c.int("v_head_dim", required=True), "bias": c.flag("attention_bias", False)}
    position = f"MLA: RoPE {layout} on the last {kwargs['qk_rope_head_dim']} features of each head, " + \
        _describe_rope(params, layout).split(", ", 1)[1]
    specs = [LayerSpec(i, "full_attention", MultiHeadLatentAttention, kwargs, make, position) for i in range(n)]
    return specs, params


def _deepseek_v3(c):
    return _mla(c, "interleaved" if c.flag("rope_interleave", True) else "half", c.int("q_lora_rank"))[0]


def _deepseek_v2(c):
    # DeepseekV2Attention's apply_rotary_emb: complex pairs (2i, 2i + 1), no rope_interleave key. q_lora_rank:
    # null in a config.json means no query LoRA (DeepSeek-V2-Lite), absent means the class's 1536.
    return _mla(c, "interleaved", c.data["q_lora_rank"] if "q_lora_rank" in c.data else c.defaults["q_lora_rank"])[0]


def _deepseek_v32(c):
    # DeepseekV32Attention: MLA rotated interleaved (apply_rotary_pos_emb_interleave, always), plus the indexer.
    if "q_lora_rank" in c.data and c.data["q_lora_rank"] is None:       # the indexer's query reads the query latent
        raise c.error("config['q_lora_rank'] is null; DeepSeek-V3.2's indexer needs the query latent (an integer)")
    q_lora_rank = c.int("q_lora_rank", required=True)
    specs, params = _mla(c, "interleaved", q_lora_rank)
    rope_dim, kind = c.int("qk_rope_head_dim", required=True), params["rope_type"]
    heads, head_dim, topk = c.int("index_n_heads"), c.int("index_head_dim"), c.int("index_topk")
    if rope_dim > head_dim:
        raise c.error(f"qk_rope_head_dim ({rope_dim}) is more than index_head_dim ({head_dim}): the indexer rotates "
                      "its first qk_rope_head_dim features")
    if kind in ("dynamic", "longrope"):
        raise c.error(f"rope_type {kind!r} changes the frequencies with the length; the indexer's keys are cached "
                      "rotated, which minipos models for fixed frequencies only")
    args = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}
    inv_freq, factor = (rope_inv_freq(rope_dim, base=params["rope_theta"]), 1.0) if kind == "default" else \
        REGISTRY[kind](rope_dim, base=params["rope_theta"], **args)
    indexer = {"num_heads": heads, "head_dim": head_dim, "rope_dim": rope_dim, "topk": topk,
               "inv_freq": inv_freq, "attention_factor": factor}
    note = (f"indexer: {heads} heads x {head_dim}, RoPE half on the first {rope_dim} features (minipos.dsa, "
            "spec.indexer); pass its picks as the layer's mask")
    return [replace(s, indexer=indexer, notes=(note,)) for s in specs]


QUERY_SCALED = ("ministral3", "mistral4")
"""The families whose attention multiplies its queries by ``llama_4_scaling_beta``'s scale (``minipos.query_scale``)."""


def _query_scale(c: _Config, params: dict) -> dict:
    """``ScaledQueryRotary``'s ``beta`` and ``original_max_position_embeddings``, popped from ``params`` with
    the ``max_position_embeddings`` HF's config class leaves there and ignores (except for LongRoPE)."""
    beta = params.pop("llama_4_scaling_beta", None)
    if params["rope_type"] != "longrope":
        params.pop("max_position_embeddings", None)
    if beta is None:
        raise c.error("config['rope_parameters']['llama_4_scaling_beta'] is required: transformers multiplies each "
                      "query by 1 + beta ln(1 + floor(p / original_max_position_embeddings)) with it")
    length = params.get("original_max_position_embeddings")
    if length is None:
        raise c.error("config['rope_parameters']['original_max_position_embeddings'] is required: it divides the "
                      "position in the query scale of llama_4_scaling_beta")
    if params["rope_type"] in ("default", "linear"):                       # read by the query scale only
        params.pop("original_max_position_embeddings")
    beta = _wrap(c, lambda: check_float(beta, "config['rope_parameters']['llama_4_scaling_beta']", minimum=0.0))
    return {"beta": beta, "original_max_position_embeddings": length}


def _ministral3(c):
    if c.data.get("rope_parameters") is None and c.data.get("rope_scaling") is None:   # the class's default
        c.data = {**c.data, "rope_parameters": dict(c.defaults["rope_parameters"])}
    params = rope_parameters(c)
    scale = _query_scale(c, params)
    try:
        ScaledQueryRotary(layout="half", scaling=dict(params), **scale)
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    c.data = {**c.data, "rope_parameters": params}                          # what the RoPE itself reads
    position = (f"{_describe_rope(params, 'half')}; queries x (1 + {scale['beta']:g} "
                f"ln(1 + floor(p/{scale['original_max_position_embeddings']})))")
    return [replace(s, scheme=lambda: ScaledQueryRotary(layout="half", scaling=dict(params), **scale),
                    position=position) for s in _dense(c, bias="none", window="all")]


_MINISTRAL3_ROPE = {"rope_type": "yarn", "rope_theta": 1_000_000.0, "factor": 16.0, "original_max_position_embeddings":
                    16384, "beta_fast": 32.0, "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                    "llama_4_scaling_beta": 0.1}
"""``Ministral3Config``'s ``rope_parameters`` when a config gives none."""


@dataclass(frozen=True)
class Family:
    """A family the reader knows: the function from a ``_Config`` to the layer specs, and the
    defaults of its transformers config class for keys a config.json may leave out."""

    read: Callable
    defaults: dict


_LLAMA_DEFAULTS = {"rope_theta": 10000.0, "max_position_embeddings": 2048}
FAMILIES = {
    "llama": Family(_llama, _LLAMA_DEFAULTS),
    "mistral": Family(_mistral, {"rope_theta": 10000.0, "max_position_embeddings": 131072}),
    "phi3": Family(_phi3, {"rope_theta": 10000.0, "max_position_embeddings": 4096}),
    "qwen2": Family(_qwen2, {"rope_theta": 10000.0, "max_position_embeddings": 32768, "max_window_layers": 28}),
    "qwen3": Family(_qwen3, {"rope_theta": 10000.0, "max_position_embeddings": 32768, "max_window_layers": 28,
                             "head_dim": 128}),
    "gemma3_text": Family(_gemma3, {"rope_theta": 1_000_000.0, "num_attention_heads": 8, "num_key_value_heads": 4,
                                    "head_dim": 256, "rms_norm_eps": 1e-6, "max_position_embeddings": 131072}),
    "cohere2": Family(_cohere2, {"rope_theta": 10000.0, "max_position_embeddings": 8192}),
    "smollm3": Family(_smollm3, {"rope_theta": 2_000_000.0, "max_position_embeddings": 32768}),
    "llama4_text": Family(_llama4, {"rope_theta": 500_000.0, "max_position_embeddings": 131072, "head_dim": 128}),
    "gpt_oss": Family(_gpt_oss, {"rope_theta": 150_000.0, "max_position_embeddings": 131072, "head_dim": 64,
                                 "sliding_window": 128}),
    "deepseek_v3": Family(_deepseek_v3, {"rope_theta": 10000.0, "max_position_embeddings": 4096}),
    "deepseek_v2": Family(_deepseek_v2, {"rope_theta": 10000.0, "max_position_embeddings": 2048, "kv_lora_rank": 512,
                                         "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                                         "v_head_dim": 128}),
    "deepseek_v32": Family(_deepseek_v32, {"rope_theta": 10000.0, "max_position_embeddings": 163840,
                                           "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                                           "qk_rope_head_dim": 64, "v_head_dim": 128, "index_topk": 2048,
                                           "index_head_dim": 128, "index_n_heads": 64}),
    "ministral3": Family(_ministral3, {"rope_theta": 10000.0, "max_position_embeddings": 262144, "head_dim": 128,
                                      "rope_parameters": _MINISTRAL3_ROPE}),
    "qwen2_vl_text": Family(_qwen2_vl, {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
                                        "max_window_layers": 80}),
}
"""``model_type`` -> ``Family``. A multimodal config (``gemma3``, ``llama4``, ``qwen2_vl``) is read
through its ``text_config`` (or, as Qwen2-VL's hub files have it, its top level)."""

TEXT_OF = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen2_vl": "qwen2_vl_text"}


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


VISION = {
    "pixtral": Family(_pixtral_vision, {"hidden_size": 1024, "num_attention_heads": 16, "num_hidden_layers": 24,
                                        "image_size": 1024, "patch_size": 16, "rope_theta": 10000.0}),
    "llama4_vision_model": Family(_llama4_vision, {"hidden_size": 768, "num_attention_heads": 16,
                                                   "num_hidden_layers": 34, "image_size": 448, "patch_size": 14,
                                                   "rope_theta": 10000.0}),
}
"""``vision_config['model_type']`` -> ``Family``: the vision towers with 2-D RoPE the reader builds (``.vision``)."""


def _read_vision(vision: dict) -> Model:
    model_type = vision.get("model_type")
    c = _Config(vision, model_type, VISION[model_type].defaults)
    return Model(model_type, vision, VISION[model_type].read(c), kind="vision encoder")


# --------------------------------------------------------------------------- read

def _as_dict(config) -> dict:
    """A config as a dict: a path to a JSON file, a dict, or an object with ``to_dict()``."""
    if isinstance(config, (str, os.PathLike)):
        data = safe_io.read_json(config)
        if not isinstance(data, dict):
            raise ValueError(f"config: {os.fspath(config)!r} holds a JSON {type(data).__name__}, not an object")
        return data
    if isinstance(config, Mapping):
        return json.loads(json.dumps(dict(config)))                       # a deep copy, JSON values only
    to_dict = getattr(config, "to_dict", None)
    if callable(to_dict):
        data = to_dict()
        if isinstance(data, Mapping):
            return json.loads(json.dumps(dict(data), default=str))
    raise TypeError(f"config must be a path to a config.json, a dict, or a transformers config object (with "
                    f"to_dict()), got {type(config).__name__}")


def read(config) -> Model:
    """The position machinery of the model ``config`` describes (module docstring): a ``Model``.

    config: a path to a ``config.json``, its dict, or a transformers config object (duck-typed:
    anything with ``to_dict()``). Raises ``ValueError`` naming the key and the model type for
    anything it does not understand or minipos does not model, ``TypeError`` for a value of the
    wrong type, ``OSError`` for a file it cannot read.
    """
    data = _as_dict(config)
    outer = data.get("model_type")
    if not isinstance(outer, str):
        raise ValueError(f"config['model_type'] is required (a string such as 'llama'), got {outer!r}")
    notes = []
    text, model_type = data, outer
    if outer in TEXT_OF or isinstance(data.get("text_config"), dict):
        if isinstance(data.get("text_config"), dict):
            text = data["text_config"]
        model_type = text.get("model_type") or TEXT_OF.get(outer, outer)
        if outer in TEXT_OF and model_type == outer:
            model_type = TEXT_OF[outer]
    if outer in VISION:                                                    # a vision encoder's own config
        return _read_vision(data)
    vision = data.get("vision_config")
    if isinstance(vision, dict) and vision.get("model_type") not in VISION:
        notes.append(f"the vision tower ({vision.get('model_type', 'vision_config')}) is not read (minipos reads "
                     f"those of {', '.join(VISION)}); .vision is None")
    for key in (outer, model_type):
        if key in NOT_YET:
            raise ValueError(f"model_type {key!r} needs {NOT_YET[key]}, which minipos does not support yet")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not a family minipos reads; it reads "
                         f"{', '.join(sorted(FAMILIES))} (and {', '.join(sorted(TEXT_OF))} through their text config)")
    c = _Config(text, model_type, FAMILIES[model_type].defaults)
    specs = FAMILIES[model_type].read(c)
    tower = _read_vision(vision) if isinstance(vision, dict) and vision.get("model_type") in VISION else None
    return Model(model_type, text, specs, notes, tower)
