"""The layer's backward against torch autograd through the attention modules real checkpoints run
(transformers' T5Attention, LlamaAttention, DisentangledSelfAttention), weights copied as the
layer's docstring says: the gradient of <dy, y> for every weight, the scheme's parameters and x.
Skipped when torch/transformers are missing."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from _torch import _np, _t  # noqa: E402

from minipos.layer import DeBERTa, MultiHeadAttention, Rotary, T5Bias  # noqa: E402

D_MODEL, HEADS, HEAD_DIM = 32, 4, 8




def _copy_linear(layer, name, linear):
    setattr(layer, "w" + name, _np(linear.weight).T.copy())
    if linear.bias is not None:
        setattr(layer, "b" + name, _np(linear.bias).copy())


def _compare_linear(grads, name, linear, rtol, atol):
    np.testing.assert_allclose(grads["w" + name], _np(linear.weight.grad).T, rtol=rtol, atol=atol, err_msg=name)
    if linear.bias is not None:
        np.testing.assert_allclose(grads["b" + name], _np(linear.bias.grad), rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("is_decoder", [False, True])
@pytest.mark.parametrize("block_size", [None, 16])
def test_t5_attention_gradients_match_transformers(is_decoder, block_size):
    from transformers.models.t5.modeling_t5 import T5Attention, T5Config

    torch.manual_seed(0)
    cfg = T5Config(d_model=D_MODEL, d_kv=HEAD_DIM, num_heads=HEADS, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, is_decoder=is_decoder, dropout_rate=0.0)
    cfg._attn_implementation = "eager"
    ref = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).double()
    with torch.no_grad():
        ref.relative_attention_bias.weight.normal_()
    T = 150                                                           # every log bucket is used
    rng = np.random.default_rng(0)
    x, dy = rng.standard_normal((2, T, D_MODEL)), rng.standard_normal((2, T, D_MODEL))
    mask = _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -1e9)[None, None]) if is_decoder else None
    tx = _t(x, grad=True)
    ref(tx, mask=mask)[0].backward(_t(dy))

    scheme = T5Bias(num_buckets=32, max_distance=128, bidirectional=not is_decoder)
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=scheme, block_size=block_size)
    for n in "qkvo":
        _copy_linear(layer, n, getattr(ref, n))
    scheme.table = _np(ref.relative_attention_bias.weight).copy()
    _, ctx = layer(x, causal=is_decoder, return_context=True)
    grads = layer.backward(ctx, dy)
    for n in "qkvo":
        _compare_linear(grads, n, getattr(ref, n), 1e-9, 1e-10)
    np.testing.assert_allclose(grads["scheme.table"], _np(ref.relative_attention_bias.weight.grad), rtol=1e-9,
                               atol=1e-10)
    np.testing.assert_allclose(grads["x"], _np(tx.grad), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("params", [{"rope_type": "default"},
                                    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}],
                         ids=lambda p: p["rope_type"])
@pytest.mark.parametrize("block_size", [None, 8])
def test_llama_attention_gradients_match_transformers(params, block_size):
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaConfig, LlamaRotaryEmbedding

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                      head_dim=HEAD_DIM, max_position_embeddings=256, attention_bias=False,
                      rope_parameters={**params, "rope_theta": 500.0})
    cfg._attn_implementation = "eager"
    ref = LlamaAttention(cfg, layer_idx=0).double()
    rotary = LlamaRotaryEmbedding(cfg)
    T = 40
    rng = np.random.default_rng(1)
    x, dy = rng.standard_normal((2, T, D_MODEL)), rng.standard_normal((2, T, D_MODEL))
    pos = torch.arange(T)[None].expand(2, T)
    causal = _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf)[None, None])
    tx = _t(x, grad=True)
    cos, sin = rotary(tx.detach(), pos)
    ref(tx, position_embeddings=(cos.double(), sin.double()), attention_mask=causal)[0].backward(_t(dy))

    scaling = None if params["rope_type"] == "default" else params
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(layout="half", base=500.0, scaling=scaling),
                               block_size=block_size)
    for n, lin in zip("qkvo", (ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj)):
        _copy_linear(layer, n, lin)
    _, ctx = layer(x, causal=True, return_context=True)
    grads = layer.backward(ctx, dy)
    # LLaMA's rotary embedding computes cos/sin in float32: agreement to float32 accuracy.
    for n, lin in zip("qkvo", (ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj)):
        _compare_linear(grads, n, lin, 1e-5, 1e-6)
    np.testing.assert_allclose(grads["x"], _np(tx.grad), rtol=1e-5, atol=1e-6)


def test_deberta_v2_attention_gradients_match_transformers():
    from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Config, DisentangledSelfAttention

    torch.manual_seed(0)
    cfg = DebertaV2Config(hidden_size=D_MODEL, num_attention_heads=HEADS, intermediate_size=64,
                          relative_attention=True, position_buckets=64, max_relative_positions=128,
                          pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = DisentangledSelfAttention(cfg).double()
    span, T = 64, 100                                                # log buckets are used
    rng = np.random.default_rng(2)
    rel_emb = rng.standard_normal((2 * span, D_MODEL))
    x, dy = rng.standard_normal((2, T, D_MODEL)), rng.standard_normal((2, T, D_MODEL))
    tx, trel = _t(x, grad=True), _t(rel_emb, grad=True)
    ref(tx, torch.ones(2, 1, T, T), rel_embeddings=trel)[0].backward(_t(dy))

    scheme = DeBERTa(position_buckets=64, max_relative_positions=128, pos_att_type=("c2p", "p2c"))
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=scheme, bias=True)
    for n, lin in zip("qkv", (ref.query_proj, ref.key_proj, ref.value_proj)):
        _copy_linear(layer, n, lin)
    layer.wo, layer.bo = np.eye(D_MODEL), np.zeros(D_MODEL)      # the module returns the context before its dense
    scheme.rel_embeddings = rel_emb
    _, ctx = layer(x, return_context=True)
    grads = layer.backward(ctx, dy)
    # transformers rounds its scale sqrt(3 D) to float32: agreement to about 1e-6.
    for n, lin in zip("qkv", (ref.query_proj, ref.key_proj, ref.value_proj)):
        _compare_linear(grads, n, lin, 1e-6, 1e-7)
    np.testing.assert_allclose(grads["scheme.rel_embeddings"], _np(trel.grad), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grads["x"], _np(tx.grad), rtol=1e-6, atol=1e-7)
