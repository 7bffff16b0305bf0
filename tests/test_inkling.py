"""Inkling 2's decoder attention (``minipos.inkling``): its pieces on hand-worked cases, the layer against its
equations written out with a loop over every (query, key) pair, its gradients against central differences, and the
blockwise, cached and rolling-window paths against the dense pass. The comparison with transformers' own modules is in
``tests/test_config_interop_inkling.py``.

Where each expected value comes from: the hand-worked numbers are computed in the docstrings (the formulas of HF
``Inkling2L2Clip``, ``Inkling2LogScale``, ``Inkling2ShortConvolution`` and ``Inkling2RelativePositionBias``, read from
transformers 5.24); the written-out layer follows ``Inkling2SlidingAttention.forward`` and
``Inkling2FullAttention.forward`` line by line.
"""

import math

import numpy as np
import pytest

from minipos.attention import attention, attention_backward, blockwise_attention, blockwise_attention_backward
from minipos.inkling import (InklingAttention, InklingCache, l2_clip, l2_clip_backward, log_scale,
                             relative_bias, relative_bias_backward, short_conv, short_conv_backward)
from minipos.layer import KVCache
from minipos.rope_scaling import Rotary

SIZES = dict(num_kv_heads=2, head_dim=6, d_rel=3, conv_kernel=3, qk_clip=1.5, rel_clip=0.7, seed=1)
FULL = dict(rel_extent=7, dynamic_conv=True, log_scaling=(0.3, 4))


def _layer(full=True, **kw):
    """A small layer (d_model 16, 4 heads over 2 key/value heads), every weight drawn away from its start so that
    the clips bite on some vectors and not on others."""
    layer = InklingAttention(16, 4, **{**SIZES, **(FULL if full else {"sliding_window": 5}), **kw})
    rng = np.random.default_rng(kw.get("seed", 1) + 10)
    for name, w in layer._weights().items():
        if w is not None:
            setattr(layer, name, w + 0.3 * rng.standard_normal(w.shape))
    return layer


# --------------------------------------------------------------------------- the pieces, hand-worked

def test_l2_clip_shortens_long_vectors_only():
    """[3, 4] has norm 5 > 2.5: times 2.5 / (5 + 1e-6); [0.3, 0.4] (norm 0.5 < 1) is kept."""
    got = l2_clip(np.array([[3.0, 4.0], [0.3, 0.4]]), 2.5)
    np.testing.assert_allclose(got[0], np.array([3.0, 4.0]) * 2.5 / (5 + 1e-6), rtol=1e-15)
    np.testing.assert_array_equal(l2_clip(np.array([0.3, 0.4]), 1.0), [0.3, 0.4])


def test_l2_clip_backward_matches_central_differences():
    rng = np.random.default_rng(0)
    a, d = rng.standard_normal((5, 4)) * 2, rng.standard_normal((5, 4))
    g = l2_clip_backward(a, 1.7, d)
    h = 1e-6
    for i in np.ndindex(a.shape):
        e = np.zeros_like(a)
        e[i] = h
        num = ((l2_clip(a + e, 1.7) - l2_clip(a - e, 1.7)) * d).sum() / (2 * h)
        assert g[i] == pytest.approx(num, rel=1e-6, abs=1e-9)


def test_log_scale_is_one_until_n_floor_then_logarithmic():
    """alpha 0.5, n_floor 4: p + 1 = 1, 4, 8, 16 -> max((p + 1) / 4, 1) = 1, 1, 2, 4 -> 1, 1, 1 + 0.5 ln 2, 1 + ln 2."""
    np.testing.assert_allclose(log_scale([0, 3, 7, 15], alpha=0.5, n_floor=4),
                               [1.0, 1.0, 1 + 0.5 * math.log(2), 1 + math.log(2)], rtol=1e-15)


