"""The cases of Inkling 2's decoder attention (spec 1.4.0): ``inkling``, forward passes of
``minipos.inkling.InklingAttention`` (sliding and full layers, cached decoding, left padding, a full layer's three
inputs), and ``inkling_grad``,
their backwards. Every weight is an input, under its attribute name; ``params`` holds the layer's keyword arguments.
"""

from __future__ import annotations

import numpy as np

from ..inkling import InklingAttention
from ._layer_cases import BATCH, D_MODEL, LENGTH, _agree_with_differences, _in_chunks, _many, _set_weights
from .cases import _case, _grid, tol
from .layers import PADDING_NOTE, _key_padding, _padding

SIZES = {"num_heads": 2, "num_kv_heads": 1, "head_dim": 4, "d_rel": 2, "conv_kernel": 3, "qk_clip": 1.5,
         "rel_clip": 0.7, "norm_eps": 1e-6}
"""Two query heads over one key/value head; thresholds small enough that the clips bite on some vectors only."""

SLIDING = {"sliding_window": 3}
FULL = {"rel_extent": 4, "dynamic_conv": True, "log_scaling": [0.5, 3]}
CONFIGS = (  # (label, layer kind, padding, chunks[, "three inputs": x_k and x_v given])
    ("sliding_window", SLIDING, None, [LENGTH]),
    ("sliding_window_cached", SLIDING, None, [3, 1, 1, 2]),
    ("full_dynamic_log_scale", FULL, None, [LENGTH]),
    ("full_dynamic_log_scale_cached", FULL, None, [3, 1, 1, 2]),
    ("full_left_padded", FULL, "left", [LENGTH]),
    ("full_three_inputs", FULL, None, [LENGTH], "three inputs"),
    ("full_three_inputs_cached", FULL, None, [3, 1, 1, 2], "three inputs"),
)
NOTES = {"sliding_window": "a sliding layer: window 3 (i - 3 < j <= i), the bias over the same 3 keys, static taps",
         "full_dynamic_log_scale": "a full layer: bias extent 4 (keys 4 or more back get none), dynamic taps, queries "
                                   "and relative states times 1 + 0.5 ln max((p + 1) / 3, 1)"}


def _params(kind, causal=True):
    return {"d_model": D_MODEL, **SIZES, **kind, "causal": causal}


def _build(inputs, params, extra=()):
    """The layer of a case, its weights set from ``inputs`` (names beyond them and ``x``, ``mask``: ``extra``)."""
    kwargs = {k: v for k, v in params.items() if k not in ("causal", "chunks")}
    layer = InklingAttention(**kwargs)
    weights = [name for name, w in layer._weights().items() if w is not None]
    return _set_weights(layer, inputs, weights, ("mask", "x_k", "x_v", *extra))


def _inputs(rng, params, padding, three=False):
    layer = _build({}, params)
    inputs = {"x": _grid(rng, (BATCH, LENGTH, D_MODEL))}
    if three:                                                              # a full layer's own key and value inputs
        inputs.update(x_k=_grid(rng, (BATCH, LENGTH, D_MODEL)), x_v=_grid(rng, (BATCH, LENGTH, D_MODEL)))
    for name, w in layer._weights().items():
        if w is not None:
            inputs[name] = _grid(rng, w.shape, 0.5) + (1.0 if name.endswith("_scale") else 0.0)
    if padding:
        inputs["mask"] = _padding(padding)
    return inputs


def _note(label, kind, padding, chunks=None, three=False):
    notes = ["InklingAttention (Inkling 2's decoder attention, no RoPE)",
             NOTES["sliding_window" if "sliding_window" in kind else "full_dynamic_log_scale"],
             "2 query heads over 1 key/value head, head_dim 4, d_rel 2, kernel 3, clips 1.5 (q, k) and 0.7 (r), "
             "per-query sinks, the sigmoid gate; causal"]
    if padding:
        notes.append(PADDING_NOTE[padding] + "; their inputs to the convolutions are zeroed (HF's conv_mask)")
    if three:
        notes.append("x_k and x_v, the keys' and the values' own inputs (HF key_hidden_states, value_hidden_states): "
                     "the keys' projection and dynamic taps read x_k, the values' x_v, the rest x")
    if chunks and len(chunks) > 1:
        notes.append(f"fed through an InklingCache in chunks {chunks} (keys, values and the K - 1 convolution "
                     "inputs before each chunk), outputs concatenated")
    return "; ".join(notes)


def inkling_cases():
    rng = np.random.default_rng(25)
    cases = []
    for label, kind, padding, chunks, *three in CONFIGS:
        params = {**_params(kind), "chunks": chunks}
        cases.append(_case(label, _note(label, kind, padding, chunks, bool(three)),
                           _inputs(rng, params, padding, bool(three)), params, tol()))
    return cases


def inkling_run(inputs, params):
    layer = _build(inputs, params)
    x, mask = inputs["x"], _key_padding(inputs, *inputs["x"].shape[:2])
    cache = layer.new_cache() if _many(params["chunks"]) else None
    x_k, x_v = inputs.get("x_k"), inputs.get("x_v")
    return _in_chunks(x, params["chunks"], lambda t: layer(
        x[:, t], mask=None if mask is None else mask[:, :t.stop], causal=params["causal"], cache=cache,
        x_k=None if x_k is None else x_k[:, t], x_v=None if x_v is None else x_v[:, t]))


def inkling_grad_cases():
    rng = np.random.default_rng(26)
    cases = []
    for label, kind, padding, chunks, *three in CONFIGS:
        if len(chunks) > 1:
            continue
        params = _params(kind)
        inputs = _inputs(rng, params, padding, bool(three))
        inputs["dy"] = _grid(rng, (BATCH, LENGTH, D_MODEL))
        cases.append(_case(label, "layer.backward(ctx, dy): the gradient of x (x_k, x_v) and of every weight; "
                           + _note(label, kind, padding, three=bool(three)), inputs, params))
    return _agree_with_differences("inkling_grad", cases, inkling_grad_run, lambda i, p: _forward(i, p)[0])


def _forward(inputs, params, **kw):
    layer = _build(inputs, params, ("dy",))
    return layer(inputs["x"], mask=_key_padding(inputs, *inputs["x"].shape[:2]), causal=params["causal"],
                 x_k=inputs.get("x_k"), x_v=inputs.get("x_v"), **kw), layer


def inkling_grad_run(inputs, params):
    (_, ctx), layer = _forward(inputs, params, return_context=True)
    grads = layer.backward(ctx, inputs["dy"])
    names = ["x", "x_k", "x_v", *(n for n, w in layer._weights().items() if w is not None)]
    return {k: grads[k] for k in names if k in grads}
