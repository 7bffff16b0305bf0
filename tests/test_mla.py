"""Multi-head latent attention (DeepSeek-V2/V3) with decoupled RoPE.

Hand-worked cases for the RMSNorm and the YaRN mscale, finite differences for every gradient
through ``layer.backward``, and ``DeepseekV3Attention`` / ``DeepseekV2Attention`` of transformers
with their weights copied in (``W = linear.weight.T``), float64 where the reference allows.
"""

import math

import numpy as np
import pytest

import minipos.fast
from minipos import rope
from minipos.layer import MultiHeadAttention, Rotary
from minipos.mla import (DecoupledRotary, MultiHeadLatentAttention, ScaledDecoupledRotary, absorbed_attention, latent_kv,
                         rms_norm, rms_norm_backward, yarn_get_mscale)

YARN = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16, "mscale": 1.0,
        "mscale_all_dim": 0.5, "beta_fast": 32.0, "beta_slow": 1.0}
SMALL = dict(kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=4, v_head_dim=2)


def _small(q_lora_rank=6, scaling=None, layout="interleaved", seed=0, **kw):
    """A small MLA layer with every weight (norms and biases too) drawn away from its initial value."""
    layer = MultiHeadLatentAttention(12, 2, q_lora_rank=q_lora_rank, bias=True, seed=seed,
                                     scheme=DecoupledRotary(layout=layout, scaling=scaling), **SMALL, **kw)
    rng = np.random.default_rng(seed + 1)
    for name, w in layer.weights().items():
        setattr(layer, name, w + 0.3 * rng.standard_normal(w.shape))
    return layer


# --- the pieces, by hand -------------------------------------------------------------------------

def test_rms_norm_hand_worked():
    # x = (3, 4): mean(x^2) = 12.5, so x / sqrt(12.5) = (0.848528..., 1.131370...), times weight (1, 2).
    got = rms_norm(np.array([3.0, 4.0]), np.array([1.0, 2.0]), eps=1e-300)
    np.testing.assert_allclose(got, [3 / math.sqrt(12.5), 8 / math.sqrt(12.5)], rtol=1e-15)
    # eps enters under the root: x = (1, 1), eps = 3 gives 1 / sqrt(1 + 3) = 0.5.
    np.testing.assert_allclose(rms_norm(np.ones(2), np.ones(2), eps=3.0), [0.5, 0.5], rtol=1e-15)


def test_rms_norm_backward_matches_finite_differences():
    rng = np.random.default_rng(0)
    x, w, dy = rng.standard_normal((2, 3, 5)), rng.standard_normal(5), rng.standard_normal((2, 3, 5))
    dx, dw = rms_norm_backward(x, w, dy)
    h = 1e-6
    for a, g in ((x, dx), (w, dw)):
        num = np.zeros_like(a)
        for i in np.ndindex(a.shape):
            e = np.zeros_like(a)
            e[i] = h
            args = (x + e, w) if a is x else (x, w + e)
            args_m = (x - e, w) if a is x else (x, w - e)
            num[i] = ((rms_norm(*args) - rms_norm(*args_m)) * dy).sum() / (2 * h)
        np.testing.assert_allclose(g, num, rtol=1e-7, atol=1e-9)


def test_yarn_get_mscale_hand_worked():
    # DeepSeek-V3's config: factor 40, mscale_all_dim 1.0 -> 0.1 ln 40 + 1 = 1.368887945411393...
    assert yarn_get_mscale(40.0, 1.0) == pytest.approx(1.3688879454113936, rel=1e-15)
    assert yarn_get_mscale(1.0, 1.0) == 1.0 and yarn_get_mscale(0.5, 2.0) == 1.0   # no extension: 1
    assert yarn_get_mscale(math.e, 0.5) == pytest.approx(1.05, rel=1e-15)          # 0.1 * 0.5 * 1 + 1


