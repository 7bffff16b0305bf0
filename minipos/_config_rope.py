"""What the families of ``minipos.config`` share: a config's RoPE parameters read and checked
(``rope_parameters``: every ``rope_type`` of transformers 5.x, flat or nested per layer type, and
transformers 4's ``rope_scaling``), the layer sizes and types, and the Llama-like layer (``dense_layers``) most
families build on. ``minipos.config``'s module docstring states the contract."""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

from ._checks import check_float
from ._config_types import FamilyConfig as _Config
from ._config_types import LayerSpec
from .kv_share import SharedKVAttention
from .layer import MultiHeadAttention
from .mrope import MRotary
from .prope import ProportionalRotary
from .qk_norm import QKNormAttention
from .rope_scaling import REGISTRY, Rotary

# --------------------------------------------------------------------------- RoPE parameters

ROPE_TYPES = ("default", *REGISTRY)
"""The ``rope_type`` values the reader builds (``ntk`` is minipos's name for static NTK; HF has none)."""


NOT_YET = {
    "mrope_interleaved": "interleaved M-RoPE in a family whose M-RoPE is split (Qwen3-VL's is read: qwen3_vl)",
    "sam3_window_padding": "SAM 3's window layers on a patch grid that is not a multiple of window_size (HF "
                           "window_partition pads the grid with zero tokens that the window's patches attend, unmasked: "
                           "extra keys whose content is the projections' biases)",
    "sam3_video": "SAM 3 video's two models at once (read its detector_config, a sam3, and its tracker_config, a "
                  "sam3_tracker_video, each alone)",
}
"""Machinery minipos does not have yet, by the key or ``model_type`` that asks for it."""


QUERY_SCALED = ("ministral3", "mistral4")
"""The families whose attention multiplies its queries by ``llama_4_scaling_beta``'s scale (``minipos.query_scale``;
Mistral 4's MLA: ``minipos.mla.ScaledDecoupledRotary``)."""


LAYER_TYPES = ("full_attention", "sliding_attention", "chunked_attention")


def checked_rope_type(c: _Config, params: dict) -> str:
    """Pop and check ``params``' ``rope_type`` (older: ``type``): one minipos builds, or ``ValueError``
    naming it (and saying "not supported yet" for a scheme minipos does not have yet)."""
    kind, older = params.pop("rope_type", None), params.pop("type", None)
    kind = kind if kind is not None else older if older is not None else "default"
    if not isinstance(kind, str):
        raise c.error(f"config['rope_parameters']['rope_type'] must be a string such as 'default' or 'yarn', got "
                      f"{kind!r}")
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
        return kind                                   # p-RoPE (minipos.prope); its keys are checked by proportional_rotary
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
    else:
        if not isinstance(found, dict):
            raise TypeError(f"model_type {c.model_type!r}: config['rope_parameters'] must be a dict")
        if found and all(k in LAYER_TYPES for k in found):              # nested per layer type (transformers 5)
            if layer_type not in found:
                raise c.error(f"config['rope_parameters'] has no entry for layer type {layer_type!r} "
                              f"(it has {sorted(found)})")
            found = found[layer_type]
        params = dict(found)
    where = "config['rope_parameters']['rope_theta']"
    if "rope_theta" not in params:                                           # only then is the top level's read
        params["rope_theta"], where = c.get("rope_theta", required=True), "config['rope_theta']"
    named_errors(c, lambda: check_float(params["rope_theta"], where, positive=True))
    kind = checked_rope_type(c, params)
    if c.has("partial_rotary_factor") and "partial_rotary_factor" not in params:
        params["partial_rotary_factor"] = c.get("partial_rotary_factor")
    factor = params.get("partial_rotary_factor")
    if factor == 1.0 and not isinstance(factor, bool):                    # true == 1.0 too: left for the check
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


def proportional_rotary(c: _Config, params: dict, layout: str) -> Callable:
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


def make_rotary(c: _Config, params: dict, layout: str) -> Callable:
    """A function making the ``Rotary`` of ``params``; built once now, so a bad key raises here."""
    if params["rope_type"] == "proportional":
        return proportional_rotary(c, params, layout)
    params = {k: v for k, v in params.items() if k != "mrope_section"}
    try:
        Rotary(layout=layout, scaling=dict(params))
    except (ValueError, TypeError) as err:
        raise c.error(f"config['rope_parameters']: {err}") from None
    return lambda: Rotary(layout=layout, scaling=dict(params))


