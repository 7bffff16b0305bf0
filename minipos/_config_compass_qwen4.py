"""More families of ``minipos.config`` built from the machinery of ``minipos._config_vision`` and
``minipos._config_rope`` (transformers 5.24): Cohere Compass (its decoder's interleaved M-RoPE or NoPE per layer type,
and its vision tower, Qwen3-VL's), Qwen4-Exp (its decoder's attention layers, Qwen3.5's with a QSA indexer, and its
vision tower), MLCD's vision encoder (read alone, its class token's learned angles too), LFM3-VL's vision tower (its
attention layers) and Qwen3-Omni's thinker's head dim (HF's ``hidden_size // num_attention_heads``, floored). Its towers are registered in ``VISION`` and ``VISION_OF``, its decoders
returned in ``FAMILIES`` and ``TEXT_OF`` for ``minipos.config`` to merge. ``minipos.config``'s module docstring states
the contract.

The interleaved M-RoPE of Cohere Compass and Qwen4-Exp is Qwen3-VL's (``MRotary(interleaved=True)``), and transformers
assigns it whatever ``mrope_section`` adds up to: frequency i of the R/2 is height when ``i % 3 == 1`` and ``i < 3
n_h``, width when ``i % 3 == 2`` and ``i < 3 n_w``, temporal otherwise. A section that does not count R/2 frequencies
(Qwen4-Exp's default [11, 11, 10] on a full head of 256) is read as the counts that rule gives, and a note says so."""

from __future__ import annotations

from dataclasses import replace

from ._config_rope import (
    axial_theta,
    layer_types_of,
    rope_parameters,
    window_of,
)
from ._config_towers import FAMILIES as TOWER_FAMILIES
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from ._config_vision import (VISION, VISION_OF, hf_interleaved_section, interleaved_section_note, qwen3_vl,
                             qwen_tower)
from .axial import AxialRotary
from .layer import MultiHeadAttention
from .mrope import MRotary
from .qk_norm import QKNormAttention
from .seams import NoPE

__all__ = ["FAMILIES", "TEXT_OF"]


# --------------------------------------------------------------------------- interleaved M-RoPE, as HF assigns it

def _strip_interleaved_flag(params):
    # HF's rotaries here never read mrope_interleaved: they always interleave.
    return {k: v for k, v in params.items() if k != "mrope_interleaved"} if isinstance(params, dict) else params


def _flag_note(params) -> tuple:
    """A note for ``mrope_interleaved: false``, which says split M-RoPE where transformers interleaves."""
    if isinstance(params, dict) and params.get("mrope_interleaved") is False:
        return ("mrope_interleaved false is not read: transformers' rotary interleaves whatever it says",)
    return ()