def test_short_conv_by_hand():
    """u = 1, 2, 3 (one channel), K = 2, taps: lag 0 weight 1, lag 1 weight 10, zero history:
    y = (u_t + u_t + 10 u_{t-1}) / sqrt(3) = 2, 14, 26 over sqrt(3). With a dynamic tap of 1 on each lag the weights
    are 2 and 11 and the divisor sqrt(2K + 1) = sqrt(5): (1 + 2) / sqrt5, (2 + 4 + 11) / sqrt5, (3 + 6 + 22) / sqrt5."""
    u, hist, taps = np.array([[[1.0], [2.0], [3.0]]]), np.zeros((1, 1, 1)), np.array([[1.0], [10.0]])
    np.testing.assert_allclose(short_conv(u, hist, taps)[0, :, 0], np.array([2, 14, 26]) / math.sqrt(3), rtol=1e-15)
    dyn = np.ones((1, 3, 1, 2))
    np.testing.assert_allclose(short_conv(u, hist, taps, dynamic=dyn)[0, :, 0], np.array([3, 17, 31]) / math.sqrt(5),
                               rtol=1e-15)
    # the history is the K - 1 inputs before the call: a history of 5 adds 10 * 5 / sqrt(3) to the first output
    np.testing.assert_allclose(short_conv(u, np.full((1, 1, 1), 5.0), taps)[0, 0, 0], 52 / math.sqrt(3), rtol=1e-15)
    # padding: a token kept out of the taps keeps its residual; 2 is zeroed in the taps:
    # (1 + 1) / sqrt3, (2 + 0 + 10 * 1) / sqrt3, (3 + 3 + 10 * 0) / sqrt3
    keep = np.array([[True, False, True]])
    np.testing.assert_allclose(short_conv(u, hist, taps, keep=keep)[0, :, 0], np.array([2, 12, 6]) / math.sqrt(3),
                               rtol=1e-15)


@pytest.mark.parametrize("dynamic", [False, True])
def test_short_conv_backward_matches_central_differences(dynamic):
    rng = np.random.default_rng(1)
    B, T, C, K, G = 2, 5, 4, 3, 2
    u, hist, taps = rng.standard_normal((B, T, C)), rng.standard_normal((B, K - 1, C)), rng.standard_normal((K, C))
    dyn = rng.standard_normal((B, T, G, K)) if dynamic else None
    keep = rng.random((B, T)) > 0.3
    dy = rng.standard_normal((B, T, C))
    du, dtaps, ddyn = short_conv_backward(u, hist, taps, dy, dynamic=dyn, keep=keep)

    def f(u=u, taps=taps, dyn=dyn):
        return (short_conv(u, hist, taps, dynamic=dyn, keep=keep) * dy).sum()
    h = 1e-6
    for name, a, g in (("u", u, du), ("taps", taps, dtaps)) + ((("dyn", dyn, ddyn),) if dynamic else ()):
        e = rng.standard_normal(a.shape)
        num = (f(**{name: a + h * e}) - f(**{name: a - h * e})) / (2 * h)
        assert (g * e).sum() == pytest.approx(num, rel=1e-7), name


def test_relative_bias_by_hand():
    """Queries at 5, 6, keys at 3, 4, 5, 6, E = 3: distances p_i - j are [2, 1, 0, -1] and [3, 2, 1, 0]; a distance
    outside 0 … 2 gives 0."""
    rel = np.array([[10.0, 11.0, 12.0], [20.0, 21.0, 22.0]])
    got = relative_bias(rel, [5, 6], [3, 4, 5, 6])
    np.testing.assert_array_equal(got, [[12, 11, 10, 0], [0, 22, 21, 20]])
    d = np.arange(8.0).reshape(2, 4)
    np.testing.assert_array_equal(relative_bias_backward(d, [5, 6], [3, 4, 5, 6], 3), [[2, 1, 0], [7, 6, 5]])


def test_relative_bias_backward_is_the_adjoint():
    rng = np.random.default_rng(2)
    rel, q, k = rng.standard_normal((2, 3, 4, 6)), np.array([3, 5, 8, 9]), np.arange(11)
    d = rng.standard_normal((2, 3, 4, 11))
    lhs = (relative_bias(rel, q, k) * d).sum()
    assert lhs == pytest.approx((rel * relative_bias_backward(d, q, k, 6)).sum(), rel=1e-12)


# --------------------------------------------------------------------------- per-query sinks in attention

def test_per_query_sinks_are_a_key_with_a_zero_value():
    """A sink logit s_t per query is an extra key whose logit is s_t and whose value is 0."""
    rng = np.random.default_rng(3)
    q, k, v = rng.standard_normal((2, 3, 4, 5)), rng.standard_normal((2, 3, 6, 5)), rng.standard_normal((2, 3, 6, 2))
    sinks = rng.standard_normal((2, 3, 4))
    mask = np.tril(np.ones((4, 6), bool), 2)
    bias = np.concatenate([np.zeros((2, 3, 4, 6)), sinks[..., None]], axis=-1)
    full_mask = np.concatenate([mask, np.ones((4, 1), bool)], axis=-1)
    ref = attention(np.concatenate([q], -1), np.concatenate([k, np.zeros((2, 3, 1, 5))], -2),
                    np.concatenate([v, np.zeros((2, 3, 1, 2))], -2), bias=bias, mask=full_mask)
    np.testing.assert_allclose(attention(q, k, v, mask=mask, sinks=sinks), ref, rtol=1e-13, atol=1e-15)
    got = blockwise_attention(q, k, v, mask_fn=lambda qs, ks: mask[qs, ks], sinks=sinks, block_size=2)
    np.testing.assert_allclose(got, ref, rtol=1e-13, atol=1e-15)


