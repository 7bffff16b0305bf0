"""Bad input to the value seam, sinks, the layer's backward contexts, the streaming cache and MLA,
reference and fast: a clear error naming the argument, or the right result (checked against an
independent computation: a fresh pass, central differences, float64 by hand, the reference)."""

import inspect
from decimal import Decimal, getcontext

import numpy as np
import pytest

import minipos.fast as fast
from minipos import _checks, mla
from minipos import attention as A
from minipos import layer as L
from minipos.mrope import MRotary
from minipos.streaming import StreamingCache

RNG = np.random.default_rng(0)
Q, K, V = (RNG.standard_normal((2, 3, 4)) for _ in range(3))                 # (H, T, D)
DOUT = RNG.standard_normal((2, 3, 4))


def _const_value(fill):
    """A value seam adding ``fill`` to every output: ``(..., H, tq, Dv)``."""
    return lambda qs, ks, p: np.full((*p.shape[:-1], 4), fill)


def _zero_value(qs, ks, p):
    return np.zeros((*p.shape[:-1], 4))


def _linear_value(w):
    """A value seam linear in p: ``out_t += sum_s p_ts w_s`` with ``w`` ``(S, Dv)``, and its dP share."""
    value = lambda qs, ks, p: p @ w[ks]                                      # noqa: E731
    value_grad = lambda qs, ks, p, dout: dout @ w[ks].T                      # noqa: E731
    return value, value_grad


# --- the value seam's callbacks -------------------------------------------------------------------

@pytest.mark.parametrize("fill", [np.nan, np.inf, -np.inf])
@pytest.mark.parametrize("run", [
    lambda vf: A.attention(Q, K, V, value_fn=vf),
    lambda vf: A.blockwise_attention(Q, K, V, value_fn=vf, block_size=2),
    lambda vf: fast.attention.attention(Q, K, V, value_fn=vf),
    lambda vf: fast.attention.blockwise_attention(Q, K, V, value_fn=vf, block_size=2),
], ids=["dense", "blockwise", "fast-dense", "fast-blockwise"])
def test_a_value_fn_returning_nan_or_inf_is_named(run, fill):
    with pytest.raises(ValueError, match="value_fn") as err:
        run(_const_value(fill))
    assert not isinstance(err.value, _checks.Overflow) or "value_fn" in str(err.value)


@pytest.mark.parametrize("returned", [lambda p: np.arange(6.0), lambda p: np.arange(3.0), lambda p: p[..., :1],
                                      lambda p: p[None]], ids=["arange6", "arange3", "column", "extra-dim"])
def test_a_value_grad_fn_of_the_wrong_shape_is_named_with_the_expected_shape(returned):
    vf, _ = _linear_value(RNG.standard_normal((3, 4)))
    grad = lambda qs, ks, p, dout: returned(p)                               # noqa: E731
    with pytest.raises(ValueError, match=r"value_grad_fn.*\(2, 3, 3\)"):
        A.attention_backward(Q, K, V, DOUT, value_fn=vf, value_grad_fn=grad)
    out, lse = A.blockwise_attention(Q, K, V, value_fn=vf, return_lse=True)
    for backward in (A.blockwise_attention_backward, fast.attention.blockwise_attention_backward):
        with pytest.raises(ValueError, match=r"value_grad_fn.*\(2, 3, 3\)"):
            backward(Q, K, V, out, lse, DOUT, value_grad_fn=grad)


@pytest.mark.parametrize("returned, exc", [(None, TypeError), ("abc", TypeError), (np.nan, ValueError),
                                           (np.inf, ValueError)])
def test_a_value_grad_fn_returning_none_or_nan_is_named(returned, exc):
    vf, _ = _linear_value(RNG.standard_normal((3, 4)))
    grad = (lambda qs, ks, p, dout: returned) if not isinstance(returned, float) else \
        (lambda qs, ks, p, dout: np.full(p.shape, returned))
    with pytest.raises(exc, match="value_grad_fn"):
        A.attention_backward(Q, K, V, DOUT, value_fn=vf, value_grad_fn=grad)
    out, lse = A.blockwise_attention(Q, K, V, value_fn=vf, return_lse=True)
    with pytest.raises(exc, match="value_grad_fn"):
        A.blockwise_attention_backward(Q, K, V, out, lse, DOUT, value_grad_fn=grad)