def interleaved_mrope(c: _Config, params: dict, head_dim: int, default: list) -> tuple:
    """Interleaved M-RoPE from ``params`` (``rope_parameters``' result): ``(MRotary's keywords, the description,
    notes)``. ``rope_type`` "default" only; ``partial_rotary_factor`` (default 1) rotates the first ``int(head_dim *
    p)`` features; ``mrope_section`` (default ``default``) as HF assigns it (``hf_interleaved_section``)."""
    extra = set(params) - {"rope_type", "rope_theta", "mrope_section", "partial_rotary_factor"}
    if params["rope_type"] != "default" or extra:
        raise c.error(f"interleaved M-RoPE with rope_type {params['rope_type']!r} and rope_parameters {sorted(extra)}: "
                      "minipos' MRotary takes mrope_section, partial_rotary_factor and rope_theta only")
    R = int(head_dim * params.get("partial_rotary_factor", 1.0))                       # HF: int(head_dim * p)
    given = list(params.get("mrope_section") or default)
    try:
        section = hf_interleaved_section(given, R // 2)
    except (ValueError, TypeError) as err:
        raise c.error(f"rope_parameters['mrope_section']: {err}") from None
    kw = {"mrope_section": section, "base": params["rope_theta"], "interleaved": True, "rotary_dim": R}
    try:
        MultiHeadAttention(scheme=MRotary(**kw), d_model=1, num_heads=1, num_kv_heads=1, head_dim=head_dim)
    except (ValueError, TypeError) as err:
        raise c.error(f"rope_parameters (mrope_section, partial_rotary_factor): {err}") from None
    notes = interleaved_section_note(given, section, R // 2)
    position = (f"M-RoPE half, interleaved (T H W T H W ...), theta {params['rope_theta']:g}, sections {section} "
                f"(t, h, w)" + (f", on the first {R} of {head_dim} features" if R != head_dim else "")
                + "; positions (3, T)")
    return kw, position, notes


def _head_dim(c: _Config, cls: str) -> tuple:
    """``(head_dim, notes)`` for a config class that sets ``head_dim = hidden_size // num_attention_heads``: a config
    whose ``head_dim`` differs (a narrowed copy: ``minipos vectors``) is read with its own, and a note says so."""
    d_model, heads = c.int("hidden_size", required=True), c.int("num_attention_heads", required=True)
    if c.int("head_dim") is None:
        if d_model % heads:
            raise c.error(f"hidden_size ({d_model}) is not a multiple of num_attention_heads ({heads})")
        return d_model // heads, ()
    if c.int("head_dim") * heads == d_model:
        return c.int("head_dim"), ()
    return c.int("head_dim"), (f"head_dim {c.int('head_dim')} as the config says; HF's {cls} sets hidden_size // "
                               f"num_attention_heads = {d_model // heads}",)


# --------------------------------------------------------------------------- Cohere Compass

def _cohere_compass(c):
    """Cohere Compass's text decoder (HF ``CohereCompassAttention``, ``CohereCompassRotaryEmbedding``): Cohere 2's layer
    with Qwen3-VL's interleaved M-RoPE, per layer type. ``layer_types`` default every layer "full_attention"; a
    "sliding_attention" layer takes ``sliding_window`` (default 4096). ``rope_parameters`` is nested per layer type
    (a layer type's entry null: NoPE; a type without an entry: transformers fails, and so does the reader); each entry
    interleaved M-RoPE (default section [24, 20, 20]) in the half layout (``rotate_half``, not Cohere 2's interleaved
    pairs). A ``rope_theta`` or ``rope_type`` beside the layer types is dropped, as ``convert_rope_params_to_dict``
    drops it. GQA, ``attention_bias`` on q, k, v and o, scale ``head_dim ** -0.5``; ``head_dim`` is ``hidden_size //
    num_attention_heads`` (the config class sets it)."""
    types = layer_types_of(c, lambda i: "full_attention")
    head_dim, notes = _head_dim(c, "CohereCompassTextConfig")
    found = c.data.get("rope_parameters")
    if not isinstance(found, dict):
        raise c.error("config['rope_parameters'] must be a dict with one entry per layer type "
                      f"(CohereCompassRotaryEmbedding reads rope_parameters[layer_type]), got {found!r}")
    unknown = sorted(set(found) - set(types) - {"rope_theta", "rope_type"})
    if unknown:
        raise c.error(f"config['rope_parameters'][{unknown[0]!r}] is neither a layer type of this model "
                      f"({sorted(set(types))}) nor a key transformers drops")
    schemes = {}
    for kind in dict.fromkeys(types):
        if kind not in found:
            raise c.error(f"config['rope_parameters'] has no entry for layer type {kind!r} (null for NoPE): "
                          "transformers' rotary reads rope_parameters[layer_type]")
        entry = _strip_interleaved_flag(found[kind])
        if entry is None:
            schemes[kind] = (lambda: NoPE(), f"NoPE (rope_parameters[{kind!r}] is null); positions (T,): the "
                             "sequence order, not the M-RoPE streams", ())
            continue
        if not isinstance(entry, dict) or entry.get("rope_theta") is None:
            raise c.error(f"config['rope_parameters'][{kind!r}]['rope_theta'] is required (a dict with rope_theta, "
                          "or null)")
        params = rope_parameters(_Config({**c.data, "rope_parameters": entry}, c.model_type, c.defaults))
        unread = ()
        if params.pop("partial_rotary_factor", None) is not None:       # HF's default rope: dim = head_dim
            unread = ("partial_rotary_factor is not read: CohereCompassRotaryEmbedding turns the whole head",)
        kw, position, mnotes = interleaved_mrope(c, params, head_dim, [24, 20, 20])
        schemes[kind] = (lambda kw=kw: MRotary(**kw), position, mnotes + _flag_note(found[kind]) + unread)
    sizes = {"d_model": c.int("hidden_size"), "num_heads": c.int("num_attention_heads"),
             "num_kv_heads": c.int("num_key_value_heads") or c.int("num_attention_heads"), "head_dim": head_dim}
    bias = c.flag("attention_bias", False)
    specs = []
    for i, kind in enumerate(types):
        make, position, mnotes = schemes[kind]
        kwargs = {**sizes, "bias": bias, "sliding_window": window_of(c, kind)}
        specs.append(LayerSpec(i, kind, MultiHeadAttention, kwargs, make, position, (), notes + mnotes))
    return specs


_COHERE_COMPASS_TEXT = {"hidden_size": 8192, "num_hidden_layers": 40, "num_attention_heads": 64, "sliding_window": 4096,
                        "max_position_embeddings": 8192, "layer_norm_eps": 1e-5}
"""``CohereCompassTextConfig``'s defaults (its ``rope_parameters`` default is empty: transformers cannot build that)."""


def _qwen3_vl_tower(c):
    # CohereCompassVisionModel, Qwen4ExpVisionModel: Qwen3-VL's tower (one qkv and proj with biases, 2-D RoPE "qwen",
    # merge_positions(h, w, spatial_merge_size), the learned table added before layer 0).
    return qwen_tower(c, "hidden_size", learned=True)


_QWEN3_VL_TOWER = {"depth": 27, "hidden_size": 1152, "num_heads": 16, "patch_size": 16, "spatial_merge_size": 2,
                   "rope_theta": 10000.0, "num_position_embeddings": 2304}
VISION.update({"cohere_compass_vision": Family(_qwen3_vl_tower, _QWEN3_VL_TOWER),
               "qwen4_exp_vision": Family(_qwen3_vl_tower, _QWEN3_VL_TOWER)})
VISION_OF.update({"cohere_compass": "cohere_compass_vision", "qwen4_exp": "qwen4_exp_vision"})


# --------------------------------------------------------------------------- Qwen4-Exp

_QSA = ("indexer_n_heads", "indexer_kv_heads", "indexer_head_dim", "indexer_budget", "indexer_compress_ratio")


def _qsa_note(c: _Config) -> str:
    """What each indexed layer's QSA indexer does to the mask, checked as ``Qwen4ExpTextConfig.validate_architecture``
    checks it."""
    given = {k: c.int(k) for k in _QSA}
    if all(v is None for v in given.values()):
        return ("indexer_* are not set: the config class's doc says QSA is then off, but Qwen4ExpTextAttention builds "
                "its Qwen4ExpTextQSAIndexer whatever the config says and transformers fails; read as every visible key")
    missing = [k for k, v in given.items() if v is None]
    if missing:
        raise c.error(f"config[{missing[0]!r}] is required: the QSA indexer takes all of {', '.join(_QSA)}")
    if given["indexer_kv_heads"] != 1:
        raise c.error(f"config['indexer_kv_heads'] must be 1 (Qwen4-Exp's QSA has one key head), got "
                      f"{given['indexer_kv_heads']}")
    budget, ratio = given["indexer_budget"], given["indexer_compress_ratio"]
    if budget % ratio:
        raise c.error(f"config['indexer_budget'] ({budget}) must be a multiple of indexer_compress_ratio ({ratio})")
    return (f"QSA indexer ({given['indexer_n_heads']} heads of {given['indexer_head_dim']}): each query keeps the top "
            f"{budget // ratio} blocks of {ratio} consecutive visible keys (scored against their mean key, turned to "
            f"the block's first position) and the keys after the last whole block; a query seeing fewer than "
            f"{budget + ratio} keys keeps them all (plain causal attention), beyond that its picks are the mask "
            "(pass mask=), which minipos does not compute")


def _qwen4_exp(c):
    """Qwen4-Exp's text decoder (HF ``Qwen4ExpTextAttention``): its attention layers (``spec.index`` their place;
    "indexed_attention", which a "full_attention" in ``layer_types`` means, as ``Qwen4ExpTextConfig`` renames it);
    the gated delta nets, the hyper-connections and the PLE in notes. ``(specs, notes)``.

    Qwen3.5's attention: per-head q/k RMSNorm with weight ``1 + w`` (``Qwen4ExpTextRMSNorm``), ``attention_bias`` on
    q, k, v and o, each head's output gated feature by feature by ``sigmoid`` of ``q_proj``'s second half
    (``gate="feature"``), ``head_dim`` from the config (default 256), scale ``head_dim ** -0.5``, causal, no window.
    Interleaved M-RoPE (``interleaved_mrope``, default section [11, 11, 10]) on the first ``int(head_dim *
    partial_rotary_factor)`` features, ``partial_rotary_factor`` default 1: unlike Qwen3.5's config, Qwen4-Exp's
    sets no 0.25. Each layer's QSA indexer picks keys (``_qsa_note``)."""
    interval = c.get("full_attention_interval", 4)
    if isinstance(interval, bool) or not isinstance(interval, int) or interval < 1:
        raise c.error(f"config['full_attention_interval'] must be an integer >= 1, got {interval!r}")
    if isinstance(c.data.get("layer_types"), list):                      # the checkpoint's "full_attention"
        c = _Config({**c.data, "layer_types": ["indexed_attention" if t == "full_attention" else t
                                               for t in c.data["layer_types"]]}, c.model_type, c.defaults)
    types = layer_types_of(c, lambda i: "linear_attention" if (i + 1) % interval else "indexed_attention",
                           allowed=("indexed_attention", "linear_attention"))
    heads = c.int("num_attention_heads", required=True)
    sizes = {"d_model": c.int("hidden_size", required=True), "num_heads": heads,
             "num_kv_heads": c.int("num_key_value_heads") or heads, "head_dim": c.int("head_dim", required=True)}
    data = {**c.data, **{k: _strip_interleaved_flag(c.data.get(k)) for k in ("rope_parameters", "rope_scaling")
                         if k in c.data}}
    params = rope_parameters(_Config(data, c.model_type, c.defaults))
    rope, position, mnotes = interleaved_mrope(c, params, sizes["head_dim"], [11, 11, 10])
    mnotes += _flag_note(c.data.get("rope_parameters")) or _flag_note(c.data.get("rope_scaling"))
    kwargs = {**sizes, "bias": c.flag("attention_bias", False), "norm_eps": c.float("rms_norm_eps", positive=True),
              "norm_offset": 1.0, "gate": "feature"}
    notes = ("q/k RMSNorm per head, weight 1 + w (norm_offset=1)",
             "output gate per feature: o * sigmoid(g), g from q_proj's second half of each head (wg)", *mnotes)
    qsa = _qsa_note(c)
    specs = [LayerSpec(i, kind, QKNormAttention, kwargs, lambda: MRotary(**rope), position, (), notes)
             for i, kind in enumerate(types) if kind == "indexed_attention"]
    deltas = [str(i) for i, kind in enumerate(types) if kind == "linear_attention"]
    model_notes = [qsa]
    if deltas:
        model_notes.append(f"layers {', '.join(deltas)} are gated delta nets (Qwen4ExpTextGatedDeltaNet: a causal "
                           f"conv1d of linear_conv_kernel_dim = {c.int('linear_conv_kernel_dim')} taps, then a "
                           "linear-attention recurrence): they see order by their recurrence, not by positions, "
                           "which minipos does not model; .layers holds the attention layers only, spec.index their "
                           "place")
    model_notes.append(f"the residual stream is {c.int('hc_count')} hyper-connection streams mixed before and after "
                       "each layer (an attention layer's input is one learned mix of them), and ple_layer_ids adds "
                       "hashed n-gram embeddings before some delta-net layers: neither is a position scheme")
    return specs, model_notes


_QWEN4_EXP_TEXT = {"hidden_size": 2048, "num_hidden_layers": 40, "num_attention_heads": 16, "num_key_value_heads": 2,
                   "head_dim": 256, "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 32768,
                   "linear_conv_kernel_dim": 4, "hc_count": 4}
"""``Qwen4ExpTextConfig``'s defaults."""


# --------------------------------------------------------------------------- MLCD, LFM3-VL's tower

def _mlcd_vision(c):
    """MLCD's vision encoder (HF ``MLCDVisionModel``, ``MLCDAttention``): the Qwen towers' 2-D RoPE (``"qwen"``
    layout: ``cat([freq_h, freq_w])`` twice with ``rotate_half``, frequencies over head_dim / 2), q, k, v and
    ``out_proj`` with biases, head dim ``hidden_size // num_attention_heads``, bidirectional; no learned position
    table. The class token, first, is turned by learned angles (``class_pos_emb``, its cos and sin prepended to the
    patches'), not a position: ``AxialRotary(class_angles=True)``; the patches follow it, row-major from 0.
    ``(specs, notes)``."""
    if c.get("num_key_value_groups", 1) != 1:
        raise c.error(f"config['num_key_value_groups'] = {c.get('num_key_value_groups')!r}: MLCDAttention's k_proj and "
                      "v_proj have num_attention_heads heads whatever it says; transformers' eager attention repeats "
                      "them that many times (and fails), sdpa does not: minipos reads 1 only")
    data = {**c.data, "spatial_merge_size": 1, "num_heads": c.int("num_attention_heads", required=True),
            "depth": c.int("num_hidden_layers", required=True)}         # qwen_tower's names for HF's keys here
    specs = qwen_tower(_Config(data, c.model_type, c.defaults), "hidden_size")
    base, head_dim = specs[0].scheme().base, specs[0].kwargs["head_dim"]
    position = (f"2-D RoPE qwen, theta {base:g}; positions (2, 1 + h w): rows, then columns, the class token's "
                "placeholder (0, 0) first, then the patches row-major from 0 (axial_positions(h, w, class_token="
                "'first')); the class token turns by scheme.class_pos_emb = HF's class_pos_emb[0]")
    make = lambda: AxialRotary(base=base, layout="qwen", class_angles=True)      # noqa: E731
    return [replace(s, position=position, scheme=make) for s in specs], [
        f"the class token (first) is turned by learned angles, cos and sin of class_pos_emb ({head_dim // 2} values, "
        "each pair's), not by a position: each layer's scheme holds them as class_pos_emb (HF's one parameter "
        "is shared by every layer: copy class_pos_emb[0] into each; its gradient is the sum of the layers'); call "
        "a layer on the whole sequence, the class token first",
        "no learned position table: MLCDVisionEmbeddings' interpolate_pos_encoding refers to a position_embedding "
        "it never creates, and its forward adds none"]


def _lfm3_vl_vision(c):
    """LFM3-VL's vision encoder (HF ``Lfm3VlVisionAttention``): its attention layers (``spec.index`` their place;
    ``layer_types`` default "conv" for i < 2 or odd i, else "full_attention"), the gated convolutions in a note.
    ``(specs, notes)``. Each: GQA, head dim ``hidden_size // num_attention_heads``, per-head q/k RMSNorm (weight w,
    ``norm_eps``), no biases, scale ``head_dim ** -0.5``, bidirectional within each frame; 2-D RoPE in the ``"qwen"``
    layout (``rope_type`` "axial", or "default" which the config class rewrites to it; default theta 1e6), positions ``merge_positions(h, w, spatial_merge_size)``."""
    types = layer_types_of(c, lambda i: "conv" if i < 2 or i % 2 else "full_attention",
                           allowed=("conv", "full_attention"))
    d_model, heads = c.int("hidden_size", required=True), c.int("num_attention_heads", required=True)
    if d_model % heads:
        raise c.error(f"hidden_size ({d_model}) is not a multiple of num_attention_heads ({heads})")
    theta, merge = axial_theta(c), c.int("spatial_merge_size", required=True)
    kwargs = {"d_model": d_model, "num_heads": heads, "num_kv_heads": c.int("num_key_value_heads") or heads,
              "head_dim": d_model // heads, "bias": False, "norm_eps": c.float("norm_eps", positive=True)}
    try:
        QKNormAttention(scheme=AxialRotary(base=theta, layout="qwen"), **kwargs)
    except (ValueError, TypeError) as err:
        raise c.error(f"2-D RoPE of head dim {kwargs['head_dim']} with {kwargs['num_kv_heads']} key/value heads: "
                      f"{err}") from None
    position = (f"2-D RoPE qwen, theta {theta:g}; positions (2, T): rows, then columns, in the tower's order "
                f"(merge_positions(h, w, {merge})); each frame alone")
    make = lambda: AxialRotary(base=theta, layout="qwen")                     # noqa: E731
    specs = [LayerSpec(i, kind, QKNormAttention, kwargs, make, position, (), ("q/k RMSNorm per head (weight w)",),
                       causal=False) for i, kind in enumerate(types) if kind == "full_attention"]
    convs = [str(i) for i, kind in enumerate(types) if kind == "conv"]
    return specs, [f"layers {', '.join(convs)} are gated depthwise convolutions over each frame's patch grid "
                   f"(conv_kernel_size {c.int('conv_kernel_size')}): they see the grid by their kernel, not by "
                   "positions; .layers holds the attention layers only, spec.index their place"] if convs else []


VISION.update({
    "mlcd_vision_model": Family(_mlcd_vision, {"hidden_size": 1664, "num_hidden_layers": 48, "num_attention_heads": 16,
                                               "image_size": 336, "patch_size": 14, "rope_theta": 10000.0}),
    "lfm3_vl_vision": Family(_lfm3_vl_vision, {"hidden_size": 1024, "num_hidden_layers": 14, "num_attention_heads": 16,
                                               "num_key_value_heads": 8, "patch_size": 16, "spatial_merge_size": 2,
                                               "norm_eps": 1e-5, "rope_theta": 1_000_000.0, "conv_kernel_size": 3}),
})
VISION_OF.update({"lfm3_vl": "lfm3_vl_vision"})


# --------------------------------------------------------------------------- Qwen3-Omni's head dim

def _qwen3_omni_moe_text(c):
    """Qwen3-Omni's thinker decoder (HF ``Qwen3OmniMoeThinkerTextAttention``): Qwen3-VL's (``qwen3_vl``). Its config
    class has no ``head_dim``; the attention takes ``getattr(config, "head_dim", hidden_size //
    num_attention_heads)``, the quotient floored, and so does the reader. An odd quotient (the class's own
    defaults: 2048 // 28 = 73) is refused: transformers' rotary then makes 74 features for 73 and fails."""
    if c.int("head_dim") is not None:
        return qwen3_vl(c)
    d_model, heads = c.int("hidden_size", required=True), c.int("num_attention_heads", required=True)
    head_dim = d_model // heads
    if head_dim % 2:
        raise c.error(f"head_dim is not given and HF's Qwen3OmniMoeThinkerTextAttention takes hidden_size // "
                      f"num_attention_heads = {d_model} // {heads} = {head_dim}, odd: its M-RoPE cannot turn an odd "
                      "head (transformers fails on this config too); give head_dim")
    specs = qwen3_vl(_Config({**c.data, "head_dim": head_dim}, c.model_type, c.defaults))
    if d_model % heads == 0:
        return specs
    note = (f"head_dim {head_dim} = hidden_size // num_attention_heads, floored as HF does: q_proj is "
            f"{heads * head_dim} wide, not hidden_size",)
    return [replace(s, notes=s.notes + note) for s in specs]



FAMILIES = {
    "cohere_compass_text": Family(_cohere_compass, _COHERE_COMPASS_TEXT),
    "qwen4_exp_text": Family(_qwen4_exp, _QWEN4_EXP_TEXT),
    "qwen3_omni_moe_text": Family(_qwen3_omni_moe_text, TOWER_FAMILIES["qwen3_omni_moe_text"].defaults),
}
"""``model_type`` -> ``Family``: the decoders of this module (``minipos.config`` merges them into its own, after
``minipos._config_towers``': its ``qwen3_omni_moe_text`` is replaced by the one here, which takes HF's head dim)."""

TEXT_OF = {"cohere_compass": "cohere_compass_text", "qwen4_exp": "qwen4_exp_text"}