def test_per_query_sink_gradients():
    rng = np.random.default_rng(4)
    q, k, v = rng.standard_normal((1, 2, 3, 4)), rng.standard_normal((1, 2, 5, 4)), rng.standard_normal((1, 2, 5, 3))
    sinks, dout = rng.standard_normal((1, 2, 3)), rng.standard_normal((1, 2, 3, 3))
    *_, dsinks = attention_backward(q, k, v, dout, sinks=sinks)
    e, h = rng.standard_normal(sinks.shape), 1e-6
    num = ((attention(q, k, v, sinks=sinks + h * e) - attention(q, k, v, sinks=sinks - h * e)) * dout).sum() / (2 * h)
    assert (dsinks * e).sum() == pytest.approx(num, rel=1e-7)
    out, lse = blockwise_attention(q, k, v, sinks=sinks, block_size=2, return_lse=True)
    *_, dsinks_b = blockwise_attention_backward(q, k, v, out, lse, dout, sinks=sinks, block_size=2)
    np.testing.assert_allclose(dsinks_b, dsinks, rtol=1e-10)


def test_sinks_of_another_shape_are_refused():
    q = np.zeros((1, 2, 3, 4))
    with pytest.raises(ValueError, match=r"sinks must have shape \(H,\).*\(\.\.\., H, T\)"):
        attention(q, q, q, sinks=np.zeros((2, 4)))


# --------------------------------------------------------------------------- the layer, written out

def _written_out(layer, x, positions, mask=None, x_k=None, x_v=None):
    """The layer's map with a loop over every (b, h, i, j): HF's forward, read line by line (float64); the keys'
    and the values' inputs ``x_k``, ``x_v`` (default ``x``) feed their projections and dynamic taps."""
    x_k, x_v = (x if a is None else a for a in (x_k, x_v))
    B, T, _ = x.shape
    H, KV, D, K, E = layer.num_heads, layer.num_kv_heads, layer.head_dim, layer.conv_kernel, layer.rel_extent
    G, full = H // KV, layer.sliding_window is None
    s = np.ones(T) if not full else 1 + layer.log_scaling[0] * np.log(
        np.maximum((positions + 1) / layer.log_scaling[1], 1))

    def clip(a, t):
        return a * min(1.0, t / (np.linalg.norm(a) + 1e-6))

    def conv(u, taps, w_dyn):  # u (T, C): causal, zero before the sequence, residual, / sqrt(c)
        out = np.zeros_like(u)
        for t in range(T):
            for lag in range(K):
                if t - lag >= 0 and (mask is None or mask[b, t - lag]):
                    w = taps[lag].copy()
                    if w_dyn is not None:
                        w = w + np.repeat(w_dyn[t].reshape(KV, K)[:, lag], D)
                    out[t] += w * u[t - lag]
        return (out + u) / math.sqrt(2 * K + 1 if w_dyn is not None else K + 1)
    y = np.zeros_like(x)
    for b in range(B):
        xb, xk, xv = x[b], x_k[b], x_v[b]
        ck = conv(xk @ layer.wk, layer.k_conv, None if not full else xk @ layer.k_conv_w)
        cv = conv(xv @ layer.wv, layer.v_conv, None if not full else xv @ layer.v_conv_w)
        heads_out = np.zeros((T, H * D))
        for h in range(H):
            g = h // G
            for i in range(T):
                q = clip((xb[i] @ layer.wq)[h * D:(h + 1) * D] * layer.q_scale[h], layer.qk_clip) * s[i]
                r = clip((xb[i] @ layer.rel_w)[h * layer.d_rel:(h + 1) * layer.d_rel] * layer.rel_scale[h],
                         layer.rel_clip) * s[i]
                logits, values = [], []
                for j in range(T):
                    dist = positions[i] - positions[j]
                    if dist < 0 or (not full and dist >= layer.sliding_window) or (mask is not None and not mask[b, j]):
                        continue
                    k = clip(ck[j, g * D:(g + 1) * D], layer.qk_clip)
                    v = cv[j, g * D:(g + 1) * D]
                    v = v / math.sqrt(np.mean(v * v) + layer.norm_eps)
                    bias = (r @ layer.rel_proj)[dist] if dist < E else 0.0
                    logits.append(q @ k / math.sqrt(D) + bias)
                    values.append(v)
                sink = xb[i] @ layer.w_sink[:, h]
                z = np.array(logits + [sink])
                p = np.exp(z - z.max())
                p /= p.sum()
                heads_out[i, h * D:(h + 1) * D] = p[:-1] @ np.array(values).reshape(-1, D) if values else 0.0
        gate = 1 / (1 + np.exp(-(xb @ layer.wg)))
        y[b] = (heads_out * gate) @ layer.wo
    return y


