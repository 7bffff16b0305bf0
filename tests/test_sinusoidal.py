"""Sinusoidal and learned absolute tables against hand-worked values and reference code."""

from math import cos, sin

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from minipos.sinusoidal import absolute_embedding, learned_table, sinusoidal_frequencies, sinusoidal_table

# Reference tables are float32 (built in float32, or in float64 and cast): compare loosely.
F32 = dict(rtol=1e-6, atol=2e-7)


# --- hand-worked values -------------------------------------------------------------------

def test_interleaved_dim4_by_hand():
    # D = 4: w_0 = 10000^0 = 1, w_1 = 10000^(-2/4) = 0.01 (Vaswani §3.5).
    expected = [
        [0.0, 1.0, 0.0, 1.0],
        [sin(1), cos(1), sin(0.01), cos(0.01)],
        [sin(2), cos(2), sin(0.02), cos(0.02)],
    ]
    np.testing.assert_allclose(sinusoidal_table(3, 4), expected, rtol=1e-15, atol=1e-16)


def test_split_dim4_by_hand_is_the_interleaved_table_permuted():
    # Same w as interleaved, columns [sin w_0, sin w_1 | cos w_0, cos w_1] (Transformer-XL).
    split = [
        [0.0, 0.0, 1.0, 1.0],
        [sin(1), sin(0.01), cos(1), cos(0.01)],
        [sin(2), sin(0.02), cos(2), cos(0.02)],
    ]
    got = sinusoidal_table(3, 4, layout="split")
    np.testing.assert_allclose(got, split, rtol=1e-15, atol=1e-16)
    # interleaved column 2i is sin w_i, 2i+1 is cos w_i: taking the even columns, then the odd
    # ones, gives [sin w_0 ... sin w_{D/2-1} | cos w_0 ... cos w_{D/2-1}], i.e. the split table.
    np.testing.assert_array_equal(sinusoidal_table(3, 4)[:, [0, 2, 1, 3]], got)
    positions = np.array([0, 1, 7, -3, 250, 4097])
    for D in (2, 6, 10, 64):
        permutation = np.r_[0:D:2, 1:D:2]
        np.testing.assert_array_equal(sinusoidal_table(positions, D)[:, permutation],
                                      sinusoidal_table(positions, D, layout="split"))


def test_tensor2tensor_dim4_by_hand():
    # D = 4: num_timescales = 2, increment = ln(10000) / 1, so w = [1, 1e-4].
    expected = [[sin(3), sin(3e-4), cos(3), cos(3e-4)]]
    np.testing.assert_allclose(sinusoidal_table([3], 4, layout="tensor2tensor"), expected, rtol=1e-15)


def test_negative_positions_are_relative_distances():
    # Transformer-XL/XLNet evaluate the table at i - j, which may be negative.
    expected = [[-sin(2), cos(2), -sin(0.02), cos(0.02)], [0.0, 1.0, 0.0, 1.0]]
    np.testing.assert_allclose(sinusoidal_table(np.array([-2, 0]), 4), expected, rtol=1e-15, atol=1e-16)


def test_frequencies_by_hand():
    # Vaswani: 10000^(-2i/6) for i = 0, 1, 2; tensor2tensor: 10000^(-i/2) = 1, 1e-2, 1e-4.
    np.testing.assert_allclose(sinusoidal_frequencies(6), [1.0, 10 ** (-4 / 3), 10 ** (-8 / 3)], rtol=1e-15)
    np.testing.assert_allclose(sinusoidal_frequencies(6, layout="tensor2tensor"), [1.0, 1e-2, 1e-4], rtol=1e-15)
    np.testing.assert_allclose(sinusoidal_frequencies(4, base=100.0, layout="split"), [1.0, 0.1], rtol=1e-15)


