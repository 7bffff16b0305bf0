"""x-transformers against the golden vectors.

Components and the conventions each one needs. Modules run in float64 (``.double()``), but
``RotaryEmbedding`` builds ``inv_freq`` and the xPos ratios in float32 at construction, and
``.double()`` keeps those float32 values: its components use the float32 tolerance, and so
does ``ScaledSinusoidalEmbedding`` (its ``inv_freq`` too).

- ``RotaryEmbedding`` with ``apply_rotary_pos_emb``: the interleaved layout (its ``rotate_half``
  pairs ``(2i, 2i+1)``); the half layout by permuting each pair's features. ``forward(t)`` takes
  any positions, negative ones included. Partial rotary is its own (``rot_dim`` = the width of
  the frequencies; the rest passes through). Given frequencies are written to its ``inv_freq``
  buffer; the attention factor is ``apply_rotary_pos_emb``'s ``scale``, which multiplies cos and sin.
- The same module's scalings: ``interpolation_factor`` (positions divided by it: ``linear``) and
  ``base_rescale_factor`` (base times ``factor^(D/(D-2))``: the static ``ntk``). Their
  ``(inv_freq, attention_factor)`` are read off the rotation at positions 0 and 1. The other
  kinds are not in the library.
- ``RotaryEmbedding(use_xpos=True)``: xPos with ``zeta_i = (2i + 0.4 D) / (1.4 D)``; queries get
  ``scale``, keys ``scale ** -1`` (as its ``Attention`` does). ``forward`` centres the exponent on
  ``(max t + 1) // 2``: a case whose ``scale_offset`` is another number is not expressible.
- Cached steps (``rope_scores``, ``xpos_scores``) as its ``Attention`` runs them: the rotary
  embedding (and xPos scale) of the keys ``0 ... S-1``, of which ``apply_rotary_pos_emb`` keeps
  the last ``T`` rows for the ``T`` queries; the scores are the product of the rotated q and k.
  xPos's centre is that of the keys for both, so it cancels in the scores.
- ``AlibiPositionalBias``: slopes from its ``_get_slopes`` (Python floats); the bias from
  ``forward_custom_pos(q, k)``, which is ``-m |i - j|``, the spec's ``symmetric`` form only. The
  causal form ``-m (i - j)`` agrees with it on causal entries alone, and the cases compare every
  entry, so they are not expressible. Slopes given to the constructor become a float32 tensor:
  float32 tolerance. ``alibi_grad`` makes that buffer a leaf that requires grad.
- ``RelativePositionBias`` (T5): its ``_relative_position_bucket`` takes ``key - query`` and
  ``causal = not bidirectional``; buckets from a float32 log, so ``exact = true`` is not
  expressible. ``forward(L, L)`` is the bias of positions ``0 ... L-1``, read at the case's rows
  and columns, with ``scale = 1`` (the module multiplies the bias by it).
- ``ScaledSinusoidalEmbedding``: the split layout ``[sin | cos]`` with ``w_i = theta^(-2i/D)``,
  times a learned scale, set to 1; the interleaved layout by permuting columns. Its
  tensor2tensor-like layout is not offered.

Gradients are torch autograd through the same calls.
"""

from __future__ import annotations

import numpy as np

from ._common import (Component, angles_and_factor, cached_step, lead_summed, require,
                      rope_family, scores_family, table_layout, tensor as _t, torch_vjp)

LIBRARY = "x-transformers"
DISTRIBUTIONS = ["x-transformers", "torch"]


def _rotate(x, positions, params, inv_freq, **module_kw):
    import torch
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb
    R = params.get("rotary_dim") or x.shape[-1]
    module = RotaryEmbedding(R, base=params["base"], **module_kw).double()
    if inv_freq is not None:
        module.inv_freq = _t(inv_freq, torch.float64)
    freqs, _ = module(_t(positions))                                           # (1, T, R)
    return apply_rotary_pos_emb(x.reshape(-1, *x.shape[-2:]), freqs, params.get("attention_factor", 1.0)).reshape(x.shape)


def rope_scaling(inputs, params):
    kind, D = params["kind"], params["dim"]
    require(kind in ("linear", "ntk"), f"RotaryEmbedding has no {kind!r} scaling (only interpolation_factor and "
                                       "base_rescale_factor)")
    kw = {"interpolation_factor": params["factor"]} if kind == "linear" else {"base_rescale_factor": params["factor"]}
    rotate = lambda x, pos: _rotate(_t(x), pos, {"base": params["base"]}, None, **kw).numpy()
    inv_freq, factor = angles_and_factor(rotate, D, "interleaved")
    return {"inv_freq": inv_freq, "attention_factor": factor}


