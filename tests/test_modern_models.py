"""The position machinery of current checkpoints through MultiHeadAttention, against the
transformers modules they run (weights copied; float64 where the reference allows): grouped-query
attention (LLaMA with fewer key/value heads), partial rotary read from a config's rope_parameters
(GPT-NeoX's rotary_pct, Phi-3's partial_rotary_factor with LongRoPE), and every key of a
rope_parameters dict honoured or refused by name."""

import numpy as np
import pytest

from minipos import rope
from minipos.layer import MultiHeadAttention, Rotary
from _torch import _np, _t, needs_torch, torch, transformers  # noqa: E402

D_MODEL, HEADS, KV_HEADS, HEAD_DIM = 32, 4, 2, 8


def _x(T, seed=0, B=2):
    return np.random.default_rng(seed).standard_normal((B, T, D_MODEL))


# --- without transformers -------------------------------------------------------------------------

def test_gqa_equals_attention_with_repeated_key_value_heads():
    # Query head h uses key/value head h // (H / KV): the same as a full layer whose wk, wv
    # columns repeat each key/value head's block for its group (HF's repeat_kv).
    rng = np.random.default_rng(1)
    gqa = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=Rotary(layout="half"), seed=2)
    full = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(layout="half"), seed=2)
    full.wq, full.wo = gqa.wq, gqa.wo
    blocks = lambda w: np.repeat(w.reshape(D_MODEL, KV_HEADS, HEAD_DIM), HEADS // KV_HEADS, axis=1)  # noqa: E731
    full.wk, full.wv = (blocks(w).reshape(D_MODEL, -1) for w in (gqa.wk, gqa.wv))
    assert gqa.wk.shape == (D_MODEL, KV_HEADS * HEAD_DIM)
    x = rng.standard_normal((2, 9, D_MODEL))
    np.testing.assert_allclose(gqa(x, causal=True), full(x, causal=True), rtol=1e-12, atol=1e-12)


def test_gqa_cache_holds_the_key_value_heads_only():
    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=1, scheme=Rotary(), seed=3)
    x = _x(6, seed=4)
    cache = layer.new_cache()
    steps = [layer(x[:, t:t + 1], causal=True, cache=cache) for t in range(6)]
    assert cache.k.shape == (2, 1, 6, HEAD_DIM) and cache.v.shape == (2, 1, 6, HEAD_DIM)    # MQA: one head
    np.testing.assert_allclose(np.concatenate(steps, axis=1), layer(x, causal=True), atol=1e-12)


@pytest.mark.parametrize("block_size", [None, 3])
def test_gqa_gradients_match_finite_differences(block_size):
    rng = np.random.default_rng(5)
    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=Rotary(), bias=True, seed=6,
                               block_size=block_size)
    x, dy = rng.standard_normal((1, 5, D_MODEL)), rng.standard_normal((1, 5, D_MODEL))
    _, ctx = layer(x, causal=True, return_context=True)
    grads = layer.backward(ctx, dy)
    assert grads["wk"].shape == layer.wk.shape and grads["bv"].shape == layer.bv.shape
    h = 1e-6
    for name in ("wk", "wv", "bk", "wq"):
        a, e = getattr(layer, name), rng.standard_normal(getattr(layer, name).shape)
        saved = a.copy()
        a[...] = saved + h * e
        plus = layer(x, causal=True)
        a[...] = saved - h * e
        minus = layer(x, causal=True)
        a[...] = saved
        fd = np.sum((plus - minus) * dy) / (2 * h)
        assert abs(np.sum(grads[name] * e) - fd) <= 1e-6 * max(1.0, abs(fd)), name


@pytest.mark.parametrize("num_kv_heads, error", [(3, "must divide num_heads"), (0, "num_kv_heads"),
                                                 (2.0, "num_kv_heads")])
def test_bad_num_kv_heads_is_named(num_kv_heads, error):
    with pytest.raises((ValueError, TypeError), match=error):
        MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=num_kv_heads)


