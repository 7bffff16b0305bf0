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
from minipos import alibi, attention, rope, t5
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
    with mock.patch.object(fa, "_DENSE_LOGITS", 0 if kernel else fa._DENSE_LOGITS):
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
    (dict(bias=np.full((2, 300, 300), np.nan)), ValueError, "bias must be finite"),
    (dict(bias=np.full((2, 300, 300), -np.inf)), ValueError, "bias must be finite"),
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
    assert q.shape[0] * 300 * 300 >= fa._DENSE_LOGITS / 2                  # shapes are checked before sizes
    for f in (attention.attention, fa.attention):
        with pytest.raises(error, match=match):
            f(q, k, v, **bad)


def test_attention_errors_on_the_kernel_path():
    rng = np.random.default_rng(2)
    q, k, v = _qkv(rng, (4,), 300, 300, 4, 4, np.float64)                # 360,000 logits: the kernel
    assert 4 * 300 * 300 >= fa._DENSE_LOGITS
    with pytest.raises(TypeError, match="mask must be a boolean"):
        fa.attention(q, k, v, mask=np.ones((300, 300)))
    with pytest.raises(ValueError, match="bias must be finite"):
        fa.attention(q, k, v, bias=np.full((300, 300), -np.inf))


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
    D = 2 * half_D
    R = 2 * max(1, half_D - 1) if partial else None
    x = np.random.default_rng(seed).standard_normal((*lead, T, 2 * D if strided else D)).astype(dtype)
    x = x[..., ::2] if strided else x
    positions = start + np.arange(T)
    inv_freq = rope.rope_inv_freq(R or D) * 0.5 if scaled else None
    kw = dict(layout=layout, rotary_dim=R, attention_factor=factor, inv_freq=inv_freq)
    want = rope.apply_rope(x, positions, **kw)
    got = frope.apply_rope(x, positions, **kw)
    assert got.dtype == want.dtype == dtype
    tol = dict(rtol=2e-3, atol=2e-3) if dtype == np.float16 else TOL[dtype]
    np.testing.assert_allclose(got.astype(float), want.astype(float), **tol)


@pytest.mark.parametrize("layout", rope.LAYOUTS)
def test_apply_rope_refuses_float16_output_that_overflows(layout):
    # float16 tops out at 65504: x = 6e4 on both features of a pair rotated by 45 degrees (theta_0 = 1,
    # position 0.785... is not an integer, so take D = 2 and inv_freq = pi/4) gives 6e4 sqrt(2) = 8.5e4.
    x = np.full((1, 2), 6e4, np.float16)
    for f in (rope.apply_rope, frope.apply_rope):
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
    (dict(base=2.0, inv_freq=[1.0] * 4), ValueError, "either base or inv_freq"),
])
def test_apply_rope_errors_are_the_references(bad, error, match):
    x = np.ones((2, 300, 8), np.float32)
    args = dict(positions=300)
    args.update(bad)
    positions = args.pop("positions")
    for f in (rope.apply_rope, frope.apply_rope):
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
