"""Llama 4's iRoPE and SmolLM3's NoPE layers: the attention temperature of NoPE layers, chunked
attention (``attention_chunk``), the per-layer choice, and the transformers modules they run."""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipos.fast as fast
from minipos import irope
from minipos.layer import MultiHeadAttention, NoPE, NoPETemperature, Rotary

from _gradcheck import after_a_cache, check_layer_gradients
from _torch import _np, _t, copy_projections, needs_torch, torch, transformers  # noqa: E402

D_MODEL, HEADS, KV_HEADS, HEAD_DIM = 32, 4, 2, 8


def _x(T, seed=0, B=2):
    return np.random.default_rng(seed).standard_normal((B, T, D_MODEL))


# --- the temperature, by hand -------------------------------------------------------------------

def test_temperature_by_hand():
    # floor_scale 4, attn_scale 0.5: tau = 1 + 0.5 log(1 + floor((i + 1) / 4)), worked by hand:
    # i = 0..2 -> floor < 1 -> 1; i = 3..6 -> 1 + 0.5 log 2; i = 7..10 -> 1 + 0.5 log 3; i = 11 -> 1 + 0.5 log 4.
    want = [1, 1, 1] + [1 + 0.5 * math.log(2)] * 4 + [1 + 0.5 * math.log(3)] * 4 + [1 + 0.5 * math.log(4)]
    np.testing.assert_allclose(irope.attn_temperature(12, attn_scale=0.5, floor_scale=4), want, rtol=1e-15)
    # Llama 4's defaults (attn_scale 0.1, floor_scale 8192): 1 up to position 8190, 1 + 0.1 log 2 at 8191.
    tau = irope.attn_temperature([0, 8190, 8191, 16383], float32=False)
    np.testing.assert_allclose(tau, [1, 1, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3)], rtol=1e-15)
    # float32=True: the float32 rounding of those numbers (HF computes tau in float32).
    f32 = irope.attn_temperature([8191, 16383], float32=True)
    np.testing.assert_array_equal(f32, np.float32([1 + 0.1 * math.log(2), 1 + 0.1 * math.log(3)]).astype(np.float64))


