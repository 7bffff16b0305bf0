"""StreamingLLM's cache: which tokens it keeps and at which positions (worked by hand from the
paper's rule, Xiao et al. 2023, §3.2), and every step equal to a fresh forward pass over the kept
tokens at positions 0, 1, ... (the definition, computed without a cache)."""

import copy

import numpy as np
import pytest

import minipos.fast as fast
from minipos.layer import ALiBi, MultiHeadAttention, NoPE, Rotary, Sinusoidal, XPos
from minipos.streaming import StreamingCache

D_MODEL, HEADS = 16, 2


def _x(T, seed=0):
    return np.random.default_rng(seed).standard_normal((1, T, D_MODEL))


def test_kept_tokens_and_positions_by_hand():
    # num_sinks = 2, window = 3: a step sees the 2 sinks and the last 3 tokens, its own included,
    # so 2 + 3 - 1 = 4 keys stay between steps. After tokens 0..6: tokens 0, 1 (sinks) and 5, 6,
    # at cache positions 0, 1, 2, 3; the next token goes to position 4 and sees 0, 1, 5, 6, 7.
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=NoPE(), seed=1)
    cache = StreamingCache(layer, num_sinks=2, window=3)
    x = _x(7, seed=2)
    for t in range(7):
        layer(x[:, t:t + 1], causal=True, cache=cache)
    assert cache.positions.tolist() == [0, 1, 2, 3] and cache.total == 7 and cache.seen == 4
    v_tokens = (x[0] @ layer.wv).reshape(7, HEADS, -1).transpose(1, 0, 2)    # (H, T, D), NoPE: v = x wv
    np.testing.assert_allclose(cache.v[0], v_tokens[:, [0, 1, 5, 6]], rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("scheme", [lambda: Rotary(layout="half"), lambda: Rotary(scaling={"rope_type": "linear",
                                                                                            "factor": 2.0}),
                                    ALiBi, NoPE])
@pytest.mark.parametrize("layer_cls", [MultiHeadAttention, fast.MultiHeadAttention])
def test_every_step_equals_a_fresh_pass_over_the_kept_tokens(scheme, layer_cls):
    # The paper's rule: the kept tokens sit at positions 0, 1, ... in cache order, so step t's
    # output is the last row of a cache-free pass over x[kept + [t]] at positions 0 ... n-1.
    num_sinks, window, T = 2, 3, 10
    layer = layer_cls(D_MODEL, HEADS, scheme=scheme(), seed=3)
    cache = StreamingCache(layer, num_sinks=num_sinks, window=window)
    x = _x(T, seed=4)
    for t in range(T):
        got = layer(x[:, t:t + 1], causal=True, cache=cache)
        kept = list(range(min(t, num_sinks))) + list(range(max(num_sinks, t - window + 1), t))
        assert len(kept) <= num_sinks + window - 1
        tokens = x[:, kept + [t]]
        expected = layer(tokens, positions=np.arange(len(kept) + 1), causal=True)[:, -1:]
        np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-12, err_msg=f"step {t}")


def test_a_chunk_then_steps_and_the_gradient_with_the_cache_constant():
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(layout="half"), seed=5)
    cache = StreamingCache(layer, num_sinks=1, window=2)
    x = _x(6, seed=6)
    layer(x[:, :4], causal=True, cache=cache)                              # keeps tokens 0 and 3
    assert cache.positions.tolist() == [0, 1] and cache.total == 4
    expected = layer(x[:, [0, 3, 4]], positions=np.arange(3), causal=True)[:, -1:]
    np.testing.assert_allclose(layer(x[:, 4:5], causal=True, cache=copy.deepcopy(cache)), expected, atol=1e-12)
    # backward: the kept keys are constants; x of this step against central differences
    dy, e, h = _x(1, seed=7), _x(1, seed=8), 1e-6
    y, ctx = layer(x[:, 4:5], causal=True, cache=copy.deepcopy(cache), return_context=True)
    grad = layer.backward(ctx, dy)["x"]
    fd = np.sum((layer(x[:, 4:5] + h * e, causal=True, cache=copy.deepcopy(cache))
                 - layer(x[:, 4:5] - h * e, causal=True, cache=copy.deepcopy(cache))) * dy) / (2 * h)
    assert abs(np.sum(grad * e) - fd) <= 1e-7 * max(1, abs(fd))


@pytest.mark.parametrize("kwargs, error", [({"num_sinks": -1}, "num_sinks"), ({"window": 0}, "window"),
                                           ({"window": 2.0}, "window")])
def test_bad_sizes_are_named(kwargs, error):
    with pytest.raises((ValueError, TypeError), match=error):
        StreamingCache(MultiHeadAttention(D_MODEL, HEADS), **kwargs)


@pytest.mark.parametrize("scheme, error", [(XPos, "re-rotates"), (Sinusoidal, "before the projections"),
                                           (lambda: Rotary(scaling={"rope_type": "yarn", "factor": 4.0,
                                                                    "original_max_position_embeddings": 4}),
                                            "re-rotates")])
def test_schemes_it_cannot_move_are_refused(scheme, error):
    with pytest.raises(ValueError, match=error):
        StreamingCache(MultiHeadAttention(D_MODEL, HEADS, scheme=scheme()))
    with pytest.raises(TypeError, match="layer"):
        StreamingCache(None)


def test_positions_other_than_the_cache_s_are_refused_and_the_cache_is_unchanged():
    layer = MultiHeadAttention(D_MODEL, HEADS, scheme=Rotary(), seed=9)
    cache = StreamingCache(layer, num_sinks=1, window=2)
    layer(_x(3), causal=True, cache=cache)
    with pytest.raises(ValueError, match="positions within the cache"):
        layer(_x(1), positions=[3], causal=True, cache=cache)
    assert cache.positions.tolist() == [0, 1] and cache.total == 3
    with pytest.raises(ValueError, match="another layer"):
        MultiHeadAttention(D_MODEL, HEADS)(_x(1), cache=cache)
