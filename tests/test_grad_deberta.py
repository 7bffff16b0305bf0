"""Gradients of minipos.deberta.

Each backward is checked against central finite differences in float64 of
L = <forward(args), dout> along random directions (every term is linear in each argument, so the
difference is exact up to rounding), against torch.autograd through the reference code's gathers
(HF transformers ``DisentangledSelfAttention.disentangled_attention_bias``: ``torch.gather`` on
``q @ pos_key^T`` for c2p, and on ``k @ pos_query^T`` followed by a transpose for p2c), and
against small cases worked by hand in the comments.
"""

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipos.deberta import (
    c2p_term,
    c2p_term_backward,
    disentangled_scores,
    disentangled_scores_backward,
    p2c_term,
    p2c_term_backward,
    relative_index,
    relative_positions,
)

SETTINGS = settings(max_examples=40, deadline=None)


def assert_directional(f, args, grads, dout, seed, h=1e-3):
    """<grad_i, e> == (L(.., a_i + h e, ..) - L(.., a_i - h e, ..)) / 2h for L = <f(*args), dout>,
    a random direction e per argument (skipping a None gradient), relative error <= 1e-6."""
    rng = np.random.default_rng(seed)
    for i, grad in enumerate(grads):
        if grad is None:
            continue
        assert grad.shape == args[i].shape
        e = rng.standard_normal(args[i].shape)
        plus, minus = list(args), list(args)
        plus[i], minus[i] = args[i] + h * e, args[i] - h * e
        numeric = (np.vdot(f(*plus), dout) - np.vdot(f(*minus), dout)) / (2 * h)
        analytic = np.vdot(grad, e)
        floor = max(1e-3 * np.linalg.norm(grad) * np.linalg.norm(e), 1e-12)
        assert abs(numeric - analytic) <= 1e-6 * max(abs(numeric), abs(analytic), floor), (i, numeric, analytic)