def test_a_value_fn_returning_none_is_named():
    with pytest.raises(TypeError, match="value_fn"):
        A.attention(Q, K, V, value_fn=lambda qs, ks, p: None)
    with pytest.raises(TypeError, match="value_fn"):
        A.blockwise_attention(Q, K, V, value_fn=lambda qs, ks, p: None)


def test_a_valid_value_seam_still_matches_central_differences():
    w = RNG.standard_normal((3, 4))
    vf, vg = _linear_value(w)
    dq, *_ = A.attention_backward(Q, K, V, DOUT, value_fn=vf, value_grad_fn=vg)
    e, h = RNG.standard_normal(Q.shape), 1e-6
    fd = (np.sum(A.attention(Q + h * e, K, V, value_fn=vf) * DOUT)
          - np.sum(A.attention(Q - h * e, K, V, value_fn=vf) * DOUT)) / (2 * h)
    assert np.isclose(np.sum(dq * e), fd, rtol=1e-7)
    out, lse = A.blockwise_attention(Q, K, V, value_fn=vf, return_lse=True, block_size=2)
    dq_b, *_ = A.blockwise_attention_backward(Q, K, V, out, lse, DOUT, value_grad_fn=vg, block_size=2)
    np.testing.assert_allclose(dq_b, dq, atol=1e-12)


# --- the fast twins take every reference argument -------------------------------------------------

@pytest.mark.parametrize("name", ["attention", "blockwise_attention", "blockwise_attention_backward"])
def test_the_fast_functions_take_every_argument_of_the_reference(name):
    ref = inspect.signature(getattr(A, name)).parameters
    got = inspect.signature(getattr(fast.attention, name)).parameters
    assert set(ref) <= set(got), set(ref) - set(got)


def test_fast_equals_reference_with_a_value_seam():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 4, 40, 8)) for _ in range(3))
    w = rng.standard_normal((40, 8))
    vf, vg = _linear_value(w)
    mask = A.causal_mask(40, 40)
    np.testing.assert_allclose(fast.attention.attention(q, k, v, mask=mask, value_fn=vf),
                               A.attention(q, k, v, mask=mask, value_fn=vf), atol=1e-12)
    out, lse = A.blockwise_attention(q, k, v, causal=True, block_size=16, value_fn=vf, return_lse=True)
    got, got_lse = fast.attention.blockwise_attention(q, k, v, causal=True, block_size=16, value_fn=vf,
                                                      return_lse=True)
    np.testing.assert_allclose(got, out, atol=1e-12)
    np.testing.assert_allclose(got_lse, lse, atol=1e-12)
    dout = rng.standard_normal(out.shape)
    want = A.blockwise_attention_backward(q, k, v, out, lse, dout, causal=True, block_size=16, value_grad_fn=vg)
    got = fast.attention.blockwise_attention_backward(q, k, v, out, lse, dout, causal=True, block_size=16,
                                                      value_grad_fn=vg)
    for g, w_ in zip(got, want):
        np.testing.assert_allclose(g, w_, atol=1e-12)


# --- sinks -------------------------------------------------------------------------------------------

@pytest.mark.parametrize("run", [A.attention, lambda q, k, v, **kw: A.blockwise_attention(q, k, v, **kw),
                                 fast.attention.attention, fast.attention.blockwise_attention])
def test_a_sink_that_does_not_fit_the_logits_dtype_is_named(run):
    q, k, v = (a.astype(np.float16) for a in (Q, K, V))
    with pytest.raises(ValueError, match="sinks"):
        run(q, k, v, sinks=[1e5, 0.0])


def test_a_large_float16_sink_that_fits_still_works():
    q, k, v = (a.astype(np.float16) for a in (Q, K, V))
    out = A.attention(q, k, v, sinks=[6e4, 0.0])
    assert out.dtype == np.float16 and np.all(out[0] == 0)                 # head 0 attends to its sink only


