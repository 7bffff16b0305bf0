"""Gradient of the learned absolute table (minipos.sinusoidal.absolute_embedding_backward).

Checked against central finite differences in float64 (the lookup is linear in the table, so the
difference is exact up to rounding), against torch.autograd through
``torch.nn.functional.embedding`` (GPT-2's ``wpe`` / BERT's ``position_embeddings``), and against
a hand-worked case with repeated positions.
"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from minipos.sinusoidal import absolute_embedding, absolute_embedding_backward

SETTINGS = settings(max_examples=40, deadline=None)


@st.composite
def cases(draw):
    """A (P, D) table, positions (T,) or (B, T) in [0, P) (repeats likely), and a dout."""
    seed = draw(st.integers(0, 2 ** 32 - 1))
    P, D = draw(st.integers(1, 6)), draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=2)))
    rng = np.random.default_rng(seed)
    positions = rng.integers(0, P, size=shape)
    return seed, rng.standard_normal((P, D)), positions, rng.standard_normal((*shape, D))


def test_repeated_positions_sum_by_hand():
    # table (4, 2), positions (1, 3, 1): out = (table[1], table[3], table[1]). With dout rows
    # (1, 2), (3, 4), (5, 6): row 1 gets (1, 2) + (5, 6) = (6, 8), row 3 gets (3, 4), rows 0 and 2 nothing.
    table = np.arange(8.0).reshape(4, 2)
    dout = np.array([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    np.testing.assert_array_equal(absolute_embedding_backward(table, [1, 3, 1], dout),
                                  [[0, 0], [6, 8], [0, 0], [3, 4]])
    # an int T means arange(T): each of the first T rows read once, dtable = dout padded with zero rows
    np.testing.assert_array_equal(absolute_embedding_backward(table, 2, dout[:2]), [[1, 2], [3, 4], [0, 0], [0, 0]])


@SETTINGS
@given(case=cases())
def test_finite_differences(case):
    seed, table, positions, dout = case
    dtable = absolute_embedding_backward(table, positions, dout)
    assert dtable.shape == table.shape
    e = np.random.default_rng(seed).standard_normal(table.shape)
    h = 1e-3
    numeric = (np.vdot(absolute_embedding(table + h * e, positions), dout)
               - np.vdot(absolute_embedding(table - h * e, positions), dout)) / (2 * h)
    analytic = np.vdot(dtable, e)
    floor = max(1e-3 * np.linalg.norm(dtable) * np.linalg.norm(e), 1e-12)
    assert abs(numeric - analytic) <= 1e-6 * max(abs(numeric), abs(analytic), floor)


@SETTINGS
@given(case=cases())
def test_matches_torch_embedding_autograd(case):
    torch = pytest.importorskip("torch")
    _, table, positions, dout = case
    weight = torch.tensor(table, requires_grad=True)
    out = torch.nn.functional.embedding(torch.tensor(positions), weight)
    (want,) = torch.autograd.grad(out, weight, torch.tensor(dout))
    np.testing.assert_allclose(absolute_embedding_backward(table, positions, dout), want.numpy(),
                               rtol=1e-12, atol=1e-12)


def test_dtype_and_empty():
    table = np.zeros((3, 2), np.float32)
    dtable = absolute_embedding_backward(table, [0, 0], np.ones((2, 2)))
    assert dtable.dtype == np.float32
    np.testing.assert_array_equal(dtable, [[2, 2], [0, 0], [0, 0]])
    np.testing.assert_array_equal(absolute_embedding_backward(table, 0, np.zeros((0, 2))), np.zeros((3, 2)))


def test_bad_input_raises_naming_the_argument():
    table = np.zeros((3, 2))
    with pytest.raises(ValueError, match="dout"):
        absolute_embedding_backward(table, [0, 1], np.ones((3, 2)))
    with pytest.raises(ValueError, match="dout"):
        absolute_embedding_backward(table, [0, 1], np.ones((2, 3)))
    with pytest.raises(ValueError, match="dout"):
        absolute_embedding_backward(table, [0, 1], np.full((2, 2), np.nan))
    with pytest.raises(ValueError, match="positions"):
        absolute_embedding_backward(table, [0, 3], np.ones((2, 2)))
    with pytest.raises(ValueError, match="table"):
        absolute_embedding_backward(np.zeros(3), [0], np.ones((1, 1)))
    with pytest.raises(ValueError, match="gradient of table overflows float32"):
        absolute_embedding_backward(table.astype(np.float32), [1, 1], np.full((2, 2), 3e38))
