"""DeepSeek-V3.2's indexer (minipos.dsa): its RoPE layout (first D_R features, half layout) beside MLA's (last D_R,
interleaved), GLM-MoE-DSA's interleaved indexer, hand-worked values, transformers 5.24's ``DeepseekV32Indexer`` and rotary functions with copied weights,
bad input, and the layout proof fed a wrong formula."""

import math

import numpy as np
import pytest
from _torch import _np, _t, needs_torch, torch

from minipos import dsa, rope


def test_hand_worked_layouts():
    # D = 6, D_R = 4, base 100: θ = (1, 0.1). Position 2.
    x = np.array([[1.0, 0.0, 0.0, 0.0, 5.0, 6.0]])
    # indexer: pairs (0, 2), (1, 3) of the first 4 features; features 4, 5 unchanged
    y = dsa.indexer_rope(x, [2], rope_dim=4, base=100.0)
    np.testing.assert_allclose(y[0], [math.cos(2), 0.0, math.sin(2), 0.0, 5.0, 6.0], rtol=1e-15, atol=1e-16)
    # MLA: pairs (2, 3), (4, 5) of the last 4 features; features 0, 1 unchanged
    y = dsa.mla_rope(x, [2], rope_dim=4, base=100.0)
    c, s = math.cos(0.2), math.sin(0.2)
    np.testing.assert_allclose(y[0], [1.0, 0.0, 0.0, 0.0, 5 * c - 6 * s, 6 * c + 5 * s], rtol=1e-15, atol=1e-16)


def test_hand_worked_interleaved_indexer():
    # GLM-MoE-DSA's indexer: pairs (0, 1), (2, 3) of the first D_R = 4 features, θ = (1, 0.1) at base 100;
    # position 2 turns (1, 0) by 2 rad and (0, 3) by 0.2 rad; features 4, 5 unchanged.
    x = np.array([[1.0, 0.0, 0.0, 3.0, 5.0, 6.0]])
    y = dsa.indexer_rope(x, [2], rope_dim=4, base=100.0, layout="interleaved")
    c, s = math.cos(0.2), math.sin(0.2)
    np.testing.assert_allclose(y[0], [math.cos(2), math.sin(2), -3 * s, 3 * c, 5.0, 6.0], rtol=1e-15, atol=1e-15)
    dy = np.array([[math.cos(2), math.sin(2), -3 * s, 3 * c, 5.0, 6.0]])    # R^T undoes the turn
    np.testing.assert_allclose(dsa.indexer_rope_backward(dy, [2], rope_dim=4, base=100.0, layout="interleaved"), x,
                               rtol=1e-14, atol=1e-15)


def test_the_layouts_agree_up_to_a_permutation_and_scores_need_it():
    # indexer(x) = P^T mla(P x) for the permutation that moves the rope slice last and de-interleaves it
    rng = np.random.default_rng(0)
    D, R = 12, 8
    perm = np.concatenate([D - R + rope.layout_permutation(R), np.arange(D - R)])   # MLA index of indexer feature j
    x, pos = rng.standard_normal((5, D)), np.array([0, 3, 17, 40, 41])
    want = dsa.indexer_rope(x, pos, rope_dim=R)
    moved = np.empty_like(x)
    moved[:, perm] = x                                                   # x in MLA's feature order
    got = dsa.mla_rope(moved, pos, rope_dim=R)[:, perm]
    np.testing.assert_allclose(got, want, rtol=1e-14, atol=1e-15)
    # the same weights read with the wrong layout give other scores
    q, k = rng.standard_normal((2, 5, D))
    s_index = dsa.indexer_rope(q, pos, rope_dim=R) @ dsa.indexer_rope(k, pos, rope_dim=R).T
    s_mla = dsa.mla_rope(q, pos, rope_dim=R) @ dsa.mla_rope(k, pos, rope_dim=R).T
    assert not np.allclose(s_index, s_mla)


def test_scores_and_top_k_by_hand():
    # one head, D = 4, w = 2: I = 2 ReLU(q . k / 2); keys [1, 0, 0, 0], [-1, 0, 0, 0], [0, 3, 0, 0]
    q = np.array([1.0, 1.0, 0.0, 0.0]).reshape(1, 1, 1, 4)
    k = np.array([[1.0, 0, 0, 0], [-1.0, 0, 0, 0], [0, 3.0, 0, 0]])[None]
    scores = dsa.index_scores(q, k, np.full((1, 1, 1), 2.0))
    np.testing.assert_allclose(scores[0, 0], [1.0, 0.0, 3.0])
    np.testing.assert_array_equal(dsa.index_topk(scores, 2)[0, 0], [2, 0])
    masked = dsa.index_scores(q, k, np.full((1, 1, 1), 2.0), mask=np.array([[True, True, False]]))
    np.testing.assert_array_equal(dsa.index_topk(masked, 5)[0, 0], [0, 1, 2])    # k = min(5, T); -inf last