# --- the layer's backward refuses a context of another layer ------------------------------------

def _mla(make, **kw):
    args = dict(kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4)
    cls = fast.MultiHeadLatentAttention if make is fast.MultiHeadAttention else mla.MultiHeadLatentAttention
    return cls(16, 4, **{**args, **kw})


@pytest.mark.parametrize("make_a, make_b", [
    (lambda m: m(16, 4, num_kv_heads=2), lambda m: m(16, 4)),                      # GQA context into plain
    (lambda m: m(16, 4), lambda m: m(16, 4, num_kv_heads=2)),                      # and the reverse
    (lambda m: m(16, 2), lambda m: m(16, 4)),                                      # another head count
    (lambda m: m(16, 4), lambda m: m(16, 4, head_dim=8)),                          # another head dim
    (lambda m: m(8, 2), lambda m: m(16, 2)),                                       # another d_model
    (lambda m: m(16, 4), lambda m: m(16, 4, block_size=2)),                        # dense into blockwise
    (lambda m: m(16, 4, block_size=2), lambda m: m(16, 4)),                        # blockwise into dense
    (lambda m: m(16, 4, scheme=MRotary()),
     lambda m: m(16, 4, scheme=L.Rotary())),                                       # M-RoPE into RoPE
    (lambda m: m(16, 4, scheme=L.Rotary()), lambda m: m(16, 4, scheme=L.ALiBi())),  # RoPE into ALiBi
    (lambda m: m(16, 4), lambda m: m(16, 4, sinks=True)),                          # no sinks into sinks
    (lambda m: m(16, 4), lambda m: m(16, 4, bias=True)),                           # no biases into biases
    (lambda m: m(16, 4), lambda m: m(16, 4, dtype=np.float32)),                    # float64 into float32
    (lambda m: m(16, 4), lambda m: _mla(m)),                                        # plain into MLA
    (lambda m: _mla(m), lambda m: m(16, 4)),                                        # MLA into plain
    (lambda m: _mla(m), lambda m: _mla(m, kv_lora_rank=6)),                            # another latent rank
    (lambda m: _mla(m), lambda m: _mla(m, q_lora_rank=4)),
], ids=["gqa-plain", "plain-gqa", "heads", "head_dim", "d_model", "dense-blockwise", "blockwise-dense",
        "mrope-rope", "rope-alibi", "sinks", "bias", "dtype", "plain-mla", "mla-plain", "mla-rank",
        "mla-q_lora"])
@pytest.mark.parametrize("make", [L.MultiHeadAttention, fast.MultiHeadAttention], ids=["reference", "fast"])
def test_backward_refuses_the_context_of_another_layer_configuration(make, make_a, make_b):
    a, b = make_a(make), make_b(make)
    x = np.random.default_rng(2).standard_normal((1, 5, a.d_model))
    y, ctx = a(x, causal=True, return_context=True)
    with pytest.raises(ValueError, match="ctx") as err:
        b.backward(ctx, np.ones_like(y))
    assert "configuration" in str(err.value)


@pytest.mark.parametrize("block_size", [None, 2])
def test_backward_takes_the_context_of_the_same_configuration_reference_or_fast(block_size):
    x = np.random.default_rng(3).standard_normal((1, 5, 16))
    a = L.MultiHeadAttention(16, 4, num_kv_heads=2, scheme=L.Rotary(), block_size=block_size, seed=4)
    b = fast.MultiHeadAttention(16, 4, num_kv_heads=2, scheme=L.Rotary(), block_size=block_size, seed=4)
    dy = np.random.default_rng(5).standard_normal((1, 5, 16))
    y, ctx = a(x, causal=True, return_context=True)
    want = a.backward(ctx, dy)
    got = b.backward(ctx, dy)                                             # the same weights, the fast backward
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-12, err_msg=key)


# --- the streaming cache ------------------------------------------------------------------------------