def test_partial_rotary_factor_sets_the_rotated_features():
    # HF: rotary dims = int(head_dim * partial_rotary_factor): 8 * 0.25 = 2 of 8 features rotate.
    scheme = Rotary(layout="half", scaling={"rope_type": "default", "rope_theta": 10000.0,
                                            "partial_rotary_factor": 0.25})
    MultiHeadAttention(D_MODEL, HEADS, scheme=scheme)
    assert scheme.rotary_dim == 2 and scheme.inv_freq.shape == (1,)
    with pytest.raises(ValueError, match="contradicts"):
        MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(rotary_dim=4, scaling={"rope_type": "default",
                                                                                 "partial_rotary_factor": 0.25}))
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        Rotary(scaling={"rope_type": "default", "partial_rotary_factor": 1.5})


@pytest.mark.parametrize("scaling, key", [
    ({"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "mrope_section": [2, 1, 1]},
     "mrope_section"),
    ({"rope_type": "linear", "factor": 2.0, "low_freq_factor": 1.0}, "low_freq_factor"),
    ({"rope_type": "default", "factor": 2.0}, "factor"),
    ({"rope_type": "llama3", "factor": 8.0}, "original_max_position_embeddings"),
    ({"rope_type": "longrope", "short_factor": [1.0] * 4, "long_factor": [1.0] * 4,
      "original_max_position_embeddings": 16}, "max_position_embeddings"),
])
def test_every_key_is_honoured_or_refused_by_name(scaling, key):
    with pytest.raises(ValueError, match=f"scaling\\['{key}'\\]"):
        Rotary(scaling=scaling)


# --- against transformers -------------------------------------------------------------------------





def _causal(T):
    return _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf)[None, None])


@needs_torch
@pytest.mark.parametrize("kv_heads", [2, 1])
def test_llama_gqa_matches_transformers_forward_and_backward(kv_heads):
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaConfig, LlamaRotaryEmbedding

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=kv_heads,
                      head_dim=HEAD_DIM, max_position_embeddings=256, attention_bias=False,
                      rope_parameters={"rope_type": "default", "rope_theta": 500.0})
    cfg._attn_implementation = "eager"
    ref = LlamaAttention(cfg, layer_idx=0).double()
    rotary = LlamaRotaryEmbedding(cfg)
    T = 24
    x, dy = _x(T, seed=1), _x(T, seed=2)
    tx = _t(x, grad=True)
    cos, sin = rotary(tx.detach(), torch.arange(T)[None].expand(2, T))
    y = ref(tx, position_embeddings=(cos.double(), sin.double()), attention_mask=_causal(T))[0]
    y.backward(_t(dy))

    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=kv_heads,
                               scheme=Rotary(layout="half", scaling=dict(cfg.rope_parameters)))
    for n, lin in zip("qkvo", (ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj)):
        setattr(layer, "w" + n, _np(lin.weight).T.copy())
    got, ctx = layer(x, causal=True, return_context=True)
    grads = layer.backward(ctx, dy)
    # LLaMA's rotary embedding computes cos/sin in float32: agreement to float32 accuracy.
    np.testing.assert_allclose(got, _np(y), rtol=1e-5, atol=1e-6)
    for n, lin in zip("qkvo", (ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj)):
        np.testing.assert_allclose(grads["w" + n], _np(lin.weight.grad).T, rtol=1e-5, atol=1e-6, err_msg=n)
    np.testing.assert_allclose(grads["x"], _np(tx.grad), rtol=1e-5, atol=1e-6)

    # Meta (interleaved) checkpoints: permute q and k separately, each by its own head count.
    meta = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=kv_heads, scheme=Rotary(layout="interleaved", base=500.0))
    meta.wq = rope.half_to_interleaved_weights(layer.wq, HEADS)
    meta.wk = rope.half_to_interleaved_weights(layer.wk, kv_heads)
    meta.wv, meta.wo = layer.wv, layer.wo
    np.testing.assert_allclose(meta(x, causal=True), layer(x, causal=True), rtol=1e-12, atol=1e-12)


