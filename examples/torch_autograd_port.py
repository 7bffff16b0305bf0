"""Backward passes written by hand in PyTorch, tested against the minipos gradient vectors.

Each scheme is a ``torch.autograd.Function`` whose ``backward`` is written out, the way a kernel
author writes a fused backward, instead of being left to autograd. ``tests/test_example_port_autograd.py``
checks the functions below against ``spec/vectors`` (``attention_grad``, ``rope_grad``,
``t5_grad``) with ``spec/check_port.py``, in float64 and float32, and each backward against
``torch.autograd.gradcheck`` in float64. It does not import minipos.

    family (spec/vectors)   Function     backward
    attention_grad          Attention    FlashAttention-2: the forward keeps out and the row
                                         log-sum-exp lse; the backward recomputes P block by block
    rope_grad               Rope         R(m)^T: the rotation by minus the angle
    t5_grad                 T5Bias       the table's gradient: dbias summed over the pairs of each bucket

The helpers ``attention_grad``, ``rope_grad`` and ``t5_grad`` run a forward and the backward for
one case and return the outputs the vectors record, so each can be handed to ``run_family``.
"""

from __future__ import annotations

import torch


def _reduce_to(grad: torch.Tensor, shape) -> torch.Tensor:
    """``grad`` summed over the axes that broadcasting added or stretched to reach its shape."""
    while grad.dim() > len(shape):
        grad = grad.sum(0)
    for axis, n in enumerate(shape):
        if n == 1 and grad.shape[axis] != 1:
            grad = grad.sum(axis, keepdim=True)
    return grad


class Attention(torch.autograd.Function):
    """``softmax(scale q k^T + bias, masked) v`` with ``lse``; FlashAttention-2's backward (arXiv:2307.08691, Alg. 2).

    q ``(..., H, T, D)``, k ``(..., H, S, D)``, v ``(..., H, S, Dv)``; bias (float) and mask (bool,
    True = may attend) broadcast to ``(..., H, T, S)``, either may be None. Returns
    ``(out (..., H, T, Dv), lse (..., H, T))``; a row with no allowed key gets out = 0 and lse = -inf.
    """

    @staticmethod
    def forward(ctx, q, k, v, bias, mask, scale, block_size):
        logits = scale * q @ k.transpose(-1, -2) + (0 if bias is None else bias)       # (..., H, T, S)
        if mask is not None:
            logits = logits.masked_fill(~mask, float("-inf"))
        lse = torch.logsumexp(logits, dim=-1)                                          # -inf: no key
        # Stored as +inf for a row with no key (FlashAttention's convention): exp(S - lse) is then 0
        # there with no branch, where -inf would give exp(-inf + inf) = NaN.
        stored = torch.where(torch.isfinite(lse), lse, torch.full_like(lse, float("inf")))
        out = torch.exp(logits - stored[..., None]) @ v                                # P V
        ctx.save_for_backward(q, k, v, bias, mask, out, stored)
        ctx.scale, ctx.block_size, ctx.bias_shape = scale, block_size, None if bias is None else bias.shape
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, bias, mask, out, lse = ctx.saved_tensors
        scale, S = ctx.scale, k.shape[-2]
        full = (*q.shape[:-1], S)                                                      # (..., H, T, S)
        bias = None if bias is None else bias.expand(full)
        mask = None if mask is None else mask.expand(full)
        D = (dout * out).sum(-1, keepdim=True)       # rowsum(dO * O), not rowsum(dP): the stored output
        dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        dbias = None if bias is None else torch.zeros(full, dtype=q.dtype)
        for j in range(0, S, ctx.block_size):                                          # key blocks
            ks = slice(j, min(j + ctx.block_size, S))
            s = scale * q @ k[..., ks, :].transpose(-1, -2)                            # (..., H, T, tk)
            if bias is not None:
                s = s + bias[..., ks]                                                  # not scaled
            if mask is not None:
                s = s.masked_fill(~mask[..., ks], float("-inf"))
            p = torch.exp(s - lse[..., None])                                          # P recomputed
            dv[..., ks, :] += p.transpose(-1, -2) @ dout                               # dV_j = P^T dO
            ds = p * (dout @ v[..., ks, :].transpose(-1, -2) - D)                      # dS = P (dP - D)
            dq += scale * ds @ k[..., ks, :]                                           # scale in dQ ...
            dk[..., ks, :] += scale * ds.transpose(-1, -2) @ q                         # ... and dK
            if dbias is not None:
                dbias[..., ks] = ds                                                    # ... not in dbias
        if dbias is not None:
            dbias = _reduce_to(dbias, ctx.bias_shape)
        return dq, dk, dv, dbias, None, None, None


