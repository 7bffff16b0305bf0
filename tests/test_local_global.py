"""Sliding windows, a softmax scale override, Gemma 3's local/global layers and gpt-oss's attention
sinks: hand-worked cases, the layer's paths (dense, blockwise, cache, fast) against each other and
against an explicit mask, gradients against central finite differences, bad input refused by name,
and the transformers modules (Gemma3Attention, GptOssAttention, HF's mask functions) with copied
weights in float64."""

import copy

import numpy as np
import pytest

import minipos.fast as fast
from minipos.attention import attention, attention_backward, blockwise_attention, blockwise_attention_backward
from minipos.layer import ALiBi, DeBERTa, MultiHeadAttention, NoPE, Rotary, TransformerXL
from minipos.local_global import gemma3_attention, gemma3_layer_types, sliding_window_mask

from _gradcheck import check_layer_gradients
from _torch import _np, _t, copy_projections, needs_torch, torch, transformers  # noqa: E402

D_MODEL, HEADS, KV_HEADS, HEAD_DIM = 32, 4, 2, 8


def _x(T, seed=0, B=2):
    return np.random.default_rng(seed).standard_normal((B, T, D_MODEL))


# --- the window rule, by hand ----------------------------------------------------------------------

def test_sliding_window_mask_by_hand():
    # HF masking_utils: kv_idx > q_idx - W and kv_idx <= q_idx. W = 3 over positions 0..4, written out:
    expected = np.array([[1, 0, 0, 0, 0],
                         [1, 1, 0, 0, 0],
                         [1, 1, 1, 0, 0],
                         [0, 1, 1, 1, 0],
                         [0, 0, 1, 1, 1]], bool)
    np.testing.assert_array_equal(sliding_window_mask(np.arange(5), np.arange(5), 3), expected)
    np.testing.assert_array_equal(sliding_window_mask(np.arange(5), np.arange(5), 1), np.eye(5, dtype=bool))
    # A decoding step at position 7 against cached keys 5, 6 and its own: W = 2 sees 6 and 7.
    np.testing.assert_array_equal(sliding_window_mask([7], [5, 6, 7], 2), [[False, True, True]])


@pytest.mark.parametrize("block_size", [None, 2])
def test_layer_window_equals_the_hand_written_band(block_size):
    # The window W = 2 as an explicit (B, T, S) mask on a layer without a window: the same output.
    windowed = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), sliding_window=2, block_size=block_size, seed=1)
    plain = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), seed=1)
    x = _x(6, seed=2)
    band = np.tri(6, k=0, dtype=bool) & ~np.tri(6, k=-2, dtype=bool)          # 0 <= i - j <= 1, by hand
    assert band[5].tolist() == [False, False, False, False, True, True]
    expected = plain(x, mask=np.broadcast_to(band, (2, 6, 6)))
    np.testing.assert_allclose(windowed(x, causal=True), expected, rtol=1e-12, atol=1e-12)
    wide = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), sliding_window=6, block_size=block_size, seed=1)
    np.testing.assert_allclose(wide(x, causal=True), plain(x, causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer_cls", [MultiHeadAttention, fast.MultiHeadAttention])
@pytest.mark.parametrize("block_size", [None, 2, 3])
def test_window_paths_agree_with_padding(layer_cls, block_size):
    # Reference dense is the oracle for blockwise and the fast layer (whose kernel skips the blocks
    # outside the window); left padding leaves batch 1's first queries with no key.
    ref = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=ALiBi(), sliding_window=3, seed=3)
    other = layer_cls(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=ALiBi(), sliding_window=3, seed=3,
                      block_size=block_size)
    x = _x(9, seed=4)
    pad = np.ones((2, 9), bool)
    pad[1, :2] = False
    np.testing.assert_allclose(other(x, causal=True, mask=pad), ref(x, causal=True, mask=pad), rtol=1e-11, atol=1e-12)


def test_fast_kernel_skips_key_blocks_outside_the_window():
    # A long call through the fast kernel (past the dense threshold) against the reference.
    ref = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), sliding_window=20, block_size=16, seed=5)
    quick = fast.MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), sliding_window=20, block_size=16, seed=5)
    x = _x(150, seed=6, B=1)
    np.testing.assert_allclose(quick(x, causal=True), ref(x, causal=True), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("chunks", [[1] * 8, [3, 1, 2, 2]])
def test_rolling_cache_of_window_minus_one_keys_equals_the_full_pass(chunks):
    # Mistral's rolling buffer: a cache of the last W - 1 keys is all a windowed step needs.
    W = 3
    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=Rotary(layout="half"),
                               sliding_window=W, seed=7)
    x = _x(8, seed=8)
    cache, outs, start = layer.new_cache(mem_len=W - 1), [], 0
    for n in chunks:
        outs.append(layer(x[:, start:start + n], causal=True, cache=cache))
        start += n
        assert cache.length <= W - 1
    np.testing.assert_allclose(np.concatenate(outs, axis=1), layer(x, causal=True), rtol=1e-12, atol=1e-12)
    assert cache.positions.tolist() == [6, 7]


