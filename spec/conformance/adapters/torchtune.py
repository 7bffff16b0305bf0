"""torchtune against the golden vectors.

Components and the conventions each one needs:

- ``RotaryPositionalEmbeddings`` (``torchtune.modules``): the interleaved layout (Meta's
  ``x.reshape(..., -1, 2)``), inputs ``[b, s, n_h, h_d]`` with ``input_pos``. The half layout is
  stated by permuting the two features of each pair. ``max_seq_len`` is the case's largest
  position + 1, since the module reads a cache of rows ``0 ... max_seq_len - 1``. Given
  frequencies whose ``scaling`` is ``llama3`` are rebuilt by ``Llama3ScaledRoPE`` (the same
  module with its scaling); others are written to its ``theta`` buffer and the cache rebuilt with
  its own ``build_rope_cache``. Cached steps (``rope_scores``): q at ``input_pos = q_positions``,
  k at ``k_positions``, then ``q k^T``. It rotates every feature it is given and has no attention factor, so
  partial rotary and a factor other than 1 are not expressible, and neither is a negative
  position (``cache[input_pos]`` reads row ``max_seq_len - 3`` for -3: see ``PROBES``). The
  rotation is computed in float32 (``x.float()``): float32 tolerance.
- ``Qwen2RotaryPositionalEmbeddings`` (``torchtune.models.qwen2``): the same cache in the half
  layout (HF's ``rotate_half``), cos and sin float32. Phi-3's ``Phi3RotaryPositionalEmbeddings``
  is the same code under another name and is not run twice.
- ``Llama3ScaledRoPE`` (``torchtune.models.llama3_1``): the ``llama3`` scaling kind. Its
  ``(inv_freq, attention_factor)`` are read off its forward at positions 0 and 1 (see
  ``_common.angles_and_factor``), not from its buffers.
- ``T5EncoderRelativePositionBias`` (``torchtune.models.t5``): bidirectional only; it builds a
  ``max_seq_len x max_seq_len`` bias for positions ``0 ... max_seq_len - 1`` from relative
  positions ``key - query``, read at the case's rows and columns. The bucket function has no
  public form: ``t5_bucket`` (distances up to 100 000) would need a 10^10-entry table.

Gradient families are torch autograd through the same calls.
"""

from __future__ import annotations

import numpy as np

from ._common import (Component, NotExpressible, angles_and_factor, in_layout, layout_permutation, nonnegative,
                      require, torch_vjp)

LIBRARY = "torchtune"
DISTRIBUTIONS = ["torchtune", "torch"]


def _t(a, dtype=None):
    import torch
    return torch.as_tensor(np.ascontiguousarray(a), dtype=dtype)


def _module(cls_name, D, base, max_seq_len, inv_freq=None, scaling=None):
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE
    from torchtune.models.qwen2._positional_embeddings import Qwen2RotaryPositionalEmbeddings
    from torchtune.modules import RotaryPositionalEmbeddings
    if cls_name == "meta" and inv_freq is not None and (scaling or {}).get("kind") == "llama3":
        return Llama3ScaledRoPE(dim=D, max_seq_len=max_seq_len, base=scaling["base"], scale_factor=scaling["factor"],
                                low_freq_factor=scaling["low_freq_factor"], high_freq_factor=scaling["high_freq_factor"],
                                old_context_len=scaling["original_max_position_embeddings"])
    cls = Qwen2RotaryPositionalEmbeddings if cls_name == "qwen2" else RotaryPositionalEmbeddings
    module = cls(dim=D, max_seq_len=max_seq_len, base=base)
    if inv_freq is not None:                       # the module's own buffer, then its own cache builder
        module.theta = _t(inv_freq).float()
        module.build_rope_cache(max_seq_len)
    return module


def _rotation(cls_name):
    def rotate(x, positions, params, inv_freq):
        D = x.shape[-1]
        require((params["rotary_dim"] or D) == D, "the module rotates every feature it is given (no partial rotary)")
        require(params["attention_factor"] == 1.0, "the module has no attention factor")
        nonnegative(positions, "the module reads cache[input_pos], rows 0 ... max_seq_len - 1")
        module = _module(cls_name, D, params["base"], int(positions.max()) + 1, inv_freq, params.get("scaling"))
        t = x.reshape(-1, x.shape[-2], 1, D)                                 # [b, s, n_h = 1, h_d]
        return module(t, input_pos=_t(positions)).reshape(x.shape)
    return rotate


