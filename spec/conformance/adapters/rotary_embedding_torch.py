"""rotary-embedding-torch against the golden vectors.

Components and the conventions each one needs:

- ``RotaryEmbedding`` with ``apply_rotary_emb``: the interleaved layout (its ``rotate_half``
  pairs ``(2i, 2i+1)``); the half layout by permuting each pair's features. ``forward(t)`` takes
  any positions, negative ones included. Partial rotary is its own (the rotated width is that of
  the frequencies; the rest passes through). Given frequencies are its ``custom_freqs``; the
  attention factor is ``apply_rotary_emb``'s ``scale``, which multiplies cos and sin. Its default
  frequencies are built in float32 (``torch.arange(...).float()``), and ``.double()`` keeps them:
  float32 tolerance.
- The same module's scalings: ``interpolate_factor`` divides the positions of
  ``rotate_queries_or_keys`` (``linear``), ``theta_rescale_factor`` multiplies the base by
  ``factor^(D/(D-2))`` (the static ``ntk``). Their ``(inv_freq, attention_factor)`` are read off
  ``rotate_queries_or_keys`` at positions 0 and 1. The other kinds are not in the library.
- ``RotaryEmbedding(use_xpos=True)``: xPos with ``zeta_i = (2i + 0.4 D) / (1.4 D)``, queries times
  ``get_scale(t)``, keys times its inverse (as ``rotate_queries_and_keys`` does). ``get_scale``
  centres the exponent on ``len(t) // 2``: a case whose ``scale_offset`` is another number is not
  expressible.
- Cached steps (``rope_scores``, ``xpos_scores``): ``rotate_queries_with_cached_keys(q, k)``,
  which numbers the keys ``0 ... S-1`` and offsets the queries by ``S - T``; the scores are the
  product of the rotated q and k.

Gradients are torch autograd through the same calls.
"""

from __future__ import annotations

import numpy as np

from ._common import (Component, angles_and_factor, cached_step, require, rope_family, scores_family, tensor as _t,
                      torch_vjp)

LIBRARY = "rotary-embedding-torch"
DISTRIBUTIONS = ["rotary-embedding-torch", "torch"]


def _rotate(x, positions, params, inv_freq):
    import torch
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb
    R = params["rotary_dim"] or x.shape[-1]
    custom = None if inv_freq is None else _t(inv_freq, torch.float64)
    module = RotaryEmbedding(R, custom_freqs=custom, theta=params["base"]).double()
    freqs = module(_t(positions))                                              # (T, R)
    return apply_rotary_emb(freqs, x, scale=params["attention_factor"])


def rope_scaling(inputs, params):
    import torch
    from rotary_embedding_torch import RotaryEmbedding
    kind, D = params["kind"], params["dim"]
    require(kind in ("linear", "ntk"), f"RotaryEmbedding has no {kind!r} scaling (only interpolate_factor and "
                                       "theta_rescale_factor)")
    kw = {"interpolate_factor": params["factor"]} if kind == "linear" else {"theta_rescale_factor": params["factor"]}
    module = RotaryEmbedding(D, theta=params["base"], **kw).double()

    def rotate(x, positions):   # rotate_queries_or_keys numbers the rows 0, 1, ...: positions are [0, 1]
        assert list(positions) == [0, 1]
        return module.rotate_queries_or_keys(_t(x, torch.float64)[None])[0].numpy()

    inv_freq, factor = angles_and_factor(rotate, D, "interleaved")
    return {"inv_freq": inv_freq, "attention_factor": factor}


def _xpos(x, positions, params):
    from rotary_embedding_torch import RotaryEmbedding, apply_rotary_emb
    centre = len(positions) // 2
    require(params["scale_offset"] == centre, f"get_scale centres xPos on len(t) // 2 = {centre}, "
                                              f"not on scale_offset = {params['scale_offset']}")
    module = RotaryEmbedding(x.shape[-1], use_xpos=True, xpos_scale_base=params["scale_base"],
                             theta=params["base"]).double()
    t = _t(positions).double()
    scale = module.get_scale(t)
    return apply_rotary_emb(module(t), x, scale=scale ** -1 if params["downscale"] else scale)


def xpos(inputs, params):
    import torch
    return {"out": _xpos(_t(inputs["x"], torch.float64), inputs["positions"], params).numpy()}


