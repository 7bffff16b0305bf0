"""The cases of the layer families: ``MultiHeadAttention`` with each scheme (``layer``, ``layer_grad``),
with iRoPE's temperature and chunks, with Shaw et al.'s relative keys and values, with sliding windows,
grouped-query heads, sinks and StreamingLLM's cache (``local_global``), and DeepSeek's
``MultiHeadLatentAttention`` (``mla``): forward passes, cached decoding and backwards.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..layer import MultiHeadAttention
from ..mla import DecoupledRotary, MultiHeadLatentAttention
from ..schemes import ENTRIES
from ..streaming import StreamingCache
from ._layer_cases import (BATCH, D_MODEL, HEADS, LENGTH, _agree_with_differences, _build_layer, _causal_only,
                           _causal_run, _in_chunks, _many, _scheme, _set_weights)
from ._text import _short
from .cases import _case, _grid, tol


# --------------------------------------------------------------------------- the layer

LAYER_SCHEMES = (
    ("nope", "nope", {}, False), ("sinusoidal", "sinusoidal", {"layout": "interleaved"}, False),
    ("learned", "learned", {"max_positions": 8}, False),
    ("rope_half", "rope", {"layout": "half"}, True),
    ("rope_interleaved_partial", "rope", {"layout": "interleaved", "rotary_dim": 2}, True),
    ("rope_yarn", "rope", {"layout": "half", "scaling": {"rope_type": "yarn", "factor": 4.0,
                                                         "original_max_position_embeddings": 4}}, True),
    ("rope_dynamic", "rope", {"layout": "half", "scaling": {"rope_type": "dynamic", "factor": 2.0,
                                                            "original_max_position_embeddings": 4}}, True),
    ("xpos", "xpos", {}, True), ("alibi", "alibi", {}, True), ("alibi_symmetric", "alibi", {"symmetric": True}, False),
    ("t5_encoder", "t5", {"num_buckets": 8, "max_distance": 8, "bidirectional": True}, False),
    ("t5_decoder", "t5", {"num_buckets": 8, "max_distance": 8, "bidirectional": False}, True),
    ("transformer_xl", "transformer-xl", {}, True),
    ("deberta", "deberta", {"position_buckets": 4, "max_relative_positions": 8}, False),
    ("rope_linear", "rope", {"layout": "half", "scaling": {"rope_type": "linear", "factor": 2.0}}, True),
    ("rope_ntk", "rope", {"layout": "half", "scaling": {"rope_type": "ntk", "factor": 4.0}}, True),
    ("rope_llama3", "rope", {"layout": "half", "scaling": {"rope_type": "llama3", "factor": 8.0,
                                                           "original_max_position_embeddings": 16,
                                                           "low_freq_factor": 1.0, "high_freq_factor": 4.0}}, True),
    ("rope_longrope", "rope", {"layout": "half", "scaling": {"rope_type": "longrope", "short_factor": [1.0, 1.5],
                                                             "long_factor": [2.0, 8.0],
                                                             "original_max_position_embeddings": 4,
                                                             "max_position_embeddings": 16}}, True),
    ("rope_yarn_partial", "rope", {"layout": "half", "rotary_dim": 2,
                                   "scaling": {"rope_type": "yarn", "factor": 4.0,
                                               "original_max_position_embeddings": 4}}, True),
    ("alibi_default_bidirectional", "alibi", {}, False),
)
CACHED = ("rope_half", "rope_dynamic", "xpos", "alibi", "t5_decoder", "transformer_xl", "rope_longrope")
SCHEME_CONFIGS = {label: (name, config) for label, name, config, _ in LAYER_SCHEMES}
# More forward cases: (label, scheme label, causal, bias, key padding, chunks)
LAYER_MORE = (
    ("nope_bias", "nope", False, True, None, [LENGTH]),
    ("rope_half_bias", "rope_half", True, True, None, [LENGTH]),
    ("t5_encoder_bias_padded", "t5_encoder", False, True, "right", [LENGTH]),
    ("alibi_default_padded", "alibi_default_bidirectional", False, False, "right", [LENGTH]),
    ("deberta_padded", "deberta", False, True, "right", [LENGTH]),
    ("rope_half_left_padded", "rope_half", True, False, "left", [LENGTH]),
    ("transformer_xl_left_padded", "transformer_xl", True, False, "left", [LENGTH]),
    ("alibi_left_padded_cached", "alibi", True, False, "left", [3, 1, 1, 2]),
)

# Grouped-query cases: 4 query heads on 2 key/value heads (head_dim 2), so the head map is neither the
# identity (KV = H) nor constant (KV = 1): query head h reads key/value head h // 2 (HF's repeat_kv),
# which a port tiling the heads (h % 2) gets wrong for heads 1 and 2. (label, scheme label, chunks)
GQA_HEADS, GQA_KV = 4, 2
LAYER_GQA = (
    ("rope_half_gqa_h4_kv2", "rope_half", [LENGTH]),
    ("rope_half_gqa_h4_kv2_cached", "rope_half", [3, 1, 1, 2]),
    ("alibi_gqa_h4_kv2", "alibi", [LENGTH]),
)
GQA_LABELS = {label for label, _, _ in LAYER_GQA}
GQA_NOTE = (f"num_heads={GQA_HEADS}, num_kv_heads={GQA_KV}: query head h reads key/value head "
            f"h // {GQA_HEADS // GQA_KV} (heads 0, 1 -> 0; 2, 3 -> 1), not h % {GQA_KV}")


def _padding(kind: str) -> np.ndarray:
    """A key padding mask ``(B, T)``: batch 0 unpadded, batch 1 with its last (``"right"``) or first
    (``"left"``) two tokens padding. Left padding under a causal mask leaves rows with no key."""
    mask = np.ones((BATCH, LENGTH), dtype=bool)
    mask[1, -2:] = kind != "right"
    mask[1, :2] = kind != "left"
    return mask


PADDING_NOTE = {"right": "key padding: the last two keys of batch 1 masked",
                "left": "key padding: the first two keys of batch 1 masked, so under the causal mask its "
                        "first two queries have no key (fully masked rows: zero output)"}


def _layer_inputs(rng, scheme, with_bias: bool, heads: int = HEADS, kv: int | None = None) -> dict:
    """x, the projections and the scheme's learned parameters, drawn at the shapes of a layer of ``heads``
    query heads and ``kv`` key/value heads (None: ``heads``): wk, wv ``(D_MODEL, kv*D)``."""
    layer = MultiHeadAttention(D_MODEL, heads, scheme=scheme, bias=with_bias, num_kv_heads=kv)
    inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
    for name in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
        w = getattr(layer, name)
        if w is not None:
            inputs[name] = _grid(rng, w.shape, 1 / np.sqrt(D_MODEL))
    for name, p in scheme.parameters().items():
        inputs[f"scheme.{name}"] = _grid(rng, p.shape, 0.5)
    return inputs


OWN_FAMILIES = {"mrope": "mrope_layer", "shaw": "shaw_layer", "nope-temperature": "irope_layer"}
"""Registered schemes whose layer cases are in families of their own."""


def _registered_examples() -> list:
    """``(label, name, config, causal)`` of every registered scheme (``minipos.schemes``) that no
    case above covers, configured by its entry's ``example``: a new scheme gets its ``layer`` and
    ``layer_grad`` cases without an edit here. Each draws its inputs from a generator of its own,
    so the cases before it keep their values."""
    covered = {name for _, name, _, _ in LAYER_SCHEMES} | set(OWN_FAMILIES)
    return [(f"{name.replace('-', '_')}_example", name, entry.example(LENGTH), True)
            for name, entry in ENTRIES.items() if name not in covered]


def _own_rng(label: str):
    return np.random.default_rng(zlib.crc32(label.encode()))


def _layer_cases():
    rng = np.random.default_rng(12)
    cases = []
    for label, name, config, causal in LAYER_SCHEMES:
        with_bias = name == "deberta"
        for chunks in ([LENGTH],) + (([3, 1, 1, 2],) if label in CACHED else ()):
            cached = len(chunks) > 1
            inputs = _layer_inputs(rng, _scheme(name, config), with_bias)
            params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": with_bias, "scheme": name,
                      "scheme_config": config, "causal": causal, "chunks": chunks}
            note = (f"MultiHeadAttention with {name}; " + ("the input fed through a KV cache in chunks "
                    f"{chunks}, outputs concatenated" if cached else "one forward pass, positions 0 ... T-1"))
            cases.append(_case(f"{label}_cached" if cached else label, note, inputs, params, tol()))
    for label, scheme_label, causal, with_bias, padding, chunks in LAYER_MORE:
        name, config = SCHEME_CONFIGS[scheme_label]
        inputs = _layer_inputs(rng, _scheme(name, config), with_bias)
        notes = [f"MultiHeadAttention with {name}", "causal" if causal else "no causal mask"]
        if with_bias:
            notes.append("bias=True: bq, bk, bv, bo added after the projections")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache in chunks {chunks}, each chunk given the mask of the keys so far")
        params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": with_bias, "scheme": name,
                  "scheme_config": config, "causal": causal, "chunks": chunks}
        cases.append(_case(label, "; ".join(notes), inputs, params, tol()))
    for label, scheme_label, chunks in LAYER_GQA:
        name, config = SCHEME_CONFIGS[scheme_label]
        inputs = _layer_inputs(_own_rng(label), _scheme(name, config), False, GQA_HEADS, GQA_KV)
        params = {"d_model": D_MODEL, "num_heads": GQA_HEADS, "num_kv_heads": GQA_KV, "bias": False, "scheme": name,
                  "scheme_config": config, "causal": True, "chunks": chunks}
        cases.append(_case(label, f"MultiHeadAttention with {name}, causal; {GQA_NOTE}" + (
            f"; fed through a KV cache (of the {GQA_KV} key/value heads) in chunks {chunks}" if len(chunks) > 1
            else "; one forward pass"), inputs, params, tol()))
    for label, name, config, causal in _registered_examples():
        inputs = _layer_inputs(_own_rng(label), _scheme(name, config), False)
        params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": False, "scheme": name, "scheme_config": config,
                  "causal": causal, "chunks": [LENGTH]}
        cases.append(_case(label, f"MultiHeadAttention with {name} (its registry example); one forward pass, "
                           "causal", inputs, params, tol()))
    return cases


def _key_padding(inputs, B: int, T: int):
    """The case's key padding mask ``(B, T)`` (``True`` = a real token), or None."""
    mask = inputs.get("mask")
    if mask is not None and (mask.dtype != bool or mask.shape != (B, T)):
        raise ValueError(f"inputs.mask must be a bool key padding mask of shape (B, T) = {(B, T)}, got "
                         f"{mask.dtype} {list(mask.shape)}")
    return mask