def _indexer():
    from transformers.models.deepseek_v32 import configuration_deepseek_v32 as cd
    from transformers.models.deepseek_v32 import modeling_deepseek_v32 as md
    cfg = cd.DeepseekV32Config(hidden_size=32, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=8,
                               qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, index_n_heads=3,
                               index_head_dim=16, index_topk=4, num_hidden_layers=1, vocab_size=10,
                               rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    torch.manual_seed(0)
    ix = md.DeepseekV32Indexer(cfg, 0).double().eval()
    ix.k_norm = torch.nn.Identity()                                      # a norm, not position machinery
    return md, cfg, ix


@needs_torch
def test_rotations_match_transformers_in_float64():
    md, cfg, _ = _indexer()
    R, T = 8, 7
    pos = np.array([0, 1, 2, 9, 30, 31, 200])
    inv = 1.0 / 100.0 ** (np.arange(0, R, 2) / R)                       # float64 θ_i = base^(-2i/D_R)
    freqs = _t(pos.astype(float))[None, :, None] * _t(inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()                                      # (1, T, D_R), as the rotary embedding
    x = np.random.default_rng(1).standard_normal((1, T, 3, R))         # (B, S, H, D_R), as the indexer
    want, _ = md.apply_rotary_pos_emb(_t(x), _t(x), cos, sin, unsqueeze_dim=2)
    got = dsa.indexer_rope(x.transpose(0, 2, 1, 3), pos, rope_dim=R, base=100.0).transpose(0, 2, 1, 3)
    np.testing.assert_allclose(got, _np(want), rtol=1e-13, atol=1e-13)
    # MLA: HF returns the rotated slice de-interleaved ([first features of the pairs | second ones])
    xm = np.random.default_rng(2).standard_normal((1, 2, T, R))         # (B, H, T, D_R)
    want, _ = md.apply_rotary_pos_emb_interleave(_t(xm), _t(xm), cos, sin)
    got = dsa.mla_rope(xm, pos, rope_dim=R, base=100.0)[..., rope.layout_permutation(R)]
    np.testing.assert_allclose(got, _np(want), rtol=1e-13, atol=1e-13)


def _indexer_against(ix, rotary, layout, seed):
    """An HF indexer's top-k (rows of 4 keys from 9, B = 2, x of width 32, q_resid 16, 3 heads of 16 with D_R = 8,
    theta 100) against minipos's from its copied weights: q = heads(q_resid W_q), k = x W_k, RoPE on the first D_R
    in ``layout``, scores, top-k. Returns minipos's scores."""
    B, T = 2, 9
    rng = np.random.default_rng(seed)
    x, q_resid = rng.standard_normal((B, T, 32)), rng.standard_normal((B, T, 16))
    pos = np.arange(T)
    causal = np.tril(np.ones((T, T), bool))
    with torch.no_grad():
        cos, sin = rotary(_t(x), _t(pos)[None].expand(B, T))
        want = _np(ix(_t(x), _t(q_resid), (cos.double(), sin.double()), torch.from_numpy(causal)[None].expand(B, T, T),
                      _t(pos)[None]))
    wq_b, wk, ww = (_np(m.weight).T for m in (ix.wq_b, ix.wk, ix.weights_proj))
    rot = {"rope_dim": 8, "base": 100.0, "layout": layout}
    q = dsa.indexer_rope((q_resid @ wq_b).reshape(B, T, 3, 16).transpose(0, 2, 1, 3), pos, **rot).transpose(0, 2, 1, 3)
    k = dsa.indexer_rope(x @ wk, pos, **rot)
    scores = dsa.index_scores(q, k, (x @ ww) * 3 ** -0.5, mask=causal)
    got = dsa.index_topk(scores, 4)
    for s in range(T):                                                  # rows with fewer than 4 keys: -inf ties
        n = min(4, s + 1)
        np.testing.assert_array_equal(np.sort(got[:, s, :n], -1), np.sort(want[:, s, :n], -1), err_msg=f"row {s}")
    return scores


@needs_torch
def test_the_indexer_top_k_matches_transformers():
    md, cfg, ix = _indexer()
    half = _indexer_against(ix, md.DeepseekV32RotaryEmbedding(cfg), "half", 3)
    assert np.isfinite(half).any()


@needs_torch
def test_the_interleaved_indexer_matches_glm_moe_dsa():
    # GlmMoeDsaIndexer.forward's top-k from copied weights, against minipos's interleaved indexer RoPE and scores.
    from transformers.models.glm_moe_dsa import configuration_glm_moe_dsa as cg
    from transformers.models.glm_moe_dsa import modeling_glm_moe_dsa as mg
    cfg = cg.GlmMoeDsaConfig(hidden_size=32, num_attention_heads=2, q_lora_rank=16, kv_lora_rank=8,
                             qk_rope_head_dim=8, qk_nope_head_dim=8, v_head_dim=8, index_n_heads=3, index_head_dim=16,
                             index_topk=4, num_hidden_layers=1, vocab_size=10,
                             rope_parameters={"rope_type": "default", "rope_theta": 100.0})
    torch.manual_seed(0)
    ix = mg.GlmMoeDsaIndexer(cfg, 0).double().eval()
    ix.k_norm = torch.nn.Identity()                                      # a norm, not position machinery
    scores = _indexer_against(ix, mg.GlmMoeDsaRotaryEmbedding(cfg), "interleaved", 4)
    # the half layout (DeepSeek-V3.2's) fails against the same module: it picks other keys from the same weights
    with pytest.raises(AssertionError):
        _indexer_against(ix, mg.GlmMoeDsaRotaryEmbedding(cfg), "half", 4)
    assert np.isfinite(scores).any()


@pytest.mark.parametrize("call, exc, words", [
    (lambda: dsa.indexer_rope(np.ones((2, 8)), [0, 1], rope_dim=4, layout="neox"), ValueError, "layout"),
    (lambda: dsa.indexer_rope_backward(np.ones((2, 8)), [0, 1], rope_dim=4, layout=None), ValueError, "layout"),
    (lambda: dsa.indexer_rope(np.ones((2, 8)), [0, 1], rope_dim=10), ValueError, "rope_dim"),
    (lambda: dsa.indexer_rope(np.ones((2, 8)), [0, 1], rope_dim=3), ValueError, "rope_dim"),
    (lambda: dsa.mla_rope(np.ones(8), [0], rope_dim=4), ValueError, "x"),
    (lambda: dsa.indexer_rope_backward(np.ones((2, 8)), [0, 1, 2], rope_dim=4), ValueError, "positions"),
    (lambda: dsa.index_scores(np.ones((1, 2, 3, 4)), np.ones((1, 5, 3)), np.ones((1, 2, 3))), ValueError, "q must"),
    (lambda: dsa.index_scores(np.ones((1, 2, 3, 4)), np.ones((1, 5, 4)), np.ones((1, 2))), ValueError, "weights"),
    (lambda: dsa.index_scores(np.ones((1, 2, 3, 4)), np.ones((1, 5, 4)), np.ones((1, 2, 3)), mask=np.ones((2, 5))),
     ValueError, "mask"),
    (lambda: dsa.index_topk(np.ones((2, 3)), 0), ValueError, "topk"),
])
def test_bad_input_is_refused_naming_the_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_the_proof_fails_on_a_wrong_formula(monkeypatch):
    pytest.importorskip("sympy")
    from _proof_support import proof_failure

    from proofs.core import TieMismatch
    # The indexer rotated like MLA's slice (interleaved pairs) instead of the half layout: the score's tie fails.
    err = proof_failure("dsa.layouts", monkeypatch, dsa, "indexer_rope",
                        lambda x, pos, rope_dim, base=10000.0, inv_freq=None: rope.apply_rope(
                            x, pos, base=base, layout="interleaved", rotary_dim=rope_dim))
    assert isinstance(err, TieMismatch) and "R_index" in str(err)


def test_indexer_rope_attention_factor_scales_the_rotated_features_only():
    # D = 4, rope_dim 2, theta_0 = 1: at position 1 the pair (x0, x1) = (1, 0) turns to (cos 1, sin 1); YaRN's
    # attention factor 2 multiplies cos and sin (HF's rotary embedding), so (2 cos 1, 2 sin 1); x2, x3 pass.
    from minipos.dsa import indexer_rope, indexer_rope_backward
    x = np.array([[1.0, 0.0, 3.0, 4.0]])                                        # (T, D)
    y = indexer_rope(x, [1], rope_dim=2, attention_factor=2.0)
    np.testing.assert_allclose(y[0], [2 * np.cos(1), 2 * np.sin(1), 3.0, 4.0], rtol=1e-15)
    g = np.array([[0.5, -1.0, 2.0, 1.0]])
    back = indexer_rope_backward(g, [1], rope_dim=2, attention_factor=2.0)
    assert np.sum(y * g) == pytest.approx(np.sum(x * back), rel=1e-14)        # the transpose
