"""Bad input, faults and shared use of attention, RoPE, ALiBi, T5 and the layer, reference and fast:
a clear error naming the argument, or the right result; memory that follows the problem; no
state that a failed call half-changed; one layer shared by threads gives the sequential results.
"""

import threading
import tracemalloc

import numpy as np
import pytest

import minipos.fast as fast
from minipos import _checks, alibi, attention, rope, t5
from minipos import layer as L

IMPLS = [(attention.blockwise_attention, "reference"), (fast.attention.blockwise_attention, "fast")]


@pytest.fixture
def small_machine(monkeypatch):
    """A pretend machine with 64 MiB, so that a request beyond it is cheap to make."""
    monkeypatch.setattr(_checks, "MAX_BYTES", 64 << 20)


# --- memory follows the problem -----------------------------------------------------------------

@pytest.mark.parametrize("blockwise", [f for f, _ in IMPLS], ids=[n for _, n in IMPLS])
def test_a_huge_block_size_is_clamped_to_the_problem(blockwise):
    # 8 tokens with block_size 10^9 asked for 15 GiB before; the block is clamped to max(T, S).
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 8, 4)) for _ in range(3))
    tracemalloc.start()
    try:
        out = blockwise(q, k, v, causal=True, block_size=10 ** 9, bias_fn=lambda qs, ks: 0.0)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1 << 20
    np.testing.assert_allclose(out, attention.attention(q, k, v, mask=attention.causal_mask(8, 8)), atol=1e-12)


def test_fast_bound_with_a_huge_block_size_is_clamped():
    rng = np.random.default_rng(1)
    q, k, v = (rng.standard_normal((2, 8, 4)) for _ in range(3))
    tracemalloc.start()
    try:
        fast.attention.blockwise_attention(q, k, v, causal=True, block_size=10 ** 9, bias_fn=lambda qs, ks: 0.0,
                                           bias_max_fn=lambda qs, ks: 0.0)
        layer = fast.MultiHeadAttention(16, 2, scheme=L.ALiBi(), block_size=10 ** 9)
        layer(rng.standard_normal((1, 8, 16)), causal=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4 << 20


@pytest.mark.parametrize("call, name", [
    (lambda: rope.apply_rope(np.ones((5, 8)), 10 ** 9), "positions must have length 5"),
    (lambda: fast.rope.apply_rope(np.ones((5, 8)), 10 ** 9), "positions must have length 5"),
    (lambda: L.MultiHeadAttention(8, 2)(np.ones((1, 5, 8)), positions=10 ** 9), "positions must have length 5"),
    (lambda: L.KVCache().append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), 10 ** 9), "positions must have length 2"),
])
def test_an_int_for_positions_is_checked_before_arange_is_built(call, name):
    with pytest.raises(ValueError, match=name):
        call()


