"""More families of ``minipos.config`` built from the machinery of ``minipos._config_rope`` and
``minipos._config_vision``: MiniMax M3 (its full-attention decoder layers, its block-sparse layers named; its tower's
3-D RoPE), Step 3.7 (its ``step3p5`` decoder and its vision tower), Muse Glimmer (decoder and tower), Muse Spark
(decoder, Glimmer's with each head's output normed, and tower), Dots 3 Note (its tower; its decoder is in
``minipos._config_mla``) and
MusicFlamingo (its Qwen2 decoder).
Its towers are registered in ``VISION`` and ``VISION_OF``, what minipos does not model yet in ``NOT_YET``, its decoders
returned in ``FAMILIES`` and ``TEXT_OF`` for ``minipos.config`` to merge. ``minipos.config``'s module docstring states
the contract; transformers 5.24 defines what each key means."""

from __future__ import annotations

from dataclasses import replace

from ._config_more import TEXT_RENAMED
from ._config_rope import (
    NOT_YET,
    axial_theta,
    check_built,
    dense_layers,
    describe_rope,
    layer_sizes,
    layer_types_of,
    make_rotary,
    refuse_keys,
    rope_parameters,
    short_value,
    window_of,
)
from ._config_types import Family, LayerSpec
from ._config_types import FamilyConfig as _Config
from ._config_vision import VISION, VISION_OF, qwen_tower, tower_kwargs
from .axial import AxialRotary, axial_pairs
from .layer import MultiHeadAttention
from .qk_norm import QKNormAttention
from .seams import NoPE



# --------------------------------------------------------------------------- MiniMax M3

def _sparse_types(c: _Config) -> _Config:
    """``c`` with ``layer_types`` from the hub's ``sparse_attention_config['sparse_attention_freq']`` where the
    config gives none (``MiniMaxM3VLTextConfig.__post_init__``: 1 -> "minimax_m3_sparse", 0 -> "full_attention")."""
    sparse = c.data.get("sparse_attention_config") or {}
    if c.data.get("layer_types") is not None or not isinstance(sparse, dict) or "sparse_attention_freq" not in sparse:
        return c
    types = ["minimax_m3_sparse" if f else "full_attention" for f in sparse["sparse_attention_freq"]]
    return _Config({**c.data, "layer_types": types}, c.model_type, c.defaults)


_SPARSE_KEYS = {"index_n_heads": "sparse_num_index_heads", "index_head_dim": "sparse_index_dim",
                "index_block_size": "sparse_block_size", "index_topk_blocks": "sparse_topk_blocks",
                "index_local_blocks": "sparse_local_block"}
"""The indexer's keys and the hub's names for them in ``sparse_attention_config``, which win where given (HF)."""