def _layer_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("mask",))
    x, mask = inputs["x"], _key_padding(inputs, *inputs["x"].shape[:2])
    cache = layer.new_cache() if _many(params["chunks"]) else None
    return _in_chunks(x, params["chunks"], lambda t: layer(                # mask (B, S): cached and new keys
        x[:, t], mask=None if mask is None else mask[:, :t.stop], causal=params["causal"], cache=cache))


def _layer_grad_cases():
    rng = np.random.default_rng(22)
    cases = []
    runs = [(label, label, causal, name == "deberta", None) for label, name, _, causal in LAYER_SCHEMES]
    runs += [(f"{label}_{'bidirectional' if causal else 'causal'}_padded", label, not causal, name == "deberta",
              "right" if causal else "left") for label, name, _, causal in LAYER_SCHEMES]
    runs += [("nope_bias", "nope", False, True, None), ("rope_half_bias_padded", "rope_half", True, True, "left"),
             ("t5_encoder_bias_padded", "t5_encoder", False, True, "right")]
    configs = {**SCHEME_CONFIGS, **{label: (name, config) for label, name, config, _ in _registered_examples()}}
    runs += [(label, label, causal, False, None) for label, _, _, causal in _registered_examples()]
    runs += [(label, scheme_label, True, False, None) for label, scheme_label, chunks in LAYER_GQA
             if len(chunks) == 1]
    for label, scheme_label, causal, with_bias, padding in runs:
        name, config = configs[scheme_label]
        gqa = label in GQA_LABELS
        own = scheme_label not in SCHEME_CONFIGS or gqa                        # a registry example, or GQA
        heads = (GQA_HEADS, GQA_KV) if gqa else (HEADS, None)
        inputs = _layer_inputs(_own_rng(label) if own else rng, _scheme(name, config), with_bias, *heads)
        inputs["dy"] = _grid(_own_rng(label + "/dy") if own else rng, (BATCH, LENGTH, D_MODEL))
        notes = [f"layer.backward(ctx, dy) of MultiHeadAttention with {name}", "causal" if causal else
                 "no causal mask"] + ([GQA_NOTE + "; dk, dv sum the gradients of each key/value head's "
                                       f"{GQA_HEADS // GQA_KV} query heads"] if gqa else [])
        if with_bias:
            notes.append("bias=True")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        params = {"d_model": D_MODEL, "num_heads": heads[0], **({"num_kv_heads": GQA_KV} if gqa else {}),
                  "bias": with_bias, "scheme": name, "scheme_config": config, "causal": causal}
        cases.append(_case(label, "; ".join(notes), inputs, params))
    return _agree_with_differences("layer_grad", cases, _layer_grad_run, _layer_grad_forward)


