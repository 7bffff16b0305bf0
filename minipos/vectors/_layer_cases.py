"""What the layer families (in ``layers``, and M-RoPE's in ``rotary``) share: the layer's shapes, a
layer built from a case with its weights set, a run through a KV cache in chunks, and the check that
a backward case's gradients agree with finite differences before they are recorded.
"""

from __future__ import annotations

import zlib

import numpy as np

from ..layer import MultiHeadAttention
from ..schemes import build
from ._text import _short

D_MODEL, HEADS, BATCH, LENGTH = 8, 2, 2, 7


def _scheme(name: str, config: dict):
    """The scheme ``name`` of a case, built by the registry (which names an unknown scheme or keyword)."""
    if not isinstance(config, dict):
        raise TypeError(f"params.scheme_config must be an object of keyword arguments, got {type(config).__name__}")
    config = dict(config)
    if "pos_att_type" in config:
        config["pos_att_type"] = tuple(config["pos_att_type"])
    return build(name, config)


def _set_weights(layer, inputs, weights, extra=()):
    """Set ``layer``'s ``weights`` (names; ``scheme.<p>`` for the scheme's) from ``inputs``; any other
    input name than ``x`` and ``extra`` is refused, so a file cannot reach other attributes."""
    known = set(weights) | {"x"} | set(extra)
    if set(inputs) - known:
        raise ValueError(f"inputs: unknown names {sorted(set(inputs) - known)}; the layer takes {sorted(known)}")
    for name in set(weights) & set(inputs):
        target, attr = (layer.scheme, name[7:]) if name.startswith("scheme.") else (layer, name)
        setattr(target, attr, inputs[name])
    return layer


def _build_layer(inputs, params, extra=()):
    """The layer and scheme of a case, its weights set from ``inputs`` (names beyond them: ``extra``)."""
    scheme = _scheme(params["scheme"], params["scheme_config"])
    layer = MultiHeadAttention(params["d_model"], params["num_heads"], scheme=scheme, bias=params["bias"],
                               num_kv_heads=params.get("num_kv_heads"))      # absent or null: num_heads
    weights = {"wq", "wk", "wv", "wo", "bq", "bk", "bv", "bo"} | {f"scheme.{p}" for p in scheme.parameters()}
    return _set_weights(layer, inputs, weights, extra)


def _causal_only(params) -> bool:
    """``params["causal"]``, which must be true: for a family that records causal layers only."""
    if params["causal"] is not True:
        raise ValueError(f"params.causal must be true (this family records causal layers only), got "
                         f"{_short(params['causal'])}")
    return True


def _in_chunks(x, chunks, call) -> dict:
    """``{"y": (B, T, d_model)}``: ``call(token_slice)`` on each of ``chunks`` (positive lengths adding
    up to T, checked) of ``x`` in order, the outputs concatenated: a cached layer's prefill and decoding."""
    if (not isinstance(chunks, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                for n in chunks) or sum(chunks) != x.shape[1]):
        raise ValueError(f"chunks must be a list of positive lengths adding up to T = {x.shape[1]}, "
                         f"got {_short(chunks)}")
    ends = np.cumsum(chunks)
    return {"y": np.concatenate([call(slice(int(e - n), int(e))) for n, e in zip(chunks, ends)], axis=1)}


def _many(chunks) -> bool:
    """More than one chunk: the case runs through a KV cache."""
    return isinstance(chunks, list) and len(chunks) > 1


def _causal_run(layer, inputs, params) -> dict:
    """``{"y": ...}`` of ``layer`` on ``inputs["x"]`` fed in ``params["chunks"]`` (through a KV cache
    when more than one), with ``params["causal"]``."""
    x, chunks = inputs["x"], params["chunks"]
    cache = layer.new_cache() if _many(chunks) else None
    return _in_chunks(x, chunks, lambda t: layer(x[:, t], causal=params["causal"], cache=cache))


class GradientMismatch(ValueError):
    """A layer's backward disagrees with central finite differences: the case is not recorded."""


def _agree_with_differences(family: str, cases: list, run, forward, *, h: float = 1e-6, rtol: float = 1e-6) -> list:
    """``cases`` of a backward family, once every gradient ``run(inputs, params)`` returns agrees with
    central differences of ``forward(inputs, params)`` (the layer's output) along a random direction,
    ``<grad, e> = (<y(p + h e) - y(p - h e), dy>) / 2h`` within ``rtol * max(1, |fd|)``; otherwise
    ``GradientMismatch`` naming the family, the case and the gradient. So a wrong backward never becomes
    a golden value. h = 1e-6 in float64: truncation ~ h^2 and rounding ~ 1e-16 / h, far below ``rtol``."""
    for case in cases:
        inputs, params = case["inputs"], case["params"]
        grads, dy = run(inputs, params), inputs["dy"]
        for name, grad in grads.items():
            base = np.asarray(inputs[name], dtype=np.float64)
            e = np.random.default_rng(zlib.crc32(f"{case['name']}/{name}".encode())).standard_normal(base.shape)
            ys = [forward({**inputs, name: base + sign * h * e}, params) for sign in (1, -1)]
            fd = float(np.sum((ys[0] - ys[1]) * dy)) / (2 * h)
            got = float(np.sum(np.asarray(grad) * e))
            if not abs(got - fd) <= rtol * max(1.0, abs(fd)):
                raise GradientMismatch(
                    f"{family}/{case['name']}: the gradient of {name} ({got:.9g} along a random direction) disagrees "
                    f"with central finite differences of the layer's output ({fd:.9g}); the case is not recorded "
                    "(a wrong backward would become a golden value)")
    return cases
