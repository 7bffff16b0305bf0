"""Transformer-XL proofs: every theorem passes; a wrong shift or a swapped bias fails loudly."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.transformer_xl  # noqa: E402
from proofs import transformer_xl as proofs_xl  # noqa: E402
from _proof_support import proof_failure  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch, select  # noqa: E402

THEOREMS = select(["transformer_xl"])


def test_the_family_is_registered():
    assert {t.id for t in THEOREMS} >= {"transformer_xl.four_terms", "transformer_xl.rel_shift"}


def test_shift_formula_on_a_hand_worked_case():
    # T = 2, M = 1 (S = 3), BD = [[1, 2, 3], [4, 5, 6]] (columns: distances 2, 1, 0).
    # Padded [[0, 1, 2, 3], [0, 4, 5, 6]], read as (4, 2): [[0, 1], [2, 3], [0, 4], [5, 6]];
    # drop the first row and read as (2, 3): [[2, 3, 0], [4, 5, 6]].
    np.testing.assert_array_equal(proofs_xl._shift_by_formula(2, 1), [[2, 3, 0], [4, 5, 6]])


def test_sinusoid_is_the_split_table_of_the_paper():
    # d_model = 4: w = (1, 1/100); R_1 = [sin 1, sin 0.01, cos 1, cos 0.01] (hand-computed).
    np.testing.assert_allclose(proofs_xl._sinusoid(1, 4),
                               [0.8414709848078965, 0.009999833334166664, 0.5403023058681398, 0.9999500004166653])


def _fails(theorem_id, monkeypatch, name, broken):
    return proof_failure(theorem_id, monkeypatch, minipos.transformer_xl, name, broken)


def test_shift_in_the_wrong_direction_fails(monkeypatch):
    def pad_right(x):  # pad on the right instead of the left: a sign flip of the shift
        x = np.asarray(x, float)
        *lead, T, S = x.shape
        padded = np.concatenate([x, np.zeros((*lead, T, 1))], axis=-1).reshape(*lead, S + 1, T)
        return padded[..., 1:, :].reshape(*lead, T, S)
    err = _fails("transformer_xl.rel_shift", monkeypatch, "rel_shift", pad_right)
    assert isinstance(err, TieMismatch)
    assert ("theorem transformer_xl.rel_shift, tie to minipos.transformer_xl.rel_shift ('every entry, labelled BD') "
            "[case T_M = (3, 2)]") in str(err)


def test_u_and_v_swapped_fails_the_four_terms(monkeypatch):
    good = minipos.transformer_xl.xl_terms
    err = _fails("transformer_xl.four_terms", monkeypatch, "xl_terms",
                 lambda q, k, w_r, u, v, **kw: good(q, k, w_r, v, u, **kw))
    assert "theorem transformer_xl.four_terms, tie to minipos.transformer_xl.xl_terms ('(a), (b), (c), (d)" in str(err)
    assert "at seed = 11" in str(err)


def test_scores_with_ascending_distances_fail(monkeypatch):
    good = minipos.transformer_xl.xl_scores
    err = _fails("transformer_xl.four_terms", monkeypatch, "xl_scores",
                 lambda q, k, r, u, v: good(q, k, r[:, ::-1], u, v))  # R not reversed: distances ascending
    assert "tie to minipos.transformer_xl.xl_scores ('(q + u).k + (q + v).r_{i-j} for j <= i + M')" in str(err)


def test_a_single_global_bias_is_not_the_paper():
    xi, Wq, WkET, xjT, WkRT, RT, u, v = (sp.Symbol(n, commutative=False) for n in
                                         ("x_i", "W_q", "W_{k,E}^T", "x_j^T", "W_{k,R}^T", "R^T", "u", "v"))

    def proof(p):  # claim that (c) + (d) can be written with u alone
        p.claim(u * WkET * xjT + v * WkRT * RT, u * (WkET * xjT + WkRT * RT), "one global vector", by="expand")
    with pytest.raises(StepFalse) as err:
        Theorem("transformer_xl.demo", "u = v", proof).prove()
    assert "theorem transformer_xl.demo, step 1 ('one global vector')" in str(err.value)
    assert "counterexample" in str(err.value)
