"""Dots 3 Note's options of multi-head latent attention: the rope key's RMSNorm, the latent scales and the per-head
output gate (``MultiHeadLatentAttention(k_rope_norm=True, q_lora_scale=, kv_lora_scale=, gate="head")``).

The expected values come from the equations written out in the test (transformers 5.24's
``Dots3NoteTextAttention.forward``, read line by line), from finite differences for every gradient, and from the
plain layer for each option switched off. The comparison with transformers' own module is in
``tests/test_config_interop_dots.py``.
"""

import math

import numpy as np
import pytest

import minipos.fast
from minipos import rope
from minipos.mla import DecoupledRotary, MultiHeadLatentAttention, absorbed_attention, latent_kv
from test_mla import check_gradients

SMALL = dict(kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=4, v_head_dim=2)
DOTS = dict(k_rope_norm=True, q_lora_scale=math.sqrt(12 / 6), kv_lora_scale=math.sqrt(12 / 5), gate="head")


def _dots(layout="interleaved", seed=0, block_size=None, cls=MultiHeadLatentAttention, **kw):
    """A small Dots-style MLA layer, every weight (norms, biases and the gate too) drawn away from its start."""
    layer = cls(12, 2, q_lora_rank=6, bias=True, seed=seed, scheme=DecoupledRotary(layout=layout),
                block_size=block_size, **SMALL, **{**DOTS, **kw})
    rng = np.random.default_rng(seed + 1)
    for name, w in layer.weights().items():
        setattr(layer, name, w + 0.3 * rng.standard_normal(w.shape))
    return layer