def describe_rope(params: dict, layout: str) -> str:
    kind, theta = params["rope_type"], params["rope_theta"]
    if kind == "proportional":                                            # the fraction of frequencies that rotate
        text = f"p-RoPE {layout}, theta {theta:g}, {params.get('partial_rotary_factor', 1.0):g} of the frequencies"
        return text + (f", factor {params['factor']:g}" if params.get("factor", 1.0) != 1.0 else "")
    text = f"RoPE {layout}, theta {theta:g}"
    if kind != "default":
        extra = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta", "partial_rotary_factor")}
        shown = ", ".join(f"{k}={short_value(v)}" for k, v in extra.items())
        text += f", {kind}({shown})"
    if "partial_rotary_factor" in params:
        text += f", partial {params['partial_rotary_factor']:g}"
    return text


def short_value(v) -> str:
    if isinstance(v, list):
        return f"[{len(v)} values]" if len(v) > 3 else str(v)
    return f"{v:g}" if isinstance(v, float) else str(v)


# --------------------------------------------------------------------------- layers

def layer_sizes(c: _Config) -> dict:
    d_model = c.int("hidden_size", required=True)
    heads = c.int("num_attention_heads", required=True)
    kv = c.int("num_key_value_heads") or heads
    head_dim = c.int("head_dim")
    if head_dim is None:
        if d_model % heads:
            raise c.error(f"hidden_size ({d_model}) is not a multiple of num_attention_heads ({heads}); "
                          "give head_dim")
        head_dim = d_model // heads
    check_kv_heads(c, heads, kv)
    return {"d_model": d_model, "num_heads": heads, "num_kv_heads": kv, "head_dim": head_dim}


def check_kv_heads(c: _Config, heads: int, kv: int, key: str = "num_key_value_heads") -> None:
    """Raise, naming ``key``, unless ``kv`` key/value heads group the ``heads`` query heads (the layers' num_kv_heads)."""
    if heads % kv:
        raise c.error(f"config[{key!r}] ({kv}: the layers' num_kv_heads) must divide num_attention_heads ({heads}): "
                      "each key/value head serves num_attention_heads // num_key_value_heads query heads")


def layer_types_of(c: _Config, rule: Callable[[int], str], allowed=("full_attention", "sliding_attention")) -> list:
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


def refuse_keys(c: _Config, keys) -> None:
    """Raise for a key that is set (true, or a value) but that no minipos layer models."""
    for key in keys:
        if c.data.get(key):
            raise c.error(f"config[{key!r}] = {c.data[key]!r} is not modelled by minipos' attention layers")


def window_of(c: _Config, kind: str):
    return c.int("sliding_window", required=True) if kind == "sliding_attention" else None


def dense_layers(c: _Config, *, bias: str, window: str, qk_norm: bool = False, mrope: bool = False) -> list:
    """Llama-like families: ``bias`` "attention_bias" / "qkv" (q, k, v only) / "none"; ``window``
    "all" (every layer when ``sliding_window`` is set) or "types" (``layer_types``)."""
    sizes, specs = layer_sizes(c), []
    n = c.int("num_hidden_layers", required=True)
    if window == "none":
        types = ["full_attention"] * n
    elif window == "all":
        types = ["sliding_attention" if c.has("sliding_window") else "full_attention"] * n
    else:
        use = c.flag("use_sliding_window", False) and c.has("sliding_window")
        start = c.int("max_window_layers") if use else None
        types = layer_types_of(c, lambda i: "sliding_attention" if use and i >= start else "full_attention")
    with_bias = {"attention_bias": c.flag("attention_bias", False), "qkv": True, "none": False}[bias]
    for i, kind in enumerate(types):
        params = rope_parameters(c)
        kwargs = {**sizes, "bias": with_bias, "sliding_window": window_of(c, kind)}
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
            scheme, position = make_rotary(c, params, "half"), describe_rope(params, "half")
        cls = MultiHeadAttention
        if qk_norm:
            cls, kwargs["norm_eps"] = QKNormAttention, c.float("rms_norm_eps", 1e-6, positive=True)
            notes.append("q/k RMSNorm per head (q_norm, k_norm)")
        if bias == "qkv":
            notes.append("biases on q, k, v only")
        specs.append(LayerSpec(i, kind, cls, kwargs, scheme, position, ("bo",) if bias == "qkv" else (),
                               tuple(notes)))
    return specs


def check_built(c: _Config, specs: list) -> list:
    """``specs``, each distinct layer built once a feature wide (``d_model`` 1; MLA's ranks 1: next to no memory), so
    that what only a built layer checks (a RoPE scaling's values, an odd head dim, key/value heads that do not group
    the heads, a window past 2**62) raises when the config is read, naming the model type and the layer."""
    seen = set()
    for s in specs:
        kwargs = {**s.kwargs, "d_model": 1}
        if "kv_lora_rank" in kwargs:                                          # MLA
            kwargs.update(kv_lora_rank=1, q_lora_rank=kwargs["q_lora_rank"] and 1)
        key = (s.cls, s.position, repr(sorted(kwargs.items())))
        if key not in seen:
            seen.add(key)
            try:
                s.cls(scheme=s.scheme(), **kwargs)
            except (ValueError, TypeError) as err:
                raise c.error(f"layer {s.index} ({s.layer_type}): {err}") from None
    return specs


