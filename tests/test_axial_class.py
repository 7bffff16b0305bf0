"""2-D RoPE's class token turned by learned angles (``AxialRotary(class_angles=True)``, MLCD's ``class_pos_emb``):
a hand-worked rotation, HF's formula written out (``x cos + rotate_half(x) sin`` with ``cat([θ, θ])``), every gradient
against central finite differences (the angles' too), the angles mattering, the identity with the plain scheme at
θ = 0, and bad input named. The interop test against transformers' ``MLCDVisionModel`` is in
``test_config_interop_compass_qwen4.py``."""

import math

import numpy as np
import pytest

from minipos import axial
from minipos.layer import AxialRotary, MultiHeadAttention

from _gradcheck import check_layer_gradients


def test_hand_worked_class_token_and_a_patch():
    # D = 4, "qwen" layout: pairs (0, 2) and (1, 3). Token 0, the class token, turns pair 0 by θ_0 = π/2 and pair 1
    # by θ_1 = π: (x_0, x_2) = (1, 3) -> (1 cos π/2 - 3 sin π/2, 3 cos π/2 + 1 sin π/2) = (-3, 1);
    # (x_1, x_3) = (2, 4) -> (2 cos π - 4 sin π, 4 cos π + 2 sin π) = (-2, -4).
    # Token 1, a patch at row 1, column 2, base 100: f = (1,) (a 2-dim RoPE's), pair 0 by the row (angle 1), pair 1
    # by the column (angle 2): [1, 1, 0, 0] -> [cos 1, cos 2, sin 1, sin 2], whatever the class angles.
    x = np.array([[1.0, 2.0, 3.0, 4.0], [1.0, 1.0, 0.0, 0.0]])
    y = axial.apply_axial_rope(x, np.array([[0, 1], [0, 2]]), base=100.0, layout="qwen",
                               class_angles=[math.pi / 2, math.pi])
    np.testing.assert_allclose(y[0], [-3.0, -2.0, 1.0, -4.0], atol=1e-15)
    np.testing.assert_allclose(y[1], [math.cos(1), math.cos(2), math.sin(1), math.sin(2)], rtol=1e-15)
    # position_scale scales the patches' positions, not the class angles
    y = axial.apply_axial_rope(x, np.array([[0, 1], [0, 2]]), base=100.0, layout="qwen", position_scale=0.5,
                               class_angles=[math.pi / 2, math.pi])
    np.testing.assert_allclose(y[0], [-3.0, -2.0, 1.0, -4.0], atol=1e-15)
    np.testing.assert_allclose(y[1], [math.cos(0.5), math.cos(1), math.sin(0.5), math.sin(1)], rtol=1e-15)


def _rotate_half(x):
    h = x.shape[-1] // 2
    return np.concatenate([-x[..., h:], x[..., :h]], axis=-1)


