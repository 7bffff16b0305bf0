"""The multi-head latent attention families of ``minipos.config``: DeepSeek-V2, DeepSeek-V3, DeepSeek-V3.2 (MLA and
its indexer, ``minipos.dsa``), Mistral 4 (V3's MLA, its queries scaled by ``llama_4_scaling_beta``), GLM-5
(``glm_moe_dsa``: V3.2's layers, the indexer interleaved, its picks shared across layers) and Dots 3 Note's decoder
(``dots3_note_text``: MLA with a normed rope key, scaled latents and a head gate; sliding layers of their own sizes
beside GLM-5-indexed ones). Returned in ``FAMILIES`` for ``minipos.config`` to merge; its module docstring states the
contract."""

from __future__ import annotations

import math
from dataclasses import replace

from ._config_rope import check_built, describe_rope, layer_types_of, named_errors, query_scale_args, rope_parameters
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from .mla import DecoupledRotary, MultiHeadLatentAttention, ScaledDecoupledRotary
from .rope import rope_inv_freq
from .rope_scaling import REGISTRY
from .seams import NoPE


def _mla(c: _Config, layout: str, q_lora_rank, params: dict | None = None, query_scale: dict | None = None) -> tuple:
    """The MLA layers of the DeepSeek families (``minipos.mla``): ``(specs, rope parameters)``. params: the RoPE
    parameters, read here when None; query_scale: ``ScaledDecoupledRotary``'s beta and L (Mistral 4), or None."""
    n = c.int("num_hidden_layers", required=True)
    params = rope_parameters(c) if params is None else params
    scaling = None if params["rope_type"] == "default" else {k: v for k, v in params.items() if k != "rope_theta"}
    theta = params["rope_theta"]

    def make():
        kw = {"layout": layout, "base": theta, "scaling": None if scaling is None else dict(scaling)}
        return DecoupledRotary(**kw) if query_scale is None else ScaledDecoupledRotary(**kw, **query_scale)
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
        describe_rope(params, layout).split(", ", 1)[1]
    if query_scale is not None:
        position += (f"; queries x (1 + {query_scale['beta']:g} ln(1 + floor(p/"
                     f"{query_scale['original_max_position_embeddings']})))")
    specs = [LayerSpec(i, "full_attention", MultiHeadLatentAttention, kwargs, make, position) for i in range(n)]
    return check_built(c, specs), params


def _deepseek_v3(c):
    return _mla(c, "interleaved" if c.flag("rope_interleave", True) else "half", c.int("q_lora_rank"))[0]


def _mistral4(c):
    # Mistral4Attention: DeepSeek-V3's MLA (rope_interleave, default True; YaRN's mscale_all_dim in the softmax
    # scale), then the whole query, both slices, times llama_4_scaling_beta's 1 + beta ln(1 + floor(p / L)).
    # Its config class writes partial_rotary_factor = qk_rope_head_dim / (qk_nope_head_dim + qk_rope_head_dim)
    # into rope_parameters, which HF's RoPE reads against head_dim = qk_nope_head_dim + qk_rope_head_dim.
    if c.data.get("rope_parameters") is None and c.data.get("rope_scaling") is None:   # the class's default
        c.data = {**c.data, "rope_parameters": {**c.defaults["rope_parameters"],
                                                "max_position_embeddings": c.get("max_position_embeddings")}}
    params = rope_parameters(c)
    scale = query_scale_args(c, params)
    factor = params.pop("partial_rotary_factor", None)
    nope, rope_dim = c.int("qk_nope_head_dim", required=True), c.int("qk_rope_head_dim", required=True)
    if factor is not None and (isinstance(factor, bool) or not isinstance(factor, (int, float))
                               or not math.isfinite(factor) or int((nope + rope_dim) * factor) != rope_dim):
        raise c.error(f"config['rope_parameters']['partial_rotary_factor'] = {factor!r} rotates "
                      f"int(head_dim * factor) features of head_dim = qk_nope_head_dim + qk_rope_head_dim = "
                      f"{nope + rope_dim} in transformers; MLA rotates qk_rope_head_dim = {rope_dim}")
    layout = "interleaved" if c.flag("rope_interleave", True) else "half"
    q_lora_rank = c.data["q_lora_rank"] if "q_lora_rank" in c.data else c.defaults["q_lora_rank"]   # null: none
    return _mla(c, layout, q_lora_rank, params, scale)[0]