def test_softmax_scale_gets_the_square_and_cos_sin_the_ratio():
    # factor 4, mscale 1, mscale_all_dim 0.5: m_all = 0.05 ln 4 + 1, m = 0.1 ln 4 + 1 (by hand).
    layer = _small(scaling=YARN)
    m_all, m = 0.05 * math.log(4) + 1, 0.1 * math.log(4) + 1
    assert layer.scheme.scale(layer.head_dim) == pytest.approx(7 ** -0.5 * m_all ** 2, rel=1e-15)
    assert layer.scheme.attention_factor == pytest.approx(m / m_all, rel=1e-15)
    assert _small().scheme.scale(7) == pytest.approx(7 ** -0.5, rel=1e-15)      # no scaling: 1/sqrt(D_N + D_R)


# --- the layer ----------------------------------------------------------------------------------

def test_equals_the_definition_written_out():
    """The layer against MLA's equations written out in the test, head by head, with a RoPE matrix."""
    layer = _small(layout="half")
    x = np.random.default_rng(3).standard_normal((1, 4, 12))
    H, DN, DR, DV, r = 2, 3, 4, 2, 5

    def norm(a, g):
        return g * a / np.sqrt((a * a).mean(-1, keepdims=True) + 1e-6)
    c_q = norm(x[0] @ layer.wq_a + layer.bq_a, layer.q_a_norm) @ layer.wq_b     # (T, H (DN + DR))
    kv_a = x[0] @ layer.wkv_a + layer.bkv_a
    kv = norm(kv_a[:, :r], layer.kv_a_norm) @ layer.wkv_b                       # (T, H (DN + DV))
    perm = rope.layout_permutation(DR)             # half layout = the interleaved one after this permutation
    R = [rope.rotation_matrix(t, DR)[np.ix_(perm, perm)] for t in range(4)]     # (DR, DR) per position
    heads = []
    for h in range(H):
        q = c_q[:, h * (DN + DR):(h + 1) * (DN + DR)]
        k_c, v = kv[:, h * (DN + DV):h * (DN + DV) + DN], kv[:, h * (DN + DV) + DN:(h + 1) * (DN + DV)]
        s = np.array([[q[i, :DN] @ k_c[j] + (R[i] @ q[i, DN:]) @ (R[j] @ kv_a[j, r:]) for j in range(4)]
                      for i in range(4)]) / math.sqrt(DN + DR)
        s = np.where(np.tril(np.ones((4, 4), bool)), s, -np.inf)
        p = np.exp(s - s.max(-1, keepdims=True))
        heads.append((p / p.sum(-1, keepdims=True)) @ v)
    expected = np.concatenate(heads, -1) @ layer.wo + layer.bo
    np.testing.assert_allclose(layer(x, causal=True)[0], expected, rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("q_lora_rank", [6, None])
@pytest.mark.parametrize("block_size", [None, 2])
def test_gradients_match_finite_differences(q_lora_rank, block_size):
    check_gradients(_small(q_lora_rank=q_lora_rank, scaling=YARN, block_size=block_size))


def check_gradients(layer):
    """``layer.backward`` of a causal pass over (2, 5, 12) against central differences, 10 entries of x and of each
    weight at random; returns the names of the gradients."""
    rng = np.random.default_rng(4)
    x, dy = rng.standard_normal((2, 5, 12)), rng.standard_normal((2, 5, 12))
    y, ctx = layer(x, causal=True, return_context=True)
    grads = layer.backward(ctx, dy)
    assert set(grads) == {"x", *layer.weights()}

    def loss():
        return (layer(x, causal=True) * dy).sum()
    h = 1e-6
    for name in grads:                                                # 10 entries of each array, at random
        a = x if name == "x" else getattr(layer, name)
        for flat in rng.choice(a.size, size=min(10, a.size), replace=False):
            i = np.unravel_index(flat, a.shape)
            old = a[i]
            a[i] = old + h
            up = loss()
            a[i] = old - h
            num = (up - loss()) / (2 * h)
            a[i] = old
            assert grads[name][i] == pytest.approx(num, rel=1e-6, abs=1e-8), (name, i)
    return set(grads)


def test_gradients_through_a_cache_match_finite_differences():
    layer = _small(scaling=YARN)
    rng = np.random.default_rng(5)
    x, dy = rng.standard_normal((1, 5, 12)), rng.standard_normal((1, 3, 12))

    def run():
        cache = layer.new_cache()
        layer(x[:, :2], causal=True, cache=cache)
        return layer(x[:, 2:], causal=True, cache=cache, return_context=True)
    _, ctx = run()
    grads = layer.backward(ctx, dy)
    # The cached keys are constants: perturb this call's input only.
    h, num = 1e-6, np.zeros((1, 3, 12))
    for i in np.ndindex(num.shape):
        j = (0, 2 + i[1], i[2])
        old = x[j]
        x[j] = old + h
        up = (run()[0] * dy).sum()
        x[j] = old - h
        num[i] = (up - (run()[0] * dy).sum()) / (2 * h)
        x[j] = old
    np.testing.assert_allclose(grads["x"], num, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("block_size", [None, 3])
def test_cache_and_fast_layer_equal_the_full_pass(block_size):
    kw = dict(kv_lora_rank=5, qk_nope_head_dim=3, qk_rope_head_dim=4, v_head_dim=2, q_lora_rank=6, seed=7,
              block_size=block_size)
    ref = MultiHeadLatentAttention(12, 2, scheme=DecoupledRotary(scaling=YARN), **kw)
    fast = minipos.fast.MultiHeadLatentAttention(12, 2, scheme=DecoupledRotary(scaling=YARN), **kw)
    x = np.random.default_rng(6).standard_normal((2, 9, 12))
    full = ref(x, causal=True)
    cache, steps = ref.new_cache(), []
    for a, b in ((0, 4), (4, 5), (5, 6), (6, 9)):
        steps.append(ref(x[:, a:b], causal=True, cache=cache))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-12, atol=1e-13)
    assert cache.k.shape == (2, 2, 9, 7) and cache.v.shape == (2, 2, 9, 2)     # expanded per-head keys, values
    np.testing.assert_allclose(fast(x, causal=True), full, rtol=1e-12, atol=1e-13)
    y, ctx = fast(x, causal=True, return_context=True)
    dy = np.random.default_rng(8).standard_normal(y.shape)
    got, want = fast.backward(ctx, dy), ref.backward(ref(x, causal=True, return_context=True)[1], dy)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-10, atol=1e-12, err_msg=name)


