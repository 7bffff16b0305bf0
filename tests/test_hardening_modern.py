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