def _deepseek_v2(c):
    # DeepseekV2Attention's apply_rotary_emb: complex pairs (2i, 2i + 1), no rope_interleave key. q_lora_rank:
    # null in a config.json means no query LoRA (DeepSeek-V2-Lite), absent means the class's 1536.
    return _mla(c, "interleaved", c.data["q_lora_rank"] if "q_lora_rank" in c.data else c.defaults["q_lora_rank"])[0]


def _deepseek_v32(c, indexer_layout: str = "half", shared: tuple = ()):
    # DeepseekV32Attention: MLA rotated interleaved (apply_rotary_pos_emb_interleave, always), plus the indexer,
    # half layout on its first qk_rope_head_dim features (GLM-MoE-DSA's: interleaved). shared: the layers that
    # reuse the picks of the last layer before them that runs an indexer.
    if "q_lora_rank" in c.data and c.data["q_lora_rank"] is None:       # the indexer's query reads the query latent
        raise c.error("config['q_lora_rank'] is null; DeepSeek-V3.2's indexer needs the query latent (an integer)")
    q_lora_rank = c.int("q_lora_rank", required=True)
    specs, params = _mla(c, "interleaved", q_lora_rank)
    rope_dim = c.int("qk_rope_head_dim", required=True)
    indexer = _indexer(c, params, rope_dim, indexer_layout)
    note = (f"indexer: {indexer['num_heads']} heads x {indexer['head_dim']}, RoPE {indexer_layout} on the first "
            f"{rope_dim} features (minipos.dsa, spec.indexer); pass its picks as the layer's mask")
    out, source = [], None
    for s in specs:
        if s.index in shared:
            reuse = (f"no indexer of its own: it reuses layer {source}'s picks (indexer_types 'shared'); pass them as "
                     "the layer's mask")
            out.append(replace(s, indexer={**indexer, "shared_from": source}, notes=(reuse,)))
        else:
            source = s.index
            out.append(replace(s, indexer=dict(indexer), notes=(note,)))
    return out


def _indexer(c: _Config, params: dict, rope_dim: int, layout: str) -> dict:
    """``spec.indexer`` of a DeepSeek-V3.2-style layer: the indexer's sizes, its RoPE's frequencies and layout."""
    kind, heads, head_dim, topk = params["rope_type"], c.int("index_n_heads"), c.int("index_head_dim"), c.int("index_topk")
    if rope_dim > head_dim:
        raise c.error(f"qk_rope_head_dim ({rope_dim}) is more than index_head_dim ({head_dim}): the indexer rotates "
                      "its first qk_rope_head_dim features")
    if kind in ("dynamic", "longrope"):
        raise c.error(f"rope_type {kind!r} changes the frequencies with the length; the indexer's keys are cached "
                      "rotated, which minipos models for fixed frequencies only")
    args = {k: v for k, v in params.items() if k not in ("rope_type", "rope_theta")}
    inv_freq, factor = (rope_inv_freq(rope_dim, base=params["rope_theta"]), 1.0) if kind == "default" else \
        REGISTRY[kind](rope_dim, base=params["rope_theta"], **args)
    return {"num_heads": heads, "head_dim": head_dim, "rope_dim": rope_dim, "topk": topk, "inv_freq": inv_freq,
            "attention_factor": factor, "layout": layout, "shared_from": None}


def _indexer_types(c: _Config) -> list:
    """GlmMoeDsaConfig's ``indexer_types``: given, else from ``index_topk_pattern`` ("FSSF...") or from
    ``index_topk_freq`` and ``index_skip_topk_offset`` (defaults 1 and 2: every layer runs its indexer)."""
    n = c.int("num_hidden_layers", required=True)
    types = c.get("indexer_types")
    if types is None:
        pattern = c.get("index_topk_pattern")
        if pattern is not None:
            if isinstance(pattern, str) and set(pattern) <= {"F", "S"}:
                types = [{"F": "full", "S": "shared"}[ch] for ch in pattern]
            elif isinstance(pattern, list):
                types = list(pattern)
            else:
                raise c.error(f"config['index_topk_pattern'] must be a string of F and S (or a list of 'full' and "
                              f"'shared'), got {pattern!r}")
        else:
            freq, offset = c.int("index_topk_freq"), c.int("index_skip_topk_offset")
            freq, offset = max(1 if freq is None else freq, 1), 2 if offset is None else offset
            types = ["full" if max(i - offset + 1, 0) % freq == 0 else "shared" for i in range(n)]
    if not isinstance(types, list) or len(types) != n or any(t not in ("full", "shared") for t in types):
        raise c.error(f"config['indexer_types'] must list 'full' or 'shared' for each of the {n} layers, got {types!r}")
    if types[0] == "shared":
        raise c.error("config['indexer_types'][0] is 'shared', but no layer before it runs an indexer whose picks "
                      "it could reuse")
    return types


