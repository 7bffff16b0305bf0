"""The multi-head latent attention families of ``minipos.config``: DeepSeek-V2, DeepSeek-V3, DeepSeek-V3.2 (MLA and
its indexer, ``minipos.dsa``), Mistral 4 (V3's MLA, its queries scaled by ``llama_4_scaling_beta``) and GLM-5
(``glm_moe_dsa``: V3.2's layers, the indexer interleaved, its picks shared across layers). Returned in ``FAMILIES`` for ``minipos.config`` to merge; its module docstring states the
contract."""

from __future__ import annotations

import math
from dataclasses import replace

from ._config_rope import check_built, describe_rope, layer_types_of, query_scale_args, rope_parameters
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from .mla import DecoupledRotary, MultiHeadLatentAttention, ScaledDecoupledRotary
from .rope import rope_inv_freq
from .rope_scaling import REGISTRY


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
    indexer = {"num_heads": heads, "head_dim": head_dim, "rope_dim": rope_dim, "topk": topk, "inv_freq": inv_freq,
               "attention_factor": factor, "layout": indexer_layout, "shared_from": None}
    note = (f"indexer: {heads} heads x {head_dim}, RoPE {indexer_layout} on the first {rope_dim} features (minipos.dsa, "
            "spec.indexer); pass its picks as the layer's mask")
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
}
"""``model_type`` -> ``Family``: the latent-attention decoders (``minipos.config`` merges them into its own)."""
