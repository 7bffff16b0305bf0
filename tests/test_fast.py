"""Every function of minipos.fast against its reference, the oracle, on drawn shapes, dtypes,
masks, offsets, positions and block sizes: float64 to 1e-10, float32 to 1e-5 relative.

The fast blockwise kernel and the layer have more tests of their own speed machinery
(test_fast_blockwise.py, test_fast_layer.py, test_fast_threads.py).
"""

from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipos.fast.attention as fa
import minipos.fast.rope as frope
import minipos.fast.xpos as fxpos
from minipos import alibi, attention, rope, t5, xpos
from minipos.fast import alibi as falibi
from minipos.fast import t5 as ft5

TOL = {np.float64: dict(rtol=1e-10, atol=1e-10), np.float32: dict(rtol=1e-5, atol=1e-5)}
dtypes = st.sampled_from([np.float64, np.float32])


def _qkv(rng, lead, T, S, D, Dv, dtype):
    return tuple(rng.standard_normal((*lead, n, d)).astype(dtype) for n, d in ((T, D), (S, D), (S, Dv)))


@settings(max_examples=80, deadline=None)
@given(lead=st.sampled_from([(1,), (3,), (2, 2), ()]), T=st.integers(1, 40), S=st.integers(1, 40),
       D=st.integers(1, 6), bias_kind=st.sampled_from([None, "full", "per-head", "per-key", "scalar"]),
       mask_kind=st.sampled_from([None, "causal", "random", "padding", "empty row"]), dtype=dtypes,
       scale=st.sampled_from([None, 1.0, 0.3]), kernel=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_attention_equals_reference(lead, T, S, D, bias_kind, mask_kind, dtype, scale, kernel, seed):
    # kernel: the size above which the fast attention runs the blockwise kernel is lowered to 0,
    # so every drawn problem takes that path; otherwise small problems take the reference's.
    if not lead and kernel:
        lead = (1,)
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, lead, T, S, D, 3, dtype)
    shape = (*lead, T, S)
    bias = {None: None, "full": rng.standard_normal(shape), "per-head": rng.standard_normal((T, S)),
            "per-key": rng.standard_normal(S), "scalar": np.array(0.7)}[bias_kind]
    bias = None if bias is None else bias.astype(dtype)
    mask = None
    if mask_kind == "causal":
        mask = attention.causal_mask(T, S)
    elif mask_kind == "random":
        mask = rng.random(shape) > 0.3
    elif mask_kind == "padding":
        mask = rng.random((*lead[:-1], 1, 1, S)[-len(shape):]) > 0.3 if lead else rng.random((1, S)) > 0.3
    elif mask_kind == "empty row":
        mask = np.ones((T, S), bool)
        mask[T // 2] = False
    want = attention.attention(q, k, v, bias=bias, mask=mask, scale=scale)
    with mock.patch.object(fa, "DENSE_LOGITS", 0 if kernel else fa.DENSE_LOGITS):
        got = fa.attention(q, k, v, bias=bias, mask=mask, scale=scale)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, **TOL[dtype])


def test_attention_recognises_the_causal_mask_and_skips_future_blocks():
    # T = S = 600 with one head is above the kernel's size: a mask equal to causal_mask(600, 600)
    # runs as causal=True (future key blocks never scored); any other mask runs as a mask.
    rng = np.random.default_rng(1)
    q, k, v = _qkv(rng, (1,), 600, 600, 8, 4, np.float64)
    calls = []
    real = fa._Blockwise.__init__

    def spy(self, *args):
        calls.append(args[7])                                              # causal
        real(self, *args)
    with mock.patch.object(fa._Blockwise, "__init__", spy):
        got = fa.attention(q, k, v, mask=attention.causal_mask(600, 600))
        other = attention.causal_mask(600, 600).copy()
        other[5, 0] = False
        got_other = fa.attention(q, k, v, mask=other)
    assert calls == [True, False]
    np.testing.assert_allclose(got, attention.attention(q, k, v, mask=attention.causal_mask(600, 600)), atol=1e-12)
    np.testing.assert_allclose(got_other, attention.attention(q, k, v, mask=other), atol=1e-12)


