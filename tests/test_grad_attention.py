"""Gradients of attention: ``softmax_backward``, ``attention_backward`` and the blockwise
(FlashAttention-2) ``blockwise_attention_backward``.

Where the expected values come from:

- central finite differences of the forward functions in float64 (the forward is the definition;
  the backward is checked against its derivative, not against itself);
- the dense backward for the blockwise one, and NumPy's own log-sum-exp of the dense logits for
  ``lse``;
- a case worked by hand (one query, two keys);
- torch autograd through ``torch.nn.functional.scaled_dot_product_attention`` (when torch is
  installed).
"""

import math
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos import attention as A
from minipos.fast import attention as FA

# ----------------------------------------------------------------------------- finite differences
#
# For a scalar f(x) = sum(forward(x) * W) and a random direction e, the central difference
# (f(x + h e) - f(x - h e)) / 2h equals <grad f, e> up to
#   truncation  h^2 |f'''| / 6        ~ 1e-12 for inputs of order 1 (h = 1e-6), and
#   rounding    eps * sum|f's terms| / h ~ 1e-10 * sum|out * W|.
# Inputs are drawn with entries of order 1 (standard normal q, k, v, bias; logits of a few units),
# so neither term comes near 1e-6 relative to a directional derivative of order 1. The rounding
# term does not shrink with the derivative, so the tolerance is 1e-6 relative to
# max(|<grad, e>|, 1e-3 sum|out * W|): the floor, 1e-9 sum|out * W|, is ten times the rounding
# noise (measured: at most ~1e-10 sum|out * W| here), and far below what a wrong gradient errs by.

STEP = 1e-6
RTOL = 1e-6


def _check_directional(fun, x, grad, rng, magnitude, name):
    e = rng.standard_normal(np.shape(x))
    plus, minus = fun(x + STEP * e), fun(x - STEP * e)
    fd = (plus - minus) / (2 * STEP)
    an = float(np.sum(np.asarray(grad) * e))
    err = abs(fd - an)
    noise = 1e-10          # float64 rounding of the two sums over 2h, seen up to 8e-12 where the gradient is 0
    assert err <= RTOL * max(abs(an), 1e-3 * magnitude) + noise, (
        f"d{name}: <grad, e> = {an!r}, finite difference = {fd!r}, |error| = {err:.3g} "
        f"(magnitude {magnitude:.3g})")


# ----------------------------------------------------------------------------- problems


@st.composite
def _sub_shape(draw, full):
    """A shape that broadcasts to ``full`` without enlarging it: a suffix of ``full`` with some
    dims set to 1."""
    n = draw(st.integers(0, len(full)))
    ones = draw(st.lists(st.booleans(), min_size=n, max_size=n))
    return tuple(1 if one else d for one, d in zip(ones, full[len(full) - n:]))


@st.composite
def attention_problems(draw, *, max_t=7, max_s=8):
    lead_kind = draw(st.sampled_from(["", "H", "BH"]))
    H, B = draw(st.integers(1, 3)), draw(st.integers(1, 2))
    lead = {"": (), "H": (H,), "BH": (B, H)}[lead_kind]
    T, S = draw(st.integers(1, max_t)), draw(st.integers(1, max_s))
    D, Dv = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    full = (*lead, T, S)
    rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))
    mask_kind = draw(st.sampled_from([None, "random", "causal", "padding", "dead_rows"]))
    mask = None
    if mask_kind == "random":
        mask = rng.random(draw(_sub_shape(full))) < 0.7
    elif mask_kind == "causal":
        mask = A.causal_mask(T, S)
    elif mask_kind == "padding":                                  # keys s < length per batch (or head) row
        lengths = rng.integers(0, S + 1, size=lead[:1] or (1,))
        mask = (np.arange(S) < lengths[:, None]).reshape(*(lead[:1] or (1,)), *(1,) * (len(full) - 2), S)
    elif mask_kind == "dead_rows":                                # some query rows see no key at all
        mask = rng.random(full) < 0.8
        mask[..., rng.random(T) < 0.5, :] = False
    bias = None
    if draw(st.booleans()):
        bias = rng.standard_normal(draw(_sub_shape(full)))
    return dict(
        q=rng.standard_normal((*lead, T, D)), k=rng.standard_normal((*lead, S, D)),
        v=rng.standard_normal((*lead, S, Dv)), dout=rng.standard_normal((*lead, T, Dv)),
        bias=bias, mask=mask, scale=draw(st.sampled_from([None, 1.0])), rng=rng)