# --- scale ------------------------------------------------------------------------------------------

def test_scale_override_equals_rescaled_queries():
    # scale * q . k = (c q) . k / sqrt(D) with c = scale * sqrt(D): the same layer with wq times c.
    s = 256 ** -0.5
    scaled = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), scale=s, seed=9)
    plain = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), seed=9)
    plain.wq = plain.wq * (s * np.sqrt(HEAD_DIM))
    x = _x(5, seed=10)
    np.testing.assert_allclose(scaled(x, causal=True), plain(x, causal=True), rtol=1e-12, atol=1e-12)
    assert scaled.attention_scale() == s and plain.attention_scale() == 1 / np.sqrt(HEAD_DIM)


# --- sinks, by hand ---------------------------------------------------------------------------------

def test_sink_by_hand():
    # One head, D = 1, scale 1: logits [0, ln 2] and a sink logit 0 give e^0, e^{ln 2}, e^0 = 1, 2, 1
    # over a total 4: weights [1/4, 1/2] (the sink's 1/4 dropped), out = 1/4 * 1 + 1/2 * 10 = 5.25.
    q, k, v = np.array([[[1.0]]]), np.array([[[0.0], [np.log(2)]]]), np.array([[[1.0], [10.0]]])
    out, w = attention(q, k, v, scale=1.0, sinks=[0.0], return_weights=True)
    np.testing.assert_allclose(w, [[[0.25, 0.5]]], rtol=1e-15)
    np.testing.assert_allclose(out, [[[5.25]]], rtol=1e-15)
    np.testing.assert_allclose(blockwise_attention(q, k, v, scale=1.0, sinks=[0.0], block_size=1), out, rtol=1e-15)
    # d out / d sink = -p_sink * out = -1/4 * 5.25 (the sink's value is 0).
    *_, dsinks = attention_backward(q, k, v, np.ones((1, 1, 1)), scale=1.0, sinks=[0.0])
    np.testing.assert_allclose(dsinks, [-0.25 * 5.25], rtol=1e-15)
    # A row with every key masked: all weight on the sink, zero output, no NaN.
    out = attention(q, k, v, scale=1.0, sinks=[0.0], mask=np.zeros((1, 1, 2), bool))
    assert out.tolist() == [[[0.0]]]


