"""Gradients of minipos.transformer_xl.

Each backward is checked three ways, none of which uses the backward's own algebra:
- central finite differences in float64 of L = <forward(args), dout> along random directions
  (every score here is linear in each argument, so the difference is exact up to rounding);
- torch.autograd through the same forwards written in torch: the reference ``_rel_shift``
  (kimiyoung/transformer-xl ``pytorch/mem_transformer.py``, pad / view / slice, here on the last
  two axes), and the per-pair definitional form of terms (b) + (d) with R built as the
  reference's ``PositionalEmbedding``;
- small cases worked by hand in the comments.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipos.transformer_xl import (
    position_scores,
    position_scores_backward,
    rel_shift,
    rel_shift_backward,
    xl_position_logits,
    xl_position_logits_backward,
    xl_scores,
    xl_scores_backward,
)

SETTINGS = settings(max_examples=40, deadline=None)


def assert_directional(f, args, grads, dout, seed, h=1e-3):
    """<grad_i, e> == (L(.., a_i + h e, ..) - L(.., a_i - h e, ..)) / 2h for L = <f(*args), dout>,
    a random direction e per argument, relative error <= 1e-6."""
    rng = np.random.default_rng(seed)
    for i, grad in enumerate(grads):
        assert grad.shape == args[i].shape
        e = rng.standard_normal(args[i].shape)
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i] + h * e, args[i] - h * e
        numeric = (np.vdot(f(*plus), dout) - np.vdot(f(*minus), dout)) / (2 * h)
        analytic = np.vdot(grad, e)
        floor = max(1e-3 * np.linalg.norm(grad) * np.linalg.norm(e), 1e-12)
        assert abs(numeric - analytic) <= 1e-6 * max(abs(numeric), abs(analytic), floor), (i, numeric, analytic)


lead_dims = st.lists(st.integers(1, 2), max_size=2).map(tuple)


def xl_case(seed, lead, H, T, M, D):
    rng = np.random.default_rng(seed)
    S = T + M
    q = rng.standard_normal((*lead, H, T, D))
    k = rng.standard_normal((*lead, H, S, D))
    r = rng.standard_normal((H, S, D))
    u, v = rng.standard_normal((H, D)), rng.standard_normal((H, D))
    dout = rng.standard_normal((*lead, H, T, S))
    return q, k, r, u, v, dout


# ----------------------------------------------------------------------------- rel_shift


def test_rel_shift_backward_by_hand():
    # T = 2, S = 3. Forward: [0 | x] = [[0, a, b, c], [0, d, e, f]], flat 0 a b c 0 d e f, drop the
    # first T = 2: b c 0 d e f, so rel_shift(x) = [[b, c, 0], [d, e, f]].
    # Adjoint of dy = [[p, q, r], [s, t, w]]: T zeros in front, 0 0 p q r s t w, as (2, 4)
    # [[0, 0, p, q], [r, s, t, w]], drop the pad column: [[0, p, q], [s, t, w]].
    # Check: <rel_shift(x), dy> = bp + cq + 0r + ds + et + fw = <x, [[0, p, q], [s, t, w]]>;
    # r sits on the pad zero and reaches nothing, a is never read.
    x = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    np.testing.assert_array_equal(rel_shift(x), [[2, 3, 0], [4, 5, 6]])
    dy = np.array([[10.0, 20.0, 30.0], [40.0, 50.0, 60.0]])
    np.testing.assert_array_equal(rel_shift_backward(dy), [[0, 10, 20], [40, 50, 60]])


def test_rel_shift_backward_garbage_flows_to_the_next_row():
    # T = S = 3: [0 | x] flat 0 a b c 0 d e f 0 g h i, drop 3: c 0 d | e f 0 | g h i. out[0, 2] = d is
    # the next row's garbage, so dy[0, 2] flows to x[1, 0] (and dy[0, 1], dy[1, 2] on pad zeros vanish).
    dy = np.zeros((3, 3))
    dy[0, 2] = 1.0
    expected = np.zeros((3, 3))
    expected[1, 0] = 1.0
    np.testing.assert_array_equal(rel_shift_backward(dy), expected)
    dy = np.zeros((3, 3))
    dy[0, 1] = dy[1, 2] = 1.0
    np.testing.assert_array_equal(rel_shift_backward(dy), np.zeros((3, 3)))


@SETTINGS
@given(T=st.integers(1, 4), M=st.integers(0, 3))
def test_rel_shift_backward_is_the_transposed_matrix(T, M):
    """Column c of rel_shift's matrix is rel_shift(e_c); row c of the backward's is rel_shift_backward(e_c)."""
    S = T + M
    n = T * S
    basis = np.eye(n).reshape(n, T, S)
    forward = np.stack([rel_shift(e).ravel() for e in basis], axis=1)           # (n, n): out = F x
    backward = np.stack([rel_shift_backward(e).ravel() for e in basis], axis=1)  # (n, n): dx = G dy
    np.testing.assert_array_equal(backward, forward.T)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), lead=lead_dims, T=st.integers(1, 5), M=st.integers(0, 4))
def test_rel_shift_backward_adjoint_identity_and_finite_differences(seed, lead, T, M):
    rng = np.random.default_rng(seed)
    x, dy = rng.standard_normal((*lead, T, T + M)), rng.standard_normal((*lead, T, T + M))
    dx = rel_shift_backward(dy)
    assert dx.shape == x.shape
    assert math.isclose(np.vdot(rel_shift(x), dy), np.vdot(x, dx), rel_tol=1e-12, abs_tol=1e-12)
    assert_directional(rel_shift, (x,), (dx,), dy, seed)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), lead=lead_dims, T=st.integers(1, 5), M=st.integers(0, 4))
def test_rel_shift_backward_matches_torch_autograd(seed, lead, T, M):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    x, dy = rng.standard_normal((*lead, T, T + M)), rng.standard_normal((*lead, T, T + M))
    xt = torch.tensor(x, requires_grad=True)
    (grad,) = torch.autograd.grad(torch_rel_shift(torch, xt), xt, torch.tensor(dy))
    np.testing.assert_allclose(rel_shift_backward(dy), grad.numpy(), rtol=0, atol=0)


def torch_rel_shift(torch, x):
    """The reference ``_rel_shift`` (zero_pad, cat, view(klen + 1, qlen), [1:], view_as) on (..., T, S)."""
    *lead, T, S = x.shape
    padded = torch.nn.functional.pad(x, (1, 0))  # (..., T, S+1)  [0 | x]
    padded = padded.view(*lead, S + 1, T)
    return padded[..., 1:, :].reshape(*lead, T, S)


# ----------------------------------------------------------------------------- position_scores, xl_scores


def test_position_scores_backward_by_hand():
    # H = D = 1, T = S = 2 (M = 0), q = (1, 2), v = 0, r = (10, 20): r[0] is distance 1, r[1] distance 0.
    # out[0, 0] = q0 r1 = 20, out[1, 0] = q1 r0 = 20, out[1, 1] = q1 r1 = 40; out[0, 1] is the pad 0.
    # L = <out, dout> = q0 r1 p + q1 r0 s + q1 r1 t with dout = [[p, g], [s, t]] = [[1, 100], [3, 5]]:
    # dq0 = r1 p = 20, dq1 = r0 s + r1 t = 30 + 100 = 130, dr0 = q1 s = 6, dr1 = q0 p + q1 t = 11,
    # dv = dq0 + dq1 = 150; g = 100 sits on the pad zero and reaches nothing.
    q = np.array([[[1.0], [2.0]]])
    r = np.array([[[10.0], [20.0]]])
    v = np.array([[0.0]])
    np.testing.assert_array_equal(position_scores(q, r, v), [[[20, 0], [20, 40]]])
    dq, dr, dv = position_scores_backward(q, r, v, np.array([[[1.0, 100.0], [3.0, 5.0]]]))
    np.testing.assert_array_equal(dq, [[[20], [130]]])
    np.testing.assert_array_equal(dr, [[[6], [11]]])
    np.testing.assert_array_equal(dv, [[150]])


def test_xl_scores_backward_by_hand():
    # H = T = S = D = 1: out = (q + u) k + (q + v) r = (2 + 7) 3 + (2 + 11) 5 = 92; for dout = 1:
    # dq = k + r = 8, dk = q + u = 9, dr = q + v = 13, du = k = 3, dv = r = 5.
    one = lambda x: np.array([[[float(x)]]])  # noqa: E731
    q, k, r, u, v = one(2), one(3), one(5), np.array([[7.0]]), np.array([[11.0]])
    assert xl_scores(q, k, r, u, v)[0, 0, 0] == 92
    grads = xl_scores_backward(q, k, r, u, v, one(1))
    assert [float(g.ravel()[0]) for g in grads] == [8, 9, 13, 3, 5]


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), lead=lead_dims, H=st.integers(1, 2), T=st.integers(1, 4),
       M=st.integers(0, 3), D=st.integers(1, 3))
def test_position_scores_backward_finite_differences(seed, lead, H, T, M, D):
    q, _, r, _, v, dout = xl_case(seed, lead, H, T, M, D)
    assert_directional(position_scores, (q, r, v), position_scores_backward(q, r, v, dout), dout, seed)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), lead=lead_dims, H=st.integers(1, 2), T=st.integers(1, 4),
       M=st.integers(0, 3), D=st.integers(1, 3))
def test_xl_scores_backward_finite_differences(seed, lead, H, T, M, D):
    q, k, r, u, v, dout = xl_case(seed, lead, H, T, M, D)
    assert_directional(xl_scores, (q, k, r, u, v), xl_scores_backward(q, k, r, u, v, dout), dout, seed)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), lead=lead_dims, H=st.integers(1, 2), T=st.integers(1, 4),
       M=st.integers(0, 3), D=st.integers(1, 3))
def test_xl_scores_backward_matches_torch_autograd(seed, lead, H, T, M, D):
    torch = pytest.importorskip("torch")
    q, k, r, u, v, dout = xl_case(seed, lead, H, T, M, D)
    qt, kt, rt, ut, vt = (torch.tensor(a, requires_grad=True) for a in (q, k, r, u, v))
    ac = (qt + ut[:, None, :]) @ kt.transpose(-1, -2)  # AC
    bd = torch_rel_shift(torch, (qt + vt[:, None, :]) @ rt.transpose(-1, -2))  # BD = _rel_shift(...)
    expected = torch.autograd.grad(ac + bd, (qt, kt, rt, ut, vt), torch.tensor(dout), retain_graph=True)
    for got, want in zip(xl_scores_backward(q, k, r, u, v, dout), expected):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    expected = torch.autograd.grad(bd, (qt, rt, vt), torch.tensor(dout))
    for got, want in zip(position_scores_backward(q, r, v, dout), expected):
        np.testing.assert_allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- xl_position_logits


def test_xl_position_logits_backward_by_hand():
    # d_model = 2: w_0 = 1, R_n = (sin n, cos n); H = D = 1 and w_r = (1, 0)^T, so W_R R_n = sin n.
    # q_positions = k_positions = (0, 1): distances n = [[0, -1], [1, 0]], distance 0 twice.
    # q = (1, 2), v = 0.5, dout = [[1, 2], [3, 4]]; out[i, j] = (q_i + v) sin n_ij.
    # dq_0 = 1 sin 0 + 2 sin(-1) = -2 sin 1, dq_1 = 3 sin 1 + 4 sin 0 = 3 sin 1, dv = dq_0 + dq_1 = sin 1,
    # dW_R = sum_ij dout_ij (q_i + v) R_{n_ij} = (1.5 + 10) R_0 + 3 R_{-1} + 7.5 R_1
    #      = (4.5 sin 1, 11.5 + 10.5 cos 1): the two pairs at distance 0 summed into one row.
    s1, c1 = math.sin(1.0), math.cos(1.0)
    q, v, w_r = np.array([[[1.0], [2.0]]]), np.array([[0.5]]), np.array([[1.0], [0.0]])
    dout = np.array([[[1.0, 2.0], [3.0, 4.0]]])
    dq, dv, dw_r = xl_position_logits_backward(q, v, w_r, [0, 1], [0, 1], dout)
    np.testing.assert_allclose(dq, [[[-2 * s1], [3 * s1]]], rtol=1e-15, atol=1e-15)
    np.testing.assert_allclose(dv, [[s1]], rtol=1e-15)
    np.testing.assert_allclose(dw_r, [[4.5 * s1], [11.5 + 10.5 * c1]], rtol=1e-15)


def test_xl_position_logits_backward_clamp_len_by_hand():
    # One query at 3, keys 0..3: distances 3, 2, 1, 0, clamp_len = 1 makes them 1, 1, 1, 0.
    # With q = 2, v = 0, dout = (1, 2, 3, 4): dW_R = 2 (1 + 2 + 3) R_1 + 2 * 4 R_0 = (12 sin 1, 12 cos 1 + 8).
    q, v, w_r = np.array([[[2.0]]]), np.array([[0.0]]), np.array([[1.0], [0.0]])
    dout = np.array([[[1.0, 2.0, 3.0, 4.0]]])
    _, _, dw_r = xl_position_logits_backward(q, v, w_r, [3], [0, 1, 2, 3], dout, clamp_len=1)
    np.testing.assert_allclose(dw_r, [[12 * math.sin(1.0)], [12 * math.cos(1.0) + 8]], rtol=1e-15)


positions = st.lists(st.integers(-12, 12), min_size=1, max_size=5)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), lead=lead_dims, H=st.integers(1, 2), D=st.integers(1, 3),
       half=st.integers(1, 3), qp=positions, kp=positions,
       clamp_len=st.none() | st.integers(1, 6), base=st.sampled_from([10000.0, 10.0]))
def test_xl_position_logits_backward_finite_differences(seed, lead, H, D, half, qp, kp, clamp_len, base):
    """Any positions: T != S, negative distances, repeated and clamped ones."""
    rng = np.random.default_rng(seed)
    q, v = rng.standard_normal((*lead, H, len(qp), D)), rng.standard_normal((H, D))
    w_r = rng.standard_normal((2 * half, H * D))
    dout = rng.standard_normal((*lead, H, len(qp), len(kp)))
    kw = dict(base=base, clamp_len=clamp_len)
    grads = xl_position_logits_backward(q, v, w_r, qp, kp, dout, **kw)
    assert_directional(lambda q, v, w_r: xl_position_logits(q, v, w_r, qp, kp, **kw), (q, v, w_r), grads, dout, seed)


def test_xl_position_logits_backward_cached_queries():
    """A cached step: T = 1 query at the cache length P = 6, keys 0 ... 6; and a memory segment."""
    rng = np.random.default_rng(1)
    for qp, kp in (([6], np.arange(7)), (np.arange(4, 7), 7)):
        q, v, w_r = rng.standard_normal((2, 3, len(qp), 2)), rng.standard_normal((3, 2)), rng.standard_normal((4, 6))
        dout = rng.standard_normal((2, 3, len(qp), 7))
        grads = xl_position_logits_backward(q, v, w_r, qp, kp, dout, clamp_len=4)
        assert_directional(lambda q, v, w_r: xl_position_logits(q, v, w_r, qp, kp, clamp_len=4),
                           (q, v, w_r), grads, dout, 1)


@SETTINGS
@given(seed=st.integers(0, 2 ** 32 - 1), lead=lead_dims, H=st.integers(1, 2), D=st.integers(1, 3),
       half=st.integers(1, 3), qp=positions, kp=positions, clamp_len=st.none() | st.integers(1, 6))
def test_xl_position_logits_backward_matches_torch_autograd(seed, lead, H, D, half, qp, kp, clamp_len):
    """Against the per-pair form (q_i + v) . (R_{i-j} W_R)_h in torch, R as ``PositionalEmbedding``."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(seed)
    T, S, d_model = len(qp), len(kp), 2 * half
    q, v = rng.standard_normal((*lead, H, T, D)), rng.standard_normal((H, D))
    w_r = rng.standard_normal((d_model, H * D))
    dout = rng.standard_normal((*lead, H, T, S))
    qt, vt, wt = (torch.tensor(a, requires_grad=True) for a in (q, v, w_r))
    n = torch.tensor(qp, dtype=torch.float64)[:, None] - torch.tensor(kp, dtype=torch.float64)[None, :]
    if clamp_len is not None:
        n = n.clamp(-clamp_len, clamp_len)
    inv_freq = 1 / (10000 ** (torch.arange(0.0, d_model, 2.0, dtype=torch.float64) / d_model))
    angles = n.reshape(-1, 1) * inv_freq  # (T*S, d_model/2)
    R = torch.cat([angles.sin(), angles.cos()], dim=-1)  # (T*S, d_model)  [sin | cos]
    r_ij = (R @ wt).view(T, S, H, D)
    out = torch.einsum("...htd,tshd->...hts", qt + vt[:, None, :], r_ij)
    expected = torch.autograd.grad(out, (qt, vt, wt), torch.tensor(dout))
    got = xl_position_logits_backward(q, v, w_r, qp, kp, dout, clamp_len=clamp_len)
    for g, want in zip(got, expected):
        np.testing.assert_allclose(g, want.numpy(), rtol=1e-10, atol=1e-12)