def _glm_moe_dsa(c):
    # GlmMoeDsaAttention (GLM-5): DeepSeek-V3.2's layer with the indexer's RoPE interleaved, and cross-layer sharing
    # of the picks (indexer_types). Every layer is "indexed_attention".
    kinds = layer_types_of(c, lambda i: "indexed_attention", allowed=("indexed_attention", "full_attention"))
    types = _indexer_types(c)
    specs = _deepseek_v32(c, "interleaved", tuple(i for i, t in enumerate(types) if t == "shared"))
    return [replace(s, layer_type=kind) for s, kind in zip(specs, kinds)]


# --------------------------------------------------------------------------- Dots 3 Note

_DOTS_SWA = {"num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1024, "kv_lora_rank": 1024,
             "head_dim": 256, "qk_nope_head_dim": 192, "v_head_dim": 128}
"""Dots3NoteTextConfig's defaults of the released checkpoint's ``swa_*`` aliases (the sliding layers' sizes)."""

_DOTS_LAYER_KEYS = ("num_attention_heads", "num_key_value_heads", "q_lora_rank", "kv_lora_rank", "head_dim",
                    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rms_norm_eps", "attention_bias",
                    "index_n_heads", "index_head_dim", "index_topk")
"""What a ``per_layer_config`` entry may set that the attention reads (HF builds each layer from its entry)."""

_DOTS_NOT_ATTENTION = ("intermediate_size", "moe_intermediate_size", "shared_experts_intermediate_size",
                       "n_routed_experts", "n_shared_experts", "num_experts_per_tok", "routed_scaling_factor", "n_group",
                       "topk_group", "norm_topk_prob", "hidden_act", "mlp_bias", "attention_dropout")
"""Keys of a ``per_layer_config`` entry that the attention does not read (the MLP's, the MoE's, dropout)."""


def _dots_layer_types(c: _Config) -> list:
    """Dots3NoteTextConfig's ``layer_types``: given, else layers 0, 1 and every i with i % 4 == 1 are full or indexed
    and the rest sliding (``use_sliding_window``, default true); ``use_dsa`` (default true unless the config has
    ``per_layer_config``) turns "full_attention" into "indexed_attention" (false: the other way)."""
    per_layer = c.data.get("per_layer_config") is not None
    use_dsa = c.data.get("use_dsa", None if per_layer else True)
    use_sliding = c.flag("use_sliding_window", True)
    full = "full_attention" if use_dsa is False else "indexed_attention"
    types = layer_types_of(c, lambda i: full if not use_sliding or i < 2 or i % 4 == 1 else "sliding_attention",
                           allowed=("indexed_attention", "sliding_attention", "full_attention"))
    if use_dsa is not None:
        if not isinstance(use_dsa, bool):
            raise c.error(f"config['use_dsa'] must be true, false or null, got {use_dsa!r}")
        old, new = ("full_attention", "indexed_attention") if use_dsa else ("indexed_attention", "full_attention")
        types = [new if t == old else t for t in types]
    return types