def _minimax_m3(c):
    """MiniMax M3's text decoder (HF ``MiniMaxM3VLAttention``): RoPE half layout (any ``rope_type``) on the first
    ``int(head_dim * rope_parameters['partial_rotary_factor'])`` features, GQA, ``head_dim`` from the config (default
    128), no biases, scale ``head_dim ** -0.5``, per-head q/k RMSNorm with Gemma's ``1 + w`` (``MiniMaxM3VLRMSNorm``),
    causal, no window. ``rotary_dim`` is not read by HF 5.24 (``MiniMaxM3VLRotaryEmbedding`` takes the partial factor
    only): a note says so where they differ. The "minimax_m3_sparse" layers are the same layer under another mask: the
    key blocks the lightning indexer picks for each key/value-head group (``spec.indexer``), which the caller passes
    per head, ``mask=minipos.dsa.block_mask(picks, ...)`` ``(B, H, T, S)``; ``(specs, notes)``."""
    c = _sparse_types(c)
    sparse = c.data.get("sparse_attention_config") or {}
    if isinstance(sparse, dict):
        c = _Config({**c.data, **{k: sparse[hub] for k, hub in _SPARSE_KEYS.items() if hub in sparse}}, c.model_type,
                    c.defaults)
    types = layer_types_of(c, lambda i: "full_attention", allowed=("full_attention", "minimax_m3_sparse"))
    params, sizes = rope_parameters(c), layer_sizes(c)
    rotated = int(sizes["head_dim"] * params.get("partial_rotary_factor", 1.0))      # HF: int(head_dim * factor)
    kwargs = {**sizes, "bias": False, "sliding_window": None, "norm_eps": c.float("rms_norm_eps", positive=True),
              "norm_offset": 1.0}
    make, position = make_rotary(c, params, "half"), describe_rope(params, "half")
    indexer = {"blocks": True, **{k: c.int(f"index_{k}") for k in ("n_heads", "head_dim", "block_size", "topk_blocks",
                                                                    "local_blocks")}}
    if "minimax_m3_sparse" in types and sizes["num_heads"] % indexer["n_heads"]:
        raise c.error(f"config['index_n_heads'] ({indexer['n_heads']}) must divide num_attention_heads "
                      f"({sizes['num_heads']}): each index head picks the key blocks of a group of query heads")
    picks = ("the key blocks its lightning indexer picks (index_topk_blocks blocks of index_block_size keys a group "
             "of heads, minipos.dsa.block_picks): pass them as mask=minipos.dsa.block_mask(picks, ...), (B, H, T, S)")
    specs = [LayerSpec(i, kind, QKNormAttention, kwargs, make, position, (),
                       ("q/k RMSNorm per head, weight 1 + w", *((picks,) if kind == "minimax_m3_sparse" else ())),
                       indexer=dict(indexer) if kind == "minimax_m3_sparse" else None) for i, kind in enumerate(types)]
    notes = []
    if c.get("rotary_dim") != rotated:
        notes.append(f"rotary_dim {c.get('rotary_dim')} is not read: transformers 5.24 rotates int(head_dim * "
                     f"rope_parameters['partial_rotary_factor']) = {rotated} features (MiniMaxM3VLRotaryEmbedding), "
                     "and so does this reader")
    return specs, notes


_MINIMAX_M3 = {"hidden_size": 6144, "num_hidden_layers": 60, "num_attention_heads": 64, "num_key_value_heads": 4,
               "head_dim": 128, "rms_norm_eps": 1e-6, "rope_theta": 5_000_000.0, "max_position_embeddings": 524288,
               "rotary_dim": 64, "index_n_heads": 4, "index_head_dim": 128, "index_block_size": 128,
               "index_topk_blocks": 16, "index_local_blocks": 1}
"""``MiniMaxM3VLTextConfig``'s defaults (``default_theta`` 5e6; ``rotary_dim`` 64, which HF does not read)."""



def _minimax_m3_vision(c):
    """MiniMax M3's vision encoder (HF ``MiniMaxM3VLVisionAttention`` with ``MiniMaxM3VLVisionRotaryEmbedding``): the
    3-D RoPE of ``minipos.axial``'s ``"minimax_m3"`` layout (positions (frame, row, column); pairs (i, i + 3F) on the
    first 6F features, F = (head_dim // 3) // 2, by the frame, the row, then the column, each at base^(-j/F); the
    rest unrotated), ``rope_type`` "axial" (or "default", which the config class turns into "axial"; the rotary raises for
    any other); q, k, v and ``out_proj`` with biases; head
    dim ``hidden_size // num_attention_heads``, scale ``head_dim ** -0.5``; every layer full and bidirectional over one
    image or clip (``get_vision_attention_seqlens(..., merge_temporal=True)``: a video's frames attend each other).
    Positions ``get_vision_position_ids(grid_thw, spatial_merge_size, include_temporal=True)``: the frame index, then
    each frame's rows and columns in ``spatial_merge_size`` blocks, restarting at 0 for each image or clip."""
    theta = axial_theta(c)                 # MiniMaxM3VLVisionConfig turns rope_type "default" into "axial"
    kwargs = tower_kwargs(c, "hidden_size", c.int("num_attention_heads", required=True), theta, "minimax_m3")
    merge, D = c.int("spatial_merge_size", required=True), kwargs["head_dim"]
    rotated = 2 * len(axial_pairs(D, base=theta, layout="minimax_m3")[0])             # 6F
    position = (f"3-D RoPE minimax_m3, theta {theta:g}, the first {rotated} of {D} features; positions (3, T): "
                f"frames, rows, then columns, each frame in merge blocks (vstack([repeat(arange(t), h * w), "
                f"tile(merge_positions(h, w, {merge}), t)]))")
    make = lambda: AxialRotary(base=theta, layout="minimax_m3")                    # noqa: E731
    return [LayerSpec(i, "full_attention", MultiHeadAttention, kwargs, make, position, (), (), causal=False)
            for i in range(c.int("num_hidden_layers", required=True))]