def _rope_family(cls_name, native, grad=False):
    rotate = _rotation(cls_name)

    def run(inputs, params):
        import torch
        x = inputs["dy" if grad else "x"]
        R = params["rotary_dim"] or x.shape[-1]
        fn = lambda t: in_layout(lambda u: rotate(u, inputs["positions"], params, inputs.get("inv_freq")), t,
                                 params["layout"], native, R)
        if grad:   # a rotation is linear: its backward is the vjp at any x
            return {"dx": torch_vjp(fn, np.zeros_like(x), x)}
        return {"out": fn(_t(x, torch.float64)).double().numpy()}
    return run


def _scores(cls_name, native):
    """A cached step: q at ``input_pos = q_positions``, k at ``k_positions``, then ``q k^T``."""
    def run(inputs, params):
        import torch
        q, k = inputs["q"], inputs["k"]
        D = q.shape[-1]
        require((params["rotary_dim"] or D) == D, "the module rotates every feature it is given (no partial rotary)")
        qp, kp = inputs["q_positions"], inputs["k_positions"]
        nonnegative(np.concatenate([qp, kp]), "the module reads cache[input_pos], rows 0 ... max_seq_len - 1")
        module = _module(cls_name, D, params["base"], int(max(qp.max(), kp.max())) + 1)
        p = layout_permutation(params["layout"], native, D, D)        # the same permutation of q and k: dots unchanged
        rot = lambda x, pos: module(_t(x[..., p], torch.float64).permute(1, 0, 2)[None], input_pos=_t(pos))[0]
        qr, kr = rot(q, qp), rot(k, kp)                                       # [s, n_h, h_d]
        return {"scores": torch.einsum("thd,shd->hts", qr, kr).double().numpy()}
    return run


def llama3_scaling(inputs, params):
    import torch
    from torchtune.models.llama3_1._position_embeddings import Llama3ScaledRoPE
    require(params["kind"] == "llama3", f"Llama3ScaledRoPE has the llama3 scaling only, not {params['kind']!r}")
    D = params["dim"]
    module = Llama3ScaledRoPE(dim=D, max_seq_len=2, base=params["base"], scale_factor=params["factor"],
                              low_freq_factor=params["low_freq_factor"], high_freq_factor=params["high_freq_factor"],
                              old_context_len=params["original_max_position_embeddings"])

    def rotate(x, positions):
        t = _t(x, torch.float32).reshape(1, len(positions), 1, D)
        return module(t, input_pos=_t(positions)).reshape(x.shape).double().numpy()

    inv_freq, factor = angles_and_factor(rotate, D, "interleaved")
    return {"inv_freq": inv_freq, "attention_factor": factor}


def _t5_module(table_or_shape, params, q, k):
    from torchtune.models.t5._encoder import T5EncoderRelativePositionBias
    require(params["bidirectional"], "T5EncoderRelativePositionBias is the encoder's (bidirectional) bias only")
    K, H = table_or_shape
    L = int(max(q.max(), k.max())) + 1
    return T5EncoderRelativePositionBias(num_buckets=K, max_dist=params["max_distance"], num_heads=H,
                                         max_seq_len=L).double()


def t5_bias(inputs, params):
    import torch
    q, k = inputs["q_positions"], inputs["k_positions"]
    module = _t5_module(inputs["table"].shape, params, q, k)
    with torch.no_grad():
        module.embedding.weight.copy_(_t(inputs["table"]))
        return {"bias": module()[0][:, _t(q)][:, :, _t(k)].numpy()}            # (H, T, S)


def t5_grad(inputs, params):
    dbias, q, k = inputs["dbias"], inputs["q_positions"], inputs["k_positions"]
    module = _t5_module((params["num_buckets"], dbias.shape[-3]), params, q, k)
    bias = module()[0][:, _t(q)][:, :, _t(k)]
    lead = tuple(range(dbias.ndim - 3))
    bias.backward(_t(dbias).sum(dim=lead) if lead else _t(dbias))
    return {"dtable": module.embedding.weight.grad.numpy()}


def t5_bucket(inputs, params):
    raise NotExpressible(
        "no public bucket function: T5EncoderRelativePositionBias tabulates max_seq_len^2 pairs, "
        "and these distances reach 100 000")