def test_length_dependent_rope_rotates_cached_keys_with_each_steps_frequencies():
    # dynamic NTK: each step's output equals the last row of a full pass over the same prefix.
    scaling = {"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}
    layer = _small(scaling=scaling)
    x = np.random.default_rng(10).standard_normal((1, 9, 12))
    cache = layer.new_cache()
    for t in range(9):
        step = layer(x[:, t:t + 1], causal=True, cache=cache)
        np.testing.assert_allclose(step[:, 0], layer(x[:, :t + 1], causal=True)[:, -1], rtol=1e-12, atol=1e-13)


def test_fast_layer_kernel_path_equals_the_reference():
    # 2 x 4 x 300 x 300 logits: above the size where the fast layer runs its blockwise kernel.
    kw = dict(kv_lora_rank=8, qk_nope_head_dim=3, qk_rope_head_dim=4, v_head_dim=2, q_lora_rank=6, seed=7)
    ref = MultiHeadLatentAttention(32, 4, **kw)
    fast = minipos.fast.MultiHeadLatentAttention(32, 4, **kw)
    x = np.random.default_rng(11).standard_normal((2, 300, 32))
    np.testing.assert_allclose(fast(x, causal=True), ref(x, causal=True), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("q_lora_rank, layout", [(6, "interleaved"), (None, "half")])
def test_latent_cache_with_absorbed_weights_equals_the_layer(q_lora_rank, layout):
    layer = _small(q_lora_rank=q_lora_rank, layout=layout, scaling=YARN)
    x = np.random.default_rng(12).standard_normal((2, 8, 12))
    full = layer(x, causal=True)
    c_kv, k_rope, outs = np.zeros((2, 0, 5)), np.zeros((2, 0, 4)), []
    for a, b in ((0, 3), (3, 4), (4, 8)):                             # prefill, then decoding steps
        c, k = latent_kv(layer, x[:, a:b], np.arange(a, b))
        c_kv, k_rope = np.concatenate([c_kv, c], 1), np.concatenate([k_rope, k], 1)
        outs.append(absorbed_attention(layer, x[:, a:b], np.arange(a, b), c_kv, k_rope, np.arange(b)))
    assert c_kv.shape == (2, 8, 5) and k_rope.shape == (2, 8, 4)     # r_kv + D_R = 9 numbers a token
    np.testing.assert_allclose(np.concatenate(outs, 1), full, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(absorbed_attention(layer, x, np.arange(8), c_kv, k_rope, np.arange(8), causal=False),
                               layer(x), rtol=1e-12, atol=1e-13)


def test_latent_cache_refuses_what_it_cannot_hold():
    x = np.ones((1, 2, 12))
    with pytest.raises(ValueError, match="fixed RoPE frequencies"):
        latent_kv(_small(scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4}),
                  x, [0, 1])
    with pytest.raises(TypeError, match="MultiHeadLatentAttention"):
        latent_kv(MultiHeadAttention(12, 2), x, [0, 1])
    layer = _small()
    c_kv, k_rope = latent_kv(layer, x, [0, 1])
    with pytest.raises(ValueError, match="c_kv and k_rope"):
        absorbed_attention(layer, x, [0, 1], c_kv[..., :4], k_rope, [0, 1])
    with pytest.raises(ValueError, match="k_positions"):
        absorbed_attention(layer, x, [0, 1], c_kv, k_rope, [0, 1, 2])


def test_interleaved_and_half_agree_once_the_rope_columns_are_permuted():
    # interleaved pairs (2i, 2i+1), half pairs (i, i + D_R/2): the interleaved layer's rope feature 2i
    # must be the half layer's i, and 2i+1 its i + D_R/2, in the query and in the shared key.
    half, inter = _small(layout="half"), _small(layout="interleaved", seed=3)
    p = np.array([0, 2, 1, 3])                                        # D_R = 4: half index of each interleaved one
    for name in ("wq_a", "bq_a", "q_a_norm", "kv_a_norm", "wkv_b", "wo", "bo"):
        setattr(inter, name, getattr(half, name))
    wq_b = half.wq_b.reshape(6, 2, 7).copy()                          # (r_q, H, D_N + D_R)
    wq_b[..., 3:] = wq_b[..., 3:][..., p]
    inter.wq_b = wq_b.reshape(6, 14)
    inter.wkv_a = np.concatenate([half.wkv_a[:, :5], half.wkv_a[:, 5:][:, p]], axis=1)
    inter.bkv_a = np.concatenate([half.bkv_a[:5], half.bkv_a[5:][p]])
    x = np.random.default_rng(9).standard_normal((1, 6, 12))
    np.testing.assert_allclose(inter(x, causal=True), half(x, causal=True), rtol=1e-12, atol=1e-13)
    inter.wkv_a = half.wkv_a                                          # unpermuted: a different model
    assert not np.allclose(inter(x, causal=True), half(x, causal=True), rtol=1e-3)


@pytest.mark.parametrize("kwargs, error, word", [
    ({"qk_rope_head_dim": 3}, ValueError, "qk_rope_head_dim"),
    ({"qk_rope_head_dim": -2}, ValueError, "qk_rope_head_dim"),
    ({"kv_lora_rank": 0}, ValueError, "kv_lora_rank"),
    ({"q_lora_rank": 2.5}, TypeError, "q_lora_rank"),
    ({"v_head_dim": -1}, ValueError, "v_head_dim"),
    ({"eps": 0.0}, ValueError, "eps"),
    ({"scheme": Rotary()}, TypeError, "DecoupledRotary"),
])
def test_bad_configuration_is_named(kwargs, error, word):
    args = dict(SMALL)
    args.update(kwargs)
    with pytest.raises(error, match=word):
        MultiHeadLatentAttention(12, 2, **args)


def test_bad_scheme_use_and_input_are_named():
    with pytest.raises(TypeError, match="MultiHeadLatentAttention"):
        MultiHeadAttention(8, 2, scheme=DecoupledRotary())
    with pytest.raises(ValueError, match="partial_rotary_factor"):
        DecoupledRotary(scaling={"rope_type": "default", "partial_rotary_factor": 0.5})
    with pytest.raises(ValueError, match="mscale_all_dim"):
        DecoupledRotary(scaling={"rope_type": "linear", "factor": 2.0, "mscale_all_dim": 1.0})
    with pytest.raises(ValueError, match="weight"):
        rms_norm(np.ones((2, 3)), np.ones(4))
    layer = _small()
    cache = layer.new_cache()
    with pytest.raises(ValueError, match="x must have shape"):
        layer(np.ones((1, 3, 11)), cache=cache)
    assert cache.length == 0                                          # a failed call leaves the cache as it was


# --- against transformers ------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch"), pytest.importorskip("transformers")


def _config(q_lora_rank, interleave, rope_parameters, version=3):
    _, transformers = _torch()
    cls = transformers.DeepseekV3Config if version == 3 else transformers.DeepseekV2Config
    extra = {"rope_interleave": interleave} if version == 3 else {}
    cfg = cls(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_lora_rank,
              kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8, max_position_embeddings=64,
              attention_bias=False, rope_parameters={**rope_parameters, "rope_theta": 500.0}, **extra)
    # "sdpa": torch's scaled_dot_product_attention computes in float64; the "eager" path of these
    # modules takes its softmax in float32 (dtype=torch.float32), which would cap agreement at 1e-7.
    cfg._attn_implementation = "sdpa"
    return cfg


def _copy(ref, layer):
    """HF -> minipos: W = linear.weight.T, the norms' weights as they are (the module docstring's table)."""
    pairs = {"wkv_a": ref.kv_a_proj_with_mqa, "wkv_b": ref.kv_b_proj, "wo": ref.o_proj}
    pairs.update({"wq": ref.q_proj} if ref.q_proj is not None else {"wq_a": ref.q_a_proj, "wq_b": ref.q_b_proj})
    for name, lin in pairs.items():
        setattr(layer, name, lin.weight.detach().numpy().T.copy())
    layer.kv_a_norm = ref.kv_a_layernorm.weight.detach().numpy().copy()
    if ref.q_a_layernorm is not None:
        layer.q_a_norm = ref.q_a_layernorm.weight.detach().numpy().copy()


def _float64_norms(ref, torch):
    """HF's DeepseekV3RMSNorm casts to float32 before the mean; this is its formula in float64, so the
    comparison below is to float64 precision (the unchanged module is compared at float32 precision)."""
    for norm in (ref.kv_a_layernorm, ref.q_a_layernorm):
        if norm is not None:
            def forward(h, norm=norm):
                return norm.weight * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon))
            norm.forward = forward