def _dense_mask(p):
    """The problem's mask as an array broadcast to ``(..., T, S)`` (all True without one)."""
    shape = (*p["q"].shape[:-1], p["k"].shape[-2])
    return np.broadcast_to(True if p["mask"] is None else p["mask"], shape)


# ----------------------------------------------------------------------------- softmax_backward


@settings(max_examples=40, deadline=None)
@given(shape=st.lists(st.integers(1, 5), min_size=1, max_size=3), seed=st.integers(0, 2 ** 32 - 1),
       masked=st.booleans(), data=st.data())
def test_softmax_backward_matches_finite_differences(shape, seed, masked, data):
    rng = np.random.default_rng(seed)
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = rng.standard_normal(shape)
    if masked:                                                    # -inf entries, some slices entirely
        x[rng.random(shape) < 0.4] = -np.inf
    W = rng.standard_normal(shape)
    p = A.softmax(x, axis=axis)
    dx = A.softmax_backward(p, W, axis=axis)
    f = lambda x_: float(np.sum(A.softmax(x_, axis=axis) * W))  # noqa: E731
    _check_directional(f, x, np.where(np.isinf(x), 0.0, dx), rng, float(np.sum(np.abs(p * W))), "x")
    assert np.all(dx[np.isinf(x)] == 0)                          # p = 0 there: no gradient


def test_softmax_backward_by_hand():
    # p = [1/4, 3/4], dp = [0, 4]: sum(p * dp) = 3, dx = p * (dp - 3) = [1/4 * -3, 3/4 * 1].
    got = A.softmax_backward(np.array([0.25, 0.75]), np.array([0.0, 4.0]))
    np.testing.assert_allclose(got, [-0.75, 0.75], rtol=0, atol=1e-15)
    # A fully masked row (p = 0 throughout) gets exactly zero.
    assert np.all(A.softmax_backward(np.zeros(3), np.array([1.0, -2.0, 5.0])) == 0)


# ----------------------------------------------------------------------------- attention_backward


@settings(max_examples=80, deadline=None)
@given(p=attention_problems())
def test_attention_backward_matches_finite_differences(p):
    q, k, v, W, bias, mask, scale, rng = (p[n] for n in ("q", "k", "v", "dout", "bias", "mask", "scale", "rng"))
    dq, dk, dv, dbias = A.attention_backward(q, k, v, W, bias=bias, mask=mask, scale=scale)
    assert dq.shape == q.shape and dk.shape == k.shape and dv.shape == v.shape
    if bias is None:
        assert dbias is None
    else:
        assert np.shape(dbias) == bias.shape                     # summed to the bias's own shape

    def f(q_=q, k_=k, v_=v, b_=bias):
        return float(np.sum(A.attention(q_, k_, v_, bias=b_, mask=mask, scale=scale) * W))

    magnitude = float(np.sum(np.abs(A.attention(q, k, v, bias=bias, mask=mask, scale=scale) * W)))
    _check_directional(lambda x: f(q_=x), q, dq, rng, magnitude, "q")
    _check_directional(lambda x: f(k_=x), k, dk, rng, magnitude, "k")
    _check_directional(lambda x: f(v_=x), v, dv, rng, magnitude, "v")
    if bias is not None:
        _check_directional(lambda x: f(b_=x), bias, dbias, rng, magnitude, "bias")