@pytest.mark.parametrize("full", [False, True])
def test_layer_equals_its_equations_written_out(full):
    layer = _layer(full)
    rng = np.random.default_rng(5)
    x, positions = rng.standard_normal((2, 9, 16)), np.arange(9) + 2       # past n_floor 4: the log scale bites
    mask = np.ones((2, 9), bool)
    mask[1, :3] = False                                                     # left padding in the second row
    np.testing.assert_allclose(layer(x, positions=positions, causal=True, mask=mask),
                               _written_out(layer, x, positions, mask), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(layer(x, positions=positions, causal=True),
                               _written_out(layer, x, positions), rtol=1e-10, atol=1e-12)
    x_k, x_v = rng.standard_normal((2, 2, 9, 16))                          # a full layer's own key and value inputs
    np.testing.assert_allclose(layer(x, x_k=x_k, x_v=x_v, positions=positions, causal=True, mask=mask),
                               _written_out(layer, x, positions, mask, x_k, x_v), rtol=1e-10, atol=1e-12)


def test_the_gate_switched_off_is_the_identity():
    layer = _layer(False)
    x = np.random.default_rng(6).standard_normal((1, 5, 16))
    layer.wg = None
    ref = _layer(False)
    ref.wg = np.full_like(ref.wg, 0.0)                                      # sigmoid(0) = 1/2
    np.testing.assert_allclose(layer(x, causal=True), 2 * ref(x, causal=True), rtol=1e-12)


# --------------------------------------------------------------------------- gradients

@pytest.mark.parametrize("block_size", [None, 3])
@pytest.mark.parametrize("full", [False, True])
def test_gradients_match_central_differences(full, block_size):
    layer = _layer(full, block_size=block_size)
    rng = np.random.default_rng(7)
    x, dy = rng.standard_normal((2, 8, 16)), rng.standard_normal((2, 8, 16))
    positions = np.arange(8) + 3
    mask = np.ones((2, 8), bool)
    mask[0, :2] = False
    x_k, x_v = rng.standard_normal((2, 2, 8, 16))
    kw = dict(positions=positions, causal=True, mask=mask, x_k=x_k, x_v=x_v)
    _, ctx = layer(x, return_context=True, **kw)
    grads = layer.backward(ctx, dy)
    names = {n for n, w in layer._weights().items() if w is not None}
    assert set(grads) == {"x", "x_k", "x_v", *names}
    h = 1e-6
    for name in grads:
        a = {"x": x, "x_k": x_k, "x_v": x_v}[name] if name.startswith("x") else getattr(layer, name)
        e = rng.standard_normal(a.shape)
        a += h * e
        up = (layer(x, **kw) * dy).sum()
        a -= 2 * h * e
        down = (layer(x, **kw) * dy).sum()
        a += h * e
        assert (grads[name] * e).sum() == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-8), name


def test_gradients_through_a_cache_treat_earlier_calls_as_constants():
    layer = _layer(True)
    rng = np.random.default_rng(8)
    x0, x1, dy = rng.standard_normal((1, 4, 16)), rng.standard_normal((1, 3, 16)), rng.standard_normal((1, 3, 16))
    cache = layer.new_cache()
    layer(x0, causal=True, cache=cache)
    snapshot = (cache.k.copy(), cache.v.copy(), cache.conv_k.copy(), cache.conv_v.copy(), cache.length, cache.seen)
    _, ctx = layer(x1, causal=True, cache=cache, return_context=True)
    grads = layer.backward(ctx, dy)

    def loss():
        c = layer.new_cache()
        c._k, c._v, c.conv_k, c.conv_v, c.length, c.seen = (snapshot[0].copy(), snapshot[1].copy(), snapshot[2],
                                                            snapshot[3], snapshot[4], snapshot[5])
        c._pos = np.arange(4)
        return (layer(x1, causal=True, cache=c) * dy).sum()
    h = 1e-6
    for name in ("x", "wk", "k_conv_w", "rel_proj", "w_sink"):
        a = x1 if name == "x" else getattr(layer, name)
        e = rng.standard_normal(a.shape)
        a += h * e
        up = loss()
        a -= 2 * h * e
        down = loss()
        a += h * e
        assert (grads[name] * e).sum() == pytest.approx((up - down) / (2 * h), rel=1e-6, abs=1e-8), name


