"""Proportional RoPE (minipos.prope): hand-worked values, transformers' ``_compute_proportional_rope_parameters``
and Gemma 4's rotary embedding, the difference from partial rotary, the layer, bad input, and proofs fed a wrong
formula. The contract suite (test_contract.py) gives it the rest: finite differences, fast, cache, blockwise,
golden case."""

import math

import numpy as np
import pytest

from minipos import prope, rope
from minipos.layer import MultiHeadAttention

from _torch import _np, _t, needs_torch, torch


def test_hand_worked_rotation():
    # D = 4, p = 1/2, base 100: k = int(2.0 // 2) = 1 pair rotates, θ_0 = 1; θ_1 = 0 (worked by hand).
    # Half layout: pair 0 = features (0, 2) turns by the angle m, pair 1 = (1, 3) stays.
    m = 3
    y = prope.apply_prope(np.array([[1.0, 2.0, 3.0, 4.0]]), [m], base=100.0, partial_rotary_factor=0.5)
    want = [math.cos(m) - 3 * math.sin(m), 2.0, 3 * math.cos(m) + math.sin(m), 4.0]
    np.testing.assert_allclose(y[0], want, rtol=1e-15)


def test_the_frequencies_and_the_count_of_rotated_pairs():
    # Gemma 4's global layers: D = 512, p = 1/4: 64 pairs rotate, θ_i = 1e6^(-2i/512); 192 do not.
    inv, factor = prope.proportional_inv_freq(512, base=1e6, partial_rotary_factor=0.25)
    assert factor == 1.0 and inv.shape == (256,) and np.count_nonzero(inv) == 64
    np.testing.assert_allclose(inv[:64], 1e6 ** (-2 * np.arange(64) / 512), rtol=1e-15)
    # HF's int(p * D // 2) is a float floor division: p = 0.3, D = 10 gives int(3.0000000000000004 // 2) = 1.
    assert prope.rotated_pairs(10, 0.3) == 1 and prope.rotated_pairs(16, 0.3) == 2 and prope.rotated_pairs(8, 0) == 0
    # factor divides every frequency (HF: inv_freq /= factor)
    np.testing.assert_allclose(prope.proportional_inv_freq(8, partial_rotary_factor=1.0, factor=4.0)[0],
                               rope.rope_inv_freq(8) / 4, rtol=1e-15)


def test_it_is_not_partial_rotary():
    # Same p = 1/2 at D = 8. Partial rotary (rotary_dim 4) rotates features 0..3 with base^(-2i/4) and passes
    # 4..7 through; p-RoPE rotates pairs (0, 4) and (1, 5) with base^(-2i/8) and leaves (2, 6), (3, 7).
    x = np.arange(1.0, 9.0)[None]
    ours = prope.apply_prope(x, [5], partial_rotary_factor=0.5)
    partial = rope.apply_rope(x, [5], layout="half", rotary_dim=4)
    assert np.array_equal(ours[0, [2, 3, 6, 7]], x[0, [2, 3, 6, 7]])
    assert np.array_equal(partial[0, 4:], x[0, 4:])
    assert not np.allclose(ours, partial)


def test_the_layer_with_p_rope_is_shift_invariant_and_p_one_is_rope():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((1, 6, 16))
    layer = MultiHeadAttention(16, 2, scheme=prope.ProportionalRotary(partial_rotary_factor=0.25), seed=1)
    np.testing.assert_allclose(layer(x, positions=np.arange(6) + 50, causal=True), layer(x, causal=True),
                               rtol=1e-12, atol=1e-12)
    from minipos.layer import Rotary
    full = MultiHeadAttention(16, 2, scheme=prope.ProportionalRotary(partial_rotary_factor=1.0), seed=1)
    plain = MultiHeadAttention(16, 2, scheme=Rotary(layout="half"), seed=1)
    np.testing.assert_allclose(full(x, causal=True), plain(x, causal=True), rtol=1e-13, atol=1e-14)


def _gemma4_rotary():
    from transformers.models.gemma4 import configuration_gemma4 as cg, modeling_gemma4 as mg
    cfg = cg.Gemma4TextConfig(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                              global_head_dim=32, num_hidden_layers=2, vocab_size=10, intermediate_size=8,
                              layer_types=["sliding_attention", "full_attention"])
    return mg, mg.Gemma4TextRotaryEmbedding(cfg)


@needs_torch
@pytest.mark.parametrize("D, p, theta, factor", [(32, 0.25, 1e6, 1.0), (16, 0.5, 1e6, 1.0), (10, 0.3, 1e4, 1.0),
                                                 (64, 0.75, 500.0, 2.0), (8, 0.0, 1e4, 1.0)])
def test_frequencies_match_transformers_proportional(D, p, theta, factor):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.llama.configuration_llama import LlamaConfig
    params = {"rope_type": "proportional", "rope_theta": theta, "partial_rotary_factor": p}
    if factor != 1.0:
        params["factor"] = factor
    cfg = LlamaConfig(hidden_size=4 * D, num_attention_heads=4, head_dim=D, rope_parameters=params)
    hf, attention_factor = ROPE_INIT_FUNCTIONS["proportional"](cfg)      # _compute_proportional_rope_parameters
    ours, our_factor = prope.proportional_inv_freq(D, base=theta, partial_rotary_factor=p, factor=factor)
    assert attention_factor == our_factor == 1.0
    np.testing.assert_array_equal(_np(hf) == 0, ours == 0)                # the same pairs unrotated, exactly
    np.testing.assert_allclose(ours, _np(hf), rtol=3e-7)                 # HF computes them in float32


