"""``minipos.kv_share.SharedKVAttention``: a layer attending with the keys and values an earlier layer stored in
its cache. Expected values come from the source layer itself (same input and weights: the same output), from the
layer's own full pass (decoding steps), and from finite differences (the gradients); transformers' Gemma 3n and
Gemma 4 are compared in test_config_interop_kv_share.py."""

import numpy as np
import pytest

from minipos.kv_share import SharedKVAttention
from minipos.qk_norm import QKNormAttention
from minipos.rope_scaling import Rotary

KW = dict(num_kv_heads=1, head_dim=8, scale=1.0, v_norm=True)


def _pair(window=None, bias=False):
    """A source layer and a shared layer reading it, every weight drawn away from its initial value."""
    rng = np.random.default_rng(3)
    src = QKNormAttention(16, 2, scheme=Rotary(layout="half"), seed=1, sliding_window=window, bias=bias, **KW)
    shared = SharedKVAttention(16, 2, kv_source=0, scheme=Rotary(layout="half"), seed=2, sliding_window=window,
                               bias=bias, **KW)
    for layer in (src, shared):
        for name in _weights(layer):
            w = getattr(layer, name)
            setattr(layer, name, w + 0.3 * rng.standard_normal(w.shape))
    return src, shared


def _weights(layer):
    return sorted(n for n in layer._weight_shapes() if getattr(layer, n) is not None)


def test_the_shared_layer_has_no_keys_or_values_of_its_own():
    _, shared = _pair(bias=True)
    assert _weights(shared) == ["bo", "bq", "q_norm", "wo", "wq"]
    assert shared.wk is None and shared.wv is None and shared.k_norm is None
    assert "kv_source=0" in repr(shared)


@pytest.mark.parametrize("window", [None, 3])
def test_on_the_sources_input_with_its_query_weights_it_is_the_source(window):
    # The source's keys are those it would compute itself: with the source's wq, q_norm and wo (and biases) the
    # shared layer on the same x must give the source's output exactly.
    src, shared = _pair(window, bias=True)
    for name in ("wq", "bq", "q_norm", "wo", "bo"):
        setattr(shared, name, getattr(src, name).copy())
    x = np.random.default_rng(4).standard_normal((2, 7, 16))
    cache = src.new_cache()
    want = src(x, causal=True, cache=cache)
    np.testing.assert_array_equal(shared(x, causal=True, cache=cache), want)
    assert cache.length == 7                                              # read, not extended


def test_decoding_steps_equal_the_full_pass():
    src, shared = _pair(window=4)
    rng = np.random.default_rng(5)
    xs, xq = rng.standard_normal((2, 9, 16)), rng.standard_normal((2, 9, 16))
    cache = src.new_cache()
    src(xs, causal=True, cache=cache)
    full = shared(xq, causal=True, cache=cache)
    cache, steps = src.new_cache(), []
    for a, b in ((0, 4), (4, 5), (5, 9)):
        src(xs[:, a:b], causal=True, cache=cache)
        steps.append(shared(xq[:, a:b], causal=True, cache=cache))
    np.testing.assert_allclose(np.concatenate(steps, 1), full, rtol=1e-12, atol=1e-13)


def test_gradients_match_finite_differences():
    src, shared = _pair(window=3, bias=True)
    rng = np.random.default_rng(6)
    xs, x, dy = (rng.standard_normal((2, 6, 16)) for _ in range(3))
    cache = src.new_cache()
    src(xs, causal=True, cache=cache)
    _, ctx = shared(x, causal=True, cache=cache, return_context=True)
    grads = shared.backward(ctx, dy)
    assert set(grads) == {"x", "wq", "bq", "q_norm", "wo", "bo"}          # the shared keys are constants
    h = 1e-6
    for name in grads:
        a = x if name == "x" else getattr(shared, name)
        for flat in rng.choice(a.size, size=min(8, a.size), replace=False):
            i = np.unravel_index(flat, a.shape)
            old = a[i]
            a[i] = old + h
            up = (shared(x, causal=True, cache=cache) * dy).sum()
            a[i] = old - h
            num = (up - (shared(x, causal=True, cache=cache) * dy).sum()) / (2 * h)
            a[i] = old
            assert grads[name][i] == pytest.approx(num, rel=1e-6, abs=1e-8), (name, i)


def test_bad_calls_are_named_and_change_nothing():
    src, shared = _pair()
    x = np.random.default_rng(7).standard_normal((2, 5, 16))
    with pytest.raises(ValueError, match="layer 0: pass cache="):
        shared(x, causal=True)
    with pytest.raises(TypeError, match="KVCache of layer 0"):
        shared(x, causal=True, cache={"k": 1})
    with pytest.raises(ValueError, match="empty"):
        shared(x, causal=True, cache=src.new_cache())
    cache = src.new_cache()
    src(x, causal=True, cache=cache)
    with pytest.raises(ValueError, match="belongs to this layer"):
        shared(x, causal=True, cache=shared.new_cache())
    with pytest.raises(ValueError, match="last T = 5 positions"):
        shared(x, positions=np.arange(1, 6), causal=True, cache=cache)
    with pytest.raises(ValueError, match="last T = 6"):
        shared(np.zeros((2, 6, 16)), causal=True, cache=cache)
    with pytest.raises(ValueError, match="batch 1"):
        shared(x[:1], causal=True, cache=cache)
    with pytest.raises(ValueError, match=r"mask must have shape \(B, S\) = \(2, 5\)"):
        shared(x, causal=True, cache=cache, mask=np.ones((2, 10), bool))
    wide = SharedKVAttention(16, 2, kv_source=0, scheme=Rotary(layout="half"), num_kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match="num_kv_heads=2"):
        wide(x, causal=True, cache=cache)
    with pytest.raises(ValueError, match="kv_source"):
        SharedKVAttention(16, 2, kv_source=-1, scheme=Rotary(layout="half"), head_dim=8)
    assert cache.length == 5 and cache.seen == 5                           # every failed call left it as it was
    np.testing.assert_array_equal(shared(x, causal=True, cache=cache),
                                  shared(x, positions=np.arange(5), causal=True, cache=cache))


def test_a_mask_per_head_is_taken_as_by_any_layer():
    # The shared layer takes the (B, H, T, S) mask the base layer takes: the same mask for every head is the
    # (B, T, S) one, bit for bit.
    src, shared = _pair()
    x = np.random.default_rng(9).standard_normal((2, 5, 16))
    cache = src.new_cache()
    src(x, causal=True, cache=cache)
    m = np.random.default_rng(10).random((2, 5, 5)) < 0.7
    m[:, np.arange(5), np.arange(5)] = True
    np.testing.assert_array_equal(shared(x, causal=True, cache=cache, mask=np.repeat(m[:, None], 2, axis=1)),
                                  shared(x, causal=True, cache=cache, mask=m))