@pytest.mark.parametrize("bad, error, match", [
    (dict(bias=np.full((2, 300, 300), np.nan)), ValueError, "bias must not hold NaN or \\+inf"),
    (dict(bias=np.full((2, 300, 300), np.inf)), ValueError, "bias must not hold NaN or \\+inf"),
    (dict(bias=np.zeros((3, 300, 300))), ValueError, "bias of shape"),
    (dict(mask=np.ones((300, 300))), TypeError, "mask must be a boolean"),
    (dict(mask=np.ones((300, 300), np.int8)), TypeError, "mask must be a boolean"),
    (dict(mask=np.ones((3, 300, 300), bool)), ValueError, "mask of shape"),
    (dict(scale=float("nan")), ValueError, "scale"),
    (dict(return_weights="no"), TypeError, "return_weights"),
])
def test_attention_errors_are_the_references(bad, error, match):
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (2,), 300, 300, 4, 4, np.float64)
    assert q.shape[0] * 300 * 300 >= fa.DENSE_LOGITS / 2                  # shapes are checked before sizes
    for f in (attention.attention, fa.attention):
        with pytest.raises(error, match=match):
            f(q, k, v, **bad)


def test_attention_errors_on_the_kernel_path():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (4,), 300, 300, 4, 4, np.float64)                # 360,000 logits: the kernel
    assert 4 * 300 * 300 >= fa.DENSE_LOGITS
    with pytest.raises(TypeError, match="mask must be a boolean"):
        fa.attention(q, k, v, mask=np.ones((300, 300)))
    for bad in (np.nan, np.inf):                                           # one entry a query attends to
        bias = np.zeros((300, 300))
        bias[200, 17] = bad
        with pytest.raises(ValueError, match="bias must not hold NaN or \\+inf"):
            fa.attention(q, k, v, bias=bias, mask=attention.causal_mask(300, 300))


def test_a_nan_bias_is_named_without_the_references_dense_logits(monkeypatch):
    # The kernel meets the NaN; naming it must not need the (H, T, S) logits the reference would
    # build: with memory for less than those logits the error is still the bias's.
    from minipos import _checks
    rng = np.random.default_rng(16)
    q, k, v = _qkv(rng, (8,), 1024, 1024, 8, 8, np.float32)
    bias = np.zeros((1024, 1024), np.float32)
    bias[700, 3] = np.nan
    monkeypatch.setattr(_checks, "MAX_BYTES", 16 << 20)                   # the logits alone take 32 MiB
    with pytest.raises(ValueError, match="bias must not hold NaN"):
        fa.attention(q, k, v, bias=bias, mask=attention.causal_mask(1024, 1024))
    bias[700, 3] = 0.0
    fa.attention(q, k, v, bias=bias, mask=attention.causal_mask(1024, 1024))   # runs: the kernel needs no logits


def test_a_bias_that_rounds_to_minus_inf_in_the_logits_dtype_masks_in_both():
    # float32 logits, a float64 bias of -1e39 (below float32's range): in the logits' dtype it is
    # -inf, a masked key, for the reference as for the kernel, which casts each block
    rng = np.random.default_rng(18)
    q, k, v = _qkv(rng, (4,), 300, 300, 4, 4, np.float32)
    blocked = rng.random((300, 300)) < 0.3
    bias = np.where(blocked, -1e39, 0.0)
    causal = attention.causal_mask(300, 300)
    want = attention.attention(q, k, v, mask=causal & ~blocked)
    with np.errstate(over="raise"):
        ref = attention.attention(q, k, v, bias=bias, mask=causal)
    np.testing.assert_allclose(ref, want, **TOL[np.float32])
    np.testing.assert_allclose(fa.attention(q, k, v, bias=bias, mask=causal), want, **TOL[np.float32])


