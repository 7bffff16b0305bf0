"""The layer, reference and fast, hardened:

1. NaN or inf in the output projection's weights (and in any weight a backward multiplies by) is an
   ``Overflow`` naming it, never a NaN output or a gradient blamed on the scheme;
2. the backward of an empty pass (``B`` or ``T`` 0), which the forward accepts, gives zero gradients
   of the right shapes: an empty output depends on nothing.
"""

import numpy as np
import pytest

import minipos.fast as fast
from minipos import layer as L
from minipos._checks import Overflow
from minipos.mla import DecoupledRotary, MultiHeadLatentAttention
from minipos.qk_norm import QKNormAttention
from _schemes import registered

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


# --- 2. the backward of an empty pass ------------------------------------------------------------------------

def _empty_positions(scheme, T):
    """The positions of a call of ``T`` tokens: ``None`` (``arange(T)``), or ``(streams, T)`` zeros."""
    return None if scheme.position_streams == 1 else np.zeros((scheme.position_streams, T), int)


def _assert_zero_gradients(grads, expected, dtype):
    assert sorted(grads) == sorted(expected)
    for name, shape in expected.items():
        assert grads[name].shape == shape, name
        assert grads[name].dtype == dtype, name
        assert not grads[name].any(), name


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("name, scheme", registered().items())
@pytest.mark.parametrize("B, T", [(2, 0), (0, 3), (0, 0)])
def test_the_backward_of_an_empty_pass_is_zero_gradients_for_every_scheme(make, name, scheme, B, T):
    # Before: "cannot reshape array of size 0" from NumPy (merged.reshape(B * T, -1)).
    sc = scheme()
    layer = make(8, 2, bias=True, scheme=sc)
    y, ctx = layer(np.zeros((B, T, 8)), positions=_empty_positions(sc, T), causal=True, return_context=True)
    # Every parameter's gradient is zero (y is empty): x's of shape (B, T, d_model) = (B, T, 8), the four
    # projections' (8, 2 * 4) and (2 * 4, 8), the biases' (8,), and one of each of the scheme's parameters.
    expected = {"x": (B, T, 8), "wq": (8, 8), "wk": (8, 8), "wv": (8, 8), "wo": (8, 8),
                "bq": (8,), "bk": (8,), "bv": (8,), "bo": (8,),
                **{f"scheme.{n}": p.shape for n, p in sc.parameters().items()}}
    _assert_zero_gradients(layer.backward(ctx, np.zeros((B, T, 8))), expected, np.float64)


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_an_empty_decoding_step_after_a_prefill_has_zero_gradients_in_the_layers_dtype(make, dtype):
    # A T = 0 step attends to the 3 cached keys, but its output is empty: nothing gets a gradient.
    layer = make(8, 2, num_kv_heads=1, scheme=L.T5Bias(), dtype=dtype)
    cache = layer.new_cache()
    layer(np.ones((2, 3, 8), dtype), cache=cache, causal=True)
    y, ctx = layer(np.ones((2, 0, 8), dtype), cache=cache, causal=True, return_context=True)
    expected = {"x": (2, 0, 8), "wq": (8, 8), "wk": (8, 4), "wv": (8, 4), "wo": (8, 8), "scheme.table": (32, 2)}
    _assert_zero_gradients(layer.backward(ctx, np.ones((2, 0, 8), dtype)), expected, dtype)


@pytest.mark.parametrize("B, T", [(2, 0), (0, 3)])
def test_the_backward_of_an_empty_pass_of_the_subclasses_is_zero_gradients(B, T):
    # QKNormAttention with its gate (wg (d_model, H*D)) and value norm, and MLA: both failed in NumPy.
    qk = QKNormAttention(8, 2, gate="feature", v_norm=True, bias=True)
    expected = {"x": (B, T, 8), "wq": (8, 8), "wk": (8, 8), "wv": (8, 8), "wo": (8, 8), "bq": (8,), "bk": (8,),
                "bv": (8,), "bo": (8,), "q_norm": (4,), "k_norm": (4,), "wg": (8, 8), "bg": (8,)}
    y, ctx = qk(np.zeros((B, T, 8)), return_context=True)
    _assert_zero_gradients(qk.backward(ctx, np.zeros((B, T, 8))), expected, np.float64)
    mla = MultiHeadLatentAttention(8, 2, kv_lora_rank=3, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=3,
                                   scheme=DecoupledRotary())
    # wq (d_model, H (qk_nope + qk_rope)) = (8, 8), wkv_a (d_model, kv_lora_rank + qk_rope) = (8, 5), kv_a_norm
    # (kv_lora_rank,), wkv_b (kv_lora_rank, H (qk_nope + v)) = (3, 10), wo (H v, d_model) = (6, 8); no biases.
    expected = {"x": (B, T, 8), "wq": (8, 8), "wkv_a": (8, 5), "kv_a_norm": (3,), "wkv_b": (3, 10), "wo": (6, 8)}
    y, ctx = mla(np.zeros((B, T, 8)), causal=True, return_context=True)
    _assert_zero_gradients(mla.backward(ctx, np.zeros((B, T, 8))), expected, np.float64)
