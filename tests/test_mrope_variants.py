"""M-RoPE's partial rotary and interleaved-layout variants (minipos.mrope ``rotary_dim``, ``layout``): hand-worked
values, Qwen3.5's interleaved partial M-RoPE and GLM-4V's split partial M-RoPE in the interleaved layout against
transformers 5.24 (their own ``recomposition_frequencies`` and ``apply_rotary_pos_emb``, and GLM-4V's text attention
with copied weights), float64; the layer; bad input."""

import math

import numpy as np
import pytest

from minipos import mrope, rope
from minipos.layer import MRotary, MultiHeadAttention

from _torch import _np, _t, copy_projections, needs_torch, torch


def test_hand_worked_partial_rotation():
    # D = 8, R = 4, section [1, 0, 1] (split): pair 0 temporal (θ_0 = 1), pair 1 width (θ_1 = 10000^(-2/4) = 0.01).
    # Positions t = 2, h = 5, w = 7. Half layout over R: pairs (0, 2) and (1, 3); features 4..7 pass through.
    x = np.array([[1.0, 0.0, 0.0, 1.0, 5.0, 6.0, 7.0, 8.0]])
    y = mrope.apply_mrope(x, np.array([[2], [5], [7]]), [1, 0, 1], rotary_dim=4)
    want = [math.cos(2), -math.sin(0.07), math.sin(2), math.cos(0.07), 5.0, 6.0, 7.0, 8.0]
    np.testing.assert_allclose(y[0], want, rtol=1e-15, atol=1e-16)
    # GLM-4V's layout: pairs (0, 1) and (2, 3) (cos.repeat_interleave(2), rotate_half_llm)
    y = mrope.apply_mrope(x, np.array([[2], [5], [7]]), [1, 0, 1], rotary_dim=4, layout="interleaved")
    want = [math.cos(2), math.sin(2), -math.sin(0.07), math.cos(0.07), 5.0, 6.0, 7.0, 8.0]
    np.testing.assert_allclose(y[0], want, rtol=1e-15, atol=1e-16)


def test_text_tokens_are_plain_partial_rope_and_the_backward_is_the_transpose():
    rng = np.random.default_rng(0)
    x, pos = rng.standard_normal((2, 5, 12)), np.array([0, 4, 9, 30, 31])
    for layout in ("half", "interleaved"):
        for inter, section in ((False, [2, 1, 1]), (True, [2, 1, 1])):
            got = mrope.apply_mrope(x, pos, section, rotary_dim=8, layout=layout, interleaved=inter)
            np.testing.assert_allclose(got, rope.apply_rope(x, pos, rotary_dim=8, layout=layout), rtol=1e-14)
            dy = rng.standard_normal(x.shape)
            three = np.stack([pos, pos + 3, 2 * pos])
            lhs = np.sum(mrope.apply_mrope(x, three, section, rotary_dim=8, layout=layout, interleaved=inter) * dy)
            rhs = np.sum(x * mrope.apply_mrope_backward(dy, three, section, rotary_dim=8, layout=layout,
                                                        interleaved=inter))
            assert math.isclose(lhs, rhs, rel_tol=1e-12)                  # <R x, dy> = <x, R^T dy>


def test_the_layer_with_partial_m_rope_is_shift_invariant():
    rng = np.random.default_rng(1)
    pos, _ = mrope.mrope_positions([0, 0, 1, 1, 1, 1, 0], image_grid_thw=[[1, 4, 4]])
    x = rng.standard_normal((1, 7, 32))
    for layout, inter in (("half", True), ("interleaved", False)):
        layer = MultiHeadAttention(32, 2, scheme=MRotary(rotary_dim=8, layout=layout, interleaved=inter), seed=2)
        assert sum(layer.scheme.mrope_section) == 4
        np.testing.assert_allclose(layer(x, positions=pos + 100, causal=True), layer(x, positions=pos, causal=True),
                                   rtol=1e-12, atol=1e-12)


def _float64_angles(positions, theta, R):
    """HF's angles with float64 frequencies base^(-2i/R) (the modules take them in float32): (3, 1, T, R/2)."""
    inv = 1.0 / theta ** (torch.arange(0, R, 2, dtype=torch.float64) / R)
    return _t(positions)[:, None, :, None].double() * inv