@settings(max_examples=40, deadline=None)
@given(p=attention_problems(), data=st.data())
def test_fully_masked_rows_have_exactly_zero_gradients(p, data):
    q, k, v, dout = p["q"], p["k"], p["v"], p["dout"]
    *lead, T, S = (*q.shape[:-1], k.shape[-2])
    mask = np.array(_dense_mask(p))
    dead = p["rng"].random(T) < 0.5
    dead[data.draw(st.integers(0, T - 1))] = True                 # at least one row sees nothing
    mask[..., dead, :] = False
    bias = p["rng"].standard_normal((*lead, T, S))
    dq, dk, dv, dbias = A.attention_backward(q, k, v, dout, bias=bias, mask=mask, scale=p["scale"])
    assert np.all(dq[..., dead, :] == 0) and np.all(dbias[..., dead, :] == 0)
    # The dead rows' output gradient reaches nothing: zeroing it changes no bit of dk, dv.
    quiet = dout.copy()
    quiet[..., dead, :] = 0
    _, dk2, dv2, _ = A.attention_backward(q, k, v, quiet, bias=bias, mask=mask, scale=p["scale"])
    np.testing.assert_array_equal(dk, dk2)
    np.testing.assert_array_equal(dv, dv2)
    assert np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()


@pytest.mark.parametrize("bias_shape", [(2, 3, 4, 5), (3, 4, 5), (4, 5), (5,), (), (1, 1, 5), (3, 1, 1),
                                        (2, 1, 1, 1), (1,), (4, 1)])
def test_dbias_is_the_logit_gradient_summed_to_the_bias_shape(bias_shape):
    # The bias enters the logits S = scale q k^T + b; so dbias is dS summed over the axes the
    # bias was broadcast along. dS is recovered independently here from the full-shape bias.
    rng = np.random.default_rng(1)
    q, k, v = rng.standard_normal((2, 3, 4, 6)), rng.standard_normal((2, 3, 5, 6)), rng.standard_normal((2, 3, 5, 2))
    dout = rng.standard_normal((2, 3, 4, 2))
    bias = rng.standard_normal(bias_shape)
    _, _, _, ds = A.attention_backward(q, k, v, dout, bias=np.broadcast_to(bias, (2, 3, 4, 5)).copy())
    _, _, _, dbias = A.attention_backward(q, k, v, dout, bias=bias)
    assert np.shape(dbias) == bias_shape
    axes = tuple(range(4 - len(bias_shape))) + tuple(4 - len(bias_shape) + i for i, n in enumerate(bias_shape)
                                                      if n == 1)
    expected = ds.sum(axis=axes, keepdims=True).reshape(bias_shape)
    np.testing.assert_allclose(dbias, expected, rtol=1e-12, atol=1e-14)