def test_equals_the_dots_forward_written_out():
    """Dots3NoteTextAttention.forward: q latent normed then times sqrt(d / r_q); kv latent normed then times
    sqrt(d / r_kv); the rope key normed, then rotated; per head a sigmoid of x @ g_proj scales the output."""
    layer = _dots(layout="half")
    x = np.random.default_rng(3).standard_normal((1, 4, 12))
    H, DN, DR, DV, r = 2, 3, 4, 2, 5

    def norm(a, g):
        return g * a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6)
    c_q = (norm(x[0] @ layer.wq_a + layer.bq_a, layer.q_a_norm) * math.sqrt(2)) @ layer.wq_b
    kv_a = x[0] @ layer.wkv_a + layer.bkv_a
    kv = (norm(kv_a[:, :r], layer.kv_a_norm) * math.sqrt(12 / 5)) @ layer.wkv_b
    k_r = norm(kv_a[:, r:], layer.k_rope_norm)                                  # the rope key, normed
    perm = rope.layout_permutation(DR)
    R = [rope.rotation_matrix(t, DR)[np.ix_(perm, perm)] for t in range(4)]
    gate = 1 / (1 + np.exp(-(x[0] @ layer.wg)))                                 # (T, H)
    heads = []
    for h in range(H):
        q = c_q[:, h * (DN + DR):(h + 1) * (DN + DR)]
        k_c, v = kv[:, h * (DN + DV):h * (DN + DV) + DN], kv[:, h * (DN + DV) + DN:(h + 1) * (DN + DV)]
        s = np.array([[q[i, :DN] @ k_c[j] + (R[i] @ q[i, DN:]) @ (R[j] @ k_r[j]) for j in range(4)]
                      for i in range(4)]) / math.sqrt(DN + DR)
        s = np.where(np.tril(np.ones((4, 4), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append((p / p.sum(-1, keepdims=True)) @ v * gate[:, h:h + 1])
    expected = np.concatenate(heads, -1) @ layer.wo + layer.bo
    np.testing.assert_allclose(layer(x, causal=True)[0], expected, rtol=1e-12, atol=1e-13)


def test_each_option_switched_off_is_the_plain_layer():
    x = np.random.default_rng(4).standard_normal((2, 5, 12))
    plain = _dots(k_rope_norm=False, q_lora_scale=1.0, kv_lora_scale=1.0, gate=None)
    dots = _dots(k_rope_norm=False, q_lora_scale=1.0, kv_lora_scale=1.0, gate="head")
    for name, w in plain.weights().items():
        setattr(dots, name, w)
    assert not np.allclose(dots(x, causal=True), plain(x, causal=True))        # the gate on: another output
    dots.wg = None                                                              # switched off
    np.testing.assert_array_equal(dots(x, causal=True), plain(x, causal=True))
    normed = _dots(q_lora_scale=1.0, kv_lora_scale=1.0, gate=None)
    for name, w in plain.weights().items():
        setattr(normed, name, w)
    assert not np.allclose(normed(x, causal=True), plain(x, causal=True))
    normed.k_rope_norm = None
    np.testing.assert_array_equal(normed(x, causal=True), plain(x, causal=True))
    assert "k_rope_norm" not in plain.weights() and "wg" not in plain.weights()


@pytest.mark.parametrize("block_size", [None, 2])
def test_gradients_match_finite_differences(block_size):
    assert {"k_rope_norm", "wg"} <= check_gradients(_dots(block_size=block_size))


def test_a_context_of_other_options_is_refused():
    layer = _dots()
    x = np.random.default_rng(5).standard_normal((1, 3, 12))
    _, ctx = layer(x, causal=True, return_context=True)
    layer.kv_lora_scale = 2.0
    with pytest.raises(ValueError, match="kv_lora_scale"):
        layer.backward(ctx, np.ones((1, 3, 12)))


def test_latent_cache_fast_layer_and_kv_cache_equal_the_full_pass():
    layer = _dots(layout="interleaved")
    x = np.random.default_rng(12).standard_normal((2, 8, 12))
    full = layer(x, causal=True)
    c_kv, k_rope, outs, cache, steps = np.zeros((2, 0, 5)), np.zeros((2, 0, 4)), [], layer.new_cache(), []
    for a, b in ((0, 3), (3, 4), (4, 8)):                             # prefill, then decoding steps
        c, k = latent_kv(layer, x[:, a:b], np.arange(a, b))
        c_kv, k_rope = np.concatenate([c_kv, c], 1), np.concatenate([k_rope, k], 1)
        outs.append(absorbed_attention(layer, x[:, a:b], np.arange(a, b), c_kv, k_rope, np.arange(b)))
        steps.append(layer(x[:, a:b], causal=True, cache=cache))
    np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-12, atol=1e-13)
    fast = _dots(cls=minipos.fast.MultiHeadLatentAttention)
    np.testing.assert_allclose(fast(x, causal=True), full, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs, error, word", [
    ({"q_lora_scale": 0.0}, ValueError, "q_lora_scale"),
    ({"kv_lora_scale": float("nan")}, ValueError, "kv_lora_scale"),
    ({"kv_lora_scale": "2"}, TypeError, "kv_lora_scale"),
    ({"k_rope_norm": 1}, TypeError, "k_rope_norm"),
    ({"gate": "token"}, ValueError, "gate"),
    ({"gate": True}, TypeError, "gate"),
    ({"q_lora_rank": None}, ValueError, "q_lora_scale"),             # no query latent to scale
])
def test_bad_options_are_named(kwargs, error, word):
    args = {**SMALL, "q_lora_rank": 6, **DOTS, **kwargs}
    with pytest.raises(error, match=word):
        MultiHeadLatentAttention(12, 2, **args)


def test_bad_option_weights_are_named_at_the_call():
    x = np.ones((1, 2, 12))
    layer = _dots()
    layer.k_rope_norm = np.ones(3)
    with pytest.raises(ValueError, match=r"k_rope_norm must have shape \(qk_rope_head_dim,\)"):
        layer(x)
    layer = _dots()
    layer.wg = np.ones((12, 3))
    with pytest.raises(ValueError, match=r"wg must have shape \(d_model, num_heads\)"):
        layer(x)
    layer = _dots()
    layer.wg[0, 0] = np.nan
    with pytest.raises(ValueError, match="gate's logits"):
        layer(x)
    layer = _dots()
    layer.q_lora_scale = -1.0
    with pytest.raises(ValueError, match="q_lora_scale"):
        layer(x)


def test_a_window_and_a_scale_run_through_the_layer_and_the_latent_cache():
    # sliding_window 3: query i sees keys i - 2 .. i (HF's rule, written out as a mask); scale replaces
    # (D_N + D_R) ** -0.5 (Dots 3 Note keeps qk_head_dim ** -0.5 under any rope_type).
    layer = _dots(sliding_window=3, scale=0.25)
    plain = _dots()
    x = np.random.default_rng(13).standard_normal((1, 6, 12))
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    window = (j <= i) & (j > i - 3)
    plain.scale = 0.25
    np.testing.assert_allclose(layer(x, causal=True), plain(x, mask=window[None], causal=True), rtol=1e-12, atol=1e-13)
    assert not np.allclose(layer(x, causal=True), _dots()(x, causal=True))
    c, k = latent_kv(layer, x, np.arange(6))
    np.testing.assert_allclose(absorbed_attention(layer, x[:, 4:], np.arange(4, 6), c, k, np.arange(6)),
                               layer(x, causal=True)[:, 4:], rtol=1e-12, atol=1e-13)
    with pytest.raises(ValueError, match="causal window"):
        absorbed_attention(layer, x, np.arange(6), c, k, np.arange(6), causal=False)


def test_the_rope_keys_weight_belongs_before_the_rotation():
    # docs/mla.md: RMS(R k) = RMS(k), so the division commutes with the rotation; the weight does only when it is the
    # same on both features of each rotated pair (interleaved pairs (0, 1), (2, 3) here).
    rng = np.random.default_rng(7)
    k, positions = rng.standard_normal((3, 4)), np.arange(3)
    inv_freq = rope.rope_inv_freq(4)

    def rot(a):
        return rope.apply_rope(a, positions, inv_freq=inv_freq, layout="interleaved")

    def rms(a):
        return a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6)
    for w, same in ((np.array([0.5, 0.5, 2.0, 2.0]), True), (np.array([0.5, 1.0, 2.0, 3.0]), False)):
        before, after = rot(w * rms(k)), w * rms(rot(k))
        assert np.allclose(before, after, rtol=1e-12, atol=1e-12) == same


