"""minipos's gradients against torch autograd through the modules and functions of transformers.

- T5: transformers' ``T5Attention`` (encoder and decoder) with its weights copied into NumPy; the
  gradient of ``relative_attention_bias.weight`` from autograd equals ``t5_bias_backward`` of the
  ``dbias`` that ``attention_backward`` returns for ``t5_bias`` + ``attention`` at scale 1.0, and
  the input's gradient equals the chain through the projections.
- RoPE: HF's own ``apply_rotary_pos_emb`` (LLaMA) differentiated by autograd equals
  ``apply_rope_backward`` (half layout), with a YaRN attention factor from ``LlamaRotaryEmbedding``.

Built the way tests/test_layer_interop.py builds the modules (tiny configs, float64, eval).
Skipped when torch or transformers is missing.
"""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _torch import _np, _t  # noqa: E402

from minipos import attention as A  # noqa: E402
from minipos.rope import apply_rope, apply_rope_backward  # noqa: E402
from minipos.rope_scaling import yarn  # noqa: E402
from minipos.t5 import t5_bias, t5_bias_backward  # noqa: E402

D_MODEL, HEADS, HEAD_DIM = 32, 4, 8




def _heads(x, B, T):
    """``(B, T, H*D)`` -> ``(B, H, T, D)``."""
    return x.reshape(B, T, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)


def _merge(x):
    """``(B, H, T, D)`` -> ``(B, T, H*D)``."""
    B, H, T, D = x.shape
    return x.transpose(0, 2, 1, 3).reshape(B, T, H * D)


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_table_gradient_matches_t5attention_autograd(is_decoder):
    from transformers.models.t5.modeling_t5 import T5Attention, T5Config

    torch.manual_seed(0)
    cfg = T5Config(d_model=D_MODEL, d_kv=HEAD_DIM, num_heads=HEADS, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, is_decoder=is_decoder, dropout_rate=0.0)
    cfg._attn_implementation = "eager"
    ref = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).double().eval()
    with torch.no_grad():
        ref.relative_attention_bias.weight.normal_()
    B, T = 2, 150                                        # beyond max_distance: every log bucket is used
    rng = np.random.default_rng(0)
    x = rng.standard_normal((B, T, D_MODEL))
    g = rng.standard_normal((B, T, D_MODEL))             # the gradient of the module's output
    mask = None
    if is_decoder:                                       # T5's decoder takes an additive causal mask
        mask = _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -1e9)[None, None])
    tx = _t(x).requires_grad_(True)
    (ref(tx, mask=mask)[0] * _t(g)).sum().backward()

    # The same computation in minipos: T5's attention has no 1/sqrt(D) (scale 1.0).
    wq, wk, wv, wo = (_np(getattr(ref, n).weight).T for n in "qkvo")
    table = _np(ref.relative_attention_bias.weight)                          # (num_buckets, H)
    buckets = dict(bidirectional=not is_decoder, num_buckets=32, max_distance=128)
    q, k, v = _heads(x @ wq, B, T), _heads(x @ wk, B, T), _heads(x @ wv, B, T)
    bias = t5_bias(table, T, T, **buckets)                                   # (H, T, T)
    causal = A.causal_mask(T, T) if is_decoder else None
    dout = _heads(g @ wo.T, B, T)                                            # through the output projection
    dq, dk, dv, dbias = A.attention_backward(q, k, v, dout, bias=bias, mask=causal, scale=1.0)
    assert dbias.shape == bias.shape                                         # the batch summed
    dtable = t5_bias_backward(dbias, T, T, **buckets)
    np.testing.assert_allclose(dtable, _np(ref.relative_attention_bias.weight.grad), rtol=1e-9, atol=1e-10)
    dx = _merge(dq) @ wq.T + _merge(dk) @ wk.T + _merge(dv) @ wv.T
    np.testing.assert_allclose(dx, _np(tx.grad), rtol=1e-9, atol=1e-10)