def test_attention_backward_by_hand():
    # One query, two keys, scale 1, D = Dv = 1: q = 1, k = [0, ln 3], v = [0, 4], dO = 1.
    #   S = q k^T = [0, ln 3]            P = softmax(S) = [1, 3] / 4 = [1/4, 3/4]
    #   O = P V = 3
    #   dV = P^T dO = [1/4, 3/4]
    #   dP = dO V^T = [0, 4]             rowsum(dP * P) = 3 (= dO * O)
    #   dS = P * (dP - 3) = [-3/4, 3/4]
    #   dq = dS K = 3/4 ln 3             dk = dS^T q = [-3/4, 3/4]
    # With the logits given instead by a bias b = [0, ln 3] on q = k = 0: dbias = dS, dq = dk = 0.
    ln3 = math.log(3.0)
    q, k, v, dout = np.array([[1.0]]), np.array([[0.0], [ln3]]), np.array([[0.0], [4.0]]), np.array([[1.0]])
    assert A.attention(q, k, v, scale=1.0)[0, 0] == pytest.approx(3.0, abs=1e-15)
    dq, dk, dv, dbias = A.attention_backward(q, k, v, dout, scale=1.0)
    np.testing.assert_allclose(dv, [[0.25], [0.75]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(dq, [[0.75 * ln3]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(dk, [[-0.75], [0.75]], rtol=0, atol=1e-15)
    assert dbias is None
    zeros = np.zeros((1, 1)), np.zeros((2, 1))
    dq, dk, dv, dbias = A.attention_backward(*zeros, v, dout, bias=np.array([0.0, ln3]), scale=1.0)
    np.testing.assert_allclose(dbias, [-0.75, 0.75], rtol=0, atol=1e-15)
    np.testing.assert_allclose(dv, [[0.25], [0.75]], rtol=0, atol=1e-15)
    assert np.all(dq == 0) and np.all(dk == 0)
    # The default scale 1/sqrt(D): with D = 4 and q = [2, 0, 0, 0] the logits are k[:, 0], so the
    # same numbers come out, dq picking up the factor 1/2 = 1/sqrt(4).
    q4, k4 = np.array([[2.0, 0, 0, 0]]), np.array([[0.0, 0, 0, 0], [ln3, 0, 0, 0]])
    dq, dk, dv, _ = A.attention_backward(q4, k4, v, dout)
    np.testing.assert_allclose(dq, [[0.5 * 0.75 * ln3, 0, 0, 0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(dk, [[-0.75, 0, 0, 0], [0.75, 0, 0, 0]], rtol=0, atol=1e-15)
    np.testing.assert_allclose(dv, [[0.25], [0.75]], rtol=0, atol=1e-15)


# ----------------------------------------------------------------------------- blockwise

# The reference backward, and minipos.fast's (same arguments, equal up to rounding) where it exists.
BACKWARDS = [pytest.param(A.blockwise_attention_backward, id="reference")]
if hasattr(FA, "blockwise_attention_backward"):
    BACKWARDS.append(pytest.param(FA.blockwise_attention_backward, id="fast"))


def _block_slicer(a):
    """``fn(q_slice, k_slice)`` giving the block of ``a`` (broadcastable to ``(..., T, S)``)."""
    if a is None:
        return None
    a = a.reshape((1,) * (2 - a.ndim) + a.shape) if a.ndim < 2 else a
    return lambda qs, ks: a[..., qs if a.shape[-2] > 1 else slice(None), ks if a.shape[-1] > 1 else slice(None)]


class _BiasGrad:
    """A ``bias_grad_fn`` that sums each block's dS into the gradient of a bias of shape ``shape``."""

    def __init__(self, shape, lead):
        self.shape, self.lead = shape, lead
        self.grad = np.zeros((1,) * (len(lead) + 2 - len(shape)) + tuple(shape))

    def __call__(self, qs, ks, ds):
        assert ds.shape == (*self.lead, qs.stop - qs.start, ks.stop - ks.start)
        g = ds.sum(axis=tuple(i for i, n in enumerate(self.grad.shape) if n == 1), keepdims=True)
        self.grad[..., qs if self.grad.shape[-2] > 1 else slice(None),
                  ks if self.grad.shape[-1] > 1 else slice(None)] += g

    def result(self):
        return self.grad.reshape(self.shape)


@st.composite
def blockwise_problems(draw):
    p = draw(attention_problems(max_t=9, max_s=9))
    T, S = p["q"].shape[-2], p["k"].shape[-2]
    p["block_size"] = draw(st.integers(1, 10))                   # divides T and S or not, or exceeds them
    p["causal"], p["q_offset"] = False, None
    if draw(st.booleans()):                                       # causal, with or without a shift
        p["causal"] = True
        p["q_offset"] = draw(st.one_of(st.none(), st.integers(-3, S + 2)))
    offset = S - T if p["q_offset"] is None else p["q_offset"]
    p["dense_mask"] = _dense_mask(p)
    if p["causal"]:
        p["dense_mask"] = p["dense_mask"] & (np.arange(S)[None, :] <= np.arange(T)[:, None] + offset)
    return p


def _blockwise_call(p, bias):
    return dict(bias_fn=_block_slicer(bias), mask_fn=_block_slicer(p["mask"]), causal=p["causal"],
                scale=p["scale"], block_size=p["block_size"], q_offset=p["q_offset"])


@pytest.mark.parametrize("backward", BACKWARDS)
@settings(max_examples=50, deadline=None)
@given(p=blockwise_problems())
def test_blockwise_backward_equals_dense_backward_float64(backward, p):
    q, k, v, dout, bias = p["q"], p["k"], p["v"], p["dout"], p["bias"]
    kw = _blockwise_call(p, bias)
    out, lse = A.blockwise_attention(q, k, v, return_lse=True, **kw)
    grad = None if bias is None else _BiasGrad(bias.shape, q.shape[:-2])
    dq, dk, dv = backward(q, k, v, out, lse, dout, bias_grad_fn=grad, **kw)
    eq, ek, ev, ebias = A.attention_backward(q, k, v, dout, bias=bias, mask=p["dense_mask"], scale=p["scale"])
    for name, got, want in (("dq", dq, eq), ("dk", dk, ek), ("dv", dv, ev)):
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)
    if bias is not None:
        np.testing.assert_allclose(grad.result(), ebias, rtol=1e-10, atol=1e-12, err_msg="dbias")

    # lse is the log-sum-exp of the dense logits, -inf where a row sees no key (NumPy's own sum).
    scale = 1 / math.sqrt(q.shape[-1]) if p["scale"] is None else p["scale"]
    logits = scale * q @ np.swapaxes(k, -1, -2) + (0 if bias is None else bias)
    logits = np.where(p["dense_mask"], logits, -np.inf)
    dead = ~p["dense_mask"].any(axis=-1)
    top = np.where(dead, 0.0, logits.max(axis=-1, initial=-np.inf))
    with np.errstate(divide="ignore"):
        expected = top + np.log(np.exp(logits - top[..., None]).sum(axis=-1))
    assert np.all(lse[dead] == -np.inf)
    np.testing.assert_allclose(lse[~dead], expected[~dead], rtol=1e-12, atol=1e-13)


@pytest.mark.parametrize("backward", BACKWARDS)
@settings(max_examples=30, deadline=None)
@given(p=blockwise_problems())
def test_blockwise_backward_matches_finite_differences(backward, p):
    # The blockwise backward against the derivative of the blockwise forward itself.
    q, k, v, W, bias, rng = p["q"], p["k"], p["v"], p["dout"], p["bias"], p["rng"]
    kw = _blockwise_call(p, bias)
    out, lse = A.blockwise_attention(q, k, v, return_lse=True, **kw)
    grad = None if bias is None else _BiasGrad(bias.shape, q.shape[:-2])
    dq, dk, dv = backward(q, k, v, out, lse, W, bias_grad_fn=grad, **kw)

    def f(q_=q, k_=k, v_=v, b_=bias):
        return float(np.sum(A.blockwise_attention(q_, k_, v_, **_blockwise_call(p, b_)) * W))

    magnitude = float(np.sum(np.abs(out * W)))
    _check_directional(lambda x: f(q_=x), q, dq, rng, magnitude, "q")
    _check_directional(lambda x: f(k_=x), k, dk, rng, magnitude, "k")
    _check_directional(lambda x: f(v_=x), v, dv, rng, magnitude, "v")
    if bias is not None:
        _check_directional(lambda x: f(b_=x), bias, grad.result(), rng, magnitude, "bias")


@pytest.mark.parametrize("backward", BACKWARDS)
@settings(max_examples=25, deadline=None)
@given(p=blockwise_problems())
def test_blockwise_backward_float32_within_1e5_of_dense(backward, p):
    # float32 through the blockwise path vs float64 through the dense one. Each gradient entry is
    # a sum of products (dS = P (dO V^T - rowsum(dO O)), dq = scale dS K, dk = scale dS^T Q,
    # dv = P^T dO, dbias = sum dS), and a float32 sum is accurate relative to the sum of its terms'
    # magnitudes, not to its value: a row's dS sums to zero, and is zero outright for a row with a
    # single allowed key, where float32 leaves ~1e-8. So the error is measured relative to the same
    # expressions taken in absolute values, with |dS| <= P (|dO| |V|^T + rowsum |dO O|).
    f32 = {n: p[n].astype(np.float32) for n in ("q", "k", "v", "dout")}
    f64 = {n: a.astype(np.float64) for n, a in f32.items()}
    bias32 = None if p["bias"] is None else p["bias"].astype(np.float32)
    kw = _blockwise_call(p, bias32)
    out, lse = A.blockwise_attention(f32["q"], f32["k"], f32["v"], return_lse=True, **kw)
    assert out.dtype == lse.dtype == np.float32
    grad = None if bias32 is None else _BiasGrad(bias32.shape, p["q"].shape[:-2])
    got = backward(f32["q"], f32["k"], f32["v"], out, lse, f32["dout"], bias_grad_fn=grad, **kw)
    full = (*p["q"].shape[:-1], p["k"].shape[-2])
    bias64 = np.zeros(full) if bias32 is None else np.broadcast_to(bias32.astype(np.float64), full).copy()
    q, k, v, dout = f64["q"], f64["k"], f64["v"], f64["dout"]
    eq, ek, ev, _ = A.attention_backward(q, k, v, dout, bias=bias64, mask=p["dense_mask"], scale=p["scale"])
    _, P = A.attention(q, k, v, bias=bias64, mask=p["dense_mask"], scale=p["scale"], return_weights=True)
    scale = 1 / math.sqrt(q.shape[-1]) if p["scale"] is None else p["scale"]
    kt = lambda a: np.swapaxes(a, -1, -2)  # noqa: E731
    out64 = P @ v
    ds_size = P * (np.abs(dout) @ kt(np.abs(v)) + np.sum(np.abs(dout * out64), axis=-1, keepdims=True))
    pairs = [("dq", got[0], eq, scale * ds_size @ np.abs(k)), ("dk", got[1], ek, scale * kt(ds_size) @ np.abs(q)),
             ("dv", got[2], ev, kt(P) @ np.abs(dout))]
    for name, g, _, _ in pairs:
        assert g.dtype == np.float32, name
    if grad is not None:
        want = A.attention_backward(q, k, v, dout, bias=bias32.astype(np.float64), mask=p["dense_mask"],
                                    scale=p["scale"])[3]
        size = _BiasGrad(bias32.shape, full[:-2])
        size(slice(0, full[-2]), slice(0, full[-1]), ds_size)
        pairs.append(("dbias", grad.result(), want, size.result()))
    for name, g, w, magnitude in pairs:
        err = np.abs(g.astype(np.float64) - w)
        assert np.all(err <= 1e-5 * magnitude + 1e-30), (
            f"{name}: worst error / magnitude = {np.max(err / np.maximum(magnitude, 1e-300)):.3g}")


@pytest.mark.parametrize("backward", BACKWARDS)
@settings(max_examples=20, deadline=None)
@given(p=blockwise_problems())
def test_fast_forward_lse_feeds_the_backward(backward, p):
    # minipos.fast's forward returns the same (out, lse) up to rounding, so either backward run on
    # them gives the dense gradients.
    q, k, v, dout, bias = p["q"], p["k"], p["v"], p["dout"], p["bias"]
    kw = _blockwise_call(p, bias)
    out_r, lse_r = A.blockwise_attention(q, k, v, return_lse=True, **kw)
    out_f, lse_f = FA.blockwise_attention(q, k, v, return_lse=True, **kw)
    np.testing.assert_allclose(out_f, out_r, rtol=1e-12, atol=1e-13)
    np.testing.assert_array_equal(np.isneginf(lse_f), np.isneginf(lse_r))
    finite = np.isfinite(lse_r)
    np.testing.assert_allclose(lse_f[finite], lse_r[finite], rtol=1e-12, atol=1e-13)
    got = backward(q, k, v, out_f, lse_f, dout, **kw)
    want = A.attention_backward(q, k, v, dout, bias=bias, mask=p["dense_mask"], scale=p["scale"])
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name)


@pytest.mark.skipif(not hasattr(FA, "blockwise_attention_backward"),
                    reason="minipos.fast.attention has no blockwise_attention_backward yet")
@settings(max_examples=20, deadline=None)
@given(p=blockwise_problems())
def test_fast_blockwise_backward_equals_reference_when_present(p):
    fast_backward = FA.blockwise_attention_backward
    q, k, v, dout, bias = p["q"], p["k"], p["v"], p["dout"], p["bias"]
    kw = _blockwise_call(p, bias)
    out, lse = A.blockwise_attention(q, k, v, return_lse=True, **kw)
    grads = [None if bias is None else _BiasGrad(bias.shape, q.shape[:-2]) for _ in range(2)]
    want = A.blockwise_attention_backward(q, k, v, out, lse, dout, bias_grad_fn=grads[0], **kw)
    got = fast_backward(q, k, v, out, lse, dout, bias_grad_fn=grads[1], **kw)
    for name, g, w in zip(("dq", "dk", "dv"), got, want):
        np.testing.assert_allclose(g, w, rtol=1e-10, atol=1e-12, err_msg=name)
    if bias is not None:
        np.testing.assert_allclose(grads[1].result(), grads[0].result(), rtol=1e-10, atol=1e-12, err_msg="dbias")


@pytest.mark.parametrize("backward", BACKWARDS)
def test_blockwise_backward_never_holds_a_T_by_S_array(backward):
    # T = S = 2048 in float32: one (T, S) array is 16 MiB, a (T, S) boolean mask 4 MiB. The forward
    # and the backward, with a causal mask and a bias_fn (its gradient summed per block), each peak
    # below a fifth of the former (so below the mask too): what they hold is O((T + S)(D + Dv)) --
    # the inputs are 128 KiB each, and fast keeps [K^T; 1], [V | 1], V^T and per-thread dK, dV --
    # plus O(block^2) per block.
    T = S = 2048
    rng = np.random.default_rng(0)
    q, k, v, dout = (rng.standard_normal((1, n, 16)).astype(np.float32) for n in (T, S, S, T))
    slope = np.float32(0.01)
    pos = np.arange(T)
    bias_fn = lambda qs, ks: (slope * (pos[ks][None, :] - pos[qs][:, None])).astype(np.float32)  # noqa: E731
    total = np.zeros(1)

    def bias_grad_fn(qs, ks, ds):
        total[0] += float(ds.sum())

    kw = dict(bias_fn=bias_fn, causal=True, block_size=128)
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        out, lse = A.blockwise_attention(q, k, v, return_lse=True, **kw)
        _, forward_peak = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()
        dq, dk, dv = backward(q, k, v, out, lse, dout, bias_grad_fn=bias_grad_fn, **kw)
        _, backward_peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    limit = T * S * 4 // 5
    assert forward_peak < limit, f"forward peak {forward_peak} bytes"
    assert backward_peak < limit, f"backward peak {backward_peak} bytes"
    assert dq.shape == q.shape and np.isfinite(dq).all() and np.isfinite(dk).all() and np.isfinite(dv).all()
    # every row's dS sums to zero (softmax is shift-invariant), so the bias_grad_fn total is ~0
    assert abs(total[0]) < 1e-2


# ----------------------------------------------------------------------------- torch autograd


@settings(max_examples=20, deadline=None)
@given(p=attention_problems())
def test_attention_backward_matches_torch_sdpa(p):
    # The float mask torch takes is bias + (0 where allowed, -inf where masked); the bias half of
    # it requires grad, so autograd's gradient of it is dbias (summed to the bias's shape by
    # autograd's broadcasting rule). torch's math backend also gives fully masked rows a zero
    # output and zero gradients, so every row is compared.
    torch = pytest.importorskip("torch")
    F = torch.nn.functional
    q, k, v, dout = p["q"], p["k"], p["v"], p["dout"]
    bias = p["bias"] if p["bias"] is not None else p["rng"].standard_normal(_dense_mask(p).shape[-2:])
    tq, tk, tv, tb = (torch.tensor(a, requires_grad=True) for a in (q, k, v, bias))
    neg = torch.tensor(np.where(_dense_mask(p), 0.0, -np.inf))
    t_out = F.scaled_dot_product_attention(tq, tk, tv, attn_mask=tb + neg, scale=p["scale"])
    (t_out * torch.tensor(dout)).sum().backward()
    np.testing.assert_allclose(A.attention(q, k, v, bias=bias, mask=p["mask"], scale=p["scale"]),
                               t_out.detach().numpy(), rtol=1e-12, atol=1e-13)
    dq, dk, dv, dbias = A.attention_backward(q, k, v, dout, bias=bias, mask=p["mask"], scale=p["scale"])
    for name, got, want in (("dq", dq, tq.grad), ("dk", dk, tk.grad), ("dv", dv, tv.grad), ("dbias", dbias, tb.grad)):
        want = want.numpy()
        assert np.shape(got) == want.shape, name
        np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-12, err_msg=name)


# ----------------------------------------------------------------------------- errors


def _small():
    rng = np.random.default_rng(0)
    q, k, v = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4)), rng.standard_normal((2, 5, 6))
    out, lse = A.blockwise_attention(q, k, v, block_size=2, return_lse=True)
    return q, k, v, out, lse, rng.standard_normal((2, 3, 6))


def test_attention_backward_names_a_misshapen_dout():
    q, k, v, _, _, dout = _small()
    with pytest.raises(ValueError, match="dout"):
        A.attention_backward(q, k, v, dout[..., :5])
    with pytest.raises(ValueError, match="dout"):
        A.attention_backward(q, k, v, dout[None])


@pytest.mark.parametrize("backward", BACKWARDS)
def test_blockwise_backward_names_a_misshapen_dout_or_lse(backward):
    q, k, v, out, lse, dout = _small()
    with pytest.raises(ValueError, match="dout"):
        backward(q, k, v, out, lse, dout[:, :2], block_size=2)
    with pytest.raises(ValueError, match="lse"):
        backward(q, k, v, out, lse[:, :2], dout, block_size=2)
    with pytest.raises(ValueError, match="lse"):
        backward(q, k, v, out, lse[..., None], dout, block_size=2)


@pytest.mark.parametrize("backward", BACKWARDS)
def test_blockwise_backward_names_a_non_callable_bias_grad_fn(backward):
    q, k, v, out, lse, dout = _small()
    with pytest.raises(TypeError, match="bias_grad_fn"):
        backward(q, k, v, out, lse, dout, bias_grad_fn=np.zeros((2, 3, 5)))


def test_backward_with_minus_inf_bias_is_the_masked_backward():
    # -inf in the bias is the mask: the same dq, dk, dv, and dbias = dS = 0 on those entries.
    rng = np.random.default_rng(31)
    q, k, v, dout = (rng.standard_normal((2, 5, 3)) for _ in range(4))
    bias = rng.standard_normal((2, 5, 5))
    blocked = rng.random((2, 5, 5)) < 0.3
    blocked[1, 2] = True                                                  # a row with no key
    got = A.attention_backward(q, k, v, dout, bias=np.where(blocked, -np.inf, bias))
    want = A.attention_backward(q, k, v, dout, bias=bias, mask=~blocked)
    for g, w in zip(got[:3], want[:3]):
        np.testing.assert_allclose(g, w, rtol=1e-13, atol=1e-15)
    np.testing.assert_array_equal(got[3][blocked], 0.0)
    np.testing.assert_allclose(got[3], want[3], rtol=1e-13, atol=1e-15)