def xpos_grad(inputs, params):
    dy = inputs["dy"]
    return {"dx": torch_vjp(lambda t: _xpos(t, inputs["positions"], params), np.zeros_like(dy), dy)}


def _cached_qk(q, k, inputs, params, **module_kw):
    """``rotate_queries_with_cached_keys(q, k)``: keys at 0 ... S-1, queries offset by S - T."""
    from rotary_embedding_torch import RotaryEmbedding
    cached_step(inputs)
    R = params.get("rotary_dim") or q.shape[-1]
    module = RotaryEmbedding(R, theta=params["base"], **module_kw).double()
    return module.rotate_queries_with_cached_keys(q, k)


def _xpos_qk(q, k, inputs, params):
    return _cached_qk(q, k, inputs, params, use_xpos=True, xpos_scale_base=params["scale_base"])


def components():
    import rotary_embedding_torch  # noqa: F401  (an environment that cannot import it fails here, not per case)
    f32 = "default frequencies built in float32: float32 tolerance"
    rope = [f32, "interleaved layout native; half by permuting each pair's features", "partial rotary native",
            "given inv_freq = custom_freqs", "attention factor = apply_rotary_emb's scale"]
    xp = [f32, "queries times get_scale(t), keys times its inverse",
          "centre len(t) // 2 must be the case's scale_offset"]
    return [
        Component("RotaryEmbedding", "rope", rope_family(_rotate, "interleaved"), "float32", rope),
        Component("RotaryEmbedding", "rope_grad", rope_family(_rotate, "interleaved", True), "float32",
                  rope + ["torch autograd"]),
        Component("RotaryEmbedding", "rope_scaling", rope_scaling, "float32",
                  [f32, "linear = interpolate_factor, ntk = theta_rescale_factor",
                   "inv_freq and attention factor read off rotate_queries_or_keys at positions 0 and 1"]),
        Component("RotaryEmbedding", "rope_scores", scores_family(_cached_qk, "interleaved"), "float32",
                  [f32, "interleaved layout native; half by the same permutation of q's and k's features",
                   "rotate_queries_with_cached_keys(q, k)"]),
        Component("RotaryEmbedding (use_xpos)", "xpos_scores", scores_family(_xpos_qk, "interleaved"), "float32",
                  [f32, "rotate_queries_with_cached_keys(q, k)"]),
        Component("RotaryEmbedding (use_xpos)", "xpos", xpos, "float32", xp),
        Component("RotaryEmbedding (use_xpos)", "xpos_grad", xpos_grad, "float32", xp + ["torch autograd"]),
    ]


def probe_xpos_cached_step():
    """xPos scores of the last query: one full pass against one cached step."""
    import torch
    from rotary_embedding_torch import RotaryEmbedding
    module = RotaryEmbedding(4, use_xpos=True, xpos_scale_base=1).double()
    q = k = torch.ones(1, 4, 4, dtype=torch.float64)
    qf, kf = module.rotate_queries_and_keys(q, k)
    qc, kc = module.rotate_queries_with_cached_keys(q[:, -1:], k)
    return {"name": "rotary_embedding_torch_xpos_cached_step",
            "input": "RotaryEmbedding(4, use_xpos=True, xpos_scale_base=1), q = k = ones(1, 4, 4): scores of query 3 "
                     "with keys 0 1 2 3, from rotate_queries_and_keys(q, k) and from "
                     "rotate_queries_with_cached_keys(q[:, -1:], k)",
            "output": {"full pass": (qf[0, -1] @ kf[0].T).tolist(), "cached step": (qc[0, -1] @ kc[0].T).tolist(),
                       "zeta_0 = 0.4 / 1.4": 0.4 / 1.4}}


def probe_rotary_dim_2():
    """A rotary width of 2 (one pair; the spec's layer/rope_interleaved_partial rotates 2 features)."""
    from rotary_embedding_torch import RotaryEmbedding
    try:
        out = RotaryEmbedding(2)(_t(np.array([0, 1]))).tolist()
    except Exception as err:
        out = f"{type(err).__name__}: {err}"
    return {"name": "rotary_embedding_torch_rotary_dim_2", "input": "RotaryEmbedding(2)(tensor([0, 1]))", "output": out}


PROBES = [probe_xpos_cached_step, probe_rotary_dim_2]