def _stream(layer_cls, scheme, num_sinks, window, chunks, seed=6):
    """Run ``chunks`` (token counts) through a StreamingCache and check each call's output against
    a cache-free pass over the kept tokens then the chunk, at positions 0, 1, ... (the paper's rule).
    The tokens kept after a call are the first ``num_sinks`` of the stream and the last ``window - 1``."""
    layer = layer_cls(16, 2, scheme=scheme(), seed=seed)
    cache = StreamingCache(layer, num_sinks=num_sinks, window=window)
    x = np.random.default_rng(seed).standard_normal((1, sum(chunks), 16))
    kept, start = [], 0
    for T in chunks:
        got = layer(x[:, start:start + T], causal=True, cache=cache)
        tokens = kept + list(range(start, start + T))
        want = layer(x[:, tokens], positions=np.arange(len(tokens)), causal=True)[:, -T:]
        np.testing.assert_allclose(got, want, rtol=1e-11, atol=1e-11, err_msg=f"chunk at {start}")
        start += T
        seen = list(range(start))
        kept = seen[:num_sinks] + [t for t in seen[max(num_sinks, start - window + 1):]]
        assert cache.length == len(kept) == cache.seen and cache.total == start
        assert cache.positions.tolist() == list(range(len(kept)))


@pytest.mark.parametrize("num_sinks, window", [(0, 1), (2, 1), (1, 1), (0, 2), (3, 1)])
@pytest.mark.parametrize("scheme", [L.Rotary, L.ALiBi, L.NoPE])
@pytest.mark.parametrize("layer_cls", [L.MultiHeadAttention, fast.MultiHeadAttention], ids=["reference", "fast"])
def test_the_smallest_windows_stream_one_token_at_a_time(layer_cls, scheme, num_sinks, window):
    _stream(layer_cls, scheme, num_sinks, window, [1] * 7)


@pytest.mark.parametrize("num_sinks, window, chunks", [(2, 3, [5, 1, 4, 1]), (0, 1, [3, 1, 2]), (2, 1, [4, 3, 1]),
                                                       (1, 2, [1, 6, 1]), (4, 2, [2, 1, 7])])
@pytest.mark.parametrize("layer_cls", [L.MultiHeadAttention, fast.MultiHeadAttention], ids=["reference", "fast"])
def test_a_chunk_longer_than_the_window_attends_causally_then_is_evicted(layer_cls, num_sinks, window, chunks):
    _stream(layer_cls, L.Rotary, num_sinks, window, chunks)


def test_a_failed_streaming_step_leaves_the_cache_as_it_was():
    layer = L.MultiHeadAttention(16, 2, scheme=L.Rotary(), seed=7)
    cache = StreamingCache(layer, num_sinks=1, window=2)
    x = np.random.default_rng(8).standard_normal((1, 6, 16))
    layer(x[:, :3], causal=True, cache=cache)
    state = (cache.length, cache.seen, cache.total, cache.k.copy(), cache.v.copy(), cache.positions.copy())

    def broken(*args, **kwargs):
        raise RuntimeError("rotation failed")
    layer.scheme.rotate_k_backward = broken                                # the re-rotation at eviction fails
    with pytest.raises(RuntimeError):
        layer(x[:, 3:4], causal=True, cache=cache)
    del layer.scheme.rotate_k_backward
    assert (cache.length, cache.seen, cache.total) == state[:3]
    for got, want in zip((cache.k, cache.v, cache.positions), state[3:]):
        np.testing.assert_array_equal(got, want)
    got = layer(x[:, 3:4], causal=True, cache=cache)                       # and the stream goes on
    want = layer(x[:, [0, 2, 3]], positions=np.arange(3), causal=True)[:, -1:]
    np.testing.assert_allclose(got, want, atol=1e-12)


class _NoMemoryForCopies:
    """``numpy`` as the cache module sees it, but without memory for a copy of its buffers."""

    def __getattr__(self, name):
        return getattr(np, name)

    @staticmethod
    def zeros_like(*args, **kwargs):
        raise MemoryError("no memory")