def _dots_layer_configs(c: _Config, types: list) -> dict:
    """Each layer type's config (a ``FamilyConfig`` of the top level with its layers' overrides), as HF's
    ``config.per_layer_config[layer_type]``: ``per_layer_config`` if given, else the ``swa_*`` aliases for the
    sliding layers. Layers of one type must share their overrides (HF builds one RoPE a type)."""
    given = c.data.get("per_layer_config")
    if given is None:
        swa = {k: c.data.get(f"swa_{k}", v) for k, v in _DOTS_SWA.items()}
        nulls = sorted(f"swa_{k}" for k, v in swa.items() if v is None)
        if nulls:
            raise c.error(f"config {nulls} null: transformers builds the sliding layers with the value None (leave the "
                          "key out for its default)")
        swa["qk_rope_head_dim"] = c.data.get("swa_qk_rope_head_dim", None)
        if swa["qk_rope_head_dim"] is None:
            head, nope = swa["head_dim"], swa["qk_nope_head_dim"]
            if isinstance(head, bool) or isinstance(nope, bool) or not (isinstance(head, int) and isinstance(nope, int)):
                raise c.error(f"config['swa_head_dim'] and config['swa_qk_nope_head_dim'] must be integers, got {head!r} "
                              f"and {nope!r}")
            swa["qk_rope_head_dim"] = head - nope
        overrides = {i: swa for i, t in enumerate(types) if t == "sliding_attention"}
    else:
        if not isinstance(given, dict):
            raise c.error(f"config['per_layer_config'] must map layer indices to dicts, got {type(given).__name__}")
        overrides = {}
        for key, entry in given.items():
            try:
                i = int(key)
            except (TypeError, ValueError):
                i = -1
            if isinstance(key, bool) or not 0 <= i < len(types) or not isinstance(entry, dict):
                raise c.error(f"config['per_layer_config'] must map layer indices 0..{len(types) - 1} to dicts, got "
                              f"{key!r}: {entry!r}")
            unknown = sorted(set(entry) - set(_DOTS_LAYER_KEYS) - set(_DOTS_NOT_ATTENTION))
            if unknown:
                raise c.error(f"config['per_layer_config'][{key!r}] sets {unknown}, which minipos does not read per "
                              f"layer (it reads {', '.join(_DOTS_LAYER_KEYS)})")
            nulls = sorted(k for k in entry if k in _DOTS_LAYER_KEYS and entry[k] is None)
            if nulls:
                raise c.error(f"config['per_layer_config'][{key!r}] sets {nulls} to null; transformers builds that "
                              "layer with the value None (a layer's value, or leave the key out for the model's)")
            overrides[i] = {k: v for k, v in entry.items() if k in _DOTS_LAYER_KEYS}
    configs = {}
    for kind in dict.fromkeys(types):
        first = types.index(kind)
        mine = {k: v for k, v in overrides.get(first, {}).items() if v != c.data.get(k, c.defaults.get(k))}
        for i, t in enumerate(types):
            theirs = {k: v for k, v in overrides.get(i, {}).items() if v != c.data.get(k, c.defaults.get(k))}
            if t == kind and theirs != mine:
                raise c.error(f"config['per_layer_config']: the {kind} layers {first} and {i} differ ({mine} and "
                              f"{theirs}); transformers builds one RoPE per layer type and refuses this")
        configs[kind] = _Config({**c.data, **mine}, c.model_type, c.defaults)
    return configs


def _dots_rope(c: _Config, types: list, configs: dict) -> dict:
    """Each layer type's RoPE parameters and rotated width, as Dots3NoteTextConfig's ``convert_rope_params_to_dict``:
    absent, default RoPE of ``swa_rope_theta`` (default 50000) on the sliding layers and ``rope_theta`` (default 8e7)
    on the others; flat, the same for every type. HF writes ``partial_rotary_factor = qk_rope_head_dim / head_dim``
    into each (any given value is overwritten) and rotates ``int(head_dim * factor)`` features."""
    found = c.data.get("rope_parameters")
    found = c.data.get("rope_scaling") if found is None else found
    theta = c.get("rope_theta")
    if found is None:
        swa_theta = c.data.get("swa_rope_theta", 50000.0)
        found = {t: {"rope_type": "default", "rope_theta": swa_theta if t == "sliding_attention" else theta}
                 for t in set(types)}
    if not isinstance(found, dict):
        raise c.error(f"config['rope_parameters'] must be a dict or null, got {type(found).__name__}")
    if not (found and set(found) <= {"indexed_attention", "sliding_attention", "full_attention"}):
        found = {t: found for t in set(types)}                          # flat: one for every layer type
    out = {}
    for kind, lc in configs.items():
        entry = found.get(kind)
        if not isinstance(entry, dict):
            raise c.error(f"config['rope_parameters'] has no entry (a dict) for layer type {kind!r}")
        entry = {k: v for k, v in entry.items() if k != "partial_rotary_factor"}   # HF recomputes it
        params = rope_parameters(_Config({**lc.data, "rope_parameters": entry, "partial_rotary_factor": None},
                                         c.model_type, c.defaults))
        head, rope_dim = lc.int("head_dim", required=True), lc.int("qk_rope_head_dim", required=True)
        if int(head * (rope_dim / head)) != rope_dim:
            raise c.error(f"the {kind} layers: transformers rotates int(head_dim * (qk_rope_head_dim / head_dim)) = "
                          f"{int(head * (rope_dim / head))} features, not qk_rope_head_dim = {rope_dim}")
        out[kind] = params
    return out