def test_tensor2tensor_small_and_odd_dims():
    # D = 2 and D = 3: num_timescales = 1, tensor2tensor divides by max(1 - 1, 1) = 1, so w = [1];
    # odd D appends a zero column (tf.pad by channels % 2; fairseq's torch.zeros column).
    np.testing.assert_allclose(sinusoidal_frequencies(2, layout="tensor2tensor"), [1.0])
    expected = [[0.0, 1.0, 0.0], [sin(1), cos(1), 0.0], [sin(2), cos(2), 0.0]]
    np.testing.assert_allclose(sinusoidal_table(3, 3, layout="tensor2tensor"), expected, rtol=1e-15)
    np.testing.assert_array_equal(sinusoidal_table(2, 1, layout="tensor2tensor"), [[0.0], [0.0]])


# --- values printed by reference implementations -------------------------------------------

# Printed by transformers 5.24.0 `xlm.modeling_xlm.create_sinusoidal_embeddings(4, 6, out)`
# (same formula as DistilBERT): the interleaved layout, float64 then cast to float32.
XLM_4x6 = [
    [0.0, 1.0, 0.0, 1.0, 0.0, 1.0],
    [0.8414709568023682, 0.5403022766113281, 0.04639922454953194, 0.9989230036735535, 0.002154432935640216, 0.9999976754188538],
    [0.9092974066734314, -0.416146844625473, 0.09269849956035614, 0.9956942200660706, 0.004308856092393398, 0.999990701675415],
    [0.14112000167369843, -0.9899924993515015, 0.13879810273647308, 0.9903206825256348, 0.006463258992880583, 0.9999791383743286],
]

# Printed by transformers 5.24.0 `MarianSinusoidalPositionalEmbedding(4, 6).create_weight()`:
# the split layout ([sin | cos], w_i = 10000^(-2i/D)).
MARIAN_4x6 = [
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0],
    [0.8414709568023682, 0.04639922454953194, 0.002154432935640216, 0.5403022766113281, 0.9989230036735535, 0.9999976754188538],
    [0.9092974066734314, 0.09269849956035614, 0.004308856092393398, -0.416146844625473, 0.9956942200660706, 0.999990701675415],
    [0.14112000167369843, 0.13879810273647308, 0.006463258992880583, -0.9899924993515015, 0.9903206825256348, 0.9999791383743286],
]

# Printed by transformers 5.24.0 `Speech2TextSinusoidalPositionalEmbedding.get_embedding(4, 6, None)`,
# a copy of fairseq's `SinusoidalPositionalEmbedding.get_embedding` (float32).
FAIRSEQ_4x6 = [
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0],
    [0.8414709568023682, 0.009999833069741726, 9.99999901978299e-05, 0.5403023362159729, 0.9999499917030334, 1.0],
    [0.9092974066734314, 0.019998665899038315, 0.0001999999803956598, -0.416146844625473, 0.9998000264167786, 1.0],
    [0.14112000167369843, 0.029995499178767204, 0.0002999999560415745, -0.9899924993515015, 0.9995500445365906, 0.9999999403953552],
]

# Printed by the same `get_embedding(3, 7, None)`: odd D, zero column appended.
FAIRSEQ_3x7 = [
    [0.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.0],
    [0.8414709568023682, 0.009999833069741726, 9.99999901978299e-05, 0.5403023362159729, 0.9999499917030334, 1.0, 0.0],
    [0.9092974066734314, 0.019998665899038315, 0.0001999999803956598, -0.416146844625473, 0.9998000264167786, 1.0, 0.0],
]

# Printed by the same `get_embedding(4, 6, padding_idx=1)`: row 1 (the padding row) is zeroed
# and real tokens are numbered from padding_idx + 1 = 2, so tokens 0, 1 read rows 2, 3.
FAIRSEQ_4x6_PAD1_ROWS_2_3 = [
    [0.9092974066734314, 0.019998665899038315, 0.0001999999803956598, -0.416146844625473, 0.9998000264167786, 1.0],
    [0.14112000167369843, 0.029995499178767204, 0.0002999999560415745, -0.9899924993515015, 0.9995500445365906, 0.9999999403953552],
]