@pytest.mark.parametrize("call, name", [
    (lambda: attention.causal_mask(10 ** 6, 6000), "causal_mask"),
    (lambda: alibi.alibi_slopes(10 ** 7), "alibi_slopes"),
    (lambda: alibi.alibi_bias(alibi.alibi_slopes(8), 2000, 2000), "alibi_bias"),
    (lambda: fast.alibi.alibi_bias(alibi.alibi_slopes(8), 2000, 2000, dtype=np.float32), "alibi_bias"),
    (lambda: t5.t5_bias(np.zeros((32, 8)), 2000, 2000), "t5_bias"),
    (lambda: fast.t5.t5_bias(np.zeros((32, 8)), 2000, 2000), "t5_bias"),
    (lambda: t5.t5_bias(np.zeros((32, 2)), 10 ** 10, [0]), "q_positions"),
    (lambda: t5.relative_position_bucket(0, num_buckets=10 ** 8, max_distance=10 ** 9), "num_buckets"),
    (lambda: L.MultiHeadAttention(10 ** 5, 2), "MultiHeadAttention's weights"),
    (lambda: L.MultiHeadAttention(16, 2, scheme=L.DeBERTa(position_buckets=-1, max_relative_positions=10 ** 8)),
     "rel_embeddings"),
    (lambda: attention.attention(np.ones((8, 2000, 2)), np.ones((8, 2000, 2)), np.ones((8, 2000, 2))), "logits"),
    (lambda: rope.rope_inv_freq(2 * 10 ** 8), "rope_inv_freq"),
    (lambda: rope.rope_angles(10 ** 6, rope.rope_inv_freq(64)), "rope_angles"),
    (lambda: rope.rotation_matrix(0, 4000), "rotation_matrix"),
])
def test_an_output_that_cannot_fit_names_its_argument(small_machine, call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_exact_t5_buckets_are_linear_in_the_number_of_buckets():
    # The exact thresholds were found by bisection on powers of big integers (358 s at 4 * 10^4
    # buckets); they now start from the logarithm of the real-number boundary. Spot-check against
    # the integer definition b(n) >= E + k  <=>  n^W >= M^k E^(W - k) at a few buckets.
    P, M = 50_000, 10 ** 6
    first = t5.first_distance_of_bucket(bidirectional=False, num_buckets=P, max_distance=M, exact=True)
    E, W = P // 2, P - P // 2
    for k in (1, 7, 1000, 12345, W - 1):
        n = int(first[E + k])
        if n < 0:
            continue
        assert n ** W >= M ** k * E ** (W - k) > (n - 1) ** W


# --- no NaN or inf where an error belongs ---------------------------------------------------------

@pytest.mark.parametrize("call, match", [
    (lambda: rope.apply_rope(np.ones((3, 8)), 3, inv_freq=[1e308] * 4), "finite"),
    (lambda: rope.rope_angles([10 ** 9], [1e308, 1.0]), "finite"),
    (lambda: rope.rotation_matrix(10 ** 9, 4, inv_freq=[1e308, 1.0]), "finite"),
    (lambda: rope.rope_inv_freq(2048, base=1e-320), "base"),
    (lambda: attention.attention(np.ones((1, 2, 2), np.float32), np.ones((1, 2, 2), np.float32),
                                 np.ones((1, 2, 2), np.float32), bias=np.full((1, 2, 2), 1e39)), "overflow"),
])
def test_inputs_that_make_non_finite_results_are_refused(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# --- flags and names ------------------------------------------------------------------------------

@pytest.mark.parametrize("call, name", [
    (lambda: alibi.alibi_bias([0.5], 2, 2, symmetric="no"), "symmetric"),
    (lambda: fast.alibi.alibi_bias_bound([0.5], 2, 2, symmetric="no"), "symmetric"),
    (lambda: t5.relative_position_bucket(0, exact="no"), "exact"),
    (lambda: attention.attention(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)), return_weights="no"),
     "return_weights"),
    (lambda: attention.blockwise_attention(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)), causal="no"),
     "causal"),
    (lambda: L.MultiHeadAttention(16, 2, bias="no"), "bias"),
    (lambda: L.MultiHeadAttention(16, 2, dtype="foo"), "dtype"),
    (lambda: attention.softmax(np.ones(3), axis="a"), "axis"),
    (lambda: L.ALiBi(symmetric="no"), "symmetric"),
])
def test_flags_and_dtypes_must_be_what_they_say(call, name):
    with pytest.raises(TypeError, match=name):
        call()


@pytest.mark.parametrize("call, match", [
    (lambda: attention.softmax(np.ones(3), axis=1), "axis"),
    (lambda: attention.blockwise_attention(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)), causal=True,
                                           q_offset=2 ** 63), "q_offset"),
    (lambda: t5.relative_position_bucket(0, max_distance=2 ** 70), "max_distance"),
    (lambda: L.Rotary(scaling={"rope_type": "default", "rope_theta": -1.0}), r"scaling\['rope_theta'\]"),
    (lambda: L.KVCache().append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 3, 2)), [0, 1]), "k and v"),
    (lambda: L.KVCache().append(np.ones((1, 1, 2, 2)), np.ones((1, 1, 2, 2)), [0.5, 1.5]), "positions must hold integers"),
    (lambda: L.Sinusoidal(base=0.0), "base"),
    (lambda: L.TransformerXL(base=-1.0), "base"),
])
def test_errors_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_check_float_names_an_integer_too_large_for_a_float():
    with pytest.raises(ValueError, match="scale"):
        attention.attention(np.ones((1, 2, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2)), scale=2 ** 1100)


