"""The layer, reference and fast, hardened:

1. NaN or inf in the output projection's weights (and in any weight a backward multiplies by) is an
   ``Overflow`` naming it, never a NaN output or a gradient blamed on the scheme;
2. the backward of an empty pass (``B`` or ``T`` 0), which the forward accepts, gives zero gradients
   of the right shapes: an empty output depends on nothing;
3. a context records the scheme's settings (``Scheme.settings()``: ScaledQueryRotary's beta and L, RoPE's
   base and scaling, T5's buckets, ...), so ``backward`` refuses one from a pass under other settings.
"""

import numpy as np
import pytest

import minipos.fast as fast
from minipos import layer as L
from minipos import schemes
from minipos._checks import Overflow
from minipos.mla import DecoupledRotary, MultiHeadLatentAttention
from minipos.mrope import MRotary
from minipos.prope import ProportionalRotary
from minipos.qk_norm import QKNormAttention
from minipos.query_scale import ScaledQueryRotary
from minipos.seams import NoPE
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


# --- 3. the scheme's settings in the configuration a context records ---------------------------------------------

@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("setting, other", [("beta", dict(beta=0.2)), ("original_max_position_embeddings",
                                                                       dict(original_max_position_embeddings=2))])
def test_a_query_scale_context_of_another_beta_or_length_is_refused(make, setting, other):
    # Before: accepted, and the gradients came out with this layer's s(p), not the pass's.
    args = dict(beta=0.1, original_max_position_embeddings=4, layout="half")
    ours = make(8, 2, scheme=ScaledQueryRotary(**args), seed=5)
    same = L.MultiHeadAttention(8, 2, scheme=ScaledQueryRotary(**args), seed=5)
    theirs = L.MultiHeadAttention(8, 2, scheme=ScaledQueryRotary(**{**args, **other}), seed=5)
    x = np.random.default_rng(1).standard_normal((1, 9, 8))
    y, ctx = theirs(x, causal=True, return_context=True)
    with pytest.raises(ValueError, match=rf"ctx comes from .*another configuration: scheme\.{setting}="):
        ours.backward(ctx, np.ones_like(y))
    y, ctx = same(x, causal=True, return_context=True)                      # the same settings: taken
    np.testing.assert_allclose(ours.backward(ctx, np.ones_like(y))["x"], same.backward(ctx, np.ones_like(y))["x"],
                               rtol=1e-12, atol=1e-14)


def test_a_setting_changed_between_forward_and_backward_is_refused():
    layer = L.MultiHeadAttention(8, 2, scheme=ScaledQueryRotary(beta=0.1, original_max_position_embeddings=4))
    y, ctx = layer(X, return_context=True)
    layer.scheme.beta = 0.5                                                 # read at each call
    with pytest.raises(ValueError, match=r"scheme\.beta=0\.1 \(this layer: 0\.5\)"):
        layer.backward(ctx, np.ones_like(y))


OTHER_SETTINGS = {                                                          # id: (setting, ours, theirs)
    "rope-base": ("base", lambda: L.Rotary(), lambda: L.Rotary(base=500000.0)),
    "rope-scaling": ("scaling_args", lambda: L.Rotary(scaling={"rope_type": "linear", "factor": 2.0}),
                     lambda: L.Rotary(scaling={"rope_type": "linear", "factor": 4.0})),
    "alibi": ("symmetric", lambda: L.ALiBi(), lambda: L.ALiBi(symmetric=False)),
    "t5": ("max_distance", lambda: L.T5Bias(num_buckets=8, max_distance=16),
           lambda: L.T5Bias(num_buckets=8, max_distance=4)),
    "xpos": ("scale_base", lambda: L.XPos(), lambda: L.XPos(scale_base=64)),
    "transformer-xl": ("base", lambda: L.TransformerXL(), lambda: L.TransformerXL(base=100.0)),
    "deberta": ("pos_att_type", lambda: L.DeBERTa(position_buckets=4, max_relative_positions=8),
                lambda: L.DeBERTa(position_buckets=4, max_relative_positions=8, pos_att_type="c2p")),
    "sinusoidal": ("base", lambda: L.Sinusoidal(), lambda: L.Sinusoidal(base=100.0)),
    "nope-temperature": ("floor_scale", lambda: L.NoPETemperature(floor_scale=4),
                         lambda: L.NoPETemperature(floor_scale=2)),
    "fire": ("init_L", lambda: L.FIRE(init_L=4.0), lambda: L.FIRE(init_L=8.0)),
    "p-rope": ("factor", lambda: L.ProportionalRotary(partial_rotary_factor=0.5),
               lambda: L.ProportionalRotary(partial_rotary_factor=0.5, factor=8.0)),
    "decomposed": ("height", lambda: L.DecomposedRelPos(height=2, width=4),
                   lambda: L.DecomposedRelPos(height=4, width=2)),
}


