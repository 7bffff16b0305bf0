"""The projected sinusoidal term is not relative; the theorem fails on a wrong claim or a broken table."""

import pytest

sp = pytest.importorskip("sympy")
sinusoidal = pytest.importorskip("minipos.sinusoidal")

from proofs import core  # noqa: E402
from proofs.core import StepFalse, Theorem, TieMismatch  # noqa: E402
from proofs.sinusoidal_projected import a, b, c, d, projected, split  # noqa: E402


def test_claiming_the_projected_term_is_relative_is_false():
    # The popular reading: PE(m) A PE(n)^T depends on m - n as PE(m) . PE(n) does.
    rel, _ = split(a, b, c, d)

    def proof(p):
        p.claim(projected(sp.Matrix([[a, b], [c, d]])), rel, "only the m - n part", by="trig")
    with pytest.raises(StepFalse, match=r"step 1 \('only the m - n part'\) \[FALSE\]"):
        Theorem("sinusoidal.projected_wrong", "s", proof).prove()


def test_a_rotation_is_no_counterexample():
    # A = [[a, b], [-b, a]] (a scaled rotation) keeps the term relative: the refutation must fail.
    from proofs.sinusoidal_projected import m, n, w
    rotation = sp.Matrix([[2, 1], [-1, 2]])

    def proof(p):
        p.refute(projected(rotation), projected(rotation).subs({m: m + 1, n: n + 1}, simultaneous=True),
                 {m: 1, n: 0, w: 1}, "shift both")
    with pytest.raises(StepFalse, match="not a counterexample"):
        Theorem("sinusoidal.rotation_refuted", "s", proof).prove()


def test_table_with_sin_and_cos_swapped_fails_the_tie(monkeypatch):
    real = sinusoidal.sinusoidal_table
    monkeypatch.setattr(sinusoidal, "sinusoidal_table", lambda *x, **kw: real(*x, **kw)[..., ::-1])
    with pytest.raises(TieMismatch, match=r"tie to minipos.sinusoidal.sinusoidal_table"):
        core.REGISTRY["sinusoidal.projected.not_relative"].prove()