VISION.update({"minimax_m3_vl_vision": Family(_minimax_m3_vision, {
    "hidden_size": 1280, "num_hidden_layers": 32, "num_attention_heads": 16, "spatial_merge_size": 2,
    "rope_theta": 10000.0})})
"""``MiniMaxM3VLVisionConfig``'s defaults (``default_theta`` 10000; head dim 1280 // 16 = 80: F = 13, 78 features
rotated)."""
VISION_OF.update({"minimax_m3_vl": "minimax_m3_vl_vision"})


# --------------------------------------------------------------------------- Step 3.7 (step3p5)

def _step_types(c: _Config) -> list:
    """``layer_types`` with the hub's trailing ``num_nextn_predict_layers`` MTP entries cut (as
    ``Step3p7TextConfig.__post_init__`` does), else every layer full."""
    n, extra = c.int("num_hidden_layers", required=True), c.data.get("num_nextn_predict_layers") or 0
    types = c.data.get("layer_types")
    if isinstance(types, list) and extra and len(types) == n + extra:
        types = types[:n]
    data = {**c.data, "layer_types": types}
    return layer_types_of(_Config(data, c.model_type, c.defaults), lambda i: "full_attention")


def _step_rope(c: _Config, types: list) -> tuple:
    """``(config with rope_parameters nested per layer type, notes)``, as ``Step3p7TextConfig.__post_init__`` builds
    them: kept when nested for every type; else each type from ``rope_theta`` (a number, or one per layer) and
    ``partial_rotary_factors`` (one per layer) at the type's first layer, ``rope_scaling`` added to "full_attention"."""
    found, notes = c.data.get("rope_parameters"), []
    if isinstance(found, dict) and all(isinstance(found.get(t), dict) for t in set(types)):
        nested = {t: found[t] for t in set(types)}
        return _Config({**c.data, "rope_parameters": nested}, c.model_type, c.defaults), notes
    if found:
        notes.append("rope_parameters is not per layer type, so Step3p7TextConfig rebuilds it from rope_theta and "
                     "partial_rotary_factors and ignores it; so does this reader")
    theta, factors = c.get("rope_theta", 10000.0), c.data.get("partial_rotary_factors")
    n, rope = len(types), {}
    for name, value in (("rope_theta", theta), ("partial_rotary_factors", factors)):
        if isinstance(value, list) and len(value) not in (n, n + (c.data.get("num_nextn_predict_layers") or 0)):
            raise c.error(f"config[{name!r}] must hold one value per layer (num_hidden_layers = {n})")
    for t in sorted(set(types)):
        i = types.index(t)
        params = {"rope_type": "default", "rope_theta": theta[i] if isinstance(theta, list) else theta}
        if factors:
            params["partial_rotary_factor"] = factors[i]
        rope[t] = params
    scaling = c.data.get("rope_scaling")
    if scaling and "full_attention" in rope:
        rope["full_attention"].update(scaling)
    data = {k: v for k, v in c.data.items() if k not in ("rope_theta", "partial_rotary_factors", "rope_scaling")}
    return _Config({**data, "rope_parameters": rope}, c.model_type, c.defaults), notes


def _step_heads(c: _Config, types: list) -> list:
    """Each layer's query heads: ``per_layer_config`` (a transformers object's ``to_dict()``) where given, else
    ``num_sliding_attention_heads`` (or the hub's ``attention_other_setting['num_attention_heads']``) on the sliding
    layers, ``num_attention_heads`` elsewhere."""
    heads = c.int("num_attention_heads", required=True)
    per_layer = c.data.get("per_layer_config")
    if per_layer is None:
        other = c.data.get("attention_other_setting") or {}
        sliding = c.int("num_sliding_attention_heads") or other.get("num_attention_heads") or heads
        return [sliding if t == "sliding_attention" else heads for t in types]
    if not isinstance(per_layer, dict):
        raise c.error("config['per_layer_config'] must map layer indices to settings")
    out = [heads] * len(types)
    for key, override in per_layer.items():
        i = int(key) if str(key).isdigit() else -1
        if not 0 <= i < len(types) or not isinstance(override, dict) or set(override) - {"num_attention_heads"}:
            raise c.error(f"config['per_layer_config'][{key!r}] must be a layer index below {len(types)} holding "
                          "num_attention_heads only (the override Step3p7TextConfig writes)")
        out[i] = _Config(override, c.model_type, {}).int("num_attention_heads", required=True)
    return out