def test_longdouble_on_the_kernel_path_is_the_reference():
    rng = np.random.default_rng(17)
    q, k, v = (a.astype(np.longdouble) for a in _qkv(rng, (2,), 400, 400, 4, 4, np.float64))
    np.testing.assert_allclose(fa.attention(q, k, v, mask=attention.causal_mask(400, 400)),
                               attention.attention(q, k, v, mask=attention.causal_mask(400, 400)), rtol=1e-12)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_minus_inf_in_the_bias_masks_and_masked_entries_are_not_read(dtype):
    # On the kernel path: -inf entries in the bias (scattered, on the diagonal, whole rows) and NaN or
    # +inf under the causal mask give the reference's result, and the reference's result is the one
    # with those entries moved into the boolean mask and zeros in the bias (the definition).
    rng = np.random.default_rng(12)
    T = 520
    q, k, v = _qkv(rng, (2,), T, T, 8, 8, dtype)
    bias = rng.standard_normal((2, T, T)).astype(dtype)
    blocked = rng.random((2, T, T)) < 0.3
    blocked[:, np.arange(0, T, 7), np.arange(0, T, 7)] = True             # some diagonal keys
    blocked[1, 300] = True                                                 # a row with no key at all
    causal = attention.causal_mask(T, T)
    dirty = np.where(blocked, -np.inf, bias)
    dirty[:, ~causal] = np.where(rng.random((2, int((~causal).sum()))) < 0.5, np.nan, np.inf)
    want = attention.attention(q, k, v, bias=np.where(blocked, 0, bias), mask=causal & ~blocked)
    np.testing.assert_array_equal(want[1, 300], 0)
    with np.errstate(invalid="raise", over="raise"):
        ref = attention.attention(q, k, v, bias=dirty, mask=causal)
        got = fa.attention(q, k, v, bias=dirty, mask=causal)
    np.testing.assert_allclose(ref, want, **TOL[dtype])
    np.testing.assert_allclose(got, want, **TOL[dtype])


def test_attention_overflow_is_refused_on_the_kernel_path():
    # scale q . k = (1/2) 4 (4e19)^2 = 3.2e39 is beyond float32 (3.4e38): refused, not inf or NaN.
    q = np.full((1, 600, 4), 4e19, np.float32)
    for f in (attention.attention, fa.attention):
        with pytest.raises(ValueError, match="overflow"):
            with np.errstate(over="ignore"):
                f(q, q, q)


def test_attention_with_weights_is_the_reference():
    rng = np.random.default_rng(3)
    q, k, v = _qkv(rng, (2,), 300, 300, 4, 4, np.float64)
    out, w = fa.attention(q, k, v, mask=attention.causal_mask(300, 300), return_weights=True)
    ref_out, ref_w = attention.attention(q, k, v, mask=attention.causal_mask(300, 300), return_weights=True)
    np.testing.assert_array_equal(out, ref_out)
    np.testing.assert_array_equal(w, ref_w)


@settings(max_examples=60, deadline=None)
@given(lead=st.sampled_from([(), (2,), (2, 3)]), T=st.integers(1, 12), S=st.integers(1, 12),
       block=st.integers(1, 14), causal=st.booleans(), shift=st.integers(-3, 3), dtype=dtypes,
       masked=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_blockwise_attention_equals_reference(lead, T, S, block, causal, shift, dtype, masked, seed):
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, lead, T, S, 3, 2, dtype)
    bias = rng.standard_normal((*lead, T, S)).astype(dtype)
    keep = rng.random((T, S)) > 0.2
    kw = dict(bias_fn=lambda qs, ks: bias[..., qs, ks], block_size=block, causal=causal,
              mask_fn=(lambda qs, ks: keep[qs, ks]) if masked else None,
              q_offset=S - T + shift if causal else None)
    want = attention.blockwise_attention(q, k, v, **kw)
    got = fa.blockwise_attention(q, k, v, **kw)
    np.testing.assert_allclose(got, want, **TOL[dtype])


def test_a_non_finite_diagonal_logit_leaves_the_running_max_to_find_a_reference():
    # Causal, no mask_fn: the fast kernel takes each row's diagonal logit as its fixed reference;
    # where that logit is -inf (the bias masks the diagonal key) it walks with the running max.
    rng = np.random.default_rng(6)
    q, k, v = _qkv(rng, (2,), 8, 8, 4, 3, np.float64)
    bias = np.zeros((8, 8))
    bias[3, 3] = -np.inf
    kw = dict(bias_fn=lambda qs, ks: bias[qs, ks], causal=True, block_size=4)
    np.testing.assert_allclose(fa.blockwise_attention(q, k, v, **kw), attention.blockwise_attention(q, k, v, **kw),
                               atol=1e-12)


