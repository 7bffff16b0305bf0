"""Tests of minipos.fast.MultiHeadAttention: equal to the reference layer for every scheme, and
its speed machinery (bias blocks kept between calls, bounds, threads) changes no result."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import minipos.fast.attention
import minipos.fast.t5
from minipos import layer as ref
from minipos.fast import MultiHeadAttention
from minipos.fast import _threads
from minipos.fast.layer import HINTS
from minipos.layer import ALiBi, T5Bias
from _schemes import with_variants

ALL = with_variants(512)
"""Every registered scheme (its registry example for a 512-token model) and the variants of ``_schemes``."""


def _x(B=2, T=12, d=16, seed=0):
    return np.random.default_rng(seed).standard_normal((B, T, d))


def _pair(name, *, dtype=np.float64, block_size=None, seed=3):
    """The reference layer and a fast one with the same weights and scheme parameters."""
    a = ref.MultiHeadAttention(16, 4, scheme=ALL[name](), seed=seed, dtype=dtype, block_size=block_size)
    b = MultiHeadAttention(16, 4, scheme=ALL[name](), seed=seed, dtype=dtype, block_size=block_size)
    return a, b


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(sorted(ALL)), T=st.integers(1, 20), block=st.sampled_from([None, 1, 3, 8]),
       causal=st.booleans(), pad=st.booleans(), start=st.integers(0, 9), float32=st.booleans(),
       seed=st.integers(0, 2 ** 16))
def test_fast_layer_equals_reference(name, T, block, causal, pad, start, float32, seed):
    dtype = np.float32 if float32 else np.float64
    a, b = _pair(name, dtype=dtype, block_size=block)
    x = _x(B=2, T=T, seed=seed).astype(dtype)
    mask = None
    if pad:
        mask = np.ones((2, T), bool)
        mask[1, T // 2:] = False
    positions = start + np.arange(T)
    want = a(x, positions=positions, causal=causal, mask=mask)
    got = b(x, positions=positions, causal=causal, mask=mask)
    tol = dict(rtol=1e-5, atol=1e-5) if float32 else dict(rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(got, want, **tol)


@pytest.mark.parametrize("name", sorted(ALL))
def test_fast_dense_path_on_large_problems_equals_reference(name):
    # T = 300 with 4 heads is past the size where the dense default runs the blockwise kernel.
    a, b = _pair(name)
    x = _x(B=1, T=300, seed=1)
    for causal in (False, True):
        np.testing.assert_allclose(b(x, causal=causal), a(x, causal=causal), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", sorted(ALL))
def test_fast_layer_cache_equals_reference_cache(name):
    a, b = _pair(name, block_size=4)
    x = _x(B=1, T=10, seed=2)
    ca, cb = a.new_cache(), b.new_cache()
    for t in range(0, 10, 3):
        np.testing.assert_allclose(b(x[:, t:t + 3], causal=True, cache=cb), a(x[:, t:t + 3], causal=True, cache=ca),
                                   rtol=1e-10, atol=1e-12)


def test_weights_come_from_the_reference_dense_step():
    a, b = _pair("alibi")
    x = _x(B=1, T=6)
    ya, wa = a(x, causal=True, return_weights=True)
    yb, wb = b(x, causal=True, return_weights=True)
    np.testing.assert_allclose(yb, ya, rtol=1e-12)
    np.testing.assert_allclose(wb, wa, rtol=1e-12)


def test_a_subclass_that_changes_the_bias_gets_no_hint():
    class Doubled(ALiBi):
        def bias(self, q_positions, k_positions):
            return 2 * super().bias(q_positions, k_positions)
    a = ref.MultiHeadAttention(16, 4, scheme=Doubled(), seed=3, block_size=4)
    b = MultiHeadAttention(16, 4, scheme=Doubled(), seed=3, block_size=4)
    x = _x(B=1, T=12)
    np.testing.assert_allclose(b(x, causal=True), a(x, causal=True), rtol=1e-10, atol=1e-12)
    assert type(b.scheme) not in HINTS


@pytest.mark.parametrize("symmetric", [True, False])
def test_alibi_bias_bound_is_never_below_the_bias(symmetric):
    # The bound lets the blockwise path skip heads; a bound below the true block maximum would
    # drop live logits. Random position sets, sorted or not, overlapping or apart.
    layer = MultiHeadAttention(16, 4, scheme=ALiBi(symmetric=symmetric))
    bound_of = HINTS[ALiBi].bound
    rng = np.random.default_rng(21)
    for _ in range(200):
        i = rng.integers(0, 60, size=rng.integers(1, 8))
        j = rng.integers(0, 60, size=rng.integers(1, 8))
        bias = layer.scheme.bias(i, j)                                       # (H, tq, tk)
        bound = bound_of(layer.scheme, i, j)                                 # (H, 1, 1)
        assert bound.shape == (4, 1, 1)
        assert np.all(bias.max(axis=(1, 2), keepdims=True) <= bound)
    # tight where the ranges are apart: queries 10..11, keys 0..3 -> least distance 7
    np.testing.assert_allclose(bound_of(layer.scheme, np.arange(10, 12), np.arange(4)),
                               -layer.scheme.slopes[:, None, None] * 7)


def test_bias_blocks_are_kept_across_passes_until_the_table_changes(monkeypatch):
    # T5's bias depends on the table: blocks computed in one pass serve the next, and a new
    # table (a checkpoint copied in) is used at once.
    x = _x(B=1, T=12)
    blocked = MultiHeadAttention(16, 4, scheme=T5Bias(), seed=5, block_size=4)
    dense = ref.MultiHeadAttention(16, 4, scheme=T5Bias(), seed=5)
    calls = []
    real = minipos.fast.t5.t5_bias
    monkeypatch.setattr(minipos.fast.t5, "t5_bias", lambda *a, **kw: calls.append(1) or real(*a, **kw))
    first = blocked(x, causal=True)
    computed = len(calls)
    assert computed > 0
    np.testing.assert_array_equal(blocked(x, causal=True), first)
    assert len(calls) == computed                                           # every block came from the memo
    new_table = np.random.default_rng(6).standard_normal(blocked.scheme.table.shape)
    blocked.scheme.table = new_table
    dense.scheme.table = new_table.copy()
    np.testing.assert_allclose(blocked(x, causal=True), dense(x, causal=True), rtol=1e-10, atol=1e-12)
    assert len(calls) > computed


def test_a_full_bias_memo_is_started_afresh_by_the_next_pass():
    # Decoding meets a new block each step; once the memo is three quarters full the next pass
    # starts a new one, so blocks that would be met again can still be kept.
    layer = MultiHeadAttention(16, 4, scheme=ALiBi(), seed=8, block_size=4)
    x = _x(B=1, T=8)
    layer(x, causal=True)
    memo = layer._memo
    assert memo is not None and memo.blocks and not memo.full()
    layer(x, causal=True)
    assert layer._memo is memo                                             # kept while there is room
    memo.room = memo.limit // 4                                           # as if decoding had filled it
    layer(x, causal=True)
    assert layer._memo is not memo and layer._memo.blocks


def test_blockwise_layer_equals_dense_with_threads(monkeypatch):
    # The threaded path (forced here at a small size) gives the same bits as one thread.
    monkeypatch.setattr(minipos.fast.attention, "_THREADED_WORK", 0)
    x = _x(B=2, T=13).astype(np.float32)
    layer = MultiHeadAttention(16, 4, scheme=ALiBi(), seed=7, dtype=np.float32, block_size=4)
    monkeypatch.setenv("MINIPOS_NUM_THREADS", "1")
    one = layer(x, causal=True)
    monkeypatch.setenv("MINIPOS_NUM_THREADS", "2")
    monkeypatch.setattr(_threads, "_openblas", lambda: ("any",))            # as if OpenBLAS were found
    monkeypatch.setattr(_threads, "_enter", lambda: None)
    monkeypatch.setattr(_threads, "_exit", lambda: None)
    np.testing.assert_array_equal(layer(x, causal=True), one)
    dense = ref.MultiHeadAttention(16, 4, scheme=ALiBi(), seed=7, dtype=np.float32)
    np.testing.assert_allclose(one, dense(x, causal=True), rtol=1e-5, atol=1e-5)


def test_the_memo_keeps_what_fits_and_hands_back_what_does_not():
    from minipos.fast.layer import _DistanceMemo
    memo = _DistanceMemo("stamp", limit=100)
    q, k = np.arange(2), np.arange(3)
    small = memo.get(q, k, lambda: np.zeros(6, np.float64))               # 48 bytes: kept
    assert memo.get(q, k, lambda: pytest.fail("computed twice")) is small
    big = memo.get(q + 5, k, lambda: np.ones(10))                         # 80 bytes > 52 left: not kept
    assert big.sum() == 10 and (-5, 2, 3) not in memo.blocks


def test_projections_on_threads_equal_the_reference(monkeypatch):
    # Steps 2 and 8 share their rows among the workers (forced here at a small size).
    monkeypatch.setattr(_threads, "_THREADED_MATMUL", 0)
    monkeypatch.setenv("MINIPOS_NUM_THREADS", "2")
    monkeypatch.setattr(_threads, "_openblas", lambda: ("any",))            # as if OpenBLAS were found
    monkeypatch.setattr(_threads, "_enter", lambda: None)
    monkeypatch.setattr(_threads, "_exit", lambda: None)
    for name in ("alibi", "rope", "deberta"):
        a, b = _pair(name)
        b.bo = a.bo = np.linspace(-1, 1, 16)
        x = _x(B=2, T=9)
        np.testing.assert_allclose(b(x, causal=True), a(x, causal=True), rtol=1e-10, atol=1e-12)


def test_a_kept_extra_block_is_computed_once_when_tasks_ask_together():
    # The kernel's tasks for groups of heads ask for the same block at once: one computes it, the
    # others wait for it (the forward of a pass with a context used to compute it once per task).
    import threading
    import time
    layer = MultiHeadAttention(16, 4, scheme=ref.TransformerXL(), seed=0)
    calls = []

    def extra(qs, ks):
        calls.append((qs, ks))
        time.sleep(0.05)
        return np.ones((1, 4, qs.stop - qs.start, ks.stop - ks.start))
    kept = layer._kept_extra(extra, 1024)
    got = [None] * 3

    def ask(i):
        got[i] = kept(slice(0, 4), slice(0, 4))
    threads = [threading.Thread(target=ask, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and got[0] is got[1] is got[2]
    assert kept(slice(0, 4), slice(4, 8)).shape == (1, 4, 4, 4) and len(calls) == 2


@pytest.mark.parametrize("name, module, names", [
    ("rope", "rope", ("apply_rope", "apply_rope_backward")),
    ("rope_partial", "rope", ("apply_rope", "apply_rope_backward")),
    ("rope_dynamic", "rope", ("apply_rope", "apply_rope_backward")),
    ("xpos", "xpos", ("apply_xpos", "apply_xpos_backward"))])
def test_rotations_run_the_fast_module_and_equal_the_reference(name, module, names, monkeypatch):
    # Step 3 and its backward run minipos.fast.rope / minipos.fast.xpos (ROTATE); forward, a cached
    # continuation and the gradients equal the reference layer's.
    import importlib
    fast_module = importlib.import_module("minipos.fast." + module)
    calls = []
    for fn in names:
        original = getattr(fast_module, fn)
        monkeypatch.setattr(fast_module, fn, lambda *a, _f=original, _n=fn, **k: calls.append(_n) or _f(*a, **k))
    a, b = _pair(name)
    x, dy = _x(B=2, T=10), _x(B=2, T=10, seed=1)
    ya, ctx_a = a(x, causal=True, return_context=True)
    yb, ctx_b = b(x, causal=True, return_context=True)
    np.testing.assert_allclose(yb, ya, rtol=1e-10, atol=1e-12)
    ga, gb = a.backward(ctx_a, dy), b.backward(ctx_b, dy)
    for key in ga:
        np.testing.assert_allclose(gb[key], ga[key], rtol=1e-9, atol=1e-11, err_msg=key)
    assert calls.count(names[0]) == 2 and calls.count(names[1]) == 2
    ca, cb = a.new_cache(), b.new_cache()
    a(x[:, :6], causal=True, cache=ca), b(x[:, :6], causal=True, cache=cb)
    np.testing.assert_allclose(b(x[:, 6:], causal=True, cache=cb), a(x[:, 6:], causal=True, cache=ca),
                               rtol=1e-10, atol=1e-12)
