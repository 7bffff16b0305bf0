"""``minipos.query_scale``: the query scale of ``llama_4_scaling_beta`` (Ministral 3), by hand and in a layer.

The formula is transformers 5.24's ``get_llama_4_attn_scale`` (models/ministral3/modeling_ministral3.py):
``1 + beta * log(1 + floor(position_ids / original_max_position_embeddings))``; the expected values below are
worked by hand from it. The layer is compared with transformers' Ministral3Attention in test_config_interop.py."""

import math

import numpy as np
import pytest

from minipos.layer import MultiHeadAttention
from minipos.query_scale import (ScaledQueryRotary, apply_query_scale, apply_query_scale_backward,
                                 llama4_query_scale)


def test_the_scale_by_hand():
    # Ministral 3's beta 0.1 and L 16384: 1 below L, 1 + 0.1 ln 2 from L, 1 + 0.1 ln 4 from 3L (floor = 3).
    s = llama4_query_scale([0, 16383, 16384, 32767, 49152], beta=0.1, original_max_position_embeddings=16384)
    np.testing.assert_allclose(s, [1.0, 1.0, 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(2), 1 + 0.1 * math.log(4)],
                               rtol=1e-15)
    # Llama 4's temperature counts i + 1 (irope.attn_temperature); this one counts p: p = L - 1 is not scaled.
    assert llama4_query_scale([3], beta=1.0, original_max_position_embeddings=4)[0] == 1.0


def test_the_queries_are_scaled_row_by_row_and_the_backward_is_the_same_diagonal():
    q = np.ones((2, 3, 4, 2))                                                       # (B, H, T, D)
    y = apply_query_scale(q, [0, 1, 2, 3], beta=0.5, original_max_position_embeddings=2)
    np.testing.assert_allclose(y[0, 0, :, 0], [1, 1, 1 + 0.5 * math.log(2), 1 + 0.5 * math.log(2)], rtol=1e-15)
    dy = np.random.default_rng(0).standard_normal(q.shape)
    dq = apply_query_scale_backward(dy, [0, 1, 2, 3], beta=0.5, original_max_position_embeddings=2)
    assert np.sum(y * dy) == pytest.approx(np.sum(q * dq), rel=1e-14)            # <Sq, dy> = <q, S dy>


def test_scaled_query_rotary_by_hand():
    # One pair (D = 2, half layout, theta_0 = 1): the query (1, 0) at p = 4 with L = 4, beta = 0.5 becomes
    # (1 + 0.5 ln 2) (cos 4, sin 4); the key is rotated only.
    scheme = ScaledQueryRotary(beta=0.5, original_max_position_embeddings=4, layout="half")
    MultiHeadAttention(2, 1, scheme=scheme)
    x = np.array([[[[1.0, 0.0]]]])                                                  # (B, H, T, D)
    s = 1 + 0.5 * math.log(2)
    np.testing.assert_allclose(scheme.rotate_q(x, [4], seq_len=5)[0, 0, 0], [s * math.cos(4), s * math.sin(4)],
                               rtol=1e-14)
    np.testing.assert_allclose(scheme.rotate_k(x, [4], seq_len=5)[0, 0, 0], [math.cos(4), math.sin(4)], rtol=1e-14)
    g = np.array([[[[0.3, -0.7]]]])
    back = scheme.rotate_q_backward(g, [4], seq_len=5)                              # the transpose of rotate_q
    assert np.sum(scheme.rotate_q(x, [4], seq_len=5) * g) == pytest.approx(np.sum(x * back), rel=1e-14)