def test_block_terms_as_lists_are_checked_like_arrays():
    rng = np.random.default_rng(7)
    q, k, v = _qkv(rng, (1,), 4, 4, 2, 2, np.float64)
    keep = [[True, False, True, True]] * 4
    kw = dict(mask_fn=lambda qs, ks: [row[ks] for row in keep[qs]], block_size=4)
    np.testing.assert_allclose(fa.blockwise_attention(q, k, v, **kw), attention.blockwise_attention(q, k, v, **kw),
                               atol=1e-12)


def test_fast_alibi_bias_refuses_a_non_floating_dtype():
    with pytest.raises(TypeError, match="dtype"):
        falibi.alibi_bias([0.5], 2, 2, dtype=np.int32)


@settings(max_examples=50, deadline=None)
@given(lead=st.sampled_from([(), (2,), (2, 3)]), T=st.integers(1, 12), S=st.integers(1, 12),
       block=st.integers(1, 14), causal=st.booleans(), shift=st.integers(-3, 3), dtype=dtypes,
       masked=st.booleans(), bound=st.booleans(), threads=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_blockwise_attention_backward_equals_reference(lead, T, S, block, causal, shift, dtype, masked, bound,
                                                       threads, seed):
    # bound: a valid (loose) bias_max_fn, so heads whose block underflows are skipped; threads:
    # the size above which query blocks go to two threads is lowered to 0.
    rng = np.random.default_rng(seed)
    q, k, v = _qkv(rng, lead, T, S, 3, 2, dtype)
    dout = rng.standard_normal(v.shape[:-2] + (T, 2)).astype(dtype)
    bias = (rng.standard_normal((*lead, T, S)) * 3).astype(dtype)
    keep = rng.random((T, S)) > 0.2
    kw = dict(bias_fn=lambda qs, ks: bias[..., qs, ks], block_size=block, causal=causal,
              mask_fn=(lambda qs, ks: keep[qs, ks]) if masked else None, q_offset=S - T + shift if causal else None)
    out, lse = attention.blockwise_attention(q, k, v, return_lse=True, **kw)
    want_bias, got_bias = np.zeros(bias.shape, np.float64), np.zeros(bias.shape, np.float64)

    def collect(into):
        def bias_grad_fn(qs, ks, ds):
            into[..., qs, ks] += ds
        return bias_grad_fn
    want = attention.blockwise_attention_backward(q, k, v, out, lse, dout, bias_grad_fn=collect(want_bias), **kw)
    extra = dict(bias_max_fn=(lambda qs, ks: bias[..., qs, ks].max(axis=(-2, -1), keepdims=True) + 0.5) if bound
                 else None, workers=2 if threads else 1)
    with mock.patch.object(fa, "_THREADED_WORK", 0 if threads else fa._THREADED_WORK):
        got = fa.blockwise_attention_backward(q, k, v, out, lse, dout, bias_grad_fn=collect(got_bias), **kw, **extra)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype
        np.testing.assert_allclose(g, w, **TOL[dtype])
    np.testing.assert_allclose(got_bias, want_bias, **TOL[dtype])


def test_blockwise_attention_in_longdouble_is_the_reference():
    rng = np.random.default_rng(4)
    q, k, v = _qkv(rng, (2,), 5, 7, 3, 2, np.longdouble)
    got = fa.blockwise_attention(q, k, v, causal=True, block_size=2)
    assert got.dtype == np.longdouble
    np.testing.assert_allclose(got.astype(float), attention.blockwise_attention(q, k, v, causal=True, block_size=2)
                               .astype(float), rtol=1e-12)


@settings(max_examples=80, deadline=None)
@given(lead=st.sampled_from([(), (3,), (2, 2)]), T=st.integers(1, 300), half_D=st.integers(1, 5),
       partial=st.booleans(), layout=st.sampled_from(rope.LAYOUTS),
       dtype=st.sampled_from([np.float64, np.float32, np.float16]), start=st.integers(-50, 5000),
       factor=st.sampled_from([1.0, 1.2]), scaled=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_apply_rope_equals_reference(lead, T, half_D, partial, layout, dtype, start, factor, scaled, strided, seed):
    # T >= 256 in float32 takes the split-angle trigonometry; strided x the copy before the complex view.
    # The backward (R(m)^T, the same chunks with the sines negated) against the reference's on the same x.
    D = 2 * half_D
    R = 2 * max(1, half_D - 1) if partial else None
    x = np.random.default_rng(seed).standard_normal((*lead, T, 2 * D if strided else D)).astype(dtype)
    x = x[..., ::2] if strided else x
    positions = start + np.arange(T)
    inv_freq = rope.rope_inv_freq(R or D) * 0.5 if scaled else None
    kw = dict(layout=layout, rotary_dim=R, attention_factor=factor, inv_freq=inv_freq)
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else TOL[dtype]
    for fast, slow in ((frope.apply_rope, rope.apply_rope), (frope.apply_rope_backward, rope.apply_rope_backward)):
        want, got = slow(x, positions, **kw), fast(x, positions, **kw)
        assert got.dtype == want.dtype == dtype
        np.testing.assert_allclose(got.astype(float), want.astype(float), **tol)


@settings(max_examples=40, deadline=None)
@given(lead=st.sampled_from([(), (3,), (2, 2)]), T=st.integers(1, 300), half_D=st.integers(1, 5),
       dtype=st.sampled_from([np.float64, np.float32]), start=st.integers(-50, 3000), downscale=st.booleans(),
       offset=st.integers(-100, 100), scale_base=st.sampled_from([512.0, 64.0]), seed=st.integers(0, 2 ** 16))
def test_apply_xpos_equals_reference(lead, T, half_D, dtype, start, downscale, offset, scale_base, seed):
    # The reference's scales and checks around minipos.fast.rope's rotation, forward and backward.
    x = np.random.default_rng(seed).standard_normal((*lead, T, 2 * half_D)).astype(dtype)
    kw = dict(downscale=downscale, scale_offset=offset, scale_base=scale_base)
    positions = start + np.arange(T)
    for fast, slow in ((fxpos.apply_xpos, xpos.apply_xpos), (fxpos.apply_xpos_backward, xpos.apply_xpos_backward)):
        want, got = slow(x, positions, **kw), fast(x, positions, **kw)
        assert got.dtype == want.dtype == dtype
        scale = np.abs(want).max(initial=1.0)                            # a rotated pair can nearly cancel
        np.testing.assert_allclose(got, want, rtol=TOL[dtype]["rtol"], atol=TOL[dtype]["rtol"] * scale)


@pytest.mark.parametrize("bad, match", [
    (dict(x=np.ones((4, 3))), "even head dim"), (dict(positions=np.arange(5)), "positions|T = 5"),
    (dict(x=np.full((4, 2), 1e38, np.float32), positions=np.arange(4) + 4000), "overflows float32"),
    (dict(positions=np.arange(4) + 10 ** 6), "too far"),
])
def test_apply_xpos_errors_are_the_references(bad, match):
    args = dict(x=np.ones((4, 2), np.float32), positions=np.arange(4))
    args.update(bad)
    for f in (xpos.apply_xpos, fxpos.apply_xpos, xpos.apply_xpos_backward, fxpos.apply_xpos_backward):
        with pytest.raises(ValueError, match=match):
            f(args["x"], args["positions"], downscale=True)


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_apply_rope_refuses_float16_output_that_overflows(layout):
    # float16 tops out at 65504: x = 6e4 on both features of a pair rotated by 45 degrees (theta_0 = 1,
    # position 0.785... is not an integer, so take D = 2 and inv_freq = pi/4) gives 6e4 sqrt(2) = 8.5e4.
    x = np.full((1, 2), 6e4, np.float16)
    for f in (rope.apply_rope, frope.apply_rope, rope.apply_rope_backward, frope.apply_rope_backward):
        with pytest.raises(ValueError, match="overflows float16"):
            f(x, [1], inv_freq=[np.pi / 4], layout=layout)


def test_apply_rope_split_angles_at_far_positions():
    # Positions near 10^6 in float32: the split-angle cos/sin differ from the direct ones by float64
    # rounding only, far below a float32 ulp.
    x = np.random.default_rng(5).standard_normal((2, 512, 8)).astype(np.float32)
    positions = 10 ** 6 + np.arange(512)
    np.testing.assert_allclose(frope.apply_rope(x, positions, layout="half"),
                               rope.apply_rope(x, positions, layout="half"), rtol=1e-5, atol=1e-5)
    cos, sin = frope._cos_sin_split(positions, rope.rope_inv_freq(8))
    angles = np.outer(positions, rope.rope_inv_freq(8))
    np.testing.assert_allclose(cos, np.cos(angles), atol=1e-9)
    np.testing.assert_allclose(sin, np.sin(angles), atol=1e-9)


@pytest.mark.parametrize("bad, error, match", [
    (dict(positions=np.arange(4)), ValueError, "positions must have length"),
    (dict(positions=10 ** 9), ValueError, "positions must have length"),
    (dict(layout="x"), ValueError, "layout"),
    (dict(rotary_dim=3), ValueError, "rotary_dim"),
    (dict(inv_freq=[1e308] * 4), ValueError, "finite"),
    (dict(attention_factor=0.0), ValueError, "attention_factor"),
    (dict(attention_factor=3e38), ValueError, "overflows float32"),
    (dict(attention_factor=1e39), ValueError, "overflows float32"),          # the factor itself: cos 1e39
    (dict(base=2.0, inv_freq=[1.0] * 4), ValueError, "either base or inv_freq"),
])
def test_apply_rope_errors_are_the_references(bad, error, match):
    x = np.ones((2, 300, 8), np.float32)
    args = dict(positions=300)
    args.update(bad)
    positions = args.pop("positions")
    for f in (rope.apply_rope, frope.apply_rope, rope.apply_rope_backward, frope.apply_rope_backward):
        with pytest.raises(error, match=match):
            f(x, positions, **args)


positions = st.lists(st.integers(0, 400), min_size=0, max_size=12).map(lambda p: np.array(p, np.int64))


@settings(max_examples=60, deadline=None)
@given(q=positions, k=positions, start=st.integers(0, 300), length=st.integers(1, 40),
       bidirectional=st.booleans(), exact=st.booleans())
def test_t5_bias_equals_reference(q, k, start, length, bidirectional, exact):
    table = np.random.default_rng(len(q) + 7 * len(k)).standard_normal((32, 3))
    run = start + np.arange(length)
    for qq, kk in ((q, k), (run, np.arange(start + length)), (run, k), (np.array([5, 3, 9]), run)):
        want = t5.t5_bias(table, qq, kk, bidirectional=bidirectional, exact=exact)
        got = ft5.t5_bias(table, qq, kk, bidirectional=bidirectional, exact=exact)
        np.testing.assert_array_equal(got, want)


@settings(max_examples=60, deadline=None)
@given(H=st.integers(1, 12), q=positions, k=positions, symmetric=st.booleans(),
       dtype=st.sampled_from([None, np.float64, np.float32, np.float16]))
def test_alibi_bias_equals_reference(H, q, k, symmetric, dtype):
    slopes = alibi.alibi_slopes(H)
    want = alibi.alibi_bias(slopes, q, k, symmetric=symmetric)
    got = falibi.alibi_bias(slopes, q, k, symmetric=symmetric, dtype=dtype)
    assert got.dtype == (want.dtype if dtype is None else dtype)
    if dtype is None:
        np.testing.assert_array_equal(got, want)
    elif dtype == np.float16:
        np.testing.assert_allclose(got, want.astype(dtype), rtol=1e-3, atol=1e-3)
    else:
        np.testing.assert_allclose(got, want.astype(dtype), rtol=np.finfo(dtype).eps, atol=0)
        if H & (H - 1) == 0:                                     # power-of-two slopes: bit for bit
            np.testing.assert_array_equal(got, want.astype(dtype))


def test_fast_modules_are_not_imported_by_the_reference():
    # Deleting minipos/fast changes no reference result: no reference module imports it.
    import pathlib
    root = pathlib.Path(attention.__file__).parent
    for path in root.glob("*.py"):
        text = path.read_text()
        assert "fast" not in {part for line in text.splitlines() if line.startswith(("import", "from"))
                              for part in line.replace(".", " ").split()}, path.name


def test_exp_flushes_below_the_square_root_of_the_smallest_normal_number():
    # ln sqrt(tiny) = -126 ln 2 / 2 = -43.668 in float32 and -1022 ln 2 / 2 = -354.19 in float64
    # (worked by hand from the IEEE exponent ranges): a term above it is kept, one below is 0.
    assert fa._FLUSH[np.dtype(np.float32)] == pytest.approx(-43.668, abs=1e-3)
    assert fa._FLUSH[np.dtype(np.float64)] == pytest.approx(-354.19, abs=1e-2)
    x = np.array([0.0, -1.0, -43.0, -44.0, -90.0, -np.inf, np.nan], np.float32)
    got = fa._exp(x.copy())
    np.testing.assert_allclose(got[:3], np.exp(np.array([0.0, -1.0, -43.0])), rtol=1e-6)
    np.testing.assert_array_equal(got[3:6], 0.0)
    assert np.isnan(got[6])                                                # NaN is kept, for the row-sum check
    got64 = fa._exp(np.array([-354.0, -355.0]))
    assert got64[0] == pytest.approx(np.exp(-354.0), rel=1e-12) and got64[1] == 0.0


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_logits_in_the_subnormal_band_give_the_reference_result(dtype):
    # A steep ALiBi-like bias puts every distance's logit between 0 and -2000, through the band where
    # e^x is subnormal (-104 to -87 in float32) and below the flush: fast equals the reference.
    rng = np.random.default_rng(5)
    T, H = 96, 3
    q, k, v = _qkv(rng, (H,), T, T, 8, 8, dtype)
    slopes = np.array([20.0, 3.0, 0.5])[:, None, None]
    pos = np.arange(T)
    bias = (-slopes * np.abs(pos[:, None] - pos[None, :])).astype(dtype)
    mask = attention.causal_mask(T, T)
    want = attention.attention(q, k, v, bias=bias, mask=mask)
    with mock.patch.object(fa, "DENSE_LOGITS", 0):
        got = fa.attention(q, k, v, bias=bias, mask=mask)
    np.testing.assert_allclose(got, want, **TOL[dtype])
    blocked = fa.blockwise_attention(q, k, v, bias_fn=lambda qs, ks: bias[:, qs, ks], causal=True, block_size=16)
    np.testing.assert_allclose(blocked, want, **TOL[dtype])


@pytest.mark.parametrize("workers", [1, 2])
def test_all_finite_is_the_exact_test(workers, monkeypatch):
    # Row sums settle a finite array; an inf, -inf or NaN anywhere makes its row's sum non-finite;
    # finite rows whose sum overflows (3e38 + 3e38 in float32) are settled by the exact test.
    monkeypatch.setattr(fa, "_THREADED_CHECK", 0)
    a = np.zeros((3, 5, 7), np.float32)
    assert fa._all_finite(a, workers)
    for bad in (np.inf, -np.inf, np.nan):
        for where in ((0, 0, 0), (2, 4, 6), (1, 2, 3)):
            b = a.copy()
            b[where] = bad
            assert not fa._all_finite(b, workers)
    huge = np.full((4, 2), 3e38, np.float32)
    assert 2 * 3e38 > float(np.finfo(np.float32).max) and fa._all_finite(huge, workers)
    assert not fa._all_finite(np.array([[1.0, np.inf]])[:, ::-1], workers)     # not contiguous
    assert not fa._all_finite(np.array([1.0, np.nan], np.float16), workers)    # no BLAS for float16


@settings(max_examples=60, deadline=None)
@given(T=st.integers(1, 12), S=st.integers(1, 12), flips=st.lists(st.tuples(st.integers(0, 11), st.integers(0, 11)),
                                                                  max_size=3),
       permute=st.booleans(), strided=st.booleans(), seed=st.integers(0, 2 ** 16))
def test_is_causal_is_equality_with_causal_mask(T, S, flips, permute, strided, seed):
    # Against the definition, array_equal with causal_mask: sizes that are and are not whole 64-bit
    # words, rows permuted (the same count in another order), and a strided (Fortran-order) mask.
    mask = attention.causal_mask(T, S).copy()
    for i, j in flips:
        mask[i % T, j % S] ^= True
    if permute:
        row = np.random.default_rng(seed).integers(T)
        mask[row] = np.random.default_rng(seed).permutation(mask[row])     # same count, any order
    given = np.asfortranarray(mask) if strided else mask
    assert fa._is_causal(given[None], T, S) == np.array_equal(mask, attention.causal_mask(T, S))
    assert not fa._is_causal(np.ones((2, T, S), bool), T, S)                # a leading dim of 2


def test_layout_on_several_threads_gives_the_same_result(monkeypatch):
    # [K^T ; 1] and [V | 1] filled a band of heads per thread, as on one, and as the reference says.
    rng = np.random.default_rng(8)
    q, k, v = _qkv(rng, (2, 3), 20, 24, 5, 6, np.float64)
    one = fa.blockwise_attention(q, k, v, causal=True, block_size=8, workers=1)
    np.testing.assert_allclose(one, attention.attention(q, k, v, mask=attention.causal_mask(20, 24)), **TOL[np.float64])
    monkeypatch.setattr(fa, "_THREADED_CHECK", 0)
    monkeypatch.setattr(fa, "_THREADED_WORK", 0)
    filled = []
    real = fa._threads.run
    monkeypatch.setattr(fa._threads, "run", lambda fn, tasks, workers, **kw: (filled.append(len(tasks)),
                                                                             real(fn, tasks, workers, **kw)))
    np.testing.assert_array_equal(fa.blockwise_attention(q, k, v, causal=True, block_size=8, workers=2), one)
    assert filled[0] == 2                                                  # the layout: two bands of heads


@pytest.mark.parametrize("name", ["q", "k", "v"])
def test_attention_refuses_non_finite_inputs_on_the_kernel_path(name):
    rng = np.random.default_rng(4)
    args = dict(zip("qkv", _qkv(rng, (4,), 300, 300, 4, 4, np.float32)))
    args[name][3, 299, 1] = np.nan                                         # the last row of the last head
    for f in (attention.attention, fa.attention):
        with pytest.raises(ValueError, match=f"{name} must be finite"):
            f(args["q"], args["k"], args["v"])


def test_attention_whose_unnormalised_sum_overflows_is_the_reference():
    # q = 0 gives every allowed key the weight 1/(t + 1), and v = 3e38 everywhere: the reference's
    # output is 3e38 in every row (worked by hand), while the kernel's e^x v summed before the
    # division reaches (t + 1) 3e38 = inf in float32. The fast form hands the call to the reference.
    T = 600
    q = np.zeros((1, T, 4), np.float32)
    v = np.full((1, T, 4), 3e38, np.float32)
    mask = attention.causal_mask(T, T)
    got = fa.attention(q, q, v, mask=mask)
    np.testing.assert_allclose(got, 3e38, rtol=1e-5)                      # float32 weights sum to 1 +- 1e-6
    np.testing.assert_array_equal(got, attention.attention(q, q, v, mask=mask))


@pytest.mark.parametrize("layout", ["half", "interleaved"])
def test_apply_rope_on_threads_equals_reference(layout, monkeypatch):
    # The chunks of x shared among threads (forced at a small size, several chunks per thread).
    monkeypatch.setattr(frope, "_THREADED_ROPE", 0)
    monkeypatch.setattr(frope, "_CHUNK", 64)
    monkeypatch.setenv("MINIPOS_NUM_THREADS", "2")
    x = np.random.default_rng(6).standard_normal((3, 40, 10)).astype(np.float32)
    got = frope.apply_rope(x, 7 + np.arange(40), layout=layout, rotary_dim=6)
    np.testing.assert_allclose(got, rope.apply_rope(x, 7 + np.arange(40), layout=layout, rotary_dim=6),
                               **TOL[np.float32])
    big = np.full((2, 40, 4), 3e38, np.float32)                            # overflows in a worker thread
    with pytest.raises(ValueError, match="rotated x overflows"):
        frope.apply_rope(big, 40, layout=layout, attention_factor=2.0)