@needs_torch
def test_gemma4_full_attention_rotation_matches_transformers():
    # Gemma 4's full-attention layers: rope_type "proportional", p = 1/4, theta 1e6, global_head_dim 32 here.
    mg, rotary = _gemma4_rotary()
    rng = np.random.default_rng(3)
    T, pos = 7, np.array([0, 1, 2, 40, 41, 300, 1000])
    q = rng.standard_normal((2, 3, T, 32))
    hf_inv = _np(rotary.full_attention_inv_freq).astype(np.float64)
    # HF's apply_rotary_pos_emb with cos/sin of HF's own frequencies taken in float64 (the module takes the
    # angles in float32): the layout and the unrotated pairs, to float64 accuracy.
    freqs = _t(pos.astype(np.float64))[None, :, None] * _t(hf_inv)
    emb = torch.cat((freqs, freqs), dim=-1)
    want = _np(mg.apply_rotary_pos_emb(_t(q), emb.cos(), emb.sin()))
    got = rope.apply_rope(q, pos, inv_freq=hf_inv, layout="half")
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=1e-13)
    # The whole module as it runs (angles in float32) against apply_prope (float64): float32 accuracy.
    with torch.no_grad():
        cos, sin = rotary(_t(q), _t(pos)[None], "full_attention")
    want = _np(mg.apply_rotary_pos_emb(_t(q), cos, sin))
    np.testing.assert_allclose(prope.apply_prope(q, pos, base=1e6, partial_rotary_factor=0.25), want,
                               rtol=1e-4, atol=2e-5)


@needs_torch
def test_llama_attention_with_proportional_rope_matches_transformers():
    # Any HF model whose rotary embedding reads ROPE_INIT_FUNCTIONS runs p-RoPE: LlamaAttention, weights copied.
    from transformers.models.llama.modeling_llama import LlamaAttention, LlamaConfig, LlamaRotaryEmbedding
    torch.manual_seed(0)
    cfg = LlamaConfig(hidden_size=32, num_attention_heads=2, num_key_value_heads=2, head_dim=16,
                      rope_parameters={"rope_type": "proportional", "rope_theta": 100.0, "partial_rotary_factor": 0.5})
    cfg._attn_implementation = "eager"
    ref = LlamaAttention(cfg, layer_idx=0).double().eval()
    rotary = LlamaRotaryEmbedding(cfg)
    T = 9
    x = np.random.default_rng(1).standard_normal((2, T, 32))
    causal = _t(np.where(np.tril(np.ones((T, T), bool)), 0.0, -np.inf)[None, None])
    with torch.no_grad():
        cos, sin = rotary(_t(x), torch.arange(T)[None].expand(2, T))
        want = _np(ref(_t(x), position_embeddings=(cos.double(), sin.double()), attention_mask=causal)[0])
    layer = MultiHeadAttention(32, 2, scheme=prope.ProportionalRotary(base=100.0, partial_rotary_factor=0.5))
    from _torch import copy_projections
    copy_projections(layer, ref)
    # The rotary embedding takes its angles in float32: agreement to float32 accuracy.
    np.testing.assert_allclose(layer(x, causal=True), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: prope.proportional_inv_freq(7), ValueError, "head_dim"),
    (lambda: prope.proportional_inv_freq(8, partial_rotary_factor=1.5), ValueError, "partial_rotary_factor"),
    (lambda: prope.proportional_inv_freq(8, partial_rotary_factor=-0.1), ValueError, "partial_rotary_factor"),
    (lambda: prope.proportional_inv_freq(8, factor=0.0), ValueError, "factor"),
    (lambda: prope.proportional_inv_freq(8, base=-1.0), ValueError, "base"),
    (lambda: prope.apply_prope(np.ones((2, 5)), [0, 1]), ValueError, "x"),
    (lambda: prope.apply_prope(np.ones((2, 4)), [0, 1], layout="diagonal"), ValueError, "layout"),
    (lambda: prope.apply_prope_backward(np.ones(4), [0]), ValueError, "dy"),
    (lambda: prope.apply_prope(np.ones((2, 4)), [0.5, 1]), (ValueError, TypeError), "positions"),
    (lambda: prope.ProportionalRotary(partial_rotary_factor="1/4"), TypeError, "partial_rotary_factor"),
    (lambda: MultiHeadAttention(6, 2, scheme=prope.ProportionalRotary()), ValueError, "head dim"),
])
def test_bad_input_is_refused_naming_the_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()


def test_the_proofs_fail_on_a_wrong_formula(monkeypatch):
    pytest.importorskip("sympy")
    from _proof_support import proof_failure
    from proofs.core import ProofFailure, TieMismatch

    # Partial rotary's frequencies (denominator p D) in place of p-RoPE's (denominator D): the tie fails.
    def partial_rotary_freq(head_dim, *, base=10000.0, partial_rotary_factor=1.0, factor=1.0):
        k = int(partial_rotary_factor * head_dim // 2)
        inv = np.zeros(head_dim // 2)
        inv[:k] = base ** (-2.0 * np.arange(k) / max(2 * k, 1)) / factor
        return inv, 1.0
    err = proof_failure("prope.frequencies", monkeypatch, prope, "proportional_inv_freq", partial_rotary_freq)
    assert isinstance(err, ProofFailure) and "prope.frequencies" in str(err)
    monkeypatch.undo()
    # A rotation that ignores p (every pair rotates): the score's tie fails.
    err = proof_failure("prope.score", monkeypatch, prope, "apply_prope",
                        lambda x, pos, **kw: rope.apply_rope(x, pos, layout="half"))
    assert isinstance(err, TieMismatch) and "prope.score" in str(err)