@needs_torch
def test_gpt_neox_partial_rotary_from_rope_parameters_matches_transformers():
    # GPT-NeoX rotates rotary_pct = 0.25 of each head: HF keeps it as rope_parameters'
    # partial_rotary_factor, which Rotary(scaling=...) now reads (it used to rotate every feature).
    from transformers import GPTNeoXConfig
    from transformers.models.gpt_neox.modeling_gpt_neox import GPTNeoXAttention, GPTNeoXRotaryEmbedding

    torch.manual_seed(0)
    cfg = GPTNeoXConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, rotary_pct=0.25, attention_bias=True,
                        max_position_embeddings=128)
    cfg._attn_implementation = "eager"
    ref = GPTNeoXAttention(cfg, layer_idx=0).double()
    rotary = GPTNeoXRotaryEmbedding(cfg)
    T = 20
    x = _x(T, seed=3)
    with torch.no_grad():
        cos, sin = rotary(_t(x), torch.arange(T)[None].expand(2, T))
        expected = _np(ref(_t(x), _causal(T), position_embeddings=(cos.double(), sin.double()))[0])
    assert cfg.rope_parameters["partial_rotary_factor"] == 0.25

    layer = MultiHeadAttention(D_MODEL, HEADS, bias=True, scheme=Rotary(layout="half", scaling=dict(cfg.rope_parameters)))
    w = _np(ref.query_key_value.weight).reshape(HEADS, 3, HEAD_DIM, D_MODEL)     # per head: [q | k | v]
    b = _np(ref.query_key_value.bias).reshape(HEADS, 3, HEAD_DIM)
    for i, n in enumerate("qkv"):
        setattr(layer, "w" + n, w[:, i].reshape(HEADS * HEAD_DIM, D_MODEL).T.copy())
        setattr(layer, "b" + n, b[:, i].reshape(-1).copy())
    layer.wo, layer.bo = _np(ref.dense.weight).T.copy(), _np(ref.dense.bias).copy()
    assert layer.scheme.rotary_dim == 2
    np.testing.assert_allclose(layer(x, causal=True), expected, rtol=1e-5, atol=1e-6)


@needs_torch
def test_phi3_longrope_with_partial_rotary_matches_transformers():
    from transformers.models.phi3.modeling_phi3 import Phi3Attention, Phi3Config, Phi3RotaryEmbedding

    torch.manual_seed(0)
    half = int(HEAD_DIM * 0.5) // 2                                        # frequencies of the rotated part
    params = {"rope_type": "longrope", "rope_theta": 10000.0, "partial_rotary_factor": 0.5,
              "short_factor": [1.0 + 0.1 * i for i in range(half)], "long_factor": [2.0 + i for i in range(half)],
              "original_max_position_embeddings": 16}
    cfg = Phi3Config(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                     max_position_embeddings=64, original_max_position_embeddings=16, rope_parameters=params,
                     partial_rotary_factor=0.5)
    cfg._attn_implementation = "eager"
    ref = Phi3Attention(cfg, layer_idx=0).double()
    rotary = Phi3RotaryEmbedding(cfg)
    T = 24                                                                   # beyond 16: the long factors
    x = _x(T, seed=4)
    with torch.no_grad():
        cos, sin = rotary(_t(x), torch.arange(T)[None].expand(2, T))
        expected = _np(ref(_t(x), position_embeddings=(cos.double(), sin.double()), attention_mask=_causal(T))[0])

    scaling = {**cfg.rope_parameters, "max_position_embeddings": cfg.max_position_embeddings}
    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=Rotary(layout="half", scaling=scaling))
    w = _np(ref.qkv_proj.weight)
    q_rows, kv_rows = HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM
    layer.wq, layer.wk = w[:q_rows].T.copy(), w[q_rows:q_rows + kv_rows].T.copy()
    layer.wv, layer.wo = w[q_rows + kv_rows:].T.copy(), _np(ref.o_proj.weight).T.copy()
    assert layer.scheme.rotary_dim == 4
    np.testing.assert_allclose(layer(x, causal=True), expected, rtol=1e-5, atol=1e-6)
