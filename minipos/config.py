"""What a model does with positions, read from its own config.json.

``read(config)`` takes a checkpoint's config (a path to its ``config.json``, the dict, or a
transformers config object, read through its ``to_dict()``: minipos never imports transformers)
and returns a ``Model``: ``.layers``, one attention layer per decoder layer, built as the model
builds it (heads, key/value heads, head dim, the scheme and its parameters, the window, the chunks,
the sinks, the scale, the per-head q/k norms), ``.vision`` (``None``: vision towers are not read
yet) and ``.describe()``, the per-layer table. Layers are built when first indexed, so reading the
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
gemma4_text (gemma4)            sliding layers: window, ``rope_parameters["sliding_attention"]``; full layers:
                                p-RoPE (``"proportional"``), ``global_head_dim``, and under
                                ``attention_k_eq_v`` ``num_global_key_value_heads`` and values = keys'
                                projection; q/k norm (weight w), weightless value norm, scale 1;
                                ``num_kv_shared_layers`` > 0 (Gemma 4 E2B, E4B) is refused
cohere2                         sliding layers: interleaved RoPE and a window; full layers: NoPE
exaone4                         sliding layers: RoPE and a window; full layers: NoPE (every layer RoPE
                                without ``sliding_window``); per-head q/k RMSNorm
smollm3                         NoPE every ``no_rope_layers[i] == 0`` layer, RoPE elsewhere
llama4_text (llama4)            iRoPE: chunked RoPE layers (interleaved, with the L2 q/k norm) and
                                NoPE layers with the attention temperature
gpt_oss                         sinks, biases, alternating sliding/full layers, YaRN
deepseek_v3                     multi-head latent attention with decoupled RoPE (``rope_interleave``)
qwen2_vl (qwen2_vl_text)        M-RoPE with ``mrope_section``: positions ``(3, T)``
glm4v_text (glm4v)              split M-RoPE (default [8, 12, 12]) on the first ``head_dim *
                                partial_rotary_factor`` features, pairs (2i, 2i + 1); q/k/v biases
glm4v_moe_text (glm4v_moe)      the same in the half layout, ``partial_rotary_factor`` default 0.5
qwen3_vl_text (qwen3_vl)        interleaved M-RoPE (T H W T H W ..., ``mrope_section``, default [24, 20, 20];
                                HF interleaves whatever ``mrope_interleaved`` says), Qwen3's q/k norm
qwen3_vl_moe_text               the same (Qwen3-VL MoE, read through ``qwen3_vl_moe``)
==============================  ====================================================================

Conventions. Every ``rope_type`` of ``minipos.rope_scaling`` is read (``default``, ``linear``,
``dynamic``, ``yarn``, ``llama3``, ``longrope``), and ``proportional`` (p-RoPE, ``minipos.prope``), from transformers 5's ``rope_parameters`` (flat,
or nested per layer type) or transformers 4's ``rope_theta`` + ``rope_scaling``. The sliding window
is the model's own: HF's rule, the query at ``i`` sees keys ``i - W < j <= i`` (W keys, its own
included). Keys the config leaves out take the defaults of the family's transformers config class.
A key the reader does not understand raises ``ValueError`` naming the key and the model type, never
a silent default: an unknown ``model_type`` or ``rope_type``, a key of ``rope_parameters`` that its
type does not take, a setting no minipos layer models (Gemma 2's logit soft-capping, say). Schemes
minipos does not have yet (ERNIE-4.5-VL's M-RoPE, 2-D / axial RoPE,
DeepSeek-V3.2's indexer) raise ``ValueError`` saying "not supported yet". Docs: "What does my model
do with positions?" (``docs/my-model.md``).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Callable

from . import safe_io, terminal
from .irope import llama4_layer, smollm3_layer
from .layer import MultiHeadAttention
from .local_global import gemma3_attention, gemma3_layer_types, gemma3_rope_parameters
from .mla import DecoupledRotary, MultiHeadLatentAttention
from .mrope import MRotary
from .prope import ProportionalRotary
from .qk_norm import QKNormAttention
from .rope_scaling import REGISTRY, Rotary
from .seams import NoPE

__all__ = ["read", "Model", "LayerSpec", "FAMILIES", "NOT_YET"]

ROPE_TYPES = ("default", *REGISTRY)
"""The ``rope_type`` values the reader builds (``ntk`` is minipos's name for static NTK; HF has none)."""

NOT_YET = {
    "mrope_interleaved": "interleaved M-RoPE in a family whose M-RoPE is split (Qwen3-VL's is read: qwen3_vl)",
    "ernie4_5_vl_moe": "ERNIE-4.5-VL's M-RoPE layout",
    "ernie4_5_vl": "ERNIE-4.5-VL's M-RoPE layout", "pixtral": "2-D / axial RoPE (Pixtral's vision encoder)",
    "deepseek_v32": "DeepSeek-V3.2's indexer RoPE", "gemma3n": "Gemma 3n's position machinery",
    "llama_4_scaling_beta": "the position-dependent query scale of llama_4_scaling_beta (Ministral 3)",
}
"""Machinery minipos does not have yet, by the key or ``model_type`` that asks for it."""


class _Config:
    """A text config dict with its family's defaults; every error names the key and the model type."""

    def __init__(self, data: dict, model_type: str, defaults: Mapping):
        self.data, self.model_type, self.defaults = data, model_type, defaults

    def error(self, message: str) -> ValueError:
        return ValueError(f"model_type {self.model_type!r}: {message}")

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def get(self, key: str, default=None, *, required: bool = False):
        """``config[key]``; absent or None: the family default, else ``default`` (or an error)."""
        if self.data.get(key) is not None:
            return self.data[key]
        if key in self.defaults:
            return self.defaults[key]
        if required:
            raise self.error(f"config[{key!r}] is required (its transformers config class has no default)")
        return default

    def int(self, key: str, **kw) -> int:
        value = self.get(key, **kw)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise self.error(f"config[{key!r}] must be an integer >= 1, got {value!r}")
        return value

    def flag(self, key: str, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise TypeError(f"model_type {self.model_type!r}: config[{key!r}] must be true or false, got "
                            f"{type(value).__name__} {value!r}")
        return value


# --------------------------------------------------------------------------- one layer

@dataclass(frozen=True)
class LayerSpec:
    """How to build one decoder layer's attention: the class, its keyword arguments, the scheme
    (a function making a fresh one), the biases the model does not have (set to ``None`` after
    building: Qwen2 has q/k/v biases and none on the output), and what ``describe`` shows."""

    index: int
    layer_type: str
    cls: type
    kwargs: dict
    scheme: Callable
    position: str
    no_bias: tuple = ()
    notes: tuple = ()

    def build(self, seed: int = 0):
        """A new layer with random weights drawn with ``seed`` (the checkpoint's are copied in)."""
        layer = self.cls(scheme=self.scheme(), seed=seed, **self.kwargs)
        for name in self.no_bias:
            setattr(layer, name, None)
        return layer


class _Layers(Sequence):
    """``Model.layers``: layer ``i`` is built when first indexed, then kept."""

    def __init__(self, specs):
        self._specs, self._built = specs, {}

    def __len__(self):
        return len(self._specs)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        spec = self._specs[i]
        if spec.index not in self._built:
            self._built[spec.index] = spec.build(seed=spec.index)
        return self._built[spec.index]

    def __repr__(self):
        return f"<{len(self)} layers, {len(self._built)} built>"


@dataclass
class Model:
    """The position machinery of a model (``read``): ``layers`` (built when indexed), ``specs`` (how
    each is built), ``vision`` (None), ``model_type``, ``config`` (the text config read) and ``notes``
    (what the reader saw but does not model: a vision tower, say)."""

    model_type: str
    config: dict
    specs: list
    notes: list = field(default_factory=list)
    vision: object = None

    def __post_init__(self):
        self.layers = _Layers(self.specs)

    def rows(self) -> list:
        """One row per layer: ``[layer, type, heads, position, mask, notes]`` as strings."""
        rows = []
        for s in self.specs:
            kw = s.kwargs
            heads = f"{kw['num_heads']}/{kw.get('num_kv_heads') or kw['num_heads']} x {kw.get('head_dim') or '-'}"
            if s.cls is MultiHeadLatentAttention:
                heads = f"{kw['num_heads']} x ({kw['qk_nope_head_dim']}+{kw['qk_rope_head_dim']})"
            mask = ["causal"]
            if kw.get("sliding_window"):
                mask.append(f"window {kw['sliding_window']} (i-{kw['sliding_window']} < j <= i)")
            if kw.get("attention_chunk"):
                mask.append(f"chunks of {kw['attention_chunk']}")
            notes = list(s.notes)
            if kw.get("sinks"):
                notes.insert(0, "sinks")
            if kw.get("scale") is not None:
                notes.insert(0, f"scale {kw['scale']:.6g}")
            rows.append([str(s.index), s.layer_type, heads, s.position, ", ".join(mask), "; ".join(notes)])
        return rows

    def describe(self, width: int | None = None, *, runs: bool = False) -> str:
        """The per-layer table (heads shown as ``query/key-value x head_dim``), then the notes; at most
        ``width`` columns where the words allow (default 200). ``runs=True`` shows the layers that are
        alike as one row, their indices listed (``"0-4, 6-10"``, ``"1, 3, ..., 23"``)."""
        head = ["layer", "type", "heads", "position", "mask", "notes"]
        rows = self.rows()
        if runs:                                                # alike layers: one row, their indices listed
            groups = {}
            for row in rows:
                groups.setdefault(tuple(row[1:]), []).append(int(row[0]))
            rows = [[_indices(ix), *key] for key, ix in groups.items()]
        lines = [f"{self.model_type}: {len(self.specs)} decoder layers"]
        lines += terminal.table(head, rows, width=width or 200, details=(5,))
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"Model(model_type={self.model_type!r}, layers={len(self.specs)})"


def _indices(ix: list) -> str:
    """Layer indices, short: ``"0-4, 6-10"``, or ``"1, 3, ..., 23"`` for a progression of 4 or more."""
    if len(ix) >= 4 and len({b - a for a, b in zip(ix, ix[1:])}) == 1 and ix[1] - ix[0] > 1:
        return f"{ix[0]}, {ix[1]}, ..., {ix[-1]}"
    runs, start = [], ix[0]
    for a, b in zip(ix, ix[1:] + [None]):
        if b != a + 1:
            runs.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ", ".join(runs)


# --------------------------------------------------------------------------- RoPE parameters

LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def _rope_type(c: _Config, params: dict) -> str:
    """Pop and check ``params``' ``rope_type`` (older: ``type``): one minipos builds, or ``ValueError``
    naming it (and saying "not supported yet" for a scheme minipos does not have yet)."""
    kind = params.pop("rope_type", None) or params.pop("type", None) or "default"
    params.pop("type", None)
    if kind == "mrope":                                                    # Qwen2-VL's hub config: default + sections
        kind = "default"
    for key in ("llama_4_scaling_beta", "mrope_interleaved"):
        if params.get(key):
            raise c.error(f"config['rope_parameters'][{key!r}] asks for {NOT_YET[key]}, which minipos does "
                          "not support yet")
    if kind == "proportional":
        return kind                                   # p-RoPE (minipos.prope); its keys are checked by _prope
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


def _prope(c: _Config, params: dict, layout: str) -> Callable:
    """A function making the ``ProportionalRotary`` of ``rope_type: "proportional"`` (HF
    ``_compute_proportional_rope_parameters``: ``rope_theta``, ``partial_rotary_factor`` default 1,
    ``factor`` default 1); a key it does not take raises ``ValueError`` naming it."""
    extra = set(params) - {"rope_type", "rope_theta", "partial_rotary_factor", "factor"}
    if extra:
        raise c.error(f"config['rope_parameters'] of rope_type 'proportional' holds {sorted(extra)}; it takes "
                      "rope_theta, partial_rotary_factor and factor")
    kw = {"base": params["rope_theta"], "partial_rotary_factor": params.get("partial_rotary_factor", 1.0),
          "factor": params.get("factor", 1.0), "layout": layout}
    try:
        ProportionalRotary(**kw)
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    return lambda: ProportionalRotary(**kw)


def _rotary(c: _Config, params: dict, layout: str) -> Callable:
    """A function making the ``Rotary`` of ``params``; built once now, so a bad key raises here."""
    if params["rope_type"] == "proportional":
        return _prope(c, params, layout)
    params = {k: v for k, v in params.items() if k != "mrope_section"}
    try:
        Rotary(layout=layout, scaling=dict(params))
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    return lambda: Rotary(layout=layout, scaling=dict(params))


def _describe_rope(params: dict, layout: str) -> str:
    kind, theta = params["rope_type"], params["rope_theta"]
    if kind == "proportional":                                            # the fraction of frequencies that rotate
        text = f"p-RoPE {layout}, theta {theta:g}, {params.get('partial_rotary_factor', 1.0):g} of the frequencies"
        return text + (f", factor {params['factor']:g}" if params.get("factor", 1.0) != 1.0 else "")
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


def _without_mrope_flag(c: _Config) -> _Config:
    """``c`` with ``mrope_interleaved`` taken out of its RoPE parameters (``rope_parameters`` or, in a
    transformers 4 file, ``rope_scaling``): for the families whose HF rotary always interleaves, the
    flag changes nothing (HF ``Qwen3VLTextRotaryEmbedding`` never reads it)."""
    data = dict(c.data)
    for key in ("rope_parameters", "rope_scaling"):
        if isinstance(data.get(key), dict):
            data[key] = {k: v for k, v in data[key].items() if k != "mrope_interleaved"}
    return _Config(data, c.model_type, c.defaults)


def _qwen3_vl(c):
    """Qwen3-VL and Qwen3-VL-MoE text decoders: Qwen3's layer (per-head q/k RMSNorm, ``attention_bias`` on
    all four projections, no window) with interleaved M-RoPE, HF's default section [24, 20, 20]."""
    c = _without_mrope_flag(c)
    params = rope_parameters(c)
    extra = set(params) - {"rope_type", "rope_theta", "mrope_section"}
    if params["rope_type"] != "default" or extra:
        raise c.error(f"interleaved M-RoPE with rope_type {params['rope_type']!r} and rope_parameters "
                      f"{sorted(extra)}: minipos' MRotary takes mrope_section and rope_theta only")
    section, theta = list(params.get("mrope_section") or [24, 20, 20]), params["rope_theta"]   # HF's default
    sizes = _sizes(c)
    try:
        MultiHeadAttention(scheme=MRotary(mrope_section=section, base=theta, interleaved=True),
                           **{**sizes, "d_model": 1, "num_heads": 1, "num_kv_heads": 1})
    except (ValueError, TypeError) as err:
        raise c.error(f"rope_parameters['mrope_section']: {err}") from None
    specs = _dense(c, bias="attention_bias", window="none", qk_norm=True)
    position = (f"M-RoPE half, interleaved (T H W T H W ...), theta {theta:g}, sections {section} (t, h, w); "
                "positions (3, T)")
    return [replace(s, scheme=lambda: MRotary(mrope_section=section, base=theta, interleaved=True),
                    position=position) for s in specs]


def _glm4v(c, *, moe: bool = False):
    """GLM-4.1V / GLM-4.5V text decoders: split M-RoPE (HF ``recomposition_frequencies``, default section
    [8, 12, 12]) on the first ``int(head_dim * partial_rotary_factor)`` features, q/k/v biases, none on the
    output. The dense model pairs features (2i, 2i + 1) (``repeat_interleave(2)`` and ``rotate_half_llm``) and
    takes its head dim from ``hidden_size // num_attention_heads``; the MoE model pairs (i, i + R/2)
    (``rotate_half``), takes ``head_dim`` and defaults ``partial_rotary_factor`` to 0.5. A dense config
    whose ``head_dim`` differs from the quotient is read with its ``head_dim``, and a note says so."""
    if moe and not c.has("partial_rotary_factor"):
        c = _Config({**c.data, "partial_rotary_factor": 0.5}, c.model_type, c.defaults)   # Glm4vMoeTextConfig
    sizes, notes = _sizes(c), ()
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
    specs = _dense(c, bias=bias, window="none")
    pairs = "half" if moe else "interleaved pairs (2i, 2i+1)"                # the feature pairing, not the streams
    position = (f"M-RoPE {pairs}, theta {theta:g}, split sections {section} (t, h, w) on the first {R} of "
                f"{sizes['head_dim']} features; positions (3, T)")
    return [replace(s, scheme=lambda: MRotary(**kw), position=position, notes=s.notes + notes) for s in specs]


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


def _gemma4_layer_types(c: _Config) -> list:
    """Gemma4TextConfig's ``layer_types``: given, or five sliding layers per full one; the last is full."""
    types = _layer_types(c, lambda i: "sliding_attention" if (i + 1) % 6 else "full_attention")
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
    itself, a weightless RMSNorm of the values, the scale 1 (HF ``Gemma4TextAttention``)."""
    _refuse(c, ("use_bidirectional_attention",))
    if c.get("num_kv_shared_layers", 0):
        raise c.error(f"config['num_kv_shared_layers'] = {c.data['num_kv_shared_layers']!r}: those last layers reuse "
                      "the keys and values of earlier layers, which minipos' attention layers do not model")
    found = c.get("rope_parameters") or {
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
        "full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25, "rope_theta": 1_000_000.0}}
    if not isinstance(found, dict) or not set(found) & set(LAYER_TYPES):
        raise c.error("config['rope_parameters'] must be nested per layer type ('sliding_attention', "
                      "'full_attention'), as Gemma4TextConfig's")
    nested = {k: v for k, v in found.items() if k in LAYER_TYPES}       # hub files may add null top-level keys
    c = _Config({**c.data, "rope_parameters": nested}, c.model_type, c.defaults)
    types = _gemma4_layer_types(c)
    d_model, heads = c.int("hidden_size", required=True), c.int("num_attention_heads")
    k_eq_v, specs = c.flag("attention_k_eq_v", False), []
    for i, (kind, (kv, head_dim)) in enumerate(zip(types, _gemma4_sizes(c, types))):
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
                  "bias": c.flag("attention_bias", False), "sliding_window": _window(c, kind), "scale": 1.0,
                  "norm_eps": float(c.get("rms_norm_eps", 1e-6)), "v_norm": True}
        notes = ["q/k RMSNorm per head (weight w), values RMSNorm without weight"]
        if k_eq_v and kind == "full_attention":
            notes.append("attention_k_eq_v: the values are the key projection (set wv = wk, bv = bk)")
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, _rotary(c, params, "half"),
                               _describe_rope(params, "half"), (), tuple(notes)))
    return specs


def _exaone4(c):
    """EXAONE 4: per-head q/k RMSNorm (weight w) on every layer; with a ``sliding_window``, the sliding layers
    rotate (half layout) and see the window and the full layers are NoPE; without one, every layer rotates
    (HF ``Exaone4Attention``: ``if self.sliding_window is None or self.is_sliding``)."""
    windowed = c.has("sliding_window") or ("sliding_window" not in c.data and "sliding_window" in c.defaults)
    pattern = c.get("sliding_window_pattern", 4)
    if c.data.get("layer_types") is None and windowed and (isinstance(pattern, bool) or not isinstance(pattern, int)
                                                          or pattern < 1):
        raise c.error(f"config['sliding_window_pattern'] = {pattern!r}: without layer_types, Exaone4Config builds "
                      "them from an integer pattern >= 1 (every pattern-th layer full)")
    types = _layer_types(c, lambda i: "sliding_attention" if windowed and (i + 1) % pattern else "full_attention")
    sizes, specs = _sizes(c), []
    norm = {"norm_eps": float(c.get("rms_norm_eps", 1e-5))}
    for i, kind in enumerate(types):
        kwargs = {**sizes, **norm, "sliding_window": _window(c, kind) if windowed else None}
        if kind == "sliding_attention" or not windowed:
            params = rope_parameters(c)
            scheme, position = _rotary(c, params, "half"), _describe_rope(params, "half")
        else:
            scheme, position = NoPE, "NoPE (no rotation)"
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, scheme, position, (),
                               ("q/k RMSNorm per head (q_norm, k_norm)",)))
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


def _deepseek_v3(c):
    n = c.int("num_hidden_layers", required=True)
    layout = "interleaved" if c.flag("rope_interleave", True) else "half"
    params = rope_parameters(c)
    scaling = None if params["rope_type"] == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
    theta = params["rope_theta"]

    def make():
        return DecoupledRotary(layout=layout, base=theta, scaling=None if scaling is None else dict(scaling))
    try:
        make()
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    kwargs = {"d_model": c.int("hidden_size", required=True), "num_heads": c.int("num_attention_heads", required=True),
              "kv_lora_rank": c.int("kv_lora_rank", required=True), "q_lora_rank": c.int("q_lora_rank"),
              "qk_nope_head_dim": c.int("qk_nope_head_dim", required=True),
              "qk_rope_head_dim": c.int("qk_rope_head_dim", required=True),
              "v_head_dim": c.int("v_head_dim", required=True), "bias": c.flag("attention_bias", False)}
    position = f"MLA: RoPE {layout} on the last {kwargs['qk_rope_head_dim']} features of each head, " + \
        _describe_rope(params, layout).split(", ", 1)[1]
    return [LayerSpec(i, "full_attention", MultiHeadLatentAttention, kwargs, make, position) for i in range(n)]


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
    "qwen2_vl_text": Family(_qwen2_vl, {"rope_theta": 1_000_000.0, "max_position_embeddings": 32768,
                                        "max_window_layers": 80}),
    "gemma4_text": Family(_gemma4, {"num_attention_heads": 8, "num_key_value_heads": 4, "head_dim": 256,
                                    "global_head_dim": 512, "sliding_window": 512, "rms_norm_eps": 1e-6,
                                    "max_position_embeddings": 131072}),
    "glm4v_text": Family(_glm4v, {"rope_theta": 10000.0, "num_key_value_heads": 2, "rms_norm_eps": 1e-5,
                                  "max_position_embeddings": 32768}),
    "glm4v_moe_text": Family(lambda c: _glm4v(c, moe=True), {"rope_theta": 10000.0, "num_key_value_heads": 8,
                                                             "max_position_embeddings": 65536}),
    "exaone4": Family(_exaone4, {"rope_theta": 10000.0, "max_position_embeddings": 2048, "sliding_window": 4096,
                                 "rms_norm_eps": 1e-5}),
    "qwen3_vl_text": Family(_qwen3_vl, {"rope_theta": 500_000.0, "max_position_embeddings": 128000, "head_dim": 128}),
    "qwen3_vl_moe_text": Family(_qwen3_vl, {"rope_theta": 500_000.0, "max_position_embeddings": 128000}),
}
"""``model_type`` -> ``Family``. A multimodal config (``gemma3``, ``llama4``, ``qwen2_vl``) is read
through its ``text_config`` (or, as Qwen2-VL's hub files have it, its top level)."""

TEXT_OF = {"gemma3": "gemma3_text", "llama4": "llama4_text", "qwen2_vl": "qwen2_vl_text"}
TEXT_OF.update({"qwen3_vl": "qwen3_vl_text", "qwen3_vl_moe": "qwen3_vl_moe_text", "gemma4": "gemma4_text",
                "glm4v": "glm4v_text", "glm4v_moe": "glm4v_moe_text"})


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
    if isinstance(data.get("vision_config"), dict):
        notes.append(f"the vision tower ({data['vision_config'].get('model_type', 'vision_config')}) is not read "
                     "(vision towers are not supported yet); .vision is None")
    for key in (outer, model_type):
        if key in NOT_YET:
            raise ValueError(f"model_type {key!r} needs {NOT_YET[key]}, which minipos does not support yet")
    if model_type not in FAMILIES:
        raise ValueError(f"model_type {model_type!r} is not a family minipos reads; it reads "
                         f"{', '.join(sorted(FAMILIES))} (and {', '.join(sorted(TEXT_OF))} through their text config)")
    c = _Config(text, model_type, FAMILIES[model_type].defaults)
    specs = FAMILIES[model_type].read(c)
    return Model(model_type, text, specs, notes)