def _step3p5(c):
    """Step 3.7's text decoder (HF ``Step3p7Attention``, config ``step3p5``): RoPE half layout per layer type (each
    type's ``rope_theta`` and ``partial_rotary_factor``: the first ``int(head_dim * factor)`` features; any
    ``rope_type`` on the full layers), GQA, ``head_dim`` from the config (default 128), the sliding layers' own query
    heads, a window on "sliding_attention" layers (HF's rule, i - W < j <= i), ``attention_bias`` on all four, scale
    ``query_pre_attn_scalar ** -0.5`` (default head_dim), per-head q/k RMSNorm with ``1 + w``, and each head's output
    times ``sigmoid(g_proj(x))``, one gate per head (``gating`` true or "per-head": HF's only working choice, since a
    per-feature ``g_proj`` does not broadcast against the heads). ``use_bidirectional_attention`` is refused."""
    refuse_keys(c, ("use_bidirectional_attention",))
    gating = c.data.get("gating", True)
    if not (gating is True or gating == "per-head"):
        raise c.error(f"config['gating'] = {gating!r}: Step3p7Attention builds a g_proj of num_heads * head_dim "
                      "outputs then, whose gate does not broadcast against the heads (transformers raises); only true "
                      "or 'per-head' is read")
    types = _step_types(c)
    c, notes = _step_rope(c, types)
    heads, sizes = _step_heads(c, types), layer_sizes(c)
    scale = float(c.get("query_pre_attn_scalar") or sizes["head_dim"]) ** -0.5
    bias = c.flag("attention_bias", False)
    specs = []
    for i, kind in enumerate(types):
        params = rope_parameters(c, kind)
        kwargs = {**sizes, "num_heads": heads[i], "bias": bias, "sliding_window": window_of(c, kind), "scale": scale,
                  "norm_eps": c.float("rms_norm_eps", positive=True), "norm_offset": 1.0, "gate": "head"}
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, make_rotary(c, params, "half"),
                               describe_rope(params, "half"), ("bg",) if bias else (),
                               ("q/k RMSNorm per head, weight 1 + w", "output gate per head: o_h * sigmoid(g)_h, "
                                "wg = g_proj's (no bias)")))
    return specs, notes


