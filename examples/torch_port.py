"""A PyTorch port of five position schemes, written from the minipos spec (it does not import minipos).

It shows what a port needs to get right; ``tests/test_example_port.py`` checks it against the
golden vectors in ``spec/vectors`` with ``spec/check_port.py``. Argument names follow the
vector files' ``inputs`` and ``params``, so each function can be handed to ``run_family``.

    family (spec/vectors)        function here
    rope                         apply_rope
    alibi_slopes, alibi_bias     alibi_slopes, alibi_bias
    t5_bucket, t5_bias           relative_position_bucket, t5_bias
    deberta_relative_position    relative_positions
    deberta_log_bucket           make_log_bucket_position

Conventions (spec/README.md): RoPE pairs features (2i, 2i+1) ("interleaved") or (i, i + R/2)
("half"), rotates each pair counter-clockwise by m * base^(-2i/R), angles in float64; ALiBi adds
-m_h (i - j); T5 buckets take n = key - query with the log branch in float32, as the reference;
DeBERTa's relative position is query - key, log-bucketed in float32.
"""

from __future__ import annotations

import math

import torch


def _rotate(x: torch.Tensor, layout: str) -> torch.Tensor:
    """Each pair (a, b) -> (-b, a): the 90 degree rotation of its layout."""
    if layout == "interleaved":
        a, b = x[..., 0::2], x[..., 1::2]
        return torch.stack([-b, a], dim=-1).flatten(-2)             # (-x1, x0, -x3, x2, ...)
    a, b = x.chunk(2, dim=-1)
    return torch.cat([-b, a], dim=-1)                               # [-x2 | x1]


def apply_rope(x, positions, *, layout="interleaved", base=10000.0, rotary_dim=None, attention_factor=1.0,
               inv_freq=None, scaling=None):
    """RoPE on x ``(..., T, D)`` at integer ``positions`` ``(T,)``; the first ``rotary_dim`` features rotate.

    ``scaling`` (the ``rope_scaling`` params a given ``inv_freq`` came from) is not needed: the
    frequencies are given."""
    x, positions = torch.as_tensor(x), torch.as_tensor(positions)
    R = x.shape[-1] if rotary_dim is None else rotary_dim
    if inv_freq is None:
        inv_freq = base ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)       # theta_i = base^(-2i/R)
    angles = positions.to(torch.float64)[:, None] * torch.as_tensor(inv_freq, dtype=torch.float64)  # (T, R/2)
    angles = angles.repeat_interleave(2, -1) if layout == "interleaved" else torch.cat([angles, angles], -1)
    cos = (attention_factor * angles.cos()).to(x.dtype)
    sin = (attention_factor * angles.sin()).to(x.dtype)
    rot, rest = x[..., :R], x[..., R:]
    return torch.cat([rot * cos + _rotate(rot, layout) * sin, rest], dim=-1)


def alibi_slopes(num_heads: int) -> torch.Tensor:
    """Slopes 2^(-8h/P) for the largest power of two P <= H, then every other slope of 2P heads."""
    P = 2 ** int(math.floor(math.log2(num_heads)))
    exponents = [8 * h / P for h in range(1, P + 1)]
    exponents += [4 * k / P for k in range(1, 2 * (num_heads - P), 2)]      # odd k of the 2P sequence
    return torch.exp2(-torch.tensor(exponents, dtype=torch.float64))


def alibi_bias(slopes, q_positions, k_positions, *, symmetric=False) -> torch.Tensor:
    """``(H, T, S)``: -m_h (i - j), or -m_h |i - j| when ``symmetric``."""
    q, k = torch.as_tensor(q_positions), torch.as_tensor(k_positions)
    rel = (k[None, :] - q[:, None]).to(torch.float64)                     # j - i
    if symmetric:
        rel = -rel.abs()
    return torch.as_tensor(slopes)[:, None, None] * rel


def relative_position_bucket(relative_position, *, bidirectional=True, num_buckets=32, max_distance=128,
                             exact=False) -> torch.Tensor:
    """T5's bucket of n = key - query; the log branch in float32, truncated, as the reference."""
    if exact:
        raise NotImplementedError("this port reproduces the float32 reference only")
    n = torch.as_tensor(relative_position)
    if bidirectional:
        num_buckets //= 2
        offset, m = (n > 0).long() * num_buckets, n.abs()
    else:
        offset, m = 0, (-n).clamp(min=0)
    max_exact = num_buckets // 2
    log = torch.log(m.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact)
    large = (max_exact + (log * (num_buckets - max_exact)).long()).clamp(max=num_buckets - 1)
    return offset + torch.where(m < max_exact, m, large)


def t5_bias(table, q_positions, k_positions, *, bidirectional=True, num_buckets=32, max_distance=128):
    """``(H, T, S)`` = table[bucket(k - q), h]; ``table`` is ``(num_buckets, H)``."""
    q, k = torch.as_tensor(q_positions), torch.as_tensor(k_positions)
    buckets = relative_position_bucket(k[None, :] - q[:, None], bidirectional=bidirectional,
                                       num_buckets=num_buckets, max_distance=max_distance)   # (T, S)
    return torch.as_tensor(table)[buckets].permute(2, 0, 1)


def make_log_bucket_position(relative_pos, bucket_size, max_position) -> torch.Tensor:
    """DeBERTa v2/v3: r where |r| <= mid, else sign(r) (ceil(log(|r|/mid) / log((M-1)/mid) (mid-1)) + mid)."""
    r = torch.as_tensor(relative_pos)
    mid = bucket_size // 2
    abs_pos = torch.where(r.abs() <= mid, torch.full_like(r, mid), r.abs())        # float32 from here
    log_scale = torch.log(torch.tensor((max_position - 1) / mid, dtype=torch.float32))
    log_pos = torch.ceil(torch.log(abs_pos.float() / mid) / log_scale * (mid - 1)) + mid
    return torch.where(r.abs() <= mid, r, r.sign() * log_pos.long())


def relative_positions(q_positions, k_positions, *, bucket_size=-1, max_position=-1) -> torch.Tensor:
    """``(T, S)`` = query - key, log-bucketed when both sizes are > 0."""
    q, k = torch.as_tensor(q_positions), torch.as_tensor(k_positions)
    rel = q[:, None] - k[None, :]
    if bucket_size > 0 and max_position > 0:
        rel = make_log_bucket_position(rel, bucket_size, max_position)
    return rel