def _layer_grad_forward(inputs, params):
    """The output of a ``layer_grad`` (or ``shaw_layer_grad``) case's forward pass."""
    layer = _build_layer(inputs, params, extra=("dy", "mask"))
    return layer(inputs["x"], mask=_key_padding(inputs, *inputs["x"].shape[:2]), causal=params["causal"])


def _layer_grad_run(inputs, params):
    layer = _build_layer(inputs, params, extra=("dy", "mask"))
    x = inputs["x"]
    mask = _key_padding(inputs, *x.shape[:2])
    _, ctx = layer(x, mask=mask, causal=params["causal"], return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    order = ["x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"]
    return {k: grads[k] for k in order + sorted(set(grads) - set(order)) if k in grads}


# --------------------------------------------------------------------------- iRoPE (Llama 4, SmolLM3)
#
# NoPE layers with Llama 4's attention temperature, and chunked attention (attention_chunk), through the
# layer: forward passes (one pass and fed through a KV cache) and the layer's backward.

IROPE_LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8,
                "low_freq_factor": 1.0, "high_freq_factor": 4.0}
# (label, scheme name, scheme config, attention_chunk, causal)
IROPE_SCHEMES = (
    ("nope_temperature", "nope-temperature", {"attn_scale": 0.5, "floor_scale": 2}, None, True),
    ("nope_temperature_float32", "nope-temperature", {"attn_scale": 0.1, "floor_scale": 3, "float32": True}, None,
     True),
    ("rope_interleaved_llama3_chunked", "rope", {"layout": "interleaved", "scaling": IROPE_LLAMA3}, 3, True),
    ("nope_temperature_chunked", "nope-temperature", {"attn_scale": 0.5, "floor_scale": 2}, 4, True),
    ("nope_chunked_bidirectional", "nope", {}, 3, False),
    # float32 arithmetic against the float64 factor rounded once: at i + 1 = 7, float64 7 / 0.28 is
    # 24.999999999999996 (floor 24), float32 7 / 0.28f is 25.0 (floor 25), so tau(6) differs by
    # 0.1 log(26/25) = 3.9e-3, far beyond the float32 tolerance
    ("nope_temperature_float32_floor", "nope-temperature", {"attn_scale": 0.1, "floor_scale": 0.28, "float32": True},
     None, True),
)
IROPE_NOTES = {"nope_temperature_float32_floor": "tau(i) in float32 arithmetic at each step: at i = 6, 7 / 0.28f "
               "is 25.0 in float32 (floor 25), where the float64 quotient 24.999999999999996 floors to 24"}


