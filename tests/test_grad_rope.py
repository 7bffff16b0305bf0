"""The gradient of RoPE: ``apply_rope_backward`` = f R(m)^T dy on the rotated features, dy on the rest.

Expected values come from central finite differences of ``apply_rope`` (float64), from the
definitional matrix ``rotation_matrix`` transposed, from a case worked by hand (D = 2, m = 1,
theta = pi/2), and from torch autograd through HF's ``rotate_half`` expression and Meta's
complex-multiplication form (when torch is installed).
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos import attention as A
from minipos.rope import apply_rope, apply_rope_backward, rope_inv_freq, rotation_matrix

# Central differences with h = 1e-6 in float64. apply_rope is linear in x, so the truncation
# error is zero and only rounding remains: eps * sum|y * W| / h ~ 1e-10 of the magnitude of
# f = sum(y * W) for entries of order 1 (as drawn here). The tolerance is 1e-6 relative to
# max(|<grad, e>|, 1e-3 sum|y * W|): the floor is ten times that noise.
STEP = 1e-6
RTOL = 1e-6


def _check_directional(fun, x, grad, rng, magnitude, name):
    e = rng.standard_normal(np.shape(x))
    fd = (fun(x + STEP * e) - fun(x - STEP * e)) / (2 * STEP)
    an = float(np.sum(grad * e))
    err = abs(fd - an)
    assert err <= RTOL * max(abs(an), 1e-3 * magnitude), (
        f"d{name}: <grad, e> = {an!r}, finite difference = {fd!r}, |error| = {err:.3g}")


@st.composite
def rope_problems(draw):
    lead = draw(st.sampled_from([(), (3,), (2, 3)]))
    T = draw(st.integers(1, 6))
    D = draw(st.integers(1, 6)) * 2
    rotary_dim = draw(st.one_of(st.none(), st.integers(1, D // 2).map(lambda r: 2 * r)))
    R = D if rotary_dim is None else rotary_dim
    freq = draw(st.sampled_from(["default", "base", "inv_freq"]))
    keywords = dict(layout=draw(st.sampled_from(["interleaved", "half"])), rotary_dim=rotary_dim,
                    attention_factor=draw(st.sampled_from([1.0, 0.6, 1.7])))
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    if freq == "base":
        keywords["base"] = 500.0
    elif freq == "inv_freq":
        keywords["inv_freq"] = rng.uniform(0.01, 2.0, R // 2)          # a scaling variant's frequencies
    positions = draw(st.lists(st.integers(-300, 300), min_size=T, max_size=T))   # negative allowed
    return dict(x=rng.standard_normal((*lead, T, D)), dy=rng.standard_normal((*lead, T, D)),
                positions=np.array(positions), keywords=keywords, rng=rng)


@settings(max_examples=80, deadline=None)
@given(p=rope_problems())
def test_apply_rope_backward_matches_finite_differences(p):
    x, W, pos, kw = p["x"], p["dy"], p["positions"], p["keywords"]
    dx = apply_rope_backward(W, pos, **kw)
    assert dx.shape == x.shape and dx.dtype == np.float64
    f = lambda x_: float(np.sum(apply_rope(x_, pos, **kw) * W))  # noqa: E731
    _check_directional(f, x, dx, p["rng"], float(np.sum(np.abs(apply_rope(x, pos, **kw) * W))), "x")


@settings(max_examples=60, deadline=None)
@given(p=rope_problems())
def test_apply_rope_backward_is_f_times_the_transposed_matrix(p):
    # The definitional form: dx[t] = f R(m_t)^T dy[t] on the first R features, dy[t] beyond them.
    dy, pos, kw = p["dy"], p["positions"], p["keywords"]
    D = dy.shape[-1]
    R = D if kw["rotary_dim"] is None else kw["rotary_dim"]
    dx = apply_rope_backward(dy, pos, **kw)
    inv_freq = kw.get("inv_freq", rope_inv_freq(R, base=kw.get("base", 10000.0)))
    f = kw["attention_factor"]
    for t, m in enumerate(pos):
        Rm = rotation_matrix(int(m), R, layout=kw["layout"], inv_freq=inv_freq)
        np.testing.assert_allclose(dx[..., t, :R], f * dy[..., t, :R] @ Rm, rtol=1e-12, atol=1e-12)   # (R^T dy)^T = dy^T R
        np.testing.assert_array_equal(dx[..., t, R:], dy[..., t, R:])


@settings(max_examples=40, deadline=None)
@given(p=rope_problems())
def test_rope_backward_undoes_rope_up_to_the_factor_squared(p):
    # R(m)^T R(m) = I, so backward(forward(x)) = f^2 x on the rotated part and x on the rest.
    x, pos, kw = p["x"], p["positions"], p["keywords"]
    R = x.shape[-1] if kw["rotary_dim"] is None else kw["rotary_dim"]
    back = apply_rope_backward(apply_rope(x, pos, **kw), pos, **kw)
    np.testing.assert_allclose(back[..., :R], kw["attention_factor"] ** 2 * x[..., :R], rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(back[..., R:], x[..., R:])


def test_apply_rope_backward_by_hand():
    # D = 2, m = 1, theta = pi/2: R(1) = B(pi/2) = [[0, -1], [1, 0]] (rotation by +90 degrees),
    # so R^T = [[0, 1], [-1, 0]] is the rotation by -90 degrees: (a, b) -> (b, -a).
    # dy = (1, 2) -> dx = (2, -1); with attention factor 2, dx = (4, -2). At D = 2 both layouts
    # pair features (0, 1), so they agree.
    kw = dict(inv_freq=np.array([math.pi / 2]))
    for layout in ("interleaved", "half"):
        got = apply_rope_backward(np.array([[1.0, 2.0]]), [1], layout=layout, **kw)
        np.testing.assert_allclose(got, [[2.0, -1.0]], rtol=0, atol=1e-15)
        got = apply_rope_backward(np.array([[1.0, 2.0]]), [1], layout=layout, attention_factor=2.0, **kw)
        np.testing.assert_allclose(got, [[4.0, -2.0]], rtol=0, atol=1e-15)
    # m = -1 rotates the other way: R(-1)^T = R(1) = (a, b) -> (-b, a): (1, 2) -> (-2, 1).
    np.testing.assert_allclose(apply_rope_backward(np.array([[1.0, 2.0]]), [-1], **kw), [[-2.0, 1.0]],
                               rtol=0, atol=1e-15)
    # Partial rotary, D = 4, rotary_dim = 2: features 2 and 3 pass through untouched.
    got = apply_rope_backward(np.array([[1.0, 2.0, 3.0, 4.0]]), [1], rotary_dim=2, attention_factor=2.0, **kw)
    np.testing.assert_allclose(got, [[4.0, -2.0, 3.0, 4.0]], rtol=0, atol=1e-15)
    # D = 4, half layout, theta = (pi/2, pi): pairs (0, 2) at +90 degrees and (1, 3) at 180 degrees.
    # R^T: (x0, x2) -> (x2, -x0) and (x1, x3) -> (-x1, -x3). dy = (1, 2, 3, 4) -> (3, -2, -1, -4).
    got = apply_rope_backward(np.array([[1.0, 2.0, 3.0, 4.0]]), [1], layout="half",
                              inv_freq=np.array([math.pi / 2, math.pi]))
    np.testing.assert_allclose(got, [[3.0, -2.0, -1.0, -4.0]], rtol=0, atol=1e-15)
    # ... and interleaved pairs (0, 1) at +90 and (2, 3) at 180: (2, -1, -3, -4).
    got = apply_rope_backward(np.array([[1.0, 2.0, 3.0, 4.0]]), [1], layout="interleaved",
                              inv_freq=np.array([math.pi / 2, math.pi]))
    np.testing.assert_allclose(got, [[2.0, -1.0, -3.0, -4.0]], rtol=0, atol=1e-15)


@settings(max_examples=30, deadline=None)
@given(p=rope_problems(), seed=st.integers(0, 2 ** 32 - 1), S=st.integers(1, 5))
def test_rope_then_attention_chain_matches_finite_differences(p, seed, S):
    # The rotate seam in training: q and k are rotated, attended, and the gradient of the raw
    # q, k is apply_rope_backward of attention_backward's dq, dk.
    kw, qpos = p["keywords"], p["positions"]
    rng = np.random.default_rng(seed)
    q = p["x"]
    T, D = q.shape[-2:]
    k = rng.standard_normal((*q.shape[:-2], S, D))
    v = rng.standard_normal((*q.shape[:-2], S, 3))
    W = rng.standard_normal((*q.shape[:-2], T, 3))
    kpos = rng.integers(-300, 300, S)

    def f(q_=q, k_=k):
        return float(np.sum(A.attention(apply_rope(q_, qpos, **kw), apply_rope(k_, kpos, **kw), v) * W))

    dq, dk, _, _ = A.attention_backward(apply_rope(q, qpos, **kw), apply_rope(k, kpos, **kw), v, W)
    magnitude = float(np.sum(np.abs(A.attention(apply_rope(q, qpos, **kw), apply_rope(k, kpos, **kw), v) * W)))
    _check_directional(lambda x: f(q_=x), q, apply_rope_backward(dq, qpos, **kw), rng, magnitude, "q")
    _check_directional(lambda x: f(k_=x), k, apply_rope_backward(dk, kpos, **kw), rng, magnitude, "k")


# ----------------------------------------------------------------------------- torch autograd


def _torch_rope_half(torch, x, pos, inv_freq, factor, R):
    """HF's ``apply_rotary_pos_emb`` / ``rotate_half`` expression (GPT-NeoX, LLaMA), in torch:
    ``emb = cat(freqs, freqs)``, ``cos = emb.cos() * factor``, ``x * cos + rotate_half(x) * sin``,
    on the first R features (HF's partial rotary keeps the rest as they are)."""
    freqs = torch.outer(torch.tensor(pos, dtype=torch.float64), torch.tensor(inv_freq))
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos() * factor, emb.sin() * factor

    def rotate_half(t):
        t1, t2 = t[..., : t.shape[-1] // 2], t[..., t.shape[-1] // 2:]
        return torch.cat((-t2, t1), dim=-1)

    x_rot, x_pass = x[..., :R], x[..., R:]
    return torch.cat((x_rot * cos + rotate_half(x_rot) * sin, x_pass), dim=-1)


def _torch_rope_interleaved(torch, x, pos, inv_freq, factor, R):
    """Meta LLaMA's ``apply_rotary_emb``: pairs (2i, 2i+1) as complex numbers times
    ``polar(factor, m theta_i)``."""
    freqs = torch.outer(torch.tensor(pos, dtype=torch.float64), torch.tensor(inv_freq))
    rot = torch.polar(torch.full_like(freqs, factor), freqs)                  # f e^{i m theta}
    x_rot, x_pass = x[..., :R], x[..., R:]
    xc = torch.view_as_complex(x_rot.reshape(*x_rot.shape[:-1], R // 2, 2).contiguous())
    y = torch.view_as_real(xc * rot).reshape(x_rot.shape)
    return torch.cat((y, x_pass), dim=-1)


@settings(max_examples=30, deadline=None)
@given(p=rope_problems())
def test_apply_rope_backward_matches_torch_autograd(p):
    torch = pytest.importorskip("torch")
    x, dy, pos, kw = p["x"], p["dy"], p["positions"], p["keywords"]
    D = x.shape[-1]
    R = D if kw["rotary_dim"] is None else kw["rotary_dim"]
    inv_freq = kw.get("inv_freq", rope_inv_freq(R, base=kw.get("base", 10000.0)))
    form = _torch_rope_half if kw["layout"] == "half" else _torch_rope_interleaved
    tx = torch.tensor(x, requires_grad=True)
    y = form(torch, tx, pos, inv_freq, kw["attention_factor"], R)
    np.testing.assert_allclose(y.detach().numpy(), apply_rope(x, pos, **kw), rtol=1e-12, atol=1e-12)
    (y * torch.tensor(dy)).sum().backward()
    np.testing.assert_allclose(apply_rope_backward(dy, pos, **kw), tx.grad.numpy(), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- errors


def test_apply_rope_backward_refuses_what_apply_rope_refuses():
    dy = np.ones((3, 4))
    with pytest.raises(ValueError, match="positions"):
        apply_rope_backward(dy, [0, 1])                                # 2 positions for T = 3
    with pytest.raises(ValueError, match="rotary_dim"):
        apply_rope_backward(dy, 3, rotary_dim=6)
    with pytest.raises(ValueError, match="even"):
        apply_rope_backward(np.ones((3, 5)), 3)
    with pytest.raises(ValueError, match="inv_freq"):
        apply_rope_backward(dy, 3, inv_freq=np.ones(3))
    with pytest.raises(ValueError, match="dy"):
        apply_rope_backward(np.ones(4), 1)