def named_errors(c: _Config, build):
    """``build()`` with its ValueError/TypeError prefixed by the model type (from minipos' own readers)."""
    try:
        return build()
    except (ValueError, TypeError) as err:
        if str(err).startswith("model_type"):
            raise
        raise type(err)(f"model_type {c.model_type!r}: {err}") from None


def query_scale_args(c: _Config, params: dict) -> dict:
    """``ScaledQueryRotary``'s (and ``ScaledDecoupledRotary``'s) ``beta`` and ``original_max_position_embeddings``,
    popped from ``params`` with the ``max_position_embeddings`` HF's config class leaves there and ignores (except
    for LongRoPE)."""
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
    beta = named_errors(c, lambda: check_float(beta, "config['rope_parameters']['llama_4_scaling_beta']", minimum=0.0))
    return {"beta": beta, "original_max_position_embeddings": length}


def kv_sources(c: _Config, types: list) -> list:
    """Each layer's source of keys and values under ``num_kv_shared_layers`` (HF ``kv_sharing_modes``,
    ``minipos.kv_share``): ``None`` for a layer with its own, else the index of the last layer of its type
    before the shared ones (the "store" layer)."""
    n, shared = len(types), c.get("num_kv_shared_layers", 0)
    if isinstance(shared, bool) or not isinstance(shared, int) or not 0 <= shared <= n:
        raise c.error(f"config['num_kv_shared_layers'] must be an integer from 0 to num_hidden_layers ({n}), got "
                      f"{shared!r}")
    if shared == 0:
        return [None] * n
    if shared == n:
        raise c.error(f"config['num_kv_shared_layers'] = {shared} must be below num_hidden_layers ({n}): with every "
                      "layer shared, the keys and values come from another model (an assistant's target), which "
                      "minipos does not read")
    first, sources = n - shared, []
    for i, kind in enumerate(types):
        own = [j for j in range(first) if types[j] == kind]
        if i >= first and not own:
            raise c.error(f"config['num_kv_shared_layers'] = {shared}: layer {i} ({kind}) shares the keys and values "
                          f"of an earlier {kind} layer, but none of layers 0-{first - 1} is one")
        sources.append(own[-1] if i >= first else None)
    return sources


def shared_kv_spec(spec: LayerSpec, source: int | None) -> LayerSpec:
    """``spec`` as a layer that attends with the keys and values of layer ``source`` (``SharedKVAttention``),
    or unchanged when ``source`` is None."""
    if source is None:
        return spec
    kwargs = {k: v for k, v in spec.kwargs.items() if k != "v_norm"}
    note = (f"keys and values: layer {source}'s (num_kv_shared_layers; minipos.kv_share): call layer {source} with a "
            "cache, then this layer with that cache")
    return replace(spec, cls=SharedKVAttention, kwargs={**kwargs, "kv_source": source}, notes=(*spec.notes, note),
                   position=f"{spec.position}; keys: layer {source}'s")


def axial_theta(c: _Config, kinds=("default", "axial")) -> float:
    """The 2-D RoPE base of a vision config: ``rope_parameters['rope_theta']`` (``rope_type`` absent or one of
    ``kinds``, no other key), else ``rope_theta``, else the class's; a number > 0. (The vision rotaries take
    ``"axial"`` only, raising "supports only axial rope" for any other; their config classes, ``default_rope_type =
    "axial"``, rewrite a ``"default"`` to ``"axial"`` before that, so both are read.)"""
    params = c.data.get("rope_parameters")
    if params is None:
        theta = c.get("rope_theta", required=True)
    elif not isinstance(params, dict):
        raise TypeError(f"model_type {c.model_type!r}: config['rope_parameters'] must be a dict")
    else:
        kind = params.get("rope_type") or params.get("type") or kinds[0]
        if kind not in kinds:
            raise c.error(f"config['rope_parameters']['rope_type'] = {kind!r}: this 2-D RoPE takes no scaling "
                          f"(rope_type {' or '.join(repr(k) for k in kinds)})")
        extra = sorted(set(params) - {"rope_type", "type", "rope_theta"})
        if extra:
            raise c.error(f"config['rope_parameters'][{extra[0]!r}] is not read by this 2-D RoPE (it takes "
                          "rope_theta only)")
        theta = params["rope_theta"] if "rope_theta" in params else c.get("rope_theta", required=True)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or not theta > 0:
        raise c.error(f"config['rope_parameters']['rope_theta'] must be a number > 0, got {theta!r}")
    return float(theta)