def _hf_v3(q_lora_rank, interleave, rope_parameters, seed=0):
    torch, _ = _torch()
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding
    torch.manual_seed(seed)
    cfg = _config(q_lora_rank, interleave, rope_parameters)
    ref = DeepseekV3Attention(cfg, layer_idx=0).double()
    with torch.no_grad():                                  # norms away from 1, so their weights are tested
        for norm in (ref.kv_a_layernorm, ref.q_a_layernorm):
            if norm is not None:
                norm.weight.uniform_(0.5, 1.5)
    return cfg, ref, DeepseekV3RotaryEmbedding(cfg)


def _mla(cfg, layout, **kw):
    scaling = None if cfg.rope_parameters["rope_type"] == "default" else dict(cfg.rope_parameters)
    return MultiHeadLatentAttention(cfg.hidden_size, cfg.num_attention_heads, q_lora_rank=cfg.q_lora_rank,
                                    kv_lora_rank=cfg.kv_lora_rank, qk_nope_head_dim=cfg.qk_nope_head_dim,
                                    qk_rope_head_dim=cfg.qk_rope_head_dim, v_head_dim=cfg.v_head_dim,
                                    scheme=DecoupledRotary(layout=layout, base=500.0 if scaling is None else 10000.0,
                                                           scaling=scaling), **kw)