def _dots3_note(c):
    # Dots3NoteTextAttention (transformers 5.24): DeepSeek-V3's MLA built from each layer's own config
    # (per_layer_config), its q and kv latents normed and then multiplied by sqrt(hidden_size / rank), its shared
    # rope key RMS-normed (k_rope_only_layernorm) before the interleaved rotation, the softmax scale qk_head_dim ** -0.5
    # whatever the rope_type, each head's output times sigmoid(x g_proj) (no bias), every norm of eps rms_norm_eps.
    # The sliding layers keep W keys (create_sliding_window_causal_mask); the indexed ones run GLM-5's indexer (RoPE
    # interleaved) on the scaled query latent.
    types = _dots_layer_types(c)
    configs = _dots_layer_configs(c, types)
    ropes = _dots_rope(c, types, configs)
    d = c.int("hidden_size", required=True)
    window = c.int("sliding_window") if c.has("sliding_window") else c.int("sliding_window_size")
    specs = []
    for kind, lc in configs.items():
        heads = lc.int("num_attention_heads", required=True)
        kv_heads = lc.int("num_key_value_heads") or heads                   # HF: null means num_attention_heads
        if kv_heads != heads:
            raise c.error(f"the {kind} layers: num_key_value_heads ({kv_heads}) must equal num_attention_heads ({heads}) "
                          "(MLA's latent serves every head; transformers refuses it too)")
        if "q_lora_rank" in lc.data and lc.data["q_lora_rank"] is None:
            raise c.error(f"the {kind} layers: q_lora_rank is null; Dots 3 Note's queries need the query latent")
        q_rank, kv_rank = lc.int("q_lora_rank", required=True), lc.int("kv_lora_rank", required=True)
        nope, rope_dim = lc.int("qk_nope_head_dim", required=True), lc.int("qk_rope_head_dim", required=True)
        if kind == "sliding_attention" and lc.int("head_dim", required=True) != nope + rope_dim:
            raise c.error(f"the sliding layers' head_dim ({lc.get('head_dim')}) must equal qk_nope_head_dim + "
                          f"qk_rope_head_dim ({nope} + {rope_dim})")
        params = ropes[kind]
        scaling = None if params["rope_type"] == "default" else {k: v for k, v in params.items() if k != "rope_theta"}

        def make(theta=params["rope_theta"], scaling=scaling):
            return DecoupledRotary(layout="interleaved", base=theta, scaling=None if scaling is None else dict(scaling))
        named_errors(c, make)
        kwargs = {"d_model": d, "num_heads": heads, "kv_lora_rank": kv_rank, "q_lora_rank": q_rank,
                  "qk_nope_head_dim": nope, "qk_rope_head_dim": rope_dim, "v_head_dim": lc.int("v_head_dim", required=True),
                  "bias": lc.flag("attention_bias", False), "eps": lc.float("rms_norm_eps", positive=True),
                  "sliding_window": window if kind == "sliding_attention" else None,
                  "scale": (nope + rope_dim) ** -0.5, "k_rope_norm": True, "q_lora_scale": math.sqrt(d / q_rank),
                  "kv_lora_scale": math.sqrt(d / kv_rank), "gate": "head"}
        position = (f"MLA: RoPE interleaved on the last {rope_dim} features of each head (the rope key RMS-normed "
                    "first), " + describe_rope(params, "interleaved").split(", ", 1)[1])
        notes = ["latents x sqrt(hidden_size / rank); sigmoid head gate (wg)"]
        indexer = None
        if kind == "indexed_attention":
            indexer = {**_indexer(lc, params, rope_dim, "interleaved"), "q_lora_scale": kwargs["q_lora_scale"]}
            notes.append(f"indexer: {indexer['num_heads']} heads x {indexer['head_dim']}, RoPE interleaved on the first "
                         f"{rope_dim} features, its query from the scaled query latent (minipos.dsa, spec.indexer); "
                         "pass its picks as the layer's mask")
        specs += [LayerSpec(i, kind, MultiHeadLatentAttention, dict(kwargs), make, position, notes=tuple(notes),
                            indexer=indexer and dict(indexer)) for i, t in enumerate(types) if t == kind]
    return check_built(c, sorted(specs, key=lambda s: s.index))


