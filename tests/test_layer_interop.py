"""MultiHeadAttention against the attention modules of real models (transformers).

A user who copies the projection weights and the scheme's parameters of T5's, LLaMA's or
DeBERTa-v2's attention into minipos must get the same output. Each test builds the reference
module from ``transformers`` with a tiny random config, copies its weights into minipos as the
layer docstring says, and compares in float64. Skipped when torch/transformers are missing.
"""

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


def _hidden(T, seed=0, B=2):
    return np.random.default_rng(seed).standard_normal((B, T, D_MODEL))


@pytest.mark.parametrize("is_decoder", [False, True])
def test_t5_attention_matches_transformers(is_decoder):
    from transformers.models.t5.modeling_t5 import T5Attention, T5Config

    torch.manual_seed(0)
    cfg = T5Config(d_model=D_MODEL, d_kv=HEAD_DIM, num_heads=HEADS, relative_attention_num_buckets=32,
                   relative_attention_max_distance=128, is_decoder=is_decoder, dropout_rate=0.0)
    cfg._attn_implementation = "eager"
    ref = T5Attention(cfg, has_relative_attention_bias=True, layer_idx=0).double().eval()
    with torch.no_grad():
        ref.relative_attention_bias.weight.normal_()
    T = 150  # beyond max_distance, so every log bucket is used
    x = _hidden(T)
    mask = None
    if is_decoder:  # T5's decoder takes an additive causal mask
        mask = _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -1e9)[None, None])
    with torch.no_grad():
        expected = _np(ref(_t(x), mask=mask)[0])

    scheme = T5Bias(num_buckets=32, max_distance=128, bidirectional=not is_decoder)
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=scheme)
    for n in "qkvo":
        _copy_linear(layer, n, getattr(ref, n))
    scheme.table = _np(ref.relative_attention_bias.weight).copy()  # (num_buckets, H)
    got = layer(x, causal=is_decoder)
    np.testing.assert_allclose(got, expected, rtol=1e-10, atol=1e-12)


ROPE_PARAMETERS = [
    {"rope_type": "default"},
    {"rope_type": "linear", "factor": 2.0},
    {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64},
    {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 64, "low_freq_factor": 1.0,
     "high_freq_factor": 4.0},
]


@pytest.mark.parametrize("params", ROPE_PARAMETERS, ids=lambda p: p["rope_type"])
def test_llama_attention_matches_transformers(params):
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaConfig, LlamaRotaryEmbedding

    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=HEADS,
                      head_dim=HEAD_DIM, max_position_embeddings=256, attention_bias=False,
                      rope_parameters={**params, "rope_theta": 500.0})
    cfg._attn_implementation = "eager"
    ref = LlamaAttention(cfg, layer_idx=0).double().eval()
    rotary = LlamaRotaryEmbedding(cfg)
    T = 40
    x = _hidden(T, seed=1)
    pos = torch.arange(T)[None].expand(2, T)
    causal = _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf)[None, None])
    with torch.no_grad():
        cos, sin = rotary(_t(x), pos)
        expected = _np(ref(_t(x), position_embeddings=(cos.double(), sin.double()), attention_mask=causal)[0])

    scaling = None if params["rope_type"] == "default" else params
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(layout="half", base=500.0, scaling=scaling))
    for n, lin in zip("qkvo", (ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj)):
        _copy_linear(layer, n, lin)
    got = layer(x, causal=True)
    # LLaMA's rotary embedding computes cos/sin in float32, so agreement is to float32 accuracy.
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_deberta_v2_attention_matches_transformers():
    from transformers.models.deberta_v2.modeling_deberta_v2 import DebertaV2Config, DisentangledSelfAttention

    torch.manual_seed(0)
    cfg = DebertaV2Config(hidden_size=D_MODEL, num_attention_heads=HEADS, intermediate_size=64,
                          relative_attention=True, position_buckets=64, max_relative_positions=128,
                          pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                          hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    ref = DisentangledSelfAttention(cfg).double().eval()
    span = 64
    rel_emb = np.random.default_rng(2).standard_normal((2 * span, D_MODEL))
    T = 100  # beyond position_buckets / 2, so log buckets are used
    x = _hidden(T, seed=3)
    with torch.no_grad():
        expected = _np(ref(_t(x), torch.ones(2, 1, T, T), rel_embeddings=_t(rel_emb))[0])

    scheme = DeBERTa(position_buckets=64, max_relative_positions=128, pos_att_type=("c2p", "p2c"))
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=scheme, bias=True)
    for n, lin in zip("qkv", (ref.query_proj, ref.key_proj, ref.value_proj)):
        _copy_linear(layer, n, lin)
    layer.wo, layer.bo = np.eye(D_MODEL), np.zeros(D_MODEL)  # the reference returns the context before its output dense
    scheme.rel_embeddings = rel_emb
    got = layer(x)
    # transformers rounds its scale sqrt(3 D) to float32 (scaled_size_sqrt), hence 1e-6, not 1e-12.
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-8)