def test_blockwise_sinks_equal_dense_with_their_gradients():
    rng = np.random.default_rng(11)
    q, k, v = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 7, 4)), rng.standard_normal((2, 3, 7, 4))
    sinks, mask = rng.standard_normal(3) * 2, rng.random((2, 1, 5, 7)) > 0.4
    mask[0, 0, 1] = False                                                 # a fully masked row
    dense = attention(q, k, v, mask=mask, sinks=sinks)
    out, lse = blockwise_attention(q, k, v, mask_fn=lambda qs, ks: mask[..., qs, ks], sinks=sinks, block_size=2,
                                   return_lse=True)
    np.testing.assert_allclose(out, dense, rtol=1e-12, atol=1e-14)
    dout = rng.standard_normal(out.shape)
    dq, dk, dv, _, dsinks = attention_backward(q, k, v, dout, mask=mask, sinks=sinks)
    got = blockwise_attention_backward(q, k, v, out, lse, dout, mask_fn=lambda qs, ks: mask[..., qs, ks], sinks=sinks,
                                       block_size=2)
    for a, b in zip(got, (dq, dk, dv, dsinks)):
        np.testing.assert_allclose(a, b, rtol=1e-11, atol=1e-13)
    h = 1e-6
    for hd in range(3):                                                   # dsinks by central differences
        e = np.eye(3)[hd] * h
        fd = (np.sum(attention(q, k, v, mask=mask, sinks=sinks + e) * dout)
              - np.sum(attention(q, k, v, mask=mask, sinks=sinks - e) * dout)) / (2 * h)
        assert abs(dsinks[hd] - fd) <= 1e-7 * max(1, abs(fd))


def test_the_sink_theorem_passes():
    # proofs/sinks.py: the weights, dS and ds of a sink row by sp.diff, tied to attention,
    # attention_backward and blockwise_attention_backward.
    pytest.importorskip("sympy")
    from proofs.core import select
    result = select(["sinks.sink_softmax"])[0].run()
    assert result.status == "PASS", result.message


# --- gradients through the layer -------------------------------------------------------------------

@pytest.mark.parametrize("layer_cls", [MultiHeadAttention, fast.MultiHeadAttention])
@pytest.mark.parametrize("block_size", [None, 2])
@pytest.mark.parametrize("cached, kv", [(False, KV_HEADS), (True, KV_HEADS), (True, HEADS)])
def test_layer_gradients_match_finite_differences(layer_cls, block_size, cached, kv):
    # kv = HEADS: the attended keys are views of the cache's buffers, which the rolling cache's
    # commit must not overwrite (it did: the backward then used the next call's keys).
    rng = np.random.default_rng(12)
    layer = layer_cls(D_MODEL, HEADS, num_kv_heads=kv, scheme=Rotary(layout="half"), sliding_window=3,
                      scale=0.2, sinks=True, bias=True, block_size=block_size, seed=13)
    layer.sinks[:] = rng.standard_normal(HEADS)
    pad = np.ones((1, 8), bool)
    pad[0, 4] = False
    base = None
    if cached:                                                            # earlier keys: constants
        base = layer.new_cache(mem_len=2)
        layer(_x(3, seed=14, B=1), causal=True, cache=base, mask=pad[:, :3])

    def call(x, **kw):
        cache = copy.deepcopy(base)
        return layer(x, causal=True, cache=cache, mask=pad[:, 3:] if not cached else pad[:, 1:], **kw)

    x, dy = _x(5, seed=15, B=1), _x(5, seed=16, B=1)
    check_layer_gradients(layer, x, dy, call, rng)