@st.composite
def cases(draw):
    """Shapes, positions (T != S, cached queries), plain or log-bucketed relative positions with small
    bucket_size / max_position, a small att_span (so clipping merges rows), a (T, S) or per-head index."""
    seed = draw(st.integers(0, 2 ** 32 - 1))
    lead = tuple(draw(st.lists(st.integers(1, 2), max_size=2)))
    H, D, att_span = draw(st.integers(1, 2)), draw(st.integers(1, 3)), draw(st.integers(1, 4))
    qp = draw(st.lists(st.integers(0, 24), min_size=1, max_size=4))
    kp = draw(st.lists(st.integers(0, 24), min_size=1, max_size=5))
    bucket_size = draw(st.sampled_from([-1, 2, 3, 4, 6, 8]))
    max_position = -1 if bucket_size < 0 else draw(st.integers(bucket_size // 2 + 2, 20))
    rel = relative_positions(qp, kp, bucket_size=bucket_size, max_position=max_position)  # (T, S)
    if draw(st.booleans()):  # one index per head, broadcast over ...
        rel = np.stack([rel if h % 2 == 0 else rel[::-1, ::-1] for h in range(H)])  # (H, T, S)
    rng = np.random.default_rng(seed)
    T, S = len(qp), len(kp)
    q, k = rng.standard_normal((*lead, H, T, D)), rng.standard_normal((*lead, H, S, D))
    pos_key, pos_query = rng.standard_normal((H, 2 * att_span, D)), rng.standard_normal((H, 2 * att_span, D))
    dout = rng.standard_normal((*lead, H, T, S))
    return seed, q, k, pos_key, pos_query, rel, att_span, dout


pos_att_types = st.sampled_from([(), ("c2p",), ("p2c",), ("c2p", "p2c"), ("p2c", "c2p"), "p2c|c2p"])


# ----------------------------------------------------------------------------- by hand


def test_c2p_term_backward_by_hand():
    # att_span = 2: delta = clip(r + 2, 0, 3); r = (3, 2, -5) gives rows (3, 3, 0), row 3 twice.
    # H = T = D = 1, q = 2, pos_key rows (1, 2, 3, 4): out = (2*4, 2*4, 2*1) = (8, 8, 2).
    # dout = (1, 10, 100): dq = 1*4 + 10*4 + 100*1 = 144; dpos_key = q * (100, 0, 0, 1 + 10) = (200, 0, 0, 22).
    q, pos_key, rel = np.array([[[2.0]]]), np.array([[[1.0], [2.0], [3.0], [4.0]]]), np.array([[3, 2, -5]])
    np.testing.assert_array_equal(c2p_term(q, pos_key, rel, 2), [[[8, 8, 2]]])
    dq, dpos_key = c2p_term_backward(q, pos_key, rel, 2, np.array([[[1.0, 10.0, 100.0]]]))
    np.testing.assert_array_equal(dq, [[[144]]])
    np.testing.assert_array_equal(dpos_key, [[[200], [0], [0], [22]]])


def test_p2c_term_backward_by_hand():
    # att_span = 2, T = 2, S = 1, r = (0, 1): delta = (2, 3). k = 3, pos_query rows (1, 2, 3, 4):
    # out = (3*3, 3*4) = (9, 12). dout = (1, 10): dk = 1*3 + 10*4 = 43, dpos_query = k * (0, 0, 1, 10).
    k, pos_query, rel = np.array([[[3.0]]]), np.array([[[1.0], [2.0], [3.0], [4.0]]]), np.array([[0], [1]])
    np.testing.assert_array_equal(p2c_term(k, pos_query, rel, 2), [[[9], [12]]])
    dk, dpos_query = p2c_term_backward(k, pos_query, rel, 2, np.array([[[1.0], [10.0]]]))
    np.testing.assert_array_equal(dk, [[[43]]])
    np.testing.assert_array_equal(dpos_query, [[[0], [0], [3], [30]]])


def test_disentangled_scores_backward_by_hand():
    # H = T = S = D = 1, r = 0, att_span = 1: delta = 1. q = 2, k = 3, pos_key = (5, 7), pos_query = (11, 13).
    # out = (q k + q pos_key[1] + k pos_query[1]) / sqrt(3 D) = (6 + 14 + 39) / sqrt 3; for dout = 1:
    # dq = (k + 7) / sqrt 3, dk = (q + 13) / sqrt 3, dpos_key = (0, q) / sqrt 3, dpos_query = (0, k) / sqrt 3.
    # With c2p alone the scale is sqrt(2 D): dq = (k + 7) / sqrt 2, dk = q / sqrt 2, no pos_query gradient.
    q, k, rel, one = np.array([[[2.0]]]), np.array([[[3.0]]]), np.array([[0]]), np.array([[[1.0]]])
    pos_key, pos_query = np.array([[[5.0], [7.0]]]), np.array([[[11.0], [13.0]]])
    assert math.isclose(disentangled_scores(q, k, pos_key, pos_query, rel, att_span=1)[0, 0, 0], 59 / math.sqrt(3))
    dq, dk, dpk, dpq = disentangled_scores_backward(q, k, pos_key, pos_query, rel, one, att_span=1)
    r3, r2 = math.sqrt(3), math.sqrt(2)
    np.testing.assert_allclose([dq.item(), dk.item()], [10 / r3, 15 / r3], rtol=1e-15)
    np.testing.assert_allclose(dpk.ravel(), [0, 2 / r3], rtol=1e-15)
    np.testing.assert_allclose(dpq.ravel(), [0, 3 / r3], rtol=1e-15)
    dq, dk, dpk, dpq = disentangled_scores_backward(q, k, pos_key, None, rel, one, att_span=1, pos_att_type=("c2p",))
    np.testing.assert_allclose([dq.item(), dk.item()], [10 / r2, 2 / r2], rtol=1e-15)
    np.testing.assert_allclose(dpk.ravel(), [0, 2 / r2], rtol=1e-15)
    assert dpq is None


# ----------------------------------------------------------------------------- finite differences


@SETTINGS
@given(case=cases())
def test_c2p_and_p2c_backward_finite_differences(case):
    seed, q, k, pos_key, pos_query, rel, att_span, dout = case
    grads = c2p_term_backward(q, pos_key, rel, att_span, dout)
    assert_directional(lambda q, p: c2p_term(q, p, rel, att_span), (q, pos_key), grads, dout, seed)
    grads = p2c_term_backward(k, pos_query, rel, att_span, dout)
    assert_directional(lambda k, p: p2c_term(k, p, rel, att_span), (k, pos_query), grads, dout, seed)


@SETTINGS
@given(case=cases(), types=pos_att_types)
def test_disentangled_scores_backward_finite_differences(case, types):
    seed, q, k, pos_key, pos_query, rel, att_span, dout = case
    kw = dict(att_span=att_span, pos_att_type=types)
    dq, dk, dpk, dpq = disentangled_scores_backward(q, k, pos_key, pos_query, rel, dout, **kw)
    assert (dpk is None) == ("c2p" not in types) and (dpq is None) == ("p2c" not in types)
    f = lambda q, k, pk, pq: disentangled_scores(q, k, pk, pq, rel, **kw)  # noqa: E731
    assert_directional(f, (q, k, pos_key, pos_query), (dq, dk, dpk, dpq), dout, seed)


# ----------------------------------------------------------------------------- torch.autograd


def torch_terms(torch, q, k, pos_key, pos_query, idx):
    """c2p and p2c as the reference gathers them, for any T and S: idx (..., T, S) is delta(i, j)."""
    *lead, H, T, _ = q.shape
    S = k.shape[-2]
    c2p = torch.gather(q @ pos_key.transpose(-1, -2), -1, idx.expand(*lead, H, T, S))  # (..., H, T, S)
    p2c = torch.gather(k @ pos_query.transpose(-1, -2), -1,                               # (..., H, S, 2K)
                       idx.transpose(-1, -2).expand(*lead, H, S, T)).transpose(-1, -2)  # (..., H, T, S)
    return c2p, p2c


@SETTINGS
@given(case=cases(), types=pos_att_types)
def test_backwards_match_torch_autograd(case, types):
    torch = pytest.importorskip("torch")
    _, q, k, pos_key, pos_query, rel, att_span, dout = case
    ts = [torch.tensor(a, requires_grad=True) for a in (q, k, pos_key, pos_query)]
    idx = torch.tensor(relative_index(rel, att_span))  # clamp(r + att_span, 0, 2 att_span - 1)
    c2p, p2c = torch_terms(torch, *ts, idx)
    dout_t = torch.tensor(dout)
    want = torch.autograd.grad(c2p, (ts[0], ts[2]), dout_t, retain_graph=True)
    for got, w in zip(c2p_term_backward(q, pos_key, rel, att_span, dout), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-12, atol=1e-12)
    want = torch.autograd.grad(p2c, (ts[1], ts[3]), dout_t, retain_graph=True)
    for got, w in zip(p2c_term_backward(k, pos_query, rel, att_span, dout), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-12, atol=1e-12)
    names = ("c2p", "p2c") if types == "p2c|c2p" else types
    scores = ts[0] @ ts[1].transpose(-1, -2) + sum(t for n, t in (("c2p", c2p), ("p2c", p2c)) if n in names)
    scores = scores / math.sqrt(q.shape[-1] * (1 + len(names)))
    want = torch.autograd.grad(scores, ts, dout_t, allow_unused=True)
    got = disentangled_scores_backward(q, k, pos_key, pos_query, rel, dout, att_span=att_span, pos_att_type=types)
    for g, w in zip(got, want):
        assert (g is None) == (w is None)
        if g is not None:
            np.testing.assert_allclose(g, w.numpy(), rtol=1e-12, atol=1e-12)


def test_p2c_backward_matches_the_reference_code_literally():
    """T == S, log buckets: HF's ``p2c_pos = clamp(-r_pos + att_span)``, gathered at (j, i), then transposed."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(7)
    B, H, T, D, att_span = 2, 2, 9, 3, 4
    rel = relative_positions(T, T, bucket_size=8, max_position=10)  # build_relative_position, i - j, bucketed
    k, pos_query = rng.standard_normal((B, H, T, D)), rng.standard_normal((H, 2 * att_span, D))
    dout = rng.standard_normal((B, H, T, T))
    kt, pqt = torch.tensor(k, requires_grad=True), torch.tensor(pos_query, requires_grad=True)
    r_pos = torch.tensor(rel)
    p2c_pos = torch.clamp(-r_pos + att_span, 0, att_span * 2 - 1)
    p2c_att = torch.matmul(kt, pqt.transpose(-1, -2))
    p2c_att = torch.gather(p2c_att, dim=-1, index=p2c_pos.expand(B, H, T, T)).transpose(-1, -2)
    want = torch.autograd.grad(p2c_att, (kt, pqt), torch.tensor(dout))
    for got, w in zip(p2c_term_backward(k, pos_query, rel, att_span, dout), want):
        np.testing.assert_allclose(got, w.numpy(), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- dtypes, empty, bad input


def test_backwards_keep_each_input_dtype_and_handle_empty_sequences():
    rng = np.random.default_rng(3)
    q, k = rng.standard_normal((2, 3, 2)).astype(np.float32), rng.standard_normal((2, 4, 2))
    pk, pq = rng.standard_normal((2, 4, 2)), rng.standard_normal((2, 4, 2)).astype(np.float32)
    rel, dout = relative_positions(np.arange(1, 4), 4), rng.standard_normal((2, 3, 4))
    got = disentangled_scores_backward(q, k, pk, pq, rel, dout, att_span=2)
    assert [g.dtype for g in got] == [np.float32, np.float64, np.float64, np.float32]
    want = disentangled_scores_backward(q.astype(float), k, pk, pq.astype(float), rel, dout, att_span=2)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
    empty = disentangled_scores_backward(q[:, :0], k, pk, pq, rel[:0], dout[:, :0], att_span=2)
    assert [g.shape for g in empty] == [(2, 0, 2), (2, 4, 2), (2, 4, 2), (2, 4, 2)]
    assert not any(g.any() for g in empty)


def test_mismatched_dout_raises_naming_it():
    rng = np.random.default_rng(4)
    q, k, pk = rng.standard_normal((1, 2, 3, 2)), rng.standard_normal((1, 2, 4, 2)), rng.standard_normal((2, 4, 2))
    rel, dout = relative_positions(3, 4), rng.standard_normal((1, 2, 3, 4))
    with pytest.raises(ValueError, match="dout"):
        c2p_term_backward(q, pk, rel, 2, dout[..., :-1])
    with pytest.raises(ValueError, match="dout"):
        p2c_term_backward(k, pk, rel, 2, dout[0])
    with pytest.raises(ValueError, match="dout"):
        disentangled_scores_backward(q, k, pk, pk, rel, dout[:, :1], att_span=2)
    with pytest.raises(ValueError, match="dout"):
        disentangled_scores_backward(q, k, pk, pk, rel, np.full(dout.shape, np.inf), att_span=2)
    with pytest.raises(ValueError, match="pos_key"):
        c2p_term_backward(q, pk[:, :3], rel, 2, dout)
    with pytest.raises(ValueError, match="relative_pos"):
        disentangled_scores_backward(q, k, pk, pk, rel.T, dout, att_span=2)


def test_overflowing_gradient_raises():
    q, pk = np.full((1, 1, 1), 3e38, np.float32), np.full((1, 2, 1), 10.0, np.float32)
    with pytest.raises(ValueError, match="gradient of q overflows float32"):
        c2p_term_backward(q, pk, np.array([[0]]), 1, np.full((1, 1, 1), 1e38, np.float32))