def _xpos(x, positions, params):
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb
    centre = (int(positions.max()) + 1) // 2
    require(params["scale_offset"] == centre, f"RotaryEmbedding centres xPos on (max t + 1) // 2 = {centre}, "
                                              f"not on scale_offset = {params['scale_offset']}")
    module = RotaryEmbedding(x.shape[-1], use_xpos=True, scale_base=params["scale_base"], base=params["base"]).double()
    freqs, scale = module(_t(positions))
    return apply_rotary_pos_emb(x[None], freqs, scale ** -1 if params["downscale"] else scale)[0]


def xpos(inputs, params):
    import torch
    return {"out": _xpos(_t(inputs["x"], torch.float64), inputs["positions"], params).numpy()}


def xpos_grad(inputs, params):
    dy = inputs["dy"]
    return {"dx": torch_vjp(lambda t: _xpos(t, inputs["positions"], params), np.zeros_like(dy), dy)}


def _cached_qk(q, k, inputs, params, **module_kw):
    """q and k of a cached step as its Attention rotates them: freqs (and xPos scale) of the keys
    0 ... S-1, of which ``apply_rotary_pos_emb`` keeps the last T rows for the T queries."""
    from x_transformers.x_transformers import RotaryEmbedding, apply_rotary_pos_emb
    _, S = cached_step(inputs)
    R = params.get("rotary_dim") or q.shape[-1]
    module = RotaryEmbedding(R, base=params["base"], **module_kw).double()
    freqs, scale = module(_t(np.arange(S)))                                   # (1, S, R)
    if not module_kw:
        return apply_rotary_pos_emb(q, freqs), apply_rotary_pos_emb(k, freqs)
    return apply_rotary_pos_emb(q, freqs, scale), apply_rotary_pos_emb(k, freqs, scale ** -1)


def _xpos_qk(q, k, inputs, params):
    return _cached_qk(q, k, inputs, params, use_xpos=True, scale_base=params["scale_base"])


def alibi_slopes(inputs, params):
    from x_transformers.x_transformers import AlibiPositionalBias
    return {"slopes": np.array(AlibiPositionalBias._get_slopes(params["num_heads"]))}


def _alibi(slopes, q, k, params):
    from x_transformers.x_transformers import AlibiPositionalBias
    require(params["symmetric"], "AlibiPositionalBias is -m |i - j|; the case's causal form -m (i - j) differs "
                                 "from it on every entry with j > i, and the case compares them all")
    module = AlibiPositionalBias(heads=len(slopes), slopes=list(slopes)).double()
    return module, lambda: module.forward_custom_pos(_t(q).double(), _t(k).double())


def alibi_bias(inputs, params):
    _, bias = _alibi(inputs["slopes"], inputs["q_positions"], inputs["k_positions"], params)
    return {"bias": bias().numpy()}


def alibi_grad(inputs, params):
    dbias = inputs["dbias"]
    module, bias = _alibi(np.ones(dbias.shape[-3]), inputs["q_positions"], inputs["k_positions"], params)
    module.slopes.requires_grad_(True)                                        # the buffer (H, 1, 1) as a leaf
    bias().backward(lead_summed(dbias))
    return {"dslopes": module.slopes.grad.reshape(-1).numpy()}


def t5_bucket(inputs, params):
    from x_transformers.x_transformers import RelativePositionBias
    require(not params["exact"], "buckets come from a float32 log (exact = true asks for real numbers)")
    bucket = RelativePositionBias._relative_position_bucket(_t(inputs["relative_position"]),
                                                           causal=not params["bidirectional"],
                                                           num_buckets=params["num_buckets"],
                                                           max_distance=params["max_distance"])
    return {"bucket": bucket.numpy()}


def _t5(H, q, k, params):
    from x_transformers.x_transformers import RelativePositionBias
    module = RelativePositionBias(scale=1.0, causal=not params["bidirectional"], num_buckets=params["num_buckets"],
                                  max_distance=params["max_distance"], heads=H).double()
    L = int(max(q.max(), k.max())) + 1
    return module, lambda: module(L, L)[:, _t(q)][:, :, _t(k)]                 # (H, T, S)


def t5_bias(inputs, params):
    import torch
    module, bias = _t5(inputs["table"].shape[1], inputs["q_positions"], inputs["k_positions"], params)
    with torch.no_grad():
        module.relative_attention_bias.weight.copy_(_t(inputs["table"]))
        return {"bias": bias().numpy()}


def t5_grad(inputs, params):
    module, bias = _t5(inputs["dbias"].shape[-3], inputs["q_positions"], inputs["k_positions"], params)
    bias().backward(lead_summed(inputs["dbias"]))
    return {"dtable": module.relative_attention_bias.weight.grad.numpy()}