# --------------------------------------------------------------------------- paths that must agree

@pytest.mark.parametrize("full", [False, True])
def test_blockwise_cached_and_rolling_paths_equal_the_dense_pass(full):
    layer = _layer(full)
    x = np.random.default_rng(9).standard_normal((2, 11, 16))
    dense = layer(x, causal=True)
    blocked = _layer(full, block_size=4)
    np.testing.assert_allclose(blocked(x, causal=True), dense, rtol=1e-12, atol=1e-14)
    cache = layer.new_cache()
    pieces = [layer(x[:, a:b], causal=True, cache=cache) for a, b in ((0, 4), (4, 5), (5, 6), (6, 11))]
    np.testing.assert_allclose(np.concatenate(pieces, axis=1), dense, rtol=1e-12, atol=1e-14)
    if not full:                                                            # the window's rolling cache: W - 1 keys
        cache = layer.new_cache(mem_len=layer.sliding_window - 1)
        steps = [layer(x[:, t:t + 1], causal=True, cache=cache) for t in range(11)]
        np.testing.assert_allclose(np.concatenate(steps, axis=1), dense, rtol=1e-12, atol=1e-14)
        assert cache.length == layer.sliding_window - 1


# --------------------------------------------------------------------------- bad input

def test_bad_arguments_are_refused_by_name():
    with pytest.raises(ValueError, match="its scheme is NoPE, got Rotary"):
        InklingAttention(16, 4, scheme=Rotary())
    with pytest.raises(ValueError, match=r"rel_extent \(9\) is the window \(5\)"):
        InklingAttention(16, 4, sliding_window=5, rel_extent=9)
    with pytest.raises(TypeError, match=r"log_scaling must be None or \(alpha, n_floor\)"):
        InklingAttention(16, 4, log_scaling=0.1)
    with pytest.raises(ValueError, match="log_scaling alpha must be"):
        InklingAttention(16, 4, log_scaling=(-1.0, 4))
    with pytest.raises(ValueError, match="per query"):
        InklingAttention(16, 4, sinks=True)
    layer = _layer(True)
    with pytest.raises(TypeError, match="cache must be an InklingCache"):
        layer(np.zeros((1, 2, 16)), causal=True, cache=KVCache())
    layer.rel_proj = np.zeros((3, 8))
    with pytest.raises(ValueError, match=r"rel_proj must have shape \(d_rel, rel_extent\) = \(3, 7\)"):
        layer(np.zeros((1, 2, 16)), causal=True)
    with pytest.raises(ValueError, match="sliding_window"):
        _layer(False)(np.zeros((1, 2, 16)), causal=False)
    with pytest.raises(ValueError, match=r"x_k must have the shape of x \(1, 2, 16\)"):
        _layer(True)(np.zeros((1, 2, 16)), x_k=np.zeros((1, 3, 16)), causal=True)
    with pytest.raises(ValueError, match="x_v"):
        _layer(True)(np.zeros((1, 2, 16)), x_v=np.full((1, 2, 16), np.nan), causal=True)


def test_a_failed_call_leaves_the_cache_as_it_was():
    layer = _layer(True)
    cache = layer.new_cache()
    x = np.random.default_rng(10).standard_normal((1, 3, 16))
    layer(x, causal=True, cache=cache)
    before = (cache.k.copy(), cache.conv_k.copy(), cache.length, cache.seen)
    with pytest.raises(ValueError):
        layer(np.zeros((2, 2, 16)), causal=True, cache=cache)              # another batch size
    assert isinstance(cache, InklingCache)
    np.testing.assert_array_equal(cache.k, before[0])
    np.testing.assert_array_equal(cache.conv_k, before[1])
    assert (cache.length, cache.seen) == before[2:]
    bad = layer.wo.copy()
    layer.wo[0, 0] = np.nan
    with pytest.raises(Exception, match="wo"):
        layer(x, causal=True, cache=cache)
    layer.wo = bad
    assert (cache.length, cache.seen) == before[2:]
