"""Gradient of xPos (minipos.xpos.apply_xpos_backward).

Checked against central finite differences in float64 (xPos is linear in x, so the difference is
exact up to rounding), against torch.autograd through xPos written in torch the way
microsoft/torchscale's ``XPOS`` computes it (``fixed_pos_embedding``, ``duplicate_interleave``,
``rotate_every_two``, the scale multiplying cos and sin), and against a case worked by hand.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipos.xpos import apply_xpos, apply_xpos_backward

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def cases(draw):
    seed = draw(st.integers(0, 2 ** 32 - 1))
    lead = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    D = 2 * draw(st.integers(1, 4))
    positions = draw(st.lists(st.integers(-600, 600), min_size=1, max_size=5))
    kw = dict(base=draw(st.sampled_from([10000.0, 500.0])), scale_base=draw(st.sampled_from([512, 64.0])),
              downscale=draw(st.booleans()), scale_offset=draw(st.integers(-50, 50)))
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((*lead, len(positions), D))
    return seed, x, np.array(positions), kw, rng.standard_normal(x.shape)


def test_by_hand():
    # D = 4, one position n = 1, base 10000: w = (1, 10000^(-1/2)) = (1, 0.01),
    # zeta = ((0 + 1.6) / 5.6, (2 + 1.6) / 5.6) = (2/7, 9/14), s_i = zeta_i^(1/512) for a query.
    # y = s R(1) x, so dx = s R(1)^T dy; R^T of a pair [[c, -s], [s, c]] is [[c, s], [-s, c]]:
    # dy = (1, 0, 0, 1) gives dx = (s_0 cos 1, -s_0 sin 1, s_1 sin 0.01, s_1 cos 0.01).
    s0, s1 = (2 / 7) ** (1 / 512), (9 / 14) ** (1 / 512)
    dy = np.array([[1.0, 0.0, 0.0, 1.0]])
    want = [s0 * math.cos(1), -s0 * math.sin(1), s1 * math.sin(0.01), s1 * math.cos(0.01)]
    np.testing.assert_allclose(apply_xpos_backward(dy, [1]), [want], rtol=1e-14)
    # a key (downscale) at n = 1 with scale_offset = 3: exponent -(1 - 3) = 2, s_i = zeta_i^(2/512)
    s0, s1 = (2 / 7) ** (2 / 512), (9 / 14) ** (2 / 512)
    want = [s0 * math.cos(1), -s0 * math.sin(1), s1 * math.sin(0.01), s1 * math.cos(0.01)]
    np.testing.assert_allclose(apply_xpos_backward(dy, [1], downscale=True, scale_offset=3), [want], rtol=1e-14)


@SETTINGS
@given(case=cases())
def test_finite_differences(case):
    seed, x, positions, kw, dy = case
    dx = apply_xpos_backward(dy, positions, **kw)
    assert dx.shape == x.shape
    e = np.random.default_rng(seed).standard_normal(x.shape)
    h = 1e-3
    numeric = (np.vdot(apply_xpos(x + h * e, positions, **kw), dy)
               - np.vdot(apply_xpos(x - h * e, positions, **kw), dy)) / (2 * h)
    analytic = np.vdot(dx, e)
    floor = max(1e-3 * np.linalg.norm(dx) * np.linalg.norm(e), 1e-12)
    assert abs(numeric - analytic) <= 1e-6 * max(abs(numeric), abs(analytic), floor)


def torch_xpos(torch, x, positions, *, base, scale_base, downscale, scale_offset):
    """torchscale's XPOS forward on (..., T, D), its centring replaced by an explicit scale_offset."""
    D = x.shape[-1]
    pos = torch.tensor(positions, dtype=torch.float64)
    zeta = (torch.arange(0, D, 2, dtype=torch.float64) + 0.4 * D) / (1.4 * D)
    scale = zeta ** ((pos - scale_offset) / scale_base)[:, None]  # (T, D/2)
    if downscale:
        scale = 1 / scale
    inv_freq = 1.0 / (base ** (torch.arange(0, D // 2, dtype=torch.float64) / (D // 2)))  # fixed_pos_embedding
    sinusoid = pos[:, None] * inv_freq
    sin = (sinusoid.sin() * scale).repeat_interleave(2, dim=-1)  # duplicate_interleave
    cos = (sinusoid.cos() * scale).repeat_interleave(2, dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    rotated = torch.stack((-x2, x1), dim=-1).flatten(-2)  # rotate_every_two
    return x * cos + rotated * sin


@SETTINGS
@given(case=cases())
def test_matches_torch_autograd(case):
    torch = pytest.importorskip("torch")
    _, x, positions, kw, dy = case
    xt = torch.tensor(x, requires_grad=True)
    out = torch_xpos(torch, xt, positions, **kw)
    np.testing.assert_allclose(out.detach().numpy(), apply_xpos(x, positions, **kw), rtol=1e-10, atol=1e-12)
    (want,) = torch.autograd.grad(out, xt, torch.tensor(dy))
    np.testing.assert_allclose(apply_xpos_backward(dy, positions, **kw), want.numpy(), rtol=1e-10, atol=1e-12)


def test_dtype_count_positions_and_empty():
    dy = np.random.default_rng(1).standard_normal((2, 3, 4))
    got = apply_xpos_backward(dy.astype(np.float32), 3, downscale=True)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, apply_xpos_backward(dy, np.arange(3), downscale=True), rtol=1e-5, atol=1e-6)
    assert apply_xpos_backward(np.zeros((2, 0, 4)), 0).shape == (2, 0, 4)


def test_bad_input_raises_naming_the_argument():
    dy = np.ones((2, 3, 4))
    with pytest.raises(ValueError, match="dy"):
        apply_xpos_backward(dy, [0, 1])           # T = 3 rows, 2 positions
    with pytest.raises(ValueError, match="dy"):
        apply_xpos_backward(dy, 4)
    with pytest.raises(ValueError, match="dy"):
        apply_xpos_backward(np.ones((3, 5)), 3)   # odd D
    with pytest.raises(ValueError, match="dy"):
        apply_xpos_backward(np.full((3, 4), np.nan), 3)
    with pytest.raises(TypeError, match="downscale"):
        apply_xpos_backward(dy[0], 3, downscale="yes")
    # a key: zeta_0^(-n/g) = 3.5^(10000/512) ~ 4e10, times 1e30 beyond float32's largest value
    with pytest.raises(ValueError, match="dy"):
        apply_xpos_backward(np.full((1, 2), 1e30, np.float32), [10000], downscale=True)