def test_a_layer_trains_through_it():
    rng = np.random.default_rng(1)
    layer = MultiHeadAttention(8, 2, scheme=ScaledQueryRotary(beta=0.3, original_max_position_embeddings=2,
                                                              layout="half"))
    x, dy = rng.standard_normal((1, 5, 8)), rng.standard_normal((1, 5, 8))
    _, ctx = layer(x, causal=True, return_context=True)
    grad = layer.backward(ctx, dy)["wq"]
    e, h = rng.standard_normal(layer.wq.shape), 1e-6
    saved = layer.wq.copy()
    layer.wq = saved + h * e
    plus = layer(x, causal=True)
    layer.wq = saved - h * e
    minus = layer(x, causal=True)
    layer.wq = saved
    assert np.sum(grad * e) == pytest.approx(np.sum((plus - minus) * dy) / (2 * h), rel=1e-6)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"beta": -0.1}, ValueError, "beta"),
    ({"beta": "0.1"}, TypeError, "beta"),
    ({"original_max_position_embeddings": 0}, ValueError, "original_max_position_embeddings"),
    ({"original_max_position_embeddings": 2.5}, TypeError, "original_max_position_embeddings"),
])
def test_bad_arguments_are_named(kwargs, error, words):
    args = {"beta": 0.1, "original_max_position_embeddings": 4, **kwargs}
    with pytest.raises(error, match=words):
        llama4_query_scale([0, 1], **args)
    with pytest.raises(error, match=words):
        ScaledQueryRotary(**args)


def test_bad_shapes_and_positions_are_named():
    with pytest.raises(ValueError, match="positions"):
        llama4_query_scale([-1], beta=0.1, original_max_position_embeddings=4)
    with pytest.raises(ValueError, match="T = 2 rows"):
        apply_query_scale(np.ones((3, 4)), [0, 1], beta=0.1, original_max_position_embeddings=4)
    with pytest.raises(ValueError, match="q must have shape"):
        apply_query_scale(np.ones(4), [0], beta=0.1, original_max_position_embeddings=4)


def test_the_tour_measures_what_the_steps_imply():
    # The registry's example steps every L // 4 positions: the tour's shift of seq_len / 2 moves queries across
    # steps, so s(p) and the outputs change (proof query_scale.score); no table, so it runs at 4x. With every
    # query position below L the scale is 1 and the layer is RoPE, shift-invariant.
    from minipos import cli
    row = next(r for r in cli.tour(d_model=16, heads=2, seq_len=16) if r["scheme"] == "query-scale")
    assert (row["shift_invariant"], row["runs_at_4x"], row["position_params"]) == (False, True, 0)
    layer = MultiHeadAttention(16, 2, scheme=ScaledQueryRotary(beta=0.1, original_max_position_embeddings=200,
                                                               layout="half"), seed=1)
    x = np.random.default_rng(2).standard_normal((1, 8, 16))
    np.testing.assert_allclose(layer(x, positions=np.arange(8) + 100, causal=True), layer(x, causal=True),
                               rtol=1e-12, atol=1e-12)


def test_one_query_past_the_step_sharpens_its_row_by_s():
    # Two tokens, one head, D = 2, wq = wk = identity, x = (1, 0) at both: q = k = (1, 0) before RoPE. The query at
    # p = 1 with L = 1, beta = 1 has s = 1 + ln 2; its logits against keys 0 and 1 are s (1, 0).R(1 - j)(1, 0) / sqrt 2,
    # i.e. s cos(1) / sqrt 2 and s / sqrt 2 (half layout, theta_0 = 1): worked by hand from the definition.
    s = 1 + math.log(2)
    layer = MultiHeadAttention(2, 1, scheme=ScaledQueryRotary(beta=1.0, original_max_position_embeddings=1,
                                                              layout="half"))
    layer.wq, layer.wk, layer.wv, layer.wo = np.eye(2), np.eye(2), np.eye(2), np.eye(2)
    _, w = layer(np.array([[[1.0, 0.0], [1.0, 0.0]]]), causal=True, return_weights=True)
    logits = np.array([s * math.cos(1), s]) / math.sqrt(2)
    np.testing.assert_allclose(w[0, 0, 1], np.exp(logits) / np.exp(logits).sum(), rtol=1e-12)
    np.testing.assert_allclose(w[0, 0, 0], [1.0, 0.0], atol=0)                      # p = 0: one key