# --------------------------------------------------------------------------- GLM-5.3-Flash

def _glm5_next(c):
    """GLM-5.3-Flash's decoder (HF ``Glm5NextTextAttention``): its attention layers (``spec.index`` their place; the
    "indexed_attention" ones, which a "full_attention" in ``layer_types`` means), the KDA layers, the hyper-connections
    and the k-pool indexer in notes. ``(specs, notes)``.

    Multi-head latent attention without RoPE (``qk_rope_head_dim`` 0, which HF requires): no position enters the
    layer at all; both latents RMS-normed with ``rms_norm_eps``; the softmax scale ``qk_nope_head_dim ** -0.5``. The
    only mask is the indexer's picks (causal and padding already), which the caller passes. A "shared" layer reuses the
    picks of the decoder layer just before it, which must be an attention layer that runs its indexer (HF raises
    otherwise)."""
    if isinstance(c.data.get("layer_types"), list):                      # Glm5NextTextConfig renames full_attention
        c = _Config({**c.data, "layer_types": ["indexed_attention" if t == "full_attention" else t
                                               for t in c.data["layer_types"]]}, c.model_type, c.defaults)
    kinds = layer_types_of(c, lambda i: "linear_attention" if i % 4 != 3 else "indexed_attention",
                           allowed=("linear_attention", "indexed_attention"))
    types = _indexer_types(c)
    heads = c.int("num_attention_heads", required=True)
    kv_heads = c.int("num_key_value_heads") or heads
    if kv_heads != heads:
        raise c.error(f"num_key_value_heads ({kv_heads}) must equal num_attention_heads ({heads}); transformers "
                      "refuses it too")
    if "q_lora_rank" in c.data and c.data["q_lora_rank"] is None:
        raise c.error("config['q_lora_rank'] is null; GLM-5.3-Flash's indexer reads the query latent (an integer)")
    if c.get("qk_rope_head_dim", 0) not in (0, None):
        raise c.error(f"config['qk_rope_head_dim'] = {c.get('qk_rope_head_dim')!r}: GLM-5.3-Flash's latent attention "
                      "has no RoPE (transformers requires 0)")
    kpool, topk = c.int("index_kpool", required=True), c.int("index_topk", required=True)
    if topk % kpool:
        raise c.error(f"index_topk ({topk}) must be a multiple of index_kpool ({kpool}); transformers refuses it too")
    kwargs = {"d_model": c.int("hidden_size", required=True), "num_heads": heads,
              "kv_lora_rank": c.int("kv_lora_rank", required=True), "q_lora_rank": c.int("q_lora_rank", required=True),
              "qk_nope_head_dim": c.int("qk_nope_head_dim", required=True), "qk_rope_head_dim": 0,
              "v_head_dim": c.int("v_head_dim", required=True), "bias": c.flag("attention_bias", False),
              "eps": c.float("rms_norm_eps", positive=True)}
    tail = c.flag("index_kpool_always_select_tail", True)
    indexer = {"num_heads": c.int("index_n_heads", required=True), "head_dim": c.int("index_head_dim", required=True),
               "rope_dim": 0, "topk": topk, "kpool": kpool, "always_select_tail": tail, "shared_from": None}
    position = "MLA without RoPE (qk_rope_head_dim 0): no position; the indexer's picks are the mask"
    specs = []
    for i, kind in enumerate(kinds):
        if kind != "indexed_attention":
            continue
        note = "call with the picks as mask (B, T, S) and causal=True: the picks are causal already"
        if types[i] == "shared":
            if i == 0 or kinds[i - 1] != "indexed_attention" or types[i - 1] != "full":
                raise c.error(f"layer {i} is 'shared' in indexer_types, but layer {i - 1} is not an attention layer "
                              "that runs its indexer; transformers hands a shared layer the picks of the layer just "
                              "before it, and raises")
            specs.append(LayerSpec(i, kind, MultiHeadLatentAttention, kwargs, NoPE, position, notes=(
                f"no indexer of its own: it reuses layer {i - 1}'s picks; {note}",),
                indexer={**indexer, "shared_from": i - 1}))
        else:
            specs.append(LayerSpec(i, kind, MultiHeadLatentAttention, kwargs, NoPE, position, notes=(note,),
                                   indexer=dict(indexer)))
    linear = [str(i) for i, kind in enumerate(kinds) if kind == "linear_attention"]
    notes = [f"the indexer (Glm5NextTextIndexer, spec.indexer) scores pools of index_kpool = {kpool} keys, each key "
             "the mean of its pool's keys weighted by a softmax of a gate plus a learned table over the place in the "
             f"pool (index_kpool_compress_ape: the only position table of the model), and picks the top "
             f"{topk // kpool} pools" + (" and the incomplete tail" if tail else "") + "; minipos does not model "
             "the indexer: pass its picks as the mask",
             f"hyper-connections: each decoder layer mixes hc_mult = {c.int('hc_mult')} residual streams into its "
             "input (not position machinery)"]
    if linear:
        notes.append(f"layers {', '.join(linear)} are KDA layers (Kimi delta attention: short convolutions of "
                     f"{c.int('linear_conv_kernel_dim')} taps, then a gated delta-rule recurrence, no attention "
                     "matrix): they see order by their recurrence, not by positions, which minipos does not model; "
                     ".layers holds the attention layers only, spec.index their place")
    return check_built(c, specs), notes