def test_temperature_scales_each_logit_row():
    # Query i scaled by tau(i), keys not: the logits of row i are tau(i) times NoPE's, so the layer equals
    # NoPE attention whose query rows are scaled by hand.
    x = _x(9, seed=1)
    tempered = MultiHeadAttention(D_MODEL, HEADS, scheme=NoPETemperature(attn_scale=0.7, floor_scale=2), seed=3)
    plain = MultiHeadAttention(D_MODEL, HEADS, seed=3)
    tau = 1 + 0.7 * np.log1p(np.floor((np.arange(9) + 1) / 2))                   # by the formula, here
    q = (x @ plain.wq).reshape(2, 9, HEADS, HEAD_DIM).transpose(0, 2, 1, 3) * tau[:, None]
    k = (x @ plain.wk).reshape(2, 9, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
    v = (x @ plain.wv).reshape(2, 9, HEADS, HEAD_DIM).transpose(0, 2, 1, 3)
    s = q @ k.transpose(0, 1, 3, 2) / np.sqrt(HEAD_DIM) + np.where(np.tril(np.ones((9, 9), bool)), 0, -np.inf)
    w = np.exp(s - s.max(-1, keepdims=True))
    out = (w / w.sum(-1, keepdims=True)) @ v
    want = out.transpose(0, 2, 1, 3).reshape(2, 9, -1) @ plain.wo
    np.testing.assert_allclose(tempered(x, causal=True), want, rtol=1e-12, atol=1e-12)


# --- chunked attention, by hand -------------------------------------------------------------------

def test_chunk_mask_by_hand():
    # C = 3 over positions 0..6, ANDed with causal: the picture of HF's masking_utils docstring
    # (chunked_causal_mask_function(3, 0), 5 x 5) extended to 7 positions.
    want = np.array([[1, 0, 0, 0, 0, 0, 0],
                     [1, 1, 0, 0, 0, 0, 0],
                     [1, 1, 1, 0, 0, 0, 0],
                     [0, 0, 0, 1, 0, 0, 0],
                     [0, 0, 0, 1, 1, 0, 0],
                     [0, 0, 0, 1, 1, 1, 0],
                     [0, 0, 0, 0, 0, 0, 1]], bool)
    got = irope.chunk_mask(7, 7, 3) & np.tri(7, dtype=bool)
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("make", [MultiHeadAttention, fast.MultiHeadAttention])
@pytest.mark.parametrize("block_size", [None, 2])
def test_chunked_layer_is_independent_chunks(make, block_size):
    # Chunks of C = 4 never see each other: the layer over 10 positions equals the plain causal layer run
    # on positions 0..3, 4..7, 8..9 separately (Rotary: each chunk keeps its absolute positions).
    x = _x(10, seed=2)
    chunked = make(D_MODEL, HEADS, scheme=Rotary(), seed=4, attention_chunk=4, block_size=block_size)
    plain = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), seed=4)
    want = np.concatenate([plain(x[:, a:b], positions=np.arange(a, b), causal=True)
                           for a, b in ((0, 4), (4, 8), (8, 10))], axis=1)
    np.testing.assert_allclose(chunked(x, causal=True), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("scheme", [lambda: Rotary(layout="interleaved"), lambda: NoPETemperature(floor_scale=3)])
@pytest.mark.parametrize("chunk", [None, 3])
def test_dense_blockwise_cache_and_fast_agree(scheme, chunk):
    x = _x(11, seed=5)
    dense = MultiHeadAttention(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=scheme(), seed=6, attention_chunk=chunk)
    want = dense(x, causal=True)
    for make, block in ((MultiHeadAttention, 4), (fast.MultiHeadAttention, None), (fast.MultiHeadAttention, 3)):
        other = make(D_MODEL, HEADS, num_kv_heads=KV_HEADS, scheme=scheme(), seed=6, attention_chunk=chunk,
                     block_size=block)
        np.testing.assert_allclose(other(x, causal=True), want, rtol=1e-12, atol=1e-12)
        cache, outs = other.new_cache(), []
        for a, b in ((0, 4), (4, 5), (5, 11)):                                   # cached steps: the queries
            outs.append(other(x[:, a:b], causal=True, cache=cache))               # start at the cache length
        np.testing.assert_allclose(np.concatenate(outs, axis=1), want, rtol=1e-12, atol=1e-12)


@settings(max_examples=25, deadline=None)
@given(chunk=st.integers(1, 6), T=st.integers(1, 12), start=st.integers(0, 9), seed=st.integers(0, 2 ** 16))
def test_a_query_ignores_every_key_outside_its_chunk(chunk, T, start, seed):
    # Changing the tokens of other chunks leaves the outputs of a chunk alone (causal and not).
    rng = np.random.default_rng(seed)
    layer = MultiHeadAttention(8, 2, scheme=Rotary(), attention_chunk=chunk, seed=seed % 5)
    positions = start + np.arange(T)
    x = rng.standard_normal((1, T, 8))
    own = positions // chunk == positions[-1] // chunk                           # the last query's chunk
    other = x.copy()
    other[:, ~own] = rng.standard_normal((1, int((~own).sum()), 8))
    for causal in (True, False):
        a, b = (layer(v, positions=positions, causal=causal)[:, own] for v in (x, other))
        np.testing.assert_allclose(a, b, rtol=1e-12, atol=1e-12)


def test_float32_layers_stay_float32():
    x = _x(9, seed=15)
    for scheme in (NoPETemperature(floor_scale=2), Rotary()):
        ref = MultiHeadAttention(D_MODEL, HEADS, scheme=scheme, seed=1, attention_chunk=4)
        low = MultiHeadAttention(D_MODEL, HEADS, scheme=type(scheme)(**({"floor_scale": 2} if isinstance(
            scheme, NoPETemperature) else {})), seed=1, attention_chunk=4, dtype=np.float32)
        y32, ctx = low(x.astype(np.float32), causal=True, return_context=True)
        assert y32.dtype == np.float32 and low.backward(ctx, y32)["wq"].dtype == np.float32
        np.testing.assert_allclose(y32, ref(x, causal=True), rtol=1e-4, atol=1e-5)


# --- gradients ----------------------------------------------------------------------------------

@pytest.mark.parametrize("make", [MultiHeadAttention, fast.MultiHeadAttention])
@pytest.mark.parametrize("scheme, chunk", [(lambda: NoPETemperature(attn_scale=0.5, floor_scale=2), None),
                                           (lambda: Rotary(), 3), (lambda: NoPETemperature(floor_scale=3), 4)])
@pytest.mark.parametrize("block", [None, 2])
def test_gradients_match_finite_differences(make, scheme, chunk, block):
    rng = np.random.default_rng(7)
    layer = make(8, 2, scheme=scheme(), bias=True, seed=1, block_size=block, attention_chunk=chunk)
    x, dy = rng.standard_normal((2, 7, 8)), rng.standard_normal((2, 7, 8))
    positions = np.arange(2, 9)                                                  # tau > 1 from position 2

    def call(x, **kw):
        return layer(x, positions=positions, causal=True, **kw)
    check_layer_gradients(layer, x, dy, call, rng)


@pytest.mark.parametrize("block", [None, 2])
def test_gradients_with_a_cache(block):
    rng = np.random.default_rng(8)
    layer = MultiHeadAttention(8, 2, scheme=NoPETemperature(floor_scale=2), seed=2, block_size=block,
                               attention_chunk=4)
    x0, x, dy = rng.standard_normal((1, 3, 8)), rng.standard_normal((1, 3, 8)), rng.standard_normal((1, 3, 8))
    check_layer_gradients(layer, x, dy, after_a_cache(layer, x0), rng)         # positions 3, 4, 5: chunk 0|1


def test_temperature_backward_is_the_transpose():
    # <apply(q), dy> = <q, backward(dy)> for the diagonal map.
    rng = np.random.default_rng(9)
    q, dy = rng.standard_normal((2, 3, 5, 4)), rng.standard_normal((2, 3, 5, 4))
    kw = dict(attn_scale=0.3, floor_scale=2)
    lhs = np.sum(irope.apply_attn_temperature(q, 5, **kw) * dy)
    assert abs(lhs - np.sum(q * irope.apply_attn_temperature_backward(dy, 5, **kw))) < 1e-12


# --- bad input ----------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, error, match", [
    ({"attention_chunk": 0}, ValueError, "attention_chunk"), ({"attention_chunk": 2.5}, TypeError, "attention_chunk"),
    ({"attention_chunk": True}, TypeError, "attention_chunk")])