def test_xl_position_logits_backward_by_blocks_sums_to_the_whole():
    """The layer calls the forward per (query block, key block): dq by query block, dv and dw_r summed."""
    rng = np.random.default_rng(2)
    qp, kp = np.arange(3, 8), np.arange(8)
    q, v, w_r = rng.standard_normal((2, 2, 5, 3)), rng.standard_normal((2, 3)), rng.standard_normal((4, 6))
    dout = rng.standard_normal((2, 2, 5, 8))
    dq, dv, dw_r = xl_position_logits_backward(q, v, w_r, qp, kp, dout)
    dq_b, dv_b, dw_b = np.zeros_like(dq), 0, 0
    for qs in (slice(0, 2), slice(2, 5)):
        for ks in (slice(0, 3), slice(3, 8)):
            g = xl_position_logits_backward(q[..., qs, :], v, w_r, qp[qs], kp[ks], dout[..., qs, ks])
            dq_b[..., qs, :] += g[0]
            dv_b, dw_b = dv_b + g[1], dw_b + g[2]
    np.testing.assert_allclose(dq_b, dq, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dv_b, dv, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(dw_b, dw_r, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- dtypes, empty, bad input


def test_backwards_keep_each_input_dtype():
    q, k, r, u, v, dout = xl_case(3, (2,), 2, 3, 1, 2)
    q32, r32 = q.astype(np.float32), r.astype(np.float32)
    for got, want in zip(xl_scores_backward(q32, k, r32, u, v, dout), xl_scores_backward(q, k, r, u, v, dout)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert [g.dtype for g in xl_scores_backward(q32, k, r32, u, v, dout)] == [np.float32, np.float64, np.float32,
                                                                              np.float64, np.float64]
    assert rel_shift_backward(dout.astype(np.float32)).dtype == np.float32
    w_r = np.ones((4, 4), np.float32)
    grads = xl_position_logits_backward(q32, v, w_r, np.arange(1, 4), 4, dout)
    assert [g.dtype for g in grads] == [np.float32, np.float64, np.float32]


def test_backwards_of_empty_sequences_are_zero():
    q, v, w_r = np.zeros((1, 2, 0, 3)), np.ones((2, 3)), np.ones((4, 6))
    dq, dv, dw_r = xl_position_logits_backward(q, v, w_r, [], [1, 2], np.zeros((1, 2, 0, 2)))
    assert dq.shape == (1, 2, 0, 3) and not dv.any() and not dw_r.any()
    e = np.zeros((2, 0, 3))
    grads = xl_scores_backward(e, e, e, v, v, np.zeros((2, 0, 0)))
    assert [g.shape for g in grads] == [(2, 0, 3)] * 3 + [(2, 3)] * 2 and not grads[3].any()
    assert rel_shift_backward(np.zeros((0, 3))).shape == (0, 3)


def test_mismatched_dout_raises_naming_it():
    q, k, r, u, v, dout = xl_case(4, (), 2, 3, 1, 2)
    with pytest.raises(ValueError, match="dout"):
        position_scores_backward(q, r, v, dout[..., :-1])
    with pytest.raises(ValueError, match="dout"):
        xl_scores_backward(q, k, r, u, v, dout[None])
    with pytest.raises(ValueError, match="dout"):
        xl_position_logits_backward(q, v, np.ones((4, 4)), [0, 1, 2], [0, 1, 2], dout)
    with pytest.raises(ValueError, match="dy"):
        rel_shift_backward(np.ones((3, 2)))  # S < T: no rel_shift output has this shape
    with pytest.raises(ValueError, match="dy"):
        rel_shift_backward(np.ones(3))
    with pytest.raises(ValueError, match="dout"):
        xl_scores_backward(q, k, r, u, v, np.full(dout.shape, np.nan))
    with pytest.raises(ValueError, match="v"):
        xl_scores_backward(q, k, r, u, v[:1], dout)


def test_overflowing_gradient_raises():
    q, k, r, u, v, dout = xl_case(5, (), 1, 2, 0, 2)
    big = np.full(dout.shape, 3e38, np.float32)
    with pytest.raises(ValueError, match="gradient of q overflows float32"):
        xl_scores_backward(q.astype(np.float32) * 10, k, r, u, v, big)
