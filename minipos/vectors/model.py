"""Golden vectors of one model's attention layers, read from its config (``minipos vectors export
--config CONFIG.json DIR``): the family ``model_layers``, one file ``model_layers.json``.

It is not part of the spec minipos ships (``FAMILIES``): a porter writes it for the model they port,
and ``minipos vectors check DIR`` recomputes it like any family. One case per distinct layer of the
model (the first layer of each kind: a local and a global layer, a RoPE and a NoPE layer, ...), each
a forward pass of the layer ``minipos.config.read`` builds, on a *narrowed* copy of the config: the
width (``hidden_size`` 16), the heads (2 query heads, 1 or 2 key/value heads: grouped-query or not,
as the model) and MLA's latent ranks (8) are made small so that the weights fit in a file; every
position setting (head dim, RoPE parameters, windows, chunks, temperature, sinks, layer pattern) is
the model's. The case records that config in ``params.config`` and the layer index in
``params.layer``. Positions step by a stride chosen so that seven tokens reach past the smallest of
the model's window, chunk, temperature floor and original training length (scaled RoPE), so each of
them changes the output; M-RoPE layers get three streams of different strides. A layer that attends with an
earlier layer's keys and values (``minipos.kv_share``: Gemma 3n, Gemma 4 E2B) gets that source layer's weights
and input too (``source.<weight>``, ``source.x``): the source fills a cache at the same positions, the layer
reads it.

A model with a vision tower (``.vision``: 2-D RoPE) gets one case per kind of tower layer too (and a tower's
own config, or SAM's video trackers' memory attention, ``memory<i>``, gets those alone),
``vision<i>``: the tower's own config (``vision_config``) in ``params.config``, ``params.tower`` =
``"vision"``, and the layer narrowed by keywords (``params.narrow``: ``d_model`` 16, 2 heads, each
head as wide as the model's, so the frequencies are the model's), bidirectional, at positions
``(2, T)`` (rows, then columns) that reach the edge of the tower's largest patch grid (64 a side when the
config names none); a layer with
square windows (Qwen2.5-VL) runs with its ``axial_window_mask``; the first, at (0, 0), is MLCD's class token, turned
by its learned angles. A vision tower's own config (Qwen3.5's ``vision_config``, say) gets those cases only. A
scheme's learned parameters are inputs like the weights, ``scheme.<name>`` (MLCD's ``scheme.class_pos_emb``).
"""

from __future__ import annotations

import math

import numpy as np

from .. import config as model_config
from .._checks import POSITION_LIMIT
from ..axial import axial_window_mask
from ..kv_share import SharedKVAttention
from ..mla import MultiHeadLatentAttention
from .cases import _case, _grid, tol

FAMILY = "model_layers"
FUNCTION = "minipos.config.read"
DESCRIPTION = ("one model's attention layers as minipos.config.read builds them from its config (narrowed: "
               "hidden_size 16, 2 heads), one forward pass per kind of layer at strided positions")
BATCH, LENGTH, WIDTH = 2, 7, 16
FLOAT32 = 1e-2   # positions reach the model's windows and original lengths (thousands): float32 angles err there


def narrowed(text: dict, model_type: str, head_dim: int | None = None) -> dict:
    """The text config with its widths made small and every position setting kept (module docstring).
    head_dim: the head dim the reader built (its family's default width over its heads), kept when the
    config states neither ``head_dim`` nor ``hidden_size``."""
    small = dict(text, model_type=model_type)
    heads = small.get("num_attention_heads") or 1
    kv = small.get("num_key_value_heads") or heads
    if small.get("head_dim") is None and "kv_lora_rank" not in small:
        width = small["hidden_size"] // heads if small.get("hidden_size") else head_dim
        if width:
            small["head_dim"] = width                                      # kept when the width shrinks
    small.update(hidden_size=WIDTH, num_attention_heads=2, num_key_value_heads=1 if kv < heads else 2)
    if model_type.startswith("minimax_m3"):              # its indexer's heads group the query heads: one per kv head
        small["index_n_heads"] = small["num_key_value_heads"]
        if isinstance(small.get("sparse_attention_config"), dict):            # whose legacy name would win
            small["sparse_attention_config"] = {k: v for k, v in small["sparse_attention_config"].items()
                                                if k != "sparse_num_index_heads"}
    for key in ("kv_lora_rank", "q_lora_rank"):
        if small.get(key):
            small[key] = min(small[key], 8)
    return small