def test_a_failed_kv_cache_commit_leaves_the_cache_as_it_was(monkeypatch):
    import minipos.cache
    layer = L.MultiHeadAttention(16, 2, scheme=L.TransformerXL(), seed=9)
    cache = layer.new_cache(mem_len=2)
    x = np.random.default_rng(10).standard_normal((1, 4, 16))
    layer(x[:, :2], causal=True, cache=cache)
    state = (cache.length, cache.seen, cache.k.copy())
    monkeypatch.setattr(minipos.cache, "np", _NoMemoryForCopies())
    with pytest.raises(MemoryError):
        layer(x[:, 2:3], causal=True, cache=cache)
    monkeypatch.undo()
    assert (cache.length, cache.seen) == state[:2]
    np.testing.assert_array_equal(cache.k, state[2])


# --- MLA ----------------------------------------------------------------------------------------------

def _rms_by_hand(x, w, eps=1e-6):
    """RMSNorm in 60-digit decimal arithmetic, one row at a time (an independent computation)."""
    getcontext().prec = 60
    out = []
    for row in np.asarray(x, np.float64).reshape(-1, np.shape(x)[-1]):
        row = [Decimal(float(a)) for a in row]
        root = (sum(a * a for a in row) / len(row) + Decimal(eps)).sqrt()
        out.append([float(Decimal(float(wi)) * a / root) for a, wi in zip(row, w)])
    return np.array(out).reshape(np.shape(x))


@pytest.mark.parametrize("value, dtype", [(1e300, np.float64), (1e200, np.float64), (-1e300, np.float64),
                                          (1e20, np.float32), (300.0, np.float16), (1e-200, np.float64),
                                          (3e38, np.float32), (6e4, np.float16)])
def test_rms_norm_of_large_entries_is_about_one_in_their_dtype(value, dtype):
    x = np.full((2, 4), value, dtype)
    x[1, 0] = -x[1, 0]
    w = np.linspace(0.5, 2.0, 4)
    got = mla.rms_norm(x, w)
    assert got.dtype == dtype
    rtol = {np.float64: 1e-12, np.float32: 1e-6, np.float16: 2e-3}[dtype]
    np.testing.assert_allclose(got.astype(np.float64), _rms_by_hand(x, w), rtol=rtol)


@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_rms_norm_and_its_backward_keep_the_dtype(dtype):
    x = np.random.default_rng(11).standard_normal((3, 4)).astype(dtype)
    assert mla.rms_norm(x, np.ones(4)).dtype == dtype
    dx, dw = mla.rms_norm_backward(x, np.ones(4), np.ones((3, 4), dtype))
    assert dx.dtype == dtype and dw.dtype == np.float64                       # dweight in weight's dtype


@pytest.mark.parametrize("scale", [1e300, 1e-150, 1.0])
def test_rms_norm_backward_of_large_entries_matches_central_differences(scale):
    rng = np.random.default_rng(12)
    x, w, dy = rng.standard_normal((2, 5)) * scale, rng.standard_normal(5), rng.standard_normal((2, 5))
    dx, dw = mla.rms_norm_backward(x, w, dy)
    e = rng.standard_normal(x.shape) * scale
    h = 1e-6
    fd = np.sum((mla.rms_norm(x + h * e, w) - mla.rms_norm(x - h * e, w)) * dy) / (2 * h)
    assert np.isclose(np.sum(dx * e), fd, rtol=1e-6, atol=1e-9)
    e = rng.standard_normal(w.shape)
    fd = np.sum((mla.rms_norm(x, w + h * e) - mla.rms_norm(x, w - h * e)) * dy) / (2 * h)
    assert np.isclose(np.sum(dw * e), fd, rtol=1e-6)