def test_t5_shared_bias_gradient_sums_over_layers():
    # T5 computes the bias in layer 0 and every later layer reuses it: the table's gradient is the
    # sum of every layer's dbias, bucketed once. Two stacked T5Attention modules, layer 1 given
    # layer 0's position_bias, as T5Stack does.
    from transformers.models.t5.modeling_t5 import T5Attention, T5Config

    torch.manual_seed(1)
    cfg = T5Config(d_model=D_MODEL, d_kv=HEAD_DIM, num_heads=HEADS, relative_attention_num_buckets=16,
                   relative_attention_max_distance=40, dropout_rate=0.0)
    cfg._attn_implementation = "eager"
    first = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).double().eval()
    second = T5Attention(cfg, has_relative_attention_bias=False, layer_idx=1).double().eval()
    with torch.no_grad():
        first.relative_attention_bias.weight.normal_()
    B, T = 1, 50
    rng = np.random.default_rng(1)
    x, g = rng.standard_normal((B, T, D_MODEL)), rng.standard_normal((B, T, D_MODEL))
    h, position_bias, _ = first(_t(x))                  # (output, position_bias (1, H, T, T), weights)
    y = second(h, position_bias=position_bias)[0]
    (y * _t(g)).sum().backward()

    buckets = dict(bidirectional=True, num_buckets=16, max_distance=40)
    table = _np(first.relative_attention_bias.weight)
    bias = t5_bias(table, T, T, **buckets)
    w0 = [_np(getattr(first, n).weight).T for n in "qkvo"]
    w1 = [_np(getattr(second, n).weight).T for n in "qkvo"]
    q0, k0, v0 = (_heads(x @ w, B, T) for w in w0[:3])
    h0 = _merge(A.attention(q0, k0, v0, bias=bias, scale=1.0)) @ w0[3]
    q1, k1, v1 = (_heads(h0 @ w, B, T) for w in w1[:3])
    dq1, dk1, dv1, dbias1 = A.attention_backward(q1, k1, v1, _heads(g @ w1[3].T, B, T), bias=bias, scale=1.0)
    dh0 = _merge(dq1) @ w1[0].T + _merge(dk1) @ w1[1].T + _merge(dv1) @ w1[2].T
    _, _, _, dbias0 = A.attention_backward(q0, k0, v0, _heads(dh0 @ w0[3].T, B, T), bias=bias, scale=1.0)
    dtable = t5_bias_backward(dbias0 + dbias1, T, T, **buckets)
    np.testing.assert_allclose(dtable, _np(first.relative_attention_bias.weight.grad), rtol=1e-9, atol=1e-10)


def test_rope_backward_matches_hf_apply_rotary_pos_emb_autograd():
    from transformers.models.llama.modeling_llama import LlamaConfig, LlamaRotaryEmbedding, apply_rotary_pos_emb

    params = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 500.0}
    cfg = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=HEADS, head_dim=HEAD_DIM,
                      max_position_embeddings=256, rope_parameters=params)
    rotary = LlamaRotaryEmbedding(cfg)
    hf_inv_freq = _np(rotary.inv_freq).astype(np.float64)                   # float32 in transformers
    factor = float(rotary.attention_scaling)
    ours, our_factor = yarn(HEAD_DIM, base=500.0, factor=4.0, original_max_position_embeddings=64)
    np.testing.assert_allclose(hf_inv_freq, ours, rtol=1e-6)                # the same YaRN frequencies ...
    assert factor == pytest.approx(our_factor, rel=1e-12)                   # ... and attention factor

    B, T = 2, 40
    rng = np.random.default_rng(2)
    pos = rng.integers(0, 200, T)
    q, k = rng.standard_normal((B, HEADS, T, HEAD_DIM)), rng.standard_normal((B, HEADS, T, HEAD_DIM))
    gq, gk = rng.standard_normal(q.shape), rng.standard_normal(k.shape)
    # cos/sin as LlamaRotaryEmbedding.forward builds them, but in float64 so the comparison is exact.
    freqs = pos[:, None].astype(np.float64) * hf_inv_freq[None, :]
    emb = np.concatenate([freqs, freqs], axis=-1)
    cos, sin = (_t(np.broadcast_to(f(emb) * factor, (B, T, HEAD_DIM))) for f in (np.cos, np.sin))
    tq, tk = _t(q).requires_grad_(True), _t(k).requires_grad_(True)
    q_embed, k_embed = apply_rotary_pos_emb(tq, tk, cos, sin)
    kw = dict(layout="half", inv_freq=hf_inv_freq, attention_factor=factor)
    np.testing.assert_allclose(_np(q_embed), apply_rope(q, pos, **kw), rtol=1e-12, atol=1e-12)
    ((q_embed * _t(gq)).sum() + (k_embed * _t(gk)).sum()).backward()
    np.testing.assert_allclose(apply_rope_backward(gq, pos, **kw), _np(tq.grad), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(apply_rope_backward(gk, pos, **kw), _np(tk.grad), rtol=1e-12, atol=1e-12)

    # With the float32 cos/sin LlamaRotaryEmbedding itself returns: agreement to float32 angles.
    with torch.no_grad():
        cos32, sin32 = rotary(_t(q), _t(np.broadcast_to(pos, (B, T))))
    tq, tk = _t(q).requires_grad_(True), _t(k).requires_grad_(True)
    q_embed, _ = apply_rotary_pos_emb(tq, tk, cos32.double(), sin32.double())
    (q_embed * _t(gq)).sum().backward()
    np.testing.assert_allclose(apply_rope_backward(gq, pos, layout="half", inv_freq=ours, attention_factor=our_factor),
                               _np(tq.grad), rtol=1e-5, atol=1e-5)
