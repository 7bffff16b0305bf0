"""Bad input to M-RoPE, iRoPE, the local/global and Llama 4 / SmolLM3 config readers, Shaw and the
masks: a clear error naming the argument, or the right result (worked by hand, or from the
formulas of the papers and of transformers, with Python's exact integers as the oracle)."""

import math

import numpy as np
import pytest

from minipos import irope, masks, mrope, shaw
from minipos import local_global as lg
from minipos.layer import MultiHeadAttention
from minipos.rope_scaling import Rotary
from minipos.seams import NoPE

I64 = np.iinfo(np.int64)


# --- M-RoPE positions --------------------------------------------------------------------------

@pytest.mark.parametrize("interval", [1e300, 1e19, 2.0 ** 62])
def test_a_video_time_interval_past_int64_is_named_not_wrapped(interval):
    # [text, 2 video tokens (grid (2, 2, 2) merged by 2: one token per frame), text]: frame 1 sits at
    # 1 + floor(1 * interval), beyond 2**62; before, it came back as -9223372036854775807.
    with pytest.raises(ValueError, match="video_time_intervals"):
        mrope.mrope_positions([0, 2, 2, 0], video_grid_thw=[[2, 2, 2]], video_time_intervals=[interval])


def test_a_large_video_time_interval_that_fits_is_exact():
    # By hand: text at 0; frames at 1 + floor(0 * s) = 1 and 1 + floor(1 * s) = 1 + 2**40 (h = w = 1 after
    # merging: rows and columns 1 + 0); current = 1 + max(2, 2) // 2 = 2, so the last text token is at 2.
    pos, delta = mrope.mrope_positions([0, 2, 2, 0], video_grid_thw=[[2, 2, 2]], video_time_intervals=[2.0 ** 40])
    assert pos.tolist() == [[0, 1, 1 + 2 ** 40, 2], [0, 1, 1, 2], [0, 1, 1, 2]]
    assert delta == 1 + 2 ** 40 + 1 - 4


def test_a_huge_grid_is_refused_by_its_token_count_before_any_array():
    # 2**40 x 2**40 patches would be 2**78 positions: refused by the count (1 token here), not by NumPy.
    with pytest.raises(ValueError, match=r"image_grid_thw\[0\].*needs"):
        mrope.mrope_positions([1], image_grid_thw=[[1, 2 ** 40, 2 ** 40]])


@pytest.mark.parametrize("cache_length, length, delta", [(2 ** 63 - 2, 3, 0), (2 ** 63, 3, 0), (2 ** 62 - 1, 2, 0),
                                                         (0, 1, -2 ** 62), (5, 2 ** 63, 0)])
def test_decode_positions_past_2_62_are_named(cache_length, length, delta):
    with pytest.raises(ValueError, match="cache_length|length"):
        mrope.mrope_decode_positions(cache_length, length, delta)


def test_decode_positions_near_the_limit_are_exact():
    # cache_length + delta + arange(2) by Python's integers.
    got = mrope.mrope_decode_positions(2 ** 62 - 10, 2, 7)
    assert got.tolist() == [[2 ** 62 - 3, 2 ** 62 - 2]] * 3
    assert mrope.mrope_decode_positions(10, 3, -4).tolist() == [[6, 7, 8]] * 3


@pytest.mark.parametrize("call", [
    lambda: mrope.mrope_streams([2 ** 63, 0, 0]),
    lambda: mrope.mrope_angles(np.zeros((3, 2), int), np.ones(2), [2 ** 63, 0, 0]),
    lambda: mrope.apply_mrope(np.ones((2, 4)), np.zeros((3, 2), int), [2 ** 63, 0, 0]),
    lambda: MultiHeadAttention(8, 2, scheme=mrope.MRotary(mrope_section=[2 ** 63, 0, 0])),
], ids=["streams", "angles", "apply", "layer"])
def test_a_huge_mrope_section_is_named(call):
    with pytest.raises(ValueError, match="mrope_section"):
        call()


# --- Shaw ------------------------------------------------------------------------------------------

def test_relative_buckets_at_the_ends_of_int64_do_not_wrap():
    # j - i = int64.max - int64.min = 2**64 - 1 > k = 2, so clip gives k and the row is 2k = 4 (the far-right
    # bucket); the other way round j - i = -(2**64 - 1) clips to -k, row 0. Before: j - i wrapped to -1, row 1.
    assert shaw.relative_buckets([I64.min], [I64.max], 2).tolist() == [[4]]
    assert shaw.relative_buckets([I64.max], [I64.min], 2).tolist() == [[0]]
    # Near the ends, distances below k stay exact: j - i = 1 and -1 with i = int64.max - 1.
    assert shaw.relative_buckets([I64.max - 1], [I64.max, I64.max - 2], 3).tolist() == [[4, 2]]


def test_relative_buckets_equal_the_clip_of_python_integers():
    rng = np.random.default_rng(5)
    i = rng.integers(I64.min, I64.max, 20, endpoint=True)
    j = np.concatenate([rng.integers(I64.min, I64.max, 20, endpoint=True), i[:5] + 3, i[5:10] - 2])
    want = [[max(-7, min(7, int(b) - int(a))) + 7 for b in j] for a in i]
    assert shaw.relative_buckets(i, j, 7).tolist() == want


@pytest.mark.parametrize("call", [lambda: shaw.Shaw(2 ** 70), lambda: shaw.Shaw(2 ** 62),
                                  lambda: shaw.relative_buckets([0], [1], 2 ** 70),
                                  lambda: MultiHeadAttention(8, 2, scheme=shaw.Shaw(2 ** 40))],
                         ids=["2**70", "2**62", "buckets", "bind"])
def test_a_huge_max_relative_position_is_named(call):
    with pytest.raises(ValueError, match="max_relative_position"):
        call()


# --- masks -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("fn, name", [(masks.chunk_mask, "chunk"), (masks.sliding_window_mask, "window")])
@pytest.mark.parametrize("size", [2 ** 70, 2 ** 63, 2 ** 62 + 1])
def test_a_chunk_or_window_past_2_62_is_named_as_by_the_layer(fn, name, size):
    with pytest.raises(ValueError, match=f"{name} must be at most 2\\*\\*62"):
        fn([0, 1], [0, 1], size)


def test_a_chunk_of_2_62_puts_every_position_in_one_chunk():
    # i // 2**62 = 0 for every position below 2**62: all pairs may attend.
    got = masks.chunk_mask([0, 2 ** 62 - 1], [0, 5, 2 ** 62 - 1], 2 ** 62)
    assert got.tolist() == [[True, True, True], [True, True, True]]