def _causal(T, S, torch):
    return torch.from_numpy(np.where(np.tril(np.ones((T, S), bool), S - T), 0.0, -np.inf)[None, None])


def _cos_sin64(inv_freq, factor, positions, torch):
    """cos/sin as HF's rotary module builds them (cat(freqs, freqs) times the attention factor), in float64."""
    freqs = np.asarray(positions, np.float64)[:, None] * np.asarray(inv_freq, np.float64)[None]   # (T, D_R/2)
    emb = np.concatenate([freqs, freqs], -1)[None]
    return torch.from_numpy(np.cos(emb) * factor), torch.from_numpy(np.sin(emb) * factor)


CONFIGS = [(32, True, {"rope_type": "default"}), (None, True, {"rope_type": "default"}),
           (32, False, {"rope_type": "default"}), (32, True, YARN), (None, False, YARN)]


@pytest.mark.parametrize("q_lora_rank, interleave, params", CONFIGS,
                         ids=lambda v: str(v.get("rope_type") if isinstance(v, dict) else v))
def test_matches_deepseek_v3_attention_in_float64_forward_backward_and_decoding(q_lora_rank, interleave, params):
    torch, _ = _torch()
    cfg, ref, rotary = _hf_v3(q_lora_rank, interleave, params)
    _float64_norms(ref, torch)
    layer = _mla(cfg, "interleaved" if interleave else "half")
    _copy(ref, layer)
    # HF computes inv_freq in float32 (compared with minipos's at 1e-6 in the float32 test below); here
    # both use HF's values, so that everything else is compared to float64 precision.
    inv_freq = rotary.inv_freq.double().numpy()
    layer.scheme.inv_freq = inv_freq
    assert layer.scheme.attention_factor == pytest.approx(rotary.attention_scaling, rel=1e-15)
    assert layer.scheme.scale(layer.head_dim) == pytest.approx(ref.scaling, rel=1e-15)

    T, rng = 10, np.random.default_rng(1)
    x, dy = rng.standard_normal((2, T, 64)), rng.standard_normal((2, T, 64))
    tx = torch.from_numpy(x).requires_grad_()
    y = ref(tx, _cos_sin64(inv_freq, rotary.attention_scaling, np.arange(T), torch), _causal(T, T, torch))[0]
    y.backward(torch.from_numpy(dy))
    got, ctx = layer(x, causal=True, return_context=True)
    np.testing.assert_allclose(got, y.detach().numpy(), rtol=1e-11, atol=1e-12)

    grads = layer.backward(ctx, dy)
    np.testing.assert_allclose(grads["x"], tx.grad.numpy(), rtol=1e-10, atol=1e-12)
    hf = {"wkv_a": ref.kv_a_proj_with_mqa, "wkv_b": ref.kv_b_proj, "wo": ref.o_proj, "wq": ref.q_proj,
          "wq_a": ref.q_a_proj, "wq_b": ref.q_b_proj}
    for name, g in grads.items():
        if name in hf:
            want = hf[name].weight.grad.numpy().T
        elif name != "x":
            want = {"kv_a_norm": ref.kv_a_layernorm, "q_a_norm": ref.q_a_layernorm}[name].weight.grad.numpy()
        else:
            continue
        np.testing.assert_allclose(g, want, rtol=1e-10, atol=1e-12, err_msg=name)

    # Decoding: HF's cache holds the normed latent and the rotated rope key; minipos's the expanded keys.
    from transformers import DynamicCache
    hf_cache, cache, outs = DynamicCache(config=cfg), layer.new_cache(), []
    with torch.no_grad():
        for a, b in ((0, 6), (6, 7), (7, 8), (8, 10)):
            cs = _cos_sin64(inv_freq, rotary.attention_scaling, np.arange(a, b), torch)
            want = ref(torch.from_numpy(x[:, a:b]), cs, _causal(b - a, b, torch), cache=hf_cache)[0].numpy()
            outs.append(layer(x[:, a:b], causal=True, cache=cache))
            np.testing.assert_allclose(outs[-1], want, rtol=1e-11, atol=1e-12)
    np.testing.assert_allclose(np.concatenate(outs, 1), got, rtol=1e-11, atol=1e-12)
    # HF's cache holds the latent cache: the normed latent, and the rotated rope key in HF's output
    # order (rope_interleave writes the rotated pairs de-interleaved: evens first, then odds).
    c_kv, k_rope = latent_kv(layer, x, np.arange(T))
    order = rope.layout_permutation(4) if interleave else np.arange(4)
    np.testing.assert_allclose(c_kv, hf_cache.layers[0].keys.numpy()[:, 0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(k_rope[..., order], hf_cache.layers[0].values.numpy()[:, 0], rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(absorbed_attention(layer, x, np.arange(T), c_kv, k_rope, np.arange(T)), got,
                               rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("params", [{"rope_type": "default"}, YARN], ids=["default", "yarn"])
def test_matches_the_unchanged_deepseek_v3_pipeline_in_float32_precision(params):
    """HF's own rotary module (float32 inv_freq, cos, sin) and RMSNorm (float32 mean): agreement is to
    float32 accuracy, and minipos's inv_freq is its own (float64)."""
    torch, _ = _torch()
    cfg, ref, rotary = _hf_v3(32, True, params, seed=1)
    layer = _mla(cfg, "interleaved")
    _copy(ref, layer)
    np.testing.assert_allclose(layer.scheme.inv_freq, rotary.inv_freq.double().numpy(), rtol=1e-6)
    T = 12
    x = np.random.default_rng(2).standard_normal((2, T, 64))
    with torch.no_grad():
        cos, sin = rotary(torch.from_numpy(x), torch.arange(T)[None].expand(2, T))
        want = ref(torch.from_numpy(x), (cos.double(), sin.double()), _causal(T, T, torch))[0].numpy()
    np.testing.assert_allclose(layer(x, causal=True), want, rtol=1e-5, atol=1e-6)


def test_matches_deepseek_v2_attention_complex_rotation():
    """DeepSeek-V2's module rotates by complex multiplication of (2i, 2i+1) pairs (always interleaved),
    in float32 (``xq.float()``): float32 accuracy."""
    torch, _ = _torch()
    from transformers.models.deepseek_v2.modeling_deepseek_v2 import DeepseekV2Attention, DeepseekV2RotaryEmbedding
    torch.manual_seed(2)
    cfg = _config(32, True, {"rope_type": "default"}, version=2)
    ref = DeepseekV2Attention(cfg, layer_idx=0).double()
    rotary = DeepseekV2RotaryEmbedding(cfg)
    layer = _mla(cfg, "interleaved")
    _copy(ref, layer)
    T = 9
    x = np.random.default_rng(3).standard_normal((1, T, 64))
    with torch.no_grad():
        freqs_cis = rotary(torch.from_numpy(x), torch.arange(T)[None])
        want = ref(torch.from_numpy(x), _causal(T, T, torch), position_embeddings=freqs_cis)[0].numpy()
    np.testing.assert_allclose(layer(x, causal=True), want, rtol=1e-5, atol=1e-6)


# --- Mistral 4: the query scale on the whole MLA query ---------------------------------------------

def _rebind(layer, beta, length):
    fresh = MultiHeadLatentAttention(12, 2, q_lora_rank=layer.q_lora_rank, bias=True, seed=0, **SMALL,
                                     scheme=ScaledDecoupledRotary(scaling=YARN, beta=beta,
                                                                  original_max_position_embeddings=length))
    for name in layer.weights():
        setattr(fresh, name, getattr(layer, name).copy())
    return fresh


def test_scaled_query_row_p_is_the_plain_layers_logits_times_s_p():
    # beta 0.5, L = 3: s(p) = 1 + 0.5 ln(1 + p // 3), by hand s(0..2) = 1, s(3..5) = 1 + 0.5 ln 2 = 1.346574,
    # s(6..8) = 1 + 0.5 ln 3 = 1.549306. Row p of the scaled layer's logits is the plain layer's row times s(p),
    # both slices of the query scaled (the rope slice alone would scale only part of each logit).
    plain = _small(scaling=YARN)
    scaled = _rebind(plain, 0.5, 3)
    x = np.random.default_rng(21).standard_normal((1, 9, 12))
    q0 = plain.scheme.rotate_q(plain._query(x), np.arange(9), seq_len=9)
    q1 = scaled.scheme.rotate_q(scaled._query(x), np.arange(9), seq_len=9)
    s = np.array([1, 1, 1] + [1 + 0.5 * math.log(2)] * 3 + [1 + 0.5 * math.log(3)] * 3)
    np.testing.assert_allclose(q1, q0 * s[:, None], rtol=1e-14)
    assert abs(s[3] - 1.346574) < 1e-6 and abs(s[6] - 1.549306) < 1e-6
    assert np.max(np.abs(scaled(x, causal=True) - plain(x, causal=True))) > 1e-3
    # beta 0 is the plain layer, bit for bit
    np.testing.assert_array_equal(_rebind(plain, 0.0, 3)(x, causal=True), plain(x, causal=True))


@pytest.mark.parametrize("q_lora_rank", [6, None])
def test_scaled_gradients_match_finite_differences(q_lora_rank):
    layer = _rebind(_small(q_lora_rank=q_lora_rank, scaling=YARN), 0.7, 2)
    rng = np.random.default_rng(22)
    x, dy = rng.standard_normal((2, 6, 12)), rng.standard_normal((2, 6, 12))
    _, ctx = layer(x, causal=True, return_context=True)
    grads = layer.backward(ctx, dy)
    h = 1e-6
    for name in ("x", "wq_b" if q_lora_rank else "wq", "wkv_a"):
        a = x if name == "x" else getattr(layer, name)
        for flat in rng.choice(a.size, size=10, replace=False):
            i = np.unravel_index(flat, a.shape)
            old = a[i]
            a[i] = old + h
            up = (layer(x, causal=True) * dy).sum()
            a[i] = old - h
            num = (up - (layer(x, causal=True) * dy).sum()) / (2 * h)
            a[i] = old
            assert grads[name][i] == pytest.approx(num, rel=1e-6, abs=1e-8), (name, i)


def test_scaled_cache_fast_layer_and_latent_cache_equal_the_full_pass():
    layer = _rebind(_small(scaling=YARN), 0.5, 2)
    fast = minipos.fast.MultiHeadLatentAttention(12, 2, q_lora_rank=6, bias=True, **SMALL, scheme=ScaledDecoupledRotary(
        scaling=YARN, beta=0.5, original_max_position_embeddings=2))
    for name in layer.weights():
        setattr(fast, name, getattr(layer, name))
    x = np.random.default_rng(23).standard_normal((2, 8, 12))
    full = layer(x, causal=True)
    cache = layer.new_cache()
    steps = [layer(x[:, a:b], causal=True, cache=cache) for a, b in ((0, 3), (3, 4), (4, 8))]
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-12, atol=1e-13)
    np.testing.assert_allclose(fast(x, causal=True), full, rtol=1e-12, atol=1e-13)
    c_kv, k_rope = latent_kv(layer, x, np.arange(8))
    got = absorbed_attention(layer, x[:, 5:], np.arange(5, 8), c_kv, k_rope, np.arange(8))
    np.testing.assert_allclose(got, full[:, 5:], rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("kwargs, error, word", [
    ({"beta": -0.1, "original_max_position_embeddings": 4}, ValueError, "beta"),
    ({"beta": 0.1, "original_max_position_embeddings": 0}, ValueError, "original_max_position_embeddings"),
    ({"beta": "0.1", "original_max_position_embeddings": 4}, TypeError, "beta"),
    ({"beta": 0.1}, TypeError, "original_max_position_embeddings"),
])
def test_scaled_bad_settings_are_named(kwargs, error, word):
    with pytest.raises(error, match=word):
        ScaledDecoupledRotary(**kwargs)