def test_an_empty_sequence_gives_an_empty_output():
    for cls in (L.NoPE, L.ALiBi, L.Rotary, L.T5Bias):
        for make in (L.MultiHeadAttention, fast.MultiHeadAttention):
            y = make(8, 2, scheme=cls())(np.zeros((1, 0, 8)), causal=True)
            assert y.shape == (1, 0, 8)


# --- state: the cache, shared schemes, threads ----------------------------------------------------

@pytest.mark.parametrize("make", [L.MultiHeadAttention, fast.MultiHeadAttention])
@pytest.mark.parametrize("block_size", [None, 2])
def test_a_failed_call_leaves_the_cache_as_it_was(make, block_size):
    layer = make(8, 2, scheme=L.T5Bias(bidirectional=False), block_size=block_size)
    x = np.random.default_rng(2).standard_normal((1, 4, 8))
    cache = layer.new_cache()
    layer(x[:, :3], causal=True, cache=cache)
    keys = cache.k.copy()
    table = layer.scheme.table.copy()
    layer.scheme.table[:] = np.nan                                        # the bias is now NaN
    with pytest.raises(ValueError):
        layer(x[:, 3:], causal=True, cache=cache)
    assert cache.length == 3 and cache.seen == 3
    np.testing.assert_array_equal(cache.k, keys)
    layer.scheme.table[:] = table
    step = layer(x[:, 3:], causal=True, cache=cache)
    np.testing.assert_allclose(step, layer(x, causal=True)[:, 3:], atol=1e-12)


def test_a_cache_belongs_to_one_layer():
    a, b = L.MultiHeadAttention(8, 2, seed=1), L.MultiHeadAttention(8, 2, seed=2)
    x = np.ones((1, 2, 8))
    cache = a.new_cache()
    a(x, cache=cache)
    with pytest.raises(ValueError, match="another layer"):
        b(x, cache=cache)
    bare = L.KVCache()
    b(x, cache=bare)                                                       # claimed by b
    with pytest.raises(ValueError, match="another layer"):
        a(x, cache=bare)


def test_a_scheme_belongs_to_one_layer():
    scheme = L.LearnedAbsolute(8)
    L.MultiHeadAttention(8, 2, scheme=scheme)
    with pytest.raises(ValueError, match="another layer"):
        L.MultiHeadAttention(8, 2, scheme=scheme)


@pytest.mark.parametrize("scaling", [{"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 8},
                                     {"rope_type": "longrope", "short_factor": [1.0, 1.5], "long_factor": [2.0, 4.0],
                                      "original_max_position_embeddings": 8, "max_position_embeddings": 32}])
def test_one_layer_shared_by_threads_gives_the_sequential_results(scaling, monkeypatch):
    # The frequencies depend on the call's length. They used to be stored on the scheme for the
    # call, so a second thread could rotate with the first one's. A barrier inside apply_rope
    # forces the two threads' calls to interleave there.
    layer = L.MultiHeadAttention(8, 2, scheme=L.Rotary(scaling=scaling))
    rng = np.random.default_rng(3)
    xs = [rng.standard_normal((1, T, 8)) for T in (3, 17)]
    want = [layer(x, causal=True) for x in xs]
    barrier = threading.Barrier(2, timeout=5)
    real = rope.apply_rope

    def interleaved(*args, **kwargs):
        try:
            barrier.wait()
        except threading.BrokenBarrierError:
            pass
        return real(*args, **kwargs)
    monkeypatch.setattr(rope, "apply_rope", interleaved)
    got = [None, None]

    def run(i):
        got[i] = layer(xs[i], causal=True)
    threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-12)