@pytest.mark.parametrize("make", LAYERS)
@pytest.mark.parametrize("setting, ours, theirs", OTHER_SETTINGS.values(), ids=OTHER_SETTINGS)
def test_a_context_of_other_scheme_settings_is_refused(make, setting, ours, theirs):
    # Before: every one of these was accepted (only the scheme's class was recorded), the gradients
    # computed with this layer's scheme for a pass run with another.
    layer, other = make(8, 2, scheme=ours(), seed=2), make(8, 2, scheme=theirs(), seed=2)
    y, ctx = other(X, causal=True, return_context=True)
    with pytest.raises(ValueError, match=rf"another configuration: .*scheme\.{setting}="):
        layer.backward(ctx, np.ones_like(y))


NOT_SETTINGS = {"learned": {"std"}, "fire": {"init_c"}, "deberta": {"max_position_embeddings"}}
"""Keyword arguments that are no setting: ``std`` and ``init_c`` only draw a learned parameter's first
value; DeBERTa's ``max_position_embeddings`` enters only through ``att_span``, which is one."""


@pytest.mark.parametrize("name", list(registered()))
def test_every_keyword_of_a_registered_scheme_is_among_its_settings(name):
    # A scheme registered later that forgets settings() fails here, not silently in a backward.
    entry = schemes.ENTRIES[name]
    sc = entry.cls(**entry.example(16))
    L.MultiHeadAttention(8, 2, scheme=sc)                                   # bound: settings resolved
    missing = set(schemes.config_keys(entry.cls)) - {n for n, _ in sc.settings()} - NOT_SETTINGS.get(name, set())
    assert not missing, f"{entry.cls.__name__}.settings() leaves out {sorted(missing)}"


class _Settings(NoPE):
    name = "settings-test"

    def __init__(self, settings):
        self._settings = settings

    def settings(self):
        return self._settings


@pytest.mark.parametrize("settings, exc, words", [
    ((("w", np.ones(2)),), TypeError, "a tuple of \\(name, value\\) pairs"),
    ({"w": 1.0}, TypeError, "must return a tuple"),
    ((("w", 1.0, 2.0),), TypeError, "must return a tuple"),
    (((1, 1.0),), TypeError, "must return a tuple"),
    ((("w", 1.0), ("w", 2.0)), ValueError, "names a setting twice"),
])
def test_settings_that_are_not_plain_pairs_are_named(settings, exc, words):
    # Before: settings() did not exist; an array among them would make the context check ambiguous.
    layer = L.MultiHeadAttention(8, 2, scheme=_Settings(settings))
    with pytest.raises(exc, match=rf"_Settings\.settings\(\) \(scheme 'settings-test'\).*{words}"):
        layer(X, return_context=True)


def test_an_empty_pass_through_the_output_norm_and_gate():
    # QKNormAttention(o_norm=True) reshaped the heads' output with -1, which NumPy cannot infer when B or T is 0.
    layer = QKNormAttention(8, 2, o_norm=True, gate="head")
    for shape in ((0, 3, 8), (2, 0, 8)):
        y, ctx = layer(np.zeros(shape), causal=True, return_context=True)
        assert y.shape == shape
        grads = layer.backward(ctx, y)
        assert grads["x"].shape == shape and grads["wg"].shape == (8, 2) and not grads["wg"].any()


@pytest.mark.parametrize("make", [
    lambda **kw: L.Rotary(layout="half", **kw),
    lambda **kw: L.Rotary(scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 4}, **kw),
    lambda **kw: MRotary(mrope_section=[2, 1, 1], **kw),
    lambda **kw: ProportionalRotary(partial_rotary_factor=0.5, **kw),          # 0.25 of 8: one pair, at 1 rad/token
])
def test_a_base_set_after_the_layer_was_built_takes_effect(make):
    # These schemes compute their frequencies once, at bind: a base set afterwards changed the recorded settings
    # (so backward refused an older context) but not the forward. It now gives a fresh layer's output of that base.
    x = np.random.default_rng(0).standard_normal((1, 5, 16))
    positions = np.arange(5) if make().position_streams == 1 else np.stack([np.arange(5)] * 3)
    layer, fresh = L.MultiHeadAttention(16, 2, scheme=make()), L.MultiHeadAttention(16, 2, scheme=make(base=50.0))
    before = layer(x, positions=positions)
    layer.scheme.base = 50.0
    np.testing.assert_array_equal(layer(x, positions=positions), fresh(x, positions=positions))
    assert not np.allclose(before, fresh(x, positions=positions))