def _stride(spec, text: dict) -> int:
    """A position stride that takes ``LENGTH`` tokens past the smallest length of the layer's machinery."""
    kw, lengths = spec.kwargs, []
    lengths += [kw[k] for k in ("sliding_window", "attention_chunk") if kw.get(k)]
    params = text.get("rope_parameters") or text.get("rope_scaling") or {}
    for p in [params, *(v for v in params.values() if isinstance(v, dict))]:
        if p.get("original_max_position_embeddings"):
            lengths.append(p["original_max_position_embeddings"])
    if text.get("original_max_position_embeddings"):
        lengths.append(text["original_max_position_embeddings"])
    if "temperature" in spec.position:
        lengths.append(text.get("floor_scale") or 8192)
    lengths = [n for n in lengths if n <= POSITION_LIMIT // LENGTH]          # longer ones no int64 position reaches
    return max(1, math.ceil(2 * min(lengths) / (LENGTH - 1))) if lengths else 1


def _weights(layer) -> list:
    """The names of the layer's weight attributes that are set (the sinks included), then its scheme's learned
    parameters as ``scheme.<name>`` (MLCD's ``scheme.class_pos_emb``)."""
    names = [n for n in layer._weight_shapes() if getattr(layer, n) is not None]
    names += ["sinks"] if getattr(layer, "sinks", None) is not None else []
    return names + [f"scheme.{n}" for n in layer.scheme.parameters()]


def _owner(layer, name: str) -> tuple:
    """``(object, attribute)`` of the weight ``name`` of ``_weights``: the layer's, or its scheme's."""
    return (layer.scheme, name[len("scheme."):]) if name.startswith("scheme.") else (layer, name)


def cases(config) -> list:
    """The ``model_layers`` cases of ``config`` (anything ``minipos.config.read`` takes)."""
    model = model_config.read(config)
    if model.kind != "decoder":                    # a tower's own config (or SAM's memory attention): its layers only
        return _vision_cases(model) + ([] if model.vision is None else _vision_cases(model.vision))
    small = narrowed(model.config, model.model_type, model.specs[0].kwargs.get("head_dim"))
    narrow = model_config.read(small)
    seen, out = set(), []
    for spec in narrow.specs:
        key = (spec.layer_type, spec.cls, spec.position, tuple(sorted((k, repr(v)) for k, v in spec.kwargs.items())),
               spec.no_bias)
        if key in seen:
            continue
        seen.add(key)
        rng = np.random.default_rng(1000 + spec.index)
        layer = spec.build()
        stride = _stride(spec, small)
        steps = np.arange(LENGTH) * stride
        positions = (np.stack([steps, steps // 2, (steps * 3) // 4]) if layer.scheme.position_streams == 3
                     else steps)
        inputs = {"x": _grid(rng, (BATCH, LENGTH, WIDTH)), "positions": positions.astype(np.int64)}
        _weight_inputs(rng, layer, inputs)
        if isinstance(layer, SharedKVAttention):                # its keys: the source layer's, on its own input
            source = next(s for s in narrow.specs if s.index == layer.kv_source).build()
            inputs["source.x"] = _grid(rng, (BATCH, LENGTH, WIDTH))
            _weight_inputs(rng, source, inputs, "source.")
        kind = "MultiHeadLatentAttention" if isinstance(layer, MultiHeadLatentAttention) else type(layer).__name__
        note = (f"{model.model_type} layer {spec.index} ({spec.layer_type}; {spec.position}) as {kind}, narrowed to "
                f"hidden_size {WIDTH}; causal, positions {positions.tolist()}")
        out.append(_case(f"layer{spec.index}_{spec.layer_type}", note, inputs,
                         {"config": small, "layer": spec.index}, tol(1e-9, FLOAT32)))
    return out + ([] if model.vision is None else _vision_cases(model.vision))


def _weight_inputs(rng, layer, inputs: dict, prefix: str = "") -> None:
    """Each weight of ``layer`` drawn on the case's grid into ``inputs`` (norm weights about 1)."""
    for name in _weights(layer):
        value = getattr(*_owner(layer, name))
        base = 1.0 if name.endswith("_norm") and not getattr(layer, "norm_offset", 0.0) else 0.0
        inputs[prefix + name] = base + _grid(rng, value.shape, 0.5 if value.ndim == 1 else 1 / np.sqrt(value.shape[0]))


def _narrow(spec) -> dict:
    """A vision layer's keywords made small: 2 query heads (grouped into 1 key/value head when the tower
    groups them), ``d_model`` ``WIDTH``, the head dim kept."""
    kv = spec.kwargs.get("num_kv_heads") or spec.kwargs["num_heads"]
    return {"d_model": WIDTH, "num_heads": 2, "num_kv_heads": 1 if kv < spec.kwargs["num_heads"] else 2}


def _vision_positions(tower) -> np.ndarray:
    """``(2, LENGTH)`` patch rows and columns, the last at the far corner of the largest grid (64 patches a side
    when the config names no image size: Qwen's towers take any)."""
    size, patch = tower.config.get("image_size"), tower.config.get("patch_size")
    side = max(2, size // patch) if isinstance(size, int) and isinstance(patch, int) and patch > 0 else 64
    rows = np.array([0, 0, 1, 1, 2, side // 2, side - 1])
    cols = np.array([0, 1, 0, 1, 3, side // 3, side - 1])
    return np.stack([rows, cols]).astype(np.int64)


def _vision_cases(tower) -> list:
    seen, out = set(), []
    for spec in tower.specs:
        key = (spec.layer_type, spec.cls, spec.position, tuple(sorted((k, repr(v)) for k, v in spec.kwargs.items())))
        if key in seen:
            continue
        seen.add(key)
        rng = np.random.default_rng(2000 + spec.index)
        narrow = _narrow(spec)
        layer = _build(spec, narrow)
        positions = _vision_positions(tower)
        if layer.scheme.position_streams == 3:                  # MiniMax M3's 3-D tower: (3, T), frames first
            positions = np.vstack([np.array([0, 0, 0, 0, 1, 1, 2], np.int64), positions])
        elif isinstance(getattr(layer.scheme, "width", None), int):   # a grid of its own (DecomposedRelPos): (T,) flat
            h, w = layer.scheme.height, layer.scheme.width      # row-major indices, the rows and columns inside it
            positions = np.minimum(positions[0], h - 1) * w + np.minimum(positions[1], w - 1)
        inputs = {"x": _grid(rng, (BATCH, LENGTH, WIDTH)), "positions": positions}
        _weight_inputs(rng, layer, inputs)
        note = (f"{tower.model_type} {tower.kind} layer {spec.index} ({spec.position}) as {type(layer).__name__}, "
                f"narrowed to d_model {WIDTH}, 2 heads of {layer.head_dim}; bidirectional, positions "
                f"{positions.tolist()}")
        prefix = "vision" if tower.kind == "vision encoder" else tower.kind.split()[0]      # "memory"
        out.append(_case(f"{prefix}{spec.index}", note, inputs,
                         {"config": tower.config, "tower": "vision", "layer": spec.index, "narrow": narrow},
                         tol(1e-9, FLOAT32)))
    return out


def _build(spec, narrow: dict):
    layer = spec.cls(scheme=spec.scheme(), seed=0, **{**spec.kwargs, **narrow})
    for name in spec.no_bias:
        setattr(layer, name, None)
    return layer


def run(inputs, params) -> dict:
    """``{"y": (B, T, hidden_size)}``: the case's layer, its weights set from ``inputs``, on ``x`` at
    ``positions``, causal. An input that is no weight of the layer is refused by name."""
    model = model_config.read(dict(params["config"]))
    tower = params.get("tower")
    if tower not in (None, "vision"):
        raise ValueError(f"params.tower must be 'vision' or absent, got {tower!r}")
    if tower == "vision" and model.kind == "decoder":
        raise ValueError(f"params.tower is 'vision' but params.config is a decoder's ({model.model_type!r})")
    index = params["layer"]
    by_index = {spec.index: spec for spec in model.specs}   # a model's index among all its layers (LFM3: some are
    if not isinstance(index, int) or isinstance(index, bool) or index not in by_index:   # convolutions, not read)
        raise ValueError(f"params.layer must be the index of one of the model's attention layers "
                         f"({min(by_index)}..{max(by_index)}), got {index!r}")
    spec = by_index[index]
    narrow = params.get("narrow")
    if tower == "vision":
        if not isinstance(narrow, dict) or set(narrow) != {"d_model", "num_heads", "num_kv_heads"} or not all(
                isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in narrow.values()):
            raise ValueError("params.narrow must be {'d_model', 'num_heads', 'num_kv_heads'} as integers >= 1, "
                             f"got {narrow!r}")
        layer = _build(spec, narrow)
    elif narrow is not None:
        raise ValueError("params.narrow is read for a vision tower's case only (params.tower 'vision')")
    else:
        layer = spec.build()
    names, cache = _weights(layer), None
    if isinstance(layer, SharedKVAttention):                    # the source layer fills the cache it reads
        source = by_index[layer.kv_source].build()
        names += ["source." + n for n in _weights(source)] + ["source.x"]
    unknown = sorted(set(inputs) - set(names) - {"x", "positions"})
    if unknown:
        raise ValueError(f"inputs: {unknown[0]!r} is not a weight of this layer; it has {names}")
    for name in names:
        if name in inputs and not name.startswith("source."):
            setattr(*_owner(layer, name), inputs[name])
    if isinstance(layer, SharedKVAttention):
        if "source.x" not in inputs:
            raise ValueError(f"inputs: 'source.x' is required: layer {index} attends with the keys and values of "
                             f"layer {layer.kv_source} on that input")
        for name in names:
            if name in inputs and name.startswith("source.") and name != "source.x":
                setattr(*_owner(source, name[len("source."):]), inputs[name])
        cache = source.new_cache()
        source(inputs["source.x"], positions=inputs["positions"], causal=spec.causal, cache=cache)
    mask = None
    if spec.patch_window is not None:                          # the layer takes a (B, T, S) mask, one per sequence
        B, T = np.shape(inputs["x"])[:2]
        mask = np.broadcast_to(axial_window_mask(inputs["positions"], spec.patch_window), (B, T, T))
    return {"y": layer(inputs["x"], positions=inputs["positions"], causal=spec.causal, mask=mask, cache=cache)}
