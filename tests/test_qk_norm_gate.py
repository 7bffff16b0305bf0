"""The output gate of ``minipos.qk_norm.QKNormAttention`` (Qwen3.5's per feature, LFM3's per head) and the heads'
output norm before it (Muse Spark's ``o_norm``): hand-worked
forward cases, the backward of its weights against central finite differences, switching it off, bad input.
The layers read from configs are checked against transformers' own modules in the interop tests."""

import numpy as np
import pytest

from minipos.layer import MultiHeadAttention
from minipos.qk_norm import QKNormAttention, sigmoid
from minipos.rope_scaling import Rotary

from _gradcheck import check_layer_gradients, layer_parameters


def _one_token(gate, **kw):
    # One head, D = 2, one token x = (1, 0): the only key is the token itself, so attention's output is its value
    # v = x wv = (3, 4) whatever q and k are; wo = I, so y = v * sigmoid(g).
    layer = QKNormAttention(2, 1, gate=gate, **kw)
    layer.wv, layer.wo = np.array([[3.0, 4.0], [0.0, 0.0]]), np.eye(2)
    return layer


def test_feature_gate_by_hand():
    # g = x wg = (0, ln 3): sigmoid(0) = 1/2, sigmoid(ln 3) = 1 / (1 + 1/3) = 3/4, so y = (3/2, 3).
    layer = _one_token("feature")
    layer.wg = np.array([[0.0, np.log(3.0)], [5.0, 5.0]])
    y = layer(np.array([[[1.0, 0.0]]]), causal=True)
    np.testing.assert_allclose(y[0, 0], [1.5, 3.0], rtol=1e-12)
    # with a bias bg = (ln 3, -ln 3): g = (ln 3, 0), gates (3/4, 1/2), y = (9/4, 2)
    layer = _one_token("feature", bias=True)
    layer.wg, layer.bg = np.array([[0.0, np.log(3.0)], [5.0, 5.0]]), np.array([np.log(3.0), -np.log(3.0)])
    layer.bq = layer.bk = layer.bv = layer.bo = None
    np.testing.assert_allclose(layer(np.array([[[1.0, 0.0]]]), causal=True)[0, 0], [2.25, 2.0], rtol=1e-12)


def test_head_gate_by_hand():
    # One gate for the head: g = x wg = ln 3, sigmoid = 3/4 on both features: y = (9/4, 3).
    layer = _one_token("head")
    assert layer.wg.shape == (2, 1) and layer.bg is None
    layer.wg = np.array([[np.log(3.0)], [7.0]])
    np.testing.assert_allclose(layer(np.array([[[1.0, 0.0]]]), causal=True)[0, 0], [2.25, 3.0], rtol=1e-12)


def test_head_gate_scales_each_head_by_its_own_gate():
    # Two heads of D = 1, d_model 2, one token x = (1, 0): values v = (2, 6) (head 0, head 1); gates from g = (0, ln 2):
    # sigmoid = (1/2, 2/3), so the merged heads are (1, 4) and wo = I gives y = (1, 4).
    layer = QKNormAttention(2, 2, head_dim=1, gate="head")
    layer.wv, layer.wo = np.array([[2.0, 6.0], [0.0, 0.0]]), np.eye(2)
    layer.wg = np.array([[0.0, np.log(2.0)], [0.0, 0.0]])
    np.testing.assert_allclose(layer(np.array([[[1.0, 0.0]]]))[0, 0], [1.0, 4.0], rtol=1e-12)


def test_output_norm_by_hand():
    # o_norm: the head's output v = (3, 4) RMS-normed without weight, (3, 4) / sqrt((9 + 16) / 2 + eps): with eps = 0.5
    # the root is sqrt(13) (a hand value: 12.5 + 0.5 = 13), so y = (3, 4) / sqrt(13); with the feature gate of
    # test_feature_gate_by_hand after it, y = (3/2, 3) / sqrt(13): the norm comes first, the gate then scales it.
    layer = _one_token(None, o_norm=True, norm_eps=0.5)
    x = np.array([[[1.0, 0.0]]])
    np.testing.assert_allclose(layer(x, causal=True)[0, 0], np.array([3.0, 4.0]) / np.sqrt(13.0), rtol=1e-12)
    layer = _one_token("feature", o_norm=True, norm_eps=0.5)
    layer.wg = np.array([[0.0, np.log(3.0)], [5.0, 5.0]])
    np.testing.assert_allclose(layer(x, causal=True)[0, 0], np.array([1.5, 3.0]) / np.sqrt(13.0), rtol=1e-12)
    layer.o_norm = False                                               # switched off: test_feature_gate_by_hand's
    np.testing.assert_allclose(layer(x, causal=True)[0, 0], [1.5, 3.0], rtol=1e-12)