def _irope_params(name, config, chunk, causal, **more):
    return {"d_model": D_MODEL, "num_heads": HEADS, "bias": False, "scheme": name, "scheme_config": config,
            "attention_chunk": chunk, "causal": causal, **more}


def _irope_note(name, config, chunk, causal):
    notes = [f"MultiHeadAttention with {name} {config}", "causal" if causal else "no causal mask"]
    if chunk is not None:
        notes.append(f"attention_chunk={chunk}: query i sees key j only if i // {chunk} == j // {chunk}")
    return notes


def _irope_layer_cases():
    rng = np.random.default_rng(23)
    cases = []
    for label, name, config, chunk, causal in IROPE_SCHEMES:
        for chunks in ([LENGTH],) + (([3, 1, 1, 2],) if causal else ()):
            inputs = _layer_inputs(rng, _scheme(name, config), False)
            notes = _irope_note(name, config, chunk, causal) + ([IROPE_NOTES[label]] if label in IROPE_NOTES else [])
            notes.append("one forward pass, positions 0 ... T-1" if len(chunks) == 1 else
                         f"the input fed through a KV cache in chunks {chunks}, outputs concatenated")
            cases.append(_case(label if len(chunks) == 1 else f"{label}_cached", "; ".join(notes), inputs,
                               _irope_params(name, config, chunk, causal, chunks=chunks), tol()))
    return cases


