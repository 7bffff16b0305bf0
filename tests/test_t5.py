"""Tests for minipos.t5: buckets, first distances, the (H, T, S) bias and its two forms."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos.fast.t5 import t5_bias as fast_t5_bias
from minipos.t5 import first_distance_of_bucket, relative_position_bucket, t5_bias

DATA = Path(__file__).parent / "data" / "t5_buckets_reference.txt"
RANGE = 10**6
STANDARD = [(b, k, m) for b in (True, False)
            for k, m in ((32, 128), (32, 256), (64, 256), (16, 64), (128, 1024))]

# n = key - query = -130 … 130, num_buckets=32, max_distance=128; printed by transformers 5.24.0
# `T5Attention._relative_position_bucket(torch.arange(-130, 131), bidirectional=..., 32, 128)`.
BIDIRECTIONAL_32_128 = [
    15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15,
    15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 15, 14, 14, 14, 14, 14, 14, 14, 14,
    14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 14, 13, 13, 13, 13, 13,
    13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 13, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12, 12,
    12, 12, 12, 11, 11, 11, 11, 11, 11, 11, 11, 11, 10, 10, 10, 10, 10, 10, 10, 9, 9, 9, 9, 8,
    8, 8, 8, 7, 6, 5, 4, 3, 2, 1, 0, 17, 18, 19, 20, 21, 22, 23, 24, 24, 24, 24, 25, 25,
    25, 25, 26, 26, 26, 26, 26, 26, 26, 27, 27, 27, 27, 27, 27, 27, 27, 27, 28, 28, 28, 28, 28, 28,
    28, 28, 28, 28, 28, 28, 28, 28, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29,
    29, 29, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30, 30,
    30, 30, 30, 30, 30, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31,
    31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31,
]
CAUSAL_32_128 = [
    31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 31, 30, 30, 30, 30, 30, 30,
    30, 30, 30, 30, 30, 30, 30, 30, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 29, 28, 28, 28, 28,
    28, 28, 28, 28, 28, 28, 27, 27, 27, 27, 27, 27, 27, 27, 27, 27, 26, 26, 26, 26, 26, 26, 26, 26,
    25, 25, 25, 25, 25, 25, 25, 24, 24, 24, 24, 24, 24, 23, 23, 23, 23, 23, 23, 22, 22, 22, 22, 22,
    21, 21, 21, 21, 20, 20, 20, 20, 19, 19, 19, 18, 18, 18, 17, 17, 16, 16, 16, 15, 14, 13, 12, 11,
    10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
    0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
]


def _reference_runs() -> dict:
    """{(bidirectional, K, M): (run starts, run buckets)} from the data file."""
    table = {}
    for line in DATA.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        b, k, m, *runs = line.split()
        starts, buckets = zip(*(map(int, run.split(":")) for run in runs))
        table[(b == "1", int(k), int(m))] = (np.array(starts), np.array(buckets))
    return table


def _runs(buckets: np.ndarray) -> tuple:
    """Run-length form of the buckets of arange(-10**6, 10**6 + 1), as in the data file."""
    change = np.flatnonzero(np.diff(buckets)) + 1
    return np.concatenate([[-RANGE], change - RANGE]), buckets[np.concatenate([[0], change])]


REFERENCE = _reference_runs()


# --- buckets ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("exact", [False, True])
@pytest.mark.parametrize("bidirectional, expected", [(True, BIDIRECTIONAL_32_128), (False, CAUSAL_32_128)])
def test_buckets_from_minus_130_to_130_match_transformers(bidirectional, expected, exact):
    out = relative_position_bucket(np.arange(-130, 131), bidirectional=bidirectional, exact=exact)
    assert out.dtype == np.int64
    np.testing.assert_array_equal(out, expected)


def _expand(starts: np.ndarray, buckets: np.ndarray) -> np.ndarray:
    """The buckets of arange(-10**6, 10**6 + 1) from their runs."""
    return np.repeat(buckets, np.diff(np.append(starts, RANGE + 1)))


def test_data_file_covers_the_standard_configurations():
    assert set(STANDARD) <= set(REFERENCE)
    for starts, buckets in REFERENCE.values():
        assert starts[0] == -RANGE and np.all(np.diff(starts) > 0) and starts[-1] <= RANGE
        assert np.all(np.diff(buckets) != 0)


@pytest.mark.parametrize("config", STANDARD)
def test_every_distance_within_a_million_matches_the_committed_reference(config):
    bidirectional, k, m = config
    n = np.arange(-RANGE, RANGE + 1)
    for exact in (False, True):   # at the standard configurations float32 changes nothing
        out = relative_position_bucket(n, bidirectional=bidirectional, num_buckets=k, max_distance=m,
                                       exact=exact)
        for got, expected in zip(_runs(out), REFERENCE[config]):
            np.testing.assert_array_equal(got, expected)


def test_float32_boundary_differs_from_exact_arithmetic():
    # Causal K = 15, M = 636: P = 15, E = 7, the log buckets span 8 buckets. In real numbers bucket
    # 7 + 6 = 13 starts at the smallest n with n**8 * 7**6 >= 636**6 * 7**8, which is 207:
    assert not 206**8 * 7**6 >= 636**6 * 7**8 and 207**8 * 7**6 >= 636**6 * 7**8
    # transformers 5.24.0 printed [13, 12, 13] for n = -206, -205, -207 (float32 reaches 6.0 at 206).
    n = np.array([-206, -205, -207])
    config = dict(bidirectional=False, num_buckets=15, max_distance=636)
    np.testing.assert_array_equal(relative_position_bucket(n, **config), [13, 12, 13])
    np.testing.assert_array_equal(relative_position_bucket(n, **config, exact=True), [12, 12, 13])
    full = np.arange(-RANGE, RANGE + 1)
    reference = _expand(*REFERENCE[(False, 15, 636)])
    np.testing.assert_array_equal(relative_position_bucket(full, **config), reference)
    exact = relative_position_bucket(full, **config, exact=True)
    np.testing.assert_array_equal(full[exact != reference], [-206])


def test_scalar_and_shapes():
    out = relative_position_bucket(-50)
    assert out.shape == () and out.dtype == np.int64 and out == 13
    grid = np.array([[-3, 0], [4, 200]])
    np.testing.assert_array_equal(relative_position_bucket(grid), [[3, 0], [20, 31]])   # from the list above
    np.testing.assert_array_equal(relative_position_bucket(np.array([-3.0, 4.0])), [3, 20])
    extremes = np.array([np.iinfo(np.int64).min, np.iinfo(np.int64).max])
    np.testing.assert_array_equal(relative_position_bucket(extremes), [15, 31])


def test_bidirectional_is_two_causal_halves():
    # The reference halves K and adds K//2 for n > 0, so each side is the causal function of K//2.
    n = np.arange(0, 3000)
    for k, m in ((32, 128), (64, 256), (33, 128)):
        causal = relative_position_bucket(-n, bidirectional=False, num_buckets=k // 2, max_distance=m)
        np.testing.assert_array_equal(relative_position_bucket(-n, num_buckets=k, max_distance=m), causal)
        np.testing.assert_array_equal(relative_position_bucket(n[1:], num_buckets=k, max_distance=m),
                                      causal[1:] + k // 2)


@settings(max_examples=50, deadline=None)
@given(k=st.integers(4, 200), extra=st.integers(1, 5000), exact=st.booleans(), bidirectional=st.booleans())
def test_buckets_are_in_range_and_monotone_in_distance(k, extra, exact, bidirectional):
    per_dir = k // 2 if bidirectional else k
    m = per_dir // 2 + extra
    out = relative_position_bucket(-np.arange(0, 2 * m), bidirectional=bidirectional, num_buckets=k,
                                   max_distance=m, exact=exact)
    assert out.min() == 0 and out.max() == per_dir - 1
    assert np.all(np.diff(out) >= 0)
    np.testing.assert_array_equal(out[: per_dir // 2], np.arange(per_dir // 2))   # one distance each


# --- first distance of each bucket ---------------------------------------------------------------

def test_first_distances_32_128_bidirectional():
    # Run starts of the reference (data file): the last bucket starts at |n| = 91, not 128, and
    # bucket 16 (n = +0) is never used.
    first = first_distance_of_bucket()
    side = [0, 1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 23, 32, 46, 64, 91]
    np.testing.assert_array_equal(first, side + [-1] + side[1:])
    assert first[15] == first[31] == 91 and first[16] == -1
    assert 16 not in REFERENCE[(True, 32, 128)][1]                   # nor in the reference's runs


@pytest.mark.parametrize("config", STANDARD)
def test_first_distances_are_the_run_starts_of_the_reference(config):
    bidirectional, k, m = config
    starts, buckets = REFERENCE[config]
    ends = np.append(starts[1:] - 1, RANGE)                          # each run is [start, end]
    nearest = np.where((starts <= 0) & (ends >= 0), 0, np.minimum(abs(starts), abs(ends)))
    expected = np.full(k, -1)
    for bucket, distance in sorted(zip(buckets, nearest), reverse=True):
        expected[bucket] = distance                                   # smallest |n| wins
    np.testing.assert_array_equal(
        first_distance_of_bucket(bidirectional=bidirectional, num_buckets=k, max_distance=m), expected)


def test_first_distances_mark_unused_buckets():
    # Odd K (bidirectional): K // 2 = 16 per direction, so bucket 32 of 33 is never used.
    first = first_distance_of_bucket(num_buckets=33)
    assert first.shape == (33,) and first[32] == -1 and first[16] == -1
    # Causal K = 8, M = 5: E = 4 and ln(n/4)/ln(5/4)*4 is 0 at n = 4 and 4 at n = 5, so n = 5 jumps
    # from bucket 4 to min(P - 1, 4 + 4) = 7; buckets 5 and 6 are empty.
    first = first_distance_of_bucket(bidirectional=False, num_buckets=8, max_distance=5)
    np.testing.assert_array_equal(first, [0, 1, 2, 3, 4, -1, -1, 5])


# --- the (H, T, S) bias --------------------------------------------------------------------------

TINY = np.array([[b, -10.0 * b] for b in range(8)], dtype=np.float32)   # table[b, h]: (K=8, H=2)


def test_t5_bias_tiny_bidirectional_by_hand():
    # K = 8, M = 16: P = 4, E = 2; bucket 3 of a side starts at (m/2)**2 >= 8, i.e. m = 6, so
    # |n| -> 0, 1, 2, 2, 2, 2, 3, 3 and n > 0 adds 4. n = s - t for t = 0, 1, 2 and s = 0 … 7:
    buckets = [[0, 5, 6, 6, 6, 6, 7, 7],
               [1, 0, 5, 6, 6, 6, 6, 7],
               [2, 1, 0, 5, 6, 6, 6, 6]]
    expected = np.stack([np.array(buckets, np.float32), -10 * np.array(buckets, np.float32)])   # (H, T, S)
    for form in (t5_bias, fast_t5_bias):
        out = form(TINY, 3, 8, num_buckets=8, max_distance=16)
        assert out.dtype == np.float32 and out.shape == (2, 3, 8)
        np.testing.assert_array_equal(out, expected)


def test_t5_bias_tiny_causal_with_cache_by_hand():
    # K = 4, M = 8 causal: E = 2, bucket 3 starts at (m/2)**2 >= 4, i.e. m = 4; future keys -> 0.
    # Two queries at positions 5, 6 (after a cache of 5) and keys 0 … 6: n = s - t.
    table = TINY[:4]
    buckets = [[3, 3, 2, 2, 1, 0, 0],
               [3, 3, 3, 2, 2, 1, 0]]
    expected = np.stack([np.array(buckets, np.float32), -10 * np.array(buckets, np.float32)])
    for form in (t5_bias, fast_t5_bias):
        out = form(table, [5, 6], 7, bidirectional=False, num_buckets=4, max_distance=8)
        np.testing.assert_array_equal(out, expected)


positions = st.lists(st.integers(0, 400), min_size=0, max_size=12).map(np.array)


@settings(max_examples=60, deadline=None)
@given(q=positions, k=positions, start=st.integers(0, 300), length=st.integers(1, 40),
       bidirectional=st.booleans(), exact=st.booleans())
def test_fast_form_equals_reference_form(q, k, start, length, bidirectional, exact):
    rng = np.random.default_rng(len(q) + 7 * len(k))
    table = rng.standard_normal((32, 3))
    contiguous = start + np.arange(length)
    for qq, kk in ((q, k), (contiguous, np.arange(start + length)), (contiguous, k)):
        qq, kk = qq.astype(np.int64), kk.astype(np.int64)
        fast = fast_t5_bias(table, qq, kk, bidirectional=bidirectional, exact=exact)
        slow = t5_bias(table, qq, kk, bidirectional=bidirectional, exact=exact)
        assert fast.shape == (3, len(qq), len(kk))
        np.testing.assert_array_equal(fast, slow)


@pytest.mark.parametrize("T, S", [(37, 50), (50, 37), (8, 8)])
def test_toeplitz_copy_on_threads_equals_reference_form(T, S, monkeypatch):
    # Large Toeplitz biases are copied out by several threads, each a band of rows; forced here
    # at a small size (every band boundary is exercised with 37 and 50 rows).
    from minipos.fast import _threads
    monkeypatch.setattr(_threads, "_THREADED_COPY", 0)
    monkeypatch.setattr(_threads, "copy_workers", lambda: 3)
    table = np.random.default_rng(9).standard_normal((32, 2))
    np.testing.assert_array_equal(fast_t5_bias(table, T, S), t5_bias(table, T, S))


@settings(max_examples=30, deadline=None)
@given(shift=st.integers(0, 10**6), t=st.integers(1, 20), s=st.integers(1, 20))
def test_bias_depends_only_on_key_minus_query(shift, t, s):
    table = np.random.default_rng(t * s).standard_normal((32, 2))
    q, k = np.arange(t), np.arange(s)
    np.testing.assert_array_equal(t5_bias(table, q + shift, k + shift), t5_bias(table, q, k))


def test_t5_bias_keeps_float64_and_empty_shapes():
    table = TINY.astype(np.float64)
    assert t5_bias(table, 3, 8, num_buckets=8, max_distance=16).dtype == np.float64
    assert t5_bias(table, 0, 5, num_buckets=8, max_distance=16).shape == (2, 0, 5)
    assert t5_bias(table, 4, 0, num_buckets=8, max_distance=16).shape == (2, 4, 0)


# --- errors --------------------------------------------------------------------------------------

@pytest.mark.parametrize("kwargs, match", [
    (dict(num_buckets=1), "num_buckets"),
    (dict(num_buckets=3), "num_buckets"),                              # 1 bucket per direction
    (dict(num_buckets=1, bidirectional=False), "num_buckets"),
    (dict(num_buckets=32, max_distance=8), "max_distance"),             # <= 32 // 4
    (dict(num_buckets=32, max_distance=16, bidirectional=False), "max_distance"),   # <= 32 // 2
    (dict(num_buckets=32, max_distance=0), "max_distance"),
])
def test_degenerate_configurations_raise(kwargs, match):
    with pytest.raises(ValueError, match=match):
        relative_position_bucket(np.arange(-3, 3), **kwargs)
    with pytest.raises(ValueError, match=match):
        first_distance_of_bucket(**kwargs)


def test_smallest_valid_configurations():
    # One exact bucket (E = 1) and one log bucket per direction: |n| >= 1 all share bucket 1.
    both = relative_position_bucket([-9, 0, 9], num_buckets=4, max_distance=2)
    causal = relative_position_bucket([-9, -1, 0, 9], bidirectional=False, num_buckets=2, max_distance=2)
    np.testing.assert_array_equal(both, [1, 0, 3])
    np.testing.assert_array_equal(causal, [1, 1, 0, 0])


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="relative_position"):
        relative_position_bucket(np.array([0.5]))
    with pytest.raises(TypeError, match="relative_position"):
        relative_position_bucket(np.array([True]))
    with pytest.raises(TypeError, match="relative_position"):
        relative_position_bucket("3")
    with pytest.raises(TypeError, match="bidirectional"):
        relative_position_bucket(3, bidirectional=1)
    with pytest.raises(TypeError, match="num_buckets"):
        relative_position_bucket(3, num_buckets=32.0)
    with pytest.raises(ValueError, match="table"):
        t5_bias(np.zeros((16, 2)), 3, 3)
    with pytest.raises(ValueError, match="table"):
        t5_bias(np.zeros(32), 3, 3)
    with pytest.raises(ValueError, match="table"):
        t5_bias(np.full((32, 2), np.nan), 3, 3)
    with pytest.raises(ValueError, match="q_positions"):
        t5_bias(np.zeros((32, 2)), np.array([-1, 0]), 3)
    with pytest.raises(ValueError, match="k_positions"):
        fast_t5_bias(np.zeros((32, 2)), 2, np.array([[0, 1]]))


# --- against transformers itself (skipped when it is not installed) ------------------------------

@pytest.mark.parametrize("config", STANDARD + [(True, 33, 128), (False, 48, 300)])
def test_every_distance_within_a_million_matches_transformers(config):
    torch = pytest.importorskip("torch")
    T5Attention = pytest.importorskip("transformers.models.t5.modeling_t5").T5Attention
    bidirectional, k, m = config
    n = np.arange(-RANGE, RANGE + 1)
    expected = T5Attention._relative_position_bucket(torch.from_numpy(n), bidirectional=bidirectional,
                                                     num_buckets=k, max_distance=m).numpy()
    np.testing.assert_array_equal(relative_position_bucket(n, bidirectional=bidirectional, num_buckets=k,
                                                           max_distance=m), expected)


@pytest.mark.parametrize("is_decoder, past", [(False, 0), (True, 0), (True, 9)])
def test_t5_bias_matches_transformers_compute_bias(is_decoder, past):
    torch = pytest.importorskip("torch")
    t5_module = pytest.importorskip("transformers.models.t5.modeling_t5")
    config = t5_module.T5Config(d_model=8, d_kv=4, num_heads=3, relative_attention_num_buckets=32,
                                relative_attention_max_distance=128, is_decoder=is_decoder)
    layer = t5_module.T5Attention(config, has_relative_attention_bias=True, layer_idx=0)
    table = np.random.default_rng(0).standard_normal((32, 3)).astype(np.float32)
    with torch.no_grad():
        layer.relative_attention_bias.weight.copy_(torch.from_numpy(table))
        expected = layer.compute_bias(5, 200 + past, past_seen_tokens=past).numpy()[0]   # (H, T, S)
    out = t5_bias(table, past + np.arange(5), 200 + past, bidirectional=not is_decoder)
    np.testing.assert_array_equal(out, expected)
