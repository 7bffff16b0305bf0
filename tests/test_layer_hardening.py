"""The layer, reference and fast, hardened: NaN or inf in the output projection's weights (and any
weight a backward multiplies by) is an ``Overflow`` naming it, never a NaN output or a gradient blamed
on the scheme."""

import numpy as np
import pytest

import minipos.fast as fast
from minipos import layer as L
from minipos._checks import Overflow

LAYERS = [pytest.param(L.MultiHeadAttention, id="reference"), pytest.param(fast.MultiHeadAttention, id="fast")]
X = np.random.default_rng(0).standard_normal((2, 3, 8))                  # (B, T, d_model)


# --- 1. step 8's weights, forward and backward ----------------------------------------------------------------

@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("name", ["wo", "bo"])
@pytest.mark.parametrize("fill", [np.nan, np.inf, -np.inf])
def test_nan_or_inf_in_the_output_projection_is_named_and_the_cache_is_unchanged(make, name, fill):
    # Before: y = merged @ wo + bo came back NaN or inf, silently, and the cache kept the call's keys.
    layer = make(8, 2, bias=True, scheme=L.Rotary())
    getattr(layer, name)[1] = fill
    cache = layer.new_cache()
    with pytest.raises(Overflow, match=rf"output projection .*\(step 8\) is not finite \(float64\): {name} holds NaN"):
        layer(X, cache=cache)
    assert cache.length == 0                                                # a failed call changes no state


@pytest.mark.parametrize("make", LAYERS)
def test_a_finite_output_projection_that_overflows_says_so(make):
    # With x = 1 and wv = 1e20 * I every value is 1e20, so is every merged feature (a weighted mean);
    # times wo = 1e20 and summed over 8 features that is 8e40, past float32's 3.4e38.
    layer = make(8, 2, dtype=np.float32)
    layer.wv = np.eye(8, dtype=np.float32) * 1e20
    layer.wo = np.full((8, 8), 1e20, np.float32)
    with pytest.raises(Overflow, match=r"merged @ wo \+ bo \(step 8\) overflows float32; rescale x, wo or bo"):
        layer(np.ones((1, 2, 8), np.float32))


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("name", ["wq", "wk", "wv", "wo"])
def test_a_weight_set_to_nan_between_forward_and_backward_is_named(make, name):
    # Before: wo gave "dy @ wo^T overflow float64" (no NaN named), wq/wk/wv a ValueError blaming the
    # scheme's embed_backward for the NaN they put into the gradient of x.
    layer = make(8, 2, scheme=L.Rotary())
    y, ctx = layer(X, return_context=True)
    getattr(layer, name)[0, 0] = np.nan
    with pytest.raises(Overflow, match=f"is not finite \\(float64\\): {name} holds NaN or inf"):
        layer.backward(ctx, np.ones_like(y))
