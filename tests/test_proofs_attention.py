"""The attention theorems pass, and fail readably on a wrong claim or broken code."""

import numpy as np
import pytest

sp = pytest.importorskip("sympy")

import minipos.attention  # noqa: E402
from proofs import core  # noqa: E402
from proofs.attention import _expect  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch  # noqa: E402

IDS = [t.id for t in core.select(["attention"])]


def test_catalogue():
    assert {"attention.softmax.shift", "attention.scale.variance", "attention.four_terms"} <= set(IDS)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")
def test_naive_softmax_fails_its_theorem(monkeypatch):
    # exp(x) / sum(exp(x)) without the max shift: a row shifted by 800 overflows to inf/inf.
    naive = lambda x, axis=-1: np.exp(np.asarray(x, float)) / np.exp(np.asarray(x, float)).sum(axis, keepdims=True)  # noqa: E731
    monkeypatch.setattr(minipos.attention, "softmax", naive)
    with pytest.raises(TieMismatch) as err:
        core.REGISTRY["attention.softmax.shift"].prove()
    msg = str(err.value)
    assert "theorem attention.softmax.shift, tie to minipos.attention.softmax" in msg
    assert "softmax of a row shifted by c" in msg and "[MISMATCH]" in msg
    assert "got:      [[nan]" in msg and "max |difference| = inf" in msg


def test_wrong_default_scale_fails(monkeypatch):
    real = minipos.attention.attention
    monkeypatch.setattr(minipos.attention, "attention",
                        lambda q, k, v, **kw: real(q, k, v, scale=1.0 / np.shape(q)[-1], **kw))  # 1/D
    with pytest.raises(TieMismatch, match=r"theorem attention.scale.variance, tie to minipos.attention.attention"):
        core.REGISTRY["attention.scale.variance"].prove()


def test_variance_without_zero_mean_is_not_d():
    # With non-zero means the cross terms do not vanish: claiming Var = D mu2 nu2 is false.
    mu = {0: 1, 1: sp.Symbol("mu1"), 2: sp.Symbol("mu2")}
    nu = {0: 1, 1: sp.Symbol("nu1"), 2: sp.Symbol("nu2")}

    def proof(p):
        q, k = sp.symbols("q0:2"), sp.symbols("k0:2")
        dot = q[0] * k[0] + q[1] * k[1]
        p.claim(_expect(dot**2, q, k, mu, nu) - _expect(dot, q, k, mu, nu) ** 2,
                2 * mu[2] * nu[2], "drop the means")
    with pytest.raises(StepFalse) as err:
        Theorem("attention.wrong_variance", "s", proof).prove()
    assert "step 1 ('drop the means')" in str(err.value) and "counterexample" in str(err.value)


def test_four_terms_with_a_wrong_term_fails():
    d = 3
    xi, pi, xj, pj = (sp.MatrixSymbol(n, 1, d) for n in ("x_i", "p_i", "x_j", "p_j"))
    W = sp.MatrixSymbol("W", d, d)

    def proof(p):  # p_i W x_j^T swapped for x_j W p_i^T: W is not symmetric
        p.claim((xi + pi) * W * (xj + pj).T,
                xi * W * xj.T + xi * W * pj.T + xj * W * pi.T + pi * W * pj.T, "distribute", by="expand")
    with pytest.raises(StepFalse, match=r"step 1 \('distribute'\).*\n(.*\n)*  counterexample: W = "):
        Theorem("attention.wrong_terms", "s", proof).prove()