FAMILIES = {
    "deepseek_v3": Family(_deepseek_v3, {"rope_theta": 10000.0, "max_position_embeddings": 4096}),
    "mistral4": Family(_mistral4, {"max_position_embeddings": 1048576, "kv_lora_rank": 256, "q_lora_rank": 1024,
                                   "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 128,
                                   "num_hidden_layers": 36, "hidden_size": 4096, "num_attention_heads": 32,
                                   "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 128.0,
                                                       "original_max_position_embeddings": 8192, "beta_fast": 32.0,
                                                       "beta_slow": 1.0, "mscale_all_dim": 1.0, "mscale": 1.0,
                                                       "llama_4_scaling_beta": 0.1}}),
    "deepseek_v2": Family(_deepseek_v2, {"rope_theta": 10000.0, "max_position_embeddings": 2048, "kv_lora_rank": 512,
                                         "q_lora_rank": 1536, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                                         "v_head_dim": 128}),
    "deepseek_v32": Family(_deepseek_v32, {"rope_theta": 10000.0, "max_position_embeddings": 163840,
                                           "kv_lora_rank": 512, "q_lora_rank": 1536, "qk_nope_head_dim": 128,
                                           "qk_rope_head_dim": 64, "v_head_dim": 128, "index_topk": 2048,
                                           "index_head_dim": 128, "index_n_heads": 64}),
    "glm_moe_dsa": Family(_glm_moe_dsa, {"rope_theta": 10000.0, "max_position_embeddings": 202752,
                                         "kv_lora_rank": 512, "q_lora_rank": 2048, "qk_nope_head_dim": 192,
                                         "qk_rope_head_dim": 64, "v_head_dim": 256, "index_topk": 2048,
                                         "index_head_dim": 128, "index_n_heads": 32, "num_hidden_layers": 78,
                                         "hidden_size": 6144, "num_attention_heads": 64}),
    "dots3_note_text": Family(_dots3_note, {"rope_theta": 80_000_000.0, "max_position_embeddings": 524288,
                                            "hidden_size": 5120, "num_hidden_layers": 46, "num_attention_heads": 128,
                                            "head_dim": 256, "q_lora_rank": 1024,
                                            "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
                                            "v_head_dim": 128, "rms_norm_eps": 1e-5, "sliding_window_size": 512,
                                            "index_topk": 2048, "index_head_dim": 128, "index_n_heads": 64}),
    "glm5_next_text": Family(_glm5_next, {"num_hidden_layers": 45, "hidden_size": 4096, "num_attention_heads": 64,
                                          "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 256,
                                          "v_head_dim": 256, "rms_norm_eps": 1e-5, "index_topk": 2048,
                                          "index_head_dim": 128, "index_n_heads": 32, "index_kpool": 16,
                                          "max_position_embeddings": 1048576, "linear_conv_kernel_dim": 4,
                                          "hc_mult": 4}),
}
"""``model_type`` -> ``Family``: the latent-attention decoders (``minipos.config`` merges them into its own)."""