def sinusoidal_table(inputs, params):
    import torch
    from x_transformers.x_transformers import ScaledSinusoidalEmbedding
    require(params["layout"] in ("split", "interleaved"), "tensor2tensor's frequencies are not offered")
    module = ScaledSinusoidalEmbedding(params["dim"], theta=params["base"]).double()
    with torch.no_grad():
        module.scale.fill_(1.0)                                               # the learned scale (init D^-1/2)
    pos = inputs["positions"]
    table = module(torch.zeros(1, len(pos), params["dim"]), pos=_t(pos, torch.float64)).detach().numpy()
    return {"table": table_layout(table, "split", params["layout"])}


def components():
    import x_transformers  # noqa: F401  (an environment that cannot import it fails here, not per case)
    f32 = "inv_freq built in float32: float32 tolerance"
    rope = [f32, "interleaved layout native; half by permuting each pair's features", "partial rotary native",
            "given inv_freq written to the inv_freq buffer", "attention factor = apply_rotary_pos_emb's scale"]
    xp = [f32, "keys get scale ** -1, as its Attention does", "centre (max t + 1) // 2 must be the case's scale_offset"]
    t5 = ["relative position key - query, causal = not bidirectional", "scale = 1",
          "bias of positions 0 ... L-1, read at the case's rows and columns"]
    al = ["forward_custom_pos: -m |i - j|, the symmetric form only", "slopes a float32 buffer: float32 tolerance"]
    grad = "torch autograd"
    return [
        Component("RotaryEmbedding", "rope", rope_family(_rotate, "interleaved"), "float32", rope),
        Component("RotaryEmbedding", "rope_grad", rope_family(_rotate, "interleaved", True), "float32", rope + [grad]),
        Component("RotaryEmbedding", "rope_scaling", rope_scaling, "float32",
                  [f32, "linear = interpolation_factor, ntk = base_rescale_factor",
                   "inv_freq and attention factor read off the rotation at positions 0 and 1"]),
        Component("RotaryEmbedding", "rope_scores", scores_family(_cached_qk, "interleaved"), "float32",
                  [f32, "interleaved layout native; half by the same permutation of q's and k's features",
                   "freqs of keys 0 ... S-1; apply_rotary_pos_emb keeps the last T for the queries"]),
        Component("RotaryEmbedding (use_xpos)", "xpos_scores", scores_family(_xpos_qk, "interleaved"), "float32",
                  [f32, "freqs and scale of keys 0 ... S-1; apply_rotary_pos_emb keeps the last T for the queries",
                   "keys get scale ** -1; one centre for queries and keys, which cancels in the scores"]),
        Component("RotaryEmbedding (use_xpos)", "xpos", xpos, "float32", xp),
        Component("RotaryEmbedding (use_xpos)", "xpos_grad", xpos_grad, "float32", xp + [grad]),
        Component("AlibiPositionalBias", "alibi_slopes", alibi_slopes, "float64", ["_get_slopes(heads)"]),
        Component("AlibiPositionalBias", "alibi_bias", alibi_bias, "float32", al),
        Component("AlibiPositionalBias", "alibi_grad", alibi_grad, "float32", al + [grad]),
        Component("RelativePositionBias", "t5_bucket", t5_bucket, "float64", t5[:1]),
        Component("RelativePositionBias", "t5_bias", t5_bias, "float64", t5),
        Component("RelativePositionBias", "t5_grad", t5_grad, "float64", t5 + [grad]),
        Component("ScaledSinusoidalEmbedding", "sinusoidal_table", sinusoidal_table, "float32",
                  ["inv_freq built in float32: float32 tolerance", "split layout native; interleaved by permuting columns", "learned scale set to 1"]),
    ]


def probe_xpos_centre():
    """The centre of the scale exponent follows the largest position passed to forward."""
    from x_transformers.x_transformers import RotaryEmbedding
    module = RotaryEmbedding(4, use_xpos=True, scale_base=1).double()
    out = {str(t): module(_t(np.array(t)))[1][0, :, 0].tolist() for t in ([0, 1, 2, 3], [0, 1, 2, 3, 100])}
    return {"name": "x_transformers_xpos_centre",
            "input": "RotaryEmbedding(4, use_xpos=True, scale_base=1)(t)[1][0, :, 0]: zeta_0 = 0.4 / 1.4 raised to "
                     "t - (max t + 1) // 2", "output": out}


def probe_rotary_dim_2():
    """A rotary width of 2 (one pair; the spec's layer/rope_interleaved_partial rotates 2 features)."""
    from x_transformers.x_transformers import RotaryEmbedding
    try:
        out = RotaryEmbedding(2)(_t(np.array([0, 1])))[0].tolist()
    except Exception as err:
        out = f"{type(err).__name__}: {err}"
    return {"name": "x_transformers_rotary_dim_2", "input": "RotaryEmbedding(2)(tensor([0, 1]))", "output": out}


PROBES = [probe_xpos_centre, probe_rotary_dim_2]