def test_latent_attention_without_rope():
    # qk_rope_head_dim 0 (GLM-5.3-Flash): no rope slice, scheme NoPE, scale D_N ** -0.5; permuting the keys of the
    # last (seeing-all) query changes nothing, the latent cache equals the layer, gradients match differences.
    layer = MultiHeadLatentAttention(12, 2, q_lora_rank=6, kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=0,
                                     v_head_dim=2, bias=True)
    assert type(layer.scheme).__name__ == "NoPE" and layer.attention_scale() == pytest.approx(3 ** -0.5)
    assert layer.wkv_a.shape == (12, 5)
    x = np.random.default_rng(2).standard_normal((2, 5, 12))
    perm = np.r_[np.random.default_rng(3).permutation(4), 4]
    np.testing.assert_allclose(layer(x[:, perm], causal=True)[:, -1], layer(x, causal=True)[:, -1], atol=1e-12)
    c, k = latent_kv(layer, x, np.arange(5))
    assert k.shape == (2, 5, 0)
    np.testing.assert_allclose(absorbed_attention(layer, x, np.arange(5), c, k, np.arange(5)), layer(x, causal=True),
                               rtol=1e-12, atol=1e-13)
    check_gradients(layer)
    with pytest.raises(TypeError, match="nothing to rotate"):
        MultiHeadLatentAttention(12, 2, kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=0, v_head_dim=2,
                                 scheme=DecoupledRotary())
    with pytest.raises(ValueError, match="k_rope_norm"):
        MultiHeadLatentAttention(12, 2, kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=0, v_head_dim=2,
                                 k_rope_norm=True)
    with pytest.raises(ValueError, match="qk_rope_head_dim"):
        MultiHeadLatentAttention(12, 2, kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=-2, v_head_dim=2)


def test_a_feature_gates_shape_is_named_by_the_value_width():
    # MLA's heads output D_V features (2 here), not head_dim = D_N + D_R (7): the error names v_head_dim.
    layer = _dots(gate="feature")
    assert layer.wg.shape == (12, 2 * 2)
    layer.wg = np.ones((12, 14))
    with pytest.raises(ValueError, match=r"wg must have shape \(d_model, num_heads \* v_head_dim\) = \(12, 4\)"):
        layer(np.ones((1, 2, 12)))