_STEP3P5 = {"hidden_size": 4096, "num_hidden_layers": 45, "num_attention_heads": 64, "num_key_value_heads": 8,
            "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 128000}
"""``Step3p7TextConfig``'s defaults."""


def _step3p5_vision(c):
    """Step 3.7's vision encoder (HF ``Step3p7VisionAttention``): the Qwen towers' 2-D RoPE (``"qwen"`` layout over
    the whole head, f_j = base^(-4j/D) for both axes), q, k, v and ``out_proj`` with biases, head dim ``hidden_size //
    num_attention_heads``, every layer full, bidirectional; the patches row-major, but HF's
    ``recomposition_frequencies`` flips the (row, column) ids (``freq.flip(1)``), so the first D/4 pairs turn by the
    column: positions ``axial_positions(h, w)[::-1]``. The hub's ``width``, ``layers``, ``heads`` are its aliases of
    ``hidden_size``, ``num_hidden_layers``, ``num_attention_heads``; a learned table, bilinearly resampled, is added
    before layer 0."""
    data = dict(c.data)
    for alias, key in (("width", "hidden_size"), ("layers", "num_hidden_layers"), ("heads", "num_attention_heads")):
        if data.get(alias) is not None:
            data[key] = data[alias]                                     # Step3p7VisionConfig: the alias wins
    c = _Config(data, c.model_type, c.defaults)
    names = {"spatial_merge_size": 1, "num_heads": c.int("num_attention_heads", required=True),
             "depth": c.int("num_hidden_layers", required=True)}              # qwen_tower's names for HF's keys here
    specs = qwen_tower(_Config({**data, **names}, c.model_type, c.defaults), "hidden_size")
    side = c.int("image_size", required=True) // c.int("patch_size", required=True)
    position = (f"2-D RoPE qwen, theta {specs[0].scheme().base:g}; positions (2, T): columns, then rows, the patches "
                "row-major (axial_positions(h, w)[::-1]: HF flips its (row, column) ids)")
    note = (f"before this layer a learned position table ({side} x {side}, image_size // patch_size a side, bilinearly "
            "resampled to the image's grid) is added to the patch embeddings: the input seam, not RoPE, and not "
            "modelled here")
    return [replace(s, position=position, notes=(note,) if s.index == 0 else ()) for s in specs]


VISION.update({"step3p5_vision": Family(_step3p5_vision, {
    "hidden_size": 1536, "num_hidden_layers": 47, "num_attention_heads": 16, "image_size": 728, "patch_size": 14,
    "rope_theta": 10000.0})})
VISION_OF.update({"step3p7": "step3p5_vision"})


# --------------------------------------------------------------------------- Muse Glimmer, Muse Spark

def _muse_glimmer(c, o_norm: bool = False):
    """Muse Glimmer's text decoder (HF ``MuseGlimmerTextAttention``): RoPE half layout on the whole head (any
    ``rope_type``) where ``layer_rope_theta[i]`` is not 0, NoPE where it is (default: every 4th layer counted back from
    the last, which are also the "full_attention" layers; the rest slide), GQA, ``head_dim`` from the config (default
    128), ``attention_bias`` on all four; q and k RMS-normed per head without weight, the query then times
    ``qk_scale_factor`` (here the scale, ``qk_scale_factor / sqrt(head_dim)``: RoPE is linear), and the heads' output
    times ``sigmoid(gate_proj(x))`` feature by feature. HF reads ``layer_rope_theta`` only as RoPE-or-NoPE: every RoPE
    layer takes ``rope_parameters['rope_theta']``, on every feature (its default rotary reads no
    ``partial_rotary_factor``); a note says so where they differ. Muse Spark's (``MuseSparkTextAttention``, o_norm
    True) is the same layer with each head's output RMS-normed without weight before the gate."""
    n = c.int("num_hidden_layers", required=True)
    nope = lambda i: (n - 1 - i) % 4 == 0                                  # noqa: E731  (the config class's rule)
    types = layer_types_of(c, lambda i: "full_attention" if nope(i) else "sliding_attention")
    params, sizes, notes = rope_parameters(c), layer_sizes(c), []
    if "partial_rotary_factor" in params:                  # HF: not read by "default", a shape error for the others
        if params["rope_type"] != "default":
            raise c.error(f"config['rope_parameters']['partial_rotary_factor'] with rope_type {params['rope_type']!r}: "
                          "MuseGlimmerTextAttention rotates every feature by cos and sin of head_dim * factor "
                          "(transformers raises); only the default type, which ignores the factor, is read")
        shown = short_value(params.pop("partial_rotary_factor"))
        notes.append(f"partial_rotary_factor {shown} is not read: transformers 5.24 "
                     "rotates the whole head (MuseGlimmerTextRotaryEmbedding's default), and so does this reader")
    thetas = c.data.get("layer_rope_theta")
    if thetas is None:
        thetas = [0 if nope(i) else params["rope_theta"] for i in range(n)]
    if not isinstance(thetas, list) or len(thetas) != n or any(isinstance(t, bool) or not isinstance(t, (int, float))
                                                               for t in thetas):
        raise c.error(f"config['layer_rope_theta'] must hold one number per layer (num_hidden_layers = {n}; 0: NoPE), "
                      f"got {thetas!r:.200}")
    factor = c.float("qk_scale_factor", positive=True)                   # minipos' scale must be > 0
    scale = factor / sizes["head_dim"] ** 0.5
    bias, specs = c.flag("attention_bias", False), []
    ignored = sorted({t for t in thetas if t and t != params["rope_theta"]})
    if ignored:
        notes.append(f"layer_rope_theta {ignored} is not read as a base: transformers 5.24 gives every RoPE layer "
                     f"rope_parameters['rope_theta'] ({params['rope_theta']:g}); only 0 (NoPE) matters, here too")
    for i, kind in enumerate(types):
        kwargs = {**sizes, "bias": bias, "sliding_window": window_of(c, kind), "scale": scale,
                  "norm_eps": c.float("rms_norm_eps", positive=True), "gate": "feature", "o_norm": o_norm}
        make, position = make_rotary(c, params, "half"), describe_rope(params, "half")
        if not thetas[i]:
            make, position = NoPE, "NoPE (layer_rope_theta 0)"
        specs.append(LayerSpec(i, kind, QKNormAttention, kwargs, make, position, ("bg",) if bias else (),
                               (f"q/k RMSNorm per head without weight (q_norm = k_norm = 1), queries x "
                                f"qk_scale_factor {factor:g}",
                                "output gate per feature: o * sigmoid(g), wg = gate_proj's (no bias)"
                                + ("; each head's output RMS-normed (no weight) before it (o_norm)" if o_norm else ""))))
    return check_built(c, specs), notes


_MUSE_GLIMMER = {"hidden_size": 6656, "num_hidden_layers": 52, "num_attention_heads": 32, "num_key_value_heads": 2,
                 "head_dim": 128, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 131072,
                 "sliding_window": 2048, "qk_scale_factor": 3.87}
"""``MuseGlimmerTextConfig``'s defaults (its ``rope_parameters`` default: ``PreTrainedConfig``'s theta 10000)."""


_MUSE_SPARK = {"hidden_size": 8192, "num_hidden_layers": 62, "num_attention_heads": 128, "num_key_value_heads": 16,
               "head_dim": 64, "rms_norm_eps": 1e-5, "max_position_embeddings": 1048576, "sliding_window": 2048,
               "qk_scale_factor": 5.4730064863875, "rope_theta": 500_000.0}
"""``MuseSparkTextConfig``'s defaults."""


def _muse_vision(c):
    """Muse Glimmer's and Muse Spark's vision encoder (HF ``MuseGlimmerVisionAttention``, ``MuseSparkVisionAttention``):
    the Qwen towers' 2-D RoPE (``"qwen"`` layout, f_j = base^(-4j/D) for both axes), q, k, v and ``proj`` with biases,
    head dim ``hidden_size // num_attention_heads``, bidirectional. HF flips the (row, column) ids and adds 1
    (``position_ids.flip(-1) + 1``), then holds the patches in Qwen2.5-VL's window order (``get_vision_window_index``,
    merge 1, windows of ``pos_emb_height`` patches a side): positions ``merge_positions(h, w, 1, window=W)[::-1] +
    1``, the first D/4 pairs turned by the column (the + 1 changes no output: each axis turns relatively).
    "window_attention" layers attend within their window (``axial_window_mask`` of the 0-based positions),
    "full_attention" layers over the image; default: full every 4th layer and the last. A learned
    ``pos_emb_height`` x ``pos_emb_width`` table is added before layer 0."""
    n = c.int("num_hidden_layers", required=True)
    types = layer_types_of(c, lambda i: "full_attention" if (i + 1) % 4 == 0 or i == n - 1 else "window_attention",
                           allowed=("full_attention", "window_attention"))
    W, side_w = c.int("pos_emb_height", required=True), c.int("pos_emb_width", required=True)
    data = {**c.data, "spatial_merge_size": 1, "num_heads": c.int("num_attention_heads", required=True), "depth": n}
    specs = qwen_tower(_Config(data, c.model_type, c.defaults), "hidden_size")
    position = (f"2-D RoPE qwen, theta {specs[0].scheme().base:g}; positions (2, T): columns + 1, then rows + 1, in "
                f"window order (merge_positions(h, w, 1, window={W})[::-1] + 1: HF flips its ids and adds 1)")
    out = []
    for s, kind in zip(specs, types):
        notes = (f"pos_emb_height {W}: pass mask=axial_window_mask(merge_positions(h, w, 1, window={W}), {W}) (the "
                 "0-based positions) repeated to (B, T, T)",) if kind == "window_attention" else ()
        if s.index == 0:
            notes += (f"before this layer a learned position table ({W} x {side_w}, bilinearly resampled by "
                      "grid_sample, read at (column, row)) is added to the patch embeddings: the input seam, not "
                      "RoPE, and not modelled here",)
        out.append(replace(s, layer_type=kind, position=position, notes=notes,
                           patch_window=W if kind == "window_attention" else None))
    return out


_MUSE_VISION = {"hidden_size": 1536, "num_hidden_layers": 50, "num_attention_heads": 16, "patch_size": 14,
                "pos_emb_height": 32, "pos_emb_width": 32, "rope_theta": 10000.0}
VISION.update({"muse_glimmer_vision": Family(_muse_vision, _MUSE_VISION),
               "muse_spark_vision": Family(_muse_vision, _MUSE_VISION)})
VISION_OF.update({"muse_glimmer": "muse_glimmer_vision", "muse_spark": "muse_spark_vision"})


# --------------------------------------------------------------------------- Dots 3 Note

def _dots3_note_vision(c):
    """Dots 3 Note's vision encoder (HF ``Dots3NoteVisionAttention``): the Qwen towers' 2-D RoPE (``"qwen"`` layout,
    rows first) and patch order (``merge_positions(h, w, spatial_merge_size)``), one ``qkv`` and one ``proj``, both with
    ``attention_bias`` (default none), per-head q/k RMSNorm (weight w) before RoPE, head dim ``hidden_size //
    num_attention_heads``, every layer full, bidirectional, no learned table. The hub's ``embed_dim``, ``num_heads``,
    ``use_bias`` are its aliases of ``hidden_size``, ``num_attention_heads``, ``attention_bias``."""
    data = dict(c.data)
    aliases = (("embed_dim", "hidden_size"), ("num_heads", "num_attention_heads"), ("use_bias", "attention_bias"))
    for alias, key in aliases:
        if data.get(alias) is not None:
            data[key] = data[alias]                                     # Dots3NoteVisionConfig: the alias wins
    c = _Config(data, c.model_type, c.defaults)
    bias = c.flag("attention_bias", False)
    specs = qwen_tower(_Config({**data, "num_heads": c.int("num_attention_heads", required=True),
                                "depth": c.int("num_hidden_layers", required=True)}, c.model_type, c.defaults),
                       "hidden_size")
    kwargs = {**specs[0].kwargs, "bias": bias, "norm_eps": c.float("rms_norm_eps", positive=True)}
    return [replace(s, cls=QKNormAttention, kwargs=kwargs, notes=("q/k RMSNorm per head (weight w)",)) for s in specs]


VISION.update({"dots3_note_vision_encoder": Family(_dots3_note_vision, {
    "hidden_size": 1536, "num_hidden_layers": 42, "num_attention_heads": 24, "patch_size": 14,
    "spatial_merge_size": 2, "rms_norm_eps": 1e-5, "rope_theta": 10000.0})})
VISION_OF.update({"dots3_note": "dots3_note_vision_encoder"})


# --------------------------------------------------------------------------- MusicFlamingo

def _musicflamingo(c):
    """MusicFlamingo's text decoder: ``AutoModel.from_config(text_config)``, a Qwen2 (``Qwen2Attention``: RoPE half,
    q/k/v biases, sliding layers from ``layer_types`` / ``max_window_layers``); ``(specs, notes)``, the audio encoder
    and its rotary time embedding named in a note."""
    note = ("the audio encoder (audio_config, an AudioFlamingo3 Whisper encoder) is not read, nor the rotary time "
            "embedding MusicFlamingo applies to its output (the top-level rope_parameters: theta 1200, "
            "partial_rotary_factor 0.2, by window and time, an input seam of the audio features, not of the decoder)")
    return dense_layers(c, bias="qkv", window="types"), [note]


FAMILIES = {
    "minimax_m3_vl_text": Family(_minimax_m3, _MINIMAX_M3),
    "step3p5": Family(_step3p5, _STEP3P5),
    "muse_glimmer_text": Family(_muse_glimmer, _MUSE_GLIMMER),
    "muse_spark_text": Family(lambda c: _muse_glimmer(c, o_norm=True), _MUSE_SPARK),
    "musicflamingo_text": Family(_musicflamingo, {"rope_theta": 10000.0, "max_position_embeddings": 32768,
                                                  "max_window_layers": 28}),
}
"""``model_type`` -> ``Family``: the decoders of this module (``minipos.config`` merges them into its own)."""

TEXT_OF = {"minimax_m3_vl": "minimax_m3_vl_text", "step3p7": "step3p5", "muse_glimmer": "muse_glimmer_text",
           "muse_spark": "muse_spark_text", "dots3_note": "dots3_note_text",
           "musicflamingo": "musicflamingo_text"}     # MusicFlamingoConfig's text_config: a Qwen2Config by default

TEXT_RENAMED.update({("musicflamingo", "qwen2"): "musicflamingo_text"})     # Qwen2's layers, with the audio note