def test_interleaved_matches_xlm():
    np.testing.assert_allclose(sinusoidal_table(4, 6), XLM_4x6, **F32)


def test_split_matches_marian():
    np.testing.assert_allclose(sinusoidal_table(4, 6, layout="split"), MARIAN_4x6, **F32)


def test_tensor2tensor_matches_fairseq_even_and_odd():
    np.testing.assert_allclose(sinusoidal_table(4, 6, layout="tensor2tensor"), FAIRSEQ_4x6, **F32)
    np.testing.assert_allclose(sinusoidal_table(3, 7, layout="tensor2tensor"), FAIRSEQ_3x7, **F32)


def test_fairseq_padding_idx_offset():
    padding_idx, T = 1, 2
    got = sinusoidal_table(np.arange(T) + padding_idx + 1, 6, layout="tensor2tensor")
    np.testing.assert_allclose(got, FAIRSEQ_4x6_PAD1_ROWS_2_3, **F32)
    # The off-by-(padding_idx + 1) port differs visibly.
    assert not np.allclose(sinusoidal_table(T, 6, layout="tensor2tensor"), FAIRSEQ_4x6_PAD1_ROWS_2_3, atol=1e-3)


def test_layouts_are_not_interchangeable():
    t2t = sinusoidal_table(4, 6, layout="tensor2tensor")
    assert not np.allclose(t2t, MARIAN_4x6, atol=1e-3)


def test_live_transformers_tables():
    torch = pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from transformers.models.marian.modeling_marian import MarianSinusoidalPositionalEmbedding
    from transformers.models.speech_to_text.modeling_speech_to_text import (
        Speech2TextSinusoidalPositionalEmbedding,
    )
    from transformers.models.xlm.modeling_xlm import create_sinusoidal_embeddings

    for n, d in [(50, 16), (33, 64), (7, 9)]:
        ref = Speech2TextSinusoidalPositionalEmbedding.get_embedding(n, d, None).double().numpy()
        np.testing.assert_allclose(sinusoidal_table(n, d, layout="tensor2tensor"), ref, atol=5e-5)
    for n, d in [(50, 16), (33, 64)]:
        out = torch.empty(n, d)
        create_sinusoidal_embeddings(n, d, out)
        np.testing.assert_allclose(sinusoidal_table(n, d), out.double().numpy(), atol=1e-6)
        ref = MarianSinusoidalPositionalEmbedding(n, d).create_weight().double().numpy()
        np.testing.assert_allclose(sinusoidal_table(n, d, layout="split"), ref, atol=1e-6)


# --- properties ---------------------------------------------------------------------------

@settings(max_examples=50, deadline=None)
@given(pos=st.integers(-1000, 1000), k=st.integers(-1000, 1000), half=st.integers(1, 8))
def test_shift_is_a_rotation_of_each_pair(pos, k, half):
    # Vaswani §3.5: PE(pos + k) is a linear function of PE(pos); per pair, a rotation by k w_i.
    D = 2 * half
    w = 10000.0 ** (-2.0 * np.arange(half) / D)
    a, b = sinusoidal_table([pos, pos + k], D)
    s, c = a[0::2], a[1::2]
    np.testing.assert_allclose(b[0::2], s * np.cos(k * w) + c * np.sin(k * w), atol=1e-9)
    np.testing.assert_allclose(b[1::2], c * np.cos(k * w) - s * np.sin(k * w), atol=1e-9)


# --- learned absolute table ---------------------------------------------------------------