def _irope_build(inputs, params, extra=()):
    """The layer of an iRoPE case (``attention_chunk`` from the params), its weights set from ``inputs``."""
    scheme = _scheme(params["scheme"], params["scheme_config"])
    layer = MultiHeadAttention(params["d_model"], params["num_heads"], scheme=scheme, bias=params["bias"],
                               attention_chunk=params["attention_chunk"])
    return _set_weights(layer, inputs, {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"}, extra)


def _irope_layer_run(inputs, params):
    return _causal_run(_irope_build(inputs, params), inputs, params)


def _irope_grad_cases():
    rng = np.random.default_rng(24)
    cases = []
    for label, name, config, chunk, causal in IROPE_SCHEMES:
        inputs = _layer_inputs(rng, _scheme(name, config), False)
        inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        notes = (["layer.backward(ctx, dy)"] + _irope_note(name, config, chunk, causal)
                 + ([IROPE_NOTES[label]] if label in IROPE_NOTES else []))
        cases.append(_case(label, "; ".join(notes), inputs, _irope_params(name, config, chunk, causal)))
    return _agree_with_differences("irope_layer_grad", cases, _irope_grad_run,
                                   lambda inputs, params: _irope_build(inputs, params, extra=("dy",))(
                                       inputs["x"], causal=params["causal"]))


def _irope_grad_run(inputs, params):
    layer = _irope_build(inputs, params, extra=("dy",))
    _, ctx = layer(inputs["x"], causal=params["causal"], return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    return {k: grads[k] for k in ("x", "wq", "wk", "wv", "wo")}


# --------------------------------------------------------------------------- Shaw et al. 2018 through the layer

# (label, max_relative_position, causal, bias, key padding, chunks)
SHAW_LAYER = (
    ("bidirectional_k2", 2, False, False, None, [LENGTH]),
    ("causal_k2", 2, True, False, None, [LENGTH]),
    ("causal_k2_cached", 2, True, False, None, [3, 1, 1, 2]),
    ("bidirectional_k1_bias_padded", 1, False, True, "right", [LENGTH]),
    ("causal_k8_left_padded", 8, True, False, "left", [LENGTH]),
)


def _shaw_layer_cases(grad: bool):
    rng = np.random.default_rng(26 if grad else 25)
    cases = []
    for label, k, causal, with_bias, padding, chunks in SHAW_LAYER:
        if grad and len(chunks) > 1:
            continue
        config = {"max_relative_position": k}
        inputs = _layer_inputs(rng, _scheme("shaw", config), with_bias)
        notes = [("layer.backward(ctx, dy) of " if grad else "") + f"MultiHeadAttention with Shaw (k = {k}): "
                 "logits q_i . (k_j + w_k[clip(j - i, k) + k]) / sqrt(D), output sum_j p_ij (v_j + w_v[...])",
                 "causal" if causal else "no causal mask"]
        if with_bias:
            notes.append("bias=True")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache in chunks {chunks}")
        if grad:
            inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        params = {"d_model": D_MODEL, "num_heads": HEADS, "bias": with_bias, "scheme": "shaw",
                  "scheme_config": config, "causal": causal, **({} if grad else {"chunks": chunks})}
        cases.append(_case(label, "; ".join(notes), inputs, params))
    return _agree_with_differences("shaw_layer_grad", cases, _layer_grad_run, _layer_grad_forward) if grad else cases


# --------------------------------------------------------------------------- local/global layers
#
# Sliding windows, a scale override, grouped-query heads and attention sinks through the layer
# (Mistral, Gemma 3's local and global layers, gpt-oss). Params beyond the ``layer`` family's:
# ``num_kv_heads``, ``sliding_window`` (null: none), ``scale`` (null: the scheme's), ``sinks``
# (then ``inputs.sinks`` ``(H,)``), ``mem_len`` of the cache (null: keep every key).

GEMMA3_LOCAL = ("rope", {"layout": "half", "base": 10000.0})
GEMMA3_GLOBAL = ("rope", {"layout": "half", "scaling": {"rope_type": "linear", "factor": 8.0,
                                                         "rope_theta": 1000000.0}})
# (label, (scheme, config), num_kv_heads, bias, sliding_window, scale, sinks, padding, chunks, mem_len)
LOCAL_GLOBAL = (
    ("window3_rope_half", SCHEME_CONFIGS["rope_half"], HEADS, False, 3, None, False, None, [LENGTH], None),
    ("window3_rope_half_rolling_cache", SCHEME_CONFIGS["rope_half"], HEADS, False, 3, None, False, None,
     [3, 1, 1, 2], 2),
    ("window2_alibi_left_padded", SCHEME_CONFIGS["alibi"], HEADS, False, 2, None, False, "left", [LENGTH], None),
    ("gemma3_local_gqa", GEMMA3_LOCAL, 1, False, 3, 0.25, False, None, [LENGTH], None),
    ("gemma3_global_gqa", GEMMA3_GLOBAL, 1, False, None, 0.25, False, None, [LENGTH], None),
    ("sinks_rope_half_bias", SCHEME_CONFIGS["rope_half"], 1, True, None, None, True, None, [LENGTH], None),
    ("sinks_window3_rolling_cache", SCHEME_CONFIGS["rope_half"], 1, True, 3, None, True, None, [3, 1, 1, 2], 2),
    ("sinks_left_padded", SCHEME_CONFIGS["rope_half"], HEADS, False, None, None, True, "left", [LENGTH], None),
)


def _local_global_layer(params):
    return MultiHeadAttention(params["d_model"], params["num_heads"], scheme=_scheme(params["scheme"],
                              params["scheme_config"]), bias=params["bias"], num_kv_heads=params["num_kv_heads"],
                              sliding_window=params["sliding_window"], scale=params["scale"], sinks=params["sinks"])


def _local_global_cases(grad: bool = False):
    rng = np.random.default_rng(23 if grad else 24)
    cases = []
    for label, (name, config), kv, with_bias, window, scale, sinks, padding, chunks, mem_len in LOCAL_GLOBAL:
        if grad and len(chunks) > 1:
            continue
        params = {"d_model": D_MODEL, "num_heads": HEADS, "num_kv_heads": kv, "bias": with_bias, "scheme": name,
                  "scheme_config": config, "causal": True, "sliding_window": window, "scale": scale,
                  "sinks": sinks}
        if not grad:
            params.update({"chunks": chunks, "mem_len": mem_len})
        layer = _local_global_layer(params)
        inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
        for w in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"):
            if getattr(layer, w) is not None:
                inputs[w] = _grid(rng, getattr(layer, w).shape, 1 / np.sqrt(D_MODEL))
        notes = [("layer.backward(ctx, dy) of " if grad else "") + f"MultiHeadAttention with {name}, causal"]
        if window:
            notes.append(f"sliding_window={window}: query i sees keys i - {window} < j <= i")
        if scale is not None:
            notes.append(f"scale={scale} in place of 1/sqrt(D)")
        if kv != HEADS:
            notes.append(f"num_kv_heads={kv}")
        if sinks:
            inputs["sinks"] = _grid(rng, (HEADS,))
            notes.append("sinks: a per-head logit column appended before the softmax, dropped after")
        if padding:
            inputs["mask"] = _padding(padding)
            notes.append(PADDING_NOTE[padding])
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache of mem_len={mem_len} in chunks {chunks}")
        if grad:
            inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        cases.append(_case(label, "; ".join(notes), inputs, params, tol()))
    if grad:
        return _agree_with_differences("local_global_grad", cases, _local_global_grad_run, _local_global_forward)
    if not grad:                                                     # StreamingLLM: positions within the cache
        name, config = SCHEME_CONFIGS["rope_half"]
        params = {"d_model": D_MODEL, "num_heads": HEADS, "num_kv_heads": HEADS, "bias": False, "scheme": name,
                  "scheme_config": config, "causal": True, "sliding_window": None, "scale": None, "sinks": False,
                  "chunks": [2, 1, 1, 1, 1, 1], "mem_len": None, "streaming": {"num_sinks": 1, "window": 3}}
        layer = _local_global_layer(params)
        inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
        inputs.update({w: _grid(rng, getattr(layer, w).shape, 1 / np.sqrt(D_MODEL)) for w in ("wq", "wk", "wv", "wo")})
        note = ("MultiHeadAttention with rope, causal, through StreamingLLM's cache (minipos.streaming.StreamingCache, "
                "num_sinks=1, window=3) in chunks [2, 1, 1, 1, 1, 1]: a step sees token 0 and the last 3 tokens, "
                "its own included, at positions counted within the cache (token 6 at position 3)")
        cases.append(_case("streaming_sinks1_window3_rope_half", note, inputs, params, tol()))
        label = "streaming_sinks1_window2_long_step_rope_half"                  # a step longer than the window
        params = {**params, "chunks": [2, 4, 1], "streaming": {"num_sinks": 1, "window": 2}}
        own = _own_rng(label)
        inputs = {"x": _grid(own, (BATCH, LENGTH, D_MODEL))}
        inputs.update({w: _grid(own, getattr(layer, w).shape, 1 / np.sqrt(D_MODEL)) for w in ("wq", "wk", "wv", "wo")})
        note = ("MultiHeadAttention with rope, causal, through StreamingLLM's cache (num_sinks=1, window=2) in "
                "chunks [2, 4, 1]: the step of 4 tokens, longer than the window, sees tokens 0, 1 and all of its "
                "own (causally) at positions 0 ... 5; only then does the cache evict, keeping token 0 and token 5 "
                "(moved to position 1), so token 6 sits at position 2 and sees tokens 0, 5 and itself")
        cases.append(_case(label, note, inputs, params, tol()))
    return cases


def _local_global_build(inputs, params, extra):
    layer = _local_global_layer(params)
    weights = {w for w in ("wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "sinks") if getattr(layer, w) is not None}
    _set_weights(layer, inputs, weights, ("mask", *extra))
    return layer, _key_padding(inputs, *inputs["x"].shape[:2])


def _local_global_run(inputs, params):
    layer, mask = _local_global_build(inputs, params, ())
    x, causal, mem_len, streaming = inputs["x"], _causal_only(params), params["mem_len"], params.get("streaming")
    if mem_len is not None and (streaming is not None or not _many(params["chunks"])):
        raise ValueError(f"params.mem_len is {_short(mem_len)}, but this case runs without a KV cache to bound "
                         "(one chunk, or StreamingLLM's cache): it must be null")
    cache = layer.new_cache(mem_len=mem_len) if _many(params["chunks"]) else None
    if streaming is not None:
        cache = StreamingCache(layer, **streaming)

    def step(t):
        held = 0 if cache is None else cache.length                             # the keys the cache kept
        keys = None if mask is None else mask[:, t.start - held:t.stop]          # (B, S)
        return layer(x[:, t], mask=keys, causal=causal, cache=cache)
    return _in_chunks(x, params["chunks"], step)


def _local_global_forward(inputs, params):
    layer, mask = _local_global_build(inputs, params, ("dy",))
    return layer(inputs["x"], mask=mask, causal=_causal_only(params))


def _local_global_grad_run(inputs, params):
    layer, mask = _local_global_build(inputs, params, ("dy",))
    _, ctx = layer(inputs["x"], mask=mask, causal=_causal_only(params), return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    order = ["x", "wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo", "sinks"]
    return {k: grads[k] for k in order if k in grads}


# --------------------------------------------------------------------------- multi-head latent attention

MLA_CONFIGS = (  # (label, q_lora_rank or None, scheme_config, bias, causal, chunks[, options (spec 1.3.0)])
    ("q_lora_interleaved", 4, {"layout": "interleaved"}, False, True, [LENGTH]),
    ("q_lora_interleaved_cached", 4, {"layout": "interleaved"}, False, True, [3, 1, 1, 2]),
    ("no_q_lora_half", None, {"layout": "half"}, False, True, [LENGTH]),
    ("q_lora_yarn_mscale_bias", 4, {"layout": "interleaved", "scaling": {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 4, "mscale": 1.0,
        "mscale_all_dim": 0.5}}, True, True, [LENGTH]),
    ("no_q_lora_bidirectional", None, {"layout": "interleaved"}, False, False, [LENGTH]),
    # spec 1.3.0: Dots 3 Note's layer (its sliding layers': a window, and the softmax scale given)
    ("dots_options_window", 4, {"layout": "interleaved"}, True, True, [LENGTH], "DOTS"),
    ("dots_options_window_cached", 4, {"layout": "interleaved"}, False, True, [3, 1, 1, 2], "DOTS"),
)
MLA_DIMS = {"kv_lora_rank": 3, "qk_nope_head_dim": 2, "qk_rope_head_dim": 2, "v_head_dim": 3}
MLA_OPTIONS = {"DOTS": {"k_rope_norm": True, "q_lora_scale": 2 ** 0.5, "kv_lora_scale": (8 / 3) ** 0.5, "gate": "head",
                        "eps": 1e-5, "sliding_window": 3, "scale": 0.4}}
"""The options of ``MultiHeadLatentAttention`` a case sets (spec 1.3.0; absent in a case: off, 1, None, eps 1e-6):
Dots 3 Note's, its latent scales sqrt(d_model / rank) at d_model 8, q_lora_rank 4, kv_lora_rank 3."""


def _mla_params(q_lora_rank, config, with_bias, causal, options=None):
    params = {"d_model": D_MODEL, "num_heads": HEADS, **MLA_DIMS, "bias": with_bias, "scheme_config": config,
              "causal": causal}
    params = params if q_lora_rank is None else {**params, "q_lora_rank": q_lora_rank}
    return params if options is None else {**params, **MLA_OPTIONS[options]}


def _build_mla(inputs, params, extra=()):
    """The MLA layer of a case, its weights set from ``inputs`` (names beyond them: ``extra``)."""
    config = dict(params["scheme_config"])
    layer = MultiHeadLatentAttention(params["d_model"], params["num_heads"], bias=params["bias"],
                                     q_lora_rank=params.get("q_lora_rank"), scheme=DecoupledRotary(**config),
                                     **{k: params[k] for k in MLA_DIMS},
                                     **{k: params[k] for k in MLA_OPTIONS["DOTS"] if k in params})
    return _set_weights(layer, inputs, layer.weights(), extra)


def _mla_inputs(rng, params):
    layer = _build_mla({}, params)
    inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
    for name, w in layer.weights().items():
        inputs[name] = _grid(rng, w.shape, 0.5) + (1.0 if name.endswith("_norm") else 0.0)
    return inputs


def _mla_cases():
    rng = np.random.default_rng(23)
    cases = []
    for label, q_lora_rank, config, with_bias, causal, chunks, *options in MLA_CONFIGS:
        params = {**_mla_params(q_lora_rank, config, with_bias, causal, *options), "chunks": chunks}
        notes = ["MultiHeadLatentAttention (DeepSeek-V2/V3 MLA, decoupled RoPE)",
                 "q = heads(x wq)" if q_lora_rank is None else "q = heads(RMSNorm(x wq_a) wq_b)",
                 f"RoPE layout {config['layout']}", "causal" if causal else "no causal mask"]
        if "scaling" in config:
            notes.append("YaRN: mscale/mscale_all_dim on cos and sin, mscale_all_dim^2 on the softmax scale")
        if with_bias:
            notes.append("bias=True: bq_a, bkv_a, bo")
        if options:
            notes.append(_DOTS_NOTE)
        if len(chunks) > 1:
            notes.append(f"fed through a KV cache in chunks {chunks}, outputs concatenated")
        cases.append(_case(label, "; ".join(notes), _mla_inputs(rng, params), params, tol()))
    return cases


_DOTS_NOTE = ("Dots 3 Note's options: the rope key RMS-normed (k_rope_norm) before its rotation, the normed latents "
              "times q_lora_scale and kv_lora_scale, each head's output times sigmoid(x wg)_h before wo, every norm "
              "of eps 1e-5, a window of 3 (i - 3 < j <= i), the softmax scale 0.4")


def _mla_run(inputs, params):
    return _causal_run(_build_mla(inputs, params), inputs, params)


def _mla_grad_cases():
    rng = np.random.default_rng(24)
    cases = []
    for label, q_lora_rank, config, with_bias, causal, chunks, *options in MLA_CONFIGS:
        if len(chunks) > 1:
            continue
        params = _mla_params(q_lora_rank, config, with_bias, causal, *options)
        inputs = _mla_inputs(rng, params)
        inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        note = (f"layer.backward(ctx, dy) of MultiHeadLatentAttention, RoPE layout {config['layout']}"
                + (", YaRN" if "scaling" in config else "") + (", bias=True" if with_bias else "")
                + ("" if causal else ", no causal mask") + (f"; {_DOTS_NOTE}" if options else ""))
        cases.append(_case(label, note, inputs, params))
    return _agree_with_differences("mla_grad", cases, _mla_grad_run,
                                   lambda inputs, params: _build_mla(inputs, params, extra=("dy",))(
                                       inputs["x"], causal=params["causal"]))


def _mla_grad_run(inputs, params):
    layer = _build_mla(inputs, params, extra=("dy",))
    _, ctx = layer(inputs["x"], causal=params["causal"], return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    return {k: grads[k] for k in ["x", *layer.weights()]}