def test_hf_formula_written_out():
    # MLCDVisionModel.forward: class_pos_emb (1, D/2) -> cat([θ, θ]), whose cos and sin come first, before the
    # patches' cat([freq_h, freq_w]) twice (freq over head_dim / 2: f_j = base^(-2j / (D/2))); then
    # apply_rotary_pos_emb_vision: q cos + rotate_half(q) sin. Written here without minipos.
    D, base, h, w = 8, 100.0, 2, 3
    rng = np.random.default_rng(0)
    x, theta = rng.standard_normal((2, 1 + h * w, D)), rng.standard_normal(D // 2)
    f = 1.0 / base ** (np.arange(0, D // 2, 2) / (D // 2))                       # (D/4,)
    rows, cols = np.repeat(np.arange(h), w), np.tile(np.arange(w), h)
    freq = np.concatenate([rows[:, None] * f, cols[:, None] * f], axis=-1)       # (h w, D/2)
    angles = np.concatenate([np.concatenate([theta, theta])[None], np.concatenate([freq, freq], axis=-1)])
    want = x * np.cos(angles) + _rotate_half(x) * np.sin(angles)
    got = axial.apply_axial_rope(x, axial.axial_positions(h, w, class_token="first"), base=base, layout="qwen",
                                 class_angles=theta)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-14)


def test_class_token_first_positions():
    np.testing.assert_array_equal(axial.axial_positions(2, 2, class_token="first"), [[0, 0, 0, 1, 1], [0, 0, 1, 0, 1]])
    np.testing.assert_array_equal(axial.axial_positions(2, 2, start=1, class_token="last"),
                                  axial.axial_positions(2, 2, start=1, class_token=True))


def _positions(layout, h=2, w=3):
    pos = axial.axial_positions(h, w, class_token="first")
    return np.vstack([np.zeros((1, pos.shape[1]), np.int64), pos]) if layout == "minimax_m3" else pos


@pytest.mark.parametrize("layout", axial.AXIAL_LAYOUTS)
def test_function_gradients_against_finite_differences(layout):
    # L = <dy, apply_axial_rope(x, θ)>: dL/dx = apply_axial_rope_backward(dy), dL/dθ = class_angles_backward
    # (R(θ + π/2) x on token 0), each against a central difference along a random direction.
    D = 14 if layout == "minimax_m3" else 8
    rng = np.random.default_rng(1)
    pos = _positions(layout)
    x, dy = rng.standard_normal((2, 3, pos.shape[1], D))
    theta = rng.standard_normal(len(axial.axial_pairs(D, layout=layout)[0]))

    def loss(x, theta):
        return float(np.sum(axial.apply_axial_rope(x, pos, layout=layout, base=50.0, class_angles=theta) * dy))
    h = 1e-6
    ex, et = rng.standard_normal(x.shape), rng.standard_normal(theta.shape)
    fd_x = (loss(x + h * ex, theta) - loss(x - h * ex, theta)) / (2 * h)
    fd_t = (loss(x, theta + h * et) - loss(x, theta - h * et)) / (2 * h)
    dx = axial.apply_axial_rope_backward(dy, pos, layout=layout, base=50.0, class_angles=theta)
    dtheta = axial.class_angles_backward(x, dy, theta, layout=layout)
    assert dtheta.shape == theta.shape
    assert math.isclose(float(np.sum(dx * ex)), fd_x, rel_tol=1e-7, abs_tol=1e-8)
    assert math.isclose(float(np.sum(dtheta * et)), fd_t, rel_tol=1e-7, abs_tol=1e-8)
    assert abs(fd_t) > 1e-2


@pytest.mark.parametrize("layout", axial.AXIAL_LAYOUTS)
@pytest.mark.parametrize("kv, block_size", [(2, None), (1, None), (2, 3)])
def test_layer_gradients_against_finite_differences(layout, kv, block_size):
    # Every gradient of the layer, "scheme.class_pos_emb" included (q's and k's class token both turn by it), dense
    # and blockwise, with and without grouped key/value heads.
    D = 12 if layout == "minimax_m3" else 8
    layer = MultiHeadAttention(16, 2, head_dim=D, num_kv_heads=kv, bias=True, block_size=block_size, seed=3,
                               scheme=AxialRotary(layout=layout, base=100.0, class_angles=True))
    rng = np.random.default_rng(2)
    pos = _positions(layout)
    x, dy = rng.standard_normal((2, 2, pos.shape[1], 16))
    check_layer_gradients(layer, x, dy, lambda x, **kw: layer(x, positions=pos, causal=False, **kw), rng)
    _, ctx = layer(x, positions=pos, causal=False, return_context=True)
    assert np.max(np.abs(layer.backward(ctx, dy)["scheme.class_pos_emb"])) > 1e-2


def test_the_angles_matter_and_zero_angles_are_the_plain_scheme():
    rng = np.random.default_rng(4)
    pos = axial.axial_positions(2, 3, class_token="first")
    x = rng.standard_normal((2, 7, 16))
    layer = MultiHeadAttention(16, 2, scheme=AxialRotary(layout="qwen", class_angles=True), seed=5)
    plain = MultiHeadAttention(16, 2, scheme=AxialRotary(layout="qwen"), seed=5)
    for name in ("wq", "wk", "wv", "wo"):
        setattr(plain, name, getattr(layer, name))
    assert layer.scheme.class_pos_emb.shape == (4,)
    y = layer(x, positions=pos)
    layer.scheme.class_pos_emb = layer.scheme.class_pos_emb + 0.3
    changed = layer(x, positions=pos)
    assert np.min(np.max(np.abs(changed - y), axis=-1)) > 1e-4          # every row: the class token is a key too
    layer.scheme.class_pos_emb = np.zeros(4)                            # θ = 0: the class token unrotated at (0, 0)
    np.testing.assert_allclose(layer(x, positions=pos), plain(x, positions=pos), rtol=0, atol=1e-14)


def test_settings_parameters_and_repr():
    on, off = AxialRotary(layout="qwen", class_angles=True), AxialRotary(layout="qwen")
    assert ("class_angles", True) in on.settings() and ("class_angles", False) in off.settings()
    assert repr(on) == "AxialRotary(layout='qwen', base=10000, class_angles=True)"
    a = MultiHeadAttention(8, 1, scheme=on)
    b = MultiHeadAttention(8, 1, scheme=off)
    assert list(a.scheme.parameters()) == ["class_pos_emb"] and b.scheme.parameters() == {}
    x = np.random.default_rng(0).standard_normal((1, 3, 8))
    _, ctx = b(x, positions=axial.axial_positions(1, 2, class_token="first"), return_context=True)
    with pytest.raises(ValueError, match="class_angles"):               # a context of the other configuration
        a.backward(ctx, np.ones((1, 3, 8)))


def _layer():
    return MultiHeadAttention(8, 1, scheme=AxialRotary(layout="qwen", class_angles=True))


X = np.ones((1, 3, 8))
POS = axial.axial_positions(1, 2, class_token="first")


def _after_cache():
    layer = _layer()
    cache = layer.new_cache()
    layer(X, positions=POS, cache=cache)
    layer(X[:, :1], positions=np.zeros((2, 1), np.int64), cache=cache)


@pytest.mark.parametrize("call, exc, words", [
    (lambda: axial.apply_axial_rope(np.ones((2, 4)), np.zeros((2, 2), int), layout="qwen", class_angles=[1.0]),
     ValueError, ["class_angles", "(2,)"]),
    (lambda: axial.apply_axial_rope(np.ones((2, 4)), np.zeros((2, 2), int), layout="qwen",
                                    class_angles=[1.0, np.nan]), ValueError, ["class_angles"]),
    (lambda: axial.apply_axial_rope(np.ones((2, 4)), np.array([[1, 0], [0, 0]]), layout="qwen",
                                    class_angles=[1.0, 2.0]), ValueError, ["positions[:, 0]", "class_token='first'"]),
    (lambda: axial.class_angles_backward(np.ones((2, 4)), np.ones((3, 4)), [1.0, 2.0], layout="qwen"),
     ValueError, ["dy", "shape"]),
    (lambda: axial.class_angles_backward(np.ones((2, 4)), np.ones((2, 4)), [1.0, 2.0, 3.0], layout="qwen"),
     ValueError, ["class_angles", "(2,)"]),
    (lambda: AxialRotary(class_angles=1), TypeError, ["class_angles"]),
    (lambda: axial.axial_positions(2, 2, class_token="middle"), ValueError, ["class_token", "'first'"]),
    (lambda: _layer()(X, positions=np.array([[0, 0, 1], [1, 0, 1]])), ValueError, ["positions[:, 0]"]),
    (_after_cache, ValueError, ["class_angles", "KV cache"]),
])
def test_bad_input_is_refused_naming_the_argument(call, exc, words):
    with pytest.raises(exc) as err:
        call()
    for w in words:
        assert w in str(err.value), (w, str(err.value))


def test_the_proof_fails_on_a_wrong_gradient(monkeypatch):
    # class_angles_backward with the derivative's sign flipped (R(θ - π/2), i.e. -dy · R(θ + π/2) x): the tie fails.
    pytest.importorskip("sympy")
    from _proof_support import proof_failure
    from proofs.core import TieMismatch

    good = axial.class_angles_backward
    err = proof_failure("axial.class_angles", monkeypatch, axial, "class_angles_backward",
                        lambda x, dy, theta, **kw: -good(x, dy, theta, **kw))
    assert isinstance(err, TieMismatch) and "gradient" in str(err)


def test_the_golden_case_of_the_class_angles_gradient_agrees_with_finite_differences():
    # spec/vectors/axial_rope_grad.json, case qwen_class_angles_d16: its recorded dclass_angles against a central
    # difference of <dy, apply_axial_rope(x, positions, class_angles=θ)> along each angle, from the recorded inputs.
    import json
    from pathlib import Path

    from minipos.vectors.codec import decode
    doc = json.loads((Path(__file__).resolve().parent.parent / "spec/vectors/axial_rope_grad.json").read_text())
    case = next(c for c in doc["cases"] if c["name"] == "qwen_class_angles_d16")
    x, dy, pos, theta = (decode(case["inputs"][k]) for k in ("x", "dy", "positions", "class_angles"))
    got = decode(case["expected"]["dclass_angles"])
    h = 1e-6

    def loss(t):
        return float(np.sum(axial.apply_axial_rope(x, pos, class_angles=t, **case["params"]) * dy))
    fd = [(loss(theta + h * e) - loss(theta - h * e)) / (2 * h) for e in np.eye(len(theta))]
    np.testing.assert_allclose(got, fd, rtol=1e-7, atol=1e-8)
    assert np.max(np.abs(got)) > 0.1