def test_learned_table_init_matches_gpt2_bert_std():
    # GPT-2 and BERT initialise position embeddings with normal(0, initializer_range = 0.02).
    # 65536 draws: the sample mean has standard error 0.02 / 256 = 7.8e-5 and the sample std
    # about 0.02 / sqrt(2 * 65536) = 5.5e-5, so 5e-4 is over 6 standard errors for each.
    table = learned_table(1024, 64)
    assert table.shape == (1024, 64) and table.dtype == np.float64
    assert abs(table.std() - 0.02) < 0.0005 and abs(table.mean()) < 0.0005
    # The documented contract is numpy.random.default_rng(seed).normal(0, std): values printed
    # by numpy 2.4.6 `np.random.default_rng(7).normal(0.0, 0.02, size=(4, 3))`.
    printed = [[2.4603067149651485e-05, 0.005974910750169398, -0.005482757107244352],
               [-0.017811836775145484, -0.009093415703434452, -0.019832931099929247],
               [0.0012028720519487697, 0.026804304911090673, -0.009844130371026593],
               [-0.01240949799639881, 0.009796841003703965, 0.007137740163201215]]
    np.testing.assert_allclose(learned_table(4, 3, seed=7), printed, rtol=1e-15, atol=0)
    np.testing.assert_allclose(learned_table(4, 3, seed=7, std=1.0), np.array(printed) / 0.02, rtol=1e-14)
    np.testing.assert_array_equal(learned_table(4, 3, seed=7, dtype=np.float32), np.array(printed, np.float32))
    assert not np.allclose(learned_table(4, 3, seed=8), printed)


def test_absolute_embedding_gathers_rows():
    table = np.arange(12.0).reshape(4, 3)
    np.testing.assert_array_equal(absolute_embedding(table, [3, 0]), [[9, 10, 11], [0, 1, 2]])
    np.testing.assert_array_equal(absolute_embedding(table, 2), [[0, 1, 2], [3, 4, 5]])
    assert absolute_embedding(table.astype(np.float32), [1]).dtype == np.float32


def test_absolute_embedding_cannot_extrapolate():
    with pytest.raises(ValueError, match=r"positions.*< num_positions = 4.*cannot extrapolate"):
        absolute_embedding(np.zeros((4, 3)), [0, 4])
    with pytest.raises(ValueError, match="positions"):
        absolute_embedding(np.zeros((4, 3)), [-1])  # would silently wrap to the last row
    with pytest.raises(ValueError, match="table"):
        absolute_embedding(np.zeros(4), [0])


# --- errors -------------------------------------------------------------------------------

@pytest.mark.parametrize("layout", ["interleaved", "split"])
def test_odd_dim_rejected_for_pair_layouts(layout):
    with pytest.raises(ValueError, match="dim must be even"):
        sinusoidal_table(3, 5, layout=layout)
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_frequencies(7, layout=layout)


@pytest.mark.parametrize("layout", ["interleaved", "split", "tensor2tensor"])
def test_nonpositive_dim_rejected(layout):
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_table(3, -4, layout=layout)
    with pytest.raises(ValueError, match="dim"):
        sinusoidal_table(3, 0, layout=layout)


def test_bad_arguments():
    with pytest.raises(ValueError, match="positions must hold integers"):
        sinusoidal_table(np.array([0.0, 1.5]), 4)
    with pytest.raises(TypeError, match="positions"):
        sinusoidal_table(np.array([True, False]), 4)
    with pytest.raises(ValueError, match="positions must be 1-D"):
        sinusoidal_table(np.zeros((2, 2), dtype=int), 4)
    with pytest.raises(ValueError, match="layout"):
        sinusoidal_table(3, 4, layout="half")
    with pytest.raises(TypeError, match="dim"):
        sinusoidal_table(3, 4.0)
    with pytest.raises(ValueError, match="base"):
        sinusoidal_table(3, 4, base=0.0)
    with pytest.raises(ValueError, match="num_positions"):
        learned_table(0, 4)
    with pytest.raises(TypeError, match="dtype"):
        learned_table(2, 4, dtype=np.int32)
    with pytest.raises(ValueError, match="std"):
        learned_table(2, 4, std=-1.0)