@pytest.mark.parametrize("arg", ["kv_lora_rank", "v_head_dim", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim"])
@pytest.mark.parametrize("size", [2 ** 70, 2 ** 63, 10 ** 9])
def test_mla_sizes_are_checked_before_allocating(arg, size):
    args = dict(kv_lora_rank=4, qk_nope_head_dim=4, qk_rope_head_dim=4, v_head_dim=4, q_lora_rank=4)
    args[arg] = size
    with pytest.raises(ValueError, match=arg):
        mla.MultiHeadLatentAttention(16, 4, **args)


# --- huge ints in the layer --------------------------------------------------------------------------

@pytest.mark.parametrize("arg", ["attention_chunk", "sliding_window"])
@pytest.mark.parametrize("size", [2 ** 63, 2 ** 70])
def test_huge_windows_and_chunks_are_named(arg, size):
    for make in (L.MultiHeadAttention, fast.MultiHeadAttention):
        with pytest.raises(ValueError, match=arg):
            make(8, 2, **{arg: size})(np.ones((1, 3, 8)), causal=True)


# --- found by the campaign (tests/test_campaign_layer.py) ------------------------------------------

def test_an_empty_causal_mask_builds_no_positions():
    import tracemalloc
    tracemalloc.start()
    try:
        mask = A.causal_mask(10 ** 7, 0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert mask.shape == (10 ** 7, 0) and peak < 1 << 20                   # arange(10**7) alone is 80 MB


@pytest.mark.parametrize("run", [A.attention, fast.attention.attention,
                                 lambda q, k, v: A.blockwise_attention(q, k, v, block_size=2),
                                 lambda q, k, v: fast.attention.blockwise_attention(
                                     q, k, v, block_size=2, bias_fn=lambda qs, ks: 0.0, bias_max_fn=lambda qs, ks: 0.0)])
def test_a_head_dim_of_zero_gives_the_mean_of_the_values_without_a_warning(run):
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")                                      # 1 / sqrt(0) warned and gave scale inf
        out = run(Q[..., :0], K[..., :0], V)
    np.testing.assert_allclose(out, np.broadcast_to(V.mean(axis=1, keepdims=True), V.shape), atol=1e-12)


@pytest.mark.parametrize("call", [lambda: L.MultiHeadAttention(8, 2)(np.ones((1, 3, 8)), positions=[[0, 1], [2]]),
                                  lambda: L.MultiHeadAttention(8, 2)([[[1.0] * 8], [[1.0] * 7]]),
                                  lambda: A.attention([[[1.0, 2.0], [3.0]]], Q, V)])
def test_a_ragged_sequence_is_named(call):
    with pytest.raises(ValueError, match=r"(positions|x|q) must be a rectangular array"):
        call()


@pytest.mark.parametrize("make", [L.MultiHeadAttention, fast.MultiHeadAttention])
@pytest.mark.parametrize("attr, value, exc", [("wq", np.zeros((8, 4)), ValueError), ("wo", "w", TypeError),
                                              ("wv", np.zeros((8, 8), int), TypeError), ("wk", None, TypeError)])
def test_a_weight_copied_in_with_the_wrong_shape_or_type_is_named(make, attr, value, exc):
    layer = make(8, 2)
    x = np.ones((1, 3, 8))
    y, ctx = layer(x, return_context=True)
    setattr(layer, attr, value)
    with pytest.raises(exc, match=attr):
        layer(x)
    with pytest.raises(exc, match=attr):
        layer.backward(ctx, y)


def test_an_mla_weight_of_the_wrong_shape_is_named_not_broadcast():
    # wkv_a with one rope column instead of two was broadcast to both by the shared rope key.
    layer = mla.MultiHeadLatentAttention(16, 4, kv_lora_rank=4, qk_nope_head_dim=2, qk_rope_head_dim=2, v_head_dim=4)
    layer.wkv_a = np.ones((16, 5))
    with pytest.raises(ValueError, match="wkv_a"):
        layer(np.ones((1, 3, 16)))
    with pytest.raises(ValueError, match="wkv_a"):
        mla.latent_kv(layer, np.ones((1, 3, 16)), np.arange(3))


@pytest.mark.parametrize("make", [L.MultiHeadAttention, fast.MultiHeadAttention])
def test_a_gradient_that_overflows_is_named_not_returned(make):
    layer = make(16, 4, bias=True)
    layer.wo = layer.wo * 1e-12                                             # dy @ wo^T fits; merged^T dy does not
    y, ctx = layer(np.random.default_rng(13).standard_normal((2, 5, 16)), return_context=True)
    with pytest.raises(ValueError, match="gradient of wo"):
        layer.backward(ctx, np.full((2, 5, 16), 1.7e308))
