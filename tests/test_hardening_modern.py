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