def components():
    import torchtune.modules  # noqa: F401  (an environment that cannot import it fails here, not per case)
    rope = ["interleaved layout native; half stated by permuting each pair's features",
            "max_seq_len = largest position + 1",
            "given inv_freq of a llama3 scaling: Llama3ScaledRoPE of the case's scaling; others written to theta, "
            "cache rebuilt by build_rope_cache", "float32 rotation: float32 tolerance"]
    qwen = ["half layout native; interleaved stated by permuting each pair's features",
            "max_seq_len = largest position + 1", "given inv_freq written to theta, cache rebuilt by build_rope_cache",
            "float32 cos/sin: float32 tolerance"]
    t5 = ["relative position key - query, as the spec", "max_seq_len = largest position + 1, read at the case's rows and columns"]
    return [
        Component("RotaryPositionalEmbeddings", "rope", _rope_family("meta", "interleaved"), "float32", rope),
        Component("RotaryPositionalEmbeddings", "rope_grad", _rope_family("meta", "interleaved", True), "float32",
                  rope + ["torch autograd"]),
        Component("RotaryPositionalEmbeddings", "rope_scores", _scores("meta", "interleaved"), "float32", rope[:2] + [
            "q at input_pos = q_positions, k at k_positions, then q k^T", rope[3]]),
        Component("Qwen2RotaryPositionalEmbeddings", "rope", _rope_family("qwen2", "half"), "float32", qwen),
        Component("Qwen2RotaryPositionalEmbeddings", "rope_scores", _scores("qwen2", "half"), "float32", qwen[:2] + [
            "q at input_pos = q_positions, k at k_positions, then q k^T", qwen[3]]),
        Component("Qwen2RotaryPositionalEmbeddings", "rope_grad", _rope_family("qwen2", "half", True), "float32",
                  qwen + ["torch autograd"]),
        Component("Llama3ScaledRoPE", "rope_scaling", llama3_scaling, "float32",
                  ["inv_freq and attention factor read off the forward at positions 0 and 1", "float32"]),
        Component("T5EncoderRelativePositionBias", "t5_bucket", t5_bucket, "float64", t5),
        Component("T5EncoderRelativePositionBias", "t5_bias", t5_bias, "float64", t5),
        Component("T5EncoderRelativePositionBias", "t5_grad", t5_grad, "float64", t5 + ["torch autograd"]),
    ]


# --- probes: the minimal inputs behind the discrepancies on the page --------------------------------

def probe_negative_position():
    """Position -3 reads cache row max_seq_len - 3: the rotation of position 5 when max_seq_len = 8."""
    import torch
    from torchtune.modules import RotaryPositionalEmbeddings
    rope = RotaryPositionalEmbeddings(dim=2, max_seq_len=8)
    x = torch.tensor([1.0, 0.0]).reshape(1, 1, 1, 2).expand(1, 3, 1, 2)
    out = rope(x, input_pos=torch.tensor([-3, 5, 3]))[0, :, 0]
    return {"name": "torchtune_negative_position",
            "input": "RotaryPositionalEmbeddings(dim=2, max_seq_len=8)(x = [1, 0] at three rows, input_pos=[-3, 5, 3])",
            "output": {"position -3": out[0].tolist(), "position 5": out[1].tolist(), "position 3": out[2].tolist(),
                       "cos, sin of -3 rad": [float(np.cos(-3.0)), float(np.sin(-3.0))]}}


def probe_past_max_seq_len():
    """A position at max_seq_len: the docstring says the cache is recomputed."""
    import torch
    from torchtune.modules import RotaryPositionalEmbeddings
    rope = RotaryPositionalEmbeddings(dim=2, max_seq_len=8)
    doc = RotaryPositionalEmbeddings.__doc__
    line = next(s.strip() for s in doc.splitlines() if "exceeded" in s)
    try:
        out = rope(torch.ones(1, 1, 1, 2), input_pos=torch.tensor([8])).tolist()
    except Exception as err:
        out = f"{type(err).__name__}: {err}"
    return {"name": "torchtune_past_max_seq_len",
            "input": "RotaryPositionalEmbeddings(dim=2, max_seq_len=8)(ones(1, 1, 1, 2), input_pos=[8])",
            "output": out, "docstring": line}


PROBES = [probe_negative_position, probe_past_max_seq_len]