def test_output_norm_normalises_each_head_alone():
    # Two heads of D = 2: outputs (3, 4) and (0.6, 0.8) have RMS sqrt(12.5) and sqrt(0.5); normed (eps tiny) both
    # become (3, 4) / sqrt(12.5) = (0.848528..., 1.131370...).
    layer = QKNormAttention(2, 2, head_dim=2, o_norm=True, norm_eps=1e-300)
    layer.wv = np.array([[3.0, 4.0, 0.6, 0.8], [0.0, 0.0, 0.0, 0.0]])
    layer.wo = np.eye(4)[:, :2] + np.eye(4)[:, 2:]                    # y = head 0 + head 1
    y = layer(np.array([[[1.0, 0.0]]]))[0, 0]
    np.testing.assert_allclose(y, 2 * np.array([3.0, 4.0]) / np.sqrt(12.5), rtol=1e-12)


@pytest.mark.parametrize("gate, block", [(None, None), ("feature", 2), ("head", None)])
def test_output_norm_backward_matches_finite_differences(gate, block):
    rng = np.random.default_rng(8)
    layer = QKNormAttention(16, 4, num_kv_heads=2, scheme=Rotary(layout="half"), norm_eps=1e-5, o_norm=True,
                            gate=gate, block_size=block, seed=4)
    x, dy = rng.standard_normal((2, 5, 16)), rng.standard_normal((2, 5, 16))
    params = {**layer_parameters(layer), "q_norm": layer.q_norm, "k_norm": layer.k_norm,
              **({"wg": layer.wg} if gate else {})}
    check_layer_gradients(layer, x, dy, lambda x, **kw: layer(x, causal=True, **kw), rng, params=params)


def test_sigmoid_is_finite_at_extremes():
    np.testing.assert_allclose(sigmoid(np.array([-800.0, 0.0, 800.0, np.log(3.0)])), [0.0, 0.5, 1.0, 0.75],
                               rtol=1e-15, atol=0)


@pytest.mark.parametrize("gate, bias, block", [("feature", True, None), ("head", False, None), ("feature", False, 2),
                                               ("head", True, 3)])
def test_gate_backward_matches_finite_differences(gate, bias, block):
    rng = np.random.default_rng(7)
    layer = QKNormAttention(16, 4, num_kv_heads=2, scheme=Rotary(layout="half"), norm_offset=1.0, norm_eps=1e-5,
                            gate=gate, bias=bias, block_size=block, seed=2)
    layer.q_norm, layer.k_norm = rng.uniform(-0.5, 0.5, 4), rng.uniform(-0.5, 0.5, 4)
    if bias:
        layer.bg = rng.standard_normal(layer.bg.shape)
    x, dy = rng.standard_normal((2, 5, 16)), rng.standard_normal((2, 5, 16))
    params = {**layer_parameters(layer), "q_norm": layer.q_norm, "k_norm": layer.k_norm, "wg": layer.wg,
              **({"bg": layer.bg} if bias else {})}
    check_layer_gradients(layer, x, dy, lambda x, **kw: layer(x, causal=True, **kw), rng, params=params)


def test_gate_switched_off_is_the_plain_layer():
    # The gate's weight is drawn after wq, wk, wv, wo: one seed gives the same projections with or without it.
    gated = QKNormAttention(16, 4, scheme=Rotary(), seed=3, gate="feature", bias=True)
    gated.q_norm = gated.k_norm = gated.wg = gated.bg = None
    plain = MultiHeadAttention(16, 4, scheme=Rotary(), seed=3, bias=True)
    x, dy = np.random.default_rng(1).standard_normal((2, 2, 6, 16))
    np.testing.assert_array_equal(gated(x, causal=True), plain(x, causal=True))
    grads = gated.backward(gated(x, causal=True, return_context=True)[1], dy)
    assert "wg" not in grads and "bg" not in grads
    assert "gate" not in repr(gated) and dict(gated.configuration())["gate"] is None


def test_context_of_a_gated_pass_is_refused_by_the_layer_without_the_gate():
    layer = QKNormAttention(8, 2, gate="head", seed=1)
    x = np.random.default_rng(2).standard_normal((1, 3, 8))
    _, ctx = layer(x, return_context=True)
    layer.wg = None
    with pytest.raises(ValueError, match="gate='head'"):
        layer.backward(ctx, np.ones_like(x))


def test_bad_gates_are_refused():
    with pytest.raises(ValueError, match="gate must be None, 'feature'"):
        QKNormAttention(8, 2, gate="elementwise")
    with pytest.raises(TypeError, match="gate must be"):
        QKNormAttention(8, 2, gate=True)
    layer = QKNormAttention(8, 2, gate="feature", bias=True)
    x = np.zeros((1, 2, 8))
    layer.wg = np.zeros((8, 2))                                          # the per-head shape on a per-feature gate
    with pytest.raises(ValueError, match=r"wg must have shape \(d_model, num_heads \* head_dim\) = \(8, 8\)"):
        layer(x)
    layer.wg = None                                                      # bg left on
    with pytest.raises(ValueError, match="bg is set but wg is None"):
        layer(x)
    layer.wg, layer.bg = np.full((8, 8), np.nan), None
    with pytest.raises(ValueError, match="output gate's logits"):
        layer(np.ones((1, 2, 8)))