def test_bad_attention_chunk_is_named(kwargs, error, match):
    with pytest.raises(error, match=match):
        MultiHeadAttention(D_MODEL, HEADS, **kwargs)


@pytest.mark.parametrize("kwargs, match", [({"floor_scale": 0}, "floor_scale"), ({"attn_scale": -0.1}, "attn_scale"),
                                           ({"floor_scale": float("nan")}, "floor_scale"),
                                           ({"float32": "yes"}, "float32")])
def test_bad_temperature_is_named(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        NoPETemperature(**kwargs)
    with pytest.raises((ValueError, TypeError), match=match):
        irope.attn_temperature(4, **kwargs)


def test_bad_temperature_inputs_are_named():
    with pytest.raises(ValueError, match="positions must be >= 0"):
        irope.attn_temperature([-2, 0])
    with pytest.raises(ValueError, match="q must have T = 3 rows"):
        irope.apply_attn_temperature(np.ones((2, 4, 8)), 3)
    with pytest.raises(ValueError, match="dy must have shape"):
        irope.apply_attn_temperature_backward(np.ones(8), 8)
    with pytest.raises(ValueError, match="chunk"):
        irope.chunk_mask(3, 3, 0)


@pytest.mark.parametrize("config, match", [
    ({"num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4, "no_rope_layers": [1, 0]},
     "no_rope_layers"),
    ({"num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4, "no_rope_layers": [1, 2, 1, 1]},
     "no_rope_layers"),
    ({"hidden_size": 32, "num_attention_heads": 4}, "num_hidden_layers"),
    ({"num_hidden_layers": 4, "num_attention_heads": 4}, "hidden_size"),
])
def test_bad_config_is_named(config, match):
    with pytest.raises(ValueError, match=match):
        irope.llama4_layer(config, 0)


def test_bad_layer_index_and_sliding_window_are_named():
    config = {"num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4}
    with pytest.raises(ValueError, match="layer_idx must be < "):
        irope.smollm3_layer(config, 4)
    with pytest.raises(TypeError, match="config must be a dict"):
        irope.llama4_layer([("hidden_size", 32)], 0)
    with pytest.raises(ValueError, match="use_sliding_window"):
        irope.smollm3_layer({**config, "use_sliding_window": True, "sliding_window": 8}, 3)


# --- against transformers -----------------------------------------------------------------------





LLAMA3 = {"rope_type": "llama3", "rope_theta": 500.0, "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 16}


def _llama4_config(**kw):
    from transformers import Llama4TextConfig
    cfg = Llama4TextConfig(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                           head_dim=HEAD_DIM, num_hidden_layers=4, intermediate_size=16, intermediate_size_mlp=16,
                           max_position_embeddings=256, rope_parameters=dict(LLAMA3), attention_chunk_size=5,
                           floor_scale=4, attn_scale=0.3, **kw)
    cfg._attn_implementation = "eager"
    return cfg


@needs_torch
def test_per_layer_choice_follows_the_configs():
    # HF fills no_rope_layers (1 = RoPE) and layer_types ("chunked_attention" on RoPE layers): read from them.
    from transformers import SmolLM3Config
    cfg = _llama4_config()
    for i in range(4):
        scheme, kw = irope.llama4_layer(cfg.to_dict(), i)
        assert isinstance(scheme, Rotary) == bool(cfg.no_rope_layers[i])
        assert (kw["attention_chunk"] == 5) == (cfg.layer_types[i] == "chunked_attention")
        if not cfg.no_rope_layers[i]:
            assert isinstance(scheme, NoPETemperature) and (scheme.attn_scale, scheme.floor_scale) == (0.3, 4)
    assert [irope.use_rope(cfg.to_dict(), i) for i in range(4)] == [True, True, True, False]
    smol = SmolLM3Config(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                         num_hidden_layers=8)
    assert [irope.use_rope(smol.to_dict(), i) for i in range(8)] == [bool(f) for f in smol.no_rope_layers]
    assert smol.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]                        # every fourth layer is NoPE
    assert type(irope.smollm3_layer(smol.to_dict(), 3)[0]) is NoPE
    assert irope.use_rope({"num_hidden_layers": 6, "no_rope_layers": None, "no_rope_layer_interval": 3}, 2) is False


@needs_torch
def test_llama4_rope_layer_with_chunks_matches_transformers():
    from transformers.masking_utils import create_chunked_causal_mask
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding

    torch.manual_seed(0)
    cfg = _llama4_config()
    ref = Llama4TextAttention(cfg, layer_idx=0).double()
    assert ref.use_rope and hasattr(ref, "qk_norm")
    # minipos does not model Llama 4's L2 q/k norm (use_qk_norm): replaced by the identity here.
    ref.qk_norm = torch.nn.Identity()
    T = 16
    x = _x(T, seed=11)
    tx = _t(x)
    pos = torch.arange(T)[None].expand(2, T)
    freqs_cis = Llama4TextRotaryEmbedding(cfg)(tx, pos)
    mask = create_chunked_causal_mask(config=cfg, inputs_embeds=tx, attention_mask=None, cache=None,
                                      position_ids=pos, allow_is_causal_skip=False)
    with torch.no_grad():
        want = _np(ref(tx, position_embeddings=freqs_cis, attention_mask=mask)[0])

    scheme, kw = irope.llama4_layer(cfg.to_dict(), 0)
    layer = MultiHeadAttention(scheme=scheme, **kw)
    copy_projections(layer, ref)
    got = layer(x, causal=True)
    # Llama 4 rotates in float32 (xq.float(), float32 angles) even in a float64 module: float32 accuracy.
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    # The chunks and the layout matter at this accuracy: unchunked, or half layout, it differs.
    for other in (dict(kw, attention_chunk=None), kw):
        wrong = MultiHeadAttention(scheme=Rotary(layout="half" if other is kw else "interleaved",
                                                 scaling=dict(LLAMA3)), **other)
        copy_projections(wrong, ref)
        assert np.max(np.abs(wrong(x, causal=True) - want)) > 1e-3


@needs_torch
def test_llama4_nope_layer_with_temperature_matches_transformers():
    from transformers.masking_utils import create_causal_mask
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    torch.manual_seed(1)
    cfg = _llama4_config()
    ref = Llama4TextAttention(cfg, layer_idx=3).double()
    assert not ref.use_rope and not hasattr(ref, "qk_norm")                       # NoPE layers have no q/k norm
    T = 24                                                             # floor_scale 4: tau up to 1 + 0.3 log 7
    x = _x(T, seed=12)
    tx = _t(x)
    pos = torch.arange(T)[None].expand(2, T)
    mask = create_causal_mask(config=cfg, inputs_embeds=tx, attention_mask=None, cache=None, position_ids=pos)
    with torch.no_grad():
        want = _np(ref(tx, position_embeddings=None, attention_mask=mask)[0])
    scheme, kw = irope.llama4_layer(cfg.to_dict(), 3)
    assert kw["attention_chunk"] is None                                         # NoPE layers: full attention
    layer = MultiHeadAttention(scheme=scheme, **kw)
    copy_projections(layer, ref)
    # float32=True rounds tau as HF does: agreement to float64 precision.
    np.testing.assert_allclose(layer(x, causal=True), want, rtol=1e-12, atol=1e-12)
    # The temperature is visible: plain NoPE differs.
    plain = MultiHeadAttention(scheme=NoPE(), **kw)
    copy_projections(plain, ref)
    assert np.max(np.abs(plain(x, causal=True) - want)) > 1e-3


@needs_torch
@pytest.mark.parametrize("layer_idx", [3, 0])
def test_smollm3_layers_match_transformers(layer_idx):
    from transformers import SmolLM3Config
    from transformers.models.smollm3.modeling_smollm3 import SmolLM3Attention, apply_rotary_pos_emb  # noqa: F401

    torch.manual_seed(2)
    cfg = SmolLM3Config(hidden_size=D_MODEL, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                        num_hidden_layers=4, rope_parameters={"rope_type": "default", "rope_theta": 1000.0})
    cfg._attn_implementation = "sdpa"   # SmolLM3's eager path takes the softmax in float32; sdpa keeps float64
    ref = SmolLM3Attention(cfg, layer_idx=layer_idx).double()
    assert ref.use_rope == (layer_idx != 3)
    T = 12
    x = _x(T, seed=13)
    # cos and sin in float64 from the RoPE definition (w_i = theta^(-2i/D), HF's rotate_half layout),
    # so the comparison is at float64 precision; the NoPE layer ignores them.
    w = 1000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float64) / HEAD_DIM)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * w
    emb = torch.cat([ang, ang], dim=-1)[None].expand(2, T, HEAD_DIM)
    causal = _t(np.where(np.tri(T, dtype=bool), 0.0, -np.inf)[None, None])
    with torch.no_grad():
        want = _np(ref(_t(x), position_embeddings=(emb.cos(), emb.sin()), attention_mask=causal)[0])
    scheme, kw = irope.smollm3_layer(cfg.to_dict(), layer_idx)
    assert isinstance(scheme, Rotary if layer_idx != 3 else NoPE)
    layer = MultiHeadAttention(scheme=scheme, **kw)
    copy_projections(layer, ref)
    np.testing.assert_allclose(layer(x, causal=True), want, rtol=1e-12, atol=1e-12)


@needs_torch
@pytest.mark.parametrize("dim, L", [(128, 8192), (8, 16)])
def test_llama4_scout_rope_parameters_match_transformers(dim, L):
    # Llama 4 Scout's rope_parameters have high_freq_factor == low_freq_factor (1.0): no ramp. HF accepts
    # them (with a warning); its inv_freq is the expected value.
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 16.0, "low_freq_factor": 1.0,
              "high_freq_factor": 1.0, "original_max_position_embeddings": L}
    cfg = LlamaConfig(head_dim=dim, hidden_size=4 * dim, num_attention_heads=4, rope_parameters=dict(params))
    theirs = _np(ROPE_INIT_FUNCTIONS["llama3"](cfg)[0]).astype(np.float64)
    layer = MultiHeadAttention(4 * dim, 4, scheme=Rotary(layout="interleaved", scaling=params))
    np.testing.assert_allclose(layer.scheme.inv_freq, theirs, rtol=1e-6)         # HF's inv_freq is float32
    assert np.any(layer.scheme.inv_freq < theirs.max() / 16)                     # some pairs were divided by 16


@needs_torch
def test_llama4_nope_layer_with_a_cache_matches_transformers():
    # HF takes the temperature's position from the cache (arange(T) + past_seen_tokens); the minipos cache's
    # default positions are the same index, so the cached steps agree (HF's own DynamicCache, eager attention).
    from transformers import DynamicCache
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention

    torch.manual_seed(3)
    cfg = _llama4_config()
    ref = Llama4TextAttention(cfg, layer_idx=3).double()
    x = _x(10, seed=14)

    def causal(T, S):                                                            # (B, 1, T, S) additive
        allowed = np.arange(S)[None] <= np.arange(S - T, S)[:, None]
        return _t(np.broadcast_to(np.where(allowed, 0.0, -np.inf), (2, 1, T, S)).copy())
    cache = DynamicCache(config=cfg)
    with torch.no_grad():
        want = [_np(ref(_t(x[:, a:b]), position_embeddings=None, attention_mask=causal(b - a, b), cache=cache)[0])
                for a, b in ((0, 6), (6, 7), (7, 10))]
    scheme, kw = irope.llama4_layer(cfg.to_dict(), 3)
    layer = MultiHeadAttention(scheme=scheme, **kw)
    copy_projections(layer, ref)
    mine = layer.new_cache()
    for (a, b), w in zip(((0, 6), (6, 7), (7, 10)), want):
        np.testing.assert_allclose(layer(x[:, a:b], causal=True, cache=mine), w, rtol=1e-12, atol=1e-12)


@needs_torch
def test_llama4_chunked_rope_layer_with_a_cache_matches_transformers():
    # Cached steps across chunk boundaries (C = 5): HF keeps a sliding window of C keys on chunked layers and
    # builds each step's mask with create_chunked_causal_mask; minipos keeps every key and masks by position.
    from transformers import DynamicCache
    from transformers.masking_utils import create_chunked_causal_mask
    from transformers.models.llama4.modeling_llama4 import Llama4TextAttention, Llama4TextRotaryEmbedding

    torch.manual_seed(4)
    cfg = _llama4_config()
    ref = Llama4TextAttention(cfg, layer_idx=0).double()
    ref.qk_norm = torch.nn.Identity()                                            # not modelled (see above)
    rotary = Llama4TextRotaryEmbedding(cfg)
    x, steps = _x(13, seed=16), ((0, 4), (4, 7), (7, 8), (8, 13))
    cache, want = DynamicCache(config=cfg), []
    with torch.no_grad():
        for a, b in steps:
            tx, pos = _t(x[:, a:b]), torch.arange(a, b)[None].expand(2, b - a)
            mask = create_chunked_causal_mask(config=cfg, inputs_embeds=tx, attention_mask=None, cache=cache,
                                              position_ids=pos, allow_is_causal_skip=False)
            want.append(_np(ref(tx, position_embeddings=rotary(tx, pos), attention_mask=mask, cache=cache)[0]))
    scheme, kw = irope.llama4_layer(cfg.to_dict(), 0)
    for chunk, agrees in ((kw["attention_chunk"], True), (None, False)):
        layer = MultiHeadAttention(scheme=Rotary(layout="interleaved", scaling=dict(LLAMA3)),
                                   **dict(kw, attention_chunk=chunk))
        copy_projections(layer, ref)
        mine = layer.new_cache()
        gap = max(np.max(np.abs(layer(x[:, a:b], causal=True, cache=mine) - w)) for (a, b), w in zip(steps, want))
        assert (gap < 1e-6) == agrees, (chunk, gap)                              # float32 rotation in HF