def _rotate(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Each pair (a, b) -> (-b, a): the 90 degree rotation of its layout."""
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([-b, a], dim=-1).flatten(-2)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)


def _cos_sin(positions, R, layout, base, inv_freq, attention_factor, dtype):
    """cos and sin of m theta_i (angles in float64) times the attention factor, laid out as x: (T, R)."""
    if inv_freq is None:
        inv_freq = base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
    angles = torch.as_tensor(positions).to(torch.float64)[:, None] * torch.as_tensor(inv_freq, dtype=torch.float64)
    angles = angles.repeat_interleave(2, -1) if layout == "interleaved" else torch.cat([angles, angles], -1)
    return (attention_factor * angles.cos()).to(dtype), (attention_factor * angles.sin()).to(dtype)


class Rope(torch.autograd.Function):
    """RoPE on x ``(..., T, D)``: the first R features turn by +m theta_i (times the attention factor),
    the rest pass through. Its backward is the transpose, the turn by -m theta_i."""

    @staticmethod
    def forward(ctx, x, positions, layout, base, rotary_dim, attention_factor, inv_freq):
        R = x.shape[-1] if rotary_dim is None else rotary_dim
        cos, sin = _cos_sin(positions, R, layout, base, inv_freq, attention_factor, x.dtype)
        ctx.save_for_backward(cos, sin)
        ctx.layout, ctx.R = layout, R
        rot = x[..., :R]
        return torch.cat([rot * cos + _rotate(rot, layout) * sin, x[..., R:]], dim=-1)

    @staticmethod
    def backward(ctx, dy):
        cos, sin = ctx.saved_tensors
        d = dy[..., :ctx.R]
        dx = d * cos - _rotate(d, ctx.layout) * sin          # R(m)^T: the adjoint of rot is -rot
        return torch.cat([dx, dy[..., ctx.R:]], dim=-1), None, None, None, None, None, None   # pass-through: dy


class T5Bias(torch.autograd.Function):
    """T5's bias ``(H, T, S) = table[buckets, h]`` from a table ``(K, H)`` and buckets ``(T, S)``.
    Its backward sums dbias over every pair of a bucket (a scatter-add, not a scatter)."""

    @staticmethod
    def forward(ctx, table, buckets):
        ctx.save_for_backward(buckets)
        ctx.num_buckets = table.shape[0]
        return table[buckets].permute(2, 0, 1)                                         # (H, T, S)

    @staticmethod
    def backward(ctx, dbias):
        (buckets,) = ctx.saved_tensors
        H = dbias.shape[-3]
        per_pair = dbias.reshape(-1, *dbias.shape[-3:]).sum(0).permute(1, 2, 0).reshape(-1, H)   # (T*S, H)
        dtable = torch.zeros(ctx.num_buckets, H, dtype=dbias.dtype)
        return dtable.index_add_(0, buckets.reshape(-1), per_pair), None               # += per bucket


# --- one case of a gradient family: forward, then backward -------------------------------------------

def attention_grad(q, k, v, dout, *, scale, bias=None, mask=None, block_size=2, function=Attention):
    """``attention_grad`` outputs: out, lse, dq, dk, dv (and dbias with a bias). ``function``: the
    ``Attention`` to test (a subclass with another backward, say)."""
    q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
    if bias is not None:
        bias = bias.detach().requires_grad_()
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    out, lse = function.apply(q, k, v, bias, mask, scale, block_size)
    out.backward(dout)
    got = {"out": out.detach(), "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}
    if bias is not None:
        got["dbias"] = bias.grad
    return got


def rope_grad(dy, positions, *, layout, base, rotary_dim, attention_factor, inv_freq=None, function=Rope):
    """``rope_grad`` output dx: the gradient of Rope at any x (it is linear) for the output gradient dy."""
    x = torch.zeros_like(dy, requires_grad=True)
    function.apply(x, positions, layout, base, rotary_dim, attention_factor, inv_freq).backward(dy)
    return x.grad


def t5_grad(dbias, buckets, num_buckets, function=T5Bias):
    """``t5_grad`` output dtable ``(K, H)`` for the bias gradient dbias ``(..., H, T, S)``."""
    table = torch.zeros(num_buckets, dbias.shape[-3], dtype=dbias.dtype, requires_grad=True)
    bias = function.apply(table, buckets)                                                # (H, T, S)
    bias.expand(dbias.shape).backward(dbias)                                           # a batch shares it
    return table.grad
