"""Inkling 2's decoder for ``minipos.config`` (transformers 5.24, ``Inkling2TextConfig``, ``Inkling2SlidingAttention``,
``Inkling2FullAttention``): each layer's attention as ``minipos.inkling.InklingAttention``. ``FAMILIES`` and
``TEXT_OF`` are merged by ``minipos.config``; its tower (``inkling2_vision``) is ``minipos._config_sam``'s.

``layer_types`` holds ``"hybrid_sliding"`` (a sliding layer: ``swa_*`` sizes, the window ``sliding_window_size``, which
is also its bias extent, static convolutions) and ``"hybrid"`` (a full layer: the plain sizes, ``rel_extent``, dynamic
convolutions, the log scale); the config class's default makes every sixth layer full."""

from __future__ import annotations

from ._config_rope import check_built, layer_types_of
from ._config_types import Family, LayerSpec
from .inkling import InklingAttention
from .seams import NoPE

__all__ = ["FAMILIES", "TEXT_OF"]

_NOT_READ = (
    "each decoder layer also runs a short causal convolution over its attention output and another over its MLP "
    "output (post_attention_convolution, post_mlp_convolution: minipos.inkling.short_conv with static taps), outside "
    "the attention module",
    "the layers' inputs are attention residuals over blocks of n_layers_per_attn_res_block layers; a full layer after "
    "the first takes its query, keys and values (and its dynamic taps) from three mixes of them, each RMS-normed: "
    "call it as layer(x, x_k=..., x_v=...) with HF's hidden_states, key_hidden_states and value_hidden_states")


def _aliased(c, key: str, alias: str) -> int:
    """``config[key]``, else its alias (HF's ``attribute_map``: a config.json may use either), else the default."""
    return c.int(alias) if not c.has(key) and c.has(alias) else c.int(key, required=True)


def _inkling2(c):
    """``(specs, notes)``: one ``InklingAttention`` per decoder layer (module docstring)."""
    kinds = layer_types_of(c, lambda i: "hybrid" if (i + 1) % 6 == 0 else "hybrid_sliding",
                           allowed=("hybrid", "hybrid_sliding"))
    window = _aliased(c, "sliding_window_size", "sliding_window")
    common = {"d_model": c.int("hidden_size", required=True), "d_rel": c.int("d_rel", required=True),
              "conv_kernel": _aliased(c, "conv_kernel_size", "sconv_kernel_size"),
              "qk_clip": c.float("qk_l2_clip_threshold", positive=True),
              "rel_clip": c.float("rel_l2_clip_threshold", positive=True),
              "norm_eps": c.float("rms_norm_eps", positive=True)}
    alpha, n_floor = c.float("log_scaling_alpha"), c.int("log_scaling_n_floor", required=True)
    if alpha < 0:
        raise c.error(f"config['log_scaling_alpha'] must be >= 0, got {alpha}")
    sizes = {}
    for kind, prefix in (("hybrid_sliding", "swa_"), ("hybrid", "")):
        heads = c.int(prefix + "num_attention_heads", required=True)
        kv = c.int(prefix + "num_key_value_heads", required=True)
        if heads % kv:
            raise c.error(f"{prefix}num_key_value_heads ({kv}) must divide {prefix}num_attention_heads ({heads})")
        sizes[kind] = {"num_heads": heads, "num_kv_heads": kv, "head_dim": c.int(prefix + "head_dim", required=True)}
    kwargs = {"hybrid_sliding": {**common, **sizes["hybrid_sliding"], "sliding_window": window},
              "hybrid": {**common, **sizes["hybrid"], "rel_extent": c.int("rel_extent", required=True),
                         "dynamic_conv": True, "log_scaling": (alpha, n_floor)}}
    position = {
        "hybrid_sliding": (f"no RoPE: a relative bias mixed by each query over its window of {window} keys back; "
                           f"static causal convolutions (kernel {common['conv_kernel']}) on k and v; per-query sinks"),
        "hybrid": (f"no RoPE: a relative bias mixed by each query over {kwargs['hybrid']['rel_extent']} keys back; "
                   f"dynamic causal convolutions (kernel {common['conv_kernel']}) on k and v; queries and relative "
                   f"states x (1 + {alpha} ln max((p + 1) / {n_floor}, 1)); per-query sinks")}
    specs = [LayerSpec(i, kind, InklingAttention, dict(kwargs[kind]), NoPE, position[kind],
                       notes=("L2-clipped q and k, RMS-normed v, sigmoid output gate (wg)",))
             for i, kind in enumerate(kinds)]
    return check_built(c, specs), list(_NOT_READ)


FAMILIES = {
    "inkling2_text": Family(_inkling2, {"hidden_size": 4608, "num_hidden_layers": 48, "num_attention_heads": 48,
                                        "num_key_value_heads": 8, "head_dim": 128, "swa_num_attention_heads": 48,
                                        "swa_num_key_value_heads": 8, "swa_head_dim": 128, "sliding_window_size": 1024,
                                        "d_rel": 16, "rel_extent": 1024, "log_scaling_n_floor": 128000,
                                        "log_scaling_alpha": 0.1, "rms_norm_eps": 1e-6, "conv_kernel_size": 4,
                                        "qk_l2_clip_threshold": 22.627416997969522, "rel_l2_clip_threshold": 8.0,
                                        "max_position_embeddings": 1048576}),
}
"""``model_type`` -> ``Family``: Inkling 2's decoder."""

TEXT_OF = {"inkling2": "inkling2_text"}