@needs_torch
def test_qwen3_5_interleaved_partial_m_rope_matches_transformers():
    from transformers.models.qwen3_5.configuration_qwen3_5 import Qwen3_5TextConfig
    from transformers.models.qwen3_5 import modeling_qwen3_5 as mq
    # Qwen3.5: head_dim 256, partial_rotary_factor 0.25 (R = 64), mrope_section [11, 11, 10], interleaved.
    D, theta, section = 256, 1e7, [11, 11, 10]
    cfg = Qwen3_5TextConfig(hidden_size=512, num_attention_heads=2, num_key_value_heads=1, head_dim=D,
                            rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.25,
                                             "mrope_section": section, "mrope_interleaved": True})
    rotary = mq.Qwen3_5TextRotaryEmbedding(cfg)
    assert rotary.inv_freq.shape == (32,)                               # R / 2: the rotary dim is 64
    pos, _ = mrope.mrope_positions([0] * 3 + [1] * 6 + [0] * 2, image_grid_thw=[[1, 4, 6]])
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 3, pos.shape[1], D)), rng.standard_normal((2, 1, pos.shape[1], D))
    freqs = _float64_angles(pos, theta, 64)
    cos = rotary.recomposition_frequencies(freqs.cos().clone())          # HF's own interleaving, float64
    sin = rotary.recomposition_frequencies(freqs.sin().clone())
    want_q, want_k = (_np(t) for t in mq.apply_rotary_pos_emb(_t(q), _t(k), cos, sin))
    for got, want in ((q, want_q), (k, want_k)):
        np.testing.assert_allclose(mrope.apply_mrope(got, pos, section, base=theta, interleaved=True, rotary_dim=64),
                                   want, rtol=1e-13, atol=1e-13)
    # The module as it runs (angles in float32): float32 accuracy.
    with torch.no_grad():
        cos32, sin32 = rotary(_t(q), _t(pos)[:, None])
    want_q = _np(mq.apply_rotary_pos_emb(_t(q), _t(k), cos32, sin32)[0])
    np.testing.assert_allclose(mrope.apply_mrope(q, pos, section, base=theta, interleaved=True, rotary_dim=64),
                               want_q, rtol=1e-5, atol=1e-5)


@needs_torch
def test_glm4v_split_partial_m_rope_in_the_interleaved_layout_matches_transformers():
    from transformers import DynamicCache
    from transformers.models.glm4v.configuration_glm4v import Glm4vTextConfig
    from transformers.models.glm4v import modeling_glm4v as mg
    # GLM-4V: partial_rotary_factor 0.5 (R = head_dim / 2), split sections, pairs (2i, 2i + 1).
    D_MODEL, HEADS, KV, theta, section = 64, 4, 2, 500.0, [2, 1, 1]
    cfg = Glm4vTextConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV,
                          rope_parameters={"rope_type": "default", "rope_theta": theta, "partial_rotary_factor": 0.5,
                                           "mrope_section": section})
    cfg._attn_implementation = "sdpa"                                   # sdpa stays in float64
    torch.manual_seed(0)
    ref = mg.Glm4vTextAttention(cfg, layer_idx=0).double().eval()
    rotary = mg.Glm4vTextRotaryEmbedding(cfg)
    assert rotary.inv_freq.shape == (4,)                                # head_dim 16, R = 8
    types = [0] * 3 + [1] * 6 + [0] * 2
    pos, delta = mrope.mrope_positions(types, image_grid_thw=[[1, 4, 6]])
    T = pos.shape[1]
    x = np.random.default_rng(3).standard_normal((2, T + 1, D_MODEL))
    step = mrope.mrope_decode_positions(T, 1, delta)

    def hf(x_part, positions, cache, past):
        freqs = _float64_angles(positions, theta, 8)
        cos_sin = (rotary.recomposition_frequencies(freqs.cos()), rotary.recomposition_frequencies(freqs.sin()))
        n = x_part.shape[1]
        allowed = np.arange(past + n)[None, :] <= past + np.arange(n)[:, None]
        with torch.no_grad():
            return _np(ref(_t(x_part), position_embeddings=cos_sin, cache=cache,
                           attention_mask=_t(np.where(allowed, 0.0, -np.inf)[None, None]))[0])
    hf_cache = DynamicCache(config=cfg)
    want = [hf(x[:, :T], pos, hf_cache, 0), hf(x[:, T:], step, hf_cache, T)]

    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV, bias=True,
                               scheme=MRotary(mrope_section=section, base=theta, rotary_dim=8, layout="interleaved"))
    copy_projections(layer, ref)
    layer.bo = np.zeros(D_MODEL)                                        # GLM-4V's o_proj has no bias
    cache = layer.new_cache()
    got = [layer(x[:, :T], positions=pos, causal=True, cache=cache),
           layer(x[:, T:], positions=step, causal=True, cache=cache)]
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: mrope.apply_mrope(np.ones((2, 8)), [0, 1], [1, 1, 1], rotary_dim=10), ValueError, "rotary_dim"),
    (lambda: mrope.apply_mrope(np.ones((2, 8)), [0, 1], [1, 1, 1], rotary_dim=5), ValueError, "rotary_dim"),
    (lambda: mrope.apply_mrope(np.ones((2, 8)), [0, 1], [2, 1, 1], rotary_dim=4), ValueError, "mrope_section"),
    (lambda: mrope.apply_mrope(np.ones((2, 8)), [0, 1], [2, 1, 1], layout="spiral"), ValueError, "layout"),
    (lambda: mrope.apply_mrope_backward(np.ones((2, 8)), [0, 1], [1, 1, 0], rotary_dim=4, inv_freq=np.ones(4)),
     ValueError, "rotary_dim/2"),
    (lambda: MRotary(rotary_dim=3), ValueError, "rotary_dim"),
    (lambda: MRotary(layout="half-ish"), ValueError, "layout"),
    (lambda: MultiHeadAttention(16, 2, scheme=MRotary(rotary_dim=16)), ValueError, "rotary_dim"),
    (lambda: MultiHeadAttention(16, 2, scheme=MRotary(rotary_dim=4, mrope_section=[2, 1, 1])), ValueError,
     "rotary_dim/2"),
])
def test_bad_input_is_refused_naming_the_argument(call, exc, words):
    with pytest.raises(exc, match=words):
        call()