# --- bad input --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error", [
    ({"sliding_window": 0}, "sliding_window"), ({"sliding_window": 2.5}, "sliding_window"),
    ({"sliding_window": True}, "sliding_window"), ({"scale": -1.0}, "scale"), ({"scale": np.nan}, "scale"),
    ({"scale": "0.1"}, "scale"), ({"sinks": 1}, "sinks"), ({"sinks": np.zeros(4)}, "sinks"),
])
def test_bad_layer_arguments_are_named(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        MultiHeadAttention(D_MODEL, HEADS, **kwargs)


@pytest.mark.parametrize("scheme", [TransformerXL, lambda: DeBERTa(position_buckets=4, max_relative_positions=8)])
def test_scale_is_refused_where_the_scheme_scales_its_own_terms(scheme):
    with pytest.raises(ValueError, match="scale"):
        MultiHeadAttention(D_MODEL, HEADS, scheme=scheme(), scale=0.1)


def test_window_without_causal_is_refused_and_the_cache_is_unchanged():
    layer = MultiHeadAttention(D_MODEL, HEADS, sliding_window=2)
    cache = layer.new_cache(mem_len=1)
    layer(_x(2), causal=True, cache=cache)
    with pytest.raises(ValueError, match="sliding_window.*causal=True"):
        layer(_x(1), cache=cache)
    assert cache.length == 1 and cache.seen == 2


@pytest.mark.parametrize("sinks, error", [(np.zeros(2), r"sinks must have shape \(H,\)"), ([np.nan] * 3, "sinks"),
                                          ("a", "sinks")])
def test_bad_sinks_are_named(sinks, error):
    q = np.zeros((1, 3, 2, 4))
    with pytest.raises((ValueError, TypeError), match=error):
        attention(q, q, q, sinks=sinks)
    with pytest.raises((ValueError, TypeError), match=error):
        blockwise_attention(q, q, q, sinks=sinks)


@pytest.mark.parametrize("window", [0, -1, 1.5])
def test_bad_window_is_named(window):
    with pytest.raises((ValueError, TypeError), match="window"):
        sliding_window_mask([0], [0], window)


# --- Gemma 3 configs --------------------------------------------------------------------------------

GEMMA3 = {"hidden_size": D_MODEL, "num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS,
          "head_dim": HEAD_DIM, "num_hidden_layers": 12, "sliding_window": 3, "query_pre_attn_scalar": 16,
          "rope_theta": 1_000_000.0, "rope_local_base_freq": 10_000.0,
          "rope_scaling": {"rope_type": "linear", "factor": 8.0}}


def test_gemma3_legacy_config_reads_the_pattern_and_the_two_ropes():
    # Hub configs of Gemma 3 4B-27B: sliding_window_pattern 6 (layers 5 and 11 global), local RoPE
    # base 10 000 unscaled, global base 1 000 000 with linear scaling by 8.
    types = gemma3_layer_types(GEMMA3)
    assert [i for i, t in enumerate(types) if t == "full_attention"] == [5, 11]
    local, kw_local = gemma3_attention(GEMMA3, 0)
    glob, kw_global = gemma3_attention(GEMMA3, 5)
    assert (local.base, local.scaling_kind, kw_local["sliding_window"]) == (10_000.0, None, 3)
    assert (glob.base, glob.scaling_kind, glob.scaling_args, kw_global["sliding_window"]) == (
        1_000_000.0, "linear", {"factor": 8.0}, None)
    assert kw_local["scale"] == 0.25 and kw_local["num_kv_heads"] == KV_HEADS       # 16 ** -0.5


@pytest.mark.parametrize("change, error", [({"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
                                           ({"use_bidirectional_attention": True}, "use_bidirectional_attention"),
                                           ({"layer_types": ["sliding_attention", "chunked"]}, "layer_types")])
def test_gemma3_configs_minipos_cannot_honour_are_refused(change, error):
    with pytest.raises(ValueError, match=error):
        gemma3_attention({**GEMMA3, **change}, 0)


def test_gemma3_bad_layer_index_is_named():
    with pytest.raises(ValueError, match="layer_idx"):
        gemma3_attention(GEMMA3, 12)
    with pytest.raises(TypeError, match="config"):
        gemma3_attention(None, 0)


# --- against transformers ---------------------------------------------------------------------------





def _hf_mask(T, window):
    """HF's own sliding-window causal mask (True = attend), (1, 1, T, T)."""
    from transformers.masking_utils import causal_mask_function, sdpa_mask, sliding_window_causal_mask_function
    fn = causal_mask_function if window is None else sliding_window_causal_mask_function(window)
    return sdpa_mask(batch_size=1, q_length=T, kv_length=T, mask_function=fn, allow_is_causal_skip=False)


@needs_torch
@pytest.mark.parametrize("window", [1, 2, 3, 7, 20])
def test_window_equals_transformers_mask_function(window):
    np.testing.assert_array_equal(sliding_window_mask(np.arange(12), np.arange(12), window),
                                  _np(_hf_mask(12, window))[0, 0])


@needs_torch
def test_rolling_cache_keeps_what_transformers_sliding_window_cache_keeps():
    # HF 5.24 cache_utils.DynamicSlidingWindowLayer: a call attends to the kept keys plus its own,
    # then "only cache the last sliding_window - 1 tokens". KVCache(mem_len=W - 1), chunk by chunk.
    from transformers.cache_utils import DynamicSlidingWindowLayer

    from minipos.layer import KVCache
    W, seen, rng = 3, 0, np.random.default_rng(21)
    hf, ours = DynamicSlidingWindowLayer(sliding_window=W), KVCache(mem_len=W - 1)
    for n in (2, 1, 1, 3, 1, 1):
        k, v = rng.standard_normal((1, 2, n, 4)), rng.standard_normal((1, 2, n, 4))
        hk, hv = hf.update(_t(k), _t(v))
        got_k, got_v, _ = ours.extend(k, v, np.arange(seen, seen + n))
        ours.commit(n)
        seen += n
        np.testing.assert_array_equal(got_k, _np(hk))
        np.testing.assert_array_equal(got_v, _np(hv))
        np.testing.assert_array_equal(ours.k, _np(hf.keys))
        np.testing.assert_array_equal(ours.v, _np(hf.values))


def _cos_sin(T, base, factor=1.0):
    """Half-layout cos/sin in float64 by HF's formula: inv_freq = base^(-2i/D) / factor (linear)."""
    inv = 1.0 / base ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM) / factor
    ang = np.arange(T)[:, None] * inv[None]
    emb = np.concatenate([ang, ang], axis=-1)[None]                       # (1, T, D)
    return _t(np.cos(emb)), _t(np.sin(emb))


@needs_torch
@pytest.mark.parametrize("layer_idx", [0, 5])
def test_gemma3_local_and_global_layers_match_transformers(layer_idx):
    from transformers import Gemma3TextConfig
    from transformers.models.gemma3.modeling_gemma3 import Gemma3Attention, Gemma3RotaryEmbedding

    torch.manual_seed(layer_idx)
    cfg = Gemma3TextConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                           head_dim=HEAD_DIM, num_hidden_layers=6, sliding_window=3, query_pre_attn_scalar=16,
                           rope_scaling={"rope_type": "linear", "factor": 8.0})
    cfg._attn_implementation = "sdpa"         # eager rounds its softmax through float32
    ref = Gemma3Attention(cfg, layer_idx=layer_idx).double()
    ref.q_norm, ref.k_norm = torch.nn.Identity(), torch.nn.Identity()    # per-head RMSNorm: not modelled
    local = cfg.layer_types[layer_idx] == "sliding_attention"
    T = 10
    x, dy = _x(T, seed=17), _x(T, seed=18)
    cos, sin = _cos_sin(T, 10_000.0) if local else _cos_sin(T, 1_000_000.0, factor=8.0)
    mask = _hf_mask(T, 3 if local else None)
    tx = _t(x, grad=True)
    y = ref(tx, position_embeddings=(cos, sin), attention_mask=mask)[0]
    y.backward(_t(dy))

    scheme, kwargs = gemma3_attention(cfg.to_dict(), layer_idx)
    assert (kwargs["sliding_window"] is not None) == local
    layer = MultiHeadAttention(scheme=scheme, **kwargs)
    copy_projections(layer, ref)
    got, ctx = layer(x, causal=True, return_context=True)
    np.testing.assert_allclose(got, _np(y), rtol=1e-12, atol=1e-13)
    grads = layer.backward(ctx, dy)
    np.testing.assert_allclose(grads["x"], _np(tx.grad), rtol=1e-11, atol=1e-12)
    for n in "qkvo":
        np.testing.assert_allclose(grads["w" + n], _np(getattr(ref, f"{n}_proj").weight.grad).T, rtol=1e-11,
                                   atol=1e-12, err_msg=n)
    # HF's rotary module (float32 angles) reads the per-layer-type RoPE the same way.
    hf_cos, _ = Gemma3RotaryEmbedding(cfg)(tx.detach(), torch.arange(T)[None], cfg.layer_types[layer_idx])
    np.testing.assert_allclose(_np(hf_cos)[0], _np(cos)[0], atol=2e-6)
    inv_freq, _ = scheme.frequencies(T)
    np.testing.assert_allclose(np.cos(np.arange(T)[:, None] * inv_freq), _np(cos)[0, :, :HEAD_DIM // 2], atol=1e-14)


@needs_torch
@pytest.mark.parametrize("layer_idx", [0, 1])
def test_gpt_oss_sinks_match_transformers(layer_idx):
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention

    torch.manual_seed(layer_idx)
    cfg = GptOssConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                       head_dim=HEAD_DIM, num_hidden_layers=2, sliding_window=3,
                       rope_parameters={"rope_type": "default", "rope_theta": 150_000.0})
    cfg._attn_implementation = "eager"        # the sinks' reference; softmax in the logits' dtype
    ref = GptOssAttention(cfg, layer_idx=layer_idx).double()
    with torch.no_grad():
        ref.sinks.copy_(torch.randn(HEADS, dtype=torch.float64) * 2)
        for lin in (ref.q_proj, ref.k_proj, ref.v_proj, ref.o_proj):
            lin.bias.normal_()
    sliding = cfg.layer_types[layer_idx] == "sliding_attention"
    assert sliding == (layer_idx == 0)
    T = 9
    x, dy = _x(T, seed=19), _x(T, seed=20)
    allowed = _np(_hf_mask(T, 3 if sliding else None))
    additive = _t(np.where(allowed, 0.0, -np.inf))
    cos, sin = (a[..., :HEAD_DIM // 2] for a in _cos_sin(T, 150_000.0))   # gpt-oss takes cos, sin of D/2
    tx = _t(x, grad=True)
    y = ref(tx, position_embeddings=(cos, sin), attention_mask=additive)[0]
    y.backward(_t(dy))

    for block_size in (None, 4):
        layer = fast.MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, bias=True, sinks=True,
                                        scheme=Rotary(layout="half", base=150_000.0), block_size=block_size,
                                        sliding_window=3 if sliding else None)
        copy_projections(layer, ref)
        layer.sinks[:] = _np(ref.sinks)
        got, ctx = layer(x, causal=True, return_context=True)
        np.testing.assert_allclose(got, _np(y), rtol=1e-12, atol=1e-13)
        grads = layer.backward(ctx, dy)
        np.testing.assert_allclose(grads["sinks"], _np(ref.sinks.grad), rtol=1e-11, atol=1e-12)
        np.testing.assert_allclose(grads["x"], _np(tx.grad), rtol=1e-11, atol=1e-12)
        for n in "qkvo":
            lin = getattr(ref, f"{n}_proj")
            np.testing.assert_allclose(grads["w" + n], _np(lin.weight.grad).T, rtol=1e-11, atol=1e-12, err_msg=n)
            np.testing.assert_allclose(grads["b" + n], _np(lin.bias.grad), rtol=1e-11, atol=1e-12, err_msg=n)


@needs_torch
def test_gpt_oss_yarn_rope_reads_as_rotary_half():
    # The checkpoint config's RoPE (YaRN, factor 32, truncate False): the frequencies and attention
    # factor of HF's GptOssRotaryEmbedding (float32 inv_freq) and its D/2 cos table.
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssRotaryEmbedding

    cfg = GptOssConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                       head_dim=HEAD_DIM, num_hidden_layers=2)
    assert cfg.rope_parameters["rope_type"] == "yarn"
    hf = GptOssRotaryEmbedding(cfg)
    layer = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS,
                               scheme=Rotary(layout="half", scaling=dict(cfg.rope_parameters)))
    inv_freq, factor = layer.scheme.frequencies(1)
    np.testing.assert_allclose(inv_freq, _np(hf.inv_freq), rtol=1e-6)
    assert factor == pytest.approx(hf.attention_scaling, rel=1e-12)
    cos, _ = hf(torch.zeros(1, dtype=torch.float64), torch.arange(5)[None])
    np.testing.assert_allclose(_np(cos)[0], factor * np.cos(np.arange(5)[:, None] * inv_freq), rtol=1e-5, atol=1e-6)
