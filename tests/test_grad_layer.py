"""The layer's backward: every parameter's gradient against central finite differences, for every
scheme, causal or not, with padding masks and a cache, dense and blockwise, reference and fast."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipos.fast as fast
from minipos import layer as L

from _gradcheck import after_a_cache, check_layer_gradients
from _schemes import with_variants

SCHEMES = with_variants(32)
"""Every registered scheme (its registry example for a 32-token model) and the variants of ``_schemes``."""


@settings(max_examples=40, deadline=None)
@given(name=st.sampled_from(sorted(SCHEMES)), causal=st.booleans(), block=st.sampled_from([None, 3]),
       pad=st.booleans(), T=st.integers(1, 7), start=st.integers(0, 5), use_fast=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_layer_gradients_match_finite_differences(name, causal, block, pad, T, start, use_fast, seed):
    rng = np.random.default_rng(seed)
    make = fast.MultiHeadAttention if use_fast else L.MultiHeadAttention
    layer = make(8, 2, scheme=SCHEMES[name](), bias=True, seed=seed % 7, block_size=block)
    x, dy = rng.standard_normal((2, T, 8)), rng.standard_normal((2, T, 8))
    mask = None
    if pad:
        mask = np.ones((2, T), bool)
        mask[1, T // 2:] = False                                       # padding (a fully masked row too)
    positions = start + np.arange(T)

    def call(x, **kw):
        return layer(x, positions=positions, causal=causal, mask=mask, **kw)
    check_layer_gradients(layer, x, dy, call, rng)


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("block", [None, 2])
def test_layer_gradients_with_a_cache(name, block):
    # The cached keys and values of earlier calls are constants: the gradient covers this call only.
    rng = np.random.default_rng(1)
    layer = L.MultiHeadAttention(8, 2, scheme=SCHEMES[name](), seed=2, block_size=block)
    x0, x, dy = rng.standard_normal((1, 3, 8)), rng.standard_normal((1, 2, 8)), rng.standard_normal((1, 2, 8))
    check_layer_gradients(layer, x, dy, after_a_cache(layer, x0), rng)


def test_fully_masked_rows_give_zero_gradients():
    rng = np.random.default_rng(3)
    layer = L.MultiHeadAttention(8, 2, scheme=L.ALiBi(), seed=4)
    x, dy = rng.standard_normal((1, 4, 8)), rng.standard_normal((1, 4, 8))
    mask = np.ones((1, 4, 4), bool)
    mask[0, 2] = False                                                 # query 2 sees no key
    _, ctx = layer(x, mask=mask, return_context=True)
    grads = layer.backward(ctx, dy)
    # query 2's output is bo alone (zero attention), so its x gets nothing through q; its gradient
    # reaches x only through the keys and values other queries attend to.
    np.testing.assert_allclose(ctx.out[0, :, 2], 0.0)
    assert np.all(np.isfinite(grads["x"]))


def test_backward_refuses_a_foreign_context_and_a_bad_dy():
    layer = L.MultiHeadAttention(8, 2)
    _, ctx = layer(np.ones((1, 2, 8)), return_context=True)
    with pytest.raises(TypeError, match="ctx"):
        layer.backward("ctx", np.ones((1, 2, 8)))
    with pytest.raises(ValueError, match="dy"):
        layer.backward(ctx, np.ones((1, 3, 8)))


def test_no_backward_state_on_the_layer_or_the_scheme():
    # Two contexts from one layer give their own gradients, in either order.
    rng = np.random.default_rng(5)
    layer = L.MultiHeadAttention(8, 2, scheme=L.T5Bias(), seed=6)
    xa, xb, dy = rng.standard_normal((1, 3, 8)), rng.standard_normal((1, 5, 8)), rng.standard_normal((1, 3, 8))
    _, ca = layer(xa, return_context=True)
    first = layer.backward(ca, dy)
    _, cb = layer(xb, return_context=True)
    again = layer.backward(ca, dy)
    for name in first:
        np.testing.assert_array_equal(first[name], again[name])


@pytest.mark.parametrize("name", sorted(SCHEMES))
@pytest.mark.parametrize("make", [L.MultiHeadAttention, fast.MultiHeadAttention])
def test_float32_layers_give_float32_gradients(name, make):
    layer = make(8, 2, scheme=SCHEMES[name](), bias=True, dtype=np.float32, block_size=2)
    x = np.random.default_rng(7).standard_normal((1, 4, 8)).astype(np.float32)
    _, ctx = layer(x, causal=True, return_context=True)
    grads = layer.backward(ctx, np.ones_like(x))
    assert {g.dtype for g in grads.values()} == {np.dtype(np.float32)}, {k: g.dtype for k, g in grads.items()}
